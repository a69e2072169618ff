//! Task requests from other agents over TCP ([`serve_agent`]): `remote_info`, and
//! `remote_spawn`, a task started here for the agent that spawned it ([`run_remote`]), killed
//! if that agent's connection breaks.

use super::access::error;
use super::info::own_node;
use super::process::{end_session, feed_stdin, pump_output, signal_group, status_of, Linger, STDIN_CHUNKS};
use super::spawn::{spawn_here, Stdio};
use crate::ports::JobContext;
use berth_core::JobId;
use berth_protocol::agent::AgentReply;
use berth_protocol::auth::{read_sealed, write_sealed, LinkKey, Opener, Sealer, TreeEnd};
use berth_protocol::error::Refusal;
use berth_protocol::step::{Chunk, TaskReply, TaskRequest};
use berth_protocol::ProtocolError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A remote spawn may arrive just before the job's launch there has finished.
const JOB_WAIT: Duration = Duration::from_secs(5);

/// A task request from another agent over TCP (`AgentQuery::Task`). `remote_spawn` keeps
/// the connection for the task's life; the user-facing requests are refused here, since a
/// TCP peer has no identity the kernel vouches for.
pub async fn serve_agent(ctx: Arc<JobContext>, req: TaskRequest, mut stream: TcpStream, link: LinkKey) {
    let (mut sealer, opener) = link.query_link(TreeEnd::Below);
    let reply = match req {
        TaskRequest::RemoteSpawn { job, node, task, argv, env, cwd, output, error, attach } => {
            let ask = RemoteAsk { job, node, task, argv, env, cwd, output, error, attach };
            return run_remote(ctx, ask, stream, sealer, opener).await;
        }
        TaskRequest::RemoteInfo { job } => match ctx.registry.wait_for(job, JOB_WAIT).await {
            Some(j) => TaskReply::Info { job, nodes: vec![own_node(&j)] },
            None => error(format!("job {job} is not running on this node")),
        },
        _ => error("the task API is served on the agent's local socket (BERTH_AGENT_SOCKET), to the job's processes"),
    };
    let _ = write_sealed(&mut stream, &mut sealer, &AgentReply::Task { reply }).await;
}

struct RemoteAsk {
    job: JobId,
    node: u32,
    task: u64,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    output: String,
    error: String,
    attach: bool,
}

enum Down {
    Signal(i32),
    Lost,
}

/// The receiving side of `remote_spawn`: start the task here, report it, relay signals, and
/// kill it if the spawning agent goes away.
async fn run_remote(ctx: Arc<JobContext>, ask: RemoteAsk, stream: TcpStream, mut sealer: Sealer, mut opener: Opener) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let reply = |r: TaskReply| AgentReply::Task { reply: r };
    let Some(job) = ctx.registry.wait_for(ask.job, JOB_WAIT).await else {
        let _ =
            write_sealed(&mut wr, &mut sealer, &reply(error(format!("job {} is not running on this node", ask.job))))
                .await;
        return;
    };
    let here = job.spec.nodes.get(ask.node as usize).is_some_and(|(n, _)| *n == job.spec.allocation.node);
    if !here {
        let message = format!("node {} of job {} is not this node ({})", ask.node, ask.job, job.spec.allocation.node);
        let _ = write_sealed(&mut wr, &mut sealer, &reply(error(message))).await;
        return;
    }
    let since = Instant::now();
    let stdio = if ask.attach { Stdio::Pipes } else { Stdio::Files(&ask.output, &ask.error) };
    let mut child = match spawn_here(&ctx, &job, &ask.argv, ask.env, &ask.cwd, stdio) {
        Ok(c) => c,
        Err(e) => {
            let _ = write_sealed(&mut wr, &mut sealer, &reply(error(e.to_string()))).await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    tracing::debug!(job = %ask.job, task = ask.task, pid, "task started for another agent");
    if write_sealed(&mut wr, &mut sealer, &reply(TaskReply::Started { pid })).await.is_err() {
        signal_group(pid, libc::SIGKILL);
    }
    // An attached task's stdin: what the spawning agent forwards, bounded as `exec`'s.
    let mut stdin = None;
    if let Some(pipe) = child.stdin.take() {
        let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(STDIN_CHUNKS);
        tokio::spawn(feed_stdin(pipe, stdin_rx));
        stdin = Some(stdin_tx);
    }
    let (tx, mut down) = mpsc::unbounded_channel();
    let (job_id, auth) = (ask.job, ctx.auth.clone());
    let reader = tokio::spawn(async move {
        loop {
            match read_sealed::<_, TaskRequest>(&mut rd, &mut opener).await {
                Ok(Some(TaskRequest::RemoteSignal { signal })) => {
                    if tx.send(Down::Signal(signal)).is_err() {
                        return;
                    }
                }
                Ok(Some(TaskRequest::Stdin { data })) => {
                    if let Some(s) = &stdin {
                        if s.send(data.as_bytes().to_vec()).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Ok(Some(TaskRequest::StdinEof)) => stdin = None,
                Ok(Some(_)) => {}
                end => {
                    // Someone else's frame on the connection counts as losing it (the task
                    // is killed), and is logged.
                    if let (Err(ProtocolError::Auth(why)), Some(auth)) = (&end, &auth) {
                        let detail = format!("task connection frame for job {job_id} refused: {why}");
                        auth.refuse(Refusal::Auth, Some(job_id), &detail);
                    }
                    let _ = tx.send(Down::Lost);
                    return;
                }
            }
        }
    });
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    pump_output(&mut child, &out_tx);
    drop(out_tx);
    let mut output_open = ask.attach;
    let mut lost = false;
    let mut status = None;
    let mut linger = Linger::default();
    while !linger.done(output_open) {
        tokio::select! {
            st = child.wait(), if status.is_none() => {
                status = Some(st);
                linger.task_ended();
            }
            chunk = out_rx.recv(), if output_open => match chunk {
                Some((stream, data)) => {
                    let frame = reply(TaskReply::Output { stream, data: Chunk::from_bytes(data) });
                    if !lost && write_sealed(&mut wr, &mut sealer, &frame).await.is_err() {
                        signal_group(pid, libc::SIGKILL);
                        lost = true;
                    }
                }
                None => output_open = false,
            },
            _ = linger.over() => break,
            d = down.recv(), if !lost => match d {
                Some(Down::Signal(sig)) if (1..=64).contains(&sig) => signal_group(pid, sig),
                Some(Down::Signal(_)) => {}
                Some(Down::Lost) | None => {
                    tracing::info!(job = %ask.job, task = ask.task, "the spawning agent went away: killing the task");
                    signal_group(pid, libc::SIGKILL);
                    lost = true;
                }
            },
        }
    }
    reader.abort();
    end_session(&job, pid).await;
    if !lost {
        let status = status.unwrap_or_else(|| Err(std::io::Error::other("the task's end was not seen")));
        let (exit_code, signal) = status_of(&status);
        let wall_ms = since.elapsed().as_millis() as u64;
        let _ = write_sealed(&mut wr, &mut sealer, &reply(TaskReply::Exited { exit_code, signal, wall_ms })).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::agent::AgentQuery;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn remote_requests_round_trip_as_frames() {
        let req = TaskRequest::RemoteSpawn {
            job: JobId(3),
            node: 1,
            task: 2,
            argv: argv(&["hostname"]),
            env: vec![],
            cwd: "/".into(),
            output: "/o".into(),
            error: "/e".into(),
            attach: false,
        };
        let json = serde_json::to_value(AgentQuery::Task { request: req.clone() }).unwrap();
        assert_eq!(json["request"]["op"], "remote_spawn");
        let back: AgentQuery = serde_json::from_value(json).unwrap();
        assert_eq!(back, AgentQuery::Task { request: req });
        // A spawn without output fields (older client) still parses.
        let old = serde_json::json!({"op":"spawn","job":1,"node":0,"argv":["x"],"env":[],"cwd":"/","count":1});
        assert!(matches!(serde_json::from_value::<TaskRequest>(old).unwrap(), TaskRequest::Spawn { output: None, .. }));
    }
}
