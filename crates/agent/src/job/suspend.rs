//! Suspending a job on this node: its cgroup is frozen (every process of the job, its steps
//! and its tasks stop where they are), its walltime clock stops, and it is thawed later,
//! possibly on other CPUs of the node (cpuset change; memory follows a change of memory
//! nodes: v1 `cpuset.memory_migrate`, always on v2).
//!
//! The controller's `suspend` / `resume` for a job are carried out one at a time, in the
//! order they arrived, each answered with `suspended` / `resumed`. A job that is ending
//! (walltime, kill) is thawed first so its processes act on the SIGTERM. The state these
//! operations change is a [`crate::ports::suspension::Suspension`].

use crate::cgroup::JobLimits;
use crate::ports::{JobContext, JobHandle};
use berth_core::job::NodeAllocation;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, CgroupReport};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

pub use crate::ports::suspension::Op;

/// Carry out `op` for the job `id` and answer the controller on `events`: in order with the
/// job's other operations when it is set up here; a job still being launched is waited for
/// briefly.
pub fn request(
    ctx: &Arc<JobContext>,
    id: JobId,
    op: Op,
    launching: bool,
    events: &mpsc::UnboundedSender<AgentMessage>,
) {
    if let Some(job) = ctx.registry.get(id) {
        enqueue(ctx, job, op, events);
        return;
    }
    if !launching {
        let _ = events.send(reply(id, &op, Err(SuspendError::NotHere(id)), vec![]));
        return;
    }
    let (ctx, events) = (ctx.clone(), events.clone());
    tokio::spawn(async move {
        match ctx.registry.wait_for(id, Duration::from_secs(10)).await {
            Some(job) => enqueue(&ctx, job, op, &events),
            None => {
                let _ = events.send(reply(id, &op, Err(SuspendError::NotStarted(id)), vec![]));
            }
        }
    });
}

fn enqueue(ctx: &Arc<JobContext>, job: Arc<JobHandle>, op: Op, events: &mpsc::UnboundedSender<AgentMessage>) {
    let start = match job.suspension.pending.lock() {
        Ok(mut p) => {
            p.ops.push_back(op);
            !std::mem::replace(&mut p.draining, true)
        }
        Err(_) => false,
    };
    if start {
        tokio::spawn(drain(ctx.clone(), job, events.clone()));
    }
}

async fn drain(ctx: Arc<JobContext>, job: Arc<JobHandle>, events: mpsc::UnboundedSender<AgentMessage>) {
    loop {
        let op = match job.suspension.pending.lock() {
            Ok(mut p) => match p.ops.pop_front() {
                Some(op) => op,
                None => {
                    p.draining = false;
                    return;
                }
            },
            Err(_) => return,
        };
        let id = job.spec.id;
        let msg = match &op {
            Op::Suspend => reply(id, &op, suspend(&job).await, vec![]),
            Op::Resume(alloc) => match resume(&ctx, &job, alloc.as_deref()).await {
                Ok(cgroups) => reply(id, &op, Ok(()), cgroups),
                Err(e) => reply(id, &op, Err(e), vec![]),
            },
        };
        match &msg {
            AgentMessage::Suspended { error: Some(e), .. } | AgentMessage::Resumed { error: Some(e), .. } => {
                tracing::warn!(job = %id, ?op, "{e}")
            }
            _ => tracing::info!(job = %id, ?op, "done"),
        }
        let _ = events.send(msg);
    }
}

/// Why a job was not suspended, resumed or moved here (the error the controller is sent).
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    #[error("job {0} is not running on this node")]
    NotHere(JobId),
    #[error("job {0} did not finish starting here")]
    NotStarted(JobId),
    #[error("job {0} is ending; it is not suspended")]
    Ending(JobId),
    #[error("cannot freeze job {id}: {error}")]
    Freeze { id: JobId, error: Box<dyn std::error::Error + Send + Sync> },
    #[error("cannot thaw job {id}: {error}")]
    Thaw { id: JobId, error: Box<dyn std::error::Error + Send + Sync> },
    #[error("job {id}: resume on {to} sent to the agent of {here}")]
    OtherNode { id: JobId, to: String, here: String },
    #[error("job {id} has sub-cpusets on {here} ({which}); it can resume only on its own CPUs, not move to {cpus}")]
    SubCpusets { id: JobId, here: String, which: String, cpus: String },
    #[error("job {id}: CPUs {cpus} map to no host CPU")]
    NoHostCpus { id: JobId, cpus: String },
    #[error("cannot move job {id} to CPUs {cpus} (host {host}): {error}")]
    Move { id: JobId, cpus: String, host: String, error: Box<dyn std::error::Error + Send + Sync> },
}

fn reply(id: JobId, op: &Op, result: Result<(), SuspendError>, cgroups: Vec<CgroupReport>) -> AgentMessage {
    let error = result.err().map(|e| e.to_string());
    match op {
        Op::Suspend => AgentMessage::Suspended { id, error },
        Op::Resume(_) => AgentMessage::Resumed { id, error, cgroups },
    }
}

/// Freeze the job's cgroup here; its walltime clock stops once the kernel reports it frozen.
pub async fn suspend(job: &JobHandle) -> Result<(), SuspendError> {
    let s = &job.suspension;
    let id = job.spec.id;
    let _gate = s.gate.lock().await;
    if s.ending.load(Ordering::SeqCst) {
        return Err(SuspendError::Ending(id));
    }
    if s.is_suspended() {
        return Ok(());
    }
    let cg = job.cgroup.clone();
    match tokio::task::spawn_blocking(move || cg.freeze()).await {
        Ok(Ok(())) => {
            s.pause();
            Ok(())
        }
        Ok(Err(e)) => Err(SuspendError::Freeze { id, error: e.into() }),
        Err(e) => Err(SuspendError::Freeze { id, error: e.into() }),
    }
}

/// Move the job (when `to` is given) and thaw it. Returns the job's cgroup as the kernel
/// holds it after a move (empty without one). A failed move leaves the job frozen where it
/// was.
pub async fn resume(
    ctx: &JobContext,
    job: &JobHandle,
    to: Option<&NodeAllocation>,
) -> Result<Vec<CgroupReport>, SuspendError> {
    let s = &job.suspension;
    let id = job.spec.id;
    let _gate = s.gate.lock().await;
    let mut reports = vec![];
    if let Some(to) = to {
        reports = relocate(ctx, job, to).await?;
    }
    if !s.is_suspended() {
        // Already running (a repeated resume, or thawed for its end).
        return Ok(reports);
    }
    let cg = job.cgroup.clone();
    match tokio::task::spawn_blocking(move || cg.thaw()).await {
        Ok(Ok(())) => {
            s.unpause();
            Ok(reports)
        }
        Ok(Err(e)) => Err(SuspendError::Thaw { id, error: e.into() }),
        Err(e) => Err(SuspendError::Thaw { id, error: e.into() }),
    }
}

/// Give the job's cpuset the CPUs and memory nodes of `to`. Refused for jobs with sub-cpusets
/// (per-rank ones, or the user's own): their CPUs are inside the job's and would not follow.
async fn relocate(ctx: &JobContext, job: &JobHandle, to: &NodeAllocation) -> Result<Vec<CgroupReport>, SuspendError> {
    let id = job.spec.id;
    let here = &job.spec.allocation.node;
    if to.node != *here {
        return Err(SuspendError::OtherNode { id, to: to.node.to_string(), here: here.to_string() });
    }
    let dir = job.cgroup.cpuset_dir();
    let children = sub_cpusets(&dir);
    if !job.spec.allocation.ranks.is_empty() || !to.ranks.is_empty() || !children.is_empty() {
        let which = if children.is_empty() { "per-rank sub-cpusets".to_string() } else { children.join(", ") };
        return Err(SuspendError::SubCpusets { id, here: here.to_string(), which, cpus: to.cpus.to_list() });
    }
    let limits = |a: &NodeAllocation| JobLimits {
        cpus: ctx.cpumap.cpus(&a.cpus).to_list(),
        mems: ctx.cpumap.mems(&a.mems).to_list(),
        memory_limit_bytes: Some(a.memory_bytes),
        // Kept as the launch set it, as are the denied devices (rules are only added).
        pids_max: None,
        deny_devices: vec![],
    };
    let new = limits(to);
    if new.cpus.is_empty() {
        return Err(SuspendError::NoHostCpus { id, cpus: to.cpus.to_list() });
    }
    let old = job.suspension.allocation().map(|a| limits(&a));
    let cg = job.cgroup.clone();
    let (wanted, mount) = (new.clone(), ctx.cgroups.cpuset_mount());
    let result = tokio::task::spawn_blocking(move || {
        if let Err(e) = cg.update(&wanted) {
            // Back to where it was, so that the cgroup matches what the controller keeps.
            if let Some(old) = old {
                if let Err(e2) = cg.update(&old) {
                    tracing::error!(job = %cg.name(), "cannot restore the cpuset after a failed move: {e2}");
                }
            }
            return Err(Box::<dyn std::error::Error + Send + Sync>::from(e));
        }
        let dir = cg.cpuset_dir();
        Ok(crate::job::cpusets::report(&*cg, &mount, &dir, None, &wanted.cpus, &wanted.mems))
    })
    .await
    .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
    .and_then(|r| r);
    match result {
        Ok(report) => {
            if let Ok(mut p) = job.suspension.pending.lock() {
                p.allocation = to.clone();
            }
            tracing::info!(job = %id, cpus = %new.cpus, mems = %new.mems, "moved to other CPUs");
            Ok(vec![report])
        }
        Err(error) => Err(SuspendError::Move { id, cpus: to.cpus.to_list(), host: new.cpus, error }),
    }
}

/// Names of the cgroups inside the job's cpuset directory.
fn sub_cpusets(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
