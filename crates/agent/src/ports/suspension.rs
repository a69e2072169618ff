//! A job's suspension state on this node: frozen or not, for how long (its walltime does not
//! count the time suspended), and the allocation it was last moved to. The operations that
//! freeze, thaw and move a job are in [`crate::job::suspend`].

use crate::cgroup::JobCgroup;
use berth_core::job::NodeAllocation;
use berth_core::JobId;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the controller asked of a job here.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Suspend,
    /// Thaw; with an allocation, first move to its CPUs and memory nodes.
    Resume(Option<Box<NodeAllocation>>),
}

/// Paused time of a job: what its walltime does not count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Pause {
    /// Suspensions that ended.
    total: Duration,
    /// The current suspension's start.
    since: Option<Instant>,
    /// Walltime added to the one the job was launched with (an admin raised it).
    extended: Duration,
}

/// When a walltime started at `start` ends, with `paused` of suspension added; `None` when
/// that is beyond what the monotonic clock can represent (it never comes). Whatever the
/// controller sends, this never overflows: an `Instant` plus a huge `Duration` panics.
pub(crate) fn walltime_deadline(start: Instant, walltime: Duration, paused: Duration) -> Option<Instant> {
    // Timers beyond a century are as good as never, and stay well inside tokio's range.
    const NEVER: Duration = Duration::from_secs(100 * 365 * 86400);
    let total = walltime.checked_add(paused)?;
    if total > NEVER {
        return None;
    }
    start.checked_add(total)
}

/// A job's suspension state on this node (one per [`crate::ports::JobHandle`]).
pub struct Suspension {
    clock: watch::Sender<Pause>,
    /// The operations to carry out and where the job is, behind one lock.
    pub(crate) pending: Mutex<Pending>,
    /// Held while the cgroup is frozen, thawed or moved, and by the job's end.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// The job is ending: no more freezing.
    pub(crate) ending: AtomicBool,
}

/// What [`Suspension::pending`] guards.
pub(crate) struct Pending {
    /// Operations not yet carried out.
    pub ops: VecDeque<Op>,
    /// A task is carrying them out.
    pub draining: bool,
    /// This node's part of the allocation as the controller last sent it.
    pub allocation: NodeAllocation,
}

impl Suspension {
    pub fn new(allocation: NodeAllocation) -> Self {
        Suspension {
            clock: watch::Sender::new(Pause::default()),
            pending: Mutex::new(Pending { ops: VecDeque::new(), draining: false, allocation }),
            gate: tokio::sync::Mutex::new(()),
            ending: AtomicBool::new(false),
        }
    }

    pub fn is_suspended(&self) -> bool {
        self.clock.borrow().since.is_some()
    }

    /// Time spent suspended so far, the current suspension included.
    pub fn paused(&self) -> Duration {
        let p = *self.clock.borrow();
        p.total + p.since.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// A job re-adopted by a restarted agent and found frozen: suspended from now on (how
    /// long it was suspended before the restart is not known here).
    pub fn adopt_frozen(&self) {
        self.pause();
    }

    pub(crate) fn pause(&self) {
        self.clock.send_modify(|p| {
            if p.since.is_none() {
                p.since = Some(Instant::now());
            }
        });
    }

    pub(crate) fn unpause(&self) {
        self.clock.send_modify(|p| {
            if let Some(s) = p.since.take() {
                p.total += s.elapsed();
            }
        });
    }

    /// The current part of the allocation (after any move).
    pub fn allocation(&self) -> Option<NodeAllocation> {
        self.pending.lock().ok().map(|p| p.allocation.clone())
    }

    /// Returns once `walltime` of time not suspended has passed since the call: the deadline
    /// moves by every suspension, and does not pass while the job is suspended; it moves too
    /// when the walltime is raised (`extend`).
    pub async fn walltime(&self, walltime: Duration) {
        let start = Instant::now();
        let (base, base_extended) = {
            let p = self.clock.borrow();
            (p.total, p.extended)
        };
        let mut rx = self.clock.subscribe();
        loop {
            let p = *rx.borrow_and_update();
            match p.since {
                Some(_) => {
                    // The sender lives as long as `self`: changed() cannot fail while we wait.
                    let _ = rx.changed().await;
                }
                None => match walltime
                    .checked_add(p.extended.saturating_sub(base_extended))
                    .and_then(|w| walltime_deadline(start, w, p.total.saturating_sub(base)))
                {
                    Some(deadline) => tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => return,
                        _ = rx.changed() => {}
                    },
                    // Beyond what the clock can hold: it never passes.
                    None => {
                        let _ = rx.changed().await;
                    }
                },
            }
        }
    }

    /// The walltime is now the one the job was launched with plus `by` (an admin raised it):
    /// every `walltime` wait moves its deadline. Setting the same value again changes nothing.
    pub fn extend(&self, by: Duration) {
        self.clock.send_if_modified(|p| {
            let changed = p.extended != by;
            p.extended = by;
            changed
        });
    }

    /// The job is ending (walltime or kill): refuse further freezing and thaw it if it is
    /// suspended, so that its processes act on the SIGTERM that follows (a frozen process
    /// acts on signals only once thawed).
    pub async fn end(&self, id: JobId, cg: &Arc<dyn JobCgroup>) {
        self.ending.store(true, Ordering::SeqCst);
        let _gate = self.gate.lock().await;
        if !self.is_suspended() {
            return;
        }
        let cg = cg.clone();
        match tokio::task::spawn_blocking(move || cg.thaw()).await {
            Ok(Ok(())) => tracing::info!(job = %id, "thawed the suspended job for its end"),
            Ok(Err(e)) => {
                tracing::warn!(job = %id, "cannot thaw the suspended job for its end: {e}; it will be killed frozen")
            }
            Err(e) => tracing::warn!(job = %id, "thaw for the job's end failed: {e}"),
        }
        self.unpause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> NodeAllocation {
        serde_json::from_value(serde_json::json!({
            "node_id": 0, "node": "n", "cpus": "0", "cores": 1, "mems": "0", "memory_bytes": 1024
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn walltime_stops_while_suspended() {
        let s = Arc::new(Suspension::new(alloc()));
        let t0 = Instant::now();
        let s2 = s.clone();
        let wall = tokio::spawn(async move {
            s2.walltime(Duration::from_secs(3)).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        s.pause();
        assert!(s.is_suspended());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!wall.is_finished(), "the walltime passed while suspended");
        s.unpause();
        assert_eq!(s.paused(), Duration::from_secs(10));
        let ended = wall.await.unwrap();
        assert_eq!(ended - t0, Duration::from_secs(13), "3 s of walltime + 10 s suspended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_raised_walltime_moves_the_deadline_and_counts_from_the_start() {
        let s = Arc::new(Suspension::new(alloc()));
        let t0 = Instant::now();
        let s2 = s.clone();
        let wall = tokio::spawn(async move {
            s2.walltime(Duration::from_secs(10)).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(8)).await;
        s.extend(Duration::from_secs(20));
        s.extend(Duration::from_secs(20)); // told again (a re-registered agent): no change
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!wall.is_finished(), "ended at the walltime it was launched with");
        let ended = wall.await.unwrap();
        assert_eq!(ended - t0, Duration::from_secs(30), "10 s launched + 20 s added, from the start");
    }

    #[tokio::test(start_paused = true)]
    async fn walltime_counts_only_suspensions_after_it_began() {
        let s = Suspension::new(alloc());
        s.pause();
        tokio::time::sleep(Duration::from_secs(5)).await;
        s.unpause();
        let t0 = Instant::now();
        s.walltime(Duration::from_secs(2)).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    }

    /// Every walltime the controller accepts (1 s to `[limits] max_walltime_secs`, 365 days by
    /// default), and any it might send from an older store (up to u64::MAX): the deadline
    /// never panics, and the job ends exactly when its walltime of unsuspended time is over.
    fn walltime_case(walltime_secs: u64, suspend_after_ms: u64, suspended_ms: u64) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let s = Arc::new(Suspension::new(alloc()));
            let t0 = Instant::now();
            let s2 = s.clone();
            let walltime = Duration::from_secs(walltime_secs);
            let wall = tokio::spawn(async move {
                s2.walltime(walltime).await;
                Instant::now()
            });
            let before = Duration::from_millis(suspend_after_ms).min(walltime / 2);
            tokio::time::sleep(before).await;
            s.pause();
            tokio::time::sleep(Duration::from_millis(suspended_ms)).await;
            s.unpause();
            // 101 years: past every deadline that can come.
            let horizon = Duration::from_secs(101 * 365 * 86400);
            let ended = tokio::time::timeout(horizon, wall).await;
            match walltime_deadline(t0, walltime, Duration::from_millis(suspended_ms)) {
                Some(_) => {
                    let at = ended.expect("the walltime ends").expect("no panic");
                    assert_eq!(at - t0, walltime + Duration::from_millis(suspended_ms));
                }
                None => assert!(ended.is_err(), "a walltime beyond a century never ends"),
            }
        });
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn every_accepted_walltime_ends_on_time(
            w in 1u64..=365 * 86400, after in 0u64..10_000_000, paused in 0u64..100_000_000,
        ) {
            walltime_case(w, after, paused);
        }

        #[test]
        fn any_walltime_at_all_never_panics(w in proptest::prelude::any::<u64>(), paused in 0u64..u64::MAX / 4) {
            let start = Instant::now();
            if let Some(d) = walltime_deadline(start, Duration::from_secs(w), Duration::from_millis(paused)) {
                proptest::prop_assert!(d >= start);
            }
        }
    }

    #[test]
    fn the_largest_walltimes_do_not_panic() {
        for w in [365 * 86400, 9223372036854775807, u64::MAX] {
            walltime_case(w, 1000, 5000);
        }
    }
}
