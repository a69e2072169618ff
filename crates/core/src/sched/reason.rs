//! Why a pending job is not running ([`PendingReason`]), and why a suspended one is not
//! ([`SuspendedReason`]): one typed value from the round (or the controller's checks before it)
//! to the edge where it is shown. Its `Display` is the sentence users read (`berth jobs`,
//! `berth show`; tests and system tests assert the words), its `code()` a stable short name,
//! Slurm's REASON where Slurm has one (`squeue %r`, `--json`).

use crate::placement::reason::{Busy, Never};
use crate::{CpuSet, JobId};
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

/// Why a suspended job is not running: what suspended it, and, once a resume was tried and
/// could not be carried out, what it waits for ([`ResumeWait`], from the round's resume step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuspendedReason {
    /// Suspended by admin `who` (`berth suspend`): only `berth resume` resumes it.
    ByAdmin { who: String },
    /// Suspended by the scheduling pass (`why`: "preempted by job 12"); it resumes as soon as
    /// it can.
    Preempted { why: String, waits: Option<ResumeWait> },
    /// A resume failed on node `node` (`error`): it is suspended again.
    ResumeFailed { node: String, error: String, waits: Option<ResumeWait> },
    /// Freezing failed on node `node` (`error`): its processes there still run.
    FreezingFailed { node: String, error: String },
    /// It waits to resume, with no cause kept (an admin's suspension lifted by `berth
    /// resume`, a failed freeze, or a cause not known).
    Waiting(ResumeWait),
}

impl SuspendedReason {
    /// Every code [`code`](Self::code) gives.
    pub const CODES: &'static [&'static str] =
        &["SuspendedByAdmin", "Preempted", "SystemFailure", "NodeDown", "Resources"];

    /// The reason's stable short code: why the job does not run now. A wait to resume gives
    /// its own ([`ResumeWait::code`]: `Resources`, or Slurm's `NodeDown`); otherwise
    /// `SuspendedByAdmin`, `Preempted` (berth's: Slurm has no REASON for either), or Slurm's
    /// `SystemFailure` when freezing or a resume failed.
    pub fn code(&self) -> &'static str {
        match self {
            SuspendedReason::Preempted { waits: Some(w), .. }
            | SuspendedReason::ResumeFailed { waits: Some(w), .. }
            | SuspendedReason::Waiting(w) => w.code(),
            SuspendedReason::ByAdmin { .. } => "SuspendedByAdmin",
            SuspendedReason::Preempted { waits: None, .. } => "Preempted",
            SuspendedReason::ResumeFailed { waits: None, .. } | SuspendedReason::FreezingFailed { .. } => {
                "SystemFailure"
            }
        }
    }

    /// The same suspension once a resume was tried and could not be carried out: `wait` its
    /// wait, what suspended it kept (the pass's preemption, a failed resume) and an earlier wait
    /// replaced. `reason`: the job's reason so far (None: none known).
    pub fn waiting(reason: Option<&SuspendedReason>, wait: ResumeWait) -> SuspendedReason {
        match reason {
            Some(SuspendedReason::Preempted { why, .. }) => {
                SuspendedReason::Preempted { why: why.clone(), waits: Some(wait) }
            }
            Some(SuspendedReason::ResumeFailed { node, error, .. }) => {
                SuspendedReason::ResumeFailed { node: node.clone(), error: error.clone(), waits: Some(wait) }
            }
            _ => SuspendedReason::Waiting(wait),
        }
    }

    /// The reason of a suspended job read back from its words (a reason as a store keeps it):
    /// what suspended it. What it waits for is not read (the next round's resume step says it
    /// again); None for words that name no cause (a wait alone, or words of no reason here).
    ///
    /// Exact: for every reason `r`, `from_words(&r.to_string())` is `r` with its wait dropped
    /// ([`cause`](Self::cause)), whatever its `why`, `who` or `error` holds ("; ", ": ",
    /// "waiting for", words of a reason), so a restart keeps the words a job showed. A wait is
    /// cut off only where the words end in "; " and then a whole wait's words (a wait's words
    /// hold no "; "), never at the first "; ". What the words cannot tell apart, nothing can:
    /// a `why` or `error` that itself ends in "; " and a wait's words reads as that wait, a
    /// `why` that is a wait's words or a failed resume's ("resuming failed on N: E") as that,
    /// and a node name holding ": " (node names hold none) is cut at its first ": ".
    pub fn from_words(words: &str) -> Option<SuspendedReason> {
        if let Some(who) =
            words.strip_prefix("suspended by admin ").and_then(|w| w.strip_suffix(": `berth resume` resumes it"))
        {
            return Some(SuspendedReason::ByAdmin { who: who.to_string() });
        }
        let failed = |w: &str| w.split_once(": ").map(|(node, error)| (node.to_string(), error.to_string()));
        if let Some(rest) = words.strip_prefix("suspended, but freezing failed on ") {
            let (node, error) = failed(rest)?;
            return Some(SuspendedReason::FreezingFailed { node, error });
        }
        let rest = words.strip_prefix("suspended: ")?;
        if ResumeWait::are_words(rest) {
            return None;
        }
        // The cause is the words before a wait ("suspended: preempted by job 12; waiting for ...").
        let cause = match rest.rsplit_once("; ") {
            Some((cause, wait)) if ResumeWait::are_words(wait) => cause,
            _ => rest,
        };
        // Without a ": " after the node, words that start so were a `why` (see above).
        if let Some((node, error)) = cause.strip_prefix("resuming failed on ").and_then(failed) {
            return Some(SuspendedReason::ResumeFailed { node, error, waits: None });
        }
        Some(SuspendedReason::Preempted { why: cause.to_string(), waits: None })
    }

    /// What suspended the job, without what it waits for: the reason [`from_words`]
    /// (Self::from_words) reads back from its words (None: a wait alone names no cause).
    pub fn cause(&self) -> Option<SuspendedReason> {
        match self {
            SuspendedReason::Preempted { why, .. } => {
                Some(SuspendedReason::Preempted { why: why.clone(), waits: None })
            }
            SuspendedReason::ResumeFailed { node, error, .. } => {
                Some(SuspendedReason::ResumeFailed { node: node.clone(), error: error.clone(), waits: None })
            }
            SuspendedReason::Waiting(_) => None,
            other => Some(other.clone()),
        }
    }
}

impl fmt::Display for SuspendedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let waits = |f: &mut fmt::Formatter<'_>, w: &Option<ResumeWait>| match w {
            Some(w) => write!(f, "; {w}"),
            None => Ok(()),
        };
        match self {
            SuspendedReason::ByAdmin { who } => write!(f, "suspended by admin {who}: `berth resume` resumes it"),
            SuspendedReason::Preempted { why, waits: w } => {
                write!(f, "suspended: {why}")?;
                waits(f, w)
            }
            SuspendedReason::ResumeFailed { node, error, waits: w } => {
                write!(f, "suspended: resuming failed on {node}: {error}")?;
                waits(f, w)
            }
            SuspendedReason::FreezingFailed { node, error } => {
                write!(f, "suspended, but freezing failed on {node}: {error}")
            }
            SuspendedReason::Waiting(w) => write!(f, "suspended: {w}"),
        }
    }
}

/// Why a suspended job does not resume now (said to users as the job's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeWait {
    #[error("node {0} is not connected")]
    NotConnected(String),
    #[error("node {0} is unknown")]
    UnknownNode(String),
    #[error("waiting for its own CPUs {cpus} on {node} to resume (its steps hold them)")]
    StepsHold { cpus: CpuSet, node: String },
    #[error("waiting for {need} {unit} on {node} to resume ({free} free)")]
    Short { need: u32, unit: &'static str, node: String, free: u32 },
    #[error("waiting for its own CPUs {cpus} on {node} to resume ({why})")]
    Pinned { cpus: CpuSet, node: String, why: &'static str },
    /// No resume was decided for it, and no why given.
    #[error("it cannot resume now")]
    Unstated,
}

impl ResumeWait {
    /// Whether `words` are a wait's words as [`Display`](fmt::Display) writes them (of any
    /// variant; none holds "; ", node names hold none).
    fn are_words(words: &str) -> bool {
        let node = |n: &str| !n.is_empty();
        if words.contains("; ") {
            return false;
        }
        words == "it cannot resume now"
            || words.strip_prefix("node ").is_some_and(|n| {
                n.strip_suffix(" is not connected").is_some_and(node) || n.strip_suffix(" is unknown").is_some_and(node)
            })
            || (words.starts_with("waiting for ") && words.ends_with(')') && words.contains(" to resume ("))
    }

    /// The wait's stable short code, Slurm's REASON where Slurm has one: `NodeDown` for a node
    /// that cannot be told to thaw it, else `Resources`.
    pub fn code(&self) -> &'static str {
        match self {
            ResumeWait::NotConnected(_) | ResumeWait::UnknownNode(_) => "NodeDown",
            ResumeWait::StepsHold { .. }
            | ResumeWait::Short { .. }
            | ResumeWait::Pinned { .. }
            | ResumeWait::Unstated => "Resources",
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

    /// Every suspended reason's code, and its words exactly as they were when they were strings
    /// (`controller/src/suspend.rs` wrote them); read back from its words, its cause.
    #[test]
    fn every_suspended_variant_keeps_its_words() {
        let short = || ResumeWait::Short { need: 4, unit: "cores", node: "n0".into(), free: 1 };
        let cases: Vec<(SuspendedReason, &str, &str, Option<SuspendedReason>)> = vec![
            (
                SuspendedReason::ByAdmin { who: "root".into() },
                "SuspendedByAdmin",
                "suspended by admin root: `berth resume` resumes it",
                Some(SuspendedReason::ByAdmin { who: "root".into() }),
            ),
            (
                SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: None },
                "Preempted",
                "suspended: preempted by job 9",
                Some(SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: None }),
            ),
            (
                SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: Some(short()) },
                "Resources",
                "suspended: preempted by job 9; waiting for 4 cores on n0 to resume (1 free)",
                Some(SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: None }),
            ),
            (
                SuspendedReason::Preempted {
                    why: "preempted by job 9".into(),
                    waits: Some(ResumeWait::NotConnected("n1".into())),
                },
                "NodeDown",
                "suspended: preempted by job 9; node n1 is not connected",
                Some(SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: None }),
            ),
            (
                SuspendedReason::ResumeFailed { node: "n1".into(), error: "kernel said no".into(), waits: None },
                "SystemFailure",
                "suspended: resuming failed on n1: kernel said no",
                Some(SuspendedReason::ResumeFailed { node: "n1".into(), error: "kernel said no".into(), waits: None }),
            ),
            (
                SuspendedReason::ResumeFailed { node: "n1".into(), error: "EBUSY".into(), waits: Some(short()) },
                "Resources",
                "suspended: resuming failed on n1: EBUSY; waiting for 4 cores on n0 to resume (1 free)",
                Some(SuspendedReason::ResumeFailed { node: "n1".into(), error: "EBUSY".into(), waits: None }),
            ),
            (
                SuspendedReason::FreezingFailed { node: "n1".into(), error: "EBUSY".into() },
                "SystemFailure",
                "suspended, but freezing failed on n1: EBUSY",
                Some(SuspendedReason::FreezingFailed { node: "n1".into(), error: "EBUSY".into() }),
            ),
            (
                SuspendedReason::Waiting(short()),
                "Resources",
                "suspended: waiting for 4 cores on n0 to resume (1 free)",
                None,
            ),
            (
                SuspendedReason::Waiting(ResumeWait::StepsHold {
                    cpus: CpuSet::from_iter_u32(0..4),
                    node: "n0".into(),
                }),
                "Resources",
                "suspended: waiting for its own CPUs 0-3 on n0 to resume (its steps hold them)",
                None,
            ),
            (
                SuspendedReason::Waiting(ResumeWait::Pinned {
                    cpus: CpuSet::from_iter_u32([2]),
                    node: "n0".into(),
                    why: "bound",
                }),
                "Resources",
                "suspended: waiting for its own CPUs 2 on n0 to resume (bound)",
                None,
            ),
            (
                SuspendedReason::Waiting(ResumeWait::NotConnected("n1".into())),
                "NodeDown",
                "suspended: node n1 is not connected",
                None,
            ),
            (
                SuspendedReason::Waiting(ResumeWait::UnknownNode("n7".into())),
                "NodeDown",
                "suspended: node n7 is unknown",
                None,
            ),
            (SuspendedReason::Waiting(ResumeWait::Unstated), "Resources", "suspended: it cannot resume now", None),
        ];
        for (reason, code, words, cause) in cases {
            assert_eq!(reason.code(), code, "{reason:?}");
            assert!(SuspendedReason::CODES.contains(&code), "{code} missing from CODES");
            assert_eq!(reason.to_string(), words, "{reason:?}");
            assert_eq!(SuspendedReason::from_words(words), cause, "{words}");
        }
        assert_eq!(SuspendedReason::from_words("requeued: node n1 failed"), None);
        // A `why` that starts as a failed resume's words but names no error reads as itself.
        let why = SuspendedReason::Preempted { why: "resuming failed on n1".into(), waits: None };
        assert_eq!(SuspendedReason::from_words(&why.to_string()), Some(why));
    }

    /// `are_words` knows every wait's words: one sample per variant (the match has no
    /// wildcard, so a new variant does not compile until it has a sample here), each read as a
    /// wait, none holding "; " (a restart would otherwise fold a new wait's words into the
    /// cause and add one more wait at each restart).
    #[test]
    fn every_waits_words_read_as_a_wait() {
        let cpus = CpuSet::from_iter_u32([2]);
        let samples = [
            ResumeWait::NotConnected("n1".into()),
            ResumeWait::UnknownNode("n1".into()),
            ResumeWait::StepsHold { cpus: cpus.clone(), node: "n1".into() },
            ResumeWait::Short { need: 2, unit: "cores", node: "n1".into(), free: 1 },
            ResumeWait::Pinned { cpus, node: "n1".into(), why: "bound" },
            ResumeWait::Unstated,
        ];
        let variant = |w: &ResumeWait| match w {
            ResumeWait::NotConnected(_) => 0,
            ResumeWait::UnknownNode(_) => 1,
            ResumeWait::StepsHold { .. } => 2,
            ResumeWait::Short { .. } => 3,
            ResumeWait::Pinned { .. } => 4,
            ResumeWait::Unstated => 5,
        };
        let seen: std::collections::BTreeSet<usize> = samples.iter().map(variant).collect();
        assert_eq!(seen.len(), samples.len(), "one sample per variant");
        for w in &samples {
            let words = w.to_string();
            assert!(ResumeWait::are_words(&words) && !words.contains("; "), "{words}");
            let waiting = SuspendedReason::Waiting(w.clone());
            assert_eq!(SuspendedReason::from_words(&waiting.to_string()), None, "{waiting}");
        }
    }

    /// A wait replaces an earlier one and keeps what suspended the job; an admin's suspension
    /// (lifted) and a failed freeze leave only the wait.
    #[test]
    fn a_wait_keeps_the_cause() {
        let wait = ResumeWait::NotConnected("n1".into());
        let earlier = ResumeWait::Short { need: 4, unit: "cores", node: "n0".into(), free: 1 };
        let preempted = SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: Some(earlier.clone()) };
        assert_eq!(
            SuspendedReason::waiting(Some(&preempted), wait.clone()),
            SuspendedReason::Preempted { why: "preempted by job 9".into(), waits: Some(wait.clone()) }
        );
        let failed = SuspendedReason::ResumeFailed { node: "n2".into(), error: "e".into(), waits: None };
        assert_eq!(
            SuspendedReason::waiting(Some(&failed), wait.clone()).to_string(),
            "suspended: resuming failed on n2: e; node n1 is not connected"
        );
        for other in [
            None,
            Some(SuspendedReason::ByAdmin { who: "root".into() }),
            Some(SuspendedReason::FreezingFailed { node: "n1".into(), error: "EBUSY".into() }),
            Some(SuspendedReason::Waiting(earlier)),
        ] {
            assert_eq!(SuspendedReason::waiting(other.as_ref(), wait.clone()), SuspendedReason::Waiting(wait.clone()));
        }
    }

    /// Fragments that make a `why` or an `error` hard to read back: the separators the words
    /// use, the words of waits and of other reasons, and plain text.
    const TRICKY: &[&str] = &[
        "; ",
        ": ",
        ";",
        ":",
        " ",
        "waiting for ",
        " to resume (1 free)",
        "node ",
        "n1",
        " is unknown",
        " is not connected",
        "it cannot resume now",
        "suspended: ",
        "resuming failed on ",
        "suspended by admin ",
        ": `berth resume` resumes it",
        "preempted by job 9",
        "EBUSY",
        "(",
        ")",
        "é",
    ];

    fn tricky() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        proptest::collection::vec(proptest::sample::select(TRICKY), 0..7).prop_map(|parts| parts.concat())
    }

    fn node_name() -> impl proptest::strategy::Strategy<Value = String> {
        "[a-z][a-z0-9.-]{0,8}"
    }

    fn wait() -> impl proptest::strategy::Strategy<Value = ResumeWait> {
        use proptest::prelude::*;
        prop_oneof![
            node_name().prop_map(ResumeWait::NotConnected),
            node_name().prop_map(ResumeWait::UnknownNode),
            (node_name(), 0u32..64)
                .prop_map(|(node, c)| ResumeWait::StepsHold { cpus: CpuSet::from_iter_u32([c]), node }),
            (node_name(), 1u32..9, 0u32..9).prop_map(|(node, need, free)| ResumeWait::Short {
                need,
                unit: "cores",
                node,
                free
            }),
            (node_name(), 0u32..64).prop_map(|(node, c)| ResumeWait::Pinned {
                cpus: CpuSet::from_iter_u32([c]),
                node,
                why: "bound"
            }),
            Just(ResumeWait::Unstated),
        ]
    }

    fn suspended() -> impl proptest::strategy::Strategy<Value = SuspendedReason> {
        use proptest::prelude::*;
        let waits = || proptest::option::of(wait());
        prop_oneof![
            tricky().prop_map(|who| SuspendedReason::ByAdmin { who }),
            (tricky(), waits()).prop_map(|(why, waits)| SuspendedReason::Preempted { why, waits }),
            (node_name(), tricky(), waits()).prop_map(|(node, error, waits)| SuspendedReason::ResumeFailed {
                node,
                error,
                waits
            }),
            (node_name(), tricky()).prop_map(|(node, error)| SuspendedReason::FreezingFailed { node, error }),
            wait().prop_map(SuspendedReason::Waiting),
        ]
    }

    /// The values no words can tell apart from another's (see `from_words`): a `why` or
    /// `error` ending in "; " and a wait's words, a `why` that is a wait's words or a failed
    /// resume's.
    fn indistinct(r: &SuspendedReason) -> bool {
        let ends_in_a_wait = |s: &str| s.rsplit_once("; ").is_some_and(|(_, w)| ResumeWait::are_words(w));
        match r {
            SuspendedReason::Preempted { why, .. } => {
                ends_in_a_wait(why)
                    || ResumeWait::are_words(why)
                    || why.strip_prefix("resuming failed on ").is_some_and(|w| w.contains(": "))
            }
            SuspendedReason::ResumeFailed { error, .. } => ends_in_a_wait(error),
            _ => false,
        }
    }

    proptest::proptest! {
        /// Words read back give the reason they were written from, less its wait, however its
        /// free text is made; written again, they are the words less the wait.
        #[test]
        fn suspended_words_read_back_exactly(r in suspended()) {
            proptest::prop_assume!(!indistinct(&r));
            let words = r.to_string();
            let read = SuspendedReason::from_words(&words);
            proptest::prop_assert_eq!(&read, &r.cause(), "{}", words);
            if let Some(read) = read {
                let without_wait = match &r {
                    SuspendedReason::Preempted { waits: Some(w), .. }
                    | SuspendedReason::ResumeFailed { waits: Some(w), .. } => {
                        words.strip_suffix(&format!("; {w}")).map(str::to_string)
                    }
                    _ => Some(words.clone()),
                };
                proptest::prop_assert_eq!(Some(read.to_string()), without_wait);
            }
        }
    }

    /// Errors and causes holding the words' own separators, read back whole (before: cut at
    /// the first "; ", so a restart changed the words of a failed resume).
    #[test]
    fn separators_inside_a_cause_are_kept() {
        let cases = [
            SuspendedReason::ResumeFailed {
                node: "n1".into(),
                error: "cgroup freezer: state THAWED; write: Device or resource busy".into(),
                waits: Some(ResumeWait::NotConnected("n2".into())),
            },
            SuspendedReason::ResumeFailed { node: "n1".into(), error: "a; b; c".into(), waits: None },
            SuspendedReason::ResumeFailed { node: "n1".into(), error: "".into(), waits: Some(ResumeWait::Unstated) },
            SuspendedReason::Preempted { why: "preempted by job 9; then 10".into(), waits: None },
            SuspendedReason::Preempted {
                why: "preempted (waiting for job 9)".into(),
                waits: Some(ResumeWait::Short { need: 2, unit: "cores", node: "n0".into(), free: 0 }),
            },
            SuspendedReason::FreezingFailed { node: "n1".into(), error: "x; waiting for y to resume (z)".into() },
            SuspendedReason::ByAdmin { who: "root; suspended: x: `berth resume` resumes it".into() },
        ];
        for r in cases {
            assert_eq!(SuspendedReason::from_words(&r.to_string()), r.cause(), "{r}");
        }
        // What the words cannot tell apart reads as the wait.
        let ambiguous =
            SuspendedReason::Preempted { why: "preempted by job 9; node n1 is unknown".into(), waits: None };
        let with_wait = SuspendedReason::Preempted {
            why: "preempted by job 9".into(),
            waits: Some(ResumeWait::UnknownNode("n1".into())),
        };
        assert_eq!(ambiguous.to_string(), with_wait.to_string());
        assert_eq!(SuspendedReason::from_words(&ambiguous.to_string()), with_wait.cause());
    }
}
