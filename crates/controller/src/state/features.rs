//! The scheduling pass's state (`PolicyState`, a field of `Controller`), which holds the
//! advance reservations' book and the dependency feature's state, and the loads from the
//! store of the features' books whose types live in `crate::model` (`AdvanceBook`,
//! `Reservations`: private fields, named methods). The features' operations
//! (`impl Controller` in `policy`, `advance`, `reservations`, `depend`) change them.

use crate::model::advance::AdvanceBook;
use crate::model::depend::DependState;
use crate::model::reservation::Reservations;
use crate::store::{Store, StoreError};
use berth_core::sched::backfill;
use berth_core::sched::fairshare::FairShare;
use berth_core::sched::priority::Priority;
use berth_core::JobId;
use std::collections::HashMap;

/// What the last pass decided and measured, for `berth jobs` and `berth share`.
#[derive(Debug, Default)]
pub struct PolicyState {
    pub fair_share: FairShare,
    /// Running jobs are charged up to this time.
    pub charged_until: f64,
    pub priorities: HashMap<JobId, Priority>,
    pub expected_start: HashMap<JobId, f64>,
    /// Why each job the last pass examined waits (shown unless a dependency's or an advance
    /// reservation's reason stands before it).
    pub pending_reasons: HashMap<JobId, berth_core::sched::PendingReason>,
    /// What the last pass counted (tests check it).
    #[cfg(test)]
    pub last_pass: PassStats,
    /// Advance reservations (see `advance`).
    pub advance: AdvanceBook,
    /// Reasons shown instead of the pass's for jobs of advance reservations (waiting for the
    /// window, or for a reservation they can no longer use).
    pub advance_reasons: HashMap<JobId, berth_core::sched::PendingReason>,
    /// Jobs waiting for their dependency or begin time (see `depend`).
    pub depend: DependState,
    /// The last conservative pass's plan, reused by the next where nothing changed.
    pub kept_plan: Option<backfill::KeptPlan<berth_core::sched::ClusterState>>,
    /// The last pass's array tails: tasks left out of its round, each shown as the task of
    /// its array examined last (`policy::gather`), in id order.
    pub tails: Vec<ArrayTail>,
    /// Tests: every task goes to the round (to compare with the tails left out).
    #[cfg(test)]
    pub whole_arrays: bool,
}

/// Pending tasks of an array that a pass left out of its round (`policy::gather`): they are
/// identical to the task examined last before them (`shown_as`) and come right after it in
/// the round's order, so the round would have decided for each what it decided for that one
/// (no start, no reservation) and told the same reason, priority and expected start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayTail {
    /// The first and last task left out (every pending task between them that went to no
    /// other pass step belongs to the tail: they were consecutive among the pass's jobs).
    pub first: JobId,
    pub last: JobId,
    /// The task whose decision stands for them.
    pub shown_as: JobId,
    /// How many tasks were left out.
    pub count: usize,
}

#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PassStats {
    pub pending: usize,
    pub backfilled: usize,
    /// Reservations kept from the pass before (conservative backfill).
    pub kept_reservations: usize,
}

impl AdvanceBook {
    /// The live advance reservations from the store.
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        store.init_advance()?;
        Ok(AdvanceBook::new(store.load_advance()?))
    }
}

impl Reservations {
    /// The live reservations from the store (after a restart their jobs are checked at the
    /// first tick: one that did not survive is released).
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        store.init_reservations()?;
        Ok(Reservations::new(store.live_reservations()?, store.max_reservation_id()? + 1))
    }
}
