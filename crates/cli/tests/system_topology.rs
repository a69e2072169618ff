//! System tests of topology-aware placement on real agents: per-rank sub-cpusets, bindings,
//! system CPUs, and the topology drawing.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Two packages of one single-thread core: PU n is real CPU n, so the kernel's files must hold
/// exactly the numbers `berth show` reports.
const TWO_PACKAGES: &str = "package:2 core:1 pu:1";

/// Wait until `berth show` lists the job's cgroups (the agent reports them once it started).
fn wait_cgroups(c: &Cluster, id: u64, count: usize) -> Value {
    let t0 = Instant::now();
    loop {
        let j = c.show(id);
        if j["cgroups"].as_array().is_some_and(|a| a.len() >= count) {
            return j;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no cgroups reported for job {id}: {j:#}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn rank_cpusets_in_the_kernel_match_berth_show() {
    let c = Cluster::up(1, TWO_PACKAGES);
    let marker = c.root().join("release");
    let script = format!(
        "#!/bin/sh\n#BERTH --cores 2 --cpus-per-task 1 --rank-cpusets\necho \"ranks=$BERTH_RANK_CPUSETS\"\nfor d in $BERTH_RANK_CPUSETS; do echo \"$d $(cat $d/cpuset.cpus) $(cat $d/cpuset.mems) $(stat -c %U $d)\"; done\nwhile [ ! -e {} ]; do sleep 0.1; done\n",
        marker.display()
    );
    let id = c.submit("ranks.sh", &script, &[]);
    let j = wait_cgroups(&c, id, 3);
    let alloc = &j["allocation"][0];
    let ranks = alloc["ranks"].as_array().expect("ranks in the allocation");
    assert_eq!(ranks.len(), 2, "{alloc:#}");
    assert_eq!((ranks[0]["cpus"].as_str(), ranks[1]["cpus"].as_str()), (Some("0"), Some("1")), "{alloc:#}");
    // Each reported cgroup: the kernel's files hold what berth show says, and the rank
    // sub-cpusets are the allocation's ranks (identity mapping on this node).
    let mount = cgroup_mount("cpuset");
    for cg in j["cgroups"].as_array().unwrap() {
        let dir = mount.join(cg["path"].as_str().unwrap());
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap().trim().to_string();
        assert_eq!(read("cpuset.cpus"), cg["cpus"].as_str().unwrap(), "{cg}");
        assert_eq!(read("cpuset.mems"), cg["mems"].as_str().unwrap(), "{cg}");
        match cg["rank"].as_u64() {
            Some(r) => {
                assert_eq!(cg["cpus"], ranks[r as usize]["cpus"], "rank {r}: {cg}");
                assert_eq!(cg["mems"], ranks[r as usize]["mems"], "rank {r}: {cg}");
                assert!(dir.starts_with(mount.join(j["cgroups"][0]["path"].as_str().unwrap())), "rank inside the job");
            }
            None => assert_eq!(cg["cpus"], alloc["cpus"], "{cg}"),
        }
    }
    let detail = String::from_utf8(c.berth(&["show", &id.to_string()]).stdout).unwrap();
    assert!(detail.contains("rank 1: cpus 1 mems 0"), "{detail}");
    std::fs::write(&marker, "").unwrap();
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "completed", "{j:#}");
    let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("rank")).collect();
    assert!(lines.iter().any(|l| l.ends_with("rank0 0 0 root")), "{out}");
    assert!(lines.iter().any(|l| l.ends_with("rank1 1 0 root")), "{out}");
}

#[test]
fn bindings_system_cpus_and_topology_drawing() {
    let c = Cluster::up(1, "package:2 numa:1 core:4 pu:1");
    let node = c.json(&["nodes"])[0]["name"].as_str().unwrap().to_string();
    // PU 0 is for daemons now: a binding of one core must avoid it.
    c.json(&["node", "system-cpus", &node, "0"]);
    let script = "#!/bin/sh\necho \"binding=$BERTH_BINDING cores=$BERTH_BINDING_CORES\"\nsleep 2\n";
    let bound = c.submit("bound.sh", script, &["--binding", "linear:2", "--binding-mode", "env"]);
    let j = c.wait_state(bound, &["running", "completed"], Duration::from_secs(30));
    // linear:2 wants two successive cores on one socket: socket 0 has cores 1-3 usable
    // (core 0 is the system CPU), but an empty socket comes first: socket 1.
    assert_eq!(j["allocation"][0]["cpus"], "4-5", "{j:#}");
    assert_eq!(j["allocation"][0]["binding"], serde_json::json!([[1, 0], [1, 1]]), "{j:#}");
    // The drawing shows the job's letter and the system CPU.
    let draw = String::from_utf8(c.berth(&["nodes", "--topology"]).stdout).unwrap();
    assert!(draw.contains("[A]") && draw.contains("[s]"), "{draw}");
    assert!(draw.contains(&format!("A=job {bound}")), "{draw}");
    // A binding that names a core this node does not have is refused at submit.
    let path = c.root().join("never.sh");
    std::fs::write(&path, "#!/bin/sh\ntrue\n").unwrap();
    let out = c.berth(&["submit", "--binding", "explicit:5,0", path.to_str().unwrap(), "--json"]);
    assert!(!out.status.success());
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "infeasible", "{err}");
    // One that names a taken core waits, saying why.
    let busy = c.submit("busy.sh", "#!/bin/sh\ntrue\n", &["--binding", "explicit:1,0"]);
    let j = c.show(busy);
    if j["state"] == "queued" {
        assert!(j["reason"].as_str().unwrap_or("").contains("in use"), "{j:#}");
    }
    let j = c.wait_finished(bound, Duration::from_secs(30));
    let out = std::fs::read_to_string(j["stdout"].as_str().unwrap()).unwrap();
    // Host CPUs of emulated PUs 4 and 5 (round robin onto the 2 real CPUs): 0 and 1.
    assert_eq!(out.trim(), "binding={0},{1} cores=1,0 1,1", "{out}");
    assert_eq!(c.wait_finished(busy, Duration::from_secs(30))["state"], "completed");
    // The system CPU is given only to a job that asks.
    let sys = c.submit("sys.sh", "#!/bin/sh\ntrue\n", &["--cores", "8", "--system-cpus"]);
    assert_eq!(c.wait_finished(sys, Duration::from_secs(30))["allocation"][0]["cpus"], "0-7");
    let out = c.berth(&["submit", "--cores", "8", c.root().join("never.sh").to_str().unwrap(), "--json"]);
    assert!(!out.status.success(), "8 cores without the system CPU can never fit 7");
}
