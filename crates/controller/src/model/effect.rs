//! Effects: what a feature decided must be written or sent, as plain values. A feature that
//! returns them instead of writing decides without a store (unit-tested without SQLite); the
//! state thread's loop (`crate::server`, `apply_batch`) carries them out in order after each
//! command, in the batch's transaction (`Controller::carry_out_effects`). Replies and orders
//! to agents wait for the commit in `state::Outbox`, as before: an effect `Send` queues its
//! order there, behind the writes decided before it.
//!
//! Not every effect waits for the loop: 13 feature methods call `carry_out_effects`
//! themselves, mid-command, each with a comment saying why. The writes keep their order
//! either way (one queue, carried out in order); an early call matters only where what follows
//! reads those rows back from the store (`ended_state` of a job that just left memory,
//! `release_request`), where an order is then queued directly (`send_to_node`, `out.agents`:
//! acks to agents, launches and kills, which bypass this queue and must follow the `Send`s
//! decided before them), or where `dirty` is cleared next (the scheduling pass). Elsewhere the
//! effects wait for the loop: a node's row (`UpsertNode`, read when carried out) is then
//! written as the node is at the command's end, the last state in the same transaction.

use crate::model::advance::Advance;
use crate::model::job::{JobRecord, Usage};
use crate::model::reservation::Reservation;
use crate::model::step::StepRow;
use crate::model::suspension::Suspension;
use berth_core::directives::array::ArrayTask;
use berth_core::sched::fairshare::FairShare;
use berth_core::JobId;
use berth_protocol::agent::ControllerMessage;

/// One thing to write or send, in the order decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write `value` under `key` in the store's `meta` table.
    SetMeta { key: String, value: String },
    /// Remove `key` from the store's `meta` table.
    DeleteMeta { key: String },
    /// Record an event (the batch's time), about a job and a node when they are set.
    Event { kind: String, job: Option<JobId>, node: Option<String>, detail: String },
    /// Something changed that may let a job start: a scheduling pass is due.
    Reschedule,
    /// A new job's row (its script with it).
    InsertJob(Box<JobRecord>),
    /// The rows of an array's tasks, in one go: task `k` of `tasks` is job `first + k`, made
    /// from `template` (`Store::insert_array`); the first row holds the script and
    /// environment, the others share them (`Store::insert_job_sharing`). One template and the
    /// tasks, not a record per task: a 100,000-task array stays one small value.
    InsertArray { template: Box<JobRecord>, first: JobId, tasks: Vec<ArrayTask> },
    /// A job's row as it is now (state, times, reason, allocation, usage).
    UpdateJob(Box<JobRecord>),
    /// A finished job's accounting row.
    InsertAccounting(Box<JobRecord>),
    /// What `berth update` changes of a job's row: its name, queue, options and walltime.
    RewriteJob(Box<JobRecord>),
    /// What an ended job's run used forgotten (its accounting row, its other nodes' usage): it
    /// was requeued to run again.
    ForgetRun { job: JobId },
    /// Requeued job `job` waits for its previous run to end on `nodes` (indexes), since
    /// `since` (`crate::update`, `OldRun`).
    SaveOldRun { job: JobId, nodes: Vec<usize>, since: f64 },
    /// Requeued job `job` waits for its previous run no more.
    ForgetOldRun { job: JobId },
    /// The usage of job `job`'s part on node `node` (not its first), recorded once per node
    /// (a repeated report is ignored); when `to_accounting` and it was new, added to the job's
    /// accounting row too (the job had ended before this node's part did).
    AddMemberUsage { job: JobId, node: String, usage: Usage, to_accounting: bool },
    /// A job's suspensions as they are now.
    SaveSuspension { job: JobId, suspension: Suspension },
    /// Node `node`'s row (by index) as the in-memory state holds it when carried out.
    UpsertNode { node: usize },
    /// A granted step's row.
    InsertStep(Box<StepRow>),
    /// A step ended at `time` (`Store::end_step`: a step closed already keeps its end).
    EndStep { job: JobId, step: u32, time: f64, exit_code: Option<i32>, failure: Option<String> },
    /// Every open step of `job` ends at `time`, with `failure`.
    CloseSteps { job: JobId, time: f64, failure: String },
    /// An advance reservation's row (`crate::advance`).
    SaveAdvance(Box<Advance>),
    /// Advance reservation `name`'s row removed (the events keep its history).
    DeleteAdvance { name: String },
    /// A reservation of the reservations API as it is now (`crate::reservations`).
    SaveReservation(Box<Reservation>),
    /// Fair-share usage as it is now (`crate::policy`: the charges a pass or `berth share`
    /// booked).
    SaveFairShare(Box<FairShare>),
    /// An order to node `node`'s agent (by index), sent after the commit if it is connected.
    Send { node: usize, msg: ControllerMessage },
}

impl Effect {
    /// An event about job `job` (on `node`, when given).
    pub fn job_event(kind: &str, job: JobId, node: Option<&str>, detail: impl Into<String>) -> Effect {
        Effect::Event { kind: kind.into(), job: Some(job), node: node.map(str::to_string), detail: detail.into() }
    }

    /// An event about node `node` only.
    pub fn node_event(kind: &str, node: &str, detail: impl Into<String>) -> Effect {
        Effect::Event { kind: kind.into(), job: None, node: Some(node.to_string()), detail: detail.into() }
    }
}
