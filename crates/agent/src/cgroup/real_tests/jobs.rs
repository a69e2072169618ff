//! Real v1 job lifecycle tests: limits, joining, killing, OOM, freezing.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use super::*;

#[test]
fn v1_create_join_kill_remove() {
    let Some(r) = v1_root("v1_create_join_kill_remove", unique("berth-test/cg")) else {
        return;
    };
    let b = &r.backend;
    let limits = JobLimits {
        cpus: "0".into(),
        mems: "0".into(),
        memory_limit_bytes: mib(64),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = b.create("job_1", &limits).unwrap();
    let p = r.paths();
    assert_eq!(read(&p.cpuset.join("job_1/cpuset.cpus")), "0");
    assert_eq!(read(&p.cpuset.join("job_1/cpuset.mems")), "0");
    assert_eq!(read(&p.memory.join("job_1/memory.limit_in_bytes")), "67108864");
    let memsw = p.memory.join("job_1/memory.memsw.limit_in_bytes");
    if memsw.exists() {
        assert_eq!(read(&memsw), "67108864");
    }
    assert!(read(&p.memory.join("job_1/memory.oom_control")).contains("oom_kill_disable 0"));
    assert_eq!(read(&p.freezer.join("job_1/freezer.state")), "THAWED");
    assert!(matches!(b.create("job_1", &limits), Err(CgroupError::AlreadyExists { .. })));
    assert_eq!(b.list().unwrap(), ["job_1"]);
    assert!(b.open("job_1").unwrap().is_some());
    assert!(b.open("job_2").unwrap().is_none());

    let mut child = spawn_in(&*job, "sleep 100 & (setsid sleep 100 &) ; exec sleep 100");
    let pids = wait_pids(&*job, 3);
    assert!(pids.len() >= 3, "expected >= 3 processes, got {pids:?}");
    assert!(pids.contains(&(child.id() as i32)));
    let job_rel = format!("/{}/job_1", r.rel);
    std::thread::sleep(Duration::from_millis(200)); // let the subshell exit
    for pid in job.pids().unwrap() {
        // Skip a process caught exiting (shown in the root cgroup then).
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if read(Path::new(&format!("/proc/{pid}/stat"))).contains(") Z ") {
            continue;
        }
        for ctl in ["cpuset", "memory", "freezer", "cpuacct"] {
            assert!(
                cg.lines().any(|l| l.contains(ctl) && l.ends_with(&job_rel)),
                "pid {pid} not in {ctl}:{job_rel}:\n{cg}"
            );
        }
    }

    let start = Instant::now();
    job.kill_all(Duration::from_secs(5)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(job.is_empty().unwrap());
    assert_eq!(wait_child(&mut child, Duration::from_secs(5)).signal(), Some(libc::SIGKILL));
    let u = job.usage().unwrap();
    assert!(u.peak_memory_bytes > 0, "{u:?}");
    assert_eq!(u.oom_kills, 0);

    job.remove().unwrap();
    for d in r.dirs(Some("job_1")) {
        assert!(!d.exists(), "{} still exists", d.display());
    }
    job.remove().unwrap(); // idempotent
    assert!(b.open("job_1").unwrap().is_none());
    r.finish();
}

/// A GPU node's job: its devices cgroup denies the stand-ins of the GPUs it does not hold
/// (here a copy of /dev/random's numbers, 1:8), the one it holds (/dev/full's, 1:7) opens.
#[test]
fn v1_devices_deny_other_gpus() {
    let Some(r) = v1_root_with("v1_devices_deny_other_gpus", unique("berth-test/cg"), true) else {
        return;
    };
    let b = &r.backend;
    assert!(b.contains_devices());
    let tmp = tempfile::tempdir().unwrap();
    let (mine, other) = (tmp.path().join("nvidia0"), tmp.path().join("nvidia1"));
    for (path, minor) in [(&mine, 7), (&other, 8)] {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C path; mknod has no other precondition.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
        assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
    }
    let mut topo = berth_core::topology::Topology::uniform(1, 2, 1, 1, 1 << 30);
    topo.add_emulated_gpus(1).unwrap();
    crate::gpu_devices::assign_device_files(&mut topo, false, Some(tmp.path()));
    let deny = crate::gpu_devices::deny_rules(&topo.gpus, &[0]);
    assert_eq!(deny, [(1, 8)]);
    let limits = JobLimits { deny_devices: deny, ..JobLimits::default() };
    let job = b.create("job_gpu", &limits).unwrap();
    let dir = r.paths().devices.unwrap().join("job_gpu");
    let list = read(&dir.join("devices.list"));
    assert!(!list.contains("c 1:8") && !list.is_empty(), "1:8 no longer allowed: {list}");
    let script = format!(
        "head -c1 {} >/dev/null || exit 3; if head -c1 {} >/dev/null 2>&1; then exit 4; fi; exit 0",
        mine.display(),
        other.display()
    );
    let mut child = spawn_in(&*job, &script);
    let status = wait_child(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "3: own GPU refused, 4: other GPU opened");
    // Outside the job the other stand-in opens: the rule is the job's only.
    assert!(std::fs::File::open(&other).is_ok());
    job.kill_all(Duration::from_secs(5)).unwrap();
    job.remove().unwrap();
    assert!(!dir.exists(), "the devices cgroup goes with the job");
    r.finish();
}

#[test]
fn v1_oom_kill_is_counted() {
    let Some(r) = v1_root("v1_oom_kill_is_counted", unique("berth-test/cg")) else {
        return;
    };
    let limits = JobLimits {
        cpus: String::new(),
        mems: String::new(),
        memory_limit_bytes: mib(32),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = r.backend.create("oom", &limits).unwrap();
    let mut child = spawn_in(&*job, "head -c 300m /dev/zero | tail");
    let st = wait_child(&mut child, Duration::from_secs(60));
    // tail is the one OOM-killed; sh reports it as 128+9 (or dies itself).
    assert!(st.signal() == Some(libc::SIGKILL) || st.code() == Some(128 + libc::SIGKILL), "{st:?}");
    let u = job.usage().unwrap();
    assert!(u.oom_kills >= 1, "{u:?}");
    assert!(u.peak_memory_bytes > (16 << 20) && u.peak_memory_bytes <= (33 << 20), "{u:?}");
    job.kill_all(Duration::from_secs(5)).unwrap();
    job.remove().unwrap();
    r.finish();
}

fn cpu_usec(job: &dyn JobCgroup) -> u64 {
    let u = job.usage().unwrap();
    u.user_cpu_usec + u.system_cpu_usec
}

#[test]
fn v1_freeze_thaw_and_cpu_accounting() {
    let Some(r) = v1_root("v1_freeze_thaw_and_cpu_accounting", unique("berth-test/cg")) else {
        return;
    };
    let job = r.backend.create("spin", &JobLimits::default()).unwrap();
    let mut child = spawn_in(&*job, "while :; do :; done");
    std::thread::sleep(Duration::from_millis(100));
    job.freeze().unwrap();
    let state = r.paths().freezer.join("spin/freezer.state");
    assert_eq!(read(&state), "FROZEN");
    let t1 = cpu_usec(&*job);
    std::thread::sleep(Duration::from_millis(300));
    let t2 = cpu_usec(&*job);
    assert!(t2 - t1 < 2_000, "frozen job used CPU: {t1} -> {t2} usec");
    job.thaw().unwrap();
    assert_eq!(read(&state), "THAWED");
    std::thread::sleep(Duration::from_millis(300));
    let t3 = cpu_usec(&*job);
    // Microseconds, not ns or ticks: ~300 ms of one CPU.
    assert!((10_000..=2_000_000).contains(&(t3 - t2)), "thawed job used {} usec", t3 - t2);
    job.kill_all(Duration::from_secs(5)).unwrap();
    assert_eq!(wait_child(&mut child, Duration::from_secs(5)).signal(), Some(libc::SIGKILL));
    job.remove().unwrap();
    r.finish();
}

#[test]
fn v1_kill_all_stops_fork_storm() {
    let Some(r) = v1_root("v1_kill_all_stops_fork_storm", unique("berth-test/cg")) else {
        return;
    };
    let job = r.backend.create("storm", &JobLimits::default()).unwrap();
    let script = "i=0; while [ $i -lt 3000 ]; do sleep 100 & (sleep 100 &) ; i=$((i+1)); done; wait";
    let mut child = spawn_in(&*job, script);
    let pids = wait_pids(&*job, 50);
    assert!(pids.len() >= 50, "{}", pids.len());
    job.kill_all(Duration::from_secs(5)).unwrap();
    assert!(job.is_empty().unwrap());
    wait_child(&mut child, Duration::from_secs(5));
    job.remove().unwrap();
    r.finish();
}

#[test]
fn v1_update_limits() {
    let Some(r) = v1_root("v1_update_limits", unique("berth-test/cg")) else {
        return;
    };
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let mut limits = JobLimits {
        cpus: "0".into(),
        mems: "0".into(),
        memory_limit_bytes: mib(64),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = r.backend.create("upd", &limits).unwrap();
    let dir = r.paths().memory.join("upd");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let check = |want: &str| {
        assert_eq!(read(&dir.join("memory.limit_in_bytes")), want);
        if memsw.exists() {
            assert_eq!(read(&memsw), want);
        }
    };
    for (limit, want) in [(mib(128), "134217728"), (mib(32), "33554432"), (None, "9223372036854771712")] {
        limits.memory_limit_bytes = limit;
        job.update(&limits).unwrap();
        check(want);
    }
    job.update(&JobLimits::default()).unwrap();
    assert_eq!(read(&r.paths().cpuset.join("upd/cpuset.cpus")), cpus);
    assert_eq!(read(&r.paths().cpuset.join("upd/cpuset.mems")), mems);
    let bad = JobLimits { cpus: "4095".into(), ..JobLimits::default() };
    let e = job.update(&bad).unwrap_err().to_string();
    assert!(e.contains("cpuset.cpus") && e.contains("kernel rejected the value"), "{e}");
    job.remove().unwrap();
    r.finish();
}

#[test]
fn v1_a_spare_is_taken_by_the_next_create_and_is_no_job() {
    let Some(r) = v1_root("v1_a_spare_is_taken_by_the_next_create_and_is_no_job", unique("berth-test/cg")) else {
        return;
    };
    let b = &r.backend;
    let p = r.paths();
    let limits = JobLimits {
        cpus: "0".into(),
        mems: "0".into(),
        memory_limit_bytes: mib(64),
        pids_max: None,
        deny_devices: vec![],
    };
    b.make_spare().unwrap();
    b.make_spare().unwrap(); // one is enough: already there
    assert_eq!(b.list().unwrap(), ["spare"]);
    let ino = |d: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(d).unwrap());
    let spare_dirs: Vec<u64> = r.dirs(Some("spare")).iter().map(|d| ino(d)).collect();

    // Taken: the same directories, renamed, limits set, the OOM killer on.
    let job = b.create("job_1", &limits).unwrap();
    assert_eq!(r.dirs(Some("job_1")).iter().map(|d| ino(d)).collect::<Vec<_>>(), spare_dirs);
    assert_eq!(b.list().unwrap(), ["job_1"]);
    assert_eq!(read(&p.cpuset.join("job_1/cpuset.cpus")), "0");
    assert_eq!(read(&p.memory.join("job_1/memory.limit_in_bytes")), "67108864");
    assert!(read(&p.memory.join("job_1/memory.oom_control")).contains("oom_kill_disable 0"));
    let mut child = spawn_in(&*job, "exec sleep 100");
    assert_eq!(wait_pids(&*job, 1), vec![child.id() as i32]);

    // A name already there is refused, and the spare stays whole for the next job.
    b.make_spare().unwrap();
    assert!(matches!(b.create("job_1", &limits), Err(CgroupError::AlreadyExists { .. })));
    assert_eq!(b.list().unwrap(), ["job_1", "spare"]);
    for d in r.dirs(Some("spare")) {
        assert!(d.is_dir(), "{} gone", d.display());
    }
    // job_2 takes it; with none left, job_3's directories are made.
    b.create("job_2", &limits).unwrap();
    let job3 = b.create("job_3", &limits).unwrap();
    assert_eq!(b.list().unwrap(), ["job_1", "job_2", "job_3"]);
    assert_eq!(read(&p.cpuset.join("job_3/cpuset.mems")), "0");
    drop(job3);

    job.kill_all(Duration::from_secs(5)).unwrap();
    wait_child(&mut child, Duration::from_secs(5));
    b.make_spare().unwrap();
    r.finish(); // the spare goes with the root
}

/// A suspended job resumed on other CPUs gets new memory nodes (issue 17 item 3): the move
/// (freeze, update, thaw, as `suspend::resume` does) sets `cpuset.memory_migrate` so that the
/// kernel moves its pages, writes `cpuset.mems`, and the job's processes may then use only
/// the new memory nodes, their pages on them. On a one-NUMA host the page move is trivial; the
/// files and what the processes see are what is checked.
#[test]
fn v1_moved_job_memory_follows_its_mems() {
    let Some(r) = v1_root("v1_moved_job_memory_follows_its_mems", unique("berth-test/cg")) else {
        return;
    };
    let (cpus, mems) = r.backend.root_cpus_mems().unwrap();
    let all_cpus = berth_core::CpuSet::parse_list(&cpus).unwrap();
    let all_mems = berth_core::CpuSet::parse_list(&mems).unwrap();
    let (first_cpu, last_cpu) = (all_cpus.iter().next().unwrap(), all_cpus.iter().last().unwrap());
    let first_mem = all_mems.iter().next().unwrap();
    let limits = |cpu: u32, mems: &str| JobLimits {
        cpus: cpu.to_string(),
        mems: mems.into(),
        memory_limit_bytes: mib(256),
        pids_max: None,
        deny_devices: vec![],
    };
    let job = r.backend.create("mig", &limits(first_cpu, &first_mem.to_string())).unwrap();
    let memory_migrate = r.paths().cpuset.join("mig/cpuset.memory_migrate");
    // The shell holds 8 MB it has touched, on its memory node.
    let mut child = spawn_in(&*job, "a=$(head -c 8000000 /dev/zero | tr '\\0' x); echo ${#a} >/dev/null; sleep 100");
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(500));
    job.freeze().unwrap();
    job.update(&limits(last_cpu, &mems)).unwrap();
    job.thaw().unwrap();
    assert_eq!(read(&memory_migrate), "1", "pages follow a change of cpuset.mems");
    assert_eq!(read(&r.paths().cpuset.join("mig/cpuset.mems")), mems);
    assert_eq!(read(&r.paths().cpuset.join("mig/cpuset.cpus")), last_cpu.to_string());
    let status = read(Path::new(&format!("/proc/{pid}/status")));
    let allowed = status.lines().find_map(|l| l.strip_prefix("Mems_allowed_list:")).map(str::trim);
    assert_eq!(allowed, Some(mems.as_str()), "{status}");
    // Every page of the process is on a node of its new cpuset.mems.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap_or_default();
    for page_node in maps.split_whitespace().filter_map(|t| t.strip_prefix('N')?.split_once('=')?.0.parse::<u32>().ok())
    {
        assert!(all_mems.contains(page_node), "a page on node {page_node}, outside {mems}");
    }
    job.kill_all(Duration::from_secs(5)).unwrap();
    let _ = wait_child(&mut child, Duration::from_secs(5));
    job.remove().unwrap();
    r.finish();
}
