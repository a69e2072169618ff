//! The count plan against its definition, on random workloads run through a small event loop
//! like the simulator's.

use super::{CountPlan, Job};
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
    queue: &[Job],
) -> (Vec<usize>, Vec<(usize, f64)>) {
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
            starts.push(job.index);
        } else {
            reserved.push((job.index, at));
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
        let mut before: Vec<(usize, f64)> = vec![];
        let job = |i: usize| Job { index: i, cpus: jobs[i].cpus, walltime: jobs[i].estimate };
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
                kept.ended(now, expected, jobs[i].cpus);
            }
            running.retain(|r| r.2 != now);
            while submitted < jobs.len() && jobs[submitted].submit <= now {
                queue.push(submitted);
                submitted += 1;
            }
            let held: Vec<(u64, f64)> = running.iter().map(|r| (jobs[r.0].cpus, r.1)).collect();
            let queued: Vec<Job> = queue.iter().map(|&i| job(i)).collect();
            let is_running = |i: usize| running.iter().any(|r| r.0 == i);
            let new = kept.planned()..submitted;
            let from_kept = if kept.can_keep(now, is_running) {
                kept.pass_kept(now, free, new.map(job), submitted)
            } else {
                None
            };
            let starts = from_kept.unwrap_or_else(|| kept.pass_afresh(now, free, held.iter().copied(), &queued, submitted));
            let fresh_starts = fresh.pass_afresh(now, free, held.iter().copied(), &queued, submitted);
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
                .map(|&(i, at)| (at, jobs[i].estimate, jobs[i].cpus))
                .chain(starts.iter().map(|&i| (now, jobs[i].estimate, jobs[i].cpus)))
                .collect();
            prop_assert!(peak(&held, &planned, now) <= total, "over {} processors at {}", total, now);
            for &i in &starts {
                prop_assert!(queue.contains(&i) && jobs[i].submit <= now);
                free = free.checked_sub(jobs[i].cpus).expect("started on processors in use");
                running.push((i, now + jobs[i].estimate, now + jobs[i].run));
                kept.started(i, now + jobs[i].estimate, now + jobs[i].run);
            }
            queue.retain(|i| !starts.contains(i));
            before = reserved;
        }
        prop_assert!(queue.is_empty() && submitted == jobs.len());
    }
}

/// Compression: B (2 of 2 processors, 10 s) waits for A, which ends at 10 instead of 100: B
/// moves from 100 to 10 (and starts), C (2 processors, 5 s, behind B) from 110 to 20.
#[test]
fn an_early_end_moves_reservations_earlier() {
    let mut plan = CountPlan::new(2, true);
    let a = Job { index: 0, cpus: 1, walltime: 100.0 };
    let b = Job { index: 1, cpus: 2, walltime: 10.0 };
    let c = Job { index: 2, cpus: 2, walltime: 5.0 };
    assert_eq!(plan.pass_afresh(0.0, 2, std::iter::empty(), &[a, b, c], 3), vec![0]);
    assert_eq!(plan.reservations(), vec![(1, 100.0), (2, 110.0)]);
    plan.started(0, 100.0, 10.0);
    plan.ended(10.0, 100.0, 1);
    assert!(plan.can_keep(10.0, |_| false));
    assert_eq!(plan.pass_kept(10.0, 2, std::iter::empty(), 3), Some(vec![1]));
    assert_eq!(plan.reservations(), vec![(2, 20.0)]);
}

/// A job past its estimate: the plan counted on its processors, so the pass plans afresh
/// (the job counts as ending now) and what cannot start now stays reserved now.
#[test]
fn an_overrunning_job_makes_the_pass_plan_afresh() {
    let mut plan = CountPlan::new(2, true);
    let a = Job { index: 0, cpus: 2, walltime: 10.0 };
    let b = Job { index: 1, cpus: 1, walltime: 10.0 };
    assert_eq!(plan.pass_afresh(0.0, 2, std::iter::empty(), &[a, b], 2), vec![0]);
    plan.started(0, 10.0, 30.0);
    assert!(!plan.can_keep(10.0, |i| i == 0));
    assert_eq!(plan.pass_afresh(10.0, 0, [(2, 10.0)].into_iter(), &[b], 2), Vec::<usize>::new());
    assert_eq!(plan.reservations(), vec![(1, 10.0)]);
    // At the next event the reservation at 10 is stale: the kept pass declines.
    assert_eq!(plan.pass_kept(20.0, 0, std::iter::empty(), 2), None);
}
