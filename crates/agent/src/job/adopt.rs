//! Re-adoption after an agent restart: the jobs still running in this agent's cgroups are
//! followed again (found by cgroup, described by their record, see `records.rs`), the jobs
//! that ended while the agent was down are reported with their exit status (written by the
//! shim, see `shim.rs`), and what belongs to no recorded job is killed and removed.
//!
//! What does not survive a restart (docs/protocol/02-agent.md, "Agent restart"):
//! - time a job spent suspended before the restart counts against its walltime (the
//!   remaining walltime is the walltime less the wall-clock time since the job started); a
//!   job found frozen is suspended again from the restart on;
//! - a resume that moved the job to other CPUs is forgotten: the job keeps its cgroup (and
//!   so its CPUs), but the agent knows only the launch's allocation;
//! - the ranks of `berth run` steps and the tasks of `berth task` running at the restart
//!   lost their shepherd (it lived in the agent): they are killed.

use crate::cgroup::{CgroupBackend, JobCgroup};
use crate::job::shim::Status;
use crate::job::{cgroup_name, cleanup, cleanup_blocking, follow, outcome_of, Ended, Script, UNKNOWN_STATUS};
use crate::ports::suspension::Suspension;
use crate::ports::{JobContext, JobHandle};
use crate::records::{now_unix_ms, proc_parent, proc_start_time, LocalJobRecord, Records};
use berth_core::job::JobOutcome;
use berth_core::JobId;
use std::collections::BTreeSet;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long killing a job's leftovers may take.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// What a starting agent found of an earlier one.
#[derive(Default)]
pub struct Recovered {
    /// Jobs still running in their cgroups: follow them again with [`run`].
    pub adopted: Vec<(LocalJobRecord, Arc<dyn JobCgroup>)>,
    /// Ended jobs whose end the controller has not acknowledged: those that ended before the
    /// restart, and those whose cgroup was gone at the restart.
    pub ended: Vec<(JobId, JobOutcome)>,
}

/// Sort the leftovers of an earlier agent: adopt the recorded jobs still running in their
/// cgroup; record as ended (and clean up) those whose batch script ended or whose cgroup is
/// gone; kill and remove the cgroups and spool directories of no recorded job.
pub fn recover(backend: &dyn CgroupBackend, spool_root: &Path, records: Option<&Records>) -> Recovered {
    let (jobs, mut ended) = match records {
        Some(r) => (r.load_jobs(), r.load_ended()),
        None => (vec![], vec![]),
    };
    let ended_ids: BTreeSet<JobId> = ended.iter().map(|(id, _)| *id).collect();
    let present: BTreeSet<String> = backend.list().unwrap_or_default().into_iter().collect();
    let mut adopted: Vec<(LocalJobRecord, Arc<dyn JobCgroup>)> = vec![];
    for rec in jobs {
        let id = rec.spec.id;
        if ended_ids.contains(&id) {
            continue; // its end is recorded: reported as it is
        }
        let cg = match rec.cgroup == cgroup_name(id) && present.contains(&rec.cgroup) {
            true => backend.open(&rec.cgroup).ok().flatten(),
            false => None,
        };
        let runs_script = rec.spec.head && !rec.spec.script.is_empty();
        let shim_alive = rec.shim_pid.is_some_and(|pid| alive(pid, rec.shim_start_time));
        match cg {
            Some(cg) if !runs_script || shim_alive => {
                tracing::info!(job = %id, cgroup = %rec.cgroup, "re-adopting a job of an earlier agent");
                adopted.push((rec, Arc::from(cg)));
            }
            found => {
                // Its batch script ended, or its cgroup is gone (killed): it ended while no
                // agent ran here. What is left of it goes.
                let outcome = gone_outcome(&rec);
                let outcome = match found {
                    Some(cg) => cleanup_blocking(id, &*cg, &rec.spool, rec.spec.pids_max, outcome),
                    None => {
                        let _ = std::fs::remove_dir_all(&rec.spool);
                        outcome
                    }
                };
                tracing::warn!(job = %id, ?outcome, "the job ended while the agent was down");
                if let Some(r) = records {
                    if let Err(e) = r.save_ended(id, &outcome) {
                        tracing::warn!(job = %id, "cannot record the job's end: {e}");
                    }
                }
                ended.push((id, outcome));
            }
        }
    }
    let kept: BTreeSet<&str> = adopted.iter().map(|(r, _)| r.cgroup.as_str()).collect();
    for stale in present.iter().filter(|n| !kept.contains(n.as_str())) {
        if let Ok(Some(cg)) = backend.open(stale) {
            tracing::warn!(cgroup = %stale, "removing a job cgroup left by an earlier agent (no record of its job)");
            let _ = cg.kill_all(KILL_DEADLINE);
            let _ = cg.remove();
        }
    }
    let spools: BTreeSet<PathBuf> = adopted.iter().map(|(r, _)| r.spool.clone()).collect();
    if let Ok(entries) = std::fs::read_dir(spool_root) {
        // The launcher link is the agent's own (made again at start: crate::launcher).
        let ours = |e: &std::fs::DirEntry| e.file_name() == crate::launcher::RSH_NAME;
        for e in entries.flatten().filter(|e| !spools.contains(&e.path()) && !ours(e)) {
            tracing::warn!(dir = %e.path().display(), "removing a job directory left by an earlier agent");
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Recovered { adopted, ended }
}

/// The outcome of a recorded job found without its cgroup.
fn gone_outcome(rec: &LocalJobRecord) -> JobOutcome {
    // The script ended when its shim wrote the status file; without one, the end is now.
    let ended_ms = std::fs::metadata(rec.spool.join(crate::job::shim::STATUS_FILE))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or_else(now_unix_ms);
    let wall_ms = ended_ms.saturating_sub(rec.started_unix_ms);
    let runs_script = rec.spec.head && !rec.spec.script.is_empty();
    let ended = match runs_script.then(|| Status::read(&rec.spool)).flatten() {
        Some(s) => Ended::Status(s),
        None => Ended::Unknown,
    };
    let mut out = outcome_of(&rec.spec, ended, None, wall_ms);
    if !runs_script {
        out.reason = Some(UNKNOWN_STATUS.into());
    }
    out
}

/// Follow a re-adopted job to its end, as `run_job` follows a launched one: its shim is
/// watched through a pidfd (or found gone), what is left of its walltime enforced, kill
/// requests honoured; then the same cleanup.
pub async fn run(
    rec: LocalJobRecord,
    cg: Arc<dyn JobCgroup>,
    ctx: Arc<JobContext>,
    mut kill: mpsc::UnboundedReceiver<String>,
) -> JobOutcome {
    let id = rec.spec.id;
    let elapsed = Duration::from_millis(now_unix_ms().saturating_sub(rec.started_unix_ms));
    let started = Instant::now().checked_sub(elapsed).unwrap_or_else(Instant::now);
    // Time suspended before the restart is not known here: it counts against the walltime.
    let walltime = rec.spec.walltime_seconds.map(|w| Duration::from_secs(w).saturating_sub(elapsed));
    let suspension = Arc::new(Suspension::new(rec.spec.allocation.clone()));
    let cg2 = cg.clone();
    if let Ok(Ok(true)) = tokio::task::spawn_blocking(move || cg2.is_frozen()).await {
        tracing::info!(job = %id, "the re-adopted job is suspended (its cgroup is frozen)");
        suspension.adopt_frozen();
    }
    let runs_script = rec.spec.head && !rec.spec.script.is_empty();
    let script = runs_script.then(|| match rec.shim_pid.and_then(|pid| open_shim(pid, rec.shim_start_time)) {
        Some(pidfd) => Script::Adopted { pidfd, spool: rec.spool.clone() },
        None => Script::Gone { spool: rec.spool.clone() },
    });
    let shim = match &script {
        Some(Script::Adopted { .. }) => rec.shim_pid,
        _ => None,
    };
    let cg2 = cg.clone();
    let _ = tokio::task::spawn_blocking(move || kill_unshepherded(id, &*cg2, shim)).await;
    let job = Arc::new(JobHandle {
        spec: rec.spec.clone(),
        cgroup: cg.clone(),
        spool: rec.spool.clone(),
        cpuset_dir: rec.cpuset_dir.clone(),
        steps: Default::default(),
        tasks: Default::default(),
        suspension,
    });
    let outcome = follow(&ctx, job, script, &mut kill, started, walltime).await;
    cleanup(&ctx, &rec.spec, cg, &rec.spool, outcome).await
}

/// Whether the recorded shim still runs: same pid, same start time, not a zombie.
fn alive(pid: i32, start_time: Option<u64>) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let zombie = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) == Some("Z");
    !zombie && start_time.is_some() && crate::records::parse_start_time(&stat) == start_time
}

/// A pidfd of the recorded shim, if that process still exists (same pid, same start time).
fn open_shim(pid: i32, start_time: Option<u64>) -> Option<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just returned to us, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // The pidfd pins the process now: it is the shim only if it started when the shim did.
    if start_time.is_none() || proc_start_time(pid) != start_time {
        return None;
    }
    // SAFETY: the AsyncFd owns the descriptor, open and unchanged for as long as it lives.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

/// Kill the processes of the job that an earlier agent started for steps (`berth run` ranks,
/// `BERTH_STEP_ID`) and tasks (`berth task`, `BERTH_TASK_ID`): their shepherd lived in that
/// agent. Descendants of the batch script's shim (`shim`) are the script's own and are kept.
fn kill_unshepherded(id: JobId, cg: &dyn JobCgroup, shim: Option<i32>) {
    let Ok(pids) = cg.pids() else { return };
    let orphans: Vec<i32> =
        pids.into_iter().filter(|&p| Some(p) != shim && !descends_from(p, shim) && started_by_agent(p)).collect();
    if orphans.is_empty() {
        return;
    }
    tracing::warn!(job = %id, ?orphans, "killing step ranks and tasks whose shepherd died with the earlier agent");
    for pid in orphans {
        // SAFETY: kill(2) on a process of the job's cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn descends_from(mut pid: i32, ancestor: Option<i32>) -> bool {
    let Some(ancestor) = ancestor else { return false };
    for _ in 0..256 {
        match proc_parent(pid) {
            Some(p) if p == ancestor => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// Whether the process was started by an agent for a step or a task (its initial environment).
fn started_by_agent(pid: i32) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
    env.split(|b| *b == 0).any(|v| v.starts_with(b"BERTH_STEP_ID=") || v.starts_with(b"BERTH_TASK_ID="))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descent_and_environment() {
        let me = std::process::id() as i32;
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(descends_from(me, Some(parent)));
        assert!(!descends_from(me, Some(me)));
        assert!(!descends_from(me, None));
        let mut child = std::process::Command::new("sleep").arg("5").env("BERTH_STEP_ID", "3").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(descends_from(pid, Some(me)));
        // The kernel fills /proc/PID/environ a moment after spawn returns (the vfork parent
        // resumes before the new image's stack is set up): wait for it, bounded.
        let t0 = Instant::now();
        while std::fs::read(format!("/proc/{pid}/environ")).map(|e| e.is_empty()).unwrap_or(true) {
            assert!(t0.elapsed() < Duration::from_secs(5), "no environment for {pid}");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(started_by_agent(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut plain = std::process::Command::new("sleep").arg("5").env_remove("BERTH_STEP_ID").spawn().unwrap();
        assert!(!started_by_agent(plain.id() as i32) || std::env::var_os("BERTH_TASK_ID").is_some());
        plain.kill().unwrap();
        plain.wait().unwrap();
    }

    #[test]
    fn shim_identity_is_checked() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(alive(pid, proc_start_time(pid)));
        assert!(!alive(pid, proc_start_time(pid).map(|s| s + 1)) && !alive(pid, None));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let start = proc_start_time(pid);
            assert!(open_shim(pid, start).is_some());
            assert!(open_shim(pid, start.map(|s| s + 1)).is_none(), "another process with that pid");
            assert!(open_shim(pid, None).is_none());
        });
        child.kill().unwrap();
        let t0 = Instant::now();
        while alive(pid, proc_start_time(pid)) {
            assert!(t0.elapsed() < Duration::from_secs(5), "a killed child is a zombie, not alive");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        rt.block_on(async { assert!(open_shim(pid, proc_start_time(pid)).is_none(), "gone") });
    }
}
