//! The shepherd of one step on one node: starts the node's ranks, forwards the launch to its
//! part of the control tree, relays stdio, signals, exits and PMI barriers, and ends with
//! its subtree.
//!
//! A shepherd receives `subtree` (indexes into the grant's nodes; its own node first). It
//! splits the rest into at most `fanout` contiguous groups (flat: one per node) and sends
//! each group to the group's first node, which does the same. Upward messages are
//! aggregated where that saves traffic (`Started`, `BarrierIn`, `Done`); the root completes
//! PMI barriers itself. A broken upstream connection kills the local ranks and closes the
//! connections below, which dissolves the subtree; a broken child connection is reported up
//! as `SubtreeLost` with the ranks it held.

use crate::ports::JobContext;
use crate::step::pmi::PmiEvent;
use crate::step::ranks::{self as step_ranks, LocalRank};
use berth_protocol::agent::{AgentMessage, AgentQuery};
use berth_protocol::auth::{read_sealed, write_sealed, LinkKey, Opener, Sealer, TreeEnd};
use berth_protocol::error::Refusal;
use berth_protocol::step::{
    Chunk, ModexFailure, ModexReply, ModexRequest, RankExit, StepGrant, TreeDown, TreeUp, MAX_MODEX_BYTES,
};
use berth_protocol::tree::{groups, keepalive, launch_deadline, read_up};
use berth_protocol::{write_frame, ProtocolError};
use std::collections::{BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long a step may wait for its job to be set up on this node.
const JOB_WAIT: Duration = Duration::from_secs(10);
/// How long to wait for a child agent to accept the launch.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a direct modex this node asked may go unanswered (the rank asked for may not have
/// committed its data yet: its node's server answers once it has).
const MODEX_TIMEOUT: Duration = Duration::from_secs(30);

/// How many direct modex requests a shepherd keeps in flight, asked and answered together
/// (libpmix asks at most once per remote rank and node).
const MAX_MODEX_PENDING: usize = 1 << 16;
/// How long a rank's `PMIx_Spawn` waits for `berth run` to say its children run (a grant
/// waiting for resources included); then it fails with PMIX_ERR_TIMEOUT.
pub const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);
/// The most spawns a node's ranks may have in flight.
const MAX_SPAWNS_PENDING: usize = 64;
/// How long a publish or connect waits for `berth run`'s answer, and the longest a lookup
/// waits for its keys (a rank's own `PMIX_TIMEOUT` may be shorter; Open MPI asks 600 s).
const SERVICE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most publishes, lookups and connects a node's ranks may have in flight.
const MAX_SERVICES_PENDING: usize = 4096;

/// A publish, lookup or connect waiting for `berth run`'s answer.
enum Service {
    Op(crate::step::pmix::OpToken),
    Lookup(crate::step::pmix::LookupToken),
}

/// After the last rank exits, how long its output may still drain (a background process
/// holding the pipe must not keep the step alive).
const OUTPUT_LINGER: Duration = Duration::from_secs(2);

enum Event {
    Down(TreeDown),
    UpLost(String),
    Child(usize, TreeUp),
    ChildLost(usize, String),
    Output(u32, u8, Vec<u8>),
    StreamClosed,
    RankExited(RankExit),
    Pmi(PmiEvent),
    Pmix(crate::step::pmix::PmixEvent),
    Signal(i32),
    KillNow,
    Linger,
    /// A direct modex this node asked has had no answer in time.
    ModexTimeout(u64),
    /// A spawn this node asked has had no answer in time.
    SpawnTimeout(u64),
    /// A publish, lookup or connect this node asked has had no answer in time.
    ServiceTimeout(u64),
}

struct Child {
    nodes: Vec<u32>,
    tx: Option<mpsc::UnboundedSender<TreeDown>>,
    started: Option<(u32, u32)>,
    barrier: bool,
    done: bool,
}

/// The shepherd's connection towards `run`.
pub enum Upstream<R, W> {
    /// The connection the launch came on.
    Connected(R, W),
    /// A step started from its job's launch order: `run` attaches later (crate::ports::attach);
    /// what goes up queues until then.
    Awaited(oneshot::Receiver<(R, W)>),
}

/// Serve one step on this node over the upstream connection `up` until the subtree is done.
/// Every frame on `up` and on the connections to the children is MAC'd under the step's
/// `link` key.
pub async fn serve<R, W>(ctx: Arc<JobContext>, grant: StepGrant, subtree: Vec<u32>, link: LinkKey, up: Upstream<R, W>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (ev_tx, mut ev) = mpsc::unbounded_channel::<Event>();
    let (up_tx, up_rx) = mpsc::unbounded_channel::<TreeUp>();
    let (sealer, opener) = link.link(subtree.first().copied().unwrap_or(0), TreeEnd::Below);
    let key = (grant.job, grant.step);
    let writer = match up {
        Upstream::Connected(rd, wr) => {
            tokio::spawn(read_down(rd, opener, key, ctx.auth.clone(), ev_tx.clone()));
            tokio::spawn(write_up(wr, sealer, up_rx))
        }
        Upstream::Awaited(attached) => {
            let (ev_tx, auth) = (ev_tx.clone(), ctx.auth.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(crate::ports::attach::ATTACH_WAIT, attached).await {
                    Ok(Ok((rd, wr))) => {
                        tokio::spawn(read_down(rd, opener, key, auth, ev_tx));
                        write_up(wr, sealer, up_rx).await
                    }
                    _ => {
                        let why =
                            format!("no `berth run` attached within {} s", crate::ports::attach::ATTACH_WAIT.as_secs());
                        let _ = ev_tx.send(Event::UpLost(why));
                    }
                }
            })
        }
    };

    let Some(&me) = subtree.first() else {
        let _ = up_tx.send(TreeUp::Done);
        drop(up_tx);
        let _ = writer.await;
        return;
    };
    let me_usize = me as usize;
    let Some(node) = grant.nodes.get(me_usize).cloned() else {
        let _ = up_tx.send(TreeUp::LaunchFailed { node: "?".into(), reason: format!("no node {me} in the step") });
        let _ = up_tx.send(TreeUp::Done);
        drop(up_tx);
        let _ = writer.await;
        return;
    };
    let is_root = subtree.len() == grant.nodes.len();
    if is_root {
        // Until the controller takes its end (daemon.rs moves it to the unacknowledged reports).
        ctx.registry.root_step_started(grant.job, grant.step);
    }

    // Forward the launch first: the other nodes start while this one does.
    let mut children: Vec<Child> = Vec::new();
    for (i, group) in groups(&subtree[1..], grant.fanout).into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        let auth = ctx.auth.clone();
        tokio::spawn(run_child(grant.clone(), group.clone(), link.clone(), auth, i, rx, ev_tx.clone()));
        children.push(Child { nodes: group, tx: Some(tx), started: None, barrier: false, done: false });
    }

    // Start the local ranks.
    let (pmi_tx, mut pmi_rx) = mpsc::unbounded_channel::<PmiEvent>();
    {
        let ev_tx = ev_tx.clone();
        tokio::spawn(async move {
            while let Some(e) = pmi_rx.recv().await {
                if ev_tx.send(Event::Pmi(e)).is_err() {
                    break;
                }
            }
        });
    }
    let (pmix_tx, mut pmix_rx) = mpsc::unbounded_channel::<crate::step::pmix::PmixEvent>();
    {
        let ev_tx = ev_tx.clone();
        tokio::spawn(async move {
            while let Some(e) = pmix_rx.recv().await {
                if ev_tx.send(Event::Pmix(e)).is_err() {
                    break;
                }
            }
        });
    }
    // The step's PMIx namespace: `berth.JOB.STEP.` and a secret part from the link key.
    let pmix_name = crate::step::pmix::namespace_name(grant.job, grant.step, &link);
    berth_protocol::probe::mark("agent shepherd ready");
    let job = ctx.registry.wait_for(grant.job, JOB_WAIT).await;
    let mut partial = Vec::new();
    let started = match &job {
        None => Err(step_ranks::RanksError::JobNotHere { job: grant.job, node: node.name.clone() }),
        Some(job) => step_ranks::start(&ctx, job, &grant, me_usize, pmi_tx, (pmix_name, pmix_tx), &mut partial),
    };
    let mut alive: HashMap<u32, i32> = HashMap::new();
    let mut stdin: Option<tokio::net::unix::pipe::Sender> = None;
    let mut open_streams = 0usize;
    let mut pmi = None;
    let mut pmix = None;
    // A PMIx fence this node's ranks wait on (completed by the barrier's way down).
    let mut pmix_fence: Option<crate::step::pmix::ModexToken> = None;
    let mut sub_cpusets = vec![];
    let mut failures_file = None;
    let mut local_started = false;
    let ranks: Vec<LocalRank> = match started {
        Ok(s) => {
            pmi = Some(s.pmi);
            pmix = s.pmix;
            sub_cpusets = s.sub_cpusets;
            failures_file = s.failures_file;
            local_started = true;
            s.ranks
        }
        Err(reason) => {
            tracing::warn!(job = %grant.job, step = grant.step, "launch failed: {reason}");
            let _ = up_tx.send(TreeUp::LaunchFailed { node: node.name.clone(), reason: reason.to_string() });
            // Ranks started before the failure are killed; the others never ran.
            for r in &partial {
                if let Some(pid) = r.child.id() {
                    signal_group(pid as i32, libc::SIGKILL);
                }
            }
            let started: BTreeSet<u32> = partial.iter().map(|r| r.rank).collect();
            let never: Vec<RankExit> = node
                .ranks
                .iter()
                .filter(|r| !started.contains(&r.rank))
                .map(|r| RankExit {
                    rank: r.rank,
                    node: node.name.clone(),
                    exit_code: None,
                    signal: None,
                    reason: Some(format!("launch failed: {reason}")),
                })
                .collect();
            if !never.is_empty() {
                let _ = up_tx.send(TreeUp::Exited { ranks: never });
            }
            std::mem::take(&mut partial)
        }
    };
    for mut r in ranks {
        if let Some(pid) = r.child.id() {
            alive.insert(r.rank, pid as i32);
        }
        if r.rank == 0 {
            stdin = r.child.stdin.take();
        }
        if let Some(out) = r.child.stdout.take() {
            open_streams += 1;
            tokio::spawn(pump(out, r.rank, 1, ev_tx.clone()));
        }
        if let Some(err) = r.child.stderr.take() {
            open_streams += 1;
            tokio::spawn(pump(err, r.rank, 2, ev_tx.clone()));
        }
        let (ev_tx, node_name) = (ev_tx.clone(), node.name.clone());
        tokio::spawn(async move {
            let status = r.child.wait().await;
            let exit = match status {
                Ok(st) => {
                    RankExit { rank: r.rank, node: node_name, exit_code: st.code(), signal: st.signal(), reason: None }
                }
                Err(e) => RankExit {
                    rank: r.rank,
                    node: node_name,
                    exit_code: None,
                    signal: None,
                    reason: Some(format!("lost track of the process: {e}")),
                },
            };
            berth_protocol::probe::mark("agent rank exited");
            let _ = ev_tx.send(Event::RankExited(exit));
        });
    }
    // Signals from `berth signal` (through the controller) for this step's local ranks.
    let (sig_tx, mut sig_rx) = mpsc::unbounded_channel::<i32>();
    if let Some(job) = &job {
        if let Ok(mut steps) = job.steps.lock() {
            steps.insert(grant.step, sig_tx);
        }
        let ev_tx = ev_tx.clone();
        tokio::spawn(async move {
            while let Some(s) = sig_rx.recv().await {
                if ev_tx.send(Event::Signal(s)).is_err() {
                    break;
                }
            }
        });
    }

    let mut started_sent = false;
    let mut local_barrier: Option<Vec<(String, String)>> = None;
    let mut child_puts: Vec<(String, String)> = Vec::new();
    let mut killing = false;
    let mut lingered = false;
    let mut up_alive = true;
    let mut dead_ranks: Vec<u32> = Vec::new();
    let mut modex = Modex::new(me, is_root);
    // Spawns this node's ranks asked (`PMIx_Spawn`): request id → the waiting token.
    let mut spawns: HashMap<u64, crate::step::pmix::SpawnToken> = HashMap::new();
    let mut next_spawn = 1u64;
    // Publishes, lookups and connects this node asked: request id → the waiting token.
    let mut services: HashMap<u64, Service> = HashMap::new();
    // At the root: how the step ended, for the controller (`StepEndReport`).
    let mut report = StepEndReport::default();
    loop {
        // Aggregated upward messages.
        if !started_sent && children.iter().all(|c| c.started.is_some() || c.done) {
            let (n, r) = children.iter().filter_map(|c| c.started).fold(
                (u32::from(local_started), if local_started { node.ranks.len() as u32 } else { 0 }),
                |(n, r), (cn, cr)| (n + cn, r + cr),
            );
            berth_protocol::probe::mark("agent started sent");
            let _ = up_tx.send(TreeUp::Started { nodes: n, ranks: r });
            started_sent = true;
        }
        if local_barrier.is_some() && children.iter().all(|c| c.barrier || c.done) {
            let mut puts = local_barrier.take().unwrap_or_default();
            puts.append(&mut child_puts);
            for c in children.iter_mut() {
                c.barrier = false;
            }
            if is_root {
                send_down(&mut children, &TreeDown::BarrierOut { kvs: puts.clone() });
                barrier_out(puts, pmi.as_ref(), &mut pmix_fence);
            } else {
                let _ = up_tx.send(TreeUp::BarrierIn { puts });
            }
        }
        let streams_done = open_streams == 0 || lingered;
        if alive.is_empty() && streams_done && children.iter().all(|c| c.done) {
            break;
        }
        let Some(event) = ev.recv().await else { break };
        match event {
            Event::Down(msg) => match msg {
                TreeDown::Stdin { data } => {
                    if let Some(s) = stdin.as_mut() {
                        if s.write_all(data.as_bytes()).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                TreeDown::StdinEof => stdin = None,
                TreeDown::Signal { signal } => {
                    send_down(&mut children, &TreeDown::Signal { signal });
                    signal_all(&alive, signal);
                }
                TreeDown::BarrierOut { kvs } => {
                    send_down(&mut children, &TreeDown::BarrierOut { kvs: kvs.clone() });
                    barrier_out(kvs, pmi.as_ref(), &mut pmix_fence);
                }
                TreeDown::RankFailed { exit } => {
                    send_down(&mut children, &TreeDown::RankFailed { exit: exit.clone() });
                    dead_ranks.push(exit.rank);
                    note_failure(&failures_file, &exit);
                    if let Some(p) = &pmi {
                        let list: Vec<String> = dead_ranks.iter().map(|r| r.to_string()).collect();
                        p.set("PMI_dead_processes", &list.join(","));
                    }
                    if let Some(ns) = &pmix {
                        ns.notify_lost(exit.rank);
                    }
                    if let Some(sig) = grant.notify_signal {
                        signal_all(&alive, sig);
                    }
                }
                TreeDown::NodeLost { node: lost } => {
                    send_down(&mut children, &TreeDown::NodeLost { node: lost.clone() });
                    if let (Some(ns), Some(i)) = (&pmix, grant.nodes.iter().position(|n| n.name == lost)) {
                        let ranks: Vec<u32> = grant.nodes[i].ranks.iter().map(|r| r.rank).collect();
                        if !ns.notify_node_down(i as u32, &lost, &ranks) {
                            tracing::warn!(job = %grant.job, step = grant.step, "PMIx: cannot announce node {lost} down");
                        }
                    }
                }
                TreeDown::ModexRequest(req) => modex.request(req, &grant, pmix.as_ref(), &mut children, &up_tx),
                TreeDown::ModexReply(rep) => modex.reply(rep, &mut children, &up_tx),
                TreeDown::SpawnReply(rep) => {
                    if rep.to == me {
                        if let Some(token) = spawns.remove(&rep.id) {
                            match rep.error {
                                None if !rep.nspace.is_empty() => token.complete(&rep.nspace),
                                why => {
                                    let why = why.unwrap_or_else(|| "no namespace".into());
                                    tracing::warn!(job = %grant.job, step = grant.step, "PMIx_Spawn failed: {why}");
                                    token.fail(crate::step::pmix::SpawnFailure::Launch);
                                }
                            }
                        }
                    } else if let Some(c) = children.iter().find(|c| c.nodes.contains(&rep.to)) {
                        if let Some(tx) = &c.tx {
                            let _ = tx.send(TreeDown::SpawnReply(rep));
                        }
                    }
                }
                TreeDown::ServiceReply(rep) => {
                    if rep.to == me {
                        match (services.remove(&rep.id), rep.error) {
                            (Some(Service::Op(token)), None) => token.done(),
                            (Some(Service::Lookup(token)), None) => token.found(&rep.found),
                            (Some(pending), Some(why)) => {
                                tracing::debug!(job = %grant.job, step = grant.step, "PMIx: {why}");
                                let why = if why.starts_with("not found") {
                                    crate::step::pmix::OpFailure::NotFound
                                } else {
                                    crate::step::pmix::OpFailure::Failed
                                };
                                match pending {
                                    Service::Op(t) => t.fail(why),
                                    Service::Lookup(t) => t.fail(why),
                                }
                            }
                            (None, _) => {}
                        }
                    } else if let Some(c) = children.iter().find(|c| c.nodes.contains(&rep.to)) {
                        if let Some(tx) = &c.tx {
                            let _ = tx.send(TreeDown::ServiceReply(rep));
                        }
                    }
                }
                TreeDown::Kill { reason } => {
                    send_down(&mut children, &TreeDown::Kill { reason });
                    if !killing {
                        killing = true;
                        signal_all(&alive, libc::SIGTERM);
                        signal_all(&alive, libc::SIGCONT);
                        let ev_tx = ev_tx.clone();
                        let grace = Duration::from_millis(grant.kill_grace_ms.max(100));
                        tokio::spawn(async move {
                            tokio::time::sleep(grace).await;
                            let _ = ev_tx.send(Event::KillNow);
                        });
                    }
                }
            },
            Event::UpLost(reason) => {
                if up_alive {
                    up_alive = false;
                    tracing::warn!(job = %grant.job, step = grant.step, "upstream lost ({reason}): killing the subtree");
                    signal_all(&alive, libc::SIGKILL);
                    // Closing the connections below dissolves the subtree.
                    for c in children.iter_mut() {
                        c.tx = None;
                    }
                }
            }
            Event::KillNow => signal_all(&alive, libc::SIGKILL),
            Event::ModexTimeout(id) => modex.timed_out(id),
            Event::ServiceTimeout(id) => match services.remove(&id) {
                Some(Service::Op(t)) => t.fail(crate::step::pmix::OpFailure::Timeout),
                Some(Service::Lookup(t)) => t.fail(crate::step::pmix::OpFailure::Timeout),
                None => {}
            },
            Event::SpawnTimeout(id) => {
                if let Some(token) = spawns.remove(&id) {
                    tracing::warn!(job = %grant.job, step = grant.step, "PMIx_Spawn: no answer from `berth run` within {} s", SPAWN_TIMEOUT.as_secs());
                    token.fail(crate::step::pmix::SpawnFailure::Timeout);
                }
            }
            Event::Signal(sig) => signal_all(&alive, sig),
            Event::Output(rank, stream, data) => {
                let _ = up_tx.send(TreeUp::Output { rank, stream, data: Chunk::from_bytes(data) });
            }
            Event::StreamClosed => open_streams = open_streams.saturating_sub(1),
            Event::Linger => lingered = true,
            Event::RankExited(exit) => {
                report.exited(std::slice::from_ref(&exit));
                alive.remove(&exit.rank);
                let _ = up_tx.send(TreeUp::Exited { ranks: vec![exit] });
                if alive.is_empty() && open_streams > 0 {
                    let ev_tx = ev_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(OUTPUT_LINGER).await;
                        let _ = ev_tx.send(Event::Linger);
                    });
                }
            }
            Event::Pmi(p) => match p {
                PmiEvent::BarrierIn { puts } => local_barrier = Some(puts),
                PmiEvent::Abort { rank, code, message } => {
                    let abort = TreeUp::Abort { rank, node: node.name.clone(), code, message };
                    report.saw(&abort);
                    let _ = up_tx.send(abort);
                }
                PmiEvent::Finalized { .. } => {}
                PmiEvent::ProtocolError { rank, message } => {
                    tracing::warn!(job = %grant.job, step = grant.step, rank, "PMI: {message}");
                }
            },
            Event::Pmix(p) => match p {
                crate::step::pmix::PmixEvent::Fence { data, token } => {
                    // The node's ranks all entered the fence: up the tree as a barrier.
                    pmix_fence = Some(token);
                    local_barrier = Some(vec![(crate::step::pmix::fence_key(me), berth_protocol::auth::hex(&data))]);
                }
                crate::step::pmix::PmixEvent::Abort { rank, code, message } => {
                    let abort = TreeUp::Abort { rank, node: node.name.clone(), code, message };
                    report.saw(&abort);
                    let _ = up_tx.send(abort);
                }
                crate::step::pmix::PmixEvent::DirectModex { rank, token } => {
                    if let Some(id) = modex.ask(rank, token, &grant, &mut children, &up_tx) {
                        let ev_tx = ev_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(MODEX_TIMEOUT).await;
                            let _ = ev_tx.send(Event::ModexTimeout(id));
                        });
                    }
                }
                crate::step::pmix::PmixEvent::DmodexAnswered { key, data } => {
                    modex.answered(key, data, &mut children, &up_tx)
                }
                crate::step::pmix::PmixEvent::Spawn { rank, apps, token } => {
                    let total: u64 = apps.iter().map(|a| u64::from(a.maxprocs)).sum();
                    if apps.iter().any(|a| a.maxprocs == 0 || a.argv.is_empty())
                        || total > u64::from(berth_protocol::step::MAX_SPAWN_PROCS)
                        || spawns.len() >= MAX_SPAWNS_PENDING
                        || !up_alive
                    {
                        let line = format!(
                            "berth: PMIx_Spawn refused: each program needs a command and 1 or more processes, at most {} in all\n",
                            berth_protocol::step::MAX_SPAWN_PROCS
                        );
                        let _ =
                            up_tx.send(TreeUp::Output { rank, stream: 2, data: Chunk::from_bytes(line.into_bytes()) });
                        token.fail(crate::step::pmix::SpawnFailure::Launch);
                    } else {
                        let id = next_spawn;
                        next_spawn += 1;
                        spawns.insert(id, token);
                        let _ =
                            up_tx.send(TreeUp::Spawn(berth_protocol::step::SpawnRequest { id, from: me, rank, apps }));
                        let ev_tx = ev_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(SPAWN_TIMEOUT).await;
                            let _ = ev_tx.send(Event::SpawnTimeout(id));
                        });
                    }
                }
                crate::step::pmix::PmixEvent::Publish { rank, values, first_read, token } => {
                    if services.len() >= MAX_SERVICES_PENDING || !up_alive {
                        token.fail(crate::step::pmix::OpFailure::Failed);
                    } else {
                        let id = next_spawn;
                        next_spawn += 1;
                        services.insert(id, Service::Op(token));
                        let req = berth_protocol::step::PublishRequest { id, from: me, rank, values, first_read };
                        let _ = up_tx.send(TreeUp::Publish(req));
                        time_out(&ev_tx, Event::ServiceTimeout(id), SERVICE_TIMEOUT);
                    }
                }
                crate::step::pmix::PmixEvent::Lookup { rank, keys, wait, timeout_s, token } => {
                    if services.len() >= MAX_SERVICES_PENDING || !up_alive {
                        token.fail(crate::step::pmix::OpFailure::Failed);
                    } else {
                        let id = next_spawn;
                        next_spawn += 1;
                        services.insert(id, Service::Lookup(token));
                        let req = berth_protocol::step::LookupRequest { id, from: me, rank, keys, wait };
                        let _ = up_tx.send(TreeUp::Lookup(req));
                        let wait = match timeout_s {
                            0 => SERVICE_TIMEOUT,
                            s => Duration::from_secs(u64::from(s)).min(SERVICE_TIMEOUT),
                        };
                        time_out(&ev_tx, Event::ServiceTimeout(id), wait);
                    }
                }
                crate::step::pmix::PmixEvent::Connect { procs, token } => {
                    if services.len() >= MAX_SERVICES_PENDING || !up_alive {
                        token.fail(crate::step::pmix::OpFailure::Failed);
                    } else {
                        let id = next_spawn;
                        next_spawn += 1;
                        services.insert(id, Service::Op(token));
                        let _ =
                            up_tx.send(TreeUp::Connect(berth_protocol::step::ConnectRequest { id, from: me, procs }));
                        time_out(&ev_tx, Event::ServiceTimeout(id), SERVICE_TIMEOUT);
                    }
                }
                crate::step::pmix::PmixEvent::Unsupported { rank, what } => {
                    tracing::warn!(job = %grant.job, step = grant.step, rank, "PMIx: {what} is not supported; refused");
                    // Told to the user on the rank's stderr, where Open MPI's own error goes.
                    let line = format!("berth: {what} is not supported by berth yet; refused (docs/launcher.md)\n");
                    let _ = up_tx.send(TreeUp::Output { rank, stream: 2, data: Chunk::from_bytes(line.into_bytes()) });
                    // Open MPI 4.1.4's other ranks wait forever in MPI_Comm_spawn for a root
                    // whose spawn (or its port exchange, or connection) failed: a step of more
                    // than one rank is ended rather than left hanging (one rank alone gets the
                    // error and goes on).
                    let size: usize = grant.nodes.iter().map(|n| n.ranks.len()).sum();
                    if size > 1 {
                        let abort = TreeUp::Abort {
                            rank,
                            node: node.name.clone(),
                            code: 1,
                            message: format!(
                                "{what} is not supported by berth; the step's other ranks would wait for it forever"
                            ),
                        };
                        report.saw(&abort);
                        let _ = up_tx.send(abort);
                    }
                }
                crate::step::pmix::PmixEvent::Finalized { .. } => {}
            },
            Event::Child(i, msg) => match msg {
                TreeUp::Started { nodes, ranks } => children[i].started = Some((nodes, ranks)),
                TreeUp::BarrierIn { mut puts } => {
                    children[i].barrier = true;
                    child_puts.append(&mut puts);
                }
                TreeUp::Done => {
                    children[i].done = true;
                    children[i].tx = None;
                }
                TreeUp::ModexRequest(req) => modex.request(req, &grant, pmix.as_ref(), &mut children, &up_tx),
                TreeUp::ModexReply(rep) => modex.reply(rep, &mut children, &up_tx),
                other => {
                    report.saw(&other);
                    let _ = up_tx.send(other);
                }
            },
            Event::ChildLost(i, reason) => {
                let c = &mut children[i];
                if !c.done {
                    c.done = true;
                    c.tx = None;
                    let names: Vec<String> =
                        c.nodes.iter().filter_map(|&n| grant.nodes.get(n as usize)).map(|n| n.name.clone()).collect();
                    let ranks: Vec<u32> = c
                        .nodes
                        .iter()
                        .filter_map(|&n| grant.nodes.get(n as usize))
                        .flat_map(|n| n.ranks.iter().map(|r| r.rank))
                        .collect();
                    let lost = TreeUp::SubtreeLost { nodes: names, ranks, reason };
                    report.saw(&lost);
                    let _ = up_tx.send(lost);
                }
            }
        }
    }
    // Deregisters the step's PMIx namespace (a fence, direct modex or spawn still pending
    // fails).
    drop(spawns);
    drop(services);
    drop(pmix_fence);
    drop(modex);
    drop(pmix);
    if let Some(job) = &job {
        if let Ok(mut steps) = job.steps.lock() {
            steps.remove(&grant.step);
        }
        for name in sub_cpusets {
            let dir = job.cgroup.cpuset_dir().join(&name);
            let _ = std::fs::remove_dir(&dir);
        }
        if let Some(f) = failures_file {
            let _ = std::fs::remove_file(f);
        }
    }
    berth_protocol::probe::mark("agent done sent");
    let _ = up_tx.send(TreeUp::Done);
    drop(up_tx);
    if is_root {
        match ctx.reports.clone() {
            Some(reports) => {
                // After `run`'s own report, normally: the first recorded wins, and `run`'s is the
                // exact one. This one closes the step when `run` died or lost its report.
                let msg = report.message(grant.job, grant.step, !local_started);
                tokio::spawn(async move {
                    tokio::time::sleep(STEP_END_REPORT_DELAY).await;
                    let _ = reports.send(msg);
                });
            }
            None => ctx.registry.root_step_ended(grant.job, grant.step),
        }
    }
    let _ = writer.await;
}

/// Send `ev` to the shepherd after `after`.
fn time_out(ev_tx: &mpsc::UnboundedSender<Event>, ev: Event, after: Duration) {
    let ev_tx = ev_tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let _ = ev_tx.send(ev);
    });
}

/// How long the root agent waits before reporting a step's end itself (see above).
const STEP_END_REPORT_DELAY: Duration = Duration::from_secs(2);

/// How a step ended, as its control tree's root sees it: the worst rank status (a signal as
/// 128 + its number, as `run` counts) and the first abnormal ending.
#[derive(Default)]
struct StepEndReport {
    worst: i32,
    failure: Option<String>,
}

impl StepEndReport {
    fn exited(&mut self, ranks: &[RankExit]) {
        for e in ranks {
            let status = match (e.exit_code, e.signal) {
                (_, Some(s)) => 128 + s,
                (Some(c), None) => c,
                (None, None) => 1,
            };
            self.worst = self.worst.max(status);
            if status != 0 && self.failure.is_none() {
                self.failure = Some(e.describe());
            }
        }
    }

    fn saw(&mut self, up: &TreeUp) {
        let failure = match up {
            TreeUp::Exited { ranks } => return self.exited(ranks),
            TreeUp::LaunchFailed { node, reason } => format!("launch failed on {node}: {reason}"),
            TreeUp::SubtreeLost { nodes, reason, .. } => format!("lost nodes {}: {reason}", nodes.join(",")),
            TreeUp::Abort { rank, code, message, .. } => format!("rank {rank} called MPI_Abort({code}) {message}"),
            _ => return,
        };
        self.worst = self.worst.max(1);
        self.failure.get_or_insert(failure);
    }

    fn message(self, job: berth_core::JobId, step: u32, launch_failed: bool) -> AgentMessage {
        let exit_code = if launch_failed { self.worst.max(1) } else { self.worst };
        AgentMessage::StepEnded { job, step, exit_code, failure: self.failure }
    }
}

/// Direct modex (docs/protocol/03-control-tree.md, "Direct modex"): requests this node's ranks
/// asked (their tokens), requests of other nodes this node's server is answering, and the
/// routing of both through the tree.
struct Modex {
    me: u32,
    is_root: bool,
    next_id: u64,
    /// Asked here: request id → (rank, the waiting `PMIx_Get`s' token).
    asked: HashMap<u64, (u32, crate::step::pmix::ModexToken)>,
    /// Answered here: libpmix's key → the request.
    serving: HashMap<u64, ModexRequest>,
    /// Each rank's node (built at the first request).
    rank_node: Option<HashMap<u32, u32>>,
}

/// Where a direct modex message goes from this node.
enum Toward {
    Here,
    Child(usize),
    Up,
    Nowhere,
}

impl Modex {
    fn new(me: u32, is_root: bool) -> Modex {
        Modex { me, is_root, next_id: 1, asked: HashMap::new(), serving: HashMap::new(), rank_node: None }
    }

    fn node_of(&mut self, grant: &StepGrant, rank: u32) -> Option<u32> {
        let map = self.rank_node.get_or_insert_with(|| {
            let mut m = HashMap::new();
            for (i, n) in grant.nodes.iter().enumerate() {
                for r in &n.ranks {
                    m.insert(r.rank, i as u32);
                }
            }
            m
        });
        map.get(&rank).copied()
    }

    fn toward(&self, node: u32, children: &[Child]) -> Toward {
        if node == self.me {
            Toward::Here
        } else if let Some(i) = children.iter().position(|c| c.nodes.contains(&node)) {
            Toward::Child(i)
        } else if self.is_root {
            Toward::Nowhere
        } else {
            Toward::Up
        }
    }

    /// Send `down` to child `i` or `up` upstream; false when it cannot go (a child gone).
    fn send(
        to: Toward,
        down: TreeDown,
        up: TreeUp,
        children: &mut [Child],
        up_tx: &mpsc::UnboundedSender<TreeUp>,
    ) -> bool {
        match to {
            Toward::Child(i) => match children.get(i).and_then(|c| c.tx.as_ref()) {
                Some(tx) => tx.send(down).is_ok(),
                None => false,
            },
            Toward::Up => up_tx.send(up).is_ok(),
            Toward::Here | Toward::Nowhere => false,
        }
    }

    /// A local rank's `PMIx_Get` needs rank `rank`'s data: ask its node. Returns the request
    /// id to time out, or None when it was answered at once (failed).
    fn ask(
        &mut self,
        rank: u32,
        token: crate::step::pmix::ModexToken,
        grant: &StepGrant,
        children: &mut [Child],
        up_tx: &mpsc::UnboundedSender<TreeUp>,
    ) -> Option<u64> {
        let Some(node) = self.node_of(grant, rank) else {
            tracing::warn!(job = %grant.job, step = grant.step, "PMIx: a rank asked for the data of rank {rank}, which the step does not have");
            token.fail(ModexFailure::NoSuchRank);
            return None;
        };
        if self.asked.len() + self.serving.len() >= MAX_MODEX_PENDING {
            tracing::warn!(job = %grant.job, step = grant.step, "PMIx: too many direct modex requests in flight");
            token.fail(ModexFailure::Other);
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let req = ModexRequest { id, from: self.me, rank };
        let to = self.toward(node, children);
        if matches!(to, Toward::Here) {
            // libpmix holds a local rank's data itself: it has none.
            token.fail(ModexFailure::NoData);
            return None;
        }
        if !Self::send(to, TreeDown::ModexRequest(req.clone()), TreeUp::ModexRequest(req), children, up_tx) {
            token.fail(ModexFailure::NoData);
            return None;
        }
        self.asked.insert(id, (rank, token));
        Some(id)
    }

    fn timed_out(&mut self, id: u64) {
        if let Some((rank, token)) = self.asked.remove(&id) {
            tracing::warn!("PMIx: no answer for rank {rank}'s data within {} s", MODEX_TIMEOUT.as_secs());
            token.fail(ModexFailure::Timeout);
        }
    }

    /// Another node's request: answered here when the rank is this node's, passed on
    /// otherwise.
    fn request(
        &mut self,
        req: ModexRequest,
        grant: &StepGrant,
        pmix: Option<&crate::step::pmix::Namespace>,
        children: &mut [Child],
        up_tx: &mpsc::UnboundedSender<TreeUp>,
    ) {
        let failed =
            |why| ModexReply { id: req.id, to: req.from, rank: req.rank, data: String::new(), failure: Some(why) };
        let Some(node) = self.node_of(grant, req.rank) else {
            return self.reply(failed(ModexFailure::NoSuchRank), children, up_tx);
        };
        match self.toward(node, children) {
            Toward::Here => {
                if self.asked.len() + self.serving.len() >= MAX_MODEX_PENDING {
                    return self.reply(failed(ModexFailure::Other), children, up_tx);
                }
                match pmix.and_then(|ns| ns.dmodex_request(req.rank)) {
                    Some(key) => {
                        self.serving.insert(key, req);
                    }
                    None => self.reply(failed(ModexFailure::NoData), children, up_tx),
                }
            }
            Toward::Nowhere => self.reply(failed(ModexFailure::NoSuchRank), children, up_tx),
            to => {
                if !Self::send(
                    to,
                    TreeDown::ModexRequest(req.clone()),
                    TreeUp::ModexRequest(req.clone()),
                    children,
                    up_tx,
                ) {
                    self.reply(failed(ModexFailure::NoData), children, up_tx);
                }
            }
        }
    }

    /// This node's server answered a request of `serving`: the reply goes to the asking node.
    fn answered(
        &mut self,
        key: u64,
        data: Option<Vec<u8>>,
        children: &mut [Child],
        up_tx: &mpsc::UnboundedSender<TreeUp>,
    ) {
        let Some(req) = self.serving.remove(&key) else { return };
        let (data, failure) = match data {
            None => (String::new(), Some(ModexFailure::NoData)),
            Some(d) if d.len() > MAX_MODEX_BYTES => (String::new(), Some(ModexFailure::TooLarge)),
            Some(d) => (berth_protocol::auth::hex(&d), None),
        };
        self.reply(ModexReply { id: req.id, to: req.from, rank: req.rank, data, failure }, children, up_tx);
    }

    /// A reply: completes the request when it is this node's, passed on otherwise.
    fn reply(&mut self, rep: ModexReply, children: &mut [Child], up_tx: &mpsc::UnboundedSender<TreeUp>) {
        match self.toward(rep.to, children) {
            Toward::Here => {
                let Some((rank, token)) = self.asked.remove(&rep.id) else { return };
                match (rep.failure, berth_protocol::auth::unhex(&rep.data)) {
                    (Some(why), _) => {
                        tracing::warn!("PMIx: no data for rank {rank}: {why}");
                        token.fail(why);
                    }
                    (None, Some(blob)) if blob.len() <= MAX_MODEX_BYTES => token.complete(&blob),
                    (None, _) => {
                        tracing::warn!("PMIx: rank {rank}'s data came back unreadable or too large");
                        token.fail(ModexFailure::Other);
                    }
                }
            }
            Toward::Nowhere => tracing::debug!("PMIx: a direct modex reply for no node of the step"),
            to => {
                let _ = Self::send(to, TreeDown::ModexReply(rep.clone()), TreeUp::ModexReply(rep), children, up_tx);
            }
        }
    }
}

/// A barrier came back down: a PMIx fence's data completes the pending fence, anything else
/// is PMI's.
fn barrier_out(
    kvs: Vec<(String, String)>,
    pmi: Option<&crate::step::pmi::PmiServer>,
    fence: &mut Option<crate::step::pmix::ModexToken>,
) {
    match crate::step::pmix::fence_data(&kvs) {
        Some(data) => match (fence.take(), data) {
            (Some(token), Ok(all)) => token.complete(&all),
            (Some(token), Err(e)) => {
                tracing::warn!("PMIx fence failed: {e}");
                drop(token);
            }
            (None, _) => tracing::warn!("a PMIx fence's data came down, but no fence is pending here"),
        },
        None => {
            if let Some(p) = pmi {
                p.barrier_out(kvs);
            }
        }
    }
}

fn send_down(children: &mut [Child], msg: &TreeDown) {
    for c in children.iter_mut() {
        if let Some(tx) = &c.tx {
            if tx.send(msg.clone()).is_err() {
                c.tx = None;
            }
        }
    }
}

/// Signal every live local rank's process group.
fn signal_all(alive: &HashMap<u32, i32>, sig: i32) {
    for &pid in alive.values() {
        signal_group(pid, sig);
    }
}

fn signal_group(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process group the shepherd started (the rank called setsid).
    unsafe {
        if libc::kill(-pid, sig) != 0 {
            libc::kill(pid, sig);
        }
    }
}

/// No-kill mode: survivors read failed ranks from `BERTH_FAILED_RANKS`, one line each.
fn note_failure(file: &Option<std::path::PathBuf>, exit: &RankExit) {
    use std::io::Write;
    if let Some(path) = file {
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
            let _ = writeln!(f, "{} {} {}", exit.rank, exit.node, exit.describe());
        }
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, rank: u32, stream: u8, ev: mpsc::UnboundedSender<Event>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if ev.send(Event::Output(rank, stream, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
    let _ = ev.send(Event::StreamClosed);
}

async fn write_up<W: AsyncWrite + Unpin>(mut w: W, mut sealer: Sealer, mut rx: mpsc::UnboundedReceiver<TreeUp>) {
    while let Some(msg) = rx.recv().await {
        if write_sealed(&mut w, &mut sealer, &msg).await.is_err() {
            // Upstream is gone; the reader reports it. Drain so senders never block.
            while rx.recv().await.is_some() {}
            return;
        }
    }
    let _ = w.shutdown().await;
}

async fn read_down<R: AsyncRead + Unpin>(
    mut r: R,
    mut opener: Opener,
    (job, step): (berth_core::JobId, u32),
    auth: Option<Arc<crate::auth::AgentAuth>>,
    ev: mpsc::UnboundedSender<Event>,
) {
    loop {
        match read_sealed::<_, TreeDown>(&mut r, &mut opener).await {
            Ok(Some(msg)) => {
                if ev.send(Event::Down(msg)).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = ev.send(Event::UpLost("connection closed".into()));
                return;
            }
            Err(e) => {
                if let ProtocolError::Auth(why) = &e {
                    // Someone else's frame on the step's connection: the step ends as if the
                    // connection broke (nothing it asked is done), and the refusal is logged.
                    if let Some(auth) = &auth {
                        auth.refuse(
                            Refusal::Auth,
                            Some(job),
                            &format!("control tree frame for step {job}.{step} refused: {why}"),
                        );
                    }
                }
                let _ = ev.send(Event::UpLost(e.to_string()));
                return;
            }
        }
    }
}

/// One connection to a child agent: launch, then relay both ways until it is done.
async fn run_child(
    grant: StepGrant,
    group: Vec<u32>,
    link: LinkKey,
    auth: Option<Arc<crate::auth::AgentAuth>>,
    index: usize,
    mut down: mpsc::UnboundedReceiver<TreeDown>,
    ev: mpsc::UnboundedSender<Event>,
) {
    let Some(address) = group.first().and_then(|&n| grant.nodes.get(n as usize)).map(|n| n.address.clone()) else {
        let _ = ev.send(Event::ChildLost(index, "empty group".into()));
        return;
    };
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let _ = ev.send(Event::ChildLost(index, format!("cannot reach the agent at {address}: {e}")));
            return;
        }
        Err(_) => {
            let _ = ev.send(Event::ChildLost(index, format!("no answer from the agent at {address}")));
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    keepalive(&stream);
    let (mut rd, mut wr) = stream.into_split();
    let deadline = launch_deadline(group.len(), grant.fanout);
    let (mut sealer, mut opener) = link.link(group[0], TreeEnd::Above);
    let (job, step) = (grant.job, grant.step);
    let launch = AgentQuery::StepLaunch { grant: Box::new(grant), subtree: group };
    if let Err(e) = write_frame(&mut wr, &launch).await {
        let _ = ev.send(Event::ChildLost(index, format!("sending the launch to {address}: {e}")));
        return;
    }
    let writer = tokio::spawn(async move {
        while let Some(msg) = down.recv().await {
            if write_sealed(&mut wr, &mut sealer, &msg).await.is_err() {
                return;
            }
        }
        // The shepherd dropped us: closing the connection dissolves the subtree below.
        let _ = wr.shutdown().await;
    });
    let mut answered = false;
    loop {
        let Some(frame) = read_up(&mut rd, &mut opener, answered, deadline).await else {
            let why = format!(
                "the agent at {address} did not answer the launch within {} s (a hung node?)",
                deadline.as_secs()
            );
            let _ = ev.send(Event::ChildLost(index, why));
            break;
        };
        answered = true;
        match frame {
            Ok(Some(TreeUp::Done)) => {
                let _ = ev.send(Event::Child(index, TreeUp::Done));
                break;
            }
            Ok(Some(msg)) => {
                if ev.send(Event::Child(index, msg)).is_err() {
                    break;
                }
            }
            Ok(None) => {
                let _ = ev.send(Event::ChildLost(index, format!("the agent at {address} closed the connection")));
                break;
            }
            Err(e) => {
                if let (ProtocolError::Auth(why), Some(auth)) = (&e, &auth) {
                    auth.refuse(
                        Refusal::Auth,
                        Some(job),
                        &format!("control tree frame from {address} for step {job}.{step} refused: {why}"),
                    );
                }
                let _ = ev.send(Event::ChildLost(index, format!("connection to {address}: {e}")));
                break;
            }
        }
    }
    writer.abort();
}
