//! The PMI-2 wire protocol, served on a rank's PMI connection when its first request asks for
//! it, with the same KVS, barrier and events as PMI-1 ([`crate::step::pmi`]): ranks of one step may mix
//! both protocols.
//!
//! # Wire
//!
//! The client opens with the PMI-1 line `cmd=init pmi_version=2 pmi_subversion=0`, answered
//! `cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0`. From then on each message, both
//! ways, is a 6-byte decimal length field (Slurm's libpmi2 pads it with spaces on the right:
//! `23    cmd=fullinit;pmirank=0;`) and that many bytes of `key=value;` pairs, the first being
//! `cmd=NAME`; a `;` inside a value is doubled. The answer to `NAME` is `NAME-response` with `rc`
//! (0 = success) and, on failure, `errmsg`. A `thrid` (threaded MPICH clients match answers to
//! requests with it) is echoed back.
//!
//! # Commands
//!
//! - `fullinit`: rank, size, appnum, `debugged=FALSE`, `pmiverbose=FALSE`. No `spawner-jobid`:
//!   both libpmi2 and MPICH take its mere presence to mean "started by MPI_Comm_spawn". A
//!   non-negative `pmirank` (-1: unknown to the client) must be the connection's rank.
//! - `job-getid`: `jobid` = the kvsname.
//! - `kvs-put`, `kvs-get` (`found=TRUE|FALSE`; `jobid` may be empty or the kvsname; `srcid` is
//!   ignored), `kvs-fence`: PMI-1's put, get and barrier (same limits: keys 1..=64 bytes, values
//!   up to 1024), answered when [`PmiServer::barrier_out`] comes back down the tree.
//! - `info-putnodeattr`, `info-getnodeattr` (`wait=TRUE` blocks until the key is put): attributes
//!   shared by the ranks of this node only.
//! - `info-getjobattr`: `PMI_process_mapping` (as PMI-1 gives it), `universeSize`, else whatever
//!   a PMI-1 get would see (e.g. `PMI_dead_processes`); `found=FALSE` otherwise.
//! - `finalize` ([`PmiEvent::Finalized`]); `abort` ([`PmiEvent::Abort`], no answer: the client
//!   exits by itself). PMI-2's abort has no exit code that means anything (MPICH 4.1's client
//!   sends `exitcode=-1`, libpmi2 none), so the code is the one in MPICH's message
//!   `application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1`, else a non-negative
//!   `exitcode`, else 1. `isworld` is ignored: without spawn the application is the only group.
//! - `spawn`, `name-publish`, `name-unpublish`, `name-lookup`, `job-connect`, `job-disconnect`:
//!   `rc=-1` with an errmsg (not supported). Any other command: `rc=-1`, reported as
//!   [`PmiEvent::ProtocolError`].
//!
//! # Environment (Slurm 22.05's libpmi2, Debian `libpmi2-0`)
//!
//! It reads `PMI_FD` (without it, a singleton of size 1) and `PMI_RANK` (sent as `pmirank`);
//! `PMI_JOBID` and `PMI_ID` are optional (sent as `pmijobid`, `srcid`; berth sets neither);
//! `PMI2_DEBUG=1` traces. Size, rank and appnum come from `fullinit`. It reads no `PMI_SPAWNED`,
//! `PMI_SIZE` or kvsname.
//!
//! # Bad input
//!
//! A length field that is not a number cannot be skipped: it gets an error answer and the
//! connection is closed. A message longer than [`MESSAGE_MAX`] is skipped and answered with an
//! error; so are messages that do not parse. Every such event is a [`PmiEvent::ProtocolError`]
//! (the shepherd logs it); missing or oversized keys and values are only answered `rc=-1`. No
//! answer exceeds what libpmi2 can parse (keys 64, values 1024 bytes).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::step::pmi_kvs::{NodeAttr, PmiEvent, PmiServer};

/// Digits of a message's length field, padded with spaces.
pub const LENGTH_FIELD: usize = 6;
/// Longest message accepted (the client's PMII_MAX_COMMAND_LEN).
pub const MESSAGE_MAX: usize = 64 * 1024;
/// libpmi2 fails to parse an answer with a longer key or value (its PMI2_MAX_KEYLEN/VALLEN).
const CLIENT_KEY_MAX: usize = 64;
const CLIENT_VALUE_MAX: usize = 1024;
const INIT_RESPONSE: &[u8] = b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n";
/// rc of a failed command (PMI2_FAIL).
const FAIL: i32 = -1;
/// Commands of other process managers' PMI-2 servers that berth answers with "not supported".
const UNSUPPORTED: [&str; 5] = ["name-publish", "name-unpublish", "name-lookup", "job-connect", "job-disconnect"];

/// Why a PMI-2 message or its length field does not parse (reported as the rank's protocol error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("empty message")]
    Empty,
    #[error("message is not UTF-8")]
    NotUtf8,
    /// The text (at most 64 bytes of it) that has no `=`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    #[error("bad key {0:?}")]
    BadKey(String),
    #[error("message does not start with cmd=NAME")]
    NoCommand,
    #[error("bad length field {0:?}")]
    BadLength(String),
}

/// Why a rank's PMI-2 connection cannot be read on: it failed, or closed inside a message.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("PMI-2 connection closed inside a length field")]
    ClosedInLength,
    #[error("PMI-2 connection closed inside a message")]
    ClosedInMessage,
    #[error("reading the PMI-2 connection: {0}")]
    Read(std::io::Error),
}

/// One PMI-2 message: `key=value` pairs in order, the first `cmd=NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub pairs: Vec<(String, String)>,
}

impl Message {
    pub fn new(cmd: &str) -> Message {
        Message { pairs: vec![("cmd".into(), cmd.into())] }
    }

    pub fn with(mut self, key: &str, value: impl ToString) -> Message {
        self.pairs.push((key.into(), value.to_string()));
        self
    }

    /// The command name ("" if the first pair is not `cmd`, which [`Message::parse`] refuses).
    pub fn cmd(&self) -> &str {
        match self.pairs.first() {
            Some((k, v)) if k == "cmd" => v,
            _ => "",
        }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The pairs as `key=value;`, each `;` of a value doubled.
    pub fn body(&self) -> String {
        let mut body = String::new();
        for (k, v) in &self.pairs {
            body.push_str(k);
            body.push('=');
            body.push_str(&v.replace(';', ";;"));
            body.push(';');
        }
        body
    }

    /// The whole message: length field and body. The field has room for 6 digits; the server
    /// only encodes answers it has bounded with [`fit_for_client`].
    pub fn encode(&self) -> Vec<u8> {
        let body = self.body();
        format!("{:<width$}{body}", body.len(), width = LENGTH_FIELD).into_bytes()
    }

    /// Parses a body (without its length field). The last `;` may be missing.
    pub fn parse(body: &[u8]) -> Result<Message, MessageError> {
        if body.is_empty() {
            return Err(MessageError::Empty);
        }
        let mut rest = std::str::from_utf8(body).map_err(|_| MessageError::NotUtf8)?;
        let mut pairs = Vec::new();
        while !rest.is_empty() {
            let Some((key, after)) = rest.split_once('=') else {
                return Err(MessageError::NotKeyValue(clip(rest).to_string()));
            };
            if key.is_empty() || key.contains(';') {
                return Err(MessageError::BadKey(clip(key).to_string()));
            }
            let (value, next) = split_value(after);
            pairs.push((key.to_string(), value));
            rest = next;
        }
        let message = Message { pairs };
        if message.cmd().is_empty() {
            return Err(MessageError::NoCommand);
        }
        Ok(message)
    }
}

/// Splits an escaped value from what follows its terminating `;`, undoing `;;`.
fn split_value(after: &str) -> (String, &str) {
    let bytes = after.as_bytes();
    let (mut value, mut start, mut i) = (String::new(), 0, 0);
    while i < bytes.len() {
        if bytes[i] != b';' {
            i += 1;
            continue;
        }
        value.push_str(&after[start..i]);
        if bytes.get(i + 1) != Some(&b';') {
            return (value, &after[i + 1..]);
        }
        value.push(';');
        i += 2;
        start = i;
    }
    value.push_str(&after[start..]);
    (value, "")
}

/// At most 64 bytes of client text, for error messages.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads a length field: decimal digits, padded with spaces on either side.
pub fn parse_length(field: &[u8]) -> Result<usize, MessageError> {
    let digits = std::str::from_utf8(field).map(|f| f.trim_matches(' ')).unwrap_or("");
    match digits.parse::<usize>() {
        Ok(len) if digits.bytes().all(|b| b.is_ascii_digit()) => Ok(len),
        _ => Err(MessageError::BadLength(String::from_utf8_lossy(field).into_owned())),
    }
}

/// Replaces an answer libpmi2 could not parse (key over 64 or value over 1024 bytes) by an error.
pub fn fit_for_client(answer: Message) -> Message {
    if answer.pairs.iter().all(|(k, v)| k.len() <= CLIENT_KEY_MAX && v.len() <= CLIENT_VALUE_MAX) {
        return answer;
    }
    let name = if answer.cmd().len() <= CLIENT_VALUE_MAX { answer.cmd() } else { "error" };
    Message::new(name).with("rc", FAIL).with("errmsg", "answer too long for the PMI-2 client (value over 1024 bytes)")
}

enum Frame {
    Message(Vec<u8>),
    /// Longer than MESSAGE_MAX: skipped.
    TooLong(usize),
    /// The length field is not a number: the stream cannot be followed any more.
    BadLength(MessageError),
    Eof,
}

/// Reads one message. Err: the connection failed or closed inside a message.
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Frame, FrameError> {
    let mut field = [0u8; LENGTH_FIELD];
    let mut filled = 0;
    while filled < LENGTH_FIELD {
        match rd.read(&mut field[filled..]).await {
            Ok(0) if filled == 0 => return Ok(Frame::Eof),
            Ok(0) => return Err(FrameError::ClosedInLength),
            Ok(n) => filled += n,
            Err(e) => return Err(FrameError::Read(e)),
        }
    }
    let len = match parse_length(&field) {
        Ok(len) => len,
        Err(e) => return Ok(Frame::BadLength(e)),
    };
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::ClosedInMessage,
        _ => FrameError::Read(e),
    };
    if len > MESSAGE_MAX {
        // Skip it, so that the next message is read from its start.
        let mut body = (&mut *rd).take(len as u64);
        let skipped = tokio::io::copy(&mut body, &mut tokio::io::sink()).await.map_err(closed)?;
        if skipped < len as u64 {
            return Err(closed(std::io::ErrorKind::UnexpectedEof.into()));
        }
        return Ok(Frame::TooLong(len));
    }
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body).await.map_err(closed)?;
    Ok(Frame::Message(body))
}

enum Answer {
    Reply(Message),
    /// No answer (abort).
    Silent,
    /// The server is gone (its barrier or node attribute will never come).
    Stop,
}

/// Serves one rank in PMI-2 after its init line, until it closes the connection. Called by
/// [`PmiServer::serve_rank`], which has read the init line (buffered bytes stay in `rd`).
pub(crate) async fn serve_rank<R, W>(srv: &PmiServer, rank: u32, mut rd: R, mut wr: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if let Err(e) = wr.write_all(INIT_RESPONSE).await {
        return srv.protocol_error(rank, format!("writing the PMI-2 connection: {e}"));
    }
    let mut session = Session { srv, rank, done: false };
    loop {
        let answer = match read_frame(&mut rd).await {
            Ok(Frame::Eof) => break,
            Err(e) => return srv.protocol_error(rank, e.to_string()),
            Ok(Frame::BadLength(e)) => {
                // Answer, so that the client fails at once instead of waiting; then give up.
                let _ = wr.write_all(&session.bad(format!("{e}; closing the connection"), "error").encode()).await;
                return;
            }
            Ok(Frame::TooLong(len)) => session.bad(format!("message of {len} bytes (most {MESSAGE_MAX})"), "error"),
            Ok(Frame::Message(body)) => match Message::parse(&body) {
                Err(e) => session.bad(e.to_string(), "error"),
                Ok(req) => match session.answer(&req).await {
                    Answer::Reply(reply) => match req.get("thrid") {
                        Some(thrid) => reply.with("thrid", thrid),
                        None => reply,
                    },
                    Answer::Silent => continue,
                    Answer::Stop => return,
                },
            },
        };
        if let Err(e) = wr.write_all(&fit_for_client(answer).encode()).await {
            return srv.protocol_error(rank, format!("writing the PMI-2 connection: {e}"));
        }
    }
    if !session.done {
        srv.protocol_error(rank, "PMI-2 connection closed before finalize".into());
    }
}

struct Session<'a> {
    srv: &'a PmiServer,
    rank: u32,
    /// Finalized or aborted: closing is expected.
    done: bool,
}

/// `NAME-response` with rc=0.
fn success(req: &Message) -> Message {
    Message::new(&format!("{}-response", req.cmd())).with("rc", 0)
}

fn failure(req: &Message, errmsg: &str) -> Message {
    Message::new(&format!("{}-response", req.cmd())).with("rc", FAIL).with("errmsg", errmsg)
}

fn found(req: &Message, value: Option<String>) -> Message {
    match value {
        Some(value) => success(req).with("found", "TRUE").with("value", value),
        None => success(req).with("found", "FALSE"),
    }
}

impl Session<'_> {
    /// Reports a bad message and gives the error answer for it.
    fn bad(&self, message: String, cmd: &str) -> Message {
        let answer = Message::new(cmd).with("rc", FAIL).with("errmsg", &message);
        self.srv.protocol_error(self.rank, message);
        answer
    }

    async fn answer(&mut self, req: &Message) -> Answer {
        let (srv, rank) = (self.srv, self.rank);
        let cfg = srv.config();
        let reply = match req.cmd() {
            "fullinit" => self.fullinit(req),
            "job-getid" => success(req).with("jobid", &cfg.kvsname),
            "kvs-put" => match req.get("key") {
                None => failure(req, "missing key"),
                Some(key) => match srv.put_value(rank, key, req.get("value").unwrap_or("")) {
                    Ok(()) => success(req),
                    Err(code) => failure(req, code),
                },
            },
            "kvs-fence" => match srv.barrier_in(rank).await {
                Ok(()) => success(req),
                Err(_) => return Answer::Stop,
            },
            "kvs-get" => match (req.get("key"), req.get("jobid")) {
                (None, _) => failure(req, "missing key"),
                (Some(_), Some(jobid)) if !jobid.is_empty() && jobid != cfg.kvsname => {
                    failure(req, &format!("unknown jobid {}", clip(jobid)))
                }
                (Some(key), _) => found(req, srv.get_value(rank, key)),
            },
            "info-putnodeattr" => match (req.get("key"), req.get("value").unwrap_or("")) {
                (None, _) => failure(req, "missing key"),
                (Some(key), _) if key.is_empty() || key.len() > CLIENT_KEY_MAX => failure(req, "bad key length"),
                (Some(_), value) if value.len() > CLIENT_VALUE_MAX => failure(req, "value too long"),
                (Some(key), value) => {
                    srv.with_node_attrs(|attrs| attrs.put(key, value));
                    success(req)
                }
            },
            "info-getnodeattr" => {
                let Some(key) = req.get("key") else { return Answer::Reply(failure(req, "missing key")) };
                let wait = req.get("wait") == Some("TRUE");
                match srv.with_node_attrs(|attrs| attrs.get(key, wait)) {
                    NodeAttr::Found(value) => found(req, Some(value)),
                    NodeAttr::Missing => found(req, None),
                    NodeAttr::Waiting(rx) => match rx.await {
                        Ok(value) => found(req, Some(value)),
                        Err(_) => return Answer::Stop,
                    },
                }
            }
            "info-getjobattr" => match req.get("key") {
                None => failure(req, "missing key"),
                Some(key) => found(req, self.job_attr(key)),
            },
            "finalize" => {
                srv.emit(PmiEvent::Finalized { rank });
                self.done = true;
                success(req)
            }
            "abort" => {
                let message = req.get("message").or(req.get("msg")).unwrap_or("").to_string();
                let exitcode = req.get("exitcode").and_then(|c| c.parse::<i32>().ok()).filter(|&c| c >= 0);
                let code = mpi_abort_code(&message).or(exitcode).unwrap_or(1);
                srv.emit(PmiEvent::Abort { rank, code, message });
                self.done = true;
                return Answer::Silent;
            }
            "spawn" => {
                srv.protocol_error(rank, "MPI_Comm_spawn (PMI-2 spawn) is not supported".into());
                failure(req, "spawn is not supported by berth")
            }
            cmd if UNSUPPORTED.contains(&cmd) => failure(req, &format!("{cmd} is not supported by berth")),
            cmd => {
                srv.protocol_error(rank, format!("unknown PMI-2 command {:?}", clip(cmd)));
                failure(req, &format!("unknown command {}", clip(cmd)))
            }
        };
        Answer::Reply(reply)
    }

    fn fullinit(&self, req: &Message) -> Message {
        let cfg = self.srv.config();
        match req.get("pmirank").map(str::parse::<i64>) {
            Some(Ok(r)) if r >= 0 && r != i64::from(self.rank) => {
                return failure(req, &format!("pmirank {r} on the connection of rank {}", self.rank))
            }
            Some(Err(_)) => return failure(req, "pmirank is not a number"),
            _ => {}
        }
        success(req)
            .with("pmi-version", 2)
            .with("pmi-subversion", 0)
            .with("rank", self.rank)
            .with("size", cfg.size)
            .with("appnum", cfg.appnum_of(self.rank))
            .with("debugged", "FALSE")
            .with("pmiverbose", "FALSE")
    }

    fn job_attr(&self, key: &str) -> Option<String> {
        let cfg = self.srv.config();
        let own = match key {
            "PMI_process_mapping" => Some(cfg.process_mapping.clone()),
            "universeSize" => Some(cfg.universe_size.to_string()),
            _ => None,
        };
        // An unusable mapping is left out, as PMI-1 does: MPICH then exchanges hostnames.
        let own = own.filter(|v| !v.is_empty() && v.len() <= CLIENT_VALUE_MAX);
        own.or_else(|| self.srv.get_value(self.rank, key))
    }
}

/// The code in MPICH's abort message `application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1`.
fn mpi_abort_code(message: &str) -> Option<i32> {
    let (_, args) = message.split_once("MPI_Abort(")?;
    let (args, _) = args.split_once(')')?;
    args.rsplit(',').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::pmi::tests::server;
    use crate::step::pmi::PmiConfig;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixStream;
    use tokio::sync::mpsc;

    #[test]
    fn frames_and_escapes() {
        let m = Message::new("fullinit").with("pmirank", 0);
        assert_eq!(m.encode(), b"23    cmd=fullinit;pmirank=0;");
        let m = Message::new("kvs-put").with("key", "k").with("value", "a;b;;c;=d");
        assert_eq!(m.body(), "cmd=kvs-put;key=k;value=a;;b;;;;c;;=d;");
        assert_eq!(Message::parse(m.body().as_bytes()), Ok(m.clone()));
        assert_eq!(Message::parse(b"cmd=x;v=;;;w=;"), Ok(Message::new("x").with("v", ";").with("w", "")));
        assert_eq!(Message::parse(b"cmd=x;v=1"), Ok(Message::new("x").with("v", "1")), "last ; missing");
        assert_eq!(Message::parse(b"cmd=x;v=a=b;").map(|m| m.get("v").map(String::from)), Ok(Some("a=b".into())));
        for bad in [&b""[..], b"=x;", b"cmd", b"key=1;cmd=x;", b"cmd=;", b"cmd=x;a;b=1;", b"cmd=\xff;"] {
            assert!(Message::parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse_length(b"23    "), Ok(23));
        assert_eq!(parse_length(b"    23"), Ok(23));
        assert_eq!(parse_length(b"000000"), Ok(0));
        for bad in [b"abc   ", b"      ", b"2 3   ", b"-1    ", b"+1    ", b"1\n    "] {
            assert!(parse_length(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(mpi_abort_code("application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1"), Some(7));
        assert_eq!(mpi_abort_code("MPI_Abort(comm, -3)"), Some(-3));
        assert_eq!(mpi_abort_code("out of memory"), None);
        let long = Message::new("kvs-get-response").with("rc", 0).with("value", "v".repeat(CLIENT_VALUE_MAX + 1));
        let fitted = fit_for_client(long);
        assert_eq!((fitted.cmd(), fitted.get("rc")), ("kvs-get-response", Some("-1")));
        assert_eq!(clip(&"é".repeat(40)).len(), 64);
    }

    /// A fake rank: the client end of a socketpair served by `srv`.
    struct Client(BufReader<UnixStream>);

    impl Client {
        fn connect(srv: &PmiServer, rank: u32) -> Client {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let srv = srv.clone();
            tokio::spawn(async move { srv.serve_rank(rank, theirs).await });
            Client(BufReader::new(ours))
        }
        /// Connects and switches to PMI-2.
        async fn start(srv: &PmiServer, rank: u32) -> Client {
            let mut c = Client::connect(srv, rank);
            assert_eq!(c.line("cmd=init pmi_version=2 pmi_subversion=0").await, String::from_utf8_lossy(INIT_RESPONSE));
            c
        }
        /// A PMI-1 request and its answer.
        async fn line(&mut self, line: &str) -> String {
            self.send(format!("{line}\n").as_bytes()).await;
            self.read_line().await
        }
        async fn read_line(&mut self) -> String {
            let mut answer = String::new();
            self.0.read_line(&mut answer).await.unwrap();
            answer
        }
        async fn send(&mut self, bytes: &[u8]) {
            self.0.get_mut().write_all(bytes).await.unwrap();
        }
        async fn recv(&mut self) -> Message {
            let mut field = [0u8; LENGTH_FIELD];
            self.0.read_exact(&mut field).await.unwrap();
            let mut body = vec![0u8; parse_length(&field).unwrap()];
            self.0.read_exact(&mut body).await.unwrap();
            Message::parse(&body).unwrap()
        }
        async fn ask(&mut self, req: Message) -> Message {
            self.send(&req.encode()).await;
            self.recv().await
        }
        /// Sends `cmd` with `pairs` and gives the answer's pairs after cmd, as `k=v` strings.
        async fn call(&mut self, cmd: &str, pairs: &[(&str, &str)]) -> Vec<String> {
            let req = pairs.iter().fold(Message::new(cmd), |m, (k, v)| m.with(k, v));
            let answer = self.ask(req).await;
            assert_eq!(answer.cmd(), format!("{cmd}-response"));
            answer.pairs[1..].iter().map(|(k, v)| format!("{k}={v}")).collect()
        }
    }

    fn protocol_error(events: &mut mpsc::UnboundedReceiver<PmiEvent>, rank: u32) -> String {
        match events.try_recv() {
            Ok(PmiEvent::ProtocolError { rank: r, message }) if r == rank => message,
            other => panic!("expected a protocol error of rank {rank}, got {other:?}"),
        }
    }

    /// MPMD: fullinit tells each rank its own program's number.
    #[tokio::test]
    async fn fullinit_gives_each_rank_its_appnum() {
        let (tx, _events) = mpsc::unbounded_channel();
        let cfg = PmiConfig { appnums: vec![2, 0], ..server(vec![0, 1]).0.config().clone() };
        let srv = PmiServer::new(cfg, tx);
        let (mut r0, mut r1) = (Client::start(&srv, 0).await, Client::start(&srv, 1).await);
        assert_eq!(r0.call("fullinit", &[("pmirank", "0")]).await[5], "appnum=2");
        assert_eq!(r1.call("fullinit", &[("pmirank", "1")]).await[5], "appnum=0");
    }

    #[tokio::test]
    async fn serves_each_command() {
        let (srv, mut events) = server(vec![0, 1]);
        let (mut r0, mut r1) = (Client::start(&srv, 0).await, Client::start(&srv, 1).await);
        let init = "rc=0 pmi-version=2 pmi-subversion=0 rank=1 size=4 appnum=0 debugged=FALSE pmiverbose=FALSE";
        assert_eq!(r1.call("fullinit", &[("pmirank", "1"), ("threaded", "FALSE")]).await.join(" "), init);
        assert_eq!(r0.call("fullinit", &[("pmirank", "-1")]).await[3], "rank=0", "-1: rank unknown to the client");
        assert_eq!(r0.call("job-getid", &[]).await, ["rc=0", "jobid=berth_12_3"]);
        assert_eq!(r0.call("kvs-put", &[("key", "a"), ("value", "x;y=1")]).await, ["rc=0"]);
        // Before the fence only the putting rank sees its put.
        let get_a = [("jobid", "berth_12_3"), ("srcid", "0"), ("key", "a")];
        assert_eq!(r0.call("kvs-get", &get_a).await, ["rc=0", "found=TRUE", "value=x;y=1"]);
        assert_eq!(r1.call("kvs-get", &get_a).await, ["rc=0", "found=FALSE"]);
        r0.send(&Message::new("kvs-fence").encode()).await;
        r1.send(&Message::new("kvs-fence").encode()).await;
        let puts = vec![("a".to_string(), "x;y=1".to_string())];
        assert_eq!(events.recv().await, Some(PmiEvent::BarrierIn { puts: puts.clone() }));
        srv.barrier_out([puts, vec![("b".to_string(), "remote".to_string())]].concat());
        assert_eq!(r0.recv().await, Message::new("kvs-fence-response").with("rc", 0));
        assert_eq!(r1.recv().await, Message::new("kvs-fence-response").with("rc", 0));
        assert_eq!(r1.call("kvs-get", &[("jobid", ""), ("key", "a")]).await, ["rc=0", "found=TRUE", "value=x;y=1"]);
        assert_eq!(r1.call("kvs-get", &[("key", "b")]).await, ["rc=0", "found=TRUE", "value=remote"]);
        // Job attributes.
        let attr = |key| [("key", key)];
        let mapping = ["rc=0", "found=TRUE", "value=(vector,(0,2,2))"];
        assert_eq!(r0.call("info-getjobattr", &attr("PMI_process_mapping")).await, mapping);
        assert_eq!(r0.call("info-getjobattr", &attr("universeSize")).await, ["rc=0", "found=TRUE", "value=4"]);
        assert_eq!(r0.call("info-getjobattr", &attr("nope")).await, ["rc=0", "found=FALSE"]);
        srv.set("PMI_dead_processes", "2,3");
        let dead = ["rc=0", "found=TRUE", "value=2,3"];
        assert_eq!(r0.call("info-getjobattr", &attr("PMI_dead_processes")).await, dead);
        // Node attributes: a waiting get is answered by the other rank's put.
        let no_wait = [("key", "shm"), ("wait", "FALSE")];
        assert_eq!(r0.call("info-getnodeattr", &no_wait).await, ["rc=0", "found=FALSE"]);
        r0.send(&Message::new("info-getnodeattr").with("key", "shm").with("wait", "TRUE").encode()).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(r1.call("info-putnodeattr", &[("key", "shm"), ("value", "/dev/shm/x")]).await, ["rc=0"]);
        assert_eq!(r0.recv().await.get("value"), Some("/dev/shm/x"));
        assert_eq!(r1.call("info-getnodeattr", &no_wait).await, ["rc=0", "found=TRUE", "value=/dev/shm/x"]);
        // Not supported.
        let spawn = r0.call("spawn", &[("ncmds", "1"), ("subcmd", "/bin/true"), ("maxprocs", "1")]).await;
        assert_eq!(spawn, ["rc=-1", "errmsg=spawn is not supported by berth"]);
        assert!(protocol_error(&mut events, 0).contains("spawn"));
        assert_eq!(r0.call("name-lookup", &[("name", "s")]).await[0], "rc=-1");
        // A threaded client's thrid comes back.
        let answer = r0.ask(Message::new("job-getid").with("thrid", "0x7f00")).await;
        assert_eq!(answer.get("thrid"), Some("0x7f00"));
        for (mut r, rank) in [(r0, 0), (r1, 1)] {
            assert_eq!(r.call("finalize", &[]).await, ["rc=0"]);
            assert_eq!(events.recv().await, Some(PmiEvent::Finalized { rank }));
            drop(r);
        }
        drop(srv);
        assert_eq!(events.recv().await, None, "no protocol error after finalize");
    }

    #[tokio::test]
    async fn mixes_with_pmi1_in_one_barrier() {
        let (srv, mut events) = server(vec![2, 3]);
        let mut pmi1 = Client::connect(&srv, 2);
        let mut pmi2 = Client::start(&srv, 3).await;
        assert!(pmi1.line("cmd=init pmi_version=1 pmi_subversion=1").await.ends_with("rc=0\n"));
        assert!(pmi1.line("cmd=put kvsname=berth_12_3 key=one value=1").await.contains("rc=0"));
        assert_eq!(pmi2.call("kvs-put", &[("key", "two"), ("value", "2")]).await, ["rc=0"]);
        pmi1.send(b"cmd=barrier_in\n").await;
        pmi2.send(&Message::new("kvs-fence").encode()).await;
        let Some(PmiEvent::BarrierIn { mut puts }) = events.recv().await else { panic!("one barrier for both") };
        puts.sort();
        assert_eq!(puts, [("one".to_string(), "1".to_string()), ("two".to_string(), "2".to_string())]);
        srv.barrier_out(puts);
        assert_eq!(pmi1.read_line().await, "cmd=barrier_out\n");
        assert_eq!(pmi2.recv().await.cmd(), "kvs-fence-response");
        assert!(pmi1.line("cmd=get kvsname=berth_12_3 key=two").await.ends_with("value=2\n"));
        assert_eq!(pmi2.call("kvs-get", &[("key", "one")]).await, ["rc=0", "found=TRUE", "value=1"]);
    }

    #[tokio::test]
    async fn survives_bad_input() {
        let (srv, mut events) = server(vec![0, 1]);
        let mut r = Client::start(&srv, 0).await;
        let error = |errmsg: &str| Message::new("error").with("rc", -1).with("errmsg", errmsg);
        // Oversized: skipped, answered, and the next message is read in step.
        let huge = format!("{:<6}cmd=kvs-put;key=k;value={};", MESSAGE_MAX + 100, "v".repeat(MESSAGE_MAX + 100));
        r.send(&huge.as_bytes()[..LENGTH_FIELD + MESSAGE_MAX + 100]).await;
        assert_eq!(r.recv().await, error(&format!("message of {} bytes (most {MESSAGE_MAX})", MESSAGE_MAX + 100)));
        assert!(protocol_error(&mut events, 0).contains("bytes"));
        assert_eq!(r.call("job-getid", &[]).await, ["rc=0", "jobid=berth_12_3"], "in step after a long message");
        let unparsable = [("", "empty"), ("hello", "key=value"), ("key=1;", "cmd=NAME"), ("cmd=x;\u{0};=1", "bad key")];
        for (body, reason) in unparsable {
            r.send(format!("{:<6}{body}", body.len()).as_bytes()).await;
            let answer = r.recv().await;
            assert_eq!((answer.cmd(), answer.get("rc")), ("error", Some("-1")), "{body:?}");
            let reported = protocol_error(&mut events, 0);
            assert!(reported.contains(reason), "{body:?}: {reported}");
        }
        r.send(b"7     cmd=\xff\xfe;").await;
        assert_eq!(r.recv().await, error("message is not UTF-8"));
        assert!(protocol_error(&mut events, 0).contains("UTF-8"));
        assert_eq!(r.call("frobnicate", &[("x", "1")]).await, ["rc=-1", "errmsg=unknown command frobnicate"]);
        assert!(protocol_error(&mut events, 0).contains("frobnicate"));
        // Missing and oversized keys and values: answered, not reported.
        let missing = ["rc=-1", "errmsg=missing key"];
        for cmd in ["kvs-put", "kvs-get", "info-putnodeattr", "info-getnodeattr", "info-getjobattr"] {
            assert_eq!(r.call(cmd, &[("value", "1")]).await, missing, "{cmd}");
        }
        let key = "k".repeat(65);
        assert_eq!(r.call("kvs-put", &[("key", &key), ("value", "1")]).await, ["rc=-1", "errmsg=bad_key_length"]);
        assert_eq!(r.call("info-putnodeattr", &[("key", &key)]).await, ["rc=-1", "errmsg=bad key length"]);
        let value = "v".repeat(1025);
        assert_eq!(r.call("kvs-put", &[("key", "k"), ("value", &value)]).await, ["rc=-1", "errmsg=value_too_long"]);
        let wrong_job = r.call("kvs-get", &[("jobid", "other"), ("key", "k")]).await;
        assert_eq!(wrong_job, ["rc=-1", "errmsg=unknown jobid other"]);
        let wrong_rank = r.call("fullinit", &[("pmirank", "1")]).await;
        assert_eq!(wrong_rank, ["rc=-1", "errmsg=pmirank 1 on the connection of rank 0"]);
        assert_eq!(r.call("fullinit", &[("pmirank", "x")]).await[0], "rc=-1");
        srv.set("huge", &"h".repeat(2000));
        let huge = r.call("kvs-get", &[("key", "huge")]).await;
        assert_eq!(huge[0], "rc=-1", "a value libpmi2 cannot read is an error, not a broken answer");
        assert!(events.try_recv().is_err(), "bad arguments are answered, not reported");
        // A length field that is no number: error answer, then the connection is closed.
        r.send(b"cmd=kvs-fence;").await;
        assert_eq!(r.recv().await.get("errmsg"), Some("bad length field \"cmd=kv\"; closing the connection"));
        let mut rest = Vec::new();
        r.0.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "closed");
        assert!(protocol_error(&mut events, 0).contains("length field"));
        // Closed inside a message, and closed without finalize.
        let mut r = Client::start(&srv, 1).await;
        r.send(b"30    cmd=kvs").await;
        drop(r);
        let closed = events.recv().await;
        assert!(matches!(&closed, Some(PmiEvent::ProtocolError { rank: 1, message }) if message.contains("inside")));
        let r = Client::start(&srv, 1).await;
        drop(r);
        let closed = events.recv().await;
        assert!(matches!(&closed, Some(PmiEvent::ProtocolError { rank: 1, message }) if message.contains("finalize")));
    }

    #[tokio::test]
    async fn abort_is_reported_and_not_answered() {
        let (srv, mut events) = server(vec![0]);
        let mut r = Client::start(&srv, 0).await;
        let mpich = "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 0";
        r.send(&Message::new("abort").with("exitcode", -1).with("message", mpich).encode()).await;
        assert_eq!(events.recv().await, Some(PmiEvent::Abort { rank: 0, code: 7, message: mpich.into() }));
        r.send(&Message::new("abort").with("isworld", "TRUE").with("msg", "out of memory").encode()).await;
        assert_eq!(events.recv().await, Some(PmiEvent::Abort { rank: 0, code: 1, message: "out of memory".into() }));
        r.send(&Message::new("abort").with("exitcode", 3).encode()).await;
        assert_eq!(events.recv().await, Some(PmiEvent::Abort { rank: 0, code: 3, message: String::new() }));
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_millis(100), r.0.read(&mut buf)).await;
        assert!(read.is_err(), "abort gets no answer");
        drop(r);
        drop(srv);
        assert_eq!(events.recv().await, None, "closing after abort is not an error");
    }
}
