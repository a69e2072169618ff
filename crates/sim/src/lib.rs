//! berth's trace simulator: replays a Standard Workload Format trace through berth's own
//! scheduler (`berth_core::sched::backfill::plan`, fair share and priority) on a virtual
//! clock, and reports utilization, waits, bounded slowdown and makespan.
//!
//! No I/O: callers pass the trace text and get values back ([`SimResult`], CSV and SVG text).
//!
//! Modelling choices (see also [`engine`]):
//! - The machine is the trace's `MaxProcs` (else `MaxNodes`) single-core nodes, else as many
//!   single-core nodes as the largest job needs (traces without a header), unless given.
//! - Jobs join the queue in submit order; jobs submitted at the same second keep the trace's
//!   order (its line order), or go by job id with [`SubmitOrder::Id`] (`berth sim --order id`).
//!   With FCFS priority that order is their priority order.
//! - A job of P processors asks for P cores anywhere (`Shape::Total { cores: P, chunk: 1 }`),
//!   no memory.
//! - The estimate reservations are made with is the requested time (field 9), or the run time
//!   when the trace has none or with [`EstimateSource::Runtime`]. A job whose run time exceeds
//!   its estimate still runs to its actual run time (the trace records what happened; killing
//!   it at its estimate would change the workload), so reservations can be late, as in life.
//! - With a GPU workload ([`SimConfig::gpus`], topology-aware machine only) a job chosen by a
//!   hash of its id asks for whole nodes' worth of its processors: `k` = P over the node's
//!   cores (rounded up) nodes of P/k cores (rounded up), with GPUs on each in proportion to
//!   its cores there (at least 1, at most the node's), placed as the controller places GPU
//!   jobs (GPUs and the cores near them together). Other jobs stay as above and may take
//!   cores of GPU nodes beside them.
//! - With preemption ([`SimConfig::preempt`]) large jobs suspend smaller ones as the controller
//!   does; suspended jobs stop progressing and resume when they can (see `engine::preempt`).

pub mod engine;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod machine;
pub mod metrics;
pub mod outcome;
pub mod output;
pub mod swf;

pub use engine::{JobResult, Sample, SimResult};
pub use error::SimError;
pub use metrics::SimReport;

use berth_core::sched::backfill::BackfillPolicy;
use berth_core::sched::preempt::PreemptConfig;
use serde::{Deserialize, Serialize};

/// Where reservations' walltime estimates come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimateSource {
    /// The requested time (field 9), or the run time when the trace has none.
    #[default]
    Request,
    /// The actual run time: perfect estimates.
    Runtime,
}

impl std::str::FromStr for EstimateSource {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s {
            "request" => Ok(EstimateSource::Request),
            "runtime" => Ok(EstimateSource::Runtime),
            _ => Err(SimError::BadOption(format!("unknown estimate {s:?}; use request or runtime"))),
        }
    }
}

/// The order of jobs submitted at the same second (they are otherwise in submit order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmitOrder {
    /// As they appear in the trace (its line order).
    #[default]
    Trace,
    /// By job id (field 1), lowest first.
    Id,
}

impl std::str::FromStr for SubmitOrder {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s {
            "trace" => Ok(SubmitOrder::Trace),
            "id" => Ok(SubmitOrder::Id),
            _ => Err(SimError::BadOption(format!("unknown order {s:?}; use trace or id"))),
        }
    }
}

/// Parse a policy name as the CLI spells it.
pub fn parse_policy(s: &str) -> Result<BackfillPolicy, SimError> {
    match s {
        "fcfs" => Ok(BackfillPolicy::Fcfs),
        "easy" => Ok(BackfillPolicy::Easy),
        "conservative" => Ok(BackfillPolicy::Conservative),
        _ => Err(SimError::BadOption(format!("unknown policy {s:?}; use fcfs, easy or conservative"))),
    }
}

/// The policy's name as the CLI spells it.
pub fn policy_name(p: BackfillPolicy) -> &'static str {
    match p {
        BackfillPolicy::Fcfs => "fcfs",
        BackfillPolicy::Easy => "easy",
        BackfillPolicy::Conservative => "conservative",
    }
}

/// The machine to replay on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MachineSpec {
    /// The trace's `MaxProcs` (else `MaxNodes`) single-core nodes, else the largest job's size.
    #[default]
    FromTrace,
    /// `nodes` identical nodes of `cores_per_node` cores, cores counted only.
    Pool { nodes: u64, cores_per_node: u32 },
    /// `nodes` nodes of a topology (`package:2 numa:2 core:8 pu:1`) under berth's placement.
    Topology { nodes: u32, spec: String },
}

/// A GPU-bearing synthetic workload (`berth sim --gpus-per-numa G --gpu-jobs F`): the
/// topology-aware machine's nodes get `per_numa` emulated GPUs on each NUMA node, and a share
/// of the trace's jobs become GPU jobs (see [`engine`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuWorkload {
    /// Emulated GPUs on every NUMA node (1 to 16).
    pub per_numa: u32,
    /// The share of the trace's jobs (0 to 1) that ask for GPUs, chosen by a hash of their job
    /// id: the same jobs on every run and under every policy.
    pub share: f64,
}

/// A licensed workload (`berth sim --licenses N --license-jobs F`): the topology-aware
/// machine's cluster has `count` licenses named `sim`, and a share of the trace's jobs each hold
/// one while they run, chosen by a hash of their job id (other than the GPU jobs' hash).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LicenseWorkload {
    /// Licenses in the cluster (1 to 1,000,000,000).
    pub count: u32,
    /// The share of the trace's jobs (0 to 1) that hold one.
    pub share: f64,
}

/// Everything a simulation run is decided by, apart from the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub machine: MachineSpec,
    pub policy: BackfillPolicy,
    pub estimate: EstimateSource,
    /// Order of jobs submitted at the same second.
    pub order: SubmitOrder,
    /// Order the queue by berth's multifactor priority with fair share per group.
    pub fair_share: bool,
    /// Preemption by suspension (see [`engine`]), with these settings; `None`: off. Needs the
    /// topology-aware machine: with [`MachineSpec::FromTrace`] the trace's processors become
    /// single-core nodes under berth's placement.
    pub preempt: Option<PreemptConfig>,
    /// Most reservations one pass computes (`PassLimits::max_reservations`).
    pub max_reservations: usize,
    /// Run `plan` at every event time, even when it provably starts nothing (slower: to check
    /// that skipping those passes changes nothing).
    pub every_pass: bool,
    /// GPU nodes and GPU jobs; needs [`MachineSpec::Topology`]. `None`: no GPUs.
    pub gpus: Option<GpuWorkload>,
    /// Cluster-wide licenses and the jobs holding one; needs [`MachineSpec::Topology`].
    pub licenses: Option<LicenseWorkload>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            machine: MachineSpec::FromTrace,
            policy: BackfillPolicy::Easy,
            estimate: EstimateSource::Request,
            order: SubmitOrder::Trace,
            fair_share: false,
            preempt: None,
            max_reservations: usize::MAX,
            every_pass: false,
            gpus: None,
            licenses: None,
        }
    }
}

/// Parse `text` as SWF and replay it under `config`.
pub fn simulate_text(text: &str, config: &SimConfig) -> Result<SimResult, SimError> {
    simulate(&swf::parse(text)?, config)
}

/// Replay a parsed trace under `config`. `jobs_per_second` is left 0: the caller measures the
/// wall clock and calls [`SimReport::set_elapsed`].
pub fn simulate(trace: &swf::Trace, config: &SimConfig) -> Result<SimResult, SimError> {
    engine::run(trace, config)
}

/// Preemption as `--preempt` sets it: jobs of more than `large_cpus` CPUs may suspend jobs of
/// fewer (scores are CPUs of large jobs, 0 for the others: traces carry no queue classes);
/// everything else as the controller's defaults (a job suspended at most 3,600 s in total, not
/// before it ran 300 s, victims packed on few nodes preferred).
pub fn preempt_config(large_cpus: u64) -> PreemptConfig {
    PreemptConfig { enabled: true, large_cpus, min_score: large_cpus as f64 + 1.0, ..PreemptConfig::default() }
}
