//! Small readable scenarios, one per policy, with the expected decisions spelled out.

use super::*;
use crate::job::Allocation;
use crate::sched::testkit::{hold, queued, queued_nodes, summary, ClusterBuilder};
use crate::sched::ClusterState;

fn pass(
    cluster: &ClusterState,
    running: &[RunningJob<Allocation>],
    queue: &[QueuedJob],
    policy: BackfillPolicy,
) -> PassOutput<Allocation> {
    let input = PassInput { machine: cluster, running, queue, now: 0.0 };
    plan(&input, &PassLimits { policy, max_reservations: 100 })
}

/// Two nodes of 4 cores. n0 is full until 100; n1 has cores 0-1 busy until 50.
/// Job 1 wants a whole node: it can start at 50 on n1.
fn two_nodes() -> (ClusterState, Vec<RunningJob<Allocation>>, Vec<QueuedJob>) {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-3")], 100.0), hold(&mut cluster, 101, &[(1, "0-1")], 50.0)];
    let queue = vec![
        queued_nodes(1, 1, 4, 10.0),
        // Fits n1:2-3 now, but runs past 50 on the head's node.
        queued(2, 2, 100.0),
        // Fits n1:2-3 now and ends by 50.
        queued(3, 2, 40.0),
        queued(4, 1, 10.0),
    ];
    (cluster, running, queue)
}

#[test]
fn fcfs_stops_at_the_first_busy_job() {
    let (cluster, running, queue) = two_nodes();
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Fcfs);
    assert_eq!(summary(&out), ["1 wait resources", "2 wait priority", "3 wait priority", "4 wait priority"]);
    assert_eq!(out.backfilled, 0);
}

#[test]
fn easy_backfills_only_what_ends_before_the_head_starts() {
    let (cluster, running, queue) = two_nodes();
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Easy);
    assert_eq!(summary(&out), ["3 start n1:2-3", "1 wait resources at 50", "2 wait priority", "4 wait resources"]);
    assert_eq!(out.backfilled, 1);
}

#[test]
fn conservative_reserves_for_every_job_in_order() {
    let (cluster, running, queue) = two_nodes();
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Conservative);
    // 1 at 50 on n1 (until 60); 2 at 60 when n1 is free again; 3 now (ends at 40, before
    // anyone's reservation); 4 at 40, when 3 ends.
    assert_eq!(
        summary(&out),
        ["3 start n1:2-3", "1 wait resources at 50", "2 wait priority at 60", "4 wait resources at 40"]
    );
    assert_eq!(out.backfilled, 1);
}

#[test]
fn held_and_never_fitting_jobs_are_passed_over_by_every_policy() {
    let cluster = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let mut held = queued(1, 1, 10.0);
    held.held = true;
    let queue = [held, queued_nodes(2, 1, 8, 10.0), queued(3, 4, 10.0)];
    for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let out = pass(&cluster, &[], &queue, policy);
        assert_eq!(summary(&out), ["3 start n0:0-3", "1 wait held", "2 wait never"], "{policy:?}");
        assert_eq!(out.backfilled, 0, "{policy:?}");
    }
}

/// An overdue job (end in the past) is expected to leave at any moment: the head's
/// reservation is "now", and only zero-length jobs could go before it.
#[test]
fn overdue_jobs_count_as_ending_now() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-1")], -5.0)];
    let queue = [queued(1, 4, 10.0), queued(2, 2, 10.0)];
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Easy);
    assert_eq!(summary(&out), ["1 wait resources at 0", "2 wait priority"]);
}

/// Without a reservation allowed, nothing may overtake the first waiting job.
#[test]
fn without_reservations_backfill_is_fcfs() {
    let (cluster, running, queue) = two_nodes();
    let input = PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 };
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let out = plan(&input, &PassLimits { policy, max_reservations: 0 });
        assert_eq!(summary(&out), ["1 wait resources", "2 wait priority", "3 wait priority", "4 wait priority"]);
    }
}

/// Past the reservation limit, conservative backfill still starts jobs that touch no
/// reservation, and gives them no expected start.
#[test]
fn conservative_past_the_limit_only_starts_jobs_beside_every_reservation() {
    let mut cluster = ClusterBuilder::new().nodes(3, 1, 4, 0).build();
    let running = vec![
        hold(&mut cluster, 100, &[(0, "0-3")], 100.0),
        hold(&mut cluster, 101, &[(1, "0-1")], 50.0),
        hold(&mut cluster, 102, &[(2, "0-2")], 1000.0),
    ];
    // Job 1 reserves n1 from 50 (the one reservation allowed). Job 2 would fit n1:2-3 now and
    // end by 50, but past the limit only "beside every reservation" counts; job 3 fits n2:3.
    let queue = [queued_nodes(1, 1, 4, 10.0), queued(2, 2, 40.0), queued(3, 1, 1000.0)];
    let input = PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 };
    let out = plan(&input, &PassLimits { policy: BackfillPolicy::Conservative, max_reservations: 1 });
    assert_eq!(summary(&out), ["3 start n2:3", "1 wait resources at 50", "2 wait priority"]);
}

/// Long jobs may still start beside the head's reservation, never on it.
#[test]
fn easy_starts_long_jobs_that_stay_off_the_reservation() {
    let mut cluster = ClusterBuilder::new().nodes(3, 1, 4, 0).build();
    let running = vec![
        hold(&mut cluster, 100, &[(0, "0-3")], 100.0),
        hold(&mut cluster, 101, &[(1, "0-1")], 50.0),
        hold(&mut cluster, 102, &[(2, "0-1")], 1000.0),
    ];
    // The head reserves n1 from 50. Job 2 (long) goes on n2 beside it; job 3 (long) has
    // nowhere left but n1; job 4 (short) uses n1 until 10.
    let queue = [queued_nodes(1, 1, 4, 10.0), queued(2, 2, 1000.0), queued(3, 2, 1000.0), queued(4, 2, 10.0)];
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Easy);
    assert_eq!(summary(&out), ["2 start n2:2-3", "4 start n1:2-3", "1 wait resources at 50", "3 wait priority"]);
    assert_eq!(out.backfilled, 2);
}
