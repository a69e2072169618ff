//! The task API's local socket (`BERTH_AGENT_SOCKET`): binding it, admitting connections,
//! and what each request of a job's process does ([`handle_local`]).

use super::access::{authorize, error, identified, Caller, SpawnAsk};
use super::env::{DEFAULT_ERROR, DEFAULT_OUTPUT};
use super::exec::exec;
use super::info::info;
use super::spawn::spawn;
use crate::ports::JobContext;
use berth_protocol::agent::{AgentQuery, AgentReply};
use berth_protocol::step::{TaskReply, TaskRequest};
use berth_protocol::{read_frame_limited, write_frame};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};

/// Why the task API's local socket could not be bound ([`bind_socket`]).
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{} exists and is not a socket; remove it or choose another --socket", .0.display())]
    NotASocket(PathBuf),
    #[error("another agent listens on {}; choose another --socket", .0.display())]
    InUse(PathBuf),
    #[error("cannot remove the stale {}: {error}", .path.display())]
    Stale { path: PathBuf, error: std::io::Error },
    #[error("cannot listen on {}: {error}", .path.display())]
    Bind { path: PathBuf, error: std::io::Error },
    #[error("chmod {}: {error}", .path.display())]
    Chmod { path: PathBuf, error: std::io::Error },
}

/// Bind the local socket (mode 0666: who may do what is decided per request). A stale socket
/// file is replaced; one another process still listens on is not.
pub fn bind_socket(path: &Path) -> Result<UnixListener, SocketError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path_buf = || path.to_path_buf();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(SocketError::NotASocket(path_buf()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse(path_buf()));
        }
        std::fs::remove_file(path).map_err(|error| SocketError::Stale { path: path_buf(), error })?;
    }
    let listener = UnixListener::bind(path).map_err(|error| SocketError::Bind { path: path_buf(), error })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|error| SocketError::Chmod { path: path_buf(), error })?;
    Ok(listener)
}

/// Serve the task API on the local socket: `AgentQuery::Task` frames, `AgentReply::Task`
/// answers, any number per connection. Connections are capped per uid and in all
/// ([`crate::conn::LOCAL_CONNECTIONS`]); idle ones are closed ([`crate::conn::LOCAL_IDLE`]).
pub async fn serve_socket(ctx: Arc<JobContext>, listener: UnixListener) {
    let tracker = crate::conn::local_tracker();
    let log = berth_protocol::limits::LogLimiter::new(Duration::from_secs(10));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: let some go before trying again.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        let slot = match tracker.admit(uid) {
            Ok(slot) => slot,
            Err(why) => {
                if let Some(held_back) = log.allow(&format!("uid {uid}")) {
                    tracing::warn!(uid, "task API connection refused: {why} ({held_back} more since the last line)");
                }
                let message = why.to_string();
                tokio::spawn(async move {
                    let reply = AgentReply::Error { message };
                    let _ = tokio::time::timeout(Duration::from_secs(1), write_frame(&mut stream, &reply)).await;
                });
                continue;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            serve_local(ctx, stream).await;
            drop(slot);
        });
    }
}

async fn serve_local(ctx: Arc<JobContext>, mut stream: UnixStream) {
    let caller = match stream.peer_cred() {
        Ok(c) => Caller { uid: c.uid(), pid: c.pid() },
        Err(e) => {
            let message = format!("cannot identify the caller: {e}");
            let _ = write_frame(&mut stream, &AgentReply::Error { message }).await;
            return;
        }
    };
    let limits = ctx.conns.local_request(identified(&ctx, caller));
    loop {
        let reply = match read_frame_limited::<_, AgentQuery>(&mut stream, &limits).await {
            Ok(Some(AgentQuery::Task { request: TaskRequest::Exec { job, node, argv, env, cwd } })) => {
                // The connection is the task's from here on.
                let ask = SpawnAsk { node, argv, env, cwd, count: 1, output: String::new(), error: String::new() };
                return exec(&ctx, caller, job, ask, stream).await;
            }
            Ok(Some(AgentQuery::Task { request })) => {
                AgentReply::Task { reply: handle_local(&ctx, caller, request).await }
            }
            Ok(Some(_)) => AgentReply::Error { message: "only task requests are served on this socket".into() },
            Ok(None) => return,
            Err(e) => {
                // The stream is not at a frame's start any more: answer, then close.
                let _ = write_frame(&mut stream, &AgentReply::Error { message: e.to_string() }).await;
                return;
            }
        };
        if write_frame(&mut stream, &reply).await.is_err() {
            return;
        }
    }
}

/// One request of a process of the job, on the local socket.
pub async fn handle_local(ctx: &Arc<JobContext>, caller: Caller, req: TaskRequest) -> TaskReply {
    let id = match &req {
        TaskRequest::Info { job }
        | TaskRequest::Spawn { job, .. }
        | TaskRequest::List { job }
        | TaskRequest::Wait { job, .. }
        | TaskRequest::Kill { job, .. } => *job,
        TaskRequest::RemoteSpawn { .. } | TaskRequest::RemoteSignal { .. } | TaskRequest::RemoteInfo { .. } => {
            return error("remote_* requests are between agents only")
        }
        TaskRequest::Exec { .. } | TaskRequest::Signal { .. } | TaskRequest::Stdin { .. } | TaskRequest::StdinEof => {
            return error("exec starts a connection of its own, and signal and stdin belong on one")
        }
    };
    let job = match authorize(ctx, caller, id) {
        Ok(j) => j,
        Err(e) => return error(e),
    };
    match req {
        TaskRequest::Info { .. } => info(ctx, &job).await,
        TaskRequest::Spawn { node, argv, env, cwd, count, output, error: err, .. } => {
            let out = output.unwrap_or_else(|| DEFAULT_OUTPUT.into());
            let err = err.unwrap_or_else(|| DEFAULT_ERROR.into());
            spawn(ctx, &job, SpawnAsk { node, argv, env, cwd, count, output: out, error: err }).await
        }
        TaskRequest::List { .. } => {
            TaskReply::Tasks { tasks: job.tasks.read(|t| t.infos(&t.select(id, &[]).unwrap_or_default())) }
        }
        TaskRequest::Wait { tasks, timeout_ms, .. } => {
            let ids = match job.tasks.read(|t| t.select(id, &tasks)) {
                Ok(ids) => ids,
                Err(e) => return error(e.to_string()),
            };
            // A timeout beyond what the clock holds is no timeout (an Instant overflow panics).
            let deadline = timeout_ms.and_then(|ms| tokio::time::Instant::now().checked_add(Duration::from_millis(ms)));
            job.tasks.wait(&ids, deadline).await;
            TaskReply::Tasks { tasks: job.tasks.read(|t| t.infos(&ids)) }
        }
        TaskRequest::Kill { tasks, signal, .. } => {
            if !(1..=64).contains(&signal) {
                return error(format!("{signal} is not a signal number (1-64)"));
            }
            match job.tasks.read(|t| t.select(id, &tasks).map(|ids| (t.signal(&ids, signal), t.infos(&ids)))) {
                Ok((_, tasks)) => TaskReply::Tasks { tasks },
                Err(e) => error(e.to_string()),
            }
        }
        TaskRequest::RemoteSpawn { .. } | TaskRequest::RemoteSignal { .. } | TaskRequest::RemoteInfo { .. } => {
            error("remote_* requests are between agents only")
        }
        TaskRequest::Exec { .. } | TaskRequest::Signal { .. } | TaskRequest::Stdin { .. } | TaskRequest::StdinEof => {
            error("exec starts a connection of its own, and signal and stdin belong on one")
        }
    }
}
