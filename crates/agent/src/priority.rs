//! The agent's CPU priority, and its children's.
//!
//! The agent's work per event is small but on the launch's path: reading a launch, starting
//! ranks, relaying their frames. On a node whose CPUs the job's ranks keep busy (the ranks it
//! just started, above all), an agent at the ranks' priority waits its turn for each of those
//! (measured: `run`'s launch read ~0.7-1 ms late while the two ranks of `-n 2 true` ran on a
//! 2-CPU node). At a negative nice (`berth agent --nice`, as `slurmd -n`) it preempts them for
//! those few microseconds. Everything it starts (batch scripts, ranks, tasks) gets the nice
//! the agent was started with, set in the child before exec.

use std::sync::atomic::{AtomicI32, Ordering};

/// The nice value of jobs' processes; `NOT_CHANGED` while the agent keeps its own.
static JOB_NICE: AtomicI32 = AtomicI32::new(NOT_CHANGED);
/// The agent's raised priority; `NOT_CHANGED` while it keeps the one it was started with.
static AGENT_NICE: AtomicI32 = AtomicI32::new(NOT_CHANGED);
const NOT_CHANGED: i32 = i32::MIN;

/// Give every thread of this process the nice value `nice` (lower only), remembering the one
/// it had for the jobs' processes.
pub fn set_agent_nice(nice: i32) -> Result<(), NiceError> {
    // SAFETY: getpriority of this thread; errno cleared first (-1 is a valid nice value).
    let before = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if before == -1 && std::io::Error::last_os_error().raw_os_error().unwrap_or(0) != 0 {
        return Err(NiceError::Read(std::io::Error::last_os_error()));
    }
    if nice >= before {
        return Ok(());
    }
    set_every_thread(nice).map_err(|error| NiceError::Set { nice, error })?;
    JOB_NICE.store(before, Ordering::Relaxed);
    AGENT_NICE.store(nice, Ordering::Relaxed);
    Ok(())
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

/// The nice value a job's process must take before exec, if the agent changed its own.
/// Async-signal-safe (one atomic load): for children between fork and exec.
pub fn job_nice() -> Option<i32> {
    let n = JOB_NICE.load(Ordering::Relaxed);
    (n != NOT_CHANGED).then_some(n)
}

/// Run `f` on a blocking thread at the jobs' priority, not the agent's raised one: bookkeeping
/// (records, a job's teardown) is nobody's wait, and should not preempt the user's processes
/// (a `run` exiting, its shell) as the agent's launch work does. Not lower than the jobs':
/// it takes the kernel's cgroup lock, which a launch next to it needs. Only when the agent
/// raised its priority (it then can restore the thread's: blocking threads are reused).
pub async fn bookkeeping<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let (Some(agent), Some(jobs)) = (agent_nice(), job_nice()) else { return f() };
        // SAFETY: setpriority of this thread (tid 0 = the caller), then back to the agent's.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, jobs) };
        let out = f();
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, agent) };
        out
    })
    .await
}

/// The agent's own nice value, if it raised its priority (see [`set_agent_nice`]).
fn agent_nice() -> Option<i32> {
    let n = AGENT_NICE.load(Ordering::Relaxed);
    (n != NOT_CHANGED).then_some(n)
}

/// In a child before exec: take the jobs' nice value. Raw call, this task only.
///
/// # Safety
/// For a child between fork/clone and exec; makes one system call.
pub unsafe fn enter_job_nice() -> bool {
    match job_nice() {
        Some(n) => libc::setpriority(libc::PRIO_PROCESS, 0, n) == 0,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_get_back_the_nice_the_agent_had() {
        // SAFETY: reading this thread's nice value.
        let mine = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = mine();
        assert_eq!(job_nice(), None);
        // Raising the nice value (lowering priority) needs no privilege: the same code path,
        // checked for the "lower only" rule.
        set_agent_nice(before + 1).unwrap();
        assert_eq!((mine(), job_nice()), (before, None), "never raises the number");
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("NOT RUN (needs root): lowering the agent's nice value");
            return;
        }
        set_agent_nice(before - 2).unwrap();
        assert_eq!(mine(), before - 2);
        assert_eq!(job_nice(), Some(before));
        // A forked child takes the jobs' value back.
        let out = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let ok = enter_job_nice();
                libc::_exit(if ok && libc::getpriority(libc::PRIO_PROCESS, 0) == before { 0 } else { 1 });
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            st
        };
        assert_eq!(out, 0, "the child runs at the nice the agent started with");
        // Bookkeeping runs at the jobs' priority, and its (reused) thread comes back to the agent's.
        let rt = tokio::runtime::Builder::new_current_thread().max_blocking_threads(1).build().unwrap();
        let during = rt.block_on(bookkeeping(mine)).unwrap();
        let after = rt.block_on(async { tokio::task::spawn_blocking(mine).await }).unwrap();
        assert_eq!((during, after), (before, before - 2));
        drop(rt);
        set_every_thread(before).unwrap();
        JOB_NICE.store(NOT_CHANGED, Ordering::Relaxed);
        AGENT_NICE.store(NOT_CHANGED, Ordering::Relaxed);
    }
}
