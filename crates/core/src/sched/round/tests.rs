//! Whole rounds from plain values, each checked against its full decisions written out.

use super::*;
use crate::sched::backfill::BackfillPolicy;
use crate::sched::fairshare::FairShareConfig;
use crate::sched::preempt::Preemptible;
use crate::sched::preempt::PREEMPTORS_PER_PASS;
use crate::sched::reason::ReservationWait;
use crate::sched::testkit::{alloc_text, hold, queued, ClusterBuilder};

/// Every decision of a round, one line each, in order.
fn snapshot(d: &RoundDecisions<Allocation>) -> Vec<String> {
    let mut lines = vec![];
    for (id, how) in &d.resumes {
        match how {
            Resume::InPlace => lines.push(format!("resume {id} in place")),
            Resume::Relocated(a) => lines.push(format!("resume {id} moved to {}", alloc_text(a))),
        }
    }
    for s in &d.starts {
        let how = if s.backfilled { " (backfilled)" } else { "" };
        lines.push(format!("start {} on {}{how}", s.id, alloc_text(&s.alloc)));
    }
    for p in &d.preemptions {
        let victims: Vec<String> = p.victims.iter().map(|v| v.to_string()).collect();
        lines.push(format!("suspend {} to start {} on {}", victims.join(","), p.id, alloc_text(&p.alloc)));
    }
    for w in &d.waiting {
        let at = w.expected_start.map(|t| format!(", expected at {t}")).unwrap_or_default();
        lines.push(format!("wait {}: {}{at}", w.id, w.reason.describe()));
    }
    for (id, p) in &d.priorities {
        lines.push(format!("priority {id}: {}", p.total));
    }
    lines.push(format!("passed {}, backfilled {}", d.passed, d.backfilled));
    lines
}

fn limits(policy: BackfillPolicy) -> PassLimits {
    PassLimits { policy, max_reservations: 100, deadline: None }
}

fn input<'a>(
    machine: &'a ClusterState,
    running: &'a [RunningJob<Allocation>],
    queue: &'a [QueuedJob],
) -> RoundInput<'a, ClusterState> {
    RoundInput {
        machine,
        running,
        queue,
        priority: None,
        user_limits: None,
        usage: None,
        barred: None,
        suspended: &[],
        resume: ResumeRule::Whole { relocate: true },
        preempt: None,
        limits: limits(BackfillPolicy::Easy),
        reasons: true,
        idle_unless: None,
    }
}

fn prio(submit_time: f64, cpus: u64) -> JobPriority {
    JobPriority { input: PriorityInput { submit_time, cpus, queue_factor: 0.0, fair_share_factor: 0.0 }, admin: None }
}

/// One node of 8 cores, 6 busy until t=100. In priority order (the oldest first, whatever the
/// order given): job 1 (4 cores) waits for resources with its expected start; job 2 (2 cores,
/// done by then) starts out of order; job 3 would take its user past the queue's limit.
#[test]
fn backfill_wait_with_expected_start_and_user_limit() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 8, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-5")], 100.0)];
    let queue = vec![queued(3, 2, 50.0), queued(2, 2, 50.0), queued(1, 4, 50.0)];
    let weights =
        PriorityWeights { age: 1000.0, size: 0.0, queue: 0.0, fair_share: 0.0, max_age_secs: 100.0, favor_large: true };
    let jobs = [prio(5.0, 2), prio(10.0, 2), prio(0.0, 4)];
    let spec = QueueSpec { name: "small".into(), max_cores_per_user: Some(3), ..Default::default() };
    let per_job = [Some((&spec, ("small".to_string(), 7))), None, None];
    let mut users = HashMap::new();
    users.insert(("small".to_string(), 7), 2);
    let mut i = input(&cluster, &running, &queue);
    i.priority = Some(PriorityRound { weights: &weights, machine_cpus: 8, jobs: &jobs });
    i.user_limits = Some(UserLimits { jobs: &per_job, running: &users });
    let d = round(&i, 20.0);
    assert_eq!(
        snapshot(&d),
        [
            "start 2 on n0:6-7 (backfilled)",
            "wait 1: resources: cores: 4 wanted, 2 free now; it starts when running jobs free 2 more, expected at 100",
            "wait 3: queue limit: queue small lets one user run 3 cores at once; yours use 2, this job needs 2",
            "priority 3: 150",
            "priority 2: 100",
            "priority 1: 200",
            "passed true, backfilled 1",
        ]
    );
}

/// Two nodes of 4 cores. Job 7, suspended on n0, resumes in place (n0 is free again); job 9
/// (class 1: score 1000) finds nothing free and suspends job 3 (score 0) on n1 to start there.
#[test]
fn resume_then_preemption_by_suspension() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 3, &[(1, "0-3")], 500.0)];
    let mut scratch = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let was = hold(&mut scratch, 7, &[(0, "0-3")], 0.0);
    let suspended = [SuspendedInput::whole(SuspendedJob { id: JobId(7), alloc: was.alloc }, 70.0, None)];
    let victims =
        [Preemptible { id: JobId(3), alloc: running[0].alloc.clone(), score: 0.0, suspended_secs: 0.0, start: 0.0 }];
    let queue = vec![crate::sched::testkit::queued_nodes(9, 1, 4, 60.0)];
    let cfg = PreemptConfig { enabled: true, min_run_secs_before_suspend: 0.0, ..Default::default() };
    let jobs = [PreemptJob { class: 1, may_preempt: true, suspendable: true, suspended_secs: 0.0 }];
    let mut i = input(&cluster, &running, &queue);
    i.suspended = &suspended;
    i.preempt = Some(PreemptRound { config: &cfg, jobs: &jobs, victims: &victims, by_id: false });
    let d = round(&i, 30.0);
    assert_eq!(snapshot(&d), ["resume 7 in place", "suspend 3 to start 9 on n1:0-3", "passed true, backfilled 0"]);
    // Without preemption, job 9 waits until job 7 (resumed, 40 s left) ends.
    i.preempt = None;
    assert_eq!(
        snapshot(&round(&i, 30.0)),
        [
            "resume 7 in place",
            "wait 9: resources: cores: 1 node with 4 free cores each wanted, no node has that many free now; it starts when running jobs free them, expected at 70",
            "passed true, backfilled 0",
        ]
    );
}

/// Five high-score jobs wait for resources: only the first `PREEMPTORS_PER_PASS` are tried,
/// each on the state the one before left.
#[test]
fn preemptors_per_round_are_bounded() {
    let mut cluster = ClusterBuilder::new().nodes(6, 1, 2, 0).build();
    let running: Vec<_> = (0..6).map(|n| hold(&mut cluster, 100 + n as u64, &[(n, "0-1")], 1e6)).collect();
    let victims: Vec<Preemptible> = running
        .iter()
        .map(|r| Preemptible { id: r.id, alloc: r.alloc.clone(), score: 0.0, suspended_secs: 0.0, start: 0.0 })
        .collect();
    let queue: Vec<QueuedJob> = (1..=5).map(|id| queued(id, 2, 10.0)).collect();
    let cfg = PreemptConfig { enabled: true, min_run_secs_before_suspend: 0.0, ..Default::default() };
    let jobs = [PreemptJob { class: 1, may_preempt: true, suspendable: true, suspended_secs: 0.0 }; 5];
    let mut i = input(&cluster, &running, &queue);
    i.preempt = Some(PreemptRound { config: &cfg, jobs: &jobs, victims: &victims, by_id: false });
    let d = round(&i, 0.0);
    assert_eq!(d.preemptions.len(), PREEMPTORS_PER_PASS);
    let victims: Vec<JobId> = d.preemptions.iter().flat_map(|p| p.victims.clone()).collect();
    let mut distinct = victims.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), victims.len(), "a job suspended twice: {victims:?}");
    assert_eq!(d.waiting.iter().map(|w| w.id.0).collect::<Vec<_>>(), [5]);
}

/// Fewer CPUs free than the smallest job needs: no pass (nothing could start), resumes still.
#[test]
fn idle_round_skips_the_pass() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 1, &[(0, "0-2")], 10.0)];
    let queue = vec![queued(2, 2, 5.0)];
    let mut i = input(&cluster, &running, &queue);
    i.idle_unless = Some(2);
    assert_eq!(snapshot(&round(&i, 0.0)), ["passed false, backfilled 0"]);
    i.idle_unless = None;
    assert_eq!(
        snapshot(&round(&i, 0.0)),
        [
            "wait 2: resources: cores: 2 wanted, 1 free now; it starts when running jobs free 1 more, expected at 10",
            "passed true, backfilled 0",
        ]
    );
}

/// Job 7 was suspended on n0:0-3, which job 3 now holds: it resumes moved to the free cores of
/// the same node (and job 9 finds nothing left); without relocation it stays suspended.
#[test]
fn resume_moved_to_other_cores_of_its_node() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 8, 0).build();
    let running = vec![hold(&mut cluster, 3, &[(0, "0-3")], 50.0)];
    let mut scratch = ClusterBuilder::new().nodes(1, 1, 8, 0).build();
    let was = hold(&mut scratch, 7, &[(0, "0-3")], 0.0);
    let suspended = [SuspendedInput::whole(SuspendedJob { id: JobId(7), alloc: was.alloc }, 20.0, None)];
    let queue = vec![queued(9, 4, 10.0)];
    let mut i = input(&cluster, &running, &queue);
    i.suspended = &suspended;
    assert_eq!(
        snapshot(&round(&i, 0.0)),
        [
            "resume 7 moved to n0:4-7",
            "wait 9: resources: cores: 4 wanted, 0 free now; it starts when running jobs free 4 more, expected at 20",
            "passed true, backfilled 0",
        ]
    );
    i.resume = ResumeRule::Whole { relocate: false };
    assert_eq!(snapshot(&round(&i, 0.0)), ["start 9 on n0:4-7", "passed true, backfilled 0"]);
}

/// The controller's rule, part by part. Two nodes of 8 cores. Job 7 was suspended on
/// n0:0-3, half of which job 3 now holds: it resumes moved to free cores of n0. Job 8 was
/// suspended on n1:0-7, which job 4 holds until t=10: it stays suspended, says why, and holds
/// job 4 back by its 50 s left, so job 9 (a whole node) is expected at 60, not 10. A node not
/// connected resumes nothing.
#[test]
fn parts_rule_moves_parts_says_why_and_holds_back() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 8, 0).build();
    let running = vec![hold(&mut cluster, 3, &[(0, "0-1")], 100.0), hold(&mut cluster, 4, &[(1, "0-7")], 10.0)];
    let mut scratch = ClusterBuilder::new().nodes(2, 1, 8, 0).build();
    let was7 = hold(&mut scratch, 7, &[(0, "0-3")], 0.0).alloc;
    let was8 = hold(&mut scratch, 8, &[(1, "0-7")], 0.0).alloc;
    let mut s7 = SuspendedInput::whole(SuspendedJob { id: JobId(7), alloc: was7 }, 40.0, None);
    s7.holds_back = Some(40.0);
    let mut s8 = SuspendedInput::whole(SuspendedJob { id: JobId(8), alloc: was8 }, 50.0, None);
    s8.holds_back = Some(50.0);
    let suspended = [s7, s8];
    let queue = vec![crate::sched::testkit::queued_nodes(9, 1, 8, 30.0)];
    let all = |_: NodeId| true;
    let mut i = input(&cluster, &running, &queue);
    i.suspended = &suspended;
    i.resume = ResumeRule::Parts { connected: &all };
    let d = round_keeping(&i, &[], &mut None, 0.0);
    assert_eq!(
        snapshot(&d),
        [
            "resume 7 moved to n0:2-5",
            "wait 9: resources: cores: 1 node with 8 free cores each wanted, no node has that many free now; it starts when running jobs free them, expected at 60",
            "passed true, backfilled 0",
        ]
    );
    let still: Vec<(JobId, String)> = d.still_suspended.iter().map(|(id, w)| (*id, w.to_string())).collect();
    assert_eq!(still, [(JobId(8), "waiting for 8 cores on n1 to resume (0 free)".to_string())]);
    assert_eq!(d.still_suspended[0].1.code(), "Resources");
    let n0_only = |n: NodeId| n.0 == 0;
    i.resume = ResumeRule::Parts { connected: &n0_only };
    i.suspended = &suspended[1..];
    let d = round_keeping(&i, &[], &mut None, 0.0);
    assert!(d.resumes.is_empty());
    assert_eq!(d.still_suspended, [(JobId(8), ResumeWait::NotConnected("n1".into()))]);
    assert_eq!(d.still_suspended[0].1.code(), "NodeDown");
}

/// A job barred from the pass (e.g. asking for an advance reservation it cannot use) is
/// ordered and waits with its reason; the rest is planned as without it. With every job
/// barred no pass runs.
#[test]
fn barred_jobs_wait_outside_the_pass() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 1, &[(0, "0-1")], 10.0)];
    let queue = vec![queued(2, 2, 5.0), queued(3, 2, 5.0)];
    let mut barred = HashMap::new();
    barred.insert(JobId(2), PendingReason::Reservation(ReservationWait::Gone { name: "r1".into() }));
    let mut i = input(&cluster, &running, &queue);
    i.barred = Some(&barred);
    let d = round(&i, 0.0);
    assert_eq!(
        snapshot(&d),
        [
            "start 3 on n0:2-3",
            "wait 2: reservation r1 no longer exists (ended or deleted); cancel the job",
            "passed true, backfilled 0"
        ]
    );
    assert_eq!(d.planned, 1);
    let queue = &queue[..1];
    i.queue = queue;
    let d = round(&i, 0.0);
    assert_eq!(
        snapshot(&d),
        ["wait 2: reservation r1 no longer exists (ended or deleted); cancel the job", "passed false, backfilled 0"]
    );
}

/// Job 9 (one node of 4 cores for 60 s) at t=0 on `cluster` (two nodes of 4 cores) with
/// `running`, every one of them a victim preemption may suspend, beside advance reservation r1
/// (node `window_node`'s PUs 0-3 from t=20 to t=1000): the round's decisions with the window,
/// then without it.
fn preempt_beside_window(
    cluster: &ClusterState,
    running: &[RunningJob<Allocation>],
    window_node: usize,
) -> (RoundDecisions<Allocation>, RoundDecisions<Allocation>) {
    let victims: Vec<Preemptible> = running
        .iter()
        .map(|r| Preemptible { id: r.id, alloc: r.alloc.clone(), score: 0.0, suspended_secs: 0.0, start: 0.0 })
        .collect();
    let mut scratch = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let window = AdvanceReservation {
        id: "r1".into(),
        alloc: hold(&mut scratch, 0, &[(window_node, "0-3")], 0.0).alloc,
        start: 20.0,
        end: 1000.0,
        members: vec![],
    };
    let queue = vec![crate::sched::testkit::queued_nodes(9, 1, 4, 60.0)];
    let cfg = PreemptConfig { enabled: true, min_run_secs_before_suspend: 0.0, ..Default::default() };
    let jobs = [PreemptJob { class: 1, may_preempt: true, suspendable: true, suspended_secs: 0.0 }];
    let mut i = input(cluster, running, &queue);
    i.preempt = Some(PreemptRound { config: &cfg, jobs: &jobs, victims: &victims, by_id: true });
    (round_keeping(&i, std::slice::from_ref(&window), &mut None, 0.0), round_keeping(&i, &[], &mut None, 0.0))
}

/// An advance reservation's window keeps a job off its resources, in the pass and in
/// preemption alike: n1 is free but reserved from t=20, longer than job 9 runs, so job 9
/// suspends job 3 on n0 instead. Without the window it starts on n1.
#[test]
fn advance_windows_bound_the_pass_and_preemption() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 3, &[(0, "0-3")], 500.0)];
    let (d, without) = preempt_beside_window(&cluster, &running, 1);
    assert_eq!(snapshot(&d), ["suspend 3 to start 9 on n0:0-3", "passed true, backfilled 0"]);
    assert_eq!(d.preemptions[0].waited.id, JobId(9));
    assert!(matches!(d.preemptions[0].waited.reason, PendingReason::Resources(_)));
    assert_eq!(snapshot(&without), ["start 9 on n1:0-3", "passed true, backfilled 0"]);
}

/// A running job on the PUs of an advance reservation's window (it ends before the window
/// opens) makes no room there for a preemptor that would run into the window: suspended, it
/// gives back none of the window's PUs, which stay claimed (as the controller keeps them).
/// Job 9 (4 cores, 60 s) at t=0: n0 is held by job 3 (ending at 15) under window r1 (n0:0-3
/// from t=20), n1 by job 4; job 9 suspends job 4 and starts on n1, not in the window on n0.
#[test]
fn a_victim_under_a_window_gives_back_none_of_the_window() {
    let mut cluster = ClusterBuilder::new().nodes(2, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 3, &[(0, "0-3")], 15.0), hold(&mut cluster, 4, &[(1, "0-3")], 500.0)];
    let (d, without) = preempt_beside_window(&cluster, &running, 0);
    assert_eq!(snapshot(&d), ["suspend 4 to start 9 on n1:0-3", "passed true, backfilled 0"]);
    // Without the window, the cheapest victim first: job 3, and job 9 on n0.
    assert_eq!(snapshot(&without), ["suspend 3 to start 9 on n0:0-3", "passed true, backfilled 0"]);
}

/// Usage charged by the round, before it orders the queue. One node of 4 cores, job 1 of
/// account a running on it since t=50 at 4 billed CPUs, charged until t=0. At t=100 it is
/// charged 200 CPU-seconds (from its start, not from the last charge), and account a's
/// fair-share factor drops from 1 to 0.5: job 3 (account b) goes before job 2 (account a),
/// which it followed on equal factors (under EASY the first waiting job alone is given its
/// expected start). Charged until t=100 already: nothing more to charge,
/// the factors given stand.
#[test]
fn usage_charged_before_the_priority_order() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 4, 0).build();
    let running = vec![hold(&mut cluster, 1, &[(0, "0-3")], 500.0)];
    let queue = vec![queued(2, 4, 50.0), queued(3, 4, 50.0)];
    let weights =
        PriorityWeights { age: 0.0, size: 0.0, queue: 0.0, fair_share: 1000.0, max_age_secs: 100.0, favor_large: true };
    let mut jobs = [prio(10.0, 4), prio(20.0, 4)];
    for j in &mut jobs {
        j.input.fair_share_factor = 1.0;
    }
    let share = FairShare::new(FairShareConfig::default());
    let usage_jobs = [UsageJob { account: "a".into(), rate: 4.0, start: 50.0 }];
    let accounts = ["a".to_string(), "b".to_string()];
    let mut i = input(&cluster, &running, &queue);
    i.priority = Some(PriorityRound { weights: &weights, machine_cpus: 4, jobs: &jobs });
    i.usage = Some(UsageRound { share: &share, since: 0.0, running: &usage_jobs, accounts: &accounts });
    let d = round(&i, 100.0);
    assert_eq!(d.charges, [("a".to_string(), 200.0)]);
    assert_eq!(
        snapshot(&d),
        [
            "wait 3: resources: cores: 4 wanted, 0 free now; it starts when running jobs free 4 more, expected at 500",
            "wait 2: resources: cores: 4 wanted, 0 free now; it starts when running jobs free 4 more",
            "priority 2: 500",
            "priority 3: 1000",
            "passed true, backfilled 0",
        ]
    );
    // The caller books the charges as the round did: the same factor.
    let mut booked = share.clone();
    book_charges(&mut booked, &d.charges, 100.0);
    assert_eq!(booked.factor("a"), 0.5);
    i.usage = Some(UsageRound { share: &share, since: 100.0, running: &usage_jobs, accounts: &accounts });
    let d = round(&i, 100.0);
    assert!(d.charges.is_empty());
    assert_eq!(
        snapshot(&d),
        [
            "wait 2: resources: cores: 4 wanted, 0 free now; it starts when running jobs free 4 more, expected at 500",
            "wait 3: resources: cores: 4 wanted, 0 free now; it starts when running jobs free 4 more",
            "priority 2: 1000",
            "priority 3: 1000",
            "passed true, backfilled 0",
        ]
    );
}

/// One node of 8 cores, 6 busy until t=100. Job 1 (16 cores) can never fit and job 2 (4 cores)
/// waits for resources; job 3 (2 cores) starts behind both: a backfill, since it overtook job
/// 2. Job 4 (2 cores) behind only the job that can never fit starts in order: it overtook no
/// job waiting for resources or priority (held jobs and jobs that can never fit are not
/// overtaken). Under every policy the round counts exactly the starts it flags.
#[test]
fn the_backfill_count_is_the_starts_flagged() {
    let mut cluster = ClusterBuilder::new().nodes(1, 1, 8, 0).build();
    let running = vec![hold(&mut cluster, 100, &[(0, "0-5")], 100.0)];
    let mut held = queued(5, 1, 10.0);
    held.held = true;
    let behind_never = [queued(1, 16, 10.0), held.clone(), queued(4, 2, 10.0), queued(2, 4, 50.0), queued(3, 2, 10.0)];
    let behind_busy = [queued(1, 16, 10.0), queued(2, 4, 50.0), held, queued(3, 2, 10.0)];
    for policy in [BackfillPolicy::Fcfs, BackfillPolicy::Easy, BackfillPolicy::Conservative] {
        for (queue, want) in [(&behind_never[..], vec![(4, false)]), (&behind_busy[..], vec![(3, true)])] {
            let mut i = input(&cluster, &running, queue);
            i.limits = limits(policy);
            for reasons in [true, false] {
                i.reasons = reasons;
                let d = round(&i, 0.0);
                let flagged = d.starts.iter().filter(|s| s.backfilled).count();
                assert_eq!(d.backfilled, flagged, "{policy:?}, reasons {reasons}: {:?}", snapshot(&d));
                let got: Vec<(u64, bool)> = d.starts.iter().map(|s| (s.id.0, s.backfilled)).collect();
                // FCFS starts nothing behind a job waiting for resources, so never backfills.
                let want = match policy {
                    BackfillPolicy::Fcfs => want.iter().copied().filter(|&(_, b)| !b).collect(),
                    _ => want.clone(),
                };
                assert_eq!(got, want, "{policy:?}, reasons {reasons}: {:?}", snapshot(&d));
            }
        }
    }
}
