//! Who may use the task API and what a request may ask: the caller as the kernel names it,
//! the job's owner and cgroup checked ([`authorize`], [`identified`]), a spawn request's
//! node, count, command and directory checked ([`check_spawn`]), and the refusals
//! ([`TaskRefusal`]) a caller is told.

use crate::ports::{JobContext, JobHandle};
use berth_core::JobId;
use berth_protocol::step::TaskReply;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Copies one `spawn` may start.
pub const MAX_SPAWN: u32 = 1024;

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
pub(super) fn authorize(ctx: &JobContext, caller: Caller, id: JobId) -> Result<Arc<JobHandle>, TaskRefusal> {
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

/// Whether `caller` is known here: root, or a process of a job running on this node.
pub(super) fn identified(ctx: &JobContext, caller: Caller) -> bool {
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

pub(super) fn error(message: impl Into<String>) -> TaskReply {
    TaskReply::Error { message: message.into() }
}

pub(super) struct SpawnAsk {
    pub(super) node: u32,
    pub(super) argv: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) cwd: String,
    pub(super) count: u32,
    pub(super) output: String,
    pub(super) error: String,
}

/// Check a spawn request against the job: the node index, the copies, the command.
pub(super) fn check_spawn(job: &JobHandle, ask: &SpawnAsk) -> Result<(), TaskRefusal> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
