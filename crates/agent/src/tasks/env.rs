//! What a task is given: its environment (the caller's, without what belongs to the caller's
//! own rank or step, plus the task's and the node's variables) and its output paths.

use berth_core::JobId;
use std::path::Path;

pub(super) const DEFAULT_OUTPUT: &str = "berth-task-%j.%t.out";
pub(super) const DEFAULT_ERROR: &str = "berth-task-%j.%t.err";
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
pub(super) fn absolute(path: &str, cwd: &str) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        Path::new(cwd).join(path).display().to_string()
    }
}

pub(super) fn set_vars(env: &mut Vec<(String, String)>, vars: Vec<(&str, String)>) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
