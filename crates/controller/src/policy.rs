//! Queue policy in the controller: fair-share usage and one scheduling round per pass.
//!
//! The decisions are berth-core's (`sched::round::round_keeping`: usage charges, resumes,
//! priority order, per-user limits, backfill beside advance reservations, preemption;
//! `FairShare`); this
//! module only gathers their inputs from the controller's state (`gather`; advance
//! reservations and their members from `advance`), carries out their effects (`effects`),
//! keeps what users are shown (priority, expected start) and persists fair-share usage.

use crate::model::job::{account_of, JobRecord};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::JobState;
use berth_core::sched::backfill::{Deadline, PassLimits};
use berth_core::sched::queue::QueueSpec;
use berth_core::sched::round::{
    charges, round_keeping, PreemptRound, PriorityRound, ResumeRule, RoundInput, UsageJob, UsageRound, UserKey,
    UserLimits,
};
use berth_core::NodeId;

mod effects;
mod gather;

impl Controller {
    /// Charge running jobs' billed CPU time (CPUs and GPUs by `[fair_share]`'s weights) since
    /// the last charge to their accounts, decayed to `now` (`berth share`; a scheduling pass
    /// has its round charge them): booked by `PolicyState::charge`, its write queued.
    pub fn charge_usage(&mut self, now: f64) {
        let charged = charges(&self.usage_jobs(now), self.policy.charged_until(), now);
        let effects = self.policy.charge(&charged, now);
        self.queue(effects);
    }

    /// The running jobs as fair-share usage sees them: account, billed CPUs (GPUs billed like
    /// the CPUs beside them unless `[fair_share] gpu_weight` says otherwise; generic resources
    /// and licenses by `gres_weights` and `license_weights`), start.
    fn usage_jobs(&self, now: f64) -> Vec<UsageJob> {
        self.usage_of(self.jobs.values().filter(|j| j.state == JobState::Running), now)
    }

    /// [`Controller::usage_jobs`] of `running` (running jobs).
    fn usage_of<'a>(&self, running: impl Iterator<Item = &'a JobRecord>, now: f64) -> Vec<UsageJob> {
        let config = &self.policy.fair_share().config;
        let gpu_weight = config.gpu_weight_on(self.cluster.nodes());
        running
            .map(|job| {
                let cpus: u64 = job.allocation.iter().map(|a| a.cpus.len() as u64).sum();
                let gpus: u64 = job.allocation.iter().map(|a| a.gpus.len() as u64).sum();
                let held: f64 = job.allocation.iter().map(|a| config.counts_billing(&a.gres, &a.licenses)).sum();
                UsageJob {
                    account: account_of(job),
                    rate: config.billing(cpus, gpus, gpu_weight) + held,
                    start: job.start_time.unwrap_or(now),
                }
            })
            .collect()
    }

    /// One scheduling pass: berth-core's round (`sched::round::round_keeping`: usage charges,
    /// resumes,
    /// priority order, per-user limits, the configured backfill beside the advance
    /// reservations, preemption) over the controller's state, then its effects (`effects`):
    /// resumes, starts and suspensions decided over the in-memory model, their effects carried
    /// out in order in the current transaction when it ends (sent to the agents after it
    /// commits), and what users are shown (reasons, expected starts).
    pub fn schedule(&mut self, now: f64) -> Result<(), StoreError> {
        self.check_advance(now)?;
        self.dirty = false;
        // Jobs whose dependency or begin time does not let them start yet wait outside the round.
        let not_yet = self.ineligible(now)?;
        let mut g = self.gather(&not_yet, now);
        let tails = std::mem::take(&mut g.tails);
        let per_job: Vec<Option<(&QueueSpec, UserKey)>> =
            g.queues.iter().map(|q| q.as_ref().map(|(k, key)| (&g.specs[*k], key.clone()))).collect();
        let connected = |n: NodeId| g.connected.get(n.0 as usize).copied().unwrap_or(false);
        let budget_ms = self.cfg.scheduler.reservation_budget_ms;
        // The budget on the injected clock (`Clock::monotonic_us`).
        let deadline = (budget_ms > 0).then(|| {
            let clock = self.clock.clone();
            Deadline::after(std::sync::Arc::new(move || clock.monotonic_us()), budget_ms.saturating_mul(1000))
        });
        let (share, since, kept_plan) = self.policy.for_round();
        let input = RoundInput {
            machine: &g.machine,
            running: &g.running,
            queue: &g.queue,
            priority: Some(PriorityRound {
                weights: &self.cfg.priority,
                machine_cpus: g.machine_cpus,
                jobs: &g.priority,
            }),
            user_limits: Some(UserLimits { jobs: &per_job, running: &g.users }),
            usage: Some(UsageRound { share, since, running: &g.usage, accounts: &g.accounts }),
            barred: Some(&g.barred),
            suspended: &g.suspended,
            resume: ResumeRule::Parts { connected: &connected },
            preempt: self.cfg.preempt.enabled.then_some(PreemptRound {
                config: &self.cfg.preempt,
                jobs: &g.preempt,
                victims: &g.victims,
                by_id: true,
            }),
            limits: PassLimits {
                policy: self.cfg.scheduler.policy,
                max_reservations: self.cfg.scheduler.max_reservations,
                deadline,
            },
            reasons: true,
            idle_unless: None,
        };
        let decisions = round_keeping(&input, &g.advance, kept_plan, now);
        self.carry_out(decisions, g.shut_out, tails, now);
        // Called after the batch's commands, whose effects are carried out already.
        self.carry_out_effects(now)
    }

    /// Resume every job the pass suspended (not the admins' suspensions) that can run now,
    /// longest suspended first: the first step of a pass's round alone (its queue left empty),
    /// for tests of that rule without a pass. Returns the ids resumed.
    #[cfg(test)]
    pub fn resume_waiting(&mut self, now: f64) -> Result<Vec<berth_core::JobId>, StoreError> {
        let pending: std::collections::HashSet<berth_core::JobId> = self.jobs.keys().copied().collect();
        let g = self.gather(&pending, now);
        let connected = |n: NodeId| g.connected.get(n.0 as usize).copied().unwrap_or(false);
        let input = RoundInput {
            machine: &g.machine,
            running: &g.running,
            queue: &[],
            priority: None,
            user_limits: None,
            usage: None,
            barred: None,
            suspended: &g.suspended,
            resume: ResumeRule::Parts { connected: &connected },
            preempt: None,
            limits: PassLimits { policy: self.cfg.scheduler.policy, max_reservations: 0, deadline: None },
            reasons: false,
            idle_unless: None,
        };
        let d = round_keeping(&input, &g.advance, &mut None, now);
        assert!(d.starts.is_empty() && d.preemptions.is_empty() && !d.passed, "a round without a queue starts nothing");
        let resumed = d.resumes.iter().map(|(id, _)| *id).collect();
        self.carry_out_resumes(d.resumes, &d.still_suspended, now);
        self.carry_out_effects(now)?;
        Ok(resumed)
    }

    /// The preemption class of a queue (0 when unknown).
    pub fn preempt_class(&self, queue: &str) -> u32 {
        self.cfg.queues.iter().find(|q| q.name == queue).map(|q| q.preempt_class).unwrap_or(0)
    }

    /// The queue's priority factor in [0, 1] among the configured queues (0 when unknown,
    /// e.g. a queue removed from the config while it still held jobs).
    pub fn queue_factor(&self, queue: &str) -> f64 {
        match self.cfg.queues.iter().find(|q| q.name == queue) {
            Some(spec) => berth_core::sched::queue::queue_factor(spec, &self.cfg.queues),
            None => 0.0,
        }
    }

    /// `berth queues`: each queue's limits and what it holds now.
    pub fn queue_infos(&self) -> Vec<berth_protocol::client::QueueInfo> {
        self.cfg
            .queues
            .iter()
            .map(|spec| {
                let jobs = || self.jobs.values().filter(|j| j.queue == spec.name);
                let count = |s: JobState| jobs().filter(|j| j.state == s).count();
                berth_protocol::client::QueueInfo {
                    spec: spec.clone(),
                    priority_factor: self.queue_factor(&spec.name),
                    queued: count(JobState::Queued),
                    held: count(JobState::Held),
                    running: count(JobState::Running),
                    running_cores: jobs()
                        .filter(|j| j.state == JobState::Running)
                        .map(|j| j.allocation.iter().map(|a| a.cores as u64).sum::<u64>())
                        .sum(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod effect_tests;

#[cfg(test)]
mod tail_tests;
