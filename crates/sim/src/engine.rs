//! The replay: which machine, which jobs, and the event loop on a virtual clock.
//!
//! At each distinct event time: fair-share usage is charged for the interval just ended (when
//! enabled), every job ending then releases its cores, suspended jobs that can run resume
//! (preemption), every job submitted then joins the queue, and one scheduling pass (`plan`)
//! decides over the whole queue; its starts are claimed at once; then jobs still waiting may
//! start by suspending others (preemption, see `preempt`). One pass per event time, not per event, keeps saturated traces (long queues,
//! bursts of submissions) affordable; so does skipping the pass when it provably starts
//! nothing (fewer CPUs free than the smallest queued job needs, or under FCFS than the first
//! job needs): `plan` is a pure function, so the schedule is the same as with every pass run.
//!
//! Conservative backfill on a pool of single-core nodes is planned by processor counts and
//! kept from pass to pass (core's `sched::counted`, through `sched::round::round_counted`:
//! textbook conservative backfill, with compression when a job ends early); there the
//! simulator also passes at reservations' starts, and at every submission and early end.
//!
//! Checked in debug builds (so in the tests): no job starts before its submission or twice,
//! never more processors are busy than the machine has, and the pass's backfill count matches
//! the jobs the simulator sees started out of order.
//!
//! Fair share (`SimConfig::fair_share`): usage is charged incrementally, at every event time,
//! for the CPUs each account holds over the interval since the previous one, so long jobs count
//! while they run (as the controller charges), not only when they end. The queue is then
//! ordered by berth's multifactor `priority` (age, size, fair share; the trace's queue numbers
//! carry no priority, so the queue factor is 0), ties by submit order, with the controller's
//! defaults: `PriorityWeights::default()`, `FairShareConfig::default()` (7-day half-life, equal
//! shares). Without fair share the queue is in submit order (FCFS priority).

use crate::machine::{parse_topology, ClusterMachine, PoolMachine};
use crate::metrics::{self, SimReport};
pub use crate::outcome::{JobResult, Skipped};
use crate::swf::Trace;
use crate::{EstimateSource, GpuWorkload, MachineSpec, SimConfig, SimError, SubmitOrder};
use berth_core::gres::Licenses;
use berth_core::job::Shape;
use berth_core::placement::JobRequest;
use berth_core::sched::backfill::{Fit, Machine, QueuedJob};
use std::collections::HashMap;

mod accounting;
mod queue;
mod replay;
mod round;

/// What one run produced.
#[derive(Debug, Clone)]
pub struct SimResult {
    pub report: SimReport,
    /// Simulated jobs in submit order.
    pub jobs: Vec<JobResult>,
    /// Busy processors and queue length after each event time's pass.
    pub timeline: Vec<Sample>,
}

/// The machine's state after one event time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub time: f64,
    pub busy_procs: u64,
    pub queued: usize,
}

/// A job of the trace the simulator will run, in the terms the scheduler sees.
#[derive(Debug, Clone)]
pub(crate) struct SimJob {
    pub trace_id: u64,
    pub submit: f64,
    pub run: f64,
    pub estimate: f64,
    pub procs: u64,
    /// GPUs held (all nodes), 0 for a job without.
    pub gpus: u64,
    /// Index into the account names (fair share).
    pub account: usize,
    pub request: JobRequest,
}

/// The jobs to simulate, in submit order (ties: trace order, or id order), with account names.
pub(crate) struct Workload {
    pub jobs: Vec<SimJob>,
    pub skipped: Skipped,
    pub accounts: Vec<String>,
}

pub(crate) fn run(trace: &Trace, config: &SimConfig) -> Result<SimResult, SimError> {
    let preempt = config.preempt.is_some();
    if config.gpus.is_some() && !matches!(config.machine, MachineSpec::Topology { .. }) {
        return Err(SimError::BadOption(
            "GPU workloads need berth's topology-aware machine: give --nodes N --topology SPEC".into(),
        ));
    }
    if let Some(l) = &config.licenses {
        if !matches!(config.machine, MachineSpec::Topology { .. }) {
            return Err(SimError::BadOption(
                "licensed workloads need berth's topology-aware machine: give --nodes N --topology SPEC".into(),
            ));
        }
        if !(1..=berth_core::gres::MAX_COUNT).contains(&l.count) || !(0.0..=1.0).contains(&l.share) {
            return Err(SimError::BadOption(format!(
                "--licenses must be 1 to {} and --license-jobs 0 to 1, got {} and {}",
                berth_core::gres::MAX_COUNT,
                l.count,
                l.share
            )));
        }
    }
    match &config.machine {
        MachineSpec::FromTrace if preempt => {
            // Preemption needs berth's placement: the same processors as single-core nodes.
            let (procs, description) = size_from_trace(trace)?;
            let nodes = u32::try_from(procs).map_err(|_| {
                SimError::BadOption(format!("{procs} nodes are too many for the topology-aware machine"))
            })?;
            let machine = ClusterMachine::new(nodes, parse_topology("core:1")?)?;
            let description = format!("{description}, topology-aware placement (for preemption)");
            replay::replay(machine, procs, description, trace, config)
        }
        MachineSpec::FromTrace => {
            let (procs, description) = size_from_trace(trace)?;
            replay::replay(PoolMachine::new(procs, 1)?, procs, description, trace, config)
        }
        MachineSpec::Pool { .. } if preempt => Err(SimError::BadOption(
            "preemption needs berth's topology-aware machine: give --nodes N --topology SPEC (or neither)".into(),
        )),
        MachineSpec::Pool { nodes, cores_per_node } => {
            let machine = PoolMachine::new(*nodes, *cores_per_node)?;
            let total = machine.total_cpus();
            let description = match cores_per_node {
                1 => format!("{nodes} single-core nodes"),
                c => format!("{nodes} nodes of {c} cores"),
            };
            replay::replay(machine, total, description, trace, config)
        }
        MachineSpec::Topology { nodes, spec } => {
            let mut topology = parse_topology(spec)?;
            let mut description = String::new();
            if let Some(g) = &config.gpus {
                check_gpus(g)?;
                topology
                    .add_emulated_gpus(g.per_numa)
                    .map_err(|e| SimError::BadOption(format!("--gpus-per-numa: {e}")))?;
                description =
                    format!(", {} GPUs a node; {:.0}% of the jobs GPU jobs", topology.gpus.len(), g.share * 100.0);
            }
            let mut machine = ClusterMachine::new(*nodes, topology)?;
            if let Some(l) = &config.licenses {
                machine.state.licenses = Licenses::new([(LICENSE.to_string(), l.count)].into_iter().collect());
                description.push_str(&format!(", {} licenses; {:.0}% of the jobs hold one", l.count, l.share * 100.0));
            }
            let total = machine.total_cpus();
            let description =
                format!("{nodes} nodes of \"{spec}\" ({total} cores{description}), topology-aware placement");
            replay::replay(machine, total, description, trace, config)
        }
    }
}

fn check_gpus(g: &GpuWorkload) -> Result<(), SimError> {
    if !(1..=berth_core::gpu::MAX_EMULATED_PER_NUMA).contains(&g.per_numa) {
        return Err(SimError::BadOption(format!(
            "--gpus-per-numa must be 1 to {}, got {}",
            berth_core::gpu::MAX_EMULATED_PER_NUMA,
            g.per_numa
        )));
    }
    if !(0.0..=1.0).contains(&g.share) {
        return Err(SimError::BadOption(format!("--gpu-jobs is a share from 0 to 1, got {}", g.share)));
    }
    Ok(())
}

/// The GPU side of a workload on the machine: which jobs, and the node shape their requests
/// follow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuJobs {
    pub share: f64,
    pub cores_per_node: u32,
    pub gpus_per_node: u32,
}

impl GpuJobs {
    /// Whether the job of trace id `id` is a GPU job: a fixed hash of the id (splitmix64)
    /// below the share.
    fn picks(&self, id: u64) -> bool {
        hashed(id) < self.share
    }

    /// The GPU request of a job of `procs` processors: `k` nodes of `c` cores (P over the
    /// node's cores, rounded up; P over k, rounded up), each with GPUs in proportion to `c`
    /// (at least one, at most the node's).
    /// Also its cores and GPUs in all.
    fn request(&self, procs: u32) -> (JobRequest, u64, u64) {
        let per = self.cores_per_node.max(1);
        let k = procs.div_ceil(per).max(1);
        let c = procs.div_ceil(k).max(1);
        let g =
            ((c as u64 * self.gpus_per_node as u64).div_ceil(per as u64) as u32).clamp(1, self.gpus_per_node.max(1));
        let mut request = JobRequest::simple(Shape::PerNode { nodes: k, cores_per_node: c }, 0);
        request.gpus_per_node = g;
        (request, k as u64 * c as u64, k as u64 * g as u64)
    }
}

/// A fixed number in [0, 1) for trace id `id` (splitmix64).
fn hashed(id: u64) -> f64 {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The license a licensed workload's jobs hold (`berth sim --licenses`).
pub(crate) const LICENSE: &str = "sim";

/// Whether the job of trace id `id` holds a license, given the share that do: a hash other
/// than the GPU jobs' (so the two shares are independent).
fn licensed(id: u64, share: f64) -> bool {
    hashed(id.rotate_left(32) ^ 0x5bd1_e995) < share
}

/// The default machine: `MaxProcs` (else `MaxNodes`) single-core nodes; for a trace with
/// neither header, as many as its largest job needs (said in the description).
fn size_from_trace(trace: &Trace) -> Result<(u64, String), SimError> {
    if let Some(p) = trace.max_procs {
        return Ok((p, format!("{p} single-core nodes (the trace's MaxProcs)")));
    }
    if let Some(n) = trace.max_nodes {
        return Ok((n, format!("{n} single-core nodes (the trace's MaxNodes)")));
    }
    match trace.jobs.iter().filter_map(|j| j.procs()).max() {
        Some(p) => Ok((p, format!("{p} single-core nodes (the largest job: the trace has no MaxProcs or MaxNodes)"))),
        None => Err(SimError::NoMachine(
            "the trace has no MaxProcs or MaxNodes header and no job with a processor count; pass --nodes N".into(),
        )),
    }
}

/// Classify the trace's jobs; `empty` is the machine with nothing running, to tell which
/// jobs could never fit.
pub(crate) fn workload<M: Machine>(
    trace: &Trace,
    empty: &M,
    estimate: EstimateSource,
    order: SubmitOrder,
    gpus: Option<GpuJobs>,
    license_share: Option<f64>,
) -> Workload {
    let mut skipped = Skipped::default();
    let mut fits_by_procs: HashMap<(u64, bool, bool), bool> = HashMap::new();
    let mut account_index: HashMap<String, usize> = HashMap::new();
    let mut accounts = vec![];
    let mut jobs = vec![];
    for j in &trace.jobs {
        let Some(run) = j.run_time.filter(|&r| r > 0.0) else {
            skipped.no_runtime += 1;
            continue;
        };
        let Some(procs) = j.procs() else {
            skipped.no_procs += 1;
            continue;
        };
        let Ok(cores) = u32::try_from(procs) else {
            skipped.too_large += 1;
            continue;
        };
        let gpu = gpus.filter(|g| g.picks(j.id));
        let (mut request, procs, gpus_held) = match gpu {
            Some(g) => g.request(cores),
            None => (JobRequest::simple(Shape::Total { cores, chunk: 1 }, 0), procs, 0),
        };
        if license_share.is_some_and(|share| licensed(j.id, share)) {
            request.licenses.insert(LICENSE.to_string(), 1);
        }
        let fits = *fits_by_procs
            .entry((procs, gpu.is_some(), !request.licenses.is_empty()))
            .or_insert_with(|| !matches!(empty.place(&request), Fit::Never(_)));
        if !fits {
            skipped.too_large += 1;
            continue;
        }
        let estimate = match (estimate, j.requested_time) {
            (EstimateSource::Request, Some(requested)) if requested > 0.0 => requested,
            _ => run,
        };
        let name = j.account();
        let next = accounts.len();
        let account = *account_index.entry(name.clone()).or_insert(next);
        if account == next {
            accounts.push(name);
        }
        jobs.push(SimJob { trace_id: j.id, submit: j.submit, run, estimate, procs, gpus: gpus_held, account, request });
    }
    // Stable: jobs submitted at the same time keep their trace order (or go by id).
    match order {
        SubmitOrder::Trace => jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit)),
        SubmitOrder::Id => jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit).then(a.trace_id.cmp(&b.trace_id))),
    }
    Workload { jobs, skipped, accounts }
}

/// The queue entry of job `index` of the workload.
pub(crate) fn queued(index: usize, job: &SimJob) -> QueuedJob {
    QueuedJob { id: berth_core::JobId(index as u64), request: job.request.clone(), walltime: job.estimate, held: false }
}

/// What happened to each job of the workload, by index.
pub(crate) struct Outcomes {
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    pub suspended: Vec<f64>,
    pub backfilled: Vec<bool>,
}

impl Outcomes {
    pub fn new(jobs: usize) -> Self {
        Outcomes {
            start: vec![f64::NAN; jobs],
            end: vec![f64::NAN; jobs],
            suspended: vec![0.0; jobs],
            backfilled: vec![false; jobs],
        }
    }
}

/// Assemble the result once every job has run.
pub(crate) fn finish(workload: &Workload, o: Outcomes, timeline: Vec<Sample>, header: metrics::Header) -> SimResult {
    let jobs: Vec<JobResult> = workload
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let wait = o.start[i] - j.submit;
            JobResult {
                id: j.trace_id,
                submit: j.submit,
                start: o.start[i],
                end: o.end[i],
                wait,
                run: j.run,
                procs: j.procs,
                estimate: j.estimate,
                bsld: metrics::bounded_slowdown(wait + o.suspended[i], j.run),
                backfilled: o.backfilled[i],
                suspended: o.suspended[i],
                gpus: j.gpus,
            }
        })
        .collect();
    let report = metrics::summarize(&jobs, workload.skipped, header);
    SimResult { report, jobs, timeline }
}
