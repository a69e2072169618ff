//! A task's process on this node, once started: waiting for it while its signals go to its
//! process group ([`watch_local`]), ending what it left in its session ([`end_session`]),
//! and an attached task's stdio: its output relayed ([`pump_output`], for at most
//! [`OUTPUT_LINGER`] after its end: [`Linger`]) and its caller's stdin fed ([`feed_stdin`]).

use crate::ports::JobHandle;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Output of an attached task: (stream 1 or 2, bytes).
pub(super) type OutputTx = mpsc::UnboundedSender<(u8, Vec<u8>)>;

/// Relay an attached task's stdout and stderr to `out` until they close.
pub(super) fn pump_output(child: &mut crate::step::rank::Process, out: &OutputTx) {
    use tokio::io::AsyncReadExt;
    async fn pump(mut r: tokio::net::unix::pipe::Receiver, stream: u8, out: OutputTx) {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = r.read(&mut buf).await {
            if out.send((stream, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    }
    if let Some(r) = child.stdout.take() {
        tokio::spawn(pump(r, 1, out.clone()));
    }
    if let Some(r) = child.stderr.take() {
        tokio::spawn(pump(r, 2, out.clone()));
    }
}

/// How long an attached task's output may go on after it ended (a background process still
/// holding its stdout), as `berth run` gives a rank's.
const OUTPUT_LINGER: Duration = Duration::from_secs(2);

/// The end of an attached task's relay (`exec` on the caller's node, `run_remote` on the task's): the
/// task's output is relayed until it closes, or for [`OUTPUT_LINGER`] after the task ended,
/// whichever comes first.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Linger {
    ended_at: Option<tokio::time::Instant>,
}

impl Linger {
    /// The task ended now (the first call counts).
    pub(super) fn task_ended(&mut self) {
        self.ended_at.get_or_insert_with(tokio::time::Instant::now);
    }

    pub(super) fn ended(&self) -> bool {
        self.ended_at.is_some()
    }

    /// Whether the relay is done: the task ended and its output closed.
    pub(super) fn done(&self, output_open: bool) -> bool {
        self.ended() && !output_open
    }

    /// Completes [`OUTPUT_LINGER`] after the task's end; never while it runs. Owns its
    /// deadline, so a `select!` arm may hold it while another arm calls `task_ended`.
    pub(super) fn over(&self) -> impl std::future::Future<Output = ()> + 'static {
        let ended_at = self.ended_at;
        async move {
            match ended_at {
                Some(t) => tokio::time::sleep_until(t + OUTPUT_LINGER).await,
                None => std::future::pending().await,
            }
        }
    }
}

/// How many chunks of a caller's stdin (each one frame, `berth task rsh` sends at most 16 KiB)
/// wait for the task to read them, per task.
pub(super) const STDIN_CHUNKS: usize = 16;

/// Write what arrives on `rx` to a task's stdin, in order; close it (EOF) when `rx` ends. A
/// task that closed its stdin gets nothing more (the rest is read and dropped, so the caller
/// is never held up by it).
pub(super) async fn feed_stdin(mut pipe: tokio::net::unix::pipe::Sender, mut rx: mpsc::Receiver<Vec<u8>>) {
    use tokio::io::AsyncWriteExt;
    while let Some(chunk) = rx.recv().await {
        if pipe.write_all(&chunk).await.is_err() {
            while rx.recv().await.is_some() {}
            return;
        }
    }
}

pub(super) fn signal_group(pid: u32, sig: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) on the process group of a child of ours not reaped yet (it called setsid).
    unsafe {
        if libc::kill(-pid, sig) != 0 {
            libc::kill(pid, sig);
        }
    }
}

/// A task's session (it called setsid: its id is the task's pid): once the task has ended,
/// what it left running in the job's cgroup (`sleep &`, children of children) is killed, as
/// the PBS node daemon ends a task's session. Processes that left the session (setsid again)
/// stay in the job's cgroup and end with the job.
pub(super) async fn end_session(job: &Arc<JobHandle>, sid: u32) {
    let Ok(sid) = i32::try_from(sid) else { return };
    if sid <= 0 {
        return;
    }
    let cg = job.cgroup.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for _ in 0..50 {
            let left: Vec<i32> =
                cg.pids().unwrap_or_default().into_iter().filter(|p| session_of(*p) == Some(sid)).collect();
            if left.is_empty() {
                return;
            }
            for p in left {
                // SAFETY: kill(2) on a process of the job's cgroup in the ended task's session.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    })
    .await;
}

/// The session id of a process (`/proc/PID/stat`, the field after the state and parents).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// How a child ended: (exit code, signal).
pub(super) fn status_of(st: &std::io::Result<std::process::ExitStatus>) -> (Option<i32>, Option<i32>) {
    match st {
        Ok(st) => (st.code(), st.signal()),
        Err(_) => (None, None),
    }
}

/// Wait for a local task, delivering signals to its process group until it ends.
pub(super) async fn watch_local(
    job: Arc<JobHandle>,
    id: u64,
    mut child: crate::step::rank::Process,
    mut signals: mpsc::UnboundedReceiver<i32>,
) {
    let pid = child.id().unwrap_or(0);
    let mut open = true;
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            sig = signals.recv(), if open => match sig {
                Some(sig) => signal_group(pid, sig),
                None => open = false,
            },
        }
    };
    end_session(&job, pid).await;
    let (code, sig) = status_of(&status);
    match status {
        Ok(_) => job.tasks.with(|t| t.exited(id, code, sig, None)),
        Err(e) => job.tasks.with(|t| t.failed(id, format!("lost track of the task: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_lingers_for_output_after_the_task_ended_then_stops() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let mut linger = Linger::default();
            assert!(!linger.ended() && !linger.done(false), "a running task's relay goes on");
            let long = tokio::time::timeout(Duration::from_secs(3600), linger.over()).await;
            assert!(long.is_err(), "no end while the task runs");
            let start = tokio::time::Instant::now();
            linger.task_ended();
            assert!(linger.done(false), "ended, output closed: done at once");
            assert!(!linger.done(true), "ended, output open: it lingers");
            let waiting = linger.over();
            // A later end does not move the deadline.
            tokio::time::advance(Duration::from_millis(500)).await;
            linger.task_ended();
            waiting.await;
            assert_eq!(start.elapsed(), OUTPUT_LINGER, "over OUTPUT_LINGER after the first end");
            let again = tokio::time::Instant::now();
            linger.over().await;
            assert_eq!(again.elapsed(), Duration::ZERO, "the deadline has passed: over at once");
        });
    }

    #[test]
    fn a_session_id_is_read_past_odd_command_names() {
        let own = session_of(std::process::id() as i32).expect("our own session");
        // SAFETY: getsid(0) has no preconditions.
        assert_eq!(own, unsafe { libc::getsid(0) });
        assert_eq!(session_of(-1), None);
    }
}
