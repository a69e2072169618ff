//! Placement: where a job goes, down to PUs and memory per NUMA node.
//!
//! Queue policy (who runs, when) lives in `sched`; this module only answers "where": on one
//! node ([`fit`]) and across the cluster's interconnect ([`cluster`]). Rules, after the APAC
//! NF Altix scheduler (seeds/000):
//! - small-memory jobs get the memory nodes local to their CPUs;
//! - jobs needing more memory than that borrow from nearby memory nodes of the same subnode
//!   (or package), never from one held by a large parallel job;
//! - large parallel jobs (more than `large_parallel_cpus` CPUs) get whole NUMA nodes (whole
//!   subnodes where the node has them) that nobody else uses, CPUs or memory;
//! - jobs whose core count is a multiple of a NUMA node's get whole NUMA nodes where possible;
//! - no NUMA node's memory is ever oversubscribed (suspended jobs keep theirs);
//! - among the placements that satisfy all this, the least spread one wins (see [`spread`]).

pub mod cluster;
pub mod fit;
pub(crate) mod index;
mod miss;
pub mod order;
pub mod ranks;
pub mod reason;
pub mod spread;
#[cfg(test)]
mod tests;

use crate::binding::{BindingStrategy, CoreRef};
use crate::directives::SubmitOptions;
pub use crate::gpu::{GpuLocality, UnknownGpuLocality};
use crate::job::Shape;
use crate::CoreError;
pub use miss::{Miss, NodeMiss, UnitNote};
use serde::{Deserialize, Serialize};

/// Admin-tunable placement rules.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementPolicy {
    /// A job with more CPUs than this is a "large parallel" job (0: no job is).
    pub large_parallel_cpus: u32,
    /// Give jobs whose core count is a multiple of a NUMA node's whole NUMA nodes.
    pub align_numa: bool,
    /// Let a job that needs more memory than its CPUs' NUMA nodes have borrow from others.
    pub wide_memory: bool,
    /// Also compute the naive first-fit placement and keep it if it is less spread.
    pub compare_first_fit: bool,
    /// A GPU job on a node whose free GPUs have too few free cores near them (`[placement]
    /// gpu_locality`): `prefer` (default) takes cores elsewhere on the node, `strict` waits.
    /// A job's own `--gpu-locality` (Slurm's `--gres-flags=enforce-binding|disable-binding`)
    /// wins.
    pub gpu_locality: GpuLocality,
}

impl Default for PlacementPolicy {
    fn default() -> Self {
        PlacementPolicy {
            large_parallel_cpus: 8,
            align_numa: true,
            wide_memory: true,
            compare_first_fit: true,
            gpu_locality: GpuLocality::Prefer,
        }
    }
}

impl std::fmt::Debug for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementPolicy")
            .field("large_parallel_cpus", &self.large_parallel_cpus)
            .field("align_numa", &self.align_numa)
            .field("wide_memory", &self.wide_memory)
            .field("compare_first_fit", &self.compare_first_fit)
            .field("gpu_locality", &self.gpu_locality)
            .finish()
    }
}

/// How much memory a job needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemRequest {
    PerNode(u64),
    PerCpu(u64),
}

impl MemRequest {
    /// Bytes needed on a node that gets `cpus` of the job's CPUs.
    pub fn on_node(self, cpus: u32) -> u64 {
        match self {
            MemRequest::PerNode(b) => b,
            MemRequest::PerCpu(b) => b.saturating_mul(cpus as u64),
        }
    }
}

/// Everything placement needs to know about a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    pub shape: Shape,
    pub mem: MemRequest,
    /// Count PUs rather than whole cores.
    pub threads: bool,
    pub binding: Option<BindingStrategy>,
    /// May use the nodes' system CPUs.
    pub system_cpus: bool,
    /// Subnode properties required.
    pub properties: Vec<String>,
    /// Subnodes with any of these properties are not for this job: other queues keep them
    /// (`reserved` queue targets, see `sched::queue::target`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_properties: Vec<String>,
    /// CPUs per rank when the job wants one sub-cpuset per rank on each node (0: none).
    pub rank_cpus: u32,
    /// GPUs the job needs on each of its nodes (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus_per_node: u32,
    /// Only GPUs of this type (`Gpu::type_name`, lower case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// The job's own GPU locality (`--gpu-locality`), over the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_locality: Option<GpuLocality>,
    /// `--gpus-per-socket`: the job's `gpus_per_node` are this many on each of
    /// `gpus_per_node / gpus_per_socket` sockets (packages) of a node (0: any GPUs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus_per_socket: u32,
    /// Generic resources (other than GPUs) the job needs on each of its nodes (`--gres`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gres: crate::gres::Counts,
    /// Cluster-wide licenses the job needs while it runs (`--licenses`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub licenses: crate::gres::Counts,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl JobRequest {
    /// A plain request: `shape` of whole cores with `mem` per node.
    pub fn simple(shape: Shape, mem_per_node: u64) -> Self {
        JobRequest {
            shape,
            mem: MemRequest::PerNode(mem_per_node),
            threads: false,
            binding: None,
            system_cpus: false,
            properties: vec![],
            avoid_properties: vec![],
            rank_cpus: 0,
            gpus_per_node: 0,
            gpu_type: None,
            gpu_locality: None,
            gpus_per_socket: 0,
            gres: Default::default(),
            licenses: Default::default(),
        }
    }

    /// From a job's submission options (memory defaults already resolved into them).
    pub fn from_options(o: &SubmitOptions) -> Result<Self, CoreError> {
        let request = o.request();
        let mut shape = request.shape()?;
        if let Some(b) = &o.binding {
            // A binding names the cores of each node, so the job is so many nodes of that.
            let nodes = o.nodes.unwrap_or(1);
            let per_node = match (b.fixed_count(), b) {
                (Some(n), _) => n,
                (
                    None,
                    BindingStrategy::StridingRange { first: CoreRef::Global(a), last: CoreRef::Global(z), step },
                ) => z.saturating_sub(*a) / (*step).max(1) + 1,
                _ => 1,
            };
            if let Some(cores) = o.cores {
                if b.fixed_count().is_some() && Some(cores) != per_node.checked_mul(nodes) {
                    return Err(CoreError::BadRequest(format!(
                        "--binding {b} gives {per_node} core(s) per node, which contradicts --cores {cores} on {nodes} node(s); drop --cores"
                    )));
                }
            }
            if request.threads {
                return Err(CoreError::BadRequest(
                    "--binding names cores; it cannot be combined with --threads".into(),
                ));
            }
            shape = Shape::PerNode { nodes, cores_per_node: per_node };
        }
        let gpus_per_node = request.gpus_on_each_node(&shape)?;
        let mem = match (o.mem, o.mem_per_cpu, o.mem_per_gpu) {
            (Some(m), None, None) => MemRequest::PerNode(m),
            (None, Some(m), None) => MemRequest::PerCpu(m),
            // Slurm's --mem-per-gpu: per node, the GPUs there times the size.
            (None, None, Some(m)) if gpus_per_node == 0 => {
                return Err(CoreError::BadRequest(format!(
                    "--mem-per-gpu {m} needs --gpus or --gpus-per-node (or give --mem or --mem-per-cpu)"
                )))
            }
            (None, None, Some(m)) => MemRequest::PerNode(m.checked_mul(u64::from(gpus_per_node)).ok_or_else(|| {
                CoreError::BadRequest(format!("--mem-per-gpu {m} x {gpus_per_node} GPUs: request too large"))
            })?),
            (None, None, None) => MemRequest::PerNode(0),
            _ => {
                return Err(CoreError::BadRequest(
                    "give one of --mem (per node), --mem-per-cpu and --mem-per-gpu, not several".into(),
                ))
            }
        };
        Ok(JobRequest {
            shape,
            mem,
            threads: request.threads,
            binding: o.binding.clone(),
            system_cpus: o.system_cpus.unwrap_or(false),
            properties: o.properties.clone().unwrap_or_default(),
            avoid_properties: vec![],
            rank_cpus: if o.rank_cpusets.unwrap_or(false) { o.cpus_per_task.unwrap_or(1) } else { 0 },
            gpus_per_node,
            gpu_type: if gpus_per_node > 0 { request.gpu_type.as_ref().map(|t| t.to_ascii_lowercase()) } else { None },
            gpu_locality: if gpus_per_node > 0 { o.gpu_locality } else { None },
            gpus_per_socket: request.gpus_per_socket()?.map_or(0, |(n, _)| n),
            gres: o.gres.clone().unwrap_or_default(),
            licenses: o.licenses.clone().unwrap_or_default(),
        })
    }

    /// The job's CPUs over all its nodes.
    pub fn total_cpus(&self) -> u64 {
        match self.shape {
            Shape::PerNode { nodes, cores_per_node } => nodes as u64 * cores_per_node as u64,
            Shape::Total { cores, .. } => cores as u64,
        }
    }

    pub fn is_large(&self, policy: &PlacementPolicy) -> bool {
        policy.large_parallel_cpus > 0 && self.total_cpus() > policy.large_parallel_cpus as u64
    }
}
