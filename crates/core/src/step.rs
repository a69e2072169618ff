//! Job steps: one `berth run` inside a job's allocation, and where its ranks go.
//!
//! A step claims whole cores of the job's allocation (a slot is one core with the job's PUs
//! on it). Several steps may run at once on disjoint cores; asking for more than the free
//! cores is refused unless the step overcommits, in which case extra ranks share the job's
//! CPUs, never others.

use crate::gpu::{GpuBind, GpuBindError};
use crate::job::NodeAllocation;
use crate::topology::Topology;
use crate::CpuSet;
use serde::{Deserialize, Serialize};

/// How ranks are laid out over the nodes and cores of the allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankBinding {
    /// Consecutive ranks on consecutive cores (block); each rank bound to its cores.
    #[default]
    Linear,
    /// Consecutive ranks alternate between the node's packages; each rank bound.
    Striding,
    /// Cores are still claimed per rank, but ranks may run on any CPU of the job.
    None,
}

/// The process-management interfaces a step's ranks are offered (`berth run --mpi`, srun's
/// `--mpi=`, `#BERTH --mpi`): PMI-1/PMI-2 on `PMI_FD` (MPICH), PMIx (Open MPI), both, or none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MpiKind {
    /// Both: MPICH and Open MPI programs run without flags.
    #[default]
    Auto,
    Pmix,
    Pmi2,
    Pmi1,
    None,
}

impl MpiKind {
    /// The names `berth run --mpi` and srun's `--mpi=` take (Slurm's `pmix_v4`, `pmi` too).
    pub fn parse(s: &str) -> Option<MpiKind> {
        match s {
            "auto" => Some(MpiKind::Auto),
            "pmix" | "pmix_v2" | "pmix_v3" | "pmix_v4" | "pmix_v5" => Some(MpiKind::Pmix),
            "pmi2" => Some(MpiKind::Pmi2),
            "pmi1" | "pmi" => Some(MpiKind::Pmi1),
            "none" => Some(MpiKind::None),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MpiKind::Auto => "auto",
            MpiKind::Pmix => "pmix",
            MpiKind::Pmi2 => "pmi2",
            MpiKind::Pmi1 => "pmi1",
            MpiKind::None => "none",
        }
    }

    /// Ranks get `PMI_FD` (PMI-1 and PMI-2 share it).
    pub fn offers_pmi(self) -> bool {
        matches!(self, MpiKind::Auto | MpiKind::Pmi2 | MpiKind::Pmi1)
    }

    /// Ranks get a PMIx namespace.
    pub fn offers_pmix(self) -> bool {
        matches!(self, MpiKind::Auto | MpiKind::Pmix)
    }
}

/// What `--mpi` accepts, for error messages.
pub const MPI_KINDS: &str = "auto, pmix, pmi2, pmi1 or none";

impl RankBinding {
    pub fn parse(s: &str) -> Option<RankBinding> {
        match s {
            "linear" | "block" | "cores" => Some(RankBinding::Linear),
            "striding" | "cyclic" | "sockets" => Some(RankBinding::Striding),
            "none" | "off" => Some(RankBinding::None),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    /// Ranks; default: one per free core (divided by `cpus_per_task`).
    pub ntasks: Option<u32>,
    /// Nodes of the allocation to use (srun's `-N`); default: as many as the ranks need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    pub tasks_per_node: Option<u32>,
    /// Cores per rank (default 1).
    pub cpus_per_task: Option<u32>,
    #[serde(default)]
    pub overcommit: bool,
    #[serde(default)]
    pub binding: RankBinding,
    /// GPUs per rank (`berth run --gpus-per-task`): an interactive allocation asks for this
    /// many per rank; the ranks' own GPUs follow `BERTH_GPUS_PER_TASK`/`BERTH_GPU_BIND` in
    /// the step's environment (docs/gpus.md, "Per-rank GPUs").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
}

/// One rank's place: the node (index into the job's allocation) and its PUs there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlace {
    pub rank: u32,
    pub cpus: CpuSet,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepNodePlan {
    /// Index of the node in the job's allocation.
    pub alloc_index: usize,
    pub node: String,
    pub ranks: Vec<RankPlace>,
    /// Every PU the step's ranks on this node use.
    pub cpus: CpuSet,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepPlan {
    pub size: u32,
    /// Nodes with ranks, in rank order (node 0 holds rank 0).
    pub nodes: Vec<StepNodePlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("-n {asked} needs {needed} cores but only {free} of the job's {total} cores are free{busy}; ask for fewer ranks, wait for the other runs, or pass --overcommit to share CPUs")]
    OverClaim { asked: u32, needed: u32, free: u32, total: u32, busy: String },
    #[error("--ntasks-per-node {per_node} with --cpus-per-task {cpt} needs {needed} cores per node, but node {node} has {free} free; lower it or pass --overcommit")]
    NodeTooSmall { per_node: u32, cpt: u32, needed: u32, node: String, free: u32 },
    #[error("all {total} cores of the job are in use by other runs; wait for them or pass --overcommit")]
    NoFreeCores { total: u32 },
    #[error("{0}")]
    Invalid(String),
    /// A part of an MPMD step (`a : b`; `part` counts from 0) cannot be laid out.
    #[error("part {} of the MPMD command: {error}", part + 1)]
    InPart { part: u32, error: Box<StepError> },
}

impl StepError {
    /// The error itself, out of its MPMD part.
    pub fn inner(&self) -> &StepError {
        match self {
            StepError::InPart { error, .. } => error.inner(),
            e => e,
        }
    }
}

/// Free slots of one node: the job's PUs grouped by core, in topology order (or alternating
/// packages for striding), minus cores holding a PU in `in_use`.
fn slots(
    topo: &Topology,
    alloc: &NodeAllocation,
    in_use: &CpuSet,
    binding: RankBinding,
    free_only: bool,
) -> Vec<CpuSet> {
    let mut per_package: Vec<Vec<CpuSet>> = vec![vec![]; topo.packages.len().max(1)];
    for core in &topo.cores {
        let pus: CpuSet = core.pus.iter().copied().filter(|&p| alloc.cpus.contains(p)).collect();
        if pus.is_empty() || (free_only && pus.intersects(in_use)) {
            continue;
        }
        let pkg = core.package.min(per_package.len() - 1);
        per_package[pkg].push(pus);
    }
    match binding {
        RankBinding::Striding => {
            let longest = per_package.iter().map(Vec::len).max().unwrap_or(0);
            (0..longest).flat_map(|i| per_package.iter().filter_map(move |p| p.get(i).cloned())).collect()
        }
        _ => per_package.into_iter().flatten().collect(),
    }
}

/// How a step's ranks share the job's GPUs (`--gpus-per-task`, `--gpu-bind`; docs/gpus.md,
/// "Per-rank GPUs"), so that [`plan_step_gpus`] puts each rank's cores next to its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepGpus {
    /// GPUs a rank under `closest` (at least 1).
    pub per_task: u32,
    pub bind: GpuBind,
}

/// Why a step's GPU settings are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepGpusError {
    #[error("BERTH_GPUS_PER_TASK={0:?}: give a count of GPUs per rank, at least 1")]
    PerTask(String),
    #[error(transparent)]
    Bind(#[from] GpuBindError),
}

impl StepGpus {
    /// The step's GPU binding as the agents read it (their `gpus_of_ranks`): the step's
    /// environment's `BERTH_GPUS_PER_TASK` and `BERTH_GPU_BIND` (`berth run --gpus-per-task`
    /// and `--gpu-bind` put them there, or the job's script inherited them), else the
    /// request's `gpus_per_task`; `closest` unless a binding is given. `None` when neither is
    /// set: every rank sees all the job's GPUs on its node, and ranks are laid out as ever.
    pub fn of_step(req: &StepRequest, env: &[(String, String)]) -> Result<Option<StepGpus>, StepGpusError> {
        let var = |name: &str| env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.trim().to_string());
        let per_task = match var("BERTH_GPUS_PER_TASK") {
            Some(v) => Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| StepGpusError::PerTask(v.escape_debug().to_string()))?,
            ),
            None => req.gpus_per_task,
        };
        let bind = var("BERTH_GPU_BIND").filter(|b| !b.is_empty()).map(|b| GpuBind::parse(&b)).transpose()?;
        Ok(match (per_task, bind) {
            (None, None) => None,
            (per_task, bind) => {
                Some(StepGpus { per_task: per_task.unwrap_or(1).max(1), bind: bind.unwrap_or(GpuBind::Closest) })
            }
        })
    }

    /// The GPUs each of `count` local ranks is meant to use on a node where the job holds
    /// `held` (indexes into `gpus`, the node's): what the agent's [`crate::gpu::rank_gpus`]
    /// gives ranks whose cores sit next to them. `closest`: `per_task` GPUs a rank, the job's
    /// GPUs in locality order (package, NUMA node, index), a rank's own when there are enough,
    /// else consecutive ranks sharing one in blocks of equal size (sizes differing by at most
    /// one); `single:N` N ranks a GPU; `per_task:N`, `map_gpu`, `mask_gpu` as the agent deals
    /// them. `None` for `none` and for a node where the job holds no GPU.
    pub fn targets(
        &self,
        gpus: &[crate::gpu::Gpu],
        held: &[u32],
        count: usize,
    ) -> Result<Option<Vec<Vec<u32>>>, GpuBindError> {
        let mut held: Vec<u32> = held.iter().copied().filter(|&i| (i as usize) < gpus.len()).collect();
        held.sort_unstable();
        held.dedup();
        if held.is_empty() || count == 0 {
            return Ok(None);
        }
        let len = held.len();
        let check = |form: &'static str, ids: &[u32]| match ids.iter().find(|i| !held.contains(i)) {
            Some(&gpu) => Err(crate::gpu::not_held(form, gpu, &held)),
            None => Ok(()),
        };
        let out = match &self.bind {
            GpuBind::None => return Ok(None),
            GpuBind::Map(ids) => {
                check("map", ids)?;
                (0..count).map(|r| vec![ids[r % ids.len()]]).collect()
            }
            GpuBind::Mask(masks) => {
                check("mask_gpu", &masks.concat())?;
                (0..count).map(|r| masks[r % masks.len()].clone()).collect()
            }
            GpuBind::PerTask(n) => {
                let n = (*n as usize).clamp(1, len);
                (0..count).map(|r| sorted((0..n).map(|j| held[(r * n + j) % len]).collect())).collect()
            }
            GpuBind::Single(n) => {
                let order = locality_order(gpus, &held);
                (0..count).map(|r| vec![order[(r / (*n).max(1) as usize) % len]]).collect()
            }
            GpuBind::Closest => {
                let order = locality_order(gpus, &held);
                let n = (self.per_task.max(1) as usize).min(len);
                (0..count)
                    .map(|r| {
                        // Enough for each its own: n apiece; else rank r starts at its share.
                        let start = if count * n <= len { r * n } else { r * len / count };
                        sorted((0..n).map(|j| order[(start + j) % len]).collect())
                    })
                    .collect()
            }
        };
        Ok(Some(out))
    }
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}

/// `held` by package, then NUMA node (GPUs hwloc could not place last), then index.
fn locality_order(gpus: &[crate::gpu::Gpu], held: &[u32]) -> Vec<u32> {
    let mut order = held.to_vec();
    order.sort_by_key(|&g| {
        let gpu = &gpus[g as usize];
        (gpu.package.is_none(), gpu.package, gpu.numa.is_none(), gpu.numa, g)
    });
    order
}

/// Where the ranks of a step go inside the job's allocation. `topos[i]` and `in_use[i]` (PUs
/// held by the job's other running steps) belong to `alloc[i]`.
pub fn plan_step(
    alloc: &[NodeAllocation],
    topos: &[&Topology],
    in_use: &[CpuSet],
    req: &StepRequest,
) -> Result<StepPlan, StepError> {
    plan_step_gpus(alloc, topos, in_use, req, None)
}

/// [`plan_step`] for a step whose ranks get their own GPUs (`gpus`): on a node where the job
/// holds GPUs, each rank's cores are the free cores of the job most local to the GPUs it is
/// meant to use ([`StepGpus::targets`]): PUs local to them (hwloc's locality: their NUMA
/// node's, or package's), else on their package, else any; ranks in order, each taking the
/// best cores left in topology order. So the agent's `closest` finds each rank's GPUs next to
/// its cores (and `--rank-cpusets` cpusets near them) whenever the job holds enough cores
/// there. A `map_gpu`/`mask_gpu` naming a GPU the job does not hold on a node is refused.
/// Overcommitted nodes (more rank cores than free ones) are laid out as by [`plan_step`].
pub fn plan_step_gpus(
    alloc: &[NodeAllocation],
    topos: &[&Topology],
    in_use: &[CpuSet],
    req: &StepRequest,
    gpus: Option<&StepGpus>,
) -> Result<StepPlan, StepError> {
    let cpt = req.cpus_per_task.unwrap_or(1);
    if cpt == 0 || req.ntasks == Some(0) || req.tasks_per_node == Some(0) {
        return Err(StepError::Invalid("-n, --ntasks-per-node and --cpus-per-task must be at least 1".into()));
    }
    if alloc.is_empty() || topos.len() != alloc.len() || in_use.len() != alloc.len() {
        return Err(StepError::Invalid("the job holds no nodes".into()));
    }
    let empty = CpuSet::new();
    let free: Vec<Vec<CpuSet>> =
        alloc.iter().zip(topos).zip(in_use).map(|((a, t), u)| slots(t, a, u, req.binding, true)).collect();
    let all: Vec<Vec<CpuSet>> = alloc.iter().zip(topos).map(|(a, t)| slots(t, a, &empty, req.binding, false)).collect();
    let total: u32 = all.iter().map(|s| s.len() as u32).sum();
    let free_total: u32 = free.iter().map(|s| s.len() as u32).sum();
    // Ranks per node.
    let counts: Vec<u32> = match (req.nodes, req.tasks_per_node) {
        (Some(k), per_node) => counts_on_nodes(alloc, &free, &all, req, k, per_node)?,
        (None, per_node) => match per_node {
            Some(k) => {
                let n = req.ntasks.unwrap_or(k * alloc.len() as u32);
                if n > k * alloc.len() as u32 && !req.overcommit {
                    return Err(StepError::Invalid(format!(
                        "-n {n} with --ntasks-per-node {k} needs {} nodes but the job has {}",
                        n.div_ceil(k),
                        alloc.len()
                    )));
                }
                let mut left = n;
                let per_node = if n > k * alloc.len() as u32 { n.div_ceil(alloc.len() as u32) } else { k };
                let counts: Vec<u32> = alloc
                    .iter()
                    .map(|_| {
                        let c = per_node.min(left);
                        left -= c;
                        c
                    })
                    .collect();
                if !req.overcommit {
                    for (i, &c) in counts.iter().enumerate() {
                        if c * cpt > free[i].len() as u32 {
                            return Err(StepError::NodeTooSmall {
                                per_node: k,
                                cpt,
                                needed: c * cpt,
                                node: alloc[i].node.clone(),
                                free: free[i].len() as u32,
                            });
                        }
                    }
                }
                counts
            }
            None => {
                let capacity: Vec<u32> = free.iter().map(|s| s.len() as u32 / cpt).collect();
                let cap_total: u32 = capacity.iter().sum();
                let n = match req.ntasks {
                    Some(n) => n,
                    None if cap_total > 0 => cap_total,
                    None if req.overcommit => (total / cpt).max(1),
                    None => return Err(StepError::NoFreeCores { total }),
                };
                if n <= cap_total {
                    // Block: fill each node's free cores in order.
                    let mut left = n;
                    capacity
                        .iter()
                        .map(|&c| {
                            let take = c.min(left);
                            left -= take;
                            take
                        })
                        .collect()
                } else if req.overcommit {
                    // Share: ranks in proportion to each node's cores.
                    let mut left = n;
                    let mut counts: Vec<u32> = all.iter().map(|s| n * s.len() as u32 / total.max(1)).collect();
                    left -= counts.iter().sum::<u32>();
                    let (mut i, len) = (0, counts.len());
                    while left > 0 {
                        counts[i % len] += 1;
                        left -= 1;
                        i += 1;
                    }
                    counts
                } else {
                    let busy = if free_total < total {
                        format!(" ({} held by other runs of the job)", total - free_total)
                    } else {
                        String::new()
                    };
                    return Err(StepError::OverClaim { asked: n, needed: n * cpt, free: free_total, total, busy });
                }
            }
        },
    };
    let mut nodes = Vec::new();
    let mut rank = 0u32;
    for (i, &count) in counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        // Free cores first; when they run out (overcommit), cycle over all the job's cores.
        let own = if count * cpt <= free[i].len() as u32 { &free[i] } else { &all[i] };
        if own.is_empty() {
            return Err(StepError::Invalid(format!("node {} has no CPUs in the job", alloc[i].node)));
        }
        let targets = match gpus {
            Some(g) if count * cpt <= own.len() as u32 => g
                .targets(&topos[i].gpus, &alloc[i].gpus, count as usize)
                .map_err(|e| StepError::Invalid(format!("node {}: {e}", alloc[i].node)))?,
            _ => None,
        };
        let mut ranks = Vec::with_capacity(count as usize);
        let mut used = CpuSet::new();
        let near = targets.map(|t| cores_near_gpus(topos[i], own, &t, cpt as usize));
        for r in 0..count {
            let cpus = match &near {
                Some(near) => near[r as usize].clone(),
                None => {
                    let mut cpus = CpuSet::new();
                    for c in 0..cpt {
                        cpus.union_with(&own[((r * cpt + c) as usize) % own.len()]);
                    }
                    cpus
                }
            };
            used.union_with(&cpus);
            ranks.push(RankPlace { rank, cpus });
            rank += 1;
        }
        nodes.push(StepNodePlan { alloc_index: i, node: alloc[i].node.clone(), ranks, cpus: used });
    }
    Ok(StepPlan { size: rank, nodes })
}

/// Each rank's PUs when it is to use the GPUs `targets[r]`: `cpt` of the free `slots` (whole
/// cores, in topology order; at least `targets.len() * cpt` of them), ranks in order, each
/// taking the slots best placed for its GPUs: all PUs local to one of them, then some, then
/// a core of their package, then any; among equals the first.
fn cores_near_gpus(topo: &Topology, slots: &[CpuSet], targets: &[Vec<u32>], cpt: usize) -> Vec<CpuSet> {
    let package_of = |slot: &CpuSet| {
        let pu = slot.iter().next()?;
        topo.cores.iter().find(|c| c.pus.contains(&pu)).map(|c| c.package)
    };
    let packages: Vec<Option<usize>> = slots.iter().map(package_of).collect();
    let mut taken = vec![false; slots.len()];
    targets
        .iter()
        .map(|mine| {
            let mut local = CpuSet::new();
            let mut near_packages = vec![];
            for g in mine.iter().filter_map(|&g| topo.gpus.get(g as usize)) {
                local.union_with(&g.cpus);
                near_packages.push(g.package);
            }
            let score = |s: usize| {
                let slot = &slots[s];
                if !local.is_empty() && slot.iter().all(|p| local.contains(p)) {
                    0
                } else if slot.intersects(&local) {
                    1
                } else if packages[s].is_some() && near_packages.contains(&packages[s]) {
                    2
                } else {
                    3
                }
            };
            let mut free: Vec<usize> = (0..slots.len()).filter(|&s| !taken[s]).collect();
            free.sort_by_key(|&s| (score(s), s));
            let mut cpus = CpuSet::new();
            for &s in free.iter().take(cpt) {
                taken[s] = true;
                cpus.union_with(&slots[s]);
            }
            cpus
        })
        .collect()
}

/// Ranks per node on exactly `k` nodes of the allocation (srun's `-N k`): the first `k` nodes
/// (in allocation order) that have room for a rank, or the first `k` when overcommitting;
/// ranks spread evenly (`-n 8 -N 2`: 4 and 4), or `per_node` each.
fn counts_on_nodes(
    alloc: &[NodeAllocation],
    free: &[Vec<CpuSet>],
    all: &[Vec<CpuSet>],
    req: &StepRequest,
    k: u32,
    per_node: Option<u32>,
) -> Result<Vec<u32>, StepError> {
    let cpt = req.cpus_per_task.unwrap_or(1);
    let len = alloc.len() as u32;
    if k == 0 {
        return Err(StepError::Invalid("-N (nodes) must be at least 1".into()));
    }
    if k > len {
        return Err(StepError::Invalid(format!(
            "-N {k} asks for {k} nodes but the job has {len}; ask for at most {len} (or submit the job with --nodes {k})"
        )));
    }
    let with_room: Vec<usize> = (0..alloc.len()).filter(|&i| free[i].len() as u32 >= cpt).collect();
    let chosen: Vec<usize> = if with_room.len() as u32 >= k {
        with_room.into_iter().take(k as usize).collect()
    } else if req.overcommit {
        (0..k as usize).collect()
    } else {
        return Err(StepError::Invalid(format!(
            "-N {k}: only {} of the job's {len} nodes have {cpt} free core(s) for a rank (the others are held by other \
             runs of the job); wait for them, ask for fewer nodes, or pass --overcommit",
            with_room.len()
        )));
    };
    let n = match (req.ntasks, per_node) {
        (Some(n), _) => n,
        (None, Some(p)) => p.saturating_mul(k),
        (None, None) if req.overcommit => chosen.iter().map(|&i| all[i].len() as u32 / cpt).sum::<u32>().max(k),
        (None, None) => chosen.iter().map(|&i| free[i].len() as u32 / cpt).sum(),
    };
    if n < k {
        return Err(StepError::Invalid(format!(
            "-n {n} ranks cannot use -N {k} nodes: each node gets at least one rank; ask for -n {k} or more, or fewer nodes"
        )));
    }
    if let Some(p) = per_node {
        if n > p.saturating_mul(k) && !req.overcommit {
            return Err(StepError::Invalid(format!(
                "-n {n} with --ntasks-per-node {p} needs {} nodes but -N asks for {k}",
                n.div_ceil(p)
            )));
        }
    }
    let mut counts = vec![0u32; alloc.len()];
    let (base, extra) = (n / k, n % k);
    for (j, &i) in chosen.iter().enumerate() {
        let c = base + u32::from((j as u32) < extra);
        if c.saturating_mul(cpt) > free[i].len() as u32 && !req.overcommit {
            return Err(StepError::Invalid(format!(
                "-n {n} over -N {k} nodes puts {c} rank(s) on {}, needing {} cores, but it has {} free; ask for fewer \
                 ranks or more nodes, or pass --overcommit",
                alloc[i].node,
                c.saturating_mul(cpt),
                free[i].len()
            )));
        }
        counts[i] = c;
    }
    Ok(counts)
}

/// MPICH's `PMI_process_mapping` and friends need ranks per node in node order.
pub fn ranks_per_node(plan: &StepPlan) -> Vec<Vec<u32>> {
    plan.nodes.iter().map(|n| n.ranks.iter().map(|r| r.rank).collect()).collect()
}

pub mod mpmd;

#[cfg(test)]
mod tests;
