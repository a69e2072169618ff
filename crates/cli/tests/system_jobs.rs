//! System tests: a real controller and agents on loopback, real jobs in real cgroups.

mod common;

use common::*;
use std::time::Duration;

const MAPPED: &str = "package:1 core:2 pu:1";
const BIG: &str = "package:2 numa:2 core:2 pu:2";

#[test]
fn jobs_run_in_cgroups_holding_exactly_their_cpus() {
    // A node of 2 single-thread cores maps PU n onto real CPU n: each job's cpuset is exact.
    let c = Cluster::up(3, MAPPED);
    let script = "#!/bin/sh\n#BERTH --cores 1 --mem 96M\ncg=$(cat /proc/self/cpuset)\necho \"cpus=$(cat /sys/fs/cgroup/cpuset$cg/cpuset.cpus)\"\necho \"mems=$(cat /sys/fs/cgroup/cpuset$cg/cpuset.mems)\"\necho \"limit=$(cat /sys/fs/cgroup/memory$cg/memory.limit_in_bytes)\"\necho \"id=$BERTH_JOB_ID nodes=$BERTH_NODES\"\ntest -d \"$TMPDIR\" && echo \"tmpdir=$TMPDIR\"\nsleep 1\n";
    let ids: Vec<u64> = (0..4).map(|i| c.submit(&format!("cg{i}.sh"), script, &[])).collect();
    for id in &ids {
        let j = c.wait_finished(*id, Duration::from_secs(30));
        assert_eq!(j["state"], "completed", "{j:#}");
        assert_eq!(j["exit_code"], 0);
        let alloc = &j["allocation"][0];
        let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
        assert!(
            out.contains(&format!("cpus={}\n", alloc["cpus"].as_str().unwrap())),
            "cgroup cpus differ from allocation {alloc}: {out}"
        );
        assert!(out.contains("mems=0\n"), "{out}");
        assert!(out.contains(&format!("limit={}\n", 96 << 20)), "{out}");
        assert!(out.contains(&format!("id={id} nodes={}\n", alloc["node"].as_str().unwrap())), "{out}");
        let tmpdir = out.lines().find_map(|l| l.strip_prefix("tmpdir=")).expect("TMPDIR existed during the job");
        assert!(!std::path::Path::new(tmpdir).exists(), "TMPDIR {tmpdir} was not removed");
        let cg = cgroup_mount("cpuset")
            .join("berth")
            .join(c.cluster_id())
            .join(alloc["node"].as_str().unwrap())
            .join(format!("job_{id}"));
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
}

#[test]
fn the_batch_script_runs_under_the_berth_client_as_its_shim() {
    // berthd's agent starts the `berth` beside it as each script's shim (it starts faster),
    // after checking that it is one; the shim keeps the script's exit status.
    let out = Command::new(BIN).args(["__berth-shim", "--check"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "berth-shim 1\n");
    let c = Cluster::up(1, MAPPED);
    let id = c.submit("parent.sh", "#!/bin/sh\nreadlink /proc/$PPID/exe\nexit 3\n", &[]);
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["exit_code"], 3, "{j:#}");
    let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
    let client = std::fs::canonicalize(BIN).unwrap();
    assert_eq!(out.trim(), client.to_str().unwrap(), "the script's parent is not the berth client");
}

#[test]
fn emulated_pus_map_round_robin_onto_real_cpus() {
    let c = Cluster::up(1, BIG);
    let id = c.submit(
        "rr.sh",
        "#!/bin/sh\n#BERTH --cores 2\ncat /sys/fs/cgroup/cpuset$(cat /proc/self/cpuset)/cpuset.cpus\n",
        &[],
    );
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["allocation"][0]["cpus"], "0-3");
    let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(out.trim(), "0-1", "emulated PUs 0-3 map onto real CPUs 0,1,0,1");
}

#[test]
fn walltime_kills_every_process_and_removes_the_cgroup() {
    let c = Cluster::up(1, BIG);
    let pids = c.root().join("pids");
    let script = format!(
        "#!/bin/sh\n#BERTH --walltime 2\nsleep 300 &\necho $! >> {p}\nsh -c 'setsid sh -c \"echo \\$\\$ >> {p}; exec sleep 301\" &'\ntrap '' TERM\necho $$ >> {p}\nsleep 300\n",
        p = pids.display()
    );
    let id = c.submit("overtime.sh", &script, &[]);
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "timeout", "{j:#}");
    assert_eq!(j["reason"], "walltime");
    let listed: Vec<i32> =
        std::fs::read_to_string(&pids).unwrap().lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(listed.len(), 3, "background sleep, double-forked daemon and the script itself: {listed:?}");
    for pid in listed {
        assert!(!pid_alive(pid), "process {pid} of the job survived its walltime");
    }
    let node = j["allocation"][0]["node"].as_str().unwrap();
    for ctrl in ["cpuset", "memory", "freezer", "cpuacct"] {
        let cg = cgroup_mount(ctrl).join("berth").join(c.cluster_id()).join(node).join(format!("job_{id}"));
        assert!(!cg.exists(), "{} left behind", cg.display());
    }
}

#[test]
fn accounting_is_plausible() {
    let c = Cluster::up(1, BIG);
    // The loop burns a CPU-time amount, not a wall-clock one: however loaded the machine, it
    // stops once its own /proc/<pid>/stat says it used half a second of CPU, and writes down
    // how much (user and system ticks, ticks per second) for the check below.
    let burned = c.root().join("burned");
    let id = c.submit(
        "burn.sh",
        &format!(
            "#!/bin/sh\n#BERTH --cores 1\nsh -c 'want=$(($1 / 2)); while :; do i=0; while [ $i -lt 1000 ]; do i=$((i+1)); done; read -r _ _ _ _ _ _ _ _ _ _ _ _ _ u s _ < /proc/$$/stat; [ $((u + s)) -ge $want ] && break; done; echo \"$u $s $1\" > {}' burn \"$(getconf CLK_TCK)\"\nhead -c 50m /dev/zero | tail > /dev/null\nexit 3\n",
            burned.display()
        ),
        &[],
    );
    let j = c.wait_finished(id, Duration::from_secs(120));
    assert_eq!(j["state"], "failed", "{j:#}");
    assert_eq!(j["exit_code"], 3);
    let ticks: Vec<f64> = std::fs::read_to_string(&burned)
        .expect("the loop wrote its CPU time")
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let [bu, bs, hz] = ticks[..] else { panic!("burned: {ticks:?}") };
    let loop_cpu = (bu + bs) / hz;
    assert!(loop_cpu >= 0.5, "the loop stopped early: {loop_cpu} CPU-s");
    let acct = c.json(&["acct"]);
    let rec = acct.as_array().unwrap().iter().find(|r| r["id"] == id).expect("job in acct");
    let a = &rec["accounting"];
    let wall = a["wall_seconds"].as_f64().unwrap();
    let user = a["user_cpu_seconds"].as_f64().unwrap();
    let sys = a["system_cpu_seconds"].as_f64().unwrap();
    let peak = a["peak_memory_bytes"].as_u64().unwrap();
    println!("loop {loop_cpu:.2} CPU-s; accounted user {user:.2} sys {sys:.2} wall {wall:.2}");
    // The job's cgroup holds the loop and more (its shell, head, tail): it accounts at least
    // the loop's own CPU time (10 ms for the tick rounding), and no more than its 1 core (2
    // emulated PUs on up to 2 real CPUs) could run in its wall time.
    assert!(user + sys >= loop_cpu - 0.01, "cpu user {user} sys {sys} below the loop's own {loop_cpu}");
    assert!(user + sys <= wall * 2.0 + 0.5, "cpu user {user} sys {sys} wall {wall}");
    // A one-threaded loop takes at least its CPU time in wall time.
    assert!(wall >= loop_cpu - 0.01 && wall < 120.0, "wall {wall} for a loop of {loop_cpu} CPU-s");
    assert!(peak > 40 << 20 && peak < 1 << 30, "peak memory {peak}");
}

#[test]
fn memory_limit_kills_and_is_reported() {
    let c = Cluster::up(1, BIG);
    let id =
        c.submit("hog.sh", "#!/bin/sh\nhead -c 400m /dev/zero | tail > /dev/null\necho survived\n", &["--mem", "48M"]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(j["state"], "failed", "{j:#}");
    assert_eq!(j["reason"], "oom", "{j:#}");
    assert_eq!(j["allocation"][0]["memory_bytes"], 48 << 20);
}

#[test]
fn cancel_hold_release() {
    let c = Cluster::up(1, MAPPED);
    let running = c.submit("long.sh", "#!/bin/sh\n#BERTH --cores 2\necho $$ > pid\nexec sleep 300\n", &[]);
    c.wait_state(running, &["running"], Duration::from_secs(20));
    // "running" is the controller's word: wait for the script itself (started by its shim).
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(c.root().join("pid")).map(|t| !t.ends_with('\n')).unwrap_or(true) {
        assert!(t0.elapsed() < Duration::from_secs(20), "the script never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = c.submit("held.sh", "#!/bin/sh\necho ran\n", &["--cores", "1"]);
    let out = c.berth(&["hold", &held.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.show(held)["state"], "held");
    // Cancel the running job: its process goes, the held job stays held.
    let out = c.berth(&["cancel", &running.to_string()]);
    assert!(out.status.success());
    let j = c.wait_finished(running, Duration::from_secs(20));
    assert_eq!(j["state"], "cancelled");
    // The process goes with the job: wait for that, bounded.
    let pid: i32 = std::fs::read_to_string(c.root().join("pid")).unwrap().trim().parse().unwrap();
    let t0 = std::time::Instant::now();
    while pid_alive(pid) {
        assert!(t0.elapsed() < Duration::from_secs(30), "cancelled job's process {pid} still alive");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.show(held)["state"], "held");
    assert!(c.berth(&["release", &held.to_string()]).status.success());
    assert_eq!(c.wait_finished(held, Duration::from_secs(20))["state"], "completed");
    // Finished and unknown jobs: clear errors, non-zero exit.
    let out = c.berth(&["cancel", &held.to_string(), "999999"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already ended") && err.contains("999999 does not exist"), "{err}");
}

#[test]
fn jobs_run_as_the_submitting_user_with_groups_env_and_cwd() {
    let c = Cluster::up(1, MAPPED);
    let uid = Command::new("id").args(["-u", "berthtest"]).output().unwrap();
    assert!(
        uid.status.success(),
        "user berthtest is missing: scripts/test.sh creates it (useradd berthtest, group berthgrp)"
    );
    let home = c.root().join("userdir");
    std::fs::create_dir(&home).unwrap();
    assert!(Command::new("chown").args(["berthtest:berthtest"]).arg(&home).status().unwrap().success());
    let script = home.join("who.sh");
    std::fs::write(&script, "#!/bin/sh\necho \"uid=$(id -u) gid=$(id -g) groups=$(id -G) cwd=$(pwd) marker=$BERTH_TEST_MARKER\"\nls -ld \"$TMPDIR\" | cut -d' ' -f3\n").unwrap();
    // The checkout may sit under a directory only root can enter (mktemp -d): give the test
    // user its own copy of the binary.
    let bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &bin).unwrap();
    let bin = bin.display().to_string();
    let out = Command::new("runuser")
        .args(["-u", "berthtest", "--", &bin, "--dir"])
        .arg(&c.dir)
        .args(["submit", "--json"])
        .arg(&script)
        .current_dir(&home)
        .env("BERTH_TEST_MARKER", "m-42")
        .output()
        .unwrap();
    assert!(out.status.success(), "submit as berthtest: {}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
    assert_eq!(j["user"], "berthtest");
    let text = std::fs::read_to_string(home.join(format!("berth-{id}.out"))).unwrap();
    let expect_uid = String::from_utf8_lossy(&uid.stdout).trim().to_string();
    let expect_groups = String::from_utf8_lossy(&Command::new("id").args(["-G", "berthtest"]).output().unwrap().stdout)
        .trim()
        .to_string();
    let expect_gid = String::from_utf8_lossy(&Command::new("id").args(["-g", "berthtest"]).output().unwrap().stdout)
        .trim()
        .to_string();
    assert!(
        text.contains(&format!(
            "uid={expect_uid} gid={expect_gid} groups={expect_groups} cwd={} marker=m-42",
            home.display()
        )),
        "{text}"
    );
    assert!(expect_groups.split(' ').count() >= 2, "berthtest should have a supplementary group: {expect_groups}");
    assert!(text.lines().nth(1) == Some("berthtest"), "TMPDIR owned by the user: {text}");
    // The output file belongs to the user, not root.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(home.join(format!("berth-{id}.out"))).unwrap();
    assert_eq!(meta.uid().to_string(), expect_uid);
    // Users may not cancel other users' jobs.
    let root_job = c.submit("rootjob.sh", "#!/bin/sh\nsleep 30\n", &["--cores", "1"]);
    let out = Command::new("runuser")
        .args(["-u", "berthtest", "--", &bin, "--dir"])
        .arg(&c.dir)
        .args(["cancel", &root_job.to_string()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_permitted"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(c.berth(&["cancel", &root_job.to_string()]).status.success());
}

use std::process::Command;

#[test]
fn multi_node_job_gets_nodes_and_nodefile() {
    let c = Cluster::up(3, BIG);
    let id = c.submit(
        "mn.sh",
        "#!/bin/sh\necho \"$BERTH_NODES\"\ncat \"$BERTH_NODEFILE\"\n",
        &["--nodes", "3", "--tasks-per-node", "2"],
    );
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "completed");
    let alloc = j["allocation"].as_array().unwrap();
    assert_eq!(alloc.len(), 3);
    let names: Vec<&str> = alloc.iter().map(|a| a["node"].as_str().unwrap()).collect();
    let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(names.join(",").as_str()));
    let nodefile: Vec<&str> = lines.collect();
    assert_eq!(nodefile.len(), 6, "{out}");
    for n in names {
        assert_eq!(nodefile.iter().filter(|l| **l == n).count(), 2);
    }
}

#[test]
fn drained_node_takes_no_new_work_until_resumed() {
    let c = Cluster::up(1, MAPPED);
    let busy = c.submit("busy.sh", "#!/bin/sh\nsleep 2\n", &["--cores", "1"]);
    c.wait_state(busy, &["running"], Duration::from_secs(20));
    let nodes = c.json(&["node", "drain", "node1"]);
    assert_eq!(nodes[0]["state"], "draining", "a node with a running job drains first");
    let waiting = c.submit("wait.sh", "#!/bin/sh\ntrue\n", &["--cores", "1"]);
    assert_eq!(c.wait_finished(busy, Duration::from_secs(20))["state"], "completed");
    // Wait for the scheduler to say why the job waits (and the node to finish draining); the
    // job stays queued all along.
    let t0 = std::time::Instant::now();
    loop {
        let j = c.show(waiting);
        assert_eq!(j["state"], "queued", "no new work on a drained node: {j:#}");
        let node = c.json(&["nodes"])[0]["state"].as_str().unwrap_or("").to_string();
        if j["reason"].as_str().unwrap_or("").contains("no suitable node") && node == "drained" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "node {node}, job {j:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = c.berth(&["node", "drain", "nosuch"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_node"));
    c.json(&["node", "resume", "node1"]);
    assert_eq!(c.wait_finished(waiting, Duration::from_secs(20))["state"], "completed");
}

#[test]
fn xml_topology_of_a_real_machine_registers() {
    // hwloc XML export of a 2x Xeon E5-2650 node, from the hwloc project's test suite
    // (open-mpi/hwloc, BSD licence), via ../shared/data/hwloc, vendored in data/hwloc.
    let xml = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/hwloc/32em64t-2n8c2t-pci-normalio.xml");
    let c = Cluster::up(1, &format!("xml:{xml}"));
    let n = &c.json(&["nodes"])[0];
    assert_eq!((n["sockets"].as_u64(), n["cores"].as_u64(), n["pus"].as_u64()), (Some(2), Some(16), Some(32)));
    assert_eq!(n["topology"], format!("S{}S{}", "CTT".repeat(8), "CTT".repeat(8)));
    assert_eq!(n["numa"].as_array().unwrap().len(), 2);
    let id = c.submit("x.sh", "#!/bin/sh\ntrue\n", &["--cores", "8", "--mem", "1G"]);
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(j["state"], "completed");
    assert_eq!(j["allocation"][0]["cores"], 8);
}
