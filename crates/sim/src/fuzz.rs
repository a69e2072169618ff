//! Fuzzing support (cargo feature `fuzzing`): the Standard Workload Format reader
//! ([`crate::swf::parse`]) and the topology strings of `--topology`
//! ([`crate::machine::parse_topology`]). See `berth_core::fuzz` for how targets are run.
//!
//! Properties: parsing never panics nor runs long, and reports errors as values naming the
//! line; a trace that parses, written back as SWF, parses to the same jobs; a topology that
//! parses is valid and within the stated limit.

use crate::machine::parse_topology;
use crate::swf::{parse, SwfJob, FIELDS};
use crate::SimError;
use berth_core::fuzz::{assert_fast, junk_text, one_of, pieces, text, Target, NUMBERS};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;

/// The targets of berth-sim.
pub fn targets() -> Vec<Target> {
    vec![
        Target { name: "sim/swf", input: || trace().prop_map(String::into_bytes).boxed(), check: check_swf },
        Target {
            name: "sim/topology",
            input: || topology_spec().prop_map(String::into_bytes).boxed(),
            check: check_topology,
        },
    ]
}

const FIELD_VALUES: &[&str] =
    &["-1", "0", "1", "16", "3600", "5094", "1e3", "-0", "99999999999", "18446744073709551615"];
const ODD_VALUES: &[&str] = &["12072.5", "-2", "1.5", "x", "1e400", "NaN", "-inf", "18446744073709551616", ""];

/// A field: usually one every field accepts, so that whole traces parse.
fn field() -> BoxedStrategy<String> {
    prop_oneof![60 => one_of(FIELD_VALUES), 2 => one_of(ODD_VALUES), 1 => one_of(NUMBERS), 1 => junk_text(4)].boxed()
}

fn job_line() -> BoxedStrategy<String> {
    let count = prop_oneof![30 => Just(FIELDS), 1 => 0usize..FIELDS + 3];
    (count, one_of(&[" ", "  ", "\t", " \u{a0}"]))
        .prop_flat_map(|(n, sep)| (vec(field(), n), Just(sep)))
        .prop_map(|(fields, sep)| fields.join(&sep))
        .boxed()
}

fn header_line() -> BoxedStrategy<String> {
    let key = one_of(&["MaxProcs", "MaxNodes", "UnixStartTime", "Version", "Note", " MaxProcs ", "maxprocs", ""]);
    let value =
        prop_oneof![6 => one_of(&["1", "64", "-1", "0", "1700000000"]), 2 => one_of(NUMBERS), 1 => junk_text(6)];
    (key, value, one_of(&[": ", ":", ": ", "", "::"])).prop_map(|(k, v, colon)| format!(";{k}{colon}{v}")).boxed()
}

/// A trace: header comments, job lines (mostly of 18 fields), blank lines, junk.
pub fn trace() -> BoxedStrategy<String> {
    let line = prop_oneof![
        16 => job_line(),
        4 => header_line(),
        2 => Just(String::new()),
        1 => junk_text(20),
    ];
    (vec(line, 0..10), one_of(&["\n", "\r\n"])).prop_map(|(lines, nl)| lines.join(&nl)).boxed()
}

/// A job written back as an SWF line (fields the reader ignores as -1).
fn render(j: &SwfJob) -> String {
    let opt_f = |v: Option<f64>| v.map_or("-1".to_string(), |v| v.to_string());
    let opt_u = |v: Option<u64>| v.map_or("-1".to_string(), |v| v.to_string());
    let f = [
        j.id.to_string(),
        j.submit.to_string(),
        "-1".into(),
        opt_f(j.run_time),
        opt_u(j.allocated_procs),
        "-1".into(),
        "-1".into(),
        opt_u(j.requested_procs),
        opt_f(j.requested_time),
        "-1".into(),
        "-1".into(),
        opt_u(j.user),
        opt_u(j.group),
        "-1".into(),
        opt_u(j.queue),
        "-1".into(),
        "-1".into(),
        "-1".into(),
    ];
    f.join(" ")
}

fn check_swf(bytes: &[u8]) {
    let s = text(bytes);
    assert_fast("swf::parse", s.len(), || {
        let _ = parse(&s);
    });
    let lines = s.lines().count();
    match parse(&s) {
        Ok(trace) => {
            assert!(!trace.jobs.is_empty());
            assert!(trace.max_procs.is_none_or(|p| p > 0) && trace.max_nodes.is_none_or(|n| n > 0));
            for j in &trace.jobs {
                assert!(j.line >= 1 && j.line <= lines);
                assert!(j.submit.is_finite() && j.submit >= 0.0);
                for t in [j.run_time, j.requested_time].into_iter().flatten() {
                    assert!(t.is_finite() && t >= 0.0);
                }
                let _ = (j.procs(), j.account());
            }
            let again: Vec<String> = trace.jobs.iter().map(render).collect();
            let back = parse(&again.join("\n")).unwrap_or_else(|e| panic!("{again:?} (from {s:?}): {e}"));
            for (a, b) in back.jobs.iter().zip(&trace.jobs) {
                assert_eq!(SwfJob { line: b.line, ..a.clone() }, *b, "{:?} (from {s:?})", render(b));
            }
        }
        Err(e) => {
            let line = match e {
                SimError::FieldCount { line, .. }
                | SimError::BadField { line, .. }
                | SimError::BadHeader { line, .. } => line,
                SimError::EmptyTrace => return,
                other => panic!("swf::parse gave {other:?}"),
            };
            assert!(line >= 1 && line <= lines, "error on line {line} of {lines}");
        }
    }
}

const LEVELS: &[&str] = &["package", "socket", "numa", "numanode", "node", "core", "pu", "thread", "PU", "l3", ""];
const COUNTS: &[&str] = &["1", "2", "4", "8", "16", "65536", "4294967295", "4294967296", "0", "-1", "x", ""];

fn topology_spec() -> BoxedStrategy<String> {
    let level = (one_of(LEVELS), one_of(&[":", ":", ":", "=", "::"]), one_of(COUNTS))
        .prop_map(|(l, c, n)| format!("{l}{c}{n}"));
    // Each level at most once, under one of its names, with a count from 1 to u32::MAX.
    let names: [&'static [&'static str]; 4] =
        [&["package", "socket"], &["numa", "numanode", "node"], &["core"], &["pu", "thread", "PU"]];
    let well_formed = names
        .map(|n| (any::<bool>(), one_of(n), one_of(&["1", "2", "3", "16", "255", "65536", "4294967295"])))
        .prop_map(|levels| {
            levels.into_iter().filter(|(keep, _, _)| *keep).map(|(_, name, count)| format!("{name}:{count}")).collect()
        })
        .prop_shuffle()
        .prop_map(|given: Vec<String>| given.join(" "));
    prop_oneof![
        4 => well_formed,
        2 => (vec(level, 0..5), one_of(&[" ", "  ", "\t"])).prop_map(|(levels, sep)| levels.join(&sep)),
        1 => pieces(&["package:", "core:", "pu:", "numa:", "2", "4294967295", " "], 8),
    ]
    .boxed()
}

fn check_topology(bytes: &[u8]) {
    let s = text(bytes);
    let mut parsed = None;
    assert_fast("parse_topology", s.len(), || parsed = Some(parse_topology(&s)));
    if let Some(Ok(topo)) = parsed {
        topo.validate().unwrap_or_else(|e| panic!("{s:?} gave an invalid topology: {e}"));
        assert!(topo.pu_count() <= 4096, "{s:?} gave {} PUs", topo.pu_count());
    }
}
