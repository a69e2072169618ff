//! Node states and the per-node view the scheduler works on.

use crate::job::NodeAllocation;
use crate::topology::Topology;
use crate::{CpuSet, NodeId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Registered and heartbeating: takes new work.
    Up,
    /// Missed its heartbeats or disconnected.
    Down,
    /// Admin asked for no new work; jobs still run on it.
    Draining,
    /// Draining and now empty.
    Drained,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "up" => NodeState::Up,
            "down" => NodeState::Down,
            "draining" => NodeState::Draining,
            "drained" => NodeState::Drained,
            _ => return None,
        })
    }

    pub fn accepts_work(self) -> bool {
        self == NodeState::Up
    }
}

/// An admin-defined block of NUMA nodes inside a large node (the seed's "subnode"): the unit
/// large parallel jobs are given, and a place queues and jobs can target by property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subnode {
    /// Indexes into the topology's `numa_nodes`.
    pub numa: Vec<usize>,
    pub state: SubnodeState,
    pub properties: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubnodeState {
    #[default]
    Up,
    /// No new work; what runs there goes on.
    Drained,
    /// Taken out of service (e.g. faulty hardware); no new work.
    Offline,
}

impl SubnodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            SubnodeState::Up => "up",
            SubnodeState::Drained => "drained",
            SubnodeState::Offline => "offline",
        }
    }
}

/// Subnode property: only large parallel jobs may use the subnode.
pub const PROP_ONLY_PARALLEL: &str = "onlyparallel";
/// Subnode property: only single-CPU jobs may use the subnode.
pub const PROP_SINGLE_CPU: &str = "singlecpu";

/// What the scheduler knows of a node: its hardware and what is free on it now.
#[derive(Debug, Clone)]
pub struct NodeCapacity {
    pub id: NodeId,
    pub name: String,
    pub state: NodeState,
    pub topology: Arc<Topology>,
    /// PUs not allocated to any job.
    pub free_pus: CpuSet,
    /// Memory not allocated to any job, per NUMA node (same order as `topology.numa_nodes`).
    pub numa_free: Vec<u64>,
    /// NUMA nodes held alone by a large parallel job.
    pub numa_exclusive: Vec<bool>,
    /// PUs held back for system daemons; jobs get them only when they ask.
    pub system_pus: CpuSet,
    pub subnodes: Vec<Subnode>,
    /// Where the node sits in the interconnect: its group at each level, leaf level first.
    pub location: Vec<u32>,
    /// Ordinary (not special) memory not allocated, bytes: `numa_free` summed.
    pub free_memory: u64,
    /// Cached counts for fast filtering: whole free cores outside system CPUs and exclusive
    /// NUMA nodes; the same counting system CPUs; free PUs outside system CPUs.
    pub free_core_count: u32,
    pub free_core_count_with_system: u32,
    pub free_pu_count: u32,
    /// Cores and memory of NUMA nodes nobody uses at all (what a large job can take).
    pub untouched_cores: u32,
    pub untouched_memory: u64,
}

impl NodeCapacity {
    pub fn new(id: NodeId, name: impl Into<String>, topology: Arc<Topology>) -> Self {
        let free_pus = topology.all_pus();
        let numa_free = topology.numa_nodes.iter().map(|n| n.memory_bytes).collect();
        let numa_exclusive = vec![false; topology.numa_nodes.len()];
        let mut n = NodeCapacity {
            id,
            name: name.into(),
            state: NodeState::Up,
            topology,
            free_pus,
            numa_free,
            numa_exclusive,
            system_pus: CpuSet::new(),
            subnodes: vec![],
            location: vec![],
            free_memory: 0,
            free_core_count: 0,
            free_core_count_with_system: 0,
            free_pu_count: 0,
            untouched_cores: 0,
            untouched_memory: 0,
        };
        n.refresh();
        n
    }

    /// The same node with nothing allocated (admin settings kept): for "could it ever fit".
    pub fn pristine(&self) -> Self {
        let mut n = NodeCapacity::new(self.id, self.name.clone(), self.topology.clone());
        n.system_pus = self.system_pus.clone();
        n.subnodes = self.subnodes.clone();
        n.location = self.location.clone();
        n.refresh();
        n
    }

    /// Split the node into subnodes of `numa_per_subnode` consecutive NUMA nodes (0: none).
    /// Existing states and properties are kept where the subnode still exists.
    pub fn set_subnode_size(&mut self, numa_per_subnode: usize) {
        let old = std::mem::take(&mut self.subnodes);
        if numa_per_subnode == 0 || self.topology.numa_nodes.len() < numa_per_subnode {
            return;
        }
        let ordinary: Vec<usize> =
            (0..self.topology.numa_nodes.len()).filter(|&i| !self.topology.numa_nodes[i].special).collect();
        for (i, chunk) in ordinary.chunks(numa_per_subnode).enumerate() {
            let (state, properties) = old.get(i).map(|s| (s.state, s.properties.clone())).unwrap_or_default();
            self.subnodes.push(Subnode { numa: chunk.to_vec(), state, properties });
        }
    }

    /// The subnode holding NUMA node `numa`, if the node has subnodes.
    pub fn subnode_of(&self, numa: usize) -> Option<usize> {
        self.subnodes.iter().position(|s| s.numa.contains(&numa))
    }

    /// Recompute the cached counts after a change.
    pub fn refresh(&mut self) {
        let topo = &self.topology;
        let mut cores = 0;
        let mut with_system = 0;
        for core in &topo.cores {
            if core.numa.is_some_and(|n| self.numa_exclusive[n]) {
                continue;
            }
            if core.pus.iter().all(|&p| self.free_pus.contains(p)) {
                with_system += 1;
                if !core.pus.iter().any(|&p| self.system_pus.contains(p)) {
                    cores += 1;
                }
            }
        }
        self.free_core_count = cores;
        self.free_core_count_with_system = with_system;
        self.free_pu_count = self.free_pus.iter().filter(|&p| !self.system_pus.contains(p)).count() as u32;
        let (mut ucores, mut umem) = (0u32, 0u64);
        for (n, numa) in topo.numa_nodes.iter().enumerate() {
            let untouched = !numa.special
                && !self.numa_exclusive[n]
                && self.numa_free[n] == numa.memory_bytes
                && numa.cpus.is_subset_of(&self.free_pus);
            if untouched {
                ucores += topo.cores.iter().filter(|c| c.numa == Some(n)).count() as u32;
                umem += numa.memory_bytes;
            }
        }
        self.untouched_cores = ucores;
        self.untouched_memory = umem;
        self.free_memory =
            self.numa_free.iter().zip(&topo.numa_nodes).filter(|(_, n)| !n.special).map(|(f, _)| *f).sum();
    }

    pub fn busy_pus(&self) -> CpuSet {
        let mut busy = self.topology.all_pus();
        busy.subtract(&self.free_pus);
        busy
    }

    /// Claim a job's part on this node: its PUs, its memory per NUMA node, its exclusive NUMA
    /// nodes. Records from before per-NUMA accounting spread memory evenly over `mems`.
    pub fn claim(&mut self, na: &NodeAllocation) {
        self.free_pus.subtract(&na.cpus);
        for (idx, bytes) in self.shares(na) {
            self.numa_free[idx] = self.numa_free[idx].saturating_sub(bytes);
        }
        for os in na.exclusive_numa.iter() {
            if let Some(i) = self.topology.numa_by_os(os) {
                self.numa_exclusive[i] = true;
            }
        }
        self.refresh();
    }

    /// Give back what `claim` took (only PUs that exist on the node; memory capped at size).
    pub fn release(&mut self, na: &NodeAllocation) {
        let all = self.topology.all_pus();
        for pu in na.cpus.iter().filter(|&p| all.contains(p)) {
            self.free_pus.insert(pu);
        }
        for (idx, bytes) in self.shares(na) {
            let size = self.topology.numa_nodes[idx].memory_bytes;
            self.numa_free[idx] = (self.numa_free[idx] + bytes).min(size);
        }
        for os in na.exclusive_numa.iter() {
            if let Some(i) = self.topology.numa_by_os(os) {
                self.numa_exclusive[i] = false;
            }
        }
        self.refresh();
    }

    fn shares(&self, na: &NodeAllocation) -> Vec<(usize, u64)> {
        if !na.numa_memory.is_empty() {
            return na.numa_memory.iter().filter_map(|s| Some((self.topology.numa_by_os(s.numa)?, s.bytes))).collect();
        }
        let idx: Vec<usize> = na.mems.iter().filter_map(|os| self.topology.numa_by_os(os)).collect();
        if idx.is_empty() {
            return vec![];
        }
        let each = na.memory_bytes / idx.len() as u64;
        let extra = na.memory_bytes % idx.len() as u64;
        idx.iter().enumerate().map(|(k, &i)| (i, each + if k == 0 { extra } else { 0 })).collect()
    }
}
