//! `berth sim`: replay a Standard Workload Format trace through berth's scheduler on a virtual
//! clock (berth-sim). Needs no cluster: it reads the trace, simulates, prints the figures and
//! writes the per-job CSV and the plot if asked.

use anyhow::{anyhow, bail, Context, Result};
use berth_sim::{output, parse_policy, swf, MachineSpec, SimConfig};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Job trace in the Standard Workload Format (Parallel Workloads Archive).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Nodes of the simulated machine. Default: the trace's MaxProcs (else MaxNodes) single-core
    /// nodes, or the largest job's size for a trace with neither.
    #[arg(long, value_name = "N")]
    nodes: Option<u64>,
    /// Node topology for berth's topology-aware placement, e.g. "package:2 numa:2 core:8 pu:1"
    /// (levels package, numa, core, pu; counts per parent). Needs --nodes.
    #[arg(long, value_name = "SPEC", requires = "nodes")]
    topology: Option<String>,
    /// GPU workload: emulated GPUs on every NUMA node of --topology (1 to 16), and a share of
    /// the jobs made GPU jobs (--gpu-jobs).
    #[arg(long = "gpus-per-numa", value_name = "G", requires = "topology")]
    gpus_per_numa: Option<u32>,
    /// With --gpus-per-numa: the share of jobs (0 to 1, default 0.5) that ask for GPUs, chosen
    /// by their job id (the same jobs every run): whole nodes' worth of their processors, GPUs
    /// in proportion to their cores on each node.
    #[arg(long = "gpu-jobs", value_name = "F", requires = "gpus_per_numa")]
    gpu_jobs: Option<f64>,
    /// Licensed workload: N cluster-wide licenses (named `sim`) on the --topology machine, and
    /// a share of the jobs holding one each while they run (--license-jobs).
    #[arg(long, value_name = "N", requires = "topology")]
    licenses: Option<u32>,
    /// With --licenses: the share of jobs (0 to 1, default 0.5) that hold a license, chosen by
    /// their job id (the same jobs every run).
    #[arg(long = "license-jobs", value_name = "F", requires = "licenses")]
    license_jobs: Option<f64>,
    /// Cores per node of a plain core-counting machine (with --nodes; default 1).
    #[arg(long = "cores-per-node", value_name = "C", requires = "nodes", conflicts_with = "topology")]
    cores_per_node: Option<u32>,
    /// Backfill policy.
    #[arg(long, default_value = "easy", value_parser = ["fcfs", "easy", "conservative"])]
    policy: String,
    /// Preemption by suspension: large jobs may suspend smaller running ones to start (needs
    /// berth's topology-aware machine; without --nodes the trace's processors become single-core
    /// nodes under it).
    #[arg(long)]
    preempt: bool,
    /// With --preempt: jobs of more than this many CPUs are the ones that may suspend others.
    #[arg(long = "preempt-cpus", value_name = "N", default_value_t = 64, requires = "preempt")]
    preempt_cpus: u64,
    /// Order the queue by multifactor priority with fair share per group (else submit order).
    #[arg(long = "fair-share")]
    fair_share: bool,
    /// Walltime estimates for reservations: the requested time (field 9; the run time where the
    /// trace has none) or the actual run time.
    #[arg(long, default_value = "request", value_parser = ["request", "runtime"])]
    estimate: String,
    /// Order of jobs submitted at the same second: as in the trace (its line order), or by job
    /// id. Jobs join the queue in submit order either way; with FCFS priority (no
    /// --fair-share) this order is their priority order.
    #[arg(long, default_value = "trace", value_parser = ["trace", "id"])]
    order: String,
    /// Most reservations one scheduling pass computes (default: every waiting job).
    #[arg(long = "max-reservations", value_name = "N")]
    max_reservations: Option<usize>,
    /// Write one line per simulated job: id, submit, start, end, wait, run, procs, estimate,
    /// bsld, backfilled, suspended.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write an SVG plot of utilization and queue length over time.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

pub fn run(json: bool, args: SimArgs) -> Result<i32> {
    let config = config(&args)?;
    let text = std::fs::read_to_string(&args.trace).with_context(|| {
        format!("cannot read the trace {}; give an SWF file with --trace FILE", args.trace.display())
    })?;
    let trace = swf::parse(&text).map_err(|e| anyhow!("{}: {e}", args.trace.display()))?;
    let started = Instant::now();
    let mut result = berth_sim::simulate(&trace, &config).map_err(|e| anyhow!(e))?;
    result.report.set_elapsed(started.elapsed());
    if let Some(path) = &args.csv {
        write(path, &output::jobs_csv(&result.jobs), "per-job CSV")?;
    }
    if let Some(path) = &args.plot {
        write(path, &output::plot_svg(&result.timeline, &result.report), "plot")?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&result.report)?);
    } else {
        print!("{}", result.report.table());
        for (what, path) in [("per-job CSV", &args.csv), ("plot", &args.plot)] {
            if let Some(p) = path {
                println!("{what} written to {}", p.display());
            }
        }
    }
    Ok(0)
}

fn config(args: &SimArgs) -> Result<SimConfig> {
    let machine = match (args.nodes, &args.topology) {
        (None, _) => MachineSpec::FromTrace,
        (Some(0), _) => bail!("--nodes must be at least 1"),
        (Some(n), Some(spec)) => MachineSpec::Topology { nodes: nodes_u32(n)?, spec: spec.clone() },
        (Some(_), None) if args.preempt && args.cores_per_node.is_some() => {
            bail!("--preempt needs berth's topology-aware machine: use --topology instead of --cores-per-node")
        }
        (Some(n), None) if args.preempt => MachineSpec::Topology { nodes: nodes_u32(n)?, spec: "core:1".into() },
        (Some(n), None) => MachineSpec::Pool { nodes: n, cores_per_node: args.cores_per_node.unwrap_or(1) },
    };
    Ok(SimConfig {
        machine,
        policy: parse_policy(&args.policy).map_err(|e| anyhow!(e))?,
        estimate: args.estimate.parse().map_err(|e: berth_sim::SimError| anyhow!(e))?,
        order: args.order.parse().map_err(|e: berth_sim::SimError| anyhow!(e))?,
        fair_share: args.fair_share,
        preempt: args.preempt.then(|| berth_sim::preempt_config(args.preempt_cpus)),
        max_reservations: args.max_reservations.unwrap_or(usize::MAX),
        every_pass: false,
        gpus: args
            .gpus_per_numa
            .map(|per_numa| berth_sim::GpuWorkload { per_numa, share: args.gpu_jobs.unwrap_or(0.5) }),
        licenses: args
            .licenses
            .map(|count| berth_sim::LicenseWorkload { count, share: args.license_jobs.unwrap_or(0.5) }),
    })
}

fn nodes_u32(n: u64) -> Result<u32> {
    u32::try_from(n).map_err(|_| anyhow!("--nodes {n} is too many for the topology-aware machine"))
}

fn write(path: &Path, text: &str, what: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write the {what} to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::sched::backfill::BackfillPolicy;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn parse(args: &[&str]) -> Result<SimConfig> {
        let cmd = Cmd::try_parse_from(std::iter::once("sim").chain(args.iter().copied()))?;
        config(&cmd.sim)
    }

    #[test]
    fn defaults_and_machines() {
        let c = parse(&["--trace", "t.swf"]).unwrap();
        assert_eq!((c.machine, c.policy, c.fair_share), (MachineSpec::FromTrace, BackfillPolicy::Easy, false));
        let c = parse(&["--trace", "t.swf", "--nodes", "4", "--cores-per-node", "8", "--policy", "fcfs"]).unwrap();
        assert_eq!((c.machine, c.policy), (MachineSpec::Pool { nodes: 4, cores_per_node: 8 }, BackfillPolicy::Fcfs));
        let c = parse(&["--trace", "t.swf", "--nodes", "2", "--topology", "core:4", "--estimate", "runtime"]).unwrap();
        assert_eq!(c.machine, MachineSpec::Topology { nodes: 2, spec: "core:4".into() });
        assert_eq!(c.estimate, berth_sim::EstimateSource::Runtime);
        assert_eq!(c.order, berth_sim::SubmitOrder::Trace);
        let c = parse(&["--trace", "t.swf", "--order", "id"]).unwrap();
        assert_eq!(c.order, berth_sim::SubmitOrder::Id);
        assert!(parse(&["--trace", "t.swf", "--order", "submit"]).is_err());
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(parse(&["--trace", "t.swf", "--topology", "core:4"]).is_err(), "--topology needs --nodes");
        assert!(parse(&["--trace", "t.swf", "--policy", "sjf"]).is_err());
        assert!(parse(&["--trace", "t.swf", "--nodes", "0"]).is_err());
        assert!(parse(&["--nodes", "2"]).is_err(), "--trace is required");
        assert!(parse(&["--trace", "t.swf", "--preempt-cpus", "8"]).is_err(), "needs --preempt");
        assert!(parse(&["--trace", "t.swf", "--preempt", "--nodes", "2", "--cores-per-node", "4"]).is_err());
        assert!(parse(&["--trace", "t.swf", "--gpus-per-numa", "1"]).is_err(), "needs --topology");
        assert!(parse(&["--trace", "t.swf", "--gpu-jobs", "0.5"]).is_err(), "needs --gpus-per-numa");
    }

    #[test]
    fn gpu_workload() {
        let c = parse(&["--trace", "t.swf", "--nodes", "2", "--topology", "numa:2 core:4", "--gpus-per-numa", "1"]);
        assert_eq!(c.unwrap().gpus, Some(berth_sim::GpuWorkload { per_numa: 1, share: 0.5 }));
        let base = ["--trace", "t.swf", "--nodes", "2", "--topology", "numa:2 core:4", "--gpus-per-numa", "2"];
        let c = parse(&[&base[..], &["--gpu-jobs", "0.25"]].concat()).unwrap();
        assert_eq!(c.gpus, Some(berth_sim::GpuWorkload { per_numa: 2, share: 0.25 }));
        assert_eq!(parse(&["--trace", "t.swf"]).unwrap().gpus, None);
    }

    #[test]
    fn licensed_workload() {
        let base = ["--trace", "t.swf", "--nodes", "2", "--topology", "core:4", "--licenses", "3"];
        assert_eq!(parse(&base).unwrap().licenses, Some(berth_sim::LicenseWorkload { count: 3, share: 0.5 }));
        let c = parse(&[&base[..], &["--license-jobs", "0.2"]].concat()).unwrap();
        assert_eq!(c.licenses, Some(berth_sim::LicenseWorkload { count: 3, share: 0.2 }));
        assert!(parse(&["--trace", "t.swf", "--licenses", "3"]).is_err(), "needs --topology");
        assert!(parse(&["--trace", "t.swf", "--license-jobs", "0.5"]).is_err(), "needs --licenses");
        assert_eq!(parse(&["--trace", "t.swf"]).unwrap().licenses, None);
    }

    #[test]
    fn preemption_settings() {
        let c = parse(&["--trace", "t.swf", "--preempt"]).unwrap();
        assert_eq!(c.preempt, Some(berth_sim::preempt_config(64)));
        assert_eq!(c.machine, MachineSpec::FromTrace);
        let c = parse(&["--trace", "t.swf", "--preempt", "--preempt-cpus", "16", "--nodes", "8"]).unwrap();
        assert_eq!(c.preempt, Some(berth_sim::preempt_config(16)));
        assert_eq!(c.machine, MachineSpec::Topology { nodes: 8, spec: "core:1".into() });
    }
}
