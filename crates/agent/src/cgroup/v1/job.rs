//! A job cgroup across the v1 hierarchies.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::procs::{self, KillOps};
use super::super::util::{self, io_err};
use super::super::{CgroupError, CgroupUsage, JobCgroup, JobLimits, Retired};
use super::spare::Spare;
use super::V1Paths;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A job cgroup in every v1 hierarchy.
#[derive(Debug)]
pub struct V1Job {
    pub(super) name: String,
    pub(super) paths: V1Paths,
    /// The subtree root's cpuset dir, source of "all CPUs" for empty lists.
    pub(super) root_cpuset: PathBuf,
    /// The backend's spare (shared by its jobs): what `retire` may turn this cgroup into.
    pub(super) spare: Arc<Spare>,
    /// The job's cpuset directory was never given to a user other than root
    /// (`chown_cpuset`): no one else can hold its files open for writing. False for a cgroup
    /// found on disk (`open`), whose history is unknown.
    pub(super) cpuset_private: AtomicBool,
}

impl V1Job {
    pub fn paths(&self) -> &V1Paths {
        &self.paths
    }

    fn freezer_state(&self) -> Result<String, CgroupError> {
        util::read_trimmed(&self.paths.freezer.join("freezer.state"))
    }

    fn set_freezer(&self, state: &'static str, wait: Duration) -> Result<(), CgroupError> {
        let f = self.paths.freezer.join("freezer.state");
        if state == "FROZEN" {
            return self.freeze_with_retries(&f, wait);
        }
        util::write_value(&f, state)?;
        if procs::wait_until(wait, || Ok(self.freezer_state()? == state))? {
            return Ok(());
        }
        Err(CgroupError::Timeout { what: "freezer.state THAWED", path: f, waited: wait })
    }

    fn freeze_with_retries(&self, f: &Path, wait: Duration) -> Result<(), CgroupError> {
        let done = freeze_retrying(wait, &|v| util::write_value(f, v), &|| self.freezer_state())?;
        if done {
            return Ok(());
        }
        Err(CgroupError::Timeout { what: "freezer.state FROZEN", path: f.to_path_buf(), waited: wait })
    }
    /// Kernel order rule: memory.limit_in_bytes <= memory.memsw.limit_in_bytes
    /// at all times, so raise memsw first when growing, last when shrinking.
    fn set_memory_limit(&self, limit: Option<u64>) -> Result<(), CgroupError> {
        let mem = self.paths.memory.join("memory.limit_in_bytes");
        let memsw = self.paths.memory.join("memory.memsw.limit_in_bytes");
        let value = limit.map(|b| b.to_string()).unwrap_or_else(|| "-1".to_string());
        let Some(cur) = util::read_optional(&memsw)? else {
            return util::write_value(&mem, &value);
        };
        let cur = util::parse_u64(&memsw, &cur)?;
        if limit.unwrap_or(u64::MAX) > cur {
            util::write_value(&memsw, &value)?;
            util::write_value(&mem, &value)
        } else {
            util::write_value(&mem, &value)?;
            util::write_value(&memsw, &value)
        }
    }
}

impl JobCgroup for V1Job {
    fn name(&self) -> &str {
        &self.name
    }

    fn join_files(&self) -> Result<Vec<File>, CgroupError> {
        self.paths
            .unique()
            .into_iter()
            .map(|d| {
                let p = d.join(self.join_file_name());
                OpenOptions::new().write(true).open(&p).map_err(|e| io_err("open for joining", &p, e))
            })
            .collect()
    }

    fn join_file_name(&self) -> &'static str {
        "tasks"
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        // The freezer hierarchy alone (its cgroup.procs and tasks, and nested cgroups): every
        // process of the job joins all its hierarchies, and only root can move one out of the
        // job's freezer cgroup (its directory and files are root's; the job's user is given
        // the cpuset's only, `chown_cpuset`), where a root process could leave every
        // hierarchy anyway. One hierarchy read instead of five on every job's end.
        let mut set = BTreeSet::new();
        procs::collect_procs(&self.paths.freezer, true, &mut set)?;
        Ok(set.into_iter().collect())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.pids()?.is_empty())
    }

    fn signal_all(&self, signal: i32) -> Result<usize, CgroupError> {
        procs::signal_pids(&self.pids()?, signal)
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        self.set_freezer("FROZEN", util::FREEZE_WAIT)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        self.set_freezer("THAWED", util::FREEZE_WAIT)
    }

    fn is_frozen(&self) -> Result<bool, CgroupError> {
        Ok(self.freezer_state()? != "THAWED")
    }

    fn kill_all(&self, deadline: Duration) -> Result<(), CgroupError> {
        procs::freeze_kill_loop(
            deadline,
            KillOps {
                pids: &|| self.pids(),
                freeze: &|wait| self.set_freezer("FROZEN", wait),
                thaw: &|| self.set_freezer("THAWED", util::FREEZE_WAIT),
            },
        )
    }

    fn usage(&self) -> Result<CgroupUsage, CgroupError> {
        let acct = &self.paths.cpuacct;
        let (user, system) = match (
            util::read_optional(&acct.join("cpuacct.usage_user"))?,
            util::read_optional(&acct.join("cpuacct.usage_sys"))?,
        ) {
            (Some(u), Some(s)) => (
                util::parse_u64(&acct.join("cpuacct.usage_user"), &u)? / 1000,
                util::parse_u64(&acct.join("cpuacct.usage_sys"), &s)? / 1000,
            ),
            _ => {
                // Older kernels: cpuacct.stat in USER_HZ ticks.
                let p = acct.join("cpuacct.stat");
                let text = util::read_string(&p)?;
                let ticks = |k| {
                    util::keyed_u64(&text, k)
                        .ok_or_else(|| CgroupError::Parse { path: p.clone(), detail: format!("no {k} line") })
                };
                let (u, s) = (ticks("user")?, ticks("system")?);
                (ticks_to_usec(u), ticks_to_usec(s))
            }
        };
        let mem = &self.paths.memory;
        let peak_path = mem.join("memory.max_usage_in_bytes");
        let peak = match util::read_optional(&peak_path)? {
            Some(t) => util::parse_u64(&peak_path, &t)?,
            None => 0,
        };
        // "oom_kill N" exists since Linux 4.13. Older kernels only have
        // memory.failcnt, which also counts reclaimed hits of the limit, so it
        // cannot tell an OOM kill apart: report 0 there.
        let oom_kills = util::read_optional(&mem.join("memory.oom_control"))?
            .and_then(|t| util::keyed_u64(&t, "oom_kill"))
            .unwrap_or(0);
        let pids_limit_hits = match &self.paths.pids {
            Some(dir) => {
                util::read_optional(&dir.join("pids.events"))?.and_then(|t| util::keyed_u64(&t, "max")).unwrap_or(0)
            }
            None => 0,
        };
        Ok(CgroupUsage {
            user_cpu_usec: user,
            system_cpu_usec: system,
            peak_memory_bytes: peak,
            oom_kills,
            pids_limit_hits,
        })
    }

    fn update(&self, limits: &JobLimits) -> Result<(), CgroupError> {
        // cpuset.memory_migrate is on since the directory was made (`memory_migrate_on`): not
        // written again here, on every launch's path.
        // Empty lists mean "everything the subtree root has".
        for (file, value) in [("cpuset.cpus", &limits.cpus), ("cpuset.mems", &limits.mems)] {
            let value = if value.trim().is_empty() {
                util::read_trimmed(&self.root_cpuset.join(file))?
            } else {
                value.trim().to_string()
            };
            util::write_value(&self.paths.cpuset.join(file), &value)?;
        }
        self.set_memory_limit(limits.memory_limit_bytes)?;
        if let (Some(dir), Some(max)) = (&self.paths.pids, limits.pids_max) {
            util::write_value(&dir.join("pids.max"), &max.to_string())?;
        }
        if let Some(dir) = &self.paths.devices {
            // One rule a write (the kernel takes one); "rwm": no read, write or mknod.
            let deny = dir.join("devices.deny");
            for (major, minor) in &limits.deny_devices {
                util::write_value(&deny, &format!("c {major}:{minor} rwm"))?;
            }
        }
        Ok(())
    }

    fn retire(&self, usage: &CgroupUsage) -> Result<Retired, CgroupError> {
        self.retire_to_spare(usage)
    }

    fn remove(&self) -> Result<(), CgroupError> {
        // remove_tree goes depth first: rank sub-cpusets before the job.
        for dir in self.paths.unique() {
            util::remove_tree(dir, util::RMDIR_WAIT)?;
        }
        Ok(())
    }

    fn cpuset_dir(&self) -> PathBuf {
        self.paths.cpuset.clone()
    }

    fn make_child(&self, name: &str, cpus: &str, mems: &str) -> Result<PathBuf, CgroupError> {
        self.make_child_with(name, cpus, mems, &util::create_dir)
    }

    fn read_cpuset(&self, child: Option<&str>) -> Result<Option<(String, String)>, CgroupError> {
        let dir = util::child_dir(&self.paths.cpuset, child)?;
        util::read_cpuset_pair(&dir, "cpuset.cpus", "cpuset.mems")
    }

    fn chown_cpuset(&self, uid: u32, gid: u32) -> Result<(), CgroupError> {
        if uid != 0 {
            self.cpuset_private.store(false, Ordering::Relaxed);
        }
        util::chown_cgroup(&self.paths.cpuset, &["tasks", "cgroup.procs"], uid, gid)
    }
}

impl V1Job {
    /// `make_child` with the mkdir step replaceable (fixtures fake the kernel's files).
    pub(crate) fn make_child_with(
        &self,
        name: &str,
        cpus: &str,
        mems: &str,
        mkdir: &dyn Fn(&Path) -> Result<bool, CgroupError>,
    ) -> Result<PathBuf, CgroupError> {
        // Only the cpuset hierarchy: the job's other controllers account the whole job.
        let own = |file: &str, v: &str| match v.trim() {
            "" => util::read_trimmed(&self.paths.cpuset.join(file)),
            v => Ok(v.to_string()),
        };
        let (cpus, mems) = (own("cpuset.cpus", cpus)?, own("cpuset.mems", mems)?);
        util::create_cpuset_child(&self.paths.cpuset, name, &cpus, &mems, mkdir)
    }
}

/// Freezes through `write`, true once `state` reads FROZEN. The v1 freezer
/// can stay FREEZING for good when it catches a task mid-fork/exec or in a
/// non-freezable sleep; thawing and freezing again gets past it (as runc
/// does), each attempt waiting a little longer. Left THAWED on failure, never
/// half-frozen behind the caller's back.
fn freeze_retrying(
    wait: Duration,
    write: &dyn Fn(&str) -> Result<(), CgroupError>,
    state: &dyn Fn() -> Result<String, CgroupError>,
) -> Result<bool, CgroupError> {
    let start = std::time::Instant::now();
    let mut attempt_wait = Duration::from_millis(50);
    loop {
        write("FROZEN")?;
        let left = wait.saturating_sub(start.elapsed());
        if procs::wait_until(attempt_wait.min(left), || Ok(state()? == "FROZEN"))? {
            return Ok(true);
        }
        write("THAWED")?;
        if start.elapsed() >= wait {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
        attempt_wait = (attempt_wait * 2).min(Duration::from_millis(400));
    }
}

fn ticks_to_usec(ticks: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    ticks.saturating_mul(1_000_000) / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_conversion() {
        // SAFETY: as above.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(ticks_to_usec(hz), 1_000_000);
    }

    /// A fake job whose every hierarchy is one temp directory.
    fn fixture(files: &[(&str, &str)]) -> (tempfile::TempDir, V1Job) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        for (f, v) in files {
            std::fs::write(dir.join(f), v).unwrap();
        }
        let paths = V1Paths {
            cpuset: dir.clone(),
            memory: dir.clone(),
            freezer: dir.clone(),
            cpuacct: dir.clone(),
            pids: None,
            devices: None,
        };
        let job = V1Job {
            name: "job_1".into(),
            paths,
            root_cpuset: dir,
            spare: Default::default(),
            cpuset_private: AtomicBool::new(true),
        };
        (tmp, job)
    }

    /// A freezer that stays FREEZING for the first `stuck` freeze attempts.
    fn stuck_freezer(stuck: usize, wait: Duration) -> (bool, Vec<String>) {
        use std::cell::RefCell;
        let writes = RefCell::new(Vec::new());
        let value = RefCell::new("THAWED".to_string());
        let write = |v: &str| {
            writes.borrow_mut().push(v.to_string());
            let freezes = writes.borrow().iter().filter(|w| *w == "FROZEN").count();
            *value.borrow_mut() = if v == "FROZEN" && freezes <= stuck { "FREEZING".into() } else { v.into() };
            Ok(())
        };
        let done = freeze_retrying(wait, &write, &|| Ok(value.borrow().clone())).unwrap();
        let state = value.borrow().clone();
        let mut log = writes.into_inner();
        log.push(state);
        (done, log)
    }

    #[test]
    fn freeze_thaws_and_retries_a_stuck_freezer() {
        let (done, log) = stuck_freezer(2, Duration::from_secs(2));
        assert!(done);
        assert_eq!(log, ["FROZEN", "THAWED", "FROZEN", "THAWED", "FROZEN", "FROZEN"]);
    }

    #[test]
    fn freeze_gives_up_thawed_at_the_deadline() {
        let (done, log) = stuck_freezer(usize::MAX, Duration::from_millis(300));
        assert!(!done);
        assert_eq!(log.last().map(String::as_str), Some("THAWED"), "{log:?}");
        assert!(log.len() >= 4, "retried: {log:?}");
    }

    #[test]
    fn usage_from_ns_counters() {
        let (_t, job) = fixture(&[
            ("cpuacct.usage_user", "2500000000\n"),
            ("cpuacct.usage_sys", "1000\n"),
            ("memory.max_usage_in_bytes", "4096\n"),
            ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
        ]);
        let want = CgroupUsage {
            user_cpu_usec: 2_500_000,
            system_cpu_usec: 1,
            peak_memory_bytes: 4096,
            oom_kills: 2,
            pids_limit_hits: 0,
        };
        assert_eq!(job.usage().unwrap(), want);
    }

    #[test]
    fn usage_falls_back_to_cpuacct_stat_and_old_oom_control() {
        // SAFETY: as above.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let stat = format!("user {}\nsystem {}\n", 3 * hz, hz / 2);
        let (_t, job) = fixture(&[
            ("cpuacct.stat", &stat),
            ("memory.max_usage_in_bytes", "0\n"),
            ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n"),
            ("memory.failcnt", "7\n"),
        ]);
        let u = job.usage().unwrap();
        assert_eq!((u.user_cpu_usec, u.system_cpu_usec), (3_000_000, 500_000));
        assert_eq!(u.oom_kills, 0, "failcnt alone does not prove an OOM kill");
    }

    #[test]
    fn update_writes_the_lists_and_memory_migration_is_turned_on_once() {
        let files = [("cpuset.cpus", ""), ("cpuset.mems", ""), ("cpuset.memory_migrate", "0\n")];
        let (_t, job) = fixture(&[files[0], files[1], files[2], ("memory.limit_in_bytes", "")]);
        let limits = JobLimits {
            cpus: "2-3".into(),
            mems: "1".into(),
            memory_limit_bytes: Some(4096),
            pids_max: None,
            deny_devices: vec![],
        };
        job.update(&limits).unwrap();
        let read = |f: &str| std::fs::read_to_string(job.paths.cpuset.join(f)).unwrap();
        assert_eq!([read("cpuset.memory_migrate"), read("cpuset.cpus"), read("cpuset.mems")], ["0\n", "2-3", "1"]);
        super::super::spare::memory_migrate_on(&job.paths.cpuset).unwrap();
        assert_eq!(read("cpuset.memory_migrate"), "1");
    }

    #[test]
    fn memory_limit_without_memsw() {
        let (_t, job) = fixture(&[("memory.limit_in_bytes", "9223372036854771712\n")]);
        job.set_memory_limit(Some(1 << 20)).unwrap();
        let read = |f: &str| std::fs::read_to_string(job.paths.memory.join(f)).unwrap();
        assert_eq!(read("memory.limit_in_bytes"), "1048576");
        job.set_memory_limit(None).unwrap();
        assert_eq!(read("memory.limit_in_bytes"), "-1");
    }
}
