//! The event loop (see the parent module for the order of things at each event time).

use super::accounting::Accounting;
use super::queue::Queue;
use super::{finish, queued, workload, GpuJobs, Outcomes, Sample, SimResult, Workload};
use crate::metrics::Header;
use crate::swf::Trace;
use crate::{SimConfig, SimError};
use berth_core::sched::backfill::{PassLimits, RunningJob};
use berth_core::sched::counted::{counts_decide, CountPlan, CountedMachine};
use berth_core::sched::fairshare::FairShareConfig;
use berth_core::sched::round::RoundMachine;
use berth_core::JobId;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// A job's end on the virtual clock, ordered by time then job (deterministic ties). `segment`
/// tells which stretch of running it ends: a suspension makes the pending end stale.
#[derive(Debug, Clone, Copy, PartialEq)]
struct End {
    time: f64,
    job: usize,
    segment: u32,
}

impl Eq for End {}

impl PartialOrd for End {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for End {
    fn cmp(&self, other: &Self) -> Ordering {
        self.time.total_cmp(&other.time).then(self.job.cmp(&other.job)).then(self.segment.cmp(&other.segment))
    }
}

/// A suspended job and the allocation it ran on.
#[derive(Debug, Clone)]
pub(super) struct Suspended<A> {
    pub job: usize,
    pub alloc: A,
    pub since: f64,
}

/// The state of one replay.
pub(super) struct Replay<'a, M: RoundMachine + CountedMachine> {
    pub machine: M,
    pub total_cpus: u64,
    pub config: &'a SimConfig,
    pub work: &'a Workload,
    pub accounting: Option<Accounting>,
    pub queue: Queue,
    pub running: Vec<RunningJob<M::Alloc>>,
    /// Where each running job sits in `running` (swap_remove keeps removal O(1)).
    slot: Vec<usize>,
    ends: BinaryHeap<Reverse<End>>,
    /// Jobs of the workload submitted so far (they are in submit order).
    submitted: usize,
    busy: u64,
    pub started: Vec<bool>,
    /// Per job: the stretch of running it is in (see [`End`]), when that began, and the
    /// actual run time left at its beginning.
    segment: Vec<u32>,
    segment_start: Vec<f64>,
    pub remaining: Vec<f64>,
    pub suspended: Vec<Suspended<M::Alloc>>,
    pub outcomes: Outcomes,
    timeline: Vec<Sample>,
    pub passes: usize,
    pub backfilled_total: usize,
    pub suspensions: usize,
    pub preemptions: usize,
    /// Conservative backfill by counts, kept between rounds, where counts decide (core's
    /// `sched::counted`, run by `round_counted`).
    pub counted: Option<CountPlan>,
}

pub(super) fn replay<M: RoundMachine + CountedMachine>(
    machine: M,
    total_cpus: u64,
    description: String,
    trace: &Trace,
    config: &SimConfig,
) -> Result<SimResult, SimError> {
    // A GPU workload's jobs follow the nodes' shape (all nodes alike).
    let gpus = config.gpus.and_then(|g| {
        let node = machine.cluster()?.nodes().first()?;
        Some(GpuJobs {
            share: g.share,
            cores_per_node: node.topology.core_count() as u32,
            gpus_per_node: node.topology.gpus.len() as u32,
        })
    });
    let machine_gpus: u64 =
        machine.cluster().map_or(0, |c| c.nodes().iter().map(|n| n.topology.gpus.len() as u64).sum());
    // Fair share bills a GPU as the controller does, by the nodes' shape (a counted machine has none).
    let gpu_weight = machine.cluster().map_or(0.0, |c| FairShareConfig::default().gpu_weight_on(c.nodes()));
    let work = workload(trace, &machine, config.estimate, config.order, gpus, config.licenses.map(|l| l.share));
    let n = work.jobs.len();
    let limits = PassLimits { policy: config.policy, max_reservations: config.max_reservations, deadline: None };
    let by_counts = counts_decide(&machine, &limits, config.preempt.is_some());
    // Fair share reorders the queue at every pass: a kept plan would be of another order.
    let counted = by_counts.then(|| CountPlan::new(total_cpus, !config.fair_share));
    let mut r = Replay {
        machine,
        total_cpus,
        config,
        work: &work,
        accounting: config.fair_share.then(|| Accounting::new(work.accounts.len(), gpu_weight)),
        queue: Queue::default(),
        running: vec![],
        slot: vec![usize::MAX; n],
        ends: BinaryHeap::new(),
        submitted: 0,
        busy: 0,
        started: vec![false; n],
        segment: vec![0; n],
        segment_start: vec![f64::NAN; n],
        remaining: work.jobs.iter().map(|j| j.run).collect(),
        suspended: vec![],
        outcomes: Outcomes::new(n),
        timeline: vec![],
        passes: 0,
        backfilled_total: 0,
        suspensions: 0,
        preemptions: 0,
        counted,
    };
    while let Some(now) = r.next_time() {
        if let Some(acc) = r.accounting.as_mut() {
            acc.charge_to(now, &work.accounts);
        }
        r.complete(now);
        r.submit(now);
        r.pass(now);
        r.timeline.push(Sample { time: now, busy_procs: r.busy, queued: r.queue.len() });
        let waking = r.counted.as_ref().and_then(CountPlan::wake).is_some();
        if r.running.is_empty() && r.submitted == n && !(r.queue.is_empty() && r.suspended.is_empty()) && !waking {
            return Err(r.stuck(now));
        }
    }
    let header = Header {
        policy: config.policy,
        fair_share: config.fair_share,
        estimate: config.estimate,
        machine: description,
        machine_procs: total_cpus,
        machine_gpus,
        passes: r.passes,
        backfilled: r.backfilled_total,
        preempt: config.preempt.is_some(),
        preemptions: r.preemptions,
        suspensions: r.suspensions,
    };
    Ok(finish(&work, r.outcomes, r.timeline, header))
}

impl<M: RoundMachine + CountedMachine> Replay<'_, M> {
    /// The next event time: the earliest end or submission, if any is left, or a reservation's
    /// start (conservative by counts: one may start when nothing ends, see `counted`).
    fn next_time(&self) -> Option<f64> {
        let wake = self.counted.as_ref().and_then(CountPlan::wake);
        let next_end = self.ends.peek().map(|e| e.0.time).into_iter().chain(wake).min_by(f64::total_cmp);
        let next_submit = self.work.jobs.get(self.submitted).map(|j| j.submit);
        match (next_end, next_submit) {
            (Some(e), Some(s)) => Some(e.min(s)),
            (e, s) => e.or(s),
        }
    }

    /// Every job ending by `now` gives its cores back.
    fn complete(&mut self, now: f64) {
        while let Some(&Reverse(End { time, job, segment })) = self.ends.peek() {
            if time > now {
                break;
            }
            self.ends.pop();
            if segment == self.segment[job] && self.slot[job] != usize::MAX {
                if let Some(plan) = self.counted.as_mut() {
                    plan.ended(JobId(job as u64), time, self.running[self.slot[job]].end, self.work.jobs[job].procs);
                }
                self.stop(job);
                self.outcomes.end[job] = time;
            }
        }
    }

    /// Take job `job` off the machine (it ended or is suspended); returns its allocation.
    pub fn stop(&mut self, job: usize) -> M::Alloc {
        let at = std::mem::replace(&mut self.slot[job], usize::MAX);
        let done = self.running.swap_remove(at);
        if let Some(moved) = self.running.get(at) {
            self.slot[moved.id.0 as usize] = at;
        }
        self.machine.release(&done.alloc);
        let j = &self.work.jobs[job];
        self.busy -= j.procs;
        if let Some(acc) = self.accounting.as_mut() {
            acc.in_use[j.account] -= j.procs;
            acc.gpus_in_use[j.account] -= j.gpus;
        }
        self.segment[job] += 1;
        done.alloc
    }

    /// Every job submitted by `now` joins the queue.
    fn submit(&mut self, now: f64) {
        let jobs = &self.work.jobs;
        while self.submitted < jobs.len() && jobs[self.submitted].submit <= now {
            self.queue.push(queued(self.submitted, &jobs[self.submitted]), jobs[self.submitted].procs);
            self.submitted += 1;
        }
    }

    /// One scheduling round (`berth_core::sched::round`: resumes, priority order, the pass,
    /// preemption; `round_counted` for conservative backfill by counts). A pass that provably
    /// starts nothing is skipped: with fewer CPUs free than the smallest queued job needs
    /// nothing fits, and under FCFS nothing starts unless the first job fits. Decisions are a
    /// pure function of state, so skipping changes none. While a queued job could preempt,
    /// every pass runs (it may start by suspending others when nothing is free); so does one
    /// a kept count plan needs now: after an early end (compression) or a submission (its new
    /// jobs planned when they come, as a pass at every event plans them, or the plan could
    /// differ: see core's `sched::counted`).
    fn pass(&mut self, now: f64) {
        let replan = self.counted.as_ref().is_some_and(|p| p.must_pass() || p.next_new().0 < self.submitted as u64);
        let every = self.config.every_pass || self.may_preempt() || replan;
        self.round(now, every)
    }

    /// Start job `index` on `alloc` at `now`.
    pub fn start(&mut self, now: f64, index: usize, alloc: M::Alloc) {
        debug_assert!(index < self.submitted && !self.started[index], "job {index} started twice or unsubmitted");
        debug_assert!(now >= self.work.jobs[index].submit, "job {index} starts at {now} before its submit time");
        self.started[index] = true;
        self.outcomes.start[index] = now;
        self.run(now, index, alloc);
    }

    /// Run job `index` on `alloc` from `now` (a start or a resume) until its run time is used up.
    pub fn run(&mut self, now: f64, index: usize, alloc: M::Alloc) {
        let job = &self.work.jobs[index];
        self.machine.claim(&alloc);
        self.busy += job.procs;
        debug_assert!(self.busy <= self.total_cpus, "{} processors in use of {}", self.busy, self.total_cpus);
        if let Some(acc) = self.accounting.as_mut() {
            acc.in_use[job.account] += job.procs;
            acc.gpus_in_use[job.account] += job.gpus;
        }
        let left = self.remaining[index];
        let estimate_left = (job.estimate - (job.run - left)).max(0.0);
        self.segment_start[index] = now;
        if let Some(plan) = self.counted.as_mut() {
            plan.started(JobId(index as u64), now + estimate_left, now + left);
        }
        self.slot[index] = self.running.len();
        self.running.push(RunningJob { id: JobId(index as u64), alloc, end: now + estimate_left });
        self.ends.push(Reverse(End { time: now + left, job: index, segment: self.segment[index] }));
    }

    /// Suspend running job `job` at `now`: it stops progressing and gives its cores back.
    pub fn suspend(&mut self, now: f64, job: usize) {
        self.remaining[job] -= now - self.segment_start[job];
        let alloc = self.stop(job);
        self.suspended.push(Suspended { job, alloc, since: now });
        self.suspensions += 1;
    }

    fn stuck(&self, now: f64) -> SimError {
        let detail = match self.queue.jobs().first() {
            Some(q) => {
                let head = &self.work.jobs[q.id.0 as usize];
                format!("the first queued job, trace id {}, needs {} processors", head.trace_id, head.procs)
            }
            None => format!("{} suspended job(s) cannot resume", self.suspended.len()),
        };
        SimError::Stuck { time: now, queued: self.queue.len(), detail }
    }
}
