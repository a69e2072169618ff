use super::testkit::{total, ClusterBuilder, G};
use super::*;
use crate::job::{Allocation, Shape};
use crate::node::{NodeCapacity, NodeState};
use crate::placement::JobRequest;
use crate::sched::PendingJob;
use crate::topology::Topology;
use crate::{CpuSet, JobId, NodeId};
use proptest::prelude::*;
use std::sync::Arc;

fn job(id: u64, shape: Shape, mem: u64) -> PendingJob {
    PendingJob { id: JobId(id), request: JobRequest::simple(shape, mem), held: false }
}

/// What a strict-FIFO pass decided.
struct Decisions {
    starts: Vec<(JobId, Allocation)>,
    waiting: Vec<(JobId, PendingReason)>,
}

/// One strict-FIFO pass (the backfill pass with `Fcfs`) over `queue` in order.
fn schedule(cluster: &ClusterState, queue: &[PendingJob]) -> Decisions {
    use super::backfill::{plan, BackfillPolicy, PassInput, PassLimits, QueuedJob};
    let queue: Vec<QueuedJob> = queue
        .iter()
        .map(|j| QueuedJob { id: j.id, request: j.request.clone(), walltime: 3600.0, held: j.held })
        .collect();
    let limits = PassLimits { policy: BackfillPolicy::Fcfs, max_reservations: 0, deadline: None };
    let out = plan(&PassInput { machine: cluster, running: &[], queue: &queue, now: 0.0 }, &limits);
    Decisions { starts: out.starts, waiting: out.waiting.into_iter().map(|w| (w.id, w.reason)).collect() }
}

/// Whether a request could ever fit the nodes that take work if they were empty.
fn check_feasible(cluster: &ClusterState, req: &JobRequest) -> Result<(), crate::placement::reason::Never> {
    crate::placement::cluster::feasible(cluster.nodes(), &cluster.policy, req, |n| n.state.accepts_work())
}

fn summary(d: &Decisions) -> Vec<String> {
    d.starts
        .iter()
        .map(|(id, a)| {
            let parts: Vec<String> = a.iter().map(|na| format!("{}:{}", na.node, na.cpus)).collect();
            format!("{id} -> {}", parts.join(" "))
        })
        .collect()
}

/// Job 2 (two cores, a NUMA node's worth) gets the whole second NUMA node, not cores 1-2.
#[test]
fn fifo_first_fit_packs_in_order() {
    let cluster = ClusterBuilder::new().nodes(2, 2, 2, 4 * G).build();
    let queue = vec![job(1, total(1), G), job(2, total(2), G), job(3, total(4), G), job(4, total(1), G)];
    let d = schedule(&cluster, &queue);
    assert_eq!(summary(&d), vec!["1 -> n0:0", "2 -> n0:2-3", "3 -> n1:0-3", "4 -> n0:1"]);
    assert_eq!(d.waiting, vec![]);
}

#[test]
fn busy_head_blocks_fifo_but_held_and_never_do_not() {
    let cluster = ClusterBuilder::new().nodes(2, 1, 4, 4 * G).build();
    let queue = vec![
        job(1, total(3), G),
        PendingJob { held: true, ..job(2, total(1), G) },
        job(3, Shape::PerNode { nodes: 1, cores_per_node: 64 }, G),
        job(4, total(3), G),
        job(5, total(4), G),
        job(6, total(1), G),
    ];
    let d = schedule(&cluster, &queue);
    assert_eq!(summary(&d), vec!["1 -> n0:0-2", "4 -> n1:0-2"]);
    assert_eq!(d.waiting[0], (JobId(2), PendingReason::Held));
    assert!(matches!(d.waiting[1], (JobId(3), PendingReason::NoSuitableNodes(_))));
    assert!(matches!(d.waiting[2], (JobId(5), PendingReason::Resources(_))));
    // Job 6 (1 core) would fit but must wait behind job 5: FIFO, no backfill.
    assert_eq!(d.waiting[3], (JobId(6), PendingReason::Priority));
}

#[test]
fn memory_is_never_oversubscribed() {
    let cluster = ClusterBuilder::new().nodes(1, 1, 8, 4 * G).build();
    let queue = vec![job(1, total(1), 3 * G), job(2, total(1), 2 * G)];
    let d = schedule(&cluster, &queue);
    assert_eq!(summary(&d), vec!["1 -> n0:0"]);
    assert!(matches!(d.waiting[..], [(JobId(2), PendingReason::Resources(_))]));
}

#[test]
fn per_node_shape_uses_distinct_nodes_and_skips_down_ones() {
    let cluster = ClusterBuilder::new().nodes(3, 1, 2, 2 * G).state(0, NodeState::Down).build();
    let d = schedule(&cluster, &[job(1, Shape::PerNode { nodes: 2, cores_per_node: 2 }, G)]);
    assert_eq!(summary(&d), vec!["1 -> n1:0-1 n2:0-1"]);
    let d = schedule(&cluster, &[job(1, Shape::PerNode { nodes: 3, cores_per_node: 1 }, G)]);
    assert!(matches!(d.waiting[0].1, PendingReason::NoSuitableNodes(_)));
}

#[test]
fn total_shape_spans_nodes_when_no_single_node_fits() {
    let cluster = ClusterBuilder::new().nodes(3, 1, 4, 2 * G).build();
    let d = schedule(&cluster, &[job(1, total(6), G)]);
    assert_eq!(summary(&d), vec!["1 -> n0:0-3 n1:0-1"]);
    let d = schedule(&cluster, &[job(1, Shape::Total { cores: 6, chunk: 3 }, G)]);
    assert_eq!(summary(&d), vec!["1 -> n0:0-2 n1:0-2"]);
}

#[test]
fn smt_cores_are_allocated_whole_with_local_memory_nodes() {
    let topo = Arc::new(Topology::uniform(2, 2, 2, 2, G));
    let cluster = ClusterState::from_parts(
        vec![NodeCapacity::new(NodeId(0), "big", topo)],
        Default::default(),
        Default::default(),
    );
    let d = schedule(&cluster, &[job(1, total(3), G)]);
    let a = &d.starts[0].1[0];
    assert_eq!(a.cpus.to_list(), "0-5");
    assert_eq!(a.mems.to_list(), "0-1");
    assert_eq!(a.cores, 3);
}

#[test]
fn infeasible_reason_is_specific() {
    let cluster = ClusterBuilder::new().nodes(2, 1, 4, 2 * G).build();
    let why = check_feasible(&cluster, &JobRequest::simple(total(1), 8 * G)).unwrap_err().to_string();
    assert!(why.contains("8G"), "{why}");
    let why = check_feasible(&cluster, &JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 5 }, G))
        .unwrap_err()
        .to_string();
    assert!(why.contains("the largest node up has 4 cores"), "{why}");
    assert!(check_feasible(&cluster, &JobRequest::simple(total(8), G)).is_ok());
    assert!(check_feasible(&cluster, &JobRequest::simple(total(9), G)).is_err());
}

#[test]
fn release_returns_resources() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 4, 4 * G).build();
    let d = schedule(&cluster, &[job(1, total(4), 4 * G)]);
    cluster.claim(&d.starts[0].1);
    assert!(matches!(place(&cluster, &JobRequest::simple(total(1), 0)), Placement::Busy(_)));
    cluster.release(&d.starts[0].1);
    assert!(matches!(place(&cluster, &JobRequest::simple(total(4), 4 * G)), Placement::Now(_)));
}

proptest! {
    /// No PU is ever booked twice and no node's memory is exceeded, whatever the queue.
    #[test]
    fn never_oversubscribes(jobs in proptest::collection::vec((1u32..6, 0u64..3, proptest::bool::ANY, 1u32..3), 1..40)) {
        let cluster = ClusterBuilder::new().nodes(3, 2, 2, 4 * G).build();
        let queue: Vec<PendingJob> = jobs.iter().enumerate().map(|(i, &(cores, mem, per_node, nodes))| {
            let shape = if per_node { Shape::PerNode { nodes, cores_per_node: cores.min(4) } } else { total(cores) };
            job(i as u64, shape, mem * G)
        }).collect();
        let d = schedule(&cluster, &queue);
        for node in cluster.nodes() {
            let mut used = CpuSet::new();
            let mut mem = 0;
            for (_, alloc) in &d.starts {
                for na in alloc.iter().filter(|na| na.node_id == node.id) {
                    prop_assert!(!used.intersects(&na.cpus), "PU booked twice on {}", node.name);
                    used.union_with(&na.cpus);
                    mem += na.memory_bytes;
                }
            }
            prop_assert!(mem <= node.topology.memory_bytes());
            prop_assert!(used.is_subset_of(&node.topology.all_pus()));
        }
    }
}

/// A bound job whose cores are in use waits for them (issue 17 item 10: it read "priority: an
/// earlier job waits first" behind a head with a reservation); a job that fits what is free now
/// but only on what the head keeps waits for priority.
#[test]
fn a_colliding_binding_waits_for_its_cores_not_for_priority() {
    use super::backfill::{plan, BackfillPolicy, PassInput, PassLimits, QueuedJob};
    use super::testkit::{hold, queued, queued_nodes};
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let mut cluster = ClusterBuilder::new().nodes(1, 1, 8, 8 * G).build();
        let running = vec![hold(&mut cluster, 9, &[(0, "0-3")], 100.0)];
        let mut bound = JobRequest::simple(Shape::PerNode { nodes: 1, cores_per_node: 2 }, 0);
        bound.binding = Some("explicit:0,0:0,1".parse().expect("binding"));
        let queue = vec![
            queued_nodes(1, 1, 8, 1000.0),
            QueuedJob { id: JobId(2), request: bound, walltime: 1000.0, held: false },
            queued(3, 2, 1000.0),
        ];
        let limits = PassLimits { policy, max_reservations: 1, deadline: None };
        let out = plan(&PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 }, &limits);
        let reason = |id: u64| out.waiting.iter().find(|w| w.id == JobId(id)).map(|w| w.reason.describe());
        assert_eq!(reason(2).as_deref(), Some("resources: cores 0,1 (socket 0) are in use"), "{policy:?}");
        assert_eq!(
            reason(3).as_deref(),
            Some(
                "priority: what it needs is free now but kept for higher-priority jobs waiting before it; it starts \
                 after them, or sooner if more frees up"
            ),
            "{policy:?}"
        );
    }
}
