//! `spawn`: start copies of a command on a node of the allocation, each with its output in
//! files; here ([`spawn_here`], in the job's cgroup, as the job's user), or through that
//! node's agent ([`super::remote`]).

use super::access::{check_spawn, error, SpawnAsk};
use super::env::{absolute, expand, set_vars, task_env};
use super::process::watch_local;
use super::remote::{drive_remote, Remote};
use crate::ports::{JobContext, JobHandle};
use berth_protocol::step::{TaskReply, TaskRequest};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long `spawn` waits for remote tasks to report their pid before answering anyway.
pub(super) const START_WAIT: Duration = Duration::from_secs(10);

/// Start `count` copies on node `node`: here directly, elsewhere through that node's agent.
/// Answers once each task runs (or failed), or after START_WAIT for slow remote nodes.
pub(super) async fn spawn(ctx: &Arc<JobContext>, job: &Arc<JobHandle>, ask: SpawnAsk) -> TaskReply {
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
pub(super) enum Stdio<'a> {
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
pub(super) fn spawn_here(
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
        nice: ctx.priority.job_nice(),
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
