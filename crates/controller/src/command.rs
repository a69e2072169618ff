//! What the state thread is sent (`Command`: from client connections, agents' connections,
//! the HTTP API and the clock) and what stops the server (`ServerError`): shared by the
//! server loop (`crate::server`) and the HTTP API (`crate::api`), below both.

use crate::model::request::Peer;
use crate::state::AgentTx;
use crate::store::StoreError;
use berth_protocol::agent::{AgentMessage, Registration};
use berth_protocol::auth::KeyError;
use berth_protocol::client::{ClientRequest, ClientResponse};
use tokio::sync::oneshot;

// A command is moved once into the state thread's channel; a request inline (not boxed) costs
// no allocation per request.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    Client {
        req: ClientRequest,
        peer: Peer,
        reply: oneshot::Sender<ClientResponse>,
    },
    Register {
        reg: Box<Registration>,
        conn_id: u64,
        tx: AgentTx,
        node: oneshot::Sender<Option<usize>>,
    },
    Agent {
        node: usize,
        conn_id: u64,
        msg: AgentMessage,
    },
    AgentGone {
        node: usize,
        conn_id: u64,
    },
    /// A client connection closed: interactive allocations made on it end.
    ClientGone {
        conn: u64,
    },
    /// An agent connection failed authentication (event `auth_refused`).
    AuthRefused {
        node: Option<String>,
        detail: String,
    },
    Tick,
    /// A scheduling pass held back under a stream of changes is due (`crate::pacing`).
    Wake,
    Shutdown,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {what} {addr}: {source}")]
    Listen { what: &'static str, addr: String, source: std::io::Error },
    #[error("another controller is already serving {0}; stop it first (`berth down`) or use another --dir")]
    AlreadyRunning(String),
    #[error("the state thread stopped unexpectedly")]
    ActorGone,
    #[error("{0}")]
    Key(#[from] KeyError),
    #[error("no cluster key configured (config key `key_file`, `berth server --key-file FILE`); create one with `berth keygen FILE`")]
    NoKey,
}
