//! Job arrays (`--array 0-15%4`, `#SBATCH -a`, `#PBS -J`): one submission, one task per
//! index, each task an ordinary job of its own id that knows its array (`ArrayTask` in its
//! options). Their ids are consecutive and the array's id is its first task's (as Slurm's
//! `ArrayJobId`): `A_i` is shown for each task. All tasks are written in the transaction of
//! the submission, so the array id is returned only once every task is on disk.
//!
//! - the running limit `%N`: at most N tasks of the array hold an allocation at once; the
//!   others wait outside the scheduling pass (`throttled`, reason `JobArrayTaskLimit`);
//! - `berth cancel A` (`scancel A`, `qdel A[]`) cancels every task; `hold`/`release` of A act
//!   on every pending task; a task's own id acts on that task alone;
//! - a dependency on A (`afterok:A`) is one on every task (`dep_state`).

use crate::model::array::{make_task, set_id_and_paths};
use crate::model::effect::Effect;
use crate::model::job::JobRecord;
use crate::model::request::Peer;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::array::tasks;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::sched::PendingReason;
use berth_core::JobId;
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode, IdResult, MAX_IDS_PER_REQUEST};
use std::collections::{HashMap, HashSet};

/// At submission: a task's identity is the controller's to give (never the client's), and
/// the array must be well formed and within `max_size` (`[scheduler] max_array_size`).
pub fn check_submission(options: &mut SubmitOptions, max_size: u32) -> Result<(), String> {
    options.array_task = None;
    if let Some(spec) = &options.array {
        spec.indexes(max_size).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What an action on a whole array does to each of its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whole {
    /// Every task not ended (cancel).
    Active,
    /// Every pending task (hold, release).
    Pending,
}

type JobOp = fn(&mut Controller, JobId, f64) -> Result<Result<(), ApiError>, StoreError>;

impl Controller {
    /// Write the tasks of an array job (its options validated by `validate_submission`): its
    /// id is the first task's.
    pub(crate) fn accept_array(&mut self, job: JobRecord) -> Result<JobId, ApiError> {
        let Some(spec) = job.options.array.clone() else { return Ok(self.accept(job)) };
        let indexes = match spec.indexes(self.cfg.scheduler.max_array_size) {
            Ok(i) => i,
            Err(e) => return Err(ApiError::new(ErrorCode::BadRequest, e.to_string())),
        };
        if indexes.is_empty() {
            return Err(ApiError::new(ErrorCode::BadRequest, "--array names no index".to_string()));
        }
        // Consecutive ids, the first the array's; every task is written in this transaction
        // (`array_submitted`).
        let first = self.take_job_ids(indexes.len() as u64);
        // Each task goes straight into the job table: a 100,000-task array's records (about
        // 2 KB each) are not gathered in a vector first.
        let jobs = &mut self.jobs;
        let effects = array_submitted(job, first, &indexes, spec.limit, |t| {
            jobs.insert(t.id, t);
        });
        self.queue(effects);
        self.dirty = true;
        Ok(first)
    }

    /// The tasks of array `id` still in memory (pending or running), in index order; empty
    /// when `id` is not an array's id.
    pub fn array_tasks(&self, id: JobId) -> Vec<JobId> {
        let count = match self.jobs.get(&id).and_then(|j| j.options.array_task) {
            Some(t) if t.job == id.0 => u64::from(t.count),
            Some(_) => return vec![],
            // The first task has ended: its siblings, consecutive ids, still say so.
            None => match self.jobs.range(id..).next() {
                Some((_, j)) if j.options.array_task.is_some_and(|t| t.job == id.0) => {
                    j.options.array_task.map_or(0, |t| u64::from(t.count))
                }
                _ => return vec![],
            },
        };
        let end = JobId(id.0.saturating_add(count));
        self.jobs
            .range(id..end)
            .filter(|(_, j)| j.options.array_task.is_some_and(|t| t.job == id.0))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Cancel, hold or release `ids`, where the id of an array stands for all its tasks (a
    /// task's own id for itself, and so does an array's id in `only`: its first task named
    /// `A_i`): one result per id given.
    pub(crate) fn for_each_id_or_array(
        &mut self,
        (ids, only): (Vec<JobId>, &[JobId]),
        peer: &Peer,
        now: f64,
        action: &str,
        whole: Whole,
        op: JobOp,
    ) -> Result<ClientResponse, StoreError> {
        let members_of = |c: &Self, id: JobId| if only.contains(&id) { vec![] } else { c.array_tasks(id) };
        if ids.len() > MAX_IDS_PER_REQUEST || ids.iter().all(|id| members_of(self, *id).is_empty()) {
            return self.for_each_id(ids, peer, now, action, op);
        }
        let mut results = Vec::with_capacity(ids.len());
        for id in ids {
            let members = members_of(self, id);
            if members.is_empty() {
                if let ClientResponse::Done { results: r } = self.for_each_id(vec![id], peer, now, action, op)? {
                    results.extend(r);
                }
                continue;
            }
            let owner = self.jobs.get(&members[0]).map(|j| (j.user.uid, j.user.name.clone()));
            if let Some((_, name)) = owner.filter(|(uid, _)| *uid != peer.user.uid && !self.is_admin(peer)) {
                self.denied(peer, action, Some(id), &name, now)?;
                let e = ApiError::new(
                    ErrorCode::NotPermitted,
                    format!("array {id} belongs to {name}; you may only act on your own jobs"),
                );
                results.push(IdResult { id, ok: false, error: Some(e) });
                continue;
            }
            let mut failure = None;
            let mut acted = 0;
            for task in members {
                let pending = self.jobs.get(&task).is_some_and(|j| j.state.is_pending());
                if whole == Whole::Pending && !pending {
                    continue;
                }
                acted += 1;
                if let Err(e) = op(self, task, now)? {
                    failure.get_or_insert(e);
                }
            }
            if acted == 0 && failure.is_none() {
                failure =
                    Some(ApiError::new(ErrorCode::InvalidState, format!("array {id} has no pending task to {action}")));
            }
            results.push(match failure {
                None => IdResult { id, ok: true, error: None },
                Some(e) => IdResult { id, ok: false, error: Some(e) },
            });
        }
        Ok(ClientResponse::Done { results })
    }

    /// Queued tasks held back by their array's running limit, with the reason shown: of each
    /// array with a limit, only as many of its queued tasks (in index order) as the limit
    /// leaves room for, beside its running ones, go to the pass. `not_yet`: tasks already held
    /// out for another reason (they take no room).
    pub fn throttled(&self, not_yet: &HashSet<JobId>) -> HashMap<JobId, PendingReason> {
        let mut running: HashMap<u64, u32> = HashMap::new();
        let mut queued: HashMap<u64, Vec<JobId>> = HashMap::new();
        for j in self.jobs.values() {
            let Some(t) = j.options.array_task.filter(|t| t.limit.is_some()) else { continue };
            if j.state.has_allocation() {
                *running.entry(t.job).or_default() += 1;
            } else if j.state == JobState::Queued && !not_yet.contains(&j.id) {
                queued.entry(t.job).or_default().push(j.id);
            }
        }
        let mut out = HashMap::new();
        for (array, ids) in queued {
            let limit =
                self.jobs.get(&ids[0]).and_then(|j| j.options.array_task).and_then(|t| t.limit).unwrap_or(u32::MAX);
            let room = limit.saturating_sub(running.get(&array).copied().unwrap_or(0)) as usize;
            for id in ids.into_iter().skip(room) {
                out.insert(id, PendingReason::JobArrayTaskLimit { array, limit });
            }
        }
        out
    }

    /// A dependency's view of array `id` (when `id` is one): its tasks as one job. While a
    /// task is pending or running, that task's state (pending first: not every task started);
    /// once all ended, completed if all completed, else the first other end.
    pub fn array_dep_state(&mut self, id: JobId) -> Result<Option<(JobState, bool)>, StoreError> {
        let known = match self.jobs.get(&id) {
            Some(j) => Some(j.options.array_task),
            // The first task has ended: a sibling still running says so (consecutive ids).
            None => {
                self.jobs.range(id..).next().and_then(|(_, j)| j.options.array_task).filter(|t| t.job == id.0).map(Some)
            }
        };
        let task = match known {
            Some(t) => t,
            None => self.ended_job(id)?.and_then(|j| j.options.array_task),
        };
        let Some(task) = task.filter(|t| t.job == id.0) else { return Ok(None) };
        let end = JobId(id.0.saturating_add(u64::from(task.count)));
        // The tasks in memory decide alone while there are any (pending first: not every task
        // started); only once all ended are their states read from the store, so that a job
        // waiting on a large array costs each pass no more than the array's live tasks.
        let (mut pending, mut running) = (None, None);
        for (_, j) in self.jobs.range(id..end).filter(|(_, j)| j.options.array_task.is_some_and(|t| t.job == id.0)) {
            if j.state.is_pending() {
                // The first pending task decides: the tasks after it need not be seen (a pass
                // asks this of every job waiting on the array).
                pending = Some(j.state);
                break;
            } else {
                running.get_or_insert(j.state);
            }
        }
        if let Some(s) = pending {
            return Ok(Some((s, false)));
        }
        if let Some(s) = running {
            return Ok(Some((s, true)));
        }
        let (mut ended, mut any_started) = (None, false);
        for tid in (id.0..end.0).map(JobId) {
            if let Some((s, started)) = self.ended_state(tid)? {
                any_started |= started;
                if s != JobState::Completed {
                    ended.get_or_insert(s);
                }
            }
        }
        Ok(Some(match ended {
            Some(s) => (s, any_started),
            None => (JobState::Completed, true),
        }))
    }
}

/// The array variables of a task's environment (`SLURM_ARRAY_*`, `PBS_ARRAY_*` when the
/// Slurm and PBS variables are on, `BERTH_ARRAY_*` always); those of the submitter's own
/// environment (a job submitted from a task) are never passed on.
pub fn environment(job: &JobRecord, compat: bool, env: &mut Vec<(String, String)>) {
    env.retain(|(k, _)| {
        !(k.starts_with("SLURM_ARRAY_") || k.starts_with("PBS_ARRAY_") || k.starts_with("BERTH_ARRAY_"))
    });
    let Some(t) = job.options.array_task else { return };
    let mut add = |k: &str, v: String| env.push((k.to_string(), v));
    add("BERTH_ARRAY_JOB_ID", t.job.to_string());
    add("BERTH_ARRAY_TASK_ID", t.index.to_string());
    if compat {
        add("SLURM_ARRAY_JOB_ID", t.job.to_string());
        add("SLURM_ARRAY_TASK_ID", t.index.to_string());
        add("SLURM_ARRAY_TASK_COUNT", t.count.to_string());
        add("SLURM_ARRAY_TASK_MIN", t.min.to_string());
        add("SLURM_ARRAY_TASK_MAX", t.max.to_string());
        add("SLURM_ARRAY_TASK_STEP", t.step.to_string());
        add("PBS_ARRAY_INDEX", t.index.to_string());
        add("PBS_ARRAY_ID", format!("{}[]", t.job));
    }
}

/// A valid job accepted as `id` (given its id and output paths: `set_id_and_paths`), then its
/// row. Needs no store.
pub(crate) fn accepted(job: &mut JobRecord, id: JobId) -> Effect {
    set_id_and_paths(job, id);
    Effect::InsertJob(Box::new(job.clone()))
}

/// The tasks of array job `template` (its `--array` as `indexes`, not empty, and `limit`)
/// under consecutive ids from `first`, the array's, each made by `make_task` and given to
/// `keep` in order; then one effect for all their rows (the template and the tasks, written by
/// `Store::insert_array`: the first with the script and environment, the others sharing them,
/// one copy in memory and on disk) and one event `submit` for all. Needs no store.
pub(crate) fn array_submitted(
    mut template: JobRecord,
    first: JobId,
    indexes: &[u32],
    limit: Option<u32>,
    mut keep: impl FnMut(JobRecord),
) -> Vec<Effect> {
    template.options.array = None;
    let tasks = tasks(first.0, indexes, limit);
    for (k, &task) in tasks.iter().enumerate() {
        let mut t = template.clone();
        make_task(&template, &mut t, first, k, task);
        keep(t);
    }
    let (min, max) = (indexes.first().copied().unwrap_or(0), indexes.last().copied().unwrap_or(0));
    let detail = format!(
        "{}: array {first}, {} tasks, indexes {}",
        template.user.name,
        indexes.len(),
        if indexes.len() as u64 == u64::from(max.saturating_sub(min)) + 1 {
            format!("{min}-{max}")
        } else {
            berth_core::directives::array::fold(indexes)
        }
    );
    vec![
        Effect::InsertArray { template: Box::new(template), first, tasks },
        Effect::job_event("submit", first, None, detail),
    ]
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
