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

/// Bytes of frames still arriving that all the controller's connections may hold together.
pub(crate) static FRAMES: FrameBudget = FrameBudget::new(256 << 20, "the controller's");

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

/// The local socket's caps and timeouts, and the agent port's handshakes.
pub(crate) struct Limits {
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
    pub(crate) fn request(&self, holds_step: bool) -> FrameLimits<'static> {
        FrameLimits {
            max_bytes: MAX_FRAME_BYTES,
            why: "",
            idle: (!holds_step).then_some(self.idle),
            frame: Some(self.idle),
            budget: Some(&FRAMES),
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
    pub(crate) fn registration() -> FrameLimits<'static> {
        FrameLimits {
            max_bytes: REGISTRATION_FRAME_BYTES,
            why: " before authentication",
            idle: Some(HANDSHAKE_TIMEOUT),
            frame: Some(HANDSHAKE_TIMEOUT),
            budget: Some(&FRAMES),
        }
    }

    /// How an authenticated agent's frames are read.
    pub(crate) fn agent_session(&self) -> FrameLimits<'static> {
        FrameLimits {
            max_bytes: MAX_FRAME_BYTES,
            why: "",
            idle: Some(self.agent_idle),
            frame: Some(self.agent_idle),
            budget: Some(&FRAMES),
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
