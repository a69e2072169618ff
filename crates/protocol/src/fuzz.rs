//! Fuzzing support (cargo feature `fuzzing`): generators of every message berth sends, and the
//! fuzz targets of the protocol: frames from arbitrary bytes, byte streams through
//! [`read_frame`], valid messages with random edits, round trips, the HTTP API's bodies. See
//! `berth_core::fuzz` for how targets are run.
//!
//! Properties: decoding never panics and reports errors as values; a message that decodes
//! encodes back to bytes that decode to the same message; every message berth can build
//! decodes to itself.

use crate::agent::{
    AgentMessage, AgentQuery, AgentReply, CgroupReport, CompatEnv, ControllerMessage, LaunchSpec, Registration, StepRef,
};
use crate::auth::{Envelope, SessionFrame};
use crate::client::{
    Accounting, AdvanceCreate, AdvanceInfo, ApiError, CgroupInfo, ClientRequest, ClientResponse, ErrorCode, IdResult,
    JobInfo, QueueInfo, SubmitRequest,
};
use crate::error::Refusal;
use crate::frame::{
    decode, encode, read_raw_frame_counted, FrameBudget, FrameLimits, READ_CHUNK, UNIDENTIFIED_FRAME_BYTES,
};
use crate::node::{NodeInfo, NumaInfo, PuHolder, SubnodeInfo};
use crate::reservation::{
    ConfirmRequest, ErrorBody, Holder, Inventory, InventoryNode, NodeHolder, NodeRequest, NumaFree, NumaMemory,
    OptionValue, ReservationInfo, ReservationReply, ReservationRequest, ReservationState, ReserveRequest,
    ReserveResources, ReservedNode,
};
use crate::step::{
    AllocationNode, Chunk, InteractiveAsk, ModexFailure, ModexReply, ModexRequest, RankExit, StepCreate, StepGrant,
    StepInfo, StepNode, StepOutcome, TaskInfo, TaskReply, TaskRequest, TreeDown, TreeUp,
};
use crate::user::UserIdentity;
use crate::{read_frame, PROTOCOL_VERSION};
use berth_core::directives::SubmitOptions;
use berth_core::fuzz::{
    self as core_fuzz, binding_mode, binding_strategy, finite_f64, job_id, job_outcome, job_state, junk_text,
    mutated_json, node_allocation, priority, queue_spec, rank_place, resource_request, share_line, short_text,
    step_request, submit_options, topology, Target,
};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// The targets of berth-protocol.
pub fn targets() -> Vec<Target> {
    vec![
        Target { name: "protocol/frame_bytes", input: frame_bytes_input, check: check_frame_bytes },
        Target { name: "protocol/frame_stream", input: frame_stream_input, check: check_frame_stream },
        Target { name: "protocol/json_mutation", input: json_mutation_input, check: check_kind_body },
        Target { name: "protocol/roundtrip", input: roundtrip_input, check: check_roundtrip },
        Target { name: "protocol/http_bodies", input: http_body_input, check: check_http_body },
        Target { name: "protocol/auth", input: auth_input, check: check_auth },
        Target {
            name: "protocol/small_parsers",
            input: || junk_text(12).prop_map(String::into_bytes).boxed(),
            check: check_small,
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// Message kinds: every type decoded from a berth connection.

/// A message's frame body: JSON with the protocol version, without the length prefix.
pub fn body<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut frame = encode(msg).expect("a generated message encodes");
    frame.drain(..4);
    frame
}

/// Decode `body` as a `T`; if it decodes, it must encode to a body that decodes to the same.
/// Returns whether it decoded.
pub fn decodes_stably<T: Serialize + DeserializeOwned + PartialEq + Debug>(body: &[u8]) -> bool {
    let Ok(msg) = decode::<T>(body) else { return false };
    let again = encode(&msg).unwrap_or_else(|e| panic!("{msg:?} decoded but does not encode: {e}"));
    match decode::<T>(&again[4..]) {
        Ok(back) => assert_eq!(back, msg, "re-encoded as {}", String::from_utf8_lossy(&again[4..])),
        Err(e) => {
            panic!("{msg:?} decoded, re-encoded as {}, does not decode: {e}", String::from_utf8_lossy(&again[4..]))
        }
    }
    true
}

/// `T` through its frame and back.
pub fn roundtrip<T: Serialize + DeserializeOwned>(msg: &T) -> T {
    decode(&body(msg)).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&body(msg))))
}

macro_rules! kinds {
    ($($name:literal => $ty:ty = $strategy:expr,)*) => {
        /// The message types read from berth's connections, by name.
        pub const KINDS: &[&str] = &[$($name),*];

        /// A valid message of kind `k` (index into [`KINDS`]) as a frame body.
        pub fn valid_body(k: usize) -> BoxedStrategy<Vec<u8>> {
            let mut i = 0;
            $(
                if k % KINDS.len() == i {
                    return $strategy.prop_map(|m| body(&m)).boxed();
                }
                i += 1;
            )*
            let _ = i;
            Just(vec![]).boxed()
        }

        /// Decode `body` as kind `k` ([`decodes_stably`]).
        pub fn decode_kind(k: usize, body: &[u8]) -> bool {
            let mut i = 0;
            $(
                if k % KINDS.len() == i {
                    return decodes_stably::<$ty>(body);
                }
                i += 1;
            )*
            let _ = i;
            false
        }
    };
}

kinds! {
    "client_request" => ClientRequest = client_request(),
    "client_response" => ClientResponse = client_response(),
    "agent_message" => AgentMessage = agent_message(),
    "controller_message" => ControllerMessage = controller_message(),
    "agent_query" => AgentQuery = agent_query(),
    "agent_reply" => AgentReply = agent_reply(),
    "tree_down" => TreeDown = tree_down(),
    "tree_up" => TreeUp = tree_up(),
    "task_request" => TaskRequest = task_request(),
    "task_reply" => TaskReply = task_reply(),
    "envelope" => Envelope = envelope(),
    "session_frame" => SessionFrame = session_frame(),
}

fn any_kind_body() -> BoxedStrategy<(usize, Vec<u8>)> {
    (0..KINDS.len()).prop_flat_map(|k| (Just(k), valid_body(k))).boxed()
}

// ---------------------------------------------------------------------------------------------
// Targets.

fn frame_bytes_input() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        2 => vec(any::<u8>(), 0..256),
        // A valid body with bytes overwritten.
        3 => (any_kind_body(), vec((any::<u32>(), any::<u8>()), 1..4)).prop_map(|((_, mut b), flips)| {
            for (at, byte) in flips {
                let at = at as usize % b.len();
                b[at] = byte;
            }
            b
        }),
        1 => junk_text(64).prop_map(|s| format!("{{\"v\":{PROTOCOL_VERSION},{s}").into_bytes()),
    ]
    .boxed()
}

/// Any bytes: decoded as every kind.
fn check_frame_bytes(bytes: &[u8]) {
    for k in 0..KINDS.len() {
        decode_kind(k, bytes);
    }
}

fn frame_stream_input() -> BoxedStrategy<Vec<u8>> {
    let piece = prop_oneof![
        // A whole frame.
        3 => any_kind_body().prop_map(|(_, b)| {
            let mut f = (b.len() as u32).to_be_bytes().to_vec();
            f.extend(b);
            f
        }),
        // A frame cut short, a length with no body, a huge length, garbage.
        1 => any_kind_body().prop_map(|(_, b)| {
            let mut f = (b.len() as u32).to_be_bytes().to_vec();
            f.extend(&b[..b.len() / 2]);
            f
        }),
        1 => prop_oneof![Just(0u32), Just(1), Just(16 << 20), Just((16 << 20) + 1), Just(u32::MAX), any::<u32>()]
            .prop_map(|n| n.to_be_bytes().to_vec()),
        1 => vec(any::<u8>(), 0..16),
    ];
    vec(piece, 0..5).prop_map(|v| v.concat()).boxed()
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
}

/// A byte stream read frame by frame, as the controller and agents read their connections:
/// every read ends (a message, an error or the end), and the stream is used up.
fn check_frame_stream(bytes: &[u8]) {
    RUNTIME.with(|rt| {
        rt.block_on(async {
            for kind in 0..2 {
                let mut r: &[u8] = bytes;
                let mut reads = 0;
                loop {
                    reads += 1;
                    assert!(reads <= bytes.len() / 4 + 2, "more frames than the stream can hold");
                    let result = if kind == 0 {
                        read_frame::<_, ClientRequest>(&mut r).await.map(|m| m.is_some())
                    } else {
                        read_frame::<_, AgentMessage>(&mut r).await.map(|m| m.is_some())
                    };
                    match result {
                        Ok(true) => {}
                        Ok(false) | Err(_) => break,
                    }
                }
            }
            // Slow and partial peers: the stream a few bytes per read, under the limits of an
            // unidentified peer and a shared budget. A frame's buffer never outgrows what
            // arrived (twice it, or one chunk), whatever length was announced, and every byte
            // taken from the budget is given back.
            let step = bytes.len() % 7 + 1;
            let budget = FrameBudget::new(4 * READ_CHUNK, "the fuzz target's");
            for max_bytes in [UNIDENTIFIED_FRAME_BYTES, crate::MAX_FRAME_BYTES] {
                let limits = FrameLimits { max_bytes, budget: Some(&budget), ..FrameLimits::default() };
                let mut r = Slow { data: bytes, step };
                for _ in 0..bytes.len() / 4 + 2 {
                    let before = r.data.len();
                    let mut peak = 0;
                    let result = read_raw_frame_counted(&mut r, &limits, &mut peak).await;
                    let arrived = before - r.data.len();
                    assert!(peak <= 2 * arrived + READ_CHUNK, "{arrived} bytes arrived, a buffer of {peak}");
                    assert_eq!(budget.used(), 0, "the budget is given back");
                    match result {
                        Ok(Some(body)) => assert!(body.len() <= max_bytes),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        })
    });
}

/// A peer sending `step` bytes per read.
struct Slow<'a> {
    data: &'a [u8],
    step: usize,
}

impl tokio::io::AsyncRead for Slow<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.step.min(buf.remaining()).min(self.data.len());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        std::task::Poll::Ready(Ok(()))
    }
}

fn json_mutation_input() -> BoxedStrategy<Vec<u8>> {
    any_kind_body()
        .prop_flat_map(|(k, b)| {
            let value: serde_json::Value = serde_json::from_slice(&b).expect("a body is JSON");
            (Just(k), mutated_json(value))
        })
        .prop_map(|(k, b)| kind_input(k, &b))
        .boxed()
}

/// Input of a typed target: the kind's index, then the body.
fn kind_input(k: usize, body: &[u8]) -> Vec<u8> {
    let mut input = vec![k as u8];
    input.extend_from_slice(body);
    input
}

/// Input `K` + body: decoded as kind K (and, as a peer might, as every other kind).
fn check_kind_body(bytes: &[u8]) {
    let Some((&k, body)) = bytes.split_first() else { return };
    decode_kind(k as usize, body);
    for other in 0..KINDS.len() {
        decode_kind(other, body);
    }
}

fn roundtrip_input() -> BoxedStrategy<Vec<u8>> {
    any_kind_body().prop_map(|(k, b)| kind_input(k, &b)).boxed()
}

/// Input `K` + a body berth built: it must decode, and stably.
fn check_roundtrip(bytes: &[u8]) {
    let Some((&k, body)) = bytes.split_first() else { return };
    assert!(
        decode_kind(k as usize, body),
        "a {} built by berth does not decode: {}",
        KINDS[k as usize % KINDS.len()],
        String::from_utf8_lossy(body)
    );
}

// ---------------------------------------------------------------------------------------------
// Authentication: signed envelopes, session frames and step grants made with one key and then
// edited (or made up) must never verify under it, and checking them must never panic.

const FUZZ_KEY: [u8; 32] = [0x42; 32];

/// Input tags of the auth target.
const AUTH_EDITED: u8 = 0;
const AUTH_OTHER: u8 = 1;

fn auth_input() -> BoxedStrategy<Vec<u8>> {
    use crate::auth::{session, sign_grant, ClusterKey, Envelope, Role, LABEL_REGISTER};
    let key = ClusterKey::from_bytes(FUZZ_KEY);
    let k2 = key.clone();
    // A session frame as `write_sealed` sends it, then one byte of it edited: `AUTH_EDITED`,
    // the byte's place (4 bytes), the XOR (1 byte), the frame's JSON.
    let edited = (agent_message(), any::<u32>(), 1..=255u8).prop_map(move |(m, at, x)| {
        let (mut tx, _) = session(&k2, &[1; 16], &[2; 16], Role::Agent);
        let frame = tx.seal_frame(&m).expect("seals");
        let mut input = vec![AUTH_EDITED];
        input.extend_from_slice(&at.to_be_bytes());
        input.push(x);
        input.extend_from_slice(&frame[4..]);
        input
    });
    let signed = prop_oneof![
        agent_message().prop_map(move |m| body(&Envelope::seal(&key, LABEL_REGISTER, &m).expect("seals"))),
        step_grant().prop_map(|mut g| {
            sign_grant(&ClusterKey::from_bytes(FUZZ_KEY), &mut g, u64::MAX);
            body(&g)
        }),
    ];
    // Flip one byte of what was signed (inside the JSON), or make it up entirely.
    let other = prop_oneof![
        (signed, any::<usize>(), 1..=255u8).prop_map(|(mut b, at, x)| {
            let i = at % b.len().max(1);
            if let Some(c) = b.get_mut(i) {
                *c ^= x;
            }
            b
        }),
        vec(any::<u8>(), 0..256),
        (envelope(), session_frame()).prop_map(|(e, f)| [body(&e), body(&f)].concat()),
    ]
    .prop_map(|b| [vec![AUTH_OTHER], b].concat());
    prop_oneof![2 => edited, 3 => other].boxed()
}

fn check_auth(bytes: &[u8]) {
    use crate::auth::{now_ms, session, verify_grant, ClusterKey, Envelope, ReplayGuard, Role, LABEL_REGISTER};
    let key = ClusterKey::from_bytes(FUZZ_KEY);
    let Some((&tag, bytes)) = bytes.split_first() else { return };
    if tag == AUTH_EDITED && bytes.len() > 5 {
        // The MAC covers the body's bytes as sent: the frame as sealed opens to its message;
        // edited in any one byte it is refused, or (a hex digit of the MAC changing case) opens
        // to the very same message. Never to another one.
        let (at, x, frame) = (u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]), bytes[4], &bytes[5..]);
        let (_, mut rx) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        let Ok(original) = rx.open_frame::<AgentMessage>(frame) else { return };
        let mut edited = frame.to_vec();
        let i = at as usize % edited.len();
        edited[i] ^= x;
        let (_, mut rx) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        if let Ok(m) = rx.open_frame::<AgentMessage>(&edited) {
            assert_eq!(m, original, "an edited frame opened to another message");
            assert!(edited[i].eq_ignore_ascii_case(&frame[i]), "byte {i} edited, and the frame still opens");
        }
        return;
    }
    if let Ok(env) = decode::<Envelope>(bytes) {
        let mut guard = ReplayGuard::default();
        let _ = env.open(&key, LABEL_REGISTER, &mut guard, now_ms());
        let _ = env.verify(&key, LABEL_REGISTER);
    }
    if let Ok(f) = decode::<SessionFrame>(bytes) {
        let (_, mut rx) = session(&key, &[1; 16], &[2; 16], Role::Controller);
        let _ = rx.open::<AgentMessage>(&f);
    }
    let (_, mut rx) = session(&key, &[1; 16], &[2; 16], Role::Controller);
    let _ = rx.open_frame::<AgentMessage>(bytes);
    if let Ok(g) = decode::<StepGrant>(bytes) {
        let _ = verify_grant(&key, &g, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// The HTTP API's request bodies (controller/src/api: `serde_json::from_slice` of the body, an
// empty body read as `{}`), and what the controller then does with their values.

fn http_body_input() -> BoxedStrategy<Vec<u8>> {
    let reserve = reserve_request().prop_map(|r| serde_json::to_value(r).expect("encodes"));
    let confirm = confirm_request().prop_map(|r| serde_json::to_value(r).expect("encodes"));
    prop_oneof![
        2 => (reserve.clone(), any::<bool>()).prop_map(|(v, b)| (u8::from(b), serde_json::to_vec(&v).expect("encodes"))),
        3 => reserve.prop_flat_map(mutated_json).prop_map(|b| (0, b)),
        2 => confirm.prop_flat_map(mutated_json).prop_map(|b| (1, b)),
        1 => vec(any::<u8>(), 0..64).prop_map(|b| (2, b)),
        1 => junk_text(24).prop_map(|s| (2, s.into_bytes())),
    ]
    .prop_map(|(k, b)| kind_input(k.into(), &b))
    .boxed()
}

fn check_http_body(bytes: &[u8]) {
    let Some((_, body)) = bytes.split_first() else { return };
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    if let Ok(r) = serde_json::from_slice::<ReserveRequest>(body) {
        let again: ReserveRequest = serde_json::from_slice(&serde_json::to_vec(&r).expect("encodes")).expect("decodes");
        assert_eq!(again, r);
        // The controller reads each value as `berth submit` reads the flag's text.
        let mut opts = SubmitOptions::default();
        for (name, value) in r.resources.entries() {
            let _ = opts.set(name, &value.as_text());
        }
        let _ = opts.request().shape();
        let _ = berth_core::units::parse_duration_secs(&r.walltime.as_text());
        for n in &r.node_list {
            if let Some(cpus) = &n.cpus {
                let _ = berth_core::CpuSet::parse_list(cpus);
            }
        }
    }
    if let Ok(c) = serde_json::from_slice::<ConfirmRequest>(body) {
        let _ = c.holder();
    }
    let _ = serde_json::from_slice::<ErrorBody>(body);
}

fn check_small(bytes: &[u8]) {
    let s = core_fuzz::text(bytes);
    if let Some(n) = crate::step::parse_signal(&s) {
        assert!((1..=64).contains(&n));
        let name = crate::step::signal_name(n);
        if name != "?" {
            assert_eq!(crate::step::parse_signal(name), Some(n));
        }
    }
    if let Some(st) = ReservationState::parse(&s) {
        assert_eq!(st.as_str(), s);
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies: every message berth sends.

fn text() -> BoxedStrategy<String> {
    short_text()
}

fn texts() -> BoxedStrategy<Vec<String>> {
    vec(text(), 0..3).boxed()
}

/// Named counts (generic resources, licenses).
fn counts() -> BoxedStrategy<berth_core::gres::Counts> {
    proptest::collection::btree_map(text(), any::<u32>(), 0..3).boxed()
}

fn env() -> BoxedStrategy<Vec<(String, String)>> {
    vec((text(), text()), 0..3).boxed()
}

fn ids() -> BoxedStrategy<Vec<berth_core::JobId>> {
    vec(job_id(), 0..3).boxed()
}

fn f64_opt() -> BoxedStrategy<Option<f64>> {
    of(finite_f64()).boxed()
}

pub fn user_identity() -> BoxedStrategy<UserIdentity> {
    (any::<u32>(), any::<u32>(), vec(any::<u32>(), 0..3), text())
        .prop_map(|(uid, gid, groups, name)| UserIdentity { uid, gid, groups, name })
        .boxed()
}

pub fn cgroup_report() -> BoxedStrategy<CgroupReport> {
    (text(), text(), text(), of(any::<u32>()))
        .prop_map(|(path, cpus, mems, rank)| CgroupReport { path, cpus, mems, rank })
        .boxed()
}

pub fn registration() -> BoxedStrategy<Registration> {
    ((text(), text(), text(), text(), text()), topology(), text(), ids(), ids(), any::<bool>(), step_refs())
        .prop_map(
            |((name, hostname, address, instance, version), topology, real_cpus, running, ended, lease, steps)| {
                Registration {
                    name,
                    hostname,
                    address,
                    instance,
                    version,
                    topology,
                    real_cpus,
                    running,
                    ended,
                    lease,
                    steps,
                }
            },
        )
        .boxed()
}

pub fn step_refs() -> BoxedStrategy<Option<Vec<StepRef>>> {
    of(vec((job_id(), any::<u32>()).prop_map(|(job, step)| StepRef { job, step }), 0..3)).boxed()
}

pub fn agent_message() -> BoxedStrategy<AgentMessage> {
    prop_oneof![
        registration().prop_map(|r| AgentMessage::Register(Box::new(r))),
        (ids(), any::<u64>(), step_refs()).prop_map(|(running, seq, steps)| AgentMessage::Heartbeat {
            running,
            seq,
            steps
        }),
        (job_id(), any::<u32>(), any::<i32>(), of(text()))
            .prop_map(|(job, step, exit_code, failure)| AgentMessage::StepEnded { job, step, exit_code, failure }),
        (job_id(), any::<u32>(), vec(cgroup_report(), 0..3)).prop_map(|(id, pid, cgroups)| AgentMessage::JobStarted {
            id,
            pid,
            cgroups
        }),
        (job_id(), job_outcome()).prop_map(|(id, outcome)| AgentMessage::JobEnded { id, outcome }),
        (job_id(), of(text())).prop_map(|(id, error)| AgentMessage::Suspended { id, error }),
        (job_id(), of(text()), vec(cgroup_report(), 0..2)).prop_map(|(id, error, cgroups)| AgentMessage::Resumed {
            id,
            error,
            cgroups
        }),
        (any::<bool>(), of(job_id()), text()).prop_map(|(auth, job, detail)| AgentMessage::Refused {
            what: if auth { Refusal::Auth } else { Refusal::Launch },
            job,
            detail
        }),
    ]
    .boxed()
}

/// A signed message's body: a message's JSON, or any JSON value.
fn signed_body() -> BoxedStrategy<crate::auth::Body> {
    prop_oneof![
        agent_message().prop_map(|m| crate::auth::to_body(&m).expect("a message encodes")),
        controller_message().prop_map(|m| crate::auth::to_body(&m).expect("a message encodes")),
        text().prop_map(|t| crate::auth::to_body(&t).expect("a string encodes")),
    ]
    .boxed()
}

pub fn envelope() -> BoxedStrategy<Envelope> {
    (any::<u64>(), text(), signed_body(), text())
        .prop_map(|(ts, nonce, body, mac)| Envelope { ts, nonce, body, mac })
        .boxed()
}

pub fn session_frame() -> BoxedStrategy<SessionFrame> {
    (any::<u64>(), signed_body(), text()).prop_map(|(seq, body, mac)| SessionFrame { seq, body, mac }).boxed()
}

pub fn launch_spec() -> BoxedStrategy<LaunchSpec> {
    (
        (job_id(), text(), user_identity(), env(), text(), text(), text(), text()),
        (node_allocation(), vec((text(), any::<u32>()), 0..3), of(any::<u64>()), any::<bool>(), texts()),
        (
            any::<u64>(),
            of(binding_mode()),
            of(text()),
            of(step_grant()),
            of(any::<u32>()),
            of(any::<u64>()),
            any::<bool>(),
            of((of(any::<u32>()), of(any::<u32>()), text()).prop_map(|(cpus_per_task, tasks_per_node, queue)| {
                CompatEnv { cpus_per_task, tasks_per_node, queue, tasks: None }
            })),
        ),
    )
        .prop_map(
            |(
                (id, name, user, env, cwd, script, stdout, stderr),
                (allocation, nodes, walltime_seconds, head, addresses),
                (kill_grace_ms, binding_mode, rankfile, step, umask, pids_max, fence, compat),
            )| LaunchSpec {
                id,
                name,
                user,
                env,
                cwd,
                script,
                stdout,
                stderr,
                allocation,
                nodes: nodes.clone(),
                walltime_seconds,
                head,
                addresses,
                kill_grace_ms,
                binding_mode,
                rankfile,
                step: step.map(Box::new),
                umask,
                pids_max,
                fence,
                compat,
                workdir: None,
                early_signal: None,
                open_append: head && fence,
                // Some launches with GPUs on every node, others without.
                node_gpus: if head { nodes.iter().map(|(_, c)| vec![c % 8]).collect() } else { vec![] },
            },
        )
        .boxed()
}

pub fn controller_message() -> BoxedStrategy<ControllerMessage> {
    prop_oneof![
        (any::<u32>(), any::<u64>(), of(any::<u64>()), any::<bool>()).prop_map(
            |(node_id, heartbeat_interval_ms, lease_ms, step_ends)| ControllerMessage::Registered {
                node_id,
                heartbeat_interval_ms,
                lease_ms,
                step_ends
            }
        ),
        (job_id(), any::<u32>()).prop_map(|(job, step)| ControllerMessage::StepEndAck { job, step }),
        any::<u64>().prop_map(|seq| ControllerMessage::Renew { seq }),
        text().prop_map(|reason| ControllerMessage::Rejected { reason }),
        launch_spec().prop_map(|l| ControllerMessage::Launch(Box::new(l))),
        (job_id(), text()).prop_map(|(id, reason)| ControllerMessage::Kill { id, reason }),
        job_id().prop_map(|id| ControllerMessage::EndAck { id }),
        (job_id(), of(any::<u32>()), any::<i32>()).prop_map(|(id, step, signal)| ControllerMessage::Signal {
            id,
            step,
            signal
        }),
        job_id().prop_map(|id| ControllerMessage::Suspend { id }),
        (job_id(), of(node_allocation())).prop_map(|(id, allocation)| ControllerMessage::Resume { id, allocation }),
        (job_id(), any::<u64>())
            .prop_map(|(id, walltime_seconds)| ControllerMessage::SetWalltime { id, walltime_seconds }),
    ]
    .boxed()
}

pub fn submit_request() -> BoxedStrategy<SubmitRequest> {
    (text(), text(), submit_options(), env(), text(), any::<bool>(), any::<bool>())
        .prop_map(|(script, script_name, options, env, cwd, hold, ignore_unsupported)| SubmitRequest {
            script,
            script_name,
            options,
            env,
            cwd,
            hold,
            ignore_unsupported,
        })
        .boxed()
}

pub fn step_create() -> BoxedStrategy<StepCreate> {
    (
        (of(job_id()), step_request(), of(any::<u32>()), of(any::<u64>()), texts(), env(), vec(app(), 0..3)),
        (text(), text(), any::<u32>(), any::<u32>(), any::<bool>(), any::<bool>(), of(any::<i32>()), of(mpi_kind())),
        (of(any::<u32>()), of(any::<u32>()), of(text()), of(any::<u32>()), of(any::<u32>()), counts(), counts()),
    )
        .prop_map(
            |(
                (job, request, nodes, walltime_seconds, argv, env, apps),
                (cwd, host, pid, fanout, no_kill, rank_cpusets, notify_signal, mpi),
                (gpus, gpus_per_node, gpu_type, gpus_per_socket, sockets_per_node, gres, licenses),
            )| StepCreate {
                job,
                request,
                interactive: InteractiveAsk {
                    nodes,
                    walltime_seconds,
                    gpus,
                    gpus_per_node,
                    gpu_type,
                    gpus_per_socket,
                    sockets_per_node,
                    gres,
                    licenses,
                },
                argv,
                env,
                cwd,
                host,
                pid,
                fanout,
                no_kill,
                rank_cpusets,
                notify_signal,
                mpi,
                apps,
                spawned_by: None,
            },
        )
        .boxed()
}

/// One program of an MPMD step.
pub fn app() -> BoxedStrategy<berth_core::step::mpmd::App> {
    (
        texts(),
        env(),
        of(text()),
        vec((any::<u32>(), any::<u32>()), 0..3),
        any::<bool>(),
        any::<bool>(),
        of(step_request()),
        of(any::<bool>()),
    )
        .prop_map(|(argv, env, cwd, ranks, rest, expand, request, bind)| berth_core::step::mpmd::App {
            argv,
            env,
            cwd,
            ranks,
            rest,
            expand,
            request,
            bind,
        })
        .boxed()
}

pub fn mpi_kind() -> BoxedStrategy<berth_core::step::MpiKind> {
    use berth_core::step::MpiKind;
    prop::sample::select(vec![MpiKind::Auto, MpiKind::Pmix, MpiKind::Pmi2, MpiKind::Pmi1, MpiKind::None]).boxed()
}

pub fn rank_exit() -> BoxedStrategy<RankExit> {
    (any::<u32>(), text(), of(any::<i32>()), of(any::<i32>()), of(text()))
        .prop_map(|(rank, node, exit_code, signal, reason)| RankExit { rank, node, exit_code, signal, reason })
        .boxed()
}

pub fn step_outcome() -> BoxedStrategy<StepOutcome> {
    (any::<i32>(), vec(rank_exit(), 0..3), of(text()), any::<u64>())
        .prop_map(|(exit_code, failures, failed_at, wall_ms)| StepOutcome { exit_code, failures, failed_at, wall_ms })
        .boxed()
}

pub fn option_value() -> BoxedStrategy<OptionValue> {
    prop_oneof![
        any::<u64>().prop_map(OptionValue::Number),
        prop_oneof![text(), core_fuzz::option_value("mem"), core_fuzz::option_value("walltime")]
            .prop_map(OptionValue::Text),
        any::<bool>().prop_map(OptionValue::Switch),
    ]
    .boxed()
}

pub fn reserve_request() -> BoxedStrategy<ReserveRequest> {
    let opt = || of(option_value());
    let resources = ((opt(), opt(), opt(), opt(), opt(), opt(), opt(), opt()), (opt(), opt(), opt(), opt(), opt()))
        .prop_map(
            |(
                (nodes, cores, tasks_per_node, cpus_per_task, mem, mem_per_cpu, threads, property),
                (gpus, gpus_per_node, gpu_type, gres, licenses),
            )| {
                ReserveResources {
                    nodes,
                    cores,
                    tasks_per_node,
                    cpus_per_task,
                    mem,
                    mem_per_cpu,
                    threads,
                    property,
                    gpus,
                    gpus_per_node,
                    gpu_type,
                    gres,
                    licenses,
                }
            },
        );
    let node = (text(), of(prop_oneof![text(), core_fuzz::option_value("cores")]), vec(any::<u32>(), 0..3), counts())
        .prop_map(|(node, cpus, gpus, gres)| NodeRequest { node, cpus, gpus, gres });
    (of(text()), resources, option_value(), vec(node, 0..3), of(text()))
        .prop_map(|(user, resources, walltime, node_list, account)| ReserveRequest {
            user,
            resources,
            walltime,
            node_list,
            account,
        })
        .boxed()
}

pub fn confirm_request() -> BoxedStrategy<ConfirmRequest> {
    (of(job_id()), of(any::<u32>()), of(text()))
        .prop_map(|(job, pid, session)| ConfirmRequest { job, pid, session })
        .boxed()
}

pub fn reservation_request() -> BoxedStrategy<ReservationRequest> {
    prop_oneof![
        Just(ReservationRequest::Inventory),
        any::<bool>().prop_map(|all| ReservationRequest::List { all }),
        any::<u64>().prop_map(|id| ReservationRequest::Show { id }),
        reserve_request().prop_map(|body| ReservationRequest::Reserve { body }),
        (any::<u64>(), confirm_request()).prop_map(|(id, body)| ReservationRequest::Confirm { id, body }),
        any::<u64>().prop_map(|id| ReservationRequest::Renew { id }),
        any::<u64>().prop_map(|id| ReservationRequest::Release { id }),
    ]
    .boxed()
}

pub fn advance_create() -> BoxedStrategy<AdvanceCreate> {
    (of(text()), f64_opt(), f64_opt(), of(any::<u64>()), texts(), of(any::<u32>()), of(any::<u32>()), of(any::<u64>()))
        .prop_flat_map(|head| (Just(head), texts(), texts(), of(any::<u32>()), counts(), counts()))
        .prop_map(
            |(
                (name, start, end, duration_secs, nodes, cores, nodes_count, mem),
                users,
                accounts,
                gpus,
                gres,
                licenses,
            )| {
                AdvanceCreate {
                    name,
                    start,
                    end,
                    duration_secs,
                    nodes,
                    cores,
                    nodes_count,
                    mem,
                    gpus,
                    gres,
                    licenses,
                    users,
                    accounts,
                }
            },
        )
        .boxed()
}

pub fn job_change() -> BoxedStrategy<crate::client::JobChange> {
    (
        of(any::<u64>()),
        of(any::<u32>()),
        of(any::<u32>()),
        of(any::<u32>()),
        of(any::<u32>()),
        of(any::<u32>()),
        of(text()),
        of(text()),
        of(text()),
        of(any::<u32>()),
    )
        .prop_flat_map(|head| {
            (Just(head), of(counts()), of(counts()), (of(any::<u32>()), of(any::<u32>()), of(text())))
        })
        .prop_map(
            |(
                (walltime, cores, nodes, tasks_per_node, cpus_per_task, tasks, queue, name, dependency, priority),
                gres,
                licenses,
                (gpus, gpus_per_node, gpu_type),
            )| {
                crate::client::JobChange {
                    walltime,
                    cores,
                    nodes,
                    tasks_per_node,
                    cpus_per_task,
                    tasks,
                    queue,
                    name,
                    dependency,
                    priority,
                    gres,
                    licenses,
                    gpus,
                    gpus_per_node,
                    gpu_type,
                }
            },
        )
        .boxed()
}

pub fn client_request() -> BoxedStrategy<ClientRequest> {
    prop_oneof![
        Just(ClientRequest::Ping),
        submit_request().prop_map(|s| ClientRequest::Submit(Box::new(s))),
        vec(submit_request(), 0..3).prop_map(|jobs| ClientRequest::SubmitBatch { jobs }),
        (vec(job_state(), 0..3), any::<bool>()).prop_map(|(states, all)| ClientRequest::ListJobs { states, all }),
        job_id().prop_map(|id| ClientRequest::ShowJob { id }),
        (ids(), ids()).prop_map(|(ids, only)| ClientRequest::Cancel { ids, only }),
        ids().prop_map(|ids| ClientRequest::Hold { ids, only: vec![] }),
        ids().prop_map(|ids| ClientRequest::Release { ids, only: vec![] }),
        any::<bool>().prop_map(|topology| ClientRequest::ListNodes { topology }),
        (text(), text(), of(text())).prop_map(|(name, action, value)| ClientRequest::NodeAdmin { name, action, value }),
        (text(), any::<u32>(), text(), of(text()))
            .prop_map(|(node, index, action, value)| ClientRequest::SubnodeAdmin { node, index, action, value }),
        (of(any::<u32>()), any::<bool>(), f64_opt(), f64_opt(), texts(), any::<bool>(), any::<bool>()).prop_map(
            |(limit, steps, since, until, users, active, with_steps)| ClientRequest::Acct {
                limit,
                steps,
                since,
                until,
                users,
                active,
                with_steps
            }
        ),
        step_create().prop_map(|s| ClientRequest::StepCreate(Box::new(s))),
        (job_id(), any::<u32>(), step_outcome()).prop_map(|(job, step, outcome)| ClientRequest::StepEnd {
            job,
            step,
            outcome
        }),
        (job_id(), of(any::<u32>()), any::<i32>()).prop_map(|(job, step, signal)| ClientRequest::Signal {
            job,
            step,
            signal
        }),
        Just(ClientRequest::Share),
        Just(ClientRequest::Queues),
        reservation_request().prop_map(|r| ClientRequest::Reservation { request: Box::new(r) }),
        ids().prop_map(|ids| ClientRequest::Suspend { ids }),
        ids().prop_map(|ids| ClientRequest::Resume { ids }),
        (job_id(), job_change(), any::<bool>()).prop_map(|(id, change, task_only)| ClientRequest::Update {
            id,
            change: Box::new(change),
            task_only
        }),
        ids().prop_map(|ids| ClientRequest::Requeue { ids, only: vec![] }),
        advance_create().prop_map(|a| ClientRequest::AdvanceCreate(Box::new(a))),
        (submit_request(), any::<bool>()).prop_map(|(submit, no_shell)| ClientRequest::Alloc(Box::new(
            crate::client::AllocRequest { submit, no_shell }
        ))),
        (job_id(), any::<i32>()).prop_map(|(id, exit_code)| ClientRequest::AllocEnd { id, exit_code }),
        job_id().prop_map(|id| ClientRequest::AllocHold { id }),
        Just(ClientRequest::AdvanceList),
        text().prop_map(|name| ClientRequest::AdvanceDelete { name }),
        (of(any::<u64>()), prop::collection::vec(text(), 0..3), of(job_id()), of(text()), of(any::<u32>())).prop_map(
            |(after_id, kinds, job, node, limit)| ClientRequest::Events(crate::client::EventQuery {
                after_id,
                kinds,
                job,
                node,
                limit
            })
        ),
    ]
    .boxed()
}

/// Any code of the one table (docs/errors.md).
pub fn error_code() -> BoxedStrategy<ErrorCode> {
    prop::sample::select(ErrorCode::ALL.to_vec()).boxed()
}

pub fn api_error() -> BoxedStrategy<ApiError> {
    (error_code(), text()).prop_map(|(code, message)| ApiError { code, message }).boxed()
}

pub fn step_info() -> BoxedStrategy<StepInfo> {
    (
        (job_id(), any::<u32>(), text(), any::<u32>(), finite_f64(), f64_opt(), text(), any::<u32>()),
        (text(), texts(), any::<u32>(), texts(), of(any::<i32>()), of(text()), any::<bool>()),
    )
        .prop_map(
            |(
                (job, step, user, uid, start_time, end_time, host, pid),
                (cwd, argv, size, nodes, exit_code, failure, interactive),
            )| StepInfo {
                job,
                step,
                user,
                uid,
                start_time,
                end_time,
                host,
                pid,
                cwd,
                argv,
                size,
                nodes,
                exit_code,
                failure,
                interactive,
            },
        )
        .boxed()
}

pub fn job_info() -> BoxedStrategy<JobInfo> {
    let accounting = (finite_f64(), finite_f64(), finite_f64(), any::<u64>(), finite_f64()).prop_map(
        |(wall_seconds, user_cpu_seconds, system_cpu_seconds, peak_memory_bytes, gpu_seconds)| Accounting {
            wall_seconds,
            user_cpu_seconds,
            system_cpu_seconds,
            peak_memory_bytes,
            gpu_seconds,
        },
    );
    let cgroup = (text(), text(), text(), text(), of(any::<u32>()))
        .prop_map(|(node, path, cpus, mems, rank)| CgroupInfo { node, path, cpus, mems, rank });
    (
        (job_id(), text(), text(), any::<u32>(), any::<u32>(), job_state(), text(), resource_request()),
        (of(any::<u64>()), finite_f64(), f64_opt(), f64_opt(), vec(node_allocation(), 0..2), of(any::<i32>())),
        (of(any::<i32>()), of(text()), text(), text(), text(), of(accounting)),
        (of(binding_strategy()), of(binding_mode()), vec(cgroup, 0..2), vec(step_info(), 0..2), text()),
        (of(priority()), f64_opt(), f64_opt()),
    )
        .prop_map(
            |(
                (id, name, user, uid, gid, state, queue, request),
                (walltime_seconds, submit_time, start_time, end_time, allocation, exit_code),
                (signal, reason, cwd, stdout, stderr, accounting),
                (binding, binding_mode, cgroups, steps, account),
                (priority, expected_start, suspended_seconds),
            )| JobInfo {
                id,
                name,
                user,
                uid,
                gid,
                state,
                queue,
                request,
                walltime_seconds,
                submit_time,
                start_time,
                end_time,
                allocation,
                exit_code,
                signal,
                // Any text, as a peer might send (the code's words are not checked).
                reason_code: reason.clone(),
                reason,
                cwd,
                stdout,
                stderr,
                accounting,
                binding,
                binding_mode,
                cgroups,
                steps,
                account,
                priority,
                expected_start,
                suspended_seconds,
                kind: None,
                dependency: None,
                begin_time: None,
                array_job: None,
                array_index: None,
                array_limit: None,
                array_count: None,
                comment: None,
                work_dir: None,
                mail_type: None,
                mail_user: None,
                early_signal: None,
                exclusive: false,
                tasks: None,
                gpu_places: vec![],
                billing: None,
            },
        )
        .boxed()
}

pub fn node_info() -> BoxedStrategy<NodeInfo> {
    let numa = (any::<u32>(), any::<u64>(), any::<u64>(), text(), of(job_id()), any::<bool>()).prop_map(
        |(os_index, memory_bytes, allocated_bytes, cpus, exclusive_job, special)| NumaInfo {
            os_index,
            memory_bytes,
            allocated_bytes,
            cpus,
            exclusive_job,
            special,
            memory_source: Default::default(),
        },
    );
    let subnode = (any::<u32>(), text(), text(), texts()).prop_map(|(index, numa, state, properties)| SubnodeInfo {
        index,
        numa,
        state,
        properties,
    });
    let holder = (job_id(), text()).prop_map(|(job, cpus)| PuHolder { job, cpus });
    (
        (any::<u32>(), text(), text(), text(), any::<usize>(), any::<usize>(), any::<usize>(), text()),
        (text(), any::<usize>(), any::<u64>(), any::<u64>(), vec(numa, 0..2), text(), ids(), f64_opt()),
        (text(), vec(subnode, 0..2), of(topology()), vec(holder, 0..2)),
    )
        .prop_map(
            |(
                (id, name, state, address, sockets, cores, pus, topology),
                (free, cpus_allocated, memory_bytes, memory_allocated_bytes, numa, real_cpus, jobs, last_heard),
                (system_cpus, subnodes, layout, pu_jobs),
            )| NodeInfo {
                id,
                name,
                state,
                address,
                sockets,
                cores,
                pus,
                topology,
                free,
                cpus_allocated,
                memory_bytes,
                memory_allocated_bytes,
                numa,
                real_cpus,
                jobs,
                last_heard_seconds_ago: last_heard,
                system_cpus,
                subnodes,
                layout,
                pu_jobs,
                gpus: vec![],
                gpus_allocated: 0,
                gpu_jobs: vec![],
                gres: vec![],
            },
        )
        .boxed()
}

pub fn queue_info() -> BoxedStrategy<QueueInfo> {
    (queue_spec(), finite_f64(), any::<usize>(), any::<usize>(), any::<usize>(), any::<u64>())
        .prop_map(|(spec, priority_factor, queued, held, running, running_cores)| QueueInfo {
            spec,
            priority_factor,
            queued,
            held,
            running,
            running_cores,
        })
        .boxed()
}

pub fn step_grant() -> BoxedStrategy<StepGrant> {
    let node = (text(), text(), vec(rank_place(), 0..3), text())
        .prop_map(|(name, address, ranks, instance)| StepNode { name, address, ranks, instance });
    (
        (job_id(), any::<u32>(), text(), user_identity(), texts(), env(), text()),
        (any::<u32>(), any::<u32>(), any::<bool>(), any::<bool>(), any::<bool>(), of(any::<i32>()), any::<u64>()),
        (vec(node, 0..3), any::<bool>(), any::<u64>(), text(), any::<bool>(), mpi_kind(), vec(app(), 0..3)),
    )
        .prop_map(
            |(
                (job, step, kvsname, user, argv, env, cwd),
                (size, fanout, no_kill, rank_cpusets, bind, notify_signal, kill_grace_ms),
                (nodes, interactive, expires_ms, mac, attach, mpi, apps),
            )| StepGrant {
                job,
                step,
                kvsname,
                user,
                argv,
                env,
                cwd,
                size,
                fanout,
                no_kill,
                rank_cpusets,
                bind,
                notify_signal,
                kill_grace_ms,
                mpi,
                nodes,
                interactive,
                attach,
                expires_ms,
                apps,
                spawned_by: None,
                mac,
            },
        )
        .boxed()
}

pub fn holder() -> BoxedStrategy<Holder> {
    prop_oneof![
        job_id().prop_map(|job| Holder::Job { job }),
        any::<u32>().prop_map(|pid| Holder::Pid { pid }),
        text().prop_map(|session| Holder::Session { session }),
    ]
    .boxed()
}

pub fn reservation_info() -> BoxedStrategy<ReservationInfo> {
    let numa = any::<(u32, u64)>().prop_map(|(numa, bytes)| NumaMemory { numa, bytes });
    let node =
        (
            (text(), text(), text(), any::<u32>(), text(), any::<u64>(), vec(numa, 0..2), vec(any::<u32>(), 0..3)),
            counts(),
        )
            .prop_map(|((node, address, cpus, cores, mems, memory_bytes, numa_memory, gpus), gres)| {
                ReservedNode { node, address, cpus, cores, mems, memory_bytes, numa_memory, gpus, gres }
            });
    let state = prop::sample::select(vec![
        ReservationState::Unconfirmed,
        ReservationState::Confirmed,
        ReservationState::Released,
    ]);
    (
        (any::<u64>(), job_id(), text(), any::<u32>(), state, finite_f64(), f64_opt(), finite_f64()),
        (any::<u64>(), of(holder()), f64_opt(), any::<bool>(), vec(node, 0..2), f64_opt(), of(text())),
        (vec(step_info(), 0..2), counts()),
    )
        .prop_map(
            |(
                (id, job, user, uid, state, created, confirm_by, ends),
                (walltime_seconds, holder, renew_by, explicit, nodes, released_at, release_reason),
                (claims, licenses),
            )| ReservationInfo {
                id,
                job,
                user,
                uid,
                state,
                created,
                confirm_by,
                ends,
                walltime_seconds,
                holder,
                renew_by,
                explicit,
                nodes,
                licenses,
                released_at,
                release_reason,
                claims,
            },
        )
        .boxed()
}

pub fn reservation_error() -> BoxedStrategy<crate::reservation::ReservationError> {
    (error_code(), text(), of(text()))
        .prop_map(|(code, message, reason)| crate::reservation::ReservationError { code, message, reason })
        .boxed()
}

pub fn inventory() -> BoxedStrategy<Inventory> {
    let numa_free = (any::<u32>(), any::<u64>(), text()).prop_map(|(os_index, free_bytes, free_cpus)| NumaFree {
        os_index,
        free_bytes,
        free_cpus,
    });
    let holder = (job_id(), of(any::<u64>()), text(), text(), any::<u64>(), vec(any::<u32>(), 0..3)).prop_map(
        |(job, reservation, user, cpus, memory_bytes, gpus)| NodeHolder {
            job,
            reservation,
            user,
            cpus,
            memory_bytes,
            gpus,
        },
    );
    let node = (
        node_info(),
        any::<u32>(),
        any::<u32>(),
        text(),
        any::<u64>(),
        vec(numa_free, 0..2),
        vec(any::<u32>(), 0..3),
        vec(holder, 0..2),
    )
        .prop_map(|(info, free_cores, free_pus, free_cpus, free_memory_bytes, numa_free, free_gpus, holders)| {
            InventoryNode { info, free_cores, free_pus, free_cpus, free_memory_bytes, numa_free, free_gpus, holders }
        });
    let license = (text(), any::<u32>(), any::<u32>()).prop_map(|(name, total, used)| crate::node::CountInfo {
        name,
        total,
        used,
    });
    (finite_f64(), vec(node, 0..2), vec(license, 0..2))
        .prop_map(|(time, nodes, licenses)| Inventory { time, nodes, licenses })
        .boxed()
}

pub fn reservation_reply() -> BoxedStrategy<ReservationReply> {
    prop_oneof![
        inventory().prop_map(|i| ReservationReply::Inventory(Box::new(i))),
        vec(reservation_info(), 0..2).prop_map(|reservations| ReservationReply::List { reservations }),
        (reservation_info(), any::<bool>())
            .prop_map(|(r, created)| ReservationReply::One { reservation: Box::new(r), created }),
        reservation_error().prop_map(ReservationReply::Failed),
    ]
    .boxed()
}

pub fn advance_info() -> BoxedStrategy<AdvanceInfo> {
    (
        (text(), finite_f64(), finite_f64(), texts(), texts(), vec(node_allocation(), 0..2), any::<u32>()),
        (finite_f64(), text(), any::<bool>(), ids(), ids(), any::<u32>(), counts(), counts()),
    )
        .prop_map(
            |(
                (name, start, end, users, accounts, allocation, cores),
                (created, created_by, active, running_jobs, queued_jobs, gpus, gres, licenses),
            )| AdvanceInfo {
                name,
                start,
                end,
                users,
                accounts,
                allocation,
                cores,
                gpus,
                gres,
                licenses,
                created,
                created_by,
                active,
                running_jobs,
                queued_jobs,
            },
        )
        .boxed()
}

pub fn client_response() -> BoxedStrategy<ClientResponse> {
    let id_result = (job_id(), any::<bool>(), of(api_error())).prop_map(|(id, ok, error)| IdResult { id, ok, error });
    prop_oneof![
        (text(), any::<u32>(), any::<usize>(), any::<usize>()).prop_map(|(version, protocol, nodes, jobs)| {
            ClientResponse::Pong { version, protocol, nodes, jobs, state_store: None }
        }),
        job_id().prop_map(|id| ClientResponse::Submitted { id }),
        ids().prop_map(|ids| ClientResponse::SubmittedBatch { ids }),
        vec(job_info(), 0..2).prop_map(|jobs| ClientResponse::Jobs { jobs }),
        job_info().prop_map(|j| ClientResponse::Job { job: Box::new(j) }),
        vec(node_info(), 0..2).prop_map(|nodes| ClientResponse::Nodes { nodes, licenses: vec![] }),
        vec(job_info(), 0..2).prop_map(|jobs| ClientResponse::Acct { jobs }),
        vec(step_info(), 0..2).prop_map(|steps| ClientResponse::Steps { steps }),
        vec(queue_info(), 0..2).prop_map(|queues| ClientResponse::Queues { queues }),
        (finite_f64(), vec(share_line(), 0..3))
            .prop_map(|(half_life_secs, accounts)| ClientResponse::Share { half_life_secs, accounts }),
        (step_grant(), "[0-9a-f]{0,64}")
            .prop_map(|(g, link_key)| ClientResponse::StepGranted { grant: Box::new(g), link_key }),
        text().prop_map(|reason| ClientResponse::TryAgain { reason }),
        vec(id_result, 0..3).prop_map(|results| ClientResponse::Done { results }),
        reservation_reply().prop_map(|reply| ClientResponse::Reservation { reply }),
        vec(advance_info(), 0..2).prop_map(|reservations| ClientResponse::Advance { reservations }),
        advance_info().prop_map(|r| ClientResponse::AdvanceDeleted { reservation: Box::new(r) }),
        api_error().prop_map(ClientResponse::Error),
    ]
    .boxed()
}

pub fn chunk() -> BoxedStrategy<Chunk> {
    vec(any::<u8>(), 0..16).prop_map(Chunk::from_bytes).boxed()
}

pub fn tree_down() -> BoxedStrategy<TreeDown> {
    prop_oneof![
        chunk().prop_map(|data| TreeDown::Stdin { data }),
        Just(TreeDown::StdinEof),
        any::<i32>().prop_map(|signal| TreeDown::Signal { signal }),
        env().prop_map(|kvs| TreeDown::BarrierOut { kvs }),
        rank_exit().prop_map(|exit| TreeDown::RankFailed { exit }),
        text().prop_map(|node| TreeDown::NodeLost { node }),
        text().prop_map(|reason| TreeDown::Kill { reason }),
        modex_request().prop_map(TreeDown::ModexRequest),
        modex_reply().prop_map(TreeDown::ModexReply),
        spawn_reply().prop_map(TreeDown::SpawnReply),
        service_reply().prop_map(TreeDown::ServiceReply),
    ]
    .boxed()
}

pub fn tree_up() -> BoxedStrategy<TreeUp> {
    prop_oneof![
        any::<(u32, u32)>().prop_map(|(nodes, ranks)| TreeUp::Started { nodes, ranks }),
        (text(), text()).prop_map(|(node, reason)| TreeUp::LaunchFailed { node, reason }),
        (any::<u32>(), any::<u8>(), chunk()).prop_map(|(rank, stream, data)| TreeUp::Output { rank, stream, data }),
        vec(rank_exit(), 0..3).prop_map(|ranks| TreeUp::Exited { ranks }),
        env().prop_map(|puts| TreeUp::BarrierIn { puts }),
        (any::<u32>(), text(), any::<i32>(), text()).prop_map(|(rank, node, code, message)| TreeUp::Abort {
            rank,
            node,
            code,
            message
        }),
        (texts(), vec(any::<u32>(), 0..3), text()).prop_map(|(nodes, ranks, reason)| TreeUp::SubtreeLost {
            nodes,
            ranks,
            reason
        }),
        modex_request().prop_map(TreeUp::ModexRequest),
        modex_reply().prop_map(TreeUp::ModexReply),
        spawn_request().prop_map(TreeUp::Spawn),
        (any::<(u64, u32, u32)>(), vec(published_value(), 0..3), any::<bool>()).prop_map(
            |((id, from, rank), values, first_read)| TreeUp::Publish(crate::step::PublishRequest {
                id,
                from,
                rank,
                values,
                first_read
            })
        ),
        (any::<(u64, u32, u32)>(), texts(), any::<bool>()).prop_map(|((id, from, rank), keys, wait)| TreeUp::Lookup(
            crate::step::LookupRequest { id, from, rank, keys, wait }
        )),
        (any::<(u64, u32)>(), vec(proc_name(), 0..3))
            .prop_map(|((id, from), procs)| TreeUp::Connect(crate::step::ConnectRequest { id, from, procs })),
        Just(TreeUp::Done),
    ]
    .boxed()
}

pub fn modex_request() -> BoxedStrategy<ModexRequest> {
    any::<(u64, u32, u32)>().prop_map(|(id, from, rank)| ModexRequest { id, from, rank }).boxed()
}

pub fn modex_reply() -> BoxedStrategy<ModexReply> {
    let failure = prop_oneof![
        Just(ModexFailure::NoSuchRank),
        Just(ModexFailure::NoData),
        Just(ModexFailure::TooLarge),
        Just(ModexFailure::Timeout),
        Just(ModexFailure::Other),
    ];
    (any::<(u64, u32, u32)>(), "[0-9a-f]{0,32}", of(failure))
        .prop_map(|((id, to, rank), data, failure)| ModexReply { id, to, rank, data, failure })
        .boxed()
}

pub fn spawn_request() -> BoxedStrategy<crate::step::SpawnRequest> {
    let app = (texts(), any::<u32>(), env(), of(text())).prop_map(|(argv, maxprocs, env, cwd)| crate::step::SpawnApp {
        argv,
        maxprocs,
        env,
        cwd,
    });
    (any::<(u64, u32, u32)>(), vec(app, 0..3))
        .prop_map(|((id, from, rank), apps)| crate::step::SpawnRequest { id, from, rank, apps })
        .boxed()
}

pub fn proc_name() -> BoxedStrategy<crate::step::ProcName> {
    (text(), any::<u32>()).prop_map(|(nspace, rank)| crate::step::ProcName { nspace, rank }).boxed()
}

pub fn published_value() -> BoxedStrategy<crate::step::PublishedValue> {
    (text(), of(text()), of("[0-9a-f]{0,32}"))
        .prop_map(|(key, text, bytes)| crate::step::PublishedValue { key, text, bytes })
        .boxed()
}

pub fn service_reply() -> BoxedStrategy<crate::step::ServiceReply> {
    let found = (published_value(), proc_name()).prop_map(|(value, publisher)| crate::step::Found { value, publisher });
    (any::<(u64, u32)>(), of(text()), vec(found, 0..3))
        .prop_map(|((id, to), error, found)| crate::step::ServiceReply { id, to, error, found })
        .boxed()
}

pub fn spawn_reply() -> BoxedStrategy<crate::step::SpawnReply> {
    (any::<(u64, u32)>(), text(), of(text()))
        .prop_map(|((id, to), nspace, error)| crate::step::SpawnReply { id, to, nspace, error })
        .boxed()
}

pub fn task_request() -> BoxedStrategy<TaskRequest> {
    let tasks = || vec(any::<u64>(), 0..3);
    prop_oneof![
        job_id().prop_map(|job| TaskRequest::Info { job }),
        (job_id(), any::<u32>(), texts(), env(), text(), any::<u32>(), of(text()), of(text())).prop_map(
            |(job, node, argv, env, cwd, count, output, error)| TaskRequest::Spawn {
                job,
                node,
                argv,
                env,
                cwd,
                count,
                output,
                error
            }
        ),
        job_id().prop_map(|job| TaskRequest::List { job }),
        (job_id(), tasks(), of(any::<u64>())).prop_map(|(job, tasks, timeout_ms)| TaskRequest::Wait {
            job,
            tasks,
            timeout_ms
        }),
        (job_id(), tasks(), any::<i32>()).prop_map(|(job, tasks, signal)| TaskRequest::Kill { job, tasks, signal }),
        (job_id(), any::<u32>(), any::<u64>(), texts(), env(), text(), text(), text(), any::<bool>()).prop_map(
            |(job, node, task, argv, env, cwd, output, error, attach)| TaskRequest::RemoteSpawn {
                job,
                node,
                task,
                argv,
                env,
                cwd,
                output,
                error,
                attach
            }
        ),
        (job_id(), any::<u32>(), texts(), env(), text()).prop_map(|(job, node, argv, env, cwd)| TaskRequest::Exec {
            job,
            node,
            argv,
            env,
            cwd
        }),
        any::<i32>().prop_map(|signal| TaskRequest::Signal { signal }),
        any::<i32>().prop_map(|signal| TaskRequest::RemoteSignal { signal }),
        chunk().prop_map(|data| TaskRequest::Stdin { data }),
        Just(TaskRequest::StdinEof),
        job_id().prop_map(|job| TaskRequest::RemoteInfo { job }),
    ]
    .boxed()
}

pub fn task_info() -> BoxedStrategy<TaskInfo> {
    (
        (any::<u64>(), text(), any::<u32>(), texts(), of(any::<u32>()), text()),
        (of(any::<i32>()), of(any::<i32>()), of(text()), of(any::<u64>()), of(text()), of(text())),
    )
        .prop_map(|((id, node, node_index, argv, pid, state), (exit_code, signal, reason, wall_ms, stdout, stderr))| {
            TaskInfo { id, node, node_index, argv, pid, state, exit_code, signal, reason, wall_ms, stdout, stderr }
        })
        .boxed()
}

pub fn task_reply() -> BoxedStrategy<TaskReply> {
    let node = (any::<u32>(), text(), text(), any::<u32>(), text())
        .prop_map(|(index, name, address, slots, cpus)| AllocationNode { index, name, address, slots, cpus });
    prop_oneof![
        (job_id(), vec(node, 0..3)).prop_map(|(job, nodes)| TaskReply::Info { job, nodes }),
        vec(task_info(), 0..2).prop_map(|tasks| TaskReply::Spawned { tasks }),
        vec(task_info(), 0..2).prop_map(|tasks| TaskReply::Tasks { tasks }),
        text().prop_map(|message| TaskReply::Error { message }),
        any::<u32>().prop_map(|pid| TaskReply::Started { pid }),
        (any::<u8>(), chunk()).prop_map(|(stream, data)| TaskReply::Output { stream, data }),
        (of(any::<i32>()), of(any::<i32>()), any::<u64>()).prop_map(|(exit_code, signal, wall_ms)| TaskReply::Exited {
            exit_code,
            signal,
            wall_ms
        }),
    ]
    .boxed()
}

pub fn agent_query() -> BoxedStrategy<AgentQuery> {
    prop_oneof![
        Just(AgentQuery::Status),
        (step_grant(), vec(any::<u32>(), 0..3))
            .prop_map(|(grant, subtree)| AgentQuery::StepLaunch { grant: Box::new(grant), subtree }),
        task_request().prop_map(|request| AgentQuery::Task { request }),
        envelope().prop_map(AgentQuery::Sealed),
    ]
    .boxed()
}

pub fn agent_reply() -> BoxedStrategy<AgentReply> {
    prop_oneof![
        (text(), text(), any::<bool>(), ids(), text()).prop_map(|(name, instance, connected, running, real_cpus)| {
            AgentReply::Status { name, instance, connected, running, real_cpus }
        }),
        task_reply().prop_map(|reply| AgentReply::Task { reply }),
        text().prop_map(|message| AgentReply::Error { message }),
    ]
    .boxed()
}
