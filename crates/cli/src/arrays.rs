//! Job arrays as users name them: a task is shown `A_i` (its array's id, its index), and
//! `A_i` is accepted wherever a job id is (`berth cancel`, `scancel`), resolved through the
//! controller's job list.

use crate::client::request;
use anyhow::{anyhow, bail, Result};
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo};
use std::path::Path;

/// A job's id as shown: `A_i` for a task of array A, else the id.
pub fn shown_id(j: &JobInfo) -> String {
    match (j.array_job, j.array_index) {
        (Some(a), Some(i)) => format!("{a}_{i}"),
        _ => j.id.to_string(),
    }
}

/// squeue's lines: the queued tasks of an array waiting for the same reason are one line, the
/// first's, shown `A_[1-3,5%2]` (indexes folded, the running limit after `%`), as Slurm does;
/// every other job is its own line, `None`: its own id.
pub fn fold_queued(jobs: &[JobInfo]) -> Vec<(&JobInfo, Option<String>)> {
    use std::collections::HashMap;
    let key = |j: &JobInfo| -> Option<(JobId, String)> {
        let a = j.array_job.filter(|_| j.state == berth_core::job::JobState::Queued && j.array_index.is_some())?;
        Some((a, crate::compat::format::slurm_reason(j)))
    };
    let mut groups: HashMap<(JobId, String), Vec<u32>> = HashMap::new();
    for j in jobs {
        if let (Some(k), Some(i)) = (key(j), j.array_index) {
            groups.entry(k).or_default().push(i);
        }
    }
    let mut out = Vec::with_capacity(jobs.len());
    for j in jobs {
        let Some(k) = key(j) else {
            out.push((j, None));
            continue;
        };
        match groups.remove(&k) {
            // The group's first line stands for all of it; the others are left out.
            Some(mut indexes) if indexes.len() > 1 => {
                indexes.sort_unstable();
                let limit = j.array_limit.map(|l| format!("%{l}")).unwrap_or_default();
                out.push((j, Some(format!("{}_[{}{limit}]", k.0, berth_core::directives::array::fold(&indexes)))));
            }
            Some(_) => out.push((j, None)),
            None => {}
        }
    }
    out
}

/// `A_i` (also `A_i.server`): the array's id and the task's index.
pub fn split_task(s: &str) -> Option<(JobId, u32)> {
    let head = s.trim().split('.').next()?;
    let (a, i) = head.split_once('_')?;
    let a = a.parse::<u64>().ok().filter(|n| *n > 0)?;
    Some((JobId(a), i.parse::<u32>().ok()?))
}

/// The task `index` of array `array` among `jobs`.
pub fn find_task(jobs: &[JobInfo], array: JobId, index: u32) -> Option<JobId> {
    jobs.iter().find(|j| j.array_job == Some(array) && j.array_index == Some(index)).map(|j| j.id)
}

/// Ids as given (`N`, `N.server`, `A_i`): the tasks' own ids looked up (active jobs first,
/// then finished ones); `parse` reads the other forms.
pub async fn resolve(dir: &Path, given: &[String], parse: impl Fn(&str) -> Result<JobId>) -> Result<Vec<JobId>> {
    let mut lists: Vec<Vec<JobInfo>> = Vec::new();
    let mut out = Vec::with_capacity(given.len());
    for s in given {
        let Some((array, index)) = split_task(s) else {
            out.push(parse(s)?);
            continue;
        };
        // lists[0]: the active jobs, lists[1]: with finished ones; each fetched once.
        let mut found = None;
        for (k, all) in [(0, false), (1, true)] {
            if lists.len() <= k {
                let ClientResponse::Jobs { jobs } =
                    request(dir, ClientRequest::ListJobs { states: vec![], all }).await?
                else {
                    bail!("unexpected answer")
                };
                lists.push(jobs);
            }
            found = find_task(&lists[k], array, index);
            if found.is_some() {
                break;
            }
        }
        out.push(found.ok_or_else(|| anyhow!("job {array}_{index} does not exist; `berth jobs --all` lists jobs"))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_tasks_fold_into_one_line() {
        let task = |id: u64, i: u32, state: &str| -> JobInfo {
            let mut j: JobInfo = serde_json::from_value(serde_json::json!({
                "id": id, "name": "a", "user": "ann", "uid": 1, "gid": 1, "state": state, "queue": "batch",
                "request": {"nodes": null, "cores": 1, "tasks_per_node": null, "cpus_per_task": null,
                "mem_per_node": null, "mem_per_cpu": null, "threads": false},
                "walltime_seconds": 60, "submit_time": 0.0, "start_time": null, "end_time": null,
                "allocation": [], "exit_code": null, "signal": null, "reason": "JobArrayTaskLimit: ...",
                "cwd": "/", "stdout": "/o", "stderr": "/e", "accounting": null
            }))
            .unwrap();
            (j.array_job, j.array_index, j.array_limit) = (Some(JobId(10)), Some(i), Some(2));
            j
        };
        let mut plain = task(9, 0, "queued");
        (plain.array_job, plain.array_index) = (None, None);
        let jobs =
            vec![plain, task(10, 1, "running"), task(11, 2, "queued"), task(12, 3, "queued"), task(13, 5, "queued")];
        let shown: Vec<String> =
            fold_queued(&jobs).into_iter().map(|(j, id)| id.unwrap_or_else(|| shown_id(j))).collect();
        assert_eq!(shown, vec!["9", "10_1", "10_[2-3,5%2]"]);
        let one = vec![task(11, 2, "queued")];
        assert_eq!(fold_queued(&one)[0].1, None, "a lone task keeps its own id");
    }

    #[test]
    fn task_ids() {
        assert_eq!(split_task("12_3"), Some((JobId(12), 3)));
        assert_eq!(split_task("12_3.server"), Some((JobId(12), 3)));
        for bad in ["12", "_3", "12_", "0_1", "12_x", "a_1"] {
            assert_eq!(split_task(bad), None, "{bad}");
        }
    }
}
