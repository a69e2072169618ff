//! The figures a run is judged by.

use crate::outcome::{JobResult, Skipped};
use crate::{policy_name, EstimateSource};
use berth_core::sched::backfill::BackfillPolicy;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Bounded slowdown's threshold, seconds: jobs shorter than this count as this long, so that
/// a 1-second job waiting 10 seconds is not a slowdown of 11.
pub const BSLD_THRESHOLD: f64 = 10.0;

/// `max(1, (wait + run) / max(run, 10))`.
pub fn bounded_slowdown(wait: f64, run: f64) -> f64 {
    ((wait + run) / run.max(BSLD_THRESHOLD)).max(1.0)
}

/// What a run was, as opposed to what it measured.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub policy: BackfillPolicy,
    pub fair_share: bool,
    pub estimate: EstimateSource,
    pub machine: String,
    pub machine_procs: u64,
    pub machine_gpus: u64,
    pub passes: usize,
    pub backfilled: usize,
    pub preempt: bool,
    pub preemptions: usize,
    pub suspensions: usize,
}

/// A run's summary (`berth sim --json`). Times are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub policy: BackfillPolicy,
    pub fair_share: bool,
    /// Preemption by suspension simulated.
    pub preempt: bool,
    pub estimate: EstimateSource,
    /// What the trace was replayed on.
    pub machine: String,
    pub machine_procs: u64,
    /// Jobs simulated.
    pub jobs: usize,
    pub skipped_too_large: usize,
    pub skipped_no_runtime: usize,
    pub skipped_no_procs: usize,
    /// Processor-seconds used over processor-seconds available from first submit to last end.
    pub utilization: f64,
    /// GPUs of the machine (a GPU workload), GPU jobs simulated, and GPU-seconds used over
    /// GPU-seconds available as `utilization`; absent without GPUs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub machine_gpus: u64,
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub gpu_jobs: usize,
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub gpu_utilization: f64,
    pub mean_wait: f64,
    pub median_wait: f64,
    /// Mean bounded slowdown (10 s threshold).
    pub mean_bsld: f64,
    /// Last end minus first submit.
    pub makespan: f64,
    /// Jobs started out of priority order, as the scheduler counted them.
    pub backfilled: usize,
    /// Jobs started by suspending others, and suspensions that took (preemption).
    pub preemptions: usize,
    pub suspensions: usize,
    /// Scheduling passes run (`plan` calls): at most one per distinct event time, none when
    /// nothing can start (fewer CPUs free than the smallest queued job needs; under FCFS, than
    /// the first one needs).
    pub passes: usize,
    /// Wall-clock seconds the simulation took (filled in by the caller).
    pub wall_seconds: f64,
    /// Simulated jobs per wall-clock second (filled in by the caller).
    pub jobs_per_second: f64,
}

impl SimReport {
    /// Record how long the simulation took on the wall clock.
    pub fn set_elapsed(&mut self, elapsed: Duration) {
        self.wall_seconds = elapsed.as_secs_f64();
        self.jobs_per_second = if self.wall_seconds > 0.0 { self.jobs as f64 / self.wall_seconds } else { 0.0 };
    }

    /// The human-readable summary `berth sim` prints.
    pub fn table(&self) -> String {
        let estimate = match self.estimate {
            EstimateSource::Request => "requested time (run time where missing)",
            EstimateSource::Runtime => "run time",
        };
        let mut rows: Vec<(&str, String)> = vec![
            ("policy", format!("{}{}", policy_name(self.policy), if self.fair_share { " + fair share" } else { "" })),
            ("machine", self.machine.clone()),
            ("estimates", estimate.into()),
            ("jobs simulated", self.jobs.to_string()),
            (
                "jobs skipped",
                format!(
                    "{} too large, {} without run time, {} without processors",
                    self.skipped_too_large, self.skipped_no_runtime, self.skipped_no_procs
                ),
            ),
            ("utilization", format!("{:.2}%", self.utilization * 100.0)),
            (
                "GPUs",
                format!(
                    "{} GPU jobs, GPU utilization {:.2}% of {} GPUs",
                    self.gpu_jobs,
                    self.gpu_utilization * 100.0,
                    self.machine_gpus
                ),
            ),
            ("mean wait", duration(self.mean_wait)),
            ("median wait", duration(self.median_wait)),
            ("mean bounded slowdown", format!("{:.3}", self.mean_bsld)),
            ("makespan", duration(self.makespan)),
            ("backfilled", format!("{} jobs", self.backfilled)),
            (
                "speed",
                format!("{:.0} jobs/s ({:.3} s, {} passes)", self.jobs_per_second, self.wall_seconds, self.passes),
            ),
        ];
        if self.machine_gpus == 0 {
            rows.retain(|(k, _)| *k != "GPUs");
        }
        if self.preempt {
            let what =
                format!("{} jobs started by suspending others, {} suspensions", self.preemptions, self.suspensions);
            rows.insert(rows.len() - 1, ("preemption", what));
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

fn is_zero_f64(n: &f64) -> bool {
    *n == 0.0
}

/// `12345.6` as `12345.6 s (3h25m)`.
fn duration(secs: f64) -> String {
    let whole = secs.round() as u64;
    let (d, h, m, s) = (whole / 86400, whole / 3600 % 24, whole / 60 % 60, whole % 60);
    let human = match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h{m:02}m"),
    };
    format!("{secs:.1} s ({human})")
}

/// Summarize the per-job records.
pub(crate) fn summarize(jobs: &[JobResult], skipped: Skipped, h: Header) -> SimReport {
    let n = jobs.len();
    let mean = |f: fn(&JobResult) -> f64| if n == 0 { 0.0 } else { jobs.iter().map(f).sum::<f64>() / n as f64 };
    let first_submit = jobs.iter().map(|j| j.submit).fold(f64::INFINITY, f64::min);
    let last_end = jobs.iter().map(|j| j.end).fold(f64::NEG_INFINITY, f64::max);
    let makespan = if n == 0 { 0.0 } else { last_end - first_submit };
    let work: f64 = jobs.iter().map(|j| j.procs as f64 * j.run).sum();
    let capacity = h.machine_procs as f64 * makespan;
    let gpu_work: f64 = jobs.iter().map(|j| j.gpus as f64 * j.run).sum();
    let gpu_capacity = h.machine_gpus as f64 * makespan;
    SimReport {
        policy: h.policy,
        fair_share: h.fair_share,
        preempt: h.preempt,
        estimate: h.estimate,
        machine: h.machine,
        machine_procs: h.machine_procs,
        jobs: n,
        skipped_too_large: skipped.too_large,
        skipped_no_runtime: skipped.no_runtime,
        skipped_no_procs: skipped.no_procs,
        utilization: if capacity > 0.0 { work / capacity } else { 0.0 },
        machine_gpus: h.machine_gpus,
        gpu_jobs: jobs.iter().filter(|j| j.gpus > 0).count(),
        gpu_utilization: if gpu_capacity > 0.0 { gpu_work / gpu_capacity } else { 0.0 },
        mean_wait: mean(|j| j.wait),
        median_wait: median(jobs.iter().map(|j| j.wait).collect()),
        mean_bsld: mean(|j| j.bsld),
        makespan,
        backfilled: h.backfilled,
        preemptions: h.preemptions,
        suspensions: h.suspensions,
        passes: h.passes,
        wall_seconds: 0.0,
        jobs_per_second: 0.0,
    }
}

/// The middle value (mean of the two middle ones for an even count; 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_slowdown_uses_the_threshold() {
        assert_eq!(bounded_slowdown(0.0, 100.0), 1.0);
        assert_eq!(bounded_slowdown(100.0, 100.0), 2.0);
        // A 1 s job waiting 9 s: (9 + 1) / 10 = 1, not 10.
        assert_eq!(bounded_slowdown(9.0, 1.0), 1.0);
        assert_eq!(bounded_slowdown(29.0, 1.0), 3.0);
    }

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(42.0), "42.0 s (42s)");
        assert_eq!(duration(3725.0), "3725.0 s (1h02m)");
        assert_eq!(duration(90061.0), "90061.0 s (1d01h01m)");
    }
}
