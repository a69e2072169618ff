//! One scheduling round: `round(&RoundInput, now) -> RoundDecisions`, a function of state and
//! time (HyperQueue's `run_scheduling(core, comm, now)`), called by the controller's policy
//! pass and by the trace simulator alike. The callers keep only the effects: persisting,
//! telling agents, the simulator's event queue.
//!
//! In order, on a copy of the machine:
//! 1. **Resumes**: suspended jobs that can run now, in the order given (longest suspended
//!    first), on their own PUs or other free cores of their nodes ([`resume_candidates`](super::preempt::resume_candidates)).
//! 2. **Priority order** (when [`RoundInput::priority`] is given): multifactor priority, an
//!    admin's priority replacing the computed one; highest first, then earlier submission,
//!    then lower id. Otherwise the queue is taken in the order given.
//! 3. **Per-user limits** of queues: a job that would take its user over its queue's
//!    `max_cores_per_user` waits (`QueueLimit`), counting the jobs ahead of it as if they start.
//! 4. **The pass**: the configured backfill over what remains ([`backfill::plan`]): starts,
//!    reasons and expected starts. Skipped when it provably starts nothing (see
//!    [`RoundInput::idle_unless`]).
//! 5. **Preemption** (when [`RoundInput::preempt`] is given): up to [`PREEMPTORS_PER_PASS`](super::preempt::PREEMPTORS_PER_PASS)
//!    jobs left waiting for resources whose score is high enough each suspend the cheapest set
//!    of running jobs that makes room ([`plan_preemption`](super::preempt::plan_preemption)) and start, one after the
//!    other on the state the previous left.

mod order;
mod suspend;

use super::backfill::{self, Machine, PassInput, PassLimits, QueuedJob, RunningJob, Waiting};
use super::preempt::{PreemptConfig, Resume, SuspendedJob};
use super::priority::{Priority, PriorityInput, PriorityWeights};
use super::queue::QueueSpec;
use super::ClusterState;
use crate::job::Allocation;
use crate::JobId;
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
}

/// Preemption by suspension.
#[derive(Debug, Clone, Copy)]
pub struct PreemptRound<'a> {
    pub config: &'a PreemptConfig,
    /// Per queue entry, aligned with [`RoundInput::queue`].
    pub jobs: &'a [PreemptJob],
    /// The running jobs that may be suspended (their order breaks ties between equal costs).
    pub victims: &'a [super::preempt::Preemptible],
}

/// A suspended job that may resume in this round.
#[derive(Debug, Clone)]
pub struct SuspendedInput {
    pub job: SuspendedJob,
    /// Seconds of walltime it has left: it runs until `now` + this once resumed.
    pub walltime_left: f64,
    /// Its score, seconds suspended (counting this suspension up to `now`) and first start,
    /// when it may be suspended again by a preemptor of the same round.
    pub victim: Option<(f64, f64, f64)>,
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
    /// Suspended jobs that may resume, longest suspended first.
    pub suspended: &'a [SuspendedInput],
    /// Whether a suspended job whose PUs are taken may resume on others of its nodes.
    pub relocate: bool,
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
    /// Started out of priority order (a job before it, not held, still waits).
    pub backfilled: bool,
}

/// A job started by suspending others: suspend `victims` first, then start it on `alloc`.
#[derive(Debug, Clone, PartialEq)]
pub struct PreemptStart<A> {
    pub id: JobId,
    pub victims: Vec<JobId>,
    pub alloc: A,
}

/// What one round decided, in the order the effects are to be carried out: resumes, starts,
/// then preemptions (each: its suspensions, then its start).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundDecisions<A> {
    pub resumes: Vec<(JobId, Resume)>,
    pub starts: Vec<Start<A>>,
    pub preemptions: Vec<PreemptStart<A>>,
    /// Jobs that stay pending, with why and (when computed) their expected start: the pass's,
    /// then those held by per-user limits.
    pub waiting: Vec<Waiting>,
    /// Each queued job's priority, when the round ordered the queue.
    pub priorities: Vec<(JobId, Priority)>,
    /// Whether the pass ran (false: it provably started nothing).
    pub passed: bool,
    /// Starts of the pass out of priority order.
    pub backfilled: usize,
}

impl<A> Default for RoundDecisions<A> {
    fn default() -> Self {
        RoundDecisions {
            resumes: vec![],
            starts: vec![],
            preemptions: vec![],
            waiting: vec![],
            priorities: vec![],
            passed: false,
            backfilled: 0,
        }
    }
}

/// One round at `now` (see the module's documentation).
pub fn round<M: RoundMachine>(input: &RoundInput<M>, now: f64) -> RoundDecisions<M::Alloc> {
    let mut out = RoundDecisions::default();
    let resumed = suspend::resumes(input, now);
    let machine = resumed.machine.as_ref().unwrap_or(input.machine);
    let running = resumed.running.as_deref().unwrap_or(input.running);
    out.resumes = resumed.resumes;
    let free = machine.free_cpus();
    if input.idle_unless.is_some_and(|smallest| free < smallest) {
        return out;
    }
    let ordered = order::ordered(input, now);
    out.priorities = ordered.priorities;
    let (queue, held) = order::limited(input, &ordered.order);
    let fcfs_idle = input.limits.policy == backfill::BackfillPolicy::Fcfs
        && input.idle_unless.is_some()
        && queue.first().is_some_and(|q| free < q.request.total_cpus());
    if queue.is_empty() || fcfs_idle {
        out.waiting = held;
        return out;
    }
    let pass = PassInput { machine, running, queue: &queue, now };
    let plan = match input.reasons || input.preempt.is_some() {
        true => backfill::plan(&pass, &input.limits),
        false => backfill::plan_starts(&pass, &input.limits),
    };
    out.passed = true;
    out.backfilled = plan.backfilled;
    out.starts = backfilled(&queue, plan.starts);
    out.waiting = plan.waiting;
    suspend::preempt(input, &resumed.victims, &queue, machine, &mut out, now);
    out.waiting.extend(held);
    out
}

/// Mark the starts that overtook a job (not held) still waiting.
fn backfilled<A>(queue: &[QueuedJob], starts: Vec<(JobId, A)>) -> Vec<Start<A>> {
    if starts.is_empty() {
        return vec![];
    }
    let started: HashMap<JobId, usize> = starts.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let mut flags = vec![false; starts.len()];
    let (mut passed_over, mut seen) = (false, 0);
    for q in queue {
        match started.get(&q.id) {
            Some(&i) => {
                flags[i] = passed_over;
                seen += 1;
                if seen == starts.len() {
                    break;
                }
            }
            None if !q.held => passed_over = true,
            None => {}
        }
    }
    starts.into_iter().zip(flags).map(|((id, alloc), backfilled)| Start { id, alloc, backfilled }).collect()
}

#[cfg(test)]
mod tests;
