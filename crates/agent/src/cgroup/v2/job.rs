//! A job cgroup in the unified hierarchy.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::procs::{self, KillOps};
use super::super::util::{self, io_err};
use super::super::{CgroupError, CgroupUsage, JobCgroup, JobLimits};

/// A job cgroup in the unified hierarchy.
#[derive(Debug, Clone)]
pub struct V2Job {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    /// The subtree root, source of "all CPUs" for empty lists.
    pub(super) root: PathBuf,
    /// `JobLimits::deny_devices` are enforced with device programs (the backend's
    /// `contains_devices`).
    devices: bool,
    /// The devices a program attached by this handle denies already: an `update` attaches one
    /// more program for new ones only (programs cannot be changed, only added; all of them
    /// must allow an open).
    denied: Arc<Mutex<BTreeSet<(u32, u32)>>>,
}

impl V2Job {
    pub(crate) fn new(name: String, dir: PathBuf, root: PathBuf, devices: bool) -> V2Job {
        V2Job { name, dir, root, devices, denied: Arc::default() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// For tests that drive a job directory directly.
    #[cfg(test)]
    pub(crate) fn at(dir: PathBuf, root: PathBuf) -> V2Job {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        V2Job::new(name, dir, root, false)
    }

    /// Attach a device program denying those of `deny` not denied yet (docs/gpus.md,
    /// "Containment"): every process of the job, its rank cgroups' included, then gets
    /// `EPERM` opening them.
    pub(crate) fn deny_devices(&self, deny: &[(u32, u32)]) -> Result<(), CgroupError> {
        let mut denied = self.denied.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<(u32, u32)> = deny.iter().copied().filter(|d| !denied.contains(d)).collect();
        if new.is_empty() {
            return Ok(());
        }
        super::devices::load_and_attach(&super::devices::deny_program(&new)?, &self.dir)?;
        denied.extend(new);
        Ok(())
    }

    fn frozen(&self) -> Result<bool, CgroupError> {
        let text = util::read_string(&self.dir.join("cgroup.events"))?;
        Ok(util::keyed_u64(&text, "frozen") == Some(1))
    }

    fn set_frozen(&self, on: bool, wait: Duration) -> Result<(), CgroupError> {
        let f = self.dir.join("cgroup.freeze");
        util::write_value(&f, if on { "1" } else { "0" })?;
        if procs::wait_until(wait, || Ok(self.frozen()? == on))? {
            return Ok(());
        }
        if on {
            // Don't leave it freezing behind the caller's back.
            util::write_value(&f, "0")?;
        }
        Err(CgroupError::Timeout {
            what: if on { "cgroup.events frozen 1" } else { "cgroup.events frozen 0" },
            path: self.dir.join("cgroup.events"),
            waited: wait,
        })
    }

    /// SIGKILL the subtree with cgroup.kill until empty.
    fn kill_with_cgroup_kill(&self, deadline: Duration) -> Result<(), CgroupError> {
        let start = Instant::now();
        loop {
            let live = self.pids()?;
            if live.is_empty() {
                return Ok(());
            }
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(CgroupError::Unkillable { pids: live });
            }
            util::write_value(&self.dir.join("cgroup.kill"), "1")?;
            procs::wait_until(left.min(Duration::from_millis(200)), || Ok(self.pids()?.is_empty()))?;
        }
    }
}

impl JobCgroup for V2Job {
    fn name(&self) -> &str {
        &self.name
    }

    fn join_files(&self) -> Result<Vec<File>, CgroupError> {
        let p = self.dir.join("cgroup.procs");
        let f = OpenOptions::new().write(true).open(&p).map_err(|e| io_err("open for joining", &p, e))?;
        Ok(vec![f])
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut set = BTreeSet::new();
        procs::collect_procs(&self.dir, false, &mut set)?;
        Ok(set.into_iter().collect())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.pids()?.is_empty())
    }

    fn signal_all(&self, signal: i32) -> Result<usize, CgroupError> {
        procs::signal_pids(&self.pids()?, signal)
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        self.set_frozen(true, util::FREEZE_WAIT)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        self.set_frozen(false, util::FREEZE_WAIT)
    }

    fn is_frozen(&self) -> Result<bool, CgroupError> {
        Ok(util::read_trimmed(&self.dir.join("cgroup.freeze"))? == "1")
    }

    fn kill_all(&self, deadline: Duration) -> Result<(), CgroupError> {
        if util::is_file(&self.dir.join("cgroup.kill")) {
            return self.kill_with_cgroup_kill(deadline);
        }
        procs::freeze_kill_loop(
            deadline,
            KillOps {
                pids: &|| self.pids(),
                freeze: &|wait| self.set_frozen(true, wait),
                thaw: &|| self.set_frozen(false, util::FREEZE_WAIT),
            },
        )
    }

    fn usage(&self) -> Result<CgroupUsage, CgroupError> {
        let keyed = |file: &str, key: &str| -> Result<u64, CgroupError> {
            let text = util::read_optional(&self.dir.join(file))?;
            Ok(text.and_then(|t| util::keyed_u64(&t, key)).unwrap_or(0))
        };
        // memory.peak exists since Linux 5.19; 0 before.
        let peak_path = self.dir.join("memory.peak");
        let peak = match util::read_optional(&peak_path)? {
            Some(t) => util::parse_u64(&peak_path, &t)?,
            None => 0,
        };
        Ok(CgroupUsage {
            user_cpu_usec: keyed("cpu.stat", "user_usec")?,
            system_cpu_usec: keyed("cpu.stat", "system_usec")?,
            peak_memory_bytes: peak,
            oom_kills: keyed("memory.events", "oom_kill")?,
            pids_limit_hits: keyed("pids.events", "max")?,
        })
    }

    fn update(&self, limits: &JobLimits) -> Result<(), CgroupError> {
        // Empty lists mean "everything the subtree root has", set explicitly
        // so later changes to the root don't silently widen the job.
        for (file, value) in [("cpuset.cpus", &limits.cpus), ("cpuset.mems", &limits.mems)] {
            let value = if value.trim().is_empty() {
                util::read_trimmed(&self.root.join(format!("{file}.effective")))?
            } else {
                value.trim().to_string()
            };
            util::write_value(&self.dir.join(file), &value)?;
        }
        let max = limits.memory_limit_bytes.map(|b| b.to_string());
        util::write_value(&self.dir.join("memory.max"), max.as_deref().unwrap_or("max"))?;
        // No swap beyond the limit (like v1 memsw); absent without swap accounting.
        let swap = self.dir.join("memory.swap.max");
        if util::is_file(&swap) {
            let v = if limits.memory_limit_bytes.is_some() { "0" } else { "max" };
            util::write_value(&swap, v)?;
        }
        // Absent when the pids controller is not enabled for the subtree.
        let pids = self.dir.join("pids.max");
        if let (Some(max), true) = (limits.pids_max, util::is_file(&pids)) {
            util::write_value(&pids, &max.to_string())?;
        }
        if self.devices {
            self.deny_devices(&limits.deny_devices)?;
        }
        Ok(())
    }

    fn remove(&self) -> Result<(), CgroupError> {
        // remove_tree goes depth first: rank sub-cpusets before the job.
        util::remove_tree(&self.dir, util::RMDIR_WAIT)
    }

    fn cpuset_dir(&self) -> PathBuf {
        self.dir.clone()
    }

    fn make_child(&self, name: &str, cpus: &str, mems: &str) -> Result<PathBuf, CgroupError> {
        self.make_child_with(name, cpus, mems, &util::create_dir)
    }

    fn read_cpuset(&self, child: Option<&str>) -> Result<Option<(String, String)>, CgroupError> {
        let dir = util::child_dir(&self.dir, child)?;
        match util::read_cpuset_pair(&dir, "cpuset.cpus.effective", "cpuset.mems.effective")? {
            Some(pair) => Ok(Some(pair)),
            None => util::read_cpuset_pair(&dir, "cpuset.cpus", "cpuset.mems"),
        }
    }

    fn chown_cpuset(&self, uid: u32, gid: u32) -> Result<(), CgroupError> {
        // The kernel's delegation files for moving processes (no "tasks" in v2); moving between
        // the job and a child needs write access to cgroup.procs of the job, their common ancestor.
        util::chown_cgroup(&self.dir, &["cgroup.procs", "cgroup.threads"], uid, gid)
    }
}

impl V2Job {
    /// `make_child` with the mkdir step replaceable (fixtures fake the kernel's files).
    pub(crate) fn make_child_with(
        &self,
        name: &str,
        cpus: &str,
        mems: &str,
        mkdir: &dyn Fn(&Path) -> Result<bool, CgroupError>,
    ) -> Result<PathBuf, CgroupError> {
        // Children get cpuset files only if the job enables it for them. cpuset is a threaded
        // controller, so this works even once the job has processes (no-internal-process rule).
        let control = self.dir.join("cgroup.subtree_control");
        if !super::missing_controllers(&util::read_string(&control)?, &["cpuset"]).is_empty() {
            util::write_value(&control, "+cpuset")?;
        }
        let own = |file: &str, v: &str| match v.trim() {
            "" => util::read_trimmed(&self.dir.join(format!("{file}.effective"))),
            v => Ok(v.to_string()),
        };
        let (cpus, mems) = (own("cpuset.cpus", cpus)?, own("cpuset.mems", mems)?);
        util::create_cpuset_child(&self.dir, name, &cpus, &mems, mkdir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fake job directory with the interface files of a v2 cgroup.
    fn fixture(files: &[(&str, &str)]) -> (tempfile::TempDir, V2Job) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let dir = root.join("job_1");
        fs::create_dir_all(&dir).unwrap();
        fs::write(root.join("cpuset.cpus.effective"), "0-3\n").unwrap();
        fs::write(root.join("cpuset.mems.effective"), "0-1\n").unwrap();
        for (f, v) in files {
            fs::write(dir.join(f), v).unwrap();
        }
        (tmp, V2Job::at(dir, root))
    }

    #[test]
    fn usage_from_stat_files() {
        let (_t, job) = fixture(&[
            ("cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\nnr_throttled 0\n"),
            ("memory.peak", "33554432\n"),
            ("memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n"),
        ]);
        let u = job.usage().unwrap();
        assert_eq!(
            u,
            CgroupUsage {
                user_cpu_usec: 1000,
                system_cpu_usec: 500,
                peak_memory_bytes: 33554432,
                oom_kills: 1,
                pids_limit_hits: 0
            }
        );
        fs::remove_file(job.dir().join("memory.peak")).unwrap();
        assert_eq!(job.usage().unwrap().peak_memory_bytes, 0, "pre-5.19 kernels");
    }

    #[test]
    fn update_writes_limits() {
        let files = ["cpuset.cpus", "cpuset.mems", "memory.max", "memory.swap.max"];
        let (_t, job) = fixture(&files.map(|f| (f, "")));
        let read = |f: &str| fs::read_to_string(job.dir().join(f)).unwrap();
        let limits = JobLimits {
            cpus: "1,3".into(),
            mems: "0".into(),
            memory_limit_bytes: Some(64 << 20),
            pids_max: None,
            deny_devices: vec![],
        };
        job.update(&limits).unwrap();
        assert_eq!(files.map(read), ["1,3", "0", "67108864", "0"]);
        job.update(&JobLimits::default()).unwrap();
        assert_eq!(files.map(read), ["0-3", "0-1", "max", "max"]);
    }

    /// What the kernel does on mkdir below a cgroup with cpuset enabled for its children.
    fn kernel_mkdir(d: &Path) -> Result<bool, CgroupError> {
        let made = util::create_dir(d)?;
        if made {
            for f in ["cpuset.cpus", "cpuset.mems", "cgroup.procs", "cgroup.threads"] {
                fs::write(d.join(f), "").map_err(|e| io_err("create", d, e))?;
            }
        }
        Ok(made)
    }

    #[test]
    fn rank_children_lists_chown_and_removal() {
        let (_t, job) = fixture(&[
            ("cgroup.subtree_control", "memory\n"),
            ("cgroup.procs", ""),
            ("cgroup.threads", ""),
            ("cpuset.cpus", "0-3"),
            ("cpuset.mems", "0"),
            ("cpuset.cpus.effective", "0-3\n"),
            ("cpuset.mems.effective", "0\n"),
        ]);
        let read = |p: &Path| fs::read_to_string(p).unwrap();
        let r0 = job.make_child_with("rank0", "0-1", "0", &kernel_mkdir).unwrap();
        assert_eq!(read(&job.dir().join("cgroup.subtree_control")), "+cpuset");
        fs::write(job.dir().join("cgroup.subtree_control"), "cpuset memory\n").unwrap();
        let r1 = job.make_child_with("rank1", "2-3", "", &kernel_mkdir).unwrap();
        assert_eq!(read(&job.dir().join("cgroup.subtree_control")), "cpuset memory\n", "enabled once");
        assert_eq!((r0.clone(), r1.clone()), (job.dir().join("rank0"), job.dir().join("rank1")));
        assert_eq!([r0.join("cpuset.cpus"), r0.join("cpuset.mems")].map(|p| read(&p)), ["0-1", "0"]);
        assert_eq!([r1.join("cpuset.cpus"), r1.join("cpuset.mems")].map(|p| read(&p)), ["2-3", "0"]);
        // The fake kernel has no .effective files for children: the plain ones are read.
        assert_eq!(job.read_cpuset(Some("rank1")).unwrap(), Some(("2-3".into(), "0".into())));
        assert_eq!(job.read_cpuset(None).unwrap(), Some(("0-3".into(), "0".into())));
        assert_eq!(job.read_cpuset(Some("rank7")).unwrap(), None);
        assert!(matches!(
            job.make_child_with("rank0", "0", "0", &kernel_mkdir),
            Err(CgroupError::AlreadyExists { .. })
        ));
        assert!(matches!(job.make_child("a/b", "0", "0"), Err(CgroupError::InvalidName { .. })));
        // No cpuset files in the child (plain mkdir): an error, and nothing left behind.
        assert!(job.make_child("rank9", "0", "0").is_err());
        assert!(!job.dir().join("rank9").exists());

        let root = nix::unistd::geteuid().is_root();
        let (uid, gid) =
            if root { (65534, 65534) } else { (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()) };
        job.chown_cpuset(uid, gid).unwrap();
        let owner = |p: &Path| {
            let m = fs::symlink_metadata(p).unwrap();
            (std::os::unix::fs::MetadataExt::uid(&m), std::os::unix::fs::MetadataExt::gid(&m))
        };
        for d in [job.dir().to_path_buf(), r0.clone(), r1.clone()] {
            for p in [d.clone(), d.join("cgroup.procs"), d.join("cgroup.threads")] {
                assert_eq!(owner(&p), (uid, gid), "{}", p.display());
            }
            if root {
                assert_eq!(owner(&d.join("cpuset.cpus")), (0, 0), "limits stay root's");
            }
        }

        // Plain files stand in for interface files, which rmdir ignores: drop them, so that
        // remove() succeeds only if it removes the children before the job.
        for d in [&r0, &r1, &job.dir().to_path_buf()] {
            for e in fs::read_dir(d).unwrap().flatten().filter(|e| e.path().is_file()) {
                fs::remove_file(e.path()).unwrap();
            }
        }
        job.remove().unwrap();
        assert!(!job.dir().exists());
    }

    #[test]
    fn freeze_reads_events() {
        let (_t, job) = fixture(&[("cgroup.freeze", "0\n"), ("cgroup.events", "populated 1\nfrozen 1\n")]);
        job.freeze().unwrap();
        assert_eq!(fs::read_to_string(job.dir().join("cgroup.freeze")).unwrap(), "1");
    }
}
