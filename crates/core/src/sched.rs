//! Scheduler v0: FIFO order, first-fit placement by whole cores and memory.
//!
//! `schedule` is a pure function of the cluster's free resources and the queue: it never
//! oversubscribes a node's PUs or memory, and answers "busy now" apart from "can never fit"
//! so that users are told which.

use crate::job::{Allocation, NodeAllocation, PendingJob, Shape};
use crate::node::NodeCapacity;
use crate::{CpuSet, JobId};
use serde::{Deserialize, Serialize};

/// The cluster as the scheduler sees it.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub nodes: Vec<NodeCapacity>,
}

/// Where a request can go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Now(Allocation),
    /// Fits the cluster's nodes but not what is free now.
    Busy,
    /// Can never fit the nodes that are up, with the reason.
    Never(String),
}

/// Why a pending job is not running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingReason {
    /// Waiting for resources to free up.
    Resources,
    /// An earlier job is waiting first (FIFO).
    Priority,
    Held,
    /// No node that is up can ever hold it; it waits for larger nodes to come up.
    NoSuitableNodes(String),
}

impl PendingReason {
    pub fn describe(&self) -> String {
        match self {
            PendingReason::Resources => "resources: waiting for cores or memory to free up".into(),
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
    /// Mark an allocation's PUs and memory as used.
    pub fn claim(&mut self, alloc: &Allocation) {
        for na in alloc {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.id == na.node_id) {
                n.free_pus.subtract(&na.cpus);
                n.free_memory = n.free_memory.saturating_sub(na.memory_bytes);
            }
        }
    }

    /// Return an allocation's PUs and memory.
    pub fn release(&mut self, alloc: &Allocation) {
        for na in alloc {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.id == na.node_id) {
                let mut pus = na.cpus.clone();
                // Only PUs that exist on the node come back (guards against a stale record).
                let all = n.topology.all_pus();
                pus.subtract(&{
                    let mut not_on_node = pus.clone();
                    not_on_node.subtract(&all);
                    not_on_node
                });
                n.free_pus.union_with(&pus);
                n.free_memory = (n.free_memory + na.memory_bytes).min(n.topology.memory_bytes());
            }
        }
    }
}

/// Take `cores` free cores on `node` first-fit, with `memory` bytes, or None.
fn take_on_node(node: &NodeCapacity, cores: u32, memory: u64) -> Option<NodeAllocation> {
    if node.free_memory < memory {
        return None;
    }
    let chosen: Vec<_> = node.free_cores().take(cores as usize).collect();
    if chosen.len() < cores as usize {
        return None;
    }
    let cpus: CpuSet = chosen.iter().flat_map(|c| c.pus.iter().copied()).collect();
    let mems = node.topology.mems_for(&cpus);
    Some(NodeAllocation { node_id: node.id, node: node.name.clone(), cpus, cores, mems, memory_bytes: memory })
}

/// Whether a request could ever fit the nodes that take work if they were empty.
pub fn check_feasible(nodes: &[NodeCapacity], shape: Shape, mem_per_node: u64) -> Result<(), String> {
    check_feasible_on(nodes, shape, mem_per_node, |n| n.state.accepts_work())
}

/// Whether a request could ever fit the nodes `counts` selects, if they were empty.
pub fn check_feasible_on(
    nodes: &[NodeCapacity],
    shape: Shape,
    mem_per_node: u64,
    counts: impl Fn(&NodeCapacity) -> bool,
) -> Result<(), String> {
    let usable: Vec<&NodeCapacity> = nodes.iter().filter(|n| counts(n)).collect();
    if usable.is_empty() {
        return Err("no node is up".into());
    }
    let fits = |n: &&NodeCapacity, cores: u32| {
        n.topology.core_count() as u64 >= cores as u64 && n.topology.memory_bytes() >= mem_per_node
    };
    let largest_cores = usable.iter().map(|n| n.topology.core_count()).max().unwrap_or(0);
    let largest_mem = usable.iter().map(|n| n.topology.memory_bytes()).max().unwrap_or(0);
    match shape {
        Shape::PerNode { nodes: want, cores_per_node } => {
            let ok = usable.iter().filter(|n| fits(n, cores_per_node)).count();
            if ok >= want as usize {
                Ok(())
            } else {
                Err(format!(
                    "{want} node(s) with {cores_per_node} cores and {} memory each were asked for, but only {ok} of the {} nodes up are that large (largest: {largest_cores} cores, {} memory)",
                    crate::units::format_size(mem_per_node),
                    usable.len(),
                    crate::units::format_size(largest_mem)
                ))
            }
        }
        Shape::Total { cores, chunk } => {
            let total: u64 = usable
                .iter()
                .filter(|n| n.topology.memory_bytes() >= mem_per_node)
                .map(|n| (n.topology.core_count() as u64 / chunk as u64) * chunk as u64)
                .sum();
            if total >= cores as u64 {
                Ok(())
            } else {
                Err(format!(
                    "{cores} cores with {} memory per node were asked for, but the nodes up offer at most {total} such cores (largest node: {largest_cores} cores, {} memory)",
                    crate::units::format_size(mem_per_node),
                    crate::units::format_size(largest_mem)
                ))
            }
        }
    }
}

/// Place one request on what is free now, first-fit over nodes in order.
pub fn place(cluster: &ClusterState, shape: Shape, mem_per_node: u64) -> Placement {
    if let Err(why) = check_feasible(&cluster.nodes, shape, mem_per_node) {
        return Placement::Never(why);
    }
    let usable = cluster.nodes.iter().filter(|n| n.state.accepts_work());
    match shape {
        Shape::PerNode { nodes, cores_per_node } => {
            let alloc: Allocation =
                usable.filter_map(|n| take_on_node(n, cores_per_node, mem_per_node)).take(nodes as usize).collect();
            if alloc.len() == nodes as usize {
                Placement::Now(alloc)
            } else {
                Placement::Busy
            }
        }
        Shape::Total { cores, chunk } => {
            // Prefer a single node; otherwise gather whole chunks across nodes in order.
            let usable: Vec<&NodeCapacity> = usable.collect();
            if let Some(a) = usable.iter().find_map(|n| take_on_node(n, cores, mem_per_node)) {
                return Placement::Now(vec![a]);
            }
            let mut alloc = Vec::new();
            let mut left = cores;
            for n in usable {
                if left == 0 {
                    break;
                }
                if n.free_memory < mem_per_node {
                    continue;
                }
                let free = n.free_core_count() as u32;
                let take = (free / chunk * chunk).min(left);
                if take == 0 {
                    continue;
                }
                if let Some(a) = take_on_node(n, take, mem_per_node) {
                    left -= take;
                    alloc.push(a);
                }
            }
            if left == 0 {
                Placement::Now(alloc)
            } else {
                Placement::Busy
            }
        }
    }
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
        match place(&state, job.shape, job.mem_per_node) {
            Placement::Now(alloc) => {
                state.claim(&alloc);
                out.starts.push((job.id, alloc));
            }
            Placement::Busy => {
                out.waiting.push((job.id, PendingReason::Resources));
                blocked = true;
            }
            Placement::Never(why) => out.waiting.push((job.id, PendingReason::NoSuitableNodes(why))),
        }
    }
    out
}

#[cfg(test)]
mod tests;
