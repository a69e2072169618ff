//! Node states and the per-node view the scheduler works on.

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

/// What the scheduler knows of a node: its hardware and what is free on it now.
#[derive(Debug, Clone)]
pub struct NodeCapacity {
    pub id: NodeId,
    pub name: String,
    pub state: NodeState,
    pub topology: Arc<Topology>,
    /// PUs not allocated to any job.
    pub free_pus: CpuSet,
    /// Memory (bytes) not allocated to any job.
    pub free_memory: u64,
}

impl NodeCapacity {
    pub fn new(id: NodeId, name: impl Into<String>, topology: Arc<Topology>) -> Self {
        let free_pus = topology.all_pus();
        let free_memory = topology.memory_bytes();
        NodeCapacity { id, name: name.into(), state: NodeState::Up, topology, free_pus, free_memory }
    }

    /// Cores all of whose PUs are free, in topology order.
    pub fn free_cores(&self) -> impl Iterator<Item = &crate::topology::Core> {
        self.topology.cores.iter().filter(|c| c.pus.iter().all(|&p| self.free_pus.contains(p)))
    }

    pub fn free_core_count(&self) -> usize {
        self.free_cores().count()
    }

    pub fn busy_pus(&self) -> CpuSet {
        let mut busy = self.topology.all_pus();
        busy.subtract(&self.free_pus);
        busy
    }
}
