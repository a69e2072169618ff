//! An ended job's cgroup as the next job's (JobCgroup::retire, issue 19): jobs in a row on one
//! core, through the agent's own end of a job (`cleanup_retiring`: kill, accounting, verdict,
//! retire), and what the next job in the same place sees.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use berth_core::job::JobOutcome;
use berth_core::JobId;

use super::*;
use crate::cgroup::v1::spare::{slot_name, LEFT_MAX, POOL, SPARE};

fn ino(d: &Path) -> u64 {
    std::fs::metadata(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())).ino()
}

fn inos(dirs: &[PathBuf]) -> Vec<u64> {
    dirs.iter().map(|d| ino(d)).collect()
}

/// How a job ended here: its outcome, the memory still charged to its cgroup once its
/// processes were gone (read just before the agent's end of the job), and what `retire` did.
struct Ended {
    outcome: JobOutcome,
    charged_before: u64,
    retired: Option<Retired>,
}

/// Run `script` in `job` to its end, then end the job as the agent does.
fn run_and_end(r: &Root, job: Box<dyn JobCgroup>, id: u64, script: &str, pids_max: Option<u64>) -> Ended {
    let mut child = spawn_in(&*job, script);
    let st = wait_child(&mut child, Duration::from_secs(60));
    let charged_before: u64 = read(&r.paths().memory.join(format!("job_{id}/memory.usage_in_bytes"))).parse().unwrap();
    let outcome = JobOutcome { exit_code: st.code(), signal: st.signal(), ..Default::default() };
    let spool = std::env::temp_dir().join(format!("berth-test-no-spool-{}-{id}", std::process::id()));
    let (outcome, retired) = crate::job::cleanup_retiring(JobId(id), &*job, &spool, pids_max, outcome);
    Ended { outcome, charged_before, retired }
}

/// A cleanly ended job's cgroup (`dirs`: its directories) when there was no spare: it became
/// the spare if little enough memory was left charged (at once, or after the kernel reclaimed
/// it), else it was removed for what was left, and `make_spare` makes a new one. Which of the
/// two depends on when the kernel frees an exited process's memory, so both are checked
/// against what was read just before. True if kept. `keep_cpuset`: the cpuset directory was
/// never a user's (else it is made anew in either case).
fn check_retired(r: &Root, e: &Ended, dirs: &[u64], keep_cpuset: bool) -> bool {
    let b = &r.backend;
    match e.retired {
        Some(Retired::Spare) => {
            assert_eq!(b.list().unwrap(), [SPARE], "kept as the spare");
            let spare = inos(&r.dirs(Some(SPARE)));
            assert_eq!(spare[1..], dirs[1..], "renamed, not made");
            assert_eq!(spare[0] == dirs[0], keep_cpuset, "the cpuset directory kept only if never a user's");
            let left: u64 = read(&r.paths().memory.join(format!("{SPARE}/memory.usage_in_bytes"))).parse().unwrap();
            assert!(left <= LEFT_MAX, "the spare holds {left} bytes");
            true
        }
        Some(Retired::Charged { bytes }) => {
            // Not kept: only for memory the kernel still had charged to it, never more than
            // was read before.
            assert!(e.charged_before > LEFT_MAX, "{} bytes charged before, yet {:?}", e.charged_before, e.retired);
            assert!(bytes > LEFT_MAX && bytes <= e.charged_before, "{bytes} of {} bytes", e.charged_before);
            let _ = writeln!(std::io::stderr(), "note: {bytes} bytes still charged at the end: not kept");
            assert_eq!(b.list().unwrap(), Vec::<String>::new(), "removed");
            b.make_spare().unwrap();
            assert_eq!(b.list().unwrap(), [SPARE]);
            let spare = inos(&r.dirs(Some(SPARE)));
            assert!(spare.iter().zip(dirs).all(|(s, d)| s != d), "a new spare: {spare:?} {dirs:?}");
            false
        }
        other => {
            panic!("a cleanly ended job with no spare there: {other:?} ({} bytes charged before)", e.charged_before)
        }
    }
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
    let e = run_and_end(&r, first, 1, script, Some(4));
    assert_eq!(e.outcome.reason.as_deref(), Some("oom"), "{:?}", e.outcome);
    assert!(e.outcome.peak_memory_bytes > (16 << 20), "{:?}", e.outcome);
    assert_eq!(e.retired, Some(Retired::NotClean));
    assert_eq!(b.list().unwrap(), Vec::<String>::new(), "not kept as the spare");

    b.make_spare().unwrap();
    let second = b.create("job_2", &limits(&cpu, 64, None)).unwrap();
    let u = second.usage().unwrap();
    assert_eq!((u.user_cpu_usec + u.system_cpu_usec, u.oom_kills, u.pids_limit_hits), (0, 0, 0), "{u:?}");
    assert_eq!(read(&p.pids.clone().unwrap().join("job_2/pids.max")), "max");
    let e = run_and_end(&r, second, 2, "for i in 1 2 3 4 5 6; do sleep 0.1 & done; wait", None);
    assert_eq!((e.outcome.exit_code, e.outcome.reason.as_deref()), (Some(0), None), "{:?}", e.outcome);
    assert!(e.outcome.peak_memory_bytes < (16 << 20), "the first job's peak: {:?}", e.outcome);
    r.finish();
}

/// A job that ended cleanly leaves its cgroup as the spare, its counters reset (or, if the
/// kernel still had more than `LEFT_MAX` charged to it after reclaim, a new spare is made);
/// the next job takes it with its own limits and is accounted alone. A cpuset that was a
/// user's is made anew (the user might hold its files open), and a job that leaves memory
/// charged (a tmpfs file) does not leave its cgroup.
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
    let dirs3 = inos(&r.dirs(Some("job_3")));
    let burn = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\\0' a); echo ${#x} >/dev/null";
    let e3 = run_and_end(&r, job3, 3, burn, Some(16));
    let out3 = e3.outcome.clone();
    assert_eq!((out3.exit_code, out3.reason.as_deref()), (Some(0), None), "{out3:?}");
    assert!(out3.peak_memory_bytes > (20 << 20), "{out3:?}");
    assert!(out3.user_cpu_us + out3.system_cpu_us > 50_000, "{out3:?}");
    let kept3 = check_retired(&r, &e3, &dirs3, true);
    let spare3 = inos(&r.dirs(Some(SPARE)));
    b.make_spare().unwrap(); // one is there
    assert_eq!(b.list().unwrap(), [SPARE]);
    assert_eq!(inos(&r.dirs(Some(SPARE))), spare3, "the spare there is kept");

    // Job 4 takes it on another CPU, without a process limit and with another memory limit.
    let job4 = b.create("job_4", &limits(&first_cpu, 128, None)).unwrap();
    let dirs4 = inos(&r.dirs(Some("job_4")));
    assert_eq!(dirs4, spare3, "the spare taken");
    assert_eq!(dirs4 == dirs3, kept3, "job 3's directories, if kept");
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
    let e4 = run_and_end(
        &r,
        job4,
        4,
        "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do sleep 0.1 & done; wait",
        None,
    );
    let out4 = &e4.outcome;
    assert_eq!((out4.exit_code, out4.reason.as_deref()), (Some(0), None), "more than job 3's 16 processes: {out4:?}");
    assert!(out4.peak_memory_bytes < (16 << 20), "job 3's peak: {out4:?}");
    assert!(out4.user_cpu_us + out4.system_cpu_us < out3.user_cpu_us + out3.system_cpu_us, "{out4:?} {out3:?}");
    if check_retired(&r, &e4, &dirs4, false) {
        assert_eq!(std::fs::metadata(&r.dirs(Some(SPARE))[0]).unwrap().uid(), 0, "the new cpuset is root's");
    }

    // Job 5 leaves a tmpfs file charged to its memory cgroup: not kept, not reclaimed.
    b.make_spare().unwrap();
    let shm = std::env::temp_dir().join(format!("berth-test-shm-{}", std::process::id()));
    let shm_dir =
        if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm").join(shm.file_name().unwrap()) } else { shm };
    let job5 = b.create("job_5", &limits(&first_cpu, 128, None)).unwrap();
    let script = format!("head -c 4000000 /dev/zero > {}", shm_dir.display());
    let e5 = run_and_end(&r, job5, 5, &script, None);
    let _ = std::fs::remove_file(&shm_dir);
    assert_eq!((e5.outcome.exit_code, e5.outcome.reason.as_deref()), (Some(0), None), "{:?}", e5.outcome);
    assert!(
        matches!(e5.retired, Some(Retired::Charged { bytes }) if bytes >= 4_000_000),
        "4 MB still charged: not the spare: {:?}",
        e5.retired
    );
    assert_eq!(b.list().unwrap(), Vec::<String>::new(), "removed");
    r.finish();
}

/// A job that leaves a little page cache (a 768 KiB file it wrote and synced to disk): more than
/// `LEFT_MAX` charged, so the agent asks the kernel to reclaim it (`memory.force_empty`)
/// before deciding; the clean pages go and the cgroup is the spare, or, if the kernel kept
/// more than `LEFT_MAX`, it is removed. The next job starts with nothing of it charged.
#[test]
fn v1_an_ended_jobs_page_cache_is_reclaimed_before_its_cgroup_is_the_spare() {
    let Some(r) =
        v1_root("v1_an_ended_jobs_page_cache_is_reclaimed_before_its_cgroup_is_the_spare", unique("berth-test/cg"))
    else {
        return;
    };
    let b = &r.backend;
    let cpu = b.root_cpus_mems().unwrap().0.split([',', '-']).next().unwrap().to_string();
    let file = Path::new("/var/tmp").join(format!("berth-test-cache-{}", std::process::id()));
    let on_tmpfs = nix::sys::statfs::statfs("/var/tmp").unwrap().filesystem_type() == nix::sys::statfs::TMPFS_MAGIC;
    let job6 = b.create("job_6", &limits(&cpu, 64, None)).unwrap();
    let dirs6 = inos(&r.dirs(Some("job_6")));
    let script = format!("dd if=/dev/zero of={} bs=64k count=12 conv=fsync status=none", file.display());
    let e6 = run_and_end(&r, job6, 6, &script, None);
    let _ = std::fs::remove_file(&file);
    assert_eq!((e6.outcome.exit_code, e6.outcome.reason.as_deref()), (Some(0), None), "{:?}", e6.outcome);
    assert!(e6.charged_before > LEFT_MAX, "the file's 768 KiB of pages: {} bytes", e6.charged_before);
    if on_tmpfs {
        // tmpfs pages are not reclaimed for a spare (they would go to swap).
        assert!(matches!(e6.retired, Some(Retired::Charged { bytes }) if bytes >= 768 << 10), "{:?}", e6.retired);
        assert_eq!(b.list().unwrap(), Vec::<String>::new(), "removed");
    } else {
        check_retired(&r, &e6, &dirs6, true);
    }
    b.make_spare().unwrap();
    let job7 = b.create("job_7", &limits(&cpu, 64, None)).unwrap();
    let left: u64 = read(&r.paths().memory.join("job_7/memory.usage_in_bytes")).parse().unwrap();
    assert!(left <= LEFT_MAX, "job 6's page cache carried over: {left} bytes");
    assert!(job7.usage().unwrap().peak_memory_bytes <= LEFT_MAX);
    job7.kill_all(Duration::from_secs(5)).unwrap();
    job7.remove().unwrap();
    r.finish();
}

/// Jobs that end together each keep their cgroup as a spare, up to `POOL` (beyond it, an
/// ended job's is removed), and the next launches take them, a kept job's before the one
/// made ahead: no directory made or removed for any of them. (Nothing runs in these jobs, so
/// nothing is left charged and the outcome does not depend on the kernel's timing.)
#[test]
fn v1_jobs_ending_together_keep_up_to_a_pool_of_spares() {
    let Some(r) = v1_root("v1_jobs_ending_together_keep_up_to_a_pool_of_spares", unique("berth-test/cg")) else {
        return;
    };
    let b = &r.backend;
    let cpu = b.root_cpus_mems().unwrap().0.split([',', '-']).next().unwrap().to_string();
    b.make_spare().unwrap();
    let made_ahead = inos(&r.dirs(Some(SPARE)));
    let ids: Vec<u64> = (10..10 + POOL as u64 + 1).collect();
    let jobs: Vec<(u64, Box<dyn JobCgroup>)> =
        ids.iter().map(|&id| (id, b.create(&format!("job_{id}"), &limits(&cpu, 64, None)).unwrap())).collect();
    assert_eq!(inos(&r.dirs(Some("job_10"))), made_ahead, "the first launch took the spare made ahead");
    let dirs: Vec<Vec<u64>> = ids.iter().map(|id| inos(&r.dirs(Some(&format!("job_{id}"))))).collect();
    let spool = std::env::temp_dir().join(format!("berth-test-no-spool-{}", std::process::id()));
    let mut retired = vec![];
    for (id, job) in &jobs {
        let outcome = JobOutcome { exit_code: Some(0), ..Default::default() };
        retired.push(crate::job::cleanup_retiring(JobId(*id), &**job, &spool, None, outcome).1);
    }
    let mut want = vec![Some(Retired::Spare); POOL];
    want.push(Some(Retired::Removed));
    assert_eq!(retired, want, "the pool is full after {POOL}");
    let names: Vec<String> = (0..POOL).map(slot_name).collect();
    let mut listed = names.clone();
    listed.sort();
    assert_eq!(b.list().unwrap(), listed);
    for (slot, name) in names.iter().enumerate() {
        assert_eq!(inos(&r.dirs(Some(name))), dirs[slot], "job {}'s cgroup is {name}", ids[slot]);
    }
    b.make_spare().unwrap(); // the one made ahead is there: nothing made
    assert_eq!(b.list().unwrap(), listed);

    // The next launches take the kept ones, the last kept first, the spare made ahead last.
    let next: Vec<Box<dyn JobCgroup>> =
        (0..POOL).map(|k| b.create(&format!("job_{}", 20 + k), &limits(&cpu, 64, None)).unwrap()).collect();
    for k in 0..POOL {
        assert_eq!(inos(&r.dirs(Some(&format!("job_{}", 20 + k)))), dirs[POOL - 1 - k], "launch {k}");
    }
    assert_eq!(b.list().unwrap().len(), POOL, "no spare left: {:?}", b.list().unwrap());
    // With none left, a launch makes its directories.
    let fresh = b.create("job_30", &limits(&cpu, 64, None)).unwrap();
    assert!(inos(&r.dirs(Some("job_30"))).iter().all(|i| !dirs.iter().flatten().any(|d| d == i)));
    for job in next.iter().chain([&fresh]) {
        job.remove().unwrap();
    }
    r.finish();
}
