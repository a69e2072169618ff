//! Generic resources per node and cluster-wide licenses (issue 20): placement never gives out
//! more than a node or the cluster has; a job whose licenses are taken waits with the license
//! named and starts, in a backfill plan, once the jobs holding them end; one that can never
//! have them is told so; a suspended job keeps both.

use berth_core::directives::SubmitOptions;
use berth_core::gres::{Counts, Licenses};
use berth_core::job::Shape;
use berth_core::node::NodeCapacity;
use berth_core::placement::{JobRequest, PlacementPolicy};
use berth_core::sched::backfill::{
    licenses_only, place_for_window, plan_with_advance, plan_with_reservations, AdvanceReservation, BackfillPolicy,
    Fit, Machine, PassInput, PassLimits, QueuedJob, RunningJob,
};
use berth_core::sched::{ClusterState, PendingReason};
use berth_core::topology::Topology;
use berth_core::{JobId, NodeId};
use proptest::prelude::*;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

fn counts(items: &[(&str, u32)]) -> Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// `gres[i]` configured on node `i` (4 cores each), and `licenses` for the cluster.
fn cluster(gres: &[Counts], licenses: Counts) -> ClusterState {
    let topo = Arc::new(Topology::uniform(1, 1, 4, 1, 8 * GIB));
    let nodes = gres
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut n = NodeCapacity::new(NodeId(i as u32), format!("n{i}"), topo.clone());
            n.set_gres(g.clone());
            n
        })
        .collect();
    let mut c = ClusterState::new(nodes, PlacementPolicy::default());
    c.licenses = Licenses::new(licenses);
    c
}

fn job(nodes: u32, cores: u32, gres: Counts, licenses: Counts) -> JobRequest {
    let mut r = JobRequest::simple(Shape::PerNode { nodes, cores_per_node: cores }, GIB);
    r.gres = gres;
    r.licenses = licenses;
    r
}

#[test]
fn a_gres_job_lands_only_on_the_node_that_has_it() {
    let c = cluster(&[Counts::new(), counts(&[("nvme", 800)])], Counts::new());
    let Fit::Now(alloc) = c.place(&job(1, 1, counts(&[("nvme", 500)]), Counts::new())) else { panic!() };
    assert_eq!(alloc[0].node, "n1");
    assert_eq!(alloc[0].gres, counts(&[("nvme", 500)]));
    let mut c2 = c.clone();
    c2.claim(&alloc);
    assert_eq!(c2.nodes()[1].free_gres("nvme"), 300);
    // 500 more: not now (300 free), but n1 has 800.
    match c2.place(&job(1, 1, counts(&[("nvme", 500)]), Counts::new())) {
        Fit::Busy(why) => assert!(why.to_string().contains("gres nvme:500"), "{why}"),
        other => panic!("{other:?}"),
    }
    // More than any node has, or a resource no node has: never.
    for want in [counts(&[("nvme", 801)]), counts(&[("fpga", 1)])] {
        match c.place(&job(1, 1, want.clone(), Counts::new())) {
            Fit::Never(why) => assert!(why.to_string().contains("gres"), "{want:?}: {why}"),
            other => panic!("{want:?}: {other:?}"),
        }
    }
    // Two nodes each with nvme: only one has it.
    assert!(matches!(c.place(&job(2, 1, counts(&[("nvme", 1)]), Counts::new())), Fit::Never(_)));
    c2.release(&alloc);
    assert_eq!(c2.nodes()[1].free_gres("nvme"), 800);
}

#[test]
fn licenses_are_counted_across_the_cluster_and_named_when_taken() {
    let mut c = cluster(&[Counts::new(), Counts::new()], counts(&[("matlab", 4)]));
    let three = counts(&[("matlab", 3)]);
    let Fit::Now(a) = c.place(&job(1, 1, Counts::new(), three.clone())) else { panic!() };
    assert_eq!(a[0].licenses, three);
    c.claim(&a);
    assert_eq!(c.licenses.free("matlab"), 1);
    match c.place(&job(1, 1, Counts::new(), three.clone())) {
        Fit::Busy(why) => assert!(why.to_string().contains("license matlab: 3 wanted, 1 of 4 free"), "{why}"),
        other => panic!("{other:?}"),
    }
    match c.place(&job(1, 1, Counts::new(), counts(&[("matlab", 5)]))) {
        Fit::Never(why) => assert!(why.to_string().contains("license matlab: 5 wanted, the cluster has 4"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.place(&job(1, 1, Counts::new(), counts(&[("ansys", 1)]))), Fit::Never(_)));
    c.release(&a);
    assert_eq!(c.licenses.free("matlab"), 4);
}

/// A suspended job gives back its PUs only: its gres stay taken (and its licenses, which the
/// controller keeps claimed with `claim_licenses`).
#[test]
fn a_suspended_job_keeps_its_gres() {
    let mut c = cluster(&[counts(&[("fpga", 1)])], Counts::new());
    let Fit::Now(a) = c.place(&job(1, 1, counts(&[("fpga", 1)]), Counts::new())) else { panic!() };
    c.claim(&a);
    let cpus = berth_core::sched::preempt::cpus_only(&a);
    c.release(&cpus);
    assert_eq!(c.nodes()[0].free_gres("fpga"), 0, "the suspended job keeps its fpga");
    assert!(matches!(c.place(&job(1, 1, counts(&[("fpga", 1)]), Counts::new())), Fit::Busy(_)));
}

/// Two jobs each wanting 3 of 4 licenses, on a machine with room for both: the second waits
/// for the licenses (named), and both plans expect it to start when the first ends.
#[test]
fn backfill_plans_treat_licenses_as_a_resource_over_time() {
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let mut c = cluster(&[Counts::new(), Counts::new()], counts(&[("matlab", 4)]));
        let three = counts(&[("matlab", 3)]);
        let Fit::Now(a) = c.place(&job(1, 1, Counts::new(), three.clone())) else { panic!() };
        c.claim(&a);
        let running = [RunningJob { id: JobId(1), alloc: a, end: 100.0 }];
        let queue = [
            QueuedJob { id: JobId(2), request: job(1, 1, Counts::new(), three.clone()), walltime: 50.0, held: false },
            // No licenses: backfills now beside the waiting one.
            QueuedJob { id: JobId(3), request: job(1, 1, Counts::new(), Counts::new()), walltime: 50.0, held: false },
            // One license: would fit now, but it would delay job 2 past its reservation
            // (job 2 needs 3 at 100, job 4 would hold 1 until 150).
            QueuedJob {
                id: JobId(4),
                request: job(1, 1, Counts::new(), counts(&[("matlab", 1)])),
                walltime: 200.0,
                held: false,
            },
        ];
        let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
        let limits = PassLimits { policy, max_reservations: 100, deadline: None };
        let (out, _) = plan_with_reservations(&input, &limits);
        let started: Vec<JobId> = out.starts.iter().map(|s| s.0).collect();
        assert_eq!(started, vec![JobId(3)], "{policy:?}: {out:?}");
        let two = out.waiting.iter().find(|w| w.id == JobId(2)).unwrap();
        match &two.reason {
            PendingReason::Resources(why) => assert!(why.to_string().contains("license matlab"), "{policy:?}: {why}"),
            other => panic!("{policy:?}: {other:?}"),
        }
        assert_eq!(two.expected_start, Some(100.0), "{policy:?}");
        assert!(out.waiting.iter().any(|w| w.id == JobId(4)), "{policy:?}: job 4 must not delay job 2: {out:?}");
    }
}

fn queued(id: u64, gres: Counts, licenses: Counts) -> QueuedJob {
    QueuedJob { id: JobId(id), request: job(1, 1, gres, licenses), walltime: 50.0, held: false }
}

/// An advance reservation holding nvme:500 of n0's 800 and 3 of the cluster's 4 matlab
/// licenses, open now: its members use those (and no more); other jobs get only what it does
/// not hold, also while its members run on part of it (their counts are inside its own, not
/// counted twice).
#[test]
fn advance_reservations_hold_gres_and_licenses() {
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let mut c = cluster(&[counts(&[("nvme", 800)]), Counts::new()], counts(&[("matlab", 4)]));
        let want = job(1, 2, counts(&[("nvme", 500)]), counts(&[("matlab", 3)]));
        // Placed for a window as the controller does: what it holds is its allocation's.
        let Fit::Now(resv) = place_for_window(&c, &[], &[], &want, (0.0, 1000.0), 0.0) else { panic!() };
        assert_eq!((resv[0].node.as_str(), resv[0].gres.clone()), ("n0", counts(&[("nvme", 500)])));
        assert_eq!(resv[0].licenses, counts(&[("matlab", 3)]));
        // A second reservation over the same window finds the licenses held.
        let others =
            [AdvanceReservation { id: "r".into(), alloc: resv.clone(), start: 0.0, end: 1000.0, members: vec![] }];
        match place_for_window(
            &c,
            &[],
            &others,
            &job(1, 1, Counts::new(), counts(&[("matlab", 2)])),
            (500.0, 600.0),
            0.0,
        ) {
            Fit::Busy(why) => assert!(why.to_string().contains("license matlab"), "{why}"),
            other => panic!("{other:?}"),
        }
        let limits = PassLimits { policy, max_reservations: 100, deadline: None };
        let member = queued(10, counts(&[("nvme", 500)]), counts(&[("matlab", 2)]));
        let queue = [
            member.clone(),
            // Members may not go past the reservation's licenses: 3, 2 taken by job 10.
            queued(11, Counts::new(), counts(&[("matlab", 2)])),
            // Others: 1 matlab and 300 nvme are not held by it.
            queued(20, Counts::new(), counts(&[("matlab", 2)])),
            queued(21, counts(&[("nvme", 400)]), Counts::new()),
            queued(22, Counts::new(), counts(&[("matlab", 1)])),
            queued(23, counts(&[("nvme", 300)]), Counts::new()),
        ];
        let advance = [AdvanceReservation {
            id: "gpuweek".into(),
            alloc: resv.clone(),
            start: 0.0,
            end: 1000.0,
            members: vec![JobId(10), JobId(11)],
        }];
        let input = PassInput { machine: &c, running: &[], queue: &queue, now: 0.0 };
        let (out, _) = plan_with_advance(&input, &advance, &limits);
        let started: Vec<JobId> = out.starts.iter().map(|s| s.0).collect();
        assert_eq!(started, vec![JobId(10), JobId(22), JobId(23)], "{policy:?}: {out:?}");
        let why = |id: u64| out.waiting.iter().find(|w| w.id == JobId(id)).map(|w| w.reason.to_string());
        let eleven = why(11).unwrap_or_default();
        assert!(eleven.contains("reservation gpuweek") && eleven.contains("license matlab"), "{policy:?}: {eleven}");
        for id in [20, 21] {
            assert!(why(id).is_some(), "{policy:?}: job {id} must wait: {out:?}");
        }
        // The member runs, holding 2 of the reservation's 3 and its nvme: the others still get
        // the one matlab and the 300 nvme it does not hold, not fewer.
        let alloc = out.starts[0].1.clone();
        assert_eq!(alloc[0].licenses, counts(&[("matlab", 2)]));
        c.claim(&alloc);
        let running = [RunningJob { id: JobId(10), alloc, end: 50.0 }];
        let queue =
            [queued(22, Counts::new(), counts(&[("matlab", 1)])), queued(23, counts(&[("nvme", 300)]), Counts::new())];
        let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
        let (out, _) = plan_with_advance(&input, &advance, &limits);
        let started: Vec<JobId> = out.starts.iter().map(|s| s.0).collect();
        assert_eq!(started, vec![JobId(22), JobId(23)], "{policy:?}: {out:?}");
    }
}

/// An advance reservation of licenses alone (3 of 4 matlab, no nodes): its members run on
/// any free cores of the machine with its licenses (and no more than it holds), everyone else
/// gets only the license it does not hold; its part claims licenses only.
#[test]
fn advance_reservations_of_licenses_alone() {
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let c = cluster(&[Counts::new(), Counts::new()], counts(&[("matlab", 4)]));
        let resv = vec![licenses_only(counts(&[("matlab", 3)]))];
        let mut claimed = c.clone();
        claimed.claim(&resv);
        assert_eq!(claimed.licenses.free("matlab"), 1);
        assert_eq!(claimed.nodes().iter().map(|n| n.free_pus.len()).sum::<usize>(), 8, "no node's cores");
        let members = vec![JobId(10), JobId(11), JobId(12), JobId(13)];
        let advance = [AdvanceReservation { id: "lic".into(), alloc: resv, start: 0.0, end: 1000.0, members }];
        let limits = PassLimits { policy, max_reservations: 100, deadline: None };
        let plan = |queue: &[QueuedJob]| {
            let input = PassInput { machine: &c, running: &[], queue, now: 0.0 };
            plan_with_advance(&input, &advance, &limits).0
        };
        // A member on cores anywhere (both nodes' worth), licenses from the reservation.
        let wide = QueuedJob {
            id: JobId(10),
            request: job(2, 4, Counts::new(), counts(&[("matlab", 2)])),
            walltime: 50.0,
            held: false,
        };
        let out = plan(&[wide]);
        assert_eq!(out.starts.len(), 1, "{policy:?}: {out:?}");
        assert_eq!(out.starts[0].1.len(), 2, "{policy:?}: on both nodes");
        assert_eq!(out.starts[0].1[0].licenses, counts(&[("matlab", 2)]));
        let queue = [
            queued(11, Counts::new(), counts(&[("matlab", 2)])),
            queued(12, Counts::new(), Counts::new()),
            // A member past what the reservation holds (3, 2 taken by 11) waits.
            queued(13, Counts::new(), counts(&[("matlab", 2)])),
            // Others: the one license it does not hold, not two.
            queued(20, Counts::new(), counts(&[("matlab", 2)])),
            queued(21, Counts::new(), counts(&[("matlab", 1)])),
        ];
        let out = plan(&queue);
        let started: Vec<JobId> = out.starts.iter().map(|s| s.0).collect();
        assert_eq!(started, vec![JobId(11), JobId(12), JobId(21)], "{policy:?}: {out:?}");
        let why = |id: u64| out.waiting.iter().find(|w| w.id == JobId(id)).map(|w| w.reason.to_string());
        assert!(why(13).unwrap_or_default().contains("license matlab"), "{policy:?}: {:?}", why(13));
        assert!(why(20).is_some(), "{policy:?}: {out:?}");
    }
}

#[test]
fn requests_are_read_from_options() {
    let mut o = SubmitOptions::default();
    o.set("gres", "nvme:10,gpu:a100:2").unwrap();
    o.set("licenses", "matlab:2,ansys").unwrap();
    assert_eq!(o.gres, Some(counts(&[("nvme", 10)])));
    assert_eq!((o.gpus_per_node, o.gpu_type.as_deref()), (Some(2), Some("a100")));
    assert_eq!(o.licenses, Some(counts(&[("ansys", 1), ("matlab", 2)])));
    let r = JobRequest::from_options(&o).unwrap();
    assert_eq!((r.gres.clone(), r.licenses.clone()), (counts(&[("nvme", 10)]), counts(&[("ansys", 1), ("matlab", 2)])));
    let mut typed = SubmitOptions::default();
    typed.set("gres", "nvme:fast:3,nvme:2,fpga:big").unwrap();
    assert_eq!(typed.gres, Some(counts(&[("fpga:big", 1), ("nvme", 2), ("nvme:fast", 3)])), "typed: by NAME:TYPE");
    for bad in ["nvme:0", "nvme:9x:1", "nvme:fast:0", "", "nvme:1,nvme:2", "9x:1", "nvme:a:b:1"] {
        assert!(SubmitOptions::default().set("gres", bad).is_err(), "{bad}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random jobs placed, claimed and released in random order: no node ever gives more of a
    /// resource than it has, the cluster never more licenses than exist, and what is free is
    /// always what exists minus what the jobs holding it hold.
    #[test]
    fn never_over_given(
        node_gres in prop::collection::vec(0u32..6, 1..5),
        total_lic in 0u32..6,
        steps in prop::collection::vec((1u32..3, 0u32..4, 0u32..4, any::<bool>()), 1..40),
    ) {
        let gres: Vec<Counts> =
            node_gres.iter().map(|&n| if n == 0 { Counts::new() } else { counts(&[("nvme", n)]) }).collect();
        let lic = if total_lic == 0 { Counts::new() } else { counts(&[("lic", total_lic)]) };
        let mut c = cluster(&gres, lic);
        let mut held: Vec<berth_core::job::Allocation> = vec![];
        for (nodes, g, l, release) in steps {
            if release && !held.is_empty() {
                let a = held.remove(0);
                c.release(&a);
            } else {
                let want_g = if g == 0 { Counts::new() } else { counts(&[("nvme", g)]) };
                let want_l = if l == 0 { Counts::new() } else { counts(&[("lic", l)]) };
                match c.place(&job(nodes, 1, want_g.clone(), want_l.clone())) {
                    Fit::Now(a) => {
                        prop_assert_eq!(a.iter().filter(|p| !p.licenses.is_empty()).count(), usize::from(l > 0));
                        prop_assert!(a.iter().all(|p| p.gres == want_g));
                        c.claim(&a);
                        held.push(a);
                    }
                    Fit::Busy(why) => prop_assert!(!why.to_string().is_empty()),
                    Fit::Never(why) => prop_assert!(!why.to_string().is_empty()),
                }
            }
            // Invariants.
            let lic_held: u32 = held.iter().flatten().map(|p| p.licenses.get("lic").copied().unwrap_or(0)).sum();
            prop_assert!(lic_held <= total_lic, "{} licenses held of {}", lic_held, total_lic);
            prop_assert_eq!(c.licenses.free("lic"), total_lic - lic_held);
            for n in c.nodes() {
                let total = n.gres_total.get("nvme").copied().unwrap_or(0);
                let on_node: u32 = held
                    .iter()
                    .flatten()
                    .filter(|p| p.node_id == n.id)
                    .map(|p| p.gres.get("nvme").copied().unwrap_or(0))
                    .sum();
                prop_assert!(on_node <= total, "{}: {} of {} given", n.name, on_node, total);
                prop_assert_eq!(n.free_gres("nvme"), total - on_node);
            }
        }
    }
}
