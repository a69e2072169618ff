//! Effects: what a feature decided must be written, as plain values. A feature that returns
//! them instead of writing decides without a store (unit-tested without SQLite); the state
//! thread's loop (`crate::server`, `apply_batch`) carries them out in order after each
//! command, in the batch's transaction (`Controller::carry_out_effects`). Replies and orders
//! to agents wait for the commit in `state::Outbox`, as before.

/// One thing to write, in the order decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write `value` under `key` in the store's `meta` table.
    SetMeta { key: String, value: String },
    /// Record an event (the batch's time), about a node when `node` is set.
    Event { kind: String, node: Option<String>, detail: String },
    /// Something changed that may let a job start: a scheduling pass is due.
    Reschedule,
}
