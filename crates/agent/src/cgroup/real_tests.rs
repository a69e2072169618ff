//! Tests against the real cgroup file system. They need root and cgroup v1
//! (cpuset, memory, freezer, cpuacct) and fail loudly otherwise, unless
//! BERTH_SKIP_CGROUP_TESTS=1, which turns them into a printed "SKIPPED".
//! Everything is created under a unique "berth-test/..." subtree and removed.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::v1::{V1Backend, V1Paths};
use super::*;

mod jobs;
mod launch;
mod ranks;
mod reuse;
mod suspend;
mod tree;
mod v2_devices;

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst))
}

/// None (test skipped) only when BERTH_SKIP_CGROUP_TESTS=1; otherwise panics.
fn precondition_failed<T>(test: &str, reason: &str) -> Option<T> {
    if std::env::var("BERTH_SKIP_CGROUP_TESTS").as_deref() == Ok("1") {
        // Straight to fd 2: libtest captures eprintln! of passing tests.
        let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
        return None;
    }
    panic!("{test}: precondition failed: {reason} (needs root and cgroup v1; set BERTH_SKIP_CGROUP_TESTS=1 to skip)");
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A prepared v1 subtree, removed (best effort) on drop.
struct Root {
    backend: V1Backend,
    rel: String,
}

impl Drop for Root {
    fn drop(&mut self) {
        if let Err(e) = self.backend.remove_root() {
            eprintln!("cleanup of {} failed: {e}", self.rel);
        }
    }
}

impl Root {
    fn paths(&self) -> V1Paths {
        self.backend.root_paths()
    }

    fn dirs(&self, job: Option<&str>) -> Vec<PathBuf> {
        let p = self.paths();
        let mut v = vec![p.cpuset, p.memory, p.freezer, p.cpuacct];
        v.extend(p.pids);
        v.extend(p.devices);
        v.into_iter().map(|d| job.map(|j| d.join(j)).unwrap_or(d)).collect()
    }

    /// remove_root and check nothing is left in any hierarchy.
    fn finish(self) {
        self.backend.remove_root().unwrap();
        for d in self.dirs(None) {
            assert!(!d.exists(), "{} left behind", d.display());
        }
    }
}

fn v1_root(test: &str, rel: String) -> Option<Root> {
    v1_root_with(test, rel, false)
}

/// [`v1_root`], with the `devices` hierarchy when `devices` (a GPU node's backend).
fn v1_root_with(test: &str, rel: String, devices: bool) -> Option<Root> {
    if !is_root() {
        return precondition_failed(test, "not running as root");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default();
    if devices && v1_mount(&mounts, "devices").is_none() {
        return precondition_failed(test, "the cgroup v1 devices controller is not mounted");
    }
    let backend = match V1Backend::from_mounts_with(&mounts, &rel, devices) {
        Ok(b) => b,
        Err(e) => return precondition_failed(test, &e.to_string()),
    };
    if let Err(e) = backend.prepare_root() {
        return precondition_failed(test, &e.to_string());
    }
    Some(Root { backend, rel })
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())).trim().to_string()
}

/// Spawn `sh -c script` joined to `job` between fork and exec.
fn spawn_in(job: &dyn JobCgroup, script: &str) -> Child {
    let files = job.join_files().unwrap();
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: the hook only calls the async-signal-safe join_from_child.
    unsafe {
        cmd.pre_exec(move || join_from_child(&fds));
    }
    let child = cmd.spawn().unwrap();
    drop(files);
    child
}

fn wait_child(child: &mut Child, timeout: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            panic!("child {} still running after {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_pids(job: &dyn JobCgroup, at_least: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let pids = job.pids().unwrap();
        if pids.len() >= at_least || start.elapsed() > Duration::from_secs(5) {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mib(n: u64) -> Option<u64> {
    Some(n << 20)
}
