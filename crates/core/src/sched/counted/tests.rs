//! The count plan against its definition, on random workloads run through a small event loop
//! like the simulator's.

use super::{CountPlan, CountedJob};
use crate::JobId;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct W {
    submit: f64,
    cpus: u64,
    run: f64,
    estimate: f64,
}

/// Estimates: exact (the kept plan must be the fresh plan), at least the run time (jobs end
/// early: compression), or either way (jobs also overrun).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Estimates {
    Exact,
    Over,
    Any,
}

fn workload() -> impl Strategy<Value = (u64, Vec<W>, Estimates)> {
    let mode = prop_oneof![Just(Estimates::Exact), Just(Estimates::Over), Just(Estimates::Any)];
    (1u64..9, mode).prop_flat_map(|(total, mode)| {
        let job = (0u32..15, 1..=total, 1u32..40, 0u32..30, any::<bool>());
        proptest::collection::vec(job, 1..30).prop_map(move |raw| {
            let mut submit = 0.0;
            let jobs = raw
                .into_iter()
                .map(|(gap, cpus, run, extra, shorter)| {
                    submit += gap as f64;
                    let estimate = match mode {
                        Estimates::Exact => run as f64,
                        Estimates::Over => (run + extra) as f64,
                        Estimates::Any if shorter => (run / 2).max(1) as f64,
                        Estimates::Any => (run + extra) as f64,
                    };
                    W { submit, cpus, run: run as f64, estimate }
                })
                .collect();
            (total, jobs, mode)
        })
    })
}

/// Conservative backfill from its definition: each job of `queue` in order at the earliest of
/// now and the ends after now at which `cpus` more stay within `total` over its estimate,
/// beside `running` (processors, expected end) and the jobs before it. Returns the starts and
/// the reservations (job, start), by job.
fn definition(
    total: u64,
    now: f64,
    mut free: u64,
    running: &[(u64, f64)],
    queue: &[CountedJob],
) -> (Vec<JobId>, Vec<(JobId, f64)>) {
    let mut held: Vec<(f64, f64, u64)> = running.iter().map(|&(c, end)| (now, end.max(now), c)).collect();
    let (mut starts, mut reserved) = (vec![], vec![]);
    for job in queue {
        let used = |held: &[(f64, f64, u64)], t: f64| -> u64 {
            held.iter().filter(|h| h.0 <= t && t < h.1).map(|h| h.2).sum()
        };
        let fits = |t: f64| {
            let mut points: Vec<f64> =
                held.iter().flat_map(|h| [h.0, h.1]).filter(|&p| p > t && p < t + job.walltime).collect();
            points.push(t);
            points.iter().all(|&p| used(&held, p) + job.cpus <= total)
        };
        let mut times: Vec<f64> = held.iter().map(|h| h.1).filter(|&e| e > now).collect();
        times.push(now);
        times.sort_by(f64::total_cmp);
        let at = times.into_iter().find(|&t| fits(t)).expect("every job fits the machine");
        held.push((at, at + job.walltime, job.cpus));
        if at == now && job.cpus <= free {
            free -= job.cpus;
            starts.push(job.id);
        } else {
            reserved.push((job.id, at));
        }
    }
    reserved.sort_by_key(|r| r.0);
    (starts, reserved)
}

/// Most processors committed at any of `points` by `running` and `planned` (start, estimate,
/// processors).
fn peak(running: &[(u64, f64)], planned: &[(f64, f64, u64)], now: f64) -> u64 {
    let mut points: Vec<f64> = planned.iter().map(|p| p.0).collect();
    points.push(now);
    points
        .iter()
        .map(|&t| {
            let r: u64 = running.iter().filter(|r| r.1.max(now) > t).map(|r| r.0).sum();
            let p: u64 = planned.iter().filter(|p| p.0 <= t && t < p.0 + p.1).map(|p| p.2).sum();
            r + p
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The kept plan, run as the simulator runs it, against a fresh plan at every pass and
    /// against the definition: with exact estimates the kept plan is the fresh plan
    /// (starts and every reservation); with jobs ending early, no reservation is ever later
    /// than in the pass before; always, the fresh plan is the definition's, and no more
    /// processors are ever committed than exist.
    #[test]
    fn kept_plans_are_fresh_plans((total, jobs, mode) in workload()) {
        let mut kept = CountPlan::new(total, true);
        let mut fresh = CountPlan::new(total, true);
        // (job, expected end, actual end)
        let mut running: Vec<(usize, f64, f64)> = vec![];
        let mut queue: Vec<usize> = vec![];
        let (mut submitted, mut free, mut done) = (0usize, total, 0usize);
        let mut before: Vec<(JobId, f64)> = vec![];
        let job = |i: usize| CountedJob { id: JobId(i as u64), cpus: jobs[i].cpus, walltime: jobs[i].estimate };
        while done < jobs.len() {
            // Ends, and reservations' starts (as the simulator wakes for them).
            let next_end = running.iter().map(|r| r.2).chain(kept.wake()).min_by(f64::total_cmp);
            let next_submit = jobs.get(submitted).map(|j| j.submit);
            let now = match (next_end, next_submit) {
                (Some(e), Some(s)) => e.min(s),
                (e, s) => e.or(s).expect("jobs left but no event"),
            };
            for &(i, expected, _) in running.iter().filter(|r| r.2 == now) {
                free += jobs[i].cpus;
                done += 1;
                kept.ended(JobId(i as u64), now, expected, jobs[i].cpus);
            }
            running.retain(|r| r.2 != now);
            while submitted < jobs.len() && jobs[submitted].submit <= now {
                queue.push(submitted);
                submitted += 1;
            }
            let held: Vec<(u64, f64)> = running.iter().map(|r| (jobs[r.0].cpus, r.1)).collect();
            let queued: Vec<CountedJob> = queue.iter().map(|&i| job(i)).collect();
            let new: Vec<CountedJob> = queued.iter().copied().filter(|j| j.id >= kept.next_new()).collect();
            prop_assert_eq!(new.len(), submitted - kept.next_new().0.min(submitted as u64) as usize);
            let from_kept = if kept.can_keep(now) {
                kept.pass_kept(now, free, &new)
            } else {
                None
            };
            let starts = from_kept.unwrap_or_else(|| kept.pass_afresh(now, free, held.iter().copied(), &queued));
            let fresh_starts = fresh.pass_afresh(now, free, held.iter().copied(), &queued);
            let (want_starts, want_reserved) = definition(total, now, free, &held, &queued);
            prop_assert_eq!(&fresh_starts, &want_starts, "fresh plan at {}", now);
            prop_assert_eq!(fresh.reservations(), want_reserved, "fresh plan at {}", now);
            if mode == Estimates::Exact {
                prop_assert_eq!(&starts, &fresh_starts, "kept plan at {}", now);
                prop_assert_eq!(kept.reservations(), fresh.reservations(), "kept plan at {}", now);
            }
            let reserved = kept.reservations();
            if mode != Estimates::Any {
                for (i, at) in &reserved {
                    if let Some((_, was)) = before.iter().find(|b| b.0 == *i) {
                        prop_assert!(at <= was, "job {} moved from {} to {} at {}", i, was, at, now);
                    }
                }
            }
            let planned: Vec<(f64, f64, u64)> = reserved
                .iter()
                .map(|&(id, at)| (at, jobs[id.0 as usize].estimate, jobs[id.0 as usize].cpus))
                .chain(starts.iter().map(|&id| (now, jobs[id.0 as usize].estimate, jobs[id.0 as usize].cpus)))
                .collect();
            prop_assert!(peak(&held, &planned, now) <= total, "over {} processors at {}", total, now);
            for &id in &starts {
                let i = id.0 as usize;
                prop_assert!(queue.contains(&i) && jobs[i].submit <= now);
                free = free.checked_sub(jobs[i].cpus).expect("started on processors in use");
                running.push((i, now + jobs[i].estimate, now + jobs[i].run));
                kept.started(id, now + jobs[i].estimate, now + jobs[i].run);
            }
            queue.retain(|&i| !starts.contains(&JobId(i as u64)));
            before = reserved;
        }
        prop_assert!(queue.is_empty() && submitted == jobs.len());
    }
}

fn job(id: u64, cpus: u64, walltime: f64) -> CountedJob {
    CountedJob { id: JobId(id), cpus, walltime }
}

/// Compression: B (2 of 2 processors, 10 s) waits for A, which ends at 10 instead of 100: B
/// moves from 100 to 10 (and starts), C (2 processors, 5 s, behind B) from 110 to 20.
#[test]
fn an_early_end_moves_reservations_earlier() {
    let mut plan = CountPlan::new(2, true);
    let (a, b, c) = (job(0, 1, 100.0), job(1, 2, 10.0), job(2, 2, 5.0));
    assert_eq!(plan.pass_afresh(0.0, 2, std::iter::empty(), &[a, b, c]), vec![JobId(0)]);
    assert_eq!(plan.reservations(), vec![(JobId(1), 100.0), (JobId(2), 110.0)]);
    assert_eq!(plan.next_new(), JobId(3));
    plan.started(JobId(0), 100.0, 10.0);
    plan.ended(JobId(0), 10.0, 100.0, 1);
    assert!(plan.must_pass());
    assert!(plan.can_keep(10.0));
    assert_eq!(plan.pass_kept(10.0, 2, &[]), Some(vec![JobId(1)]));
    assert_eq!(plan.reservations(), vec![(JobId(2), 20.0)]);
    assert!(!plan.must_pass());
    // The simulator wakes for C's reservation, at which nothing ends.
    assert_eq!(plan.wake(), Some(20.0));
}

/// A job past its estimate: the plan counted on its processors, so the pass plans afresh
/// (the job counts as ending now) and what cannot start now stays reserved now.
#[test]
fn an_overrunning_job_makes_the_pass_plan_afresh() {
    let mut plan = CountPlan::new(2, true);
    let (a, b) = (job(0, 2, 10.0), job(1, 1, 10.0));
    assert_eq!(plan.pass_afresh(0.0, 2, std::iter::empty(), &[a, b]), vec![JobId(0)]);
    plan.started(JobId(0), 10.0, 30.0);
    assert!(!plan.can_keep(10.0));
    assert_eq!(plan.pass_afresh(10.0, 0, [(2, 10.0)].into_iter(), &[b]), Vec::<JobId>::new());
    assert_eq!(plan.reservations(), vec![(JobId(1), 10.0)]);
    // At the next event the reservation at 10 is stale: the kept pass declines.
    assert_eq!(plan.pass_kept(20.0, 0, &[]), None);
}

/// Rounds by counts: `round_counted` from plain values, on a machine of single CPUs counted
/// (an allocation is its CPU count).
mod rounds {
    use super::super::{CountPlan, CountedMachine};
    use crate::placement::reason::{Busy, Never};
    use crate::placement::JobRequest;
    use crate::sched::backfill::{BackfillPolicy, Fit, Machine, PassLimits, QueuedJob, RunningJob};
    use crate::sched::priority::{PriorityInput, PriorityWeights};
    use crate::sched::round::{
        round_counted, JobPriority, PriorityRound, ResumeRule, RoundDecisions, RoundInput, RoundMachine,
    };
    use crate::sched::testkit::queued;
    use crate::JobId;

    #[derive(Debug, Clone)]
    struct Cpus {
        total: u64,
        free: u64,
    }

    impl Machine for Cpus {
        type Alloc = u64;
        fn place(&self, req: &JobRequest) -> Fit<u64> {
            let want = req.total_cpus();
            match want {
                _ if want > self.total => Fit::Never(Never::Cores { cores: want, nodes: self.total, per_node: 1 }),
                _ if want > self.free => Fit::Busy(Busy::Unstated),
                _ => Fit::Now(want),
            }
        }
        fn claim(&mut self, alloc: &u64) {
            self.free -= alloc;
        }
        fn release(&mut self, alloc: &u64) {
            self.free += alloc;
        }
        fn free_cpus(&self) -> u64 {
            self.free
        }
    }

    impl RoundMachine for Cpus {}

    impl CountedMachine for Cpus {
        fn counts_suffice(&self) -> bool {
            true
        }
        fn cpus_held(alloc: &u64) -> u64 {
            *alloc
        }
    }

    fn input<'a>(machine: &'a Cpus, running: &'a [RunningJob<u64>], queue: &'a [QueuedJob]) -> RoundInput<'a, Cpus> {
        RoundInput {
            machine,
            running,
            queue,
            priority: None,
            user_limits: None,
            usage: None,
            barred: None,
            suspended: &[],
            resume: ResumeRule::Whole { relocate: false },
            preempt: None,
            limits: PassLimits { policy: BackfillPolicy::Conservative, max_reservations: usize::MAX, deadline: None },
            reasons: true,
            idle_unless: None,
        }
    }

    /// Every decision, one line each.
    fn lines(d: &RoundDecisions<u64>) -> Vec<String> {
        let mut out: Vec<String> = d
            .starts
            .iter()
            .map(|s| format!("start {} on {}{}", s.id, s.alloc, if s.backfilled { " (backfilled)" } else { "" }))
            .collect();
        for w in &d.waiting {
            let at = w.expected_start.map(|t| format!(", expected at {t}")).unwrap_or_default();
            out.push(format!("wait {}: {}{at}", w.id, w.reason.code()));
        }
        out.push(format!("passed {}, backfilled {}", d.passed, d.backfilled));
        out
    }

    /// 4 CPUs, 3 busy until t=10. Job 1 (4 CPUs) is reserved at 10; job 2 (1 CPU, 5 s) fits
    /// before it and starts, backfilled; job 3 (1 CPU, 20 s) would run into job 1's
    /// reservation, so it is reserved after it, at 20; job 4 never fits, job 5 is held: neither
    /// is planned.
    #[test]
    fn a_round_by_counts_starts_reserves_and_says_why() {
        let machine = Cpus { total: 4, free: 1 };
        let running = [RunningJob { id: JobId(100), alloc: 3, end: 10.0 }];
        let mut held = queued(5, 1, 5.0);
        held.held = true;
        let queue = [queued(1, 4, 10.0), queued(2, 1, 5.0), queued(3, 1, 20.0), queued(4, 5, 1.0), held];
        let mut plan = CountPlan::new(4, true);
        let d = round_counted(&input(&machine, &running, &queue), &mut plan, 0.0);
        assert_eq!(
            lines(&d),
            vec![
                "start 2 on 1 (backfilled)".to_string(),
                "wait 1: Resources, expected at 10".into(),
                "wait 3: Resources, expected at 20".into(),
                "wait 4: ReqNodeNotAvail".into(),
                "wait 5: JobHeldUser".into(),
                "passed true, backfilled 1".into(),
            ]
        );
        assert_eq!(plan.reservations(), vec![(JobId(1), 10.0), (JobId(3), 20.0)]);
        assert_eq!(plan.wake(), Some(10.0));
    }

    /// One definition of a backfill, as the other passes: a start behind only a job larger
    /// than the machine and a held one overtakes nobody; one behind a job waiting for CPUs
    /// does. With and without reasons, the count is the starts flagged.
    #[test]
    fn a_round_by_counts_flags_only_starts_that_overtook_a_waiting_job() {
        let machine = Cpus { total: 4, free: 2 };
        let running = [RunningJob { id: JobId(100), alloc: 2, end: 100.0 }];
        let mut held = queued(5, 1, 10.0);
        held.held = true;
        let behind_never = [queued(1, 8, 10.0), held.clone(), queued(3, 2, 10.0)];
        let behind_busy = [queued(2, 4, 10.0), held, queued(3, 2, 10.0)];
        for (queue, flagged) in [(&behind_never[..], false), (&behind_busy[..], true)] {
            for reasons in [true, false] {
                let mut input = input(&machine, &running, queue);
                input.reasons = reasons;
                let d = round_counted(&input, &mut CountPlan::new(4, false), 0.0);
                let got: Vec<(JobId, bool)> = d.starts.iter().map(|s| (s.id, s.backfilled)).collect();
                assert_eq!(got, vec![(JobId(3), flagged)], "reasons {reasons}: {:?}", lines(&d));
                assert_eq!(d.backfilled, usize::from(flagged), "reasons {reasons}: {:?}", lines(&d));
            }
        }
    }

    /// Kept from round to round: at 10, job 1's reservation is due (job 100 ended when
    /// expected) and starts; job 6, new, is planned after every earlier reservation.
    #[test]
    fn a_kept_plan_starts_what_is_due_and_plans_new_jobs_after() {
        let mut plan = CountPlan::new(4, true);
        let machine = Cpus { total: 4, free: 1 };
        let running = [RunningJob { id: JobId(100), alloc: 3, end: 10.0 }];
        let queue = [queued(1, 4, 10.0), queued(2, 1, 5.0), queued(3, 1, 20.0)];
        let d = round_counted(&input(&machine, &running, &queue), &mut plan, 0.0);
        assert_eq!(d.starts.iter().map(|s| s.id).collect::<Vec<_>>(), vec![JobId(2)]);
        plan.started(JobId(2), 5.0, 5.0);
        plan.ended(JobId(2), 5.0, 5.0, 1);
        plan.ended(JobId(100), 10.0, 10.0, 3);
        assert!(!plan.must_pass(), "ends as expected compress nothing");
        let machine = Cpus { total: 4, free: 4 };
        let queue = [queued(1, 4, 10.0), queued(3, 1, 20.0), queued(6, 1, 1.0)];
        assert_eq!(plan.next_new(), JobId(4));
        let d = round_counted(&input(&machine, &[], &queue), &mut plan, 10.0);
        assert_eq!(
            lines(&d),
            vec![
                "start 1 on 4".to_string(),
                "wait 3: Resources, expected at 20".into(),
                "wait 6: Resources, expected at 20".into(),
                "passed true, backfilled 0".into(),
            ]
        );
        assert_eq!(plan.next_new(), JobId(7));
    }

    /// With priorities the round orders the queue (highest first, then earlier submission,
    /// then lower id) before the plan: job 2, submitted first, is planned first and takes the
    /// only CPU free; job 1 waits for it.
    #[test]
    fn a_round_by_counts_plans_in_the_rounds_priority_order() {
        let machine = Cpus { total: 2, free: 1 };
        let running = [RunningJob { id: JobId(100), alloc: 1, end: 30.0 }];
        let queue = [queued(1, 1, 50.0), queued(2, 1, 50.0)];
        let prio = |submit_time: f64| JobPriority {
            input: PriorityInput { submit_time, cpus: 1, queue_factor: 0.0, fair_share_factor: 0.0 },
            admin: None,
        };
        let jobs = [prio(5.0), prio(0.0)];
        let weights = PriorityWeights { age: 1000.0, max_age_secs: 100.0, ..PriorityWeights::default() };
        let mut input = input(&machine, &running, &queue);
        input.priority = Some(PriorityRound { weights: &weights, machine_cpus: 2, jobs: &jobs });
        let d = round_counted(&input, &mut CountPlan::new(2, false), 20.0);
        assert_eq!(
            lines(&d),
            vec![
                "start 2 on 1".to_string(),
                "wait 1: Resources, expected at 30".into(),
                "passed true, backfilled 0".into()
            ]
        );
        // Nothing free: the round skips the pass when told the smallest job's CPUs.
        let full = Cpus { total: 2, free: 0 };
        let mut idle = self::input(&full, &running, &queue);
        idle.idle_unless = Some(1);
        let d = round_counted(&idle, &mut CountPlan::new(2, false), 20.0);
        assert!(!d.passed && d.starts.is_empty());
    }
}
