//! Talking to the controller over its Unix socket.

use anyhow::{anyhow, bail, Context, Result};
use berth_protocol::client::{ClientRequest, ClientResponse};
use berth_protocol::{read_frame, write_frame};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::UnixStream;

/// Where a cluster lives: `--dir`, else `BERTH_DIR`, else the directory of `BERTH_SOCKET`,
/// else `./.berth`.
pub fn cluster_dir(flag: Option<PathBuf>) -> PathBuf {
    // Inside a job the agent sets BERTH_SOCKET (the controller's socket, in its cluster dir).
    let from_socket = || {
        std::env::var_os("BERTH_SOCKET")
            .map(PathBuf::from)
            .filter(|p| p.file_name().is_some_and(|n| n == "controller.sock"))
            .and_then(|p| p.parent().map(Path::to_path_buf))
    };
    let dir = flag
        .or_else(|| std::env::var_os("BERTH_DIR").map(PathBuf::from))
        .or_else(from_socket)
        .unwrap_or_else(|| PathBuf::from(".berth"));
    if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir().map(|c| c.join(&dir)).unwrap_or(dir)
    }
}

pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("controller.sock")
}

pub struct Client {
    stream: UnixStream,
}

/// How long a command waits for a controller that is down (restarting): `--timeout`, else
/// `BERTH_TIMEOUT` (seconds), else 60 s. A job script's next step then rides out a restart.
static WAIT_SECS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Set the wait (the `--timeout` flag).
pub fn set_wait_secs(secs: u64) {
    WAIT_SECS.store(secs, Ordering::Relaxed);
}

fn wait_bound() -> Duration {
    let secs = match WAIT_SECS.load(Ordering::Relaxed) {
        u64::MAX => std::env::var("BERTH_TIMEOUT").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(60),
        s => s,
    };
    Duration::from_secs(secs.min(86400))
}

/// The controller may be on its way back: its socket is there with nobody listening (killed,
/// restarting), or its socket is gone from a directory that holds a cluster.
fn restarting(e: &std::io::Error, dir: &Path) -> bool {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::WouldBlock => true,
        ErrorKind::NotFound => dir.join("controller").is_dir(),
        _ => false,
    }
}

impl Client {
    pub async fn connect(dir: &Path) -> Result<Self> {
        let sock = socket_path(dir);
        let deadline = Instant::now() + wait_bound();
        let mut pause = Duration::from_millis(50);
        let mut told = false;
        loop {
            let e = match UnixStream::connect(&sock).await {
                Ok(stream) => return Ok(Client { stream }),
                Err(e) => e,
            };
            if !restarting(&e, dir) || Instant::now() + pause > deadline {
                if e.kind() == std::io::ErrorKind::NotFound {
                    bail!(
                        "no berth controller at {} ({} does not exist); start one with `berth up --dir {}`, or point --dir / BERTH_DIR at a running cluster",
                        dir.display(),
                        sock.display(),
                        dir.display()
                    );
                }
                return Err(e).with_context(|| {
                    format!(
                        "the controller at {} is not answering{}; is it running? (`berth up --dir {}` restarts it)",
                        sock.display(),
                        if told { format!(" after {} s", wait_bound().as_secs()) } else { String::new() },
                        dir.display()
                    )
                });
            }
            if !told {
                eprintln!(
                    "berth: the controller at {} is not answering ({e}); waiting up to {} s for it (--timeout)",
                    sock.display(),
                    wait_bound().as_secs()
                );
                told = true;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// One attempt, no waiting for a restarting controller (the caller retries).
    pub async fn connect_once(dir: &Path) -> std::io::Result<Self> {
        UnixStream::connect(socket_path(dir)).await.map(|stream| Client { stream })
    }

    pub async fn call(&mut self, req: &ClientRequest) -> Result<ClientResponse> {
        if let Err(e) = write_frame(&mut self.stream, req).await {
            if let berth_protocol::ProtocolError::TooLarge { len, limit, .. } = e {
                // Nothing was sent: too large to send at all.
                bail!("the request is {len} bytes, more than a frame holds ({limit}); send less at once (fewer scripts, a smaller script or environment)");
            }
            // A connection the controller refused (too many from this user) carries why.
            if let Ok(Some(ClientResponse::Error(why))) = read_frame::<_, ClientResponse>(&mut self.stream).await {
                return Ok(ClientResponse::Error(why));
            }
            return Err(anyhow!(e)).context("sending the request to the controller");
        }
        match read_frame::<_, ClientResponse>(&mut self.stream).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(anyhow!("the controller closed the connection before answering; check its log and retry")),
            Err(e) => Err(anyhow!("reading the controller's answer: {e}")),
        }
    }
}

/// One request on a fresh connection; protocol-level errors become `Err`. A read whose
/// answer a controller restart cut off is asked again once the controller is back.
pub async fn request(dir: &Path, req: ClientRequest) -> Result<ClientResponse> {
    let mut c = Client::connect(dir).await?;
    let answer = match c.call(&req).await {
        Err(_) if req.is_query() => Client::connect(dir).await?.call(&req).await?,
        other => other?,
    };
    match answer {
        ClientResponse::Error(e) => Err(anyhow!(e)),
        r => Ok(r),
    }
}
