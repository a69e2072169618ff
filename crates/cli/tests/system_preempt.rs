//! Preemption by suspension on real agents: a large job suspends the two small jobs that fill
//! the node (frozen in the kernel, memory kept), runs, and the small jobs resume after it and
//! complete; nothing is left behind.

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// 2 single-thread cores: PU n runs on real CPU n.
const MAPPED: &str = "package:1 core:2 pu:1";

/// Jobs of more than one CPU are "large" and may suspend smaller ones at once.
const CONFIG: &str = "[preempt]\nenabled = true\nlarge_cpus = 1\nmin_score = 1.0\nmin_run_secs_before_suspend = 0.0\nmax_suspended_secs = 600.0\n";

/// A 1-core job appending a line to `file` every 50 ms, `n` times.
fn counter(file: &Path, n: u32) -> String {
    format!(
        "#!/bin/sh\n#BERTH --cores 1 --mem 32M --walltime 120\ni=0\nwhile [ $i -lt {n} ]; do i=$((i+1)); echo $i >> {f}; sleep 0.05; done\n",
        f = file.display()
    )
}

fn lines(file: &Path) -> usize {
    std::fs::read_to_string(file).map(|t| t.lines().count()).unwrap_or(0)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_large_job_suspends_two_small_ones_and_they_resume_after_it() {
    let c = Cluster::up_configured(1, MAPPED, CONFIG);
    let bin = c.root().join("bin");
    c.json(&["compat", "install", &bin.display().to_string()]);
    let files: Vec<_> = (0..2).map(|i| c.root().join(format!("count{i}"))).collect();
    let small: Vec<u64> =
        files.iter().enumerate().map(|(i, f)| c.submit(&format!("s{i}.sh"), &counter(f, 100), &[])).collect();
    for (id, f) in small.iter().zip(&files) {
        c.wait_state(*id, &["running"], Duration::from_secs(30));
        wait_for("the small jobs to count", || lines(f) > 2);
    }
    let marker = c.root().join("large-ran");
    let large = c.submit(
        "large.sh",
        &format!("#!/bin/sh\n#BERTH --cores 2 --mem 32M --walltime 60\nsleep 2\ntouch {}\n", marker.display()),
        &[],
    );
    c.wait_state(large, &["running"], Duration::from_secs(30));
    for id in &small {
        let s = c.show(*id);
        assert_eq!(s["state"], "suspended", "{s:#}");
        assert!(s["reason"].as_str().unwrap_or("").contains(&format!("preempted by job {large}")), "{s:#}");
        // squeue says why it does not run: preempted, or (once a pass tried to resume it)
        // waiting for its cores.
        let q = named_ok(&c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%t %r"]);
        assert!(["S Preempted", "S Resources"].contains(&q.trim()), "squeue: {q:?}, {s:#}");
    }
    // Frozen: neither counter moves while the large job runs.
    let frozen: Vec<usize> = files.iter().map(|f| lines(f)).collect();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(files.iter().map(|f| lines(f)).collect::<Vec<_>>(), frozen, "a suspended job went on counting");
    // Their memory stays allocated on the node (2 x 32M), with the large job's 32M.
    let node = &c.json(&["nodes"])[0];
    assert_eq!(node["memory_allocated_bytes"], 96u64 << 20, "{node:#}");

    let done = c.wait_finished(large, Duration::from_secs(60));
    assert_eq!(done["state"], "completed", "{done:#}");
    assert!(marker.exists(), "the large job did not run to its end");
    for (id, f) in small.iter().zip(&files) {
        let d = c.wait_finished(*id, Duration::from_secs(60));
        assert_eq!(d["state"], "completed", "{d:#}");
        assert_eq!(lines(f), 100, "job {id} counted to its end after resuming");
        let suspended = d["suspended_seconds"].as_f64().unwrap_or(0.0);
        assert!(suspended >= 1.5, "job {id} suspended_seconds {suspended}");
    }
    // Nothing of the jobs is left in the kernel.
    for ctrl in ["cpuset", "memory", "freezer", "cpuacct"] {
        let node_dir = cgroup_mount(ctrl).join("berth").join(c.cluster_id()).join("node1");
        for id in small.iter().chain([&large]) {
            let cg = node_dir.join(format!("job_{id}"));
            assert!(!cg.exists(), "{} left behind", cg.display());
        }
    }
}
