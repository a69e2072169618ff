//! cgroup v2 (unified hierarchy) backend, after the kernel's
//! Documentation/admin-guide/cgroup-v2.rst:
//! - controllers reach a child only if enabled in every ancestor's
//!   cgroup.subtree_control, and only cgroups without processes may enable
//!   them ("no internal processes"), so the subtree levels stay process-free
//!   and jobs are leaves;
//! - an empty cpuset.cpus/mems inherits the parent's effective set, so no
//!   copying down is needed (unlike v1);
//! - freezing is core (cgroup.freeze + "frozen" in cgroup.events) and
//!   cgroup.kill (Linux 5.14+) SIGKILLs the whole subtree atomically.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::util;
use super::{CgroupBackend, CgroupError, JobCgroup, JobLimits};

pub mod devices;
mod job;
pub use job::V2Job;

/// Controllers berth needs; pids is used when available.
const REQUIRED: [&str; 2] = ["cpuset", "memory"];
const OPTIONAL: [&str; 1] = ["pids"];

/// cgroup v2 backend for the subtree `root_rel` of the unified mount.
#[derive(Debug, Clone)]
pub struct V2Backend {
    mount: PathBuf,
    root_rel: PathBuf,
    /// Jobs' `JobLimits::deny_devices` are enforced by a device program attached to each
    /// job's cgroup ([`devices`]): asked for (a GPU node) and a program could be loaded.
    devices: bool,
    /// Why devices are not contained though asked for (the bpf() error).
    devices_error: Option<String>,
}

impl V2Backend {
    /// `mount` is the cgroup2 mount point, e.g. /sys/fs/cgroup.
    pub fn new(mount: impl Into<PathBuf>, root_rel: &str) -> Result<Self, CgroupError> {
        Ok(V2Backend {
            mount: mount.into(),
            root_rel: util::validate_rel(root_rel)?,
            devices: false,
            devices_error: None,
        })
    }

    /// [`V2Backend::new`], containing jobs' devices when `devices` (a node with GPUs) and a
    /// device program loads here ([`devices::probe`]); else says why not
    /// ([`CgroupBackend::devices_error`]).
    pub fn with_devices(mount: impl Into<PathBuf>, root_rel: &str, devices: bool) -> Result<Self, CgroupError> {
        let mut b = Self::new(mount, root_rel)?;
        if devices {
            match devices::probe() {
                Ok(()) => b.devices = true,
                Err(e) => b.devices_error = Some(e.to_string()),
            }
        }
        Ok(b)
    }

    pub fn root_dir(&self) -> PathBuf {
        self.mount.join(&self.root_rel)
    }

    fn job(&self, name: &str) -> Result<V2Job, CgroupError> {
        util::validate_name(name)?;
        Ok(self.job_unchecked(name))
    }

    /// For names found on disk (cleanup must not trip over odd names).
    fn job_unchecked(&self, name: &str) -> V2Job {
        V2Job::new(name.to_string(), self.root_dir().join(name), self.root_dir(), self.devices)
    }

    fn prepare_once(&self) -> Result<(), CgroupError> {
        let path = self.mount.join("cgroup.controllers");
        let avail_text = util::read_trimmed(&path)?;
        let avail: Vec<&str> = avail_text.split_whitespace().collect();
        if let Some(c) = REQUIRED.iter().find(|c| !avail.contains(c)) {
            return Err(CgroupError::Unsupported(format!(
                "cgroup v2 at {} lacks the {c} controller (cgroup.controllers: \"{avail_text}\"); \
                 it may be bound to a v1 hierarchy or not delegated to this cgroup",
                self.mount.display()
            )));
        }
        let wanted: Vec<&str> = REQUIRED.iter().chain(OPTIONAL.iter()).copied().filter(|c| avail.contains(c)).collect();
        let mut cur = self.mount.clone();
        for comp in self.root_rel.components() {
            enable_controllers(&cur, &wanted)?;
            cur.push(comp);
            util::create_dir(&cur)?;
        }
        // The root's children (jobs) get the controllers too.
        enable_controllers(&cur, &wanted)
    }
}

/// Controllers of `wanted` not yet listed in a cgroup.subtree_control text.
pub(crate) fn missing_controllers<'a>(subtree_control: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let on: Vec<&str> = subtree_control.split_whitespace().collect();
    wanted.iter().copied().filter(|c| !on.contains(c)).collect()
}

fn enable_controllers(dir: &Path, wanted: &[&str]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    for c in missing_controllers(&util::read_string(&file)?, wanted) {
        // One write per controller so a missing optional one can't block the rest.
        match util::write_value(&file, &format!("+{c}")) {
            Ok(()) => {}
            Err(e) if OPTIONAL.contains(&c) => {
                tracing::warn!(error = %e, "optional controller not enabled")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl CgroupBackend for V2Backend {
    fn prepare_root(&self) -> Result<(), CgroupError> {
        util::retry_vanished(|| self.prepare_once())
    }

    fn root_cpus_mems(&self) -> Result<(String, String), CgroupError> {
        let dir = self.root_dir();
        Ok((
            util::read_trimmed(&dir.join("cpuset.cpus.effective"))?,
            util::read_trimmed(&dir.join("cpuset.mems.effective"))?,
        ))
    }

    fn create(&self, name: &str, limits: &JobLimits) -> Result<Box<dyn JobCgroup>, CgroupError> {
        let job = self.job(name)?;
        if util::is_dir(&job.dir) || !util::create_dir(&job.dir)? {
            return Err(CgroupError::AlreadyExists { path: job.dir });
        }
        let result = job.update(limits).and_then(|()| {
            // Normally 0 already; make sure a job never starts frozen.
            let freeze = job.dir.join("cgroup.freeze");
            if util::is_file(&freeze) {
                util::write_value(&freeze, "0")
            } else {
                Ok(())
            }
        });
        match result {
            Ok(()) => Ok(Box::new(job)),
            Err(e) => {
                if let Err(e2) = util::remove_tree(&job.dir, Duration::from_millis(200)) {
                    tracing::warn!(error = %e2, "cleanup after failed create");
                }
                Err(e)
            }
        }
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn JobCgroup>>, CgroupError> {
        let job = self.job(name)?;
        Ok(util::is_dir(&job.dir).then(|| Box::new(job) as Box<dyn JobCgroup>))
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        util::subdirs(&self.root_dir())
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
        match first_err {
            Some(e) => Err(e),
            None => util::remove_chain(&self.mount, &self.root_rel),
        }
    }

    fn contains_devices(&self) -> bool {
        self.devices
    }

    fn devices_error(&self) -> Option<String> {
        self.devices_error.clone()
    }

    fn version(&self) -> u8 {
        2
    }

    fn cpuset_mount(&self) -> PathBuf {
        self.mount.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let b = V2Backend::new("/sys/fs/cgroup", "berth/demo/node1").unwrap();
        assert_eq!(b.root_dir(), PathBuf::from("/sys/fs/cgroup/berth/demo/node1"));
        let j = b.job("job_42").unwrap();
        assert_eq!(j.dir(), Path::new("/sys/fs/cgroup/berth/demo/node1/job_42"));
        assert!(b.job("a/b").is_err());
        assert!(V2Backend::new("/sys/fs/cgroup", "../x").is_err());
    }

    #[test]
    fn controllers_to_enable() {
        let want = ["cpuset", "memory", "pids"];
        assert_eq!(missing_controllers("", &want), want);
        assert_eq!(missing_controllers("cpu memory\n", &want), ["cpuset", "pids"]);
        assert!(missing_controllers("cpuset io memory pids", &want).is_empty());
    }
}
