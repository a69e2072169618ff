//! What a peer may hold of an agent (docs/protocol/00-framing.md, "Limits"): frames that grow with what
//! arrives within a budget shared by every connection, a small limit until the peer is known,
//! timeouts, and caps on connections.
//!
//! "Identified" per socket: on the TCP port (steps, tasks between agents, status) the first
//! frame is the credential (a signed grant or envelope), checked once it is whole, so it is
//! held to [`FIRST_FRAME_BYTES`] and [`HANDSHAKE_TIMEOUT`]; later frames are MAC'd session
//! frames. On the local socket the caller is identified when the kernel's credentials show it
//! is root or a process of a job running here; anyone else (who can only be refused) is held
//! to [`UNIDENTIFIED_FRAME_BYTES`].

use berth_protocol::frame::UNIDENTIFIED_FRAME_BYTES;
use berth_protocol::limits::ConnLimits;
use berth_protocol::{FrameBudget, FrameLimits, MAX_FRAME_BYTES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of frames still arriving that all the agent's connections may hold together.
pub static FRAMES: FrameBudget = FrameBudget::new(256 << 20, "the agent's");

/// The largest first frame on the TCP port: a step launch carries the step's environment and
/// command line (the kernel's ARG_MAX bounds them, 2 MiB by default) and its node list.
pub const FIRST_FRAME_BYTES: usize = 4 << 20;

/// How long a new TCP connection may take to send its first frame.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A local connection with no request in flight that sends nothing this long is closed; also
/// the time a request may take to arrive once begun.
pub const LOCAL_IDLE: Duration = Duration::from_secs(60);

/// TCP connections still waiting for their first frame, at most.
const MAX_HANDSHAKES: usize = 1024;

/// The local socket's caps (root: no per-uid cap, and a reserve past the total).
pub const LOCAL_CONNECTIONS: ConnLimits = ConnLimits { per_uid: 256, total: 4096, root_reserve: 64 };

static HANDSHAKES: AtomicUsize = AtomicUsize::new(0);

/// How the first frame of a TCP connection is read.
pub fn first_frame() -> FrameLimits<'static> {
    FrameLimits {
        max_bytes: FIRST_FRAME_BYTES,
        why: " before authentication",
        idle: Some(HANDSHAKE_TIMEOUT),
        frame: Some(HANDSHAKE_TIMEOUT),
        budget: Some(&FRAMES),
    }
}

/// How the next request on the local socket is read.
pub fn local_request(identified: bool) -> FrameLimits<'static> {
    FrameLimits {
        max_bytes: if identified { MAX_FRAME_BYTES } else { UNIDENTIFIED_FRAME_BYTES },
        why: if identified { "" } else { " for a caller that is not a process of a job running here" },
        idle: Some(LOCAL_IDLE),
        frame: Some(LOCAL_IDLE),
        budget: Some(&FRAMES),
    }
}

/// A TCP connection waiting for its first frame; `None` if too many are.
pub struct Handshake(());

impl Handshake {
    pub fn start() -> Option<Handshake> {
        if HANDSHAKES.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            HANDSHAKES.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Handshake(()))
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        HANDSHAKES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Raise the open-file limit (soft to hard) at start: every connection holds a descriptor.
pub fn raise_nofile() {
    match berth_protocol::limits::raise_nofile() {
        Ok(n) => tracing::debug!("open-file limit {n}"),
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
}

/// Shared by the local socket's connections.
pub fn local_tracker() -> Arc<berth_protocol::limits::ConnTracker> {
    berth_protocol::limits::ConnTracker::new(LOCAL_CONNECTIONS)
}
