//! Fuzz tests of berth-core's parsers: `#BERTH` directives and submission options, sizes and
//! durations, CPU lists, binding strategies, host lists, topologies from the wire. The
//! generators and properties are in `berth_core::fuzz` (feature `fuzzing`), shared with
//! `berth-bench fuzz`. `BERTH_FUZZ_CASES=100000 cargo test -p berth-core --test fuzz_parsers`
//! runs more cases; the regression tests at the end hold the exact inputs that failed once.

use berth_core::fuzz::{self, Target};

/// Cases per target by default: enough to exercise every generator, small enough for CI.
const CASES: u32 = 300;

fn target(name: &str) -> Target {
    fuzz::targets().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no fuzz target {name}"))
}

macro_rules! fuzz_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                fuzz::run(&target($name), fuzz::cases(CASES));
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
    directives => "core/directives",
    submit_option => "core/submit_option",
    units => "core/units",
    cpu_list => "core/cpu_list",
    binding => "core/binding",
    hostlist => "core/hostlist",
    topology => "core/topology",
    small_parsers => "core/small_parsers",
}

// Regression tests: the exact inputs the fuzzers failed on (see RELIABILITY.md, "Fuzzing").

fn check(name: &str, input: &[u8]) {
    (target(name).check)(input)
}

/// A registered topology whose NUMA memory adds up beyond u64 made `memory_bytes()` (the
/// controller's node view) overflow: a panic in debug builds, a wrong total in release.
#[test]
fn regression_topology_memory_overflow() {
    let input = br#"{"packages":[{"os_index":0}],"numa_nodes":[{"os_index":0,"memory_bytes":9223372036854775808,"cpus":"0"},{"os_index":1,"memory_bytes":9223372036854775808,"cpus":"1"}],"cores":[{"package":0,"numa":0,"pus":[0]},{"package":0,"numa":1,"pus":[1]}]}"#;
    check("core/topology", input);
    let topo: berth_core::topology::Topology = serde_json::from_slice(input).unwrap();
    assert!(topo.validate().unwrap_err().to_string().contains("memory"));
}

/// A PU (or NUMA node) number near u32::MAX made validation (and `mems_for`) build a bitmap
/// of up to 512 MB from a 100-byte registration.
#[test]
fn regression_topology_huge_os_index() {
    let pu = br#"{"packages":[{"os_index":0}],"numa_nodes":[],"cores":[{"package":0,"numa":null,"pus":[85369285],"kind":2168980203}],"disallowed":"6,96"}"#;
    check("core/topology", pu);
    let numa = br#"{"packages":[{"os_index":0}],"numa_nodes":[{"os_index":4294967295,"memory_bytes":1,"cpus":"0"}],"cores":[{"package":0,"numa":0,"pus":[4294967295]}]}"#;
    check("core/topology", numa);
    for input in [&pu[..], &numa[..]] {
        let topo: berth_core::topology::Topology = serde_json::from_slice(input).unwrap();
        assert!(topo.validate().is_err(), "{}", String::from_utf8_lossy(input));
    }
}

/// `D-HH:MM:SS` and `MM:SS` walltimes beyond u64 seconds overflowed (`days * 86400`,
/// `m * 60`): a panic in debug builds, a wrapped (short) walltime in release.
#[test]
fn regression_duration_overflow() {
    for input in ["9007199254740993-0", "18446744073709551615:0", "5124095576030432:0:0", "213503982334602-0:0:0"] {
        check("core/units", input.as_bytes());
        assert!(berth_core::units::parse_duration_secs(input).is_err(), "{input}");
    }
    assert_eq!(berth_core::units::parse_duration_secs("213503982334601-0:0:0"), Ok(213503982334601 * 86400));
    let mut o = berth_core::directives::SubmitOptions::default();
    assert!(o.set("walltime", "9007199254740993-0").is_err());
}

/// `0-1048575` inserted a million bits one at a time, and a list repeating it did so for
/// every repeat: a 1 MB reservation body (`node_list[].cpus`) would keep the controller busy
/// for hours.
#[test]
fn regression_cpu_list_work_is_bounded() {
    check("core/cpu_list", b"0-1048575");
    let big = vec!["0-1048575"; 100_000].join(",");
    let t0 = std::time::Instant::now();
    let set = berth_core::CpuSet::parse_list(&big).unwrap();
    assert_eq!(set.len(), 1 << 20);
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "took {:?}", t0.elapsed());
    assert_eq!(berth_core::CpuSet::parse_list("5-9,0-3,2-6,64-64").unwrap().to_list(), "0-9,64");
}

/// Two bracket groups multiplied: `[01-10,0-99999]x[0-99999]` is 10^10 names, built one by
/// one (and the suffix re-expanded for each).
#[test]
fn regression_hostlist_product_is_bounded() {
    let input = "[1-3]-[01-10,0-99999]x[0-99999]-";
    check("core/hostlist", input.as_bytes());
    let e = berth_core::hierarchy::expand_hostlist(input).unwrap_err();
    assert!(matches!(e, berth_core::hierarchy::HostlistError::TooMany { .. }), "{e:?}");
    assert!(e.to_string().contains("more than"), "{e}");
    assert_eq!(berth_core::hierarchy::expand_hostlist("n[0-99999]").unwrap().len(), 100_000);
    assert_eq!(berth_core::hierarchy::expand_hostlist("n[1-2]x[01-02]").unwrap(), ["n1x01", "n1x02", "n2x01", "n2x02"]);
}
