//! The placement across nodes as it was before nodes were indexed (commit 5bcbed6, verbatim but
//! for imports): a full scan of the nodes and full sorts. The indexed placement must decide
//! exactly as this does. Reasons are worded by the same functions (issue 17 item 10 reworded
//! them), so that only decisions are compared twice. One change since (issue 17 item 5): a
//! job's nodes are listed in the cluster's node order, here (the test clusters are named n0,
//! n1, ... in id order, so natural name order is id order) by id.
#![allow(dead_code)]

use crate::job::{Allocation, Shape};
use crate::node::NodeCapacity;
use crate::placement::cluster::{feasible, short_per_node, short_spread, short_total, Busy, Placement};
use crate::placement::fit::{fit, NodeAsk};
use crate::placement::spread::spread;
use crate::placement::{JobRequest, MemRequest, Miss, PlacementPolicy};

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

/// Place `req` on what is free now. `nodes` must be in id order.
pub fn place(nodes: &[NodeCapacity], policy: &PlacementPolicy, req: &JobRequest) -> Placement {
    let found = match req.shape {
        Shape::PerNode { nodes: k, cores_per_node } => per_node(nodes, policy, req, k, cores_per_node, false),
        Shape::Total { cores, chunk } => total(nodes, policy, req, cores, chunk),
    };
    match found {
        Ok(mut alloc) => {
            alloc.sort_by_key(|a| a.node_id);
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
fn per_node(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    k: u32,
    c: u32,
    naive_only: bool,
) -> Result<Allocation, Busy> {
    let c = per_node_slots_on(nodes, req, c);
    let need = req.mem.on_node(c);
    let large = is_large(policy, req, k, c);
    let cand: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let n = &nodes[i];
            n.state.accepts_work()
                && free_slots(n, req) >= c
                && n.free_memory >= need
                // A large job needs NUMA nodes nobody touches: count only those.
                && (!large || req.threads || (n.untouched_cores >= c && n.untouched_memory >= need))
        })
        .collect();
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
    let ordered = order_by_hierarchy(nodes, &cand, k as usize, |i| free_slots(&nodes[i], req) as u64);
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
        None => crate::placement::cluster::short_layout(req, c, cand.len()),
    })
}

fn same_top_group(nodes: &[NodeCapacity], alloc: &Allocation) -> bool {
    let top = |a: &crate::job::NodeAllocation| node_by_id(nodes, a.node_id).and_then(|n| n.location.last().copied());
    alloc.first().is_some_and(|first| top(first).is_some() && alloc.iter().all(|a| top(a) == top(first)))
}

/// Pick the interconnect group (lowest level, then fewest candidates) holding `k` candidates;
/// its candidates come first (fullest first), then the rest grouped by location. Only the
/// first `k + EXTRA_TRIES + 1` are ever tried, so only those are sorted.
fn order_by_hierarchy(nodes: &[NodeCapacity], cand: &[usize], k: usize, free: impl Fn(usize) -> u64) -> Vec<usize> {
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
    let mut keyed: Vec<(bool, u128, u64, usize)> = cand
        .iter()
        .map(|&i| {
            let in_group = chosen.is_some_and(|(l, g)| nodes[i].location.get(l) == Some(&g));
            (!in_group, packed(i), free(i), i)
        })
        .collect();
    let want = (k + EXTRA_TRIES + 1).min(keyed.len());
    if want > 0 && want < keyed.len() {
        keyed.select_nth_unstable(want - 1);
        keyed.truncate(want);
    }
    keyed.sort_unstable();
    keyed.into_iter().map(|t| t.3).collect()
}

fn spread_of(nodes: &[NodeCapacity], alloc: &Allocation) -> u64 {
    spread(alloc.iter().filter_map(|a| node_by_id(nodes, a.node_id).map(|n| (n, a))))
}

/// The node with id `id` (nodes are kept in id order).
pub fn node_by_id(nodes: &[NodeCapacity], id: crate::NodeId) -> Option<&NodeCapacity> {
    match nodes.binary_search_by_key(&id, |n| n.id) {
        Ok(i) => Some(&nodes[i]),
        Err(_) => nodes.iter().find(|n| n.id == id),
    }
}

/// `cores` units in chunks of `chunk`: one node if any can (fullest first), else chunks
/// gathered over the tightest interconnect group, emptiest nodes first (fewest nodes).
fn total(
    nodes: &[NodeCapacity],
    policy: &PlacementPolicy,
    req: &JobRequest,
    cores: u32,
    chunk: u32,
) -> Result<Allocation, Busy> {
    let large = req.is_large(policy);
    let single_need = req.mem.on_node(cores);
    let mut singles: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let n = &nodes[i];
            n.state.accepts_work() && free_slots(n, req) >= cores && n.free_memory >= single_need
        })
        .collect();
    singles.sort_by_key(|&i| (free_slots(&nodes[i], req), i));
    let ask = NodeAsk { slots: cores, req, large, first_fit: false };
    for &i in singles.iter().take(EXTRA_TRIES) {
        if let Ok(a) = fit(&nodes[i], policy, &ask) {
            return Ok(vec![a]);
        }
    }
    let chunk = chunk.max(1);
    let cand: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let n = &nodes[i];
            n.state.accepts_work() && free_slots(n, req) >= chunk && n.free_memory >= req.mem.on_node(chunk)
        })
        .collect();
    let room = |i: usize| (free_slots(&nodes[i], req) / chunk * chunk) as u64;
    let have: u64 = cand.iter().map(|&i| room(i)).sum();
    if have < cores as u64 {
        return Err(short_total(nodes, req, cores, chunk, have));
    }
    // Nodes needed if the emptiest are used: the group to look for must hold that many.
    let mut rooms: Vec<u64> = cand.iter().map(|&i| room(i)).collect();
    rooms.sort_unstable_by(|a, b| b.cmp(a));
    let (mut sum, mut k) = (0u64, 0usize);
    while sum < cores as u64 && k < rooms.len() {
        sum += rooms[k];
        k += 1;
    }
    let mut ordered = order_by_hierarchy(nodes, &cand, k, |i| u64::MAX - room(i));
    if nodes.iter().all(|n| n.location.is_empty()) {
        ordered.sort_by_key(|&i| (std::cmp::Reverse(room(i)), i));
    }
    let mut alloc = Vec::new();
    let mut left = cores;
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
        Ok(alloc)
    } else {
        Err(short_spread(policy, req, cores, cores - left, first_miss))
    }
}
