//! `berth-bench easy-oracle`: berth's EASY against textbook EASY at sizes too large for a
//! debug-mode test (issue 17 item 8). The oracle is `crates/sim/tests/textbook/mod.rs`, the
//! one `tests/textbook_easy.rs` uses (included here, not copied). Processor model: the
//! trace's `MaxProcs` single-core nodes (the pool). One line per run: jobs, berth and
//! textbook mean wait and utilization, how many jobs start at other times, and the seconds
//! each scheduler took.
//!
//! Runs: the three traces of `crates/sim/tests/data` with exact and requested estimates;
//! lublin_256 made 100,000 jobs long (stretch 1 and 1.25, as `berth-bench sim --jobs`); and
//! `--random N` (50) random traces of 3,000 jobs on 64-1,024 processors, both estimates.

#[path = "../../crates/sim/tests/textbook/mod.rs"]
mod textbook;

use anyhow::{bail, Context, Result};
use berth_sim::swf::{self, Trace};
use berth_sim::{EstimateSource, SimConfig};
use std::path::PathBuf;
use std::time::Instant;

struct Figures {
    mean_wait: f64,
    utilization: f64,
}

fn figures(jobs: &[textbook::Job], starts: &[f64], p: u64) -> Figures {
    let n = jobs.len().max(1) as f64;
    let mean_wait = jobs.iter().zip(starts).map(|(j, s)| s - j.submit).sum::<f64>() / n;
    let first = jobs.iter().map(|j| j.submit).fold(f64::INFINITY, f64::min);
    let last = jobs.iter().zip(starts).map(|(j, s)| s + j.run).fold(f64::NEG_INFINITY, f64::max);
    let work: f64 = jobs.iter().map(|j| j.procs as f64 * j.run).sum();
    Figures { mean_wait, utilization: work / (p as f64 * (last - first)) }
}

/// Both schedulers on `trace`; prints one line, returns whether berth did at least as well.
fn compare(name: &str, trace: &Trace, estimate: EstimateSource) -> Result<bool> {
    let config = SimConfig { estimate, ..SimConfig::default() };
    let t = Instant::now();
    let result = berth_sim::simulate(trace, &config)?;
    let berth_secs = t.elapsed().as_secs_f64();
    let p = result.report.machine_procs;
    let jobs: Vec<textbook::Job> = result
        .jobs
        .iter()
        .map(|j| textbook::Job { submit: j.submit, run: j.run, estimate: j.estimate, procs: j.procs })
        .collect();
    let berth_starts: Vec<f64> = result.jobs.iter().map(|j| j.start).collect();
    let t = Instant::now();
    let oracle_starts = textbook::easy(&jobs, p);
    let oracle_secs = t.elapsed().as_secs_f64();
    let (b, o) = (figures(&jobs, &berth_starts, p), figures(&jobs, &oracle_starts, p));
    let differ = berth_starts.iter().zip(&oracle_starts).filter(|(a, b)| a != b).count();
    println!(
        "| {name} | {estimate:?} | {p} | {} | {:.1} | {:.1} | {:+.2}% | {:.5} | {:.5} | {differ} | {berth_secs:.3} | {oracle_secs:.3} |",
        jobs.len(),
        b.mean_wait,
        o.mean_wait,
        (b.mean_wait / o.mean_wait - 1.0) * 100.0,
        b.utilization,
        o.utilization,
    );
    let tol = 1e-9;
    Ok(b.mean_wait <= o.mean_wait * (1.0 + tol) && b.utilization >= o.utilization * (1.0 - tol))
}

pub fn run(args: &[String]) -> Result<()> {
    let mut random = 50u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--random" => random = it.next().context("--random wants a value")?.parse().context("--random")?,
            _ => bail!("usage: berth-bench easy-oracle [--random N]"),
        }
    }
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates/sim/tests/data");
    println!("| trace | estimates | processors | jobs | berth mean wait (s) | textbook mean wait (s) | berth vs textbook | berth utilization | textbook utilization | jobs starting at other times | berth s | textbook s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worse = vec![];
    let both = [EstimateSource::Runtime, EstimateSource::Request];
    for name in ["lublin_256.swf", "accasim-ricc-25.swf", "easy_mediumWL_smallPF.swf"] {
        let path = data.join(name);
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        let trace = swf::parse(&text)?;
        for estimate in both {
            if !compare(name, &trace, estimate)? {
                worse.push(format!("{name} {estimate:?}"));
            }
        }
        if name == "lublin_256.swf" {
            for stretch in [1.0, 1.25] {
                let long = crate::sim::lengthen(&trace, 100_000, stretch);
                let label = format!("lublin_256 x10 (100k), stretch {stretch}");
                if !compare(&label, &long, EstimateSource::Runtime)? {
                    worse.push(label);
                }
            }
        }
    }
    for seed in 0..random {
        let p = [64, 128, 256, 1024][seed as usize % 4];
        let trace = swf::parse(&textbook::random_trace(1000 + seed, p, 3000))?;
        for estimate in both {
            if !compare(&format!("random {seed}"), &trace, estimate)? {
                worse.push(format!("random {seed} {estimate:?}"));
            }
        }
    }
    if worse.is_empty() {
        eprintln!("berth's EASY did at least as well as textbook EASY on every run");
        Ok(())
    } else {
        bail!("berth's EASY did worse than textbook EASY on: {}", worse.join(", "))
    }
}
