//! `exec` (`berth task rsh`): one task attached to its caller's connection, its output and
//! exit relayed up, the caller's signals and stdin down, and a caller that goes away hung up
//! on as sshd does ([`HangUp`]).

use super::access::{authorize, check_spawn, error, Caller, SpawnAsk};
use super::env::task_env;
use super::process::{feed_stdin, pump_output, watch_local, Linger, STDIN_CHUNKS};
use super::remote::{drive_remote, Remote};
use super::spawn::{spawn_here, Stdio, START_WAIT};
use crate::ports::{JobContext, JobHandle};
use berth_core::JobId;
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::step::{Chunk, TaskReply, TaskRequest};
use berth_protocol::{read_frame_limited, write_frame};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// `exec` (`berth task rsh`): one task on node `ask.node`, attached to the caller's
/// connection. Answers `spawned`; then relays the task's output as `output` frames and the
/// caller's `signal` frames to the task, and ends with `exited` (or `error` if the task was
/// lost). A caller that goes away takes the task with it, as sshd treats a dropped ssh: SIGHUP
/// at once, SIGTERM (and SIGCONT) half a grace period later, SIGKILL at its end ([`HangUp`]).
pub(super) async fn exec(ctx: &Arc<JobContext>, caller: Caller, id: JobId, ask: SpawnAsk, mut stream: UnixStream) {
    let refuse = |m: String| AgentReply::Task { reply: error(m) };
    let job = match authorize(ctx, caller, id) {
        Ok(j) => j,
        Err(e) => return drop(write_frame(&mut stream, &refuse(e.into())).await),
    };
    if let Err(e) = check_spawn(&job, &ask) {
        return drop(write_frame(&mut stream, &refuse(e.into())).await);
    }
    let spec = &job.spec;
    let node_name = spec.nodes[ask.node as usize].0.clone();
    let local = node_name == spec.allocation.node;
    let address = spec.addresses.get(ask.node as usize).cloned().unwrap_or_default();
    if !local && address.is_empty() {
        let m = format!("the agent address of node {} ({node_name}) is unknown", ask.node);
        return drop(write_frame(&mut stream, &refuse(m)).await);
    }
    let task = job.tasks.with(|t| t.add_attached(ask.node, &node_name, &ask.argv));
    let env = task_env(&ask.env, spec.id, task, ask.node, spec.compat.is_some());
    let (sig_tx, sig_rx) = mpsc::unbounded_channel();
    job.tasks.with(|t| t.set_signals(task, sig_tx));
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    // The caller's stdin, to the task (here) or to the agent that runs it: bounded.
    let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(STDIN_CHUNKS);
    let mut stdin_rx = Some(stdin_rx);
    if local {
        match spawn_here(ctx, &job, &ask.argv, env, &ask.cwd, Stdio::Pipes) {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                job.tasks.with(|t| t.started(task, pid));
                pump_output(&mut child, &out_tx);
                if let (Some(pipe), Some(rx)) = (child.stdin.take(), stdin_rx.take()) {
                    tokio::spawn(feed_stdin(pipe, rx));
                }
                tokio::spawn(watch_local(job.clone(), task, child, sig_rx));
            }
            Err(e) => job.tasks.with(|t| t.failed(task, e.to_string())),
        }
    } else {
        let req = TaskRequest::RemoteSpawn {
            job: spec.id,
            node: ask.node,
            task,
            argv: ask.argv.clone(),
            env,
            cwd: ask.cwd.clone(),
            output: String::new(),
            error: String::new(),
            attach: true,
        };
        let (started_tx, started_rx) = oneshot::channel();
        let out = Some(out_tx.clone());
        let remote = Remote { signals: sig_rx, stdin: stdin_rx.take(), started: started_tx, output: out };
        tokio::spawn(drive_remote(ctx.clone(), job.clone(), task, address, req, remote));
        let _ = tokio::time::timeout(START_WAIT, started_rx).await;
    }
    drop(out_tx);
    let infos = job.tasks.read(|t| t.infos(&[task]));
    let failed = infos.iter().any(|i| i.state == "failed");
    if write_frame(&mut stream, &AgentReply::Task { reply: TaskReply::Spawned { tasks: infos } }).await.is_err() {
        // Not yet told it runs: the caller cannot have relied on it.
        job.tasks.read(|t| t.signal(&[task], libc::SIGKILL));
        return;
    }
    if failed {
        return;
    }
    let (mut rd, mut wr) = stream.into_split();
    // The caller's frames, read by their own task (a read cut by select! would lose bytes).
    // Its stdin goes on from here: while the task does not read it, this reader waits and
    // the caller's writes with it (its signals queue behind).
    let (down_tx, mut down) = mpsc::unbounded_channel();
    let conns = ctx.conns.clone();
    let reader = tokio::spawn(async move {
        let limits = conns.local_request(true);
        let limits = berth_protocol::FrameLimits { idle: None, ..limits };
        let mut stdin = Some(stdin_tx);
        loop {
            let msg = read_frame_limited::<_, AgentQuery>(&mut rd, &limits).await;
            match msg {
                Ok(Some(AgentQuery::Task { request: TaskRequest::Stdin { data } })) => {
                    if let Some(tx) = &stdin {
                        if tx.send(data.as_bytes().to_vec()).await.is_err() {
                            stdin = None;
                        }
                    }
                    continue;
                }
                Ok(Some(AgentQuery::Task { request: TaskRequest::StdinEof })) => {
                    stdin = None;
                    continue;
                }
                _ => {}
            }
            let end = !matches!(msg, Ok(Some(_)));
            if down_tx.send(msg).is_err() || end {
                return;
            }
        }
    });
    let mut output_open = true;
    let mut caller_here = true;
    let mut linger = Linger::default();
    let mut hang_up = HangUp::new(job.spec.kill_grace_ms);
    let ids = [task];
    while !linger.done(output_open) {
        tokio::select! {
            chunk = out_rx.recv(), if output_open => match chunk {
                Some((stream, data)) => {
                    let frame = AgentReply::Task { reply: TaskReply::Output { stream, data: Chunk::from_bytes(data) } };
                    if caller_here && write_frame(&mut wr, &frame).await.is_err() {
                        caller_here = false;
                        hang_up.start(&job, task);
                    }
                }
                None => output_open = false,
            },
            msg = down.recv(), if caller_here => match msg {
                Some(Ok(Some(AgentQuery::Task { request: TaskRequest::Signal { signal } }))) if (1..=64).contains(&signal) => {
                    job.tasks.read(|t| t.signal(&[task], signal));
                }
                Some(Ok(Some(_))) => {}
                _ => {
                    // The caller went away: the task goes too, given time to end itself.
                    caller_here = false;
                    hang_up.start(&job, task);
                }
            },
            _ = hang_up.next(), if hang_up.pending() && !linger.ended() => hang_up.step(&job, task),
            _ = job.tasks.wait(&ids, None), if !linger.ended() => linger.task_ended(),
            _ = linger.over() => break,
        }
    }
    reader.abort();
    if !caller_here {
        return;
    }
    let info = job.tasks.read(|t| t.infos(&[task])).pop();
    let reply = match info {
        Some(i) if i.state == "exited" => {
            TaskReply::Exited { exit_code: i.exit_code, signal: i.signal, wall_ms: i.wall_ms.unwrap_or(0) }
        }
        Some(i) => error(i.reason.unwrap_or_else(|| "the task was lost".into())),
        None => error("the task was lost"),
    };
    let _ = write_frame(&mut wr, &AgentReply::Task { reply }).await;
}

/// What an `exec` task gets once its caller is gone: SIGHUP, then SIGTERM and SIGCONT half
/// the grace period later, then SIGKILL at its end. The grace is the job's kill grace,
/// bounded to 1-60 s (a handler of SIGHUP always gets a second).
struct HangUp {
    grace: Duration,
    /// Signals sent so far (0: the caller is here).
    sent: u8,
    next_at: Option<tokio::time::Instant>,
}

impl HangUp {
    fn new(kill_grace_ms: u64) -> HangUp {
        HangUp { grace: Duration::from_millis(kill_grace_ms.clamp(1_000, 60_000)), sent: 0, next_at: None }
    }

    /// The caller went away: SIGHUP now.
    fn start(&mut self, job: &JobHandle, task: u64) {
        if self.sent == 0 {
            job.tasks.read(|t| t.signal(&[task], libc::SIGHUP));
            self.sent = 1;
            self.next_at = Some(tokio::time::Instant::now() + self.grace / 2);
        }
    }

    fn pending(&self) -> bool {
        self.next_at.is_some()
    }

    async fn next(&self) {
        match self.next_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// The next signal is due: SIGTERM (and SIGCONT), then SIGKILL.
    fn step(&mut self, job: &JobHandle, task: u64) {
        if self.sent == 1 {
            job.tasks.read(|t| {
                t.signal(&[task], libc::SIGTERM);
                t.signal(&[task], libc::SIGCONT);
            });
            self.sent = 2;
            self.next_at = Some(tokio::time::Instant::now() + self.grace - self.grace / 2);
        } else {
            job.tasks.read(|t| t.signal(&[task], libc::SIGKILL));
            self.sent = 3;
            self.next_at = None;
        }
    }
}
