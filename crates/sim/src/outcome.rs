//! What a run produced for each job of the trace: the simulated jobs' outcomes and the jobs not
//! simulated. Plain values, made by the engine (`engine`) and summarized by `metrics`.

use serde::{Deserialize, Serialize};

/// One simulated job's outcome (a line of the per-job CSV).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// The trace's job id (field 1).
    pub id: u64,
    pub submit: f64,
    pub start: f64,
    pub end: f64,
    pub wait: f64,
    pub run: f64,
    pub procs: u64,
    pub estimate: f64,
    /// Bounded slowdown, 10 s threshold.
    pub bsld: f64,
    /// Started out of priority order.
    pub backfilled: bool,
    /// Seconds spent suspended (preemption).
    pub suspended: f64,
    /// GPUs held (a GPU workload's GPU jobs; 0 otherwise).
    #[serde(default)]
    pub gpus: u64,
}

/// Jobs of the trace that are not simulated, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// More processors than the machine has (or a shape the machine can never hold).
    pub too_large: usize,
    /// Run time missing or not positive.
    pub no_runtime: usize,
    /// Neither requested nor allocated processors known.
    pub no_procs: usize,
}
