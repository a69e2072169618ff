//! What a peer may hold of the controller (docs/protocol/00-framing.md, "Limits"): connections per user
//! and in all on the local socket, frames that grow with what arrives within a budget shared
//! by every connection, and timeouts so that idle or silent peers let go.
//!
//! "Identified" per socket: on the local socket the kernel tells who connected
//! (SO_PEERCRED) before any byte is read, so a user's frames may be as large as the protocol
//! allows (a submission carries its script) from the start; on the agent port nothing is
//! known until the signed registration is verified, so that first frame is held to
//! [`REGISTRATION_FRAME_BYTES`] and [`HANDSHAKE_TIMEOUT`].

use crate::config::ControllerConfig;
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode};
use berth_protocol::limits::{ConnLimits, ConnSlot, ConnTracker, LogLimiter};
use berth_protocol::{write_frame, FrameBudget, FrameLimits, MAX_FRAME_BYTES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// Bytes of frames still arriving that all of one controller's connections may hold together.
const FRAME_BYTES: usize = 256 << 20;

/// The largest registration: it carries the node's topology (a 4,096-PU node's is ~60 KB) and
/// its job lists. Larger first frames on the agent port are refused before authentication.
pub(crate) const REGISTRATION_FRAME_BYTES: usize = 1 << 20;

/// How long a new agent connection may take to send its registration.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Agent connections still in their handshake, at most: past it new ones are closed at once.
const MAX_HANDSHAKES: usize = 1024;

/// Descriptors kept for everything but client connections: the database, agents, logs.
const FD_RESERVE: u64 = 512;

/// Refused connections being told why, at most; past it they are closed without a word.
const MAX_REFUSING: usize = 64;

/// The local socket's caps and timeouts, the agent port's handshakes, and the frame budget
/// every connection of this controller draws on (its own: two controllers in one process,
/// as in tests, do not share one).
pub(crate) struct Limits {
    frames: FrameBudget,
    clients: Arc<ConnTracker>,
    idle: Duration,
    log: LogLimiter,
    refusing: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    /// An authenticated agent that sends nothing (not even heartbeats) this long is cut off.
    pub(crate) agent_idle: Duration,
}

impl Limits {
    /// Raises the descriptor limit (soft to hard) and fits the caps of `cfg` under it.
    pub(crate) fn new(cfg: &ControllerConfig) -> Arc<Limits> {
        let c = &cfg.connections;
        let mut total = c.max_total;
        match berth_protocol::limits::raise_nofile() {
            Ok(nofile) => {
                let room = nofile.saturating_sub(FD_RESERVE + c.root_reserve as u64 + MAX_REFUSING as u64);
                if (total as u64) > room {
                    total = room.max(1) as usize;
                    tracing::warn!(
                        "open-file limit {nofile}: at most {total} client connections (connections.max_total is {}); raise the hard limit (LimitNOFILE=) to allow more",
                        c.max_total
                    );
                }
            }
            Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
        }
        let limits = ConnLimits { per_uid: c.max_per_uid.min(total), total, root_reserve: c.root_reserve };
        tracing::info!(
            per_uid = limits.per_uid,
            total = limits.total,
            root_reserve = limits.root_reserve,
            idle_secs = c.idle_timeout_secs,
            "client connection limits"
        );
        Arc::new(Limits {
            frames: FrameBudget::new(FRAME_BYTES, "the controller's"),
            clients: ConnTracker::new(limits),
            idle: Duration::from_secs(c.idle_timeout_secs.max(1)),
            log: LogLimiter::new(Duration::from_secs(10)),
            refusing: Arc::new(AtomicUsize::new(0)),
            handshakes: Arc::new(AtomicUsize::new(0)),
            agent_idle: Duration::from_secs_f64(
                (cfg.heartbeat_interval_secs * f64::from(cfg.heartbeat_misses) * 4.0).clamp(60.0, 3600.0),
            ),
        })
    }

    /// A place for a new client connection, or `None`: it was refused (told why, logged).
    pub(crate) fn admit(&self, stream: UnixStream) -> Option<(UnixStream, ConnSlot)> {
        let uid = match stream.peer_cred() {
            Ok(c) => c.uid(),
            // serve_client tells the peer; it holds a place as any user would.
            Err(_) => u32::MAX,
        };
        match self.clients.admit(uid) {
            Ok(slot) => Some((stream, slot)),
            Err(why) => {
                let why = why.to_string();
                if let Some(held_back) = self.log.allow(&format!("uid {uid}")) {
                    let (total, mine) = self.clients.held(uid);
                    tracing::warn!(
                        uid,
                        held = mine,
                        total,
                        "client connection refused: {why}{}",
                        if held_back > 0 {
                            format!(" ({held_back} more refused since the last line)")
                        } else {
                            String::new()
                        }
                    );
                }
                self.refuse(stream, why);
                None
            }
        }
    }

    /// Tell a refused peer why, then close: the answer is written first, the peer's request (if
    /// it sends one) is read and dropped, so that it reads the answer instead of a reset.
    fn refuse(&self, mut stream: UnixStream, why: String) {
        if self.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let refusing = self.refusing.clone();
        tokio::spawn(async move {
            let resp = ClientResponse::Error(ApiError::new(ErrorCode::Unavailable, why));
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                if write_frame(&mut stream, &resp).await.is_ok() {
                    let mut sink = [0u8; 4096];
                    let _ = stream.read(&mut sink).await;
                }
            })
            .await;
            refusing.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// How the next request of a client connection is read: idle timeout unless the connection
    /// holds a step (`berth run` keeps it open, silent, while the step runs; closing it would
    /// end an interactive allocation), the same bound on a request once it has begun.
    pub(crate) fn request(&self, holds_step: bool) -> FrameLimits<'_> {
        FrameLimits {
            max_bytes: MAX_FRAME_BYTES,
            why: "",
            idle: (!holds_step).then_some(self.idle),
            frame: Some(self.idle),
            budget: Some(&self.frames),
        }
    }

    /// A place for an agent connection's handshake, or `None` if too many are in progress.
    pub(crate) fn handshake(&self) -> Option<Handshake> {
        if self.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            self.handshakes.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Handshake(self.handshakes.clone()))
    }

    /// How an agent connection's first frame is read: unauthenticated.
    pub(crate) fn registration(&self) -> FrameLimits<'_> {
        FrameLimits {
            max_bytes: REGISTRATION_FRAME_BYTES,
            why: " before authentication",
            idle: Some(HANDSHAKE_TIMEOUT),
            frame: Some(HANDSHAKE_TIMEOUT),
            budget: Some(&self.frames),
        }
    }

    /// How an authenticated agent's frames are read.
    pub(crate) fn agent_session(&self) -> FrameLimits<'_> {
        FrameLimits {
            max_bytes: MAX_FRAME_BYTES,
            why: "",
            idle: Some(self.agent_idle),
            frame: Some(self.agent_idle),
            budget: Some(&self.frames),
        }
    }
}

/// An agent connection's handshake in progress.
pub(crate) struct Handshake(Arc<AtomicUsize>);

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::client::ClientRequest;
    use berth_protocol::read_raw_frame_limited;
    use tokio::io::AsyncWriteExt;

    /// Two controllers in one process (as in the tests) each have their own frame budget: a
    /// frame arriving at one holds bytes of its budget only, given back when the read ends.
    #[tokio::test]
    async fn each_controller_draws_on_its_own_frame_budget() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::testkit::config(dir.path());
        let (a, b) = (Limits::new(&cfg), Limits::new(&cfg));
        let draws_on = |l: FrameLimits<'_>, on: &Limits| l.budget.is_some_and(|x| std::ptr::eq(x, &on.frames));
        for l in [&a, &b] {
            assert!(draws_on(l.request(false), l) && draws_on(l.request(true), l));
            assert!(draws_on(l.registration(), l) && draws_on(l.agent_session(), l));
        }
        assert!(!draws_on(b.registration(), &a), "another controller's budget is its own");

        // A 1 MiB registration begun on a's agent port: its first bytes arrived, the rest not.
        let (mut peer, mut conn) = tokio::io::duplex(1 << 16);
        peer.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
        peer.write_all(&[b'x'; 100]).await.unwrap();
        let reading = {
            let a = a.clone();
            tokio::spawn(async move { read_raw_frame_limited(&mut conn, &a.registration()).await })
        };
        let began = std::time::Instant::now();
        while a.frames.used() == 0 {
            assert!(began.elapsed() < Duration::from_secs(10), "the frame never drew on a's budget");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(b.frames.used(), 0, "a's frame drew on b's budget");

        // Meanwhile b reads whole frames, and holds nothing once they are read.
        let (mut client, mut served) = tokio::io::duplex(1 << 16);
        berth_protocol::write_frame(&mut client, &ClientRequest::Ping).await.unwrap();
        let body = read_raw_frame_limited(&mut served, &b.request(false)).await.unwrap();
        assert!(body.is_some_and(|frame| !frame.is_empty()));
        assert_eq!(b.frames.used(), 0);

        // The frame's read ends (its connection dropped): a's bytes are given back.
        reading.abort();
        assert!(reading.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(a.frames.used(), 0, "a's budget kept the bytes of a read that ended");
        drop(peer);
    }
}
