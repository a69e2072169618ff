//! EASY backfill (Lifka's Argonne scheduler): jobs start in priority order until the first
//! that cannot (the head). The head gets a reservation: the earliest time `T` at which it fits
//! once running jobs end, and the resources `R` it would get then. Every later job may start
//! now if it fits now and either ends by `T` or fits beside `R` (on the machine with `R`
//! claimed too), so nothing it starts can delay the head.
//!
//! Which resources `R` are matters as much as `T`: `R` is placed preferring what the jobs
//! ending by `T` free (busy now) over what is free now ([`Machine::place_preferring`]), and a
//! job ending by `T` uses the part of `R` free now before anything else. What stays free
//! beside `R` is then textbook EASY's "extra" processors; on a machine of interchangeable
//! cores this pass schedules job for job as textbook EASY (issue 17 item 8: first fit by index
//! at `T` often put `R` on cores free now, and backfill lost them: lublin_256's mean wait was
//! 7.7% above textbook EASY's; `sim/tests/textbook_easy.rs` compares the two).
//!
//! Reasons of later jobs that do not start: `Resources` when they do not fit what is free now
//! (by the free count or a remembered answer), else `Priority`: they would have to use what is
//! kept for the head.
//!
//! With `max_reservations == 0` no reservation is computed and the pass is FCFS after the head.
//! A head that would not fit even once every running job ended (a placement that cannot be
//! found on the idle machine) gets no reservation and does not stop the pass; the next busy
//! job becomes the head.

use super::advance::{Layers, Windows};
use super::conservative::{earliest_in, overlaps};
use super::pass::{counted_cpus, Detail, Outcome, Tracked, NOW, RESERVED};
use super::timeline::Timeline;
use super::{Fit, Machine, PassInput, PassLimits, PassOutput, QueuedJob, Reservation};
use crate::placement::JobRequest;
use crate::sched::reason::{PendingReason, Unsuitable, Wanting};

/// The head's reservation: when it starts, the machine now with its resources claimed, and
/// (when part of them is free now) those resources, for jobs ending by then to use first.
struct Head<M: Machine> {
    at: f64,
    reserved: Tracked<M>,
    free_now: Option<M::Alloc>,
}

enum Phase<M: Machine> {
    /// Starting in order; no job has been busy yet.
    InOrder,
    Reserved(Head<M>),
    /// No reservation may be computed (`max_reservations == 0`): nothing overtakes.
    Blocked,
}

/// The pass; `windows` (advance reservations, usually none) are kept off by every job that
/// would run into them, the head's reservation included.
pub(super) fn plan<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    windows: &Windows<M::Alloc>,
    detail: Detail,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    let now = input.now;
    let mut machine = Tracked::new(input.machine.clone());
    // One memo per set of windows a job overlaps; only the first without windows.
    let mut memos = Layers::new(windows);
    let mut out = Outcome::new(input.queue, detail);
    // Jobs started before the head: they hold resources until now + walltime.
    let mut started: Vec<(f64, M::Alloc)> = vec![];
    let mut phase = Phase::InOrder;
    let mut reservations = vec![];
    for job in input.queue {
        if job.held {
            out.wait(job.id, PendingReason::Held, None);
            continue;
        }
        let end = now + walltime(job);
        // The windows it would run into.
        let k = windows.layer(now, walltime(job));
        match &mut phase {
            Phase::InOrder => match memos.place(windows, &mut machine, NOW, k, &job.request) {
                Fit::Now(alloc) => {
                    machine.claim(&alloc);
                    started.push((end, alloc.clone()));
                    out.start(job.id, alloc);
                }
                Fit::Never(why) => out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why)), None),
                Fit::Busy(what) => {
                    let reason = memos.busy_reason(windows, &mut machine, NOW, k, &job.request, what);
                    if limits.max_reservations == 0 {
                        phase = Phase::Blocked;
                        out.wait(job.id, reason, None);
                        continue;
                    }
                    let head = if windows.is_empty() {
                        will_run_at(&machine, input.running, &started, &job.request, now)
                    } else {
                        let mut timeline = Timeline::new(&machine, input.running, &started, now);
                        let w = walltime(job);
                        earliest_in(&mut timeline, &windows.book, &job.request, w, &[]).map(|(at, alloc)| {
                            let beside: Vec<&M::Alloc> =
                                windows.book.iter().filter(|r| overlaps(r, at, w)).map(|r| &r.alloc).collect();
                            match timeline.place_preferring_freed(at, &beside, &job.request) {
                                Fit::Now(preferred) => (at, preferred),
                                _ => (at, alloc),
                            }
                        })
                    };
                    match head {
                        Some((at, alloc)) => {
                            let mut reserved = machine.clone();
                            reserved.claim(&alloc);
                            // Fewer CPUs free beside it than now: it holds some that are free now.
                            let free_now = (reserved.free_cpus() < machine.free_cpus()).then(|| alloc.clone());
                            phase = Phase::Reserved(Head { at, reserved, free_now });
                            reservations.push(Reservation { id: job.id, start: at, end: at + walltime(job), alloc });
                            out.wait(job.id, reason, Some(at));
                        }
                        None => out.wait(job.id, reason, None),
                    }
                }
            },
            Phase::Blocked => out.wait(job.id, PendingReason::Priority, None),
            // Starts only, a job already overtaking a waiting one, too big for what is free
            // (now, or beside the head if it would still run then): it does not start, and
            // saying why would change nothing.
            Phase::Reserved(head)
                if !out.reports_waiting()
                    && out.blocked()
                    && counted_cpus(&job.request).is_some_and(|n| {
                        n > if end <= head.at { machine.free_cpus() } else { head.reserved.free_cpus() }
                    }) => {}
            Phase::Reserved(head) => {
                // Ends by the head's start: only what is free now matters. Else it must also
                // stay off the head's resources.
                let short = end <= head.at;
                let fit = if short {
                    match &head.free_now {
                        // Use what the head holds first: what else is free stays for jobs
                        // that run past its start (textbook EASY's extra processors).
                        Some(reserved) if k == 0 => {
                            memos.base().place_preferring(&machine, NOW, &[reserved], &job.request)
                        }
                        _ => memos.place(windows, &mut machine, NOW, k, &job.request),
                    }
                } else {
                    memos.place(windows, &mut head.reserved, RESERVED, k, &job.request)
                };
                match fit {
                    Fit::Now(alloc) => {
                        machine.claim(&alloc);
                        head.reserved.claim(&alloc);
                        out.start(job.id, alloc);
                    }
                    Fit::Never(why) => out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why)), None),
                    Fit::Busy(what) if short => {
                        let reason = memos.busy_reason(windows, &mut machine, NOW, k, &job.request, what);
                        out.wait(job.id, reason, None)
                    }
                    Fit::Busy(_) => {
                        let reason = match memos.base().busy_on(&machine, NOW, &job.request) {
                            Some(what) => PendingReason::Resources(Wanting::Busy(what)),
                            // Starts only: the reason is not reported (both block alike).
                            None if !out.reports_waiting() => PendingReason::Priority,
                            None => memos.why_waiting(windows, &mut machine, k, &job.request, out.started()),
                        };
                        out.wait(job.id, reason, None);
                    }
                }
            }
        }
    }
    (out.finish(), reservations)
}

/// A job's walltime estimate as a duration: negative or NaN counts as 0.
pub(super) fn walltime(job: &QueuedJob) -> f64 {
    job.walltime.max(0.0)
}

/// When `req` would start if nothing else started: running jobs (and `started`, started by
/// this pass and claimed on `machine`) release their resources in order of expected end; the
/// first end after which `req` fits is its start, with the allocation it would get.
///
/// Found by galloping over the distinct end times then bisecting (a few placements, not one
/// per end time), which assumes that releasing more never makes a fit impossible; where the
/// placement heuristics break that, the time found is a time it fits, if not the earliest.
pub(super) fn will_run_at<M: Machine>(
    machine: &Tracked<M>,
    running: &[super::RunningJob<M::Alloc>],
    started: &[(f64, M::Alloc)],
    req: &JobRequest,
    now: f64,
) -> Option<(f64, M::Alloc)> {
    let mut timeline = Timeline::new(machine, running, started, now);
    let times = timeline.end_times();
    let need = counted_cpus(req);
    let mut fits_at = |i: usize| -> Option<M::Alloc> {
        timeline.move_to(times[i]);
        if need.is_some_and(|n| n > timeline.scratch.free_cpus()) {
            return None;
        }
        match timeline.scratch.machine.place(req) {
            Fit::Now(alloc) => Some(alloc),
            _ => None,
        }
    };
    let last = times.len().checked_sub(1)?;
    // Gallop: 0, 1, 3, 7, ... until it fits; `lo` is the last index known not to fit.
    let (mut lo, mut step, mut i) = (None::<usize>, 1usize, 0usize);
    let (mut hi, mut alloc) = loop {
        if let Some(alloc) = fits_at(i) {
            break (i, alloc);
        }
        if i == last {
            return None;
        }
        lo = Some(i);
        i = (i + step).min(last);
        step *= 2;
    };
    // Bisect between the last miss and the first fit found.
    while let Some(l) = lo.filter(|&l| hi - l > 1) {
        let mid = l + (hi - l) / 2;
        match fits_at(mid) {
            Some(a) => (hi, alloc) = (mid, a),
            None => lo = Some(mid),
        }
    }
    // Where, at that time: what the jobs ending by then free before what is free now.
    match timeline.place_preferring_freed(times[hi], &[], req) {
        Fit::Now(preferred) => Some((times[hi], preferred)),
        _ => Some((times[hi], alloc)),
    }
}
