//! What users read of a job that waits (issue 17 item 10): every reason names the resource that
//! is missing and what would change that. Each text is pinned here on a small cluster.

use crate::binding::BindingStrategy;
use crate::job::Shape;
use crate::node::{NodeCapacity, SubnodeState, PROP_ONLY_PARALLEL, PROP_SINGLE_CPU};
use crate::placement::cluster::{place, Placement};
use crate::placement::{JobRequest, PlacementPolicy};
use crate::topology::Topology;
use crate::{CpuSet, NodeId};
use std::sync::Arc;

const G: u64 = 1 << 30;

fn nodes(count: u32, topo: Topology) -> Vec<NodeCapacity> {
    let t = Arc::new(topo);
    (0..count).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), t.clone())).collect()
}

fn total(cores: u32, mem: u64) -> JobRequest {
    JobRequest::simple(Shape::Total { cores, chunk: 1 }, mem)
}

fn per_node(nodes: u32, cores_per_node: u32, mem: u64) -> JobRequest {
    JobRequest::simple(Shape::PerNode { nodes, cores_per_node }, mem)
}

/// Place `req` and claim it (it must fit).
fn start(ns: &mut [NodeCapacity], req: &JobRequest) {
    match place(ns, &PlacementPolicy::default(), req) {
        Placement::Now(alloc) => {
            for a in &alloc {
                ns.iter_mut().find(|n| n.id == a.node_id).expect("node").claim(a);
            }
        }
        other => panic!("{req:?} does not start: {other:?}"),
    }
}

fn busy(ns: &[NodeCapacity], req: &JobRequest) -> String {
    match place(ns, &PlacementPolicy::default(), req) {
        Placement::Busy(s) => s.to_string(),
        other => panic!("expected busy, got {other:?}"),
    }
}

fn never(ns: &[NodeCapacity], req: &JobRequest) -> String {
    match place(ns, &PlacementPolicy::default(), req) {
        Placement::Never(s) => s.to_string(),
        other => panic!("expected never, got {other:?}"),
    }
}

/// A memory shortfall said "1 free units wanted in chunks of 1, 0 free now" while 12 PUs were
/// free: memory is what is missing.
#[test]
fn memory_shortfall_names_memory_not_cores() {
    let mut ns = nodes(1, Topology::uniform(1, 1, 12, 1, 4 * G));
    start(&mut ns, &total(1, 3 * G));
    // One core and 3G of the 4G taken: cores are free, memory is not.
    assert_eq!(
        busy(&ns, &total(1, 2 * G)),
        "memory: 2G free wanted on a node beside 1 core; 11 cores are free now, 0 of them on nodes with that much \
         memory free (at most 1G on one node); it starts when memory frees up"
    );
    assert_eq!(
        busy(&ns, &total(3, 2 * G)),
        "memory: 2G free wanted on a node beside 1 core; 11 cores are free now, 0 of them on nodes with that much \
         memory free (at most 1G on one node); it starts when memory frees up"
    );
    assert_eq!(
        busy(&ns, &per_node(1, 1, 2 * G)),
        "memory: 2G free beside 1 free core wanted on 1 node, the nodes with that many free have at most 1G free \
         now; it starts when memory frees up"
    );
}

#[test]
fn too_few_free_cores_says_how_many() {
    let mut ns = nodes(2, Topology::uniform(1, 1, 4, 1, 4 * G));
    start(&mut ns, &total(3, 0));
    assert_eq!(busy(&ns, &total(6, 0)), "cores: 6 wanted, 5 free now; it starts when running jobs free 1 more");
    assert_eq!(
        busy(&ns, &per_node(2, 2, 0)),
        "cores: 2 nodes with 2 free cores each wanted, 1 node has that many free now; it starts when running jobs \
         free them"
    );
}

/// The large-job rule said "could give 0" (or 8) without naming the rule.
#[test]
fn the_large_job_rule_is_named() {
    let mut ns = nodes(1, Topology::uniform(1, 2, 8, 1, 4 * G));
    start(&mut ns, &total(1, 0));
    assert_eq!(
        busy(&ns, &total(12, 0)),
        "whole NUMA nodes: a large parallel job (more than 8 CPUs) gets NUMA nodes nobody else uses; 12 cores \
         wanted, such NUMA nodes free now hold 8; it starts when the jobs on them end"
    );
    assert_eq!(
        busy(&ns, &per_node(1, 12, 0)),
        "whole NUMA nodes: a large parallel job (more than 8 CPUs) gets NUMA nodes nobody else uses; 1 node with 12 \
         cores in such NUMA nodes wanted, no node has that many now; it starts when the jobs on them end"
    );
}

/// Infeasible messages had an empty clause (": (largest node…").
#[test]
fn never_reasons_have_no_empty_clause() {
    let ns = nodes(3, Topology::uniform(1, 1, 12, 1, 4 * G));
    assert_eq!(
        never(&ns, &per_node(5, 1, 0)),
        "nodes: 5 nodes wanted, 3 nodes up; ask for at most 3 nodes, or wait for more nodes to come up"
    );
    assert_eq!(
        never(&ns, &total(100, 0)),
        "cores: 100 wanted, the 3 nodes up have 36 in all; ask for at most 36, or wait for more nodes to come up"
    );
    assert_eq!(
        never(&ns, &total(1, 100 * G)),
        "1 core wanted, the 3 nodes up could hold at most 0 of them: 100G of memory wanted on n0, the NUMA nodes it \
         may use there have 4G; the largest node up has 12 cores, 12 PUs, 4G memory; ask for less, or wait for \
         nodes that have it to come up"
    );
    assert_eq!(never(&[], &total(1, 0)), "nodes: no node is up; it starts once nodes come up");
    for ns in [nodes(3, Topology::uniform(1, 1, 12, 1, 4 * G)), nodes(1, Topology::uniform(2, 2, 4, 1, 4 * G))] {
        for req in [per_node(5, 1, 0), total(100, 0), total(1, 100 * G), per_node(2, 20, 0)] {
            let why = never(&ns, &req);
            assert!(!why.contains(":  ") && !why.contains(": (") && !why.contains(": ;"), "{why}");
        }
    }
}

/// The subnode messages: which property, which subnode keeps the job off and why, and the fix.
#[test]
fn subnode_reasons_say_which_subnode_and_why() {
    let plain = nodes(1, Topology::uniform(1, 1, 12, 1, 4 * G));
    let mut with_gpu = total(2, 0);
    with_gpu.properties = vec!["gpu".into()];
    assert_eq!(
        never(&plain, &with_gpu),
        "2 cores wanted, the 1 node up could hold at most 0 of them: subnodes: property gpu wanted, but node n0 has no \
         subnodes; drop --property, or ask an admin to set subnode_numa and the properties"
    );
    let mut sub = nodes(1, Topology::uniform(2, 2, 4, 1, 4 * G));
    sub[0].set_subnode_size(2);
    sub[0].subnodes[0].properties = vec!["fast".into()];
    sub[0].refresh();
    assert_eq!(
        never(&sub, &with_gpu),
        "2 cores wanted, the 1 node up could hold at most 0 of them: cores: n0 has 0 in subnodes with property \
         gpu, 1 wanted (no subnode of n0 has property gpu; drop --property, or ask an admin to set it on a subnode)"
    );
    let mut fast = total(2, 0);
    fast.properties = vec!["fast".into()];
    sub[0].subnodes[0].state = SubnodeState::Offline;
    sub[0].refresh();
    let why = match place(&sub, &PlacementPolicy::default(), &fast) {
        Placement::Busy(s) => s.to_string(),
        Placement::Never(s) => s.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(why.ends_with("cores: n0 has 0 in subnodes with property fast, 1 wanted (subnode 0 is offline)"), "{why}");
    let mut limited = nodes(1, Topology::uniform(2, 2, 4, 1, 4 * G));
    limited[0].set_subnode_size(2);
    limited[0].subnodes[0].properties = vec![PROP_SINGLE_CPU.into()];
    limited[0].subnodes[1].properties = vec![PROP_ONLY_PARALLEL.into()];
    limited[0].refresh();
    assert_eq!(
        never(&limited, &total(2, 0)),
        "2 cores wanted, the 1 node up could hold at most 0 of them: cores: n0 has 0, 1 wanted (subnode 0 takes \
         only single-CPU jobs (singlecpu); subnode 1 takes only large parallel jobs (onlyparallel)); the largest node \
         up has 16 cores, 16 PUs, 16G memory; ask for less, or wait for nodes that have it to come up"
    );
}

#[test]
fn system_cpus_are_named_as_what_keeps_cores_off() {
    let mut ns = nodes(1, Topology::uniform(1, 1, 4, 1, 4 * G));
    ns[0].system_pus = CpuSet::parse_list("0-1").expect("list");
    ns[0].refresh();
    let mut bound = per_node(1, 3, 0);
    bound.binding = None;
    assert_eq!(
        never(&ns, &bound),
        "1 node wanted, 0 of the 1 node up could ever hold a part: cores: n0 has 2, 3 wanted (2 more PUs are \
         system CPUs, which only --system-cpus jobs use); the largest node up has 4 cores, 4 PUs, 4G memory; ask for \
         less, or wait for nodes that have it to come up"
    );
}

#[test]
fn a_bound_job_names_the_cores_in_use() {
    let mut ns = nodes(1, Topology::uniform(1, 1, 12, 1, 4 * G));
    let mut bound = per_node(1, 2, 0);
    bound.binding = Some("explicit:0,0:0,1".parse::<BindingStrategy>().expect("binding"));
    start(&mut ns, &bound);
    assert_eq!(busy(&ns, &bound), "cores 0,1 (socket 0) are in use");
}
