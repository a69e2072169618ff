//! Builders shared by the scheduler's tests: clusters, jobs, running jobs, and a readable
//! summary of a pass.

use super::backfill::{PassOutput, QueuedJob, RunningJob};
use super::{ClusterState, PendingReason};
use crate::job::{Allocation, NodeAllocation, Shape};
use crate::node::{NodeCapacity, NodeState};
use crate::placement::JobRequest;
use crate::topology::Topology;
use crate::{CpuSet, JobId, NodeId};
use std::sync::Arc;

pub const G: u64 = 1 << 30;

/// Builds clusters of uniform nodes for tests.
pub struct ClusterBuilder {
    nodes: Vec<NodeCapacity>,
}

impl ClusterBuilder {
    pub fn new() -> Self {
        ClusterBuilder { nodes: vec![] }
    }
    /// `count` nodes of `packages` x `cores` (1 PU each, one NUMA node per package) with `mem` bytes.
    pub fn nodes(self, count: u32, packages: u32, cores_per_package: u32, mem: u64) -> Self {
        self.smt_nodes(count, packages, cores_per_package, 1, mem)
    }
    /// The same with `pus` hardware threads per core.
    pub fn smt_nodes(mut self, count: u32, packages: u32, cores_per_package: u32, pus: u32, mem: u64) -> Self {
        let topo = Arc::new(Topology::uniform(packages, 1, cores_per_package, pus, mem / packages as u64));
        for _ in 0..count {
            let id = self.nodes.len() as u32;
            self.nodes.push(NodeCapacity::new(NodeId(id), format!("n{id}"), topo.clone()));
        }
        self
    }
    pub fn state(mut self, index: usize, state: NodeState) -> Self {
        self.nodes[index].state = state;
        self
    }
    pub fn build(self) -> ClusterState {
        ClusterState::from_parts(self.nodes, Default::default(), Default::default())
    }
}

pub fn total(cores: u32) -> Shape {
    Shape::Total { cores, chunk: 1 }
}

/// A job of `cores` cores anywhere, no memory, with `walltime` seconds.
pub fn queued(id: u64, cores: u32, walltime: f64) -> QueuedJob {
    QueuedJob { id: JobId(id), request: JobRequest::simple(total(cores), 0), walltime, held: false }
}

/// A job of `nodes` whole nodes of `cores_per_node` cores each.
pub fn queued_nodes(id: u64, nodes: u32, cores_per_node: u32, walltime: f64) -> QueuedJob {
    let shape = Shape::PerNode { nodes, cores_per_node };
    QueuedJob { id: JobId(id), request: JobRequest::simple(shape, 0), walltime, held: false }
}

/// A running job holding PUs `cpus` (kernel list, e.g. "0-3") of node `node` until `end`,
/// claimed on `cluster`.
pub fn hold(cluster: &mut ClusterState, id: u64, parts: &[(usize, &str)], end: f64) -> RunningJob<Allocation> {
    let alloc: Allocation = parts
        .iter()
        .map(|&(node, cpus)| {
            let n = &cluster.nodes()[node];
            let cpus = CpuSet::parse_list(cpus).expect("cpu list");
            NodeAllocation {
                gres: Default::default(),
                licenses: Default::default(),
                node_id: n.id,
                node: n.name.clone(),
                cores: cpus.len() as u32,
                mems: n.topology.mems_for(&cpus),
                cpus,
                memory_bytes: 0,
                numa_memory: vec![],
                exclusive_numa: CpuSet::new(),
                subnodes: vec![],
                binding: vec![],
                ranks: vec![],
                gpus: vec![],
            }
        })
        .collect();
    cluster.claim(&alloc);
    RunningJob { id: JobId(id), alloc, end }
}

pub fn alloc_text(alloc: &Allocation) -> String {
    alloc.iter().map(|na| format!("{}:{}", na.node, na.cpus)).collect::<Vec<_>>().join(" ")
}

/// One line per job: "1 start n0:0-3", "2 wait resources at 50", "3 wait priority".
pub fn summary(out: &PassOutput<Allocation>) -> Vec<String> {
    let mut lines: Vec<String> = out.starts.iter().map(|(id, a)| format!("{id} start {}", alloc_text(a))).collect();
    for w in &out.waiting {
        let reason = match &w.reason {
            PendingReason::Resources(_) => "resources",
            PendingReason::Priority => "priority",
            PendingReason::Held => "held",
            PendingReason::NoSuitableNodes(_) => "never",
            PendingReason::QueueLimit(_) => "queue limit",
            other => other.code(),
        };
        let at = w.expected_start.map(|t| format!(" at {t}")).unwrap_or_default();
        lines.push(format!("{} wait {reason}{at}", w.id));
    }
    lines
}
