//! Properties of GPU placement (issue 20) on a cluster of the hand-made GPU machines (two of
//! each of tests/fixtures/gpu/*.json: 4 A100 PCIe in NVLink pairs, one pair a package; 8 A100
//! SXM, two a NUMA node, a package's four linked), with random starts and ends of single- and
//! multi-node GPU jobs, typed or not, and CPU-only jobs beside them:
//!
//! - a GPU is never given twice: every GPU held by at most one live job, the nodes' books
//!   (`gpu_free`, `free_gpu_count`) equal to the live jobs' GPUs after every step;
//! - on each node of a job, its cores are local to its GPUs there whenever that node had a
//!   NUMA node with the GPUs and the cores free (and not held whole by a large parallel job,
//!   whose NUMA nodes nobody else uses; such a job's own part is not checked: it takes whole
//!   unshared NUMA nodes first, which may be far from its GPUs);
//! - a multi-GPU part is inside one link group whenever the node had a group with enough free.
//!
//! (The same on an emulated 8-GPU node: `placement::tests::gpu`; per rank: `step::tests`.)

use berth_core::job::{Allocation, Shape};
use berth_core::node::NodeCapacity;
use berth_core::placement::cluster::{place, Placement};
use berth_core::placement::{JobRequest, MemRequest, PlacementPolicy};
use berth_core::topology::Topology;
use berth_core::{CpuSet, NodeId};
use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;

fn machine(stem: &str) -> Arc<Topology> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/gpu/{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Arc::new(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn cluster() -> Vec<NodeCapacity> {
    let (four, eight) = (machine("gpu4-2p-nvlink-pairs"), machine("gpu8-2p4n-nvlink-quads"));
    [&four, &eight, &four, &eight]
        .iter()
        .enumerate()
        .map(|(i, t)| NodeCapacity::new(NodeId(i as u32), format!("n{i}"), Arc::clone(t)))
        .collect()
}

fn local(n: &NodeCapacity, gpus: &[u32]) -> CpuSet {
    let mut s = CpuSet::new();
    for &g in gpus {
        s.union_with(&n.topology.gpus[g as usize].cpus);
    }
    s
}

/// A NUMA node of `n` with `g` free GPUs and `c` free whole cores, not held whole by a large
/// parallel job (`numa_exclusive`: nobody else may use its free cores).
fn room_near(n: &NodeCapacity, c: u32, g: u32) -> bool {
    n.topology.numa_nodes.iter().enumerate().filter(|(i, _)| !n.numa_exclusive[*i]).any(|(i, m)| {
        let gpus =
            n.topology.gpus.iter().filter(|x| x.numa == Some(m.os_index) && n.gpu_free[x.index as usize]).count();
        let cores = n
            .topology
            .cores
            .iter()
            .filter(|core| core.numa == Some(i) && core.pus.iter().all(|&p| n.free_pus.contains(p)))
            .count();
        gpus as u32 >= g && cores as u32 >= c
    })
}

fn linked_room(n: &NodeCapacity, g: u32) -> bool {
    let t = &n.topology;
    g > 1
        && t.gpus.iter().any(|x| {
            x.link_group.is_some()
                && t.gpus.iter().filter(|h| h.link_group == x.link_group && n.gpu_free[h.index as usize]).count() as u32
                    >= g
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn gpus_never_twice_cores_near_links_kept(
        ops in prop::collection::vec((0u8..5, 1u32..3, 1u32..9, 0u32..5, any::<bool>()), 1..30)
    ) {
        let mut nodes = cluster();
        let mut held: Vec<Allocation> = vec![];
        for (kind, k, cores, gpus, typed) in ops {
            if kind == 0 && !held.is_empty() {
                let a = held.remove(cores as usize % held.len());
                for part in &a {
                    nodes[part.node_id.0 as usize].release(part);
                }
            } else {
                let mut req = JobRequest {
                    gpus_per_node: gpus,
                    mem: MemRequest::PerNode(1 << 30),
                    ..JobRequest::simple(Shape::PerNode { nodes: k, cores_per_node: cores }, 0)
                };
                if typed && gpus > 0 {
                    req.gpu_type = Some("a100".into());
                }
                // What each node allowed before the placement.
                let near: Vec<bool> = nodes.iter().map(|n| gpus > 0 && room_near(n, cores, gpus)).collect();
                let linked: Vec<bool> = nodes.iter().map(|n| linked_room(n, gpus)).collect();
                if let Placement::Now(a) = place(&nodes, &PlacementPolicy::default(), &req) {
                    prop_assert_eq!(a.len() as u32, k);
                    for part in &a {
                        let i = part.node_id.0 as usize;
                        let n = &nodes[i];
                        prop_assert_eq!(part.gpus.len() as u32, gpus);
                        prop_assert!(part.gpus.iter().all(|&g| n.gpu_free[g as usize]), "a GPU given twice: {:?} on {}", part.gpus, n.name);
                        // A large parallel job's part (whole NUMA nodes nobody else uses,
                        // docs/placement.md) keeps to that rule first: its GPUs' NUMA node
                        // may be shared, so "the node allows it" is not the room above.
                        if near[i] && part.exclusive_numa.is_empty() {
                            prop_assert!(part.cpus.is_subset_of(&local(n, &part.gpus)), "cores {} not near GPUs {:?} on {}", part.cpus, part.gpus, n.name);
                        }
                        if linked[i] {
                            let g0 = n.topology.gpus[part.gpus[0] as usize].link_group;
                            prop_assert!(part.gpus.iter().all(|&g| n.topology.gpus[g as usize].link_group == g0), "split GPUs {:?} on {}", part.gpus, n.name);
                        }
                    }
                    for part in &a {
                        nodes[part.node_id.0 as usize].claim(part);
                    }
                    held.push(a);
                }
            }
            // The books: every GPU held by at most one live job, the rest free.
            for n in &nodes {
                let i = n.id.0;
                let mut owner = vec![0u32; n.topology.gpus.len()];
                for part in held.iter().flatten().filter(|p| p.node_id.0 == i) {
                    for &g in &part.gpus {
                        owner[g as usize] += 1;
                    }
                }
                prop_assert!(owner.iter().all(|&c| c <= 1), "{:?} on {}", owner, n.name);
                for (g, &c) in owner.iter().enumerate() {
                    prop_assert_eq!(n.gpu_free[g], c == 0);
                }
                prop_assert_eq!(n.free_gpu_count as usize, owner.iter().filter(|&&c| c == 0).count());
            }
        }
    }
}
