//! An ended job's cgroup as the next job's (JobCgroup::retire, issue 19): jobs in a row on one
//! core, through the agent's own end of a job (`cleanup_blocking`: kill, accounting, verdict,
//! retire), and what the next job in the same place sees.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use berth_core::job::JobOutcome;
use berth_core::JobId;

use super::*;
use crate::cgroup::v1::spare::{LEFT_MAX, SPARE};

fn ino(d: &Path) -> u64 {
    std::fs::metadata(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())).ino()
}

/// Run `script` in `job` to its end, then end the job as the agent does; its outcome.
fn run_and_end(job: Box<dyn JobCgroup>, id: u64, script: &str, pids_max: Option<u64>) -> JobOutcome {
    let mut child = spawn_in(&*job, script);
    let st = wait_child(&mut child, Duration::from_secs(60));
    let outcome = JobOutcome { exit_code: st.code(), signal: st.signal(), ..Default::default() };
    let spool = std::env::temp_dir().join(format!("berth-test-no-spool-{}-{id}", std::process::id()));
    crate::job::cleanup_blocking(JobId(id), &*job, &spool, pids_max, outcome)
}

fn limits(cpu: &str, mem_mib: u64, pids_max: Option<u64>) -> JobLimits {
    JobLimits {
        cpus: cpu.into(),
        mems: String::new(),
        memory_limit_bytes: mib(mem_mib),
        pids_max,
        deny_devices: vec![],
    }
}

/// The first job is OOM-killed and refused forks at its process limit: its cgroup does not
/// become the spare (those counters cannot be reset in v1), and the next job on the same core
/// starts from nothing, is accounted alone and ends without a verdict of the first.
#[test]
fn v1_a_job_after_an_oom_killed_and_fork_limited_one_is_clean() {
    let Some(r) = v1_root("v1_a_job_after_an_oom_killed_and_fork_limited_one_is_clean", unique("berth-test/cg")) else {
        return;
    };
    let b = &r.backend;
    let p = r.paths();
    let cpu = b.root_cpus_mems().unwrap().0.split([',', '-']).next().unwrap().to_string();
    let first = b.create("job_1", &limits(&cpu, 32, Some(4))).unwrap();
    let script = "head -c 300m /dev/zero | tail; for i in 1 2 3 4 5 6; do sleep 2 & done; wait; exit 1";
    let out = run_and_end(first, 1, script, Some(4));
    assert_eq!(out.reason.as_deref(), Some("oom"), "{out:?}");
    assert!(out.peak_memory_bytes > (16 << 20), "{out:?}");
    assert_eq!(b.list().unwrap(), Vec::<String>::new(), "not kept as the spare");

    b.make_spare().unwrap();
    let second = b.create("job_2", &limits(&cpu, 64, None)).unwrap();
    let u = second.usage().unwrap();
    assert_eq!((u.user_cpu_usec + u.system_cpu_usec, u.oom_kills, u.pids_limit_hits), (0, 0, 0), "{u:?}");
    assert_eq!(read(&p.pids.clone().unwrap().join("job_2/pids.max")), "max");
    let out = run_and_end(second, 2, "for i in 1 2 3 4 5 6; do sleep 0.1 & done; wait", None);
    assert_eq!((out.exit_code, out.reason.as_deref()), (Some(0), None), "{out:?}");
    assert!(out.peak_memory_bytes < (16 << 20), "the first job's peak: {out:?}");
    r.finish();
}

/// A job that ended cleanly leaves its cgroup as the spare, its counters reset; the next job
/// takes it with its own limits and is accounted alone. A cpuset that was a user's is made
/// anew (the user might hold its files open), and a job that leaves memory charged (a tmpfs
/// file) does not leave its cgroup.
#[test]
fn v1_an_ended_jobs_cgroup_becomes_the_spare_and_carries_nothing_over() {
    let Some(r) =
        v1_root("v1_an_ended_jobs_cgroup_becomes_the_spare_and_carries_nothing_over", unique("berth-test/cg"))
    else {
        return;
    };
    let b = &r.backend;
    let p = r.paths();
    let cpus = b.root_cpus_mems().unwrap().0;
    let all = berth_core::CpuSet::parse_list(&cpus).unwrap();
    let (first_cpu, last_cpu) = (all.iter().next().unwrap().to_string(), all.iter().last().unwrap().to_string());

    // Job 3 burns CPU, grows to ~30 MB, has a process limit, and ends well.
    let job3 = b.create("job_3", &limits(&last_cpu, 256, Some(16))).unwrap();
    let dirs3: Vec<u64> = r.dirs(Some("job_3")).iter().map(|d| ino(d)).collect();
    let burn = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\\0' a); echo ${#x} >/dev/null";
    let out3 = run_and_end(job3, 3, burn, Some(16));
    assert_eq!((out3.exit_code, out3.reason.as_deref()), (Some(0), None), "{out3:?}");
    assert!(out3.peak_memory_bytes > (20 << 20), "{out3:?}");
    assert!(out3.user_cpu_us + out3.system_cpu_us > 50_000, "{out3:?}");
    assert_eq!(b.list().unwrap(), [SPARE], "job 3's cgroup is the spare now");
    assert_eq!(r.dirs(Some(SPARE)).iter().map(|d| ino(d)).collect::<Vec<_>>(), dirs3, "renamed, not made");
    b.make_spare().unwrap(); // one is there
    assert_eq!(b.list().unwrap(), [SPARE]);

    // Job 4 takes it on another CPU, without a process limit and with another memory limit.
    let job4 = b.create("job_4", &limits(&first_cpu, 128, None)).unwrap();
    assert_eq!(r.dirs(Some("job_4")).iter().map(|d| ino(d)).collect::<Vec<_>>(), dirs3);
    assert_eq!(read(&p.cpuset.join("job_4/cpuset.cpus")), first_cpu);
    assert_eq!(read(&p.memory.join("job_4/memory.limit_in_bytes")), (128u64 << 20).to_string());
    assert_eq!(read(&p.pids.clone().unwrap().join("job_4/pids.max")), "max");
    assert_eq!(read(&p.freezer.join("job_4/freezer.state")), "THAWED");
    let u = job4.usage().unwrap();
    assert_eq!((u.user_cpu_usec, u.system_cpu_usec, u.oom_kills, u.pids_limit_hits), (0, 0, 0, 0), "{u:?}");
    assert!(u.peak_memory_bytes <= LEFT_MAX, "job 3's peak carried over: {u:?}");
    assert_eq!(read(&p.memory.join("job_4/memory.failcnt")), "0");
    // Its cpuset is given to a user: that directory is not kept, the others are.
    job4.chown_cpuset(65534, 65534).unwrap();
    let out4 =
        run_and_end(job4, 4, "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do sleep 0.1 & done; wait", None);
    assert_eq!((out4.exit_code, out4.reason.as_deref()), (Some(0), None), "more than job 3's 16 processes: {out4:?}");
    assert!(out4.peak_memory_bytes < (16 << 20), "job 3's peak: {out4:?}");
    assert!(out4.user_cpu_us + out4.system_cpu_us < out3.user_cpu_us + out3.system_cpu_us, "{out4:?} {out3:?}");
    assert_eq!(b.list().unwrap(), [SPARE]);
    let spare_dirs = r.dirs(Some(SPARE));
    assert_ne!(ino(&spare_dirs[0]), dirs3[0], "the cpuset that was a user's is a new one");
    assert_eq!(std::fs::metadata(&spare_dirs[0]).unwrap().uid(), 0);
    assert_eq!(spare_dirs[1..].iter().map(|d| ino(d)).collect::<Vec<_>>(), dirs3[1..], "the others are kept");

    // Job 5 leaves a tmpfs file charged to its memory cgroup: not kept.
    let shm = std::env::temp_dir().join(format!("berth-test-shm-{}", std::process::id()));
    let shm_dir =
        if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm").join(shm.file_name().unwrap()) } else { shm };
    let job5 = b.create("job_5", &limits(&first_cpu, 128, None)).unwrap();
    let script = format!("head -c 4000000 /dev/zero > {}", shm_dir.display());
    let out5 = run_and_end(job5, 5, &script, None);
    let _ = std::fs::remove_file(&shm_dir);
    assert_eq!((out5.exit_code, out5.reason.as_deref()), (Some(0), None), "{out5:?}");
    if shm_dir.starts_with("/dev/shm") {
        assert_eq!(b.list().unwrap(), Vec::<String>::new(), "4 MB still charged: not the spare");
    }
    r.finish();
}
