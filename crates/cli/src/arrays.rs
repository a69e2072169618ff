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
    Ok(resolve_tasks(dir, given, parse).await?.0)
}

/// [`resolve`], with the ids that were given as `A_i`: those name one task, even the first
/// (whose id is its array's), where `A` names every task (a request's `only`).
pub async fn resolve_tasks(
    dir: &Path,
    given: &[String],
    parse: impl Fn(&str) -> Result<JobId>,
) -> Result<(Vec<JobId>, Vec<JobId>)> {
    let mut lists: Vec<Vec<JobInfo>> = Vec::new();
    let mut out = Vec::with_capacity(given.len());
    let mut only = Vec::new();
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
        let task = found.ok_or_else(|| anyhow!("job {array}_{index} does not exist; `berth jobs --all` lists jobs"))?;
        out.push(task);
        only.push(task);
    }
    Ok((out, only))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids() {
        assert_eq!(split_task("12_3"), Some((JobId(12), 3)));
        assert_eq!(split_task("12_3.server"), Some((JobId(12), 3)));
        for bad in ["12", "_3", "12_", "0_1", "12_x", "a_1"] {
            assert_eq!(split_task(bad), None, "{bad}");
        }
    }
}
