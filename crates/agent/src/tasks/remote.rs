//! A task on another node, seen from the agent that spawned it ([`drive_remote`]): one TCP
//! connection to that node's agent per task (`remote_spawn`), kept open while the task runs;
//! its start, end and output come back on it, its signals and stdin go down it.

use super::process::OutputTx;
use crate::ports::{JobContext, JobHandle};
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::auth::{read_sealed, write_sealed, TreeEnd};
use berth_protocol::step::{Chunk, TaskReply, TaskRequest};
use berth_protocol::write_frame;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a remote attached task is relayed: signals and stdin down, its start and output up.
pub(super) struct Remote {
    pub(super) signals: mpsc::UnboundedReceiver<i32>,
    /// The caller's stdin (an `exec` task); None: the task's stdin ends at once.
    pub(super) stdin: Option<mpsc::Receiver<Vec<u8>>>,
    pub(super) started: oneshot::Sender<()>,
    pub(super) output: Option<OutputTx>,
}

/// One remote task, seen from the agent that spawned it: launch, then relay its end (and an
/// attached task's output) up and signals (and stdin) down until it ends, its connection
/// breaks, or the job ends here.
pub(super) async fn drive_remote(
    ctx: Arc<JobContext>,
    job: Arc<JobHandle>,
    id: u64,
    address: String,
    req: TaskRequest,
    remote: Remote,
) {
    let Remote { mut signals, stdin, started, output } = remote;
    let mut stdin_open = stdin.is_some();
    let mut stdin = stdin;
    let node = match &req {
        TaskRequest::RemoteSpawn { node, .. } => *node,
        _ => 0,
    };
    let fail = |why: String| job.tasks.with(|t| t.failed(id, why));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return fail(format!("cannot reach the agent of node {node} at {address}: {e}")),
        Err(_) => return fail(format!("no answer from the agent of node {node} at {address}")),
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (query, link) = match crate::auth::to_agent(ctx.auth.as_deref(), AgentQuery::Task { request: req }) {
        Ok(x) => x,
        Err(e) => return fail(format!("signing the task for node {node}: {e}")),
    };
    let (mut sealer, mut opener) = link.query_link(TreeEnd::Above);
    if let Err(e) = write_frame(&mut wr, &query).await {
        return fail(format!("sending the task to node {node}: {e}"));
    }
    match read_sealed::<_, AgentReply>(&mut rd, &mut opener).await {
        Ok(Some(AgentReply::Task { reply: TaskReply::Started { pid } })) => job.tasks.with(|t| t.started(id, pid)),
        Ok(Some(AgentReply::Task { reply: TaskReply::Error { message } })) => return fail(message),
        Ok(Some(AgentReply::Error { message })) => return fail(message),
        Ok(Some(other)) => return fail(format!("unexpected answer from node {node}: {other:?}")),
        Ok(None) => return fail(format!("the agent of node {node} closed the connection")),
        Err(e) => return fail(format!("connection to node {node}: {e}")),
    }
    let _ = started.send(());
    // Frames are read by their own task: a read cut by select! would lose its bytes.
    let (up_tx, mut up) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let msg = read_sealed::<_, AgentReply>(&mut rd, &mut opener).await;
            let end = !matches!(msg, Ok(Some(_)));
            if up_tx.send(msg).is_err() || end {
                return;
            }
        }
    });
    let mut check = tokio::time::interval(Duration::from_millis(500));
    let mut open = true;
    loop {
        tokio::select! {
            msg = up.recv() => match msg {
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Exited { exit_code, signal, wall_ms } }))) => {
                    job.tasks.with(|t| t.exited(id, exit_code, signal, Some(wall_ms)));
                    break;
                }
                Some(Ok(Some(AgentReply::Task { reply: TaskReply::Output { stream, data } }))) => {
                    if let Some(out) = &output {
                        let _ = out.send((stream, data.as_bytes().to_vec()));
                    }
                }
                Some(Ok(Some(_))) => {}
                Some(Ok(None)) | None => {
                    fail(format!("the agent of node {node} closed the connection; the task is lost"));
                    break;
                }
                Some(Err(e)) => {
                    fail(format!("connection to node {node}: {e}; the task is lost"));
                    break;
                }
            },
            sig = signals.recv(), if open => match sig {
                Some(signal) => {
                    if write_sealed(&mut wr, &mut sealer, &TaskRequest::RemoteSignal { signal }).await.is_err() {
                        fail(format!("connection to node {node} broke; the task is lost"));
                        break;
                    }
                }
                None => open = false,
            },
            chunk = async { match stdin.as_mut() { Some(rx) => rx.recv().await, None => None } }, if stdin_open => {
                let frame = match chunk {
                    Some(data) => TaskRequest::Stdin { data: Chunk::from_bytes(data) },
                    None => {
                        stdin_open = false;
                        stdin = None;
                        TaskRequest::StdinEof
                    }
                };
                if write_sealed(&mut wr, &mut sealer, &frame).await.is_err() {
                    fail(format!("connection to node {node} broke; the task is lost"));
                    break;
                }
            },
            _ = check.tick() => {
                // The job ended here: dropping the connection makes the remote agent kill the task.
                if !ctx.registry.get(job.spec.id).is_some_and(|j| Arc::ptr_eq(&j, &job)) {
                    fail("the job ended".into());
                    break;
                }
            }
        }
    }
    reader.abort();
}
