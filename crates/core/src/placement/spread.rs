//! The spread of a placement over the machine's hierarchy: interconnect groups (switches,
//! racks, building blocks), nodes, packages, NUMA nodes.
//!
//! `spread = Σ over each level of (distinct parts used at that level − 1)`, levels being the
//! interconnect tree's levels, nodes, and per node its packages and NUMA nodes. A job on one
//! NUMA node has spread 0; every extra branch it crosses at any level adds one. Placement
//! prefers the lowest.

use crate::job::NodeAllocation;
use crate::node::NodeCapacity;
use std::collections::HashSet;

/// Spread of an allocation; `node_of` finds each part's node.
pub fn spread<'a>(parts: impl IntoIterator<Item = (&'a NodeCapacity, &'a NodeAllocation)>) -> u64 {
    let parts: Vec<_> = parts.into_iter().collect();
    if parts.is_empty() {
        return 0;
    }
    let levels = parts.iter().map(|(n, _)| n.location.len()).max().unwrap_or(0);
    let mut total = 0u64;
    for level in 0..levels {
        let groups: HashSet<Option<u32>> = parts.iter().map(|(n, _)| n.location.get(level).copied()).collect();
        total += groups.len() as u64 - 1;
    }
    total += parts.len() as u64 - 1;
    for (node, alloc) in &parts {
        let (packages, numas) = within_node(node, alloc);
        total += packages.saturating_sub(1) + numas.saturating_sub(1);
    }
    total
}

/// Packages and NUMA nodes an allocation's CPUs touch on its node.
pub fn within_node(node: &NodeCapacity, alloc: &NodeAllocation) -> (u64, u64) {
    let topo = &node.topology;
    // Flags, not hash sets: this runs for every part of every compared placement.
    let mut packages = vec![false; topo.packages.len()];
    let mut numas = vec![false; topo.numa_nodes.len() + 1];
    for c in &topo.cores {
        if c.pus.iter().any(|&p| alloc.cpus.contains(p)) {
            packages[c.package] = true;
            numas[c.numa.unwrap_or(topo.numa_nodes.len())] = true;
        }
    }
    let count = |v: &[bool]| v.iter().filter(|&&b| b).count() as u64;
    (count(&packages), count(&numas))
}
