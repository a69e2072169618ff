//! `berth-bench sim`: how fast the trace simulator (berth-sim) replays a trace, in simulated
//! jobs per wall-clock second. No cluster: berth-sim and berth-core alone, on this thread.
//!
//! Default trace: lublin_256.swf (10,000 jobs of the Lublin & Feitelson model on 256
//! processors, from DIR-LAB/deep-batch-scheduler; vendored in crates/sim/tests/data). With
//! `--jobs N` the trace is made N jobs long, deterministically, by concatenating copies of it,
//! each shifted to start after the previous copy's last submission (submit times multiplied by
//! `--stretch X` first, X > 1 lowering the offered load). Options: `--trace FILE`, `--jobs N`,
//! `--stretch X` (1), `--policy fcfs|easy|conservative|all` (all), `--repeats R` (3; the best
//! and the median are reported), `--fair-share`, `--preempt` (jobs of more than 64 CPUs may
//! suspend smaller ones; on the topology-aware machine), `--nodes N` (N single-core nodes) or
//! `--nodes N --topology SPEC` (N nodes of that topology under berth's placement), `--json`
//! (JSON lines on stdout).

use anyhow::{bail, Context, Result};
use berth_core::sched::backfill::BackfillPolicy;
use berth_sim::swf::{self, Trace};
use berth_sim::{parse_policy, policy_name, simulate, MachineSpec, Sample, SimConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Opts {
    trace: PathBuf,
    jobs: Option<usize>,
    stretch: f64,
    policies: Vec<BackfillPolicy>,
    repeats: usize,
    fair_share: bool,
    /// `--preempt`: jobs of more than 64 CPUs may suspend smaller ones.
    preempt: bool,
    /// `--nodes N [--topology SPEC]`: the machine (default: the trace's).
    machine: MachineSpec,
    json: bool,
}

const USAGE: &str = "usage: berth-bench sim [--trace FILE] [--jobs N] [--stretch X] \
                     [--policy fcfs|easy|conservative|all] [--repeats R] [--fair-share] [--preempt] \
                     [--nodes N [--topology SPEC]] [--json]";

fn parse_opts(args: &[String]) -> Result<Opts> {
    let default_trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates/sim/tests/data/lublin_256.swf");
    let all = vec![BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative];
    let mut o = Opts {
        trace: default_trace,
        jobs: None,
        stretch: 1.0,
        policies: all.clone(),
        repeats: 3,
        fair_share: false,
        preempt: false,
        machine: MachineSpec::FromTrace,
        json: false,
    };
    let (mut nodes, mut topology) = (None::<u64>, None::<String>);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} wants a value"));
        match a.as_str() {
            "--trace" => o.trace = val()?.into(),
            "--jobs" => o.jobs = Some(val()?.parse().context("--jobs")?),
            "--stretch" => o.stretch = val()?.parse().context("--stretch")?,
            "--repeats" => o.repeats = val()?.parse().context("--repeats")?,
            "--policy" => {
                o.policies = match val()?.as_str() {
                    "all" => all.clone(),
                    p => vec![parse_policy(p)?],
                }
            }
            "--fair-share" => o.fair_share = true,
            "--preempt" => o.preempt = true,
            "--nodes" => nodes = Some(val()?.parse().context("--nodes")?),
            "--topology" => topology = Some(val()?.clone()),
            "--json" => o.json = true,
            _ => bail!(USAGE),
        }
    }
    o.machine = match (nodes, topology) {
        (None, None) => MachineSpec::FromTrace,
        (Some(n), None) => MachineSpec::Pool { nodes: n, cores_per_node: 1 },
        (Some(n), Some(spec)) => MachineSpec::Topology { nodes: u32::try_from(n).context("--nodes")?, spec },
        (None, Some(_)) => bail!("--topology needs --nodes"),
    };
    if o.repeats == 0 || o.jobs == Some(0) || o.stretch.is_nan() || o.stretch <= 0.0 {
        bail!("--repeats and --jobs must be positive and --stretch above 0");
    }
    Ok(o)
}

/// `base` repeated (with shifted submit times and fresh ids) until it has `jobs` jobs.
pub(crate) fn lengthen(base: &Trace, jobs: usize, stretch: f64) -> Trace {
    let first = base.jobs.iter().map(|j| j.submit).fold(f64::INFINITY, f64::min);
    let last = base.jobs.iter().map(|j| j.submit).fold(f64::NEG_INFINITY, f64::max);
    let period = (last - first) * stretch + 1.0;
    let mut out = Trace { jobs: Vec::with_capacity(jobs), ..base.clone() };
    for (n, j) in base.jobs.iter().cycle().take(jobs).enumerate() {
        let copy = (n / base.jobs.len()) as f64;
        let mut j = j.clone();
        j.id = n as u64 + 1;
        j.submit = (j.submit - first) * stretch + copy * period;
        out.jobs.push(j);
    }
    out
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse_opts(args)?;
    let text =
        std::fs::read_to_string(&o.trace).with_context(|| format!("cannot read the trace {}", o.trace.display()))?;
    let t0 = Instant::now();
    let base = swf::parse(&text).with_context(|| o.trace.display().to_string())?;
    let parse_secs = t0.elapsed().as_secs_f64();
    let trace = match o.jobs {
        Some(n) => lengthen(&base, n, o.stretch),
        None if o.stretch != 1.0 => lengthen(&base, base.jobs.len(), o.stretch),
        None => base,
    };
    let name = o.trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    eprintln!("{name}: {} jobs (parsed the base trace in {parse_secs:.3} s), stretch {}", trace.jobs.len(), o.stretch);
    for policy in &o.policies {
        let config = SimConfig {
            policy: *policy,
            fair_share: o.fair_share,
            machine: o.machine.clone(),
            preempt: o.preempt.then(|| berth_sim::preempt_config(64)),
            ..SimConfig::default()
        };
        let mut times: Vec<Duration> = vec![];
        let mut report = None;
        let mut queue = (0.0, 0);
        for _ in 0..o.repeats {
            let t = Instant::now();
            let result = simulate(&trace, &config)?;
            times.push(t.elapsed());
            queue = queue_lengths(&result.timeline);
            report = Some(result.report);
        }
        let Some(mut report) = report else { continue };
        times.sort();
        let (best, median) = (times[0], times[times.len() / 2]);
        report.set_elapsed(best);
        let jobs = report.jobs as f64;
        let line = serde_json::json!({
            "bench": "sim", "trace": name, "trace_jobs": trace.jobs.len(), "stretch": o.stretch,
            "policy": policy_name(*policy), "fair_share": o.fair_share, "preempt": o.preempt,
            "preemptions": report.preemptions, "machine": report.machine,
            "jobs": report.jobs, "passes": report.passes,
            "best_seconds": best.as_secs_f64(), "median_seconds": median.as_secs_f64(),
            "jobs_per_second": jobs / best.as_secs_f64(), "jobs_per_second_median": jobs / median.as_secs_f64(),
            "mean_queue": queue.0, "max_queue": queue.1,
            "utilization": report.utilization, "mean_wait": report.mean_wait, "mean_bsld": report.mean_bsld,
        });
        if o.json {
            println!("{line}");
        }
        eprintln!(
            "{:<12} {:>7} jobs  {:>6} passes  best {:>8.3} s ({:>9.0} jobs/s)  median {:>8.3} s ({:>9.0} jobs/s)  util {:.3}  mean wait {:.0} s  queue mean {:.0} max {}",
            policy_name(*policy),
            report.jobs,
            report.passes,
            best.as_secs_f64(),
            jobs / best.as_secs_f64(),
            median.as_secs_f64(),
            jobs / median.as_secs_f64(),
            report.utilization,
            report.mean_wait,
            queue.0,
            queue.1
        );
    }
    Ok(())
}

/// Queue length over the run: time-weighted mean, and most.
fn queue_lengths(timeline: &[Sample]) -> (f64, usize) {
    let most = timeline.iter().map(|s| s.queued).max().unwrap_or(0);
    let span = match (timeline.first(), timeline.last()) {
        (Some(a), Some(b)) if b.time > a.time => b.time - a.time,
        _ => return (0.0, most),
    };
    let area: f64 = timeline.windows(2).map(|w| w[0].queued as f64 * (w[1].time - w[0].time)).sum();
    (area / span, most)
}
