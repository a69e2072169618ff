//! Authentication between berth daemons: the cluster key, HMAC-SHA256, signed envelopes with
//! replay protection, per-connection sessions, and signed step grants.
//!
//! See docs/protocol/06-auth.md, "Authentication". Everything here proves *who* sent a message (a
//! holder of the cluster key) and that it is fresh; nothing here encrypts.

use crate::error::AuthError;
use crate::frame::ProtocolError;
use crate::step::StepGrant;
use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Sha256;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

mod reader;
mod tree;
pub use reader::SealedReader;
pub use tree::{
    LinkKey, TreeEnd, LABEL_QUERY_DOWN, LABEL_QUERY_LINK, LABEL_QUERY_UP, LABEL_STEP_LINK, LABEL_TREE_DOWN,
    LABEL_TREE_LINK, LABEL_TREE_UP,
};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the cluster key.
pub const KEY_BYTES: usize = 32;
/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 16;
/// How far a signed timestamp may be from the receiver's clock, by default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// How many nonces a replay guard remembers at most (a flood of validly signed messages
/// beyond this is refused, not remembered: fail closed).
pub const DEFAULT_GUARD_CAPACITY: usize = 100_000;
/// How long a step grant is valid after the controller issues it.
pub const GRANT_LIFETIME: Duration = Duration::from_secs(120);

/// Domain-separation labels: a MAC made for one purpose never verifies for another.
pub const LABEL_REGISTER: &[u8] = b"berth/v2/agent-register";
pub const LABEL_REGISTERED: &[u8] = b"berth/v2/controller-registered";
pub const LABEL_SESSION: &[u8] = b"berth/v2/session-key";
pub const LABEL_AGENT_TO_CONTROLLER: &[u8] = b"berth/v2/agent-to-controller";
pub const LABEL_CONTROLLER_TO_AGENT: &[u8] = b"berth/v2/controller-to-agent";
pub const LABEL_GRANT: &[u8] = b"berth/v2/step-grant";
pub const LABEL_AGENT_QUERY: &[u8] = b"berth/v2/agent-query";

pub type Nonce = [u8; NONCE_BYTES];

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the cluster key {path}: {source}; create one with `berth keygen {path}` (mode 0600, owned by the daemons' user) and give the same file to the controller and every agent (`berth up` makes DIR/cluster.key)")]
    Read { path: String, source: std::io::Error },
    #[error("the cluster key {path} is accessible by group or others (mode {mode:04o}); it must be secret: `chmod 600 {path}`")]
    Permissions { path: String, mode: u32 },
    #[error(
        "the cluster key {path} is owned by uid {owner}, not by this daemon's user (uid {me}): `chown {me} {path}`"
    )]
    Owner { path: String, owner: u32, me: u32 },
    #[error("{path} is not a berth cluster key ({why}); create one with `berth keygen FILE`")]
    Format { path: String, why: String },
    #[error("cannot write the cluster key {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error("{path} already exists; remove it first to make a new key (every daemon must then get the new one)")]
    Exists { path: String },
    #[error("no random numbers from the operating system: {0}")]
    Random(String),
}

/// The secret every daemon of a cluster shares.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_BYTES]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// A fresh random key (not written anywhere).
    pub fn random() -> Result<ClusterKey, KeyError> {
        let mut b = [0u8; KEY_BYTES];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(ClusterKey(b))
    }

    /// Make a new key and write it to `path` (hex, mode 0600, atomically: a temporary file
    /// in the same directory renamed over). Refuses to replace an existing file.
    pub fn generate(path: &Path) -> Result<ClusterKey, KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let p = path.display().to_string();
        if path.exists() {
            return Err(KeyError::Exists { path: p });
        }
        let key = ClusterKey::random()?;
        let write = |source| KeyError::Write { path: p.clone(), source };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "key".into());
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let result = (|| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(format!("{}\n", hex(&key.0)).as_bytes())?;
            f.sync_all()?;
            // Never replace a key someone made meanwhile.
            std::fs::hard_link(&tmp, path)?;
            std::fs::remove_file(&tmp)?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                return Err(KeyError::Exists { path: p });
            }
            return Err(write(e));
        }
        Ok(key)
    }

    /// Read the key at `path`, refusing a file other users could read or that belongs to
    /// another user.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        use std::os::unix::fs::MetadataExt;
        let p = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| KeyError::Read { path: p.clone(), source })?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(KeyError::Owner { path: p, owner: meta.uid(), me });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: p, mode });
        }
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read { path: p.clone(), source })?;
        let bytes = unhex(text.trim()).filter(|b| b.len() == KEY_BYTES).ok_or_else(|| KeyError::Format {
            path: p.clone(),
            why: format!("expected {} hex digits", 2 * KEY_BYTES),
        })?;
        let mut k = [0u8; KEY_BYTES];
        k.copy_from_slice(&bytes);
        Ok(ClusterKey(k))
    }

    /// The key at `path`, made first if there is none.
    pub fn load_or_generate(path: &Path) -> Result<ClusterKey, KeyError> {
        match ClusterKey::generate(path) {
            Err(KeyError::Exists { .. }) => ClusterKey::load(path),
            r => r,
        }
    }

    /// HMAC-SHA256 under this key over the concatenation of `parts`.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        hmac(&self.0, parts)
    }
}

/// HMAC-SHA256 over the concatenation of `parts`.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Check an HMAC-SHA256 in constant time.
pub fn hmac_verify(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

pub fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() & 1 == 1 || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

pub fn random_nonce() -> Nonce {
    let mut n = [0u8; NONCE_BYTES];
    // The OS generator failing is not recoverable; a fixed nonce would be worse than stopping.
    getrandom::fill(&mut n).expect("the operating system's random number generator failed");
    n
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Is `ts` within `window` of `now` (both Unix milliseconds)?
pub fn check_time(ts: u64, now: u64, window: Duration) -> Result<(), AuthError> {
    let w = window.as_millis() as u64;
    if ts.saturating_add(w) < now {
        return Err(AuthError::Stale(now - ts));
    }
    if ts > now.saturating_add(w) {
        return Err(AuthError::Future(ts - now));
    }
    Ok(())
}

fn nonce_from_hex(s: &str) -> Result<Nonce, AuthError> {
    let b = unhex(s)
        .filter(|b| b.len() == NONCE_BYTES)
        .ok_or_else(|| AuthError::Malformed(format!("nonce must be {} hex digits", 2 * NONCE_BYTES)))?;
    let mut n = [0u8; NONCE_BYTES];
    n.copy_from_slice(&b);
    Ok(n)
}

fn tag_from_hex(s: &str) -> Result<Vec<u8>, AuthError> {
    unhex(s).filter(|b| b.len() == 32).ok_or_else(|| AuthError::Malformed("mac must be 64 hex digits".into()))
}

/// A signed message's body: the message's JSON itself (no `"v"`: the frame holding it has
/// one), kept as the exact bytes that arrived, which are what the MAC covers. Serialized once
/// by the sender, parsed once by the receiver.
pub type Body = Box<RawValue>;

/// The message `msg` as a body.
pub fn to_body<T: Serialize>(msg: &T) -> Result<Body, ProtocolError> {
    serde_json::value::to_raw_value(msg).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// The message a body holds (call only once its MAC is checked).
pub fn from_body<T: DeserializeOwned>(body: &RawValue) -> Result<T, ProtocolError> {
    serde_json::from_str(body.get()).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

/// A message signed on its own: who (a key holder), when (`ts`), and once (`nonce`).
///
/// The MAC covers: the label's length (4 bytes, big-endian), the label, `ts` (8 bytes,
/// big-endian), the 16 nonce bytes, and `body`'s bytes exactly as they stand in the frame
/// (from its `{` to its `}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// Unix milliseconds, the sender's clock.
    pub ts: u64,
    /// 16 random bytes, hex.
    pub nonce: String,
    /// The signed message's JSON.
    pub body: Body,
    /// HMAC-SHA256, hex.
    pub mac: String,
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Envelope) -> bool {
        self.ts == other.ts && self.nonce == other.nonce && self.body.get() == other.body.get() && self.mac == other.mac
    }
}

impl Eq for Envelope {}

fn envelope_mac(key: &ClusterKey, label: &[u8], ts: u64, nonce: &Nonce, body: &[u8]) -> [u8; 32] {
    key.mac(&[&(label.len() as u32).to_be_bytes(), label, &ts.to_be_bytes(), nonce, body])
}

impl Envelope {
    /// Sign `msg` for `label` now, with a fresh nonce.
    pub fn seal<T: Serialize>(key: &ClusterKey, label: &[u8], msg: &T) -> Result<Envelope, ProtocolError> {
        Envelope::seal_at(key, label, msg, now_ms(), random_nonce())
    }

    /// Sign `msg` for `label` with this time and nonce.
    pub fn seal_at<T: Serialize>(
        key: &ClusterKey,
        label: &[u8],
        msg: &T,
        ts: u64,
        nonce: Nonce,
    ) -> Result<Envelope, ProtocolError> {
        Ok(Envelope::seal_body(key, label, to_body(msg)?, ts, nonce))
    }

    pub fn seal_body(key: &ClusterKey, label: &[u8], body: Body, ts: u64, nonce: Nonce) -> Envelope {
        let mac = envelope_mac(key, label, ts, &nonce, body.get().as_bytes());
        Envelope { ts, nonce: hex(&nonce), body, mac: hex(&mac) }
    }

    /// Check the MAC only (constant time); the nonce on success.
    pub fn verify(&self, key: &ClusterKey, label: &[u8]) -> Result<Nonce, AuthError> {
        let nonce = nonce_from_hex(&self.nonce)?;
        let tag = tag_from_hex(&self.mac)?;
        let parts: [&[u8]; 5] =
            [&(label.len() as u32).to_be_bytes(), label, &self.ts.to_be_bytes(), &nonce, self.body.get().as_bytes()];
        if !hmac_verify(&key.0, &parts, &tag) {
            return Err(AuthError::BadMac);
        }
        Ok(nonce)
    }

    /// Check the MAC, then the time window and the nonce against `guard`.
    pub fn open(&self, key: &ClusterKey, label: &[u8], guard: &mut ReplayGuard, now: u64) -> Result<Nonce, AuthError> {
        let nonce = self.verify(key, label)?;
        guard.check(self.ts, &nonce, now)?;
        Ok(nonce)
    }

    /// The signed message (call only after `verify` or `open`).
    pub fn message<T: DeserializeOwned>(&self) -> Result<T, ProtocolError> {
        from_body(&self.body)
    }
}

/// Remembers the nonces of accepted envelopes while their timestamps are inside the window.
#[derive(Debug)]
pub struct ReplayGuard {
    window: Duration,
    capacity: usize,
    seen: HashMap<Nonce, u64>,
    /// (forget-after time, nonce), oldest first.
    order: BTreeSet<(u64, Nonce)>,
}

impl Default for ReplayGuard {
    fn default() -> Self {
        ReplayGuard::new(DEFAULT_WINDOW, DEFAULT_GUARD_CAPACITY)
    }
}

impl ReplayGuard {
    pub fn new(window: Duration, capacity: usize) -> ReplayGuard {
        ReplayGuard { window, capacity: capacity.max(1), seen: HashMap::new(), order: BTreeSet::new() }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Forget nonces whose timestamps left the window (they would be refused as stale).
    pub fn prune(&mut self, now: u64) {
        while let Some(&(until, nonce)) = self.order.first() {
            if until >= now {
                break;
            }
            self.order.pop_first();
            self.seen.remove(&nonce);
        }
    }

    /// Accept (`ts`, `nonce`) once: refused outside the window or when seen before.
    pub fn check(&mut self, ts: u64, nonce: &Nonce, now: u64) -> Result<(), AuthError> {
        check_time(ts, now, self.window)?;
        self.prune(now);
        if self.seen.contains_key(nonce) {
            return Err(AuthError::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(AuthError::GuardFull(self.capacity));
        }
        let until = ts.saturating_add(self.window.as_millis() as u64);
        self.seen.insert(*nonce, until);
        self.order.insert((until, *nonce));
        Ok(())
    }
}

/// A frame of an authenticated connection: its place in the sequence, the message, the MAC
/// under the session key (label of the direction, `seq` as 8 bytes big-endian, `body`'s bytes
/// exactly as they stand in the frame).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionFrame {
    pub seq: u64,
    pub body: Body,
    pub mac: String,
}

impl PartialEq for SessionFrame {
    fn eq(&self, other: &SessionFrame) -> bool {
        self.seq == other.seq && self.body.get() == other.body.get() && self.mac == other.mac
    }
}

impl Eq for SessionFrame {}

/// A session frame as read: its body borrowed from the bytes that arrived.
#[derive(Deserialize)]
struct SessionFrameIn<'a> {
    seq: u64,
    #[serde(borrow)]
    body: &'a RawValue,
    #[serde(borrow)]
    mac: &'a str,
}

/// Which end of an agent-controller connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Agent,
    Controller,
}

/// Signs the frames one end sends.
pub struct Sealer {
    key: [u8; 32],
    label: &'static [u8],
    next: u64,
}

/// Checks the frames one end receives: valid MAC, and exactly the next sequence number.
pub struct Opener {
    key: [u8; 32],
    label: &'static [u8],
    next: u64,
}

/// The two halves of a connection's session, keyed by both handshake nonces.
pub fn session(key: &ClusterKey, agent_nonce: &Nonce, controller_nonce: &Nonce, role: Role) -> (Sealer, Opener) {
    let k = key.mac(&[LABEL_SESSION, agent_nonce, controller_nonce]);
    let (send, recv) = match role {
        Role::Agent => (LABEL_AGENT_TO_CONTROLLER, LABEL_CONTROLLER_TO_AGENT),
        Role::Controller => (LABEL_CONTROLLER_TO_AGENT, LABEL_AGENT_TO_CONTROLLER),
    };
    (Sealer { key: k, label: send, next: 1 }, Opener { key: k, label: recv, next: 1 })
}

impl Sealer {
    /// The next frame, as a value.
    pub fn seal<T: Serialize>(&mut self, msg: &T) -> Result<SessionFrame, ProtocolError> {
        let body = to_body(msg)?;
        let seq = self.next;
        self.next += 1;
        let mac = hmac(&self.key, &[self.label, &seq.to_be_bytes(), body.get().as_bytes()]);
        Ok(SessionFrame { seq, body, mac: hex(&mac) })
    }

    /// The next frame's bytes, length prefix included: the message serialized once, straight
    /// into the frame, the MAC over those bytes (what [`write_sealed`] sends).
    pub fn seal_frame<T: Serialize>(&mut self, msg: &T) -> Result<Vec<u8>, ProtocolError> {
        use std::io::Write;
        let seq = self.next;
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(&[0; 4]);
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{{\"v\":{},\"seq\":{seq},\"body\":", crate::PROTOCOL_VERSION);
        let start = out.len();
        serde_json::to_writer(&mut out, msg).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
        let mac = hmac(&self.key, &[self.label, &seq.to_be_bytes(), &out[start..]]);
        out.extend_from_slice(b",\"mac\":\"");
        out.extend_from_slice(hex(&mac).as_bytes());
        out.extend_from_slice(b"\"}");
        let len = out.len() - 4;
        if len > crate::MAX_FRAME_BYTES {
            return Err(ProtocolError::TooLarge { len, limit: crate::MAX_FRAME_BYTES, why: "" });
        }
        out[..4].copy_from_slice(&(len as u32).to_be_bytes());
        self.next += 1;
        Ok(out)
    }
}

impl Opener {
    /// Check a frame (MAC, then sequence) and decode its message.
    pub fn open<T: DeserializeOwned>(&mut self, f: &SessionFrame) -> Result<T, ProtocolError> {
        self.check(f.seq, &f.body, &f.mac)?;
        from_body(&f.body)
    }

    /// Check and decode a frame's JSON as it arrived (without the length prefix): the frame is
    /// scanned once, its body checked as raw bytes and then parsed once.
    pub fn open_frame<T: DeserializeOwned>(&mut self, frame: &[u8]) -> Result<T, ProtocolError> {
        crate::frame::check_version(frame)?;
        let f: SessionFrameIn<'_> =
            serde_json::from_slice(frame).map_err(|e| ProtocolError::Auth(AuthError::Unsigned(e.to_string())))?;
        self.check(f.seq, f.body, f.mac)?;
        from_body(f.body)
    }

    fn check(&mut self, seq: u64, body: &RawValue, mac: &str) -> Result<(), ProtocolError> {
        let tag = tag_from_hex(mac)?;
        if !hmac_verify(&self.key, &[self.label, &seq.to_be_bytes(), body.get().as_bytes()], &tag) {
            return Err(AuthError::BadMac.into());
        }
        if seq != self.next {
            return Err(AuthError::Sequence { expected: self.next, got: seq }.into());
        }
        self.next += 1;
        Ok(())
    }
}

/// Write `msg` as the next frame of the session.
pub async fn write_sealed<W, T>(w: &mut W, sealer: &mut Sealer, msg: &T) -> Result<(), ProtocolError>
where
    W: tokio::io::AsyncWrite + Unpin,
    T: Serialize,
{
    use tokio::io::AsyncWriteExt;
    let bytes = sealer.seal_frame(msg)?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Read the next frame of the session; `Ok(None)` at a clean end.
pub async fn read_sealed<R, T>(r: &mut R, opener: &mut Opener) -> Result<Option<T>, ProtocolError>
where
    R: tokio::io::AsyncRead + Unpin,
    T: DeserializeOwned,
{
    read_sealed_limited(r, opener, &crate::frame::FrameLimits::default()).await
}

/// [`read_sealed`] within `limits` (docs/protocol/00-framing.md, "Limits").
pub async fn read_sealed_limited<R, T>(
    r: &mut R,
    opener: &mut Opener,
    limits: &crate::frame::FrameLimits<'_>,
) -> Result<Option<T>, ProtocolError>
where
    R: tokio::io::AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let body = match crate::frame::read_raw_frame_limited(r, limits).await? {
        None => return Ok(None),
        Some(b) => b,
    };
    crate::probe::mark("sealed raw read");
    opener.open_frame(&body).map(Some)
}

/// The label the controller signs its handshake answer with: bound to the agent's nonce, so
/// an answer recorded earlier does not verify for a new registration.
pub fn registered_label(agent_nonce: &Nonce) -> Vec<u8> {
    let mut l = LABEL_REGISTERED.to_vec();
    l.extend_from_slice(agent_nonce);
    l
}

/// The bytes a grant's MAC covers: its JSON with `mac` empty (`expires_ms` included).
fn grant_bytes(grant: &StepGrant) -> Vec<u8> {
    let mut g = grant.clone();
    g.mac.clear();
    serde_json::to_vec(&g).unwrap_or_default()
}

/// The controller signs a grant, valid until `expires_ms` (Unix milliseconds).
pub fn sign_grant(key: &ClusterKey, grant: &mut StepGrant, expires_ms: u64) {
    grant.expires_ms = expires_ms;
    let mac = key.mac(&[LABEL_GRANT, &grant_bytes(grant)]);
    grant.mac = hex(&mac);
}

/// An agent checks a grant: signed with the cluster key, not expired.
pub fn verify_grant(key: &ClusterKey, grant: &StepGrant, now: u64) -> Result<(), AuthError> {
    if grant.mac.is_empty() {
        return Err(AuthError::Unsigned("the step grant carries no signature".into()));
    }
    let tag = tag_from_hex(&grant.mac)?;
    if !hmac_verify(&key.0, &[LABEL_GRANT, &grant_bytes(grant)], &tag) {
        return Err(AuthError::BadMac);
    }
    if grant.expires_ms < now {
        return Err(AuthError::Expired(now - grant.expires_ms));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentMessage, ControllerMessage};
    use crate::frame::{decode, encode, to_json};
    use berth_core::JobId;

    fn raw(s: &str) -> Body {
        RawValue::from_string(s.to_string()).unwrap()
    }

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_BYTES])
    }

    fn hb() -> AgentMessage {
        AgentMessage::Heartbeat { running: vec![JobId(3)], seq: 0, steps: None }
    }

    #[test]
    fn envelope_sign_and_verify() {
        let k = key(1);
        let env = Envelope::seal(&k, LABEL_REGISTER, &hb()).unwrap();
        let mut g = ReplayGuard::default();
        env.open(&k, LABEL_REGISTER, &mut g, now_ms()).unwrap();
        assert_eq!(env.message::<AgentMessage>().unwrap(), hb());
        // Through the wire format and back.
        let text = String::from_utf8(to_json(&env).unwrap()).unwrap();
        let back: Envelope = decode(text.as_bytes()).unwrap();
        assert_eq!(back.verify(&k, LABEL_REGISTER).unwrap(), nonce_from_hex(&env.nonce).unwrap());
    }

    #[test]
    fn tampering_is_detected() {
        let k = key(1);
        let env = Envelope::seal(&k, LABEL_REGISTER, &hb()).unwrap();
        let mut body = env.clone();
        body.body = raw(&body.body.get().replace('3', "4"));
        assert_eq!(body.verify(&k, LABEL_REGISTER), Err(AuthError::BadMac));
        // The same message written otherwise (a space): the MAC covers the bytes.
        let mut spaced = env.clone();
        spaced.body = raw(&spaced.body.get().replacen(':', ": ", 1));
        assert_eq!(spaced.message::<AgentMessage>().unwrap(), hb());
        assert_eq!(spaced.verify(&k, LABEL_REGISTER), Err(AuthError::BadMac));
        let mut ts = env.clone();
        ts.ts += 1;
        assert_eq!(ts.verify(&k, LABEL_REGISTER), Err(AuthError::BadMac));
        let mut nonce = env.clone();
        nonce.nonce = hex(&random_nonce());
        assert_eq!(nonce.verify(&k, LABEL_REGISTER), Err(AuthError::BadMac));
        let mut mac = env.clone();
        mac.mac = hex(&[0u8; 32]);
        assert_eq!(mac.verify(&k, LABEL_REGISTER), Err(AuthError::BadMac));
        let mut short = env.clone();
        short.mac.truncate(10);
        assert!(matches!(short.verify(&k, LABEL_REGISTER), Err(AuthError::Malformed(_))));
        // Wrong key, wrong purpose.
        assert_eq!(env.verify(&key(2), LABEL_REGISTER), Err(AuthError::BadMac));
        assert_eq!(env.verify(&k, LABEL_AGENT_QUERY), Err(AuthError::BadMac));
    }

    #[test]
    fn replays_and_clock_skew_are_refused() {
        let k = key(1);
        let now = now_ms();
        let mut g = ReplayGuard::new(Duration::from_secs(60), 100);
        let env = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), now, random_nonce());
        env.open(&k, LABEL_REGISTER, &mut g, now).unwrap();
        assert_eq!(env.open(&k, LABEL_REGISTER, &mut g, now + 1000), Err(AuthError::Replayed));
        let stale = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), now - 61_000, random_nonce());
        assert_eq!(stale.open(&k, LABEL_REGISTER, &mut g, now), Err(AuthError::Stale(61_000)));
        let future = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), now + 61_000, random_nonce());
        assert_eq!(future.open(&k, LABEL_REGISTER, &mut g, now), Err(AuthError::Future(61_000)));
        let far = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), u64::MAX, random_nonce());
        assert!(matches!(far.open(&k, LABEL_REGISTER, &mut g, now), Err(AuthError::Future(_))));
        let edge = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), now - 59_000, random_nonce());
        edge.open(&k, LABEL_REGISTER, &mut g, now).unwrap();
        // A configurable window.
        let mut tight = ReplayGuard::new(Duration::from_secs(5), 100);
        let e = Envelope::seal_body(&k, LABEL_REGISTER, raw("{}"), now - 6_000, random_nonce());
        assert_eq!(e.open(&k, LABEL_REGISTER, &mut tight, now), Err(AuthError::Stale(6_000)));
    }

    #[test]
    fn the_guard_forgets_what_left_the_window_and_stays_bounded() {
        let mut g = ReplayGuard::new(Duration::from_secs(10), 3);
        let t = 1_000_000u64;
        let n: Vec<Nonce> = (0..5).map(|_| random_nonce()).collect();
        g.check(t, &n[0], t).unwrap();
        g.check(t + 1000, &n[1], t + 1000).unwrap();
        g.check(t + 2000, &n[2], t + 2000).unwrap();
        assert_eq!(g.check(t + 2000, &n[3], t + 2000), Err(AuthError::GuardFull(3)));
        assert_eq!(g.len(), 3);
        // 10.5 s later the first is out of the window: forgotten, room for another.
        g.check(t + 10_500, &n[3], t + 10_500).unwrap();
        assert_eq!(g.len(), 3);
        // Its timestamp would be stale now, so forgetting it opened no replay.
        assert_eq!(g.check(t, &n[0], t + 10_500), Err(AuthError::Stale(10_500)));
        g.prune(t + 60_000);
        assert!(g.is_empty());
    }

    #[test]
    fn sessions_check_order_direction_and_key() {
        let k = key(7);
        let (a, c) = (random_nonce(), random_nonce());
        let (mut agent_tx, mut agent_rx) = session(&k, &a, &c, Role::Agent);
        let (mut ctl_tx, mut ctl_rx) = session(&k, &a, &c, Role::Controller);
        let f1 = agent_tx.seal(&hb()).unwrap();
        let f2 = agent_tx.seal(&hb()).unwrap();
        assert_eq!(ctl_rx.open::<AgentMessage>(&f1).unwrap(), hb());
        // Replaying frame 1 is out of sequence.
        assert!(matches!(
            ctl_rx.open::<AgentMessage>(&f1),
            Err(ProtocolError::Auth(AuthError::Sequence { expected: 2, got: 1 }))
        ));
        let mut bad = f2.clone();
        bad.body = raw(&bad.body.get().replace('3', "9"));
        assert!(matches!(ctl_rx.open::<AgentMessage>(&bad), Err(ProtocolError::Auth(AuthError::BadMac))));
        assert_eq!(ctl_rx.open::<AgentMessage>(&f2).unwrap(), hb());
        // A frame reflected back to its sender does not verify (direction labels).
        let down = ctl_tx.seal(&ControllerMessage::EndAck { id: JobId(1) }).unwrap();
        let mut reflect = agent_tx.seal(&hb()).unwrap();
        reflect.seq = 1;
        assert!(agent_rx.open::<AgentMessage>(&reflect).is_err());
        assert_eq!(agent_rx.open::<ControllerMessage>(&down).unwrap(), ControllerMessage::EndAck { id: JobId(1) });
        // Another session (other nonces) has another key.
        let (_, mut other_rx) = session(&k, &random_nonce(), &c, Role::Controller);
        let f = session(&k, &a, &c, Role::Agent).0.seal(&hb()).unwrap();
        assert!(matches!(other_rx.open::<AgentMessage>(&f), Err(ProtocolError::Auth(AuthError::BadMac))));
    }

    #[test]
    fn the_registered_answer_is_bound_to_the_agent_nonce() {
        let k = key(1);
        let (a1, a2) = (random_nonce(), random_nonce());
        let msg =
            ControllerMessage::Registered { node_id: 1, heartbeat_interval_ms: 1000, lease_ms: None, step_ends: false };
        let env = Envelope::seal(&k, &registered_label(&a1), &msg).unwrap();
        env.verify(&k, &registered_label(&a1)).unwrap();
        assert_eq!(env.verify(&k, &registered_label(&a2)), Err(AuthError::BadMac));
    }

    #[test]
    fn a_sealed_message_is_json_in_the_frame_written_once_and_checked_as_bytes() {
        let k = key(7);
        let (a, c) = (random_nonce(), random_nonce());
        let (mut tx, _) = session(&k, &a, &c, Role::Controller);
        let (mut tx2, _) = session(&k, &a, &c, Role::Controller);
        let msg = ControllerMessage::Kill { id: JobId(4), reason: "quote \" and \u{e9}".into() };
        // Written straight into the frame, or as a value and then framed: the same bytes.
        let bytes = tx.seal_frame(&msg).unwrap();
        assert_eq!(bytes, encode(&tx2.seal(&msg).unwrap()).unwrap());
        let json = &bytes[4..];
        assert_eq!(u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize, json.len());
        let text = std::str::from_utf8(json).unwrap();
        assert!(text.starts_with("{\"v\":3,\"seq\":1,\"body\":{\"op\":\"kill\""), "{text}");
        let v: serde_json::Value = serde_json::from_slice(json).unwrap();
        assert!(v["body"].is_object(), "the body is the message, not a string: {text}");
        // Opened from the bytes, and from the decoded value.
        let (_, mut rx) = session(&k, &a, &c, Role::Agent);
        assert_eq!(rx.open_frame::<ControllerMessage>(json).unwrap(), msg);
        let (_, mut rx) = session(&k, &a, &c, Role::Agent);
        assert_eq!(rx.open::<ControllerMessage>(&decode::<SessionFrame>(json).unwrap()).unwrap(), msg);
        // Every single-byte edit of the frame is refused, never read as another message.
        for i in 0..json.len() {
            for x in [1u8, 0x20, 0x80] {
                let mut edited = json.to_vec();
                edited[i] ^= x;
                let (_, mut rx) = session(&k, &a, &c, Role::Agent);
                match rx.open_frame::<ControllerMessage>(&edited) {
                    Err(_) => {}
                    // A hex digit's case (the MAC's): the same MAC.
                    Ok(m) => assert!(m == msg && edited[i].eq_ignore_ascii_case(&json[i]), "byte {i} ^ {x} opened"),
                }
            }
        }
        // Whitespace that changes nothing in the message still changes the bytes the MAC covers.
        let spaced = text.replacen("\"body\":{\"op\":", "\"body\":{\"op\": ", 1);
        let (_, mut rx) = session(&k, &a, &c, Role::Agent);
        assert!(matches!(
            rx.open_frame::<ControllerMessage>(spaced.as_bytes()),
            Err(ProtocolError::Auth(AuthError::BadMac))
        ));
        // An envelope's body is the message too.
        let env = Envelope::seal(&k, LABEL_REGISTER, &hb()).unwrap();
        let text = String::from_utf8(to_json(&env).unwrap()).unwrap();
        assert!(text.contains("\"body\":{\"op\":\"heartbeat\""), "{text}");
    }

    #[test]
    fn a_frame_of_the_previous_version_is_refused_naming_both_versions() {
        let k = key(7);
        let (_, mut rx) = session(&k, &[1; 16], &[2; 16], Role::Agent);
        let old = br#"{"v":2,"seq":1,"body":"{\"v\":2,\"op\":\"end_ack\",\"id\":1}","mac":"00"}"#;
        let e = rx.open_frame::<ControllerMessage>(old).unwrap_err();
        assert!(matches!(e, ProtocolError::Version { theirs: 2 }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("version 2") && text.contains("speaks 3"), "{text}");
        let old_env = br#"{"v":2,"ts":1,"nonce":"00","body":"{}","mac":"00"}"#;
        assert!(matches!(decode::<Envelope>(old_env), Err(ProtocolError::Version { theirs: 2 })));
    }

    fn grant() -> StepGrant {
        use crate::step::StepNode;
        use crate::user::UserIdentity;
        use berth_core::step::RankPlace;
        StepGrant {
            job: JobId(5),
            step: 1,
            kvsname: "berth_5_1".into(),
            user: UserIdentity { uid: 1000, gid: 1000, groups: vec![], name: "u".into() },
            argv: vec!["true".into()],
            env: vec![("A".into(), "é\"\\".into())],
            cwd: "/".into(),
            size: 1,
            fanout: 2,
            no_kill: false,
            rank_cpusets: false,
            bind: true,
            notify_signal: None,
            kill_grace_ms: 500,
            mpi: Default::default(),
            nodes: vec![StepNode {
                name: "node1".into(),
                address: "127.0.0.1:1".into(),
                ranks: vec![RankPlace { rank: 0, cpus: berth_core::CpuSet::parse_list("0-1").unwrap() }],
                instance: String::new(),
            }],
            interactive: false,
            attach: false,
            expires_ms: 0,
            apps: vec![],
            spawned_by: None,
            mac: String::new(),
        }
    }

    #[test]
    fn grants_are_signed_and_expire() {
        let k = key(3);
        let now = now_ms();
        let mut g = grant();
        assert!(matches!(verify_grant(&k, &g, now), Err(AuthError::Unsigned(_))));
        sign_grant(&k, &mut g, now + 1000);
        verify_grant(&k, &g, now).unwrap();
        // Through JSON (as `berth run` relays it) it still verifies.
        let relayed: StepGrant = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        verify_grant(&k, &relayed, now).unwrap();
        assert_eq!(verify_grant(&k, &g, now + 1500), Err(AuthError::Expired(500)));
        assert_eq!(verify_grant(&key(4), &g, now), Err(AuthError::BadMac));
        let mut cpus = g.clone();
        cpus.nodes[0].ranks[0].cpus = berth_core::CpuSet::parse_list("2-3").unwrap();
        assert_eq!(verify_grant(&k, &cpus, now), Err(AuthError::BadMac));
        let mut later = g.clone();
        later.expires_ms += 60_000;
        assert_eq!(verify_grant(&k, &later, now), Err(AuthError::BadMac));
        let mut root = g.clone();
        root.user.uid = 0;
        assert_eq!(verify_grant(&k, &root, now), Err(AuthError::BadMac));
    }

    #[test]
    fn key_files_are_private_and_well_formed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("berth-key-test-{}-{}", std::process::id(), now_ms()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.key");
        let k = ClusterKey::generate(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(ClusterKey::load(&path).unwrap(), k);
        assert!(matches!(ClusterKey::generate(&path), Err(KeyError::Exists { .. })));
        assert_eq!(ClusterKey::load_or_generate(&path).unwrap(), k);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = ClusterKey::load(&path).unwrap_err();
        assert!(matches!(e, KeyError::Permissions { mode: 0o640, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(matches!(ClusterKey::load(&path), Err(KeyError::Format { .. })));
        let missing = ClusterKey::load(&dir.join("nope")).unwrap_err();
        assert!(missing.to_string().contains("berth keygen"), "{missing}");
        assert_eq!(format!("{k:?}"), "ClusterKey(..)");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
