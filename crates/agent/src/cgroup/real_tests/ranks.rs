//! Real v1 rank sub-cpusets: the kernel's lists, handing the job's cpuset to its user, and
//! removal of the children with the job.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use berth_core::CpuSet;

use super::*;

/// The unprivileged user the job runs as (nobody).
const NOBODY: u32 = 65534;

/// Spawn `sh -c script` joined to `job`, then as uid/gid `NOBODY` (like a job's script).
fn spawn_as_nobody(job: &dyn JobCgroup, script: &str) -> Child {
    let files = job.join_files().unwrap();
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: the hook only makes async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            join_from_child(&fds)?;
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(files);
    child
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    (m.uid(), m.gid())
}

/// The cpuset line of /proc/<pid>/cgroup once it ends with `want` (or the last seen).
fn wait_cpuset_of(pid: u32, want: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let line = text.lines().find(|l| l.split(':').nth(1) == Some("cpuset")).unwrap_or("").to_string();
        if line.ends_with(want) || start.elapsed() > Duration::from_secs(5) {
            return line;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn v1_rank_cpusets_owned_by_user_and_removed_with_job() {
    let Some(r) = v1_root("v1_rank_cpusets_owned_by_user_and_removed_with_job", unique("berth-test/cg")) else {
        return;
    };
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let host: Vec<u32> = CpuSet::parse_list(&cpus).unwrap().iter().take(2).collect();
    // One-CPU hosts: both ranks share it.
    let (c0, c1) = (host[0].to_string(), host.get(1).unwrap_or(&host[0]).to_string());
    let mem = CpuSet::parse_list(&mems).unwrap().iter().next().unwrap().to_string();
    let job_cpus = CpuSet::from_iter_u32(host.iter().copied()).to_list();
    let limits = JobLimits {
        cpus: job_cpus.clone(),
        mems: mem.clone(),
        memory_limit_bytes: mib(64),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = r.backend.create("ranks", &limits).unwrap();
    let dir = job.cpuset_dir();
    assert_eq!(dir, r.paths().cpuset.join("ranks"));
    assert_eq!(r.backend.cpuset_mount().join(&r.rel).join("ranks"), dir);

    let r0 = job.make_child("rank0", &c0, &mem).unwrap();
    let r1 = job.make_child("rank1", &c1, "").unwrap(); // empty: the job's memory nodes
    assert_eq!((r0.clone(), r1.clone()), (dir.join("rank0"), dir.join("rank1")));
    for (d, c) in [(&r0, &c0), (&r1, &c1)] {
        assert_eq!(read(&d.join("cpuset.cpus")), *c, "{}", d.display());
        assert_eq!(read(&d.join("cpuset.mems")), mem, "{}", d.display());
    }
    assert_eq!(job.read_cpuset(None).unwrap(), Some((job_cpus, mem.clone())));
    assert_eq!(job.read_cpuset(Some("rank1")).unwrap(), Some((c1.clone(), mem.clone())));
    assert!(matches!(job.make_child("rank0", &c0, &mem), Err(CgroupError::AlreadyExists { .. })));
    assert!(matches!(job.make_child("../x", &c0, &mem), Err(CgroupError::InvalidName { .. })));
    assert!(matches!(job.read_cpuset(Some("a/b")), Err(CgroupError::InvalidName { .. })));
    // Outside the job's CPUs: the kernel refuses, and no half-made child stays.
    let e = job.make_child("bad", "4095", &mem).unwrap_err().to_string();
    assert!(e.contains("cpuset.cpus"), "{e}");
    assert!(!dir.join("bad").exists());

    job.chown_cpuset(NOBODY, NOBODY).unwrap();
    for d in [&dir, &r0, &r1] {
        for p in [d.clone(), d.join("tasks"), d.join("cgroup.procs")] {
            assert_eq!(owner(&p), (NOBODY, NOBODY), "{}", p.display());
        }
        // The limits stay root's: the user cannot widen a rank or the job.
        assert_eq!(owner(&d.join("cpuset.cpus")), (0, 0), "{}", d.display());
    }
    assert_eq!(owner(&r.paths().memory.join("ranks")).0, 0, "only the cpuset hierarchy is given");
    assert_eq!(owner(&r.paths().freezer.join("ranks")).0, 0, "only the cpuset hierarchy is given");

    // As the user: make its own sub-cpuset, move itself into rank 1.
    let script = format!("mkdir {0}/mine && echo $$ > {1}/tasks && exec sleep 100", dir.display(), r1.display());
    let mut child = spawn_as_nobody(&*job, &script);
    let want = format!("/{}/ranks/rank1", r.rel);
    let line = wait_cpuset_of(child.id(), &want);
    assert!(line.ends_with(&want), "not moved into rank1: {line:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    assert!(status.contains(&format!("Cpus_allowed_list:\t{c1}\n")), "{status}");
    assert_eq!(owner(&dir.join("mine")), (NOBODY, NOBODY));
    assert!(job.pids().unwrap().contains(&(child.id() as i32)), "nested cgroups are part of the job");

    job.kill_all(Duration::from_secs(5)).unwrap();
    assert_eq!(wait_child(&mut child, Duration::from_secs(5)).signal(), Some(libc::SIGKILL));
    job.remove().unwrap(); // children (ranks and the user's) first
    for d in r.dirs(Some("ranks")) {
        assert!(!d.exists(), "{} still exists", d.display());
    }
    r.finish();
}
