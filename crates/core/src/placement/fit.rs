//! Placement on one node: which PUs and how much memory on which NUMA nodes.

use super::miss::{NodeMiss, UnitNote};
use super::{GpuLocality, JobRequest, Miss, PlacementPolicy};
use crate::binding::BindMiss;
use crate::job::{NodeAllocation, NumaShare};
use crate::node::{NodeCapacity, SubnodeState, PROP_ONLY_PARALLEL, PROP_SINGLE_CPU};
use crate::CpuSet;

/// One job's ask on one node.
#[derive(Debug, Clone, Copy)]
pub struct NodeAsk<'a> {
    /// Cores (or PUs with `req.threads`) wanted here; a binding decides its own count.
    pub slots: u32,
    pub req: &'a JobRequest,
    pub large: bool,
    /// Naive mode: the first usable CPUs in topology order, for comparison.
    pub first_fit: bool,
}

/// A unit the job can be given: a whole core, or one PU of a core (`threads`).
#[derive(Debug, Clone, Copy)]
struct Item {
    core: usize,
    pu: Option<u32>,
    numa: Option<usize>,
    package: usize,
}

/// What is usable on the node for one job.
struct View<'a> {
    node: &'a NodeCapacity,
    ask: &'a NodeAsk<'a>,
    numa_ok: Vec<bool>,
    /// Only these PUs (those local to the job's GPUs), when set.
    only: Option<&'a CpuSet>,
}

impl<'a> View<'a> {
    fn new(node: &'a NodeCapacity, ask: &'a NodeAsk<'a>, only: Option<&'a CpuSet>) -> Result<Self, Miss> {
        let topo = &node.topology;
        let props = &ask.req.properties;
        if !props.is_empty() && node.subnodes.is_empty() {
            return Err(Miss::never(NodeMiss::NoSubnodes { properties: props.clone(), node: node.name.clone() }));
        }
        // A job's memory limit here would be 0 bytes, and the kernel kills it at once. (Jobs
        // asking no memory exist only in tests: the controller gives every job some.)
        let needs_memory = ask.req.mem.on_node(1) > 0;
        if needs_memory && !topo.numa_nodes.iter().any(|n| !n.special && n.has_memory()) {
            return Err(Miss::never(NodeMiss::NoMemory { node: node.name.clone() }));
        }
        let single = ask.req.total_cpus() == 1;
        let numa_ok = (0..topo.numa_nodes.len())
            .map(|n| {
                // A NUMA node without memory takes no job, with its CPUs or for its memory.
                let no_memory = needs_memory && !topo.numa_nodes[n].has_memory();
                if node.numa_exclusive[n] || topo.numa_nodes[n].special || no_memory {
                    return false;
                }
                match node.subnode_of(n).map(|s| &node.subnodes[s]) {
                    Some(sub) => {
                        let has = |p: &str| sub.properties.iter().any(|q| q == p);
                        sub.state == SubnodeState::Up
                            && props.iter().all(|p| has(p))
                            && !ask.req.avoid_properties.iter().any(|p| has(p))
                            && (!has(PROP_ONLY_PARALLEL) || ask.large)
                            && (!has(PROP_SINGLE_CPU) || single)
                    }
                    None => props.is_empty(),
                }
            })
            .collect();
        Ok(View { node, ask, numa_ok, only })
    }

    fn numa_allowed(&self, numa: Option<usize>) -> bool {
        numa.is_none_or(|n| self.numa_ok[n]) && (numa.is_some() || self.ask.req.properties.is_empty())
    }

    fn pu_usable(&self, pu: u32) -> bool {
        self.node.free_pus.contains(pu)
            && (self.ask.req.system_cpus || !self.node.system_pus.contains(pu))
            && self.only.is_none_or(|only| only.contains(pu))
    }

    fn core_usable(&self, core: usize) -> bool {
        let c = &self.node.topology.cores[core];
        self.numa_allowed(c.numa) && c.pus.iter().all(|&p| self.pu_usable(p))
    }

    /// A NUMA node nobody uses at all: every PU free, all its memory free.
    fn numa_untouched(&self, n: usize) -> bool {
        let topo = &self.node.topology;
        self.numa_ok[n]
            && self.node.numa_free[n] == topo.numa_nodes[n].memory_bytes
            && topo.numa_nodes[n].cpus.iter().all(|p| self.node.free_pus.contains(p))
    }

    /// The usable items in topology order; with `threads`, PUs of partly used cores first
    /// within each NUMA node so that whole cores stay whole.
    fn items(&self, only: impl Fn(Option<usize>) -> bool) -> Vec<Item> {
        let topo = &self.node.topology;
        let mut out = Vec::new();
        for (i, c) in topo.cores.iter().enumerate() {
            if !only(c.numa) || !self.numa_allowed(c.numa) {
                continue;
            }
            if self.ask.req.threads {
                for &p in c.pus.iter().filter(|&&p| self.pu_usable(p)) {
                    out.push(Item { core: i, pu: Some(p), numa: c.numa, package: c.package });
                }
            } else if self.core_usable(i) {
                out.push(Item { core: i, pu: None, numa: c.numa, package: c.package });
            }
        }
        if self.ask.req.threads {
            let whole = |it: &Item| topo.cores[it.core].pus.iter().all(|&p| self.pu_usable(p));
            out.sort_by_key(|it| (it.numa, whole(it), it.core));
        }
        out
    }
}

/// Place `ask` on `node` now, or say why not. A job with GPUs gets them with its cores: the
/// GPU choices of [`gpu_choices`] in turn, each with cores from the PUs local to its GPUs;
/// when none has room there, the first choice with cores anywhere on the node, unless the
/// job's GPU locality (its own, else the policy's) is strict: then it does not fit here.
pub fn fit(node: &NodeCapacity, policy: &PlacementPolicy, ask: &NodeAsk) -> Result<NodeAllocation, Miss> {
    if ask.req.gres.is_empty() {
        return fit_devices(node, policy, ask);
    }
    gres_miss(node, ask.req).map_or(Ok(()), Err)?;
    let mut a = fit_devices(node, policy, ask)?;
    // By the node's keys: a type-less request may take several types (gres::take).
    a.gres = crate::gres::take(&node.gres_free, &ask.req.gres).ok_or_else(|| {
        Miss::busy(NodeMiss::GresNotFree { gres: crate::gres::render(&ask.req.gres), node: node.name.clone() })
    })?;
    Ok(a)
}

/// Why `node` cannot give `req` its generic resources: `Never` when it has fewer than asked
/// (or none), `Busy` when jobs hold them; `None` when they are free.
pub fn gres_miss(node: &NodeCapacity, req: &JobRequest) -> Option<Miss> {
    for (name, &want) in &req.gres {
        let total = crate::gres::available(&node.gres_total, name);
        if total < want {
            return Some(Miss::never(NodeMiss::GresTooFew {
                name: name.clone(),
                want,
                node: node.name.clone(),
                total,
            }));
        }
        let free = crate::gres::available(&node.gres_free, name);
        if free < want {
            return Some(Miss::busy(NodeMiss::GresTaken {
                name: name.clone(),
                want,
                free,
                total,
                node: node.name.clone(),
            }));
        }
    }
    // Each key fits alone; together (a typed and a type-less request of one name) they may not.
    let all = crate::gres::render(&req.gres);
    if crate::gres::take(&node.gres_total, &req.gres).is_none() {
        return Some(Miss::never(NodeMiss::GresTooMany { gres: all, node: node.name.clone() }));
    }
    if !node.gres_fits(&req.gres) {
        return Some(Miss::busy(NodeMiss::GresNotAllFree { gres: all, node: node.name.clone() }));
    }
    None
}

/// `fit` of cores, memory and GPUs.
fn fit_devices(node: &NodeCapacity, policy: &PlacementPolicy, ask: &NodeAsk) -> Result<NodeAllocation, Miss> {
    if ask.req.gpus_per_node == 0 {
        return fit_cores(node, policy, ask, None);
    }
    let choices = gpu_choices(node, ask.req)?;
    for gpus in &choices {
        let local = local_pus(node, gpus);
        if local.is_empty() {
            continue;
        }
        if let Ok(mut a) = fit_cores(node, policy, ask, Some(&local)) {
            a.gpus = gpus.clone();
            return Ok(a);
        }
    }
    if ask.req.gpu_locality.unwrap_or(policy.gpu_locality) == GpuLocality::Strict {
        return Err(strict_miss(node, ask, &choices));
    }
    let mut a = fit_cores(node, policy, ask, None)?;
    a.gpus = choices[0].clone();
    Ok(a)
}

/// The PUs local to `gpus` on `node`.
fn local_pus(node: &NodeCapacity, gpus: &[u32]) -> CpuSet {
    let mut local = CpuSet::new();
    for &g in gpus {
        if let Some(gpu) = node.topology.gpus.get(g as usize) {
            local.union_with(&gpu.cpus);
        }
    }
    local
}

/// Why a job of strict GPU locality does not fit `node`, none of whose GPU `choices` has the
/// job's cores free next to it: `Never` when no choice has that many cores near it at all (the
/// node could never hold the job so), else `Busy`. Either way the reason names the rule.
fn strict_miss(node: &NodeCapacity, ask: &NodeAsk, choices: &[Vec<u32>]) -> Miss {
    let unit = if ask.req.threads { "PUs" } else { "cores" };
    let system = |p: u32| ask.req.system_cpus || !node.system_pus.contains(p);
    // Per choice: (units local to its GPUs, of those free now); the best of each.
    let (mut most_local, mut most_free) = (0usize, 0usize);
    for gpus in choices {
        let local = local_pus(node, gpus);
        let (mut all, mut free) = (0, 0);
        for c in &node.topology.cores {
            let pus = c.pus.iter().filter(|&&p| local.contains(p) && system(p));
            if ask.req.threads {
                let (a, f) = pus.fold((0, 0), |(a, f), &p| (a + 1, f + usize::from(node.free_pus.contains(p))));
                (all, free) = (all + a, free + f);
            } else if !c.pus.is_empty() && pus.count() == c.pus.len() {
                all += 1;
                free += usize::from(c.pus.iter().all(|&p| node.free_pus.contains(p)));
            }
        }
        most_local = most_local.max(all);
        most_free = most_free.max(free);
    }
    let want = ask.slots;
    let gpus = ask.req.gpus_per_node;
    if most_local < want as usize {
        return Miss::never(NodeMiss::StrictNever { want, unit, gpus, node: node.name.clone(), most_local });
    }
    Miss::busy(NodeMiss::StrictBusy { want, unit, gpus, node: node.name.clone(), most_free })
}

/// The most GPU choices [`fit`] tries on one node.
const GPU_CHOICES: usize = 8;

/// Sets of free GPUs a job could get on `node`, best first (never empty): for a multi-GPU job,
/// inside one link group when one holds it (only those; the group with the fewest free GPUs
/// that still holds the job first, so larger groups stay whole for larger jobs); else inside
/// one NUMA node, then one package (fewest free first likewise), then the lowest free indexes. GPUs of the job's type only. `Never` when the node does not have that
/// many such GPUs at all, `Busy` when they are taken.
pub fn gpu_choices(node: &NodeCapacity, req: &JobRequest) -> Result<Vec<Vec<u32>>, Miss> {
    let want = req.gpus_per_node as usize;
    let kind = req.gpu_type.as_deref();
    let gpus = &node.topology.gpus;
    let gpu_type = kind.map(str::to_string);
    let have = node.gpu_count_of(kind) as usize;
    if have < want {
        let types: Vec<String> = {
            let mut t: Vec<String> = gpus.iter().map(|g| g.type_name()).collect();
            t.sort();
            t.dedup();
            t
        };
        let types = if kind.is_some() { types } else { vec![] };
        return Err(Miss::never(NodeMiss::GpusTooFew { gpu_type, node: node.name.clone(), have, want, types }));
    }
    let free: Vec<u32> = node.free_gpus_of(kind).collect();
    if free.len() < want {
        return Err(Miss::busy(NodeMiss::GpusTaken { gpu_type, free: free.len(), node: node.name.clone(), want }));
    }
    if req.gpus_per_socket > 0 {
        return socket_choices(node, req, &free);
    }
    let mut out: Vec<Vec<u32>> = vec![];
    let push = |out: &mut Vec<Vec<u32>>, set: Vec<u32>| {
        if set.len() == want && !out.contains(&set) && out.len() < GPU_CHOICES {
            out.push(set);
        }
    };
    // `want` of `v`: a GPU of each distinct locality in turn, the most free PUs first.
    let spread_set = |v: &[u32], want: usize| -> Vec<u32> {
        let free_near = |g: u32| gpus[g as usize].cpus.iter().filter(|&p| node.free_pus.contains(p)).count();
        let mut order: Vec<(usize, u32)> = v.iter().map(|&g| (free_near(g), g)).collect();
        order.sort_by_key(|&(f, g)| (std::cmp::Reverse(f), g));
        let mut picked: Vec<u32> = vec![];
        for &(_, g) in &order {
            let seen = picked.iter().any(|&q| gpus[q as usize].cpus == gpus[g as usize].cpus);
            if !seen && picked.len() < want {
                picked.push(g);
            }
        }
        for &(_, g) in &order {
            if picked.len() < want && !picked.contains(&g) {
                picked.push(g);
            }
        }
        picked.sort_unstable();
        picked
    };
    // Groups of free GPUs by a key; each group that holds the job, fewest free first.
    let grouped = |key: &dyn Fn(&crate::gpu::Gpu) -> Option<u32>| -> Vec<Vec<u32>> {
        let mut groups: Vec<(u32, Vec<u32>)> = vec![];
        for &g in &free {
            let Some(k) = gpus.get(g as usize).and_then(key) else { continue };
            match groups.iter_mut().find(|(q, _)| *q == k) {
                Some((_, v)) => v.push(g),
                None => groups.push((k, vec![g])),
            }
        }
        let mut fit: Vec<Vec<u32>> = groups.into_iter().map(|(_, v)| v).filter(|v| v.len() >= want).collect();
        fit.sort_by_key(|v| (v.len(), v[0]));
        // Inside each group, its NUMA nodes that hold the job alone first (their cores are
        // local to all its GPUs), then the group's lowest free GPUs.
        let (mut sets, mut spread) = (vec![], vec![]);
        for v in fit {
            let mut numas: Vec<Option<u32>> = v.iter().map(|&g| gpus[g as usize].numa).collect();
            numas.dedup();
            for n in numas.into_iter().flatten() {
                let here: Vec<u32> = v.iter().copied().filter(|&g| gpus[g as usize].numa == Some(n)).collect();
                if here.len() >= want {
                    sets.push(here[..want].to_vec());
                }
            }
            sets.push(v[..want].to_vec());
            // After all those, each group's GPUs over as many NUMA nodes as it takes (most
            // free PUs next to them first): for a job wanting more cores than one NUMA node
            // has free, whose cores then stay local to its GPUs.
            if want > 1 {
                spread.push(spread_set(&v, want));
            }
        }
        sets.extend(spread);
        sets
    };
    if want > 1 {
        for set in grouped(&|g| g.link_group) {
            push(&mut out, set);
        }
        // One link group holds the job: only such choices, so it is never given split GPUs.
        if !out.is_empty() {
            return Ok(out);
        }
    }
    for set in grouped(&|g| g.numa) {
        push(&mut out, set);
    }
    for set in grouped(&|g| g.package.map(|p| p as u32)) {
        push(&mut out, set);
    }
    push(&mut out, free[..want].to_vec());
    Ok(out)
}

/// GPU choices of a `--gpus-per-socket N` job (Slurm's): N GPUs attached to each of S sockets
/// (packages) of the node, S = `gpus_per_node / N`; GPUs of no known package count for none.
/// Sockets with the fewest free GPUs that still have N come first (so fuller sockets stay
/// whole), and inside a socket N GPUs of one NUMA node when it has them, else its lowest free.
/// `Never` when fewer than S sockets have N GPUs (of the type) at all, `Busy` when fewer than S
/// have N free. At most [`GPU_CHOICES`] sets.
fn socket_choices(node: &NodeCapacity, req: &JobRequest, free: &[u32]) -> Result<Vec<Vec<u32>>, Miss> {
    let n = req.gpus_per_socket as usize;
    let sockets = req.gpus_per_node as usize / n;
    let gpus = &node.topology.gpus;
    let kind = req.gpu_type.as_deref();
    // Per package: all its GPUs of the type, and the free ones (in index order).
    let packages = node.topology.packages.len();
    let (mut all, mut open) = (vec![0usize; packages], vec![Vec::<u32>::new(); packages]);
    for g in gpus.iter().filter(|g| kind.is_none_or(|k| g.is_type(k))) {
        if let Some(p) = g.package.filter(|&p| p < packages) {
            all[p] += 1;
        }
    }
    for &g in free {
        if let Some(p) = gpus.get(g as usize).and_then(|g| g.package).filter(|&p| p < packages) {
            open[p].push(g);
        }
    }
    let able = all.iter().filter(|&&c| c >= n).count();
    if able < sockets {
        return Err(Miss::never(NodeMiss::SocketGpusTooFew {
            gpu_type: kind.map(str::to_string),
            per_socket: n,
            sockets,
            node: node.name.clone(),
            able,
        }));
    }
    let mut ready: Vec<usize> = (0..packages).filter(|&p| open[p].len() >= n).collect();
    if ready.len() < sockets {
        return Err(Miss::busy(NodeMiss::SocketGpusTaken {
            gpu_type: kind.map(str::to_string),
            per_socket: n,
            sockets,
            node: node.name.clone(),
            ready: ready.len(),
        }));
    }
    ready.sort_by_key(|&p| (open[p].len(), p));
    // N of a socket's free GPUs: one NUMA node's when one has N (fewest free first), else the lowest.
    let pick = |p: usize| -> Vec<u32> {
        let v = &open[p];
        let mut numas: Vec<u32> = v.iter().filter_map(|&g| gpus[g as usize].numa).collect();
        numas.sort_unstable();
        numas.dedup();
        let best = numas
            .iter()
            .map(|&m| v.iter().copied().filter(|&g| gpus[g as usize].numa == Some(m)).collect::<Vec<u32>>())
            .filter(|here| here.len() >= n)
            .min_by_key(|here| (here.len(), here[0]));
        best.map_or_else(|| v[..n].to_vec(), |here| here[..n].to_vec())
    };
    // Combinations of `sockets` of the ready sockets, in order, the first GPU_CHOICES.
    let mut out: Vec<Vec<u32>> = vec![];
    let mut idx: Vec<usize> = (0..sockets).collect();
    loop {
        let mut set: Vec<u32> = idx.iter().flat_map(|&i| pick(ready[i])).collect();
        set.sort_unstable();
        out.push(set);
        if out.len() >= GPU_CHOICES {
            break;
        }
        // Next combination (lexicographic) of `sockets` indexes below ready.len().
        let Some(i) = (0..sockets).rev().find(|&i| idx[i] < ready.len() - sockets + i) else { break };
        idx[i] += 1;
        for j in i + 1..sockets {
            idx[j] = idx[j - 1] + 1;
        }
    }
    Ok(out)
}

/// [`fit`] for the cores alone, on the PUs of `only` when given.
fn fit_cores(
    node: &NodeCapacity,
    policy: &PlacementPolicy,
    ask: &NodeAsk,
    only: Option<&CpuSet>,
) -> Result<NodeAllocation, Miss> {
    let view = View::new(node, ask, only)?;
    let need_mem = |items: usize| ask.req.mem.on_node(items as u32);
    if let Some(strategy) = &ask.req.binding {
        // A large bound job takes NUMA nodes nobody touches, whole subnodes where defined.
        let unit_untouched = |numa: Option<usize>| match numa {
            None => true,
            Some(n) => match node.subnode_of(n) {
                Some(sub) => node.subnodes[sub].numa.iter().all(|&m| view.numa_untouched(m)),
                None => view.numa_untouched(n),
            },
        };
        let usable: Vec<bool> = (0..node.topology.cores.len())
            .map(|i| view.core_usable(i) && (!ask.large || unit_untouched(node.topology.cores[i].numa)))
            .collect();
        let bind_miss = |m| match m {
            BindMiss::Busy(b) => Miss::busy(NodeMiss::BindBusy(b)),
            BindMiss::Never(n) => Miss::never(NodeMiss::BindNever(n)),
        };
        let first = strategy.select(&node.topology, &usable).map_err(bind_miss)?;
        let first_try = finish_bound(&view, policy, &first);
        if first_try.is_ok() {
            return first_try;
        }
        // The strategy chose without regard to memory: its other choices may have room (cores
        // spanning more NUMA nodes or subnodes), else "busy" says what the first lacked. Choices
        // on the same NUMA nodes give the same memory, so each footprint is tried once.
        let mut tried = vec![footprint(node, &first)];
        for cores in strategy.choices(&node.topology, &usable).map_err(bind_miss)?.into_iter().skip(1) {
            let print = footprint(node, &cores);
            if tried.contains(&print) {
                continue;
            }
            if let Ok(a) = finish_bound(&view, policy, &cores) {
                return Ok(a);
            }
            tried.push(print);
        }
        return first_try;
    }
    if ask.large {
        return fit_large(&view, policy, need_mem(ask.slots as usize));
    }
    let need = need_mem(ask.slots as usize);
    let all = view.items(|_| true);
    if all.len() < ask.slots as usize {
        let memless_numa: Vec<u32> = node
            .topology
            .numa_nodes
            .iter()
            .filter(|n| ask.req.mem.on_node(1) > 0 && !n.has_memory() && !n.cpus.is_empty())
            .map(|n| n.os_index)
            .collect();
        return Err(Miss::busy(short_units(&view, all.len(), memless_numa)));
    }
    let mut tried = None;
    for choice in candidates(&view, policy, &all).into_iter().take(10) {
        match finish(&view, policy, &choice, need, &[], vec![]) {
            Ok(a) => return Ok(a),
            Err(m) => tried = Some(m),
        }
    }
    Err(tried.unwrap_or_else(|| {
        Miss::busy(NodeMiss::NoRoom { slots: ask.slots, unit: unit_name(ask), node: node.name.clone() })
    }))
}

/// A bound job's allocation on `cores`: large jobs hold their NUMA nodes (whole subnodes where
/// the node has them) alone.
fn finish_bound(view: &View, policy: &PlacementPolicy, cores: &[usize]) -> Result<NodeAllocation, Miss> {
    let node = view.node;
    let topo = &node.topology;
    let items: Vec<Item> = cores
        .iter()
        .map(|&i| Item { core: i, pu: None, numa: topo.cores[i].numa, package: topo.cores[i].package })
        .collect();
    let (exclusive, subnodes) = if !view.ask.large {
        (vec![], vec![])
    } else if node.subnodes.is_empty() {
        (numas_of(&items), vec![])
    } else {
        let mut subs: Vec<usize> = numas_of(&items).iter().filter_map(|&n| node.subnode_of(n)).collect();
        subs.sort_unstable();
        subs.dedup();
        let excl = subs.iter().flat_map(|&s| node.subnodes[s].numa.iter().copied()).collect();
        (excl, subs.iter().map(|&s| s as u32).collect())
    };
    finish(view, policy, &items, view.ask.req.mem.on_node(items.len() as u32), &exclusive, subnodes)
}

/// The NUMA nodes `cores` lie in, with how many of them in each (what memory depends on).
fn footprint(node: &NodeCapacity, cores: &[usize]) -> Vec<(Option<usize>, usize)> {
    let mut v: Vec<(Option<usize>, usize)> = vec![];
    for &i in cores {
        let numa = node.topology.cores[i].numa;
        match v.iter_mut().find(|(n, _)| *n == numa) {
            Some((_, k)) => *k += 1,
            None => v.push((numa, 1)),
        }
    }
    v.sort_unstable();
    v
}

/// Why only `have` of the units the job wants are usable on the node: what keeps the others
/// from it (subnode properties and states, system CPUs), and what would change that.
fn short_units(view: &View, have: usize, memless_numa: Vec<u32>) -> NodeMiss {
    let (node, ask) = (view.node, view.ask);
    let props = &ask.req.properties;
    let has_all = |k: usize| props.iter().all(|p| node.subnodes[k].properties.iter().any(|q| q == p));
    let mut notes: Vec<UnitNote> = vec![];
    for (k, sub) in node.subnodes.iter().enumerate().filter(|&(k, _)| has_all(k)) {
        let has = |p: &str| sub.properties.iter().any(|q| q == p);
        if sub.state != SubnodeState::Up {
            notes.push(UnitNote::SubnodeState { subnode: k, state: sub.state });
        } else if let Some(p) = ask.req.avoid_properties.iter().find(|p| has(p)) {
            notes.push(UnitNote::SubnodeKept { subnode: k, property: p.clone() });
        } else if has(PROP_ONLY_PARALLEL) && !ask.large {
            notes.push(UnitNote::OnlyParallel { subnode: k });
        } else if has(PROP_SINGLE_CPU) && ask.req.total_cpus() != 1 {
            notes.push(UnitNote::SingleCpu { subnode: k });
        }
    }
    if !props.is_empty() && !(0..node.subnodes.len()).any(has_all) {
        notes.push(UnitNote::NoSubnodeHas { node: node.name.clone(), properties: props.clone() });
    }
    notes.extend(system_note(view));
    NodeMiss::ShortUnits {
        unit: unit_name(ask),
        have,
        node: node.name.clone(),
        properties: props.clone(),
        want: ask.slots,
        notes,
        memless_numa,
    }
}

/// The free PUs kept from the job because they are system CPUs, if any.
fn system_note(view: &View) -> Option<UnitNote> {
    let node = view.node;
    let system = node.system_pus.iter().filter(|&p| node.free_pus.contains(p)).count();
    match system {
        _ if view.ask.req.system_cpus => None,
        0 => None,
        n => Some(UnitNote::SystemCpus(n)),
    }
}

fn unit_name(ask: &NodeAsk) -> &'static str {
    if ask.req.threads {
        "PUs"
    } else {
        "cores"
    }
}

fn numas_of(items: &[Item]) -> Vec<usize> {
    let mut v: Vec<usize> = items.iter().filter_map(|i| i.numa).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Candidate item choices in order of preference (best fit first; first fit alone in naive
/// mode): whole NUMA nodes, one NUMA node, one package, the whole node.
fn candidates(view: &View, policy: &PlacementPolicy, all: &[Item]) -> Vec<Vec<Item>> {
    let slots = view.ask.slots as usize;
    if view.ask.first_fit {
        return vec![all[..slots].to_vec()];
    }
    let topo = &view.node.topology;
    let numas = topo.numa_nodes.len();
    let mut by_numa: Vec<Vec<Item>> = vec![vec![]; numas + 1];
    for it in all {
        by_numa[it.numa.unwrap_or(numas)].push(*it);
    }
    let size_of = |n: usize| -> usize {
        let cores = topo.numa_cores(n);
        if view.ask.req.threads {
            cores.map(|c| topo.cores[c].pus.len()).sum()
        } else {
            cores.count()
        }
    };
    let local_mem = |n: usize| if n < numas { view.node.numa_free[n] } else { 0 };
    let need = view.ask.req.mem.on_node(slots as u32);
    let mut out = Vec::new();

    // Whole NUMA nodes when the count is a multiple of their size: nothing else shares them.
    if policy.align_numa {
        let whole: Vec<usize> = (0..numas).filter(|&n| size_of(n) > 0 && by_numa[n].len() == size_of(n)).collect();
        if let Some(&first) = whole.first() {
            let size = size_of(first);
            if slots.is_multiple_of(size) && whole.iter().all(|&n| size_of(n) == size) && whole.len() >= slots / size {
                let k = slots / size;
                let mut per_pkg: Vec<(usize, Vec<usize>)> = vec![];
                for &n in &whole {
                    let p = by_numa[n][0].package;
                    match per_pkg.iter_mut().find(|(q, _)| *q == p) {
                        Some((_, v)) => v.push(n),
                        None => per_pkg.push((p, vec![n])),
                    }
                }
                // Best fit: the package with the fewest whole NUMA nodes that still has k.
                let pick: Vec<usize> = match per_pkg.iter().filter(|(_, v)| v.len() >= k).min_by_key(|(_, v)| v.len()) {
                    Some((_, v)) => v[..k].to_vec(),
                    None => {
                        per_pkg.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
                        per_pkg.iter().flat_map(|(_, v)| v.iter().copied()).take(k).collect()
                    }
                };
                out.push(pick.iter().flat_map(|&n| by_numa[n].iter().copied()).collect());
            }
        }
    }

    // One NUMA node: the fullest one that still fits (cores and local memory) first.
    let mut singles: Vec<usize> = (0..=numas).filter(|&n| by_numa[n].len() >= slots).collect();
    singles.sort_by_key(|&n| (local_mem(n) < need, by_numa[n].len(), n));
    out.extend(singles.iter().take(4).map(|&n| by_numa[n][..slots].to_vec()));

    // One package, fewest NUMA nodes inside it; then the whole node likewise.
    let packages = topo.packages.len();
    let mut pkg_items: Vec<Vec<usize>> = vec![vec![]; packages];
    for (n, items) in by_numa.iter().enumerate() {
        if let Some(it) = items.first() {
            pkg_items[it.package].push(n);
        }
    }
    let gather = |mut ns: Vec<usize>| -> Vec<Item> {
        ns.sort_by_key(|&n| (std::cmp::Reverse(by_numa[n].len()), n));
        ns.iter().flat_map(|&n| by_numa[n].iter().copied()).take(slots).collect()
    };
    let mut pkgs: Vec<usize> =
        (0..packages).filter(|&p| pkg_items[p].iter().map(|&n| by_numa[n].len()).sum::<usize>() >= slots).collect();
    pkgs.sort_by_key(|&p| (pkg_items[p].iter().map(|&n| by_numa[n].len()).sum::<usize>(), p));
    out.extend(pkgs.iter().take(2).map(|&p| gather(pkg_items[p].clone())));
    out.push(gather((0..=numas).filter(|&n| !by_numa[n].is_empty()).collect()));
    // Widest footprint last: one CPU per NUMA node in turn, so a job whose memory does not
    // fit beside fewer NUMA nodes (or inside one subnode) gets local memory on more of them.
    // NUMA nodes of different subnodes alternate, so the footprint spans subnodes too.
    let mut order: Vec<usize> = (0..=numas).collect();
    let node = view.node;
    order.sort_by_key(|&n| {
        let sub = if n < numas { node.subnode_of(n) } else { None };
        let pos = sub.and_then(|s| node.subnodes[s].numa.iter().position(|&m| m == n)).unwrap_or(0);
        (pos, sub, n)
    });
    let mut wide = Vec::with_capacity(slots);
    let mut next = vec![0usize; numas + 1];
    while wide.len() < slots {
        let before = wide.len();
        for &n in &order {
            if wide.len() < slots && next[n] < by_numa[n].len() {
                wide.push(by_numa[n][next[n]]);
                next[n] += 1;
            }
        }
        if wide.len() == before {
            break;
        }
    }
    out.push(wide);
    out
}

/// A unit a large job may take: its subnode, NUMA nodes, usable CPUs, free memory.
type FreeUnit = (Option<usize>, Vec<usize>, Vec<Item>, u64);

/// Large parallel jobs: whole subnodes (or NUMA nodes) nobody else touches.
fn fit_large(view: &View, policy: &PlacementPolicy, need: u64) -> Result<NodeAllocation, Miss> {
    let node = view.node;
    let topo = &node.topology;
    let units: Vec<(Option<usize>, Vec<usize>)> = if node.subnodes.is_empty() {
        (0..topo.numa_nodes.len()).filter(|&n| !topo.numa_nodes[n].special).map(|n| (None, vec![n])).collect()
    } else {
        node.subnodes.iter().enumerate().map(|(i, s)| (Some(i), s.numa.clone())).collect()
    };
    // A unit is free when all its NUMA nodes are untouched; its items are its usable CPUs.
    let free: Vec<FreeUnit> = units
        .into_iter()
        .filter(|(_, ns)| ns.iter().all(|&n| view.numa_untouched(n)))
        .map(|(s, ns)| {
            let items = view.items(|m| m.is_some_and(|m| ns.contains(&m)));
            let mem = ns.iter().map(|&n| node.numa_free[n]).sum();
            (s, ns, items, mem)
        })
        .filter(|(_, _, items, _)| !items.is_empty())
        .collect();
    let slots = view.ask.slots as usize;
    let enough = |chosen: &[usize]| {
        chosen.iter().map(|&u| free[u].2.len()).sum::<usize>() >= slots
            && chosen.iter().map(|&u| free[u].3).sum::<u64>() >= need
    };
    let take = |order: &[usize]| -> Option<Vec<usize>> {
        let mut chosen = vec![];
        for &u in order {
            if enough(&chosen) {
                break;
            }
            chosen.push(u);
        }
        enough(&chosen).then_some(chosen)
    };
    let idx: Vec<usize> = (0..free.len()).collect();
    let chosen = if view.ask.first_fit {
        take(&idx)
    } else {
        // Best fit: the package whose free units hold the job with the least to spare.
        let package_of = |u: usize| free[u].2[0].package;
        let mut pkgs: Vec<usize> = idx.iter().map(|&u| package_of(u)).collect();
        pkgs.dedup();
        let mut best: Option<(usize, Vec<usize>)> = None;
        for p in pkgs {
            let in_p: Vec<usize> = idx.iter().copied().filter(|&u| package_of(u) == p).collect();
            let spare: usize = in_p.iter().map(|&u| free[u].2.len()).sum();
            if let Some(c) = take(&in_p) {
                if best.as_ref().is_none_or(|(s, _)| spare < *s) {
                    best = Some((spare, c));
                }
            }
        }
        best.map(|(_, c)| c).or_else(|| {
            let mut by_room = idx.clone();
            by_room.sort_by_key(|&u| {
                let p = package_of(u);
                let room: usize = idx.iter().filter(|&&v| package_of(v) == p).map(|&v| free[v].2.len()).sum();
                (std::cmp::Reverse(room), p, u)
            });
            take(&by_room)
        })
    };
    let Some(chosen) = chosen else {
        let have: usize = free.iter().map(|u| u.2.len()).sum();
        return Err(Miss::busy(NodeMiss::WholeNuma {
            large_cpus: policy.large_parallel_cpus,
            node: node.name.clone(),
            have,
            unit: unit_name(view.ask),
            slots,
            system: system_note(view),
        }));
    };
    let items: Vec<Item> = chosen.iter().flat_map(|&u| free[u].2.iter().copied()).take(slots).collect();
    let exclusive: Vec<usize> = chosen.iter().flat_map(|&u| free[u].1.iter().copied()).collect();
    let subnodes: Vec<u32> = chosen.iter().filter_map(|&u| free[u].0).map(|s| s as u32).collect();
    finish(view, policy, &items, need, &exclusive, subnodes)
}

/// Turn chosen items into an allocation: reserve memory, local NUMA nodes first.
fn finish(
    view: &View,
    policy: &PlacementPolicy,
    items: &[Item],
    need: u64,
    exclusive: &[usize],
    subnodes: Vec<u32>,
) -> Result<NodeAllocation, Miss> {
    let node = view.node;
    let topo = &node.topology;
    let mut cpus = CpuSet::new();
    for it in items {
        match it.pu {
            Some(p) => cpus.insert(p),
            None => topo.cores[it.core].pus.iter().for_each(|&p| cpus.insert(p)),
        }
    }
    // Local NUMA nodes with the number of the job's items on each; exclusive ones count too.
    let mut local: Vec<(usize, u64)> = vec![];
    for n in items.iter().filter_map(|i| i.numa).chain(exclusive.iter().copied()) {
        match local.iter_mut().find(|(m, _)| *m == n) {
            Some((_, w)) => *w += 1,
            None => local.push((n, 1)),
        }
    }
    let mut shares: Vec<(usize, u64)> = local.iter().map(|&(n, _)| (n, 0)).collect();
    let mut left = need;
    // Proportional to the CPUs on each local node, capped by what is free there; then top up.
    let weight: u64 = local.iter().map(|l| l.1).sum();
    for (k, &(n, w)) in local.iter().enumerate() {
        let want = if weight == 0 { 0 } else { (need as u128 * w as u128 / weight as u128) as u64 };
        let give = want.min(node.numa_free[n]).min(left);
        shares[k].1 += give;
        left -= give;
    }
    for (k, &(n, _)) in local.iter().enumerate() {
        let give = (node.numa_free[n] - shares[k].1).min(left);
        shares[k].1 += give;
        left -= give;
    }
    if left > 0 && exclusive.is_empty() && policy.wide_memory {
        // Borrow: the job's subnodes (or its package first, without subnodes), nearest first; never
        // from an exclusive or special node, or one the job may not use.
        let home = local.first().map(|l| l.0);
        let local_subs: Vec<usize> = local.iter().filter_map(|l| node.subnode_of(l.0)).collect();
        let home_pkg = items.first().map(|i| i.package);
        let pkg_of = |n: usize| topo.numa_cores(n).next().map(|c| topo.cores[c].package);
        let mut donors: Vec<usize> = (0..topo.numa_nodes.len())
            .filter(|&n| view.numa_ok[n] && node.numa_free[n] > 0 && !local.iter().any(|l| l.0 == n))
            .filter(|&n| local_subs.is_empty() || node.subnode_of(n).is_some_and(|s| local_subs.contains(&s)))
            .collect();
        donors.sort_by_key(|&n| (pkg_of(n) != home_pkg, n.abs_diff(home.unwrap_or(0)), n));
        for n in donors {
            if left == 0 {
                break;
            }
            let give = node.numa_free[n].min(left);
            shares.push((n, give));
            left -= give;
        }
    }
    if left > 0 {
        return Err(Miss::busy(NodeMiss::Memory { need, node: node.name.clone(), free: need - left }));
    }
    let mut mems = CpuSet::new();
    for &(n, _) in &local {
        mems.insert(topo.numa_nodes[n].os_index);
    }
    for &(n, b) in &shares {
        if b > 0 {
            mems.insert(topo.numa_nodes[n].os_index);
        }
    }
    if mems.is_empty() {
        mems = topo.mems_for(&cpus);
    }
    let binding = if view.ask.req.binding.is_some() {
        items.iter().map(|it| topo.socket_core(it.core)).collect()
    } else {
        vec![]
    };
    let mut alloc = NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id: node.id,
        node: node.name.clone(),
        cpus,
        cores: items.len() as u32,
        mems,
        memory_bytes: need,
        numa_memory: shares
            .iter()
            .filter(|s| s.1 > 0)
            .map(|&(n, bytes)| NumaShare { numa: topo.numa_nodes[n].os_index, bytes })
            .collect(),
        exclusive_numa: exclusive.iter().map(|&n| topo.numa_nodes[n].os_index).collect(),
        subnodes,
        binding,
        ranks: vec![],
        gpus: vec![],
    };
    if let Some(ranks) = alloc.cores.checked_div(view.ask.req.rank_cpus) {
        alloc.ranks = super::ranks::split(topo, &alloc, ranks.max(1));
    }
    Ok(alloc)
}
