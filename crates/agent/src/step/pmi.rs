//! A PMI-1 "simple" wire-protocol server for the local ranks of a parallel application (MPICH's
//! `simple_pmi` client, as served by hydra's `hydra_pmi_proxy`), node-local part only.
//!
//! The shepherd starts each local rank with one end of a socketpair and hands the other end to
//! [`PmiServer::serve_rank`]. Puts are held back until every local rank has entered the barrier;
//! then [`PmiEvent::BarrierIn`] carries them to the shepherd, which gathers the puts of all nodes
//! up its tree and calls [`PmiServer::barrier_out`] with the union, which releases the ranks.
//!
//! # Environment of each rank (MPICH 4.0.2, ch4:ucx, PMI-1 simple client)
//!
//! Required:
//! - `PMI_FD=<n>`: the rank's end of the socketpair, open in the child (clear `FD_CLOEXEC`, or
//!   `dup2` it to a fixed number). Without it MPICH silently runs as a singleton (size 1).
//! - `PMI_RANK=<global rank>` and `PMI_SIZE=<total ranks>` (MPICH takes both from the
//!   environment, never from the server).
//!
//! Recommended (hydra sets them, and some libraries read them): `MPI_LOCALNRANKS=<ranks on this
//! node>`, `MPI_LOCALRANKID=<index of the rank among them>`.
//!
//! Not needed: `PMI_KVSNAME` (the client asks with `get_my_kvsname`), `PMI_PORT`/`PMI_ID` (the
//! connect-back handshake, for which `initack` is answered anyway). Do not set `PMI_VERSION` or
//! `PMI_SUBVERSION` to anything but 1/1: MPICH reads `PMI_process_mapping` only with PMI 1.1 and
//! falls back to a slower hostname exchange otherwise. `PMI_DEBUG=1` makes the client trace.
//!
//! UCX 1.13 (measured on one host, as root and as an ordinary user, ranks started one by one as
//! here): ranks that the mapping puts on one node talk through MPICH's own shared memory (files in
//! `/dev/shm`, which they must share); ranks on different nodes talk through UCX, which needs no
//! variable: between processes of one host it finds shared memory (sysv, posix, cma) by itself,
//! also across network namespaces, as long as they share the IPC namespace and `/dev/shm`. In
//! separate IPC namespaces UCX falls back to `tcp`, which reaches another network namespace only
//! through a routed interface (a veth pair works; loopback does not: MPI_Init aborts with
//! "Destination is unreachable"). `UCX_TLS=tcp,self` forces TCP, `UCX_NET_DEVICES=<iface>` picks
//! the interface (set per rank: names differ between namespaces).
//!
//! # Protocol
//!
//! Lines of space-separated `key=value` tokens; the first is `cmd=NAME` (or `mcmd=NAME` for the
//! multi-line spawn). A value is everything after the first `=` of its token, so it may contain
//! `=` (MPICH puts `segments=3`) but never a space or newline. Served commands: `init`,
//! `initack`, `get_maxes`, `get_appnum`, `get_my_kvsname`, `get_universe_size`, `put`, `get`
//! (including `PMI_process_mapping` and values injected with [`PmiServer::set`] such as
//! `PMI_dead_processes`), `barrier_in`, `finalize`, `abort`. Spawning (`mcmd=spawn`,
//! `MPI_Comm_spawn`), name publishing and extra KVS spaces are answered with `rc=-1`
//! (not supported); `get_ranks2hosts` (not sent by MPICH 4.0.2) is unknown. Bad lines are answered with `cmd=error rc=-1` and reported as
//! [`PmiEvent::ProtocolError`]; nothing a rank sends can make the server panic.
//!
//! A rank whose first request is `cmd=init pmi_version=2 pmi_subversion=0` speaks PMI-2 from
//! then on ([`crate::step::pmi2`]), with the same KVS and barrier: a step may mix both protocols.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

pub use crate::step::pmi_kvs::{PmiConfig, PmiEvent, PmiServer, KEYLEN_MAX, KVSNAME_MAX, VALLEN_MAX};
use crate::step::pmi_kvs::{CLIENT_LINE_MAX, GET_OK};

/// Longest request line accepted (a put with maximal kvsname, key and value fits).
pub const LINE_MAX: usize = 2048;
/// PMI-1 requests answered with `rc=-1` (not supported), and the name of their answer.
const UNSUPPORTED: [(&str, &str); 6] = [
    ("publish_name", "publish_result"),
    ("unpublish_name", "unpublish_result"),
    ("lookup_name", "lookup_result"),
    ("create_kvs", "newkvs"),
    ("destroy_kvs", "kvs_destroyed"),
    ("getbyidx", "getbyidx_results"),
];
/// Most lines one `mcmd=spawn` block may have before the server gives up on it.
const MCMD_LINES_MAX: usize = 4096;

/// Builds MPICH's `PMI_process_mapping` value from the ranks of each node, in node order:
/// `(vector,(START,COUNT,SIZE),...)`, each block saying that nodes START..START+COUNT hold SIZE
/// consecutive ranks each; MPICH starts over at the first block when the blocks run out before
/// the ranks. `[[0,1],[2,3]]` gives `(vector,(0,2,2))`, `[[0,1,2],[3]]` gives
/// `(vector,(0,1,3),(1,1,1))`, cyclic `[[0,2],[1,3]]` gives `(vector,(0,2,1))`.
///
/// MPICH only compares node ids, so nodes are numbered by their lowest rank (the given order
/// when node 0 holds rank 0, as usual). Gives "" unless the ranks are exactly 0..N-1 once each:
/// the server then has no `PMI_process_mapping` and MPICH exchanges hostnames instead (as when
/// the value is too long for MPICH's 1024-byte reply line: only for irregular mappings).
pub fn process_mapping(ranks_per_node: &[Vec<u32>]) -> String {
    let total: usize = ranks_per_node.iter().map(Vec::len).sum();
    let mut node_of = vec![usize::MAX; total];
    for (node, ranks) in ranks_per_node.iter().enumerate() {
        for &r in ranks {
            match node_of.get_mut(r as usize) {
                Some(slot) if *slot == usize::MAX => *slot = node,
                _ => return String::new(),
            }
        }
    }
    if total == 0 {
        return String::new();
    }
    let mut ids = vec![usize::MAX; ranks_per_node.len()];
    let mut next = 0;
    let seq: Vec<usize> = node_of
        .iter()
        .map(|&n| {
            if ids[n] == usize::MAX {
                ids[n] = next;
                next += 1;
            }
            ids[n]
        })
        .collect();
    // Smallest period of the rank -> node sequence (prefix function): MPICH's wrap-around.
    let mut pi = vec![0usize; total];
    for i in 1..total {
        let mut k = pi[i - 1];
        while k > 0 && seq[i] != seq[k] {
            k = pi[k - 1];
        }
        pi[i] = if seq[i] == seq[k] { k + 1 } else { 0 };
    }
    let full = encode_blocks(&seq);
    let periodic = encode_blocks(&seq[..total - pi[total - 1]]);
    if periodic.len() < full.len() {
        periodic
    } else {
        full
    }
}

fn encode_blocks(seq: &[usize]) -> String {
    let mut blocks: Vec<(usize, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < seq.len() {
        let run = seq[i..].iter().take_while(|&&n| n == seq[i]).count();
        match blocks.last_mut() {
            Some((start, count, size)) if *size == run && *start + *count == seq[i] => *count += 1,
            _ => blocks.push((seq[i], 1, run)),
        }
        i += run;
    }
    let body: Vec<String> = blocks.iter().map(|(s, c, z)| format!("({s},{c},{z})")).collect();
    format!("(vector,{})", body.join(","))
}

/// Why a PMI-1 request line does not parse (reported as the rank's protocol error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("token {0:?} is not key=value")]
    NotKeyValue(String),
    #[error("empty request")]
    Empty,
    #[error("request starts with {first}={cmd}, not cmd=NAME")]
    NoCommand { first: String, cmd: String },
}

/// One request line: `cmd=NAME key=value ...` (`multi` for `mcmd=NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub cmd: &'a str,
    pub multi: bool,
    pub args: Vec<(&'a str, &'a str)>,
}

impl<'a> Request<'a> {
    /// Parses one line (without or with its newline). An abort's `error_msg=` (sent by newer
    /// clients) is free text up to the end of the line.
    pub fn parse(line: &'a str) -> Result<Request<'a>, RequestError> {
        let line = line.trim_end_matches(['\n', '\r']);
        let (head, msg) = match line.find(" error_msg=") {
            Some(i) if line.starts_with("cmd=abort ") => (&line[..i], Some(&line[i + 11..])),
            _ => (line, None),
        };
        let mut args = Vec::new();
        for tok in head.split(' ').filter(|t| !t.is_empty()) {
            match tok.split_once('=') {
                Some((k, v)) if !k.is_empty() => args.push((k, v)),
                _ => return Err(RequestError::NotKeyValue(tok.to_string())),
            }
        }
        args.extend(msg.map(|m| ("error_msg", m)));
        let Some(&(first, cmd)) = args.first() else { return Err(RequestError::Empty) };
        if (first != "cmd" && first != "mcmd") || cmd.is_empty() {
            return Err(RequestError::NoCommand { first: first.to_string(), cmd: cmd.to_string() });
        }
        Ok(Request { cmd, multi: first == "mcmd", args: args.split_off(1) })
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.args.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// Whether a PMI-1 request is the opening line of a PMI-2 client.
pub fn asks_for_pmi2(req: &Request<'_>) -> bool {
    !req.multi && req.cmd == "init" && req.get("pmi_version") == Some("2") && req.get("pmi_subversion") == Some("0")
}

enum Action {
    Reply(String),
    Barrier(oneshot::Receiver<()>),
    /// Reply, and the rank is done with PMI (finalize, or abort with no reply).
    Last(Option<String>),
}

enum Line {
    Text(Vec<u8>),
    TooLong,
    Eof,
}

/// Reads one `\n`-terminated line of at most `max` bytes (without the newline); a longer line
/// is skipped up to its newline and reported as TooLong.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Line> {
    let (mut buf, mut too_long) = (Vec::new(), false);
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if buf.is_empty() {
                Line::Eof
            } else {
                Line::Text(buf)
            });
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        too_long |= buf.len() + take > max;
        if !too_long {
            buf.extend_from_slice(&avail[..take]);
        }
        r.consume(take + usize::from(done));
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Text(buf) });
        }
    }
}

impl PmiServer {
    /// Serve one local rank on its end of the socketpair until it closes. Spawn with tokio::spawn.
    /// A rank that closes it after `init` without `finalize` (or abort) is reported as a
    /// ProtocolError; one that never spoke PMI (not an MPI program) is not.
    pub async fn serve_rank(&self, rank: u32, stream: UnixStream) {
        if !self.config().local_ranks.contains(&rank) {
            return self.protocol_error(rank, "not a local rank of this PMI server".into());
        }
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::new(rd);
        let (mut active, mut done) = (false, false);
        loop {
            let reply = match read_line(&mut rd, LINE_MAX).await {
                Ok(Line::Eof) => break,
                Err(e) => {
                    self.protocol_error(rank, format!("reading the PMI connection: {e}"));
                    return;
                }
                Ok(Line::TooLong) => self.bad(rank, format!("request longer than {LINE_MAX} bytes"), "line_too_long"),
                Ok(Line::Text(bytes)) => match std::str::from_utf8(&bytes).map(Request::parse) {
                    Err(_) => self.bad(rank, "request is not UTF-8".into(), "not_utf8"),
                    Ok(Err(_)) if bytes.iter().all(|&b| b == b' ' || b == b'\r') => continue,
                    Ok(Err(e)) => self.bad(rank, e.to_string(), "parse_error"),
                    Ok(Ok(req)) if !active && asks_for_pmi2(&req) => {
                        return crate::step::pmi2::serve_rank(self, rank, rd, wr).await;
                    }
                    Ok(Ok(req)) if req.multi => match self.multi(rank, &req, &mut rd).await {
                        Some(reply) => reply,
                        None => continue,
                    },
                    Ok(Ok(req)) => {
                        active = true;
                        match self.handle(rank, &req) {
                            Action::Reply(reply) => reply,
                            Action::Barrier(rx) => match rx.await {
                                Ok(()) => "cmd=barrier_out".into(),
                                Err(_) => return,
                            },
                            Action::Last(reply) => {
                                done = true;
                                match reply {
                                    Some(reply) => reply,
                                    None => continue,
                                }
                            }
                        }
                    }
                },
            };
            if let Err(e) = wr.write_all(format!("{reply}\n").as_bytes()).await {
                self.protocol_error(rank, format!("writing the PMI connection: {e}"));
                return;
            }
        }
        if active && !done {
            self.protocol_error(rank, "PMI connection closed before finalize".into());
        }
    }

    /// Reports a bad request and gives the reply for it.
    fn bad(&self, rank: u32, message: String, code: &str) -> String {
        self.protocol_error(rank, message);
        format!("cmd=error rc=-1 msg={code}")
    }

    /// `mcmd=spawn` (MPI_Comm_spawn): `key=value` lines up to `endcmd`, one block per command;
    /// answered after the last block (`spawnssofar` = `totspawns`) with `rc=-1`: not supported.
    async fn multi<R: AsyncBufRead + Unpin>(&self, rank: u32, req: &Request<'_>, rd: &mut R) -> Option<String> {
        let (mut total, mut sofar) = (None, None);
        for _ in 0..MCMD_LINES_MAX {
            match read_line(rd, LINE_MAX).await {
                Ok(Line::Text(l)) if l == b"endcmd" => {
                    if req.cmd != "spawn" {
                        return Some(self.bad(rank, format!("unknown command mcmd={}", req.cmd), "unknown_command"));
                    }
                    if sofar < total {
                        return None;
                    }
                    self.protocol_error(rank, "MPI_Comm_spawn is not supported".into());
                    return Some("cmd=spawn_result rc=-1 msg=spawn_not_supported".into());
                }
                Ok(Line::Text(l)) => match String::from_utf8_lossy(&l).split_once('=') {
                    Some(("totspawns", v)) => total = v.parse::<u32>().ok(),
                    Some(("spawnssofar", v)) => sofar = v.parse::<u32>().ok(),
                    _ => {}
                },
                Ok(Line::TooLong) => {}
                Ok(Line::Eof) | Err(_) => return None,
            }
        }
        Some(self.bad(rank, format!("mcmd={} longer than {MCMD_LINES_MAX} lines", req.cmd), "line_too_long"))
    }

    fn handle(&self, rank: u32, req: &Request<'_>) -> Action {
        let cfg = &self.config();
        let reply = match req.cmd {
            "init" => {
                let sub = req.get("pmi_subversion").and_then(|s| s.parse::<u32>().ok());
                let rc = if req.get("pmi_version") == Some("1") && sub.is_some_and(|s| s <= 1) { 0 } else { -1 };
                format!("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc={rc}")
            }
            "initack" => format!("cmd=initack rc=0\ncmd=set size={}\ncmd=set rank={rank}\ncmd=set debug=0", cfg.size),
            "get_maxes" => {
                format!("cmd=maxes kvsname_max={KVSNAME_MAX} keylen_max={KEYLEN_MAX} vallen_max={VALLEN_MAX}")
            }
            "get_appnum" => format!("cmd=appnum appnum={}", cfg.appnum_of(rank)),
            "get_my_kvsname" => format!("cmd=my_kvsname kvsname={}", cfg.kvsname),
            "get_universe_size" => format!("cmd=universe_size size={}", cfg.universe_size),
            "put" => format!("cmd=put_result {}", self.put(rank, req)),
            "get" => format!("cmd=get_result {}", self.get(rank, req)),
            "barrier_in" => return Action::Barrier(self.barrier_in(rank)),
            "finalize" => {
                self.emit(PmiEvent::Finalized { rank });
                return Action::Last(Some("cmd=finalize_ack".into()));
            }
            "abort" => {
                let code = req.get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1);
                let message = req.get("error_msg").or(req.get("msg")).unwrap_or("").to_string();
                self.emit(PmiEvent::Abort { rank, code, message });
                return Action::Last(None);
            }
            other => match UNSUPPORTED.iter().find(|(c, _)| *c == other) {
                Some((_, answer)) => format!("cmd={answer} rc=-1 msg=not_supported"),
                None => self.bad(rank, format!("unknown command cmd={other}"), "unknown_command"),
            },
        };
        Action::Reply(reply)
    }

    fn put(&self, rank: u32, req: &Request<'_>) -> String {
        let (Some(kvsname), Some(key)) = (req.get("kvsname"), req.get("key")) else {
            return "rc=-1 msg=missing_kvsname_or_key".into();
        };
        if kvsname != self.config().kvsname {
            return "rc=-1 msg=unknown_kvsname".into();
        }
        match self.put_value(rank, key, req.get("value").unwrap_or("")) {
            Ok(()) => "rc=0 msg=success".into(),
            Err(code) => format!("rc=-1 msg={code}"),
        }
    }

    fn get(&self, rank: u32, req: &Request<'_>) -> String {
        let Some(key) = req.get("key") else { return "rc=-1 msg=missing_key".into() };
        if req.get("kvsname").is_some_and(|k| k != self.config().kvsname) {
            return "rc=-1 msg=unknown_kvsname".into();
        }
        match self.get_value(rank, key) {
            Some(v) if GET_OK.len() + v.len() > CLIENT_LINE_MAX => "rc=-1 msg=value_too_long_for_client".into(),
            Some(v) => format!("rc=0 msg=success value={v}"),
            None => "rc=-1 msg=key_not_found".into(),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::sync::mpsc;

    #[test]
    fn parses_requests() {
        let r = Request::parse("cmd=put kvsname=k  key=-bcast-1-0 value=segments=3\n").unwrap();
        assert_eq!((r.cmd, r.multi), ("put", false));
        assert_eq!(r.args, vec![("kvsname", "k"), ("key", "-bcast-1-0"), ("value", "segments=3")]);
        assert_eq!(r.get("value"), Some("segments=3"));
        assert_eq!(r.get("nope"), None);
        let r = Request::parse("cmd=put kvsname=k key=x value=").unwrap();
        assert_eq!(r.get("value"), Some(""));
        let r = Request::parse("mcmd=spawn").unwrap();
        assert_eq!((r.cmd, r.multi, r.args.len()), ("spawn", true, 0));
        let r = Request::parse("cmd=abort exitcode=7 error_msg=it went wrong = badly\r\n").unwrap();
        assert_eq!(r.get("exitcode"), Some("7"));
        assert_eq!(r.get("error_msg"), Some("it went wrong = badly"));
        for bad in ["", "   ", "key=x cmd=get", "cmd= key=x", "cmd=get key", "cmd=get =x", "cmd"] {
            assert!(Request::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// MPICH's MPIR_NODEMAP_populate_ids_from_mapping, for checking what process_mapping writes.
    fn mpich_decode(mapping: &str, size: usize) -> Vec<usize> {
        let inner = mapping.strip_prefix("(vector,").unwrap().strip_suffix(')').unwrap();
        let blocks: Vec<Vec<usize>> = inner
            .split("),")
            .map(|b| b.trim_matches(['(', ')']).split(',').map(|n| n.parse().unwrap()).collect())
            .collect();
        let (mut out, mut wrapped) = (Vec::new(), false);
        loop {
            let first = if wrapped { blocks.iter().position(|b| b[0] == 0).unwrap() } else { 0 };
            for b in &blocks[first..] {
                wrapped |= b[0] == 0;
                for node in b[0]..b[0] + b[1] {
                    for _ in 0..b[2] {
                        out.push(node);
                        if out.len() == size {
                            return out;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn process_mapping_matches_mpich() {
        assert_eq!(process_mapping(&[vec![0, 1], vec![2, 3]]), "(vector,(0,2,2))");
        assert_eq!(process_mapping(&[vec![0, 1, 2], vec![3]]), "(vector,(0,1,3),(1,1,1))");
        assert_eq!(process_mapping(&[vec![0, 2], vec![1, 3]]), "(vector,(0,2,1))");
        assert_eq!(process_mapping(&[vec![0, 1, 2, 3]]), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[vec![0]]), "(vector,(0,1,1))");
        assert_eq!(process_mapping(&[vec![0, 3], vec![1, 4], vec![2]]), "(vector,(0,3,1))");
        assert_eq!(process_mapping(&[vec![3], vec![0, 1, 2]]), "(vector,(0,1,3),(1,1,1))");
        for bad in [vec![], vec![vec![0], vec![0]], vec![vec![0, 2]], vec![vec![1]]] {
            assert_eq!(process_mapping(&bad), "", "{bad:?}");
        }
        // Pseudo-random placements decode, the MPICH way, to the same nodes (numbered by lowest rank).
        let mut seed = 12345u64;
        for _ in 0..500 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (nodes, size) = (1 + (seed >> 33) as usize % 5, 1 + (seed >> 40) as usize % 24);
            let mut per_node = vec![Vec::new(); nodes];
            for rank in 0..size as u32 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let node = if seed >> 62 == 0 { (seed >> 33) as usize % nodes } else { rank as usize % nodes };
                per_node[node].push(rank);
            }
            let mapping = process_mapping(&per_node);
            let decoded = mpich_decode(&mapping, size);
            for (a, ra) in decoded.iter().zip(0u32..) {
                for (b, rb) in decoded.iter().zip(0u32..) {
                    let same = per_node.iter().any(|n| n.contains(&ra) && n.contains(&rb));
                    assert_eq!(a == b, same, "{per_node:?} -> {mapping} -> {decoded:?}");
                }
            }
        }
    }

    /// A server for ranks 0-3 of a 4-rank step (PMI-1 and PMI-2 tests alike).
    pub(in crate::step) fn server(local_ranks: Vec<u32>) -> (PmiServer, mpsc::UnboundedReceiver<PmiEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = PmiConfig {
            kvsname: "berth_12_3".into(),
            size: 4,
            appnum: 0,
            appnums: vec![],
            universe_size: 4,
            process_mapping: "(vector,(0,2,2))".into(),
            local_ranks,
        };
        (PmiServer::new(cfg, tx), rx)
    }

    /// A fake rank: the client end of a socketpair served by `srv`.
    struct Rank(BufReader<UnixStream>);

    impl Rank {
        fn start(srv: &PmiServer, rank: u32) -> Rank {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let srv = srv.clone();
            tokio::spawn(async move { srv.serve_rank(rank, theirs).await });
            Rank(BufReader::new(ours))
        }
        async fn send(&mut self, bytes: &[u8]) {
            self.0.get_mut().write_all(bytes).await.unwrap();
        }
        async fn line(&mut self) -> String {
            let mut line = String::new();
            self.0.read_line(&mut line).await.unwrap();
            line.trim_end().to_string()
        }
        async fn ask(&mut self, request: &str) -> String {
            self.send(format!("{request}\n").as_bytes()).await;
            self.line().await
        }
    }

    #[tokio::test]
    async fn serves_a_barrier_epoch() {
        let (srv, mut events) = server(vec![0, 1]);
        let (mut r0, mut r1) = (Rank::start(&srv, 0), Rank::start(&srv, 1));
        let init = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0";
        assert_eq!(r0.ask("cmd=init pmi_version=1 pmi_subversion=1").await, init);
        assert_eq!(r1.ask("cmd=init pmi_version=1 pmi_subversion=1").await, init);
        assert_eq!(r0.ask("cmd=get_maxes").await, "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024");
        assert_eq!(r0.ask("cmd=get_appnum").await, "cmd=appnum appnum=0");
        assert_eq!(r0.ask("cmd=get_my_kvsname").await, "cmd=my_kvsname kvsname=berth_12_3");
        assert_eq!(r0.ask("cmd=get_universe_size").await, "cmd=universe_size size=4");
        let mapping = r1.ask("cmd=get kvsname=berth_12_3 key=PMI_process_mapping").await;
        assert_eq!(mapping, "cmd=get_result rc=0 msg=success value=(vector,(0,2,2))");
        assert_eq!(r0.ask("cmd=put kvsname=berth_12_3 key=a value=x=1").await, "cmd=put_result rc=0 msg=success");
        // Before the barrier only the putting rank sees its put.
        let a = "cmd=get kvsname=berth_12_3 key=a";
        assert_eq!(r0.ask(a).await, "cmd=get_result rc=0 msg=success value=x=1");
        assert_eq!(r1.ask(a).await, "cmd=get_result rc=-1 msg=key_not_found");
        r0.send(b"cmd=barrier_in\n").await;
        r1.send(b"cmd=barrier_in\n").await;
        let puts = vec![("a".to_string(), "x=1".to_string())];
        assert_eq!(events.recv().await, Some(PmiEvent::BarrierIn { puts: puts.clone() }));
        srv.barrier_out([puts, vec![("b".to_string(), "remote".to_string())]].concat());
        assert_eq!(r0.line().await, "cmd=barrier_out");
        assert_eq!(r1.line().await, "cmd=barrier_out");
        assert_eq!(r1.ask(a).await, "cmd=get_result rc=0 msg=success value=x=1");
        assert_eq!(r1.ask("cmd=get kvsname=berth_12_3 key=b").await, "cmd=get_result rc=0 msg=success value=remote");
        srv.set("PMI_dead_processes", "2");
        let dead = r0.ask("cmd=get kvsname=berth_12_3 key=PMI_dead_processes").await;
        assert_eq!(dead, "cmd=get_result rc=0 msg=success value=2");
        // A second epoch with no puts.
        r0.send(b"cmd=barrier_in\n").await;
        r1.send(b"cmd=barrier_in\n").await;
        assert_eq!(events.recv().await, Some(PmiEvent::BarrierIn { puts: vec![] }));
        srv.barrier_out(vec![]);
        assert_eq!((r0.line().await, r1.line().await), ("cmd=barrier_out".into(), "cmd=barrier_out".into()));
        assert_eq!(r0.ask("cmd=initack pmiid=0").await, "cmd=initack rc=0");
        assert_eq!(r0.line().await, "cmd=set size=4");
        assert_eq!(r0.line().await, "cmd=set rank=0");
        assert_eq!(r0.line().await, "cmd=set debug=0");
        for (mut r, rank) in [(r0, 0), (r1, 1)] {
            assert_eq!(r.ask("cmd=finalize").await, "cmd=finalize_ack");
            assert_eq!(events.recv().await, Some(PmiEvent::Finalized { rank }));
            drop(r);
        }
        drop(srv);
        assert_eq!(events.recv().await, None, "no protocol error after finalize");
    }

    /// MPMD: each local rank is told its own program's number.
    #[tokio::test]
    async fn each_rank_gets_its_programs_appnum() {
        let (tx, _events) = mpsc::unbounded_channel();
        let cfg = PmiConfig { appnums: vec![0, 1], ..server(vec![1, 2]).0.config().clone() };
        let srv = PmiServer::new(cfg, tx);
        let (mut r1, mut r2) = (Rank::start(&srv, 1), Rank::start(&srv, 2));
        assert_eq!(r1.ask("cmd=get_appnum").await, "cmd=appnum appnum=0");
        assert_eq!(r2.ask("cmd=get_appnum").await, "cmd=appnum appnum=1");
        assert_eq!(srv.config().appnum_of(3), 0, "a rank of another node: the step's");
    }

    #[tokio::test]
    async fn survives_bad_input() {
        let (srv, mut events) = server(vec![2, 3]);
        let mut r = Rank::start(&srv, 2);
        let mut err = |r: u32| match events.try_recv() {
            Ok(PmiEvent::ProtocolError { rank, message }) if rank == r => message,
            other => panic!("expected a protocol error of rank {r}, got {other:?}"),
        };
        r.send(b"cmd=get_appnum \xff\xfe\n").await;
        assert_eq!(r.line().await, "cmd=error rc=-1 msg=not_utf8");
        assert!(err(2).contains("UTF-8"));
        let long = format!("cmd=put kvsname=berth_12_3 key=k value={}\n", "v".repeat(LINE_MAX));
        r.send(long.as_bytes()).await;
        assert_eq!(r.line().await, "cmd=error rc=-1 msg=line_too_long");
        assert!(err(2).contains("longer"));
        assert_eq!(r.ask("cmd=get_appnum").await, "cmd=appnum appnum=0", "in step after a long line");
        assert_eq!(r.ask("cmd=frobnicate x=1").await, "cmd=error rc=-1 msg=unknown_command");
        assert!(err(2).contains("frobnicate"));
        assert_eq!(r.ask("hello").await, "cmd=error rc=-1 msg=parse_error");
        assert!(err(2).contains("key=value"));
        assert_eq!(r.ask("cmd=init pmi_version=2 pmi_subversion=0").await.rsplit(' ').next(), Some("rc=-1"));
        let key = "k".repeat(KEYLEN_MAX + 1);
        let bad_key = r.ask(&format!("cmd=put kvsname=berth_12_3 key={key} value=1")).await;
        assert_eq!(bad_key, "cmd=put_result rc=-1 msg=bad_key_length");
        let value = "v".repeat(VALLEN_MAX + 1);
        let bad_value = r.ask(&format!("cmd=put kvsname=berth_12_3 key=k value={value}")).await;
        assert_eq!(bad_value, "cmd=put_result rc=-1 msg=value_too_long");
        let other = r.ask("cmd=put kvsname=other key=k value=1").await;
        assert_eq!(other, "cmd=put_result rc=-1 msg=unknown_kvsname");
        assert_eq!(r.ask("cmd=get kvsname=berth_12_3").await, "cmd=get_result rc=-1 msg=missing_key");
        assert_eq!(r.ask("cmd=lookup_name service=s").await, "cmd=lookup_result rc=-1 msg=not_supported");
        srv.set("huge", &"h".repeat(VALLEN_MAX));
        let huge = r.ask("cmd=get kvsname=berth_12_3 key=huge").await;
        assert_eq!(huge, "cmd=get_result rc=-1 msg=value_too_long_for_client");
        let spawn = "mcmd=spawn\nnprocs=1\nexecname=/bin/true\ntotspawns=2\nspawnssofar=1\nendcmd\n";
        r.send(spawn.as_bytes()).await;
        r.send(spawn.replace("spawnssofar=1", "spawnssofar=2").as_bytes()).await;
        assert_eq!(r.line().await, "cmd=spawn_result rc=-1 msg=spawn_not_supported");
        assert!(err(2).contains("spawn"));
        assert!(events.try_recv().is_err(), "bad puts are answered, not reported");
        // A connection closed after init without finalize is reported.
        drop(r);
        let closed = events.recv().await;
        assert!(matches!(&closed, Some(PmiEvent::ProtocolError { rank: 2, message }) if message.contains("finalize")));
        // A rank this server does not serve.
        let (ours, theirs) = UnixStream::pair().unwrap();
        srv.serve_rank(0, theirs).await;
        assert!(matches!(events.recv().await, Some(PmiEvent::ProtocolError { rank: 0, .. })));
        drop(ours);
    }

    #[tokio::test]
    async fn abort_is_reported_and_not_answered() {
        let (srv, mut events) = server(vec![0]);
        let mut r = Rank::start(&srv, 0);
        r.send(b"cmd=init pmi_version=1 pmi_subversion=1\n").await;
        r.line().await;
        r.send(b"cmd=abort exitcode=7\n").await;
        let abort = PmiEvent::Abort { rank: 0, code: 7, message: String::new() };
        assert_eq!(events.recv().await, Some(abort));
        r.send(b"cmd=abort exitcode=3 error_msg=out of memory\n").await;
        let abort = PmiEvent::Abort { rank: 0, code: 3, message: "out of memory".into() };
        assert_eq!(events.recv().await, Some(abort));
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_millis(100), r.0.read(&mut buf)).await;
        assert!(read.is_err(), "abort gets no answer: the rank waits to be killed");
        drop(r);
        drop(srv);
        assert_eq!(events.recv().await, None, "closing after abort is not an error");
    }
}
