//! The controller's sockets and its single state-owning thread.
//!
//! Connections are async tasks; all state lives in one thread (the actor) that takes commands
//! in batches, applies a batch in one transaction, commits, and only then replies and sends
//! launches: one fsync serves many submissions (group commit), and nothing is acknowledged
//! before it is durable.

pub use crate::command::{Command, ServerError};
use crate::config::ControllerConfig;
use crate::model::request::Peer;
use crate::pacing::PassPacer;
use crate::state::{AgentTx, Controller};
use crate::store::{Store, StoreError, WriteBlock};
use crate::users::peer_identity;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::auth::{
    now_ms, random_nonce, read_sealed_limited, registered_label, session, write_sealed, ClusterKey, Envelope,
    ReplayGuard, Role, DEFAULT_GUARD_CAPACITY, LABEL_REGISTER,
};
use berth_protocol::client::{ApiError, ClientRequest, ClientResponse, ErrorCode, StoreHealth};
use berth_protocol::frame::decode;
use berth_protocol::{read_frame_limited, read_raw_frame_limited, write_frame, ProtocolError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// Run the controller until SIGTERM or SIGINT.
pub async fn serve(cfg: ControllerConfig) -> Result<(), ServerError> {
    let store = Store::open(&cfg.state_dir)?;
    store.preallocate_wal();
    // No key, no controller: agents could not prove themselves, nor could we.
    let key = Arc::new(ClusterKey::load(cfg.key_file.as_deref().ok_or(ServerError::NoKey)?)?);
    let mut ctl = Controller::load(cfg.clone(), store)?;
    ctl.key = Some(key.clone());
    let auth = Arc::new(AgentAuth {
        key,
        guard: std::sync::Mutex::new(ReplayGuard::new(
            Duration::from_secs(cfg.replay_window_secs.max(1)),
            DEFAULT_GUARD_CAPACITY,
        )),
        fencing: cfg.lease().is_some(),
    });
    tracing::info!(jobs = ctl.jobs.len(), nodes = ctl.cluster.nodes().len(), "state loaded");

    let socket = cfg.socket.clone();
    if socket.exists() {
        if UnixStream::connect(&socket).await.is_ok() {
            return Err(ServerError::AlreadyRunning(socket.display().to_string()));
        }
        let _ = std::fs::remove_file(&socket);
    }
    if let Some(parent) = socket.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let unix = UnixListener::bind(&socket).map_err(|source| ServerError::Listen {
        what: "unix socket",
        addr: socket.display().to_string(),
        source,
    })?;
    // Every local user may connect; who they are comes from SO_PEERCRED, not from trust.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666));
    let tcp = TcpListener::bind(&cfg.listen).await.map_err(|source| ServerError::Listen {
        what: "agent address",
        addr: cfg.listen.clone(),
        source,
    })?;
    tracing::info!(socket = %socket.display(), agents = %cfg.listen, "controller listening");
    let api = crate::api::bind(&cfg).await?;

    let (tx, rx) = mpsc::channel::<Command>(65536);
    let actor = std::thread::Builder::new()
        .name("berth-state".into())
        .spawn({
            let waker = Waker { tx: tx.downgrade(), rt: tokio::runtime::Handle::current(), armed: None };
            move || run_actor(ctl, rx, waker)
        })
        .map_err(|_| ServerError::ActorGone)?;

    let tick_every = Duration::from_secs_f64((cfg.heartbeat_interval_secs / 2.0).clamp(0.1, 1.0));
    let ticker = tx.clone();
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(tick_every);
        loop {
            iv.tick().await;
            if ticker.send(Command::Tick).await.is_err() {
                break;
            }
        }
    });
    // Raises the descriptor limit; caps connections per user and in all (docs/protocol/00-framing.md, "Limits").
    let limits = crate::conn::Limits::new(&cfg);
    let conn_ids = Arc::new(AtomicU64::new(1));
    let _api = api.serve(tx.clone(), conn_ids.clone());
    let client_tx = tx.clone();
    let client_ids = conn_ids.clone();
    let client_limits = limits.clone();
    tokio::spawn(async move {
        loop {
            match unix.accept().await {
                Ok((stream, _)) => {
                    let Some((stream, slot)) = client_limits.admit(stream) else { continue };
                    let limits = client_limits.clone();
                    let tx = client_tx.clone();
                    let conn = client_ids.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        // Only connections that asked for steps can hold any.
                        let _slot = slot;
                        if serve_client(stream, conn, tx.clone(), &limits).await {
                            let _ = tx.send(Command::ClientGone { conn }).await;
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept on unix socket: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    let agent_tx = tx.clone();
    tokio::spawn(async move {
        loop {
            match tcp.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let tx = agent_tx.clone();
                    let id = conn_ids.fetch_add(1, Ordering::Relaxed);
                    let auth = auth.clone();
                    let Some(handshake) = limits.handshake() else {
                        tracing::warn!(peer = %addr, "agent connection closed: too many handshakes in progress");
                        continue;
                    };
                    let limits = limits.clone();
                    tokio::spawn(async move {
                        serve_agent(stream, addr.to_string(), id, tx, auth, handshake, &limits).await
                    });
                }
                Err(e) => {
                    tracing::warn!("accept on agent port: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| ServerError::Listen { what: "signal", addr: "SIGTERM".into(), source })?;
    let actor_done = tokio::task::spawn_blocking(move || actor.join());
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        r = actor_done => {
            let _ = std::fs::remove_file(&socket);
            return match r {
                Ok(Ok(Ok(()))) => Ok(()),
                Ok(Ok(Err(e))) => Err(e.into()),
                _ => Err(ServerError::ActorGone),
            };
        }
    }
    let _ = tx.send(Command::Shutdown).await;
    // Give the actor a moment to commit its last batch.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// The state thread: takes commands in batches, applies each batch in one transaction,
/// commits, then sends its orders and replies.
///
/// When the store cannot be written (its filesystem is full, or another process holds a
/// lock on the database: [`StoreError::Unwritable`]; a commit that finds the database busy
/// is first retried with backoff, `commit_retrying`), the controller does not stop:
/// - the failed batch's transaction is rolled back, and its in-memory changes are undone by
///   reloading the state from the store (`Controller::reload`, keeping the live connections);
///   none of its orders leave, every client request in it is answered with `no_space` (or
///   `unavailable` for a lock) naming the path, and the agent messages and step ends in it
///   are kept (`Deferred`) to be applied later; an agent registering in it is told to retry;
/// - until the store is writable again (probed with a small durable write at ticks, with
///   backoff: `Degraded`), requests that change state are refused up front with the same
///   error, reads are served, agents' heartbeats are taken, and everything else from the
///   agents (job starts and ends above all) waits in memory, unacknowledged: an agent keeps
///   a job's end (on its disk too) until the controller acknowledges it after writing it,
///   and sends it again when it registers, so a controller restart meanwhile loses nothing;
/// - when the probe succeeds, the kept messages are applied first, in order, with the next
///   batch, and scheduling resumes. `berth status` reports the condition meanwhile
///   (`Controller::store_health`).
///
/// Any other store error stops the controller, as before: nothing unrecorded is acknowledged.
///
/// A scheduling pass runs in a batch that changed something, paced under a stream of
/// changes (`crate::pacing`): a pass held back runs in a later batch, at the latest in the
/// one the `Waker` starts.
fn run_actor(mut ctl: Controller, mut rx: mpsc::Receiver<Command>, mut waker: Waker) -> Result<(), StoreError> {
    const MAX_BATCH: usize = 4096;
    let mut deferred: Vec<Deferred> = Vec::new();
    let mut degraded = Degraded::default();
    let mut pacer = PassPacer::new(ctl.cfg.scheduler.pass_pace);
    while let Some(first) = rx.blocking_recv() {
        let mut batch = Vec::with_capacity(64);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let now = ctl.clock.unix();
        berth_protocol::probe::mark("ctl batch");
        if ctl.store_health.is_some() && degraded.due(ctl.clock.instant()) {
            // After a full disk, writing resumes once there is room for more than the probe.
            let no_space = ctl.store_health.as_ref().is_some_and(|h| h.problem == WriteBlock::NoSpace.as_str());
            let probe = if no_space && crate::store::free_bytes(ctl.store.path()) < ROOM_TO_RESUME {
                Err(StoreError::Unwritable {
                    block: WriteBlock::NoSpace,
                    path: ctl.store.path().to_path_buf(),
                    detail: format!("less than {ROOM_TO_RESUME} bytes free"),
                })
            } else {
                ctl.store.probe_write(now)
            };
            match probe {
                Ok(()) => {
                    let health = ctl.store_health.take();
                    let what = health.map(|h| format!("{} for {:.1} s: {}", h.problem, now - h.since, h.message));
                    let what = what.unwrap_or_default();
                    tracing::info!(kept = deferred.len(), "the state database is writable again (it was {what})");
                    if let Err(e) = ctl.store.event(now, "store_writable", None, None, &what) {
                        tracing::warn!("cannot log the store's recovery: {e}");
                    }
                    degraded = Degraded::default();
                    ctl.dirty = true;
                    // What waited is applied first, in the order it came.
                    let kept: Vec<Command> = deferred.drain(..).map(Deferred::into_command).collect();
                    batch.splice(0..0, kept);
                }
                Err(e) if e.unwritable().is_some() => {
                    degraded.failed(ctl.clock.instant());
                    tracing::debug!("the state database is still not writable: {e}");
                }
                Err(e) => {
                    tracing::error!("state store failed: {e}; stopping so that nothing unrecorded is acknowledged");
                    return Err(e);
                }
            }
        }
        let stop;
        (ctl, stop) = apply_batch(ctl, batch, &mut deferred, &mut pacer, now)?;
        if stop {
            break;
        }
        // A pass this batch held back runs when due, or at once if it is due already (the
        // commit may have outlasted the wait): in a batch of its own if nothing else comes.
        if pacer.held_back() && ctl.dirty && ctl.store_health.is_none() {
            let now = ctl.clock.instant();
            waker.arm(pacer.wait_until(now).unwrap_or(now));
        }
    }
    Ok(())
}

/// Sends the state thread a `Command::Wake` when a pass held back by the pacer is due, so that
/// it runs even if nothing else comes.
struct Waker {
    /// Weak: the state thread's own sender must not keep its channel open.
    tx: mpsc::WeakSender<Command>,
    rt: tokio::runtime::Handle,
    /// When the wake-up on its way is due.
    armed: Option<std::time::Instant>,
}

impl Waker {
    fn arm(&mut self, at: std::time::Instant) {
        let now = std::time::Instant::now();
        if self.armed.is_some_and(|t| t > now && t <= at) {
            return; // one on its way already, before the pass is due; it re-arms if needed
        }
        self.armed = Some(at);
        let tx = self.tx.clone();
        self.rt.spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(Command::Wake).await;
            }
        });
    }
}

/// Bytes that must be free on the state database's filesystem, after it filled, before
/// writing is tried again (a write that just fits would only fill it again at once).
const ROOM_TO_RESUME: u64 = 1 << 20;

/// When to probe again whether the store is writable: at ticks, from every 0.25 s to every
/// 2 s while it keeps failing.
#[derive(Default)]
struct Degraded {
    next: Option<std::time::Instant>,
    delay: Duration,
}

impl Degraded {
    fn due(&self, now: std::time::Instant) -> bool {
        self.next.is_none_or(|t| now >= t)
    }

    fn failed(&mut self, now: std::time::Instant) {
        self.delay = (self.delay * 2).clamp(Duration::from_millis(250), Duration::from_secs(2));
        self.next = Some(now + self.delay);
    }
}

/// What could not be written yet and is applied once the store is writable (`run_actor`).
// Few at a time (only while the store is not writable): a request kept inline, as `Command`.
#[allow(clippy::large_enum_variant)]
enum Deferred {
    Agent {
        node: usize,
        conn_id: u64,
        msg: AgentMessage,
    },
    AgentGone {
        node: usize,
        conn_id: u64,
    },
    ClientGone {
        conn: u64,
    },
    /// A step's end (`berth run` has its answer already: it is acknowledged when queued).
    StepEnd {
        req: ClientRequest,
        peer: Peer,
    },
}

impl Deferred {
    fn into_command(self) -> Command {
        match self {
            Deferred::Agent { node, conn_id, msg } => Command::Agent { node, conn_id, msg },
            Deferred::AgentGone { node, conn_id } => Command::AgentGone { node, conn_id },
            Deferred::ClientGone { conn } => Command::ClientGone { conn },
            Deferred::StepEnd { req, peer } => Command::Client { req, peer, reply: oneshot::channel().0 },
        }
    }
}

/// How to answer one command of a batch whose writes fail.
#[derive(Default)]
struct OnFailure {
    /// The client's reply channel (the handler answered into the receiver's other end).
    reply: Option<(oneshot::Sender<ClientResponse>, oneshot::Receiver<ClientResponse>)>,
    keep: Option<Deferred>,
    /// An agent registering: told to try again.
    reject: Option<AgentTx>,
}

/// Whether a client request changes what the store holds (refused while it cannot be
/// written); the others only read (a refusal they log may still fail to be written: then
/// they get the store's error).
fn changes_state(req: &ClientRequest) -> bool {
    // A signal writes nothing either (but is not a query: sending it twice is not the same).
    !(req.is_query() || matches!(req, ClientRequest::Signal { .. }))
}

/// The error a request gets when the store cannot record it.
fn unrecorded(e: &StoreError) -> ClientResponse {
    refusal(e.unwritable() == Some(WriteBlock::NoSpace), &e.to_string())
}

fn refusal(no_space: bool, why: &str) -> ClientResponse {
    let code = if no_space { ErrorCode::NoSpace } else { ErrorCode::Unavailable };
    ClientResponse::Error(ApiError::new(code, format!("not done, the controller cannot record it: {why}")))
}

/// Apply one batch (see `run_actor`); returns the controller (reloaded if the batch failed)
/// and whether it was told to stop.
fn apply_batch(
    mut ctl: Controller,
    batch: Vec<Command>,
    deferred: &mut Vec<Deferred>,
    pacer: &mut PassPacer,
    now: f64,
) -> Result<(Controller, bool), StoreError> {
    let mut stop = false;
    let degraded = ctl.store_health.is_some();
    let begun = if degraded { ctl.store.begin_deferred() } else { ctl.store.begin() };
    if let Err(e) = begun {
        ctl.store.rollback();
        if e.unwritable().is_none() || degraded {
            tracing::error!("state store failed: {e}; stopping so that nothing unrecorded is acknowledged");
            return Err(e);
        }
        // Nothing of the batch is applied yet: all of it is handled as the store allows.
        mark_unwritable(&mut ctl, &e, now);
        return apply_batch(ctl, batch, deferred, pacer, now);
    }
    let mut undo: Vec<OnFailure> = Vec::with_capacity(batch.len());
    let mut commands = batch.into_iter();
    let result = (|| -> Result<(), StoreError> {
        for cmd in commands.by_ref() {
            let mut on_failure = OnFailure::default();
            match cmd {
                Command::Client { req, peer, reply } => {
                    if matches!(req, ClientRequest::StepEnd { .. }) {
                        if degraded {
                            deferred.push(Deferred::StepEnd { req, peer });
                            continue;
                        }
                        on_failure.keep = Some(Deferred::StepEnd { req: req.clone(), peer: peer.clone() });
                    } else if degraded && changes_state(&req) {
                        let (no_space, why) = unwritable_now(&ctl);
                        let _ = reply.send(refusal(no_space, &why));
                        continue;
                    }
                    let (inner, answer) = oneshot::channel();
                    on_failure.reply = Some((reply, answer));
                    undo.push(on_failure);
                    ctl.handle_client(req, &peer, inner, now)?;
                }
                Command::Register { reg, conn_id, tx, node } => {
                    if degraded {
                        let reason = format!("{}; try again", unwritable_now(&ctl).1);
                        let _ = tx.send(ControllerMessage::Rejected { reason });
                        let _ = node.send(None);
                        continue;
                    }
                    on_failure.reject = Some(tx.clone());
                    undo.push(on_failure);
                    let name = reg.name.clone();
                    ctl.handle_register(*reg, conn_id, tx, now)?;
                    let _ = node.send(ctl.node_by_name(&name).filter(|i| ctl.extra[*i].is_connection(conn_id)));
                }
                Command::Agent { node, conn_id, msg } => {
                    if let AgentMessage::Heartbeat { .. } = msg {
                        if degraded {
                            // Heard from; what it runs is checked once the store is writable.
                            let heard = ctl.clock.instant();
                            if let Some(ex) = ctl.extra.get_mut(node).filter(|e| e.is_connection(conn_id)) {
                                ex.heard(heard);
                            }
                            continue;
                        }
                    } else if degraded {
                        if let AgentMessage::JobEnded { id, .. } = &msg {
                            tracing::warn!(job = %id, node, "job end kept in memory (unacknowledged) until it can be written");
                        }
                        deferred.push(Deferred::Agent { node, conn_id, msg });
                        continue;
                    } else {
                        on_failure.keep = Some(Deferred::Agent { node, conn_id, msg: msg.clone() });
                    }
                    undo.push(on_failure);
                    ctl.handle_agent(node, conn_id, msg, now)?;
                }
                Command::AgentGone { node, conn_id } => {
                    if degraded {
                        deferred.push(Deferred::AgentGone { node, conn_id });
                        continue;
                    }
                    on_failure.keep = Some(Deferred::AgentGone { node, conn_id });
                    undo.push(on_failure);
                    ctl.handle_disconnect(node, conn_id);
                }
                Command::ClientGone { conn } => {
                    if degraded {
                        deferred.push(Deferred::ClientGone { conn });
                        continue;
                    }
                    on_failure.keep = Some(Deferred::ClientGone { conn });
                    undo.push(on_failure);
                    ctl.client_gone(conn, now)?;
                }
                Command::AuthRefused { node, detail } => {
                    // Logged by the connection already; the event waits for nothing.
                    if !degraded {
                        ctl.queue([crate::handlers::auth_refused(node, detail)]);
                    }
                }
                Command::Tick => {
                    if !degraded {
                        ctl.check_heartbeats(now)?;
                        ctl.check_interactive(now)?;
                        ctl.check_lowered_walltimes(now)?;
                        ctl.check_reservations(now, false)?;
                        ctl.check_advance(now)?;
                        ctl.check_begin(now);
                    }
                }
                // Only here to start a batch: its pass, held back by the pacer, is due.
                Command::Wake => {}
                Command::Shutdown => stop = true,
            }
            berth_protocol::probe::mark("ctl command handled");
            // What the command decided to write, in order, before the next command.
            ctl.carry_out_effects(now)?;
            berth_protocol::probe::mark("ctl effects written");
        }
        if ctl.dirty && !degraded {
            let began = ctl.clock.instant();
            if pacer.wait_until(began).is_none() {
                ctl.schedule(now)?;
                pacer.ran(began, ctl.clock.instant());
                berth_protocol::probe::mark("ctl scheduled");
            } else {
                pacer.hold();
            }
        }
        if stop && !degraded {
            ctl.closing()?;
        }
        Ok(())
    })();
    berth_protocol::probe::mark("ctl applied");
    let committed = result.and_then(|()| commit_retrying(&ctl.store));
    let must_sync = match committed {
        Ok(must_sync) => must_sync,
        Err(e) => {
            ctl.store.rollback();
            if e.unwritable().is_none() {
                tracing::error!("state store failed: {e}; stopping so that nothing unrecorded is acknowledged");
                return Err(e);
            }
            // Nothing of this batch leaves: undo it in memory, answer and keep what it held.
            ctl.out.replies.clear();
            ctl.out.agents.clear();
            mark_unwritable(&mut ctl, &e, now);
            let health = ctl.store_health.take();
            ctl = ctl.reload()?;
            ctl.store_health = health;
            let refused = unrecorded(&e);
            let mut kept = 0;
            for f in undo {
                if let Some((reply, _)) = f.reply {
                    let _ = reply.send(refused.clone());
                }
                if let Some(tx) = f.reject {
                    let _ = tx.send(ControllerMessage::Rejected { reason: format!("{e}; try again") });
                }
                if let Some(d) = f.keep {
                    deferred.push(d);
                    kept += 1;
                }
            }
            if kept > 0 {
                tracing::warn!(kept, "agent messages and step ends kept in memory until the state can be written");
            }
            // What the batch had not reached yet is handled as the store allows now.
            let rest: Vec<Command> = commands.collect();
            let (ctl, stopped) = apply_batch(ctl, rest, deferred, pacer, now)?;
            return Ok((ctl, stop || stopped));
        }
    };
    berth_protocol::probe::mark("ctl written");
    // Agents first, as soon as the commit is written (`JobIds::agents_before_sync`): an
    // interactive allocation's launch is on its way, and the agent making the job's
    // cgroups, while the commit is synced and before `run` has its grant.
    if ctl.ids.agents_before_sync() {
        send_orders(&mut ctl);
    }
    if must_sync {
        ctl.store.sync_committed()?;
        berth_protocol::probe::mark("ctl synced");
        ctl.ids.synced();
    }
    send_orders(&mut ctl); // those that had to wait for the sync
    if !ctl.out.replies.is_empty() {
        berth_protocol::probe::mark("ctl replies sent");
    }
    for (tx, resp) in ctl.out.replies.drain(..) {
        let _ = tx.send(resp);
    }
    for f in undo {
        if let Some((reply, mut answer)) = f.reply {
            if let Ok(resp) = answer.try_recv() {
                let _ = reply.send(resp);
            }
        }
    }
    Ok((ctl, stop))
}

/// Commit the open transaction, trying again with backoff (20 ms to 0.5 s, 2 s in all on top
/// of SQLite's own `BUSY_TIMEOUT`) while another process holds the database's lock.
fn commit_retrying(store: &Store) -> Result<bool, StoreError> {
    let mut delay = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    loop {
        match store.commit_written() {
            Err(e) if e.unwritable() == Some(WriteBlock::Busy) && waited < Duration::from_secs(2) => {
                tracing::warn!("commit: {e}; trying again in {delay:?}");
                std::thread::sleep(delay);
                waited += delay;
                delay = (delay * 3).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// The store cannot be written: say so (log, `berth status`) unless it was known already.
fn mark_unwritable(ctl: &mut Controller, e: &StoreError, now: f64) {
    let problem = e.unwritable().map(WriteBlock::as_str).unwrap_or("error").to_string();
    match &mut ctl.store_health {
        Some(h) => {
            h.problem = problem;
            h.message = e.to_string();
        }
        None => {
            tracing::error!(
                "cannot write the state database: {e}. Until it can be written, changes are refused \
                 (`no_space`/`unavailable`), reads are served, running jobs go on and their ends are kept \
                 until they can be recorded"
            );
            ctl.store_health = Some(StoreHealth { problem, message: e.to_string(), since: now });
        }
    }
}

/// The store's current condition: whether the disk is full, and what is wrong.
fn unwritable_now(ctl: &Controller) -> (bool, String) {
    match &ctl.store_health {
        Some(h) => (h.problem == WriteBlock::NoSpace.as_str(), h.message.clone()),
        None => (false, "the state database cannot be written".into()),
    }
}

/// Send the batch's orders to the agents, in order.
fn send_orders(ctl: &mut Controller) {
    if !ctl.out.agents.is_empty() {
        berth_protocol::probe::mark("ctl orders sent");
    }
    for (tx, msg) in ctl.out.agents.drain(..) {
        let _ = tx.send(msg);
    }
}

/// Serve one client connection until it closes; true if it asked for a step.
async fn serve_client(
    mut stream: UnixStream,
    conn: u64,
    tx: mpsc::Sender<Command>,
    limits: &crate::conn::Limits,
) -> bool {
    let user = match peer_identity(&stream) {
        Ok(u) => u,
        Err(e) => {
            let _ = write_frame(&mut stream, &ClientResponse::Error(ApiError::new(ErrorCode::Internal, e))).await;
            return false;
        }
    };
    let peer = Peer { user, conn };
    let mut stepped = false;
    // Granted a step: `berth run` holds the connection, silent, while the step runs.
    let mut holds_step = false;
    loop {
        let req: ClientRequest = match read_frame_limited(&mut stream, &limits.request(holds_step)).await {
            Ok(Some(r)) => r,
            Ok(None) => return stepped,
            Err(e @ ProtocolError::Idle(_)) => {
                let msg = format!("the controller {e}");
                let _ =
                    write_frame(&mut stream, &ClientResponse::Error(ApiError::new(ErrorCode::Unavailable, msg))).await;
                return stepped;
            }
            Err(e @ ProtocolError::Busy(_)) => {
                let _ = write_frame(
                    &mut stream,
                    &ClientResponse::Error(ApiError::new(ErrorCode::Unavailable, e.to_string())),
                )
                .await;
                return stepped;
            }
            Err(e) => {
                let msg = format!("could not read your request: {e}");
                let _ =
                    write_frame(&mut stream, &ClientResponse::Error(ApiError::new(ErrorCode::BadRequest, msg))).await;
                return stepped;
            }
        };
        if matches!(req, ClientRequest::StepCreate(_)) {
            berth_protocol::probe::mark("ctl step create read");
        }
        // An allocation (`berth alloc`) is held by its connection as a step is.
        stepped |= matches!(req, ClientRequest::StepCreate(_) | ClientRequest::Alloc(_));
        // A step's end is acknowledged once it is queued: the actor takes commands in order, so
        // whatever the client does next (another `berth run` in the job, `berth acct --steps`)
        // is handled after it, and `run` exits without waiting for the state thread (the
        // invocation log row is written with the next batch; refusals are logged there).
        let early = match &req {
            ClientRequest::StepEnd { job, .. } => Some(ClientResponse::Done {
                results: vec![berth_protocol::client::IdResult { id: *job, ok: true, error: None }],
            }),
            _ => None,
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if tx.send(Command::Client { req, peer: peer.clone(), reply: reply_tx }).await.is_err() {
            return stepped;
        }
        if let Some(resp) = early {
            if write_frame(&mut stream, &resp).await.is_err() {
                return stepped;
            }
            continue;
        }
        let resp = match reply_rx.await {
            Ok(r) => r,
            Err(_) => ClientResponse::Error(ApiError::new(
                ErrorCode::Unavailable,
                "the controller is stopping; try again when it is back",
            )),
        };
        // `berth alloc` holds its allocation (answered `submitted`) as `run` holds a step.
        holds_step |= matches!(resp, ClientResponse::StepGranted { .. })
            || (stepped && matches!(resp, ClientResponse::Submitted { .. }));
        if let Err(e) = write_frame(&mut stream, &resp).await {
            let ProtocolError::TooLarge { len, .. } = e else { return stepped };
            // Every request gets an answer: one too large for a frame is replaced by why.
            tracing::warn!(uid = peer.user.uid, len, "an answer too large for a frame was replaced by an error");
            let msg = format!(
                "the answer is {len} bytes, more than a frame holds ({} bytes); ask for less: `berth jobs --state ...`, `berth acct --limit N`, `berth events --limit N`",
                berth_protocol::MAX_FRAME_BYTES
            );
            let refusal = ClientResponse::Error(ApiError::new(ErrorCode::BadRequest, msg));
            if write_frame(&mut stream, &refusal).await.is_err() {
                return stepped;
            }
        }
    }
}

/// What agent connections are checked with.
struct AgentAuth {
    key: Arc<ClusterKey>,
    /// Nonces of accepted registrations (one per connection).
    guard: std::sync::Mutex<ReplayGuard>,
    /// Agents that fence get a lease, renewed here on each heartbeat (crate::lease).
    fencing: bool,
}

use crate::conn::HANDSHAKE_TIMEOUT;

/// Refuse an agent connection: a tracing warning and event `auth_refused` (node = the name
/// the peer claimed, if any; detail = its address and why).
async fn auth_refused(tx: &mpsc::Sender<Command>, addr: &str, node: Option<String>, why: String) {
    tracing::warn!(peer = %addr, node = node.as_deref().unwrap_or("?"), "agent connection refused: {why}");
    let detail = format!("from {addr}: {why}");
    let _ = tx.send(Command::AuthRefused { node, detail }).await;
}

/// The node name a (perhaps forged) first frame claims, for the log only.
fn claimed_name(body: &[u8]) -> Option<String> {
    // Signed or not, of this version or not: look for a name without trusting anything.
    // The body is the message (this version), a string holding it (version 2), or absent.
    let outer: serde_json::Value = serde_json::from_slice(body).ok()?;
    let v = match outer.get("body") {
        Some(serde_json::Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(inner @ serde_json::Value::Object(_)) => inner.clone(),
        _ => outer,
    };
    v.get("name").and_then(|n| n.as_str()).map(|n| n.chars().take(64).collect())
}

/// One agent connection: the signed handshake (docs/protocol/06-auth.md, "Authentication"), then
/// session frames both ways until it closes.
async fn serve_agent(
    stream: tokio::net::TcpStream,
    addr: String,
    conn_id: u64,
    tx: mpsc::Sender<Command>,
    auth: Arc<AgentAuth>,
    handshake: crate::conn::Handshake,
    limits: &crate::conn::Limits,
) {
    let (mut rd, mut wr) = stream.into_split();
    let registration = limits.registration();
    let first = read_raw_frame_limited(&mut rd, &registration);
    let body = match tokio::time::timeout(HANDSHAKE_TIMEOUT, first).await {
        Ok(Ok(Some(b))) => b,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            auth_refused(&tx, &addr, None, format!("unreadable first frame: {e}")).await;
            return;
        }
        Err(_) => {
            auth_refused(&tx, &addr, None, "no registration within 10 s".into()).await;
            return;
        }
    };
    // Answers to a peer that failed are unsigned: they only help an operator see why.
    let reject = |reason: String| ControllerMessage::Rejected { reason };
    let env: Envelope = match decode(&body) {
        Ok(env) => env,
        Err(e) => {
            let why = match e {
                ProtocolError::Version { theirs } => {
                    format!(
                        "protocol version {theirs}, not {}: run the same berth version",
                        berth_protocol::PROTOCOL_VERSION
                    )
                }
                _ => "the registration is not signed with the cluster key".to_string(),
            };
            auth_refused(&tx, &addr, claimed_name(&body), why.clone()).await;
            let _ = write_frame(&mut wr, &reject(why)).await;
            return;
        }
    };
    let opened = auth
        .guard
        .lock()
        .map_err(|_| "replay guard poisoned".to_string())
        .and_then(|mut g| env.open(&auth.key, LABEL_REGISTER, &mut g, now_ms()).map_err(|e| e.to_string()));
    let agent_nonce = match opened {
        Ok(n) => n,
        Err(why) => {
            auth_refused(&tx, &addr, claimed_name(&body), format!("registration refused: {why}")).await;
            let _ = write_frame(&mut wr, &reject(format!("authentication failed: {why}"))).await;
            return;
        }
    };
    let reg = match env.message::<AgentMessage>() {
        Ok(AgentMessage::Register(reg)) => reg,
        Ok(_) => {
            let _ = write_frame(&mut wr, &reject("the first message must be a registration".into())).await;
            return;
        }
        Err(e) => {
            tracing::warn!(peer = %addr, "bad registration from an agent holding the key: {e}");
            let _ = write_frame(&mut wr, &reject(e.to_string())).await;
            return;
        }
    };
    let controller_nonce = random_nonce();
    let (mut sealer, mut opener) = session(&auth.key, &agent_nonce, &controller_nonce, Role::Controller);
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<ControllerMessage>();
    let key = auth.key.clone();
    let writer = tokio::spawn(async move {
        // The first answer (registered or rejected) proves the key and binds the session to
        // both nonces; every later frame is a session frame.
        let Some(first) = out_rx.recv().await else { return };
        let Ok(env) = Envelope::seal_at(&key, &registered_label(&agent_nonce), &first, now_ms(), controller_nonce)
        else {
            return;
        };
        if write_frame(&mut wr, &env).await.is_err() {
            return;
        }
        while let Some(msg) = out_rx.recv().await {
            berth_protocol::probe::mark("ctl writer woke");
            if write_sealed(&mut wr, &mut sealer, &msg).await.is_err() {
                break;
            }
            berth_protocol::probe::mark("ctl writer wrote");
        }
    });
    let name = reg.name.clone();
    // Weak: the writer (and with it the connection) ends when the state thread drops the
    // node's sender (node taken for down, connection replaced), renewals or not.
    let renew = (auth.fencing && reg.lease).then(|| out_tx.downgrade());
    let (node_tx, node_rx) = oneshot::channel();
    if tx.send(Command::Register { reg, conn_id, tx: out_tx, node: node_tx }).await.is_err() {
        return;
    }
    let Ok(Some(node)) = node_rx.await else {
        let _ = writer.await;
        return;
    };
    // Authenticated and registered: no longer a handshake; heartbeats keep it from idling.
    drop(handshake);
    let session_limits = limits.agent_session();
    let heard = crate::lease::open(conn_id);
    loop {
        match read_sealed_limited::<_, AgentMessage>(&mut rd, &mut opener, &session_limits).await {
            Ok(Some(msg)) => {
                // Stamped before the renewal goes out: the state thread then never judges the
                // node silent for longer than the agent has gone unrenewed.
                crate::lease::heard(&heard);
                if let (Some(renew), AgentMessage::Heartbeat { seq, .. }) = (&renew, &msg) {
                    if let Some(renew) = renew.upgrade() {
                        let _ = renew.send(ControllerMessage::Renew { seq: *seq });
                    }
                }
                if tx.send(Command::Agent { node, conn_id, msg }).await.is_err() {
                    break;
                }
            }
            Ok(None) => break,
            Err(ProtocolError::Auth(e)) => {
                auth_refused(&tx, &addr, Some(name.clone()), format!("frame refused, connection closed: {e}")).await;
                break;
            }
            Err(e) => {
                tracing::warn!(peer = %addr, "agent connection: {e}");
                break;
            }
        }
    }
    crate::lease::close(conn_id);
    let _ = tx.send(Command::AgentGone { node, conn_id }).await;
    writer.abort();
}
