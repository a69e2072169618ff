//! One scheduling pass with backfill: who starts now, and when every other job is expected to.
//!
//! Queue policy (who, when) only: "where" is the [`Machine`]'s. The same code drives the
//! controller (a topology-aware [`ClusterState`](super::ClusterState)) and the trace simulator
//! (which may use a plain core pool for traces of single-core nodes), as Slurm's sched/backfill
//! drives whatever select plugin is loaded.
//!
//! The pass walks the whole queue once, in priority order. Placements that cannot succeed are
//! not tried: a request needing more CPUs than are free is rejected from a cached count, and a
//! "busy" answer is remembered for identical requests for the rest of the pass (a pass only
//! ever takes resources from the states it places on, so busy stays busy). The policies are
//! described at [`plan`].
//!
//! Advance reservations (resources set aside for a time window for some jobs) go through
//! [`plan_with_advance`]: members run only inside theirs, every other job keeps off the
//! windows it would run into (see the `advance` module). [`place_for_window`] places a new one.

mod advance;
mod conservative;
mod easy;
mod kept;
mod pass;
mod prefer;
mod profile;
mod timeline;

pub use advance::{
    licenses_only, machine_at, on_nodes, place_for_window, plan_with_advance, plan_with_advance_keeping,
    AdvanceReservation, Confine, NO_NODE,
};
pub use kept::KeptPlan;
pub use prefer::place_preferring_on_cluster;

use super::reason::{PendingReason, Unsuitable};
use crate::placement::JobRequest;
use crate::JobId;
use serde::{Deserialize, Serialize};

/// Which jobs may start out of priority order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillPolicy {
    /// Strict priority order: the first job that cannot start stops the pass.
    Fcfs,
    /// EASY: the highest-priority waiting job gets a reservation that nothing delays; any later
    /// job may start now if it does not touch that reservation.
    #[default]
    Easy,
    /// Conservative: every waiting job gets a reservation; a job may start now only if it
    /// delays none of the reservations of the jobs before it.
    Conservative,
}

/// Where jobs go: the placement side of a pass ("now", "test only", "will run at" are built
/// from `place` on a clone with some allocations claimed or released).
pub trait Machine: Clone {
    type Alloc: Clone + std::fmt::Debug + PartialEq;
    /// Place on what is free now: `Now`, `Busy` (fits the machine, not what is free) or `Never`.
    fn place(&self, req: &JobRequest) -> Fit<Self::Alloc>;
    fn claim(&mut self, alloc: &Self::Alloc);
    fn release(&mut self, alloc: &Self::Alloc);
    /// CPUs free now, for rejecting a job without trying a placement.
    fn free_cpus(&self) -> u64;
    /// Why `req` does not fit what is free now, when the count alone shows it: it takes `need`
    /// CPUs, `free` are free. The words should be those `place` would give, so that a job
    /// rejected by the count reads as one placed; the default has only the count to say.
    fn busy_by_count(&self, req: &JobRequest, need: u64, free: u64) -> crate::placement::reason::Busy {
        let _ = req;
        crate::placement::reason::Busy::Counted { need, free }
    }
    /// `claim`, returning what `free_cpus` is afterwards, given `free_before` (its value
    /// before). The default counts again; a machine that can count only what changed should.
    fn claim_counting(&mut self, alloc: &Self::Alloc, free_before: u64) -> u64 {
        let _ = free_before;
        self.claim(alloc);
        self.free_cpus()
    }
    /// `release`, returning what `free_cpus` is afterwards (see [`Machine::claim_counting`]).
    fn release_counting(&mut self, alloc: &Self::Alloc, free_before: u64) -> u64 {
        let _ = free_before;
        self.release(alloc);
        self.free_cpus()
    }
    /// `place` as if `extra` were claimed too, leaving the machine as it was ("test only" beside
    /// other reservations). The default places on a copy; a machine that can set a few parts
    /// aside and put them back should do that instead.
    fn place_with_claimed(&mut self, extra: &[&Self::Alloc], req: &JobRequest) -> Fit<Self::Alloc> {
        let mut copy = self.clone();
        for alloc in extra {
            copy.claim(alloc);
        }
        copy.place(req)
    }
    /// `place`, taking what `prefer` holds (where free here) before anything else, with the
    /// same answer whenever `place` does not fit. EASY places its head's reservation so,
    /// preferring what running jobs free by its start: what is free now stays for backfill
    /// (textbook EASY's "extra" processors). The default has no preference.
    fn place_preferring(&self, prefer: &[&Self::Alloc], req: &JobRequest) -> Fit<Self::Alloc> {
        let _ = prefer;
        self.place(req)
    }
    /// Whether `self` and `other` are alike for placement: the same resources, free alike. A
    /// conservative pass reuses its last plan only on a machine found so ([`plan_keeping`]);
    /// the default says no, so nothing is ever reused.
    fn same_state(&self, other: &Self) -> bool {
        let _ = other;
        false
    }
    /// Whether two allocations hold the same resources (the default: equal as values).
    fn same_holding(a: &Self::Alloc, b: &Self::Alloc) -> bool {
        a == b
    }
    /// Whether two allocations may hold a resource in common (the default: they may). A kept
    /// reservation stays only where no job started since may share anything with it.
    fn may_share(a: &Self::Alloc, b: &Self::Alloc) -> bool {
        let _ = (a, b);
        true
    }
}

/// The answer of [`Machine::place`]: the placement's own answer, for any machine.
pub use crate::placement::cluster::Fit;

/// A pending job as a pass sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    pub id: JobId,
    pub request: JobRequest,
    /// Seconds: the estimate reservations are made with (the requested walltime).
    pub walltime: f64,
    pub held: bool,
}

/// A job holding resources, and when it is expected to release them.
#[derive(Debug, Clone)]
pub struct RunningJob<A> {
    pub id: JobId,
    pub alloc: A,
    /// Expected end (start + walltime); values in the past mean "any moment now".
    pub end: f64,
}

/// Everything one pass decides from. `machine` has every running job's allocation claimed.
pub struct PassInput<'a, M: Machine> {
    pub machine: &'a M,
    pub running: &'a [RunningJob<M::Alloc>],
    /// In priority order, highest first.
    pub queue: &'a [QueuedJob],
    pub now: f64,
}

/// Bounds on one pass, so a huge queue never stalls decisions.
#[derive(Debug, Clone)]
pub struct PassLimits {
    pub policy: BackfillPolicy,
    /// Most "will run at" computations (reservations) in one pass; jobs beyond it are still
    /// considered for starting now, and get no expected start.
    pub max_reservations: usize,
    /// A time budget for the reservations of a conservative pass: once it has passed, the
    /// pass goes on as past `max_reservations`.
    pub deadline: Option<Deadline>,
}

/// A monotonic clock in microseconds, the caller's: the controller's injected clock (a fake
/// one in its unit tests), the bench's system clock, a counter in tests. Any
/// `Fn() -> u64 + Send + Sync` is one.
pub trait MonotonicClock: Send + Sync {
    fn micros(&self) -> u64;
}

impl<F: Fn() -> u64 + Send + Sync> MonotonicClock for F {
    fn micros(&self) -> u64 {
        self()
    }
}

/// A point on the caller's clock. The core crate reads no clock of its own: the caller passes
/// one, so a pass stays a function of its inputs.
#[derive(Clone)]
pub struct Deadline {
    pub at: u64,
    pub clock: std::sync::Arc<dyn MonotonicClock>,
}

impl Deadline {
    /// `budget_us` microseconds from now on `clock`.
    pub fn after(clock: std::sync::Arc<dyn MonotonicClock>, budget_us: u64) -> Deadline {
        Deadline { at: clock.micros().saturating_add(budget_us), clock }
    }

    pub fn passed(&self) -> bool {
        self.clock.micros() >= self.at
    }
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline").field("at", &self.at).finish_non_exhaustive()
    }
}

/// A job that does not start in this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub id: JobId,
    pub reason: PendingReason,
    /// When the pass expects it to start, if it computed a reservation for it.
    pub expected_start: Option<f64>,
}

/// What a pass decided.
#[derive(Debug, Clone)]
pub struct PassOutput<A> {
    /// Jobs to start now, in the order they were chosen.
    pub starts: Vec<(JobId, A)>,
    pub waiting: Vec<Waiting>,
    /// The starts that overtook a job waiting for resources or priority (held jobs and jobs
    /// that can never fit are not overtaken), in the order of `starts` (of which they are a
    /// subsequence): the one definition of a backfill, counted by the round and flagged on
    /// each of its starts alike.
    pub backfilled: Vec<JobId>,
}

/// One pass over the whole queue.
///
/// - Held jobs wait (`Held`); jobs that can never fit wait (`NoSuitableNodes`).
/// - `Fcfs`: jobs start in order until the first that is busy (`Resources`); every later job
///   waits (`Priority`) without being tried.
/// - `Easy`: jobs start in order until the first busy one, the head. It gets a reservation (its
///   `expected_start`): the first time, as running jobs end (overdue ones "now"), at which it
///   fits, and the resources it would get then, those freed by then before those free now. A later job starts now if it fits now and
///   either ends by then or fits beside the head's resources. Later jobs that do not start wait
///   with `Resources` if they do not fit what is free now, else `Priority` (they would need the
///   head's resources).
/// - `Conservative`: every job, in order, gets a reservation at the earliest time it fits
///   beside the running jobs and all earlier reservations, for its whole walltime, and starts
///   now when that time is now (`Resources`: does not fit what is free now; `Priority`: fits,
///   but would delay an earlier reservation). Past `max_reservations` reservations, jobs only
///   start now if they fit beside every reservation, and get no expected start.
/// - `max_reservations == 0` makes both FCFS: nothing may overtake a waiting job.
///
/// `backfilled` counts the starts that overtook a job waiting for resources or priority (held
/// jobs and jobs that can never fit are not overtaken).
pub fn plan<M: Machine>(input: &PassInput<M>, limits: &PassLimits) -> PassOutput<M::Alloc> {
    plan_with_reservations(input, limits).0
}

/// A reservation a pass computed: where and when a waiting job is expected to run.
#[derive(Debug, Clone)]
pub struct Reservation<A> {
    pub id: JobId,
    pub start: f64,
    /// `start` + walltime.
    pub end: f64,
    pub alloc: A,
}

/// [`plan`], also returning the reservations behind the expected starts (the EASY head's, or
/// every conservative one, in queue order): e.g. to show which nodes a job is expected on.
pub fn plan_with_reservations<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    plan_beside(input, limits, &advance::Windows::none(), pass::Detail::Full)
}

/// [`plan_with_reservations`] that keeps what a conservative pass planned in `kept` and
/// reuses it in the next pass, planning again only what changed (see the `kept` module):
/// the pass a controller runs every few seconds over a long queue. Other policies plan from
/// scratch (and leave `kept` empty).
pub fn plan_keeping<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    kept: &mut Option<KeptPlan<M>>,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    if limits.policy != BackfillPolicy::Conservative {
        *kept = None;
        return plan_with_reservations(input, limits);
    }
    conservative::plan_keeping(input, limits, &advance::Windows::none(), pass::Detail::Full, kept)
}

/// [`plan`] when only the starts matter (the trace simulator): the same starts and
/// `backfilled`, but `waiting` is left empty and the pass stops as soon as every later job
/// needs more CPUs than are free, so a long queue behind a full machine costs little.
pub fn plan_starts<M: Machine>(input: &PassInput<M>, limits: &PassLimits) -> PassOutput<M::Alloc> {
    plan_beside(input, limits, &advance::Windows::none(), pass::Detail::StartsOnly).0
}

/// The pass of `limits.policy`, every job keeping off `windows` while it would run.
fn plan_beside<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    windows: &advance::Windows<M::Alloc>,
    detail: pass::Detail,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    match limits.policy {
        BackfillPolicy::Fcfs => (fcfs(input, windows, detail), vec![]),
        BackfillPolicy::Easy => easy::plan(input, limits, windows, detail),
        BackfillPolicy::Conservative => conservative::plan(input, limits, windows, detail),
    }
}

/// Strict priority order (beside `windows`): the first job that is busy stops every later one.
fn fcfs<M: Machine>(
    input: &PassInput<M>,
    windows: &advance::Windows<M::Alloc>,
    detail: pass::Detail,
) -> PassOutput<M::Alloc> {
    let mut machine = pass::Tracked::new(input.machine.clone());
    let mut memos = advance::Layers::new(windows);
    let mut out = pass::Outcome::new(input.queue, detail);
    for job in input.queue {
        if !out.reports_waiting() && out.blocked() {
            break;
        }
        if job.held {
            out.wait(job.id, PendingReason::Held, None);
        } else if out.blocked() {
            out.wait(job.id, PendingReason::Priority, None);
        } else {
            let k = windows.layer(input.now, easy::walltime(job));
            match memos.place(windows, &mut machine, pass::NOW, k, &job.request) {
                Fit::Now(alloc) => {
                    machine.claim(&alloc);
                    out.start(job.id, alloc);
                }
                Fit::Busy(what) => {
                    let reason = memos.busy_reason(windows, &mut machine, pass::NOW, k, &job.request, what);
                    out.wait(job.id, reason, None)
                }
                Fit::Never(why) => out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why)), None),
            }
        }
    }
    out.finish()
}

#[cfg(test)]
mod kept_props;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
