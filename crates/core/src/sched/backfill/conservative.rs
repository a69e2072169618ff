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
use super::kept::{Decision, KeptPlan, Planned};
use super::pass::{counted_cpus, Detail, Memo, Outcome, Tracked, NOW, RESERVED};
use super::profile::{clear, Profile};
use super::timeline::{clamp_end, Timeline};
use super::{Fit, Machine, PassInput, PassLimits, PassOutput, QueuedJob, Reservation};
use crate::placement::JobRequest;
use crate::sched::reason::{PendingReason, Unsuitable, Wanting};
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
    /// Reservations made before the profile was measured (kept ones): (start, end, CPUs), to
    /// take from it once measured.
    untaken: Vec<(f64, f64, u64)>,
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
        if let Some(cpus) = counted_cpus(req) {
            match self.profile.as_mut() {
                Some(p) => p.take(at, at + w, cpus),
                None => self.untaken.push((at, at + w, cpus)),
            }
        }
        self.book.push(Reservation { id, start: at, end: at + w, alloc });
        self.times.add_end(at + w, false);
    }
}

impl<M: Machine> State<'_, M> {
    /// Measures the profile, if not yet done.
    fn measure_profile(&mut self) {
        if self.profile.is_none() {
            let mut p = Profile::measure(&mut self.timeline);
            for (start, end, cpus) in self.untaken.drain(..) {
                p.take(start, end, cpus);
            }
            self.profile = Some(p);
        }
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
    run(input, limits, windows, detail, None)
}

/// [`plan`], reusing what `kept` holds from the last pass where it still holds and leaving
/// this pass's plan there (see the `kept` module). Plans are kept only without `windows`.
pub(super) fn plan_keeping<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    windows: &Windows<M::Alloc>,
    detail: Detail,
    kept: &mut Option<KeptPlan<M>>,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    if !windows.book.is_empty() {
        *kept = None;
        return run(input, limits, windows, detail, None);
    }
    run(input, limits, windows, detail, Some(kept))
}

/// Where a pass is in the kept plan of the last one.
struct Reuse<A> {
    planned: Vec<Planned<A>>,
    /// What this pass decided otherwise than the kept plan, as (from, to, allocation): jobs
    /// started now and reservations planned afresh. A kept reservation that may share
    /// resources with one of them while both hold them is planned afresh too.
    changed: Vec<(f64, f64, A)>,
}

/// What a pass decided for one job.
enum Decided<A> {
    Started(A),
    /// A reservation from `at`; `kept` when it is the last pass's.
    Reserved {
        at: f64,
        alloc: A,
        kept: bool,
    },
    /// Waits as `Held` or `Never` (the decision to keep), or without a reservation (`None`).
    Waits(Option<Decision<A>>),
}

fn run<M: Machine>(
    input: &PassInput<M>,
    limits: &PassLimits,
    windows: &Windows<M::Alloc>,
    detail: Detail,
    kept: Option<&mut Option<KeptPlan<M>>>,
) -> (PassOutput<M::Alloc>, Vec<Reservation<M::Alloc>>) {
    let mut keeping = kept;
    let last = keeping.as_mut().and_then(|k| k.take());
    if limits.max_reservations == 0 {
        // No reservation may be computed: nothing can be shown safe to overtake.
        return (super::fcfs(input, windows, detail), vec![]);
    }
    let mut reuse = last.and_then(|k| k.still_valid(input, limits)).map(|planned| Reuse { planned, changed: vec![] });
    // This pass's decisions for the next one, while it keeps plans and plans every job.
    let (mut record, mut recording): (Vec<Planned<M::Alloc>>, bool) = (vec![], keeping.is_some());
    let mut started: Vec<(JobId, f64, M::Alloc)> = vec![];
    // Reservations of the kept plan this pass keeps.
    let mut reused = 0usize;
    let machine = Tracked::new(input.machine.clone());
    let timeline = Timeline::new(&machine, input.running, &[], input.now);
    let times = Times::new(&timeline, &windows.book);
    let mut s = State {
        now: input.now,
        all_reserved: machine.clone(),
        timeline,
        machine,
        book: vec![],
        profile: None,
        untaken: vec![],
        times,
    };
    // Not counted in the profile: it stays an upper bound of what is free.
    for r in &windows.book {
        s.all_reserved.claim(&r.alloc);
        s.book.push(r.clone());
    }
    let mut f = Fresh {
        windows,
        limits,
        advance: windows.book.len(),
        memo: Memo::default(),
        // Why jobs wait, when the windows are why.
        reasons: Layers::new(windows),
        // Sticky: once out of time, the rest of the pass reserves nothing.
        out_of_time: false,
    };
    let mut out = Outcome::new(input.queue, detail);
    for (i, job) in input.queue.iter().enumerate() {
        if out.nothing_more_starts(i, s.machine.free_cpus()) {
            break;
        }
        let w = walltime(job);
        // The kept decision, while the queue is the kept plan's.
        let kept_decision = reuse.as_mut().and_then(|r| {
            let p = r.planned.get_mut(i).filter(|p| p.is(job, w))?;
            Some(std::mem::replace(&mut p.decision, Decision::Held))
        });
        if kept_decision.is_none() {
            reuse = None;
        }
        // The kept reservation, to tell what this pass changed from it.
        let was = match &kept_decision {
            Some(Decision::Reserved { start, alloc }) => Some((*start, *start + w, alloc.clone())),
            _ => None,
        };
        let from_plan = match (kept_decision, reuse.as_ref()) {
            (Some(d), Some(r)) => reuse_one(&mut s, &mut f.memo, &r.changed, job, w, d, &mut out),
            _ => None,
        };
        let (decided, past_limit) = match from_plan {
            Some(decided) => (decided, false),
            // A kept reservation planned again: from where it was (it may be later than the
            // earliest possible, as a kept one may be, never invalid).
            None => f.plan_one(&mut s, job, w, was.as_ref().map_or(f64::NEG_INFINITY, |r| r.0), &mut out),
        };
        recording &= !past_limit;
        // A job left without a reservation (past the limit or the time budget, or nowhere to
        // go) ends the kept prefix: no later job keeps one that this job could not get.
        if past_limit || matches!(decided, Decided::Waits(None)) {
            reuse = None;
        }
        if let Some(r) = reuse.as_mut() {
            let now = (s.now, s.now + w);
            match &decided {
                Decided::Started(alloc) => r.changed.extend(changes::<M>(now, alloc, was.as_ref())),
                Decided::Reserved { at, alloc, kept: false } => {
                    r.changed.extend(changes::<M>((*at, *at + w), alloc, was.as_ref()))
                }
                _ => {}
            }
        }
        match decided {
            Decided::Started(alloc) => {
                if keeping.is_some() {
                    started.push((job.id, s.now + w, alloc));
                }
            }
            Decided::Reserved { at, alloc, kept } => {
                reused += usize::from(kept);
                note(recording, &mut record, job, w, Decision::Reserved { start: at, alloc })
            }
            Decided::Waits(Some(d)) => note(recording, &mut record, job, w, d),
            // Not planned: nothing from here on is kept.
            Decided::Waits(None) => recording = false,
        }
    }
    let book = s.book.split_off(f.advance);
    if let Some(k) = keeping {
        *k = Some(KeptPlan::new(input, limits, s.machine.machine, started.into_iter(), record, reused));
    }
    (out.finish(), book)
}

/// Records `decision` for `job`, while the pass records.
fn note<A>(recording: bool, record: &mut Vec<Planned<A>>, job: &QueuedJob, w: f64, decision: Decision<A>) {
    if recording {
        record.push(Planned { id: job.id, request: job.request.clone(), walltime: w, held: job.held, decision });
    }
}

/// What planning a job afresh needs besides the pass's state.
struct Fresh<'w, A> {
    windows: &'w Windows<A>,
    limits: &'w PassLimits,
    /// How many of the book's first reservations are the windows'.
    advance: usize,
    memo: Memo,
    reasons: Layers,
    out_of_time: bool,
}

impl<A: Clone + std::fmt::Debug + PartialEq> Fresh<'_, A> {
    /// Plans `job` (walltime `w`) as the pass does, with whether it was past the limit of
    /// reservations (or out of time). Its reservation is not before `not_before`.
    fn plan_one<M: Machine<Alloc = A>>(
        &mut self,
        s: &mut State<M>,
        job: &QueuedJob,
        w: f64,
        not_before: f64,
        out: &mut Outcome<A>,
    ) -> (Decided<A>, bool) {
        let (windows, memo, req) = (self.windows, &mut self.memo, &job.request);
        if job.held {
            out.wait(job.id, PendingReason::Held, None);
            return (Decided::Waits(Some(Decision::Held)), false);
        }
        self.out_of_time = self.out_of_time || self.limits.deadline.as_ref().is_some_and(|d| d.passed());
        if self.out_of_time || s.book.len() - self.advance >= self.limits.max_reservations {
            // Past the limit: now, touching no reservation, or not in this pass.
            let decided = match memo.place(&s.all_reserved, RESERVED, req) {
                Fit::Now(alloc) => {
                    s.start(req, w, &alloc);
                    out.start(job.id, alloc.clone());
                    Decided::Started(alloc)
                }
                Fit::Never(why) => {
                    out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why)), None);
                    Decided::Waits(None)
                }
                Fit::Busy(_) => {
                    let reason = match memo.busy_on(&s.machine, NOW, req) {
                        Some(what) => PendingReason::Resources(Wanting::Busy(what)),
                        // Starts only: the reason is not reported (both block alike).
                        None if !out.reports_waiting() => PendingReason::Priority,
                        None => {
                            let k = windows.layer(s.now, w);
                            self.reasons.why_waiting(windows, &mut s.machine, k, req, out.started())
                        }
                    };
                    out.wait(job.id, reason, None);
                    Decided::Waits(None)
                }
            };
            return (decided, true);
        }
        let reason = match memo.place(&s.machine, NOW, req) {
            Fit::Never(why) => {
                out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why.clone())), None);
                return (Decided::Waits(Some(Decision::Never(why))), false);
            }
            Fit::Busy(what) => PendingReason::Resources(Wanting::Busy(what)),
            Fit::Now(alloc) => match fit_now_beside(s, memo, req, alloc, w) {
                Some(alloc) => {
                    s.start(req, w, &alloc);
                    out.start(job.id, alloc.clone());
                    return (Decided::Started(alloc), false);
                }
                None => {
                    let k = windows.layer(s.now, w);
                    self.reasons
                        .why_not_now(windows, &mut s.machine, k, req, out.started())
                        .unwrap_or(PendingReason::Priority)
                }
            },
        };
        s.measure_profile();
        match earliest(s, req, w, not_before) {
            Some((at, alloc)) => {
                s.reserve(job.id, req, at, w, alloc.clone());
                out.wait(job.id, reason, Some(at));
                (Decided::Reserved { at, alloc, kept: false }, false)
            }
            None => {
                out.wait(job.id, reason, None);
                (Decided::Waits(None), false)
            }
        }
    }
}

/// What holding `alloc` over `[from, to)` changes from the kept reservation `was` (its
/// interval and allocation): on the same allocation, only the time outside the reservation's;
/// otherwise all of it. As (from, to, allocation) entries of [`Reuse::changed`].
fn changes<M: Machine>(
    (from, to): (f64, f64),
    alloc: &M::Alloc,
    was: Option<&(f64, f64, M::Alloc)>,
) -> Vec<(f64, f64, M::Alloc)> {
    match was {
        Some((start, end, reserved)) if M::same_holding(reserved, alloc) && to > from => {
            [(from, to.min(*start)), (from.max(*end), to)]
                .into_iter()
                .filter(|(a, b)| b > a)
                .map(|(a, b)| (a, b, alloc.clone()))
                .collect()
        }
        _ => vec![(from, to, alloc.clone())],
    }
}

/// `job` (walltime `w`) as the kept plan decided it, if that still holds (see the `kept`
/// module): tried now exactly as a full pass tries it, else its kept decision; `None` when
/// it must be planned afresh (its reservation is due but cannot start, or may share resources
/// with a job this pass decided otherwise, `changed`).
fn reuse_one<M: Machine>(
    s: &mut State<M>,
    memo: &mut Memo,
    changed: &[(f64, f64, M::Alloc)],
    job: &QueuedJob,
    w: f64,
    decision: Decision<M::Alloc>,
    out: &mut Outcome<M::Alloc>,
) -> Option<Decided<M::Alloc>> {
    let req = &job.request;
    let (start, alloc) = match decision {
        Decision::Held => {
            out.wait(job.id, PendingReason::Held, None);
            return Some(Decided::Waits(Some(Decision::Held)));
        }
        Decision::Never(why) => {
            out.wait(job.id, PendingReason::NoSuitableNodes(Unsuitable::Never(why.clone())), None);
            return Some(Decided::Waits(Some(Decision::Never(why))));
        }
        Decision::Reserved { start, alloc } => (start, alloc),
    };
    // Now if it fits beside the reservations it would meet (as a full pass starts it),
    // preferably on its reserved resources: later reservations keep off those, but for the
    // time it holds them beyond its reservation.
    let reason = match memo.place(&s.machine, NOW, req) {
        Fit::Never(_) => return None,
        Fit::Busy(what) => PendingReason::Resources(Wanting::Busy(what)),
        Fit::Now(now) => {
            let reserved = match s.machine.machine.place_preferring(&[&alloc], req) {
                Fit::Now(a) if s.book.iter().filter(|b| overlaps(b, s.now, w)).all(|b| !M::may_share(&b.alloc, &a)) => {
                    Some(a)
                }
                _ => None,
            };
            match reserved.or_else(|| fit_now_beside(s, memo, req, now, w)) {
                Some(now) => {
                    s.start(req, w, &now);
                    out.start(job.id, now.clone());
                    return Some(Decided::Started(now));
                }
                None => PendingReason::Priority,
            }
        }
    };
    let in_the_way = changed
        .iter()
        .any(|(from, to, a)| *to > start && (*from < start + w || *from <= start) && M::may_share(a, &alloc));
    if start <= s.now || in_the_way {
        return None;
    }
    s.reserve(job.id, req, start, w, alloc.clone());
    out.wait(job.id, reason, Some(start));
    Some(Decided::Reserved { at: start, alloc, kept: true })
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
/// Times before `not_before` are not tried.
fn earliest<M: Machine>(s: &mut State<M>, req: &JobRequest, w: f64, not_before: f64) -> Option<(f64, M::Alloc)> {
    let bad = match (counted_cpus(req), &s.profile) {
        (Some(need), Some(profile)) => profile.short_of(need),
        _ => vec![],
    };
    let times = s.times.after_now();
    let times = &times[times.partition_point(|&t| t < not_before)..];
    earliest_among(&mut s.timeline, &s.book, req, w, &bad, times)
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
