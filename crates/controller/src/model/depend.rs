//! What the dependency feature (`crate::depend`) keeps between passes: the reasons pending
//! jobs are held out of the pass, the next begin time, two caches of what the store answered,
//! and requeued jobs waiting for their previous run to end (`crate::update`).

use crate::model::job::OldRun;
use berth_core::job::JobState;
use berth_core::sched::PendingReason;
use berth_core::JobId;
use std::collections::HashMap;

/// At most this many entries in each cache; a full cache starts again empty.
const CACHE_LIMIT: usize = 100_000;

/// What the last pass found, kept for `berth jobs` and the clock.
#[derive(Debug, Default)]
pub struct DependState {
    /// Pending jobs held out of the pass, with the reason shown.
    reasons: HashMap<JobId, PendingReason>,
    /// The earliest begin time still to come: a pass is due then.
    next_begin: Option<f64>,
    /// Ended jobs' states (and whether they started), read from the store once.
    ended: HashMap<JobId, (JobState, bool)>,
    /// `aftercorr`: the task of array `.0` with index `.1` (None: it has none), found once.
    corresponding: HashMap<(JobId, u32), Option<JobId>>,
    /// Requeued jobs whose previous run is still ending on some of its nodes: kept out of
    /// the pass until it has ended there.
    requeued: HashMap<JobId, OldRun>,
}

impl DependState {
    /// The jobs held out of the pass by their dependency or begin time, with their reasons,
    /// and the earliest begin time to come: replace those of the pass before.
    pub fn waiting(&mut self, reasons: HashMap<JobId, PendingReason>, next_begin: Option<f64>) {
        self.reasons = reasons;
        self.next_begin = next_begin;
    }

    /// Job `id` is held out of the pass too, for `why`.
    pub fn hold_out(&mut self, id: JobId, why: PendingReason) {
        self.reasons.insert(id, why);
    }

    /// Why job `id` is held out of the pass, if it is.
    pub fn reason(&self, id: JobId) -> Option<&PendingReason> {
        self.reasons.get(&id)
    }

    /// Whether the earliest begin time has come at `now`; if so, it is forgotten (one pass).
    pub fn begin_due(&mut self, now: f64) -> bool {
        if self.next_begin.is_some_and(|t| t <= now) {
            self.next_begin = None;
            return true;
        }
        false
    }

    /// Ended job `id`'s state and whether it started, if read before.
    pub fn ended(&self, id: JobId) -> Option<(JobState, bool)> {
        self.ended.get(&id).copied()
    }

    /// Ended job `id`'s state and whether it started, as the store answered.
    pub fn remember_ended(&mut self, id: JobId, state: (JobState, bool)) {
        if self.ended.len() >= CACHE_LIMIT {
            self.ended.clear();
        }
        self.ended.insert(id, state);
    }

    /// A job ended is pending again (`berth requeue`): its state is read anew.
    pub fn forget_ended(&mut self, id: JobId) {
        self.ended.remove(&id);
    }

    /// The task of array `array` with index `index` (None: it has none), if found before.
    pub fn corresponding(&self, array: JobId, index: u32) -> Option<Option<JobId>> {
        self.corresponding.get(&(array, index)).copied()
    }

    /// The task of array `array` with index `index`, as found.
    pub fn remember_corresponding(&mut self, array: JobId, index: u32, found: Option<JobId>) {
        if self.corresponding.len() >= CACHE_LIMIT {
            self.corresponding.clear();
        }
        self.corresponding.insert((array, index), found);
    }

    /// Requeued job `id` waits for its previous run to end (`run`: where, since when).
    pub fn await_old_run(&mut self, id: JobId, run: OldRun) {
        self.requeued.insert(id, run);
    }

    /// The previous run requeued job `id` waits for, if it does.
    pub fn old_run_mut(&mut self, id: JobId) -> Option<&mut OldRun> {
        self.requeued.get_mut(&id)
    }

    /// Requeued job `id` waits no more.
    pub fn old_run_over(&mut self, id: JobId) {
        self.requeued.remove(&id);
    }

    /// The previous runs requeued jobs wait for (in no particular order).
    pub fn old_runs(&self) -> impl Iterator<Item = (JobId, &OldRun)> {
        self.requeued.iter().map(|(id, w)| (*id, w))
    }

    /// Keep waiting only for the previous runs for which `waits` is true (it may change them).
    pub fn keep_old_runs(&mut self, mut waits: impl FnMut(JobId, &mut OldRun) -> bool) {
        self.requeued.retain(|id, w| waits(*id, w));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_s_reasons_replace_those_before_and_the_begin_time_comes_once() {
        let mut d = DependState::default();
        d.waiting(HashMap::from([(JobId(1), PendingReason::Dependency("afterok:1".into()))]), Some(100.0));
        d.hold_out(JobId(2), PendingReason::Dependency("afterok:1".into()));
        assert!(d.reason(JobId(1)).is_some() && d.reason(JobId(2)).is_some());
        assert!(!d.begin_due(99.0));
        assert!(d.begin_due(100.0));
        assert!(!d.begin_due(200.0), "one pass for it");
        d.waiting(HashMap::new(), None);
        assert!(d.reason(JobId(1)).is_none() && d.reason(JobId(2)).is_none());
    }

    #[test]
    fn answers_of_the_store_are_kept_until_forgotten_or_the_cache_is_full() {
        let mut d = DependState::default();
        assert_eq!(d.ended(JobId(1)), None);
        d.remember_ended(JobId(1), (JobState::Completed, true));
        assert_eq!(d.ended(JobId(1)), Some((JobState::Completed, true)));
        d.forget_ended(JobId(1));
        assert_eq!(d.ended(JobId(1)), None);
        d.remember_corresponding(JobId(10), 3, None);
        d.remember_corresponding(JobId(10), 4, Some(JobId(14)));
        assert_eq!(d.corresponding(JobId(10), 3), Some(None));
        assert_eq!(d.corresponding(JobId(10), 4), Some(Some(JobId(14))));
        assert_eq!(d.corresponding(JobId(10), 5), None);
        for i in 0..CACHE_LIMIT as u64 {
            d.remember_ended(JobId(100 + i), (JobState::Failed, false));
        }
        // Full: the next answer starts the cache again.
        d.remember_ended(JobId(7), (JobState::Cancelled, false));
        assert_eq!((d.ended(JobId(100)), d.ended(JobId(7))), (None, Some((JobState::Cancelled, false))));
    }

    #[test]
    fn requeued_jobs_wait_for_their_old_runs_until_over() {
        let mut d = DependState::default();
        d.await_old_run(JobId(1), OldRun { nodes: vec![0, 1], since: 10.0 });
        d.await_old_run(JobId(2), OldRun { nodes: vec![2], since: 10.0 });
        if let Some(w) = d.old_run_mut(JobId(1)) {
            w.nodes.retain(|n| *n != 0);
        }
        let mut runs: Vec<(JobId, Vec<usize>)> = d.old_runs().map(|(id, w)| (id, w.nodes.clone())).collect();
        runs.sort();
        assert_eq!(runs, vec![(JobId(1), vec![1]), (JobId(2), vec![2])]);
        d.keep_old_runs(|id, _| id == JobId(1));
        d.old_run_over(JobId(1));
        assert_eq!(d.old_runs().count(), 0);
        assert!(d.old_run_mut(JobId(2)).is_none());
    }
}
