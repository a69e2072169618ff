//! The spare job cgroup: made ahead (after a job's end, at start), taken by the next
//! `create`, which renames it in each hierarchy. A v1 cgroup's mkdir costs 25-65 µs per
//! hierarchy (the kernel makes its files), a rename ~10: ~0.15 ms less on each launch's path
//! (BENCHMARKS.md, issue 4). A fresh cgroup never held a process: nothing of an earlier job is
//! in its accounting.

use std::path::Path;
use std::time::Duration;

use super::{util, V1Backend, V1Job};
use crate::cgroup::CgroupError;

/// The spare's name under the agent's root (never a job's: those are `job_<id>`).
pub const SPARE: &str = "spare";

impl V1Backend {
    /// Make the spare, unless there is one.
    pub(super) fn make_spare_dirs(&self) -> Result<(), CgroupError> {
        let spare = self.job_unchecked(SPARE);
        for dir in spare.paths.unique() {
            util::create_dir(dir)?; // false: already there
        }
        oom_killer_on(&spare.paths.memory)
    }

    /// Rename the spare to `job`'s directories; false (and nothing changed) if there is no
    /// complete spare or `job` exists in some hierarchy.
    pub(super) fn take_spare(&self, job: &V1Job) -> bool {
        let spare = self.job_unchecked(SPARE);
        let pairs: Vec<(&Path, &Path)> = spare.paths.unique().into_iter().zip(job.paths.unique()).collect();
        let moved = pairs.iter().take_while(|(from, to)| std::fs::rename(from, to).is_ok()).count();
        if moved == pairs.len() {
            return true;
        }
        for (from, to) in pairs[..moved].iter().rev() {
            // Back to a spare; a directory that cannot go back goes (it is empty).
            if std::fs::rename(to, from).is_err() {
                if let Err(e) = util::remove_tree(to, Duration::from_millis(200)) {
                    tracing::warn!(error = %e, "cannot undo a partly taken spare cgroup");
                }
            }
        }
        false
    }
}

/// Children inherit memory.oom_control's oom_kill_disable; berth wants the OOM killer on.
pub(super) fn oom_killer_on(memory_dir: &Path) -> Result<(), CgroupError> {
    let oom = memory_dir.join("memory.oom_control");
    if util::read_optional(&oom)?.and_then(|t| util::keyed_u64(&t, "oom_kill_disable")) == Some(1) {
        util::write_value(&oom, "0")?;
    }
    Ok(())
}
