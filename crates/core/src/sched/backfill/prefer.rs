//! Placement preferring some resources over others ([`Machine::place_preferring`]) on the
//! topology-aware cluster, with berth's placement unchanged: the preference is expressed by
//! which nodes and PUs the placement is shown, never by bending its rules.

use super::{Fit, Machine};
use crate::job::{Allocation, NodeAllocation};
use crate::placement::JobRequest;
use crate::sched::ClusterState;
use crate::{CpuSet, NodeId};

/// [`Machine::place_preferring`] for [`ClusterState`], as the simulator's core pool does it
/// by core: berth's own placement, shown only part of the cluster (so every topology rule
/// holds), the least of what is free beside `prefer`'s PUs that lets it fit.
///
/// The part: the nodes `prefer` touches (`D`), then other nodes with free PUs, in the
/// cluster's node order, until they have twice the job's CPUs free. Its free PUs outside `prefer`, `D`'s first, are
/// offered in that order: none (only `prefer`'s), then the fewest first ones that fit: from as
/// many as the job's CPUs lack (by count: fewer cannot fit), galloping then bisecting (a few
/// placements on copies of the part). When even all of them do not fit, the plain placement
/// on the whole cluster, which fits whenever `place` does.
pub fn place_preferring_on_cluster(state: &ClusterState, prefer: &[&Allocation], req: &JobRequest) -> Fit<Allocation> {
    if prefer.is_empty() {
        return state.place(req);
    }
    let position = |id: NodeId| state.position(id);
    // Per node position of `D`: `prefer`'s PUs there.
    let mut kept: Vec<(usize, CpuSet)> = vec![];
    for na in prefer.iter().flat_map(|a| a.iter()) {
        let Some(i) = position(na.node_id) else { continue };
        match kept.iter_mut().find(|k| k.0 == i) {
            Some(k) => k.1.union_with(&na.cpus),
            None => kept.push((i, na.cpus.clone())),
        }
    }
    let ranks = state.ranks();
    let mut in_d: Vec<usize> = kept.iter().map(|k| k.0).collect();
    in_d.sort_unstable();
    // `D` in the cluster's order.
    kept.sort_unstable_by_key(|k| ranks.rank(k.0));
    // The PUs offered, in order: (node position, PU).
    let mut offers: Vec<(usize, u32)> = vec![];
    for (i, pus) in &kept {
        offers.extend(state.nodes()[*i].free_pus.iter().filter(|&pu| !pus.contains(pu)).map(|pu| (*i, pu)));
    }
    let (mut others, enough) = (0u64, req.total_cpus().saturating_mul(2));
    for i in ranks.positions() {
        let node = &state.nodes()[i];
        if others >= enough {
            break;
        }
        if node.free_pus.is_empty() || in_d.binary_search(&i).is_ok() {
            continue;
        }
        offers.extend(node.free_pus.iter().map(|pu| (i, pu)));
        others += node.free_pus.len() as u64;
    }
    let mut positions: Vec<usize> = offers.iter().map(|o| o.0).chain(kept.iter().map(|k| k.0)).collect();
    positions.sort_unstable();
    positions.dedup();
    // Copies outside any index (placement scans them, few as they are): the whole cluster's
    // index is untouched.
    // Their nodes keep their places in the cluster's order (so the part goes by it).
    let part = ClusterState::from_parts(
        positions.iter().map(|&i| state.nodes()[i].clone()).collect(),
        state.policy.clone(),
        state.licenses.clone(),
    );
    // Placement on the part with only the first `m` offers (and `prefer`'s PUs) free.
    let trial = |m: usize| -> Option<Allocation> {
        let mut taken: Vec<(usize, CpuSet)> = vec![];
        for &(i, pu) in &offers[m..] {
            match taken.last_mut() {
                Some(t) if t.0 == i => t.1.insert(pu),
                _ => taken.push((i, CpuSet::from_iter([pu]))),
            }
        }
        let mut copy = part.clone();
        let take: Allocation =
            taken.into_iter().map(|(i, pus)| pus_only(state.nodes()[i].id, &state.nodes()[i].name, pus)).collect();
        copy.claim(&take);
        match copy.place(req) {
            Fit::Now(alloc) => Some(alloc),
            _ => None,
        }
    };
    if let Some(alloc) = trial(0) {
        return Fit::Now(alloc);
    }
    let plain = state.place(req);
    if !matches!(plain, Fit::Now(_)) || offers.is_empty() {
        return plain;
    }
    // PUs the job needs beyond `prefer`'s free ones: fewer offers cannot fit.
    let pus_per_core = kept.first().map_or(1, |(i, _)| {
        let topo = &state.nodes()[*i].topology;
        (topo.pu_count() as u64).div_ceil((topo.core_count() as u64).max(1)).max(1)
    });
    let need = req.total_cpus().saturating_mul(if req.threads { 1 } else { pus_per_core });
    let have: u64 = kept
        .iter()
        .map(|(i, pus)| pus.iter().filter(|&pu| state.nodes()[*i].free_pus.contains(pu)).count() as u64)
        .sum();
    let first = usize::try_from(need.saturating_sub(have)).unwrap_or(usize::MAX).clamp(1, offers.len());
    // Gallop from `first` to a fit (`lo`: the last count known not to fit), then bisect.
    let (mut lo, mut m, mut step) = (first - 1, first, 1);
    let (mut hi, mut best) = loop {
        if let Some(alloc) = trial(m) {
            break (m, alloc);
        }
        if m == offers.len() {
            return plain;
        }
        lo = m;
        m = (m + step).min(offers.len());
        step *= 2;
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match trial(mid) {
            Some(alloc) => (hi, best) = (mid, alloc),
            None => lo = mid,
        }
    }
    Fit::Now(best)
}

/// An allocation of PUs alone (no memory): to take them off what placement sees.
fn pus_only(node_id: NodeId, node: &str, cpus: CpuSet) -> NodeAllocation {
    NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id,
        node: node.to_string(),
        cpus,
        cores: 0,
        mems: CpuSet::new(),
        memory_bytes: 0,
        numa_memory: vec![],
        exclusive_numa: CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: vec![],
    }
}
