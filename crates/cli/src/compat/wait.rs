//! Waiting for jobs to end: `berth wait`, `berth submit --wait`, `sbatch --wait`,
//! `qsub -W block=true`. The controller is asked until every job has ended (as sbatch polls:
//! every 0.2 s at first, backing off to every 2 s); the exit status is the jobs' (the highest
//! of several). The id of an array stands for every task of it (`sbatch --wait -a`: "the
//! highest exit code of any task", as Slurm's); `A_i` for that task alone.
//!
//! Each round asks for the jobs still running one by one while they are few, else lists the
//! active jobs once; a job found ended is fetched once more for its end, never again.

use crate::client::request;
use anyhow::{anyhow, bail, Result};
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest `berth wait --timeout`: a year.
pub const MAX_TIMEOUT_SECS: u64 = 366 * 86_400;

/// `berth wait`'s exit status when `--timeout` ran out first (as timeout(1)'s).
pub const TIMED_OUT: i32 = 124;

/// Below this many jobs left, each is asked for alone; above, the active jobs are listed.
const FEW: usize = 16;

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

/// What to wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub id: JobId,
    /// The id of an array stands for all its tasks (`12`); a task named `12_0` is that task
    /// alone, although its id is the array's.
    pub whole_array: bool,
    /// As the user named it (`12`, `12_0`).
    pub shown: String,
}

impl Target {
    /// A job (or, if `id` is an array's, the whole array) as submitted.
    pub fn submitted(id: JobId) -> Target {
        Target { id, whole_array: true, shown: id.to_string() }
    }
}

/// How one waited-for job or array ended (or stood, when the wait gave up).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// As the user named it (`12`, `12_3`).
    pub name: String,
    /// The job's id (the array's, for an array).
    pub id: JobId,
    /// Whether it has ended (false only when `--timeout` ran out first).
    pub ended: bool,
    /// The job's state; of an array, `completed` if every task completed, else the state of
    /// the task that gives the exit status.
    pub state: JobState,
    /// That job's (task's) exit code and signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The exit status it gives (`ExitRule`; of an array the highest of its tasks'); none
    /// while it has not ended.
    pub exit: Option<i32>,
    /// Of an array: its tasks and how many ended (or stand) in each state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<usize>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub task_states: BTreeMap<&'static str, usize>,
}

/// What a wait found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub jobs: Vec<Outcome>,
    /// Whether the timeout ran out before every job ended.
    pub timed_out: bool,
    /// The exit status: the highest of the jobs', or [`TIMED_OUT`].
    pub exit: i32,
}

/// The outcome of `target` from its jobs' latest records (`members`: one job, or every task
/// of an array in index order).
pub fn outcome(target: &Target, array: bool, members: &[&JobInfo], rule: ExitRule) -> Outcome {
    let ended = members.iter().all(|j| j.state.is_finished());
    // The job giving the status: the highest exit status, the first such task; while some
    // have not ended, the first of those.
    let deciding = if ended {
        members.iter().copied().max_by_key(|j| (job_exit(j, rule), std::cmp::Reverse(j.array_index)))
    } else {
        members.iter().copied().find(|j| !j.state.is_finished())
    };
    let mut task_states = BTreeMap::new();
    if array {
        for j in members {
            *task_states.entry(j.state.as_str()).or_insert(0) += 1;
        }
    }
    let all_completed = members.iter().all(|j| j.state == JobState::Completed);
    Outcome {
        name: target.shown.clone(),
        id: target.id,
        ended,
        state: match deciding {
            Some(_) if ended && all_completed => JobState::Completed,
            Some(j) => j.state,
            None => JobState::Completed,
        },
        exit_code: deciding.and_then(|j| j.exit_code),
        signal: deciding.and_then(|j| j.signal),
        exit: ended.then(|| members.iter().map(|j| job_exit(j, rule)).max().unwrap_or(0)),
        tasks: array.then_some(members.len()),
        task_states,
    }
}

/// The exit status of a wait: [`TIMED_OUT`] if it gave up, else the highest of the jobs'.
pub fn exit_status(jobs: &[Outcome], timed_out: bool) -> i32 {
    if timed_out {
        TIMED_OUT
    } else {
        jobs.iter().filter_map(|o| o.exit).max().unwrap_or(0)
    }
}

/// One line per job: `job 12: completed, exit 0`, `array 15 (3 tasks): 2 completed, 1
/// failed; exit 3`, `job 16: running (not ended)`.
pub fn human(o: &Outcome) -> String {
    let how = match (o.exit_code, o.signal) {
        (Some(c), _) => format!(", exit code {c}"),
        (None, Some(s)) => format!(", signal {s}"),
        _ => String::new(),
    };
    match o.tasks {
        Some(n) => {
            let states: Vec<String> = o.task_states.iter().map(|(s, k)| format!("{k} {s}")).collect();
            let end = match o.exit {
                Some(e) => format!("exit {e}"),
                None => "not ended".into(),
            };
            format!("array {} ({n} task{}): {}; {end}\n", o.name, if n == 1 { "" } else { "s" }, states.join(", "))
        }
        None => match o.exit {
            Some(e) => format!("job {}: {}{how}; exit {e}\n", o.name, o.state.as_str()),
            None => format!("job {}: {} (not ended)\n", o.name, o.state.as_str()),
        },
    }
}

/// Wait until every job has ended; the highest exit status under `rule` (the jobs and
/// arrays were just submitted: an array's id is all its tasks). Interrupting the wait leaves
/// the jobs alone.
pub async fn wait_for(dir: &Path, ids: &[JobId], rule: ExitRule) -> Result<i32> {
    let targets: Vec<Target> = ids.iter().map(|id| Target::submitted(*id)).collect();
    Ok(wait(dir, &targets, rule, None).await?.exit)
}

/// Wait until every target has ended, or `timeout` has passed. A job the controller does
/// not know is an error.
pub async fn wait(dir: &Path, targets: &[Target], rule: ExitRule, timeout: Option<Duration>) -> Result<Report> {
    let start = Instant::now();
    // Each target's jobs, in order (an array's tasks by index).
    let mut members: Vec<(bool, Vec<JobId>)> = Vec::with_capacity(targets.len());
    let mut seen: HashMap<JobId, JobInfo> = HashMap::new();
    let first = super::jobs_by_id(dir, &targets.iter().map(|t| t.id).collect::<Vec<_>>()).await?;
    for t in targets {
        let j = first
            .iter()
            .find(|j| j.id == t.id)
            .ok_or_else(|| anyhow!("job {} does not exist (`berth jobs --all` lists jobs)", t.shown))?;
        let tasks =
            if t.whole_array && j.array_job == Some(t.id) { array_tasks(dir, j).await? } else { vec![j.clone()] };
        members.push((t.whole_array && j.array_job == Some(t.id), tasks.iter().map(|j| j.id).collect()));
        for j in tasks {
            seen.insert(j.id, j);
        }
    }
    let mut pause = Duration::from_millis(200);
    let timed_out = loop {
        let left: Vec<JobId> = {
            let mut v: Vec<JobId> = seen.values().filter(|j| !j.state.is_finished()).map(|j| j.id).collect();
            v.sort_unstable();
            v
        };
        if left.is_empty() {
            break false;
        }
        let waited = start.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            break true;
        }
        let nap = match timeout {
            Some(t) => pause.min(t - waited),
            None => pause,
        };
        tokio::time::sleep(nap).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(2));
        for j in refresh(dir, &left).await? {
            seen.insert(j.id, j);
        }
    };
    let jobs: Vec<Outcome> = targets
        .iter()
        .zip(&members)
        .map(|(t, (array, ids))| {
            let latest: Vec<&JobInfo> = ids.iter().filter_map(|id| seen.get(id)).collect();
            outcome(t, *array, &latest, rule)
        })
        .collect();
    let exit = exit_status(&jobs, timed_out);
    Ok(Report { jobs, timed_out, exit })
}

/// The latest records of `ids`, jobs not yet seen ended: asked for one by one when few; else
/// the active jobs listed once, and those no longer among them fetched for their end.
async fn refresh(dir: &Path, ids: &[JobId]) -> Result<Vec<JobInfo>> {
    let mut gone: Vec<JobId> = Vec::new();
    let mut out = Vec::with_capacity(ids.len());
    if ids.len() <= FEW {
        gone.extend_from_slice(ids);
    } else {
        let active = list(dir, false).await?;
        let by_id: HashMap<JobId, &JobInfo> = active.iter().map(|j| (j.id, j)).collect();
        for id in ids {
            match by_id.get(id) {
                Some(j) => out.push((*j).clone()),
                None => gone.push(*id),
            }
        }
    }
    if gone.len() > FEW {
        // Many ended at once: the latest finished jobs in one answer first.
        let all = list(dir, true).await?;
        let by_id: HashMap<JobId, &JobInfo> = all.iter().map(|j| (j.id, j)).collect();
        gone.retain(|id| match by_id.get(id) {
            Some(j) => {
                out.push((*j).clone());
                false
            }
            None => true,
        });
    }
    let found = super::jobs_by_id(dir, &gone).await?;
    if let Some(lost) = gone.iter().find(|id| !found.iter().any(|j| j.id == **id)) {
        bail!("job {lost} is no longer known to the controller; its end is not known");
    }
    out.extend(found);
    Ok(out)
}

async fn list(dir: &Path, all: bool) -> Result<Vec<JobInfo>> {
    match request(dir, ClientRequest::ListJobs { states: vec![], all }).await? {
        ClientResponse::Jobs { jobs } => Ok(jobs),
        _ => bail!("unexpected answer"),
    }
}

/// Every task of the array whose first task is `first` (their ids are consecutive from it),
/// in index order.
async fn array_tasks(dir: &Path, first: &JobInfo) -> Result<Vec<JobInfo>> {
    let array = first.id;
    let count = u64::from(first.array_count.unwrap_or(1).max(1));
    let ids: Vec<JobId> = (array.0..array.0 + count).map(JobId).collect();
    let mut tasks = vec![first.clone()];
    tasks.extend(refresh(dir, &ids[1..]).await?);
    match first.array_count {
        Some(_) => tasks.retain(|j| j.array_job == Some(array)),
        // A controller that does not say how many: the tasks it lists (active, and the latest
        // finished jobs).
        None => {
            tasks = list(dir, true).await?.into_iter().filter(|j| j.array_job == Some(array)).collect();
        }
    }
    tasks.sort_by_key(|j| (j.array_index, j.id));
    Ok(tasks)
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

    fn task(index: u32, state: &str, exit_code: Option<i32>, signal: Option<i32>) -> JobInfo {
        let mut j = job(state, exit_code, signal);
        j.id = JobId(20 + u64::from(index));
        (j.array_job, j.array_index) = (Some(JobId(20)), Some(index));
        j
    }

    #[test]
    fn an_array_ends_with_its_highest_task_status() {
        let t = Target::submitted(JobId(20));
        let tasks =
            [task(0, "completed", Some(0), None), task(1, "failed", Some(3), None), task(2, "failed", Some(1), None)];
        let o = outcome(&t, true, &tasks.iter().collect::<Vec<_>>(), ExitRule::Shell);
        assert_eq!((o.ended, o.state, o.exit_code, o.exit), (true, JobState::Failed, Some(3), Some(3)));
        assert_eq!(o.tasks, Some(3));
        assert_eq!(o.task_states, BTreeMap::from([("completed", 1), ("failed", 2)]));
        assert_eq!(human(&o), "array 20 (3 tasks): 1 completed, 2 failed; exit 3\n");

        let done = [task(0, "completed", Some(0), None), task(1, "completed", Some(0), None)];
        let o = outcome(&t, true, &done.iter().collect::<Vec<_>>(), ExitRule::Slurm);
        assert_eq!((o.state, o.exit), (JobState::Completed, Some(0)));

        // Not ended: the first task still going decides the state; no exit status.
        let going =
            [task(0, "completed", Some(0), None), task(1, "running", None, None), task(2, "queued", None, None)];
        let o = outcome(&t, true, &going.iter().collect::<Vec<_>>(), ExitRule::Shell);
        assert_eq!((o.ended, o.state, o.exit), (false, JobState::Running, None));
        assert_eq!(human(&o), "array 20 (3 tasks): 1 completed, 1 queued, 1 running; not ended\n");
        assert_eq!(exit_status(&[o], true), TIMED_OUT);
    }

    #[test]
    fn one_job_and_several() {
        let one = |state: &str, code: Option<i32>, signal: Option<i32>, name: &str| {
            let t = Target { id: JobId(7), whole_array: false, shown: name.into() };
            outcome(&t, false, &[&job(state, code, signal)], ExitRule::Shell)
        };
        let a = one("failed", Some(3), None, "7");
        assert_eq!(human(&a), "job 7: failed, exit code 3; exit 3\n");
        assert!(a.tasks.is_none() && a.task_states.is_empty());
        let b = one("timeout", None, Some(15), "7_1");
        assert_eq!(human(&b), "job 7_1: timeout, signal 15; exit 143\n");
        let c = one("completed", Some(0), None, "8");
        assert_eq!(exit_status(std::slice::from_ref(&c), false), 0);
        assert_eq!(exit_status(&[a.clone(), c.clone()], false), 3, "the highest of several");
        assert_eq!(exit_status(&[a, b, c], false), 143);
        assert_eq!(human(&one("running", None, None, "9")), "job 9: running (not ended)\n");
    }
}
