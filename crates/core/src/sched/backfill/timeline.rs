//! When the resources held now come free: the running jobs (and the jobs a pass starts) by
//! expected end, and a scratch copy of the machine moved to any time along them.

use super::pass::Tracked;
use super::{Fit, Machine, RunningJob};
use crate::placement::JobRequest;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included};

/// A time with a tie-breaker, ordered (f64 by `total_cmp`) for use as a map key.
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub time: f64,
    pub seq: u64,
}

impl At {
    /// The key after every key at `time`.
    pub fn after_all(time: f64) -> Self {
        At { time, seq: u64::MAX }
    }
}

impl Ord for At {
    fn cmp(&self, other: &Self) -> Ordering {
        self.time.total_cmp(&other.time).then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for At {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for At {}

/// Where a held allocation is: a running job's (borrowed), or a job the pass started.
#[derive(Debug, Clone, Copy)]
enum Source {
    Running(usize),
    Started(usize),
}

/// Ends in the past count as "now": the job is expected to leave at any moment. A NaN end
/// (no estimate) counts as now too rather than never, so that it cannot block a reservation.
pub(super) fn clamp_end(end: f64, now: f64) -> f64 {
    end.max(now)
}

/// A copy of the scratch machine at a time, to jump to instead of walking far along the ends.
struct Snapshot<M: Machine> {
    at: f64,
    machine: Tracked<M>,
    /// Jobs of `started` already claimed on it (or ending before `at`).
    synced: usize,
}

/// A jump to a snapshot is worth it when it saves more than this many end times of walking
/// (a copy of the machine costs about as much as re-claiming a few thousand allocations).
const SNAPSHOT_GAIN: usize = 2048;
/// Most snapshots kept: each is a whole copy of the machine.
const MAX_SNAPSHOTS: usize = 8;

/// The machine as it will be at any time `t >= now`: every held allocation whose end is at
/// or before `t` released. Moving back and forth releases and re-claims allocations, which
/// undo each other exactly because the held allocations are disjoint. Far moves start from
/// the nearest snapshot taken on the way (see [`Timeline::snapshot_here`]).
pub(super) struct Timeline<'a, M: Machine> {
    running: &'a [RunningJob<M::Alloc>],
    started: Vec<(f64, M::Alloc)>,
    held: BTreeMap<At, Source>,
    /// Distinct ends of the running jobs, ascending: to measure how far apart two times are.
    running_ends: Vec<f64>,
    /// Where `scratch` stands: what ends at or before it is released (-inf: nothing).
    at: f64,
    pub scratch: Tracked<M>,
    snapshots: Vec<Snapshot<M>>,
    pub now: f64,
}

impl<'a, M: Machine> Timeline<'a, M> {
    /// `machine` has every running job's allocation claimed, and those of `started` (jobs
    /// started by the pass so far, with their expected ends).
    pub fn new(
        machine: &Tracked<M>,
        running: &'a [RunningJob<M::Alloc>],
        started: &[(f64, M::Alloc)],
        now: f64,
    ) -> Self {
        let mut held = BTreeMap::new();
        for (i, r) in running.iter().enumerate() {
            held.insert(At { time: clamp_end(r.end, now), seq: i as u64 }, Source::Running(i));
        }
        let mut running_ends: Vec<f64> = held.keys().map(|k| k.time).collect();
        running_ends.dedup();
        let mut scratch = machine.clone();
        // Moves are many and counts few: count the free CPUs only when asked.
        scratch.count_changes(false);
        let mut timeline = Timeline {
            running,
            started: vec![],
            held,
            running_ends,
            at: f64::NEG_INFINITY,
            scratch,
            snapshots: vec![],
            now,
        };
        for (end, alloc) in started {
            timeline.hold(*end, alloc.clone());
        }
        timeline
    }

    fn hold(&mut self, end: f64, alloc: M::Alloc) {
        let end = clamp_end(end, self.now);
        let seq = (self.running.len() + self.started.len()) as u64;
        self.held.insert(At { time: end, seq }, Source::Started(self.started.len()));
        self.started.push((end, alloc));
    }

    /// A job the pass started after the timeline was made (claimed on the pass's machine, not
    /// yet on `scratch`).
    pub fn add_started(&mut self, end: f64, alloc: M::Alloc) {
        // Where `scratch` stands after this end, the job is already gone.
        if clamp_end(end, self.now) > self.at {
            self.scratch.claim(&alloc);
        }
        self.hold(end, alloc);
    }

    /// Distinct end times, ascending.
    pub fn end_times(&self) -> Vec<f64> {
        let mut times: Vec<f64> = self.held.keys().map(|k| k.time).collect();
        times.dedup();
        times
    }

    /// Running jobs' end times between `a` and `b`: how long a walk from one to the other is.
    fn distance(&self, a: f64, b: f64) -> usize {
        let rank = |t: f64| self.running_ends.partition_point(|&e| e <= t);
        rank(a).abs_diff(rank(b))
    }

    /// Keep a copy of `scratch` where it stands, if it is far from the last copy kept.
    pub fn snapshot_here(&mut self) {
        let spacing = (self.running_ends.len() / MAX_SNAPSHOTS).max(SNAPSHOT_GAIN);
        let far = self.snapshots.last().is_none_or(|s| self.distance(s.at, self.at) >= spacing);
        if far && self.snapshots.len() < MAX_SNAPSHOTS && self.at.is_finite() {
            let synced = self.started.len();
            self.snapshots.push(Snapshot { at: self.at, machine: self.scratch.clone(), synced });
        }
    }

    /// Move `scratch` to time `t`: everything ending at or before `t` released, the rest held.
    pub fn move_to(&mut self, t: f64) {
        let walk = self.distance(self.at, t);
        if walk > SNAPSHOT_GAIN {
            let nearest = self.snapshots.iter().rposition(|s| s.at <= t);
            if let Some(k) = nearest.filter(|&k| self.distance(self.snapshots[k].at, t) + SNAPSHOT_GAIN < walk) {
                self.jump_to_snapshot(k);
            }
        }
        if t > self.at {
            let range = self.held.range((Excluded(At::after_all(self.at)), Included(At::after_all(t))));
            for &source in range.map(|e| e.1) {
                let alloc = match source {
                    Source::Running(i) => &self.running[i].alloc,
                    Source::Started(i) => &self.started[i].1,
                };
                self.scratch.release(alloc);
            }
        } else if t < self.at {
            let range = self.held.range((Excluded(At::after_all(t)), Included(At::after_all(self.at))));
            for &source in range.map(|e| e.1) {
                let alloc = match source {
                    Source::Running(i) => &self.running[i].alloc,
                    Source::Started(i) => &self.started[i].1,
                };
                self.scratch.claim(alloc);
            }
        }
        self.at = t;
    }

    /// Place `req` on the machine as it will be at `t` (beside `extra`, claimed too),
    /// preferring what the jobs ending by then free over what is free now: EASY's head.
    pub fn place_preferring_freed(&mut self, t: f64, extra: &[&M::Alloc], req: &JobRequest) -> Fit<M::Alloc> {
        self.move_to(t);
        let running = self.running;
        let freed: Vec<&M::Alloc> = self
            .held
            .range(..=At::after_all(t))
            .map(|(_, &source)| match source {
                Source::Running(i) => &running[i].alloc,
                Source::Started(i) => &self.started[i].1,
            })
            .collect();
        if extra.is_empty() {
            return self.scratch.machine.place_preferring(&freed, req);
        }
        let mut beside = self.scratch.machine.clone();
        for alloc in extra {
            beside.claim(alloc);
        }
        beside.place_preferring(&freed, req)
    }

    /// Make snapshot `k` current (with the jobs started since it was taken) and stand on it.
    fn jump_to_snapshot(&mut self, k: usize) {
        let snap = &mut self.snapshots[k];
        for (end, alloc) in &self.started[snap.synced..] {
            if *end > snap.at {
                snap.machine.claim(alloc);
            }
        }
        snap.synced = self.started.len();
        self.scratch = snap.machine.clone();
        self.at = snap.at;
    }
}
