//! Fencing by lease (docs/protocol/02-agent.md, "Fencing"): the connection task of an agent that
//! fences answers each of its heartbeats with `renew` at once, and stamps when it last heard
//! from it here. The state thread judges a node's silence by the later of that stamp and its
//! own record, so a node is never taken for silent (and its jobs requeued) while its agent
//! is still renewed, even when the state thread is behind on its queue; and an agent kills
//! its fenced jobs a margin before the controller, having heard nothing for the node
//! timeout, requeues them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The origin of the stamps: the first stamp of this process (a monotonic clock).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since `epoch`.
fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

type Stamps = Mutex<HashMap<u64, Arc<AtomicU64>>>;

fn stamps() -> &'static Stamps {
    static STAMPS: OnceLock<Stamps> = OnceLock::new();
    STAMPS.get_or_init(Default::default)
}

/// The stamp of agent connection `conn`, made when its registration is accepted.
pub fn open(conn: u64) -> Arc<AtomicU64> {
    let stamp = Arc::new(AtomicU64::new(now_ms()));
    if let Ok(mut s) = stamps().lock() {
        s.insert(conn, stamp.clone());
    }
    stamp
}

/// Heard from the agent of this stamp now.
pub fn heard(stamp: &AtomicU64) {
    stamp.fetch_max(now_ms(), Ordering::Relaxed);
}

/// The connection closed.
pub fn close(conn: u64) {
    if let Ok(mut s) = stamps().lock() {
        s.remove(&conn);
    }
}

/// How long connection `conn`'s agent has been silent at `now` (the state thread's clock,
/// `crate::clock`), as its connection task saw it.
pub fn silent_for(conn: u64, now: Instant) -> Option<Duration> {
    let stamp = stamps().lock().ok()?.get(&conn)?.load(Ordering::Relaxed);
    Some(now.saturating_duration_since(epoch() + Duration::from_millis(stamp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_stamp_counts_and_a_closed_connection_has_none() {
        let s = open(u64::MAX - 1);
        std::thread::sleep(Duration::from_millis(30));
        assert!(silent_for(u64::MAX - 1, Instant::now()).unwrap() >= Duration::from_millis(30));
        heard(&s);
        assert!(silent_for(u64::MAX - 1, Instant::now()).unwrap() < Duration::from_millis(30));
        close(u64::MAX - 1);
        assert_eq!(silent_for(u64::MAX - 1, Instant::now()), None);
    }
}
