//! Fuzz tests of the agent's PMI servers: the PMI-1 line parser, the PMI-2 message codec, and
//! whole sessions of a rank against the real server over a socketpair (barriers answered as the
//! shepherd's tree would). Targets are in `berth_agent::fuzz` (feature `fuzzing`), shared with
//! `berth-bench fuzz`. `BERTH_FUZZ_CASES=20000 cargo test -p berth-agent --test fuzz_pmi` runs
//! more cases.

use berth_agent::fuzz;
use berth_core::fuzz::{cases, run, Target};

const CASES: u32 = 200;

fn target(name: &str) -> Target {
    fuzz::targets().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no fuzz target {name}"))
}

macro_rules! fuzz_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run(&target($name), cases(CASES));
            }
        )*

        #[test]
        fn every_target_has_a_test() {
            let tested = [$($name),*];
            for t in fuzz::targets() {
                assert!(tested.contains(&t.name), "no test runs fuzz target {}", t.name);
            }
        }
    };
}

fuzz_tests! {
    pmi1_line => "agent/pmi1_line",
    pmi2_message => "agent/pmi2_message",
    pmi1_session => "agent/pmi1_session",
    pmi2_session => "agent/pmi2_session",
    process_mapping => "agent/process_mapping",
    hwloc_synthetic => "agent/hwloc_synthetic",
}

// Regression tests: the exact inputs the fuzzers failed on (see RELIABILITY.md, "Fuzzing").

/// hwloc reads synthetic counts with strtoul(.., 0), so `0x10000` and `+65536` are 65536; the
/// agent's PU bound read them as 0 or not at all, and let hwloc build 65536 PUs or more (tens
/// of seconds, and unbounded with larger counts) past the 32768-PU limit.
#[test]
fn regression_synthetic_hex_and_signed_counts_are_bounded() {
    use berth_agent::hwtopo::{load, TopologyError, TopologySource};
    for spec in ["pu:0x10000", "l3:64 pack:2 pu:0x100(indexes=0,2,1,3) core:2", "pu:+65536", "pack:2 core:0X4000 pu:2"]
    {
        (target("agent/hwloc_synthetic").check)(spec.as_bytes());
        let err = load(&TopologySource::Synthetic(spec.into())).unwrap_err();
        assert!(matches!(err, TopologyError::SyntheticTooLarge { .. }), "{spec}: {err:?}");
    }
    assert_eq!(load(&TopologySource::Synthetic("package:0x2 core:+2 pu:2".into())).unwrap().pu_count(), 8);
}

/// Found by `berth-bench fuzz` (a case over 60 s): in `3(indexes=pu:0,1)` the PU bound read
/// the count after the attribute's `:` (0), so the bound was 0 and hwloc built 65536 groups.
/// And within the PU limit, one wide level keeps hwloc busy for minutes (`core:8192 pu:2`
/// 4.5 min, `core:16384 pu:2` over 15 in hwloc-info): a level may hold at most 1024 objects.
#[test]
fn regression_synthetic_attributes_and_wide_levels_are_bounded() {
    use berth_agent::hwtopo::{load, TopologyError, TopologySource};
    let spec = "group:0x10000 3(indexes=pu:0,1)";
    (target("agent/hwloc_synthetic").check)(spec.as_bytes());
    let err = load(&TopologySource::Synthetic(spec.into())).unwrap_err();
    assert!(matches!(err, TopologyError::SyntheticTooLarge { pus: 196608, .. }), "{err:?}");
    for spec in ["core:16384 pu:2", "core:8192 pu:2", "pack:2 core:0x800 pu:2", "2048 2"] {
        (target("agent/hwloc_synthetic").check)(spec.as_bytes());
        let err = load(&TopologySource::Synthetic(spec.into())).unwrap_err();
        assert!(matches!(err, TopologyError::SyntheticTooWide { count: 2048.., .. }), "{spec}: {err:?}");
    }
    assert_eq!(load(&TopologySource::Synthetic("core:1024 pu:2".into())).unwrap().pu_count(), 2048);
    assert_eq!(load(&TopologySource::Synthetic("2(indexes=pu:1,0) 2".into())).unwrap().pu_count(), 4);
}
