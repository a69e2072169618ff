//! Who holds each allocation of `berth alloc` (`crate::alloc`): the client connection whose
//! command runs in it. In memory only: after a controller restart, holders hold their
//! allocations again (`AllocHold`) within a window; those nobody came back for end.

use berth_core::JobId;
use berth_protocol::client::ALLOC_RECLAIM_SECS;
use std::collections::HashMap;

/// The holders of allocations, and the window in which holders may come back after a start.
#[derive(Debug, Default)]
pub struct AllocHolders {
    /// The client connection holding each allocation.
    by_job: HashMap<JobId, u64>,
    /// Until then (`ALLOC_RECLAIM_SECS` after the first check), allocations nobody holds are
    /// kept for their holders to come back; set at that check.
    reclaim_until: Option<f64>,
}

impl AllocHolders {
    /// Connection `conn` holds allocation `id` (from now on, instead of any other).
    pub fn hold(&mut self, id: JobId, conn: u64) {
        self.by_job.insert(id, conn);
    }

    /// Allocation `id` is held no more.
    pub fn release(&mut self, id: JobId) {
        self.by_job.remove(&id);
    }

    /// The connection holding allocation `id`, if any.
    pub fn holder(&self, id: JobId) -> Option<u64> {
        self.by_job.get(&id).copied()
    }

    /// The allocations connection `conn` holds, in id order.
    pub fn held_by(&self, conn: u64) -> Vec<JobId> {
        let mut held: Vec<JobId> = self.by_job.iter().filter(|(_, c)| **c == conn).map(|(id, _)| *id).collect();
        held.sort();
        held
    }

    /// Forget the holders of allocations for which `live` is false (their jobs have ended).
    pub fn keep_only(&mut self, mut live: impl FnMut(JobId) -> bool) {
        self.by_job.retain(|id, _| live(*id));
    }

    /// Whether holders may still come back at `now`: the window opens at the first call and
    /// lasts `ALLOC_RECLAIM_SECS`.
    pub fn reclaiming(&mut self, now: f64) -> bool {
        now < *self.reclaim_until.get_or_insert(now + ALLOC_RECLAIM_SECS)
    }

    /// Nothing is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_job.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_has_one_holder_until_released() {
        let mut h = AllocHolders::default();
        assert_eq!(h.holder(JobId(1)), None);
        h.hold(JobId(1), 7);
        h.hold(JobId(2), 8);
        assert_eq!((h.holder(JobId(1)), h.holder(JobId(2))), (Some(7), Some(8)));
        // Held again over another connection: that one holds it now.
        h.hold(JobId(1), 9);
        assert_eq!(h.holder(JobId(1)), Some(9));
        h.release(JobId(1));
        assert_eq!(h.holder(JobId(1)), None);
        h.release(JobId(1));
        assert!(!h.is_empty());
        h.release(JobId(2));
        assert!(h.is_empty());
    }

    #[test]
    fn a_connection_s_allocations_are_listed_in_id_order() {
        let mut h = AllocHolders::default();
        for (id, conn) in [(5, 1), (3, 2), (9, 1), (1, 1)] {
            h.hold(JobId(id), conn);
        }
        assert_eq!(h.held_by(1), vec![JobId(1), JobId(5), JobId(9)]);
        assert_eq!(h.held_by(2), vec![JobId(3)]);
        assert_eq!(h.held_by(3), vec![]);
        // Listing releases nothing.
        assert_eq!(h.holder(JobId(5)), Some(1));
    }

    #[test]
    fn holders_of_ended_jobs_are_forgotten() {
        let mut h = AllocHolders::default();
        h.hold(JobId(1), 1);
        h.hold(JobId(2), 1);
        h.keep_only(|id| id == JobId(2));
        assert_eq!((h.holder(JobId(1)), h.holder(JobId(2))), (None, Some(1)));
    }

    #[test]
    fn the_reclaim_window_opens_at_the_first_check_and_closes_once() {
        let mut h = AllocHolders::default();
        assert!(h.reclaiming(100.0));
        assert!(h.reclaiming(100.0 + ALLOC_RECLAIM_SECS - 1.0));
        assert!(!h.reclaiming(100.0 + ALLOC_RECLAIM_SECS));
        // It does not open again.
        assert!(!h.reclaiming(100.0 + 10.0 * ALLOC_RECLAIM_SECS));
    }
}
