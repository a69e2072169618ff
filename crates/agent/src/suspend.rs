//! Suspending a job on this node: its cgroup is frozen (every process of the job, its steps
//! and its tasks stop where they are), its walltime clock stops, and it is thawed later,
//! possibly on other CPUs of the node (cpuset change; memory follows a change of memory
//! nodes: v1 `cpuset.memory_migrate`, always on v2).
//!
//! The controller's `suspend` / `resume` for a job are carried out one at a time, in the
//! order they arrived, each answered with `suspended` / `resumed`. A job that is ending
//! (walltime, kill) is thawed first so its processes act on the SIGTERM.

use crate::cgroup::{JobCgroup, JobLimits};
use crate::job::JobContext;
use crate::registry::JobHandle;
use berth_core::job::NodeAllocation;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, CgroupReport};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
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

/// A job's suspension state on this node (one per [`JobHandle`]).
pub struct Suspension {
    clock: watch::Sender<Pause>,
    /// Operations not yet carried out, and whether a task is carrying them out.
    queue: Mutex<(VecDeque<Op>, bool)>,
    /// Held while the cgroup is frozen, thawed or moved, and by the job's end.
    gate: tokio::sync::Mutex<()>,
    /// The job is ending: no more freezing.
    ending: AtomicBool,
    /// This node's part of the allocation as the controller last sent it.
    allocation: Mutex<NodeAllocation>,
}

impl Suspension {
    pub fn new(allocation: NodeAllocation) -> Self {
        Suspension {
            clock: watch::Sender::new(Pause::default()),
            queue: Mutex::new((VecDeque::new(), false)),
            gate: tokio::sync::Mutex::new(()),
            ending: AtomicBool::new(false),
            allocation: Mutex::new(allocation),
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

    fn pause(&self) {
        self.clock.send_modify(|p| {
            if p.since.is_none() {
                p.since = Some(Instant::now());
            }
        });
    }

    fn unpause(&self) {
        self.clock.send_modify(|p| {
            if let Some(s) = p.since.take() {
                p.total += s.elapsed();
            }
        });
    }

    /// The current part of the allocation (after any move).
    pub fn allocation(&self) -> Option<NodeAllocation> {
        self.allocation.lock().ok().map(|a| a.clone())
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

/// Carry out `op` for the job `id` and answer the controller on `events`: in order with the
/// job's other operations when it is set up here; a job still being launched is waited for
/// briefly.
pub fn request(
    ctx: &Arc<JobContext>,
    id: JobId,
    op: Op,
    launching: bool,
    events: &mpsc::UnboundedSender<AgentMessage>,
) {
    if let Some(job) = ctx.registry.get(id) {
        enqueue(ctx, job, op, events);
        return;
    }
    if !launching {
        let _ = events.send(reply(id, &op, Err(format!("job {id} is not running on this node")), vec![]));
        return;
    }
    let (ctx, events) = (ctx.clone(), events.clone());
    tokio::spawn(async move {
        match ctx.registry.wait_for(id, Duration::from_secs(10)).await {
            Some(job) => enqueue(&ctx, job, op, &events),
            None => {
                let _ = events.send(reply(id, &op, Err(format!("job {id} did not finish starting here")), vec![]));
            }
        }
    });
}

fn enqueue(ctx: &Arc<JobContext>, job: Arc<JobHandle>, op: Op, events: &mpsc::UnboundedSender<AgentMessage>) {
    let start = match job.suspension.queue.lock() {
        Ok(mut q) => {
            q.0.push_back(op);
            !std::mem::replace(&mut q.1, true)
        }
        Err(_) => false,
    };
    if start {
        tokio::spawn(drain(ctx.clone(), job, events.clone()));
    }
}

async fn drain(ctx: Arc<JobContext>, job: Arc<JobHandle>, events: mpsc::UnboundedSender<AgentMessage>) {
    loop {
        let op = match job.suspension.queue.lock() {
            Ok(mut q) => match q.0.pop_front() {
                Some(op) => op,
                None => {
                    q.1 = false;
                    return;
                }
            },
            Err(_) => return,
        };
        let id = job.spec.id;
        let msg = match &op {
            Op::Suspend => reply(id, &op, suspend(&job).await, vec![]),
            Op::Resume(alloc) => match resume(&ctx, &job, alloc.as_deref()).await {
                Ok(cgroups) => reply(id, &op, Ok(()), cgroups),
                Err(e) => reply(id, &op, Err(e), vec![]),
            },
        };
        match &msg {
            AgentMessage::Suspended { error: Some(e), .. } | AgentMessage::Resumed { error: Some(e), .. } => {
                tracing::warn!(job = %id, ?op, "{e}")
            }
            _ => tracing::info!(job = %id, ?op, "done"),
        }
        let _ = events.send(msg);
    }
}

fn reply(id: JobId, op: &Op, result: Result<(), String>, cgroups: Vec<CgroupReport>) -> AgentMessage {
    let error = result.err();
    match op {
        Op::Suspend => AgentMessage::Suspended { id, error },
        Op::Resume(_) => AgentMessage::Resumed { id, error, cgroups },
    }
}

/// Freeze the job's cgroup here; its walltime clock stops once the kernel reports it frozen.
pub async fn suspend(job: &JobHandle) -> Result<(), String> {
    let s = &job.suspension;
    let id = job.spec.id;
    let _gate = s.gate.lock().await;
    if s.ending.load(Ordering::SeqCst) {
        return Err(format!("job {id} is ending; it is not suspended"));
    }
    if s.is_suspended() {
        return Ok(());
    }
    let cg = job.cgroup.clone();
    match tokio::task::spawn_blocking(move || cg.freeze()).await {
        Ok(Ok(())) => {
            s.pause();
            Ok(())
        }
        Ok(Err(e)) => Err(format!("cannot freeze job {id}: {e}")),
        Err(e) => Err(format!("cannot freeze job {id}: {e}")),
    }
}

/// Move the job (when `to` is given) and thaw it. Returns the job's cgroup as the kernel
/// holds it after a move (empty without one). A failed move leaves the job frozen where it
/// was.
pub async fn resume(
    ctx: &JobContext,
    job: &JobHandle,
    to: Option<&NodeAllocation>,
) -> Result<Vec<CgroupReport>, String> {
    let s = &job.suspension;
    let id = job.spec.id;
    let _gate = s.gate.lock().await;
    let mut reports = vec![];
    if let Some(to) = to {
        reports = relocate(ctx, job, to).await?;
    }
    if !s.is_suspended() {
        // Already running (a repeated resume, or thawed for its end).
        return Ok(reports);
    }
    let cg = job.cgroup.clone();
    match tokio::task::spawn_blocking(move || cg.thaw()).await {
        Ok(Ok(())) => {
            s.unpause();
            Ok(reports)
        }
        Ok(Err(e)) => Err(format!("cannot thaw job {id}: {e}")),
        Err(e) => Err(format!("cannot thaw job {id}: {e}")),
    }
}

/// Give the job's cpuset the CPUs and memory nodes of `to`. Refused for jobs with sub-cpusets
/// (per-rank ones, or the user's own): their CPUs are inside the job's and would not follow.
async fn relocate(ctx: &JobContext, job: &JobHandle, to: &NodeAllocation) -> Result<Vec<CgroupReport>, String> {
    let id = job.spec.id;
    let here = &job.spec.allocation.node;
    if to.node != *here {
        return Err(format!("job {id}: resume on {} sent to the agent of {here}", to.node));
    }
    let dir = job.cgroup.cpuset_dir();
    let children = sub_cpusets(&dir);
    if !job.spec.allocation.ranks.is_empty() || !to.ranks.is_empty() || !children.is_empty() {
        let which = if children.is_empty() { "per-rank sub-cpusets".to_string() } else { children.join(", ") };
        return Err(format!(
            "job {id} has sub-cpusets on {here} ({which}); it can resume only on its own CPUs, not move to {}",
            to.cpus.to_list()
        ));
    }
    let limits = |a: &NodeAllocation| JobLimits {
        cpus: ctx.cpumap.cpus(&a.cpus).to_list(),
        mems: ctx.cpumap.mems(&a.mems).to_list(),
        memory_limit_bytes: Some(a.memory_bytes),
        // Kept as the launch set it, as are the denied devices (rules are only added).
        pids_max: None,
        deny_devices: vec![],
    };
    let new = limits(to);
    if new.cpus.is_empty() {
        return Err(format!("job {id}: CPUs {} map to no host CPU", to.cpus.to_list()));
    }
    let old = job.suspension.allocation().map(|a| limits(&a));
    let cg = job.cgroup.clone();
    let (wanted, mount) = (new.clone(), ctx.cgroups.cpuset_mount());
    let result = tokio::task::spawn_blocking(move || {
        if let Err(e) = cg.update(&wanted) {
            // Back to where it was, so that the cgroup matches what the controller keeps.
            if let Some(old) = old {
                if let Err(e2) = cg.update(&old) {
                    tracing::error!(job = %cg.name(), "cannot restore the cpuset after a failed move: {e2}");
                }
            }
            return Err(e.to_string());
        }
        let dir = cg.cpuset_dir();
        Ok(crate::cpusets::report(&*cg, &mount, &dir, None, &wanted.cpus, &wanted.mems))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match result {
        Ok(report) => {
            if let Ok(mut a) = job.suspension.allocation.lock() {
                *a = to.clone();
            }
            tracing::info!(job = %id, cpus = %new.cpus, mems = %new.mems, "moved to other CPUs");
            Ok(vec![report])
        }
        Err(e) => Err(format!("cannot move job {id} to CPUs {} (host {}): {e}", to.cpus.to_list(), new.cpus)),
    }
}

/// Names of the cgroups inside the job's cpuset directory.
fn sub_cpusets(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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
