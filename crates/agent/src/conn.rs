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
const FRAME_BYTES: usize = 256 << 20;

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

/// What all of one agent's connections share (its `JobContext::conns`): the bytes of frames
/// still arriving ([`FRAME_BYTES`] at most) and the TCP connections waiting for their first
/// frame ([`MAX_HANDSHAKES`] at most).
pub struct ConnBudgets {
    frames: FrameBudget,
    handshakes: AtomicUsize,
}

impl Default for ConnBudgets {
    fn default() -> Self {
        ConnBudgets { frames: FrameBudget::new(FRAME_BYTES, "the agent's"), handshakes: AtomicUsize::new(0) }
    }
}

impl ConnBudgets {
    /// How the first frame of a TCP connection is read.
    pub fn first_frame(&self) -> FrameLimits<'_> {
        FrameLimits {
            max_bytes: FIRST_FRAME_BYTES,
            why: " before authentication",
            idle: Some(HANDSHAKE_TIMEOUT),
            frame: Some(HANDSHAKE_TIMEOUT),
            budget: Some(&self.frames),
        }
    }

    /// How the next request on the local socket is read.
    pub fn local_request(&self, identified: bool) -> FrameLimits<'_> {
        FrameLimits {
            max_bytes: if identified { MAX_FRAME_BYTES } else { UNIDENTIFIED_FRAME_BYTES },
            why: if identified { "" } else { " for a caller that is not a process of a job running here" },
            idle: Some(LOCAL_IDLE),
            frame: Some(LOCAL_IDLE),
            budget: Some(&self.frames),
        }
    }

    /// A TCP connection starts waiting for its first frame; `None` if too many are.
    pub fn handshake(self: &Arc<Self>) -> Option<Handshake> {
        if self.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            self.handshakes.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Handshake(self.clone()))
    }
}

/// A TCP connection waiting for its first frame, counted until dropped.
pub struct Handshake(Arc<ConnBudgets>);

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::AcqRel);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_capped_per_agent_and_freed_when_dropped() {
        let (a, b) = (Arc::new(ConnBudgets::default()), Arc::new(ConnBudgets::default()));
        let held: Vec<Handshake> = (0..MAX_HANDSHAKES).map(|_| a.handshake().expect("under the cap")).collect();
        assert!(a.handshake().is_none(), "one past the cap is refused");
        // Another agent in the same process has its own count.
        assert!(b.handshake().is_some());
        drop(held);
        assert_eq!(a.handshakes.load(Ordering::Acquire), 0);
        assert!(a.handshake().is_some(), "dropped handshakes free their places");
    }

    #[test]
    fn every_connection_of_an_agent_draws_on_its_one_frame_budget() {
        let (a, b) = (ConnBudgets::default(), ConnBudgets::default());
        let draws_on = |l: FrameLimits<'_>, on: &ConnBudgets| l.budget.is_some_and(|x| std::ptr::eq(x, &on.frames));
        assert!(draws_on(a.first_frame(), &a));
        assert!(draws_on(a.local_request(true), &a));
        assert!(draws_on(a.local_request(false), &a));
        assert!(draws_on(b.first_frame(), &b) && !draws_on(b.first_frame(), &a), "another agent's budget is its own");
        assert_eq!(a.frames.used(), 0);
    }
}
