//! cgroup v1 backend: one directory per hierarchy (cpuset, memory, freezer,
//! cpuacct, optional pids), which may be co-mounted (e.g. "cpu,cpuacct").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::util::{self, io_err};
use super::{CgroupBackend, CgroupError, JobCgroup, JobLimits, MountInfo};

mod job;
pub(crate) mod spare;
pub use job::V1Job;

/// One directory per role; roles may share a directory when co-mounted.
#[derive(Debug, Clone, PartialEq)]
pub struct V1Paths {
    pub cpuset: PathBuf,
    pub memory: PathBuf,
    pub freezer: PathBuf,
    pub cpuacct: PathBuf,
    pub pids: Option<PathBuf>,
    /// The `devices` hierarchy, used only on a node with GPUs to contain.
    pub devices: Option<PathBuf>,
}

impl V1Paths {
    fn join(&self, rel: &Path) -> V1Paths {
        V1Paths {
            cpuset: self.cpuset.join(rel),
            memory: self.memory.join(rel),
            freezer: self.freezer.join(rel),
            cpuacct: self.cpuacct.join(rel),
            pids: self.pids.as_ref().map(|p| p.join(rel)),
            devices: self.devices.as_ref().map(|p| p.join(rel)),
        }
    }

    /// The same cgroup's directories, named `name` instead (a sibling in each hierarchy).
    fn join_sibling(&self, name: &str) -> V1Paths {
        let sib = |p: &PathBuf| p.parent().map(|d| d.join(name)).unwrap_or_else(|| PathBuf::from(name));
        V1Paths {
            cpuset: sib(&self.cpuset),
            memory: sib(&self.memory),
            freezer: sib(&self.freezer),
            cpuacct: sib(&self.cpuacct),
            pids: self.pids.as_ref().map(sib),
            devices: self.devices.as_ref().map(sib),
        }
    }

    /// Distinct directories, cpuset first (it must be set up before others are joined).
    fn unique(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        let all = [&self.cpuset, &self.memory, &self.freezer, &self.cpuacct];
        for p in all.into_iter().chain(self.pids.as_ref()).chain(self.devices.as_ref()) {
            if !out.contains(&p.as_path()) {
                out.push(p);
            }
        }
        out
    }
}

/// cgroup v1 backend for the subtree `root_rel` of each hierarchy.
#[derive(Debug, Clone)]
pub struct V1Backend {
    mounts: V1Paths,
    root_rel: PathBuf,
    /// The spare child, shared with the jobs (which may become it: `JobCgroup::retire`).
    spare: std::sync::Arc<spare::Spare>,
}

impl V1Backend {
    /// Use the hierarchies mounted in this process's mount namespace.
    pub fn new(root_rel: &str) -> Result<Self, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|e| io_err("read", path, e))?;
        Self::from_mounts(&super::parse_mountinfo(&text), root_rel)
    }

    pub(crate) fn from_mounts(mounts: &[MountInfo], root_rel: &str) -> Result<Self, CgroupError> {
        Self::from_mounts_with(mounts, root_rel, false)
    }

    /// [`V1Backend::from_mounts`], with the `devices` hierarchy too when `devices` and it is
    /// mounted.
    pub(crate) fn from_mounts_with(mounts: &[MountInfo], root_rel: &str, devices: bool) -> Result<Self, CgroupError> {
        let find = |c| super::v1_mount(mounts, c);
        let (cpuset, memory, freezer, cpuacct) = (find("cpuset"), find("memory"), find("freezer"), find("cpuacct"));
        let missing: Vec<&str> =
            [("cpuset", &cpuset), ("memory", &memory), ("freezer", &freezer), ("cpuacct", &cpuacct)]
                .iter()
                .filter(|(_, p)| p.is_none())
                .map(|(n, _)| *n)
                .collect();
        match (cpuset, memory, freezer, cpuacct) {
            (Some(cpuset), Some(memory), Some(freezer), Some(cpuacct)) => Self::with_mounts(
                V1Paths {
                    cpuset,
                    memory,
                    freezer,
                    cpuacct,
                    pids: find("pids"),
                    devices: if devices { find("devices") } else { None },
                },
                root_rel,
            ),
            _ => Err(CgroupError::Unsupported(format!(
                "cgroup v1 controller(s) {} not mounted (see /proc/self/mountinfo); mount them, e.g. `mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer`",
                missing.join(", ")
            ))),
        }
    }

    /// Use explicit hierarchy mount points.
    pub fn with_mounts(mounts: V1Paths, root_rel: &str) -> Result<Self, CgroupError> {
        Ok(V1Backend { mounts, root_rel: util::validate_rel(root_rel)?, spare: Default::default() })
    }

    /// Directories of the subtree root.
    pub fn root_paths(&self) -> V1Paths {
        self.mounts.join(&self.root_rel)
    }

    fn job(&self, name: &str) -> Result<V1Job, CgroupError> {
        util::validate_name(name)?;
        Ok(self.job_unchecked(name))
    }

    /// For names found on disk (cleanup must not trip over odd names). Its cpuset counts as
    /// given to a user (`V1Job::cpuset_private`) until `create` made it.
    fn job_unchecked(&self, name: &str) -> V1Job {
        let root = self.root_paths();
        V1Job {
            name: name.to_string(),
            paths: root.join(Path::new(name)),
            root_cpuset: root.cpuset,
            spare: self.spare.clone(),
            cpuset_private: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn prepare_once(&self) -> Result<(), CgroupError> {
        for mount in self.mounts.unique() {
            let mut cur = mount.to_path_buf();
            for comp in self.root_rel.components() {
                let parent = cur.clone();
                cur.push(comp);
                util::create_dir(&cur)?;
                if mount == self.mounts.cpuset {
                    // A v1 cpuset starts empty and rejects tasks/children until filled.
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        if util::read_trimmed(&cur.join(file))?.is_empty() {
                            let v = util::read_trimmed(&parent.join(file))?;
                            util::write_value(&cur.join(file), &v)?;
                        }
                    }
                }
                if mount == self.mounts.memory {
                    // Always 1 on recent kernels; older ones need it so job
                    // limits are accounted hierarchically. Best effort.
                    let f = cur.join("memory.use_hierarchy");
                    if util::read_trimmed(&f).map(|v| v == "0").unwrap_or(false) {
                        if let Err(e) = util::write_value(&f, "1") {
                            tracing::debug!(error = %e, "cannot enable memory.use_hierarchy");
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Remove the directories a failed `create` made (or took), last first.
fn remove_made(dirs: Vec<&Path>) {
    for dir in dirs.into_iter().rev() {
        if let Err(e) = util::remove_tree(dir, Duration::from_millis(200)) {
            tracing::warn!(error = %e, "cleanup after failed create");
        }
    }
}

impl CgroupBackend for V1Backend {
    fn prepare_root(&self) -> Result<(), CgroupError> {
        util::retry_vanished(|| self.prepare_once())
    }

    fn root_cpus_mems(&self) -> Result<(String, String), CgroupError> {
        let dir = self.root_paths().cpuset;
        let read = |eff: &str, plain: &str| match util::read_optional(&dir.join(eff))? {
            Some(v) => Ok(v.trim().to_string()),
            None => util::read_trimmed(&dir.join(plain)),
        };
        Ok((read("cpuset.effective_cpus", "cpuset.cpus")?, read("cpuset.effective_mems", "cpuset.mems")?))
    }

    fn create(&self, name: &str, limits: &JobLimits) -> Result<Box<dyn JobCgroup>, CgroupError> {
        let job = self.job(name)?;
        job.cpuset_private.store(true, std::sync::atomic::Ordering::Relaxed);
        if self.take_spare(&job) {
            // A spare that was a job's (JobCgroup::retire) had its pids.max set back to "max".
            match job.update(limits) {
                Ok(()) => return Ok(Box::new(job)),
                Err(e) => {
                    // Made again below, from nothing: what the kernel refused was the spare's.
                    tracing::debug!(error = %e, "the spare cgroup took no limits; making the job's");
                    remove_made(job.paths.unique());
                }
            }
        }
        // No look before: a directory that exists fails its mkdir, and only those made here
        // are removed again (each file operation costs a launch ~15 us).
        let mut created: Vec<PathBuf> = Vec::new();
        let result = (|| {
            for dir in job.paths.unique() {
                if !util::create_dir(dir)? {
                    return Err(CgroupError::AlreadyExists { path: dir.to_path_buf() });
                }
                created.push(dir.to_path_buf());
            }
            spare::memory_migrate_on(&job.paths.cpuset)?;
            job.update(limits)?;
            spare::oom_killer_on(&job.paths.memory)?;
            // A new freezer cgroup takes its parent's state: thawed (berth never freezes its
            // subtree's root; a frozen parent would keep it frozen whatever is written here).
            Ok(())
        })();
        match result {
            Ok(()) => Ok(Box::new(job)),
            Err(e) => {
                remove_made(created.iter().map(PathBuf::as_path).collect());
                Err(e)
            }
        }
    }

    fn make_spare(&self) -> Result<(), CgroupError> {
        self.make_spare_dirs()
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn JobCgroup>>, CgroupError> {
        let job = self.job(name)?;
        // Partially created jobs count as present so they can be cleaned up.
        let present = job.paths.unique().into_iter().any(util::is_dir);
        Ok(present.then(|| Box::new(job) as Box<dyn JobCgroup>))
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut names = BTreeSet::new();
        for dir in self.root_paths().unique() {
            names.extend(util::subdirs(dir)?);
        }
        Ok(names.into_iter().collect())
    }

    fn remove_root(&self) -> Result<(), CgroupError> {
        let mut first_err = None;
        for name in self.list()? {
            let job = self.job_unchecked(&name);
            let res = job.kill_all(util::REMOVE_KILL_DEADLINE).and_then(|()| job.remove());
            if let Err(e) = res {
                tracing::warn!(job = %name, error = %e, "cannot remove leftover job cgroup");
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for mount in self.mounts.unique() {
            util::remove_chain(mount, &self.root_rel)?;
        }
        Ok(())
    }

    fn contains_devices(&self) -> bool {
        self.mounts.devices.is_some()
    }

    fn version(&self) -> u8 {
        1
    }

    fn cpuset_mount(&self) -> PathBuf {
        self.mounts.cpuset.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts(cpuacct: &str) -> V1Paths {
        V1Paths {
            cpuset: "/cg/cpuset".into(),
            memory: "/cg/memory".into(),
            freezer: "/cg/freezer".into(),
            cpuacct: cpuacct.into(),
            pids: None,
            devices: None,
        }
    }

    #[test]
    fn paths_are_built_and_deduplicated() {
        let mut m = mounts("/cg/cpu,cpuacct");
        m.memory = m.cpuset.clone(); // co-mounted cpuset,memory
        let b = V1Backend::with_mounts(m, "berth/demo/n1").unwrap();
        let job = b.job("job_42").unwrap();
        assert_eq!(job.paths.cpuset, PathBuf::from("/cg/cpuset/berth/demo/n1/job_42"));
        assert_eq!(job.paths.cpuacct, PathBuf::from("/cg/cpu,cpuacct/berth/demo/n1/job_42"));
        let u: Vec<_> = job.paths.unique().into_iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            u,
            [
                "/cg/cpuset/berth/demo/n1/job_42",
                "/cg/freezer/berth/demo/n1/job_42",
                "/cg/cpu,cpuacct/berth/demo/n1/job_42"
            ]
        );
        assert!(b.job("../x").is_err());
        assert!(V1Backend::with_mounts(mounts("/cg/cpuacct"), "/abs").is_err());
    }

    #[test]
    fn missing_controllers_are_named() {
        let m = super::super::parse_mountinfo("35 31 0:32 / /cg/memory rw - cgroup cgroup rw,memory\n");
        let e = V1Backend::from_mounts(&m, "berth").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cpuset, freezer, cpuacct"), "{e}");
    }
}
