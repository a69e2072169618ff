//! System test: the Slurm and PBS variables of a job, its steps' ranks and its tasks on a live
//! 2-node cluster (issue 19, "Environment"; docs/compat.md), and `[compat] environment =
//! false` turning them off.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::Duration;

const TOPO: &str = "package:1 core:4 pu:1";

/// `KEY=value` lines as a map (a value may hold `=`).
fn vars(text: &str) -> BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn read(c: &Cluster, name: &str) -> String {
    std::fs::read_to_string(c.root().join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{}", c.logs()))
}

#[test]
fn jobs_steps_and_tasks_get_slurm_and_pbs_variables() {
    let c = Cluster::up(2, TOPO);
    let script = format!(
        r#"#!/bin/sh
#SBATCH -N 2 --ntasks-per-node=2 -c 2 -t 2:00
B={BIN}
env | grep -E '^(SLURM|PBS)_' > job.env
cat "$PBS_NODEFILE" > pbs_nodefile.txt
$B run -N 2 -n 4 sh -c 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $BERTH_RANK $BERTH_LOCAL_RANK $BERTH_NODEID $SLURM_STEP_ID $BERTH_STEP_ID $SLURM_NTASKS $SLURM_NNODES $SLURM_JOB_NODELIST $SLURM_JOB_ID $SLURM_CPUS_ON_NODE"' > ranks.txt
$B task spawn --node 1 --output task.out sh -c 'echo "$PBS_TASKNUM $PBS_NODENUM $SLURM_NODEID $SLURM_JOB_ID ${{SLURM_PROCID:-none}} $SLURM_NTASKS"' > task.id
$B task wait "$(cat task.id)"
"#
    );
    let name = "env test;$(false) \"q\"";
    // Submitted from "inside a step": what belongs to that step is not the job's.
    std::fs::write(c.root().join("env.sh"), &script).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(["submit", "--json", "--name", name, "env.sh"])
        .env("SLURM_PROCID", "7")
        .env("SLURM_STEP_ID", "9")
        .env("PBS_TASKNUM", "3")
        .env("SLURM_CONF", "/kept")
        .current_dir(c.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    let nodes: Vec<String> =
        job["allocation"].as_array().unwrap().iter().map(|a| a["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 2, "{job:#}");
    let nodelist = berth_core::hostlist::compress(&nodes);
    // The allocation's order is the cluster's (names in natural order), whichever agent
    // registered first.
    assert_eq!(nodelist, "node[1-2]", "in the cluster's node order");
    let cwd = c.root().display().to_string();
    let id_s = id.to_string();

    let env = vars(&read(&c, "job.env"));
    for (k, want) in [
        ("SLURM_JOB_ID", id_s.as_str()),
        ("SLURM_JOBID", &id_s),
        ("SLURM_JOB_NAME", name),
        ("SLURM_JOB_NODELIST", &nodelist),
        ("SLURM_NODELIST", &nodelist),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NPROCS", "4"),
        ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_CPUS_PER_TASK", "2"),
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_CPUS_ON_NODE", "4"),
        ("SLURM_NODEID", "0"),
        ("SLURM_SUBMIT_DIR", &cwd),
        ("SLURM_JOB_PARTITION", "batch"),
        ("SLURM_JOB_USER", "root"),
        ("PBS_JOBID", &id_s),
        ("PBS_JOBNAME", name),
        ("PBS_O_WORKDIR", &cwd),
        ("PBS_NP", "4"),
        ("PBS_QUEUE", "batch"),
        ("PBS_ENVIRONMENT", "PBS_BATCH"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(want), "{k} in {env:#?}");
    }
    assert_eq!(env.get("SLURM_CONF").map(String::as_str), Some("/kept"), "the submitter's own are kept");
    for absent in
        ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_ID", "PBS_TASKNUM", "SLURM_ARRAY_JOB_ID", "PBS_ARRAY_INDEX"]
    {
        assert!(!env.contains_key(absent), "{absent} is not the batch script's: {env:#?}");
    }
    // One line per task (2 CPUs each): two per node, in the job's node order.
    let nodefile = read(&c, "pbs_nodefile.txt");
    let want: String = nodes.iter().flat_map(|n| [format!("{n}\n"), format!("{n}\n")]).collect();
    assert_eq!(nodefile, want);
    let path = env.get("PBS_NODEFILE").expect("PBS_NODEFILE is set");
    assert!(!std::path::Path::new(path).exists(), "{path} is removed with the job");

    // Each rank of the step: SLURM_PROCID/LOCALID/NODEID are berth's rank, local rank, node.
    let ranks = read(&c, "ranks.txt");
    let mut procids = Vec::new();
    for line in ranks.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 13, "{line}");
        assert_eq!((f[0], f[1], f[2], f[6]), (f[3], f[4], f[5], f[7]), "SLURM_PROCID/LOCALID/NODEID/STEP_ID: {line}");
        assert_eq!(&f[8..13], ["4", "2", nodelist.as_str(), id_s.as_str(), "4"], "{line}");
        procids.push(f[0].parse::<u32>().unwrap());
    }
    procids.sort();
    assert_eq!(procids, [0, 1, 2, 3], "{ranks}");
    let mut locals: Vec<(&str, &str)> =
        ranks.lines().map(|l| l.split(' ').collect::<Vec<_>>()).map(|f| (f[2], f[1])).collect();
    locals.sort();
    assert_eq!(locals, [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], "two ranks per node: {ranks}");

    // A task on the second node: its id and node, the job's counts, no step variables.
    let task = read(&c, "task.out");
    let f: Vec<&str> = task.split_whitespace().collect();
    assert_eq!(f.len(), 6, "{task}");
    assert_eq!(&f[1..], ["1", "1", id_s.as_str(), "none", "4"], "{task}");
    assert!(f[0].parse::<u64>().is_ok(), "{task}");
}

#[test]
fn the_switch_turns_them_off() {
    let c = Cluster::up_configured(1, TOPO, "[compat]\nenvironment = false\n");
    let script = format!(
        r#"#!/bin/sh
#SBATCH -n 2 -o berth-%j.out -e berth-%j.err
env | grep -E '^(SLURM|PBS)_' > off.env
{BIN} run -n 2 sh -c 'env | grep -E "^(SLURM|PBS)_"' >> off.env
echo "berth=$BERTH_JOB_ID"
"#
    );
    let id = c.submit("off.sh", &script, &[]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    assert_eq!(read(&c, "off.env"), "", "no Slurm or PBS variables when [compat] environment = false");
    let out = read(&c, &format!("berth-{id}.out"));
    assert_eq!(out.trim(), format!("berth={id}"));
}
