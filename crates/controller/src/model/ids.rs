//! Job ids: the next one to give, and the bound below which ids are reserved on disk, so that
//! a restarted controller never gives again an id an agent may have heard of. Needs no store:
//! the bound is written by the effect taking ids returns.

use crate::model::effect::Effect;
use berth_core::JobId;

/// The `meta` key of the reserved job ids' bound.
pub const JOB_ID_BOUND: &str = "job_id_bound";
/// How many job ids are reserved at a time: a crash skips at most this many.
pub const JOB_ID_BLOCK: u64 = 64;

/// The job ids given and reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobIds {
    /// The next id to give.
    next: u64,
    /// Ids below this are reserved (written to the store's `meta` as `JOB_ID_BOUND` by the
    /// batch that moved it).
    bound: u64,
    /// `bound` as of the last commit synced to disk (see [`JobIds::agents_before_sync`]).
    durable_bound: u64,
}

impl JobIds {
    /// At start: ids continue at `next` (above every id in the store and every id reserved),
    /// and nothing more is reserved yet.
    pub fn starting_at(next: u64) -> Self {
        JobIds { next, bound: next, durable_bound: next }
    }

    /// `n` consecutive job ids (at least one), the first returned; when fewer than half a
    /// block stays reserved, the bound moves a block past the ids given and the effect
    /// returned writes it (`JOB_ID_BOUND`), with the batch that takes them, so that the next
    /// batches' ids are already reserved on disk.
    pub fn take(&mut self, n: u64) -> (JobId, Option<Effect>) {
        let id = JobId(self.next);
        self.next += n.max(1);
        if self.next + JOB_ID_BLOCK / 2 > self.bound {
            self.bound = self.next + JOB_ID_BLOCK;
            return (id, Some(Effect::SetMeta { key: JOB_ID_BOUND.into(), value: self.bound.to_string() }));
        }
        (id, None)
    }

    /// Whether a batch's orders may go to the agents once its commit is written, before it is
    /// synced to disk (its replies still wait for the sync). Only a power loss of this host in
    /// between can undo such a commit; agents then report what they did when they register
    /// again, and the state is reconciled from that. What must not happen is an id an agent
    /// has heard of being given to another job: true only when every id given so far is below
    /// the bound already on disk.
    pub fn agents_before_sync(&self) -> bool {
        self.next <= self.durable_bound
    }

    /// The commit of the batch is on disk: its reserved ids are too.
    pub fn synced(&mut self) {
        self.durable_bound = self.bound;
    }

    /// A clean stop: nothing beyond the next id stays reserved. Returns the bound to write
    /// (`JOB_ID_BOUND`), so that the next start continues at the next id.
    pub fn closing(&mut self) -> u64 {
        self.bound = self.next;
        self.next
    }

    /// The next id to give.
    #[cfg(test)]
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Ids below this are reserved.
    #[cfg(test)]
    pub fn bound(&self) -> u64 {
        self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(b: u64) -> Option<Effect> {
        Some(Effect::SetMeta { key: JOB_ID_BOUND.into(), value: b.to_string() })
    }

    #[test]
    fn ids_are_taken_in_blocks_and_the_bound_is_written_only_when_it_moves() {
        // A fresh start: the first id moves the bound a block past it.
        let mut ids = JobIds::starting_at(1);
        assert_eq!(ids.take(1), (JobId(1), bound(2 + JOB_ID_BLOCK)));
        assert_eq!((ids.next(), ids.bound()), (2, 2 + JOB_ID_BLOCK));
        // Within the block: nothing to write.
        assert_eq!(ids.take(1), (JobId(2), None));
        // An array of 40 ids leaves fewer than half a block: the bound moves once, past them all.
        assert_eq!(ids.take(40), (JobId(3), bound(43 + JOB_ID_BLOCK)));
        assert_eq!(ids.next(), 43);
        // No ids asked for: one is taken all the same.
        assert_eq!(ids.take(0), (JobId(43), None));
        assert_eq!(ids.next(), 44);
    }

    #[test]
    fn agents_may_act_before_the_sync_only_on_ids_below_the_bound_synced() {
        let mut ids = JobIds::starting_at(5);
        // Nothing given: nothing an agent could have heard of.
        assert!(ids.agents_before_sync());
        // The first id is above the bound on disk until the batch that reserved it is synced.
        ids.take(1);
        assert!(!ids.agents_before_sync());
        ids.synced();
        assert!(ids.agents_before_sync());
        // Ids within the synced block: at once.
        for _ in 0..JOB_ID_BLOCK / 2 {
            let (_, write) = ids.take(1);
            assert_eq!(write, None);
            assert!(ids.agents_before_sync());
        }
        // The bound moves again: the new block is not on disk before its sync, but the ids
        // given are still below the bound synced before.
        let (_, write) = ids.take(1);
        assert_eq!(write, bound(39 + JOB_ID_BLOCK));
        assert!(ids.agents_before_sync());
        // Past the synced bound: wait for the sync.
        ids.take(JOB_ID_BLOCK);
        assert!(!ids.agents_before_sync());
        ids.synced();
        assert!(ids.agents_before_sync());
    }

    #[test]
    fn a_clean_stop_reserves_nothing_beyond_the_next_id() {
        let mut ids = JobIds::starting_at(1);
        ids.take(3);
        assert_eq!(ids.closing(), 4);
        assert_eq!((ids.next(), ids.bound()), (4, 4));
        // The next start continues there.
        assert_eq!(JobIds::starting_at(4).take(1).0, JobId(4));
    }
}
