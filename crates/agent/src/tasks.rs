//! The task API (seeds/001, the PBS TM interface): from inside a job, node information and
//! asynchronous spawn of tasks on any node of the job's allocation, each in the job's cgroup
//! there (so accounted with the job and killed at its end), then list, wait and kill.
//!
//! Served on the agent's local Unix socket (`BERTH_AGENT_SOCKET`) to the job's own processes
//! only: the caller's uid (SO_PEERCRED) must be the job's owner or root, and a non-root
//! caller's pid must be inside the job's cgroup on this node. The agent called keeps the job's
//! task table; a task for another node is started by that node's agent over one TCP
//! connection per task (`remote_spawn`), kept open while the task runs: its end comes back on
//! it, signals go down it, and if it breaks the remote agent kills the task's process group.
//! See docs/protocol/04-task-api.md.

use crate::ports::{JobContext, JobHandle};
use berth_core::JobId;
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::auth::{read_sealed, write_sealed, LinkKey, Opener, Sealer, TreeEnd};
use berth_protocol::error::Refusal;
use berth_protocol::step::{AllocationNode, Chunk, TaskReply, TaskRequest};
use berth_protocol::{read_frame_limited, write_frame, ProtocolError};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// Copies one `spawn` may start.
pub const MAX_SPAWN: u32 = 1024;
/// How long `spawn` waits for remote tasks to report their pid before answering anyway.
const START_WAIT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A remote spawn may arrive just before the job's launch there has finished.
const JOB_WAIT: Duration = Duration::from_secs(5);
const DEFAULT_OUTPUT: &str = "berth-task-%j.%t.out";
const DEFAULT_ERROR: &str = "berth-task-%j.%t.err";
/// Variables of a rank or step that must not leak into a task started from it.
const NOT_INHERITED: &[&str] = &[
    "BERTH_STEP_ID",
    "BERTH_RANK",
    "BERTH_LOCAL_RANK",
    "BERTH_RANK_CPUS",
    "BERTH_FAILED_RANKS",
    "MPI_RANK",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
];

/// `%j` job id, `%t` task id, `%n` node index, `%%` a percent sign.
pub fn expand(pattern: &str, job: JobId, task: u64, node: u32) -> String {
    berth_core::directives::expand_percent(pattern, |c| match c {
        'j' => Some(job.to_string()),
        't' => Some(task.to_string()),
        'n' => Some(node.to_string()),
        _ => None,
    })
}

/// `path` made absolute against `cwd`.
fn absolute(path: &str, cwd: &str) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        Path::new(cwd).join(path).display().to_string()
    }
}

fn set_vars(env: &mut Vec<(String, String)>, vars: Vec<(&str, String)>) {
    env.retain(|(k, _)| !vars.iter().any(|(v, _)| v == k));
    env.extend(vars.into_iter().map(|(k, v)| (k.to_string(), v)));
}

/// The caller's environment for task `task` on node `node`, without what belongs to the
/// caller's own rank or step. The node's own variables are added where the task starts;
/// `compat`: the Slurm and PBS ones too (crate::compat_env).
pub fn task_env(caller: &[(String, String)], job: JobId, task: u64, node: u32, compat: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = caller
        .iter()
        .filter(|(k, _)| {
            !k.starts_with("PMI_")
                && !k.starts_with("PMIX_")
                && !NOT_INHERITED.contains(&k.as_str())
                && !crate::compat_env::STEP_ONLY.contains(&k.as_str())
        })
        .cloned()
        .collect();
    let mut vars = vec![
        ("BERTH_JOB_ID", job.to_string()),
        ("BERTH_TASK_ID", task.to_string()),
        ("BERTH_NODEID", node.to_string()),
    ];
    if compat {
        vars.extend(crate::compat_env::task_vars(task, node));
    }
    set_vars(&mut env, vars);
    env
}

/// Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is in the cgroup at `rel`
/// (relative to its hierarchy's root, e.g. `berth/c1/node1/job_7`) or below it.
pub fn cgroup_contains(proc_cgroup: &str, rel: &Path) -> bool {
    if rel.as_os_str().is_empty() {
        return false;
    }
    proc_cgroup.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        Path::new(path).strip_prefix("/").is_ok_and(|p| p.starts_with(rel))
    })
}

/// The job's cgroup relative to its hierarchy's root.
fn job_cgroup_rel(ctx: &JobContext, job: &JobHandle) -> PathBuf {
    let dir = job.cgroup.cpuset_dir();
    dir.strip_prefix(ctx.cgroups.cpuset_mount()).map(Path::to_path_buf).unwrap_or_default()
}

/// Who called on the local socket, as the kernel says.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub pid: Option<i32>,
}

/// Why a task API request is refused before anything starts ([`authorize`], [`check_spawn`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskRefusal {
    #[error("job {0} is not running on this node")]
    NotHere(JobId),
    #[error("permission denied: job {job} belongs to {owner}")]
    NotOwner { job: JobId, owner: String },
    #[error("permission denied: the calling process is unknown")]
    UnknownCaller,
    #[error(
        "permission denied: process {pid} is not part of job {job} (only the job's own processes may use its task API)"
    )]
    NotInJob { pid: i32, job: JobId },
    #[error("node {node} is not in the allocation: job {job} has nodes 0-{last}")]
    NoSuchNode { node: u32, job: JobId, last: usize },
    #[error("count {0} is out of range (1-{MAX_SPAWN})")]
    Count(u32),
    #[error("no command to run")]
    NoCommand,
    #[error("the working directory {0:?} is not absolute")]
    RelativeCwd(String),
}

impl From<TaskRefusal> for String {
    fn from(e: TaskRefusal) -> String {
        e.to_string()
    }
}

/// The job, if `caller` may use the task API for it here.
fn authorize(ctx: &JobContext, caller: Caller, id: JobId) -> Result<Arc<JobHandle>, TaskRefusal> {
    let Some(job) = ctx.registry.get(id) else {
        return Err(TaskRefusal::NotHere(id));
    };
    if caller.uid == 0 {
        return Ok(job);
    }
    if caller.uid != job.spec.user.uid {
        return Err(TaskRefusal::NotOwner { job: id, owner: job.spec.user.name.clone() });
    }
    let Some(pid) = caller.pid else { return Err(TaskRefusal::UnknownCaller) };
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    if !cgroup_contains(&text, &job_cgroup_rel(ctx, &job)) {
        return Err(TaskRefusal::NotInJob { pid, job: id });
    }
    Ok(job)
}

/// Why the task API's local socket could not be bound ([`bind_socket`]).
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{} exists and is not a socket; remove it or choose another --socket", .0.display())]
    NotASocket(PathBuf),
    #[error("another agent listens on {}; choose another --socket", .0.display())]
    InUse(PathBuf),
    #[error("cannot remove the stale {}: {error}", .path.display())]
    Stale { path: PathBuf, error: std::io::Error },
    #[error("cannot listen on {}: {error}", .path.display())]
    Bind { path: PathBuf, error: std::io::Error },
    #[error("chmod {}: {error}", .path.display())]
    Chmod { path: PathBuf, error: std::io::Error },
}

/// Bind the local socket (mode 0666: who may do what is decided per request). A stale socket
/// file is replaced; one another process still listens on is not.
pub fn bind_socket(path: &Path) -> Result<UnixListener, SocketError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path_buf = || path.to_path_buf();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(SocketError::NotASocket(path_buf()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse(path_buf()));
        }
        std::fs::remove_file(path).map_err(|error| SocketError::Stale { path: path_buf(), error })?;
    }
    let listener = UnixListener::bind(path).map_err(|error| SocketError::Bind { path: path_buf(), error })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|error| SocketError::Chmod { path: path_buf(), error })?;
    Ok(listener)
}

/// Serve the task API on the local socket: `AgentQuery::Task` frames, `AgentReply::Task`
/// answers, any number per connection. Connections are capped per uid and in all
/// ([`crate::conn::LOCAL_CONNECTIONS`]); idle ones are closed ([`crate::conn::LOCAL_IDLE`]).
pub async fn serve_socket(ctx: Arc<JobContext>, listener: UnixListener) {
    let tracker = crate::conn::local_tracker();
    let log = berth_protocol::limits::LogLimiter::new(Duration::from_secs(10));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: let some go before trying again.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        let slot = match tracker.admit(uid) {
            Ok(slot) => slot,
            Err(why) => {
                if let Some(held_back) = log.allow(&format!("uid {uid}")) {
                    tracing::warn!(uid, "task API connection refused: {why} ({held_back} more since the last line)");
                }
                let message = why.to_string();
                tokio::spawn(async move {
                    let reply = AgentReply::Error { message };
                    let _ = tokio::time::timeout(Duration::from_secs(1), write_frame(&mut stream, &reply)).await;
                });
                continue;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            serve_local(ctx, stream).await;
            drop(slot);
        });
    }
}

/// Whether `caller` is known here: root, or a process of a job running on this node.
fn identified(ctx: &JobContext, caller: Caller) -> bool {
    if caller.uid == 0 {
        return true;
    }
    let Some(pid) = caller.pid else { return false };
    let mine: Vec<_> = ctx.registry.all().into_iter().filter(|j| j.spec.user.uid == caller.uid).collect();
    if mine.is_empty() {
        return false;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    mine.iter().any(|j| cgroup_contains(&text, &job_cgroup_rel(ctx, j)))
}

async fn serve_local(ctx: Arc<JobContext>, mut stream: UnixStream) {
    let caller = match stream.peer_cred() {
        Ok(c) => Caller { uid: c.uid(), pid: c.pid() },
        Err(e) => {
            let message = format!("cannot identify the caller: {e}");
            let _ = write_frame(&mut stream, &AgentReply::Error { message }).await;
            return;
        }
    };
    let limits = crate::conn::local_request(identified(&ctx, caller));
    loop {
        let reply = match read_frame_limited::<_, AgentQuery>(&mut stream, &limits).await {
            Ok(Some(AgentQuery::Task { request: TaskRequest::Exec { job, node, argv, env, cwd } })) => {
                // The connection is the task's from here on.
                let ask = SpawnAsk { node, argv, env, cwd, count: 1, output: String::new(), error: String::new() };
                return exec(&ctx, caller, job, ask, stream).await;
            }
            Ok(Some(AgentQuery::Task { request })) => {
                AgentReply::Task { reply: handle_local(&ctx, caller, request).await }
            }
            Ok(Some(_)) => AgentReply::Error { message: "only task requests are served on this socket".into() },
            Ok(None) => return,
            Err(e) => {
                // The stream is not at a frame's start any more: answer, then close.
                let _ = write_frame(&mut stream, &AgentReply::Error { message: e.to_string() }).await;
                return;
            }
        };
        if write_frame(&mut stream, &reply).await.is_err() {
            return;
        }
    }
}

fn error(message: impl Into<String>) -> TaskReply {
    TaskReply::Error { message: message.into() }
}

/// One request of a process of the job, on the local socket.
pub async fn handle_local(ctx: &Arc<JobContext>, caller: Caller, req: TaskRequest) -> TaskReply {
    let id = match &req {
        TaskRequest::Info { job }
        | TaskRequest::Spawn { job, .. }
        | TaskRequest::List { job }
        | TaskRequest::Wait { job, .. }
        | TaskRequest::Kill { job, .. } => *job,
        TaskRequest::RemoteSpawn { .. } | TaskRequest::RemoteSignal { .. } | TaskRequest::RemoteInfo { .. } => {
            return error("remote_* requests are between agents only")
        }
        TaskRequest::Exec { .. } | TaskRequest::Signal { .. } | TaskRequest::Stdin { .. } | TaskRequest::StdinEof => {
            return error("exec starts a connection of its own, and signal and stdin belong on one")
        }
    };
    let job = match authorize(ctx, caller, id) {
        Ok(j) => j,
        Err(e) => return error(e),
    };
    match req {
        TaskRequest::Info { .. } => info(ctx, &job).await,
        TaskRequest::Spawn { node, argv, env, cwd, count, output, error: err, .. } => {
            let out = output.unwrap_or_else(|| DEFAULT_OUTPUT.into());
            let err = err.unwrap_or_else(|| DEFAULT_ERROR.into());
            spawn(ctx, &job, SpawnAsk { node, argv, env, cwd, count, output: out, error: err }).await
        }
        TaskRequest::List { .. } => {
            TaskReply::Tasks { tasks: job.tasks.read(|t| t.infos(&t.select(id, &[]).unwrap_or_default())) }
        }
        TaskRequest::Wait { tasks, timeout_ms, .. } => {
            let ids = match job.tasks.read(|t| t.select(id, &tasks)) {
                Ok(ids) => ids,
                Err(e) => return error(e.to_string()),
            };
            // A timeout beyond what the clock holds is no timeout (an Instant overflow panics).
            let deadline = timeout_ms.and_then(|ms| tokio::time::Instant::now().checked_add(Duration::from_millis(ms)));
            job.tasks.wait(&ids, deadline).await;
            TaskReply::Tasks { tasks: job.tasks.read(|t| t.infos(&ids)) }
        }
        TaskRequest::Kill { tasks, signal, .. } => {
            if !(1..=64).contains(&signal) {
                return error(format!("{signal} is not a signal number (1-64)"));
            }
            match job.tasks.read(|t| t.select(id, &tasks).map(|ids| (t.signal(&ids, signal), t.infos(&ids)))) {
                Ok((_, tasks)) => TaskReply::Tasks { tasks },
                Err(e) => error(e.to_string()),
            }
        }
        TaskRequest::RemoteSpawn { .. } | TaskRequest::RemoteSignal { .. } | TaskRequest::RemoteInfo { .. } => {
            error("remote_* requests are between agents only")
        }
        TaskRequest::Exec { .. } | TaskRequest::Signal { .. } | TaskRequest::Stdin { .. } | TaskRequest::StdinEof => {
            error("exec starts a connection of its own, and signal and stdin belong on one")
        }
    }
}

/// This node's entry of the allocation.
fn own_node(job: &JobHandle) -> AllocationNode {
    let spec = &job.spec;
    let index = spec.nodes.iter().position(|(n, _)| *n == spec.allocation.node).unwrap_or(0);
    AllocationNode {
        index: index as u32,
        name: spec.allocation.node.clone(),
        address: spec.addresses.get(index).cloned().unwrap_or_default(),
        slots: spec.allocation.cores,
        cpus: job.allocation().cpus.to_list(),
    }
}

/// Every node of the allocation; the CPUs of other nodes are asked of their agents.
async fn info(ctx: &JobContext, job: &Arc<JobHandle>) -> TaskReply {
    let spec = &job.spec;
    let own = own_node(job);
    let mut asks = Vec::new();
    for (i, (name, cores)) in spec.nodes.iter().enumerate() {
        let address = spec.addresses.get(i).cloned().unwrap_or_default();
        let entry = AllocationNode {
            index: i as u32,
            name: name.clone(),
            address: address.clone(),
            slots: *cores,
            cpus: String::new(),
        };
        if i as u32 == own.index {
            asks.push(tokio::spawn(std::future::ready(own.clone())));
            continue;
        }
        let (id, auth) = (spec.id, ctx.auth.clone());
        asks.push(tokio::spawn(async move {
            let ask = async {
                let mut s = TcpStream::connect(&address).await.ok()?;
                let (q, link) = crate::auth::to_agent(
                    auth.as_deref(),
                    AgentQuery::Task { request: TaskRequest::RemoteInfo { job: id } },
                )
                .ok()?;
                write_frame(&mut s, &q).await.ok()?;
                let (_, mut opener) = link.query_link(TreeEnd::Above);
                match read_sealed::<_, AgentReply>(&mut s, &mut opener).await.ok()?? {
                    AgentReply::Task { reply: TaskReply::Info { nodes, .. } } => nodes.into_iter().next(),
                    _ => None,
                }
            };
            let cpus = tokio::time::timeout(CONNECT_TIMEOUT, ask).await.ok().flatten().map(|n| n.cpus);
            AllocationNode { cpus: cpus.unwrap_or_default(), ..entry }
        }));
    }
    let mut nodes = Vec::with_capacity(asks.len());
    for a in asks {
        if let Ok(n) = a.await {
            nodes.push(n);
        }
    }
    TaskReply::Info { job: spec.id, nodes }
}

struct SpawnAsk {
    node: u32,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    count: u32,
    output: String,
    error: String,
}

/// Check a spawn request against the job: the node index, the copies, the command.
fn check_spawn(job: &JobHandle, ask: &SpawnAsk) -> Result<(), TaskRefusal> {
    let n = job.spec.nodes.len();
    if ask.node as usize >= n {
        return Err(TaskRefusal::NoSuchNode { node: ask.node, job: job.spec.id, last: n.saturating_sub(1) });
    }
    if ask.count == 0 || ask.count > MAX_SPAWN {
        return Err(TaskRefusal::Count(ask.count));
    }
    if ask.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(TaskRefusal::NoCommand);
    }
    if !Path::new(&ask.cwd).is_absolute() {
        return Err(TaskRefusal::RelativeCwd(ask.cwd.clone()));
    }
    Ok(())
}

/// Start `count` copies on node `node`: here directly, elsewhere through that node's agent.
/// Answers once each task runs (or failed), or after START_WAIT for slow remote nodes.
async fn spawn(ctx: &Arc<JobContext>, job: &Arc<JobHandle>, ask: SpawnAsk) -> TaskReply {
    if let Err(e) = check_spawn(job, &ask) {
        return error(e);
    }
    let spec = &job.spec;
    let node_name = spec.nodes[ask.node as usize].0.clone();
    let local = node_name == spec.allocation.node;
    let address = spec.addresses.get(ask.node as usize).cloned().unwrap_or_default();
    if !local && address.is_empty() {
        return error(format!("the agent address of node {} ({node_name}) is unknown", ask.node));
    }
    let mut ids = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..ask.count {
        let (id, out, err) = job.tasks.with(|t| {
            let id = t.next_id();
            let out = absolute(&expand(&ask.output, spec.id, id, ask.node), &ask.cwd);
            let err = absolute(&expand(&ask.error, spec.id, id, ask.node), &ask.cwd);
            let got = t.add(ask.node, &node_name, &ask.argv, &out, &err);
            debug_assert_eq!(got, id);
            (id, out, err)
        });
        ids.push(id);
        let env = task_env(&ask.env, spec.id, id, ask.node, spec.compat.is_some());
        let (tx, rx) = mpsc::unbounded_channel();
        job.tasks.with(|t| t.set_signals(id, tx));
        if local {
            match spawn_here(ctx, job, &ask.argv, env, &ask.cwd, Stdio::Files(&out, &err)) {
                Ok(child) => {
                    let pid = child.id().unwrap_or(0);
                    job.tasks.with(|t| t.started(id, pid));
                    tokio::spawn(watch_local(job.clone(), id, child, rx));
                }
                Err(e) => job.tasks.with(|t| t.failed(id, e.to_string())),
            }
        } else {
            let req = TaskRequest::RemoteSpawn {
                job: spec.id,
                node: ask.node,
                task: id,
                argv: ask.argv.clone(),
                env,
                cwd: ask.cwd.clone(),
                output: out,
                error: err,
                attach: false,
            };
            let (started_tx, started_rx) = oneshot::channel();
            let remote = Remote { signals: rx, stdin: None, started: started_tx, output: None };
            tokio::spawn(drive_remote(ctx.clone(), job.clone(), id, address.clone(), req, remote));
            pending.push(started_rx);
        }
    }
    let deadline = tokio::time::Instant::now() + START_WAIT;
    for p in pending {
        let _ = tokio::time::timeout_at(deadline, p).await;
    }
    TaskReply::Spawned { tasks: job.tasks.read(|t| t.infos(&ids)) }
}

/// Where a task's stdout and stderr go.
enum Stdio<'a> {
    /// Appended to these files (opened by the task as the user).
    Files(&'a str, &'a str),
    /// Pipes to the agent (an attached task: `exec`).
    Pipes,
}

/// Why a task did not start on this node (the message its requester gets).
#[derive(Debug, thiserror::Error)]
pub enum TaskSpawnError {
    #[error("cannot open the job's cgroup: {0}")]
    Cgroup(crate::cgroup::CgroupError),
    #[error(transparent)]
    Spawn(#[from] crate::step::rank::SpawnError),
}

/// Start a task on this node: in the job's cgroup, as the job's user, with the node's own
/// variables on top of `env`.
fn spawn_here(
    ctx: &JobContext,
    job: &JobHandle,
    argv: &[String],
    mut env: Vec<(String, String)>,
    cwd: &str,
    stdio: Stdio<'_>,
) -> Result<crate::step::rank::Process, TaskSpawnError> {
    set_vars(
        &mut env,
        vec![
            ("TMPDIR", job.tmpdir().display().to_string()),
            ("BERTH_NODEFILE", job.spool.join("nodefile").display().to_string()),
            ("BERTH_CPUS", job.allocation().cpus.to_list()),
            ("BERTH_CORES", job.spec.allocation.cores.to_string()),
            ("BERTH_CPUSET", job.cpuset_dir.display().to_string()),
            ("BERTH_AGENT_SOCKET", ctx.agent_socket.display().to_string()),
        ],
    );
    // The job's GPUs on this node, as the batch script gets them (none: nothing set).
    let held = &job.allocation().gpus;
    set_vars(&mut env, berth_core::gpu::gpu_env(&ctx.topology.gpus, held, held, ctx.cgroups.contains_devices()));
    if let Some(compat) = &job.spec.compat {
        use crate::compat_env::{job_vars, node_index};
        // The job's, as on this node (a step's counts do not follow a task started from it).
        let node = node_index(&job.spec);
        let cpus = job.allocation().cpus.len();
        set_vars(&mut env, job_vars(&job.spec, compat, node, cpus));
    }
    let join = job.cgroup.join_files().map_err(TaskSpawnError::Cgroup)?;
    let launch = crate::step::rank::RankLaunch {
        argv,
        env,
        cwd,
        user: &job.spec.user,
        join_fds: join.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect(),
        affinity: None,
        pmi_fd: None,
        // An attached task reads what its caller forwards ([`feed_stdin`]).
        stdin: matches!(stdio, Stdio::Pipes),
        umask: job.spec.umask,
    };
    let task = match stdio {
        Stdio::Files(stdout, stderr) => crate::step::rank::spawn_to_files(launch, stdout, stderr),
        Stdio::Pipes => crate::step::rank::spawn(launch),
    }?;
    if let Some(pid) = task.id() {
        job.cgroup.joined(pid as i32);
    }
    Ok(task)
}

/// Output of an attached task: (stream 1 or 2, bytes).
type OutputTx = mpsc::UnboundedSender<(u8, Vec<u8>)>;

/// Relay an attached task's stdout and stderr to `out` until they close.
fn pump_output(child: &mut crate::step::rank::Process, out: &OutputTx) {
    use tokio::io::AsyncReadExt;
    async fn pump(mut r: tokio::net::unix::pipe::Receiver, stream: u8, out: OutputTx) {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = r.read(&mut buf).await {
            if out.send((stream, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    }
    if let Some(r) = child.stdout.take() {
        tokio::spawn(pump(r, 1, out.clone()));
    }
    if let Some(r) = child.stderr.take() {
        tokio::spawn(pump(r, 2, out.clone()));
    }
}

/// How long an attached task's output may go on after it ended (a background process still
/// holding its stdout), as `berth run` gives a rank's.
const OUTPUT_LINGER: Duration = Duration::from_secs(2);

/// The end of an attached task's relay (`exec` on the caller's node, `run_remote` on the task's): the
/// task's output is relayed until it closes, or for [`OUTPUT_LINGER`] after the task ended,
/// whichever comes first.
#[derive(Debug, Default, Clone, Copy)]
struct Linger {
    ended_at: Option<tokio::time::Instant>,
}

impl Linger {
    /// The task ended now (the first call counts).
    fn task_ended(&mut self) {
        self.ended_at.get_or_insert_with(tokio::time::Instant::now);
    }

    fn ended(&self) -> bool {
        self.ended_at.is_some()
    }

    /// Whether the relay is done: the task ended and its output closed.
    fn done(&self, output_open: bool) -> bool {
        self.ended() && !output_open
    }

    /// Completes [`OUTPUT_LINGER`] after the task's end; never while it runs. Owns its
    /// deadline, so a `select!` arm may hold it while another arm calls `task_ended`.
    fn over(&self) -> impl std::future::Future<Output = ()> + 'static {
        let ended_at = self.ended_at;
        async move {
            match ended_at {
                Some(t) => tokio::time::sleep_until(t + OUTPUT_LINGER).await,
                None => std::future::pending().await,
            }
        }
    }
}

/// `exec` (`berth task rsh`): one task on node `ask.node`, attached to the caller's
/// connection. Answers `spawned`; then relays the task's output as `output` frames and the
/// caller's `signal` frames to the task, and ends with `exited` (or `error` if the task was
/// lost). A caller that goes away takes the task with it, as sshd treats a dropped ssh: SIGHUP
/// at once, SIGTERM (and SIGCONT) half a grace period later, SIGKILL at its end ([`HangUp`]).
async fn exec(ctx: &Arc<JobContext>, caller: Caller, id: JobId, ask: SpawnAsk, mut stream: UnixStream) {
    let refuse = |m: String| AgentReply::Task { reply: error(m) };
    let job = match authorize(ctx, caller, id) {
        Ok(j) => j,
        Err(e) => return drop(write_frame(&mut stream, &refuse(e.into())).await),
    };
    if let Err(e) = check_spawn(&job, &ask) {
        return drop(write_frame(&mut stream, &refuse(e.into())).await);
    }
    let spec = &job.spec;
    let node_name = spec.nodes[ask.node as usize].0.clone();
    let local = node_name == spec.allocation.node;
    let address = spec.addresses.get(ask.node as usize).cloned().unwrap_or_default();
    if !local && address.is_empty() {
        let m = format!("the agent address of node {} ({node_name}) is unknown", ask.node);
        return drop(write_frame(&mut stream, &refuse(m)).await);
    }
    let task = job.tasks.with(|t| t.add_attached(ask.node, &node_name, &ask.argv));
    let env = task_env(&ask.env, spec.id, task, ask.node, spec.compat.is_some());
    let (sig_tx, sig_rx) = mpsc::unbounded_channel();
    job.tasks.with(|t| t.set_signals(task, sig_tx));
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    // The caller's stdin, to the task (here) or to the agent that runs it: bounded.
    let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(STDIN_CHUNKS);
    let mut stdin_rx = Some(stdin_rx);
    if local {
        match spawn_here(ctx, &job, &ask.argv, env, &ask.cwd, Stdio::Pipes) {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                job.tasks.with(|t| t.started(task, pid));
                pump_output(&mut child, &out_tx);
                if let (Some(pipe), Some(rx)) = (child.stdin.take(), stdin_rx.take()) {
                    tokio::spawn(feed_stdin(pipe, rx));
                }
                tokio::spawn(watch_local(job.clone(), task, child, sig_rx));
            }
            Err(e) => job.tasks.with(|t| t.failed(task, e.to_string())),
        }
    } else {
        let req = TaskRequest::RemoteSpawn {
            job: spec.id,
            node: ask.node,
            task,
            argv: ask.argv.clone(),
            env,
            cwd: ask.cwd.clone(),
            output: String::new(),
            error: String::new(),
            attach: true,
        };
        let (started_tx, started_rx) = oneshot::channel();
        let out = Some(out_tx.clone());
        let remote = Remote { signals: sig_rx, stdin: stdin_rx.take(), started: started_tx, output: out };
        tokio::spawn(drive_remote(ctx.clone(), job.clone(), task, address, req, remote));
        let _ = tokio::time::timeout(START_WAIT, started_rx).await;
    }
    drop(out_tx);
    let infos = job.tasks.read(|t| t.infos(&[task]));
    let failed = infos.iter().any(|i| i.state == "failed");
    if write_frame(&mut stream, &AgentReply::Task { reply: TaskReply::Spawned { tasks: infos } }).await.is_err() {
        // Not yet told it runs: the caller cannot have relied on it.
        job.tasks.read(|t| t.signal(&[task], libc::SIGKILL));
        return;
    }
    if failed {
        return;
    }
    let (mut rd, mut wr) = stream.into_split();
    // The caller's frames, read by their own task (a read cut by select! would lose bytes).
    // Its stdin goes on from here: while the task does not read it, this reader waits and
    // the caller's writes with it (its signals queue behind).
    let (down_tx, mut down) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let limits = crate::conn::local_request(true);
        let limits = berth_protocol::FrameLimits { idle: None, ..limits };
        let mut stdin = Some(stdin_tx);
        loop {
            let msg = read_frame_limited::<_, AgentQuery>(&mut rd, &limits).await;
            match msg {
                Ok(Some(AgentQuery::Task { request: TaskRequest::Stdin { data } })) => {
                    if let Some(tx) = &stdin {
                        if tx.send(data.as_bytes().to_vec()).await.is_err() {
                            stdin = None;
                        }
                    }
                    continue;
                }
                Ok(Some(AgentQuery::Task { request: TaskRequest::StdinEof })) => {
                    stdin = None;
                    continue;
                }
                _ => {}
            }
            let end = !matches!(msg, Ok(Some(_)));
            if down_tx.send(msg).is_err() || end {
                return;
            }
        }
    });
    let mut output_open = true;
    let mut caller_here = true;
    let mut linger = Linger::default();
    let mut hang_up = HangUp::new(job.spec.kill_grace_ms);
    let ids = [task];
    while !linger.done(output_open) {
        tokio::select! {
            chunk = out_rx.recv(), if output_open => match chunk {
                Some((stream, data)) => {
                    let frame = AgentReply::Task { reply: TaskReply::Output { stream, data: Chunk::from_bytes(data) } };
                    if caller_here && write_frame(&mut wr, &frame).await.is_err() {
                        caller_here = false;
                        hang_up.start(&job, task);
                    }
                }
                None => output_open = false,
            },
            msg = down.recv(), if caller_here => match msg {
                Some(Ok(Some(AgentQuery::Task { request: TaskRequest::Signal { signal } }))) if (1..=64).contains(&signal) => {
                    job.tasks.read(|t| t.signal(&[task], signal));
                }
                Some(Ok(Some(_))) => {}
                _ => {
                    // The caller went away: the task goes too, given time to end itself.
                    caller_here = false;
                    hang_up.start(&job, task);
                }
            },
            _ = hang_up.next(), if hang_up.pending() && !linger.ended() => hang_up.step(&job, task),
            _ = job.tasks.wait(&ids, None), if !linger.ended() => linger.task_ended(),
            _ = linger.over() => break,
        }
    }
    reader.abort();
    if !caller_here {
        return;
    }
    let info = job.tasks.read(|t| t.infos(&[task])).pop();
    let reply = match info {
        Some(i) if i.state == "exited" => {
            TaskReply::Exited { exit_code: i.exit_code, signal: i.signal, wall_ms: i.wall_ms.unwrap_or(0) }
        }
        Some(i) => error(i.reason.unwrap_or_else(|| "the task was lost".into())),
        None => error("the task was lost"),
    };
    let _ = write_frame(&mut wr, &AgentReply::Task { reply }).await;
}

/// How many chunks of a caller's stdin (each one frame, `berth task rsh` sends at most 16 KiB)
/// wait for the task to read them, per task.
const STDIN_CHUNKS: usize = 16;

/// Write what arrives on `rx` to a task's stdin, in order; close it (EOF) when `rx` ends. A
/// task that closed its stdin gets nothing more (the rest is read and dropped, so the caller
/// is never held up by it).
async fn feed_stdin(mut pipe: tokio::net::unix::pipe::Sender, mut rx: mpsc::Receiver<Vec<u8>>) {
    use tokio::io::AsyncWriteExt;
    while let Some(chunk) = rx.recv().await {
        if pipe.write_all(&chunk).await.is_err() {
            while rx.recv().await.is_some() {}
            return;
        }
    }
}

/// What a remote attached task is relayed: signals and stdin down, its start and output up.
struct Remote {
    signals: mpsc::UnboundedReceiver<i32>,
    /// The caller's stdin (an `exec` task); None: the task's stdin ends at once.
    stdin: Option<mpsc::Receiver<Vec<u8>>>,
    started: oneshot::Sender<()>,
    output: Option<OutputTx>,
}

/// What an `exec` task gets once its caller is gone: SIGHUP, then SIGTERM and SIGCONT half
/// the grace period later, then SIGKILL at its end. The grace is the job's kill grace,
/// bounded to 1-60 s (a handler of SIGHUP always gets a second).
struct HangUp {
    grace: Duration,
    /// Signals sent so far (0: the caller is here).
    sent: u8,
    next_at: Option<tokio::time::Instant>,
}

impl HangUp {
    fn new(kill_grace_ms: u64) -> HangUp {
        HangUp { grace: Duration::from_millis(kill_grace_ms.clamp(1_000, 60_000)), sent: 0, next_at: None }
    }

    /// The caller went away: SIGHUP now.
    fn start(&mut self, job: &JobHandle, task: u64) {
        if self.sent == 0 {
            job.tasks.read(|t| t.signal(&[task], libc::SIGHUP));
            self.sent = 1;
            self.next_at = Some(tokio::time::Instant::now() + self.grace / 2);
        }
    }

    fn pending(&self) -> bool {
        self.next_at.is_some()
    }

    async fn next(&self) {
        match self.next_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// The next signal is due: SIGTERM (and SIGCONT), then SIGKILL.
    fn step(&mut self, job: &JobHandle, task: u64) {
        if self.sent == 1 {
            job.tasks.read(|t| {
                t.signal(&[task], libc::SIGTERM);
                t.signal(&[task], libc::SIGCONT);
            });
            self.sent = 2;
            self.next_at = Some(tokio::time::Instant::now() + self.grace - self.grace / 2);
        } else {
            job.tasks.read(|t| t.signal(&[task], libc::SIGKILL));
            self.sent = 3;
            self.next_at = None;
        }
    }
}

fn signal_group(pid: u32, sig: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) on the process group of a child of ours not reaped yet (it called setsid).
    unsafe {
        if libc::kill(-pid, sig) != 0 {
            libc::kill(pid, sig);
        }
    }
}

/// A task's session (it called setsid: its id is the task's pid): once the task has ended,
/// what it left running in the job's cgroup (`sleep &`, children of children) is killed, as
/// the PBS node daemon ends a task's session. Processes that left the session (setsid again)
/// stay in the job's cgroup and end with the job.
async fn end_session(job: &Arc<JobHandle>, sid: u32) {
    let Ok(sid) = i32::try_from(sid) else { return };
    if sid <= 0 {
        return;
    }
    let cg = job.cgroup.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for _ in 0..50 {
            let left: Vec<i32> =
                cg.pids().unwrap_or_default().into_iter().filter(|p| session_of(*p) == Some(sid)).collect();
            if left.is_empty() {
                return;
            }
            for p in left {
                // SAFETY: kill(2) on a process of the job's cgroup in the ended task's session.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    })
    .await;
}

/// The session id of a process (`/proc/PID/stat`, the field after the state and parents).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// How a child ended: (exit code, signal).
fn status_of(st: &std::io::Result<std::process::ExitStatus>) -> (Option<i32>, Option<i32>) {
    match st {
        Ok(st) => (st.code(), st.signal()),
        Err(_) => (None, None),
    }
}

/// Wait for a local task, delivering signals to its process group until it ends.
async fn watch_local(
    job: Arc<JobHandle>,
    id: u64,
    mut child: crate::step::rank::Process,
    mut signals: mpsc::UnboundedReceiver<i32>,
) {
    let pid = child.id().unwrap_or(0);
    let mut open = true;
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            sig = signals.recv(), if open => match sig {
                Some(sig) => signal_group(pid, sig),
                None => open = false,
            },
        }
    };
    end_session(&job, pid).await;
    let (code, sig) = status_of(&status);
    match status {
        Ok(_) => job.tasks.with(|t| t.exited(id, code, sig, None)),
        Err(e) => job.tasks.with(|t| t.failed(id, format!("lost track of the task: {e}"))),
    }
}

/// One remote task, seen from the agent that spawned it: launch, then relay its end (and an
/// attached task's output) up and signals (and stdin) down until it ends, its connection
/// breaks, or the job ends here.
async fn drive_remote(
    ctx: Arc<JobContext>,
    job: Arc<JobHandle>,
    id: u64,
    address: String,
    req: TaskRequest,
    remote: Remote,
) {
    let Remote { mut signals, stdin, started, output } = remote;
    let mut stdin_open = stdin.is_some();
    let mut stdin = stdin;
    let node = match &req {
        TaskRequest::RemoteSpawn { node, .. } => *node,
        _ => 0,
    };
    let fail = |why: String| job.tasks.with(|t| t.failed(id, why));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return fail(format!("cannot reach the agent of node {node} at {address}: {e}")),
        Err(_) => return fail(format!("no answer from the agent of node {node} at {address}")),
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (query, link) = match crate::auth::to_agent(ctx.auth.as_deref(), AgentQuery::Task { request: req }) {
        Ok(x) => x,
        Err(e) => return fail(format!("signing the task for node {node}: {e}")),
    };
    let (mut sealer, mut opener) = link.query_link(TreeEnd::Above);
    if let Err(e) = write_frame(&mut wr, &query).await {
        return fail(format!("sending the task to node {node}: {e}"));
    }
    match read_sealed::<_, AgentReply>(&mut rd, &mut opener).await {
        Ok(Some(AgentReply::Task { reply: TaskReply::Started { pid } })) => job.tasks.with(|t| t.started(id, pid)),
        Ok(Some(AgentReply::Task { reply: TaskReply::Error { message } })) => return fail(message),
        Ok(Some(AgentReply::Error { message })) => return fail(message),
        Ok(Some(other)) => return fail(format!("unexpected answer from node {node}: {other:?}")),
        Ok(None) => return fail(format!("the agent of node {node} closed the connection")),
        Err(e) => return fail(format!("connection to node {node}: {e}")),
    }
    let _ = started.send(());
    // Frames are read by their own task: a read cut by select! would lose its bytes.
    let (up_tx, mut up) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let msg = read_sealed::<_, AgentReply>(&mut rd, &mut opener).await;
            let end = !matches!(msg, Ok(Some(_)));
            if up_tx.send(msg).is_err() || end {
                return;
            }
        }
    });
    let mut check = tokio::time::interval(Duration::from_millis(500));
    let mut open = true;
    loop {
        tokio::select! {
            msg = up.recv() => match msg {
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Exited { exit_code, signal, wall_ms } }))) => {
                    job.tasks.with(|t| t.exited(id, exit_code, signal, Some(wall_ms)));
                    break;
                }
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Output { stream, data } }))) => {
                    if let Some(out) = &output {
                        let _ = out.send((stream, data.as_bytes().to_vec()));
                    }
                }
                Some(Ok(Some(_))) => {}
                Some(Ok(None)) | None => {
                    fail(format!("the agent of node {node} closed the connection; the task is lost"));
                    break;
                }
                Some(Err(e)) => {
                    fail(format!("connection to node {node}: {e}; the task is lost"));
                    break;
                }
            },
            sig = signals.recv(), if open => match sig {
                Some(signal) => {
                    if write_sealed(&mut wr, &mut sealer, &TaskRequest::RemoteSignal { signal }).await.is_err() {
                        fail(format!("connection to node {node} broke; the task is lost"));
                        break;
                    }
                }
                None => open = false,
            },
            chunk = async { match stdin.as_mut() { Some(rx) => rx.recv().await, None => None } }, if stdin_open => {
                let frame = match chunk {
                    Some(data) => TaskRequest::Stdin { data: Chunk::from_bytes(data) },
                    None => {
                        stdin_open = false;
                        stdin = None;
                        TaskRequest::StdinEof
                    }
                };
                if write_sealed(&mut wr, &mut sealer, &frame).await.is_err() {
                    fail(format!("connection to node {node} broke; the task is lost"));
                    break;
                }
            },
            _ = check.tick() => {
                // The job ended here: dropping the connection makes the remote agent kill the task.
                if !ctx.registry.get(job.spec.id).is_some_and(|j| Arc::ptr_eq(&j, &job)) {
                    fail("the job ended".into());
                    break;
                }
            }
        }
    }
    reader.abort();
}

/// A task request from another agent over TCP (`AgentQuery::Task`). `remote_spawn` keeps
/// the connection for the task's life; the user-facing requests are refused here, since a
/// TCP peer has no identity the kernel vouches for.
pub async fn serve_agent(ctx: Arc<JobContext>, req: TaskRequest, mut stream: TcpStream, link: LinkKey) {
    let (mut sealer, opener) = link.query_link(TreeEnd::Below);
    let reply = match req {
        TaskRequest::RemoteSpawn { job, node, task, argv, env, cwd, output, error, attach } => {
            let ask = RemoteAsk { job, node, task, argv, env, cwd, output, error, attach };
            return run_remote(ctx, ask, stream, sealer, opener).await;
        }
        TaskRequest::RemoteInfo { job } => match ctx.registry.wait_for(job, JOB_WAIT).await {
            Some(j) => TaskReply::Info { job, nodes: vec![own_node(&j)] },
            None => error(format!("job {job} is not running on this node")),
        },
        _ => error("the task API is served on the agent's local socket (BERTH_AGENT_SOCKET), to the job's processes"),
    };
    let _ = write_sealed(&mut stream, &mut sealer, &AgentReply::Task { reply }).await;
}

struct RemoteAsk {
    job: JobId,
    node: u32,
    task: u64,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    output: String,
    error: String,
    attach: bool,
}

enum Down {
    Signal(i32),
    Lost,
}

/// The receiving side of `remote_spawn`: start the task here, report it, relay signals, and
/// kill it if the spawning agent goes away.
async fn run_remote(ctx: Arc<JobContext>, ask: RemoteAsk, stream: TcpStream, mut sealer: Sealer, mut opener: Opener) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let reply = |r: TaskReply| AgentReply::Task { reply: r };
    let Some(job) = ctx.registry.wait_for(ask.job, JOB_WAIT).await else {
        let _ =
            write_sealed(&mut wr, &mut sealer, &reply(error(format!("job {} is not running on this node", ask.job))))
                .await;
        return;
    };
    let here = job.spec.nodes.get(ask.node as usize).is_some_and(|(n, _)| *n == job.spec.allocation.node);
    if !here {
        let message = format!("node {} of job {} is not this node ({})", ask.node, ask.job, job.spec.allocation.node);
        let _ = write_sealed(&mut wr, &mut sealer, &reply(error(message))).await;
        return;
    }
    let since = Instant::now();
    let stdio = if ask.attach { Stdio::Pipes } else { Stdio::Files(&ask.output, &ask.error) };
    let mut child = match spawn_here(&ctx, &job, &ask.argv, ask.env, &ask.cwd, stdio) {
        Ok(c) => c,
        Err(e) => {
            let _ = write_sealed(&mut wr, &mut sealer, &reply(error(e.to_string()))).await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    tracing::debug!(job = %ask.job, task = ask.task, pid, "task started for another agent");
    if write_sealed(&mut wr, &mut sealer, &reply(TaskReply::Started { pid })).await.is_err() {
        signal_group(pid, libc::SIGKILL);
    }
    // An attached task's stdin: what the spawning agent forwards, bounded as `exec`'s.
    let mut stdin = None;
    if let Some(pipe) = child.stdin.take() {
        let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(STDIN_CHUNKS);
        tokio::spawn(feed_stdin(pipe, stdin_rx));
        stdin = Some(stdin_tx);
    }
    let (tx, mut down) = mpsc::unbounded_channel();
    let (job_id, auth) = (ask.job, ctx.auth.clone());
    let reader = tokio::spawn(async move {
        loop {
            match read_sealed::<_, TaskRequest>(&mut rd, &mut opener).await {
                Ok(Some(TaskRequest::RemoteSignal { signal })) => {
                    if tx.send(Down::Signal(signal)).is_err() {
                        return;
                    }
                }
                Ok(Some(TaskRequest::Stdin { data })) => {
                    if let Some(s) = &stdin {
                        if s.send(data.as_bytes().to_vec()).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Ok(Some(TaskRequest::StdinEof)) => stdin = None,
                Ok(Some(_)) => {}
                end => {
                    // Someone else's frame on the connection counts as losing it (the task
                    // is killed), and is logged.
                    if let (Err(ProtocolError::Auth(why)), Some(auth)) = (&end, &auth) {
                        let detail = format!("task connection frame for job {job_id} refused: {why}");
                        auth.refuse(Refusal::Auth, Some(job_id), &detail);
                    }
                    let _ = tx.send(Down::Lost);
                    return;
                }
            }
        }
    });
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    pump_output(&mut child, &out_tx);
    drop(out_tx);
    let mut output_open = ask.attach;
    let mut lost = false;
    let mut status = None;
    let mut linger = Linger::default();
    while !linger.done(output_open) {
        tokio::select! {
            st = child.wait(), if status.is_none() => {
                status = Some(st);
                linger.task_ended();
            }
            chunk = out_rx.recv(), if output_open => match chunk {
                Some((stream, data)) => {
                    let frame = reply(TaskReply::Output { stream, data: Chunk::from_bytes(data) });
                    if !lost && write_sealed(&mut wr, &mut sealer, &frame).await.is_err() {
                        signal_group(pid, libc::SIGKILL);
                        lost = true;
                    }
                }
                None => output_open = false,
            },
            _ = linger.over() => break,
            d = down.recv(), if !lost => match d {
                Some(Down::Signal(sig)) if (1..=64).contains(&sig) => signal_group(pid, sig),
                Some(Down::Signal(_)) => {}
                Some(Down::Lost) | None => {
                    tracing::info!(job = %ask.job, task = ask.task, "the spawning agent went away: killing the task");
                    signal_group(pid, libc::SIGKILL);
                    lost = true;
                }
            },
        }
    }
    reader.abort();
    end_session(&job, pid).await;
    if !lost {
        let status = status.unwrap_or_else(|| Err(std::io::Error::other("the task's end was not seen")));
        let (exit_code, signal) = status_of(&status);
        let wall_ms = since.elapsed().as_millis() as u64;
        let _ = write_sealed(&mut wr, &mut sealer, &reply(TaskReply::Exited { exit_code, signal, wall_ms })).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::task_table::{JobTasks, TaskTable};

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_relay_lingers_for_output_after_the_task_ended_then_stops() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let mut linger = Linger::default();
            assert!(!linger.ended() && !linger.done(false), "a running task's relay goes on");
            let long = tokio::time::timeout(Duration::from_secs(3600), linger.over()).await;
            assert!(long.is_err(), "no end while the task runs");
            let start = tokio::time::Instant::now();
            linger.task_ended();
            assert!(linger.done(false), "ended, output closed: done at once");
            assert!(!linger.done(true), "ended, output open: it lingers");
            let waiting = linger.over();
            // A later end does not move the deadline.
            tokio::time::advance(Duration::from_millis(500)).await;
            linger.task_ended();
            waiting.await;
            assert_eq!(start.elapsed(), OUTPUT_LINGER, "over OUTPUT_LINGER after the first end");
            let again = tokio::time::Instant::now();
            linger.over().await;
            assert_eq!(again.elapsed(), Duration::ZERO, "the deadline has passed: over at once");
        });
    }

    #[test]
    fn a_session_id_is_read_past_odd_command_names() {
        let own = session_of(std::process::id() as i32).expect("our own session");
        // SAFETY: getsid(0) has no preconditions.
        assert_eq!(own, unsafe { libc::getsid(0) });
        assert_eq!(session_of(-1), None);
    }

    #[test]
    fn ids_count_up_and_states_move_forward_only() {
        let mut t = TaskTable::default();
        let a = t.add(0, "n1", &argv(&["true"]), "/o", "/e");
        let b = t.add(1, "n2", &argv(&["false"]), "/o", "/e");
        assert_eq!((a, b), (1, 2));
        let infos = t.infos(&[1, 2]);
        assert!(infos.iter().all(|i| i.state == "starting" && i.pid.is_none()));
        t.started(1, 100);
        t.failed(2, "nope: command not found".into());
        t.started(2, 200); // too late: it failed
        let infos = t.infos(&[1, 2]);
        assert_eq!((infos[0].state.as_str(), infos[0].pid), ("running", Some(100)));
        assert_eq!((infos[1].state.as_str(), infos[1].pid), ("failed", None));
        assert!(infos[1].unsuccessful() && infos[1].ended());
        assert!(!t.all_ended(&[1, 2]) && t.all_ended(&[2]));
        t.exited(1, None, Some(9), Some(1500));
        t.exited(1, Some(0), None, None); // ends once
        let i = &t.infos(&[1])[0];
        assert_eq!((i.state.as_str(), i.exit_code, i.signal, i.wall_ms), ("exited", None, Some(9), Some(1500)));
        assert!(i.unsuccessful());
        assert!(t.all_ended(&[]) && t.all_ended(&[1, 2]));
        assert_eq!(t.add(0, "n1", &argv(&["x"]), "/o", "/e"), 3);
    }

    #[test]
    fn select_checks_ids_and_empty_means_all() {
        let mut t = TaskTable::default();
        for _ in 0..3 {
            t.add(0, "n1", &argv(&["x"]), "/o", "/e");
        }
        let job = JobId(7);
        assert_eq!(t.select(job, &[]).unwrap(), [1, 2, 3]);
        assert_eq!(t.select(job, &[3, 1, 3]).unwrap(), [1, 3]);
        let e = t.select(job, &[2, 9, 10]).unwrap_err();
        assert_eq!(e, crate::ports::task_table::UnknownTasks { job, ids: vec![9, 10] });
        assert_eq!(
            e.to_string(),
            "no task 9, 10 in job 7 on this node (tasks are known to the agent they were spawned through)"
        );
    }

    #[test]
    fn signals_reach_only_tasks_that_run() {
        let mut t = TaskTable::default();
        let (a, b) = (t.add(0, "n", &argv(&["x"]), "", ""), t.add(0, "n", &argv(&["x"]), "", ""));
        let (tx_a, mut rx_a) = mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = mpsc::unbounded_channel();
        t.set_signals(a, tx_a);
        t.set_signals(b, tx_b);
        t.started(a, 10);
        t.started(b, 11);
        t.exited(b, Some(0), None, None);
        assert_eq!(t.signal(&[a, b], 15), 1);
        assert_eq!(rx_a.try_recv().ok(), Some(15));
        assert!(rx_b.try_recv().is_err());
    }

    #[test]
    fn wait_returns_when_tasks_end_or_at_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let tasks = Arc::new(JobTasks::default());
            let id = tasks.with(|t| t.add(0, "n", &argv(&["x"]), "", ""));
            tasks.with(|t| t.started(id, 1));
            let t0 = Instant::now();
            tasks.wait(&[id], Some(tokio::time::Instant::now() + Duration::from_millis(50))).await;
            assert!(t0.elapsed() >= Duration::from_millis(50));
            let t2 = tasks.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                t2.with(|t| t.exited(id, Some(3), None, None));
            });
            tasks.wait(&[id], None).await;
            assert_eq!(tasks.read(|t| t.infos(&[id]))[0].exit_code, Some(3));
        });
    }

    #[test]
    fn patterns_expand_and_paths_resolve_against_cwd() {
        let j = JobId(12);
        assert_eq!(expand(DEFAULT_OUTPUT, j, 3, 1), "berth-task-12.3.out");
        assert_eq!(expand("o-%n-%t%%-%x-%", j, 4, 2), "o-2-4%-%x-%");
        assert_eq!(absolute("a/b.out", "/home/u"), "/home/u/a/b.out");
        assert_eq!(absolute("/abs.out", "/home/u"), "/abs.out");
    }

    #[test]
    fn task_env_drops_rank_variables_and_sets_task_ones() {
        let caller: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("PMI_FD", "5"),
            ("BERTH_RANK", "3"),
            ("BERTH_NODEID", "0"),
            ("BERTH_JOB_ID", "1"),
            ("HOME", "/home/u"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let env = task_env(&caller, JobId(5), 9, 1, false);
        let get = |k: &str| env.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(get("PATH"), ["/usr/bin"]);
        assert_eq!(get("HOME"), ["/home/u"]);
        assert!(get("PMI_FD").is_empty() && get("BERTH_RANK").is_empty());
        assert_eq!(get("BERTH_NODEID"), ["1"]);
        assert_eq!(get("BERTH_JOB_ID"), ["5"]);
        assert_eq!(get("BERTH_TASK_ID"), ["9"]);
        assert!(get("PBS_TASKNUM").is_empty(), "no Slurm or PBS variables when they are off");
    }

    #[test]
    fn task_env_drops_step_variables_and_sets_pbs_ones() {
        let caller: Vec<(String, String)> =
            [("SLURM_PROCID", "3"), ("SLURM_LOCALID", "1"), ("SLURM_STEP_ID", "2"), ("SLURM_JOB_ID", "5")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let env = task_env(&caller, JobId(5), 9, 1, true);
        let get = |k: &str| env.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert!(get("SLURM_PROCID").is_empty() && get("SLURM_LOCALID").is_empty() && get("SLURM_STEP_ID").is_empty());
        assert_eq!(get("SLURM_JOB_ID"), ["5"]);
        assert_eq!(get("PBS_TASKNUM"), ["9"]);
        assert_eq!(get("PBS_NODENUM"), ["1"]);
        assert_eq!(get("SLURM_NODEID"), ["1"]);
    }

    #[test]
    fn cgroup_membership_is_by_whole_path_components() {
        let rel = Path::new("berth/c1/node1/job_7");
        let v1 = "12:freezer:/berth/c1/node1/job_7\n4:cpuset:/berth/c1/node1/job_7/s1r0\n0::/\n";
        assert!(cgroup_contains(v1, rel));
        let v2 = "0::/berth/c1/node1/job_7\n";
        assert!(cgroup_contains(v2, rel));
        assert!(!cgroup_contains("4:cpuset:/berth/c1/node1/job_70\n", rel));
        assert!(!cgroup_contains("4:cpuset:/berth/c1/node2/job_7\n", rel));
        assert!(!cgroup_contains("4:cpuset:/\n0::/user.slice\n", rel));
        assert!(!cgroup_contains(v1, Path::new("")));
    }

    #[test]
    fn remote_requests_round_trip_as_frames() {
        let req = TaskRequest::RemoteSpawn {
            job: JobId(3),
            node: 1,
            task: 2,
            argv: argv(&["hostname"]),
            env: vec![],
            cwd: "/".into(),
            output: "/o".into(),
            error: "/e".into(),
            attach: false,
        };
        let json = serde_json::to_value(AgentQuery::Task { request: req.clone() }).unwrap();
        assert_eq!(json["request"]["op"], "remote_spawn");
        let back: AgentQuery = serde_json::from_value(json).unwrap();
        assert_eq!(back, AgentQuery::Task { request: req });
        // A spawn without output fields (older client) still parses.
        let old = serde_json::json!({"op":"spawn","job":1,"node":0,"argv":["x"],"env":[],"cwd":"/","count":1});
        assert!(matches!(serde_json::from_value::<TaskRequest>(old).unwrap(), TaskRequest::Spawn { output: None, .. }));
    }
}
