//! Fuzzing support (cargo feature `fuzzing`): the PMI-1 line parser, the PMI-2 message codec,
//! and whole PMI sessions against the real [`PmiServer`] over a socketpair, as an MPI rank
//! talks to it. See `berth_core::fuzz` for how targets are run.
//!
//! Properties: nothing a rank sends makes the server panic or stop answering (short of a
//! PMI-2 `info-getnodeattr` with `wait=TRUE`, which waits by design); every answer is one the
//! client can read (PMI-1 lines of at most 1023 bytes starting `cmd=`; PMI-2 frames with a
//! valid length, keys of at most 64 and values of at most 1024 bytes); what parses prints back
//! to the same request.

use crate::hwtopo::{load, TopologySource, MAX_SYNTHETIC_PUS};
use crate::step::pmi::{process_mapping, PmiConfig, PmiEvent, PmiServer, Request, KEYLEN_MAX, LINE_MAX, VALLEN_MAX};
use crate::step::pmi2::{parse_length, Message, LENGTH_FIELD, MESSAGE_MAX};
use berth_core::fuzz::{assert_fast, junk_text, one_of, text, Target, NUMBERS};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The targets of berth-agent.
pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "agent/pmi1_line",
            input: || pmi1_line().prop_map(String::into_bytes).boxed(),
            check: check_pmi1_line,
        },
        Target { name: "agent/pmi2_message", input: pmi2_message_input, check: check_pmi2_message },
        Target { name: "agent/pmi1_session", input: pmi1_session_input, check: check_pmi1_session },
        Target { name: "agent/pmi2_session", input: pmi2_session_input, check: check_pmi2_session },
        Target { name: "agent/process_mapping", input: mapping_input, check: check_mapping },
        Target {
            name: "agent/hwloc_synthetic",
            input: || synthetic_spec().prop_map(String::into_bytes).boxed(),
            check: check_synthetic,
        },
    ]
}

const KVSNAME: &str = "berth_7_1";

/// A value of about `n` bytes (limits are 64 for keys and 1024 for values).
fn sized(n: usize) -> BoxedStrategy<String> {
    prop_oneof![Just("k".repeat(n)), Just("é".repeat(n / 2)), Just(";".repeat(n))].boxed()
}

fn pmi_value() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-zA-Z0-9_=-]{0,12}",
        1 => one_of(NUMBERS),
        1 => prop_oneof![Just(KEYLEN_MAX), Just(KEYLEN_MAX + 1), Just(VALLEN_MAX), Just(VALLEN_MAX + 1), 0usize..3000]
            .prop_flat_map(sized),
        1 => junk_text(8),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// PMI-1.

const PMI1_COMMANDS: &[&str] = &[
    "init",
    "initack",
    "get_maxes",
    "get_appnum",
    "get_my_kvsname",
    "get_universe_size",
    "put",
    "get",
    "barrier_in",
    "finalize",
    "abort",
    "publish_name",
    "lookup_name",
    "create_kvs",
    "getbyidx",
    "get_ranks2hosts",
    "spawn",
    "",
];
const PMI1_KEYS: &[&str] =
    &["kvsname", "key", "value", "pmi_version", "pmi_subversion", "exitcode", "error_msg", "msg", "cmd", ""];

/// One request line (without its newline).
fn pmi1_line() -> BoxedStrategy<String> {
    let arg = (one_of(PMI1_KEYS), pmi_value(), 0u8..8).prop_map(|(k, v, how)| match (k.as_str(), how) {
        ("kvsname", 0..=4) => format!("kvsname={KVSNAME}"),
        ("error_msg", _) => format!("error_msg={v} and more words"),
        (_, 7) => k.clone(),
        _ => format!("{k}={v}"),
    });
    prop_oneof![
        8 => (one_of(&["cmd", "cmd", "cmd", "mcmd", "key", ""]), one_of(PMI1_COMMANDS), vec(arg, 0..4), one_of(&[" ", "  ", "\t"]))
            .prop_map(|(c, cmd, args, sep)| {
                let mut line = format!("{c}={cmd}");
                for a in args {
                    line.push_str(&sep);
                    line.push_str(&a);
                }
                line
            }),
        1 => one_of(&["cmd=init pmi_version=1 pmi_subversion=1", "cmd=init pmi_version=2 pmi_subversion=0", "endcmd", "totspawns=1", "spawnssofar=1", "   ", "\r"]),
        1 => junk_text(40),
    ]
    .boxed()
}

/// A parsed request written back as a line.
fn render(req: &Request<'_>) -> String {
    let mut line = format!("{}={}", if req.multi { "mcmd" } else { "cmd" }, req.cmd);
    for (k, v) in &req.args {
        line.push(' ');
        line.push_str(k);
        line.push('=');
        line.push_str(v);
    }
    line
}

fn check_pmi1_line(bytes: &[u8]) {
    let Ok(line) = std::str::from_utf8(bytes) else { return };
    let Ok(req) = Request::parse(line) else { return };
    assert!(!req.cmd.is_empty());
    assert!(req.args.iter().all(|(k, _)| !k.is_empty()));
    let again = render(&req);
    if again.ends_with(['\r', '\n']) {
        // A value may end in CR before a space but not at the end of the line, where the
        // parser drops line endings: such a request cannot be written back as one line.
        return;
    }
    let back = Request::parse(&again).unwrap_or_else(|e| panic!("{again:?} (from {line:?}) does not parse: {e}"));
    assert_eq!(back, req, "{again:?} (from {line:?})");
}

fn pmi1_session_input() -> BoxedStrategy<Vec<u8>> {
    let line = prop_oneof![
        10 => pmi1_line().prop_map(String::into_bytes),
        1 => Just(vec![b'x'; LINE_MAX + 1]),
        1 => vec(any::<u8>(), 0..24),
    ];
    let ending = one_of(&["\n", "\r\n", "\n\n"]);
    (vec((line, ending), 0..12), any::<bool>())
        .prop_map(|(lines, newline_at_end)| {
            let mut out = Vec::new();
            for (l, nl) in lines {
                out.extend(l);
                out.extend(nl.as_bytes());
            }
            if !newline_at_end && out.last() == Some(&b'\n') {
                out.pop();
            }
            out
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// PMI-2.

const PMI2_COMMANDS: &[&str] = &[
    "fullinit",
    "job-getid",
    "kvs-put",
    "kvs-get",
    "kvs-fence",
    "info-putnodeattr",
    "info-getnodeattr",
    "info-getjobattr",
    "finalize",
    "abort",
    "spawn",
    "name-publish",
    "job-connect",
    "nope",
];
const PMI2_KEYS: &[&str] = &[
    "pmirank", "key", "value", "jobid", "wait", "thrid", "srcid", "message", "exitcode", "isworld", "cmd", "a;b", "=",
];
const PMI2_VALUES: &[&str] = &[
    "TRUE",
    "FALSE",
    "0",
    "-1",
    "1",
    KVSNAME,
    "PMI_process_mapping",
    "universeSize",
    "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 0",
    "MPI_Abort(",
    "x;;y",
];

fn pmi2_message() -> BoxedStrategy<Message> {
    let pair = (one_of(PMI2_KEYS), prop_oneof![3 => one_of(PMI2_VALUES), 2 => pmi_value()]);
    (one_of(PMI2_COMMANDS), vec(pair, 0..4))
        .prop_map(|(cmd, pairs)| pairs.into_iter().fold(Message::new(&cmd), |m, (k, v)| m.with(&k, v)))
        .boxed()
}

fn pmi2_message_input() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => pmi2_message().prop_map(|m| m.body().into_bytes()),
        1 => pmi2_message().prop_flat_map(|m| {
            let body = m.body().into_bytes();
            let len = body.len();
            (Just(body), 0..len.max(1), any::<u8>())
        })
        .prop_map(|(mut body, at, byte)| {
            if let Some(b) = body.get_mut(at) {
                *b = byte;
            }
            body
        }),
        1 => junk_text(40).prop_map(String::into_bytes),
        1 => vec(any::<u8>(), 0..32),
    ]
    .boxed()
}

/// The client end of the PMI-2 codec: a body parses to a message that prints back to a body
/// that parses to the same message; its frame's length field reads back.
fn check_pmi2_message(bytes: &[u8]) {
    let _ = parse_length(&bytes[..bytes.len().min(LENGTH_FIELD)]);
    let Ok(m) = Message::parse(bytes) else { return };
    assert!(!m.cmd().is_empty());
    let body = m.body();
    assert_eq!(Message::parse(body.as_bytes()).as_ref(), Ok(&m), "{body:?}");
    let frame = m.encode();
    if body.len() < 1_000_000 {
        assert_eq!(parse_length(&frame[..LENGTH_FIELD]), Ok(body.len()));
    }
    let fitted = crate::step::pmi2::fit_for_client(m);
    assert!(fitted.pairs.iter().all(|(k, v)| k.len() <= 64 && v.len() <= 1024));
}

fn pmi2_session_input() -> BoxedStrategy<Vec<u8>> {
    let frame = prop_oneof![
        8 => pmi2_message().prop_map(|m| m.encode()),
        // A length field that lies, pads on the left, is not a number, or is too large.
        1 => (pmi2_message(), -3i64..3).prop_map(|(m, off)| {
            let body = m.body();
            format!("{:<6}{body}", (body.len() as i64 + off).max(0)).into_bytes()
        }),
        1 => one_of(&["    12cmd=finalize", "abc   cmd=x;", "999999", "1000000", "-1    ", "", "65537 "])
            .prop_map(String::into_bytes),
        1 => Just(format!("{:<6}{}", MESSAGE_MAX + 1, "x".repeat(MESSAGE_MAX + 1)).into_bytes()),
        1 => vec(any::<u8>(), 0..16),
    ];
    (
        one_of(&["cmd=init pmi_version=2 pmi_subversion=0\n", "cmd=init pmi_version=2 pmi_subversion=0\r\n"]),
        vec(frame, 0..8),
    )
        .prop_map(|(init, frames)| {
            let mut out = init.into_bytes();
            for f in frames {
                out.extend(f);
            }
            out
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Sessions with the real server.

thread_local! {
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
}

/// Feed `input` to a PMI server serving rank 0 of a 2-rank job (rank 1 elsewhere), answering
/// its barriers as the shepherd's tree would; the bytes it answered, or None if it is still
/// busy after `limit`. A panic of the server is resumed here.
fn session(input: &[u8], limit: Duration) -> Option<Vec<u8>> {
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
            let cfg = PmiConfig {
                kvsname: KVSNAME.into(),
                size: 2,
                appnum: 0,
                appnums: vec![],
                universe_size: 2,
                process_mapping: process_mapping(&[vec![0], vec![1]]),
                local_ranks: vec![0],
            };
            let srv = PmiServer::new(cfg, tx);
            srv.set("PMI_dead_processes", "");
            let (ours, theirs) = UnixStream::pair().expect("a socketpair");
            let server = tokio::spawn({
                let srv = srv.clone();
                async move { srv.serve_rank(0, theirs).await }
            });
            let tree = tokio::spawn({
                let srv = srv.clone();
                async move {
                    while let Some(event) = events.recv().await {
                        if let PmiEvent::BarrierIn { mut puts } = event {
                            puts.push(("from_rank_1".into(), "x".into()));
                            srv.barrier_out(puts);
                        }
                    }
                }
            });
            let (mut rd, mut wr) = ours.into_split();
            let input = input.to_vec();
            let writer = tokio::spawn(async move {
                // The server may close first (PMI-2 bad length): a broken pipe is fine.
                let _ = wr.write_all(&input).await;
                let _ = wr.shutdown().await;
            });
            let mut out = Vec::new();
            let stop = server.abort_handle();
            let finished = tokio::time::timeout(limit, rd.read_to_end(&mut out)).await.is_ok();
            let ended = if finished { tokio::time::timeout(limit, server).await.ok() } else { None };
            // A server left waiting would hold its socket and task for ever.
            stop.abort();
            tree.abort();
            writer.abort();
            match ended {
                Some(Ok(())) => Some(out),
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => None,
            }
        })
    })
}

/// How long a session may take: a PMI-2 `wait=TRUE` may wait forever by design, so such an
/// input gets a short limit and may time out.
fn limit_for(input: &[u8]) -> (Duration, bool) {
    let may_wait = input.windows(9).any(|w| w == b"wait=TRUE");
    if may_wait {
        (Duration::from_millis(200), true)
    } else {
        (Duration::from_secs(10), false)
    }
}

fn check_pmi1_session(bytes: &[u8]) {
    let (limit, may_wait) = limit_for(bytes);
    let Some(out) = session(bytes, limit) else {
        assert!(may_wait, "the PMI server stopped answering");
        return;
    };
    // Requests that failed to parse leave the rank free to switch to PMI-2 afterwards.
    let pmi2 = out.windows(PMI2_INIT.len()).position(|w| w == PMI2_INIT).unwrap_or(out.len());
    let answers = std::str::from_utf8(&out[..pmi2]).expect("PMI-1 answers are text");
    for line in answers.lines() {
        assert!(line.starts_with("cmd="), "answer {line:?}");
        assert!(line.len() <= 1023, "answer of {} bytes: MPICH reads 1024", line.len());
    }
    if pmi2 < out.len() {
        check_pmi2_answers(&out[pmi2..]);
    }
}

const PMI2_INIT: &[u8] = b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n";

fn check_pmi2_session(bytes: &[u8]) {
    let (limit, may_wait) = limit_for(bytes);
    let Some(out) = session(bytes, limit) else {
        assert!(may_wait, "the PMI-2 server stopped answering");
        return;
    };
    check_pmi2_answers(&out);
}

/// The init answer, then frames the client can parse: a length field, a body of that length
/// that parses, keys of at most 64 and values of at most 1024 bytes.
fn check_pmi2_answers(out: &[u8]) {
    assert!(out.starts_with(PMI2_INIT), "answer {:?}", text(out));
    let mut rest = &out[PMI2_INIT.len()..];
    while !rest.is_empty() {
        assert!(rest.len() >= LENGTH_FIELD, "a cut length field: {:?}", text(rest));
        let len = parse_length(&rest[..LENGTH_FIELD]).unwrap_or_else(|e| panic!("{e}"));
        let body = rest.get(LENGTH_FIELD..LENGTH_FIELD + len).unwrap_or_else(|| panic!("cut frame {:?}", text(rest)));
        let m = Message::parse(body).unwrap_or_else(|e| panic!("answer {:?}: {e}", text(body)));
        for (k, v) in &m.pairs {
            assert!(k.len() <= 64 && v.len() <= 1024, "answer {:?} has a key or value too long", text(body));
        }
        rest = &rest[LENGTH_FIELD + len..];
    }
}

// ---------------------------------------------------------------------------------------------
// PMI_process_mapping from the ranks of each node.

fn mapping_input() -> BoxedStrategy<Vec<u8>> {
    let valid = (1usize..40, 1usize..6, any::<u64>()).prop_map(|(ranks, nodes, seed)| {
        // Ranks 0..N dealt over the nodes by a seeded shuffle: blocks, cycles, irregular.
        let mut per_node = vec![vec![]; nodes];
        let mut x = seed | 1;
        for r in 0..ranks as u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let node = match seed % 3 {
                0 => r as usize * nodes / ranks,
                1 => r as usize % nodes,
                _ => x as usize % nodes,
            };
            per_node[node].push(r);
        }
        per_node
    });
    let any_ranks = vec(vec(prop_oneof![0u32..8, any::<u32>()], 0..4), 0..4);
    prop_oneof![3 => valid, 1 => any_ranks].prop_map(|m| serde_json::to_vec(&m).expect("encodes")).boxed()
}

fn check_mapping(bytes: &[u8]) {
    let Ok(per_node) = serde_json::from_slice::<Vec<Vec<u32>>>(bytes) else { return };
    let mapping = process_mapping(&per_node);
    let mut all: Vec<u32> = per_node.iter().flatten().copied().collect();
    all.sort_unstable();
    let exact = !all.is_empty() && all.iter().enumerate().all(|(i, &r)| r as usize == i);
    if exact {
        assert!(mapping.starts_with("(vector,(") && mapping.ends_with("))"), "{mapping:?}");
    } else {
        assert_eq!(mapping, "", "{per_node:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// hwloc synthetic descriptions (`berth up --topology "package:2 numa:2 core:4 pu:2"`).

const SYNTH_LEVELS: &[&str] =
    &["package", "pack", "numa", "NUMANode", "core", "pu", "l3", "l2", "l1d", "group", "die", "machine", "socket", ""];
/// Small counts (a legit node of many PUs takes hwloc seconds) and ones the limits refuse:
/// too many PUs, or too many objects under one parent (`core:2048 pu:2`).
const SYNTH_COUNTS: &[&str] = &[
    "1",
    "2",
    "4",
    "3",
    "0",
    "16",
    "0x10",
    "0x10000",
    "+65536",
    "2048",
    "0x800",
    "010",
    "1e3",
    "-1",
    "99999999999999999999",
    "",
];
const SYNTH_EXTRAS: &[&str] =
    &["(memory=1GB)", "[numa(memory=4GB)]", "(indexes=0,2,1,3)", "(indexes=pu:0,1)", "[mcdram]", "(", "]", " ", "\0"];

fn synthetic_spec() -> BoxedStrategy<String> {
    let level = (
        one_of(SYNTH_LEVELS),
        one_of(&[":", ":", ":", ""]),
        one_of(SYNTH_COUNTS),
        prop_oneof![5 => Just(String::new()), 1 => one_of(SYNTH_EXTRAS)],
    )
        .prop_map(|(l, c, n, x)| format!("{l}{c}{n}{x}"));
    prop_oneof![
        8 => vec(level, 1..5).prop_map(|levels| levels.join(" ")),
        1 => junk_text(16),
    ]
    .boxed()
}

/// hwloc reads the description (a C library: a crash here takes the agent down); what loads is
/// a valid topology within the PU limit, and loading takes little time.
fn check_synthetic(bytes: &[u8]) {
    let spec = text(bytes).into_owned();
    let mut loaded = None;
    // Up to 4 s: the generated counts keep accepted nodes small (hwloc takes seconds only near
    // the limits), so a longer load is a description the limits let through.
    assert_fast("loading a synthetic topology", 200_000, || {
        loaded = Some(load(&TopologySource::Synthetic(spec.clone())))
    });
    if let Some(Ok(topo)) = loaded {
        topo.validate().unwrap_or_else(|e| panic!("{spec:?} loaded invalid: {e}"));
        assert!(topo.pu_count() as u64 <= MAX_SYNTHETIC_PUS, "{spec:?} loaded {} PUs", topo.pu_count());
    }
}
