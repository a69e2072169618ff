//! Fair share in the simulation: usage charged as jobs run, and the priority order it feeds.

use super::SimJob;
use berth_core::sched::backfill::QueuedJob;
use berth_core::sched::fairshare::{FairShare, FairShareConfig};
use berth_core::sched::priority::{PriorityInput, PriorityWeights};
use berth_core::sched::round::JobPriority;

/// Fair-share usage and the priority it feeds.
pub(super) struct Accounting {
    share: FairShare,
    weights: PriorityWeights,
    /// CPUs each account holds now.
    pub in_use: Vec<u64>,
    /// GPUs each account holds now.
    pub gpus_in_use: Vec<u64>,
    /// What a GPU is billed a second, as the controller bills it
    /// ([`FairShareConfig::gpu_weight_on`] of the machine's nodes; 0 without GPUs).
    gpu_weight: f64,
    /// Until when usage has been charged.
    charged_to: f64,
}

impl Accounting {
    /// `gpu_weight`: what a GPU is billed a second ([`FairShareConfig::gpu_weight_on`]).
    pub fn new(accounts: usize, gpu_weight: f64) -> Self {
        Accounting {
            gpu_weight,
            share: FairShare::new(FairShareConfig::default()),
            weights: PriorityWeights::default(),
            in_use: vec![0; accounts],
            gpus_in_use: vec![0; accounts],
            charged_to: f64::NEG_INFINITY,
        }
    }

    /// Charge every account for the CPUs and GPUs it held from the last charge until `now`,
    /// billed as the controller bills them (Slurm's TRES billing).
    pub fn charge_to(&mut self, now: f64, names: &[String]) {
        if self.charged_to > f64::NEG_INFINITY && now > self.charged_to {
            let span = now - self.charged_to;
            self.share.decay_to(now);
            for (account, (&cpus, &gpus)) in self.in_use.iter().zip(&self.gpus_in_use).enumerate() {
                if cpus > 0 || gpus > 0 {
                    let rate = self.share.config.billing(cpus, gpus, self.gpu_weight);
                    self.share.charge(&names[account], rate * span, now);
                }
            }
        }
        self.charged_to = now;
    }

    /// The priority weights (the controller's defaults).
    pub fn weights(&self) -> &PriorityWeights {
        &self.weights
    }

    /// Each queued job's priority inputs, for the round to order the queue by (the trace's
    /// queue numbers carry no priority: queue factor 0): highest first, then earlier
    /// submission, then lower id (core's `sched::round` order).
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

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::node::NodeCapacity;
    use berth_core::topology::Topology;
    use std::sync::Arc;

    /// GPUs are billed in the simulator's fair share as the controller bills them: unset, a GPU
    /// costs the PUs per GPU of the GPU nodes (8 PUs, 2 GPUs: 4).
    #[test]
    fn fair_share_bills_gpus_as_the_controller_does() {
        let mut t = Topology::uniform(1, 2, 4, 1, 1 << 30);
        t.add_emulated_gpus(1).expect("emulated GPUs");
        let nodes = vec![NodeCapacity::new(berth_core::NodeId(0), "n0", Arc::new(t))];
        let weight = FairShareConfig::default().gpu_weight_on(&nodes);
        assert_eq!(weight, 4.0);
        let mut acc = Accounting::new(2, weight);
        let names = ["gpu".to_string(), "cpu".to_string()];
        acc.in_use = vec![2, 2];
        acc.gpus_in_use = vec![2, 0];
        acc.charge_to(0.0, &names);
        acc.charge_to(100.0, &names);
        let usage = &acc.share.usage;
        let near = |a: f64, b: f64| (a - b).abs() < b * 1e-3;
        // 2 CPUs + 2 GPUs x 4 for 100 s, against 2 CPUs (a 7-day half-life decays little).
        assert!(near(usage["gpu"], 1000.0) && near(usage["cpu"], 200.0), "{usage:?}");
        // Without GPUs on the machine, a GPU costs nothing (none are ever held).
        assert_eq!(FairShareConfig::default().gpu_weight_on(&[]), 0.0);
    }
}
