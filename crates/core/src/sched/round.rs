//! One scheduling round: `round(&RoundInput, now) -> RoundDecisions`, a function of state and
//! time (HyperQueue's `run_scheduling(core, comm, now)`), called by the controller's policy
//! pass ([`round_keeping`]: with advance reservations and the conservative plan kept between
//! rounds) and by the trace simulator ([`round`], and [`round_counted`] for conservative
//! backfill where processor counts decide) alike. The callers keep only the effects:
//! persisting, telling agents, the reasons shown to users, the simulator's event queue.
//!
//! In order, on a copy of the machine:
//! 1. **Resumes**: suspended jobs that can run now, in the order given (longest suspended
//!    first), by the [`ResumeRule`] given: whole jobs on their own PUs or other free cores of
//!    their nodes ([`resume_candidates`](super::preempt::resume_candidates), the simulator's),
//!    or part by part ([`resume_parts`](super::preempt::resume_parts), the controller's). Those
//!    that stay suspended may hold back the running jobs on their CPUs
//!    ([`SuspendedInput::holds_back`]).
//! 2. **Priority order** (when [`RoundInput::priority`] is given): multifactor priority, an
//!    admin's priority replacing the computed one; highest first, then earlier submission,
//!    then lower id. Otherwise the queue is taken in the order given. Jobs
//!    [`barred`](RoundInput::barred) are ordered but wait outside the pass.
//! 3. **Per-user limits** of queues: a job that would take its user over its queue's
//!    `max_cores_per_user` waits (`QueueLimit`), counting the jobs ahead of it as if they start.
//! 4. **The pass**: the configured backfill over what remains ([`backfill::plan`]; with
//!    [`round_keeping`], [`backfill::plan_with_advance_keeping`]; with [`round_counted`],
//!    conservative backfill by processor counts, [`counted`](super::counted)): starts, reasons
//!    and expected starts. Skipped when it provably starts nothing (see [`RoundInput::idle_unless`]).
//! 5. **Preemption** (when [`RoundInput::preempt`] is given): up to [`PREEMPTORS_PER_PASS`](super::preempt::PREEMPTORS_PER_PASS)
//!    jobs left waiting for resources, in the pass's order, whose score is high enough each
//!    suspend the cheapest set of running jobs that makes room ([`plan_preemption`](super::preempt::plan_preemption),
//!    beside the advance reservations they would run into) and start, one after the other on
//!    the state the previous left.
//!
//! 0. **Usage charges** (when [`RoundInput::usage`] is given, the controller's): each running
//!    job's billed CPU time since the last charge, to its account ([`charges`]), returned in
//!    [`RoundDecisions::charges`] for the caller to book and persist; the priority order sees
//!    the fair-share factors after them. The simulator charges the CPUs each account holds at
//!    every event of its clock, not only at rounds: it charges before the round, on its own
//!    books, and gives the factors in [`PriorityRound::jobs`].

mod order;
mod suspend;

use super::backfill::{
    self, AdvanceReservation, KeptPlan, Machine, PassInput, PassLimits, PassOutput, QueuedJob, RunningJob, Waiting,
};
use super::counted::{self, CountPlan, CountedMachine};
use super::fairshare::FairShare;
use super::preempt::{PartsJob, PreemptConfig, Resume, ResumeWait, SuspendedJob};
use super::priority::{Priority, PriorityInput, PriorityWeights};
use super::queue::QueueSpec;
use super::{ClusterState, PendingReason};
use crate::job::Allocation;
use crate::{JobId, NodeId};
use std::collections::HashMap;

/// A machine a round can run on. Preemption and resumes need berth's topology-aware state:
/// a machine without it (`cluster` None) has neither.
pub trait RoundMachine: Machine {
    fn cluster(&self) -> Option<&ClusterState> {
        None
    }
    fn as_allocation(_alloc: &Self::Alloc) -> Option<&Allocation> {
        None
    }
    fn from_allocation(_alloc: Allocation) -> Option<Self::Alloc> {
        None
    }
    /// The cluster itself, to change in place: only for a machine that is nothing more (no
    /// counts of its own to keep), which [`ResumeRule::Parts`] needs (a resume that moves a
    /// job's memory).
    fn cluster_mut(&mut self) -> Option<&mut ClusterState> {
        None
    }
}

impl RoundMachine for ClusterState {
    fn cluster(&self) -> Option<&ClusterState> {
        Some(self)
    }
    fn as_allocation(alloc: &Allocation) -> Option<&Allocation> {
        Some(alloc)
    }
    fn from_allocation(alloc: Allocation) -> Option<Allocation> {
        Some(alloc)
    }
    fn cluster_mut(&mut self) -> Option<&mut ClusterState> {
        Some(self)
    }
}

/// A queued job's priority inputs (aligned with [`RoundInput::queue`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobPriority {
    pub input: PriorityInput,
    /// An admin's priority (`berth update --priority`): replaces the computed total.
    pub admin: Option<f64>,
}

/// Priority ordering of the queue.
#[derive(Debug, Clone, Copy)]
pub struct PriorityRound<'a> {
    pub weights: &'a PriorityWeights,
    /// CPUs of the whole machine (the size factor's unit).
    pub machine_cpus: u64,
    /// Per queue entry, aligned with [`RoundInput::queue`].
    pub jobs: &'a [JobPriority],
}

/// Who runs how much in a queue with a per-user limit: (queue name, uid).
pub type UserKey = (String, u32);

/// Per-user limits of queues.
#[derive(Debug, Clone, Copy)]
pub struct UserLimits<'a> {
    /// Per queue entry (aligned with [`RoundInput::queue`]): its queue's spec, when that queue
    /// is known, and whose job it is.
    pub jobs: &'a [Option<(&'a QueueSpec, UserKey)>],
    /// Cores each (queue, user) runs now.
    pub running: &'a HashMap<UserKey, u64>,
}

/// A queued job as preemption sees it (aligned with [`RoundInput::queue`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreemptJob {
    /// Its queue's preemption class.
    pub class: u32,
    /// Whether it may suspend others (e.g. not a member of an advance reservation).
    pub may_preempt: bool,
    /// Whether, once started, it may be suspended by a later preemptor of the same round.
    pub suspendable: bool,
    /// Seconds it was suspended before (a job run again keeps its count), once started.
    pub suspended_secs: f64,
}

/// Preemption by suspension.
#[derive(Debug, Clone, Copy)]
pub struct PreemptRound<'a> {
    pub config: &'a PreemptConfig,
    /// Per queue entry, aligned with [`RoundInput::queue`].
    pub jobs: &'a [PreemptJob],
    /// The running jobs that may be suspended (their order breaks ties between equal costs).
    pub victims: &'a [super::preempt::Preemptible],
    /// Offer the victims to each preemptor in id order (the controller's), else in the order
    /// kept: those given, then those resumed, then those started, removed by swapping in the
    /// last (the simulator's).
    pub by_id: bool,
}

/// A running job as fair-share usage sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageJob {
    /// The account its usage is charged to.
    pub account: String,
    /// Billed CPUs (CPUs and GPUs by the fair-share weights): charged per second it runs.
    pub rate: f64,
    /// When it started: it is charged from the later of this and the last charge.
    pub start: f64,
}

/// Fair-share usage charged by the round (the controller's).
#[derive(Debug, Clone, Copy)]
pub struct UsageRound<'a> {
    /// Usage as charged so far, to `since`.
    pub share: &'a FairShare,
    /// Until when usage has been charged.
    pub since: f64,
    /// The running jobs, charged in this order.
    pub running: &'a [UsageJob],
    /// Per queue entry (aligned with [`RoundInput::queue`]): its account, whose fair-share
    /// factor after the charges replaces the one given in [`PriorityRound::jobs`].
    pub accounts: &'a [String],
}

/// The billed CPU-seconds each running job used from the last charge (`since`) to `now`, to
/// its account, in the order given (nothing when `now` is not later).
pub fn charges(running: &[UsageJob], since: f64, now: f64) -> Vec<(String, f64)> {
    if now <= since {
        return vec![];
    }
    let mut out = vec![];
    for job in running {
        let from = job.start.max(since);
        if now > from && job.rate > 0.0 {
            out.push((job.account.clone(), job.rate * (now - from)));
        }
    }
    out
}

/// Book `charges` (from [`charges`]) on `share` at `now`: usage decays to `now`, then each is
/// added. A caller that charged until before `now` books even no charges (the decay).
pub fn book_charges(share: &mut FairShare, charges: &[(String, f64)], now: f64) {
    share.decay_to(now);
    for (account, cpu_seconds) in charges {
        share.charge(account, *cpu_seconds, now);
    }
}

/// A suspended job that may resume in this round.
#[derive(Debug, Clone)]
pub struct SuspendedInput {
    pub job: SuspendedJob,
    /// When it is expected to end if it resumes now (`now` + the walltime it has left).
    pub resumed_end: f64,
    /// Its score, seconds suspended (counting this suspension up to `now`) and first start,
    /// when it may be suspended again by a preemptor of the same round.
    pub victim: Option<(f64, f64, f64)>,
    /// Under [`ResumeRule::Parts`]: how its parts may move.
    pub parts: PartsJob,
    /// Under [`ResumeRule::Parts`], for a job that is not a member of the advance reservations:
    /// seconds it has left to run, for which it keeps off the windows it would run into.
    pub keep_off: Option<f64>,
    /// Seconds it runs once resumed, when it resumes as soon as it can: while it stays
    /// suspended, the running jobs on its CPUs count as running that much longer (it resumes
    /// after them, then runs), for expected starts. None: not counted (the simulator's).
    pub holds_back: Option<f64>,
    /// Whose job it is and the cores it holds, for per-user limits once it resumes.
    pub user: Option<(UserKey, u64)>,
}

impl SuspendedInput {
    /// A suspended job that resumes whole, holds nothing back and counts for no limit.
    pub fn whole(job: SuspendedJob, resumed_end: f64, victim: Option<(f64, f64, f64)>) -> Self {
        SuspendedInput {
            job,
            resumed_end,
            victim,
            parts: PartsJob::default(),
            keep_off: None,
            holds_back: None,
            user: None,
        }
    }
}

/// How suspended jobs resume.
#[derive(Clone, Copy)]
pub enum ResumeRule<'a> {
    /// Whole jobs: on their own PUs when all are free, else (with `relocate`) on other whole
    /// free cores of the same nodes, on their memory's NUMA nodes
    /// ([`resume_candidates`](super::preempt::resume_candidates)). The simulator's.
    Whole { relocate: bool },
    /// Part by part, each on its own PUs where free, else moved within its node, its memory
    /// following ([`resume_parts`](super::preempt::resume_parts)); only on nodes `connected`
    /// says yes to. The controller's (a [`RoundMachine::cluster_mut`] machine).
    Parts { connected: &'a dyn Fn(NodeId) -> bool },
}

/// Everything a round decides from.
pub struct RoundInput<'a, M: RoundMachine> {
    /// With every running job's allocation claimed, and the memory of suspended jobs.
    pub machine: &'a M,
    pub running: &'a [RunningJob<M::Alloc>],
    /// Pending jobs: in priority order, or any order when `priority` is given.
    pub queue: &'a [QueuedJob],
    pub priority: Option<PriorityRound<'a>>,
    pub user_limits: Option<UserLimits<'a>>,
    /// Fair-share usage to charge first (None: charged by the caller, the factors given).
    pub usage: Option<UsageRound<'a>>,
    /// Queued jobs that wait outside the pass whatever it decides (e.g. asking for an advance
    /// reservation they cannot use), with why: ordered, not planned, not counted for limits.
    pub barred: Option<&'a HashMap<JobId, PendingReason>>,
    /// Suspended jobs that may resume, longest suspended first.
    pub suspended: &'a [SuspendedInput],
    pub resume: ResumeRule<'a>,
    pub preempt: Option<PreemptRound<'a>>,
    pub limits: PassLimits,
    /// Whether the pass must say why each job waits and when it is expected to start (else it
    /// only decides starts; preemption needs the reasons either way).
    pub reasons: bool,
    /// The fewest CPUs any queued job needs, to skip a pass that provably starts nothing
    /// (fewer CPUs free after the resumes; under FCFS, fewer than the first job needs). None:
    /// the pass always runs.
    pub idle_unless: Option<u64>,
}

/// A job started by the pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Start<A> {
    pub id: JobId,
    pub alloc: A,
    /// A backfill: it overtook a job waiting for resources or priority (held jobs and jobs that
    /// can never fit are not overtaken), as the pass counts it ([`PassOutput::backfilled`]).
    pub backfilled: bool,
}

/// A job started by suspending others: suspend `victims` first, then start it on `alloc`.
#[derive(Debug, Clone, PartialEq)]
pub struct PreemptStart<A> {
    pub id: JobId,
    pub victims: Vec<JobId>,
    pub alloc: A,
    /// How the pass left it waiting: its state again if the preemption cannot be carried out.
    pub waited: Waiting,
}

/// What one round decided, in the order the effects are to be carried out: resumes, starts,
/// then preemptions (each: its suspensions, then its start).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundDecisions<A> {
    /// Billed CPU-seconds to charge to accounts (with [`RoundInput::usage`]), in order: book
    /// them with [`book_charges`] at `now` when usage was charged until before `now`.
    pub charges: Vec<(String, f64)>,
    pub resumes: Vec<(JobId, Resume)>,
    /// Suspended jobs that stay so, with why (under [`ResumeRule::Parts`] only).
    pub still_suspended: Vec<(JobId, ResumeWait)>,
    pub starts: Vec<Start<A>>,
    pub preemptions: Vec<PreemptStart<A>>,
    /// Jobs that stay pending, with why and (when computed) their expected start: the pass's,
    /// then those held by per-user limits.
    pub waiting: Vec<Waiting>,
    /// Each queued job's priority, when the round ordered the queue.
    pub priorities: Vec<(JobId, Priority)>,
    /// Whether the pass ran (false: it provably started nothing).
    pub passed: bool,
    /// Jobs the pass planned (the queue less those barred or held by per-user limits).
    pub planned: usize,
    /// How many of `starts` are backfills (those flagged `backfilled`).
    pub backfilled: usize,
}

impl<A> Default for RoundDecisions<A> {
    fn default() -> Self {
        RoundDecisions {
            charges: vec![],
            resumes: vec![],
            still_suspended: vec![],
            starts: vec![],
            preemptions: vec![],
            waiting: vec![],
            priorities: vec![],
            passed: false,
            planned: 0,
            backfilled: 0,
        }
    }
}

/// One round at `now` (see the module's documentation), planning afresh.
pub fn round<M: RoundMachine>(input: &RoundInput<M>, now: f64) -> RoundDecisions<M::Alloc> {
    run(input, now, &[], |pass, full| match full {
        true => backfill::plan(pass, &input.limits),
        false => backfill::plan_starts(pass, &input.limits),
    })
}

/// One round at `now` on a machine where processor counts decide, its pass conservative
/// backfill by counts ([`counted`](super::counted)), planned from `plan` when it holds and
/// kept there for the next round: the trace simulator's conservative round on single-core
/// nodes (see [`counts_decide`](super::counted::counts_decide) for when it applies; the
/// caller owes the plan what that module says).
pub fn round_counted<M: RoundMachine + CountedMachine>(
    input: &RoundInput<M>,
    plan: &mut CountPlan,
    now: f64,
) -> RoundDecisions<M::Alloc> {
    run(input, now, &[], |pass, full| counted::pass(pass, plan, full))
}

/// One round at `now` as the controller runs it: beside the advance reservations `advance`
/// (their members run only inside them, every other job keeps off them, for its start, its
/// resume and its preemption alike), and keeping the conservative plan in `kept` for the next
/// round ([`backfill::plan_with_advance_keeping`]). The pass always says why each job waits.
pub fn round_keeping(
    input: &RoundInput<ClusterState>,
    advance: &[AdvanceReservation<Allocation>],
    kept: &mut Option<KeptPlan<ClusterState>>,
    now: f64,
) -> RoundDecisions<Allocation> {
    run(input, now, advance, |pass, _| backfill::plan_with_advance_keeping(pass, advance, &input.limits, kept).0)
}

/// The round, with `pass` as its backfill pass (told whether to say why jobs wait).
fn run<M: RoundMachine>(
    input: &RoundInput<M>,
    now: f64,
    windows: &[AdvanceReservation<Allocation>],
    pass: impl FnOnce(&PassInput<M>, bool) -> PassOutput<M::Alloc>,
) -> RoundDecisions<M::Alloc> {
    let mut out = RoundDecisions::default();
    let charged = input.usage.map(|u| {
        out.charges = charges(u.running, u.since, now);
        let mut share = u.share.clone();
        if now > u.since {
            book_charges(&mut share, &out.charges, now);
        }
        share
    });
    let resumed = suspend::resumes(input, windows, now);
    let machine = resumed.machine.as_ref().unwrap_or(input.machine);
    let running = resumed.running.as_deref().unwrap_or(input.running);
    out.resumes = resumed.resumes;
    out.still_suspended = resumed.still;
    let free = machine.free_cpus();
    if input.idle_unless.is_some_and(|smallest| free < smallest) {
        return out;
    }
    let ordered = order::ordered(input, charged.as_ref(), now);
    out.priorities = ordered.priorities;
    let (queue, held) = order::limited(input, &ordered.order, &resumed.users);
    let fcfs_idle = input.limits.policy == backfill::BackfillPolicy::Fcfs
        && input.idle_unless.is_some()
        && queue.first().is_some_and(|q| free < q.request.total_cpus());
    // Jobs held by per-user limits still make a pass (with nothing to plan); barred ones not.
    let barred = |id: &JobId| input.barred.is_some_and(|b| b.contains_key(id));
    if input.queue.iter().all(|q| barred(&q.id)) || fcfs_idle {
        out.waiting = held;
        return out;
    }
    let plan = pass(&PassInput { machine, running, queue: &queue, now }, input.reasons || input.preempt.is_some());
    out.passed = true;
    out.planned = queue.len();
    out.backfilled = plan.backfilled.len();
    out.starts = flagged(plan.starts, &plan.backfilled);
    out.waiting = plan.waiting;
    suspend::preempt(input, windows, &resumed.victims, &queue, machine, &mut out, now);
    out.waiting.extend(held);
    out
}

/// The pass's starts, each flagged when the pass counted it a backfill (`overtook`: a
/// subsequence of `starts`, in their order), so the flags and the count are one definition.
fn flagged<A>(starts: Vec<(JobId, A)>, overtook: &[JobId]) -> Vec<Start<A>> {
    let mut rest = overtook.iter().peekable();
    let flagged: Vec<Start<A>> = starts
        .into_iter()
        .map(|(id, alloc)| {
            let backfilled = rest.next_if(|o| **o == id).is_some();
            Start { id, alloc, backfilled }
        })
        .collect();
    debug_assert!(rest.next().is_none(), "a backfill that is not a start, or out of the starts' order");
    flagged
}

#[cfg(test)]
mod tests;
