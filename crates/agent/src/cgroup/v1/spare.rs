//! The spare job cgroup: taken by the next `create`, which renames it in each hierarchy. A v1
//! cgroup's mkdir costs 25-65 µs per hierarchy (the kernel makes its files), its rmdir as much
//! again plus the kernel's deferred freeing, a rename ~8: a spare made ahead takes the mkdirs
//! off the launch's path (BENCHMARKS.md, issue 4), and an ended job's cgroup that becomes a
//! spare (`retire`) saves both the rmdirs and the mkdirs (issue 19). Up to [`POOL`] spares are
//! kept: the one made ahead and ended jobs' beside it; `create` takes a kept job's first.
//!
//! A retired cgroup must be as good as a new one: only a cgroup whose job left nothing that
//! cannot be reset is retired so (no OOM kill and no refused fork counted: v1 cannot reset
//! `memory.oom_control`'s `oom_kill` nor `pids.events`; no nested cgroup; at most
//! [`LEFT_MAX`] bytes still charged to its memory cgroup, after `memory.force_empty` when
//! more was, up to [`RECLAIM_MAX`] and no tmpfs page (the kernel frees an exited process's
//! memory and the charges it caches per CPU some time after the exit); no `devices` rules,
//! which can only be added), and its resettable counters are reset before it is one (CPU
//! time, peak memory, failure counts), its process limit set back to none. Its cpuset directory is kept only if
//! it never was a user's (`chown_cpuset`): a user may still hold its `tasks` file open for
//! writing, which a rename would carry over to the next job; it is made anew otherwise.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use super::{util, V1Backend, V1Job};
use crate::cgroup::{CgroupError, CgroupUsage, JobCgroup, Retired};

/// The name of the spare made ahead under the agent's root, and the prefix of the others'
/// (never a job's: those are `job_<id>`).
pub const SPARE: &str = "spare";

/// The most an ended job may still have charged to its memory cgroup (kernel objects not
/// freed yet, page cache its files left) for the cgroup to become the spare: the next job's
/// peak starts from it (`memory.max_usage_in_bytes` resets to the current usage). A job that
/// leaves more (files in its page cache, tmpfs) gets a new memory cgroup.
pub const LEFT_MAX: u64 = 512 << 10;

/// Above [`LEFT_MAX`] and up to this much charged, the kernel is asked to reclaim it
/// (`memory.force_empty`) before the cgroup is given up; more is a job's data in the page
/// cache, which is not evicted for a spare's sake.
pub const RECLAIM_MAX: u64 = 2 << 20;

/// How many spares an agent keeps at most: the one made ahead ([`SPARE`], by `make_spare`)
/// and ended jobs' cgroups kept beside it (`spare1`, ...), so that on a node whose jobs end
/// together (several one-core jobs) each end keeps its cgroup for a next launch.
pub const POOL: usize = 4;

/// The name of spare `slot` (0: [`SPARE`]).
pub fn slot_name(slot: usize) -> String {
    match slot {
        0 => SPARE.to_string(),
        n => format!("{SPARE}{n}"),
    }
}

/// Which spares are known to be there whole, behind the lock that orders taking, making and
/// retiring them (jobs start and end on several threads).
#[derive(Debug, Default)]
pub struct Spare {
    whole: Mutex<[bool; POOL]>,
}

impl Spare {
    fn lock(&self) -> std::sync::MutexGuard<'_, [bool; POOL]> {
        self.whole.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl V1Backend {
    /// Make the spare made ahead ([`SPARE`]), unless it is there.
    pub(super) fn make_spare_dirs(&self) -> Result<(), CgroupError> {
        let mut whole = self.spare.lock();
        if whole[0] {
            return Ok(());
        }
        let spare = self.job_unchecked(SPARE);
        for dir in spare.paths.unique() {
            util::create_dir(dir)?; // false: already there
        }
        oom_killer_on(&spare.paths.memory)?;
        memory_migrate_on(&spare.paths.cpuset)?;
        whole[0] = true;
        Ok(())
    }

    /// Rename a spare (a kept job's first, the one made ahead last) to `job`'s directories;
    /// false (and nothing changed) if there is no whole spare or `job` exists in some hierarchy.
    pub(super) fn take_spare(&self, job: &V1Job) -> bool {
        let mut whole = self.spare.lock();
        let Some(slot) = (0..POOL).rev().find(|&i| whole[i]) else { return false };
        whole[slot] = false;
        let spare = self.job_unchecked(&slot_name(slot));
        let pairs: Vec<(&Path, &Path)> = spare.paths.unique().into_iter().zip(job.paths.unique()).collect();
        let moved = pairs.iter().take_while(|(from, to)| std::fs::rename(from, to).is_ok()).count();
        if moved == pairs.len() {
            return true;
        }
        let mut back = true;
        for (from, to) in pairs[..moved].iter().rev() {
            // Back to a spare; a directory that cannot go back goes (it is empty).
            if std::fs::rename(to, from).is_err() {
                back = false;
                if let Err(e) = util::remove_tree(to, Duration::from_millis(200)) {
                    tracing::warn!(error = %e, "cannot undo a partly taken spare cgroup");
                }
            }
        }
        if back {
            whole[slot] = true; // as it was, for the next job
        } else {
            remove_slot(&spare.paths); // not whole: what is left of it goes
        }
        false
    }
}

/// Remove what is there of a spare that is not whole (best effort: it is empty).
fn remove_slot(paths: &super::V1Paths) {
    for dir in paths.unique() {
        if let Err(e) = util::remove_tree(dir, Duration::from_millis(200)) {
            tracing::warn!(error = %e, "cannot remove a part of a spare cgroup");
        }
    }
}

impl V1Job {
    /// [`JobCgroup::retire`]: a spare if fewer than [`POOL`] are there and nothing of the job
    /// can outlive it there (see the module's comment), else removed.
    pub(super) fn retire_to_spare(&self, usage: &CgroupUsage) -> Result<Retired, CgroupError> {
        let verdict = self.may_become_spare(usage);
        if verdict != Retired::Spare {
            self.remove()?;
            return Ok(verdict);
        }
        let mut whole = self.spare.lock();
        let Some(slot) = (0..POOL).find(|&i| !whole[i]) else {
            drop(whole);
            self.remove()?;
            return Ok(Retired::Removed);
        };
        let spare = self.paths.join_sibling(&slot_name(slot));
        match self.become_spare(&spare) {
            Ok(()) => {
                whole[slot] = true;
                Ok(Retired::Spare)
            }
            Err(e) => {
                // What was renamed already goes, with what is left of the job.
                remove_slot(&spare);
                drop(whole);
                tracing::debug!(job = %self.name, error = %e, "the job's cgroup could not become a spare");
                self.remove()?;
                Ok(Retired::Removed)
            }
        }
    }

    /// [`Retired::Spare`] if this cgroup may become the spare, else why not.
    fn may_become_spare(&self, usage: &CgroupUsage) -> Retired {
        if usage.oom_kills != 0 || usage.pids_limit_hits != 0 || self.paths.devices.is_some() {
            return Retired::NotClean;
        }
        // A cgroup directory's link count is 2 plus its nested cgroups (rank sub-cpusets,
        // or the job's own).
        let nested =
            |dir: &Path| std::fs::symlink_metadata(dir).map(|m| std::os::unix::fs::MetadataExt::nlink(&m) != 2);
        if self.paths.unique().into_iter().any(|d| nested(d).unwrap_or(true)) {
            return Retired::NotClean;
        }
        let mem = &self.paths.memory;
        let charged =
            || -> Option<u64> { util::read_optional(&mem.join("memory.usage_in_bytes")).ok()??.trim().parse().ok() };
        let Some(left) = charged() else { return Retired::NotClean };
        if left <= LEFT_MAX {
            return Retired::Spare;
        }
        if left > RECLAIM_MAX || self.holds_shmem() {
            return Retired::Charged { bytes: left };
        }
        // What is left after a short job is mostly the kernel's: memory of its exited processes
        // not freed yet, and charges cached per CPU; `memory.force_empty` drains those and
        // reclaims the page cache the job's files left (an empty cgroup only, as this is).
        if let Err(e) = util::write_value(&mem.join("memory.force_empty"), "0") {
            tracing::debug!(job = %self.name, error = %e, "memory.force_empty refused");
        }
        match charged() {
            Some(n) if n <= LEFT_MAX => Retired::Spare,
            Some(n) => Retired::Charged { bytes: n },
            None => Retired::NotClean,
        }
    }

    /// Whether tmpfs or shared memory pages are charged to the job (a file it left in
    /// /dev/shm): never reclaimed for a spare (that would push a user's file to swap).
    fn holds_shmem(&self) -> bool {
        let stat = util::read_optional(&self.paths.memory.join("memory.stat"));
        !matches!(stat.map(|t| t.and_then(|t| util::keyed_u64(&t, "shmem"))), Ok(Some(0)))
    }

    /// Reset what the job counted, then rename each directory to the spare's; a cpuset
    /// directory that was a user's is removed and the spare's made anew.
    fn become_spare(&self, spare: &super::V1Paths) -> Result<(), CgroupError> {
        util::write_value(&self.paths.cpuacct.join("cpuacct.usage"), "0")?;
        let mem = &self.paths.memory;
        util::write_value(&mem.join("memory.max_usage_in_bytes"), "0")?;
        util::write_value(&mem.join("memory.failcnt"), "0")?;
        if util::write_optional(&mem.join("memory.memsw.max_usage_in_bytes"), "0")? {
            util::write_value(&mem.join("memory.memsw.failcnt"), "0")?;
        }
        if let Some(dir) = &self.paths.pids {
            util::write_value(&dir.join("pids.max"), "max")?;
        }
        let keep_cpuset = self.cpuset_private.load(Ordering::Relaxed);
        for (from, to) in self.paths.unique().into_iter().zip(spare.unique()) {
            if from == self.paths.cpuset && !keep_cpuset {
                util::remove_tree(from, util::RMDIR_WAIT)?;
                if !util::create_dir(to)? {
                    return Err(CgroupError::AlreadyExists { path: to.to_path_buf() });
                }
                memory_migrate_on(to)?;
                continue;
            }
            std::fs::rename(from, to).map_err(|e| util::io_err("rename to the spare", from, e))?;
        }
        Ok(())
    }
}

/// A job's pages follow a change of its `cpuset.mems` (a suspended job resumed elsewhere; v2
/// always migrates): written once, when a job's cpuset directory is made (a new job's, the
/// spare's), before its mems are; absent on kernels without it.
pub(super) fn memory_migrate_on(cpuset_dir: &Path) -> Result<(), CgroupError> {
    util::write_optional(&cpuset_dir.join("cpuset.memory_migrate"), "1").map(|_| ())
}

/// Children inherit memory.oom_control's oom_kill_disable; berth wants the OOM killer on.
pub(super) fn oom_killer_on(memory_dir: &Path) -> Result<(), CgroupError> {
    let oom = memory_dir.join("memory.oom_control");
    if util::read_optional(&oom)?.and_then(|t| util::keyed_u64(&t, "oom_kill_disable")) == Some(1) {
        util::write_value(&oom, "0")?;
    }
    Ok(())
}
