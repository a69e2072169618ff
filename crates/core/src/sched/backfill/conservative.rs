//! Conservative backfill (Mu'alem and Feitelson): every waiting job, in priority order, gets a
//! reservation at the earliest time it fits beside the running jobs and every earlier
//! reservation, for its whole walltime; it starts now when that time is now. So no job ever
//! delays one before it.
//!
//! A job of walltime `w` fits at `t` when it can be placed on: the machine now, minus the
//! running jobs (and jobs this pass started) ending by `t`, plus the reservations overlapping
//! `[t, t + w)`. Times tried: now, then the ends of running jobs and of reservations, skipping
//! those at which a CPU count shows it cannot fit ([`Profile`]). After a few misses in a row the
//! times tried thin out (every 2nd, 4th, ...), and the last end (an idle machine) is always
//! tried: a reservation found that way may be later than the earliest possible, never invalid.
//!
//! After `max_reservations` reservations, or once the pass's time budget (`deadline`) has
//! passed, the remaining jobs are only tried now, on the machine with every reservation
//! claimed (so they touch none), and get no expected start. With `max_reservations == 0` the
//! pass is FCFS (as EASY's is).
//!
//! Reasons: `Resources` for a job that does not fit what is free now, `Priority` for one that
//! does but would delay an earlier job's reservation.

use super::advance::{Layers, Windows};
use super::easy::walltime;
use super::pass::{counted_cpus, Detail, Memo, Outcome, Tracked, NOW, RESERVED};
use super::profile::{clear, Profile};
use super::timeline::{clamp_end, Timeline};
use super::{Fit, Machine, PassInput, PassLimits, PassOutput, Reservation};
use crate::placement::JobRequest;
use crate::sched::PendingReason;
use crate::JobId;

/// Consecutive misses after which the times tried thin out.
const DENSE_TRIES: u32 = 4;
/// Most placements tried for one job's reservation (plus the idle machine).
const MAX_TRIES: u32 = 40;

/// What a pass keeps besides the output: the machine now, the same with every reservation
/// claimed, the timeline of ends and the CPU profile (measured when first needed).
struct State<'a, M: Machine> {
    now: f64,
    machine: Tracked<M>,
    all_reserved: Tracked<M>,
    book: Vec<Reservation<M::Alloc>>,
    timeline: Timeline<'a, M>,
    profile: Option<Profile>,
    /// The times a reservation may start at: the timeline's ends and the book's, ascending
    /// and distinct (kept as both grow, not sorted again per job).
    times: Times,
}

impl<M: Machine> State<'_, M> {
    fn start(&mut self, req: &JobRequest, w: f64, alloc: &M::Alloc) {
        self.machine.claim(alloc);
        self.all_reserved.claim(alloc);
        if let (Some(p), Some(cpus)) = (self.profile.as_mut(), counted_cpus(req)) {
            p.take(self.now, self.now + w, cpus);
        }
        self.timeline.add_started(self.now + w, alloc.clone());
        self.times.add_end(clamp_end(self.now + w, self.now), true);
    }

    fn reserve(&mut self, id: JobId, req: &JobRequest, at: f64, w: f64, alloc: M::Alloc) {
        self.all_reserved.claim(&alloc);
        if let (Some(p), Some(cpus)) = (self.profile.as_mut(), counted_cpus(req)) {
            p.take(at, at + w, cpus);
        }
        self.book.push(Reservation { id, start: at, end: at + w, alloc });
        self.times.add_end(at + w, false);
    }
}

/// Candidate start times (see [`State::times`]).
pub(super) struct Times {
    sorted: Vec<f64>,
    /// Some held job (running, or started by the pass) is expected to end now (or is overdue).
    held_end_now: bool,
    now: f64,
}

impl Times {
    pub fn new<M: Machine>(timeline: &Timeline<M>, book: &[Reservation<M::Alloc>]) -> Self {
        let now = timeline.now;
        let mut sorted = timeline.end_times();
        let held_end_now = sorted.first() == Some(&now);
        sorted.extend(book.iter().map(|r| r.end));
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        Times { sorted, held_end_now, now }
    }

    /// An end at `t`; `held` for a job holding resources (not a reservation's).
    fn add_end(&mut self, t: f64, held: bool) {
        self.held_end_now |= held && t == self.now;
        let i = self.sorted.partition_point(|x| x.total_cmp(&t).is_lt());
        if self.sorted.get(i) != Some(&t) {
            self.sorted.insert(i, t);
        }
    }

    /// The times to try after now: "now" was tried on the machine as it is, so now again only
    /// when a held job's end makes it different.
    pub fn after_now(&self) -> &[f64] {
        let now = self.now;
        let from = self.sorted.partition_point(|&t| t < now || (t == now && !self.held_end_now));
        &self.sorted[from..]
    }
}

/// The pass; `windows` (advance reservations, usually none) start in the book as reservations
/// made before any job's: every job keeps off them as off earlier jobs' reservations.
pub(super) fn plan<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    windows: &Windows<M::Alloc>,
    detail: Detail,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    if limits.max_reservations == 0 {
        // No reservation may be computed: nothing can be shown safe to overtake.
        return (super::fcfs(input, windows, detail), vec![]);
    }
    let machine = Tracked::new(input.machine.clone());
    let timeline = Timeline::new(&machine, input.running, &[], input.now);
    let times = Times::new(&timeline, &windows.book);
    let mut s =
        State { now: input.now, all_reserved: machine.clone(), timeline, machine, book: vec![], profile: None, times };
    // Not counted in the profile: it stays an upper bound of what is free.
    for r in &windows.book {
        s.all_reserved.claim(&r.alloc);
        s.book.push(r.clone());
    }
    let advance = windows.book.len();
    let mut memo = Memo::default();
    // Why jobs wait, when the windows are why.
    let mut reasons = Layers::new(windows);
    let mut out = Outcome::new(input.queue, detail);
    // Sticky: once out of time, the rest of the pass reserves nothing.
    let mut out_of_time = false;
    for (i, job) in input.queue.iter().enumerate() {
        if out.nothing_more_starts(i, s.machine.free_cpus()) {
            break;
        }
        if job.held {
            out.wait(job.id, PendingReason::Held, None);
            continue;
        }
        let (w, req) = (walltime(job), &job.request);
        out_of_time = out_of_time || limits.deadline.is_some_and(|d| d.passed());
        if out_of_time || s.book.len() - advance >= limits.max_reservations {
            // Past the limit: now, touching no reservation, or not in this pass.
            match memo.place(&s.all_reserved, RESERVED, req) {
                Fit::Now(alloc) => {
                    s.start(req, w, &alloc);
                    out.start(job.id, alloc);
                }
                Fit::Never(why) => out.wait(job.id, PendingReason::NoSuitableNodes(why), None),
                Fit::Busy(_) => {
                    let reason = match memo.busy_on(&s.machine, NOW, req) {
                        Some(what) => PendingReason::Resources(what),
                        // Starts only: the reason is not reported (both block alike).
                        None if !out.reports_waiting() => PendingReason::Priority,
                        None => {
                            let k = windows.layer(s.now, w);
                            reasons.why_waiting(windows, &mut s.machine, k, req, out.started())
                        }
                    };
                    out.wait(job.id, reason, None);
                }
            }
            continue;
        }
        let reason = match memo.place(&s.machine, NOW, req) {
            Fit::Never(why) => {
                out.wait(job.id, PendingReason::NoSuitableNodes(why), None);
                continue;
            }
            Fit::Busy(what) => PendingReason::Resources(what),
            Fit::Now(alloc) => match fit_now_beside(&mut s, &mut memo, req, alloc, w) {
                Some(alloc) => {
                    s.start(req, w, &alloc);
                    out.start(job.id, alloc);
                    continue;
                }
                None => {
                    let k = windows.layer(s.now, w);
                    reasons
                        .why_not_now(windows, &mut s.machine, k, req, out.started())
                        .unwrap_or(PendingReason::Priority)
                }
            },
        };
        if s.profile.is_none() {
            s.profile = Some(Profile::measure(&mut s.timeline));
        }
        match earliest(&mut s, req, w) {
            Some((at, alloc)) => {
                s.reserve(job.id, req, at, w, alloc);
                out.wait(job.id, reason, Some(at));
            }
            None => out.wait(job.id, reason, None),
        }
    }
    (out.finish(), s.book.split_off(advance))
}

/// Whether a job running over `[at, at + w)` overlaps reservation `r` (a zero-length job still
/// occupies its start instant).
pub(super) fn overlaps<A>(r: &Reservation<A>, at: f64, w: f64) -> bool {
    r.end > at && (r.start < at + w || r.start <= at)
}

/// The job fits what is free now (as `alloc`); may it start, given the reservations? Yes if
/// none starts before it ends, or if it fits beside all of them, or beside those that start
/// before it ends.
fn fit_now_beside<M: Machine>(
    s: &mut State<M>,
    memo: &mut Memo,
    req: &JobRequest,
    alloc: M::Alloc,
    w: f64,
) -> Option<M::Alloc> {
    let overlapping: Vec<&M::Alloc> = s.book.iter().filter(|r| overlaps(r, s.now, w)).map(|r| &r.alloc).collect();
    if overlapping.is_empty() {
        return Some(alloc);
    }
    if let Fit::Now(alloc) = memo.place(&s.all_reserved, RESERVED, req) {
        return Some(alloc);
    }
    if overlapping.len() == s.book.len() {
        return None;
    }
    match s.machine.place_with_claimed(&overlapping, req) {
        Fit::Now(alloc) => Some(alloc),
        _ => None,
    }
}

/// The earliest time after now at which `req` fits for `w` seconds, and where.
fn earliest<M: Machine>(s: &mut State<M>, req: &JobRequest, w: f64) -> Option<(f64, M::Alloc)> {
    let bad = match (counted_cpus(req), &s.profile) {
        (Some(need), Some(profile)) => profile.short_of(need),
        _ => vec![],
    };
    earliest_among(&mut s.timeline, &s.book, req, w, &bad, s.times.after_now())
}

/// The earliest time after now at which `req` fits for `w` seconds beside the reservations of
/// `book` that overlap it, and where; times inside the intervals of `bad` (too few CPUs, from a
/// [`Profile`]) are skipped. Also EASY's head's, when advance reservations are in force.
pub(super) fn earliest_in<M: Machine>(
    timeline: &mut Timeline<M>,
    book: &[Reservation<M::Alloc>],
    req: &JobRequest,
    w: f64,
    bad: &[(f64, f64)],
) -> Option<(f64, M::Alloc)> {
    let times = Times::new(timeline, book);
    earliest_among(timeline, book, req, w, bad, times.after_now())
}

/// [`earliest_in`] trying `times` (ascending, distinct, after now).
fn earliest_among<M: Machine>(
    timeline: &mut Timeline<M>,
    book: &[Reservation<M::Alloc>],
    req: &JobRequest,
    w: f64,
    bad: &[(f64, f64)],
    times: &[f64],
) -> Option<(f64, M::Alloc)> {
    let mut from = 0;
    let candidates: Vec<f64> = times.iter().copied().filter(|&t| clear(bad, &mut from, t, w)).collect();
    let last = candidates.len().checked_sub(1)?;
    let (mut i, mut misses) = (0usize, 0u32);
    loop {
        let at = candidates[i];
        if let Some(alloc) = fits_at(timeline, book, req, at, w) {
            return Some((at, alloc));
        }
        if i == last {
            return None;
        }
        misses += 1;
        let skip = if misses < DENSE_TRIES { 1 } else { 1usize << (misses - DENSE_TRIES + 1).min(30) };
        i = if misses >= MAX_TRIES { last } else { (i + skip).min(last) };
    }
}

/// Place `req` at `at` for `w` seconds, if it fits then.
fn fits_at<M: Machine>(
    timeline: &mut Timeline<M>,
    book: &[Reservation<M::Alloc>],
    req: &JobRequest,
    at: f64,
    w: f64,
) -> Option<M::Alloc> {
    timeline.move_to(at);
    let overlapping: Vec<&M::Alloc> = book.iter().filter(|r| overlaps(r, at, w)).map(|r| &r.alloc).collect();
    let fit = if overlapping.is_empty() {
        timeline.scratch.machine.place(req)
    } else {
        timeline.scratch.place_with_claimed(&overlapping, req)
    };
    match fit {
        Fit::Now(alloc) => Some(alloc),
        _ => None,
    }
}
