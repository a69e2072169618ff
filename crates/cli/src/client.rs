//! Talking to the controller over its Unix socket.

use anyhow::{anyhow, bail, Context, Result};
use berth_protocol::client::{ClientRequest, ClientResponse};
use berth_protocol::{read_frame, write_frame};
use std::path::{Path, PathBuf};
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

impl Client {
    pub async fn connect(dir: &Path) -> Result<Self> {
        let sock = socket_path(dir);
        if !sock.exists() {
            bail!(
                "no berth controller at {} ({} does not exist); start one with `berth up --dir {}`, or point --dir / BERTH_DIR at a running cluster",
                dir.display(),
                sock.display(),
                dir.display()
            );
        }
        let stream = UnixStream::connect(&sock).await.with_context(|| {
            format!(
                "the controller at {} is not answering; is it running? (`berth up --dir {}` restarts it)",
                sock.display(),
                dir.display()
            )
        })?;
        Ok(Client { stream })
    }

    pub async fn call(&mut self, req: &ClientRequest) -> Result<ClientResponse> {
        write_frame(&mut self.stream, req).await.context("sending the request to the controller")?;
        match read_frame::<_, ClientResponse>(&mut self.stream).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(anyhow!("the controller closed the connection before answering; check its log and retry")),
            Err(e) => Err(anyhow!("reading the controller's answer: {e}")),
        }
    }
}

/// One request on a fresh connection; protocol-level errors become `Err`.
pub async fn request(dir: &Path, req: ClientRequest) -> Result<ClientResponse> {
    let mut c = Client::connect(dir).await?;
    match c.call(&req).await? {
        ClientResponse::Error(e) => Err(anyhow!(e)),
        r => Ok(r),
    }
}
