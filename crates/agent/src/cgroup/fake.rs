//! An in-memory [`CgroupBackend`] for unit tests of job supervision: no cgroup file system,
//! no root. Only in tests (`cfg(test)`): the daemon and the system tests use the real
//! backends ([`super::v1`], [`super::v2`]).
//!
//! What a real cgroup knows by itself (which processes are in it) the fake learns from the
//! spawn path: [`JobCgroup::joined`] records the pid the agent started in the job (with its
//! start time, so that a reused pid is not taken for it), and the
//! members are those pids and every live descendant of them (read from
//! `/proc/<pid>/task/<tid>/children`; a double-forked daemon escapes the fake, not a real
//! cgroup). Signals, kills, freezing (SIGSTOP) and thawing (SIGCONT) act on those real
//! processes, and every operation is written to a log the test reads. Accounting is what the
//! test sets ([`FakeBackend::set_usage`]). Each job has a real directory under the fake's
//! mount (its `cpuset_dir`, with one subdirectory per `make_child`), removed by `remove`.

use super::{procs, CgroupBackend, CgroupError, CgroupUsage, JobCgroup, JobLimits};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One operation the agent asked of the fake, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum FakeOp {
    Create(String),
    Joined(String, i32),
    MakeChild(String, String),
    Chown(String, u32, u32),
    Signal(String, i32),
    Freeze(String),
    Thaw(String),
    KillAll(String),
    Update(String, JobLimits),
    Usage(String),
    Remove(String),
}

#[derive(Debug, Default)]
struct FakeJob {
    limits: JobLimits,
    /// Pids started in the job (`joined`), with their start times: a pid reused by another
    /// process once the member was reaped is not a member (a real cgroup knows that).
    members: BTreeMap<i32, Option<u64>>,
    children: BTreeMap<String, (String, String)>,
    frozen: bool,
    usage: CgroupUsage,
}

#[derive(Debug, Default)]
struct State {
    jobs: BTreeMap<String, FakeJob>,
    log: Vec<FakeOp>,
    /// Usage every job created from now on reports.
    usage: CgroupUsage,
    /// `create` fails with this (once) when set.
    fail_create: Option<String>,
}

/// The fake backend; clones share one state.
#[derive(Debug, Clone)]
pub struct FakeBackend {
    mount: PathBuf,
    state: Arc<Mutex<State>>,
}

impl FakeBackend {
    /// A fake whose job directories live under `mount` (a test's temporary directory).
    pub fn new(mount: &Path) -> Self {
        FakeBackend { mount: mount.to_path_buf(), state: Arc::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding it has failed already; its state is still readable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every operation so far, in order.
    pub fn log(&self) -> Vec<FakeOp> {
        self.state().log.clone()
    }

    /// Names of the job cgroups that exist now.
    pub fn existing(&self) -> Vec<String> {
        self.state().jobs.keys().cloned().collect()
    }

    /// What jobs created from now on report as their accounting.
    pub fn set_usage(&self, usage: CgroupUsage) {
        self.state().usage = usage;
    }

    /// The next `create` fails with an I/O error saying `why`.
    pub fn fail_next_create(&self, why: &str) {
        self.state().fail_create = Some(why.to_string());
    }

    /// The limits job `name` holds now (None: no such job).
    pub fn limits(&self, name: &str) -> Option<JobLimits> {
        self.state().jobs.get(name).map(|j| j.limits.clone())
    }

    fn job(&self, name: &str) -> Box<dyn JobCgroup> {
        Box::new(FakeJobCgroup { name: name.to_string(), backend: self.clone() })
    }
}

impl CgroupBackend for FakeBackend {
    fn prepare_root(&self) -> Result<(), CgroupError> {
        std::fs::create_dir_all(&self.mount).map_err(|e| super::util::io_err("create", &self.mount, e))
    }

    fn root_cpus_mems(&self) -> Result<(String, String), CgroupError> {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Ok((format!("0-{}", n - 1), "0".into()))
    }

    fn create(&self, name: &str, limits: &JobLimits) -> Result<Box<dyn JobCgroup>, CgroupError> {
        super::util::validate_name(name)?;
        let dir = self.mount.join(name);
        let mut s = self.state();
        if let Some(why) = s.fail_create.take() {
            return Err(super::util::io_err("create", &dir, std::io::Error::other(why)));
        }
        if s.jobs.contains_key(name) {
            return Err(CgroupError::AlreadyExists { path: dir });
        }
        std::fs::create_dir(&dir).map_err(|e| super::util::io_err("create", &dir, e))?;
        let usage = s.usage;
        s.jobs.insert(name.to_string(), FakeJob { limits: limits.clone(), usage, ..Default::default() });
        s.log.push(FakeOp::Create(name.to_string()));
        drop(s);
        Ok(self.job(name))
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn JobCgroup>>, CgroupError> {
        Ok(self.state().jobs.contains_key(name).then(|| self.job(name)))
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        Ok(self.existing())
    }

    fn remove_root(&self) -> Result<(), CgroupError> {
        for name in self.existing() {
            let job = self.job(&name);
            job.kill_all(Duration::from_secs(5))?;
            job.remove()?;
        }
        Ok(())
    }

    fn version(&self) -> u8 {
        2
    }

    fn cpuset_mount(&self) -> PathBuf {
        self.mount.clone()
    }
}

/// One job of a [`FakeBackend`].
#[derive(Debug)]
pub struct FakeJobCgroup {
    name: String,
    backend: FakeBackend,
}

impl FakeJobCgroup {
    fn with<T>(&self, f: impl FnOnce(&mut FakeJob) -> T) -> Result<T, CgroupError> {
        let mut s = self.backend.state();
        match s.jobs.get_mut(&self.name) {
            Some(job) => Ok(f(job)),
            None => {
                Err(super::util::io_err("open", &self.cpuset_dir(), std::io::Error::from_raw_os_error(libc::ENOENT)))
            }
        }
    }

    fn record(&self, op: FakeOp) {
        self.backend.state().log.push(op);
    }
}

/// `pid` and its descendants that are alive (zombies, as in a real cgroup, are not listed).
fn live_tree(pid: i32, out: &mut BTreeSet<i32>) {
    if out.contains(&pid) || !is_live(pid) {
        return;
    }
    out.insert(pid);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            live_tree(child, out);
        }
    }
}

/// The state letter of /proc/<pid>/stat (after the command's ")"); None once it is gone.
fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).map(str::to_string)
}

/// Alive and not a zombie.
fn is_live(pid: i32) -> bool {
    !matches!(proc_state(pid).as_deref(), None | Some("Z") | Some("X"))
}

/// Stopped by a signal (or gone: nothing left to stop).
fn is_stopped(pid: i32) -> bool {
    matches!(proc_state(pid).as_deref(), None | Some("T") | Some("Z") | Some("X"))
}

impl JobCgroup for FakeJobCgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn join_files(&self) -> Result<Vec<std::fs::File>, CgroupError> {
        // The child's write of b"0" goes nowhere; the spawn path reports the pid (`joined`).
        let null = Path::new("/dev/null");
        let file =
            std::fs::OpenOptions::new().write(true).open(null).map_err(|e| super::util::io_err("open", null, e))?;
        Ok(vec![file])
    }

    fn joined(&self, pid: i32) {
        let started = crate::records::proc_start_time(pid);
        if self.with(|j| j.members.insert(pid, started)).is_ok() {
            self.record(FakeOp::Joined(self.name.clone(), pid));
        }
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let members = self.with(|j| j.members.clone())?;
        let mut out = BTreeSet::new();
        for (pid, started) in members {
            if started.is_some() && crate::records::proc_start_time(pid) == started {
                live_tree(pid, &mut out);
            }
        }
        Ok(out.into_iter().collect())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.pids()?.is_empty())
    }

    fn signal_all(&self, signal: i32) -> Result<usize, CgroupError> {
        self.record(FakeOp::Signal(self.name.clone(), signal));
        procs::signal_pids(&self.pids()?, signal)
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        self.record(FakeOp::Freeze(self.name.clone()));
        procs::signal_pids(&self.pids()?, libc::SIGSTOP)?;
        // As the kernel's freezer is waited for: every member stopped.
        let waited = Duration::from_secs(2);
        if !procs::wait_until(waited, || Ok(self.pids()?.into_iter().all(is_stopped)))? {
            procs::signal_pids(&self.pids()?, libc::SIGCONT)?;
            return Err(CgroupError::Timeout { what: "the processes to stop", path: self.cpuset_dir(), waited });
        }
        self.with(|j| j.frozen = true)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        self.record(FakeOp::Thaw(self.name.clone()));
        procs::signal_pids(&self.pids()?, libc::SIGCONT)?;
        self.with(|j| j.frozen = false)
    }

    fn is_frozen(&self) -> Result<bool, CgroupError> {
        self.with(|j| j.frozen)
    }

    fn kill_all(&self, deadline: Duration) -> Result<(), CgroupError> {
        self.record(FakeOp::KillAll(self.name.clone()));
        let start = Instant::now();
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= deadline {
                return Err(CgroupError::Unkillable { pids });
            }
            procs::signal_pids(&pids, libc::SIGKILL)?;
            // SIGKILL acts on stopped processes too; their parent reaps them.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn usage(&self) -> Result<CgroupUsage, CgroupError> {
        self.record(FakeOp::Usage(self.name.clone()));
        self.with(|j| j.usage)
    }

    fn update(&self, limits: &JobLimits) -> Result<(), CgroupError> {
        self.record(FakeOp::Update(self.name.clone(), limits.clone()));
        self.with(|j| j.limits = limits.clone())
    }

    fn remove(&self) -> Result<(), CgroupError> {
        let dir = self.cpuset_dir();
        if !self.backend.state().jobs.contains_key(&self.name) {
            return Ok(()); // already gone
        }
        if !self.is_empty()? {
            return Err(super::util::io_err("rmdir", &dir, std::io::Error::from_raw_os_error(libc::EBUSY)));
        }
        std::fs::remove_dir_all(&dir).map_err(|e| super::util::io_err("rmdir", &dir, e))?;
        let mut s = self.backend.state();
        s.jobs.remove(&self.name);
        s.log.push(FakeOp::Remove(self.name.clone()));
        Ok(())
    }

    fn cpuset_dir(&self) -> PathBuf {
        self.backend.mount.join(&self.name)
    }

    fn make_child(&self, name: &str, cpus: &str, mems: &str) -> Result<PathBuf, CgroupError> {
        super::util::validate_name(name)?;
        let dir = self.cpuset_dir().join(name);
        let job_limits = self.with(|j| j.limits.clone())?;
        if self.with(|j| j.children.contains_key(name))? {
            return Err(CgroupError::AlreadyExists { path: dir });
        }
        std::fs::create_dir(&dir).map_err(|e| super::util::io_err("create", &dir, e))?;
        let cpus = if cpus.is_empty() { job_limits.cpus } else { cpus.to_string() };
        let mems = if mems.is_empty() { job_limits.mems } else { mems.to_string() };
        self.with(|j| j.children.insert(name.to_string(), (cpus, mems)))?;
        self.record(FakeOp::MakeChild(self.name.clone(), name.to_string()));
        Ok(dir)
    }

    fn read_cpuset(&self, child: Option<&str>) -> Result<Option<(String, String)>, CgroupError> {
        self.with(|j| match child {
            None => Some((j.limits.cpus.clone(), j.limits.mems.clone())),
            Some(c) => j.children.get(c).cloned(),
        })
    }

    fn chown_cpuset(&self, uid: u32, gid: u32) -> Result<(), CgroupError> {
        self.record(FakeOp::Chown(self.name.clone(), uid, gid));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_the_joined_pids_and_their_live_descendants() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeBackend::new(&dir.path().join("cg"));
        fake.prepare_root().unwrap();
        let cg = fake.create("job_1", &JobLimits { cpus: "0".into(), ..Default::default() }).unwrap();
        assert!(cg.is_empty().unwrap());
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 30 & wait"]).spawn().unwrap();
        cg.joined(child.id() as i32);
        // The shell's `sleep` shows up as a member once forked.
        let both = procs::wait_until(Duration::from_secs(5), || Ok(cg.pids()?.len() == 2)).unwrap();
        assert!(both, "members: {:?}", cg.pids().unwrap());
        assert!(cg.remove().is_err(), "a cgroup with processes is not removed");
        cg.kill_all(Duration::from_secs(5)).unwrap();
        let _ = child.wait();
        assert!(cg.is_empty().unwrap());
        cg.remove().unwrap();
        assert!(fake.existing().is_empty());
        assert!(!dir.path().join("cg/job_1").exists());
        assert!(fake.create("job_1", &JobLimits::default()).is_ok(), "a removed name can be made again");
        let log = fake.log();
        assert_eq!(log[0], FakeOp::Create("job_1".into()));
        assert_eq!(log[1], FakeOp::Joined("job_1".into(), child.id() as i32));
        assert!(log.contains(&FakeOp::KillAll("job_1".into())));
        assert!(fake.create("job_1", &JobLimits::default()).is_err(), "an existing name is refused");
    }
}
