//! An upper bound of the CPUs free at every future time, to skip the times at which a job
//! cannot fit without trying a placement there.
//!
//! Free CPUs at time `t` = (free once the running jobs that end by `t` have left) minus (CPUs
//! of the jobs started by the pass and of the reservations active at `t`). The first part is
//! measured on the machine at a few checkpoints (each measurement is a count over the whole
//! machine) and bounded between them by the next checkpoint, as it only grows with time; the
//! second is exact for requests whose CPUs the count sees ([`counted_cpus`](super::pass)),
//! left out (so still an upper bound) for the others.

use super::timeline::{At, Timeline};
use super::Machine;
use std::collections::BTreeMap;

/// How many times the running part is measured, at most.
const CHECKPOINTS: usize = 256;

pub(super) struct Profile {
    /// (time, free CPUs once every running job ending at or before it has left), ascending.
    /// Bounds the free CPUs at any time before it (and after the previous checkpoint).
    checkpoints: Vec<(f64, i64)>,
    /// CPUs taken (negative) or given back (positive) at a time.
    events: BTreeMap<At, i64>,
    next_seq: u64,
}

impl Profile {
    /// Measures `timeline` (its scratch machine is left at the last end time).
    pub fn measure<M: Machine>(timeline: &mut Timeline<M>) -> Self {
        let times = timeline.end_times();
        let step = times.len().div_ceil(CHECKPOINTS).max(1);
        let mut checkpoints = Vec::with_capacity(CHECKPOINTS + 1);
        let mut i = 0;
        while i < times.len() {
            // Always measure the last time: after it everything has left.
            let at = if i + step >= times.len() { times.len() - 1 } else { i };
            timeline.move_to(times[at]);
            checkpoints.push((times[at], timeline.scratch.free_cpus() as i64));
            timeline.snapshot_here();
            i = at + step;
        }
        if checkpoints.is_empty() {
            checkpoints.push((timeline.now, timeline.scratch.free_cpus() as i64));
        }
        Profile { checkpoints, events: BTreeMap::new(), next_seq: 0 }
    }

    /// `cpus` taken over `[start, end)`.
    pub fn take(&mut self, start: f64, end: f64, cpus: u64) {
        if cpus == 0 {
            return;
        }
        for (time, delta) in [(start, -(cpus as i64)), (end, cpus as i64)] {
            self.events.insert(At { time, seq: self.next_seq }, delta);
            self.next_seq += 1;
        }
    }

    /// The intervals `[from, to)` in which fewer than `need` CPUs are free, ascending and
    /// disjoint (the last may reach infinity: a job larger than the machine's CPUs).
    pub fn short_of(&self, need: u64) -> Vec<(f64, f64)> {
        let need = need as i64;
        // Breakpoints: where the running part steps up (after each checkpoint) or an event
        // happens. Value on [point, next point) = running bound + events up to point.
        let mut bad: Vec<(f64, f64)> = vec![];
        let mut c = 0;
        let mut events = self.events.iter().map(|(k, d)| (k.time, *d)).peekable();
        let mut taken = 0i64;
        let mut at = f64::NEG_INFINITY;
        loop {
            while let Some((_, delta)) = events.next_if(|(t, _)| *t <= at) {
                taken += delta;
            }
            while c < self.checkpoints.len() && self.checkpoints[c].0 <= at {
                c += 1;
            }
            let running = self.checkpoints.get(c).or(self.checkpoints.last()).map_or(0, |p| p.1);
            let next = match (self.checkpoints.get(c), events.peek()) {
                (Some(p), Some(ev)) => p.0.min(ev.0),
                (Some(p), None) => p.0,
                (None, Some(ev)) => ev.0,
                (None, None) => f64::INFINITY,
            };
            if running + taken < need {
                match bad.last_mut() {
                    Some(last) if last.1 >= at => last.1 = next,
                    _ => bad.push((at, next)),
                }
            }
            if next == f64::INFINITY {
                return bad;
            }
            at = next;
        }
    }
}

/// Whether `[t, t + w)` avoids every interval of `bad` (ascending, disjoint), scanning from
/// `*from` (advanced past intervals that end by `t`, for ascending `t`).
pub(super) fn clear(bad: &[(f64, f64)], from: &mut usize, t: f64, w: f64) -> bool {
    while *from < bad.len() && bad[*from].1 <= t {
        *from += 1;
    }
    match bad.get(*from) {
        None => true,
        Some(&(start, _)) => start >= t + w && start > t,
    }
}
