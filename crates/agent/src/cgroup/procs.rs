//! Process handling in job cgroups: listing, signalling, freeze-and-kill,
//! and joining from a forked child.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::util::{read_optional, subdirs};
use super::CgroupError;

/// Parse a cgroup.procs / tasks file; a missing file (cgroup gone) is empty.
pub(crate) fn read_ids(path: &Path) -> Result<Vec<i32>, CgroupError> {
    let Some(text) = read_optional(path)? else {
        return Ok(Vec::new());
    };
    text.split_whitespace()
        .map(|w| {
            w.parse::<i32>()
                .map_err(|_| CgroupError::Parse { path: path.to_path_buf(), detail: format!("not a pid: {w:?}") })
        })
        .collect()
}

/// Add the processes of `dir` and every cgroup nested below it to `out`.
/// With `tasks`, threads listed only in `tasks` (e.g. of a process whose
/// leader already exited, hidden from cgroup.procs on old kernels) are
/// mapped to their process id.
pub(crate) fn collect_procs(dir: &Path, tasks: bool, out: &mut BTreeSet<i32>) -> Result<(), CgroupError> {
    let procs = read_ids(&dir.join("cgroup.procs"))?;
    let known: BTreeSet<i32> = procs.iter().copied().collect();
    out.extend(procs);
    if tasks {
        for tid in read_ids(&dir.join("tasks"))? {
            if !known.contains(&tid) {
                if let Some(tgid) = tgid_of(tid) {
                    out.insert(tgid);
                }
            }
        }
    }
    for child in subdirs(dir)? {
        collect_procs(&dir.join(child), tasks, out)?;
    }
    Ok(())
}

/// Thread-group id of thread `tid`, None if it is gone.
fn tgid_of(tid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
}

/// Signal each pid; ESRCH (already gone) is not an error. Never signals
/// pid <= 0 (process groups / everything) or the agent itself.
pub(crate) fn signal_pids(pids: &[i32], signal: i32) -> Result<usize, CgroupError> {
    let me = std::process::id() as i32;
    let mut n = 0;
    for &pid in pids {
        if pid <= 0 || pid == me {
            tracing::warn!(pid, "refusing to signal this pid found in a job cgroup");
            continue;
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        if unsafe { libc::kill(pid, signal) } == 0 {
            n += 1;
            continue;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(CgroupError::Signal { pid, signal, source: e });
        }
    }
    Ok(n)
}

/// Poll `done` until it returns true or `timeout` passes; returns the last answer.
pub(crate) fn wait_until(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, CgroupError>,
) -> Result<bool, CgroupError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if done()? {
            return Ok(true);
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(false);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Hooks for [`freeze_kill_loop`].
pub(crate) struct KillOps<'a> {
    pub pids: &'a dyn Fn() -> Result<Vec<i32>, CgroupError>,
    pub freeze: &'a dyn Fn(Duration) -> Result<(), CgroupError>,
    pub thaw: &'a dyn Fn() -> Result<(), CgroupError>,
}

/// Freeze, SIGKILL everything, thaw, repeat until empty or `deadline`.
/// Freezing first closes the race with processes that fork between listing
/// and killing; v1 frozen tasks only die once thawed, hence the thaw.
pub(crate) fn freeze_kill_loop(deadline: Duration, ops: KillOps<'_>) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        let live = (ops.pids)()?;
        if live.is_empty() {
            return Ok(());
        }
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(CgroupError::Unkillable { pids: live });
        }
        // A failed freeze (D-state task, missing freezer) still lets SIGKILL
        // make progress, so it is only logged.
        // Shorter than a suspend's wait: killing goes on without it.
        if let Err(e) = (ops.freeze)(left.min(Duration::from_secs(2))) {
            tracing::debug!(error = %e, "freeze before kill failed; killing anyway");
        }
        signal_pids(&(ops.pids)()?, libc::SIGKILL)?;
        if let Err(e) = (ops.thaw)() {
            tracing::warn!(error = %e, "thaw after kill failed; retrying");
        }
        let left = deadline.saturating_sub(start.elapsed());
        wait_until(left.min(Duration::from_millis(200)), || Ok((ops.pids)()?.is_empty()))?;
    }
}
/// Join the cgroups behind `fds` (from `JobCgroup::join_files`) by writing
/// "0" (= the writer itself) to each. Async-signal-safe and allocation-free,
/// for use in `CommandExt::pre_exec` between fork and exec.
pub fn join_from_child(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: writes one byte from a static buffer to a caller-owned fd.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cgroup.procs");
        assert_eq!(read_ids(&p).unwrap(), Vec::<i32>::new());
        fs::write(&p, "12\n7\n").unwrap();
        assert_eq!(read_ids(&p).unwrap(), vec![12, 7]);
        fs::write(&p, "12\nx\n").unwrap();
        assert!(matches!(read_ids(&p), Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn signal_pids_refuses_dangerous_pids() {
        let me = std::process::id() as i32;
        assert_eq!(signal_pids(&[0, -1, me], libc::SIGKILL).unwrap(), 0);
    }

    #[test]
    fn kill_loop_gives_up_at_deadline() {
        // Above any pid_max, so kill() gets ESRCH but the "cgroup" never empties.
        let ghost = i32::MAX - 1;
        let start = Instant::now();
        let r = freeze_kill_loop(
            Duration::from_millis(100),
            KillOps { pids: &|| Ok(vec![ghost]), freeze: &|_| Ok(()), thaw: &|| Ok(()) },
        );
        assert!(matches!(r, Err(CgroupError::Unkillable { ref pids }) if pids == &[ghost]), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(1));
        let empty =
            freeze_kill_loop(Duration::ZERO, KillOps { pids: &|| Ok(vec![]), freeze: &|_| Ok(()), thaw: &|| Ok(()) });
        assert!(empty.is_ok());
    }
}
