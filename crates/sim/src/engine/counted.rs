//! Conservative backfill by processor counts: the simulator's conservative policy on a pool of
//! single-core nodes, where any free cores do for any job (Mu'alem and Feitelson's processor
//! model), kept from pass to pass.
//!
//! Every queued job, in priority order, holds a reservation at the earliest time at which its
//! processors stay free, beside the running jobs and every earlier reservation, for its whole
//! estimate; it starts when that time is now. Which cores a job gets is decided only when it
//! starts (first fit): with single-core nodes and jobs of "any N cores", counts decide.
//!
//! Kept between passes (the plan, and the profile of committed processors, [`Steps`]):
//! - While jobs end when expected, the kept plan *is* a fresh plan: nothing before a kept
//!   reservation got freer (jobs ended as assumed, started ones hold what their reservation
//!   held) and nothing in it got fuller (a job that started out of order kept off it), so it
//!   is still the earliest; new jobs come last in priority and are planned after it. So a
//!   pass starts the reservations due now and plans the new jobs only (the property test
//!   `kept_plans_are_fresh_plans` compares both on random workloads).
//! - A job ending before its estimate frees the rest of its time: the reservations are
//!   compressed (Mu'alem and Feitelson): in priority order, each moves to the earliest time
//!   it now fits, beside all the others. Its old time still fits, so none moves later.
//! - Otherwise (a job running past its estimate, whose processors a reservation counted on;
//!   a queue reordered by fair share) the pass plans afresh, as the definition says.
//!
//! What the simulator owes the plan: a pass at every submission and early end (so that new
//! jobs and compression happen when a pass at every event would do them: skipping idle passes
//! then changes nothing) and at every reservation's start ([`CountPlan::wake`]: a compressed
//! reservation may start when nothing ends).

mod steps;
#[cfg(test)]
mod tests;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::ops::Bound::{Excluded, Unbounded};
use steps::Steps;

/// Most rounds of compression after an early end (see [`CountPlan::compress_at`]).
const COMPRESS_ROUNDS: usize = 4;

/// A time ordered by `total_cmp`, for map keys.
#[derive(Debug, Clone, Copy)]
struct Time(f64);

impl PartialEq for Time {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A queued job as the plan sees it; `index` is its place in the workload (submit order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub index: usize,
    pub cpus: u64,
    pub walltime: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Reserved {
    start: f64,
    cpus: u64,
    walltime: f64,
}

/// The plan of a conservative pass, kept for the next one.
#[derive(Debug)]
pub(crate) struct CountPlan {
    total: u64,
    /// Committed processors: running jobs until their expected ends, reservations.
    steps: Steps,
    /// Reservations by job index: priority order while plans are kept (submit order).
    by_job: BTreeMap<usize, Reserved>,
    /// The same by start time: which are due.
    by_start: BTreeSet<(Time, usize)>,
    /// Jobs of the workload below this index have a decision in the plan; later ones are new.
    planned: usize,
    /// Plans are kept at all (not when the queue is reordered between passes).
    keep: bool,
    /// The plan holds for the next pass (else it plans afresh).
    valid: bool,
    /// A job ended early since the last pass: compress before anything else.
    compress: bool,
    /// Running jobs that outlast their estimate, by expected end: once one is overdue the
    /// plan counted on processors it still holds.
    late: BinaryHeap<Reverse<(Time, usize)>>,
    /// When the last pass ran.
    last_pass: f64,
}

impl CountPlan {
    /// A plan for `total` processors; `keep`: whether the queue keeps its order between passes.
    pub fn new(total: u64, keep: bool) -> Self {
        CountPlan {
            total,
            steps: Steps::default(),
            by_job: BTreeMap::new(),
            by_start: BTreeSet::new(),
            planned: 0,
            keep,
            valid: false,
            compress: false,
            late: BinaryHeap::new(),
            last_pass: f64::NEG_INFINITY,
        }
    }

    /// Jobs of the workload below this index are in the plan (started or reserved).
    pub fn planned(&self) -> usize {
        self.planned
    }

    /// Job `index` started (or resumed), expected to end at `expected`, ending at `actual`.
    pub fn started(&mut self, index: usize, expected: f64, actual: f64) {
        if actual > expected {
            self.late.push(Reverse((Time(expected), index)));
        }
    }

    /// A job of `cpus` processors expected to end at `expected` ended at `now`.
    pub fn ended(&mut self, now: f64, expected: f64, cpus: u64) {
        if now < expected && self.valid {
            self.steps.remove(now, expected, cpus);
            self.compress = true;
        } else if now > expected {
            self.valid = false;
        }
    }

    /// Whether the next pass must run even if nothing can start now: a job ended early, and
    /// the reservations are compressed at this time, not at a later one (compressed later,
    /// some could start later than with a pass at every event). New jobs too must be planned
    /// when they come (the simulator sees to that, see [`Self::planned`]).
    pub fn must_pass(&self) -> bool {
        self.compress
    }

    /// Whether the kept plan may be used at `now`: it is valid and no running job (as
    /// `running` tells) is past its estimate.
    pub fn can_keep(&mut self, now: f64, running: impl Fn(usize) -> bool) -> bool {
        while let Some(&Reverse((Time(end), index))) = self.late.peek() {
            if !running(index) {
                self.late.pop();
                continue;
            }
            if end <= now {
                return false;
            }
            break;
        }
        self.valid
    }

    /// A pass from the kept plan: compress if a job ended early, start the reservations due
    /// now, plan the `new` jobs (submitted since, in priority order, after every planned one).
    /// `free`: processors free now. Returns the jobs to start, in priority order, or `None`
    /// if the plan does not hold (a due reservation cannot start): then plan afresh.
    pub fn pass_kept(
        &mut self,
        now: f64,
        mut free: u64,
        new: impl Iterator<Item = Job>,
        submitted: usize,
    ) -> Option<Vec<usize>> {
        if self.by_start.first().is_some_and(|&(Time(t), _)| t < now) {
            // A reservation was due at a pass that did not run: not a plan of this pass.
            self.valid = false;
            return None;
        }
        self.last_pass = now;
        self.steps.forget_before(now);
        if std::mem::take(&mut self.compress) {
            self.compress_at(now);
        }
        let mut starts: Vec<usize> = self.by_start.range(..=(Time(now), usize::MAX)).map(|&(_, i)| i).collect();
        if starts.iter().map(|i| self.by_job[i].cpus).sum::<u64>() > free {
            self.valid = false;
            return None;
        }
        starts.sort_unstable();
        for i in &starts {
            let r = self.by_job.remove(i).expect("a due job is reserved");
            self.by_start.remove(&(Time(r.start), *i));
            free -= r.cpus;
        }
        for job in new {
            self.place(now, &mut free, job, &mut starts);
        }
        self.planned = submitted;
        Some(starts)
    }

    /// A pass from scratch: `running` as (processors, expected end), `queue` in priority
    /// order, `free` processors free now. Returns the jobs to start, in priority order.
    pub fn pass_afresh(
        &mut self,
        now: f64,
        mut free: u64,
        running: impl Iterator<Item = (u64, f64)>,
        queue: &[Job],
        submitted: usize,
    ) -> Vec<usize> {
        self.last_pass = now;
        self.steps = Steps::default();
        self.by_job.clear();
        self.by_start.clear();
        self.compress = false;
        for (cpus, end) in running {
            // A job past its estimate is expected to end any moment: now.
            self.steps.add(now, end.max(now), cpus);
        }
        // Not kept: the plan may stop once no later job fits what is free (no start follows).
        let smallest_after = |k: usize| queue[k..].iter().map(|j| j.cpus).min().unwrap_or(u64::MAX);
        let mut starts = vec![];
        for (k, &job) in queue.iter().enumerate() {
            if !self.keep && job.cpus > free && smallest_after(k) > free {
                break;
            }
            self.place(now, &mut free, job, &mut starts);
        }
        self.planned = submitted;
        self.valid = self.keep;
        starts
    }

    /// Plan `job` at the earliest time it fits; it starts if that is now and its processors
    /// are free (not so only while a job overruns its estimate: then it stays reserved now).
    fn place(&mut self, now: f64, free: &mut u64, job: Job, starts: &mut Vec<usize>) {
        let Some(at) = self.steps.earliest(now, job.cpus, job.walltime, self.total) else {
            // Larger than the machine: the workload holds no such job.
            debug_assert!(false, "job {} of {} processors never fits", job.index, job.cpus);
            return;
        };
        self.steps.add(at, at + job.walltime, job.cpus);
        if at <= now && job.cpus <= *free {
            *free -= job.cpus;
            starts.push(job.index);
        } else {
            self.by_job.insert(job.index, Reserved { start: at, cpus: job.cpus, walltime: job.walltime });
            self.by_start.insert((Time(at), job.index));
        }
    }

    /// Each reservation, in priority order, to the earliest time it fits beside all others;
    /// again while any moved (a job that moved may have waited for the end of a later one,
    /// which then moved too), a few rounds at most: a reservation may then be at a time at
    /// which nothing ends, so the simulator also passes at reservation times ([`Self::wake`]).
    fn compress_at(&mut self, now: f64) {
        let order: Vec<usize> = self.by_job.keys().copied().collect();
        for _ in 0..COMPRESS_ROUNDS {
            let mut moved = false;
            for &i in &order {
                let r = self.by_job[&i];
                self.steps.remove(r.start, r.start + r.walltime, r.cpus);
                let at = self.steps.earliest(now, r.cpus, r.walltime, self.total).unwrap_or(r.start);
                debug_assert!(at <= r.start, "compression moved job {i} from {} to {at}", r.start);
                self.steps.add(at, at + r.walltime, r.cpus);
                if at != r.start {
                    moved = true;
                    self.by_start.remove(&(Time(r.start), i));
                    self.by_start.insert((Time(at), i));
                    self.by_job.insert(i, Reserved { start: at, ..r });
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// The next reservation's start after the last pass: the simulator passes then too (a
    /// compressed reservation may start when nothing ends).
    pub fn wake(&self) -> Option<f64> {
        let after = (Time(self.last_pass), usize::MAX);
        self.by_start.range((Excluded(after), Unbounded)).next().map(|&(Time(t), _)| t)
    }

    /// The reservations: (job index, start), in job order.
    #[cfg(test)]
    pub fn reservations(&self) -> Vec<(usize, f64)> {
        self.by_job.iter().map(|(&i, r)| (i, r.start)).collect()
    }
}
