//! An upper bound of the CPUs free at every future time, to skip the times at which a job
//! cannot fit without trying a placement there.
//!
//! Free CPUs at time `t` = (free once the running jobs that end by `t` have left) minus (CPUs
//! of the jobs started by the pass and of the reservations active at `t`). The first part is
//! measured on the machine at a few checkpoints (each measurement is a count over the whole
//! machine) and bounded between them by the next checkpoint, as it only grows with time; the
//! second is exact for requests whose CPUs the count sees ([`counted_cpus`](super::pass)),
//! left out (so still an upper bound) for the others.

use super::timeline::Timeline;
use super::Machine;

/// How many times the running part is measured, at most.
const CHECKPOINTS: usize = 256;

/// Free CPUs as a step function of time, kept flat so that a pass asking it once per job
/// scans one array instead of merging measurements with bookings each time.
pub(super) struct Profile {
    /// (from, free CPUs from then until the next step), ascending by time; the first step
    /// starts at -inf. A checkpoint bounds the free CPUs at any time before it (and at or
    /// after the previous one); bookings subtract over their interval.
    steps: Vec<(f64, i64)>,
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
        Profile::from_checkpoints(&checkpoints)
    }

    /// Until a checkpoint's time, at most its count is free; from the last one on, its count.
    fn from_checkpoints(checkpoints: &[(f64, i64)]) -> Self {
        let mut steps = Vec::with_capacity(checkpoints.len() + 1);
        steps.push((f64::NEG_INFINITY, checkpoints[0].1));
        for (k, &(time, free)) in checkpoints.iter().enumerate() {
            let bound = checkpoints.get(k + 1).map_or(free, |next| next.1);
            steps.push((time, bound));
        }
        Profile { steps }
    }

    /// The step starting exactly at `time`, made by splitting the one containing it.
    fn step_at(&mut self, time: f64) -> usize {
        let i = self.steps.partition_point(|s| s.0.total_cmp(&time).is_lt());
        if self.steps.get(i).is_some_and(|s| s.0.total_cmp(&time).is_eq()) {
            return i;
        }
        // i > 0: the first step starts at -inf, before any time.
        let value = self.steps[i - 1].1;
        self.steps.insert(i, (time, value));
        i
    }

    /// `cpus` taken over `[start, end)`.
    pub fn take(&mut self, start: f64, end: f64, cpus: u64) {
        if cpus == 0 || start.total_cmp(&end).is_ge() {
            return;
        }
        let first = self.step_at(start);
        let last = self.step_at(end);
        for step in &mut self.steps[first..last] {
            step.1 -= cpus as i64;
        }
    }

    /// The intervals `[from, to)` in which fewer than `need` CPUs are free, ascending and
    /// disjoint (the last may reach infinity: a job larger than the machine's CPUs).
    pub fn short_of(&self, need: u64) -> Vec<(f64, f64)> {
        let need = need as i64;
        let mut bad: Vec<(f64, f64)> = vec![];
        let mut open: Option<f64> = None;
        for &(time, free) in &self.steps {
            match (free < need, open) {
                (true, None) => open = Some(time),
                (false, Some(from)) => {
                    bad.push((from, time));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(from) = open {
            bad.push((from, f64::INFINITY));
        }
        bad
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bound at `t` straight from the definition.
    fn free_at(checkpoints: &[(f64, i64)], takes: &[(f64, f64, u64)], t: f64) -> i64 {
        let running = checkpoints.iter().find(|c| c.0 > t).or(checkpoints.last()).unwrap().1;
        let taken: u64 = takes.iter().filter(|(s, e, _)| *s <= t && t < *e).map(|x| x.2).sum();
        running - taken as i64
    }

    proptest! {
        #[test]
        fn short_of_is_where_the_bound_is_short(
            mut times in proptest::collection::vec(0u32..50, 1..6),
            frees in proptest::collection::vec(0i64..16, 6),
            takes in proptest::collection::vec((0u32..60, 0u32..20, 0u64..6), 0..8),
            need in 0u64..16,
        ) {
            times.sort();
            times.dedup();
            let mut free_sorted: Vec<i64> = frees[..times.len()].to_vec();
            free_sorted.sort();
            let checkpoints: Vec<(f64, i64)> = times.iter().zip(free_sorted).map(|(&t, f)| (t as f64, f)).collect();
            let takes: Vec<(f64, f64, u64)> = takes.iter().map(|&(s, w, c)| (s as f64, (s + w) as f64, c)).collect();
            let mut p = Profile::from_checkpoints(&checkpoints);
            for &(s, e, c) in &takes {
                p.take(s, e, c);
            }
            let bad = p.short_of(need);
            for w in bad.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "not disjoint and merged: {bad:?}");
            }
            // Every half second from before the first event to after the last.
            for k in -4..240 {
                let t = k as f64 / 2.0;
                let short = free_at(&checkpoints, &takes, t) < need as i64;
                let inside = bad.iter().any(|&(a, b)| a <= t && t < b);
                prop_assert_eq!(short, inside, "t={} bad={:?}", t, bad);
            }
        }
    }
}
