//! Placement across nodes: which nodes, preferring the least spread over the interconnect.
//!
//! Fast path for large clusters: every node keeps cached free counts, so candidates are found
//! from those plain integers; the exact per-node fit runs only on the nodes chosen. A cluster
//! kept as a `ClusterState` also has its nodes indexed by those counts (see `placement::index`):
//! then only the nodes with enough free cores are looked at, not every node. Both ways find the
//! same candidates in the same order.
//!
//! Nodes are tried, ties between them broken and a job's nodes listed in the cluster's node
//! order (`placement::order`: the admin's list, else names in natural order), never in id
//! order, which is only the order agents registered in.

use super::fit::{fit, NodeAsk};
use super::index::{Count, NodeIndex};
use super::order::NodeRanks;
pub use super::reason::{Busy, Never, NodeSize, SizeAdvice};
use super::spread::spread;
use super::{JobRequest, MemRequest, Miss, PlacementPolicy};
use crate::job::{Allocation, Shape};
use crate::node::NodeCapacity;

/// Where a request can go now, on any machine (`A`: what it hands out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit<A> {
    Now(A),
    /// Fits the machine but not what is free now, with what is missing.
    Busy(Busy),
    /// Can never fit the machine (its nodes that are up), with the reason.
    Never(Never),
}

/// Where a request can go now on the cluster's nodes.
pub type Placement = Fit<Allocation>;

/// How many of the job's units a node could hold now, by the cached counts.
fn free_slots(n: &NodeCapacity, req: &JobRequest) -> u32 {
    if req.threads && req.system_cpus {
        n.free_pus.len() as u32
    } else if req.threads {
        n.free_pu_count
    } else if req.system_cpus {
        n.free_core_count_with_system
    } else {
        n.free_core_count
    }
}

/// Units per node a binding asks for, else the shape's.
/// A striding range named by `<socket>,<core>` has as many cores as the node's numbering
/// gives, so it is counted on a node's topology (the first that takes work).
fn per_node_slots_on(nodes: &[NodeCapacity], req: &JobRequest, shape_slots: u32) -> u32 {
    use crate::binding::{BindingStrategy, CoreRef};
    if let Some(BindingStrategy::StridingRange { first, last, step }) = &req.binding {
        let topo = nodes.iter().find(|n| n.state.accepts_work()).or(nodes.first()).map(|n| &n.topology);
        if let Some(topo) = topo {
            let global = |r: &CoreRef| match *r {
                CoreRef::Global(n) => Some(n as usize),
                CoreRef::Socket(s, c) => topo.core_index(s, c),
            };
            if let (Some(a), Some(z)) = (global(first), global(last)) {
                if z >= a {
                    return ((z - a) / (*step).max(1) as usize + 1) as u32;
                }
            }
        }
    }
    req.binding.as_ref().and_then(|b| b.fixed_count()).unwrap_or(shape_slots)
}

/// Large by the CPUs the job really gets (`k` nodes of `c`).
fn is_large(policy: &PlacementPolicy, req: &JobRequest, k: u32, c: u32) -> bool {
    req.is_large(policy) || (policy.large_parallel_cpus > 0 && k as u64 * c as u64 > policy.large_parallel_cpus as u64)
}

/// The most exact fits tried beyond what the job needs before answering "busy": keeps one
/// decision bounded on a fragmented cluster.
const EXTRA_TRIES: usize = 64;

/// Place `req` on what is free now, looking at every node (a cluster's own index is used by
/// [`ClusterState::place_on_nodes`](crate::sched::ClusterState::place_on_nodes)). `nodes`
/// must be in id order.
pub fn place(nodes: &[NodeCapacity], policy: &PlacementPolicy, req: &JobRequest) -> Placement {
    place_with(nodes, policy, None, req)
}

/// `place` looking at every node (no index): what `place` must always agree with.
#[cfg(test)]
pub(crate) fn place_scanning(nodes: &[NodeCapacity], policy: &PlacementPolicy, req: &JobRequest) -> Placement {
    place_with(nodes, policy, None, req)
}

/// Whether a request's units per node are what `free_core_count` counts (what the index keeps).
fn counts_free_cores(req: &JobRequest) -> bool {
    !req.threads && !req.system_cpus
}

/// `place` with the candidates found through `index` (which must be true for `nodes`) or, without
/// one, by looking at every node.
pub(crate) fn place_with(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    index: Option<&NodeIndex>,
    req: &JobRequest,
) -> Placement {
    // The nodes' order: the index's, else read from the nodes (one pass, as the scan is).
    let owned;
    let ranks = match index {
        Some(ix) => ix.ranks(),
        None => {
            owned = NodeRanks::of(nodes);
            &owned
        }
    };
    let found = match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => {
            per_node(nodes, policy, index, ranks, req, k, cores_per_node, false)
        }
        Shape::Total { cores, chunk } => total(nodes, policy, index, ranks, req, cores, chunk),
    };
    match found {
        Ok(mut alloc) => {
            // Listed in the cluster's order: the first node (the head node, rank 0's) and the
            // job's node list follow node names, not which node was chosen first.
            alloc.sort_by_key(|a| node_position(nodes, a.node_id).map_or(u32::MAX, |i| ranks.rank(i)));
            Placement::Now(alloc)
        }
        Err(busy) => match feasible(nodes, policy, req, |n| n.state.accepts_work()) {
            Ok(()) => Placement::Busy(busy),
            Err(never) => Placement::Never(never),
        },
    }
}

/// `k` nodes with `c` units each: the tightest interconnect group that has enough
/// candidates, fullest nodes first; compared with naive first fit by spread.
#[allow(clippy::too_many_arguments)]
fn per_node(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    index: Option<&NodeIndex>,
    ranks: &NodeRanks,
    req: &JobRequest,
    k: u32,
    c: u32,
    naive_only: bool,
) -> Result<Allocation, Busy> {
    let c = per_node_slots_on(nodes, req, c);
    let need = req.mem.on_node(c);
    let large = is_large(policy, req, k, c);
    let keep = |i: &usize| {
        let n = &nodes[*i];
        n.state.accepts_work()
            && free_slots(n, req) >= c
            && n.free_memory >= need
            // A large job needs NUMA nodes nobody touches: count only those.
            && (!large || req.threads || (n.untouched_cores >= c && n.untouched_memory >= need))
            && (req.gpus_per_node == 0
                || (n.free_gpu_count >= req.gpus_per_node
                    && n.free_gpu_count_of(req.gpu_type.as_deref()) >= req.gpus_per_node))
            && (req.gres.is_empty() || n.gres_fits(&req.gres))
    };
    // With an index, the nodes with `c` free cores (or, for a large job, `c` untouched cores),
    // whichever are fewer, in the cluster's order; else every node, in that order.
    let by = |count: Count| index.map(|ix| (ix, count, ix.count_from(count, c)));
    let lists = [
        by(Count::FreeCores).filter(|_| counts_free_cores(req)),
        by(Count::UntouchedCores).filter(|_| large && !req.threads),
    ];
    let cand: Vec<usize> = match lists.into_iter().flatten().filter(|_| c > 0).min_by_key(|l| l.2) {
        Some((ix, count, _)) => {
            let mut cand = ix.all_from(count, c);
            cand.retain(keep);
            cand
        }
        None => ranks.positions().filter(keep).collect(),
    };
    if cand.len() < k as usize {
        return Err(short_per_node(nodes, policy, req, k, c, large));
    }
    let ask = |first_fit| NodeAsk { slots: c, req, large, first_fit };
    let last_miss = std::cell::RefCell::new(None::<Miss>);
    let take = |order: &[usize], first_fit: bool| -> Option<Allocation> {
        let mut alloc = Vec::with_capacity(k as usize);
        let mut misses = 0;
        for &i in order {
            match fit(&nodes[i], policy, &ask(first_fit)) {
                Ok(a) => alloc.push(a),
                Err(m) => {
                    misses += 1;
                    *last_miss.borrow_mut() = Some(m);
                }
            }
            if alloc.len() == k as usize {
                return Some(alloc);
            }
            if misses > EXTRA_TRIES {
                break;
            }
        }
        None
    };
    let naive = || take(&cand, true);
    if naive_only {
        return naive().ok_or(Busy::NoNodesFit);
    }
    let ordered = order_by_hierarchy(nodes, ranks, &cand, k as usize, |i| free_slots(&nodes[i], req) as u64);
    let best = take(&ordered, false);
    // First fit is compared where it is cheap (few nodes) or could win (the best choice spans
    // several top-level groups); inside one group of the tightest level holding the job it
    // cannot spread less across nodes.
    let compare = policy.compare_first_fit && best.as_ref().is_some_and(|b| k <= 4 || !same_top_group(nodes, b));
    let chosen = match (best, compare) {
        (Some(b), true) => match naive() {
            Some(n) if spread_of(nodes, &n) < spread_of(nodes, &b) => Some(n),
            _ => Some(b),
        },
        (b, _) => b.or_else(naive),
    };
    chosen.ok_or_else(|| match last_miss.into_inner() {
        Some(m) => Busy::Node(m),
        None => short_layout(req, c, cand.len()),
    })
}

/// Why `nodes` nodes with `c` free units and the memory wanted, by the counts, do not take
/// them when placed exactly.
pub(crate) fn short_layout(req: &JobRequest, c: u32, nodes: usize) -> Busy {
    Busy::Layout { unit: unit_of(req), slots: c, have: nodes }
}

/// Why fewer than `k` nodes can take `c` of the job's units now, by the cached counts: the
/// first of cores, whole NUMA nodes (large jobs) or memory that too few nodes have.
pub(crate) fn short_per_node(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    k: u32,
    c: u32,
    large: bool,
) -> Busy {
    let need = req.mem.on_node(c);
    let unit = unit_of(req);
    // One scan: nodes with `c` free units, those with `c` untouched cores too, and the most
    // memory free on a node with `c` free units.
    let (mut with_units, mut whole, mut most) = (0usize, 0usize, 0u64);
    for n in nodes.iter().filter(|n| n.state.accepts_work() && free_slots(n, req) >= c) {
        with_units += 1;
        whole += (n.untouched_cores >= c && n.untouched_memory >= need) as usize;
        most = most.max(n.free_memory);
    }
    if with_units < k as usize {
        return Busy::Units { unit, nodes: k, slots: c, have: with_units };
    }
    if req.gpus_per_node > 0 {
        let kind = req.gpu_type.as_deref();
        let with_gpus = nodes
            .iter()
            .filter(|n| {
                n.state.accepts_work() && free_slots(n, req) >= c && n.free_gpu_count_of(kind) >= req.gpus_per_node
            })
            .count();
        if with_gpus < k as usize {
            return Busy::Gpus {
                gpu_type: kind.map(str::to_string),
                nodes: k,
                gpus: req.gpus_per_node,
                unit,
                slots: c,
                have: with_gpus,
            };
        }
    }
    if !req.gres.is_empty() {
        let with_gres = nodes
            .iter()
            .filter(|n| n.state.accepts_work() && free_slots(n, req) >= c && n.gres_fits(&req.gres))
            .count();
        if with_gres < k as usize {
            return Busy::Gres { gres: crate::gres::render(&req.gres), nodes: k, unit, slots: c, have: with_gres };
        }
    }
    if large && !req.threads && whole < k as usize {
        return Busy::WholeNumaNodes { large_cpus: policy.large_parallel_cpus, nodes: k, cores: c, have: whole };
    }
    Busy::NodeMemory { need, unit, slots: c, nodes: k, most }
}

/// "cores" or "PUs": what the job counts.
fn unit_of(req: &JobRequest) -> &'static str {
    if req.threads {
        "PUs"
    } else {
        "cores"
    }
}

fn same_top_group(nodes: &[NodeCapacity], alloc: &Allocation) -> bool {
    let top = |a: &crate::job::NodeAllocation| node_by_id(nodes, a.node_id).and_then(|n| n.location.last().copied());
    alloc.first().is_some_and(|first| top(first).is_some() && alloc.iter().all(|a| top(a) == top(first)))
}

/// Pick the interconnect group (lowest level, then fewest candidates) holding `k` candidates;
/// its candidates come first (fullest first), then the rest grouped by location; ties in the
/// cluster's order. Only the first `k + EXTRA_TRIES + 1` are ever tried, so only those are
/// sorted.
fn order_by_hierarchy(
    nodes: &[NodeCapacity],
    ranks: &NodeRanks,
    cand: &[usize],
    k: usize,
    free: impl Fn(usize) -> u64,
) -> Vec<usize> {
    let levels = cand.iter().map(|&i| nodes[i].location.len()).max().unwrap_or(0);
    let mut chosen: Option<(usize, u32)> = None;
    let mut groups: Vec<u32> = Vec::with_capacity(cand.len());
    for level in 0..levels {
        groups.clear();
        groups.extend(cand.iter().filter_map(|&i| nodes[i].location.get(level).copied()));
        groups.sort_unstable();
        let mut best: Option<(usize, u32)> = None;
        for run in groups.chunk_by(|a, b| a == b) {
            if run.len() >= k && best.is_none_or(|(n, _)| run.len() < n) {
                best = Some((run.len(), run[0]));
            }
        }
        if let Some((_, g)) = best {
            chosen = Some((level, g));
            break;
        }
    }
    // Location from the top level down, packed into one integer (top 4 levels).
    let packed =
        |i: usize| -> u128 { nodes[i].location.iter().rev().take(4).fold(0u128, |acc, &g| (acc << 32) | g as u128) };
    let mut keyed: Vec<(bool, u128, u64, u32, usize)> = cand
        .iter()
        .map(|&i| {
            let in_group = chosen.is_some_and(|(l, g)| nodes[i].location.get(l) == Some(&g));
            (!in_group, packed(i), free(i), ranks.rank(i), i)
        })
        .collect();
    let want = (k + EXTRA_TRIES + 1).min(keyed.len());
    if want > 0 && want < keyed.len() {
        keyed.select_nth_unstable(want - 1);
        keyed.truncate(want);
    }
    keyed.sort_unstable();
    keyed.into_iter().map(|t| t.4).collect()
}

fn spread_of(nodes: &[NodeCapacity], alloc: &Allocation) -> u64 {
    spread(alloc.iter().filter_map(|a| node_by_id(nodes, a.node_id).map(|n| (n, a))))
}

/// The node with id `id` (nodes are kept in id order).
pub fn node_by_id(nodes: &[NodeCapacity], id: crate::NodeId) -> Option<&NodeCapacity> {
    node_position(nodes, id).map(|i| &nodes[i])
}

/// The position of the node with id `id` (nodes are kept in id order).
pub(crate) fn node_position(nodes: &[NodeCapacity], id: crate::NodeId) -> Option<usize> {
    match nodes.binary_search_by_key(&id, |n| n.id) {
        Ok(i) => Some(i),
        Err(_) => nodes.iter().position(|n| n.id == id),
    }
}

/// `cores` units in chunks of `chunk`: one node if any can (fullest first), else chunks
/// gathered over the tightest interconnect group, emptiest nodes first (fewest nodes).
fn total(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    index: Option<&NodeIndex>,
    ranks: &NodeRanks,
    req: &JobRequest,
    cores: u32,
    chunk: u32,
) -> Result<Allocation, Busy> {
    let index = index.filter(|_| counts_free_cores(req) && cores > 0);
    let large = req.is_large(policy);
    let single_need = req.mem.on_node(cores);
    let single = |i: &usize| {
        let n = &nodes[*i];
        n.state.accepts_work() && free_slots(n, req) >= cores && n.free_memory >= single_need
    };
    // The EXTRA_TRIES fullest nodes that can hold it alone, by (free units, rank).
    let singles: Vec<usize> = match index {
        Some(ix) => ix.from(Count::FreeCores, cores).filter(single).take(EXTRA_TRIES).collect(),
        None => {
            let mut singles: Vec<usize> = ranks.positions().filter(single).collect();
            first_sorted(&mut singles, EXTRA_TRIES, |&i| (free_slots(&nodes[i], req), ranks.rank(i)));
            singles
        }
    };
    let ask = NodeAsk { slots: cores, req, large, first_fit: false };
    for &i in &singles {
        if let Ok(a) = fit(&nodes[i], policy, &ask) {
            return Ok(vec![a]);
        }
    }
    let chunk = chunk.max(1);
    let chunk_need = req.mem.on_node(chunk);
    let usable = |n: &NodeCapacity| n.state.accepts_work() && n.free_memory >= chunk_need;
    let room = |i: usize| (free_slots(&nodes[i], req) / chunk * chunk) as u64;
    // Without an interconnect hierarchy the order is simply the emptiest first (by room, then
    // rank): the index gives it directly, stopping once enough nodes are found.
    let flat = nodes.iter().all(|n| n.location.is_empty());
    let ordered = match index.filter(|_| flat) {
        Some(ix) => match emptiest_first(ix, chunk, cores, |i| usable(&nodes[i]), room) {
            Ok(ordered) => ordered,
            Err(have) => return Err(short_total(nodes, req, cores, chunk, have)),
        },
        None => {
            let cand: Vec<usize> = match index {
                Some(ix) => {
                    let mut cand = ix.all_from(Count::FreeCores, chunk);
                    cand.retain(|&i| usable(&nodes[i]));
                    cand
                }
                None => {
                    ranks.positions().filter(|&i| free_slots(&nodes[i], req) >= chunk && usable(&nodes[i])).collect()
                }
            };
            let have: u64 = cand.iter().map(|&i| room(i)).sum();
            if have < cores as u64 {
                return Err(short_total(nodes, req, cores, chunk, have));
            }
            // Nodes needed if the emptiest are used: the group to look for must hold that many.
            let k = fewest_holding(cand.iter().map(|&i| room(i)), cores as u64);
            let mut ordered = order_by_hierarchy(nodes, ranks, &cand, k, |i| u64::MAX - room(i));
            if flat {
                ordered.sort_by_key(|&i| (std::cmp::Reverse(room(i)), ranks.rank(i)));
            }
            ordered
        }
    };
    let mut alloc = Vec::new();
    let mut left = cores;
    // The first miss: the nodes are tried in the same order however they were found.
    let mut first_miss = None;
    for i in ordered {
        if left == 0 {
            break;
        }
        // The node's whole room first; if that does not fit (memory, NUMA layout, subnode
        // properties the cached counts do not see), the largest chunk multiple that does,
        // found by bisection (a few fits, not one per size).
        let mut take = (room(i) as u32).min(left);
        if let MemRequest::PerCpu(per) = req.mem {
            let by_mem = nodes[i].free_memory.checked_div(per).unwrap_or(u64::MAX).min(u32::MAX as u64) as u32;
            take = take.min(by_mem / chunk * chunk);
        }
        let try_fit =
            |units: u32| fit(&nodes[i], policy, &NodeAsk { slots: units * chunk, req, large, first_fit: false });
        let (mut lo, mut hi) = (0u32, take / chunk);
        let mut best = None;
        if hi > 0 {
            match try_fit(hi) {
                Ok(a) => best = Some((hi, a)),
                Err(m) => {
                    first_miss = first_miss.or(Some(m));
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        match try_fit(mid) {
                            Ok(a) => {
                                lo = mid;
                                best = Some((mid, a));
                            }
                            Err(_) => hi = mid,
                        }
                    }
                }
            }
        }
        if let Some((units, a)) = best {
            left -= units * chunk;
            alloc.push(a);
        }
    }
    if left == 0 {
        return Ok(alloc);
    }
    Err(short_spread(policy, req, cores, cores - left, first_miss))
}

/// Why the nodes free now take only `given` of `cores` units spread over them, `miss` being
/// the first node's answer that fell short.
pub(crate) fn short_spread(
    policy: &PlacementPolicy,
    req: &JobRequest,
    cores: u32,
    given: u32,
    miss: Option<Miss>,
) -> Busy {
    let unit = unit_of(req);
    if req.is_large(policy) {
        return Busy::SpreadWholeNuma { large_cpus: policy.large_parallel_cpus, cores, unit, given };
    }
    Busy::Spread { unit, cores, given, miss }
}

/// Why a request does not fit what is free now when the free count alone shows it: fewer free
/// units (as [`free_slots`] counts them: whole cores for a request of cores) than the job takes
/// in all. The words placement gives when it finds the same by trying ([`short_per_node`],
/// [`short_total`]), so that a job rejected by the count (a pass's shortcut for requests already
/// placed once) reads as one placed. None when the counts do show room (the caller's count
/// differs): the caller keeps its own words.
pub(crate) fn short_by_count(nodes: &[NodeCapacity], policy: &PlacementPolicy, req: &JobRequest) -> Option<Busy> {
    let busy = match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => {
            let c = per_node_slots_on(nodes, req, cores_per_node);
            short_per_node(nodes, policy, req, k, c, is_large(policy, req, k, c))
        }
        Shape::Total { cores, chunk } => short_total(nodes, req, cores, chunk.max(1), 0),
    };
    matches!(busy, Busy::Units { .. } | Busy::TotalUnits { .. }).then_some(busy)
}

/// Why the nodes free now have room for fewer than `cores` units in chunks of `chunk`, `have`
/// counting only nodes with the memory a chunk needs: cores, or memory beside them.
pub(crate) fn short_total(nodes: &[NodeCapacity], req: &JobRequest, cores: u32, chunk: u32, have: u64) -> Busy {
    let unit = unit_of(req);
    let (mut free, mut most) = (0u64, 0u64);
    for n in nodes.iter().filter(|n| n.state.accepts_work()) {
        let room = free_slots(n, req) / chunk * chunk;
        free += room as u64;
        if room > 0 {
            most = most.max(n.free_memory);
        }
    }
    if free < cores as u64 {
        return Busy::TotalUnits { unit, cores, chunk, free };
    }
    let need = req.mem.on_node(chunk);
    Busy::TotalMemory { need, unit, chunk, free, have, most }
}

/// Keep the first `n` of `v` in the order of `key` (distinct for distinct items), sorted: what
/// sorting all of `v` and truncating gives, without sorting the rest.
fn first_sorted<T, K: Ord>(v: &mut Vec<T>, n: usize, key: impl Fn(&T) -> K) {
    if n == 0 {
        v.clear();
        return;
    }
    if v.len() > n {
        v.select_nth_unstable_by_key(n - 1, &key);
        v.truncate(n);
    }
    v.sort_unstable_by_key(key);
}

/// How many of `rooms`, largest first, it takes to reach `cores` (all of them if they do not).
fn fewest_holding(rooms: impl Iterator<Item = u64>, cores: u64) -> usize {
    // Rooms are at most a node's units: count them by size rather than sorting them.
    let mut by_size: std::collections::BTreeMap<u64, usize> = Default::default();
    for r in rooms {
        *by_size.entry(r).or_default() += 1;
    }
    let (mut sum, mut k) = (0u64, 0usize);
    for (&r, &count) in by_size.iter().rev() {
        if sum >= cores {
            break;
        }
        let take = if r == 0 { count } else { ((cores - sum).div_ceil(r) as usize).min(count) };
        sum += r * take as u64;
        k += take;
    }
    k
}

/// The nodes `total` spreads a job of `cores` units over when the cluster has no hierarchy:
/// the candidates (at least `chunk` free cores, `usable`) by room descending then rank,
/// as many as are needed to reach `cores` and EXTRA_TRIES + 1 more. Err (their room) if all of
/// them together have less room than `cores`.
fn emptiest_first(
    ix: &NodeIndex,
    chunk: u32,
    cores: u32,
    usable: impl Fn(usize) -> bool,
    room: impl Fn(usize) -> u64,
) -> Result<Vec<usize>, u64> {
    let mut ordered = vec![];
    let (mut have, mut want) = (0u64, None::<usize>);
    let mut group = vec![];
    // Rooms are multiples of `chunk`: nodes of free counts r..r + chunk share room r.
    let top = ix.top(Count::FreeCores);
    let mut r = top / chunk * chunk;
    while r >= chunk && want.is_none_or(|w| ordered.len() < w) {
        group.clear();
        for f in r..=top.min(r.saturating_add(chunk - 1)) {
            group.extend(ix.with(Count::FreeCores, f).filter(|&i| usable(i)));
        }
        if chunk > 1 {
            group.sort_unstable_by_key(|&i| ix.ranks().rank(i));
        }
        for &i in &group {
            if want.is_some_and(|w| ordered.len() >= w) {
                break;
            }
            ordered.push(i);
            have += room(i);
            if want.is_none() && have >= cores as u64 {
                want = Some(ordered.len() + EXTRA_TRIES + 1);
            }
        }
        r -= chunk;
    }
    if have < cores as u64 {
        return Err(have);
    }
    Ok(ordered)
}

/// Could `req` ever run on the nodes `counts` selects, if they were empty (admin settings
/// such as system CPUs and subnode properties and states kept)? What the scheduler asks: a job
/// only drained or offline subnodes could hold waits like one for a drained node.
pub fn feasible(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    counts: impl Fn(&NodeCapacity) -> bool,
) -> Result<(), Never> {
    feasible_with(nodes, policy, req, counts, false)
}

/// `feasible` with the subnodes of those nodes up too: what a submission is judged by. Drained,
/// offline or down resources are temporary, so a job only they could hold is taken and waits.
pub fn feasible_when_up(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    counts: impl Fn(&NodeCapacity) -> bool,
) -> Result<(), Never> {
    feasible_with(nodes, policy, req, counts, true)
}

fn feasible_with(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    counts: impl Fn(&NodeCapacity) -> bool,
    subnodes_up: bool,
) -> Result<(), Never> {
    let usable: Vec<&NodeCapacity> = nodes.iter().filter(|n| counts(n)).collect();
    if usable.is_empty() {
        return Err(Never::NoNodeUp);
    }
    let large = match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => {
            is_large(policy, req, k, per_node_slots_on(nodes, req, cores_per_node))
        }
        Shape::Total { .. } => req.is_large(policy),
    };
    // Nodes of the same hardware and settings answer alike: fit each kind once.
    let mut kinds: Vec<(&NodeCapacity, NodeCapacity, usize)> = vec![];
    for n in &usable {
        // Cheap tests first: comparing two empty sets still costs a memcmp per node.
        let same_set = |a: &crate::CpuSet, b: &crate::CpuSet| (a.is_empty() && b.is_empty()) || a == b;
        match kinds.iter_mut().find(|(r, _, _)| {
            std::sync::Arc::ptr_eq(&r.topology, &n.topology)
                && same_set(&r.system_pus, &n.system_pus)
                && ((r.subnodes.is_empty() && n.subnodes.is_empty()) || r.subnodes == n.subnodes)
                && r.gres_total == n.gres_total
        }) {
            Some(k) => k.2 += 1,
            None => {
                let mut p = n.pristine();
                p.state = crate::node::NodeState::Up;
                if subnodes_up {
                    p.subnodes.iter_mut().for_each(|s| s.state = crate::node::SubnodeState::Up);
                }
                kinds.push((n, p, 1));
            }
        }
    }
    let check = |slots: u32| -> (usize, Option<Miss>) {
        let ask = NodeAsk { slots, req, large, first_fit: false };
        let mut ok = 0;
        let mut miss = None;
        for (_, p, count) in &kinds {
            match fit(p, policy, &ask) {
                Ok(_) => ok += count,
                // On an empty node a miss is for good: told as what the node has.
                Err(m) => miss = Some(m.on_empty()),
            }
        }
        (ok, miss)
    };
    // Sizes: the largest node says how much to ask for. Properties' reasons carry their fix.
    let advice = req.properties.is_empty().then(|| SizeAdvice {
        largest: usable.iter().max_by_key(|n| (n.topology.core_count(), n.topology.memory_bytes())).map(|n| NodeSize {
            cores: n.topology.core_count(),
            pus: n.topology.pu_count(),
            memory: n.topology.memory_bytes(),
        }),
    });
    let up = usable.len();
    match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => {
            let (ok, miss) = check(per_node_slots_on(nodes, req, cores_per_node));
            match miss {
                _ if ok >= k as usize => Ok(()),
                // Every node up could hold its part: there are too few of them.
                None => Err(Never::TooFewNodes { wanted: k, up }),
                Some(miss) => Err(Never::NoNodeHolds { wanted: k, ok, up, miss, advice }),
            }
        }
        Shape::Total { cores, chunk } => {
            if check(cores).0 > 0 {
                return Ok(());
            }
            // Spread over nodes: each kind's largest multiple of `chunk` that fits alone.
            let chunk = chunk.max(1);
            let mut total = 0u64;
            let mut last = None;
            for (_, p, count) in &kinds {
                let ask = |s| NodeAsk { slots: s, req, large, first_fit: false };
                let most = (free_slots(p, req) / chunk * chunk).min(cores);
                let fits = (1..=most / chunk).rev().map(|m| m * chunk).find(|&s| match fit(p, policy, &ask(s)) {
                    Ok(_) => true,
                    Err(m) => {
                        last = Some(m.on_empty());
                        false
                    }
                });
                total += fits.unwrap_or(0) as u64 * *count as u64;
            }
            let unit = unit_of(req);
            match last {
                _ if total >= cores as u64 => Ok(()),
                None => Err(Never::TooFewUnits { unit, cores, up, total }),
                Some(miss) => Err(Never::TooLarge { unit, cores, up, total, miss, advice }),
            }
        }
    }
}
