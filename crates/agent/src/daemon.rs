//! The agent process: registers with the controller, heartbeats, runs what it is told.

use crate::auth::AgentAuth;
use crate::cgroup::{self, CgroupBackend};
use crate::cpumap::CpuMap;
use crate::hwtopo::{self, TopologySource};
use crate::job::suspend::Op;
use crate::job::{cgroup_name, run_job};
use crate::ports::JobContext;
use crate::records::Records;
use crate::step::shepherd::Upstream;
use berth_core::job::JobOutcome;
use berth_core::{CpuSet, JobId};
use berth_protocol::agent::{AgentMessage, AgentQuery, AgentReply, ControllerMessage, LaunchSpec, Registration};
use berth_protocol::auth::{
    check_time, now_ms, random_nonce, registered_label, session, write_sealed, ClusterKey, Envelope, LinkKey, Role,
    SealedReader, TreeEnd, DEFAULT_WINDOW, LABEL_REGISTER,
};
use berth_protocol::error::Refusal;
use berth_protocol::frame::decode;
use berth_protocol::step::{RankExit, StepGrant, TreeUp};
use berth_protocol::{read_frame_limited, read_raw_frame, write_frame, ProtocolError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: String,
    /// The controller's agent address (host:port).
    pub controller: String,
    /// Where this agent listens (host:port; port 0 picks one).
    pub listen: String,
    pub state_dir: PathBuf,
    pub topology: TopologySource,
    /// The admin's NUMA node memory sizes (`--numa-memory`), over what hwloc and the OS say.
    pub numa_memory: hwtopo::NumaMemory,
    /// The agent's cgroup subtree, relative to each controller's mount (e.g. `berth/node1`).
    pub cgroup_root: String,
    /// Parent of per-job spool directories and TMPDIRs.
    pub spool_dir: PathBuf,
    /// The local socket of the task API (`BERTH_AGENT_SOCKET`), usually `<state_dir>/agent.sock`.
    pub socket: PathBuf,
    /// The cluster key (`--key-file`): proves this agent to the controller and the
    /// controller to it, and checks step grants (docs/protocol/06-auth.md).
    pub key: Arc<ClusterKey>,
    /// The agent's own nice value (crate::priority); jobs keep the one it started with.
    pub nice: i32,
    /// Where the GPUs' device files are (`--gpu-device-dir`): stand-ins for an emulated
    /// node's GPUs (`DIR/nvidia0`, ...); None: `/dev` on the real machine, none on an
    /// emulated one (crate::gpu_devices).
    pub gpu_device_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("topology: {0}")]
    Topology(#[from] hwtopo::TopologyError),
    #[error("cgroups: {0}")]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    TaskSocket(#[from] crate::tasks::SocketError),
    #[error("{0}")]
    Setup(String),
}

pub async fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    let priority = crate::priority::set_agent_nice(cfg.nice).unwrap_or_else(|e| {
        tracing::warn!("{e}");
        Default::default()
    });
    let instance = format!("{:x}-{:x}", std::process::id(), crate::now_nanos());
    // Everything for the controller: sent while connected, queued while not.
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<AgentMessage>();
    let auth = Arc::new(crate::auth::AgentAuth::new(
        cfg.key.clone(),
        cfg.name.clone(),
        instance.clone(),
        Some(events_tx.clone()),
    ));
    crate::conn::raise_nofile();
    let facts = hwtopo::MemoryFacts::from_host(cfg.numa_memory.clone(), &cfg.topology);
    let mut topology = hwtopo::load_with(&cfg.topology, &facts)?;
    let real = cfg.topology == TopologySource::Real;
    crate::gpu_devices::assign_device_files(&mut topology, real, cfg.gpu_device_dir.as_deref());
    topology.validate().map_err(|e| AgentError::Setup(format!("--gpu-device-dir: {e}")))?;
    let has_gpu_files = topology.gpus.iter().any(|g| !g.device_files.is_empty());
    let backend: Arc<dyn CgroupBackend> = Arc::from(cgroup::detect_with_devices(&cfg.cgroup_root, has_gpu_files)?);
    let gpus_contained = has_gpu_files && backend.contains_devices();
    let v2_error = backend.devices_error();
    crate::gpu_devices::containment_warning(&topology, gpus_contained, backend.version() == 2, v2_error.as_deref());
    backend.prepare_root()?;
    let (cpus, mems) = backend.root_cpus_mems()?;
    let real_cpus = CpuSet::parse_list(&cpus).map_err(|e| AgentError::Setup(e.to_string()))?;
    let real_mems = CpuSet::parse_list(&mems).map_err(|e| AgentError::Setup(e.to_string()))?;
    let cpumap = match cfg.topology {
        TopologySource::Real => CpuMap::identity(&topology, real_cpus, real_mems),
        _ => CpuMap::round_robin(&topology, real_cpus, real_mems),
    };
    prepare_spool_root(&cfg.spool_dir)?;
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| AgentError::Setup(format!("cannot create {}: {e}", cfg.state_dir.display())))?;
    let records = Arc::new(
        Records::open(&cfg.state_dir)
            .map_err(|e| AgentError::Setup(format!("cannot prepare {}: {e}", cfg.state_dir.display())))?,
    );
    // Leftovers of an earlier agent in our subtree: the jobs it recorded are re-adopted (or
    // reported ended); the rest is killed and removed.
    let recovered = crate::job::adopt::recover(&*backend, &cfg.spool_dir, Some(&records));
    // After the recovery, which clears the spool of what no job owns.
    let rsh = std::env::current_exe().ok().and_then(|exe| crate::launcher::install(&cfg.spool_dir, &exe));
    // The batch scripts' shim (`berth __berth-shim`: the client beside this binary, or this
    // binary; crate::job::shim::open_binary), resolved once. It is held open and exec'd as
    // /proc/self/fd/N: the job's user needs no search permission on the directories of the
    // agent's binary (a build tree under a private directory).
    let shim = match std::env::current_exe().and_then(|exe| crate::job::shim::open_binary(&exe)) {
        Ok(exe) => {
            use std::os::fd::IntoRawFd;
            // Open (close-on-exec) for the agent's lifetime.
            Some(PathBuf::from(format!("/proc/self/fd/{}", exe.into_raw_fd())))
        }
        Err(e) => {
            tracing::warn!(
                "cannot find the berth binary for the job shim ({e}): exit statuses will not survive an agent restart"
            );
            None
        }
    };

    let task_socket = crate::tasks::bind_socket(&cfg.socket)?;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| AgentError::Setup(format!("cannot listen on {}: {e}", cfg.listen)))?;
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| cfg.listen.clone());
    let real_cpus_text = cpumap.real_cpus.to_list();
    let ctx = Arc::new(JobContext {
        cgroups: backend.clone(),
        cpumap,
        topology: topology.clone(),
        spool_root: cfg.spool_dir.clone(),
        registry: Default::default(),
        agent_socket: cfg.socket.clone(),
        shim,
        rsh,
        records: Some(records.clone()),
        reports: Some(events_tx.clone()),
        priority,
        conns: Default::default(),
        auth: Some(auth),
    });
    tokio::spawn(crate::tasks::serve_socket(ctx.clone(), task_socket));
    let for_spares = ctx.clone();
    tokio::spawn(ctx.priority.bookkeeping(move || crate::job::make_spares(&for_spares)));
    ctx.registry.with(|s| {
        if let Some(held) = records.load_lease() {
            // The predecessor's lease goes on: a restart while cut off does not stop fencing.
            let ago = Duration::from_millis(crate::records::now_unix_ms().saturating_sub(held.renewed_unix_ms));
            s.lease = crate::fence::LeaseState::restored(
                std::time::Instant::now(),
                Duration::from_millis(held.lease_ms),
                ago,
            );
        }
        s.unacked.extend(recovered.ended);
        s.unacked_steps.extend(records.load_step_ends());
    });
    // A lease that ran out while the agent was down (or is about to): its fenced jobs are
    // stopped now, as the predecessor would have (crate::fence, `restored`); the controller
    // requeues them.
    let lease_over = ctx
        .registry
        .with(|s| s.lease.deadline())
        .is_some_and(|d| d <= std::time::Instant::now() + Duration::from_secs(1));
    for (rec, cg) in recovered.adopted {
        let id = rec.spec.id;
        let (kill_tx, kill_rx) = mpsc::unbounded_channel();
        if lease_over && rec.spec.fence {
            tracing::warn!(job = %id, "the lease ran out while the agent was down: stopping the re-adopted job");
            let _ = kill_tx.send(
                "fenced: this node's lease from the controller ran out while its agent was down; the controller requeues the job elsewhere"
                    .to_string(),
            );
            let cg = cg.clone();
            tokio::task::spawn_blocking(move || {
                let _ = cg.thaw();
                if let Err(e) = cg.kill_all(Duration::from_secs(10)) {
                    tracing::error!(job = %id, "fencing: cannot kill the job's processes: {e}");
                }
            });
        }
        ctx.registry.with(|s| s.running.insert(id, kill_tx));
        let (ctx, events) = (ctx.clone(), events_tx.clone());
        tokio::spawn(async move {
            let outcome = contained(id, &ctx, crate::job::adopt::run(rec, cg, ctx.clone(), kill_rx)).await;
            job_ended(id, outcome, &ctx, &events).await;
        });
    }
    tracing::info!(name = %cfg.name, %address, topology = %topology.ge_string(&CpuSet::new()), "agent ready");

    tokio::spawn(serve_status(listener, cfg.name.clone(), instance.clone(), real_cpus_text.clone(), ctx.clone()));

    let registration = Registration {
        name: cfg.name.clone(),
        hostname: hostname(),
        address,
        instance,
        version: env!("CARGO_PKG_VERSION").into(),
        topology,
        real_cpus: real_cpus_text,
        running: vec![],
        ended: vec![],
        lease: true,
        steps: None,
    };

    tokio::spawn(watch_lease(ctx.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| AgentError::Setup(e.to_string()))?;
    let mut backoff = Duration::from_millis(100);
    loop {
        let session = connection(&cfg, &registration, &ctx, &events_tx, &mut events_rx);
        tokio::select! {
            r = session => {
                ctx.registry.with(|s| s.connected = false);
                match r {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(e) => tracing::warn!("controller connection: {e}; retrying in {:?}", backoff),
                }
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = term.recv() => break,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    tracing::info!("stopping: killing running jobs and removing cgroups");
    crate::job::stop_spares(&ctx);
    let running: Vec<_> = ctx.registry.with(|s| s.running.values().cloned().collect());
    for tx in running {
        let _ = tx.send("agent stopped".into());
    }
    let backend2 = backend.clone();
    let _ = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(200));
        backend2.remove_root()
    })
    .await;
    let _ = std::fs::remove_file(&cfg.socket);
    // Job directories are gone with their jobs; the root goes too if nothing else is in it.
    let _ = std::fs::remove_dir(&cfg.spool_dir);
    Ok(())
}

/// Why a session with the controller ended (logged; the agent connects again).
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("cannot reach the controller at {controller}: {error}")]
    Unreachable { controller: String, error: std::io::Error },
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("the controller at {0} did not answer the registration within 10 s")]
    NoAnswer(String),
    #[error("the controller closed the connection during the handshake (does it hold the same cluster key?)")]
    ClosedInHandshake,
    #[error(
        "the controller at {controller} could not prove it holds the cluster key ({error}); not taking its orders"
    )]
    Unproven { controller: String, error: berth_protocol::error::AuthError },
    #[error("the controller refused this agent: {0}")]
    Refused(String),
    #[error("the controller at {0} answered without proving the cluster key")]
    Unsigned(String),
    #[error("the controller rejected this agent: {0}")]
    Rejected(String),
    #[error("unexpected first reply {0:?}")]
    UnexpectedReply(Box<ControllerMessage>),
    #[error("the controller closed the connection")]
    Closed,
    #[error("a frame from the controller failed authentication ({0}); closing the connection")]
    FrameAuth(berth_protocol::error::AuthError),
}

/// One session with the controller: register, then relay until the connection drops.
async fn connection(
    cfg: &AgentConfig,
    registration: &Registration,
    ctx: &Arc<JobContext>,
    events_tx: &mpsc::UnboundedSender<AgentMessage>,
    events_rx: &mut mpsc::UnboundedReceiver<AgentMessage>,
) -> Result<(), SessionError> {
    ctx.registry.with(|s| s.lease.connecting());
    let stream = match TcpStream::connect(&cfg.controller).await {
        Ok(s) => s,
        Err(e) => {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                // Nobody listens there: the controller is not running, and requeues nothing.
                ctx.registry.with(|s| s.lease.refused(std::time::Instant::now()));
            }
            return Err(SessionError::Unreachable { controller: cfg.controller.clone(), error: e });
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut reg = registration.clone();
    let unacked: Vec<(JobId, JobOutcome)> = ctx.registry.with(|s| {
        reg.running = s.running.keys().copied().collect();
        reg.ended = s.unacked.keys().copied().collect();
        reg.steps = Some(s.open_steps());
        s.unacked.iter().map(|(k, v)| (*k, v.clone())).collect()
    });
    // The events queued now (while disconnected): their job ends are among `unacked`.
    let mut queued = events_rx.len();
    // The registration is signed and carries our nonce; the answer must be signed and bound
    // to that nonce; both nonces key the session every later frame is checked with.
    let agent_nonce = random_nonce();
    let hello =
        Envelope::seal_at(&cfg.key, LABEL_REGISTER, &AgentMessage::Register(Box::new(reg)), now_ms(), agent_nonce)?;
    let hello_sent = std::time::Instant::now();
    write_frame(&mut wr, &hello).await?;
    let answer = tokio::time::timeout(crate::conn::HANDSHAKE_TIMEOUT, read_raw_frame(&mut rd))
        .await
        .map_err(|_| SessionError::NoAnswer(cfg.controller.clone()))??
        .ok_or(SessionError::ClosedInHandshake)?;
    let (reply, controller_nonce) = match decode::<Envelope>(&answer) {
        Ok(env) => {
            let checked = env
                .verify(&cfg.key, &registered_label(&agent_nonce))
                .and_then(|n| check_time(env.ts, now_ms(), DEFAULT_WINDOW).map(|()| n));
            match checked {
                Ok(n) => (env.message::<ControllerMessage>()?, n),
                Err(error) => {
                    let why = SessionError::Unproven { controller: cfg.controller.clone(), error };
                    tracing::error!("{why}");
                    return Err(why);
                }
            }
        }
        Err(_) => match decode::<ControllerMessage>(&answer) {
            Ok(ControllerMessage::Rejected { reason }) => return Err(SessionError::Refused(reason)),
            _ => {
                let why = SessionError::Unsigned(cfg.controller.clone());
                tracing::error!("{why}");
                return Err(why);
            }
        },
    };
    let (heartbeat, step_ends) = match reply {
        ControllerMessage::Registered { heartbeat_interval_ms, lease_ms, step_ends, .. } => {
            let lease = lease_ms.map(Duration::from_millis);
            ctx.registry.with(|s| s.lease.registered(lease, hello_sent));
            keep_lease(ctx);
            // At least three renewals per lease: one late or lost renewal does not fence.
            let every = Duration::from_millis(heartbeat_interval_ms);
            (lease.map_or(every, |l| every.min(l / 3)).max(Duration::from_millis(100)), step_ends)
        }
        ControllerMessage::Rejected { reason } => return Err(SessionError::Rejected(reason)),
        other => return Err(SessionError::UnexpectedReply(Box::new(other))),
    };
    let (mut sealer, opener) = session(&cfg.key, &agent_nonce, &controller_nonce, Role::Agent);
    ctx.registry.with(|s| s.connected = true);
    tracing::info!(controller = %cfg.controller, "registered");
    // Ends queued while disconnected are among these: they are not sent twice. Only those: a
    // job requeued here later in this session ends again, under the same id.
    let resent: std::collections::BTreeSet<JobId> = unacked.iter().map(|(id, _)| *id).collect();
    for (id, outcome) in unacked {
        write_sealed(&mut wr, &mut sealer, &AgentMessage::JobEnded { id, outcome }).await?;
    }
    let steps: Vec<AgentMessage> = match step_ends {
        true => ctx.registry.with(|s| s.unacked_steps.values().cloned().collect()),
        false => vec![],
    };
    for msg in steps {
        write_sealed(&mut wr, &mut sealer, &msg).await?;
    }
    let mut ticker = tokio::time::interval(heartbeat);
    // Whether the pages start-up or the last work touched were dropped since (crate::resident):
    // once at the first idle heartbeat, again after a job or step ended.
    let mut trimmed = false;
    // Read by their own task: a read cut by select! would lose a frame's bytes (SealedReader).
    let mut frames = SealedReader::<ControllerMessage>::spawn(rd, opener);
    loop {
        tokio::select! {
            msg = frames.next() => {
                match msg {
                    Ok(None) => return Err(SessionError::Closed),
                    Ok(Some(m)) => handle(m, ctx, events_tx),
                    Err(ProtocolError::Auth(e)) => {
                        let why = SessionError::FrameAuth(e);
                        tracing::error!("{why}");
                        return Err(why);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Some(ev) = events_rx.recv() => {
                trimmed = false;
                let was_queued = queued > 0;
                queued = queued.saturating_sub(1);
                if was_queued && matches!(&ev, AgentMessage::JobEnded { id, .. } if resent.contains(id)) {
                    continue;
                }
                if let AgentMessage::StepEnded { job, step, .. } = &ev {
                    // From the running steps to the reported ones, in one turn of this loop:
                    // a heartbeat lists it all along.
                    let (job, step) = (*job, *step);
                    ctx.registry.with(|s| {
                        s.root_steps.remove(&berth_protocol::agent::StepRef { job, step });
                        if step_ends {
                            s.unacked_steps.insert((job, step), ev.clone());
                        }
                    });
                    if !step_ends {
                        continue; // a controller that does not take them
                    }
                    if let Some(records) = ctx.records.clone() {
                        let msg = ev.clone();
                        tokio::spawn(ctx.priority.bookkeeping(move || {
                            if let Err(e) = records.save_step_end(job, step, &msg) {
                                tracing::warn!(job = %job, step, "cannot record the step's end: {e}");
                            }
                        }));
                    }
                }
                write_sealed(&mut wr, &mut sealer, &ev).await?;
            }
            _ = ticker.tick() => {
                let (running, seq, steps): (Vec<JobId>, _, _) = ctx.registry.with(|s| {
                    let seq = s.lease.heartbeat(std::time::Instant::now());
                    (s.running.keys().copied().collect(), seq, Some(s.open_steps()))
                });
                let idle = running.is_empty() && steps.as_ref().is_none_or(Vec::is_empty);
                let beat = AgentMessage::Heartbeat { running, seq, steps };
                write_sealed(&mut wr, &mut sealer, &beat).await?;
                if idle && !trimmed {
                    trimmed = true;
                    match crate::resident::drop_clean_file_pages() {
                        Ok(d) => tracing::debug!(mappings = d.mappings, kb = d.kb, "idle: clean file pages dropped"),
                        Err(e) => tracing::debug!("idle: cannot read /proc/self/smaps to drop clean pages: {e}"),
                    }
                }
            }
        }
    }
}

fn handle(msg: ControllerMessage, ctx: &Arc<JobContext>, events: &mpsc::UnboundedSender<AgentMessage>) {
    match msg {
        ControllerMessage::Launch(spec) => {
            berth_protocol::probe::mark("agent order read");
            launch(*spec, ctx, events)
        }
        ControllerMessage::Kill { id, reason } => match ctx.registry.kill_sender(id) {
            Some(tx) => {
                let _ = tx.send(reason);
            }
            None => tracing::info!(job = %id, "kill for a job not running here"),
        },
        ControllerMessage::Signal { id, step, signal } => signal_job(ctx, id, step, signal),
        ControllerMessage::Suspend { id } => suspend_op(ctx, events, id, Op::Suspend),
        ControllerMessage::Resume { id, allocation } => {
            suspend_op(ctx, events, id, Op::Resume(allocation.map(Box::new)))
        }
        ControllerMessage::SetWalltime { id, walltime_seconds } => set_walltime(ctx, id, walltime_seconds),
        ControllerMessage::EndAck { id } => {
            ctx.registry.with(|s| s.unacked.remove(&id));
            if let Some(records) = ctx.records.clone() {
                tokio::spawn(ctx.priority.bookkeeping(move || {
                    records.forget(id);
                    berth_protocol::probe::mark("agent forgot");
                }));
            }
        }
        ControllerMessage::StepEndAck { job, step } => {
            ctx.registry.with(|s| s.unacked_steps.remove(&(job, step)));
            if let Some(records) = ctx.records.clone() {
                tokio::spawn(ctx.priority.bookkeeping(move || records.forget_step_end(job, step)));
            }
        }
        ControllerMessage::Renew { seq } => {
            ctx.registry.with(|s| s.lease.renew(seq));
            keep_lease(ctx);
        }
        ControllerMessage::Registered { .. } | ControllerMessage::Rejected { .. } => {}
    }
}

/// Write the lease as now renewed for a restarted agent (crate::fence, `restored`).
fn keep_lease(ctx: &JobContext) {
    let Some(records) = ctx.records.clone() else { return };
    let held = ctx.registry.with(|s| s.lease.held());
    let held = held.map(|(lease, renewed)| crate::records::HeldLease {
        lease_ms: lease.as_millis() as u64,
        renewed_unix_ms: crate::records::now_unix_ms().saturating_sub(renewed.elapsed().as_millis() as u64),
    });
    tokio::spawn(ctx.priority.bookkeeping(move || match held {
        Some(h) => {
            if let Err(e) = records.save_lease(&h) {
                tracing::warn!("cannot record the lease: {e}");
            }
        }
        None => records.forget_lease(),
    }));
}

/// Kill the fenced jobs when the lease runs out (crate::fence): the controller requeues them
/// a margin later, so the copy it starts elsewhere never overlaps this one.
async fn watch_lease(ctx: Arc<JobContext>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let Some(lease) = ctx.registry.with(|s| s.lease.expired(std::time::Instant::now())) else {
            continue;
        };
        let fenced: Vec<_> = ctx.registry.all().into_iter().filter(|j| j.spec.fence).collect();
        tracing::warn!(
            jobs = fenced.len(),
            "no word from the controller for {:.1} s (the lease): killing the jobs it requeues elsewhere",
            lease.as_secs_f64()
        );
        for job in fenced {
            let id = job.spec.id;
            let reason = format!(
                "fenced: this node heard nothing from the controller for {:.1} s (its lease); the controller requeues the job elsewhere",
                lease.as_secs_f64()
            );
            if let Some(tx) = ctx.registry.kill_sender(id) {
                let _ = tx.send(reason);
            }
            // At once, not after the kill grace: the lease's margin is for this.
            let cg = job.cgroup.clone();
            tokio::task::spawn_blocking(move || {
                let _ = cg.thaw();
                if let Err(e) = cg.kill_all(Duration::from_secs(10)) {
                    tracing::error!(job = %id, "fencing: cannot kill the job's processes: {e}");
                }
            });
        }
    }
}

/// `suspend` / `resume`: carried out in order per job, answered on `events`.
fn suspend_op(ctx: &Arc<JobContext>, events: &mpsc::UnboundedSender<AgentMessage>, id: JobId, op: Op) {
    let launching = ctx.registry.with(|s| s.running.contains_key(&id));
    crate::job::suspend::request(ctx, id, op, launching, events);
}

/// `berth signal`: one step's local ranks, or every process of the job here. A suspended
/// job's processes get it now and act on it when the job resumes.
/// An admin raised a running job's walltime (`ControllerMessage::SetWalltime`; never below
/// the one it was launched with): its deadlines move (the `--signal` one too), and its record
/// says so for a restarted agent.
fn set_walltime(ctx: &Arc<JobContext>, id: JobId, secs: u64) {
    let Some(job) = ctx.registry.get(id) else {
        tracing::info!(job = %id, "walltime for a job not running here");
        return;
    };
    // Unlimited stays unlimited.
    let Some(launched) = job.spec.walltime_seconds else { return };
    let secs = secs.max(launched);
    job.suspension.extend(Duration::from_secs(secs - launched));
    tracing::info!(job = %id, walltime = secs, "walltime raised");
    if let Some(records) = ctx.records.clone() {
        tokio::spawn(ctx.priority.bookkeeping(move || {
            if let Err(e) = records.save_walltime(id, secs) {
                tracing::warn!(job = %id, "cannot record the raised walltime: {e}");
            }
        }));
    }
}

fn signal_job(ctx: &Arc<JobContext>, id: JobId, step: Option<u32>, signal: i32) {
    let Some(job) = ctx.registry.get(id) else {
        tracing::info!(job = %id, "signal for a job not running here");
        return;
    };
    if job.suspension.is_suspended() {
        tracing::info!(job = %id, signal, "the job is suspended: the signal acts when it resumes");
    }
    match step {
        Some(s) => {
            if !job.signal_step(s, signal) {
                tracing::info!(job = %id, step = s, "signal for a step with no ranks here");
            }
        }
        None => {
            let cg = job.cgroup.clone();
            tokio::task::spawn_blocking(move || cg.signal_all(signal));
        }
    }
}

fn launch(spec: LaunchSpec, ctx: &Arc<JobContext>, events: &mpsc::UnboundedSender<AgentMessage>) {
    let id = spec.id;
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let duplicate = ctx.registry.with(|s| {
        let duplicate = s.running.contains_key(&id) || s.unacked.contains_key(&id);
        if !duplicate {
            s.running.insert(id, kill_tx);
        }
        duplicate
    });
    if duplicate {
        tracing::warn!(job = %id, "duplicate launch ignored");
        return;
    }
    let (ctx, events) = (ctx.clone(), events.clone());
    tokio::spawn(async move {
        tracing::info!(job = %id, cgroup = %cgroup_name(id), "starting");
        let step = spec.step.as_ref().map(|g| (g.job, g.step));
        let outcome = contained(id, &ctx, run_job(spec, ctx.clone(), kill_rx, events.clone())).await;
        if let Some((job, step)) = step {
            let why = outcome.reason.clone().unwrap_or_else(|| "its job has ended".into());
            ctx.registry.attach.job_ended(job, step, format!("step {job}.{step} did not run: {why}"));
        }
        job_ended(id, outcome, &ctx, &events).await;
    });
}

/// Supervise one job in its own task: a panic there (a bug, an input nobody foresaw) ends
/// that job `failed` with the reason, its processes killed and its cgroup and spool removed,
/// instead of leaving it running unsupervised with its cores held for ever.
pub(crate) async fn contained<F>(id: JobId, ctx: &Arc<JobContext>, supervision: F) -> JobOutcome
where
    F: std::future::Future<Output = JobOutcome> + Send + 'static,
{
    let failure = match tokio::spawn(supervision).await {
        Ok(outcome) => return outcome,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => panic_text(&*payload),
            Err(e) => format!("its task stopped: {e}"),
        },
    };
    tracing::error!(job = %id, "the supervision of the job failed ({failure}); killing what is left of it");
    ctx.registry.remove(id);
    let ctx2 = ctx.clone();
    let cleaned = ctx.priority.bookkeeping(move || reap_failed(id, &ctx2)).await;
    let cleaned = match cleaned {
        Ok(Ok(())) => String::new(),
        Ok(Err(e)) => format!("; cleaning up failed too: {e}"),
        Err(e) => format!("; cleaning up failed too: {e}"),
    };
    JobOutcome {
        reason: Some(format!("agent_error: the agent's supervision of this job failed ({failure}){cleaned}")),
        ..Default::default()
    }
}

/// What a panic said, if it said it as text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    format!("panic: {}", text.chars().take(200).collect::<String>())
}

/// What went wrong cleaning up after a failed supervision (each problem, in order).
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
struct ReapError(Vec<ReapProblem>);

#[derive(Debug, thiserror::Error)]
enum ReapProblem {
    #[error("killing its processes: {0}")]
    Kill(cgroup::CgroupError),
    #[error("removing its cgroup: {0}")]
    RemoveCgroup(cgroup::CgroupError),
    #[error("opening its cgroup: {0}")]
    OpenCgroup(cgroup::CgroupError),
    #[error("removing {}: {error}", .spool.display())]
    RemoveSpool { spool: PathBuf, error: std::io::Error },
}

/// After a failed supervision: every process of the job killed, its cgroup and spool removed.
fn reap_failed(id: JobId, ctx: &JobContext) -> Result<(), ReapError> {
    let mut problems = Vec::new();
    match ctx.cgroups.open(&cgroup_name(id)) {
        Ok(Some(cg)) => {
            let _ = cg.thaw();
            if let Err(e) = cg.kill_all(Duration::from_secs(10)) {
                problems.push(ReapProblem::Kill(e));
            }
            if let Err(e) = cg.remove() {
                problems.push(ReapProblem::RemoveCgroup(e));
            }
        }
        Ok(None) => {}
        Err(e) => problems.push(ReapProblem::OpenCgroup(e)),
    }
    let spool = ctx.spool_root.join(id.to_string());
    if let Err(e) = std::fs::remove_dir_all(&spool) {
        if e.kind() != std::io::ErrorKind::NotFound {
            problems.push(ReapProblem::RemoveSpool { spool: spool.clone(), error: e });
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ReapError(problems))
    }
}

/// A job's part here ended: its outcome is kept (on disk too) until the controller
/// acknowledges it, and sent.
async fn job_ended(id: JobId, outcome: JobOutcome, ctx: &JobContext, events: &mpsc::UnboundedSender<AgentMessage>) {
    tracing::info!(job = %id, ?outcome, "ended");
    if let Some(records) = ctx.records.clone() {
        let o = outcome.clone();
        if let Ok(Err(e)) = ctx.priority.bookkeeping(move || records.save_ended(id, &o)).await {
            tracing::warn!(job = %id, "cannot record the job's end ({e}): an agent restarted before the controller acknowledges it would not report it");
        }
    }
    berth_protocol::probe::mark("agent end saved");
    ctx.registry.with(|s| {
        s.running.remove(&id);
        s.unacked.insert(id, outcome.clone());
    });
    let _ = events.send(AgentMessage::JobEnded { id, outcome });
}

async fn serve_status(listener: TcpListener, name: String, instance: String, real_cpus: String, ctx: Arc<JobContext>) {
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else {
            // Out of descriptors, most likely: let some go before trying again.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(handshake) = ctx.conns.handshake() else {
            tracing::warn!(%peer, "connection closed: too many connections waiting for their first frame");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (name, instance, real_cpus) = (name.clone(), instance.clone(), real_cpus.clone());
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let Some(auth) = ctx.auth.clone() else { return };
            // Until its first frame is whole and checked, the peer is nobody (crate::conn).
            let first = read_frame_limited::<_, AgentQuery>(&mut stream, &ctx.conns.first_frame()).await;
            drop(handshake);
            let reply = match first {
                Ok(Some(AgentQuery::StepLaunch { grant, subtree })) => {
                    berth_protocol::probe::mark("agent step launch read");
                    berth_protocol::tree::keepalive(&stream);
                    // Every later frame of this connection, both ways, is MAC'd under it.
                    let link = LinkKey::of_grant(&auth.key, &grant);
                    if grant.attach && auth.is_root_launch(&grant, &subtree) {
                        attach_step(&auth, &ctx, *grant, subtree, link, stream, peer).await;
                        return;
                    }
                    if let Err((what, why)) = crate::step::launch::check(&ctx, &grant, &subtree).await {
                        auth.refuse(what, Some(grant.job), &format!("{why} (launch from {peer})"));
                        refuse_launch(&mut stream, &grant, &subtree, &link, &name, &why).await;
                        return;
                    }
                    berth_protocol::probe::mark("agent step checked");
                    let (rd, wr) = stream.into_split();
                    crate::step::shepherd::serve(ctx, *grant, subtree, link, Upstream::Connected(rd, wr)).await;
                    return;
                }
                Ok(Some(AgentQuery::Sealed(env))) => match auth.open_query(&env) {
                    Ok((AgentQuery::Task { request }, link)) => {
                        crate::tasks::serve_agent(ctx, request, stream, link).await;
                        return;
                    }
                    Ok((_, link)) => {
                        let (mut up, _) = link.query_link(TreeEnd::Below);
                        let reply = AgentReply::Error { message: "only task requests come signed".into() };
                        let _ = write_sealed(&mut stream, &mut up, &reply).await;
                        return;
                    }
                    Err(why) => {
                        let why = format!("agent request from {peer} refused: {why}");
                        auth.refuse(Refusal::Auth, None, &why);
                        AgentReply::Error { message: why }
                    }
                },
                Ok(Some(AgentQuery::Task { .. })) => {
                    let why = format!(
                        "unsigned task request from {peer} refused: agents sign their task requests with the cluster key; jobs use the local socket (BERTH_AGENT_SOCKET)"
                    );
                    auth.refuse(Refusal::Auth, None, &why);
                    AgentReply::Error { message: why }
                }
                Ok(Some(AgentQuery::Status)) => {
                    let (connected, running) =
                        ctx.registry.with(|s| (s.connected, s.running.keys().copied().collect()));
                    AgentReply::Status { name, instance, connected, running, real_cpus }
                }
                Ok(None) => return,
                Err(e) => AgentReply::Error { message: e.to_string() },
            };
            let _ = write_frame(&mut stream, &reply).await;
        });
    }
}

/// `run`'s launch of a step this agent started from the job's launch order (`grant.attach`):
/// checked as a launch is (signed, unexpired, for this node), then handed to the step.
async fn attach_step(
    auth: &AgentAuth,
    ctx: &JobContext,
    grant: StepGrant,
    subtree: Vec<u32>,
    link: LinkKey,
    stream: TcpStream,
    peer: std::net::SocketAddr,
) {
    let refused = match auth.check_step_attach(&grant, &subtree) {
        Err((what, why)) => Some((what, why, stream)),
        Ok(()) => {
            let up = stream.into_split();
            match ctx.registry.attach.attach(grant.job, grant.step, up, crate::ports::attach::ATTACH_WAIT).await {
                Ok(()) => None,
                Err(r) => match r.up.0.reunite(r.up.1) {
                    Ok(stream) => Some((Refusal::Launch, r.reason, stream)),
                    Err(_) => return,
                },
            }
        }
    };
    if let Some((what, why, mut stream)) = refused {
        auth.refuse(what, Some(grant.job), &format!("{why} (launch from {peer})"));
        refuse_launch(&mut stream, &grant, &subtree, &link, &auth.name, &why).await;
    }
}

/// Answer a refused step launch as the control tree answers a failed one: every rank of the
/// subtree never ran, and the subtree is done. Sealed like any tree frame (a `run` holding a genuine grant checks them; whoever sent a
/// forged one learns nothing from them).
async fn refuse_launch(
    stream: &mut TcpStream,
    grant: &StepGrant,
    subtree: &[u32],
    link: &LinkKey,
    me: &str,
    why: &str,
) {
    let (mut up, _) = link.link(subtree.first().copied().unwrap_or(0), TreeEnd::Below);
    let reason = format!("launch refused by node {me}: {why}");
    let ranks: Vec<RankExit> = subtree
        .iter()
        .filter_map(|&i| grant.nodes.get(i as usize))
        .flat_map(|n| {
            n.ranks.iter().map(|r| RankExit {
                rank: r.rank,
                node: n.name.clone(),
                exit_code: None,
                signal: None,
                reason: Some(reason.clone()),
            })
        })
        .collect();
    let _ = write_sealed(stream, &mut up, &TreeUp::LaunchFailed { node: me.to_string(), reason: reason.clone() }).await;
    if !ranks.is_empty() {
        let _ = write_sealed(stream, &mut up, &TreeUp::Exited { ranks }).await;
    }
    let _ = write_sealed(stream, &mut up, &TreeUp::Done).await;
}

/// The spool root must be a real directory owned by root, not something a user planted.
fn prepare_spool_root(dir: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let bad = |m: String| AgentError::Setup(m);
    for d in [dir.parent(), Some(dir)].into_iter().flatten() {
        if d.as_os_str().is_empty() || d == std::path::Path::new("/") || d == std::path::Path::new("/tmp") {
            continue;
        }
        match std::fs::symlink_metadata(d) {
            Ok(m) => {
                if !m.is_dir() || m.uid() != unsafe_geteuid() {
                    return Err(bad(format!("{} exists but is not a directory owned by this agent's user; remove it or choose another --spool-dir", d.display())));
                }
            }
            Err(_) => std::fs::create_dir(d).map_err(|e| bad(format!("cannot create {}: {e}", d.display())))?,
        }
        // Users must reach their own job directory inside, but not list others.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| bad(format!("chmod {}: {e}", d.display())))?;
    }
    Ok(())
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "localhost".into())
}
