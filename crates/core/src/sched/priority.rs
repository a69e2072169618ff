//! Multifactor priority: age, size, queue and fair share, weighted by the admin.
//!
//! Every factor is in [0, 1] and the total is their weighted sum, so an admin reads the weights
//! as "how many points this factor is worth at most".

use serde::{Deserialize, Serialize};

/// Weights (`[priority]` in the controller's config). Each factor is in [0, 1] before weighting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriorityWeights {
    pub age: f64,
    pub size: f64,
    pub queue: f64,
    pub fair_share: f64,
    /// Age at which the age factor reaches 1, seconds.
    pub max_age_secs: f64,
    /// Size factor favours large jobs (true) or small ones (false).
    pub favor_large: bool,
}

impl Default for PriorityWeights {
    fn default() -> Self {
        PriorityWeights {
            age: 1000.0,
            size: 1000.0,
            queue: 1000.0,
            fair_share: 10000.0,
            max_age_secs: 7.0 * 86400.0,
            favor_large: true,
        }
    }
}

/// What priority is computed from, for one pending job.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityInput {
    pub submit_time: f64,
    pub cpus: u64,
    /// The queue's priority, normalized to [0, 1] over the configured queues.
    pub queue_factor: f64,
    /// From [`super::fairshare::FairShare::factor`].
    pub fair_share_factor: f64,
}

/// The factors and their weighted sum, for `berth jobs` and `berth show`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Priority {
    pub total: f64,
    pub age: f64,
    pub size: f64,
    pub queue: f64,
    pub fair_share: f64,
}

/// Priority of one job at `now` on a machine of `machine_cpus` CPUs.
pub fn priority(w: &PriorityWeights, job: &PriorityInput, now: f64, machine_cpus: u64) -> Priority {
    let unit = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
    let waited = (now - job.submit_time).max(0.0);
    let age = if w.max_age_secs > 0.0 { unit(waited / w.max_age_secs) } else { 1.0 };
    let share_of_machine = if machine_cpus > 0 { unit(job.cpus as f64 / machine_cpus as f64) } else { 0.0 };
    let size = if w.favor_large { share_of_machine } else { 1.0 - share_of_machine };
    let queue = unit(job.queue_factor);
    let fair_share = unit(job.fair_share_factor);
    let total = w.age * age + w.size * size + w.queue * queue + w.fair_share * fair_share;
    Priority { total, age, size, queue, fair_share }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(submit_time: f64, cpus: u64) -> PriorityInput {
        PriorityInput { submit_time, cpus, queue_factor: 0.5, fair_share_factor: 0.25 }
    }

    #[test]
    fn factors_are_weighted_and_bounded() {
        let w = PriorityWeights { max_age_secs: 100.0, ..Default::default() };
        let p = priority(&w, &input(0.0, 16), 50.0, 64);
        assert_eq!((p.age, p.size, p.queue, p.fair_share), (0.5, 0.25, 0.5, 0.25));
        assert_eq!(p.total, 500.0 + 250.0 + 500.0 + 2500.0);
        // Age saturates; a job larger than the machine counts as the whole machine.
        let p = priority(&w, &input(0.0, 1000), 1e9, 64);
        assert_eq!((p.age, p.size), (1.0, 1.0));
        // Submitted "in the future" (clock skew): no age, not negative.
        assert_eq!(priority(&w, &input(10.0, 1), 0.0, 64).age, 0.0);
    }

    #[test]
    fn small_jobs_first_when_asked() {
        let w = PriorityWeights { favor_large: false, ..Default::default() };
        let small = priority(&w, &input(0.0, 1), 0.0, 64);
        let large = priority(&w, &input(0.0, 64), 0.0, 64);
        assert!(small.total > large.total);
        assert_eq!(large.size, 0.0);
    }
}
