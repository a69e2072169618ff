//! Conservative backfill by processor counts: on a machine where any free CPUs do for any job
//! (Mu'alem and Feitelson's processor model; a pool of single-core nodes whose jobs ask for "N
//! cores anywhere", the trace simulator's default machine), kept from round to round.
//! `sched::round::round_counted` runs it as a round's pass (this module uses nothing of the
//! round's: the round calls its `pass`).
//!
//! Every queued job, in priority order, holds a reservation at the earliest time at which its
//! processors stay free, beside the running jobs and every earlier reservation, for its whole
//! estimate; it starts when that time is now. Which CPUs a job gets is decided only when it
//! starts (first fit, by the round): where counts decide, counts suffice.
//!
//! Kept between passes (the plan, and the profile of committed processors, [`Steps`]):
//! - While jobs end when expected, the kept plan *is* a fresh plan: nothing before a kept
//!   reservation got freer (jobs ended as assumed, started ones hold what their reservation
//!   held) and nothing in it got fuller (a job that started out of order kept off it), so it
//!   is still the earliest; new jobs come last in priority and are planned after it. So a
//!   pass starts the reservations due now and plans the new jobs only (the property test
//!   `kept_plans_are_fresh_plans` compares both on random workloads).
//! - A job ending before its estimate frees the rest of its time: the reservations are
//!   compressed (Mu'alem and Feitelson): in priority order, each moves to the earliest time
//!   it now fits, beside all the others. Its old time still fits, so none moves later.
//! - Otherwise (a job running past its estimate, whose processors a reservation counted on;
//!   a queue reordered by priority; a queue that is not the planned jobs followed by new ones)
//!   the pass plans afresh, as the definition says.
//!
//! What the caller owes a kept plan: jobs numbered in submission order (a new job's id is above
//! every planned one's) and the queue in id order (the plan is kept only when
//! [`CountPlan::new`] is told so); the starts and ends of jobs ([`CountPlan::started`],
//! [`CountPlan::ended`]); a round at every submission and early end (so that new jobs and
//! compression happen when a round at every event would do them: skipping idle rounds then
//! changes nothing; [`CountPlan::must_pass`], [`CountPlan::next_new`]) and at every
//! reservation's start ([`CountPlan::wake`]: a compressed reservation may start when nothing
//! ends).

mod steps;
#[cfg(test)]
mod tests;

use super::backfill::{Fit, Machine, PassInput, PassOutput, QueuedJob, Waiting};
use super::reason::{Unsuitable, Wanting};
use super::PendingReason;
use crate::JobId;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound::{Excluded, Unbounded};
use steps::Steps;

/// Most rounds of compression after an early end (see [`CountPlan::compress_at`]).
const COMPRESS_ROUNDS: usize = 4;

/// A time ordered by `total_cmp`, for map keys.
#[derive(Debug, Clone, Copy)]
struct Time(f64);

impl PartialEq for Time {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A machine on which processor counts decide where jobs fit: any free CPUs do for any job.
pub trait CountedMachine: Machine {
    /// Whether counts decide on this machine (e.g. single-core nodes, whose every request is
    /// "N cores anywhere"). The default: no.
    fn counts_suffice(&self) -> bool {
        false
    }
    /// The CPUs `alloc` holds.
    fn cpus_held(alloc: &Self::Alloc) -> u64;
}

/// Whether conservative backfill by counts is the pass of `policy` on `machine`: conservative
/// backfill with unlimited reservations, where counts decide, without preemption.
pub fn counts_decide<M: CountedMachine>(machine: &M, limits: &super::backfill::PassLimits, preempt: bool) -> bool {
    limits.policy == super::backfill::BackfillPolicy::Conservative
        && limits.max_reservations == usize::MAX
        && machine.counts_suffice()
        && !preempt
}

/// A queued job as the plan sees it.
#[derive(Debug, Clone, Copy)]
pub struct CountedJob {
    pub id: JobId,
    pub cpus: u64,
    pub walltime: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Reserved {
    start: f64,
    cpus: u64,
    walltime: f64,
}

/// The plan of a conservative pass by counts, kept for the next one.
#[derive(Debug)]
pub struct CountPlan {
    total: u64,
    /// Committed processors: running jobs until their expected ends, reservations.
    steps: Steps,
    /// Reservations by job id: priority order while plans are kept (id order).
    by_job: BTreeMap<JobId, Reserved>,
    /// The same by start time: which are due.
    by_start: BTreeSet<(Time, JobId)>,
    /// Queued jobs from this id on are new to the plan; those below have a decision in it.
    next_new: JobId,
    /// Plans are kept at all (not when the queue is reordered between passes).
    keep: bool,
    /// The plan holds for the next pass (else it plans afresh).
    valid: bool,
    /// A job ended early since the last pass: compress before anything else.
    compress: bool,
    /// Running jobs that outlast their estimate, by expected end: once one is overdue the
    /// plan counted on processors it still holds.
    late: BTreeSet<(Time, JobId)>,
    /// When the last pass ran.
    last_pass: f64,
}

impl CountPlan {
    /// A plan for `total` processors; `keep`: whether the queue keeps its order between passes
    /// (id order: see the module's documentation).
    pub fn new(total: u64, keep: bool) -> Self {
        CountPlan {
            total,
            steps: Steps::default(),
            by_job: BTreeMap::new(),
            by_start: BTreeSet::new(),
            next_new: JobId(0),
            keep,
            valid: false,
            compress: false,
            late: BTreeSet::new(),
            last_pass: f64::NEG_INFINITY,
        }
    }

    /// Queued jobs from this id on are new to the plan (submitted since its last pass): the
    /// caller runs a round when there are any, see the module's documentation.
    pub fn next_new(&self) -> JobId {
        self.next_new
    }

    /// Job `id` started (or resumed), expected to end at `expected`, ending at `actual`.
    pub fn started(&mut self, id: JobId, expected: f64, actual: f64) {
        if actual > expected {
            self.late.insert((Time(expected), id));
        }
    }

    /// Job `id` of `cpus` processors, expected to end at `expected` (as told at its start),
    /// ended at `now`.
    pub fn ended(&mut self, id: JobId, now: f64, expected: f64, cpus: u64) {
        self.late.remove(&(Time(expected), id));
        if now < expected && self.valid {
            self.steps.remove(now, expected, cpus);
            self.compress = true;
        } else if now > expected {
            self.valid = false;
        }
    }

    /// Whether the next round must pass even if nothing can start now: a job ended early, and
    /// the reservations are compressed at this time, not at a later one (compressed later,
    /// some could start later than with a pass at every event). New jobs too must be planned
    /// when they come (the caller sees to that, see [`Self::next_new`]).
    pub fn must_pass(&self) -> bool {
        self.compress
    }

    /// Whether the kept plan may be used at `now`: it is valid and no running job is past its
    /// estimate.
    pub fn can_keep(&self, now: f64) -> bool {
        self.valid && !self.late.first().is_some_and(|&(Time(end), _)| end <= now)
    }

    /// A pass from the kept plan: compress if a job ended early, start the reservations due
    /// now, plan the `new` jobs (submitted since, in priority order, after every planned one).
    /// `free`: processors free now. Returns the jobs to start, in priority order, or `None`
    /// if the plan does not hold (a due reservation cannot start): then plan afresh.
    pub fn pass_kept(&mut self, now: f64, mut free: u64, new: &[CountedJob]) -> Option<Vec<JobId>> {
        if self.by_start.first().is_some_and(|&(Time(t), _)| t < now) {
            // A reservation was due at a pass that did not run: not a plan of this pass.
            self.valid = false;
            return None;
        }
        self.last_pass = now;
        self.steps.forget_before(now);
        if std::mem::take(&mut self.compress) {
            self.compress_at(now);
        }
        let mut starts: Vec<JobId> = self.by_start.range(..=(Time(now), JobId(u64::MAX))).map(|&(_, id)| id).collect();
        if starts.iter().map(|id| self.by_job[id].cpus).sum::<u64>() > free {
            self.valid = false;
            return None;
        }
        starts.sort_unstable();
        for id in &starts {
            if let Some(r) = self.by_job.remove(id) {
                self.by_start.remove(&(Time(r.start), *id));
                free -= r.cpus;
            }
        }
        for &job in new {
            self.place(now, &mut free, job, &mut starts);
        }
        Some(starts)
    }

    /// A pass from scratch: `running` as (processors, expected end), `queue` in priority
    /// order, `free` processors free now. Returns the jobs to start, in priority order.
    pub fn pass_afresh(
        &mut self,
        now: f64,
        free: u64,
        running: impl Iterator<Item = (u64, f64)>,
        queue: &[CountedJob],
    ) -> Vec<JobId> {
        self.afresh(now, free, running, queue, self.keep)
    }

    /// [`Self::pass_afresh`]; `reserve_all`: every job gets its reservation (else, unless the
    /// plan is kept, the pass stops once no later job fits what is free: no start follows).
    fn afresh(
        &mut self,
        now: f64,
        mut free: u64,
        running: impl Iterator<Item = (u64, f64)>,
        queue: &[CountedJob],
        reserve_all: bool,
    ) -> Vec<JobId> {
        self.last_pass = now;
        self.steps = Steps::default();
        self.by_job.clear();
        self.by_start.clear();
        self.compress = false;
        for (cpus, end) in running {
            // A job past its estimate is expected to end any moment: now.
            self.steps.add(now, end.max(now), cpus);
        }
        // Not kept: the plan may stop once no later job fits what is free (no start follows).
        let smallest_after = |k: usize| queue[k..].iter().map(|j| j.cpus).min().unwrap_or(u64::MAX);
        let mut starts = vec![];
        for (k, &job) in queue.iter().enumerate() {
            if !reserve_all && job.cpus > free && smallest_after(k) > free {
                break;
            }
            self.place(now, &mut free, job, &mut starts);
        }
        if let Some(last) = queue.iter().map(|j| j.id).max() {
            self.next_new = self.next_new.max(JobId(last.0.saturating_add(1)));
        }
        self.valid = self.keep;
        starts
    }

    /// Plan `job` at the earliest time it fits; it starts if that is now and its processors
    /// are free (not so only while a job overruns its estimate: then it stays reserved now).
    fn place(&mut self, now: f64, free: &mut u64, job: CountedJob, starts: &mut Vec<JobId>) {
        if job.id >= self.next_new {
            self.next_new = JobId(job.id.0.saturating_add(1));
        }
        let Some(at) = self.steps.earliest(now, job.cpus, job.walltime, self.total) else {
            // Larger than the machine: [`pass`] plans no such job.
            debug_assert!(false, "job {} of {} processors never fits", job.id.0, job.cpus);
            return;
        };
        self.steps.add(at, at + job.walltime, job.cpus);
        if at <= now && job.cpus <= *free {
            *free -= job.cpus;
            starts.push(job.id);
        } else {
            self.by_job.insert(job.id, Reserved { start: at, cpus: job.cpus, walltime: job.walltime });
            self.by_start.insert((Time(at), job.id));
        }
    }

    /// Each reservation, in priority order, to the earliest time it fits beside all others;
    /// again while any moved (a job that moved may have waited for the end of a later one,
    /// which then moved too), a few rounds at most: a reservation may then be at a time at
    /// which nothing ends, so the caller also passes at reservation times ([`Self::wake`]).
    fn compress_at(&mut self, now: f64) {
        let order: Vec<JobId> = self.by_job.keys().copied().collect();
        for _ in 0..COMPRESS_ROUNDS {
            let mut moved = false;
            for &id in &order {
                let r = self.by_job[&id];
                self.steps.remove(r.start, r.start + r.walltime, r.cpus);
                let at = self.steps.earliest(now, r.cpus, r.walltime, self.total).unwrap_or(r.start);
                debug_assert!(at <= r.start, "compression moved job {} from {} to {at}", id.0, r.start);
                self.steps.add(at, at + r.walltime, r.cpus);
                if at != r.start {
                    moved = true;
                    self.by_start.remove(&(Time(r.start), id));
                    self.by_start.insert((Time(at), id));
                    self.by_job.insert(id, Reserved { start: at, ..r });
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// The next reservation's start after the last pass: the caller runs a round then too (a
    /// compressed reservation may start when nothing ends).
    pub fn wake(&self) -> Option<f64> {
        let after = (Time(self.last_pass), JobId(u64::MAX));
        self.by_start.range((Excluded(after), Unbounded)).next().map(|&(Time(t), _)| t)
    }

    /// Where the plan expects job `id` to start, if it holds a reservation.
    pub fn reserved_start(&self, id: JobId) -> Option<f64> {
        self.by_job.get(&id).map(|r| r.start)
    }

    /// The reservations: (job, start), in job order.
    pub fn reservations(&self) -> Vec<(JobId, f64)> {
        self.by_job.iter().map(|(&id, r)| (id, r.start)).collect()
    }

    /// The plan no longer holds (e.g. a start could not be placed): plan afresh next time.
    fn invalidate(&mut self) {
        self.valid = false;
    }
}

/// The pass of a round by counts (see the module's documentation): from `plan` when it holds,
/// else afresh; the jobs starting get their CPUs first fit, in priority order. Held jobs and
/// jobs larger than the machine are not planned (they wait; a queue holding one is planned
/// afresh). With `full`, every job that does not start waits with its expected start (its
/// reservation's) and why: `Resources` when it needs more CPUs than the pass leaves free, else
/// `Priority` (it would delay an earlier reservation).
pub(super) fn pass<M: CountedMachine>(input: &PassInput<M>, plan: &mut CountPlan, full: bool) -> PassOutput<M::Alloc> {
    let (now, queue) = (input.now, input.queue);
    let free = input.machine.free_cpus();
    let total = plan.total;
    let job = |q: &QueuedJob| CountedJob { id: q.id, cpus: q.request.total_cpus(), walltime: q.walltime.max(0.0) };
    let plannable = |q: &QueuedJob| !q.held && q.request.total_cpus() <= total;
    // Kept: the queue is the reserved jobs, then the new ones (ids from `next_new` on).
    let new_from = queue.len() - queue.iter().rev().take_while(|q| q.id >= plan.next_new).count();
    let new = &queue[new_from..];
    let kept = plan.keep && new_from == plan.by_job.len() && new.iter().all(plannable) && plan.can_keep(now);
    let kept = match kept {
        true => plan.pass_kept(now, free, &new.iter().map(job).collect::<Vec<_>>()),
        false => None,
    };
    let starts = kept.unwrap_or_else(|| {
        let running = input.running.iter().map(|r| (M::cpus_held(&r.alloc), r.end));
        let planned: Vec<CountedJob> = queue.iter().filter(|q| plannable(q)).map(job).collect();
        plan.afresh(now, free, running, &planned, plan.keep || full)
    });
    let picked = picked(queue, &starts, plannable);
    if picked.len() < starts.len() {
        // A queue not in the order the plan was kept for (see the module's documentation):
        // the starts not found wait, and the next pass plans afresh.
        plan.invalidate();
    }
    let mut out = PassOutput { starts: Vec::with_capacity(starts.len()), waiting: vec![], backfilled: vec![] };
    // The machine with the starts claimed, copied only once a second start needs it.
    let mut machine = None::<M>;
    let mut unclaimed = false;
    for (k, (q, overtook)) in picked.into_iter().enumerate() {
        if k > 0 {
            claim_last(&mut machine, input.machine, &out.starts, &mut unclaimed);
        }
        match machine.as_ref().unwrap_or(input.machine).place(&q.request) {
            Fit::Now(alloc) => {
                if overtook {
                    out.backfilled.push(q.id);
                }
                out.starts.push((q.id, alloc));
                unclaimed = true;
            }
            // The plan starts a job only on processors free now. Were it wrong, the job waits
            // and the next pass plans afresh; the later starts keep the flags `picked` gave them
            // (as if it had started: an overtaking of it is not counted this once).
            _ => {
                debug_assert!(false, "job {} planned to start at {now} does not fit the free CPUs", q.id.0);
                plan.invalidate();
            }
        }
    }
    if full {
        claim_last(&mut machine, input.machine, &out.starts, &mut unclaimed);
        let after = machine.as_ref().unwrap_or(input.machine);
        let started: HashSet<JobId> = out.starts.iter().map(|s| s.0).collect();
        for q in queue.iter().filter(|q| !started.contains(&q.id)) {
            let reason = match after.place(&q.request) {
                _ if q.held => PendingReason::Held,
                Fit::Never(why) => PendingReason::NoSuitableNodes(Unsuitable::Never(why)),
                Fit::Busy(what) => PendingReason::Resources(Wanting::Busy(what)),
                Fit::Now(_) => PendingReason::Priority,
            };
            out.waiting.push(Waiting { id: q.id, reason, expected_start: plan.reserved_start(q.id) });
        }
    }
    out
}

/// The last start's allocation claimed on `machine` (a copy of `base` made when first needed),
/// if not yet.
fn claim_last<M: Machine>(machine: &mut Option<M>, base: &M, starts: &[(JobId, M::Alloc)], unclaimed: &mut bool) {
    if let (true, Some((_, alloc))) = (std::mem::take(unclaimed), starts.last()) {
        machine.get_or_insert_with(|| base.clone()).claim(alloc);
    }
}

/// The queued jobs of `starts` (which the plan gives in queue order), each with whether it
/// overtook a job still waiting before it in `queue` for resources or priority (one the plan
/// could place: `plannable`; held jobs and jobs larger than the machine are not overtaken, as
/// in [`backfill`](super::backfill)'s passes). One walk of the queue, up to the last start.
fn picked<'q>(
    queue: &'q [QueuedJob],
    starts: &[JobId],
    plannable: impl Fn(&QueuedJob) -> bool,
) -> Vec<(&'q QueuedJob, bool)> {
    let mut found = Vec::with_capacity(starts.len());
    let mut passed_over = false;
    for q in queue {
        let Some(&next) = starts.get(found.len()) else { break };
        if q.id == next {
            found.push((q, passed_over));
        } else if plannable(q) {
            passed_over = true;
        }
    }
    found
}
