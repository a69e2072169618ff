//! Golden results: every trace of `tests/data` under fcfs, easy and conservative, on the
//! default machine (the trace's MaxProcs / MaxNodes single-core nodes, else its largest job)
//! with the default estimates, compared with `tests/golden.json`.
//!
//! The traces (see `tests/data/README.md`): `lublin_256.swf`, 10,000 jobs of the Lublin &
//! Feitelson workload model as published in DIR-LAB/deep-batch-scheduler; `accasim-ricc-25.swf`,
//! 25 jobs of the RIKEN RICC trace (Parallel Workloads Archive) from cgalleguillosm/accasim's
//! tests; `easy_mediumWL_smallPF.swf`, 800 synthetic jobs from oar-team/evalys's tests (Batsim).
//!
//! When a scheduler change moves the figures on purpose, regenerate with
//! `cargo test --release -p berth-sim --test golden -- --ignored regenerate_golden` and review
//! the diff of `golden.json` (waits and slowdowns should move the way the change intends).

use berth_core::sched::backfill::BackfillPolicy;
use berth_sim::{policy_name, simulate_text, SimConfig, SimReport};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

const TRACES: [&str; 3] = ["lublin_256.swf", "accasim-ricc-25.swf", "easy_mediumWL_smallPF.swf"];
const POLICIES: [BackfillPolicy; 3] = [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative];
/// Relative tolerance: the simulation is deterministic, this only absorbs float formatting.
const TOLERANCE: f64 = 1e-9;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Golden {
    trace: String,
    policy: String,
    jobs: usize,
    utilization: f64,
    mean_wait: f64,
    median_wait: f64,
    mean_bsld: f64,
    makespan: f64,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn simulate(trace: &str, policy: BackfillPolicy) -> SimReport {
    let text = std::fs::read_to_string(dir().join("data").join(trace)).unwrap();
    simulate_text(&text, &SimConfig { policy, ..SimConfig::default() }).unwrap().report
}

fn golden(trace: &str, r: &SimReport) -> Golden {
    Golden {
        trace: trace.into(),
        policy: policy_name(r.policy).into(),
        jobs: r.jobs,
        utilization: r.utilization,
        mean_wait: r.mean_wait,
        median_wait: r.median_wait,
        mean_bsld: r.mean_bsld,
        makespan: r.makespan,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE * a.abs().max(b.abs()).max(1.0)
}

fn golden_file() -> Vec<Golden> {
    let text = std::fs::read_to_string(dir().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Simulate `trace` under each of `policies` and compare with golden.json.
fn check(trace: &str, policies: &[BackfillPolicy]) {
    let reports: Vec<SimReport> = policies.iter().map(|&p| simulate(trace, p)).collect();
    compare(trace, &reports);
}

fn compare(trace: &str, reports: &[SimReport]) {
    let want = golden_file();
    let mut wrong = vec![];
    for report in reports {
        let g = golden(trace, report);
        let Some(w) = want.iter().find(|w| w.trace == g.trace && w.policy == g.policy) else {
            panic!("golden.json has no entry for {trace} {}; regenerate it (see the top of this file)", g.policy);
        };
        let same = w.jobs == g.jobs
            && close(w.utilization, g.utilization)
            && close(w.mean_wait, g.mean_wait)
            && close(w.median_wait, g.median_wait)
            && close(w.mean_bsld, g.mean_bsld)
            && close(w.makespan, g.makespan);
        if !same {
            wrong.push(format!("{trace} {}:\n  want {w:?}\n  got  {g:?}", g.policy));
        }
    }
    assert!(wrong.is_empty(), "results differ from golden.json:\n{}", wrong.join("\n"));
}

// One test per expensive run, so that they run in parallel.
#[test]
fn lublin_fcfs() {
    check("lublin_256.swf", &[BackfillPolicy::Fcfs]);
}

/// Also a sanity check: backfill lets jobs start sooner than strict order on this trace.
#[test]
fn lublin_easy() {
    let easy = simulate("lublin_256.swf", BackfillPolicy::Easy);
    compare("lublin_256.swf", std::slice::from_ref(&easy));
    let fcfs = simulate("lublin_256.swf", BackfillPolicy::Fcfs);
    assert!(easy.mean_wait <= fcfs.mean_wait, "easy {} fcfs {}", easy.mean_wait, fcfs.mean_wait);
    assert!(easy.backfilled > 0);
    assert_eq!(fcfs.backfilled, 0);
}

#[test]
fn lublin_conservative() {
    check("lublin_256.swf", &[BackfillPolicy::Conservative]);
}

#[test]
fn ricc_25() {
    check("accasim-ricc-25.swf", &POLICIES);
}

#[test]
fn evalys_medium() {
    check("easy_mediumWL_smallPF.swf", &POLICIES);
}

/// Rewrites golden.json from the current scheduler.
#[test]
#[ignore = "regenerates golden.json; run on purpose"]
fn regenerate_golden() {
    let mut all = vec![];
    for trace in TRACES {
        for policy in POLICIES {
            all.push(golden(trace, &simulate(trace, policy)));
        }
    }
    std::fs::write(dir().join("golden.json"), serde_json::to_string_pretty(&all).unwrap() + "\n").unwrap();
    // Read back: equal up to the last digit (serde_json may parse a float one ulp off).
    let back = golden_file();
    assert_eq!(back.len(), all.len());
    for (b, a) in back.iter().zip(&all) {
        let fields = |g: &Golden| [g.utilization, g.mean_wait, g.median_wait, g.mean_bsld, g.makespan];
        let same = fields(b).iter().zip(fields(a)).all(|(x, y)| close(*x, y));
        assert!(same && (&b.trace, &b.policy, b.jobs) == (&a.trace, &a.policy, a.jobs), "{b:?} != {a:?}");
    }
}
