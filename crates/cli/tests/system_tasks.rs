//! System test of the task API (seeds/001, PBS TM): `berth task` from inside a 2-node job run
//! as the test user, on a real local cluster.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MAPPED: &str = "package:1 core:2 pu:1";

const SCRIPT: &str = r#"#!/bin/sh
#BERTH --nodes 2 --tasks-per-node 1 --walltime 120
B=@BIN@
echo "socket=$BERTH_AGENT_SOCKET" > env.txt
echo "job=$BERTH_JOB_ID" >> env.txt
$B task info --json > info.json 2> info.err; echo "info=$?" >> codes.txt
$B task spawn --json --node 0 sh -c 'echo "node=$BERTH_NODEID task=$BERTH_TASK_ID job=$BERTH_JOB_ID tmp=$TMPDIR sock=$BERTH_AGENT_SOCKET"; test -d "$TMPDIR" && echo tmpdir-exists; grep cpuset: /proc/self/cgroup' > spawn0.json; echo "spawn0=$?" >> codes.txt
$B task spawn --json --node 1 --count 2 --output 'n1-%t.out' sh -c 'echo "node=$BERTH_NODEID task=$BERTH_TASK_ID job=$BERTH_JOB_ID tmp=$TMPDIR sock=$BERTH_AGENT_SOCKET"; test -d "$TMPDIR" && echo tmpdir-exists; grep cpuset: /proc/self/cgroup' > spawn1.json; echo "spawn1=$?" >> codes.txt
$B task spawn --node 1 sh -c 'exit 3' > fail.id; echo "spawnfail=$?" >> codes.txt
$B task spawn --node 0 no-such-command-berth > missing.out 2> missing.err; echo "missing=$?" >> codes.txt
$B task spawn --node 1 sleep 300 > sleep.id; echo "sleep=$?" >> codes.txt
$B task spawn --node 0 sh -c 'echo $$ > left0.pid; exec sleep 301' > left0.id
$B task spawn --node 1 sh -c 'echo $$ > left1.pid; exec sleep 302' > left1.id
$B task wait --json 1 2 3 > wait_ok.json; echo "wait_ok=$?" >> codes.txt
$B task wait "$(cat fail.id)" > /dev/null; echo "wait_fail=$?" >> codes.txt
touch ready
i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
$B task kill --signal KILL "$(cat sleep.id)" > kill.txt; echo "kill=$?" >> codes.txt
$B task wait --json "$(cat sleep.id)" > wait_killed.json; echo "wait_killed=$?" >> codes.txt
$B task spawn --node 0 sleep 303 > sleep0.id
$B task kill "$(cat sleep0.id)" > /dev/null; echo "kill0=$?" >> codes.txt
$B task wait --json "$(cat sleep0.id)" > wait_killed0.json; echo "wait_killed0=$?" >> codes.txt
$B task wait --timeout 0.5 "$(cat left0.id)" > /dev/null; echo "wait_timeout=$?" >> codes.txt
$B task list --json > list.json; echo "list=$?" >> codes.txt
$B task list > list.txt
i=0; while { [ ! -s left0.pid ] || [ ! -s left1.pid ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "end=0" >> codes.txt
"#;

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn json_file(dir: &Path, name: &str) -> Value {
    let text = read(dir, name);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"))
}

#[test]
fn tasks_spawn_on_every_node_are_tracked_killed_and_cleaned_with_the_job() {
    let c = Cluster::up(2, MAPPED);
    let uid = Command::new("id").args(["-u", "berthtest"]).output().unwrap();
    assert!(uid.status.success(), "user berthtest is missing: scripts/test.sh creates it");
    let home = c.root().join("taskuser");
    std::fs::create_dir(&home).unwrap();
    assert!(Command::new("chown").args(["berthtest:berthtest"]).arg(&home).status().unwrap().success());
    // The checkout may be out of the test user's reach: its own copy of the binary.
    let bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &bin).unwrap();
    let bin = bin.display().to_string();
    let script = home.join("tasks.sh");
    std::fs::write(&script, SCRIPT.replace("@BIN@", &bin)).unwrap();
    let out = Command::new("runuser")
        .args(["-u", "berthtest", "--", &bin, "--dir"])
        .arg(&c.dir)
        .args(["submit", "--json"])
        .arg(&script)
        .current_dir(&home)
        .output()
        .unwrap();
    assert!(out.status.success(), "submit as berthtest: {}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();

    // While the job waits for us: a process of the same user outside the job is refused.
    let t0 = Instant::now();
    while !home.join("ready").exists() {
        let j = c.show(id);
        assert!(
            t0.elapsed() < Duration::from_secs(60)
                && !["completed", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or("")),
            "the job never got ready: {j:#}\ncodes: {}\n{}",
            std::fs::read_to_string(home.join("codes.txt")).unwrap_or_default(),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let env = read(&home, "env.txt");
    let socket = env.lines().find_map(|l| l.strip_prefix("socket=")).unwrap().to_string();
    let outsider = Command::new("runuser")
        .args(["-u", "berthtest", "--", "env", &format!("BERTH_AGENT_SOCKET={socket}"), &format!("BERTH_JOB_ID={id}")])
        .args([&bin, "task", "list"])
        .output()
        .unwrap();
    assert!(!outsider.status.success(), "a process outside the job used its task API");
    let err = String::from_utf8_lossy(&outsider.stderr);
    assert!(err.contains("not part of job"), "{err}");
    std::fs::write(home.join("go"), "").unwrap();

    let j = c.wait_finished(id, Duration::from_secs(60));
    let codes = std::fs::read_to_string(home.join("codes.txt")).unwrap_or_default();
    assert_eq!(j["state"], "completed", "{j:#}\ncodes:\n{codes}\n{}", c.logs());
    let names: Vec<String> =
        j["allocation"].as_array().unwrap().iter().map(|a| a["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(names.len(), 2);
    for want in [
        "info=0",
        "spawn0=0",
        "spawn1=0",
        "spawnfail=0",
        "missing=1",
        "sleep=0",
        "wait_ok=0",
        "wait_fail=1",
        "kill=0",
        "wait_killed=1",
        "kill0=0",
        "wait_killed0=1",
        "wait_timeout=2",
        "list=0",
        "end=0",
    ] {
        assert!(
            codes.lines().any(|l| l == want),
            "expected {want} in:\n{codes}\nlist:\n{}\ninfo errors:\n{}",
            read(&home, "list.txt"),
            read(&home, "info.err") + &read(&home, "info.json")
        );
    }

    // Node info: both nodes, in allocation order, with their slots, CPUs and agents.
    let info = json_file(&home, "info.json");
    assert_eq!(info["job"], id);
    let nodes = info["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{info:#}");
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["index"], i as u64);
        assert_eq!(n["name"], names[i].as_str());
        assert_eq!(n["slots"], 1);
        assert_eq!(n["cpus"], j["allocation"][i]["cpus"], "{info:#}");
        assert!(n["address"].as_str().unwrap().contains(':'), "{info:#}");
    }

    // Spawn answers at once with running (or already ended) tasks and their pids.
    let s1 = json_file(&home, "spawn1.json");
    let s1 = s1.as_array().unwrap();
    assert_eq!(s1.iter().map(|t| t["id"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 3]);
    for t in s1 {
        assert_eq!(t["node_index"], 1);
        assert_eq!(t["node"], names[1].as_str());
        assert!(t["pid"].as_u64().is_some() && t["state"] != "failed", "{t}");
    }

    // Each task ran on its node, in the job's cgroup there, with the node's TMPDIR and agent.
    let outputs =
        [(format!("berth-task-{id}.1.out"), 0, 1), ("n1-2.out".to_string(), 1, 2), ("n1-3.out".to_string(), 1, 3)];
    for (file, node, task) in outputs {
        let text = read(&home, &file);
        assert!(
            text.contains(&format!("node={node} task={task} job={id} tmp=/tmp/berth/"))
                && text.contains("tmpdir-exists")
                && text.contains(&format!("/{}/job_{id}", names[node]))
                && text.contains(&format!(
                    "sock={}",
                    c.dir.join("agents").join(&names[node]).join("agent.sock").display()
                )),
            "{file}: {text}"
        );
    }
    let ok = json_file(&home, "wait_ok.json");
    assert!(ok.as_array().unwrap().iter().all(|t| t["state"] == "exited" && t["exit_code"] == 0), "{ok:#}");
    let missing = read(&home, "missing.err");
    // "command not found", or "permission denied" when PATH holds a directory the user may not enter.
    assert!(missing.contains("failed to start: no-such-command-berth: "), "{missing}");
    let killed = json_file(&home, "wait_killed.json");
    assert_eq!(killed[0]["signal"], 9, "{killed:#}");
    assert!(read(&home, "kill.txt").contains("signalled (KILL)"));
    let killed0 = json_file(&home, "wait_killed0.json");
    assert_eq!(
        (killed0[0]["node_index"].clone(), killed0[0]["signal"].clone()),
        (Value::from(0), Value::from(15)),
        "{killed0:#}"
    );

    // The list holds every task with how it ended.
    let list = json_file(&home, "list.json");
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 9, "{list:#?}");
    let state = |i: usize| (list[i]["state"].as_str().unwrap().to_string(), list[i]["exit_code"].clone());
    assert_eq!(state(3), ("exited".into(), Value::from(3)));
    assert_eq!(state(4).0, "failed");
    assert_eq!(state(6).0, "running");
    assert_eq!(state(7).0, "running");
    assert!(list.iter().all(|t| t["wall_ms"].as_u64().is_some()));
    let table = read(&home, "list.txt");
    assert!(table.contains("signal 9 (KILL)") && table.contains("sleep 300"), "{table}");

    // After the job: the tasks it left running are gone, on both nodes, and so are its cgroups.
    for f in ["left0.pid", "left1.pid"] {
        let pid: i32 = read(&home, f).trim().parse().unwrap();
        let t0 = Instant::now();
        while pid_alive(pid) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!pid_alive(pid), "task process {pid} ({f}) survived its job");
    }
    for node in &names {
        for ctrl in ["cpuset", "memory", "freezer", "cpuacct"] {
            let cg = cgroup_mount(ctrl).join("berth").join(c.cluster_id()).join(node).join(format!("job_{id}"));
            // Other nodes clean up when the controller tells them the job ended: allow a moment.
            let t0 = Instant::now();
            while cg.exists() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(!cg.exists(), "{} left behind", cg.display());
        }
    }
    // Accounting covers the tasks (they ran in the job's cgroup): the job used some CPU.
    let acct = c.json(&["acct"]);
    let rec = acct.as_array().unwrap().iter().find(|r| r["id"] == id).cloned().unwrap_or_default();
    assert!(!rec.is_null(), "job {id} missing from acct: {acct:#}");
}

#[test]
fn task_commands_outside_a_job_say_so() {
    let out = Command::new(BIN).args(["task", "list"]).env_remove("BERTH_AGENT_SOCKET").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("berth task works only inside a job (BERTH_AGENT_SOCKET is not set)"), "{err}");
}

/// Issue 16 item 16: what a task leaves running in its session (`sleep &`) ends with the task,
/// on the node it ran on, local or remote, as the PBS node daemon ends a task's session.
#[test]
fn a_tasks_background_children_end_with_it() {
    let c = Cluster::up(2, MAPPED);
    let bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &bin).unwrap();
    let script = format!(
        r#"#!/bin/sh
#BERTH --nodes 2 --tasks-per-node 1 --walltime 60
B={}
for n in 0 1; do
  id=$($B task spawn --node $n sh -c "sleep 217 & echo \$! > bg$n.pid; exit 0")
  $B task wait "$id" > /dev/null
  i=0; while [ ! -s bg$n.pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  i=0; while kill -0 "$(cat bg$n.pid)" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  if kill -0 "$(cat bg$n.pid)" 2>/dev/null; then echo "node$n=alive" >> left.txt; else echo "node$n=gone" >> left.txt; fi
done
"#,
        bin.display()
    );
    let id = c.submit("bg.sh", &script, &[]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
    let left = read(c.root(), "left.txt");
    assert_eq!(left, "node0=gone\nnode1=gone\n", "a task's background child outlived it");
}
