//! The round's input, gathered from the controller's state: the queue with its priority
//! inputs and accounts, the running jobs' usage, per-user limits, preemption classes, the suspended jobs that may resume, the running
//! jobs and the advance reservations. Owned here; `RoundInput` borrows it.

use crate::model::job::account_of;
use crate::model::job::JobRecord;
use crate::model::policy::ArrayTail;
use crate::state::Controller;
use berth_core::job::{Allocation, JobState};
use berth_core::sched::backfill::{AdvanceReservation, QueuedJob, RunningJob};
use berth_core::sched::preempt::{self, Preemptible, SuspendedJob};
use berth_core::sched::priority::PriorityInput;
use berth_core::sched::queue::QueueSpec;
use berth_core::sched::round::{JobPriority, PreemptJob, SuspendedInput, UsageJob, UserKey};
use berth_core::sched::tail::{tasks_needed, RunTask, TailPass};
use berth_core::sched::{ClusterState, PendingReason};
use berth_core::JobId;
use std::collections::{HashMap, HashSet};

/// Everything a round decides from, owned.
pub(super) struct Gathered {
    /// The nodes up and connected (others down), every running job's allocation claimed.
    pub machine: ClusterState,
    pub machine_cpus: u64,
    pub running: Vec<RunningJob<Allocation>>,
    /// Pending jobs eligible now, in id order, with their priority inputs, queue (an index
    /// into `specs` with the job's (queue, uid)) and preemption traits alongside.
    pub queue: Vec<QueuedJob>,
    pub priority: Vec<JobPriority>,
    pub queues: Vec<Option<(usize, UserKey)>>,
    pub preempt: Vec<PreemptJob>,
    pub specs: Vec<QueueSpec>,
    /// Per queue entry: its account (the round gives its fair-share factor after charging).
    pub accounts: Vec<String>,
    /// The running jobs as fair-share usage sees them.
    pub usage: Vec<UsageJob>,
    /// Cores each (queue, user) runs now.
    pub users: HashMap<UserKey, u64>,
    /// Jobs asking for an advance reservation they cannot use: why (waiting outside the pass).
    pub shut_out: HashMap<JobId, PendingReason>,
    pub barred: HashMap<JobId, PendingReason>,
    pub advance: Vec<AdvanceReservation<Allocation>>,
    /// Jobs the pass suspended, longest suspended first.
    pub suspended: Vec<SuspendedInput>,
    /// Running jobs preemption may suspend, in id order (empty with preemption off).
    pub victims: Vec<Preemptible>,
    /// Per node index: whether its agent is connected.
    pub connected: Vec<bool>,
    /// Pending array tasks left out of the queue (see [`TailRun`]), in id order.
    pub tails: Vec<ArrayTail>,
}

/// A run of pending tasks of one array, consecutive among the pass's pending jobs (in id
/// order) and identical in everything the round sees of them (request, walltime, hold, queue,
/// user and account, submission time, admin priority): its first `keep` tasks go to the round,
/// the rest are left out and shown as the last kept one (`PolicyState::shown_as`). How many the
/// round needs, and why the rest change nothing, is core's rule
/// ([`berth_core::sched::tail::tasks_needed`]); finding the runs and applying the rule is this.
struct TailRun {
    /// The run's first task's options (its `array_task` set to each task compared).
    options: berth_core::directives::SubmitOptions,
    state: JobState,
    queue: String,
    user: (u32, u32),
    walltime: Option<u64>,
    submit_time: f64,
    /// How many of its tasks go to the round (None: all).
    keep: Option<usize>,
    seen: usize,
    last_kept: JobId,
    tail: Option<ArrayTail>,
}

impl TailRun {
    /// Whether `job` continues this run.
    fn takes(&mut self, job: &JobRecord) -> bool {
        let Some(task) = job.options.array_task else { return false };
        if self.options.array_task.map(|t| t.job) != Some(task.job) {
            return false;
        }
        self.options.array_task = Some(task);
        job.state == self.state
            && job.walltime == self.walltime
            && job.submit_time.total_cmp(&self.submit_time).is_eq()
            && (job.user.uid, job.user.gid) == self.user
            && job.queue == self.queue
            && job.options == self.options
    }
}

impl Controller {
    /// The round's input at `now`; `not_yet`: pending jobs whose dependency or begin time does
    /// not let them start yet (they wait outside the round).
    pub(super) fn gather(&self, not_yet: &HashSet<JobId>, now: f64) -> Gathered {
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        let (advance, shut_out) = self.advance_pass_input();
        let barred = shut_out.clone();
        let mut g = Gathered {
            machine: self.sched_view(),
            machine_cpus: self.cluster.nodes().iter().map(|n| n.topology.all_pus().len() as u64).sum(),
            running: vec![],
            queue: vec![],
            priority: vec![],
            queues: vec![],
            preempt: vec![],
            specs: self.cfg.queues.clone(),
            accounts: vec![],
            usage: vec![],
            users: HashMap::new(),
            shut_out,
            barred,
            advance,
            suspended: vec![],
            victims: vec![],
            connected: self.extra.iter().map(|e| e.connected()).collect(),
            tails: vec![],
        };
        // One walk over the jobs (a pass costs a walk per look at every job): the running and
        // suspended ones set aside, the pending ones gathered.
        let (mut running, mut suspended) = (vec![], vec![]);
        let mut run: Option<TailRun> = None;
        for job in self.jobs.values() {
            match job.state {
                JobState::Running => {
                    running.push(job);
                    continue;
                }
                JobState::Suspended => {
                    suspended.push(job);
                    continue;
                }
                s if !s.is_pending() || not_yet.contains(&job.id) => continue,
                _ => {}
            }
            if let Some(r) = run.as_mut() {
                if r.takes(job) {
                    r.seen += 1;
                    if r.keep.is_some_and(|keep| r.seen > keep) {
                        let t = r.tail.get_or_insert(ArrayTail {
                            first: job.id,
                            last: job.id,
                            shown_as: r.last_kept,
                            count: 0,
                        });
                        t.last = job.id;
                        t.count += 1;
                    } else {
                        r.last_kept = job.id;
                        self.gather_pending(job, &mut g, unlimited, now);
                    }
                    continue;
                }
            }
            if let Some(t) = run.take().and_then(|r| r.tail) {
                g.tails.push(t);
            }
            self.gather_pending(job, &mut g, unlimited, now);
            run = self.tail_run(job, &g);
        }
        if let Some(t) = run.and_then(|r| r.tail) {
            g.tails.push(t);
        }
        g.usage = self.usage_of(running.iter().copied(), now);
        g.suspended = self.suspended_inputs(suspended, now);
        let preempting = self.cfg.preempt.enabled;
        for j in running {
            g.running.push(RunningJob { id: j.id, alloc: j.allocation.clone(), end: j.expected_end(unlimited) });
            let cores: u64 = j.allocation.iter().map(|a| a.cores as u64).sum();
            *g.users.entry((j.queue.clone(), j.user.uid)).or_default() += cores;
            if preempting && self.may_be_suspended(j) {
                g.victims.push(Preemptible {
                    id: j.id,
                    alloc: j.allocation.clone(),
                    score: preempt::score(&j.pending().request, self.preempt_class(&j.queue), &self.cfg.preempt),
                    suspended_secs: j.suspension.seconds(now),
                    start: j.start_time.unwrap_or(now),
                });
            }
        }
        g
    }

    /// The run (see [`TailRun`]) `job` starts, just gathered (its request the queue's last);
    /// None when `job` is no array task.
    fn tail_run(&self, job: &JobRecord, g: &Gathered) -> Option<TailRun> {
        job.options.array_task?;
        let req = &g.queue.last()?.request;
        let sched = &self.cfg.scheduler;
        let task = RunTask {
            request: req,
            held: job.state == JobState::Held,
            in_advance: job.options.reservation.is_some(),
            user_limited: self.cfg.queues.iter().any(|s| s.name == job.queue && s.max_cores_per_user.is_some()),
        };
        let pass = TailPass {
            machine: &g.machine,
            machine_cpus: g.machine_cpus,
            policy: sched.policy,
            max_reservations: sched.max_reservations,
            preempting: self.cfg.preempt.enabled,
        };
        let keep = tasks_needed(task, pass);
        #[cfg(test)]
        let keep = keep.filter(|_| !self.policy.whole_arrays());
        Some(TailRun {
            options: job.options.clone(),
            state: job.state,
            queue: job.queue.clone(),
            user: (job.user.uid, job.user.gid),
            walltime: job.walltime,
            submit_time: job.submit_time,
            keep,
            seen: 1,
            last_kept: job.id,
            tail: None,
        })
    }

    fn gather_pending(&self, job: &JobRecord, g: &mut Gathered, unlimited: f64, now: f64) {
        let pending = job.pending_in(&self.cfg.queues);
        g.accounts.push(account_of(job));
        g.priority.push(JobPriority {
            input: PriorityInput {
                submit_time: job.submit_time,
                cpus: pending.request.total_cpus(),
                queue_factor: self.queue_factor(&job.queue),
                // The round's, after it charges usage (`accounts`).
                fair_share_factor: 0.0,
            },
            // An admin's priority (`berth update --priority`) replaces the computed one.
            admin: job.options.priority.map(f64::from),
        });
        let spec = self.cfg.queues.iter().position(|s| s.name == job.queue);
        g.queues.push(spec.map(|k| (k, (job.queue.clone(), job.user.uid))));
        g.preempt.push(PreemptJob {
            class: self.preempt_class(&job.queue),
            // Members of advance reservations wait for their reservation's resources only.
            may_preempt: job.state == JobState::Queued && job.options.reservation.is_none(),
            suspendable: self.may_be_suspended(job),
            suspended_secs: job.suspension.seconds(now),
        });
        let walltime = job.walltime.map(|w| w as f64).unwrap_or(unlimited);
        g.queue.push(QueuedJob { id: job.id, request: pending.request, walltime, held: pending.held });
    }

    /// Whether preemption may suspend `job` once it runs: not an interactive allocation, not in
    /// an advance reservation.
    fn may_be_suspended(&self, job: &JobRecord) -> bool {
        !job.is_interactive() && !self.in_advance(job)
    }

    /// The jobs the pass suspended (admins' suspensions last until `berth resume`), longest
    /// suspended first, as the round sees them: each resumes as soon as it can, and until then
    /// the running jobs on its CPUs count as running as much longer as it has left to run.
    /// `suspended`: the suspended jobs, in id order.
    fn suspended_inputs(&self, suspended: Vec<&JobRecord>, now: f64) -> Vec<SuspendedInput> {
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        let mut waiting: Vec<&JobRecord> =
            suspended.into_iter().filter(|j| !j.suspension.by_admin && j.kill_sent.is_none()).collect();
        waiting.sort_by(|a, b| {
            let since = |j: &JobRecord| j.suspension.since.unwrap_or(now);
            since(a).total_cmp(&since(b)).then(a.id.cmp(&b.id))
        });
        let cfg = &self.cfg.preempt;
        waiting
            .into_iter()
            .map(|j| {
                let left = self.left_to_run(j, now);
                // Its suspension ends now: its expected end then counts it.
                let resumed_end = j.ends_after(j.suspension.seconds(now), unlimited);
                let victim = (cfg.enabled && self.may_be_suspended(j)).then(|| {
                    let score = preempt::score(&j.pending().request, self.preempt_class(&j.queue), cfg);
                    (score, j.suspension.seconds(now), j.start_time.unwrap_or(now))
                });
                SuspendedInput {
                    job: SuspendedJob { id: j.id, alloc: j.allocation.clone() },
                    resumed_end,
                    victim,
                    parts: self.parts_job(j),
                    keep_off: self.resume_keeps_off(j, now),
                    holds_back: Some(left),
                    user: Some(((j.queue.clone(), j.user.uid), j.allocation.iter().map(|a| a.cores as u64).sum())),
                }
            })
            .collect()
    }
}
