//! The index of nodes by free cores must never change a decision: placements through the
//! index (kept up to date by `ClusterState::claim`/`release`, or noticed stale after direct
//! changes) agree with the placement as it was before the index (`reference`, a full scan with
//! full sorts), on random clusters after random starts, ends, direct changes and copies.

mod gpu;
mod reasons;
mod reference;

use super::cluster::{place_scanning, place_with, Placement};
use super::{JobRequest, MemRequest, PlacementPolicy};
use crate::binding::BindingStrategy;
use crate::job::{Allocation, Shape};
use crate::node::{NodeCapacity, NodeState};
use crate::sched::backfill::{Fit, Machine};
use crate::sched::{self, ClusterState};
use crate::topology::Topology;
use crate::{CpuSet, NodeId};
use proptest::prelude::*;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// Node kinds a cluster mixes (so free-core counts differ in range): 8 cores; 2 NUMA x 4 cores
/// x 2 PUs per package (16 cores, SMT); 16 cores in one NUMA node; 12 cores.
fn topologies() -> Vec<Arc<Topology>> {
    vec![
        Arc::new(Topology::uniform(2, 1, 4, 1, 1024 * MIB)),
        Arc::new(Topology::uniform(2, 2, 4, 2, 512 * MIB)),
        Arc::new(Topology::uniform(1, 1, 16, 1, 4096 * MIB)),
        Arc::new(Topology::uniform(2, 1, 6, 1, 2048 * MIB)),
    ]
}

#[derive(Debug, Clone)]
struct ClusterSpec {
    /// Topology (index into `topologies`) per node.
    kinds: Vec<usize>,
    /// 0: no interconnect hierarchy; 1: leaves of 3 nodes under spines of 2 leaves; 2: a
    /// hierarchy on some nodes only.
    hierarchy: u8,
    large_parallel_cpus: u32,
    compare_first_fit: bool,
}

fn cluster_spec() -> impl Strategy<Value = ClusterSpec> {
    (prop::collection::vec(0usize..4, 1..=24), 0u8..3, prop_oneof![Just(0u32), Just(4), Just(8)], any::<bool>())
        .prop_map(|(kinds, hierarchy, large_parallel_cpus, compare_first_fit)| ClusterSpec {
            kinds,
            hierarchy,
            large_parallel_cpus,
            compare_first_fit,
        })
}

fn build(spec: &ClusterSpec) -> ClusterState {
    let topos = topologies();
    let nodes = spec
        .kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let mut n = NodeCapacity::new(NodeId(i as u32), format!("n{i}"), topos[k].clone());
            n.location = match spec.hierarchy {
                1 => vec![i as u32 / 3, i as u32 / 6],
                2 if i % 2 == 0 => vec![i as u32 / 4],
                _ => vec![],
            };
            n
        })
        .collect();
    let policy = PlacementPolicy {
        large_parallel_cpus: spec.large_parallel_cpus,
        compare_first_fit: spec.compare_first_fit,
        ..Default::default()
    };
    let mut c = ClusterState::from_parts(nodes, policy, Default::default());
    // Half the clusters arranged (a node changed in place keeps the index then), half not
    // (the index is dropped then: the nodes' ranks depend on their names).
    if spec.compare_first_fit {
        c.arrange(&Default::default());
    }
    c
}

#[derive(Debug, Clone)]
struct ReqSpec {
    /// (per node?, nodes or total cores, cores per node or chunk)
    shape: (bool, u32, u32),
    /// (per cpu?, MiB)
    mem: (bool, u64),
    threads: bool,
    system_cpus: bool,
    binding: Option<&'static str>,
}

fn req_spec() -> impl Strategy<Value = ReqSpec> {
    let per_node = (1u32..=4, 0u32..=12).prop_map(|(k, c)| (true, k, c));
    let total = (0u32..=48, prop_oneof![4 => Just(1u32), 1 => 2u32..=4]).prop_map(|(c, ch)| (false, c, ch));
    let shape = prop_oneof![per_node, total];
    let mem = prop_oneof![(Just(false), 0u64..=3000), (Just(true), 0u64..=400)];
    let binding = prop_oneof![8 => Just(None), 1 => Just(Some("linear:2")), 1 => Just(Some("linear:4"))];
    (shape, mem, prop::bool::weighted(0.2), prop::bool::weighted(0.15), binding)
        .prop_map(|(shape, mem, threads, system_cpus, binding)| ReqSpec { shape, mem, threads, system_cpus, binding })
}

impl ReqSpec {
    fn request(&self) -> JobRequest {
        let shape = match self.shape {
            (true, nodes, cores_per_node) => Shape::PerNode { nodes, cores_per_node },
            (false, cores, chunk) => Shape::Total { cores, chunk },
        };
        let mut r = JobRequest::simple(shape, 0);
        r.mem = if self.mem.0 { MemRequest::PerCpu(self.mem.1 * MIB) } else { MemRequest::PerNode(self.mem.1 * MIB) };
        r.threads = self.threads;
        r.system_cpus = self.system_cpus;
        // A binding names cores: not with threads.
        if !self.threads {
            r.binding = self.binding.map(|b| b.parse::<BindingStrategy>().expect("binding"));
        }
        r
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Place through the cluster and claim what it gives.
    Start(ReqSpec),
    /// Release a running job (`ClusterState::release`).
    End(usize),
    /// Set a node's state directly.
    State(usize, u8),
    /// Hold a node's first PU back for the system (or give it back), then `refresh`.
    System(usize, bool),
    /// Replace a node by a new one (same id and kind) directly.
    Replace(usize),
    /// Claim a placement on the nodes directly (`node_mut` and `NodeCapacity::claim`).
    ClaimDirectly(ReqSpec),
    /// Release a running job on the nodes directly.
    ReleaseDirectly(usize),
    /// Go on with a copy of the cluster.
    Copy,
    /// Place as if a few running jobs were claimed once more (`Machine::place_with_claimed`).
    WithClaimed(ReqSpec, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => req_spec().prop_map(Op::Start),
        4 => any::<usize>().prop_map(Op::End),
        1 => (any::<usize>(), 0u8..4).prop_map(|(i, s)| Op::State(i, s)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, b)| Op::System(i, b)),
        1 => any::<usize>().prop_map(Op::Replace),
        1 => req_spec().prop_map(Op::ClaimDirectly),
        1 => any::<usize>().prop_map(Op::ReleaseDirectly),
        1 => Just(Op::Copy),
        1 => (req_spec(), any::<usize>()).prop_map(|(r, k)| Op::WithClaimed(r, k)),
    ]
}

/// Every way of placing `req` on `c` agrees with the reference, and the index the cluster
/// keeps (`indexed`: the test expects one) is true for its nodes.
fn check(c: &ClusterState, req: &JobRequest, indexed: bool) -> Result<(), TestCaseError> {
    let want = reference::place(c.nodes(), &c.policy, req);
    prop_assert_eq!(&place_scanning(c.nodes(), &c.policy, req), &want, "full scan, {:?}", req);
    prop_assert_eq!(&sched::place(c, req), &want, "ClusterState, {:?}", req);
    prop_assert_eq!(c.index().is_some(), indexed, "an index is kept");
    if let Some(ix) = c.index() {
        prop_assert!(ix.consistent_with(c.nodes()), "the index files every node under its counts");
        prop_assert_eq!(&place_with(c.nodes(), &c.policy, Some(ix), req), &want, "index, {:?}", req);
    }
    Ok(())
}

fn alloc_of(p: Placement) -> Option<Allocation> {
    match p {
        Placement::Now(a) => Some(a),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn indexed_placement_decides_as_the_full_scan(
        spec in cluster_spec(),
        ops in prop::collection::vec(op(), 1..40),
        probes in prop::collection::vec(req_spec(), 1..4),
    ) {
        let mut c = build(&spec);
        let topos = topologies();
        let probes: Vec<JobRequest> = probes.iter().map(ReqSpec::request).collect();
        let mut running: Vec<Allocation> = vec![];
        // No index yet: a new cluster is indexed by its first claim or release.
        let mut fresh = false;
        // A node changed in place keeps the index of an arranged cluster.
        let arranged = spec.compare_first_fit;
        for op in &ops {
            let mut asked = None;
            match op {
                Op::Start(r) => {
                    let req = r.request();
                    check(&c, &req, fresh)?;
                    if let Some(a) = alloc_of(sched::place(&c, &req)) {
                        c.claim(&a);
                        running.push(a);
                        fresh = true;
                    }
                    asked = Some(req);
                }
                Op::End(k) if !running.is_empty() => {
                    let a = running.swap_remove(k % running.len());
                    c.release(&a);
                    fresh = true;
                }
                Op::End(_) => {}
                Op::State(i, s) => {
                    let i = i % c.nodes().len();
                    c.node_at_mut(i).state = [NodeState::Up, NodeState::Down, NodeState::Draining, NodeState::Up][*s as usize];
                    fresh = fresh && arranged;
                }
                Op::System(i, hold) => {
                    let len = c.nodes().len();
                    let mut n = c.node_at_mut(i % len);
                    n.system_pus = if *hold { CpuSet::from_iter_u32([n.topology.cores[0].pus[0]]) } else { CpuSet::new() };
                    n.refresh();
                    drop(n);
                    fresh = fresh && arranged;
                }
                Op::Replace(i) => {
                    let i = i % c.nodes().len();
                    let old = &c.nodes()[i];
                    let mut n = NodeCapacity::new(old.id, old.name.clone(), topos[spec.kinds[i]].clone());
                    n.location = old.location.clone();
                    // Its place in the node order too (as the controller arranges after).
                    n.order = old.order;
                    c.replace(i, n);
                    // What ran there is gone with it.
                    running.retain(|a| a.iter().all(|na| na.node_id != NodeId(i as u32)));
                    fresh = false;
                }
                Op::ClaimDirectly(r) => {
                    let req = r.request();
                    if let Some(a) = alloc_of(reference::place(c.nodes(), &c.policy, &req)) {
                        for na in &a {
                            c.node_mut(na.node_id).expect("node").claim(na);
                        }
                        // An empty allocation (no cores asked) changes no node: the index stays.
                        fresh = fresh && (arranged || a.is_empty());
                        running.push(a);
                    }
                    asked = Some(req);
                }
                Op::ReleaseDirectly(k) if !running.is_empty() => {
                    let a = running.swap_remove(k % running.len());
                    for na in &a {
                        c.node_mut(na.node_id).expect("node").release(na);
                    }
                    fresh = fresh && (arranged || a.is_empty());
                }
                Op::ReleaseDirectly(_) => {}
                Op::Copy => {
                    c = c.clone();
                    // The copy has its own copy of the index, if there was one.
                }
                Op::WithClaimed(r, k) => {
                    let req = r.request();
                    let extra: Vec<&Allocation> = running.iter().skip(k % (running.len() + 1)).take(2).collect();
                    let mut copy = c.clone();
                    for a in &extra {
                        copy.claim(a);
                    }
                    let want = reference::place(copy.nodes(), &copy.policy, &req);
                    let extra: Vec<Allocation> = extra.into_iter().cloned().collect();
                    let extra: Vec<&Allocation> = extra.iter().collect();
                    let got = c.place_with_claimed(&extra, &req);
                    let want = match want {
                        Placement::Now(a) => Fit::Now(a),
                        Placement::Busy(b) => Fit::Busy(b),
                        Placement::Never(n) => Fit::Never(n),
                    };
                    prop_assert_eq!(got, want, "with {} claimed, {:?}", extra.len(), req);
                    // Put back as it was: the index too.
                    fresh = true;
                    asked = Some(req);
                }
            }
            if let Some(req) = &asked {
                check(&c, req, fresh)?;
            }
            for req in &probes {
                check(&c, req, fresh)?;
            }
        }
    }
}

/// A cluster of `n` nodes of 8 cores with `free[i]` cores free on node i (the rest claimed).
fn with_free(free: &[u32]) -> (ClusterState, Vec<Allocation>) {
    let topo = Arc::new(Topology::uniform(2, 1, 4, 1, 1024 * MIB));
    let nodes = (0..free.len()).map(|i| NodeCapacity::new(NodeId(i as u32), format!("n{i}"), topo.clone())).collect();
    let mut c = ClusterState::from_parts(nodes, PlacementPolicy::default(), Default::default());
    let mut held = vec![];
    for (i, &f) in free.iter().enumerate() {
        let busy = 8 - f;
        if busy > 0 {
            let req = JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: busy }, 0);
            let mut only = c.clone();
            only.update_nodes(|nodes| {
                for (j, n) in nodes.iter_mut().enumerate() {
                    if j != i {
                        n.state = NodeState::Down;
                    }
                }
            });
            let a = alloc_of(sched::place(&only, &req)).expect("fits");
            c.claim(&a);
            held.push(a);
        }
    }
    (c, held)
}

fn cores(n: u32) -> JobRequest {
    JobRequest::simple(Shape::Total { cores: n, chunk: 1 }, 0)
}

fn nodes_of(p: &Placement) -> Vec<u32> {
    match p {
        Placement::Now(a) => a.iter().map(|na| na.node_id.0).collect(),
        _ => vec![],
    }
}

#[test]
fn the_fullest_node_that_fits_wins_then_the_lowest_id() {
    let (c, _) = with_free(&[3, 5, 2, 5, 8, 4]);
    assert!(c.index().is_some_and(|ix| ix.consistent_with(c.nodes())));
    assert_eq!(nodes_of(&sched::place(&c, &cores(4))), vec![5]);
    assert_eq!(nodes_of(&sched::place(&c, &cores(5))), vec![1]);
    assert_eq!(nodes_of(&sched::place(&c, &cores(2))), vec![2]);
    // Spread over the emptiest nodes: 8 (node 4) then 5 (node 1), listed in the cluster's order.
    assert_eq!(nodes_of(&sched::place(&c, &cores(12))), vec![1, 4]);
    let Placement::Busy(why) = sched::place(&c, &cores(40)) else { panic!("40 cores placed") };
    assert_eq!(why, crate::placement::reason::Busy::TotalUnits { unit: "cores", cores: 40, chunk: 1, free: 27 });
    assert_eq!(why.to_string(), "cores: 40 wanted, 27 free now; it starts when running jobs free 13 more");
}

#[test]
fn a_node_changed_directly_is_not_missed() {
    // Not arranged: a node changed in place drops the index (its rank may follow its name)...
    let (mut c, held) = with_free(&[1, 1, 1, 1]);
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), Vec::<u32>::new());
    c.node_mut(NodeId(2)).unwrap().release(&held[2][0]);
    assert!(c.index().is_none());
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![2]);
    // ... until the next claim or release rebuilds it.
    c.release(&held[0]);
    assert!(c.index().is_some_and(|ix| ix.consistent_with(c.nodes())));
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![0]);
    // Arranged: the node is filed again under its new counts when the borrow ends.
    let (mut c, held) = with_free(&[1, 1, 1, 1]);
    c.arrange(&Default::default());
    c.claim(&vec![]);
    c.node_mut(NodeId(2)).unwrap().release(&held[2][0]);
    assert!(c.index().is_some_and(|ix| ix.consistent_with(c.nodes())), "re-filed, not dropped");
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![2]);
    // Every node changed at once: re-filed too, unless the node order changed.
    c.update_nodes(|nodes| nodes.iter_mut().for_each(|n| n.state = NodeState::Down));
    assert!(c.index().is_some_and(|ix| ix.consistent_with(c.nodes())));
    assert!(matches!(sched::place(&c, &cores(8)), Placement::Never(_)));
    c.update_nodes(|nodes| nodes.swap(0, 1));
    assert!(c.index().is_none(), "the order changed: dropped");
    // A node replaced by a new one, or by a copy of another.
    let (mut c, _) = with_free(&[1, 1, 1]);
    let topo = c.nodes()[1].topology.clone();
    c.replace(1, NodeCapacity::new(NodeId(1), "n1", topo));
    assert!(c.index().is_none());
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![1]);
    let (mut c, _) = with_free(&[1, 1, 8]);
    c.claim(&vec![]);
    let (mut spare, mut first) = (c.nodes()[2].clone(), c.nodes()[0].clone());
    (spare.id, first.id) = (NodeId(0), NodeId(2));
    c.replace(2, first);
    c.replace(0, spare);
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![0]);
    // More nodes.
    let (mut c, _) = with_free(&[1]);
    let topo = c.nodes()[0].topology.clone();
    c.push(NodeCapacity::new(NodeId(1), "n1", topo));
    assert!(c.index().is_none());
    assert_eq!(nodes_of(&sched::place(&c, &cores(8))), vec![1]);
}

#[test]
fn the_policy_carries_no_index_and_a_copy_of_the_cluster_its_own() {
    let (mut c, _) = with_free(&[2, 3]);
    assert!(c.index().is_some());
    let policy = c.policy.clone();
    assert_eq!(
        format!("{policy:?}"),
        "PlacementPolicy { large_parallel_cpus: 8, align_numa: true, wide_memory: true, compare_first_fit: true, gpu_locality: Prefer }"
    );
    assert_eq!(serde_json::to_string(&policy).unwrap(), serde_json::to_string(&PlacementPolicy::default()).unwrap());
    // A copy of the cluster gets its own copy of the index, true for its own nodes, and they
    // go their own ways.
    c.ensure_index();
    let mut copy = c.clone();
    assert!(copy.index().is_some_and(|ix| ix.consistent_with(copy.nodes())), "a copied index is true for the copy");
    let a = alloc_of(sched::place(&copy, &cores(3))).expect("fits");
    copy.claim(&a);
    assert!(copy.index().is_some_and(|ix| ix.consistent_with(copy.nodes())));
    assert!(c.index().is_some_and(|ix| ix.consistent_with(c.nodes())), "the original's untouched");
    assert_ne!(copy.nodes()[1].free_core_count, c.nodes()[1].free_core_count);
}

/// The names of an allocation's nodes, in its order.
fn names_of(p: &Placement) -> Vec<String> {
    match p {
        Placement::Now(a) => a.iter().map(|na| na.node.clone()).collect(),
        other => vec![format!("{other:?}")],
    }
}

/// Nodes that joined (registered) in the order node10, node2, node1: placement tries them,
/// breaks ties and lists a job's nodes by name in natural order, never by id, whether the
/// cluster was arranged, indexed or neither.
#[test]
fn placement_follows_node_names_not_the_order_nodes_joined() {
    let topo = Arc::new(Topology::uniform(2, 1, 4, 1, 1024 * MIB));
    let joined = ["node10", "node2", "node1"];
    let nodes = || -> Vec<NodeCapacity> {
        joined.iter().enumerate().map(|(i, n)| NodeCapacity::new(NodeId(i as u32), *n, topo.clone())).collect()
    };
    let per_node = |k, c| JobRequest::simple(Shape::PerNode { nodes: k, cores_per_node: c }, 0);
    let arranged = ClusterState::new(nodes(), PlacementPolicy::default());
    let mut indexed = ClusterState::new(nodes(), PlacementPolicy::default());
    indexed.claim(&vec![]);
    let plain = ClusterState::from_parts(nodes(), PlacementPolicy::default(), Default::default());
    for (what, c) in [("arranged", &arranged), ("indexed", &indexed), ("never arranged", &plain)] {
        assert_eq!(c.in_order(), vec![2, 1, 0], "{what}");
        assert_eq!(names_of(&sched::place(c, &per_node(1, 2))), ["node1"], "{what}");
        assert_eq!(names_of(&sched::place(c, &per_node(3, 2))), ["node1", "node2", "node10"], "{what}");
        assert_eq!(names_of(&sched::place(c, &cores(1))), ["node1"], "{what}");
        assert_eq!(names_of(&sched::place(c, &cores(24))), ["node1", "node2", "node10"], "{what}");
        assert_eq!(names_of(&place_scanning(c.nodes(), &c.policy, &per_node(2, 8))), ["node1", "node2"], "{what}");
    }
    // The admin's order first, then the others by name.
    let mut listed = ClusterState::new(nodes(), PlacementPolicy::default());
    listed.arrange(&crate::hierarchy::NodeOrder::listed(&["node2".into(), "node10".into()]).unwrap());
    assert_eq!(names_of(&sched::place(&listed, &per_node(1, 2))), ["node2"]);
    assert_eq!(names_of(&sched::place(&listed, &per_node(3, 2))), ["node2", "node10", "node1"]);
    // Chosen fullest first (node10 has 4 busy cores), listed in the cluster's order all the same.
    let mut c = ClusterState::new(nodes(), PlacementPolicy::default());
    let busy = alloc_of(sched::place(&c, &per_node(1, 4))).expect("fits");
    assert_eq!(busy[0].node, "node1");
    c.claim(&busy);
    assert_eq!(names_of(&sched::place(&c, &per_node(1, 4))), ["node1"], "the fullest node that fits");
    assert_eq!(names_of(&sched::place(&c, &per_node(2, 4))), ["node1", "node2"]);
    // Spread emptiest first (node2, node10: 8 free each, before node1's 4), listed by name.
    assert_eq!(names_of(&sched::place(&c, &cores(12))), ["node2", "node10"]);
}
