//! Why a pending job is not running: one typed value from the round (or the controller's
//! checks before it) to the edge where it is shown. Its `Display` is the sentence users read
//! (`berth jobs`, `berth show`; tests and system tests assert the words), its [`code`]
//! a stable short name, Slurm's REASON where Slurm has one (`squeue %r`, `--json`).
//!
//! [`code`]: PendingReason::code

use crate::placement::reason::{Busy, Never};
use crate::JobId;
use std::fmt;

/// Why a pending job is not running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingReason {
    /// Waiting for resources to free up, with what is missing.
    Resources(Wanting),
    /// It fits what is free now, but that is kept for higher-priority jobs waiting before it
    /// (or, without backfill, an earlier job waits first).
    Priority,
    Held,
    /// No node that is up can ever hold it; it waits for larger nodes to come up.
    NoSuitableNodes(Unsuitable),
    /// A limit of its queue holds it back.
    QueueLimit(QueueLimit),
    /// The advance reservation it asks for: it cannot use it, or it has not started.
    Reservation(ReservationWait),
    /// Its dependency is not met yet (the words of the dependency's check).
    Dependency(String),
    /// Its dependency can never be met (the words of the dependency's check): it will not
    /// start.
    DependencyNeverSatisfied {
        why: String,
        job: JobId,
    },
    /// Not before a time: its begin time, or its previous run's end.
    BeginTime(BeginWait),
    /// Its array runs at most `limit` tasks at once (`%limit`), and that many run.
    JobArrayTaskLimit {
        array: u64,
        limit: u32,
    },
}

/// What a job waiting for resources misses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanting {
    /// What placement found missing on what is free now.
    Busy(Busy),
    /// It fits what is free now, but that is held for these advance reservations (named)
    /// before the job would end.
    HeldForAdvance(Vec<String>),
    /// A member of advance reservation `name`: what it misses inside it.
    InAdvance { name: String, busy: Busy },
    /// A member of advance reservation `name`, which has not started.
    AdvanceNotStarted(String),
}

/// Why no node up can ever hold the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsuitable {
    /// Placement's answer on the nodes up.
    Never(Never),
    /// The advance reservation `name` it is a member of has ended.
    AdvanceEnded(String),
    /// The advance reservation `name` ends before the job's walltime would.
    AdvanceTooShort(String),
    /// Inside advance reservation `name`, it can never fit.
    InAdvance { name: String, never: Never },
}

/// A limit of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueLimit {
    /// Queue `queue` lets one user run `max` cores at once; theirs use `used`, the job `need`.
    UserCores { queue: String, max: u64, used: u64, need: u64 },
}

/// Why a job asking for an advance reservation waits outside the round (or for its window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationWait {
    /// Reservation `name` no longer admits `user` (it is for `who`).
    NotAdmitted { name: String, user: String, who: String },
    /// Reservation `name` no longer exists.
    Gone { name: String },
    /// Reservation `name` starts at `at` (as the controller's clock shows it).
    Starts { name: String, at: String },
}

/// What a job with a begin time waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginWait {
    /// Its begin time, `at` as the controller shows local times.
    At(String),
    /// Requeued: its previous run still ends on these nodes.
    OldRun(Vec<String>),
}

impl PendingReason {
    /// Every code [`code`](Self::code) gives: what a client accepts from a peer as a code
    /// (anything else it reads from the words, as before codes were sent).
    pub const CODES: &'static [&'static str] = &[
        "Resources",
        "Priority",
        "JobHeldUser",
        "ReqNodeNotAvail",
        "QOSMaxCpuPerUserLimit",
        "Reservation",
        "Dependency",
        "DependencyNeverSatisfied",
        "BeginTime",
        "JobArrayTaskLimit",
    ];

    /// The reason's stable short code: Slurm's REASON where Slurm has one (what `squeue %r`
    /// shows), so scripts can match it across versions.
    pub fn code(&self) -> &'static str {
        match self {
            PendingReason::Resources(_) => "Resources",
            PendingReason::Priority => "Priority",
            PendingReason::Held => "JobHeldUser",
            PendingReason::NoSuitableNodes(_) => "ReqNodeNotAvail",
            PendingReason::QueueLimit(QueueLimit::UserCores { .. }) => "QOSMaxCpuPerUserLimit",
            PendingReason::Reservation(_) => "Reservation",
            PendingReason::Dependency(_) => "Dependency",
            PendingReason::DependencyNeverSatisfied { .. } => "DependencyNeverSatisfied",
            PendingReason::BeginTime(_) => "BeginTime",
            PendingReason::JobArrayTaskLimit { .. } => "JobArrayTaskLimit",
        }
    }

    /// The words users read (the reason's `Display`).
    pub fn describe(&self) -> String {
        self.to_string()
    }

    /// The words of a dependency that can never be met without the advice to cancel: what
    /// a job cancelled for it (`[scheduler] kill_invalid_depend`) records. None for other
    /// reasons.
    pub fn never_satisfied(&self) -> Option<String> {
        match self {
            PendingReason::DependencyNeverSatisfied { why, .. } => Some(format!("DependencyNeverSatisfied: {why}")),
            _ => None,
        }
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::Resources(what) => {
                let what = what.to_string();
                if what.is_empty() {
                    f.write_str("resources: waiting for cores or memory to free up")
                } else {
                    write!(f, "resources: {what}")
                }
            }
            PendingReason::Priority => f.write_str(
                "priority: what it needs is free now but kept for higher-priority jobs waiting before it; it starts after them, or sooner if more frees up",
            ),
            PendingReason::Held => f.write_str("held: run `berth release <id>`"),
            PendingReason::NoSuitableNodes(why) => write!(f, "no suitable node up: {why}"),
            PendingReason::QueueLimit(which) => write!(f, "queue limit: {which}"),
            PendingReason::Reservation(why) => write!(f, "{why}"),
            PendingReason::Dependency(why) => write!(f, "Dependency: {why}"),
            PendingReason::DependencyNeverSatisfied { why, job } => {
                write!(f, "DependencyNeverSatisfied: {why}; it will not start: cancel it (`berth cancel {job}`)")
            }
            PendingReason::BeginTime(BeginWait::At(at)) => write!(f, "BeginTime: starts no earlier than {at}"),
            PendingReason::BeginTime(BeginWait::OldRun(nodes)) => {
                write!(f, "BeginTime: requeued; its previous run is still ending on {}", nodes.join(","))
            }
            PendingReason::JobArrayTaskLimit { array, limit } => {
                write!(f, "JobArrayTaskLimit: array {array} runs at most {limit} tasks at once (%{limit})")
            }
        }
    }
}

impl fmt::Display for Wanting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wanting::Busy(what) => write!(f, "{what}"),
            Wanting::HeldForAdvance(names) => write!(
                f,
                "what is free now is held for advance reservation {} before the job would end",
                names.join(", ")
            ),
            Wanting::InAdvance { name, busy } => write!(f, "reservation {name}: {busy}"),
            Wanting::AdvanceNotStarted(name) => write!(f, "reservation {name} has not started"),
        }
    }
}

impl fmt::Display for Unsuitable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsuitable::Never(why) => write!(f, "{why}"),
            Unsuitable::AdvanceEnded(name) => write!(f, "reservation {name} has ended"),
            Unsuitable::AdvanceTooShort(name) => write!(f, "reservation {name} ends before the job's walltime would"),
            Unsuitable::InAdvance { name, never } => write!(f, "reservation {name}: {never}"),
        }
    }
}

impl fmt::Display for QueueLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueLimit::UserCores { queue, max, used, need } => write!(
                f,
                "queue {queue} lets one user run {max} cores at once; yours use {used}, this job needs {need}"
            ),
        }
    }
}

impl fmt::Display for ReservationWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReservationWait::NotAdmitted { name, user, who } => {
                write!(f, "reservation {name} no longer admits {user} (it is for {who}); cancel the job")
            }
            ReservationWait::Gone { name } => {
                write!(f, "reservation {name} no longer exists (ended or deleted); cancel the job")
            }
            ReservationWait::Starts { name, at } => write!(f, "reservation {name} starts at {at}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant's code, and its words exactly as they were when they were strings.
    #[test]
    fn codes_and_words() {
        let cases: Vec<(PendingReason, &str, &str)> = vec![
            (
                PendingReason::Resources(Wanting::Busy(Busy::Counted { need: 8, free: 2 })),
                "Resources",
                "resources: cores: 8 wanted, 2 free now; it starts when running jobs free them",
            ),
            (
                PendingReason::Resources(Wanting::Busy(Busy::Unstated)),
                "Resources",
                "resources: waiting for cores or memory to free up",
            ),
            (
                PendingReason::Resources(Wanting::HeldForAdvance(vec!["a".into(), "b".into()])),
                "Resources",
                "resources: what is free now is held for advance reservation a, b before the job would end",
            ),
            (
                PendingReason::Resources(Wanting::AdvanceNotStarted("course".into())),
                "Resources",
                "resources: reservation course has not started",
            ),
            (PendingReason::Held, "JobHeldUser", "held: run `berth release <id>`"),
            (
                PendingReason::NoSuitableNodes(Unsuitable::Never(Never::NoNodeUp)),
                "ReqNodeNotAvail",
                "no suitable node up: nodes: no node is up; it starts once nodes come up",
            ),
            (
                PendingReason::NoSuitableNodes(Unsuitable::AdvanceEnded("r".into())),
                "ReqNodeNotAvail",
                "no suitable node up: reservation r has ended",
            ),
            (
                PendingReason::QueueLimit(QueueLimit::UserCores { queue: "q".into(), max: 4, used: 2, need: 3 }),
                "QOSMaxCpuPerUserLimit",
                "queue limit: queue q lets one user run 4 cores at once; yours use 2, this job needs 3",
            ),
            (
                PendingReason::Reservation(ReservationWait::Gone { name: "r1".into() }),
                "Reservation",
                "reservation r1 no longer exists (ended or deleted); cancel the job",
            ),
            (PendingReason::Dependency("afterok:5".into()), "Dependency", "Dependency: afterok:5"),
            (
                PendingReason::DependencyNeverSatisfied { why: "job 5 failed".into(), job: JobId(7) },
                "DependencyNeverSatisfied",
                "DependencyNeverSatisfied: job 5 failed; it will not start: cancel it (`berth cancel 7`)",
            ),
            (
                PendingReason::BeginTime(BeginWait::OldRun(vec!["n1".into(), "n2".into()])),
                "BeginTime",
                "BeginTime: requeued; its previous run is still ending on n1,n2",
            ),
            (
                PendingReason::JobArrayTaskLimit { array: 3, limit: 2 },
                "JobArrayTaskLimit",
                "JobArrayTaskLimit: array 3 runs at most 2 tasks at once (%2)",
            ),
        ];
        for (reason, code, words) in cases {
            assert_eq!(reason.code(), code, "{reason:?}");
            assert!(PendingReason::CODES.contains(&code), "{code} missing from CODES");
            assert_eq!(reason.to_string(), words, "{reason:?}");
        }
        let never = PendingReason::DependencyNeverSatisfied { why: "job 5 failed".into(), job: JobId(7) };
        assert_eq!(never.never_satisfied().as_deref(), Some("DependencyNeverSatisfied: job 5 failed"));
        assert_eq!(PendingReason::Priority.never_satisfied(), None);
    }
}
