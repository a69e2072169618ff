//! Node states and the per-node view the scheduler works on.

use crate::gpu::GpuMask;
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
    /// Back after a failure or an admin `down`, but still running processes of jobs that
    /// ended or moved meanwhile: no new work until they are gone.
    Cleaning,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Down => "down",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Cleaning => "cleaning",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "up" => NodeState::Up,
            "down" => NodeState::Down,
            "draining" => NodeState::Draining,
            "drained" => NodeState::Drained,
            "cleaning" => NodeState::Cleaning,
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
///
/// The cached counts (`free_memory` to `untouched_memory`) are written only by [`refresh`]
/// (which every method that changes what is free calls). A cluster's index of its nodes by
/// those counts is kept by its owner,
/// [`ClusterState`](crate::sched::ClusterState), through which its nodes change.
///
/// [`refresh`]: NodeCapacity::refresh
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
    /// The node's place in its cluster's node order, 0 first: set for all nodes at once by
    /// [`ClusterState::arrange`](crate::sched::ClusterState::arrange) (the admin's
    /// `[interconnect] order`, else names in natural order). `u32::MAX` until then: nodes not
    /// arranged go after those that are, by name in natural order (see
    /// `placement::order::NodeRanks`). Placement tries nodes, breaks ties and lists a job's
    /// nodes in this order, never in id (registration) order.
    pub order: u32,
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
    /// Whether each GPU (`topology.gpus`, by index) is free: not held by any job, running or
    /// suspended (a suspended job keeps its GPUs, as its memory).
    pub gpu_free: Vec<bool>,
    /// Cached: free GPUs (`gpu_free` counted).
    pub free_gpu_count: u32,
    /// Cached: the free GPUs as bits (`gpu_free`, when the node has at most `MAX_GPUS`), so
    /// that a typed count is the topology's shared mask of the type ANDed with this, no
    /// pointer followed (placement asks it of every candidate node).
    free_gpu_mask: GpuMask,
    /// Generic countable resources the node has (`[gres]` in the controller's configuration:
    /// `nvme_gb = 800`, `fpga = 1`); set with [`NodeCapacity::set_gres`].
    pub gres_total: crate::gres::Counts,
    /// Of those, what no job holds, running or suspended (a suspended job keeps its own, as
    /// its memory).
    pub gres_free: crate::gres::Counts,
}

/// The most distinct topologies [`shared_topology`] compares a new one with.
pub const SHARED_TOPOLOGY_KINDS: usize = 32;

/// `t` as an `Arc` shared with the nodes of `nodes` whose topology equals it, else a new one:
/// nodes of the same hardware then hold one topology, so placement's "nodes alike answer
/// alike" (`placement::cluster::feasible`) fits each kind once instead of every node, and the
/// tables a topology works out once (its GPU type words) serve them all. Compares `t` with
/// at most [`SHARED_TOPOLOGY_KINDS`] distinct topologies (a cluster of more kinds shares the
/// first ones), each once however many nodes hold it.
pub fn shared_topology(nodes: &[NodeCapacity], t: Topology) -> Arc<Topology> {
    let mut seen: Vec<&Arc<Topology>> = Vec::with_capacity(SHARED_TOPOLOGY_KINDS);
    for n in nodes {
        if seen.iter().any(|s| Arc::ptr_eq(s, &n.topology)) {
            continue;
        }
        if *n.topology == t {
            return n.topology.clone();
        }
        if seen.len() == SHARED_TOPOLOGY_KINDS {
            break;
        }
        seen.push(&n.topology);
    }
    Arc::new(t)
}

/// Why a suspended job's part cannot resume elsewhere on its node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelocateError {
    #[error("waiting for {need} {unit} to resume ({free} free)")]
    Short { need: u32, free: u32, unit: &'static str },
    #[error("it can resume only on its own CPUs: {0}")]
    Pinned(&'static str),
}

impl NodeCapacity {
    pub fn new(id: NodeId, name: impl Into<String>, topology: Arc<Topology>) -> Self {
        let name = name.into();
        let free_pus = topology.all_pus();
        let numa_free = topology.numa_nodes.iter().map(|n| n.memory_bytes).collect();
        let numa_exclusive = vec![false; topology.numa_nodes.len()];
        let gpu_free = vec![true; topology.gpus.len()];
        let mut n = NodeCapacity {
            id,
            name,
            state: NodeState::Up,
            topology,
            free_pus,
            numa_free,
            numa_exclusive,
            system_pus: CpuSet::new(),
            subnodes: vec![],
            location: vec![],
            order: u32::MAX,
            free_memory: 0,
            free_core_count: 0,
            free_core_count_with_system: 0,
            free_pu_count: 0,
            untouched_cores: 0,
            untouched_memory: 0,
            gpu_free,
            free_gpu_count: 0,
            free_gpu_mask: GpuMask::default(),
            gres_total: Default::default(),
            gres_free: Default::default(),
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
        n.order = self.order;
        n.gres_total = self.gres_total.clone();
        n.gres_free = self.gres_total.clone();
        n.refresh();
        n
    }

    /// Set the node's generic resources to `total`, keeping what jobs hold of them taken
    /// (what was held of a resource the node no longer has is forgotten; a smaller count
    /// leaves 0 free until enough is given back).
    pub fn set_gres(&mut self, total: crate::gres::Counts) {
        let mut free = crate::gres::Counts::new();
        for (name, &n) in &total {
            let held = self
                .gres_total
                .get(name)
                .map_or(0, |&t| t.saturating_sub(self.gres_free.get(name).copied().unwrap_or(0)));
            free.insert(name.clone(), n.saturating_sub(held));
        }
        self.gres_total = total;
        self.gres_free = free;
    }

    /// How many of generic resource `name` are free on the node.
    pub fn free_gres(&self, name: &str) -> u32 {
        self.gres_free.get(name).copied().unwrap_or(0)
    }

    /// Whether every count of `want` is free on the node (a type-less request taking any
    /// types: `gres::take`).
    pub fn gres_fits(&self, want: &crate::gres::Counts) -> bool {
        crate::gres::take(&self.gres_free, want).is_some()
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
        self.free_gpu_count = self.gpu_free.iter().filter(|f| **f).count() as u32;
        self.free_gpu_mask = GpuMask::default();
        for (g, _) in self.gpu_free.iter().enumerate().filter(|(_, f)| **f) {
            self.free_gpu_mask.insert(g as u32);
        }
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
        self.take_pus(na);
        self.take_memory(na);
        self.refresh();
    }

    /// Give back what `claim` took (only PUs that exist on the node; memory capped at size).
    pub fn release(&mut self, na: &NodeAllocation) {
        self.give_pus(na);
        self.give_memory(na);
        self.refresh();
    }

    /// Claim only a job's PUs and exclusive NUMA nodes: a suspended job resuming, whose memory
    /// stayed claimed while it was suspended.
    pub fn claim_pus(&mut self, na: &NodeAllocation) {
        self.take_pus(na);
        self.refresh();
    }

    /// Give back a job's PUs and exclusive NUMA nodes but keep its memory claimed per NUMA
    /// node: a suspended job's pages stay where they are, so other jobs may use its CPUs only.
    pub fn release_pus(&mut self, na: &NodeAllocation) {
        self.give_pus(na);
        self.refresh();
    }

    /// Claim only a job's memory (a suspended job reloaded after a restart).
    pub fn claim_memory(&mut self, na: &NodeAllocation) {
        self.take_memory(na);
        self.refresh();
    }

    /// Give back only a job's memory (a suspended job that ends: its PUs were given back).
    pub fn release_memory(&mut self, na: &NodeAllocation) {
        self.give_memory(na);
        self.refresh();
    }

    /// Whether `claim_pus(na)` would take only free PUs: every PU of `na` is free and, for each
    /// NUMA node `na` holds alone, no other job holds any of its PUs or memory (`na`'s own
    /// memory there is counted as claimed, as it is while the job is suspended).
    pub fn pus_free_for(&self, na: &NodeAllocation) -> bool {
        if !na.cpus.is_subset_of(&self.free_pus) {
            return false;
        }
        let shares = self.shares(na);
        na.exclusive_numa.iter().all(|os| {
            let Some(i) = self.topology.numa_by_os(os) else { return true };
            let node = &self.topology.numa_nodes[i];
            let own: u64 = shares.iter().filter(|(k, _)| *k == i).map(|(_, b)| *b).sum();
            !self.numa_exclusive[i]
                && node.cpus.is_subset_of(&self.free_pus)
                && self.numa_free[i].saturating_add(own) >= node.memory_bytes
        })
    }

    /// Where a suspended job's part `na` could resume on this node when its own PUs are not
    /// all free: as many free cores as it holds (PUs with `threads`), on the same PUs where they
    /// are free, then on the NUMA nodes its memory is on, then anywhere, in topology order. Its
    /// memory follows its CPUs (see `memory_following`); a binding of cores does not hold on
    /// other cores and is dropped. Parts pinned to their PUs (per-rank sub-cpusets,
    /// NUMA nodes held alone, subnodes) cannot move. System PUs only with `system_cpus` (the
    /// job asked for them).
    pub fn relocation_for(
        &self,
        na: &NodeAllocation,
        threads: bool,
        system_cpus: bool,
    ) -> Result<NodeAllocation, RelocateError> {
        if !na.ranks.is_empty() {
            return Err(RelocateError::Pinned("it has per-rank sub-cpusets"));
        }
        if !na.exclusive_numa.is_empty() {
            return Err(RelocateError::Pinned("it holds NUMA nodes alone"));
        }
        if !na.subnodes.is_empty() {
            return Err(RelocateError::Pinned("it holds subnodes"));
        }
        let topo = &self.topology;
        let usable = |pu: u32| self.free_pus.contains(pu) && (system_cpus || !self.system_pus.contains(pu));
        let numa_ok = |c: &crate::topology::Core| !matches!(c.numa, Some(n) if self.numa_exclusive[n]);
        let on_mems = |c: &crate::topology::Core| c.numa.is_some_and(|n| na.mems.contains(topo.numa_nodes[n].os_index));
        // Candidate units (a whole core, or one PU with `threads`) with their preference rank.
        let mut units: Vec<(u8, Vec<u32>)> = Vec::new();
        for core in topo.cores.iter().filter(|c| numa_ok(c)) {
            let rank = |pus: &[u32]| {
                if pus.iter().all(|&p| na.cpus.contains(p)) {
                    0
                } else if on_mems(core) {
                    1
                } else {
                    2
                }
            };
            if threads {
                for &pu in core.pus.iter().filter(|&&p| usable(p)) {
                    units.push((rank(&[pu]), vec![pu]));
                }
            } else if core.pus.iter().all(|&p| usable(p)) {
                units.push((rank(&core.pus), core.pus.clone()));
            }
        }
        let need = if threads {
            na.cpus.len()
        } else {
            topo.cores.iter().filter(|c| c.pus.iter().any(|&p| na.cpus.contains(p))).count()
        };
        if units.len() < need {
            let unit = if threads { "PUs" } else { "cores" };
            return Err(RelocateError::Short { need: need as u32, free: units.len() as u32, unit });
        }
        units.sort_by_key(|(rank, _)| *rank); // stable: topology order within a rank
        let mut moved = na.clone();
        moved.cpus = units.into_iter().take(need).flat_map(|(_, pus)| pus).collect();
        if moved.cpus != na.cpus {
            moved.binding.clear();
            self.memory_following(na, &mut moved);
        }
        Ok(moved)
    }

    /// Move the memory of suspended part `na` after its CPUs, now `moved.cpus` (seeds/000: a
    /// suspended job's pages migrate with it, or it runs on remote memory and crowds the jobs
    /// on its old CPUs): onto the NUMA nodes of the new CPUs in proportion to its CPUs there,
    /// as far as they have room (its own share there counts as room); what does not fit stays
    /// where it was. `moved.mems` becomes those NUMA nodes and the ones still holding a share.
    /// The books are not changed: the caller releases `na`'s memory and claims `moved`'s.
    fn memory_following(&self, na: &NodeAllocation, moved: &mut NodeAllocation) {
        let topo = &self.topology;
        let mut own = vec![0u64; topo.numa_nodes.len()];
        for (i, b) in self.shares(na) {
            own[i] = own[i].saturating_add(b);
        }
        let total: u64 = own.iter().fold(0, |a, &b| a.saturating_add(b));
        // The new CPUs' NUMA nodes, with how many of its PUs each holds, in topology order.
        let mut local: Vec<(usize, u64)> = vec![];
        for core in &topo.cores {
            let pus = core.pus.iter().filter(|&&p| moved.cpus.contains(p)).count() as u64;
            if let Some(n) = core.numa.filter(|&n| pus > 0 && !topo.numa_nodes[n].special) {
                match local.iter_mut().find(|l| l.0 == n) {
                    Some(l) => l.1 += pus,
                    None => local.push((n, pus)),
                }
            }
        }
        let room = |i: usize| self.numa_free[i].saturating_add(own[i]);
        let mut give = vec![0u64; own.len()];
        let mut left = total;
        let weight: u64 = local.iter().map(|l| l.1).sum();
        for &(i, w) in &local {
            let want = (total as u128 * w as u128 / weight.max(1) as u128) as u64;
            let g = want.min(room(i)).min(left);
            give[i] += g;
            left -= g;
        }
        for &(i, _) in &local {
            let g = room(i).saturating_sub(give[i]).min(left);
            give[i] += g;
            left -= g;
        }
        for (i, &b) in own.iter().enumerate() {
            if !local.iter().any(|l| l.0 == i) {
                let g = b.min(left);
                give[i] += g;
                left -= g;
            }
        }
        if left > 0 {
            // Books that do not hold its memory (cannot happen while they are kept): leave it.
            return;
        }
        moved.numa_memory = give
            .iter()
            .enumerate()
            .filter(|(_, &b)| b > 0)
            .map(|(i, &bytes)| crate::job::NumaShare { numa: topo.numa_nodes[i].os_index, bytes })
            .collect();
        let mut mems = CpuSet::new();
        for &(i, _) in &local {
            mems.insert(topo.numa_nodes[i].os_index);
        }
        for s in &moved.numa_memory {
            mems.insert(s.numa);
        }
        if !mems.is_empty() {
            moved.mems = mems;
        }
    }

    fn take_pus(&mut self, na: &NodeAllocation) {
        self.free_pus.subtract(&na.cpus);
        for os in na.exclusive_numa.iter() {
            if let Some(i) = self.topology.numa_by_os(os) {
                self.numa_exclusive[i] = true;
            }
        }
    }

    fn give_pus(&mut self, na: &NodeAllocation) {
        let all = self.topology.all_pus();
        for pu in na.cpus.iter().filter(|&p| all.contains(p)) {
            self.free_pus.insert(pu);
        }
        for os in na.exclusive_numa.iter() {
            if let Some(i) = self.topology.numa_by_os(os) {
                self.numa_exclusive[i] = false;
            }
        }
    }

    /// A job's memory, its GPUs and its generic resources: all stay with a suspended job.
    fn take_memory(&mut self, na: &NodeAllocation) {
        for (idx, bytes) in self.shares(na) {
            self.numa_free[idx] = self.numa_free[idx].saturating_sub(bytes);
        }
        for &g in &na.gpus {
            if let Some(free) = self.gpu_free.get_mut(g as usize) {
                *free = false;
            }
        }
        for (name, &n) in &na.gres {
            if let Some(free) = self.gres_free.get_mut(name) {
                *free = free.saturating_sub(n);
            }
        }
    }

    fn give_memory(&mut self, na: &NodeAllocation) {
        for (idx, bytes) in self.shares(na) {
            let size = self.topology.numa_nodes[idx].memory_bytes;
            self.numa_free[idx] = (self.numa_free[idx] + bytes).min(size);
        }
        for &g in &na.gpus {
            if let Some(free) = self.gpu_free.get_mut(g as usize) {
                *free = true;
            }
        }
        for (name, &n) in &na.gres {
            if let (Some(free), Some(&total)) = (self.gres_free.get_mut(name), self.gres_total.get(name)) {
                *free = free.saturating_add(n).min(total);
            }
        }
    }

    /// The free GPUs of type `kind` (any type: `None`), by index.
    pub fn free_gpus_of<'a>(&'a self, kind: Option<&'a str>) -> impl Iterator<Item = u32> + 'a {
        let named: Option<&[u32]> = kind.map(|k| self.topology.gpu_types().named(k).0);
        let all = (0..self.gpu_free.len() as u32).filter(move |_| named.is_none());
        let some = named.into_iter().flatten().copied();
        all.chain(some).filter(move |&g| self.gpu_free.get(g as usize).copied().unwrap_or(false))
    }

    /// How many GPUs of type `kind` (any: `None`) are free now (by the cached counts, as
    /// `free_gpu_count`).
    pub fn free_gpu_count_of(&self, kind: Option<&str>) -> u32 {
        match kind {
            None => self.free_gpu_count,
            Some(k) if GpuMask::covers(self.gpu_free.len()) => {
                self.topology.gpu_types().named(k).1.count_and(&self.free_gpu_mask)
            }
            Some(_) => self.free_gpus_of(kind).count() as u32,
        }
    }

    /// How many GPUs of type `kind` (any: `None`) the node has, free or not.
    pub fn gpu_count_of(&self, kind: Option<&str>) -> u32 {
        match kind {
            None => self.gpu_free.len() as u32,
            Some(k) => self.topology.gpu_types().named(k).0.len() as u32,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NumaShare;

    const GIB: u64 = 1 << 30;

    /// 2 NUMA nodes (1 GiB each) x 4 cores x 2 PUs: PUs 0-7 on NUMA 0, 8-15 on NUMA 1.
    fn node() -> NodeCapacity {
        NodeCapacity::new(NodeId(0), "n0", Arc::new(Topology::uniform(2, 1, 4, 2, GIB)))
    }

    fn part(cpus: &str, cores: u32, numa: u32, bytes: u64) -> NodeAllocation {
        NodeAllocation {
            gres: Default::default(),
            licenses: Default::default(),
            node_id: NodeId(0),
            node: "n0".into(),
            cpus: CpuSet::parse_list(cpus).unwrap(),
            cores,
            mems: CpuSet::from_iter_u32([numa]),
            memory_bytes: bytes,
            numa_memory: vec![NumaShare { numa, bytes }],
            exclusive_numa: CpuSet::new(),
            subnodes: vec![],
            binding: vec![],
            ranks: vec![],
            gpus: vec![],
        }
    }

    #[test]
    fn release_pus_keeps_memory_and_claim_pus_takes_them_back() {
        let mut n = node();
        let a = part("0-3", 2, 0, 256 << 20);
        n.claim(&a);
        assert_eq!((n.free_core_count, n.numa_free[0]), (6, GIB - (256 << 20)));
        n.release_pus(&a);
        assert_eq!(n.free_core_count, 8, "a suspended job's cores are free");
        assert_eq!(n.numa_free[0], GIB - (256 << 20), "its memory stays claimed");
        assert_eq!(n.free_memory, 2 * GIB - (256 << 20));
        assert!(n.pus_free_for(&a));
        // Another job takes core 0: the suspended part's own PUs are no longer free.
        let b = part("0-1", 1, 0, 0);
        n.claim(&b);
        assert!(!n.pus_free_for(&a));
        n.release(&b);
        n.claim_pus(&a);
        assert_eq!((n.free_core_count, n.numa_free[0]), (6, GIB - (256 << 20)));
        // A suspended job that ends gives back its memory only.
        n.release_pus(&a);
        n.release_memory(&a);
        assert_eq!((n.free_core_count, n.numa_free[0]), (8, GIB));
        n.claim_memory(&a);
        assert_eq!((n.free_core_count, n.numa_free[0]), (8, GIB - (256 << 20)));
    }

    #[test]
    fn exclusive_numa_is_given_up_while_suspended() {
        let mut n = node();
        let mut a = part("0-7", 4, 0, GIB / 2);
        a.exclusive_numa = CpuSet::from_iter_u32([0]);
        n.claim(&a);
        assert!(n.numa_exclusive[0]);
        n.release_pus(&a);
        assert!(!n.numa_exclusive[0]);
        assert!(n.pus_free_for(&a));
        // Another job's memory on that NUMA node forbids holding it alone again.
        let mut m = part("8-9", 1, 0, 1);
        m.numa_memory = vec![NumaShare { numa: 0, bytes: 1 }];
        n.claim(&m);
        assert!(!n.pus_free_for(&a));
        n.release(&m);
        assert!(n.pus_free_for(&a));
        n.claim_pus(&a);
        assert!(n.numa_exclusive[0]);
    }

    #[test]
    fn relocation_prefers_own_cores_then_its_numa_node() {
        let mut n = node();
        let a = part("2-5", 2, 0, 64 << 20); // cores 1 and 2 of NUMA 0
        n.claim(&a);
        n.release_pus(&a);
        n.claim(&part("2-3", 1, 0, 0)); // core 1 taken by another job
        let moved = n.relocation_for(&a, false, false).unwrap();
        assert_eq!(moved.cpus.to_list(), "0-1,4-5", "keeps core 2, takes core 0 of the same NUMA node");
        assert_eq!(
            (moved.cores, moved.mems.to_list(), moved.numa_memory.clone()),
            (2, "0".into(), a.numa_memory.clone())
        );
        // NUMA 0 full: cores of NUMA 1 come next.
        n.claim(&part("0-1,6-7", 2, 0, 0));
        let moved = n.relocation_for(&a, false, false).unwrap();
        assert_eq!(moved.cpus.to_list(), "4-5,8-9");
        // Not enough whole cores anywhere.
        n.claim(&part("8-9,11,12-15", 3, 1, 0));
        let err = n.relocation_for(&a, false, false).unwrap_err();
        assert_eq!(err, RelocateError::Short { need: 2, free: 1, unit: "cores" });
        assert_eq!(err.to_string(), "waiting for 2 cores to resume (1 free)");
        // Counting PUs, the lone PU 10 and core 2's PUs 4-5 would do... if it asked for threads.
        let mut t = a.clone();
        t.cpus = CpuSet::parse_list("2-3").unwrap();
        assert_eq!(n.relocation_for(&t, true, false).unwrap().cpus.to_list(), "4-5");
    }

    /// Moved to the other NUMA node's CPUs, the memory follows as far as that node has room
    /// (what it holds there itself counts); the rest stays, and both are in `mems`.
    #[test]
    fn relocated_memory_follows_the_cpus_as_far_as_there_is_room() {
        const MIB: u64 = 1 << 20;
        let mut n = node();
        let a = part("0-7", 4, 0, 768 * MIB);
        n.claim(&a);
        n.release_pus(&a);
        n.claim(&part("0-7", 4, 0, 0)); // NUMA 0's cores taken
        let moved = n.relocation_for(&a, false, false).unwrap();
        assert_eq!((moved.cpus.to_list(), moved.mems.to_list()), ("8-15".into(), "1".into()));
        assert_eq!(moved.numa_memory, vec![NumaShare { numa: 1, bytes: 768 * MIB }]);
        // With 512 MiB of NUMA 1 taken, 256 MiB stays behind.
        n.claim(&part("", 0, 1, 512 * MIB));
        let moved = n.relocation_for(&a, false, false).unwrap();
        assert_eq!((moved.cpus.to_list(), moved.mems.to_list()), ("8-15".into(), "0-1".into()));
        let shares = vec![NumaShare { numa: 0, bytes: 256 * MIB }, NumaShare { numa: 1, bytes: 512 * MIB }];
        assert_eq!(moved.numa_memory, shares);
        assert_eq!(moved.memory_bytes, 768 * MIB);
        // The books follow: release the old part's memory, claim the new one's.
        n.release_memory(&a);
        n.claim_memory(&moved);
        assert_eq!(n.numa_free, vec![768 * MIB, 0], "NUMA 0 keeps 256 MiB of it, NUMA 1 is full");
    }

    #[test]
    fn relocation_skips_system_cpus_and_drops_the_binding() {
        let mut n = node();
        n.system_pus = CpuSet::parse_list("0-1").unwrap();
        n.refresh();
        let mut a = part("2-3", 1, 0, 0);
        a.binding = vec![(0, 1)];
        n.claim(&a);
        n.release_pus(&a);
        n.claim(&part("2-3", 1, 0, 0));
        let moved = n.relocation_for(&a, false, false).unwrap();
        assert_eq!(moved.cpus.to_list(), "4-5", "not the system core 0");
        assert!(moved.binding.is_empty());
        assert_eq!(n.relocation_for(&a, false, true).unwrap().cpus.to_list(), "0-1", "asked for system CPUs");
        let mut pinned = a.clone();
        pinned.ranks = vec![crate::job::RankSet { cpus: a.cpus.clone(), mems: a.mems.clone() }];
        assert!(matches!(n.relocation_for(&pinned, false, false), Err(RelocateError::Pinned(_))));
    }

    #[test]
    fn nodes_of_equal_hardware_share_one_topology() {
        let mut nodes: Vec<NodeCapacity> = vec![];
        let add = |nodes: &mut Vec<NodeCapacity>, t: Topology| {
            let t = shared_topology(nodes, t);
            let id = NodeId(nodes.len() as u32);
            nodes.push(NodeCapacity::new(id, format!("n{}", id.0), t));
        };
        let small = Topology::uniform(2, 1, 4, 2, GIB);
        let big = Topology::uniform(2, 2, 4, 2, GIB);
        for t in [&small, &big, &small, &big, &small] {
            add(&mut nodes, t.clone());
        }
        assert!(Arc::ptr_eq(&nodes[0].topology, &nodes[2].topology));
        assert!(Arc::ptr_eq(&nodes[0].topology, &nodes[4].topology));
        assert!(Arc::ptr_eq(&nodes[1].topology, &nodes[3].topology));
        assert!(!Arc::ptr_eq(&nodes[0].topology, &nodes[1].topology));
        // Differing only in a GPU's model: not shared (their --gpu-type words differ).
        let mut a = Topology::uniform(1, 2, 2, 1, GIB);
        a.add_emulated_gpus(1).unwrap();
        let mut b = a.clone();
        b.gpus[0].emulated = false;
        b.gpus[0].model = Some("NVIDIA A100-SXM4-80GB".into());
        add(&mut nodes, a.clone());
        add(&mut nodes, b);
        add(&mut nodes, a);
        assert!(!Arc::ptr_eq(&nodes[5].topology, &nodes[6].topology));
        assert!(Arc::ptr_eq(&nodes[5].topology, &nodes[7].topology));
        assert_eq!(nodes[6].gpu_count_of(Some("a100")), 1);
        assert_eq!(nodes[7].gpu_count_of(Some("a100")), 0);
        // Past the bound of kinds compared, a new topology is its own (still correct).
        let mut many: Vec<NodeCapacity> = vec![];
        for k in 0..SHARED_TOPOLOGY_KINDS as u32 + 2 {
            add(&mut many, Topology::uniform(1, 1, k + 1, 1, GIB));
        }
        let last = Topology::uniform(1, 1, SHARED_TOPOLOGY_KINDS as u32 + 2, 1, GIB);
        let t = shared_topology(&many, last.clone());
        assert_eq!(*t, last);
        let first = shared_topology(&many, Topology::uniform(1, 1, 1, 1, GIB));
        assert!(Arc::ptr_eq(&first, &many[0].topology));
    }

    #[test]
    fn typed_free_counts_follow_claims_and_releases() {
        let mut t = Topology::uniform(2, 2, 2, 1, GIB);
        t.add_emulated_gpus(1).unwrap();
        for g in &mut t.gpus {
            g.emulated = false;
            g.model = Some(if g.index % 2 == 0 { "NVIDIA A100-SXM4-80GB" } else { "NVIDIA H100 80GB HBM3" }.into());
        }
        let mut n = NodeCapacity::new(NodeId(0), "g0", Arc::new(t));
        let check = |n: &NodeCapacity| {
            for k in ["a100", "h100", "80gb", "nvidia", "v100", "A100"] {
                let by_gpu =
                    n.topology.gpus.iter().filter(|g| n.gpu_free[g.index as usize] && g.is_type(k)).count() as u32;
                assert_eq!(n.free_gpu_count_of(Some(k)), by_gpu, "{k}");
                assert_eq!(n.free_gpus_of(Some(k)).count() as u32, by_gpu, "{k}");
            }
        };
        check(&n);
        let mut a = part("0", 1, 0, 0);
        a.gpus = vec![0, 3];
        n.claim(&a);
        assert_eq!(n.free_gpu_count_of(Some("a100")), 1);
        assert_eq!(n.free_gpu_count_of(Some("h100")), 1);
        check(&n);
        n.release(&a);
        assert_eq!(n.free_gpu_count_of(Some("nvidia")), 4);
        check(&n);
    }
}
