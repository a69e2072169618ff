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
    plan(&input, &PassLimits { policy, max_reservations: 100, deadline: None })
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
    assert_eq!(out.backfilled.len(), 0);
}

#[test]
fn easy_backfills_only_what_ends_before_the_head_starts() {
    let (cluster, running, queue) = two_nodes();
    let out = pass(&cluster, &running, &queue, BackfillPolicy::Easy);
    assert_eq!(summary(&out), ["3 start n1:2-3", "1 wait resources at 50", "2 wait priority", "4 wait resources"]);
    assert_eq!(out.backfilled.len(), 1);
}

/// Issue 17 item 8, on the topology-aware cluster. Two nodes of 4 cores: n0 free, n1 busy until
/// 50. The head (5 cores) fits at 50; its reservation takes n1, which only then comes free,
/// and one core of n0, so that 3 cores stay free for jobs running past 50 (textbook EASY's 3
/// extra processors; first fit by index took n0 and left none). A job ending by 50 uses the
/// head's core of n0 first, so the long one after it still starts.
#[test]
fn easy_reserves_what_is_busy_now_first() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(1, "0-3")], 50.0)];
    let queue = [queued(1, 5, 10.0), queued(2, 2, 40.0), queued(3, 2, 100.0)];
    let input = PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 };
    let limits = PassLimits { policy: BackfillPolicy::Easy, max_reservations: 100, deadline: None };
    let (out, reservations) = plan_with_reservations(&input, &limits);
    let head = crate::sched::testkit::alloc_text(&reservations[0].alloc);
    assert!(head.contains("n1:0-3"), "the head's reservation {head} leaves out the cores busy now");
    let started: Vec<u64> = out.starts.iter().map(|(id, _)| id.0).collect();
    assert_eq!(started, [2, 3], "{:?}", summary(&out));
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
    assert_eq!(out.backfilled.len(), 1);
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
        assert_eq!(out.backfilled.len(), 0, "{policy:?}");
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
        let out = plan(&input, &PassLimits { policy, max_reservations: 0, deadline: None });
        assert_eq!(summary(&out), ["1 wait resources", "2 wait priority", "3 wait priority", "4 wait priority"]);
    }
}

/// Past the reservation limit, conservative backfill still starts jobs that touch no
/// reservation, and gives them no expected start.
/// Three nodes of 4 cores: n0 full until 100, n1:0-1 until 50, n2:0-2 until 1000. Job 1
/// wants a whole node (n1 from 50), job 2 would fit n1:2-3 now and end by 50, job 3 fits n2:3.
fn one_reservation_decides() -> (ClusterState, Vec<RunningJob<Allocation>>, Vec<QueuedJob>) {
    let mut cluster = ClusterBuilder::new().nodes(3, 1, 4, 0).build();
    let running = vec![
        hold(&mut cluster, 100, &[(0, "0-3")], 100.0),
        hold(&mut cluster, 101, &[(1, "0-1")], 50.0),
        hold(&mut cluster, 102, &[(2, "0-2")], 1000.0),
    ];
    let queue = vec![queued_nodes(1, 1, 4, 10.0), queued(2, 2, 40.0), queued(3, 1, 1000.0)];
    (cluster, running, queue)
}

#[test]
fn conservative_past_the_limit_only_starts_jobs_beside_every_reservation() {
    let (cluster, running, queue) = one_reservation_decides();
    // Job 1 reserves n1 from 50 (the one reservation allowed). Job 2 would fit n1:2-3 now and
    // end by 50, but past the limit only "beside every reservation" counts; job 3 fits n2:3.
    let input = PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 };
    let out = plan(&input, &PassLimits { policy: BackfillPolicy::Conservative, max_reservations: 1, deadline: None });
    assert_eq!(summary(&out), ["3 start n2:3", "1 wait resources at 50", "2 wait priority"]);
}

thread_local! {
    static TICKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A clock that advances by one each time it is read.
fn ticking() -> u64 {
    TICKS.with(|t| {
        t.set(t.get() + 1);
        t.get()
    })
}

/// Out of time is as past the limit: the same decisions as `max_reservations: 1` above, when
/// the budget runs out after the first job's reservation.
#[test]
fn conservative_out_of_time_reserves_no_more() {
    let (cluster, running, queue) = one_reservation_decides();
    let input = PassInput { machine: &cluster, running: &running, queue: &queue, now: 0.0 };
    TICKS.with(|t| t.set(0));
    // Read once per job: 1 for job 1 (in time), 2 for job 2 (the deadline).
    let deadline = Some(Deadline { at: 2, clock: std::sync::Arc::new(ticking) });
    let limits = PassLimits { policy: BackfillPolicy::Conservative, max_reservations: 100, deadline };
    assert_eq!(summary(&plan(&input, &limits)), ["3 start n2:3", "1 wait resources at 50", "2 wait priority"]);
    // With time to spare, job 2 gets its own reservation and starts now (it ends by 50).
    TICKS.with(|t| t.set(0));
    let limits = PassLimits { deadline: Some(Deadline { at: 1_000, clock: std::sync::Arc::new(ticking) }), ..limits };
    let out = plan(&input, &limits);
    assert!(summary(&out).contains(&"2 start n1:2-3".to_string()), "{:?}", summary(&out));
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
    assert_eq!(out.backfilled.len(), 2);
}

/// PUs `cpus` of node `node` (no memory), unclaimed: a reservation's resources.
fn part(cluster: &ClusterState, node: usize, cpus: &str) -> Allocation {
    let n = &cluster.nodes()[node];
    let cpus = crate::CpuSet::parse_list(cpus).expect("cpu list");
    vec![crate::job::NodeAllocation {
        gres: Default::default(),
        licenses: Default::default(),
        node_id: n.id,
        node: n.name.clone(),
        cores: cpus.len() as u32,
        mems: n.topology.mems_for(&cpus),
        cpus,
        memory_bytes: 0,
        numa_memory: vec![],
        exclusive_numa: crate::CpuSet::new(),
        subnodes: vec![],
        binding: vec![],
        ranks: vec![],
        gpus: vec![],
    }]
}

fn advance(id: &str, alloc: Allocation, (start, end): (f64, f64), members: &[u64]) -> AdvanceReservation<Allocation> {
    AdvanceReservation { id: id.into(), alloc, start, end, members: members.iter().map(|&m| JobId(m)).collect() }
}

fn pass_at(
    cluster: &ClusterState,
    running: &[RunningJob<Allocation>],
    queue: &[QueuedJob],
    resv: &[AdvanceReservation<Allocation>],
    policy: BackfillPolicy,
    now: f64,
) -> PassOutput<Allocation> {
    let input = PassInput { machine: cluster, running, queue, now };
    plan_with_advance(&input, resv, &PassLimits { policy, max_reservations: 100, deadline: None }).0
}

const POLICIES: [BackfillPolicy; 3] = [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative];

/// n1 is reserved over [100, 300) for others: a job that would still run at 100 starts on n0;
/// one that ends by 100 may use n1 now.
#[test]
fn advance_reservation_is_used_now_only_by_jobs_that_end_before_it() {
    let cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let resv = [advance("maint", part(&cluster, 1, "0-3"), (100.0, 300.0), &[])];
    let queue = [queued(1, 4, 200.0), queued(2, 4, 50.0), queued(3, 4, 200.0)];
    for policy in POLICIES {
        let out = pass_at(&cluster, &[], &queue, &resv, policy, 0.0);
        let s = summary(&out);
        assert_eq!(&s[..2], ["1 start n0:0-3", "2 start n1:0-3"], "{policy:?}");
        assert!(s[2].starts_with("3 wait resources"), "{policy:?}: {s:?}");
    }
}

/// With n0 busy until 1000 and n1 reserved over [100, 300), a 200 s job cannot start now
/// (n1 would be held into the window): reason "reserved", expected when the window ends.
#[test]
fn a_job_that_would_run_into_a_window_waits_for_its_end() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-3")], 1000.0)];
    let resv = [advance("maint", part(&cluster, 1, "0-3"), (100.0, 300.0), &[])];
    let queue = [queued(1, 4, 200.0), queued(2, 2, 50.0)];
    for policy in [BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        let out = pass_at(&cluster, &running, &queue, &resv, policy, 0.0);
        assert_eq!(summary(&out), ["2 start n1:0-1", "1 wait resources at 300"], "{policy:?}");
        let why = out.waiting[0].reason.describe();
        assert!(why.contains("advance reservation maint"), "{policy:?}: {why}");
    }
    let out = pass_at(&cluster, &running, &queue, &resv, BackfillPolicy::Fcfs, 0.0);
    assert_eq!(summary(&out), ["1 wait resources", "2 wait priority"]);
}

/// Members wait for the window (expected at its start), then start on the reservation's
/// resources only, though others are free; a member that would run past the end never does.
#[test]
fn members_run_only_inside_their_reservation() {
    let cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let resv = [advance("course", part(&cluster, 1, "0-3"), (100.0, 300.0), &[1, 2, 3, 4])];
    let queue = [queued(1, 2, 100.0), queued(2, 2, 150.0), queued(3, 2, 100.0), queued(4, 1, 250.0)];
    for policy in POLICIES {
        let before = pass_at(&cluster, &[], &queue, &resv, policy, 0.0);
        let s = summary(&before);
        assert_eq!(s[..3], ["1 wait resources at 100", "2 wait resources at 100", "3 wait resources"], "{policy:?}");
        assert_eq!(s[3], "4 wait never", "{policy:?}");
        assert!(before.waiting[0].reason.describe().contains("reservation course has not started"));
        let during = pass_at(&cluster, &[], &queue, &resv, policy, 120.0);
        // 2 would end at 270 (fits), 3 waits for room, 4 can no longer end by 300.
        assert_eq!(
            summary(&during),
            ["1 start n1:0-1", "2 start n1:2-3", "3 wait resources", "4 wait never"],
            "{policy:?}"
        );
    }
}

/// Running members hold part of the reservation; the rest is for the next members.
#[test]
fn members_share_the_reservation_with_running_members() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 9, &[(1, "0")], 250.0)];
    let resv = [advance("r", part(&cluster, 1, "0-3"), (100.0, 300.0), &[9, 1, 2])];
    let queue = [queued(1, 2, 100.0), queued(2, 2, 100.0)];
    let out = pass_at(&cluster, &running, &queue, &resv, BackfillPolicy::Easy, 150.0);
    assert_eq!(summary(&out), ["1 start n1:1-2", "2 wait resources"]);
}

/// Where a reservation can go: on the machine as it will be at its start, beside running jobs
/// that will still run then and other reservations whose windows overlap.
#[test]
fn place_for_window_respects_running_jobs_and_other_reservations() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-3")], 50.0), hold(&mut cluster, 101, &[(1, "0-3")], 500.0)];
    let req = queued(0, 4, 0.0).request;
    let text = |f: Fit<Allocation>| match f {
        Fit::Now(a) => crate::sched::testkit::alloc_text(&a),
        Fit::Busy(_) => "busy".into(),
        Fit::Never(_) => "never".into(),
    };
    assert_eq!(text(place_for_window(&cluster, &running, &[], &req, (100.0, 200.0), 0.0)), "n0:0-3");
    assert_eq!(text(place_for_window(&cluster, &running, &[], &req, (10.0, 200.0), 0.0)), "busy");
    assert_eq!(text(place_for_window(&cluster, &running, &[], &req, (600.0, 700.0), 0.0)), "n0:0-3");
    let other = [advance("a", part(&cluster, 0, "0-3"), (150.0, 250.0), &[])];
    assert_eq!(text(place_for_window(&cluster, &running, &other, &req, (100.0, 200.0), 0.0)), "busy");
    assert_eq!(text(place_for_window(&cluster, &running, &other, &req, (250.0, 400.0), 0.0)), "n0:0-3");
    assert_eq!(text(place_for_window(&cluster, &running, &other, &req, (600.0, 700.0), 0.0)), "n0:0-3");
    let big = queued_nodes(0, 1, 8, 0.0).request;
    assert_eq!(text(place_for_window(&cluster, &running, &[], &big, (600.0, 700.0), 0.0)), "never");
}

/// Without advance reservations the pass is exactly `plan_with_reservations`'s.
#[test]
fn no_advance_reservation_is_the_plain_pass() {
    let (cluster, running, queue) = two_nodes();
    for policy in POLICIES {
        let a = pass_at(&cluster, &running, &queue, &[], policy, 0.0);
        assert_eq!(summary(&a), summary(&pass(&cluster, &running, &queue, policy)));
    }
}

/// A request rejected by the free count (the memo's shortcut once it was placed) reads as the
/// placement's own answer, so one situation has one phrasing: per node and in all.
#[test]
fn a_count_rejects_in_placement_words() {
    use super::pass::{Memo, Tracked, NOW};
    for req in [queued_nodes(1, 1, 4, 10.0).request, queued(1, 4, 10.0).request] {
        let cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
        let mut machine = Tracked::new(cluster);
        let mut memo = Memo::default();
        for _ in 0..2 {
            match memo.place(&machine, NOW, &req) {
                Fit::Now(alloc) => machine.claim(&alloc),
                other => panic!("{other:?}"),
            }
        }
        let placements = memo.placements;
        let Fit::Busy(counted) = memo.place(&machine, NOW, &req) else { panic!("the machine is full") };
        assert_eq!(memo.placements, placements, "the count answers, not a placement");
        let Fit::Busy(placed) = Machine::place(&machine.machine, &req) else { panic!("the machine is full") };
        assert_eq!(counted, placed);
        assert!(!matches!(counted, crate::placement::reason::Busy::Counted { .. }), "{counted:?}");
    }
    let per_node = queued_nodes(1, 1, 4, 10.0).request;
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let _ = (hold(&mut cluster, 100, &[(0, "0-3")], 10.0), hold(&mut cluster, 101, &[(1, "0-3")], 10.0));
    assert_eq!(
        Machine::busy_by_count(&cluster, &per_node, 4, 0).to_string(),
        "cores: 1 node with 4 free cores each wanted, no node has that many free now; it starts when running jobs free them"
    );
}
