//! Messages between the CLI (or any API client) and the controller.

use crate::node::{is_zero, CountInfo, NodeInfo};
use berth_core::directives::SubmitOptions;
use berth_core::gres::Counts;
use berth_core::job::{Allocation, JobState, ResourceRequest};
use berth_core::JobId;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ClientRequest {
    Ping,
    Submit(Box<SubmitRequest>),
    /// Many submissions in one round trip and one transaction (API clients, benchmarks).
    SubmitBatch {
        jobs: Vec<SubmitRequest>,
    },
    ListJobs {
        #[serde(default)]
        states: Vec<JobState>,
        /// Include finished jobs.
        #[serde(default)]
        all: bool,
    },
    ShowJob {
        id: JobId,
    },
    Cancel {
        ids: Vec<JobId>,
        /// Those of `ids` that name one array task (`A_i`), not every task as an array's id
        /// does: an array's first task has the array's id.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        only: Vec<JobId>,
    },
    Hold {
        ids: Vec<JobId>,
        /// Those of `ids` that name one array task (`A_i`), not every task as an array's id
        /// does: an array's first task has the array's id.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        only: Vec<JobId>,
    },
    Release {
        ids: Vec<JobId>,
        /// Those of `ids` that name one array task (`A_i`), not every task as an array's id
        /// does: an array's first task has the array's id.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        only: Vec<JobId>,
    },
    ListNodes {
        /// Include each node's full topology and which job holds which PU.
        #[serde(default)]
        topology: bool,
    },
    /// Set a node's admin state: "drain" or "resume"; or its system CPUs: "system-cpus" with
    /// `value` a kernel cpu list ("" for none).
    NodeAdmin {
        name: String,
        action: String,
        #[serde(default)]
        value: Option<String>,
    },
    /// Set a subnode's state ("drain", "offline", "resume") or properties ("properties" with
    /// `value` a comma-separated list).
    SubnodeAdmin {
        node: String,
        index: u32,
        action: String,
        #[serde(default)]
        value: Option<String>,
    },
    Acct {
        #[serde(default)]
        limit: Option<u32>,
        /// The invocation log of `berth run` steps instead of jobs.
        #[serde(default)]
        steps: bool,
        /// Only jobs not ended before this time (Unix seconds): sacct's `--starttime`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<f64>,
        /// Only jobs started (or, not started, submitted) by this time: `--endtime`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<f64>,
        /// Only these users' jobs (names; at most [`ACCT_MAX_USERS`]); empty: everyone's.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        users: Vec<String>,
        /// Also the jobs not finished yet (queued, held, running, suspended), as sacct lists.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        active: bool,
        /// Also each job's steps (`JobInfo::steps`, argv cut to the program), at most
        /// [`ACCT_MAX_STEPS`] in the answer: sacct's `N.0` lines.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        with_steps: bool,
    },
    /// `berth run`: a step inside a job, or an interactive allocation and its step.
    StepCreate(Box<crate::step::StepCreate>),
    /// `berth run` reports how its step ended; ends an interactive allocation.
    StepEnd {
        job: JobId,
        step: u32,
        outcome: crate::step::StepOutcome,
    },
    /// Send a signal to every process of a job, or of one step of it.
    Signal {
        job: JobId,
        #[serde(default)]
        step: Option<u32>,
        signal: i32,
    },
    /// Fair-share usage and shares per account (`berth share`).
    Share,
    /// The queues with their limits and how many jobs each holds (`berth queues`).
    Queues,
    /// The reservations API (docs/reservations.md): the HTTP API's requests, also on this socket.
    Reservation {
        request: Box<crate::reservation::ReservationRequest>,
    },
    /// Admins: freeze running jobs on their nodes (`berth suspend`); answered with `done`.
    Suspend {
        ids: Vec<JobId>,
    },
    /// Admins: thaw suspended jobs, on other CPUs of their nodes if their own are taken
    /// (`berth resume`); answered with `done`.
    Resume {
        ids: Vec<JobId>,
    },
    /// Admins: reserve resources for a time window for some users or accounts (`berth resv
    /// create`); answered with `advance` holding it.
    AdvanceCreate(Box<AdvanceCreate>),
    /// The advance reservations (`berth resv list`); answered with `advance`.
    AdvanceList,
    /// Admins: delete an advance reservation (`berth resv delete`); answered with
    /// `advance_deleted`. Its running jobs keep running.
    AdvanceDelete {
        name: String,
    },
    /// The event log (`berth events`): node up/down, job starts, ends, requeues, refusals.
    /// Answered with `events`, oldest first.
    Events(EventQuery),
    /// Change a job (`berth update`, `scontrol update`, `qalter`): a pending one's walltime,
    /// size, queue, name, dependency or (admins only) priority, checked as at submission; a
    /// running one's walltime, lowered only. The id of an array changes each of its pending
    /// tasks. Answered with `done`: one result per job changed (all or none are).
    Update {
        id: JobId,
        /// Boxed: the other requests stay small (serde reads and writes it as the struct).
        change: Box<JobChange>,
        /// `id` names one task (`A_i`), even its array's first (whose id is the array's).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        task_only: bool,
    },
    /// Put running or ended batch jobs back in the queue, to run again from the start
    /// (`berth requeue`, `scontrol requeue`, `qrerun`); a running one is killed first.
    /// Answered with `done`.
    Requeue {
        ids: Vec<JobId>,
        /// Those of `ids` that name one array task (`A_i`), not every task as an array's id
        /// does: an array's first task has the array's id.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        only: Vec<JobId>,
    },
    /// `berth alloc` (Slurm's `salloc`): queue an allocation, a job with no batch script;
    /// answered `submitted` once it is stored. Unless `no_shell`, it is held by this
    /// connection: it ends when the connection closes (docs/protocol/01-client.md, "Allocations").
    Alloc(Box<AllocRequest>),
    /// The holder of an allocation releases it: its command exited with `exit_code`
    /// (answered with `done`).
    AllocEnd {
        id: JobId,
        exit_code: i32,
    },
    /// The holder of an allocation whose connection a controller restart cut holds it again
    /// over this connection (answered with `done`; refused if another connection holds it, or
    /// it is not an active allocation of the sender's). A restarted controller waits
    /// `ALLOC_RECLAIM_SECS` for holders before it ends allocations nobody holds.
    AllocHold {
        id: JobId,
    },
}

/// How long a restarted controller keeps allocations whose holder has not come back.
pub const ALLOC_RECLAIM_SECS: f64 = 60.0;

/// An allocation's request (`berth alloc`): its resources as a batch job's (`submit.script`
/// must be empty: there is none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocRequest {
    pub submit: SubmitRequest,
    /// `--no-shell`: kept until its walltime or `berth cancel`, not held by the connection
    /// once granted (while it waits, closing the connection still cancels it).
    #[serde(default)]
    pub no_shell: bool,
}

/// What `update` changes: each field given replaces the job's (docs/protocol/01-client.md,
/// "Changing jobs"); none given changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobChange {
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walltime: Option<u64>,
    /// Total cores (drops `tasks_per_node` unless it is given too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Tasks per node (drops `cores` unless it is given too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// Tasks in all (Slurm's `NumTasks`, `-n`): per node when the job has a node count, else
    /// that many times its CPUs per task in cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Slurm's syntax (`afterok:5`); empty: no dependency any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// Admins only: the job's priority, instead of the computed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Generic resources per node (other than GPUs), as `--gres`; empty: none any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gres: Option<Counts>,
    /// Licenses, as `--licenses`; empty: none any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licenses: Option<Counts>,
    /// GPUs of the whole job, as `--gpus` (replaces its GPU counts); 0: no GPUs any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// GPUs on each node, as `--gpus-per-node`, PBS's `ngpus` (replaces its GPU counts); 0: no
    /// GPUs any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// Only GPUs of this type, as `--gpu-type`; empty: of any type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
}

impl JobChange {
    pub fn is_empty(&self) -> bool {
        *self == JobChange::default()
    }
}

/// Which events to list: those after `after_id` (to follow the log), of some kinds, about one
/// job or node; at most `limit` (the most recent ones when `after_id` is not given).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventQuery {
    #[serde(default)]
    pub after_id: Option<u64>,
    #[serde(default)]
    pub kinds: Vec<String>,
    #[serde(default)]
    pub job: Option<JobId>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
}

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventInfo {
    pub id: u64,
    /// Unix time.
    pub time: f64,
    pub kind: String,
    #[serde(default)]
    pub job: Option<JobId>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub detail: String,
}

/// An advance reservation to make: a window, what (whole nodes, or cores placed by the
/// controller), and for whom.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdvanceCreate {
    /// Default: `resvN`.
    #[serde(default)]
    pub name: Option<String>,
    /// Unix time; none: now.
    #[serde(default)]
    pub start: Option<f64>,
    /// Unix time; or `duration_secs` after the start.
    #[serde(default)]
    pub end: Option<f64>,
    #[serde(default)]
    pub duration_secs: Option<u64>,
    /// Whole nodes, by name.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Or this many cores, placed by the controller for the window ...
    #[serde(default)]
    pub cores: Option<u32>,
    /// ... on this many nodes.
    #[serde(default)]
    pub nodes_count: Option<u32>,
    /// Memory per node with `cores` (default: the default memory per CPU for each core).
    #[serde(default)]
    pub mem: Option<u64>,
    /// With `cores`: this many GPUs in all, spread evenly over the nodes and placed with cores
    /// near them (as a job's `--gpus`). Whole `nodes` hold all their GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// With `cores`: generic resources on each node (`[gres]` names, as a job's `--gres`).
    /// Whole `nodes` hold all of theirs.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub gres: Counts,
    /// Cluster-wide licenses held for the window (its members' licenses come from these).
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub licenses: Counts,
    #[serde(default)]
    pub users: Vec<String>,
    /// Accounts (projects): their jobs (`--account`) may use it.
    #[serde(default)]
    pub accounts: Vec<String>,
}

/// An advance reservation as the controller holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdvanceInfo {
    pub name: String,
    /// Unix times: the window is `[start, end)`.
    pub start: f64,
    pub end: f64,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    /// The reserved resources.
    pub allocation: Allocation,
    pub cores: u32,
    /// GPUs held (those of `allocation`'s parts), left out when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
    /// Generic resources held, summed over the parts (each part's are in `allocation`), left
    /// out when none.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub gres: Counts,
    /// Licenses held, left out when none.
    #[serde(default, skip_serializing_if = "Counts::is_empty")]
    pub licenses: Counts,
    pub created: f64,
    pub created_by: String,
    /// The window is open now.
    pub active: bool,
    /// Its jobs (`--reservation NAME`) running, and waiting.
    #[serde(default)]
    pub running_jobs: Vec<JobId>,
    #[serde(default)]
    pub queued_jobs: Vec<JobId>,
}

/// The most users one `acct` request may name.
pub const ACCT_MAX_USERS: usize = 64;
/// The most jobs one `acct` answer holds (a larger `limit` is this).
pub const ACCT_MAX_JOBS: u32 = 10_000;
/// The most steps one `acct` answer holds (`with_steps`); the jobs after are sent without.
pub const ACCT_MAX_STEPS: usize = 10_000;

impl ClientRequest {
    /// It only reads: answering it changes nothing, so it may be asked again (a client whose
    /// answer a controller restart cut off) and needs no write of the state store.
    pub fn is_query(&self) -> bool {
        use crate::reservation::ReservationRequest as R;
        match self {
            ClientRequest::Ping
            | ClientRequest::ListJobs { .. }
            | ClientRequest::ShowJob { .. }
            | ClientRequest::ListNodes { .. }
            | ClientRequest::Acct { .. }
            | ClientRequest::Share
            | ClientRequest::Queues
            | ClientRequest::AdvanceList
            | ClientRequest::Events(_) => true,
            ClientRequest::Reservation { request } => {
                matches!(**request, R::Inventory | R::List { .. } | R::Show { .. })
            }
            _ => false,
        }
    }
}

/// The most job ids one request may name (`cancel`, `hold`, `release`) and the most jobs one
/// batch submission may carry: every answer then fits a frame. `berth` sends more in batches.
pub const MAX_IDS_PER_REQUEST: usize = 10_000;

/// A batch job as submitted. The submitter's uid, gid and groups are not in it: the controller
/// takes them from the kernel (SO_PEERCRED) so nobody can submit as someone else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    pub script: String,
    /// The script's file name, for the default job name.
    pub script_name: String,
    pub options: SubmitOptions,
    /// The submitting environment, reproduced for the job.
    pub env: Vec<(String, String)>,
    /// Absolute submit directory; the job's working directory.
    pub cwd: String,
    #[serde(default)]
    pub hold: bool,
    /// Submit although `#SBATCH`/`#PBS` directives berth does not support are present
    /// (`--ignore-unsupported`; the client shows them as warnings).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_unsupported: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ClientResponse {
    Pong {
        version: String,
        protocol: u32,
        nodes: usize,
        jobs: usize,
        /// Set while the controller cannot write its state database (disk full, database
        /// locked): what is wrong and since when. Absent when all is well (and from older
        /// controllers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_store: Option<StoreHealth>,
    },
    Submitted {
        id: JobId,
    },
    SubmittedBatch {
        ids: Vec<JobId>,
    },
    Jobs {
        jobs: Vec<JobInfo>,
    },
    Job {
        job: Box<JobInfo>,
    },
    Nodes {
        nodes: Vec<NodeInfo>,
        /// The cluster's licenses (`[licenses]`) and how many jobs hold, running or
        /// suspended. Absent when it has none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        licenses: Vec<CountInfo>,
    },
    Acct {
        jobs: Vec<JobInfo>,
    },
    Steps {
        steps: Vec<crate::step::StepInfo>,
    },
    Queues {
        queues: Vec<QueueInfo>,
    },
    Share {
        half_life_secs: f64,
        accounts: Vec<berth_core::sched::fairshare::ShareLine>,
    },
    /// The grant `berth run` opens the control tree with, and the tree's link key (hex): the
    /// secret its frames are MAC'd with (docs/protocol/06-auth.md, "Authentication"); `run` keeps it.
    StepGranted {
        grant: Box<crate::step::StepGrant>,
        link_key: String,
    },
    /// An interactive allocation cannot be placed now: why, and the caller retries.
    TryAgain {
        reason: String,
    },
    /// Per-id results of cancel/hold/release.
    Done {
        results: Vec<IdResult>,
    },
    /// The answer to a `reservation` request.
    Reservation {
        reply: crate::reservation::ReservationReply,
    },
    /// Advance reservations: the one created, or every one (`advance_list`).
    Advance {
        reservations: Vec<AdvanceInfo>,
    },
    /// An advance reservation deleted, as it was (its running jobs keep running; its queued
    /// ones never start).
    AdvanceDeleted {
        reservation: Box<AdvanceInfo>,
    },
    Events {
        events: Vec<EventInfo>,
    },
    Error(ApiError),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdResult {
    pub id: JobId,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

/// Stable error codes: scripts may match on them. One table for the socket, the HTTP API and
/// the agents' refusals (crates/protocol/src/error.rs, docs/errors.md).
pub use crate::error::ErrorCode;

/// Why the controller cannot write its state database at the moment (`Pong::state_store`).
/// Meanwhile reads and running jobs go on; requests that change state are refused; job ends
/// wait in memory (and on the agents) until they can be written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreHealth {
    /// `no_space` (the filesystem is full) or `busy` (another process holds a lock on the
    /// database).
    pub problem: String,
    /// What failed, naming the path.
    pub message: String,
    /// Unix time since when.
    pub since: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} [{}]", code.as_str())]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
}

/// Resource usage of a finished job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accounting {
    pub wall_seconds: f64,
    pub user_cpu_seconds: f64,
    pub system_cpu_seconds: f64,
    pub peak_memory_bytes: u64,
    /// GPUs held times the wall time (Slurm's `gres/gpu` TRES seconds); 0 without GPUs.
    #[serde(default, skip_serializing_if = "is_no_time")]
    pub gpu_seconds: f64,
}

fn is_no_time(x: &f64) -> bool {
    *x == 0.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: JobId,
    pub name: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub state: JobState,
    pub queue: String,
    pub request: ResourceRequest,
    pub walltime_seconds: Option<u64>,
    /// Unix times, seconds.
    pub submit_time: f64,
    pub start_time: Option<f64>,
    pub end_time: Option<f64>,
    pub allocation: Allocation,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why the job ended as it did, or why it waits.
    pub reason: Option<String>,
    /// A pending or suspended job's reason as a stable short code: Slurm's REASON where Slurm
    /// has one (`Resources`, `Priority`, `Dependency`, `ReqNodeNotAvail`, `NodeDown`, ...;
    /// berth's own `SuspendedByAdmin`, `Preempted`; `reason` has the words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    pub cwd: String,
    pub stdout: String,
    pub stderr: String,
    pub accounting: Option<Accounting>,
    /// The binding strategy and mode the job asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<berth_core::binding::BindingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_mode: Option<berth_core::binding::BindingMode>,
    /// The job's cgroups as the agents made them (host CPUs and memory nodes), while it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<CgroupInfo>,
    /// The job's steps (`berth run`), first first; filled by `show_job` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::step::StepInfo>,
    /// The account fair share charges (a project, or the user's primary group).
    #[serde(default)]
    pub account: String,
    /// A pending job's priority and its factors, as of the last scheduling pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<berth_core::sched::priority::Priority>,
    /// When the last pass expects a pending job to start (Unix time), if it reserved for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_start: Option<f64>,
    /// Seconds the job has spent suspended in all (the current suspension up to now), if it
    /// ever was; its walltime does not count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_seconds: Option<f64>,
    /// What the job is when it is not a batch job: `alloc` (`berth alloc`), `interactive`
    /// (`berth run` outside a job) or `reservation` (the reservations API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The job's dependency, in Slurm's syntax (`afterok:5,afterany:6`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// The earliest time it may start (Unix time), if it was given one (`--begin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<f64>,
    /// Of a task of a job array: the array's id (shown `A_i`) and the task's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// The array's running limit (`%N`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_limit: Option<u32>,
    /// How many tasks the array has (their ids are consecutive from the array's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_count: Option<u32>,
    /// Options recorded with the job (`--comment`, `--chdir`, `--mail-*`, `--signal`,
    /// `--exclusive`); docs/compat.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// The working directory, when `--chdir` gave one other than the submit directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
    /// `--mail-type` in Slurm's spelling (`END,FAIL`), if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_user: Option<String>,
    /// `--signal` as given back in Slurm's spelling (`B:10@60`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_signal: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// An `--exclusive` job's tasks: it holds whole nodes but keeps the tasks it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<berth_core::directives::JobTasks>,
    /// Where the job's GPUs sit on their nodes (NUMA node, socket, local PUs), node by node in
    /// allocation order; filled by `show_job` only, left out when the job holds no GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_places: Vec<berth_core::gpu::GpuPlace>,
    /// What the job is billed a second under the controller's `[fair_share]` weights (its CPUs
    /// and GPUs, as Slurm's `billing` TRES); set by `acct` and `show_job` for a job that holds
    /// resources, absent otherwise (and from older controllers: sacct then bills the CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<f64>,
}

/// A cgroup of a running job as its node's kernel holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupInfo {
    pub node: String,
    pub path: String,
    pub cpus: String,
    pub mems: String,
    /// The rank of a per-rank sub-cpuset; None for the job's cgroup.
    #[serde(default)]
    pub rank: Option<u32>,
}

/// One queue as `berth queues` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub spec: berth_core::sched::queue::QueueSpec,
    /// Its priority factor in [0, 1] among the queues.
    pub priority_factor: f64,
    pub queued: usize,
    pub held: usize,
    pub running: usize,
    pub running_cores: u64,
}
