//! Real tests of the subtree: setup, removal, detection, v2 core files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::{procs, v2::V2Job};
use super::*;

#[test]
fn v1_root_setup() {
    let Some(r) = v1_root("v1_root_setup", unique("berth-test/cg")) else {
        return;
    };
    r.backend.prepare_root().unwrap(); // idempotent
    let top = r.paths().cpuset.ancestors().nth(2).map(Path::to_path_buf).unwrap_or_default();
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    assert_eq!(cpus, read(&top.join("cpuset.effective_cpus")));
    assert_eq!(mems, read(&top.join("cpuset.effective_mems")));
    assert_eq!(read(&r.paths().memory.join("memory.use_hierarchy")), "1");
    assert!(r.backend.list().unwrap().is_empty());
    assert!(matches!(r.backend.create("bad/name", &JobLimits::default()), Err(CgroupError::InvalidName { .. })));
    r.finish();
}

#[test]
fn v1_remove_root_cleans_leftovers_and_partial_jobs() {
    let Some(r) = v1_root("v1_remove_root_cleans_leftovers", unique("berth-test/cg")) else {
        return;
    };
    let job = r.backend.create("left", &JobLimits::default()).unwrap();
    let mut child = spawn_in(&*job, "sleep 100 & exec sleep 100");
    assert!(wait_pids(&*job, 2).len() >= 2);
    // A job that only made it into one hierarchy (agent crashed mid-create).
    std::fs::create_dir(r.paths().memory.join("partial")).unwrap();
    assert_eq!(r.backend.list().unwrap(), ["left", "partial"]);
    assert!(r.backend.open("partial").unwrap().is_some());
    r.finish();
    assert_eq!(wait_child(&mut child, Duration::from_secs(5)).signal(), Some(libc::SIGKILL));
}

#[test]
fn v1_remove_root_keeps_shared_ancestors() {
    let top = unique("berth-test-anc");
    let (Some(a), Some(b)) = (
        v1_root("v1_remove_root_keeps_shared_ancestors", format!("{top}/x/a")),
        v1_root("v1_remove_root_keeps_shared_ancestors", format!("{top}/x/b")),
    ) else {
        return;
    };
    let shared = b.paths().cpuset.parent().map(Path::to_path_buf).unwrap_or_default();
    a.finish();
    assert!(shared.is_dir() && b.paths().cpuset.is_dir());
    let top_dirs: Vec<PathBuf> =
        b.dirs(None).iter().filter_map(|d| d.ancestors().nth(2)).map(Path::to_path_buf).collect();
    b.finish();
    for d in top_dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn detect_on_this_host() {
    if !is_root() {
        precondition_failed::<()>("detect_on_this_host", "not running as root");
        return;
    }
    match detect("berth-test/detect") {
        Ok(b) => {
            // This host has the v1 controllers berth needs (cpuset, memory, freezer, cpuacct):
            // the backend found must be v1 and its mounts must exist.
            let cpuset = b.cpuset_mount();
            assert!(
                cpuset.is_dir(),
                "detected backend {b:?} names a cpuset mount {} that does not exist",
                cpuset.display()
            );
            let v1_here = std::path::Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists();
            assert_eq!(
                v1_here,
                cpuset.join("cpuset.cpus").exists(),
                "detected {b:?} on a host with v1 cpuset = {v1_here}"
            );
        }
        Err(e) => {
            precondition_failed::<()>("detect_on_this_host", &e.to_string());
        }
    }
}

/// v2's freezer, cgroup.kill and joining are core features, so they can be
/// exercised on a controller-less cgroup2 mount (hybrid hosts) too.
#[test]
fn v2_core_files_on_cgroup2_mount() {
    let test = "v2_core_files_on_cgroup2_mount";
    if !is_root() {
        return precondition_failed(test, "not running as root").unwrap_or(());
    }
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(mount) = parse_mountinfo(&text).into_iter().find(|m| m.fs_type == "cgroup2") else {
        return precondition_failed(test, "no cgroup2 mount").unwrap_or(());
    };
    let rel = unique("berth-test/v2");
    let root = mount.mount_point.join(&rel);
    std::fs::create_dir_all(&root).unwrap();
    let job = V2Job::at(root.join("job_1"), root.clone());
    std::fs::create_dir(job.dir()).unwrap();

    let mut child = spawn_in(&job, "sleep 100 & (setsid sleep 100 &) ; exec sleep 100");
    assert!(wait_pids(&job, 3).len() >= 3);
    job.freeze().unwrap();
    assert!(read(&job.dir().join("cgroup.events")).contains("frozen 1"));
    job.thaw().unwrap();
    job.kill_all(Duration::from_secs(5)).unwrap(); // cgroup.kill when present
    assert!(job.is_empty().unwrap());
    assert_eq!(wait_child(&mut child, Duration::from_secs(5)).signal(), Some(libc::SIGKILL));

    // The freeze-and-kill fallback used where cgroup.kill is missing.
    let mut child = spawn_in(&job, "while :; do sleep 100 & done");
    assert!(wait_pids(&job, 10).len() >= 10);
    procs::freeze_kill_loop(
        Duration::from_secs(5),
        procs::KillOps { pids: &|| job.pids(), freeze: &|_| job.freeze(), thaw: &|| job.thaw() },
    )
    .unwrap();
    wait_child(&mut child, Duration::from_secs(5));
    assert!(job.usage().unwrap().user_cpu_usec + job.usage().unwrap().system_cpu_usec > 0);
    job.remove().unwrap();
    util::remove_chain(&mount.mount_point, Path::new(&rel)).unwrap();
    assert!(!root.exists());
}
