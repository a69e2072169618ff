//! The agent's CPU priority, and its children's.
//!
//! The agent's work per event is small but on the launch's path: reading a launch, starting
//! ranks, relaying their frames. On a node whose CPUs the job's ranks keep busy (the ranks it
//! just started, above all), an agent at the ranks' priority waits its turn for each of those
//! (measured: `run`'s launch read ~0.7-1 ms late while the two ranks of `-n 2 true` ran on a
//! 2-CPU node). At a negative nice (`berth agent --nice`, as `slurmd -n`) it preempts them for
//! those few microseconds. Everything it starts (batch scripts, ranks, tasks) gets the nice
//! the agent was started with, set in the child before exec.
//!
//! What [`set_agent_nice`] did is a [`Priority`], kept in the agent's `JobContext` and passed
//! to what starts processes (`RankLaunch::nice`) and to [`Priority::bookkeeping`].

/// The agent's nice value and its jobs', once [`set_agent_nice`] raised its priority; the
/// default: unchanged, everything runs at the nice the agent was started with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Priority {
    /// The nice value of jobs' processes (the agent's before); None while it keeps its own.
    jobs: Option<i32>,
    /// The agent's raised priority; None while it keeps the one it was started with.
    agent: Option<i32>,
}

/// Give every thread of this process the nice value `nice` (lower only); what it did, with the
/// nice value it had for the jobs' processes.
pub fn set_agent_nice(nice: i32) -> Result<Priority, NiceError> {
    // SAFETY: getpriority of this thread; errno cleared first (-1 is a valid nice value).
    let before = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if before == -1 && std::io::Error::last_os_error().raw_os_error().unwrap_or(0) != 0 {
        return Err(NiceError::Read(std::io::Error::last_os_error()));
    }
    if nice >= before {
        return Ok(Priority::default());
    }
    set_every_thread(nice).map_err(|error| NiceError::Set { nice, error })?;
    Ok(Priority { jobs: Some(before), agent: Some(nice) })
}

/// Why the agent's nice value could not be raised ([`set_agent_nice`]).
#[derive(Debug, thiserror::Error)]
pub enum NiceError {
    #[error("cannot read the agent's nice value: {0}")]
    Read(std::io::Error),
    #[error("cannot set the agent's nice value to {nice}: {error} (it needs root or CAP_SYS_NICE; --nice 0 keeps it)")]
    Set { nice: i32, error: std::io::Error },
}

/// Linux keeps a nice value per thread: each thread of the process, this one included.
fn set_every_thread(nice: i32) -> std::io::Result<()> {
    for task in std::fs::read_dir("/proc/self/task")?.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<libc::id_t>().ok()) else { continue };
        // SAFETY: setpriority of one of our own threads.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
            let error = std::io::Error::last_os_error();
            // A thread that ended between the listing and the call has no nice value to set.
            if error.raw_os_error() != Some(libc::ESRCH) {
                return Err(error);
            }
        }
    }
    Ok(())
}

impl Priority {
    /// The nice value a job's process must take before exec, if the agent changed its own.
    pub fn job_nice(self) -> Option<i32> {
        self.jobs
    }

    /// Run `f` on a blocking thread at the jobs' priority, not the agent's raised one:
    /// bookkeeping (records, a job's teardown) is nobody's wait, and should not preempt the
    /// user's processes (a `run` exiting, its shell) as the agent's launch work does. Not lower
    /// than the jobs': it takes the kernel's cgroup lock, which a launch next to it needs. Only
    /// when the agent raised its priority (it then can restore the thread's: blocking threads
    /// are reused).
    pub async fn bookkeeping<T, F>(self, f: F) -> Result<T, tokio::task::JoinError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        tokio::task::spawn_blocking(move || {
            let (Some(agent), Some(jobs)) = (self.agent, self.jobs) else { return f() };
            // SAFETY: setpriority of this thread (tid 0 = the caller), then back to the agent's.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, jobs) };
            let out = f();
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, agent) };
            out
        })
        .await
    }
}

/// In a child before exec: take the jobs' nice value `nice` (`Priority::job_nice`; None: keep
/// the agent's). Raw call, this task only; async-signal-safe.
///
/// # Safety
/// For a child between fork/clone and exec; makes one system call.
pub unsafe fn enter_job_nice(nice: Option<i32>) -> bool {
    match nice {
        Some(n) => libc::setpriority(libc::PRIO_PROCESS, 0, n) == 0,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's nice value.
    fn mine() -> i32 {
        // SAFETY: reading this thread's nice value.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }

    /// The nice value of a child forked from here that took `nice` before its exec (with None,
    /// checked in the child to be the one it inherited).
    fn child_nice(nice: Option<i32>) -> i32 {
        // SAFETY: the child makes raw system calls only, then _exit.
        let status = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let inherited = libc::getpriority(libc::PRIO_PROCESS, 0);
                let ok = enter_job_nice(nice);
                let after = libc::getpriority(libc::PRIO_PROCESS, 0);
                let kept = nice.is_some() || after == inherited;
                // Nice values are -20..=19: exit codes 0..=39; 255 when it could not be set.
                libc::_exit(if ok && kept { after + 20 } else { 255 });
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            st
        };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 255, "the child failed: {status}");
        libc::WEXITSTATUS(status) - 20
    }

    #[test]
    fn each_agent_starts_its_jobs_at_its_own_jobs_nice() {
        // Three agents' priorities in one process (two set, one default) (a higher number needs no privilege).
        let (a, b) = ((mine() + 1).min(19), (mine() + 3).min(19));
        let (pa, pb) = (Priority { jobs: Some(a), agent: None }, Priority { jobs: Some(b), agent: None });
        assert_eq!((child_nice(pa.job_nice()), child_nice(pb.job_nice())), (a, b));
        // Unchanged: the child keeps what it inherited (checked in the child).
        assert_eq!(Priority::default().job_nice(), None);
        child_nice(None);
    }

    /// Set in the test's own process, started again by the test below: lower the nice value
    /// there, where every thread may take it.
    const LOWERING: &str = "BERTH_TEST_LOWER_NICE_HERE";

    #[test]
    fn children_get_back_the_nice_the_agent_had() {
        if std::env::var_os(LOWERING).is_some() {
            return lowering_the_agents_nice();
        }
        let before = mine();
        // Raising the nice value (lowering priority) needs no privilege: the same code path,
        // checked for the "lower only" rule.
        assert_eq!(set_agent_nice(before + 1).unwrap(), Priority::default());
        assert_eq!(mine(), before, "never raises the number");
        // Bookkeeping takes the jobs' nice and gives its (reused) thread back the agent's; with
        // both above ours (no privilege needed), on a runtime of its own.
        let (jobs, agent) = ((before + 1).min(19), (before + 2).min(19));
        let rt = tokio::runtime::Builder::new_current_thread().max_blocking_threads(1).build().unwrap();
        let during = rt.block_on(Priority { jobs: Some(jobs), agent: Some(agent) }.bookkeeping(mine)).unwrap();
        let after = rt.block_on(async { tokio::task::spawn_blocking(mine).await }).unwrap();
        assert_eq!((during, after), (jobs, agent));
        drop(rt);
        assert_eq!(mine(), before, "the test's own thread kept its nice value");

        // Lowering it needs root (or CAP_SYS_NICE), and changes every thread of the process:
        // done in a process of its own (this test, started again), not in the test process.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "lowering the agent's nice value needs root, and CI runs as root"
            );
            eprintln!("NOT RUN (needs root): lowering the agent's nice value; run the tests as root");
            return;
        }
        let name = concat!(module_path!(), "::children_get_back_the_nice_the_agent_had");
        let name = name.split_once("::").map_or(name, |(_crate, path)| path);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(LOWERING, "1")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("1 passed"), "in a process of its own: {said}");
        assert_eq!(mine(), before, "the test process's nice value changed");
    }

    /// In a process of its own: the agent lowers its nice value (every thread), its children
    /// take back the one it had, and bookkeeping runs at theirs.
    fn lowering_the_agents_nice() {
        let before = mine();
        let priority = set_agent_nice(before - 2).unwrap();
        assert_eq!(mine(), before - 2);
        assert_eq!(priority, Priority { jobs: Some(before), agent: Some(before - 2) });
        assert_eq!(child_nice(priority.job_nice()), before, "the child runs at the nice the agent started with");
        // Bookkeeping runs at the jobs' priority, and its (reused) thread comes back to the agent's.
        let rt = tokio::runtime::Builder::new_current_thread().max_blocking_threads(1).build().unwrap();
        let during = rt.block_on(priority.bookkeeping(mine)).unwrap();
        let after = rt.block_on(async { tokio::task::spawn_blocking(mine).await }).unwrap();
        assert_eq!((during, after), (before, before - 2));
    }
}
