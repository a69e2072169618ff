//! Fair share in the simulation: usage charged as jobs run, and the priority order it feeds.

use super::SimJob;
use berth_core::sched::backfill::QueuedJob;
use berth_core::sched::fairshare::{FairShare, FairShareConfig};
use berth_core::sched::priority::{priority, PriorityInput, PriorityWeights};
use berth_core::sched::round::JobPriority;

/// Fair-share usage and the priority it feeds.
pub(super) struct Accounting {
    share: FairShare,
    weights: PriorityWeights,
    /// CPUs each account holds now.
    pub in_use: Vec<u64>,
    /// Until when usage has been charged.
    charged_to: f64,
    /// Priority of each job at the last pass, by workload index.
    priority: Vec<f64>,
}

impl Accounting {
    pub fn new(accounts: usize, jobs: usize) -> Self {
        Accounting {
            share: FairShare::new(FairShareConfig::default()),
            weights: PriorityWeights::default(),
            in_use: vec![0; accounts],
            charged_to: f64::NEG_INFINITY,
            priority: vec![0.0; jobs],
        }
    }

    /// Charge every account for the CPUs it held from the last charge until `now`.
    pub fn charge_to(&mut self, now: f64, names: &[String]) {
        if self.charged_to > f64::NEG_INFINITY && now > self.charged_to {
            let span = now - self.charged_to;
            self.share.decay_to(now);
            for (account, &cpus) in self.in_use.iter().enumerate().filter(|(_, &c)| c > 0) {
                self.share.charge(&names[account], cpus as f64 * span, now);
            }
        }
        self.charged_to = now;
    }

    /// Put `queue` in priority order (highest first; ties by submit order).
    pub fn order(&mut self, queue: &mut [QueuedJob], jobs: &[SimJob], names: &[String], now: f64, cpus: u64) {
        let factors: Vec<f64> = names.iter().map(|n| self.share.factor(n)).collect();
        for q in queue.iter() {
            let job = &jobs[q.id.0 as usize];
            let input = PriorityInput {
                submit_time: job.submit,
                cpus: job.procs,
                queue_factor: 0.0,
                fair_share_factor: factors[job.account],
            };
            self.priority[q.id.0 as usize] = priority(&self.weights, &input, now, cpus).total;
        }
        let p = &self.priority;
        queue.sort_by(|a, b| p[b.id.0 as usize].total_cmp(&p[a.id.0 as usize]).then(a.id.cmp(&b.id)));
    }

    /// The priority weights (the controller's defaults).
    pub fn weights(&self) -> &PriorityWeights {
        &self.weights
    }

    /// Each queued job's priority inputs, for the round to order the queue by (the trace's
    /// queue numbers carry no priority: queue factor 0).
    pub fn priorities(&self, queue: &[QueuedJob], jobs: &[SimJob], names: &[String]) -> Vec<JobPriority> {
        let factors: Vec<f64> = names.iter().map(|n| self.share.factor(n)).collect();
        queue
            .iter()
            .map(|q| {
                let job = &jobs[q.id.0 as usize];
                let input = PriorityInput {
                    submit_time: job.submit,
                    cpus: job.procs,
                    queue_factor: 0.0,
                    fair_share_factor: factors[job.account],
                };
                JobPriority { input, admin: None }
            })
            .collect()
    }
}
