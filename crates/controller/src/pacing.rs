//! When the state thread runs a scheduling pass: at once after a quiet spell, paced under a
//! stream of changes.
//!
//! A pass walks every pending job, so one after every group-commit batch makes a stream of
//! submissions quadratic in the queue's length (10,000 held jobs through the API: ~900 jobs/s,
//! against ~6,000 with an empty queue). Like Slurm's `sched_min_interval`/`defer`, but sized
//! by what a pass costs rather than by a fixed interval: after a pass that took `c`, the next
//! waits `pass_pace × c` (3 by default) (at most [`MAX_GAP`]), so passes take at most `1 / (1 + pass_pace)` of the
//! state thread's time whatever the queue's length, and a pass of a small queue (tens of
//! microseconds) delays nothing a person could see. A change after a quiet spell is scheduled
//! in its own batch, as before; one that comes within the gap is scheduled when it ends (the
//! server arms a wake-up, `Command::Wake`).

use std::time::{Duration, Instant};

/// A pass waits this many times the last pass's cost after it (`[scheduler] pass_pace`).
pub const DEFAULT_PACE: u32 = 3;

/// The largest `pass_pace` accepted.
pub const MAX_PACE: u32 = 100;

/// The longest wait between passes, whatever the last one cost.
pub const MAX_GAP: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct PassPacer {
    pace: u32,
    /// The earliest time of the next pass (None: any time).
    next: Option<Instant>,
    /// A pass was due and held back since the last one ran.
    held: bool,
}

impl PassPacer {
    /// A pacer waiting `pace` times a pass's cost after it (0: never waits).
    pub fn new(pace: u32) -> PassPacer {
        PassPacer { pace: pace.min(MAX_PACE), next: None, held: false }
    }

    /// None when a pass may run at `now`; else the time it may.
    pub fn wait_until(&self, now: Instant) -> Option<Instant> {
        self.next.filter(|at| now < *at)
    }

    /// A pass was due but held back (`wait_until` said to wait): one must run later, even if
    /// nothing else comes (the server wakes itself).
    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Whether a pass was held back since the last one ran.
    pub fn held_back(&self) -> bool {
        self.held
    }

    /// A pass ran from `began` to `ended`.
    pub fn ran(&mut self, began: Instant, ended: Instant) {
        self.held = false;
        let cost = ended.saturating_duration_since(began);
        self.next = Some(ended + cost.saturating_mul(self.pace).min(MAX_GAP));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_after_a_quiet_spell_runs_at_once() {
        let t0 = Instant::now();
        let mut p = PassPacer::new(DEFAULT_PACE);
        assert_eq!(p.wait_until(t0), None, "no pass yet: run now");
        p.ran(t0, t0 + Duration::from_millis(2));
        assert_eq!(p.wait_until(t0 + Duration::from_millis(9)), None, "2 ms pass, 7 ms later: run now");
    }

    #[test]
    fn the_next_pass_waits_pace_times_the_last_ones_cost() {
        let t0 = Instant::now();
        let mut p = PassPacer::new(DEFAULT_PACE);
        let end = t0 + Duration::from_millis(4);
        p.ran(t0, end);
        let at = end + Duration::from_millis(4 * DEFAULT_PACE as u64);
        assert_eq!(p.wait_until(end), Some(at));
        assert_eq!(p.wait_until(at - Duration::from_micros(1)), Some(at));
        assert_eq!(p.wait_until(at), None);
    }

    #[test]
    fn the_wait_is_bounded_and_a_free_pass_waits_for_nothing() {
        let t0 = Instant::now();
        let mut p = PassPacer::new(DEFAULT_PACE);
        p.ran(t0, t0 + Duration::from_secs(10));
        assert_eq!(p.wait_until(t0 + Duration::from_secs(10)), Some(t0 + Duration::from_secs(10) + MAX_GAP));
        // A clock that does not move (tests' fake clock): passes are never held back.
        p.ran(t0, t0);
        assert_eq!(p.wait_until(t0), None);
    }

    #[test]
    fn a_held_back_pass_is_remembered_until_one_runs() {
        let t0 = Instant::now();
        let mut p = PassPacer::new(DEFAULT_PACE);
        p.ran(t0, t0 + Duration::from_millis(1));
        assert!(!p.held_back());
        p.hold();
        assert!(p.held_back(), "the server must wake itself for it");
        p.ran(t0 + Duration::from_millis(5), t0 + Duration::from_millis(6));
        assert!(!p.held_back());
    }

    #[test]
    fn pace_zero_schedules_after_every_batch() {
        let t0 = Instant::now();
        let mut p = PassPacer::new(0);
        p.ran(t0, t0 + Duration::from_secs(1));
        assert_eq!(p.wait_until(t0 + Duration::from_secs(1)), None);
    }
}
