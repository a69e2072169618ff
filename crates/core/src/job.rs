//! Jobs: what users ask for, and what they get.

use crate::{CoreError, CpuSet, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Held,
    Running,
    /// Frozen on its nodes (preempted, or by an admin): holds its memory but not its PUs.
    Suspended,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
}

impl JobState {
    pub const ALL: [JobState; 9] = [
        JobState::Queued,
        JobState::Held,
        JobState::Running,
        JobState::Suspended,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Held => "held",
            JobState::Running => "running",
            JobState::Suspended => "suspended",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Timeout => "timeout",
            JobState::NodeFail => "node_fail",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_finished(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Held | JobState::Running | JobState::Suspended)
    }

    /// Running or suspended: the job holds an allocation and has processes on its nodes.
    pub fn has_allocation(self) -> bool {
        matches!(self, JobState::Running | JobState::Suspended)
    }

    pub fn is_pending(self) -> bool {
        matches!(self, JobState::Queued | JobState::Held)
    }
}

/// What a job asks for, as the user wrote it (flags and `#BERTH` directives).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    pub nodes: Option<u32>,
    /// Total cores of the job.
    pub cores: Option<u32>,
    pub tasks_per_node: Option<u32>,
    pub cpus_per_task: Option<u32>,
    /// Memory per node, bytes.
    pub mem_per_node: Option<u64>,
    /// Memory per allocated CPU (core, or PU with `threads`), bytes; excludes `mem_per_node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_cpu: Option<u64>,
    /// Count hardware threads (PUs) instead of whole cores.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub threads: bool,
    /// GPUs of the whole job (`--gpus`, Slurm's `--gpus`/`-G`), spread evenly over its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// GPUs on each node (`--gpus-per-node`, Slurm's `--gres=gpu:N`, PBS `ngpus=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// Only GPUs of this type (`--gpu-type`, compared with `Gpu::type_name`, any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// CPUs per GPU (`--cpus-per-gpu`): the job's CPUs on a node are its GPUs there times this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_gpu: Option<u32>,
    /// Memory per GPU, bytes (`--mem-per-gpu`): the job's memory on a node is its GPUs there
    /// times this; excludes `mem_per_node` and `mem_per_cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_gpu: Option<u64>,
    /// GPUs on each socket the job uses (`--gpus-per-socket`, Slurm's): with
    /// `sockets_per_node`, the job's GPUs on a node are their product.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_socket: Option<u32>,
    /// Sockets of each node the job uses (`--sockets-per-node`), with `gpus_per_socket`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets_per_node: Option<u32>,
    /// `--gres`: generic resources on each node (other than GPUs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gres: crate::gres::Counts,
    /// `--licenses`: cluster-wide licenses while the job runs.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub licenses: crate::gres::Counts,
}

/// The most sockets (packages) `--sockets-per-node` may name.
pub const MAX_SOCKETS_PER_NODE: u32 = 64;

/// The most GPUs a job may ask for on one node (as many as a node may have).
pub const MAX_GPUS_PER_NODE: u32 = crate::gpu::MAX_GPUS as u32;

/// The most GPUs a job may ask for in all.
pub const MAX_GPUS_PER_JOB: u32 = 65_536;

/// The shape the scheduler places: either an exact count of cores on each of `nodes` nodes,
/// or a total number of cores packed onto as few nodes as first-fit finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Shape {
    PerNode { nodes: u32, cores_per_node: u32 },
    Total { cores: u32, chunk: u32 },
}

impl ResourceRequest {
    /// Turn the user's request into a shape, rejecting contradictions with a reason.
    pub fn shape(&self) -> Result<Shape, CoreError> {
        let bad = |m: String| Err(CoreError::BadRequest(m));
        let cpt = self.cpus_per_task.unwrap_or(1);
        for (name, v) in [
            ("--nodes", self.nodes),
            ("--cores", self.cores),
            ("--tasks-per-node", self.tasks_per_node),
            ("--cpus-per-task", self.cpus_per_task),
        ] {
            if v == Some(0) {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if let Some(cpg) = self.cpus_per_gpu {
            return self.shape_from_gpus(cpg);
        }
        if let Some(tpn) = self.tasks_per_node {
            let nodes = self.nodes.unwrap_or(1);
            let per_node = tpn.checked_mul(cpt).ok_or(CoreError::BadRequest("request too large".into()))?;
            if let Some(cores) = self.cores {
                if Some(cores) != per_node.checked_mul(nodes) {
                    return bad(format!(
                        "--cores {cores} contradicts --nodes {nodes} x --tasks-per-node {tpn} x --cpus-per-task {cpt}; give only one of them"
                    ));
                }
            }
            return Ok(Shape::PerNode { nodes, cores_per_node: per_node });
        }
        if let Some(nodes) = self.nodes {
            let cores = self.cores.unwrap_or(nodes.saturating_mul(cpt));
            if !cores.is_multiple_of(nodes) || cores < nodes {
                return bad(format!(
                    "--cores {cores} cannot be spread evenly over --nodes {nodes}; give a multiple of {nodes} or use --tasks-per-node"
                ));
            }
            return Ok(Shape::PerNode { nodes, cores_per_node: cores / nodes });
        }
        let cores = self.cores.unwrap_or(cpt);
        if !cores.is_multiple_of(cpt) {
            return bad(format!("--cores {cores} is not a multiple of --cpus-per-task {cpt}"));
        }
        if self.wants_gpus() {
            // A GPU job that names no node count runs on one node, its GPUs and cores together.
            return Ok(Shape::PerNode { nodes: 1, cores_per_node: cores });
        }
        Ok(Shape::Total { cores, chunk: cpt })
    }

    /// The shape of a `--cpus-per-gpu` job, as Slurm: on each of its nodes (`--nodes`, else
    /// one) its GPUs there times `cpg` CPUs. `--cores` and `--cpus-per-task` say the same
    /// another way and are refused with it; `--tasks-per-node` tasks share the CPUs (at
    /// least one each).
    fn shape_from_gpus(&self, cpg: u32) -> Result<Shape, CoreError> {
        let bad = |m: String| Err(CoreError::BadRequest(m));
        if cpg == 0 {
            return bad("--cpus-per-gpu must be at least 1".into());
        }
        if !self.wants_gpus() {
            return bad(format!("--cpus-per-gpu {cpg} needs --gpus or --gpus-per-node"));
        }
        if self.cores.is_some() || self.cpus_per_task.is_some() {
            return bad(format!(
                "--cpus-per-gpu {cpg} sets the job's CPUs from its GPUs; give it or --cores/--cpus-per-task, not both"
            ));
        }
        let nodes = self.nodes.unwrap_or(1);
        let gpus = self.gpus_on_each_node(&Shape::PerNode { nodes, cores_per_node: 1 })?;
        let Some(per_node) = gpus.checked_mul(cpg) else {
            return bad(format!("{gpus} GPUs x --cpus-per-gpu {cpg}: request too large"));
        };
        if let Some(tpn) = self.tasks_per_node.filter(|&t| t > per_node) {
            return bad(format!(
                "--tasks-per-node {tpn} is more than the {per_node} CPUs of {gpus} GPU(s) x --cpus-per-gpu {cpg} on a node; raise --cpus-per-gpu"
            ));
        }
        Ok(Shape::PerNode { nodes, cores_per_node: per_node })
    }

    /// Whether the job asks for GPUs at all.
    pub fn wants_gpus(&self) -> bool {
        self.gpus.is_some() || self.gpus_per_node.is_some() || self.gpus_per_socket.is_some()
    }

    /// `--gpus-per-socket N --sockets-per-node S`: (N, S), with a reason when one is given
    /// without the other (Slurm needs both) or the product exceeds a node's bound.
    pub fn gpus_per_socket(&self) -> Result<Option<(u32, u32)>, CoreError> {
        let bad = |m: String| Err(CoreError::BadRequest(m));
        match (self.gpus_per_socket, self.sockets_per_node) {
            (None, None) => Ok(None),
            (None, Some(s)) => bad(format!(
                "--sockets-per-node {s} is read with --gpus-per-socket only; for a job's cores, use --cores or --binding"
            )),
            (Some(n), None) => bad(format!(
                "--gpus-per-socket {n} needs --sockets-per-node (how many sockets of each node the job uses), as Slurm does"
            )),
            (Some(n), Some(s)) if n == 0 || s == 0 => {
                bad("--gpus-per-socket and --sockets-per-node must be at least 1".into())
            }
            (Some(n), Some(s)) if u64::from(n) * u64::from(s) > u64::from(MAX_GPUS_PER_NODE) => bad(format!(
                "--gpus-per-socket {n} on {s} socket(s): {} GPUs per node, at most {MAX_GPUS_PER_NODE}",
                u64::from(n) * u64::from(s)
            )),
            (Some(n), Some(s)) => Ok(Some((n, s))),
        }
    }

    /// The GPUs the job needs on each of its nodes (0: none), from `--gpus` or
    /// `--gpus-per-node` and the node count of `shape`, with a reason when they contradict
    /// each other, do not spread evenly or exceed the bounds.
    pub fn gpus_on_each_node(&self, shape: &Shape) -> Result<u32, CoreError> {
        let bad = |m: String| Err(CoreError::BadRequest(m));
        if self.gpus == Some(0) || self.gpus_per_node == Some(0) {
            return bad("--gpus and --gpus-per-node must be at least 1".into());
        }
        if let Some(t) = &self.gpu_type {
            if !self.wants_gpus() {
                return bad(format!("--gpu-type {t} needs --gpus or --gpus-per-node"));
            }
            if !valid_gpu_type(t) {
                return bad(format!("--gpu-type needs a name of letters, digits, _ - and . (at most 64), got {t:?}"));
            }
        }
        let nodes = match *shape {
            Shape::PerNode { nodes, .. } => nodes,
            Shape::Total { .. } => 1,
        };
        if let Some(total) = self.gpus {
            if total > MAX_GPUS_PER_JOB {
                return bad(format!("--gpus {total}: at most {MAX_GPUS_PER_JOB} GPUs a job"));
            }
        }
        if let Some((n, s)) = self.gpus_per_socket()? {
            let per_node = n * s;
            if self.gpus_per_node.is_some_and(|p| p != per_node)
                || self.gpus.is_some_and(|t| u64::from(t) != u64::from(per_node) * u64::from(nodes))
            {
                return bad(format!(
                    "--gpus-per-socket {n} on {s} socket(s) ({per_node} GPUs a node) contradicts --gpus or --gpus-per-node; give only --gpus-per-socket"
                ));
            }
            return Ok(per_node);
        }
        let per_node = match (self.gpus, self.gpus_per_node) {
            (None, None) => return Ok(0),
            (_, Some(per_node)) => {
                if let Some(total) = self.gpus {
                    if u64::from(total) != u64::from(per_node) * u64::from(nodes) {
                        return bad(format!(
                            "--gpus {total} contradicts --gpus-per-node {per_node} on {nodes} node(s); give only one of them"
                        ));
                    }
                }
                per_node
            }
            (Some(total), None) => {
                if !total.is_multiple_of(nodes) {
                    // Defined behaviour (docs/gpus.md, "Uneven GPUs"): refused, with the
                    // nearest even requests.
                    let below = total / nodes * nodes;
                    let above = below + nodes;
                    let fewer = (1..nodes).rev().find(|d| total.is_multiple_of(*d)).unwrap_or(1);
                    let more = (nodes + 1..=total).find(|d| total.is_multiple_of(*d));
                    let on: Vec<String> = std::iter::once(fewer).chain(more).map(|d| format!("--nodes {d}")).collect();
                    let gpus = if below > 0 { format!("--gpus {below} or {above}") } else { format!("--gpus {above}") };
                    return bad(format!(
                        "--gpus {total} cannot be spread evenly over {nodes} nodes: a job holds the same GPUs on each of its nodes (Slurm may split them unevenly); ask for {gpus} (a multiple of {nodes}), or {total} GPUs on {}, or use --gpus-per-node",
                        on.join(" or ")
                    ));
                }
                total / nodes
            }
        };
        if per_node > MAX_GPUS_PER_NODE {
            return bad(format!("{per_node} GPUs per node: at most {MAX_GPUS_PER_NODE}"));
        }
        Ok(per_node)
    }
}

/// Whether `t` may name a GPU type: 1 to 64 letters, digits, `_`, `-`, `.`.
pub fn valid_gpu_type(t: &str) -> bool {
    !t.is_empty() && t.len() <= 64 && t.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// The resources a running job holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocation {
    pub node_id: NodeId,
    pub node: String,
    /// PUs (OS indexes in the node's topology).
    pub cpus: CpuSet,
    pub cores: u32,
    /// NUMA nodes (OS indexes) the job's memory may come from.
    pub mems: CpuSet,
    pub memory_bytes: u64,
    /// Where `memory_bytes` is reserved, per NUMA node (sums to `memory_bytes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_memory: Vec<NumaShare>,
    /// NUMA nodes (OS indexes) the job holds alone: no other job may use their CPUs or memory.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub exclusive_numa: CpuSet,
    /// Subnodes (indexes) the job holds, for large parallel jobs on nodes that have them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnodes: Vec<u32>,
    /// The bound cores as Grid Engine `(socket, core)` pairs, when the job asked for a binding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binding: Vec<(u32, u32)>,
    /// Per-rank sub-cpusets, when the job asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankSet>,
    /// The GPUs the job holds on the node (`Gpu::index` on that node), in increasing order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// The generic resources the job holds on the node (its `--gres`, other than GPUs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gres: crate::gres::Counts,
    /// The cluster-wide licenses the job holds (`--licenses`): on its first node's part only,
    /// so that claiming or releasing the whole allocation counts them once.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub licenses: crate::gres::Counts,
}

/// Memory reserved for a job on one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaShare {
    /// The NUMA node's OS index.
    pub numa: u32,
    pub bytes: u64,
}

/// One rank's sub-cpuset inside the job's cpuset on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSet {
    pub cpus: CpuSet,
    pub mems: CpuSet,
}

pub type Allocation = Vec<NodeAllocation>;

/// How a finished job ended, as the agent measured it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why berth ended it, if berth did: "walltime", "cancelled", "oom", "launch_failed: ...".
    pub reason: Option<String>,
    pub wall_ms: u64,
    pub user_cpu_us: u64,
    pub system_cpu_us: u64,
    pub peak_memory_bytes: u64,
}

impl JobOutcome {
    /// The final state of a job that ended this way.
    pub fn final_state(&self) -> JobState {
        match self.reason.as_deref() {
            Some("walltime") => JobState::Timeout,
            Some("cancelled") => JobState::Cancelled,
            Some("node_fail") => JobState::NodeFail,
            Some(_) => JobState::Failed,
            None if self.exit_code == Some(0) && self.signal.is_none() => JobState::Completed,
            None => JobState::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(nodes: Option<u32>, cores: Option<u32>, tpn: Option<u32>, cpt: Option<u32>) -> ResourceRequest {
        ResourceRequest { nodes, cores, tasks_per_node: tpn, cpus_per_task: cpt, ..Default::default() }
    }

    #[test]
    fn shapes() {
        assert_eq!(req(None, None, None, None).shape().unwrap(), Shape::Total { cores: 1, chunk: 1 });
        assert_eq!(req(None, Some(6), None, None).shape().unwrap(), Shape::Total { cores: 6, chunk: 1 });
        assert_eq!(req(Some(2), Some(8), None, None).shape().unwrap(), Shape::PerNode { nodes: 2, cores_per_node: 4 });
        assert_eq!(
            req(Some(3), None, Some(2), Some(2)).shape().unwrap(),
            Shape::PerNode { nodes: 3, cores_per_node: 4 }
        );
        assert_eq!(req(Some(2), None, None, None).shape().unwrap(), Shape::PerNode { nodes: 2, cores_per_node: 1 });
        assert!(req(Some(3), Some(8), None, None).shape().is_err());
        assert!(req(Some(2), Some(5), Some(2), None).shape().is_err());
        assert!(req(Some(0), None, None, None).shape().is_err());
        assert!(req(None, Some(5), None, Some(2)).shape().is_err());
    }

    #[test]
    fn cpus_per_gpu_scales_with_the_gpus_on_a_node() {
        let r = |nodes, gpus, per_node, cpg| ResourceRequest {
            nodes,
            gpus,
            gpus_per_node: per_node,
            cpus_per_gpu: Some(cpg),
            ..Default::default()
        };
        let pn = |nodes, cores_per_node| Shape::PerNode { nodes, cores_per_node };
        assert_eq!(r(None, Some(2), None, 4).shape().unwrap(), pn(1, 8), "2 GPUs x 4 on one node");
        assert_eq!(r(Some(2), Some(6), None, 3).shape().unwrap(), pn(2, 9), "3 GPUs a node x 3");
        assert_eq!(r(Some(3), None, Some(2), 5).shape().unwrap(), pn(3, 10));
        let err = |x: ResourceRequest| x.shape().unwrap_err().to_string();
        assert!(err(r(None, None, None, 4)).contains("needs --gpus"));
        assert!(err(r(None, Some(1), None, 0)).contains("at least 1"));
        assert!(err(ResourceRequest { cores: Some(8), ..r(None, Some(2), None, 4) }).contains("not both"));
        assert!(err(ResourceRequest { cpus_per_task: Some(2), ..r(None, Some(2), None, 4) }).contains("not both"));
        assert!(err(r(Some(2), Some(3), None, 4)).contains("spread evenly"));
        let tasks = ResourceRequest { tasks_per_node: Some(2), ..r(None, Some(2), None, 4) };
        assert_eq!(tasks.shape().unwrap(), pn(1, 8), "tasks share the GPUs' CPUs");
        let too_many = ResourceRequest { tasks_per_node: Some(9), ..r(None, Some(2), None, 4) };
        assert!(err(too_many).contains("raise --cpus-per-gpu"));
    }

    #[test]
    fn gpu_requests() {
        let gpus = |nodes, gpus, per_node, kind: Option<&str>| {
            let r = ResourceRequest {
                nodes,
                gpus,
                gpus_per_node: per_node,
                gpu_type: kind.map(String::from),
                ..Default::default()
            };
            r.shape().and_then(|s| r.gpus_on_each_node(&s).map(|g| (s, g)))
        };
        // A GPU job without --nodes is one node; without GPUs the shape is unchanged.
        assert_eq!(gpus(None, Some(3), None, None).unwrap(), (Shape::PerNode { nodes: 1, cores_per_node: 1 }, 3));
        assert_eq!(gpus(None, None, None, None).unwrap(), (Shape::Total { cores: 1, chunk: 1 }, 0));
        assert_eq!(gpus(Some(2), Some(8), None, None).unwrap().1, 4);
        assert_eq!(gpus(Some(2), None, Some(4), Some("a100")).unwrap().1, 4);
        assert_eq!(gpus(Some(2), Some(8), Some(4), None).unwrap().1, 4);
        let err = |r: Result<(Shape, u32), CoreError>| r.unwrap_err().to_string();
        assert!(err(gpus(Some(2), Some(3), None, None)).contains("spread evenly"));
        // Uneven GPUs: refused, naming the nearest even requests.
        let e = err(gpus(Some(2), Some(3), None, None));
        assert!(e.contains("--gpus 2 or 4 (a multiple of 2)") && e.contains("--nodes 1 or --nodes 3"), "{e}");
        let e = err(gpus(Some(4), Some(6), None, None));
        assert!(e.contains("--gpus 4 or 8") && e.contains("--nodes 3 or --nodes 6"), "{e}");
        let e = err(gpus(Some(4), Some(3), None, None));
        assert!(e.contains("ask for --gpus 4 (a multiple of 4), or 3 GPUs on --nodes 3, or"), "{e}");
        assert!(err(gpus(Some(2), Some(6), Some(4), None)).contains("contradicts"));
        assert!(err(gpus(None, None, None, Some("a100"))).contains("needs --gpus"));
        assert!(err(gpus(None, Some(1), None, Some("a 100"))).contains("--gpu-type"));
        assert!(err(gpus(None, Some(0), None, None)).contains("at least 1"));
        assert!(err(gpus(None, None, Some(257), None)).contains("at most 256"));
        assert!(err(gpus(Some(1), Some(300), None, None)).contains("at most 256"));
        assert!(err(gpus(Some(1000), Some(MAX_GPUS_PER_JOB + 1000), None, None)).contains("GPUs a job"));
    }

    /// Slurm's `--gpus-per-socket N` needs `--sockets-per-node S`: N x S GPUs a node.
    #[test]
    fn gpus_per_socket_times_sockets_per_node() {
        let r = |nodes, n, s| ResourceRequest { nodes, gpus_per_socket: n, sockets_per_node: s, ..Default::default() };
        let each = |r: ResourceRequest| r.shape().and_then(|sh| r.gpus_on_each_node(&sh).map(|g| (sh, g)));
        assert_eq!(each(r(None, Some(2), Some(2))).unwrap(), (Shape::PerNode { nodes: 1, cores_per_node: 1 }, 4));
        assert_eq!(each(r(Some(3), Some(1), Some(2))).unwrap().1, 2);
        assert!(r(None, Some(1), Some(1)).wants_gpus());
        let err = |r: ResourceRequest| each(r).unwrap_err().to_string();
        assert!(err(r(None, Some(2), None)).contains("needs --sockets-per-node"));
        assert!(err(r(None, None, Some(2))).contains("with --gpus-per-socket only"));
        assert!(err(r(None, Some(0), Some(2))).contains("at least 1"));
        assert!(err(r(None, Some(200), Some(2))).contains("at most 256"));
        let both = ResourceRequest { gpus_per_node: Some(3), ..r(None, Some(2), Some(2)) };
        assert!(err(both).contains("contradicts"));
        let agree = ResourceRequest { gpus: Some(8), ..r(Some(2), Some(2), Some(2)) };
        assert_eq!(each(agree).unwrap().1, 4);
        // --cpus-per-gpu scales with them.
        let cpg = ResourceRequest { cpus_per_gpu: Some(3), ..r(None, Some(1), Some(2)) };
        assert_eq!(cpg.shape().unwrap(), Shape::PerNode { nodes: 1, cores_per_node: 6 });
    }

    #[test]
    fn outcome_states() {
        let ok = JobOutcome { exit_code: Some(0), ..Default::default() };
        assert_eq!(ok.final_state(), JobState::Completed);
        let bad = JobOutcome { exit_code: Some(3), ..Default::default() };
        assert_eq!(bad.final_state(), JobState::Failed);
        let wall = JobOutcome { signal: Some(15), reason: Some("walltime".into()), ..Default::default() };
        assert_eq!(wall.final_state(), JobState::Timeout);
        let oom = JobOutcome { signal: Some(9), reason: Some("oom".into()), ..Default::default() };
        assert_eq!(oom.final_state(), JobState::Failed);
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn suspended_is_neither_pending_nor_finished() {
        let s = JobState::Suspended;
        assert_eq!(
            (s.as_str(), s.is_pending(), s.is_finished(), s.has_allocation()),
            ("suspended", false, false, true)
        );
        assert!(JobState::Running.has_allocation());
        assert!(!JobState::Queued.has_allocation() && !JobState::Completed.has_allocation());
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"suspended\"");
    }
}
