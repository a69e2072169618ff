//! Scheduler v0: FIFO order; placement (where) is `placement`'s.
//!
//! `schedule` is a pure function of the cluster's free resources and the queue: it never
//! oversubscribes a node's PUs or a NUMA node's memory, and answers "busy now" apart from
//! "can never fit" so that users are told which.

use crate::job::{Allocation, PendingJob};
use crate::node::NodeCapacity;
pub use crate::placement::cluster::Placement;
use crate::placement::{cluster, JobRequest, PlacementPolicy};
use crate::JobId;
use serde::{Deserialize, Serialize};

/// The cluster as the scheduler sees it.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// In id order.
    pub nodes: Vec<NodeCapacity>,
    pub policy: PlacementPolicy,
}

/// Why a pending job is not running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingReason {
    /// Waiting for resources to free up, with what is missing.
    Resources(String),
    /// An earlier job is waiting first (FIFO).
    Priority,
    Held,
    /// No node that is up can ever hold it; it waits for larger nodes to come up.
    NoSuitableNodes(String),
}

impl PendingReason {
    pub fn describe(&self) -> String {
        match self {
            PendingReason::Resources(what) if what.is_empty() => {
                "resources: waiting for cores or memory to free up".into()
            }
            PendingReason::Resources(what) => format!("resources: {what}"),
            PendingReason::Priority => "priority: an earlier job waits first".into(),
            PendingReason::Held => "held: run `berth release <id>`".into(),
            PendingReason::NoSuitableNodes(why) => format!("no suitable node up: {why}"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions {
    pub starts: Vec<(JobId, Allocation)>,
    pub waiting: Vec<(JobId, PendingReason)>,
}

impl ClusterState {
    pub fn node_mut(&mut self, id: crate::NodeId) -> Option<&mut NodeCapacity> {
        match self.nodes.binary_search_by_key(&id, |n| n.id) {
            Ok(i) => Some(&mut self.nodes[i]),
            Err(_) => self.nodes.iter_mut().find(|n| n.id == id),
        }
    }

    /// Mark an allocation's PUs and memory as used.
    pub fn claim(&mut self, alloc: &Allocation) {
        for na in alloc {
            if let Some(n) = self.node_mut(na.node_id) {
                n.claim(na);
            }
        }
    }

    /// Return an allocation's PUs and memory.
    pub fn release(&mut self, alloc: &Allocation) {
        for na in alloc {
            if let Some(n) = self.node_mut(na.node_id) {
                n.release(na);
            }
        }
    }
}

/// Whether a request could ever fit the nodes that take work if they were empty.
pub fn check_feasible(cluster: &ClusterState, req: &JobRequest) -> Result<(), String> {
    cluster::feasible(&cluster.nodes, &cluster.policy, req, |n| n.state.accepts_work())
}

/// Place one request on what is free now.
pub fn place(cluster: &ClusterState, req: &JobRequest) -> Placement {
    cluster::place(&cluster.nodes, &cluster.policy, req)
}

/// One scheduling pass: strict FIFO over `queue` (in priority order). Held jobs and jobs that
/// can never fit the nodes up are passed over; the first job that is only busy stops the pass.
pub fn schedule(cluster: &ClusterState, queue: &[PendingJob]) -> Decisions {
    let mut state = cluster.clone();
    let mut out = Decisions::default();
    let mut blocked = false;
    for job in queue {
        if job.held {
            out.waiting.push((job.id, PendingReason::Held));
            continue;
        }
        if blocked {
            out.waiting.push((job.id, PendingReason::Priority));
            continue;
        }
        match place(&state, &job.request) {
            Placement::Now(alloc) => {
                state.claim(&alloc);
                out.starts.push((job.id, alloc));
            }
            Placement::Busy(what) => {
                out.waiting.push((job.id, PendingReason::Resources(what)));
                blocked = true;
            }
            Placement::Never(why) => out.waiting.push((job.id, PendingReason::NoSuitableNodes(why))),
        }
    }
    out
}

#[cfg(test)]
mod tests;
