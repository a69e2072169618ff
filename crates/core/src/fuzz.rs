//! Fuzzing support (cargo feature `fuzzing`): input generators and the properties every input
//! must keep, shared by the proptest suites in each crate's `tests/fuzz_*.rs` and by the
//! bounded run `berth-bench fuzz --minutes M`.
//!
//! A [`Target`] is a generator of inputs, as the bytes saved when one fails (text for string
//! inputs, JSON for structured ones), and a check that panics when a property fails. The
//! properties: parsing never panics, never takes long on a small input, and reports errors as
//! values; what parses prints back to the same value. This module holds the targets of
//! berth-core and the strategies other crates build their messages from.

use crate::binding::{BindingMode, BindingStrategy, CoreRef};
use crate::directives::{parse_script, SubmitOptions, OPTION_NAMES};
use crate::job::{JobOutcome, JobState, NodeAllocation, NumaShare, RankSet, ResourceRequest};
use crate::node::NodeState;
use crate::sched::fairshare::ShareLine;
use crate::sched::priority::Priority;
use crate::sched::queue::QueueSpec;
use crate::step::{RankBinding, RankPlace, StepRequest};
use crate::topology::{Core, NumaNode, Package, Topology};
use crate::units::{parse_duration_secs, parse_size};
use crate::{CoreError, CpuSet, JobId, NodeId};
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use std::time::{Duration, Instant};

/// One fuzz target: where its inputs come from and what must hold for each.
#[derive(Clone, Copy)]
pub struct Target {
    /// `crate/what`, e.g. `core/directives`.
    pub name: &'static str,
    /// Inputs as bytes: text for string inputs, JSON for structured ones.
    pub input: fn() -> BoxedStrategy<Vec<u8>>,
    /// Panics if a property fails on the input.
    pub check: fn(&[u8]),
}

/// Cases per target for the test suites: `BERTH_FUZZ_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("BERTH_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Longest a case may take in the test suites before it counts as a hang.
pub const CASE_LIMIT: Duration = Duration::from_secs(20);

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// The check panicked: the panic's message.
    Panicked(String),
    /// Still running after the limit (the thread is left to finish on its own).
    Hung,
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic with a non-text payload".into())
}

/// Run one case on its own thread, so that a panic is caught and a hang is noticed.
pub fn run_case(check: fn(&[u8]), input: Vec<u8>, limit: Duration) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("fuzz-case".into()).spawn(move || {
        let result = std::panic::catch_unwind(|| check(&input));
        let _ = tx.send(result.map_err(|p| panic_message(&*p)));
    });
    if let Err(e) = spawned {
        return Outcome::Panicked(format!("cannot start a thread: {e}"));
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(message)) => Outcome::Panicked(message),
        Err(_) => Outcome::Hung,
    }
}

/// Run `target` for `cases` generated inputs under proptest, shrinking a failure to a small
/// input; panics with the input if one fails or takes longer than [`CASE_LIMIT`].
pub fn run(target: &Target, cases: u32) {
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let hung: std::cell::RefCell<Option<Vec<u8>>> = Default::default();
    let result = runner.run(&(target.input)(), |bytes| {
        if hung.borrow().is_some() {
            // Do not shrink a hang: every try would leave another thread spinning.
            return Ok(());
        }
        match run_case(target.check, bytes.clone(), CASE_LIMIT) {
            Outcome::Passed => Ok(()),
            Outcome::Panicked(message) => Err(TestCaseError::fail(message)),
            Outcome::Hung => {
                *hung.borrow_mut() = Some(bytes);
                Err(TestCaseError::fail("hung"))
            }
        }
    });
    if let Some(bytes) = hung.into_inner() {
        panic!("fuzz target {} still running after {CASE_LIMIT:?} on input {:?}", target.name, text(&bytes));
    }
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, bytes)) => {
            panic!("fuzz target {} failed on input {:?} (shrunk): {why}", target.name, text(&bytes))
        }
        Err(e) => panic!("fuzz target {} failed: {e}", target.name),
    }
}

/// Asserts that `f` runs within `budget(len)` = 20 ms + 20 us per input byte: parsing must
/// take time in proportion to its input, not to the numbers in it. A slow run is retried
/// (twice) so that a busy machine does not fail it.
pub fn assert_fast(what: &str, len: usize, mut f: impl FnMut()) {
    let budget = Duration::from_millis(20) + Duration::from_micros(20) * len as u32;
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed());
        if best <= budget {
            return;
        }
    }
    panic!("{what} took {best:?} on {len} bytes of input (budget {budget:?})");
}

/// The input as text (inputs of string targets are UTF-8; a saved file edited by hand may not be).
pub fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// The targets of berth-core.
pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "core/directives",
            input: || script().prop_map(String::into_bytes).boxed(),
            check: check_script,
        },
        Target { name: "core/submit_option", input: option_input, check: check_option },
        Target { name: "core/units", input: units_input, check: check_units },
        Target {
            name: "core/cpu_list",
            input: || cpu_list_text().prop_map(String::into_bytes).boxed(),
            check: check_cpu_list,
        },
        Target {
            name: "core/binding",
            input: || binding_text().prop_map(String::into_bytes).boxed(),
            check: check_binding,
        },
        Target {
            name: "core/hostlist",
            input: || hostlist_text().prop_map(String::into_bytes).boxed(),
            check: check_hostlist,
        },
        Target { name: "core/topology", input: topology_input, check: check_topology },
        Target {
            name: "core/small_parsers",
            input: || junk_text(24).prop_map(String::into_bytes).boxed(),
            check: check_small,
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// Text generators.

/// Characters that trip parsers: separators, quotes, whitespace of every kind, NUL, multi-byte
/// and non-ASCII digits.
const AWKWARD: &[char] = &[
    ' ',
    '\t',
    '\n',
    '\r',
    '\0',
    '"',
    '\'',
    '#',
    '=',
    '-',
    '+',
    ':',
    ',',
    ';',
    '.',
    '[',
    ']',
    '(',
    ')',
    '%',
    '\\',
    '\u{a0}',
    '\u{2028}',
    '\u{3000}',
    '\u{feff}',
    '\u{1f600}',
    'é',
    '\u{663}',
    '\u{ff11}',
    'e',
    'E',
    'x',
];

pub fn awkward_char() -> BoxedStrategy<char> {
    prop_oneof![3 => prop::sample::select(AWKWARD), 1 => any::<char>(), 2 => prop::char::range(' ', '~')].boxed()
}

/// One of `options`.
pub fn one_of(options: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(options).prop_map(str::to_string).boxed()
}

/// Up to `max` characters, mostly awkward ones.
pub fn junk_text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::collection::vec(awkward_char(), 0..=max).prop_map(|v| v.into_iter().collect()),
        1 => any::<String>().prop_map(move |s| s.chars().take(max).collect()),
    ]
    .boxed()
}

/// Up to `max` pieces of `dict` (a grammar's tokens), with an awkward character now and then.
pub fn pieces(dict: &'static [&'static str], max: usize) -> BoxedStrategy<String> {
    let piece = prop_oneof![9 => one_of(dict), 1 => awkward_char().prop_map(String::from)];
    prop::collection::vec(piece, 0..=max).prop_map(|v| v.concat()).boxed()
}

/// Numbers at and around every limit a parser may hit.
pub const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "7",
    "00",
    "01",
    "59",
    "60",
    "63",
    "64",
    "65",
    "86400",
    "1048575",
    "1048576",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "-1",
    "+1",
    "1.5",
    ".5",
    "5.",
    "1e3",
    "1e400",
    "NaN",
    "inf",
    "0x10",
    "1_000",
    "\u{663}",
];

// ---------------------------------------------------------------------------------------------
// Directives and submission options.

const SWITCH_VALUES: &[&str] = &["", "yes", "no", "true", "false", "1", "0", "YES", "maybe"];
const MODES: &[&str] = &["set", "env", "pe", "SET", "", "bind"];

/// A value for option `name`: usually well-formed, often at a limit, sometimes junk.
pub fn option_value(name: &str) -> BoxedStrategy<String> {
    let own = match name {
        "cores" | "nodes" | "tasks-per-node" | "cpus-per-task" | "gpus" | "gpus-per-node" | "cpus-per-gpu"
        | "gpus-per-task" | "gpus-per-socket" | "sockets-per-node" => pieces(NUMBERS, 2),
        "gpu-bind" => pieces(&["closest", "none", "map:", "map_gpu:", "0", ",", "1", "x", "255", "256"], 5),
        "gpu-locality" => pieces(&["strict", "prefer", "STRICT", "s", " ", "enforce-binding"], 3),
        "gpu-type" => pieces(&["a100", "v100", "-", "sxm4", ".", "_", "A100", "é", " ", "x123456789"], 9),
        "mem" | "mem-per-cpu" | "mem-per-gpu" => size_text(),
        "walltime" => duration_text(),
        "threads" | "rank-cpusets" | "system-cpus" | "requeue" | "no-requeue" | "no-kill" | "hold" => {
            one_of(SWITCH_VALUES)
        }
        "dependency" => pieces(&["afterok", "afterany", ":", "12", "?", ",", "singleton", "after", "x", "_1"], 6),
        "begin" => pieces(&["now", "+", "60", "hours", "12:30", ":", "2027-01-02", "T", "noon", "x"], 4),
        "binding" => binding_text(),
        "binding-mode" => one_of(MODES),
        "mpi" => one_of(&["auto", "pmix", "pmix_v4", "pmi2", "pmi1", "pmi", "none", "", "PMIX", "openmpi"]),
        "property" => pieces(&["a", "singlecpu", "big_mem", "x-1", ",", " ", ",,", "é", "-"], 6),
        "gres" | "licenses" => pieces(&["nvme", "matlab", ":", "10", ",", "gpu", "a100", "0", "1x", "é", " "], 6),
        "account" | "reservation" => pieces(&["proj", "a", "_", "-", ".", "1", "é", " ", "/", "x123456789"], 9),
        _ => junk_text(16),
    };
    prop_oneof![6 => own, 1 => junk_text(16)].boxed()
}

fn option_name() -> BoxedStrategy<String> {
    prop_oneof![
        12 => prop::sample::select(OPTION_NAMES.to_vec()).prop_map(str::to_string),
        1 => one_of(&["", "-", "cores=", "CORES", "hold", "colour", "mem\0"]),
        1 => junk_text(8),
    ]
    .boxed()
}

/// `--name value`, `--name=value`, `--switch`, sometimes quoted, sometimes broken.
fn directive_option() -> BoxedStrategy<String> {
    option_name()
        .prop_flat_map(|name| {
            let value = option_value(&name);
            (Just(name), value, 0..8u8)
        })
        .prop_map(|(name, value, form)| match form {
            0 | 1 => format!("--{name} {value}"),
            2 => format!("--{name}={value}"),
            3 => format!("--{name} \"{value}\""),
            4 => format!("--{name}=\"{value}\""),
            5 => format!("--{name}"),
            6 => format!("{name} {value}"),
            _ => format!("--{name} \"{value}"),
        })
        .boxed()
}

fn script_line() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::collection::vec(directive_option(), 0..4)
            .prop_flat_map(|opts| (Just(opts), one_of(&["#BERTH ", "#BERTH\t", "  #BERTH ", "#BERTH", "#BERTHX ", "#berth "])))
            .prop_map(|(opts, prefix)| format!("{prefix}{}", opts.join(" "))),
        1 => Just(String::new()),
        1 => Just("# a comment".to_string()),
        1 => Just("echo hi".to_string()),
        1 => junk_text(30),
    ]
    .boxed()
}

/// A batch script: an interpreter line (usually), then directives, comments and commands.
pub fn script() -> BoxedStrategy<String> {
    let first = prop_oneof![
        8 => Just("#!/bin/sh".to_string()),
        1 => Just("\u{feff}#!/bin/sh".to_string()),
        1 => Just("#!".to_string()),
        1 => junk_text(10),
    ];
    let ending = one_of(&["\n", "\r\n", "\r"]);
    (first, prop::collection::vec(script_line(), 0..8), ending)
        .prop_map(|(first, lines, nl)| {
            let mut s = first;
            for l in lines {
                s.push_str(&nl);
                s.push_str(&l);
            }
            s
        })
        .boxed()
}

/// Directives that set exactly `opts` (whose text values hold no `"`, as directives give).
pub fn render_script(opts: &SubmitOptions) -> String {
    let mut s = "#!/bin/sh\n".to_string();
    for name in OPTION_NAMES {
        if let Some(v) = render_value(opts, name) {
            s.push_str(&format!("#BERTH --{name}=\"{v}\"\n"));
        }
    }
    s
}

/// The text `SubmitOptions::set(name, _)` reads back to the option's current value.
pub fn render_value(o: &SubmitOptions, name: &str) -> Option<String> {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    match name {
        "cores" => o.cores.map(|v| v.to_string()),
        "nodes" => o.nodes.map(|v| v.to_string()),
        "tasks-per-node" => o.tasks_per_node.map(|v| v.to_string()),
        "cpus-per-task" => o.cpus_per_task.map(|v| v.to_string()),
        "mem" => o.mem.map(|v| v.to_string()),
        "mem-per-cpu" => o.mem_per_cpu.map(|v| v.to_string()),
        "walltime" => o.walltime.map(|v| v.to_string()),
        "name" => o.name.clone(),
        "output" => o.output.clone(),
        "error" => o.error.clone(),
        "queue" => o.queue.clone(),
        "account" => o.account.clone(),
        "reservation" => o.reservation.clone(),
        "threads" => o.threads.map(yes_no),
        "rank-cpusets" => o.rank_cpusets.map(yes_no),
        "mpi" => o.mpi.map(|m| m.name().to_string()),
        "system-cpus" => o.system_cpus.map(yes_no),
        // `no-requeue` is the same setting spelled the other way round.
        "requeue" => o.requeue.map(yes_no),
        "no-requeue" => o.requeue.map(|r| yes_no(!r)),
        "no-kill" => o.no_kill.map(yes_no),
        "hold" => o.hold.map(yes_no),
        "dependency" => o.dependency.as_ref().map(ToString::to_string),
        "begin" => o.begin.map(|b| b.to_string()),
        "binding" => o.binding.as_ref().map(ToString::to_string),
        "binding-mode" => o.binding_mode.map(|m| m.to_string()),
        "property" => o.properties.as_ref().map(|p| p.join(",")),
        "comment" => o.comment.clone(),
        "chdir" => o.chdir.clone(),
        "export" => o.export.as_ref().map(|e| {
            let vars = e.vars.iter().map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            });
            std::iter::once(if e.all { "ALL".to_string() } else { "NONE".to_string() })
                .chain(vars)
                .collect::<Vec<_>>()
                .join(",")
        }),
        "signal" => {
            o.signal.as_ref().map(|s| format!("{}{}@{}", if s.batch_only { "B:" } else { "" }, s.signal, s.secs))
        }
        "mail-type" => o.mail_type.as_ref().map(|m| m.slurm()),
        "mail-user" => o.mail_user.clone(),
        "exclusive" => o.exclusive.map(yes_no),
        "qos" => o.qos.clone(),
        "array" => o.array.as_ref().map(ToString::to_string),
        "gpus" => o.gpus.map(|v| v.to_string()),
        "gpus-per-node" => o.gpus_per_node.map(|v| v.to_string()),
        "gpu-type" => o.gpu_type.clone(),
        "cpus-per-gpu" => o.cpus_per_gpu.map(|v| v.to_string()),
        "mem-per-gpu" => o.mem_per_gpu.map(|v| v.to_string()),
        "gpus-per-task" => o.gpus_per_task.map(|v| v.to_string()),
        "gpu-bind" => o.gpu_bind.clone(),
        "gpu-locality" => o.gpu_locality.map(|l| l.to_string()),
        "gpus-per-socket" => o.gpus_per_socket.map(|v| v.to_string()),
        "sockets-per-node" => o.sockets_per_node.map(|v| v.to_string()),
        // `--gres gpu[:TYPE]:N` sets the GPUs per node (and type), the other items `gres`.
        "gres" => {
            let gpus = o.gpus_per_node.map(|n| match &o.gpu_type {
                Some(t) => format!("gpu:{t}:{n}"),
                None => format!("gpu:{n}"),
            });
            let items: Vec<String> = gpus.into_iter().chain(o.gres.as_ref().map(crate::gres::render)).collect();
            (!items.is_empty()).then(|| items.join(","))
        }
        "licenses" => o.licenses.as_ref().map(crate::gres::render),
        _ => None,
    }
}

/// What every accepted option must look like.
fn assert_sane_options(o: &SubmitOptions) {
    for (name, v) in [("cores", o.cores), ("nodes", o.nodes), ("tasks", o.tasks_per_node), ("cpt", o.cpus_per_task)] {
        assert_ne!(v, Some(0), "--{name} 0 accepted");
    }
    assert_ne!(o.walltime, Some(0), "--walltime 0 accepted");
    assert!(o.gpus.is_none_or(|g| (1..=crate::job::MAX_GPUS_PER_JOB).contains(&g)), "--gpus {:?}", o.gpus);
    assert!(o.gpus_per_node.is_none_or(|g| (1..=crate::job::MAX_GPUS_PER_NODE).contains(&g)));
    assert!(o.gpus_per_socket.is_none_or(|g| (1..=crate::job::MAX_GPUS_PER_NODE).contains(&g)));
    assert!(o.sockets_per_node.is_none_or(|s| (1..=crate::job::MAX_SOCKETS_PER_NODE).contains(&s)));
    assert!(o.gpu_type.as_deref().is_none_or(crate::job::valid_gpu_type));
    for v in [&o.name, &o.output, &o.error, &o.queue, &o.account, &o.reservation].into_iter().flatten() {
        assert!(!v.is_empty(), "empty text value accepted");
    }
    for counts in [&o.gres, &o.licenses].into_iter().flatten() {
        assert!(!counts.is_empty());
    }
    // Generic resources may be typed (`nvme:fast`), licenses not.
    if let Some(g) = &o.gres {
        assert!(crate::gres::check_node_config("request", g).is_ok(), "{g:?}");
    }
    if let Some(l) = &o.licenses {
        assert!(crate::gres::check_config("request", l).is_ok(), "{l:?}");
    }
    if let Some(props) = &o.properties {
        assert!(!props.is_empty() && props.iter().all(|p| !p.is_empty()));
    }
    // The scheduler turns every accepted request into a shape or an error, never a panic.
    if let Ok(shape) = o.request().shape() {
        if let Ok(per_node) = o.request().gpus_on_each_node(&shape) {
            assert!(per_node <= crate::job::MAX_GPUS_PER_NODE);
        }
        match shape {
            crate::job::Shape::PerNode { nodes, cores_per_node } => assert!(nodes > 0 && cores_per_node > 0),
            crate::job::Shape::Total { cores, chunk } => assert!(cores > 0 && chunk > 0 && cores % chunk == 0),
        }
    }
}

fn check_script(bytes: &[u8]) {
    let s = text(bytes);
    match parse_script(&s) {
        Ok(opts) => {
            assert_sane_options(&opts);
            let again = render_script(&opts);
            assert_eq!(parse_script(&again).as_ref(), Ok(&opts), "directives {again:?} do not read back");
        }
        Err(CoreError::Directive { line, message }) => {
            assert!(line >= 1 && line <= s.lines().count().max(1), "error on line {line}: {message}");
            assert!(!message.is_empty());
        }
        Err(e) => panic!("parse_script gave a non-directive error: {e:?}"),
    }
}

fn option_input() -> BoxedStrategy<Vec<u8>> {
    option_name()
        .prop_flat_map(|name| (option_value(&name), Just(name)))
        .prop_map(|(value, name)| format!("{name}\0{value}").into_bytes())
        .boxed()
}

/// Input `NAME\0VALUE`: `SubmitOptions::set(NAME, VALUE)`.
fn check_option(bytes: &[u8]) {
    let s = text(bytes);
    let (name, value) = s.split_once('\0').unwrap_or((&s, ""));
    let mut opts = SubmitOptions::default();
    match opts.set(name, value) {
        Ok(()) => {
            assert_sane_options(&opts);
            let back = render_value(&opts, name)
                .unwrap_or_else(|| panic!("--{name} was set but berth_core::fuzz::render_value does not know it"));
            let mut again = SubmitOptions::default();
            again.set(name, &back).unwrap_or_else(|e| panic!("--{name} {back:?} (from {value:?}) refused: {e}"));
            assert_eq!(again, opts, "--{name} {back:?} reads back differently");
        }
        Err(message) => assert!(!message.to_string().is_empty()),
    }
}

// ---------------------------------------------------------------------------------------------
// Units.

const SIZE_UNITS: &[&str] = &["K", "M", "G", "T", "KB", "MiB", "gb", "TiB", "B", "P", " ", "i", "."];
const DURATION_PARTS: &[&str] = &[":", "-", "s", "m", "h", "d", "w", " ", "1:", "00:", "-00:", "M"];

fn size_text() -> BoxedStrategy<String> {
    (pieces(NUMBERS, 2), pieces(SIZE_UNITS, 2)).prop_map(|(n, u)| format!("{n}{u}")).boxed()
}

fn duration_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::collection::vec(prop_oneof![one_of(NUMBERS), one_of(DURATION_PARTS)], 0..6).prop_map(|v| v.concat()),
        2 => (one_of(NUMBERS), one_of(&["s", "m", "h", "d", "x", " m"])).prop_map(|(n, u)| format!("{n}{u}")),
        1 => pieces(NUMBERS, 2),
        2 => (proptest::option::of(one_of(NUMBERS)), prop::collection::vec(one_of(NUMBERS), 1..4)).prop_map(|(d, hms)| {
            let hms = hms.join(":");
            d.map_or(hms.clone(), |d| format!("{d}-{hms}"))
        }),
    ]
    .boxed()
}

fn units_input() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![size_text(), duration_text(), junk_text(12)].prop_map(String::into_bytes).boxed()
}

/// What `parse_duration_secs` must give, computed without overflow: `None` for an error.
pub fn reference_duration(input: &str) -> Option<u64> {
    let s = input.trim();
    if s.is_empty() {
        return None;
    }
    let total: u128 = if let Some(unit) = s.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n: u64 = s[..s.len() - 1].trim().parse().ok()?;
        let mult = match unit.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return None,
        };
        u128::from(n) * mult
    } else {
        let (days, rest) = match s.split_once('-') {
            Some((d, r)) => (d.parse::<u64>().ok()?, r),
            None => (0, s),
        };
        let parts: Vec<u128> = rest.split(':').map(|p| p.parse::<u64>().ok().map(u128::from)).collect::<Option<_>>()?;
        let secs = match parts.as_slice() {
            [s] => *s,
            [m, s] => m * 60 + s,
            [h, m, s] => h * 3600 + m * 60 + s,
            _ => return None,
        };
        u128::from(days) * 86400 + secs
    };
    u64::try_from(total).ok()
}

fn check_units(bytes: &[u8]) {
    let s = text(bytes);
    let got = parse_duration_secs(&s).ok();
    assert_eq!(got, reference_duration(&s), "parse_duration_secs({s:?})");
    if let Ok(v) = parse_size(&s) {
        // Whole numbers with a unit, when exact in f64, are exact.
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u128 = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 1,
            "K" | "KB" | "KIB" => 1 << 10,
            "M" | "MB" | "MIB" => 1 << 20,
            "G" | "GB" | "GIB" => 1 << 30,
            "T" | "TB" | "TIB" => 1 << 40,
            _ => 0,
        };
        if let (Ok(n), true) = (num.parse::<u128>(), mult > 0) {
            if n * mult < 1 << 53 {
                assert_eq!(u128::from(v), n * mult, "parse_size({s:?})");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CPU lists.

const CPU_LIST: &[&str] = &[
    "0",
    "1",
    "3",
    "63",
    "64",
    "127",
    "1048575",
    "1048576",
    "4294967295",
    "-",
    ",",
    " ",
    "0-1048575",
    "0-3",
    "8-8",
    "5-2",
    ",,",
];

fn cpu_list_text() -> BoxedStrategy<String> {
    prop_oneof![
        10 => pieces(CPU_LIST, 12),
        1 => prop::collection::vec(one_of(&["0-1048575", "1048575-1048575", "0-65535"]), 1..64).prop_map(|v| v.join(",")),
        2 => junk_text(16),
    ]
    .boxed()
}

fn check_cpu_list(bytes: &[u8]) {
    let s = text(bytes);
    assert_fast("CpuSet::parse_list", s.len(), || {
        let _ = CpuSet::parse_list(&s);
    });
    if let Ok(set) = CpuSet::parse_list(&s) {
        // Reading its own list back also shows every index is below the limit.
        let list = set.to_list();
        let again = CpuSet::parse_list(&list).unwrap_or_else(|e| panic!("{list:?} (from {s:?}) refused: {e}"));
        assert_eq!(again, set, "{list:?} (from {s:?})");
    }
}

// ---------------------------------------------------------------------------------------------
// Binding strategies.

const BINDING: &[&str] = &[
    "linear",
    "striding",
    "explicit",
    ":",
    ":",
    ",",
    "-",
    "0",
    "1",
    "2",
    "3",
    "4294967295",
    "4294967296",
    " ",
    "linear:",
    "striding:",
    "explicit:",
];

fn binding_text() -> BoxedStrategy<String> {
    pieces(BINDING, 8)
}

fn check_binding(bytes: &[u8]) {
    let s = text(bytes);
    if let Ok(b) = s.parse::<BindingStrategy>() {
        let shown = b.to_string();
        assert_eq!(shown.parse::<BindingStrategy>().as_ref(), Ok(&b), "{shown:?} (from {s:?})");
        let _ = b.fixed_count();
        for topo in [Topology::uniform(2, 1, 4, 1, 1 << 30), Topology::uniform(1, 2, 2, 2, 1 << 30)] {
            let usable = vec![true; topo.cores.len()];
            if let Ok(cores) = b.select(&topo, &usable) {
                assert!(cores.iter().all(|&c| c < topo.cores.len()));
            }
        }
    }
    if let Ok(m) = s.parse::<BindingMode>() {
        assert_eq!(m.to_string().parse::<BindingMode>(), Ok(m));
    }
}

// ---------------------------------------------------------------------------------------------
// Host lists (`n[1-4,7]`, interconnect configuration).

const HOSTLIST: &[&str] = &["n", "node", "[", "]", "0", "1", "01", "9", "99", "99999", "-", ",", "x", "0-99999", "1-3"];
const HOST_RANGES: &[&str] = &["1-3", "0-99999", "01-10", "5", "9-1", "000-999", "", "a-b", "0-"];

fn hostlist_text() -> BoxedStrategy<String> {
    let group = prop::collection::vec(one_of(HOST_RANGES), 1..4).prop_map(|r| format!("[{}]", r.join(",")));
    let structured =
        (one_of(&["n", "", "rack1-n"]), prop::collection::vec((group, one_of(&["", "x", "-", "]"])), 0..4))
            .prop_map(|(prefix, groups)| groups.into_iter().fold(prefix, |s, (g, sep)| s + &g + &sep));
    prop_oneof![pieces(HOSTLIST, 12), structured].boxed()
}

fn check_hostlist(bytes: &[u8]) {
    let s = text(bytes);
    if let Ok(names) = crate::hierarchy::expand_hostlist(&s) {
        assert!(!names.is_empty(), "{s:?} expands to nothing");
    }
}

// ---------------------------------------------------------------------------------------------
// Topologies (an agent's registration) and the values built on them.

/// A PU or NUMA index: small, or anything a peer could send.
fn index_u32() -> BoxedStrategy<u32> {
    prop_oneof![6 => 0u32..16, 1 => 0u32..(1 << 20), 1 => any::<u32>()].boxed()
}

fn bytes_u64() -> BoxedStrategy<u64> {
    prop_oneof![4 => Just(1u64 << 30), 2 => 0u64..(1 << 40), 1 => any::<u64>()].boxed()
}

/// A finite float (JSON has no NaN or infinity).
pub fn finite_f64() -> BoxedStrategy<f64> {
    prop_oneof![
        3 => -1.0e6..1.0e10f64,
        1 => prop::sample::select(vec![0.0, -0.0, 0.5, 1.0, 1.0e-300, f64::MIN_POSITIVE, f64::MAX, f64::MIN, 1.7e9]),
        1 => any::<f64>().prop_filter("finite", |f| f.is_finite()),
    ]
    .boxed()
}

/// A valid CPU set (as the wire's kernel lists give: indexes below 2^20).
pub fn cpuset() -> BoxedStrategy<CpuSet> {
    // Now and then an index near the top: a set is a bitmap, and its text lists every bit.
    prop::collection::vec(prop_oneof![60 => 0u32..130, 1 => 0u32..(1 << 20)], 0..10)
        .prop_map(CpuSet::from_iter_u32)
        .boxed()
}

/// A topology as a peer may send it: often valid, often not.
pub fn topology() -> BoxedStrategy<Topology> {
    let uniform =
        (1u32..3, 1u32..3, 1u32..4, 1u32..3, bytes_u64()).prop_map(|(p, n, c, t, m)| Topology::uniform(p, n, c, t, m));
    let package = index_u32().prop_map(|os_index| Package { os_index });
    let numa =
        (index_u32(), bytes_u64(), cpuset(), any::<bool>()).prop_map(|(os_index, memory_bytes, cpus, special)| {
            NumaNode { os_index, memory_bytes, cpus, special, memory_source: Default::default() }
        });
    let small_or_any = || prop_oneof![8 => 0usize..4, 1 => any::<usize>()];
    let core = (
        small_or_any(),
        proptest::option::of(small_or_any()),
        prop::collection::vec(index_u32(), 0..3),
        prop_oneof![3 => Just(0u32), 1 => any::<u32>()],
        proptest::option::of(0u32..4),
    )
        .prop_map(|(package, numa, pus, kind, group)| Core { package, numa, pus, kind, group });
    let free = (
        prop::collection::vec(package, 0..3),
        prop::collection::vec(numa, 0..3),
        prop::collection::vec(core, 0..6),
        cpuset(),
    )
        .prop_map(|(packages, numa_nodes, cores, disallowed)| Topology {
            packages,
            numa_nodes,
            cores,
            disallowed,
            gpus: vec![],
            gpu_links: vec![],
            derived: Default::default(),
        });
    prop_oneof![uniform, free].boxed()
}

fn topology_input() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        4 => topology().prop_map(|t| serde_json::to_vec(&t).expect("a topology encodes")),
        1 => topology().prop_flat_map(|t| mutated_json(serde_json::to_value(&t).expect("a topology encodes"))),
    ]
    .boxed()
}

fn check_topology(bytes: &[u8]) {
    let Ok(topo) = serde_json::from_slice::<Topology>(bytes) else { return };
    let back: Topology = serde_json::from_slice(&serde_json::to_vec(&topo).expect("encodes")).expect("decodes");
    assert_eq!(back, topo);
    // Validating, and what the controller and the scheduler then do with a registered
    // topology, must not panic, nor take long (a huge PU or NUMA number makes huge bitmaps).
    assert_fast("validating and querying a topology", bytes.len(), || query_topology(&topo));
}

fn query_topology(topo: &Topology) {
    if topo.validate().is_err() {
        return;
    }
    let all = topo.all_pus();
    assert_eq!(all.len(), topo.pu_count());
    let _ = (topo.core_count(), topo.threads_per_core(), topo.memory_bytes(), topo.ge_counts());
    let _ = (topo.mems_for(&all), topo.mems_for(&CpuSet::new()));
    assert!(topo.ge_string(&CpuSet::new()).len() >= topo.packages.len());
    let _ = topo.ge_string(&all);
    for i in 0..topo.cores.len() {
        let (s, c) = topo.socket_core(i);
        assert_eq!(topo.core_index(s, c), Some(i));
    }
    for n in 0..topo.numa_nodes.len() {
        let _ = topo.numa_cores(n).count();
        let _ = topo.numa_by_os(topo.numa_nodes[n].os_index);
    }
    let usable = vec![true; topo.cores.len()];
    for b in ["linear:1", "linear:2:0,0", "striding:1:2", "explicit:0,0"] {
        let strategy: BindingStrategy = b.parse().expect("a valid strategy");
        let _ = strategy.select(topo, &usable);
    }
}

// ---------------------------------------------------------------------------------------------
// Small parsers: job ids, state names, rank bindings.

fn check_small(bytes: &[u8]) {
    let s = text(bytes);
    if let Ok(id) = s.parse::<JobId>() {
        assert_eq!(id.to_string().parse::<JobId>(), Ok(id));
    }
    if let Some(st) = JobState::parse(&s) {
        assert_eq!(st.as_str(), s);
    }
    if let Some(st) = NodeState::parse(&s) {
        assert_eq!(st.as_str(), s);
    }
    let _ = RankBinding::parse(&s);
}

// ---------------------------------------------------------------------------------------------
// JSON mutation, for structured inputs of any message type.

/// Any JSON value, nested a little.
pub fn json_value() -> BoxedStrategy<serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        finite_f64().prop_map(Value::from),
        junk_text(12).prop_map(Value::String),
        one_of(NUMBERS).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(junk_text(6), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// `value` with 1 to 4 random edits (replace, delete, add a field, change a type or a tag,
/// nest deeply), as JSON bytes; now and then cut short or with a byte flipped.
pub fn mutated_json(value: serde_json::Value) -> BoxedStrategy<Vec<u8>> {
    let edits = prop::collection::vec((any::<u32>(), 0u8..7, json_value()), 1..5);
    (edits, 0u8..10, any::<u32>(), any::<u8>())
        .prop_map(move |(edits, damage, at, byte)| {
            let mut v = value.clone();
            for (pick, kind, with) in edits {
                mutate(&mut v, pick, kind, with);
            }
            let mut bytes = serde_json::to_vec(&v).expect("a JSON value encodes");
            if !bytes.is_empty() {
                let at = at as usize % bytes.len();
                match damage {
                    0 => bytes.truncate(at),
                    1 => bytes[at] = byte,
                    _ => {}
                }
            }
            bytes
        })
        .boxed()
}

/// Tags and enum names of berth's messages: a mutation that swaps one in makes a message of
/// another kind with the wrong fields.
const TAGS: &[&str] = &[
    "ping",
    "submit",
    "submit_batch",
    "register",
    "heartbeat",
    "job_started",
    "job_ended",
    "launch",
    "kill",
    "signal",
    "suspend",
    "resume",
    "reservation",
    "step_create",
    "step_end",
    "error",
    "jobs",
    "nodes",
    "done",
    "stdin",
    "output",
    "exited",
    "spawn",
    "info",
    "remote_spawn",
    "inventory",
    "reserve",
    "confirm",
    "failed",
    "one",
    "linear",
    "global",
    "socket",
    "queued",
    "running",
    "set",
    "env",
    "pe",
    "text",
    "raw",
];

fn mutate(v: &mut serde_json::Value, pick: u32, kind: u8, with: serde_json::Value) {
    use serde_json::Value;
    // Count the nodes, then edit the one picked.
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    /// The `n`th node in preorder, or how many nodes are still to skip.
    fn nth(v: &mut Value, n: usize) -> Result<&mut Value, usize> {
        if n == 0 {
            return Ok(v);
        }
        let mut n = n - 1;
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => vec![],
        };
        for child in children {
            match nth(child, n) {
                Ok(found) => return Ok(found),
                Err(rest) => n = rest,
            }
        }
        Err(n)
    }
    let total = count(v);
    let Ok(target) = nth(v, pick as usize % total) else { return };
    let tag = TAGS[pick as usize % TAGS.len()];
    match (kind, target) {
        (0, t) => *t = with,
        (1, Value::Object(o)) if !o.is_empty() => {
            let key = o.keys().nth(pick as usize % o.len()).cloned().unwrap_or_default();
            o.remove(&key);
        }
        (1, Value::Array(a)) if !a.is_empty() => {
            a.remove(pick as usize % a.len());
        }
        (2, Value::Object(o)) => {
            o.insert(format!("x{}", pick % 7), with);
        }
        (2, Value::Array(a)) => a.push(with),
        (3, Value::Object(o)) => {
            for key in ["op", "result", "action", "kind", "strategy"] {
                if let Some(t) = o.get_mut(key) {
                    *t = Value::String(tag.into());
                }
            }
        }
        (4, t) => {
            let mut deep = t.clone();
            for _ in 0..(pick % 200) {
                deep = Value::Array(vec![deep]);
            }
            *t = deep;
        }
        (5, t @ Value::Number(_)) => *t = Value::String(t.to_string()),
        (5, t @ Value::String(_)) => *t = Value::from(pick),
        (6, t) => *t = Value::String(tag.into()),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies for the values berth's messages carry (used by berth-protocol's generators).

pub fn job_id() -> BoxedStrategy<JobId> {
    prop_oneof![3 => (1u64..1000).prop_map(JobId), 1 => any::<u64>().prop_map(JobId)].boxed()
}

pub fn job_state() -> BoxedStrategy<JobState> {
    prop::sample::select(JobState::ALL.to_vec()).boxed()
}

pub fn binding_mode() -> BoxedStrategy<BindingMode> {
    prop::sample::select(vec![BindingMode::Set, BindingMode::Env, BindingMode::Pe]).boxed()
}

pub fn core_ref() -> BoxedStrategy<CoreRef> {
    prop_oneof![any::<u32>().prop_map(CoreRef::Global), any::<(u32, u32)>().prop_map(|(s, c)| CoreRef::Socket(s, c))]
        .boxed()
}

/// Any strategy value (not necessarily one the parser accepts: the wire carries the enum).
pub fn binding_strategy() -> BoxedStrategy<BindingStrategy> {
    prop_oneof![
        (any::<u32>(), proptest::option::of(core_ref()))
            .prop_map(|(amount, start)| BindingStrategy::Linear { amount, start }),
        (core_ref(), core_ref(), any::<u32>()).prop_map(|(first, last, step)| BindingStrategy::StridingRange {
            first,
            last,
            step
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(amount, step)| BindingStrategy::StridingCount { amount, step }),
        prop::collection::vec(any::<(u32, u32)>(), 0..4).prop_map(|cores| BindingStrategy::Explicit { cores }),
    ]
    .boxed()
}

pub fn short_text() -> BoxedStrategy<String> {
    prop_oneof![3 => "[a-z0-9_./-]{0,12}", 1 => any::<String>()].boxed()
}

pub fn submit_options() -> BoxedStrategy<SubmitOptions> {
    let count = || proptest::option::of(any::<u32>());
    let text = || proptest::option::of(short_text());
    let flag = || proptest::option::of(any::<bool>());
    (
        (count(), count(), count(), count(), proptest::option::of(any::<u64>()), proptest::option::of(any::<u64>())),
        (text(), text(), text(), text(), text()),
        (proptest::option::of(any::<u64>()), flag(), flag(), flag()),
        (
            proptest::option::of(binding_strategy()),
            proptest::option::of(binding_mode()),
            proptest::option::of(prop::collection::vec(short_text(), 0..3)),
        ),
    )
        .prop_map(
            |(
                (cores, nodes, tasks_per_node, cpus_per_task, mem, walltime),
                (name, output, error, queue, account),
                (mem_per_cpu, threads, rank_cpusets, system_cpus),
                (binding, binding_mode, properties),
            )| SubmitOptions {
                cores,
                nodes,
                tasks_per_node,
                cpus_per_task,
                mem,
                walltime,
                name,
                output,
                error,
                queue,
                mem_per_cpu,
                threads,
                binding,
                binding_mode,
                rank_cpusets,
                system_cpus,
                properties,
                account,
                ..SubmitOptions::default()
            },
        )
        .boxed()
}

pub fn resource_request() -> BoxedStrategy<ResourceRequest> {
    let count = || proptest::option::of(any::<u32>());
    (
        count(),
        count(),
        count(),
        count(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        any::<bool>(),
        (count(), count(), proptest::option::of(short_text()), count(), proptest::option::of(any::<u64>())),
    )
        .prop_map(
            |(
                nodes,
                cores,
                tasks_per_node,
                cpus_per_task,
                mem_per_node,
                mem_per_cpu,
                threads,
                (gpus, gpus_per_node, gpu_type, cpus_per_gpu, mem_per_gpu),
            )| ResourceRequest {
                nodes,
                cores,
                tasks_per_node,
                cpus_per_task,
                mem_per_node,
                mem_per_cpu,
                threads,
                gpus,
                gpus_per_node,
                gpu_type,
                cpus_per_gpu,
                mem_per_gpu,
                // Sometimes per socket too (zeros and contradictions included).
                gpus_per_socket: mem_per_gpu.map(|m| (m % 5) as u32),
                sockets_per_node: gpus.map(|g| g % 4),
                gres: Default::default(),
                licenses: Default::default(),
            },
        )
        .boxed()
}

pub fn node_allocation() -> BoxedStrategy<NodeAllocation> {
    (
        (any::<u32>(), short_text(), cpuset(), any::<u32>(), cpuset(), any::<u64>()),
        (
            prop::collection::vec(any::<(u32, u64)>().prop_map(|(numa, bytes)| NumaShare { numa, bytes }), 0..3),
            cpuset(),
            prop::collection::vec(any::<u32>(), 0..3),
            prop::collection::vec(any::<(u32, u32)>(), 0..3),
            prop::collection::vec((cpuset(), cpuset()).prop_map(|(cpus, mems)| RankSet { cpus, mems }), 0..3),
            prop::collection::vec(any::<u32>(), 0..3),
        ),
    )
        .prop_map(
            |(
                (node_id, node, cpus, cores, mems, memory_bytes),
                (numa_memory, exclusive_numa, subnodes, binding, ranks, gpus),
            )| {
                NodeAllocation {
                    gres: Default::default(),
                    licenses: Default::default(),
                    node_id: NodeId(node_id),
                    node,
                    cpus,
                    cores,
                    mems,
                    memory_bytes,
                    numa_memory,
                    exclusive_numa,
                    subnodes,
                    binding,
                    ranks,
                    gpus,
                }
            },
        )
        .boxed()
}

pub fn job_outcome() -> BoxedStrategy<JobOutcome> {
    (
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<i32>()),
        proptest::option::of(short_text()),
        any::<(u64, u64, u64, u64)>(),
    )
        .prop_map(|(exit_code, signal, reason, (wall_ms, user_cpu_us, system_cpu_us, peak_memory_bytes))| JobOutcome {
            exit_code,
            signal,
            reason,
            wall_ms,
            user_cpu_us,
            system_cpu_us,
            peak_memory_bytes,
        })
        .boxed()
}

pub fn step_request() -> BoxedStrategy<StepRequest> {
    let count = || proptest::option::of(any::<u32>());
    (
        count(),
        count(),
        count(),
        any::<bool>(),
        prop::sample::select(vec![RankBinding::Linear, RankBinding::Striding, RankBinding::None]),
        count(),
        count(),
    )
        .prop_map(|(ntasks, tasks_per_node, cpus_per_task, overcommit, binding, nodes, gpus_per_task)| StepRequest {
            ntasks,
            nodes,
            tasks_per_node,
            cpus_per_task,
            overcommit,
            binding,
            gpus_per_task,
        })
        .boxed()
}

pub fn rank_place() -> BoxedStrategy<RankPlace> {
    (any::<u32>(), cpuset()).prop_map(|(rank, cpus)| RankPlace { rank, cpus }).boxed()
}

pub fn queue_spec() -> BoxedStrategy<QueueSpec> {
    (
        short_text(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(prop::collection::vec(short_text(), 0..3)),
        proptest::option::of(any::<bool>()),
        any::<i32>(),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                name,
                max_walltime_secs,
                default_walltime_secs,
                max_cores_per_job,
                max_cores_per_user,
                allowed_properties,
                allowed_subnodes,
                priority,
                preempt_class,
                enabled,
            )| QueueSpec {
                name,
                max_walltime_secs,
                default_walltime_secs,
                max_cores_per_job,
                max_cores_per_user,
                allowed_properties,
                allowed_subnodes,
                target_properties: vec![],
                reserved: false,
                priority,
                preempt_class,
                enabled,
            },
        )
        .boxed()
}

pub fn share_line() -> BoxedStrategy<ShareLine> {
    (short_text(), finite_f64(), finite_f64(), finite_f64(), finite_f64())
        .prop_map(|(account, share, usage, usage_fraction, factor)| ShareLine {
            account,
            share,
            usage,
            usage_fraction,
            factor,
        })
        .boxed()
}

pub fn priority() -> BoxedStrategy<Priority> {
    (finite_f64(), finite_f64(), finite_f64(), finite_f64(), finite_f64())
        .prop_map(|(total, age, size, queue, fair_share)| Priority { total, age, size, queue, fair_share })
        .boxed()
}

#[cfg(test)]
mod tests {
    /// Inputs the fuzzer found: `--gres gpu` sets GPUs per node, not `gres`, and must render
    /// back (with a type, and beside other generic resources too).
    #[test]
    fn gres_gpu_items_render_back() {
        for input in ["gres\0gpu", "gres\0gpu:a100:2", "gres\0gpu:2,nvme:3", "gres\0nvme:fast:1,gpu:1"] {
            super::check_option(input.as_bytes());
        }
    }
}
