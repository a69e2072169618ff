//! Fuzz tests of the simulator's readers: Standard Workload Format traces and `--topology`
//! strings. Targets are in `berth_sim::fuzz` (feature `fuzzing`), shared with `berth-bench
//! fuzz`. `BERTH_FUZZ_CASES=100000 cargo test -p berth-sim --test fuzz_swf` runs more cases.

use berth_core::fuzz::{cases, run, Target};
use berth_sim::fuzz;

const CASES: u32 = 300;

fn target(name: &str) -> Target {
    fuzz::targets().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no fuzz target {name}"))
}

#[test]
fn swf() {
    run(&target("sim/swf"), cases(CASES));
}

#[test]
fn topology() {
    run(&target("sim/topology"), cases(CASES));
}

#[test]
fn every_target_has_a_test() {
    for t in fuzz::targets() {
        assert!(["sim/swf", "sim/topology"].contains(&t.name), "no test runs fuzz target {}", t.name);
    }
}

// Regression tests: the exact inputs the fuzzers failed on (see RELIABILITY.md, "Fuzzing").

/// Level counts multiplied in u64 overflowed: a panic in debug builds; in release
/// `package:65536 numa:65536 core:65536 pu:65536` wrapped to 0 PUs, passed the 4096-PU limit
/// and went on to build 2^64 PUs.
#[test]
fn regression_topology_counts_overflow() {
    for spec in ["package:4294967295 numa:4294967295 core:2", "package:65536 numa:65536 core:65536 pu:65536"] {
        (target("sim/topology").check)(spec.as_bytes());
        let e = berth_sim::machine::parse_topology(spec).unwrap_err();
        assert!(e.to_string().contains("at most 4096"), "{e}");
    }
}
