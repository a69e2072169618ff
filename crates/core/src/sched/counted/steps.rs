//! Committed processors as a step function of time: what running jobs and reservations hold.

/// (from, processors committed from then until the next step), ascending by time. The first
/// step starts at -inf; the last one reaches +inf (0 once every job has ended).
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    steps: Vec<(f64, u64)>,
}

/// Steps wholly before now are dropped once there are this many (one memmove per batch; a
/// small batch in tests, so that the property test covers it).
const FORGET_BATCH: usize = if cfg!(test) { 2 } else { 64 };

impl Default for Steps {
    fn default() -> Self {
        Steps { steps: vec![(f64::NEG_INFINITY, 0)] }
    }
}

impl Steps {
    /// The step holding time `t`: the last starting at or before it.
    fn index_of(&self, t: f64) -> usize {
        // steps[0] starts at -inf, so at least one step starts at or before `t`.
        self.steps.partition_point(|s| s.0.total_cmp(&t).is_le()) - 1
    }

    /// The step starting exactly at `t`, made by splitting the one holding it.
    fn split_at(&mut self, t: f64) -> usize {
        let i = self.index_of(t);
        if self.steps[i].0.total_cmp(&t).is_eq() {
            return i;
        }
        self.steps.insert(i + 1, (t, self.steps[i].1));
        i + 1
    }

    /// `cpus` committed over `[from, to)`.
    pub fn add(&mut self, from: f64, to: f64, cpus: u64) {
        if cpus == 0 || from.total_cmp(&to).is_ge() {
            return;
        }
        let (a, b) = (self.split_at(from), self.split_at(to));
        for s in &mut self.steps[a..b] {
            s.1 += cpus;
        }
        self.merge(a, b);
    }

    /// Steps `b`, then `a`, joined to the one before when equal: compression moves
    /// reservations back and forth, and the profile keeps only the times at which it changes.
    fn merge(&mut self, a: usize, b: usize) {
        for i in [b, a] {
            if i > 0 && i < self.steps.len() && self.steps[i].1 == self.steps[i - 1].1 {
                self.steps.remove(i);
            }
        }
    }

    /// `cpus` no longer committed over `[from, to)` (they were added over an interval holding
    /// it).
    pub fn remove(&mut self, from: f64, to: f64, cpus: u64) {
        if cpus == 0 || from.total_cmp(&to).is_ge() {
            return;
        }
        let (a, b) = (self.split_at(from), self.split_at(to));
        for s in &mut self.steps[a..b] {
            debug_assert!(s.1 >= cpus, "removing {cpus} processors from {} at {}", s.1, s.0);
            s.1 -= cpus;
        }
        self.merge(a, b);
    }

    /// Processors committed at time `t`.
    #[cfg(test)]
    pub fn at(&self, t: f64) -> u64 {
        self.steps[self.index_of(t)].1
    }

    /// The earliest `t >= now` such that `need` more processors stay within `total` over
    /// `[t, t + w)` (at `t` itself when `w` is 0); `None` if never. One scan from now: a
    /// window opens at the first step with room and closes at the first without.
    pub fn earliest(&self, now: f64, need: u64, w: f64, total: u64) -> Option<f64> {
        let mut open: Option<f64> = None;
        for k in self.index_of(now)..self.steps.len() {
            let (from, used) = self.steps[k];
            if used + need > total {
                open = None;
                continue;
            }
            let start = *open.get_or_insert(from.max(now));
            let next = self.steps.get(k + 1).map_or(f64::INFINITY, |s| s.0);
            if start + w <= next {
                return Some(start);
            }
        }
        None
    }

    /// Forget what lies before `now` (never asked about again), a batch at a time.
    pub fn forget_before(&mut self, now: f64) {
        let i = self.index_of(now);
        if i >= FORGET_BATCH {
            self.steps.drain(..i);
            self.steps[0].0 = f64::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `at` and `earliest` against their definitions, on sums of random intervals.
        #[test]
        fn steps_follow_their_definition(
            adds in proptest::collection::vec((0u32..40, 1u32..15, 1u64..5), 0..10),
            removes in proptest::collection::vec(any::<bool>(), 10),
            now in 0u32..40,
            need in 1u64..9,
            w in 0u32..12,
        ) {
            let total = 8;
            let mut s = Steps::default();
            let mut kept = vec![];
            for (k, &(from, len, cpus)) in adds.iter().enumerate() {
                let (a, b) = (from as f64, (from + len) as f64);
                s.add(a, b, cpus);
                if removes[k] {
                    s.remove(a, b, cpus);
                } else {
                    kept.push((a, b, cpus));
                }
            }
            let used = |t: f64| -> u64 { kept.iter().filter(|k| k.0 <= t && t < k.1).map(|k| k.2).sum() };
            for half in 0..120 {
                let t = half as f64 / 2.0;
                prop_assert_eq!(s.at(t), used(t), "t={}", t);
            }
            let (now, w) = (now as f64, w as f64);
            // Start times worth trying: now and every interval end after it.
            let mut starts: Vec<f64> = kept.iter().map(|k| k.1).filter(|&e| e > now).collect();
            starts.push(now);
            starts.sort_by(f64::total_cmp);
            let fits = |t: f64| {
                let mut points: Vec<f64> = kept.iter().flat_map(|k| [k.0, k.1]).filter(|&p| p > t && p < t + w).collect();
                points.push(t);
                points.iter().all(|&p| used(p) + need <= total)
            };
            let want = starts.iter().copied().find(|&t| fits(t));
            prop_assert_eq!(s.earliest(now, need, w, total), want);
            s.forget_before(now);
            prop_assert_eq!(s.earliest(now, need, w, total), want);
        }
    }
}
