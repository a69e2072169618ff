//! Queues: limits and defaults a job is checked against at submission, a per-user running
//! limit checked at each pass, and the queue's share of a job's priority.
//!
//! Subnodes: `allowed_subnodes = false` keeps a queue's jobs off subnode targeting — they may
//! not ask for subnode properties (`--property`); `allowed_properties` narrows which
//! properties they may ask for. `target_properties` pins the queue itself to subnodes (seeds/
//! 000 targets queues at subnodes): its jobs run only on subnodes with all those properties,
//! as if each had asked for them; with `reserved`, jobs of other queues keep off those
//! subnodes (see [`target`]).

use super::reason::{PendingReason, QueueLimit};
use crate::placement::JobRequest;
use crate::units::format_duration;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One queue (`[[queues]]` in the controller's config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSpec {
    pub name: String,
    pub max_walltime_secs: Option<u64>,
    /// Given to jobs that ask for none (else `max_walltime_secs`).
    pub default_walltime_secs: Option<u64>,
    pub max_cores_per_job: Option<u32>,
    /// Cores one user's running jobs of this queue may hold together.
    pub max_cores_per_user: Option<u32>,
    /// Subnode properties jobs may ask for (None: any).
    pub allowed_properties: Option<Vec<String>>,
    /// Whether jobs may target subnodes by property at all (None: yes).
    pub allowed_subnodes: Option<bool>,
    /// The queue's jobs run only on subnodes with all of these properties (empty: anywhere).
    pub target_properties: Vec<String>,
    /// Jobs of other queues keep off subnodes with any of `target_properties`.
    pub reserved: bool,
    /// Higher runs first (see [`queue_factor`]).
    pub priority: i32,
    /// Jobs of a higher class may suspend jobs of a lower one (see [`super::preempt`]).
    pub preempt_class: u32,
    /// A disabled queue takes no new jobs; its queued jobs still run.
    pub enabled: bool,
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            name: "batch".into(),
            max_walltime_secs: None,
            default_walltime_secs: None,
            max_cores_per_job: None,
            max_cores_per_user: None,
            allowed_properties: None,
            allowed_subnodes: None,
            target_properties: vec![],
            reserved: false,
            priority: 0,
            preempt_class: 0,
            enabled: true,
        }
    }
}

/// Why a queue refuses a job, saying what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueError {
    #[error("no queue {name:?}; queues are: {known}")]
    Unknown { name: String, known: String },
    #[error("queue {queue} is closed to new jobs{hint}")]
    Disabled { queue: String, hint: String },
    #[error("queue {queue} allows at most {max} of walltime, the job asks for {asked}; ask for less{hint}")]
    Walltime { queue: String, max: String, asked: String, hint: String },
    #[error("queue {queue} allows at most {max} cores per job, the job asks for {asked}; ask for fewer{hint}")]
    CoresPerJob { queue: String, max: u32, asked: u64, hint: String },
    #[error(
        "queue {queue} lets one user run at most {max} cores, the job alone asks for {asked}; ask for fewer{hint}"
    )]
    CoresPerUser { queue: String, max: u32, asked: u64, hint: String },
    #[error("queue {queue} does not allow subnode properties ({asked}); drop --property{hint}")]
    Subnodes { queue: String, asked: String, hint: String },
    #[error("queue {queue} allows the properties {allowed}, not {asked}{hint}")]
    Property { queue: String, allowed: String, asked: String, hint: String },
    #[error(
        "subnodes with property {property} are kept for queue {owner}; submit to queue {owner} or drop --property"
    )]
    Reserved { property: String, owner: String },
}

impl QueueSpec {
    /// The walltime a job gets: its own, else the queue's default, else the queue's maximum.
    pub fn walltime_or_default(&self, walltime: Option<u64>) -> Option<u64> {
        walltime.or(self.default_walltime_secs).or(self.max_walltime_secs)
    }

    /// Whether the queue takes a job of `walltime` (after defaults) asking for `req`.
    pub fn check(&self, walltime: Option<u64>, req: &JobRequest) -> Result<(), QueueError> {
        self.check_with_hint(walltime, req, String::new())
    }

    fn check_with_hint(&self, walltime: Option<u64>, req: &JobRequest, hint: String) -> Result<(), QueueError> {
        let queue = self.name.clone();
        if !self.enabled {
            return Err(QueueError::Disabled { queue, hint });
        }
        if let Some(max) = self.max_walltime_secs {
            if walltime.is_none_or(|w| w > max) {
                let asked = walltime.map_or("no limit".into(), format_duration);
                return Err(QueueError::Walltime { queue, max: format_duration(max), asked, hint });
            }
        }
        let asked = req.total_cpus();
        if let Some(max) = self.max_cores_per_job.filter(|&m| asked > m as u64) {
            return Err(QueueError::CoresPerJob { queue, max, asked, hint });
        }
        if let Some(max) = self.max_cores_per_user.filter(|&m| asked > m as u64) {
            return Err(QueueError::CoresPerUser { queue, max, asked, hint });
        }
        if !req.properties.is_empty() {
            let asked = req.properties.join(",");
            if self.allowed_subnodes == Some(false) {
                return Err(QueueError::Subnodes { queue, asked, hint });
            }
            if let Some(allowed) = &self.allowed_properties {
                if !req.properties.iter().all(|p| allowed.contains(p)) {
                    let allowed = if allowed.is_empty() { "none".into() } else { allowed.join(",") };
                    return Err(QueueError::Property { queue, allowed, asked, hint });
                }
            }
        }
        Ok(())
    }
}

/// Find queue `name` in `specs` and check the job against it. When it refuses, the message
/// names another enabled queue that would take the job, if there is one.
pub fn check_in<'a>(
    specs: &'a [QueueSpec],
    name: &str,
    walltime: Option<u64>,
    req: &JobRequest,
) -> Result<&'a QueueSpec, QueueError> {
    let Some(spec) = specs.iter().find(|s| s.name == name) else {
        let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        return Err(QueueError::Unknown { name: name.into(), known: known.join(", ") });
    };
    // Asking for another queue's reserved subnodes: they would never take the job.
    for p in &req.properties {
        if let Some(owner) = reserved_by_other(specs, name, p) {
            return Err(QueueError::Reserved { property: p.clone(), owner: owner.name.clone() });
        }
    }
    if spec.check(walltime, req).is_ok() {
        return Ok(spec);
    }
    // What another queue would give this job if it asked it instead (its own default walltime).
    let alternative = specs
        .iter()
        .find(|other| other.name != spec.name && other.check(other.walltime_or_default(walltime), req).is_ok());
    let hint = alternative.map(|a| format!(" or use queue {}", a.name)).unwrap_or_default();
    spec.check_with_hint(walltime, req, hint).map(|()| spec)
}

/// A queue other than `queue` that reserves subnodes with property `p` (and `queue` does not
/// target them too).
fn reserved_by_other<'a>(specs: &'a [QueueSpec], queue: &str, p: &str) -> Option<&'a QueueSpec> {
    let own = specs.iter().find(|s| s.name == queue);
    if own.is_some_and(|q| q.target_properties.iter().any(|t| t == p)) {
        return None;
    }
    specs.iter().find(|s| s.name != queue && s.reserved && s.target_properties.iter().any(|t| t == p))
}

/// Where queue `queue`'s job `req` may run, as placement reads it: its queue's target
/// properties are added to those it asked for, and the properties other queues reserve to
/// those it keeps off. Applied whenever a job is placed (not stored with it), so a change of
/// the queues' config holds for jobs already queued.
pub fn target(specs: &[QueueSpec], queue: &str, req: &mut JobRequest) {
    if let Some(own) = specs.iter().find(|s| s.name == queue) {
        for p in &own.target_properties {
            if !req.properties.contains(p) {
                req.properties.push(p.clone());
            }
        }
    }
    for other in specs.iter().filter(|s| s.reserved && s.name != queue) {
        for p in &other.target_properties {
            if !req.properties.contains(p) && !req.avoid_properties.contains(p) {
                req.avoid_properties.push(p.clone());
            }
        }
    }
}

/// Whether a job of `job_cores` must wait because its user already runs `user_running_cores`
/// in this queue: `Some(QueueLimit(...))` when starting it would exceed the queue's limit.
pub fn user_limit_reason(spec: &QueueSpec, user_running_cores: u64, job_cores: u64) -> Option<PendingReason> {
    let max = spec.max_cores_per_user? as u64;
    (user_running_cores + job_cores > max).then(|| {
        PendingReason::QueueLimit(QueueLimit::UserCores {
            queue: spec.name.clone(),
            max,
            used: user_running_cores,
            need: job_cores,
        })
    })
}

/// The queue's priority normalized over all queues to [0, 1]: 0 for the lowest, 1 for the
/// highest (0 for every queue when they all have the same).
pub fn queue_factor(spec: &QueueSpec, all_specs: &[QueueSpec]) -> f64 {
    let priorities = all_specs.iter().map(|s| s.priority).chain([spec.priority]);
    let (lo, hi) = priorities.fold((i32::MAX, i32::MIN), |(lo, hi), p| (lo.min(p), hi.max(p)));
    if hi <= lo {
        return 0.0;
    }
    ((spec.priority as f64 - lo as f64) / (hi as f64 - lo as f64)).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests;
