//! Conservative plans kept across passes (`kept`): every pass from a kept plan is as valid as
//! a fresh one (no PU or memory booked twice at any moment, every waiting job's expected start
//! its reservation's), and the plan is reused where nothing changed, not where something did.

use super::proptests::{ask, consistent, request, scenario, Scenario};
use super::*;
use crate::job::Allocation;
use crate::sched::testkit::{hold, queued, ClusterBuilder};
use crate::sched::ClusterState;
use crate::JobId;
use proptest::prelude::*;
use std::collections::HashMap;

fn limits(max_reservations: usize) -> PassLimits {
    PassLimits { policy: BackfillPolicy::Conservative, max_reservations, deadline: None }
}

/// The state after a pass at `now` once time reaches `next`: the pass's starts run until their
/// walltime ends, every job expected to end by `next` has ended, as expected.
struct Next {
    cluster: ClusterState,
    running: Vec<RunningJob<Allocation>>,
    queue: Vec<QueuedJob>,
}

fn advance(
    cluster: &ClusterState,
    running: &[RunningJob<Allocation>],
    queue: &[QueuedJob],
    out: &PassOutput<Allocation>,
    now: f64,
    next: f64,
) -> Next {
    let walltime: HashMap<JobId, f64> = queue.iter().map(|j| (j.id, j.walltime)).collect();
    let mut cluster = cluster.clone();
    let started = out.starts.iter().map(|(id, a)| {
        cluster.claim(a);
        RunningJob { id: *id, alloc: a.clone(), end: now + walltime[id] }
    });
    let all: Vec<RunningJob<Allocation>> = running.iter().cloned().chain(started).collect();
    let mut still = vec![];
    for r in all {
        if r.end.max(now) <= next {
            cluster.release(&r.alloc);
        } else {
            still.push(r);
        }
    }
    let queue = queue.iter().filter(|j| !out.starts.iter().any(|(id, _)| *id == j.id)).cloned().collect();
    Next { cluster, running: still, queue }
}

/// The pass at `now` is valid: every queued job decided once, the whole schedule (running jobs,
/// starts, reservations) never books a PU twice or exceeds memory, no reservation in the past,
/// expected starts are the reservations'.
fn valid(
    s: &Scenario,
    n: &Next,
    now: f64,
    out: &PassOutput<Allocation>,
    booked: &[Reservation<Allocation>],
) -> Result<(), String> {
    if out.starts.len() + out.waiting.len() != n.queue.len() {
        return Err(format!("{} decisions for {} jobs", out.starts.len() + out.waiting.len(), n.queue.len()));
    }
    let walltime: HashMap<JobId, f64> = n.queue.iter().map(|j| (j.id, j.walltime)).collect();
    let running = n.running.iter().map(|r| (now, r.end.max(now), r.alloc.clone()));
    let started = out.starts.iter().map(|(id, a)| (now, now + walltime[id], a.clone()));
    let reserved = booked.iter().map(|r| (r.start, r.end, r.alloc.clone()));
    let schedule: Vec<(f64, f64, Allocation)> = running.chain(started).chain(reserved).collect();
    consistent(s, &schedule)?;
    for r in booked {
        if r.start < now {
            return Err(format!("job {} reserved at {} before now {now}", r.id, r.start));
        }
    }
    for w in &out.waiting {
        let reserved = booked.iter().find(|r| r.id == w.id).map(|r| r.start);
        if w.expected_start != reserved {
            return Err(format!("job {} expected at {:?}, reserved at {reserved:?}", w.id, w.expected_start));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Three passes, each from the plan the last kept, time moving on, jobs arriving and now
    /// and then one cancelled: each pass is valid.
    #[test]
    fn passes_from_a_kept_plan_are_valid(
        s in scenario(),
        steps in proptest::collection::vec(0u32..120, 3),
        arrivals in proptest::collection::vec(proptest::collection::vec((ask(), 1u32..300, proptest::bool::weighted(0.1)), 0..3), 3),
        cancel in proptest::collection::vec(proptest::option::weighted(0.3, 0usize..20), 3),
    ) {
        let limits = limits(s.max_reservations);
        let mut kept = None;
        let mut n = Next { cluster: s.cluster.clone(), running: s.running.clone(), queue: s.queue.clone() };
        let mut now = 0.0;
        let mut next_id = 500;
        for pass in 0..3 {
            let input = PassInput { machine: &n.cluster, running: &n.running, queue: &n.queue, now };
            let (out, booked) = plan_keeping(&input, &limits, &mut kept);
            if let Err(e) = valid(&s, &n, now, &out, &booked) {
                prop_assert!(false, "pass {pass} at {now}: {e}");
            }
            prop_assert!(kept.is_some());
            let later = now + steps[pass] as f64;
            n = advance(&n.cluster, &n.running, &n.queue, &out, now, later);
            now = later;
            for &(a, w, held) in &arrivals[pass] {
                n.queue.push(QueuedJob { id: JobId(next_id), request: request(a), walltime: w as f64, held });
                next_id += 1;
            }
            if let Some(i) = cancel[pass].filter(|_| !n.queue.is_empty()) {
                n.queue.remove(i % n.queue.len());
            }
        }
    }

    /// With nothing changed at all (the same input again), the kept plan gives what a fresh
    /// pass gives.
    #[test]
    fn the_same_input_gets_the_same_decisions(s in scenario()) {
        let limits = limits(s.max_reservations);
        let input = PassInput { machine: &s.cluster, running: &s.running, queue: &s.queue, now: 0.0 };
        let mut kept = None;
        let (fresh, booked) = plan_keeping(&input, &limits, &mut kept);
        // Only when nothing started is the same input the state after the pass (about half of
        // the cases).
        if !fresh.starts.is_empty() {
            return Ok(());
        }
        let (again, booked_again) = plan_keeping(&input, &limits, &mut kept);
        prop_assert_eq!(&again.starts, &fresh.starts);
        prop_assert_eq!(&again.waiting, &fresh.waiting);
        let at = |b: &[Reservation<Allocation>]| b.iter().map(|r| (r.id, r.start, r.alloc.clone())).collect::<Vec<_>>();
        prop_assert_eq!(at(&booked_again), at(&booked));
        // Every reservation is kept, unless one is due now (behind an overdue job): that one is
        // planned again, and so may be any later one sharing a node with it.
        let reused = kept.as_ref().map_or(0, |k| k.reused());
        match booked.iter().any(|r| r.start <= 0.0) {
            false => prop_assert_eq!(reused, booked.len()),
            true => prop_assert!(reused < booked.len()),
        }
    }
}

/// Two nodes of 4 cores, both full until 100 and 200; three 4-core jobs queued.
fn full_cluster() -> (ClusterState, Vec<RunningJob<Allocation>>, Vec<QueuedJob>) {
    let mut c = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut c, 90, &[(0, "0-3")], 100.0), hold(&mut c, 91, &[(1, "0-3")], 200.0)];
    let queue = vec![queued(1, 4, 500.0), queued(2, 4, 500.0), queued(3, 4, 50.0)];
    (c, running, queue)
}

#[test]
fn reservations_are_kept_while_nothing_changes() {
    let (c, running, queue) = full_cluster();
    let mut kept = None;
    let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
    let (_, booked) = plan_keeping(&input, &limits(10), &mut kept);
    assert_eq!(booked.iter().map(|r| (r.id.0, r.start)).collect::<Vec<_>>(), [(1, 100.0), (2, 200.0), (3, 600.0)]);
    // Ten seconds on, a new job at the end of the queue: the three reservations stay, the new
    // job is planned beside them.
    let mut queue2 = queue.clone();
    queue2.push(queued(4, 4, 10.0));
    let input = PassInput { machine: &c, running: &running, queue: &queue2, now: 10.0 };
    let (out, booked) = plan_keeping(&input, &limits(10), &mut kept);
    assert_eq!(kept.as_ref().map(|k| k.reused()), Some(3));
    assert!(out.starts.is_empty());
    assert_eq!(
        booked.iter().map(|r| (r.id.0, r.start)).collect::<Vec<_>>(),
        [(1, 100.0), (2, 200.0), (3, 600.0), (4, 650.0)]
    );
}

#[test]
fn a_job_ending_early_makes_the_pass_plan_afresh() {
    let (mut c, running, queue) = full_cluster();
    let mut kept = None;
    let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
    plan_keeping(&input, &limits(10), &mut kept);
    // Job 91 (expected until 200) ends at 50: job 1 starts now, nothing is kept.
    c.release(&running[1].alloc);
    let input = PassInput { machine: &c, running: &running[..1], queue: &queue, now: 50.0 };
    let (out, booked) = plan_keeping(&input, &limits(10), &mut kept);
    assert_eq!(kept.as_ref().map(|k| k.reused()), Some(0));
    assert_eq!(out.starts.iter().map(|s| s.0 .0).collect::<Vec<_>>(), [1]);
    assert_eq!(booked.iter().map(|r| (r.id.0, r.start)).collect::<Vec<_>>(), [(2, 100.0), (3, 550.0)]);
}

#[test]
fn a_due_reservation_starts_and_a_cancelled_job_ends_the_kept_prefix() {
    let (mut c, running, queue) = full_cluster();
    let mut kept = None;
    let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
    plan_keeping(&input, &limits(10), &mut kept);
    // At 100 job 90 ended as expected: job 1's reservation is due and starts on its node; job
    // 2 was cancelled, so job 3 is planned again (and now goes before where job 2 was).
    c.release(&running[0].alloc);
    let queue2 = vec![queue[0].clone(), queue[2].clone()];
    let input = PassInput { machine: &c, running: &running[1..], queue: &queue2, now: 100.0 };
    let (out, booked) = plan_keeping(&input, &limits(10), &mut kept);
    assert_eq!(out.starts.iter().map(|s| (s.0 .0, s.1[0].node_id.0)).collect::<Vec<_>>(), [(1, 0)]);
    assert_eq!(booked.iter().map(|r| (r.id.0, r.start)).collect::<Vec<_>>(), [(3, 200.0)]);
    assert_eq!(kept.as_ref().map(|k| k.reused()), Some(0));
}

#[test]
fn a_drained_node_makes_the_pass_plan_afresh() {
    let (c, running, queue) = full_cluster();
    let mut kept = None;
    let input = PassInput { machine: &c, running: &running, queue: &queue, now: 0.0 };
    plan_keeping(&input, &limits(10), &mut kept);
    let mut drained = c.clone();
    drained.node_at_mut(1).state = crate::node::NodeState::Drained;
    let input = PassInput { machine: &drained, running: &running, queue: &queue, now: 0.0 };
    plan_keeping(&input, &limits(10), &mut kept);
    assert_eq!(kept.as_ref().map(|k| k.reused()), Some(0));
}
