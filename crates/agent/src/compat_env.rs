//! The Slurm and PBS variables of a job's processes, beside berth's own (docs/compat.md,
//! "Environment"): the batch script's, a step's and its ranks', a task's. Built from plain
//! values (the launch, the step grant); set only when the launch carries `compat` (the
//! controller's `[compat] environment`, on by default).

use berth_protocol::agent::{CompatEnv, LaunchSpec};
use berth_protocol::step::StepGrant;

/// Variables to set, in order.
pub type Vars = Vec<(&'static str, String)>;

/// The name of the PBS node file in the job's spool when berth's own (one line per core)
/// does not serve: jobs with more than one CPU per task (PBS writes one line per task).
pub const PBS_NODEFILE: &str = "pbs_nodefile";

/// Variables a step or rank sets that a task started from it must not inherit.
pub const STEP_ONLY: &[&str] = &[
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_GPUS",
];

/// Whether `name` is one of the variables set here only in some cases: the batch script
/// does not take it from the submitter's environment (a job submitted from another job's
/// rank would otherwise carry that rank's `SLURM_PROCID`, or its `SLURM_CPUS_PER_TASK`).
pub fn not_from_submitter(name: &str) -> bool {
    STEP_ONLY.contains(&name)
        || [
            "SLURM_CPUS_PER_TASK",
            "SLURM_NTASKS_PER_NODE",
            "SLURM_JOB_GPUS",
            "SLURM_GPUS_ON_NODE",
            "PBS_NODEFILE",
            "PBS_GPUFILE",
            "PBS_TASKNUM",
            "PBS_NODENUM",
        ]
        .contains(&name)
}

fn cpus_per_task(compat: &CompatEnv) -> u32 {
    compat.cpus_per_task.unwrap_or(1).max(1)
}

/// Tasks on `cores` cores: one per `--cpus-per-task` CPUs, at least one.
fn tasks(cores: u32, compat: &CompatEnv) -> u32 {
    (cores / cpus_per_task(compat)).max(1)
}

/// The job's tasks over all its nodes (`SLURM_NTASKS`, `PBS_NP`, the PBS node file's lines).
pub fn job_tasks(spec: &LaunchSpec, compat: &CompatEnv) -> u64 {
    node_tasks(spec, compat).iter().sum()
}

/// The job's tasks on each of its nodes: one per `--cpus-per-task` CPUs, or, for an
/// `--exclusive` job, the tasks it asked for on its whole nodes (so many per node when it
/// gave that, else filling each node's CPUs in order), as Slurm lays them out.
pub fn node_tasks(spec: &LaunchSpec, compat: &CompatEnv) -> Vec<u64> {
    let Some(asked) = compat.tasks else {
        return spec.nodes.iter().map(|(_, cores)| u64::from(tasks(*cores, compat))).collect();
    };
    let mut left = u64::from(asked.total);
    spec.nodes
        .iter()
        .map(|(_, cores)| {
            let room = asked.per_node.map_or(u64::from(cores / cpus_per_task(compat)), u64::from);
            let here = room.min(left);
            left -= here;
            here
        })
        .collect()
}

/// Counts per node in Slurm's form, runs folded: 2, 2, 2, 1 is `2(x3),1`
/// (`SLURM_TASKS_PER_NODE`, which MPI launchers read for their slots).
pub fn per_node(counts: impl IntoIterator<Item = u64>) -> String {
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for c in counts {
        match runs.last_mut() {
            Some((v, n)) if *v == c => *n += 1,
            _ => runs.push((c, 1)),
        }
    }
    let text: Vec<String> =
        runs.into_iter().map(|(v, n)| if n == 1 { v.to_string() } else { format!("{v}(x{n})") }).collect();
    text.join(",")
}

/// This node's index in the job's node list (0 on the node that runs the script).
pub fn node_index(spec: &LaunchSpec) -> usize {
    spec.nodes.iter().position(|(n, _)| *n == spec.allocation.node).unwrap_or(0)
}

/// The job's own variables on node `node` (its index in the job) holding `cpus_on_node`
/// CPUs (PUs) there.
pub fn job_vars(spec: &LaunchSpec, compat: &CompatEnv, node: usize, cpus_on_node: usize) -> Vars {
    let id = spec.id.to_string();
    let nodelist = berth_core::hostlist::compress(&spec.nodes.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>());
    let nnodes = spec.nodes.len().to_string();
    let ntasks = job_tasks(spec, compat).to_string();
    let mut vars: Vars = vec![
        ("SLURM_JOB_ID", id.clone()),
        ("SLURM_JOBID", id.clone()),
        ("SLURM_JOB_NAME", spec.name.clone()),
        ("SLURM_JOB_USER", spec.user.name.clone()),
        ("SLURM_JOB_UID", spec.user.uid.to_string()),
        ("SLURM_JOB_PARTITION", compat.queue.clone()),
        ("SLURM_JOB_NODELIST", nodelist.clone()),
        ("SLURM_NODELIST", nodelist),
        ("SLURM_JOB_NUM_NODES", nnodes.clone()),
        ("SLURM_NNODES", nnodes),
        ("SLURM_NTASKS", ntasks.clone()),
        ("SLURM_NPROCS", ntasks.clone()),
        ("SLURM_TASKS_PER_NODE", per_node(node_tasks(spec, compat))),
        ("SLURM_CPUS_ON_NODE", cpus_on_node.to_string()),
        ("SLURM_NODEID", node.to_string()),
        ("SLURM_SUBMIT_DIR", spec.cwd.clone()),
        ("PBS_JOBID", id),
        ("PBS_JOBNAME", spec.name.clone()),
        ("PBS_O_WORKDIR", spec.cwd.clone()),
        ("PBS_QUEUE", compat.queue.clone()),
        ("PBS_NP", ntasks),
        ("PBS_ENVIRONMENT", if spec.script.is_empty() { "PBS_INTERACTIVE" } else { "PBS_BATCH" }.into()),
    ];
    // As Slurm: only when the job gave them.
    if let Some(c) = compat.cpus_per_task {
        vars.push(("SLURM_CPUS_PER_TASK", c.to_string()));
    }
    if let Some(t) = compat.tasks_per_node {
        vars.push(("SLURM_NTASKS_PER_NODE", t.to_string()));
    }
    // A GPU job's GPUs on this node (berth's indexes, as `BERTH_GPUS`), as Slurm's gres/gpu.
    let gpus = &spec.allocation.gpus;
    if !gpus.is_empty() {
        let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        vars.push(("SLURM_JOB_GPUS", list.join(",")));
        vars.push(("SLURM_GPUS_ON_NODE", gpus.len().to_string()));
    }
    vars
}

/// The PBS node file of the job, on the node that runs its script: `nodefile` (berth's own,
/// one line per core) when a task is one core, else [`PBS_NODEFILE`] ([`pbs_nodefile_text`]);
/// none when a node's name could not be a line of it.
pub fn pbs_nodefile_name(spec: &LaunchSpec, compat: &CompatEnv) -> Option<&'static str> {
    if !spec.nodes.iter().all(|(n, _)| safe_host(n)) {
        return None;
    }
    Some(if cpus_per_task(compat) == 1 && compat.tasks.is_none() { "nodefile" } else { PBS_NODEFILE })
}

/// A host name as a line of a node file: no whitespace, no control characters.
fn safe_host(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The job's hosts one line per task, as PBS's `$PBS_NODEFILE`; only host names.
pub fn pbs_nodefile_text(spec: &LaunchSpec, compat: &CompatEnv) -> String {
    spec.nodes
        .iter()
        .zip(node_tasks(spec, compat))
        .filter(|((n, _), _)| safe_host(n))
        .flat_map(|((n, _), count)| std::iter::repeat_n(n.as_str(), count as usize))
        .fold(String::new(), |mut s, n| {
            s.push_str(n);
            s.push('\n');
            s
        })
}

/// The name of Torque's GPU file in the job's spool (`$PBS_GPUFILE`).
pub const PBS_GPUFILE: &str = "pbs_gpufile";

/// Torque's `$PBS_GPUFILE` of a job holding GPUs: one line per GPU of the job on every node,
/// `<host>-gpu<N>` (N the GPU's index on its node, berth's, as `BERTH_GPUS`), nodes in the
/// job's order; none when the job holds no GPU or a node's name could not be a line of it.
pub fn pbs_gpufile_text(spec: &LaunchSpec) -> Option<String> {
    if spec.node_gpus.iter().all(Vec::is_empty) || !spec.nodes.iter().all(|(n, _)| safe_host(n)) {
        return None;
    }
    let mut text = String::new();
    for ((host, _), gpus) in spec.nodes.iter().zip(&spec.node_gpus) {
        for g in gpus {
            text.push_str(&format!("{host}-gpu{g}\n"));
        }
    }
    Some(text)
}

/// A step's variables on its node `node_index` (index in the grant's nodes), over the job's:
/// srun's, where the counts and the node list are the step's. `gpus`: the step's GPUs on the
/// node (the job's there, berth's indexes), as Slurm's `SLURM_STEP_GPUS`; unset when none.
pub fn step_vars(grant: &StepGrant, node_index: usize, gpus: &[u32]) -> Vars {
    let nodelist = berth_core::hostlist::compress(&grant.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>());
    let (size, nnodes) = (grant.size.to_string(), grant.nodes.len().to_string());
    let tasks_per_node = per_node(grant.nodes.iter().map(|n| n.ranks.len() as u64));
    let mut vars = vec![
        ("SLURM_STEP_ID", grant.step.to_string()),
        ("SLURM_STEPID", grant.step.to_string()),
        ("SLURM_STEP_NUM_TASKS", size.clone()),
        ("SLURM_STEP_NUM_NODES", nnodes.clone()),
        ("SLURM_STEP_NODELIST", nodelist.clone()),
        ("SLURM_STEP_TASKS_PER_NODE", tasks_per_node.clone()),
        ("SLURM_TASKS_PER_NODE", tasks_per_node),
        ("SLURM_NTASKS", size.clone()),
        ("SLURM_NPROCS", size),
        ("SLURM_NNODES", nnodes),
        ("SLURM_NODELIST", nodelist),
        ("SLURM_NODEID", node_index.to_string()),
    ];
    if !gpus.is_empty() {
        let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
        vars.push(("SLURM_STEP_GPUS", list.join(",")));
    }
    vars
}

/// One rank's: its rank in the step and on its node.
pub fn rank_vars(rank: u32, local_rank: usize) -> Vars {
    vec![("SLURM_PROCID", rank.to_string()), ("SLURM_LOCALID", local_rank.to_string())]
}

/// A task's (`berth task spawn`, PBS's TM tasks): its id and its node's index in the job.
pub fn task_vars(task: u64, node: u32) -> Vars {
    vec![("PBS_TASKNUM", task.to_string()), ("PBS_NODENUM", node.to_string()), ("SLURM_NODEID", node.to_string())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: &[(&str, u32)], here: &str) -> LaunchSpec {
        serde_json::from_value(serde_json::json!({
            "id": 42, "name": "my job; $(rm -rf /)\n", "user": {"uid": 1000, "gid": 1000, "groups": [], "name": "ann"},
            "env": [], "cwd": "/home/ann/run", "script": "#!/bin/sh\ntrue\n", "stdout": "/o", "stderr": "/e",
            "allocation": {"node_id": 1, "node": here, "cpus": "0-3", "cores": 4, "mems": "0", "memory_bytes": 1024},
            "nodes": nodes, "walltime_seconds": 60, "kill_grace_ms": 100
        }))
        .unwrap()
    }

    fn get<'a>(vars: &'a Vars, k: &str) -> Option<&'a str> {
        let mut found = vars.iter().filter(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        let v = found.next();
        assert!(found.next().is_none(), "{k} set twice");
        v
    }

    #[test]
    fn job_variables() {
        let s = spec(&[("node1", 4), ("node2", 4), ("node3", 4), ("node10", 4)], "node2");
        let c = CompatEnv { cpus_per_task: Some(2), tasks_per_node: Some(2), queue: "batch".into(), tasks: None };
        let v = job_vars(&s, &c, node_index(&s), 4);
        for (k, want) in [
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOBID", "42"),
            ("SLURM_JOB_NAME", "my job; $(rm -rf /)\n"),
            ("SLURM_JOB_USER", "ann"),
            ("SLURM_JOB_UID", "1000"),
            ("SLURM_JOB_PARTITION", "batch"),
            ("SLURM_JOB_NODELIST", "node[1-3,10]"),
            ("SLURM_NODELIST", "node[1-3,10]"),
            ("SLURM_NNODES", "4"),
            ("SLURM_JOB_NUM_NODES", "4"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_NPROCS", "8"),
            ("SLURM_TASKS_PER_NODE", "2(x4)"),
            ("SLURM_CPUS_PER_TASK", "2"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_CPUS_ON_NODE", "4"),
            ("SLURM_NODEID", "1"),
            ("SLURM_SUBMIT_DIR", "/home/ann/run"),
            ("PBS_JOBID", "42"),
            ("PBS_JOBNAME", "my job; $(rm -rf /)\n"),
            ("PBS_O_WORKDIR", "/home/ann/run"),
            ("PBS_QUEUE", "batch"),
            ("PBS_NP", "8"),
            ("PBS_ENVIRONMENT", "PBS_BATCH"),
        ] {
            assert_eq!(get(&v, k), Some(want), "{k}");
        }
    }

    #[test]
    fn an_exclusive_job_counts_the_tasks_it_asked_for() {
        use berth_core::directives::JobTasks;
        // `--exclusive -N 2 -n 6` on 8-core nodes: whole nodes, 3 tasks on each.
        let s = spec(&[("a01", 8), ("a02", 8)], "a01");
        let c = CompatEnv {
            tasks_per_node: Some(3),
            tasks: Some(JobTasks { total: 6, per_node: Some(3) }),
            ..Default::default()
        };
        let v = job_vars(&s, &c, 0, 8);
        assert_eq!(get(&v, "SLURM_NTASKS"), Some("6"), "not the 16 cores");
        assert_eq!(get(&v, "PBS_NP"), Some("6"));
        assert_eq!(get(&v, "SLURM_TASKS_PER_NODE"), Some("3(x2)"));
        assert_eq!(get(&v, "SLURM_CPUS_ON_NODE"), Some("8"), "the whole node's CPUs");
        assert_eq!(pbs_nodefile_name(&s, &c), Some(PBS_NODEFILE), "one line per task, not per core");
        assert_eq!(pbs_nodefile_text(&s, &c), "a01\na01\na01\na02\na02\na02\n");
        // `-n 10` without a node count: the nodes' CPUs in order.
        let c = CompatEnv { tasks: Some(JobTasks { total: 10, per_node: None }), ..Default::default() };
        let v = job_vars(&s, &c, 0, 8);
        assert_eq!((get(&v, "SLURM_NTASKS"), get(&v, "SLURM_TASKS_PER_NODE")), (Some("10"), Some("8,2")));
    }

    #[test]
    fn a_gpu_jobs_gpus_on_the_node() {
        let mut s = spec(&[("g1", 4)], "g1");
        let v = job_vars(&s, &CompatEnv::default(), 0, 4);
        assert_eq!((get(&v, "SLURM_JOB_GPUS"), get(&v, "SLURM_GPUS_ON_NODE")), (None, None), "no GPUs: unset");
        s.allocation.gpus = vec![1, 3];
        let v = job_vars(&s, &CompatEnv::default(), 0, 4);
        assert_eq!((get(&v, "SLURM_JOB_GPUS"), get(&v, "SLURM_GPUS_ON_NODE")), (Some("1,3"), Some("2")));
        assert!(not_from_submitter("SLURM_JOB_GPUS") && not_from_submitter("SLURM_GPUS_ON_NODE"));
    }

    #[test]
    fn per_task_counts_are_set_only_when_asked() {
        let s = spec(&[("a01", 3), ("a02", 1)], "a01");
        let v = job_vars(&s, &CompatEnv::default(), node_index(&s), 3);
        assert_eq!(get(&v, "SLURM_CPUS_PER_TASK"), None);
        assert_eq!(get(&v, "SLURM_NTASKS_PER_NODE"), None);
        assert_eq!(get(&v, "SLURM_NTASKS"), Some("4"), "one task per core");
        assert_eq!(get(&v, "SLURM_TASKS_PER_NODE"), Some("3,1"));
        assert_eq!(get(&v, "SLURM_JOB_NODELIST"), Some("a[01-02]"));
        assert_eq!(get(&v, "SLURM_NODEID"), Some("0"));
        let mut interactive = s.clone();
        interactive.script.clear();
        let v = job_vars(&interactive, &CompatEnv::default(), 0, 3);
        assert_eq!(get(&v, "PBS_ENVIRONMENT"), Some("PBS_INTERACTIVE"));
    }

    #[test]
    fn what_the_submitter_had_of_a_step_or_task_is_not_inherited() {
        for k in ["SLURM_PROCID", "SLURM_STEP_ID", "SLURM_CPUS_PER_TASK", "PBS_NODEFILE", "PBS_TASKNUM"] {
            assert!(not_from_submitter(k), "{k}");
        }
        for k in ["SLURM_JOB_ID", "PATH", "SLURM_CONF", "PBS_O_HOST"] {
            assert!(!not_from_submitter(k), "{k}");
        }
    }

    #[test]
    fn counts_per_node_fold_runs() {
        assert_eq!(per_node([2, 2, 2, 1]), "2(x3),1");
        assert_eq!(per_node([4]), "4");
        assert_eq!(per_node([1, 2, 1, 1]), "1,2,1(x2)");
        assert_eq!(per_node([]), "");
    }

    #[test]
    fn pbs_node_file_has_a_line_per_task() {
        let s = spec(&[("n2", 4), ("n1", 2)], "n2");
        let one = CompatEnv::default();
        assert_eq!(pbs_nodefile_name(&s, &one), Some("nodefile"), "berth's own: a line per core");
        assert_eq!(pbs_nodefile_text(&s, &one), "n2\nn2\nn2\nn2\nn1\nn1\n");
        let two = CompatEnv { cpus_per_task: Some(2), ..Default::default() };
        assert_eq!(pbs_nodefile_name(&s, &two), Some(PBS_NODEFILE));
        assert_eq!(pbs_nodefile_text(&s, &two), "n2\nn2\nn1\n");
        let odd = spec(&[("n1", 1)], "n1");
        assert_eq!(pbs_nodefile_text(&odd, &CompatEnv { cpus_per_task: Some(4), ..Default::default() }), "n1\n");
        // Only host names, never anything else: a name that could not be a line gives no file.
        let bad = spec(&[("n1\nevil", 1)], "n1\nevil");
        assert_eq!(pbs_nodefile_name(&bad, &one), None);
        assert_eq!(pbs_nodefile_text(&bad, &one), "");
    }

    #[test]
    fn step_and_rank_variables() {
        let grant: StepGrant = serde_json::from_value(serde_json::json!({
            "job": 42, "step": 3, "kvsname": "k", "user": {"uid": 1000, "gid": 1000, "groups": [], "name": "ann"},
            "argv": ["x"], "env": [], "cwd": "/", "size": 5, "fanout": 2, "no_kill": false, "rank_cpusets": false,
            "bind": false, "notify_signal": null, "kill_grace_ms": 100, "interactive": false,
            "nodes": [
                {"name": "node1", "address": "", "ranks": [{"rank": 0, "cpus": "0"}, {"rank": 1, "cpus": "1"}, {"rank": 2, "cpus": "2"}]},
                {"name": "node2", "address": "", "ranks": [{"rank": 3, "cpus": "0"}, {"rank": 4, "cpus": "1"}]}
            ]
        }))
        .unwrap();
        let v = step_vars(&grant, 1, &[]);
        assert_eq!(get(&v, "SLURM_STEP_GPUS"), None, "no GPUs: unset");
        let g = step_vars(&grant, 1, &[2, 5]);
        assert_eq!(get(&g, "SLURM_STEP_GPUS"), Some("2,5"));
        for (k, want) in [
            ("SLURM_STEP_ID", "3"),
            ("SLURM_STEPID", "3"),
            ("SLURM_STEP_NUM_TASKS", "5"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_NODELIST", "node[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "3,2"),
            ("SLURM_TASKS_PER_NODE", "3,2"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NODELIST", "node[1-2]"),
            ("SLURM_NODEID", "1"),
        ] {
            assert_eq!(get(&v, k), Some(want), "{k}");
        }
        let r = rank_vars(4, 1);
        assert_eq!((get(&r, "SLURM_PROCID"), get(&r, "SLURM_LOCALID")), (Some("4"), Some("1")));
        let t = task_vars(7, 1);
        assert_eq!(
            (get(&t, "PBS_TASKNUM"), get(&t, "PBS_NODENUM"), get(&t, "SLURM_NODEID")),
            (Some("7"), Some("1"), Some("1"))
        );
        assert!(rank_vars(0, 0).iter().chain(&step_vars(&grant, 0, &[1])).all(|(k, _)| STEP_ONLY.contains(k)
            || [
                "SLURM_NTASKS",
                "SLURM_NPROCS",
                "SLURM_NNODES",
                "SLURM_NODELIST",
                "SLURM_NODEID",
                "SLURM_TASKS_PER_NODE"
            ]
            .contains(k)));
    }

    /// Torque's GPU file: a line per GPU of the job over all its nodes, in node order; none
    /// without GPUs or with a host name that cannot be a line.
    #[test]
    fn pbs_gpufile_lists_every_node_s_gpus() {
        let mut s = spec(&[("g01", 4), ("g02", 4), ("g03", 2)], "g02");
        assert_eq!(pbs_gpufile_text(&s), None, "no GPUs, no file");
        s.node_gpus = vec![vec![0, 2], vec![1], vec![]];
        assert_eq!(pbs_gpufile_text(&s).as_deref(), Some("g01-gpu0\ng01-gpu2\ng02-gpu1\n"));
        s.node_gpus = vec![vec![], vec![], vec![]];
        assert_eq!(pbs_gpufile_text(&s), None);
        s.node_gpus = vec![vec![0], vec![0], vec![0]];
        s.nodes[1].0 = "bad host".into();
        assert_eq!(pbs_gpufile_text(&s), None, "a name with a space is no line");
        assert!(not_from_submitter("PBS_GPUFILE"), "a job's file, never the submitter's");
        // Frames without GPUs are unchanged: the field is left out.
        let mut s = spec(&[("g01", 4)], "g01");
        assert!(!serde_json::to_string(&s).unwrap().contains("node_gpus"));
        s.node_gpus = vec![vec![3]];
        let back: LaunchSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.node_gpus, vec![vec![3]]);
    }
}
