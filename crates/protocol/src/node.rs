//! Nodes as the controller shows them: `berth nodes` (`ClientResponse::Nodes`) and the
//! reservations API's inventory (`InventoryNode`) carry the same `NodeInfo`.

use berth_core::gpu::Gpu;
use berth_core::topology::{MemorySource, Topology};
use berth_core::JobId;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaInfo {
    pub os_index: u32,
    pub memory_bytes: u64,
    pub allocated_bytes: u64,
    pub cpus: String,
    /// The job holding this NUMA node alone (a large parallel job), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_job: Option<JobId>,
    /// Special memory (MCDRAM, HBM) not given to jobs by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub special: bool,
    /// Where `memory_bytes` came from (absent: hwloc); `berth nodes` shows any other.
    #[serde(default, skip_serializing_if = "MemorySource::is_hwloc")]
    pub memory_source: MemorySource,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u32,
    pub name: String,
    pub state: String,
    pub address: String,
    pub sockets: usize,
    pub cores: usize,
    pub pus: usize,
    /// Grid Engine notation, e.g. `SCTTCTT`.
    pub topology: String,
    /// The same with allocated PUs as dots, e.g. `S..CTT`.
    pub free: String,
    pub cpus_allocated: usize,
    pub memory_bytes: u64,
    pub memory_allocated_bytes: u64,
    pub numa: Vec<NumaInfo>,
    /// Host CPUs the node's emulated PUs are mapped onto (all of them on a real node).
    pub real_cpus: String,
    pub jobs: Vec<JobId>,
    pub last_heard_seconds_ago: Option<f64>,
    /// PUs held back for system daemons (kernel list, "" for none).
    #[serde(default)]
    pub system_cpus: String,
    #[serde(default)]
    pub subnodes: Vec<SubnodeInfo>,
    /// The full topology, when asked for (`berth nodes --topology`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Topology>,
    /// Which job holds which PUs, when the topology is asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pu_jobs: Vec<PuHolder>,
    /// The node's GPUs (absent when it has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    /// How many of them jobs hold (suspended jobs keep theirs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus_allocated: u32,
    /// Which job holds which GPUs (suspended jobs included), when the topology is asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_jobs: Vec<GpuHolder>,
    /// The node's generic resources (the controller's `[gres]`), by name, and how many of
    /// each jobs hold (suspended jobs keep theirs). Absent when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gres: Vec<CountInfo>,
}

/// A countable resource (a node's generic resource, a cluster-wide license): how many exist
/// and how many jobs hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountInfo {
    pub name: String,
    pub total: u32,
    pub used: u32,
}

/// GPUs of a node held by one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHolder {
    pub job: JobId,
    /// The GPUs' indexes on the node (`Gpu::index`).
    pub gpus: Vec<u32>,
}

pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// PUs of a node held by one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PuHolder {
    pub job: JobId,
    /// Kernel cpu list (the node's PU OS indexes).
    pub cpus: String,
}

/// An admin-defined block of NUMA nodes inside a node, an allocation unit for large jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubnodeInfo {
    pub index: u32,
    /// NUMA nodes (OS indexes, kernel list).
    pub numa: String,
    /// "up", "drained" or "offline".
    pub state: String,
    pub properties: Vec<String>,
}
