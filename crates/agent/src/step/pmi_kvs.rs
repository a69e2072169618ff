//! What both PMI wire protocols of a step serve on one node: the application's configuration,
//! its key-value space with the barrier that publishes puts, PMI-2 node attributes and the events
//! for the shepherd. [`crate::step::pmi`] (PMI-1 "simple") and [`crate::step::pmi2`] speak to
//! the ranks; this module knows neither protocol.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// Limits announced by `get_maxes` and enforced on `put` (hydra's values). MPICH 4.0.2 then
/// shrinks its own value limit to 1024 - 256 - 64 - 30 = 674 so that a put fits its line buffer.
pub const KVSNAME_MAX: usize = 256;
pub const KEYLEN_MAX: usize = 64;
pub const VALLEN_MAX: usize = 1024;
/// MPICH reads each reply into a 1024-byte buffer: a longer reply line would desynchronise it.
pub(crate) const CLIENT_LINE_MAX: usize = 1023;
/// The start of PMI-1's answer to a get: a value must fit the client's line after it.
pub(crate) const GET_OK: &str = "cmd=get_result rc=0 msg=success value=";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmiConfig {
    /// Name of the key-value space, e.g. "berth_12_3" (job 12 step 3); at most 255 bytes.
    pub kvsname: String,
    /// Total ranks of the application.
    pub size: u32,
    /// 0 (one executable).
    pub appnum: u32,
    /// MPMD: the application number of each local rank (as `local_ranks`); a rank not here
    /// has `appnum`.
    pub appnums: Vec<u32>,
    /// = size.
    pub universe_size: u32,
    /// Value of `PMI_process_mapping`, see [`process_mapping`]; "" for none.
    pub process_mapping: String,
    /// Global rank numbers of the ranks on this node.
    pub local_ranks: Vec<u32>,
}

impl PmiConfig {
    /// The application number of local rank `rank` (MPMD: its program's index).
    pub fn appnum_of(&self, rank: u32) -> u32 {
        self.local_ranks
            .iter()
            .position(|&r| r == rank)
            .and_then(|i| self.appnums.get(i).copied())
            .unwrap_or(self.appnum)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PmiEvent {
    /// Every local rank has entered barrier_in: here are all puts made by local ranks since the
    /// previous barrier. Answer with [`PmiServer::barrier_out`].
    BarrierIn { puts: Vec<(String, String)> },
    /// A rank called abort (MPI_Abort): rank, exit code, message ("" from MPICH 4.0.2). A failed
    /// MPI_Init aborts with an MPI error code (e.g. 1010421263), not an exit status. The rank
    /// then waits for an answer that never comes (were its connection closed, MPICH 4.0.2 would
    /// return from MPI_Abort and carry on): the shepherd must kill the application.
    Abort { rank: u32, code: i32, message: String },
    /// A rank called finalize.
    Finalized { rank: u32 },
    /// A rank's PMI connection broke (or closed after init without finalize) or spoke garbage:
    /// rank, description. Not fatal for the server.
    ProtocolError { rank: u32, message: String },
}

/// The node-local PMI server of one application. Cheap to clone (shared state).
#[derive(Clone)]
pub struct PmiServer {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: PmiConfig,
    events: UnboundedSender<PmiEvent>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Visible to every get: barrier results, injected values, PMI_process_mapping.
    kvs: HashMap<String, String>,
    /// Puts since the last barrier (rank, key, value): only their own rank sees them before it.
    pending: Vec<(u32, String, String)>,
    /// Ranks in barrier_in, released by barrier_out.
    waiting: HashMap<u32, oneshot::Sender<()>>,
    /// BarrierIn was sent and barrier_out not yet called.
    barrier_complete: bool,
    /// PMI-2 node attributes of this node's ranks.
    node_attrs: NodeAttrs,
}

impl PmiServer {
    pub fn new(cfg: PmiConfig, events: UnboundedSender<PmiEvent>) -> PmiServer {
        let mut state = State::default();
        // Served only if MPICH can read the reply; otherwise it falls back to hostnames.
        if !cfg.process_mapping.is_empty() && GET_OK.len() + cfg.process_mapping.len() <= CLIENT_LINE_MAX {
            state.kvs.insert("PMI_process_mapping".into(), cfg.process_mapping.clone());
        }
        PmiServer { inner: Arc::new(Inner { cfg, events, state: Mutex::new(state) }) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn config(&self) -> &PmiConfig {
        &self.inner.cfg
    }

    pub(crate) fn with_node_attrs<T>(&self, f: impl FnOnce(&mut NodeAttrs) -> T) -> T {
        f(&mut self.state().node_attrs)
    }

    pub(crate) fn emit(&self, event: PmiEvent) {
        let _ = self.inner.events.send(event);
    }

    pub(crate) fn protocol_error(&self, rank: u32, message: String) {
        self.emit(PmiEvent::ProtocolError { rank, message });
    }

    /// Values other parts may inject (e.g. "PMI_dead_processes"); visible to every get at once.
    pub fn set(&self, key: &str, value: &str) {
        self.state().kvs.insert(key.to_string(), value.to_string());
    }

    /// The tree's answer to a barrier: the union of all puts of all ranks in this epoch. Stores
    /// them in the local KVS and answers barrier_out to every waiting local rank. Called when no
    /// barrier is complete (no BarrierIn outstanding), it only stores the values.
    pub fn barrier_out(&self, kvs: Vec<(String, String)>) {
        let waiting = {
            let mut st = self.state();
            st.kvs.extend(kvs);
            if !std::mem::take(&mut st.barrier_complete) {
                return;
            }
            std::mem::take(&mut st.waiting)
        };
        for tx in waiting.into_values() {
            let _ = tx.send(());
        }
    }

    /// A put of either protocol: seen by its own rank at once, by the others after the barrier.
    /// The error is a short code (PMI-1's `msg`).
    pub(crate) fn put_value(&self, rank: u32, key: &str, value: &str) -> Result<(), &'static str> {
        if key.is_empty() || key.len() > KEYLEN_MAX {
            Err("bad_key_length")
        } else if value.len() > VALLEN_MAX {
            Err("value_too_long")
        } else {
            self.state().pending.push((rank, key.to_string(), value.to_string()));
            Ok(())
        }
    }

    /// What a get of either protocol sees: the shared KVS, else the rank's own pending put.
    pub(crate) fn get_value(&self, rank: u32, key: &str) -> Option<String> {
        let st = self.state();
        let own = st.pending.iter().rev().find(|(r, k, _)| *r == rank && k == key).map(|(_, _, v)| v);
        st.kvs.get(key).or(own).cloned()
    }

    pub(crate) fn barrier_in(&self, rank: u32) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state();
        st.waiting.insert(rank, tx);
        let local = &self.inner.cfg.local_ranks;
        if !st.barrier_complete && local.iter().all(|r| st.waiting.contains_key(r)) {
            st.barrier_complete = true;
            let puts = std::mem::take(&mut st.pending).into_iter().map(|(_, k, v)| (k, v)).collect();
            drop(st);
            self.emit(PmiEvent::BarrierIn { puts });
        }
        rx
    }
}

/// PMI-2 node attributes of one node's ranks, and the ranks waiting for one.
#[derive(Default)]
pub(crate) struct NodeAttrs {
    values: HashMap<String, String>,
    waiting: Vec<(String, oneshot::Sender<String>)>,
}

pub(crate) enum NodeAttr {
    Found(String),
    Missing,
    Waiting(oneshot::Receiver<String>),
}

impl NodeAttrs {
    pub(crate) fn put(&mut self, key: &str, value: &str) {
        self.values.insert(key.to_string(), value.to_string());
        let (ready, waiting) = std::mem::take(&mut self.waiting).into_iter().partition(|(k, _)| k == key);
        self.waiting = waiting;
        for (_, tx) in ready {
            let _ = tx.send(value.to_string());
        }
    }

    pub(crate) fn get(&mut self, key: &str, wait: bool) -> NodeAttr {
        match self.values.get(key) {
            Some(value) => NodeAttr::Found(value.clone()),
            None if !wait => NodeAttr::Missing,
            None => {
                let (tx, rx) = oneshot::channel();
                self.waiting.push((key.to_string(), tx));
                NodeAttr::Waiting(rx)
            }
        }
    }
}
