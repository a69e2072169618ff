//! A job as the controller keeps it.

use berth_core::directives::SubmitOptions;
use berth_core::job::{Allocation, JobOutcome, JobState, Shape};
use berth_core::placement::JobRequest;
use berth_core::sched::PendingJob;
use berth_core::JobId;
use berth_protocol::client::{Accounting, JobInfo};
use berth_protocol::user::UserIdentity;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub wall_ms: u64,
    pub user_cpu_us: u64,
    pub system_cpu_us: u64,
    pub peak_memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    pub user: UserIdentity,
    pub state: JobState,
    pub queue: String,
    /// As submitted, with `mem` and `walltime` resolved to what the job was given.
    pub options: SubmitOptions,
    pub walltime: Option<u64>,
    pub submit_time: f64,
    pub start_time: Option<f64>,
    pub end_time: Option<f64>,
    pub allocation: Allocation,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    pub cwd: String,
    pub stdout: String,
    pub stderr: String,
    /// Shared by the tasks of an array (one copy in memory, one row on disk: `store`).
    pub script: std::sync::Arc<str>,
    pub env: std::sync::Arc<Vec<(String, String)>>,
    pub usage: Option<Usage>,
    /// A kill was sent and the job's end is awaited (not persisted: resent after a restart).
    pub kill_sent: Option<String>,
    /// Its suspensions (see `suspend`).
    pub suspension: crate::model::suspension::Suspension,
}

/// The queue of interactive allocations (`berth run` outside a job): made for one step, with
/// no batch script, and ended with it.
pub const INTERACTIVE_QUEUE: &str = "interactive";

/// The queue of reservations made through the reservations API (`crate::reservations`): no
/// batch script either; they end when released.
pub const RESERVATION_QUEUE: &str = "reservation";

/// The account a job's usage is charged to.
pub fn account_of(job: &JobRecord) -> String {
    job.options.account.clone().unwrap_or_else(|| crate::users::default_account(job.user.gid))
}

/// The nodes a requeued job's previous run still ends on (told to kill it), since when.
#[derive(Debug, Clone, PartialEq)]
pub struct OldRun {
    pub nodes: Vec<usize>,
    pub since: f64,
}

impl JobRecord {
    /// It has no batch script (an interactive allocation, a reservation, or an allocation of
    /// `berth alloc`): the controller ends it, and every node only holds its cgroup for steps
    /// and tasks.
    pub fn is_interactive(&self) -> bool {
        self.queue == INTERACTIVE_QUEUE || self.queue == RESERVATION_QUEUE || self.options.alloc.is_some()
    }

    /// What it is when not a batch job (`JobInfo::kind`).
    pub fn kind(&self) -> Option<&'static str> {
        if self.options.alloc.is_some() {
            Some("alloc")
        } else if self.queue == INTERACTIVE_QUEUE {
            Some("interactive")
        } else if self.queue == RESERVATION_QUEUE {
            Some("reservation")
        } else {
            None
        }
    }

    /// Node `id` holds part of the job.
    pub fn on_node(&self, id: usize) -> bool {
        self.allocation.iter().any(|a| a.node_id.0 as usize == id)
    }

    /// The job's options must describe a request the scheduler can place.
    pub fn validate(&self) -> Result<(), String> {
        JobRequest::from_options(&self.options).map(|_| ()).map_err(|e| e.to_string())
    }

    /// Derived from the options, which `validate` checked when the job was accepted or loaded.
    pub fn request(&self) -> JobRequest {
        JobRequest::from_options(&self.options)
            .unwrap_or_else(|_| JobRequest::simple(Shape::Total { cores: 1, chunk: 1 }, 0))
    }

    pub fn pending(&self) -> PendingJob {
        PendingJob { id: self.id, request: self.request(), held: self.state == JobState::Held }
    }

    /// `pending` with where its queue sends it (the queues' subnode targets, see
    /// `sched::queue::target`): what the scheduling pass places.
    pub fn pending_in(&self, queues: &[berth_core::sched::queue::QueueSpec]) -> PendingJob {
        let mut pending = self.pending();
        berth_core::sched::queue::target(queues, &self.queue, &mut pending.request);
        pending
    }

    pub fn finish(&mut self, outcome: &JobOutcome, now: f64) {
        self.state = outcome.final_state();
        self.exit_code = outcome.exit_code;
        self.signal = outcome.signal;
        self.reason = outcome.reason.clone();
        self.end_time = Some(now);
        self.usage = Some(Usage {
            wall_ms: outcome.wall_ms,
            user_cpu_us: outcome.user_cpu_us,
            system_cpu_us: outcome.system_cpu_us,
            peak_memory_bytes: outcome.peak_memory_bytes,
        });
    }

    /// When a started job reaches its walltime: start + walltime (`unlimited` seconds when it
    /// has none) + the seconds of its suspensions that ended (its walltime clock stops while
    /// it is suspended). A job suspended now ends later still, by how long it stays so.
    pub fn expected_end(&self, unlimited: f64) -> f64 {
        self.ends_after(self.suspension.total_secs, unlimited)
    }

    /// `expected_end` had its suspensions lasted `suspended_secs` in all.
    pub fn ends_after(&self, suspended_secs: f64, unlimited: f64) -> f64 {
        let start = self.start_time.unwrap_or(self.submit_time);
        start + self.walltime.map(|w| w as f64).unwrap_or(unlimited) + suspended_secs
    }

    /// What users see of it; `now` counts a suspension going on.
    pub fn info(&self, now: f64) -> JobInfo {
        JobInfo {
            id: self.id,
            name: self.name.clone(),
            user: self.user.name.clone(),
            uid: self.user.uid,
            gid: self.user.gid,
            state: self.state,
            queue: self.queue.clone(),
            request: self.options.request(),
            walltime_seconds: self.walltime,
            submit_time: self.submit_time,
            start_time: self.start_time,
            end_time: self.end_time,
            allocation: self.allocation.clone(),
            exit_code: self.exit_code,
            signal: self.signal,
            reason: self.reason.clone(),
            reason_code: None,
            cwd: self.cwd.clone(),
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            accounting: self.usage.map(|u| Accounting {
                wall_seconds: u.wall_ms as f64 / 1000.0,
                user_cpu_seconds: u.user_cpu_us as f64 / 1e6,
                system_cpu_seconds: u.system_cpu_us as f64 / 1e6,
                peak_memory_bytes: u.peak_memory_bytes,
                gpu_seconds: self.allocation.iter().map(|a| a.gpus.len()).sum::<usize>() as f64 * u.wall_ms as f64
                    / 1000.0,
            }),
            cgroups: vec![],
            steps: vec![],
            binding: self.options.binding.clone(),
            binding_mode: self.options.binding_mode,
            account: account_of(self),
            priority: None,
            expected_start: None,
            kind: self.kind().map(str::to_string),
            dependency: self.options.dependency.as_ref().map(ToString::to_string),
            begin_time: match self.options.begin {
                Some(berth_core::directives::Begin::At(t)) => Some(t as f64),
                _ => None,
            },
            array_job: self.options.array_task.map(|t| JobId(t.job)),
            array_index: self.options.array_task.map(|t| t.index),
            array_limit: self.options.array_task.and_then(|t| t.limit),
            array_count: self.options.array_task.map(|t| t.count),
            comment: self.options.comment.clone(),
            work_dir: self.options.chdir.clone(),
            mail_type: self.options.mail_type.map(|m| m.slurm()),
            mail_user: self.options.mail_type.and(self.options.mail_user.clone()),
            early_signal: self
                .options
                .signal
                .as_ref()
                .map(|s| format!("{}{}@{}", if s.batch_only { "B:" } else { "" }, s.signal, s.secs)),
            exclusive: self.options.exclusive == Some(true),
            tasks: self.options.tasks,
            gpu_places: vec![],
            billing: None,
            suspended_seconds: self.suspension.ever().then(|| {
                // A suspension going on counts up to the job's end, or to now.
                let until = self.end_time.unwrap_or(now);
                (self.suspension.seconds(until) * 10.0).round() / 10.0
            }),
        }
    }
}
