//! Waiting for jobs to end: `sbatch --wait`, `qsub -W block=true`, `berth submit --wait`.
//! The controller is asked for each job until every one has finished (as sbatch polls); the
//! exit status is the jobs' (the worst of several).

use anyhow::{bail, Result};
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::JobInfo;
use std::path::Path;
use std::time::Duration;

/// How a finished job's end becomes the waiting command's exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitRule {
    /// sbatch's: the job's exit code when it exited, else 1 (killed by a signal, cancelled,
    /// timed out, never started).
    Slurm,
    /// The shell's (berth, qsub): the exit code, 128+N for signal N, else 1.
    Shell,
}

/// The exit status a finished job gives a command that waited for it.
pub fn job_exit(j: &JobInfo, rule: ExitRule) -> i32 {
    match (j.exit_code, j.signal, rule) {
        (Some(c), None, _) => c.clamp(0, 255),
        (_, Some(s), ExitRule::Shell) => (128 + s).clamp(1, 255),
        _ if j.state == JobState::Completed => 0,
        _ => 1,
    }
}

/// Wait until every job has finished; the worst exit status under `rule`. A job the
/// controller no longer knows is an error. Interrupting the wait leaves the jobs alone.
pub async fn wait_for(dir: &Path, ids: &[JobId], rule: ExitRule) -> Result<i32> {
    let mut pause = Duration::from_millis(200);
    loop {
        let jobs = super::jobs_by_id(dir, ids).await?;
        if let Some(gone) = ids.iter().find(|id| !jobs.iter().any(|j| j.id == **id)) {
            bail!("job {gone} is no longer known to the controller; its end is not known");
        }
        if jobs.iter().all(|j| j.state.is_finished()) {
            return Ok(jobs.iter().map(|j| job_exit(j, rule)).max().unwrap_or(0));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, exit_code: Option<i32>, signal: Option<i32>) -> JobInfo {
        serde_json::from_value(serde_json::json!({
            "id": 7, "name": "j", "user": "ann", "uid": 1000, "gid": 1000, "state": state,
            "queue": "batch", "request": {"nodes": null, "cores": 1, "tasks_per_node": null,
            "cpus_per_task": null, "mem_per_node": null, "mem_per_cpu": null, "threads": false},
            "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
            "allocation": [], "exit_code": exit_code, "signal": signal, "reason": null,
            "cwd": "/tmp", "stdout": "/tmp/o", "stderr": "/tmp/e", "accounting": null
        }))
        .unwrap()
    }

    #[test]
    fn exit_status_of_a_finished_job() {
        use ExitRule::*;
        assert_eq!(job_exit(&job("completed", Some(0), None), Slurm), 0);
        assert_eq!(job_exit(&job("failed", Some(3), None), Slurm), 3);
        assert_eq!(job_exit(&job("failed", Some(3), None), Shell), 3);
        // Killed by SIGTERM (timeout, cancel): sbatch says 1, a shell 143.
        assert_eq!(job_exit(&job("timeout", None, Some(15)), Slurm), 1);
        assert_eq!(job_exit(&job("timeout", None, Some(15)), Shell), 143);
        // Cancelled before it started: no status at all.
        assert_eq!(job_exit(&job("cancelled", None, None), Slurm), 1);
        assert_eq!(job_exit(&job("cancelled", None, None), Shell), 1);
        assert_eq!(job_exit(&job("completed", None, None), Shell), 0);
        assert_eq!(job_exit(&job("failed", Some(300), None), Shell), 255);
    }
}
