//! Length-prefixed JSON frames with a version check.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bumped on any incompatible change to a message (2: daemons authenticate with the cluster
/// key; 3: a signed message's body is the message's JSON itself, not a string holding it;
/// docs/protocol/06-auth.md "Authentication").
pub const PROTOCOL_VERSION: u32 = 3;

/// Larger frames are refused: no legitimate message comes near it, and it bounds what a
/// garbage peer can make us allocate.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "frame of {len} bytes is larger than the {limit}-byte limit{why}; is the peer speaking the berth protocol?"
    )]
    TooLarge { len: usize, limit: usize, why: &'static str },
    #[error("closed after {} s without a request", .0.as_secs())]
    Idle(Duration),
    #[error("a frame did not arrive in full within {} s; closed", .0.as_secs())]
    Slow(Duration),
    #[error("{0}")]
    Busy(String),
    #[error("malformed message: {0}; is the peer speaking the berth protocol?")]
    Malformed(String),
    #[error("authentication failed: {0}")]
    Auth(#[from] crate::error::AuthError),
    #[error("peer speaks protocol version {theirs}, this program speaks {PROTOCOL_VERSION}; run the same berth version on both ends")]
    Version { theirs: u32 },
}

#[derive(Serialize)]
struct OutEnvelope<'a, T> {
    v: u32,
    #[serde(flatten)]
    body: &'a T,
}

/// How a message of this version begins as `to_json` writes it (`v` first).
const CURRENT_PREFIX: &str = "{\"v\":3,";

#[derive(Deserialize)]
struct VersionOnly {
    v: u32,
}

/// A message's frame body: its JSON with `"v"` (no length prefix).
pub fn to_json<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    serde_json::to_vec(&OutEnvelope { v: PROTOCOL_VERSION, body: msg })
        .map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// Encode a message as one frame's bytes (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let json = to_json(msg)?;
    if json.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge { len: json.len(), limit: MAX_FRAME_BYTES, why: "" });
    }
    let mut out = Vec::with_capacity(json.len() + 4);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Decode one frame's JSON body (without the length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    check_version(body)?;
    serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// Is `body` (a frame's JSON) of this protocol version? [`ProtocolError::Version`] names the
/// peer's when it is another.
pub(crate) fn check_version(body: &[u8]) -> Result<(), ProtocolError> {
    // What `to_json` writes starts so: no parse, where reading the version is one more (every
    // frame of a launch is decoded on its path).
    if body.starts_with(CURRENT_PREFIX.as_bytes()) {
        return Ok(());
    }
    let version: VersionOnly =
        serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(format!("no protocol version: {e}")))?;
    if version.v != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { theirs: version.v });
    }
    Ok(())
}

pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> Result<(), ProtocolError> {
    let bytes = encode(msg)?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Read one message; `Ok(None)` on a clean end of stream before a frame starts.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R) -> Result<Option<T>, ProtocolError> {
    read_frame_limited(r, &FrameLimits::default()).await
}

/// [`read_frame`] within `limits` (size, timeouts, a shared budget).
pub async fn read_frame_limited<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
    limits: &FrameLimits<'_>,
) -> Result<Option<T>, ProtocolError> {
    match read_raw_frame_limited(r, limits).await? {
        Some(body) => decode(&body).map(Some),
        None => Ok(None),
    }
}

/// Read one frame's body without decoding it; `Ok(None)` on a clean end of stream.
pub async fn read_raw_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, ProtocolError> {
    read_raw_frame_limited(r, &FrameLimits::default()).await
}

/// A frame's buffer starts at most this big and grows only when full, to at most twice what
/// arrived: memory follows the bytes that arrive, never the length a peer announces
/// (docs/protocol/00-framing.md, "Limits").
pub const READ_CHUNK: usize = 64 << 10;

/// The frame limit for a peer not yet authenticated or identified (docs/protocol/00-framing.md, "Limits").
pub const UNIDENTIFIED_FRAME_BYTES: usize = 64 << 10;

/// Bytes of frames being received (started, not complete) that all connections of a daemon may
/// hold together; a frame that would go past it is refused ([`ProtocolError::Busy`]), so slow
/// or lying peers cannot make the daemon hold more than this, however many they are.
#[derive(Debug)]
pub struct FrameBudget {
    used: AtomicUsize,
    cap: usize,
    what: &'static str,
}

impl FrameBudget {
    /// `what` names the budget in errors (e.g. "the controller's").
    pub const fn new(cap: usize, what: &'static str) -> FrameBudget {
        FrameBudget { used: AtomicUsize::new(0), cap, what }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(n).filter(|t| *t <= self.cap))
            .is_ok()
    }

    fn give(&self, n: usize) {
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(n)));
    }
}

/// Bytes taken from a [`FrameBudget`] for one frame, given back when the frame is done
/// (complete, failed, or its read dropped).
struct Held<'a> {
    budget: Option<&'a FrameBudget>,
    bytes: usize,
}

impl Held<'_> {
    fn grow(&mut self, n: usize) -> Result<(), ProtocolError> {
        let Some(b) = self.budget else { return Ok(()) };
        if !b.take(n) {
            return Err(ProtocolError::Busy(format!(
                "{} memory for incoming messages is in use ({} MiB in frames still arriving); try again shortly",
                b.what,
                b.cap >> 20
            )));
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.budget {
            b.give(self.bytes);
        }
    }
}

/// What one frame read may take: its size, its time, and a share of a daemon-wide budget.
#[derive(Debug, Clone, Copy)]
pub struct FrameLimits<'a> {
    /// Largest frame body accepted ([`ProtocolError::TooLarge`] beyond).
    pub max_bytes: usize,
    /// Said in the TooLarge error after the limit (e.g. " before authentication").
    pub why: &'static str,
    /// How long to wait for a frame's first byte ([`ProtocolError::Idle`]); `None`: for ever.
    pub idle: Option<Duration>,
    /// How long a frame may take from its first byte to its last ([`ProtocolError::Slow`]).
    pub frame: Option<Duration>,
    /// Shared by the daemon's connections: bytes of frames still arriving.
    pub budget: Option<&'a FrameBudget>,
}

impl Default for FrameLimits<'_> {
    /// [`MAX_FRAME_BYTES`], no timeouts, no budget: what [`read_frame`] reads with.
    fn default() -> Self {
        FrameLimits { max_bytes: MAX_FRAME_BYTES, why: "", idle: None, frame: None, budget: None }
    }
}

/// [`read_raw_frame`] within `limits`. The buffer grows with the bytes that arrive
/// ([`READ_CHUNK`]): a peer announcing 16 MiB and sending nothing costs 64 KiB, not 16 MiB.
pub async fn read_raw_frame_limited<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &FrameLimits<'_>,
) -> Result<Option<Vec<u8>>, ProtocolError> {
    read_raw_frame_counted(r, limits, &mut 0).await
}

/// [`read_raw_frame_limited`], recording in `peak` the largest capacity its buffer reached
/// (what the tests and the fuzz target check).
pub(crate) async fn read_raw_frame_counted<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &FrameLimits<'_>,
    peak: &mut usize,
) -> Result<Option<Vec<u8>>, ProtocolError> {
    let mut len = [0u8; 4];
    // The first byte: waiting for it is being idle.
    let first = r.read(&mut len[..1]);
    let n = match limits.idle {
        Some(idle) => tokio::time::timeout(idle, first).await.map_err(|_| ProtocolError::Idle(idle))??,
        None => first.await?,
    };
    if n == 0 {
        return Ok(None);
    }
    let rest = read_rest(r, len, limits, peak);
    match limits.frame {
        Some(t) => tokio::time::timeout(t, rest).await.map_err(|_| ProtocolError::Slow(t))?,
        None => rest.await,
    }
}

/// The rest of a frame whose first byte is `len[0]`.
async fn read_rest<R: AsyncRead + Unpin>(
    r: &mut R,
    mut len: [u8; 4],
    limits: &FrameLimits<'_>,
    peak: &mut usize,
) -> Result<Option<Vec<u8>>, ProtocolError> {
    r.read_exact(&mut len[1..]).await?;
    let len = u32::from_be_bytes(len) as usize;
    let limit = limits.max_bytes.min(MAX_FRAME_BYTES);
    if len > limit {
        return Err(ProtocolError::TooLarge { len, limit, why: limits.why });
    }
    let mut held = Held { budget: limits.budget, bytes: 0 };
    // A small frame (the usual case) in one allocation of its exact size.
    let first = len.min(READ_CHUNK);
    held.grow(first)?;
    let mut body = Vec::with_capacity(first);
    *peak = (*peak).max(body.capacity());
    while body.len() < len {
        let start = body.len();
        if body.capacity() == start {
            // Full: double (at least a chunk more), never past the announced length.
            let before = body.capacity();
            let target = (before + before.max(READ_CHUNK)).min(len);
            held.grow(target - before)?;
            body.reserve_exact(target - start);
            *peak = (*peak).max(body.capacity());
        }
        // Into the spare capacity (at most `len - start`: the capacity never passes `len`),
        // which nothing touches before the kernel writes what arrived.
        let n = r.read_buf(&mut body).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the connection closed inside a frame ({start} of {len} bytes)"),
            )
            .into());
        }
    }
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ClientRequest, ClientResponse};
    use proptest::prelude::*;

    #[tokio::test]
    async fn roundtrip() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, &ClientRequest::Ping).await.unwrap();
        let got: ClientRequest = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(got, ClientRequest::Ping);
        drop(a);
        assert!(read_frame::<_, ClientRequest>(&mut b).await.unwrap().is_none());
    }

    #[test]
    fn the_version_is_checked_wherever_it_is() {
        assert_eq!(CURRENT_PREFIX, format!("{{\"v\":{PROTOCOL_VERSION},"), "the prefix follows the version");
        let written = to_json(&ClientRequest::Ping).unwrap();
        assert!(written.starts_with(CURRENT_PREFIX.as_bytes()), "{}", String::from_utf8_lossy(&written));
        assert_eq!(decode::<ClientRequest>(&written).unwrap(), ClientRequest::Ping);
        let later = br#"{"op":"ping","v":3}"#;
        assert_eq!(decode::<ClientRequest>(later).unwrap(), ClientRequest::Ping);
        for other in [&br#"{"v":4,"op":"ping"}"#[..], br#"{"op":"ping","v":1}"#, br#"{"v":2,"op":"ping"}"#] {
            assert!(matches!(decode::<ClientRequest>(other), Err(ProtocolError::Version { .. })));
        }
        // An old peer is told both versions.
        let old = decode::<ClientRequest>(br#"{"v":2,"op":"ping"}"#).unwrap_err().to_string();
        assert!(old.contains("version 2") && old.contains("speaks 3"), "{old}");
        assert!(matches!(decode::<ClientRequest>(br#"{"op":"ping"}"#), Err(ProtocolError::Malformed(_))));
        assert!(matches!(decode::<ClientRequest>(br#"{"v":3,"op":"nope"}"#), Err(ProtocolError::Malformed(_))));
    }

    #[tokio::test]
    async fn garbage_is_an_error_not_a_panic() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // "GET " read as a length is > 1 GB.
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::TooLarge { .. })));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&[0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']).await.unwrap();
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::Malformed(_))));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let body = br#"{"v":99,"op":"ping"}"#;
        a.write_all(&(body.len() as u32).to_be_bytes()).await.unwrap();
        a.write_all(body).await.unwrap();
        assert!(matches!(read_frame::<_, ClientRequest>(&mut b).await, Err(ProtocolError::Version { theirs: 99 })));
    }

    /// A peer that hands over `step` bytes per read, then ends the stream.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.step.min(buf.remaining()).min(self.data.len() - self.pos);
            let pos = self.pos;
            buf.put_slice(&self.data[pos..pos + n]);
            self.pos += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn announced(len: u32, body: &[u8]) -> Vec<u8> {
        let mut v = len.to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[tokio::test]
    async fn a_lying_length_costs_what_arrives_not_what_it_announces() {
        for sent in [0usize, 1, 1000, 100_000, 1_000_000] {
            for step in [1usize, 7, 4096, 1 << 20] {
                if step == 1 && sent > 1000 {
                    continue;
                }
                let mut r = Trickle { data: announced(16 << 20, &vec![b'x'; sent]), pos: 0, step };
                let mut peak = 0;
                let got = read_raw_frame_counted(&mut r, &FrameLimits::default(), &mut peak).await;
                assert!(matches!(got, Err(ProtocolError::Io(ref e)) if e.kind() == std::io::ErrorKind::UnexpectedEof));
                assert!(peak <= 2 * sent + READ_CHUNK, "sent {sent} (step {step}), buffer grew to {peak}");
            }
        }
        // 16 MiB announced, nothing sent, the peer still there: the read waits with 64 KiB at most.
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
        let limits = FrameLimits { frame: Some(Duration::from_millis(100)), ..FrameLimits::default() };
        let mut peak = 0;
        let got = read_raw_frame_counted(&mut b, &limits, &mut peak).await;
        assert!(matches!(got, Err(ProtocolError::Slow(_))), "{got:?}");
        assert!(peak <= READ_CHUNK, "{peak}");
        drop(a);
    }

    #[tokio::test]
    async fn frames_arriving_in_pieces_are_whole() {
        for len in [0usize, 1, 5, READ_CHUNK - 1, READ_CHUNK, READ_CHUNK + 1, 3 * READ_CHUNK + 17, 1 << 20] {
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for step in [1usize, 3, 1000, 70_000, usize::MAX] {
                if step < 1000 && len > 4 * READ_CHUNK {
                    continue;
                }
                let mut data = announced(len as u32, &body);
                data.extend_from_slice(&announced(2, b"{}"));
                let mut r = Trickle { data, pos: 0, step };
                let mut peak = 0;
                let got = read_raw_frame_counted(&mut r, &FrameLimits::default(), &mut peak).await.unwrap().unwrap();
                assert_eq!(got, body, "len {len} step {step}");
                assert!(peak <= len.max(1) * 2, "len {len}: buffer of {peak}");
                assert_eq!(read_raw_frame(&mut r).await.unwrap().unwrap(), b"{}");
                assert!(read_raw_frame(&mut r).await.unwrap().is_none());
            }
        }
        // A stream ending inside the length prefix is an error, not a clean end.
        let mut r = Trickle { data: vec![0, 0], pos: 0, step: 1 };
        assert!(read_raw_frame(&mut r).await.is_err());
    }

    #[tokio::test]
    async fn limits_size_idle_and_budget() {
        let small =
            FrameLimits { max_bytes: UNIDENTIFIED_FRAME_BYTES, why: " before authentication", ..Default::default() };
        let mut r: &[u8] = &announced(UNIDENTIFIED_FRAME_BYTES as u32 + 1, b"");
        let e = read_raw_frame_limited(&mut r, &small).await.unwrap_err();
        assert!(e.to_string().contains("larger than the 65536-byte limit before authentication"), "{e}");
        let mut r: &[u8] = &announced(3, b"abc");
        assert_eq!(read_raw_frame_limited(&mut r, &small).await.unwrap().unwrap(), b"abc");

        // Nothing at all: idle.
        let (_a, mut b) = tokio::io::duplex(64);
        let idle = FrameLimits { idle: Some(Duration::from_millis(50)), ..Default::default() };
        let e = read_raw_frame_limited(&mut b, &idle).await.unwrap_err();
        assert!(matches!(e, ProtocolError::Idle(_)), "{e}");

        // Two frames arriving together may not hold more than the budget.
        let budget = FrameBudget::new(5 * READ_CHUNK, "the test's");
        let limits = FrameLimits { budget: Some(&budget), ..Default::default() };
        let (mut a1, mut b1) = tokio::io::duplex(1 << 20);
        let (mut a2, mut b2) = tokio::io::duplex(1 << 20);
        a1.write_all(&announced(4 << 20, &vec![1; 2 * READ_CHUNK])).await.unwrap();
        a2.write_all(&announced(4 << 20, &vec![2; 2 * READ_CHUNK])).await.unwrap();
        let limits = FrameLimits { frame: Some(Duration::from_millis(300)), ..limits };
        let (first, second) =
            tokio::join!(read_raw_frame_limited(&mut b1, &limits), read_raw_frame_limited(&mut b2, &limits));
        let errors = [first.unwrap_err(), second.unwrap_err()];
        assert!(
            errors.iter().any(|e| matches!(e, ProtocolError::Busy(m) if m.contains("the test's memory"))),
            "{errors:?}"
        );
        assert!(errors.iter().any(|e| matches!(e, ProtocolError::Slow(_))), "the other one waits for its bytes");
        drop((a1, a2));
        assert_eq!(budget.used(), 0, "every byte is given back");
        let mut r: &[u8] = &announced(5, b"hello");
        assert_eq!(read_raw_frame_limited(&mut r, &limits).await.unwrap().unwrap(), b"hello");
        assert_eq!(budget.used(), 0);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ClientRequest>(&bytes);
            let _ = decode::<ClientResponse>(&bytes);
            let _ = decode::<crate::agent::AgentMessage>(&bytes);
            let _ = decode::<crate::agent::ControllerMessage>(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_json(s in "\\{\"v\":3,\"op\":\"[a-z_]{0,12}\"(,\"[a-z_]{1,8}\":(1|\"x\"|null|\\[\\]|\\{\\}))*\\}") {
            let _ = decode::<ClientRequest>(s.as_bytes());
            let _ = decode::<crate::agent::AgentMessage>(s.as_bytes());
        }
    }
}
