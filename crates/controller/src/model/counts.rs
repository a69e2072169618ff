//! What a live job carries over from its earlier runs that its row does not hold: how often
//! it was requeued (its `requeue` events: the node-failure policy's limit, `crate::fault`)
//! and the last step id it was given (its `steps` rows: the next step's id, `crate::steps`).
//! Kept in memory for the jobs in memory only, so that these live decisions never read the
//! store; restored from the store when a job enters memory (`Store::job_counts` at load and
//! reload, `Store::job_counts_of` for an ended job requeued) and forgotten when it leaves.

use berth_core::JobId;
use std::collections::HashMap;

/// Per live job, its requeues and last step id; a job with neither has no entry (an array's
/// 100,000 tasks cost nothing here until one of them runs a step or is requeued).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobCounts {
    requeues: HashMap<JobId, u32>,
    last_step: HashMap<JobId, u32>,
}

impl JobCounts {
    /// How often job `id` was requeued (for node failures or by `berth requeue`).
    pub fn requeues(&self, id: JobId) -> u32 {
        self.requeues.get(&id).copied().unwrap_or(0)
    }

    /// Job `id` was requeued once more (as its `requeue` event is queued).
    pub fn requeued(&mut self, id: JobId) {
        let n = self.requeues.entry(id).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// The id job `id`'s next step gets: one more than any it ever had (its first: 1).
    pub fn next_step(&self, id: JobId) -> u32 {
        self.last_step.get(&id).copied().unwrap_or(0).saturating_add(1)
    }

    /// Job `id` was given step `step` (as its row is queued).
    pub fn step_taken(&mut self, id: JobId, step: u32) {
        let last = self.last_step.entry(id).or_insert(0);
        *last = (*last).max(step);
    }

    /// Job `id`'s counts as the store recorded them (`requeues` events, `last_step` the
    /// highest step id; 0: none), replacing any held.
    pub fn restore(&mut self, id: JobId, requeues: u32, last_step: u32) {
        self.forget(id);
        if requeues > 0 {
            self.requeues.insert(id, requeues);
        }
        if last_step > 0 {
            self.last_step.insert(id, last_step);
        }
    }

    /// Job `id` left memory (it ended): the store keeps its history.
    pub fn forget(&mut self, id: JobId) {
        self.requeues.remove(&id);
        self.last_step.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_with_no_entry_has_no_requeue_and_takes_step_one() {
        let c = JobCounts::default();
        assert_eq!(c.requeues(JobId(7)), 0);
        assert_eq!(c.next_step(JobId(7)), 1);
    }

    #[test]
    fn counts_grow_and_are_forgotten_per_job() {
        let mut c = JobCounts::default();
        c.requeued(JobId(1));
        c.requeued(JobId(1));
        c.step_taken(JobId(1), 4);
        // A lower id (never given after a higher one) does not lower the next.
        c.step_taken(JobId(1), 2);
        c.step_taken(JobId(2), 1);
        assert_eq!((c.requeues(JobId(1)), c.next_step(JobId(1))), (2, 5));
        assert_eq!((c.requeues(JobId(2)), c.next_step(JobId(2))), (0, 2));
        c.forget(JobId(1));
        assert_eq!((c.requeues(JobId(1)), c.next_step(JobId(1))), (0, 1));
        assert_eq!(c.next_step(JobId(2)), 2);
        c.restore(JobId(2), 3, 0);
        assert_eq!((c.requeues(JobId(2)), c.next_step(JobId(2))), (3, 1));
        // Nothing recorded: no entry kept.
        c.restore(JobId(2), 0, 0);
        assert_eq!(c, JobCounts::default());
    }
}
