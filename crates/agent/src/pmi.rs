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
//! UCX (1.13, measured on one host; see the report in `tests/pmi_mpich.rs`): ranks that MPICH
//! sees on one node talk through MPICH's own shared memory; ranks it sees on different nodes talk
//! through UCX, which picks shared memory or `tcp` by itself when the processes share a host, the
//! same IPC namespace and a reachable interface, with no variable needed. The variables below are
//! only needed when that is not the case and are documented for the shepherd:
//! - ranks of one host in different network namespaces: UCX's `tcp` addresses are the interfaces of
//!   each namespace, so they must route to each other (`UCX_NET_DEVICES=<iface>` picks the one that
//!   does); `UCX_TLS=self,sm` (shared memory only) works between namespaces of one host as long
//!   as `/dev/shm` and the IPC namespace are shared.
//! - `UCX_TLS=tcp` restricts UCX to TCP (e.g. if shared memory is not shared between ranks).
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
//! (not supported). Bad lines are answered with `cmd=error rc=-1` and reported as
//! [`PmiEvent::ProtocolError`]; nothing a rank sends can make the server panic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// Limits announced by `get_maxes` and enforced on `put` (hydra's values). MPICH 4.0.2 then
/// shrinks its own value limit to 1024 - 256 - 64 - 30 = 674 so that a put fits its line buffer.
pub const KVSNAME_MAX: usize = 256;
pub const KEYLEN_MAX: usize = 64;
pub const VALLEN_MAX: usize = 1024;
/// Longest request line accepted (a put with maximal kvsname, key and value fits).
pub const LINE_MAX: usize = 2048;
/// MPICH reads each reply into a 1024-byte buffer: a longer reply line would desynchronise it.
const CLIENT_LINE_MAX: usize = 1023;
const GET_OK: &str = "cmd=get_result rc=0 msg=success value=";
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmiConfig {
    /// Name of the key-value space, e.g. "berth_12_3" (job 12 step 3); at most 255 bytes.
    pub kvsname: String,
    /// Total ranks of the application.
    pub size: u32,
    /// 0 (one executable).
    pub appnum: u32,
    /// = size.
    pub universe_size: u32,
    /// Value of `PMI_process_mapping`, see [`process_mapping`]; "" for none.
    pub process_mapping: String,
    /// Global rank numbers of the ranks on this node.
    pub local_ranks: Vec<u32>,
}

/// Builds MPICH's `PMI_process_mapping` value from the ranks of each node, in node order:
/// `(vector,(START,COUNT,SIZE),...)`, each block saying that nodes START..START+COUNT hold SIZE
/// consecutive ranks each; MPICH starts over at the first block when the blocks run out before
/// the ranks. `[[0,1],[2,3]]` gives `(vector,(0,2,2))`, `[[0,1,2],[3]]` gives
/// `(vector,(0,1,3),(1,1,1))`, cyclic `[[0,2],[1,3]]` gives `(vector,(0,2,1))`.
///
/// MPICH only compares node ids, so nodes are numbered by their lowest rank (the given order
/// when node 0 holds rank 0, as usual). Gives "" unless the ranks are exactly 0..N-1 once each:
/// the server then has no `PMI_process_mapping` and MPICH exchanges hostnames instead.
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PmiEvent {
    /// Every local rank has entered barrier_in: here are all puts made by local ranks since the
    /// previous barrier. Answer with [`PmiServer::barrier_out`].
    BarrierIn { puts: Vec<(String, String)> },
    /// A rank called abort (MPI_Abort): rank, exit code, message ("" from MPICH 4.0.2). The rank
    /// then waits for an answer that never comes: the shepherd must kill the application.
    Abort { rank: u32, code: i32, message: String },
    /// A rank called finalize.
    Finalized { rank: u32 },
    /// A rank's PMI connection broke (or closed after init without finalize) or spoke garbage:
    /// rank, description. Not fatal for the server.
    ProtocolError { rank: u32, message: String },
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
    pub fn parse(line: &'a str) -> Result<Request<'a>, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        let (head, msg) = match line.find(" error_msg=") {
            Some(i) if line.starts_with("cmd=abort ") => (&line[..i], Some(&line[i + 11..])),
            _ => (line, None),
        };
        let mut args = Vec::new();
        for tok in head.split(' ').filter(|t| !t.is_empty()) {
            match tok.split_once('=') {
                Some((k, v)) if !k.is_empty() => args.push((k, v)),
                _ => return Err(format!("token {tok:?} is not key=value")),
            }
        }
        args.extend(msg.map(|m| ("error_msg", m)));
        let Some(&(first, cmd)) = args.first() else { return Err("empty request".into()) };
        if (first != "cmd" && first != "mcmd") || cmd.is_empty() {
            return Err(format!("request starts with {first}={cmd}, not cmd=NAME"));
        }
        Ok(Request { cmd, multi: first == "mcmd", args: args.split_off(1) })
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.args.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// The node-local PMI server of one application. Cheap to clone (shared state).
#[derive(Clone)]
pub struct PmiServer {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: PmiConfig,
    events: UnboundedSender<PmiEvent>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Visible to every get: barrier results, injected values, PMI_process_mapping.
    kvs: HashMap<String, String>,
    /// Puts since the last barrier (rank, key, value): only their own rank sees them before it.
    pending: Vec<(u32, String, String)>,
    /// Ranks in barrier_in, released by barrier_out.
    waiting: HashMap<u32, oneshot::Sender<()>>,
    /// BarrierIn was sent and barrier_out not yet called.
    barrier_complete: bool,
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
    pub fn new(cfg: PmiConfig, events: UnboundedSender<PmiEvent>) -> PmiServer {
        let mut state = State::default();
        // Served only if MPICH can read the reply; otherwise it falls back to hostnames.
        if !cfg.process_mapping.is_empty() && GET_OK.len() + cfg.process_mapping.len() <= CLIENT_LINE_MAX {
            state.kvs.insert("PMI_process_mapping".into(), cfg.process_mapping.clone());
        }
        PmiServer { inner: Arc::new(Inner { cfg, events, state: Mutex::new(state) }) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: PmiEvent) {
        let _ = self.inner.events.send(event);
    }

    fn protocol_error(&self, rank: u32, message: String) {
        self.emit(PmiEvent::ProtocolError { rank, message });
    }

    /// Values other parts may inject (e.g. "PMI_dead_processes"); visible to every get at once.
    pub fn set(&self, key: &str, value: &str) {
        self.state().kvs.insert(key.to_string(), value.to_string());
    }

    /// The tree's answer to a barrier: the union of all puts of all ranks in this epoch. Stores
    /// them in the local KVS and answers barrier_out to every waiting local rank. Called when no
    /// barrier is complete (no BarrierIn outstanding), it only stores the values.
    pub fn barrier_out(&self, kvs: Vec<(String, String)>) {
        let waiting = {
            let mut st = self.state();
            st.kvs.extend(kvs);
            if !std::mem::take(&mut st.barrier_complete) {
                return;
            }
            std::mem::take(&mut st.waiting)
        };
        for tx in waiting.into_values() {
            let _ = tx.send(());
        }
    }

    /// Serve one local rank on its end of the socketpair until it closes. Spawn with tokio::spawn.
    pub async fn serve_rank(&self, rank: u32, stream: UnixStream) {
        if !self.inner.cfg.local_ranks.contains(&rank) {
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
                    Ok(Err(e)) => self.bad(rank, e, "parse_error"),
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
                    self.protocol_error(rank, "MPI_Comm_spawn is not supported".into());
                    return (sofar >= total).then(|| "cmd=spawn_result rc=-1 msg=spawn_not_supported".into());
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
        let cfg = &self.inner.cfg;
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
            "get_appnum" => format!("cmd=appnum appnum={}", cfg.appnum),
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

    fn put(&self, rank: u32, req: &Request<'_>) -> &'static str {
        let (Some(kvsname), Some(key)) = (req.get("kvsname"), req.get("key")) else {
            return "rc=-1 msg=missing_kvsname_or_key";
        };
        let value = req.get("value").unwrap_or("");
        if kvsname != self.inner.cfg.kvsname {
            "rc=-1 msg=unknown_kvsname"
        } else if key.is_empty() || key.len() > KEYLEN_MAX {
            "rc=-1 msg=bad_key_length"
        } else if value.len() > VALLEN_MAX {
            "rc=-1 msg=value_too_long"
        } else {
            self.state().pending.push((rank, key.to_string(), value.to_string()));
            "rc=0 msg=success"
        }
    }

    fn get(&self, rank: u32, req: &Request<'_>) -> String {
        let Some(key) = req.get("key") else { return "rc=-1 msg=missing_key".into() };
        if req.get("kvsname").is_some_and(|k| k != self.inner.cfg.kvsname) {
            return "rc=-1 msg=unknown_kvsname".into();
        }
        let st = self.state();
        let own = st.pending.iter().rev().find(|(r, k, _)| *r == rank && k == key).map(|(_, _, v)| v);
        match st.kvs.get(key).or(own) {
            Some(v) if GET_OK.len() + v.len() > CLIENT_LINE_MAX => "rc=-1 msg=value_too_long_for_client".into(),
            Some(v) => format!("rc=0 msg=success value={v}"),
            None => "rc=-1 msg=key_not_found".into(),
        }
    }

    fn barrier_in(&self, rank: u32) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state();
        st.waiting.insert(rank, tx);
        let local = &self.inner.cfg.local_ranks;
        if !st.barrier_complete && local.iter().all(|r| st.waiting.contains_key(r)) {
            st.barrier_complete = true;
            let puts = std::mem::take(&mut st.pending).into_iter().map(|(_, k, v)| (k, v)).collect();
            drop(st);
            self.emit(PmiEvent::BarrierIn { puts });
        }
        rx
    }
}
