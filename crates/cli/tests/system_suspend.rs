//! System tests of suspension: `berth suspend` freezes a real job in the kernel on its node,
//! `berth resume` thaws it (on other cores when its own are taken), the walltime does not
//! count the time suspended, and nothing is left behind.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// 2 single-thread cores: PU n runs on real CPU n.
const MAPPED: &str = "package:1 core:2 pu:1";

/// A job that appends a line to `file` every 50 ms, `n` times (0: forever).
fn counter(file: &Path, n: u32, flags: &str) -> String {
    let cond = if n == 0 { ":".to_string() } else { format!("[ $i -lt {n} ]") };
    format!(
        "#!/bin/sh\n#BERTH --cores 1 --mem 64M {flags}\ni=0\nwhile {cond}; do i=$((i+1)); echo $i >> {f}; sleep 0.05; done\n",
        f = file.display()
    )
}

fn lines(file: &Path) -> usize {
    std::fs::read_to_string(file).map(|t| t.lines().count()).unwrap_or(0)
}

/// Wait until `file` has more than `n` lines.
fn grows(file: &Path, n: usize) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if lines(file) > n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The job's cgroup directory in controller `ctrl` (from `berth show`'s cgroup report, which
/// follows the job's start).
fn cgroup_dir(c: &Cluster, id: u64, ctrl: &str) -> PathBuf {
    let t0 = Instant::now();
    loop {
        let j = c.show(id);
        if let Some(path) = j["cgroups"][0]["path"].as_str() {
            return cgroup_mount(ctrl).join(path);
        }
        if t0.elapsed() > Duration::from_secs(10) {
            panic!("no cgroup reported: {j:#}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until the job's freezer.state reads `want`; returns what it read last.
fn freezer(dir: &Path, want: &str) -> String {
    let t0 = Instant::now();
    loop {
        let s = std::fs::read_to_string(dir.join("freezer.state")).unwrap_or_default().trim().to_string();
        if s == want || t0.elapsed() > Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn per_id_ok(v: &Value) -> bool {
    v[0]["ok"].as_bool() == Some(true)
}

fn assert_no_cgroups(c: &Cluster, id: u64) {
    for ctrl in ["cpuset", "memory", "freezer", "cpuacct"] {
        let node_dir = cgroup_mount(ctrl).join("berth").join(c.cluster_id()).join("node1");
        let cg = node_dir.join(format!("job_{id}"));
        assert!(!cg.exists(), "{} left behind", cg.display());
    }
}

#[test]
fn suspend_freezes_the_job_and_resume_lets_it_complete() {
    let c = Cluster::up(1, MAPPED);
    let bin = c.root().join("bin");
    c.json(&["compat", "install", &bin.display().to_string()]);
    let count = c.root().join("count");
    let id = c.submit("count.sh", &counter(&count, 80, "--walltime 60"), &[]);
    // squeue's state and reason: why it does not run, in one word.
    let squeue = || named_ok(&c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%t %r"]).trim().to_string();
    c.wait_state(id, &["running"], Duration::from_secs(30));
    assert!(grows(&count, 3), "the job does not count");
    let freezer_dir = cgroup_dir(&c, id, "freezer");

    // Only admins may suspend (the test user is refused with a stable code).
    let out = c.berth_as("berthtest", &["suspend", &id.to_string(), "--json"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && text.contains("not_permitted"), "berthtest could suspend: {text}");

    let r = c.json(&["suspend", &id.to_string()]);
    assert!(per_id_ok(&r), "{r:#}");
    let s = c.show(id);
    assert_eq!(s["state"], "suspended", "{s:#}");
    assert!(s["reason"].as_str().unwrap_or("").contains("suspended by admin"), "{s:#}");
    assert_eq!(squeue(), "S SuspendedByAdmin", "{s:#}");
    assert_eq!(freezer(&freezer_dir, "FROZEN"), "FROZEN");
    let listed = c.json(&["jobs"]);
    let row = listed.as_array().unwrap().iter().find(|r| r["id"] == id).cloned().unwrap_or_default();
    assert_eq!(row["state"], "suspended", "berth jobs: {listed:#}");
    // Every process of the job is frozen in the kernel.
    let procs = std::fs::read_to_string(freezer_dir.join("cgroup.procs")).unwrap();
    let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(!pids.is_empty(), "no process in {}", freezer_dir.display());
    for pid in &pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let state = status.lines().find(|l| l.starts_with("State:")).unwrap_or("");
        assert!(state.contains("D (disk sleep)"), "pid {pid} not frozen: {state}");
    }
    let frozen_at = lines(&count);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(lines(&count), frozen_at, "the suspended job went on counting");
    // Its core is free for others; its memory stays counted on the node.
    let node = &c.json(&["nodes"])[0];
    assert_eq!(node["cpus_allocated"], 0, "{node:#}");
    assert_eq!(node["memory_allocated_bytes"], 64u64 << 20, "{node:#}");

    let r = c.json(&["resume", &id.to_string()]);
    assert!(per_id_ok(&r), "{r:#}");
    assert_eq!(c.show(id)["state"], "running");
    assert_eq!(squeue(), "R None", "a running job has no reason");
    assert_eq!(freezer(&freezer_dir, "THAWED"), "THAWED");
    assert!(grows(&count, frozen_at), "the resumed job does not count");

    let done = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(done["state"], "completed", "{done:#}");
    assert_eq!(lines(&count), 80, "it counted to its end");
    let suspended = done["suspended_seconds"].as_f64().unwrap_or(0.0);
    assert!(suspended >= 1.5, "suspended_seconds {suspended}: {done:#}");
    assert!(!freezer_dir.exists(), "{} left behind", freezer_dir.display());
    assert_no_cgroups(&c, id);
}

#[test]
fn resumed_on_the_free_core_with_its_walltime_moved_back() {
    let c = Cluster::up(1, MAPPED);
    let count = c.root().join("count");
    let id = c.submit("count.sh", &counter(&count, 0, "--walltime 4"), &[]);
    let j = c.wait_state(id, &["running"], Duration::from_secs(30));
    let started = Instant::now();
    assert_eq!(j["allocation"][0]["cpus"], "0");
    assert!(grows(&count, 3));
    assert!(per_id_ok(&c.json(&["suspend", &id.to_string()])));
    let cpuset_dir = cgroup_dir(&c, id, "cpuset");
    assert_eq!(freezer(&cgroup_dir(&c, id, "freezer"), "FROZEN"), "FROZEN");
    // Another job takes the suspended job's core.
    let other = c.submit("other.sh", "#!/bin/sh\n#BERTH --cores 1 --mem 64M\nsleep 300\n", &[]);
    let o = c.wait_state(other, &["running"], Duration::from_secs(30));
    assert_eq!(o["allocation"][0]["cpus"], "0", "{o:#}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.show(id)["state"], "suspended", "the walltime passed while suspended");

    // Resumed on the other core: the cgroup's CPUs change in the kernel.
    assert!(per_id_ok(&c.json(&["resume", &id.to_string()])));
    let r = c.show(id);
    assert_eq!((r["state"].as_str(), r["allocation"][0]["cpus"].as_str()), (Some("running"), Some("1")), "{r:#}");
    let t0 = Instant::now();
    let cpus = loop {
        let cpus = std::fs::read_to_string(cpuset_dir.join("cpuset.cpus")).unwrap_or_default().trim().to_string();
        if cpus == "1" || t0.elapsed() > Duration::from_secs(10) {
            break cpus;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(cpus, "1", "the job's cpuset did not move");
    let at = lines(&count);
    assert!(grows(&count, at), "the moved job does not count");

    let done = c.wait_finished(id, Duration::from_secs(30));
    let ran = started.elapsed();
    assert_eq!(done["state"], "timeout", "{done:#}");
    // 4 s of walltime plus the 3 s and more it was suspended.
    assert!(ran >= Duration::from_secs(7), "ended {ran:?} after it started: the suspension was counted");
    assert!(done["suspended_seconds"].as_f64().unwrap_or(0.0) >= 3.0, "{done:#}");
    assert!(per_id_ok(&c.json(&["cancel", &other.to_string()])));
    c.wait_finished(other, Duration::from_secs(30));
    assert_no_cgroups(&c, id);
    assert_no_cgroups(&c, other);
}
