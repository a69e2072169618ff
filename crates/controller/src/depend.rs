//! Job dependencies and begin times: which pending jobs may not start yet, and why.
//!
//! A job with a dependency (`--dependency`, Slurm's syntax; `berth_core::directives::depend`)
//! or a begin time in the future is left out of the scheduling pass (`policy::schedule`) with
//! the reason users see: `Dependency: ...`, `DependencyNeverSatisfied: ...` or `BeginTime:
//! ...` (squeue's `(Dependency)`, `(DependencyNeverSatisfied)`, `(BeginTime)`). A dependency
//! that can never be met (afterok on a job that failed or was cancelled) leaves the job
//! waiting, as Slurm does by default, until it is cancelled. Both are part of the job's
//! options, stored with it, so they survive a restart.
//!
//! `aftercorr:A` (arrays): task `i` of the dependent array waits for task `i` of array `A`
//! to end successfully (never, if it failed). As in Slurm, a dependent job that is no array
//! task, or an index `A` has no task of, waits for `A` as a whole, as `afterok:A` does.

use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::depend::MAX_BEGIN_AHEAD_SECS;
use berth_core::directives::{Begin, DepKind, Dependency};
use berth_core::job::JobState;
use berth_core::sched::reason::{BeginWait, PendingReason};
use berth_core::JobId;
use std::collections::{HashMap, HashSet};

/// Whether a dependency lets its job start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    Wait(String),
    Never(String),
}

/// Judge `dep` with `lookup` giving a job a term of that kind names: its state and whether it
/// started (None: no such job); `singleton_free`: no other job of the same name and user runs
/// or is ahead.
pub fn judge(
    dep: &Dependency,
    mut lookup: impl FnMut(DepKind, JobId) -> Option<(JobState, bool)>,
    singleton_free: bool,
) -> Verdict {
    let mut passed = 0;
    let mut never: Option<String> = None;
    let mut waiting: Option<String> = None;
    for term in &dep.terms {
        // A term passes when every job it names does, and can never pass if one cannot.
        let mut term_never = None;
        let mut term_wait = None;
        if term.kind == DepKind::Singleton {
            if !singleton_free {
                term_wait = Some("another job of yours with this name runs or is ahead (singleton)".to_string());
            }
        } else {
            for &id in &term.jobs {
                let shown = format!("{}:{id}", term.kind.as_str());
                match lookup(term.kind, id) {
                    None => {
                        term_never = Some(format!("job {id} does not exist ({shown})"));
                        break;
                    }
                    Some((state, started)) => match term.kind.judge(state, started) {
                        Some(true) => {}
                        Some(false) => {
                            term_never = Some(format!("job {id} ended {} ({shown})", state.as_str()));
                            break;
                        }
                        None => {
                            if term_wait.is_none() {
                                term_wait = Some(format!("waits for job {id}, {} ({shown})", state.as_str()));
                            }
                        }
                    },
                }
            }
        }
        match (term_never, term_wait) {
            (Some(n), _) => {
                never.get_or_insert(n);
            }
            (None, Some(w)) => {
                waiting.get_or_insert(w);
            }
            (None, None) => passed += 1,
        }
    }
    let total = dep.terms.len();
    if dep.any {
        if passed > 0 {
            Verdict::Ready
        } else if let Some(w) = waiting {
            Verdict::Wait(w)
        } else {
            Verdict::Never(never.unwrap_or_default())
        }
    } else if let Some(n) = never {
        Verdict::Never(n)
    } else if passed == total {
        Verdict::Ready
    } else {
        Verdict::Wait(waiting.unwrap_or_default())
    }
}

/// A begin time as a Unix time: relative ones from `now`, clock times and dates in the local
/// time zone (the next such clock time: today, or tomorrow once it has passed). Refused when
/// more than a year ahead.
pub fn resolve_begin(b: Begin, now: f64) -> Result<u64, String> {
    let now_s = now.max(0.0) as i64;
    let at: i64 = match b {
        Begin::At(t) => i64::try_from(t).unwrap_or(i64::MAX),
        // No earlier than `now + s`: the second rounded up, not down (`now` itself stays now).
        Begin::In(0) => now_s,
        Begin::In(s) => (now.max(0.0).ceil() as i64).saturating_add(i64::try_from(s).unwrap_or(i64::MAX)),
        Begin::Clock { hour, minute, second } => {
            let today = local(now_s, None, (hour, minute, second)).ok_or("the local time cannot be computed")?;
            if today > now_s {
                today
            } else {
                local(now_s, Some(1), (hour, minute, second)).ok_or("the local time cannot be computed")?
            }
        }
        Begin::Tomorrow => local(now_s, Some(1), (0, 0, 0)).ok_or("the local time cannot be computed")?,
        Begin::Date { year, month, day, hour, minute, second } => {
            // SAFETY: a zeroed tm is valid; mktime only reads and normalises it.
            let mut tm: libc::tm = unsafe { std::mem::zeroed() };
            tm.tm_year = i32::from(year) - 1900;
            tm.tm_mon = i32::from(month) - 1;
            tm.tm_mday = i32::from(day);
            (tm.tm_hour, tm.tm_min, tm.tm_sec) = (i32::from(hour), i32::from(minute), i32::from(second));
            tm.tm_isdst = -1;
            // SAFETY: tm is a valid, initialised struct.
            let t = unsafe { libc::mktime(&mut tm) };
            if t == -1 || tm.tm_mday != i32::from(day) {
                return Err(format!("--begin {b}: there is no such date"));
            }
            t
        }
    };
    if at > now_s.saturating_add(MAX_BEGIN_AHEAD_SECS as i64) {
        return Err(format!("--begin {b}: more than a year ahead; give an earlier time"));
    }
    // A time already past means: now (as Slurm).
    Ok(at.max(0) as u64)
}

/// Local time `hms` on today's date plus `days`, as a Unix time.
fn local(now: i64, days: Option<i32>, (h, m, s): (u8, u8, u8)) -> Option<i64> {
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it, mktime reads it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let secs = now as libc::time_t;
    // SAFETY: both pointers are to valid, owned values.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return None;
    }
    tm.tm_mday += days.unwrap_or(0);
    (tm.tm_hour, tm.tm_min, tm.tm_sec) = (i32::from(h), i32::from(m), i32::from(s));
    tm.tm_isdst = -1;
    // SAFETY: tm is valid.
    let t = unsafe { libc::mktime(&mut tm) };
    (t != -1).then_some(t)
}

/// Local date and time of a Unix time, to the second.
pub fn local_text(t: f64) -> String {
    // SAFETY: as in `local`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let secs = t as libc::time_t;
    // SAFETY: both pointers are to valid, owned values.
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

impl Controller {
    /// Check a submission's dependency and begin time, resolving the begin time: every job
    /// it names must exist.
    pub(crate) fn check_depend_submission(
        &self,
        options: &mut berth_core::directives::SubmitOptions,
        now: f64,
    ) -> Result<(), berth_protocol::client::ApiError> {
        use berth_protocol::client::{ApiError, ErrorCode};
        if let Some(b) = options.begin {
            let at = resolve_begin(b, now).map_err(|e| ApiError::new(ErrorCode::BadRequest, e))?;
            options.begin = Some(Begin::At(at));
        }
        if let Some(dep) = &options.dependency {
            // What the parser guarantees, checked again for requests not made by `berth`.
            let max = berth_core::directives::depend::MAX_DEPENDENCY_IDS;
            let malformed = dep.terms.is_empty()
                || dep.terms.len() > max
                || dep.job_ids().count() > max
                || dep.terms.iter().any(|t| (t.kind == DepKind::Singleton) != t.jobs.is_empty())
                || dep.job_ids().any(|id| id.0 == 0);
            if malformed {
                return Err(ApiError::new(
                    ErrorCode::BadRequest,
                    format!("--dependency: give 1 to {max} terms naming at most {max} jobs, as afterok:ID[:ID...] or singleton"),
                ));
            }
            for id in dep.job_ids() {
                let known = self.jobs.contains_key(&id)
                    || self
                        .store
                        .job_state(id)
                        .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?
                        .is_some();
                if !known {
                    return Err(ApiError::new(
                        ErrorCode::BadRequest,
                        format!("--dependency {dep}: job {id} does not exist; `berth jobs --all` lists jobs"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `dep` with each `aftercorr:A` naming the task of array `A` of the dependent's own
    /// index (`task`), where there is one (returned too: each is judged alone); else `A`
    /// itself is kept (Slurm's rule: the whole job, as `afterok`).
    fn corresponding_tasks(
        &mut self,
        mut dep: Dependency,
        task: Option<berth_core::directives::ArrayTask>,
    ) -> Result<(Dependency, HashSet<JobId>), StoreError> {
        let mut tasks = HashSet::new();
        let Some(task) = task else { return Ok((dep, tasks)) };
        for term in dep.terms.iter_mut().filter(|t| t.kind == DepKind::Aftercorr) {
            for id in term.jobs.iter_mut() {
                if let Some(corr) = self.corresponding_task(*id, task.index)? {
                    *id = corr;
                    tasks.insert(corr);
                }
            }
        }
        Ok((dep, tasks))
    }

    /// The task of array `array` with index `index`, if it has one. Its tasks have
    /// consecutive ids in ascending index order (`crate::array`): a guess from the array's
    /// step, else a binary search, each look at a task in memory or in the store.
    fn corresponding_task(&mut self, array: JobId, index: u32) -> Result<Option<JobId>, StoreError> {
        if let Some(found) = self.policy.depend().corresponding(array, index) {
            return Ok(found);
        }
        let found = self.find_task(array, index)?;
        self.policy.depend_mut().remember_corresponding(array, index, found);
        Ok(found)
    }

    fn find_task(&self, array: JobId, index: u32) -> Result<Option<JobId>, StoreError> {
        // What a task says of its array, if job `id` is a task of `array`.
        let task_of = |id: JobId| -> Result<Option<berth_core::directives::ArrayTask>, StoreError> {
            let t = match self.jobs.get(&id) {
                Some(j) => j.options.array_task,
                None => self.ended_job(id)?.and_then(|j| j.options.array_task),
            };
            Ok(t.filter(|t| t.job == array.0))
        };
        let Some(first) = task_of(array)? else { return Ok(None) };
        if index < first.min || index > first.max {
            return Ok(None);
        }
        let count = u64::from(first.count);
        let step = first.step.max(1);
        if (index - first.min).is_multiple_of(step) {
            let pos = u64::from((index - first.min) / step);
            if pos < count && task_of(JobId(array.0 + pos))?.is_some_and(|t| t.index == index) {
                return Ok(Some(JobId(array.0 + pos)));
            }
        }
        let (mut lo, mut hi) = (0u64, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let id = JobId(array.0 + mid);
            let Some(t) = task_of(id)? else { return Ok(None) };
            match t.index.cmp(&index) {
                std::cmp::Ordering::Equal => return Ok(Some(id)),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }

    /// A job's state and whether it started, wherever it is (memory, else the store).
    fn dep_lookup(&mut self, id: JobId) -> Result<Option<(JobState, bool)>, StoreError> {
        // An array's id: all its tasks (`crate::array`).
        if let Some(s) = self.array_dep_state(id)? {
            return Ok(Some(s));
        }
        self.job_lookup(id)
    }

    /// Job `id`'s own state and whether it started (of a task: that task alone).
    fn job_lookup(&mut self, id: JobId) -> Result<Option<(JobState, bool)>, StoreError> {
        if let Some(j) = self.jobs.get(&id) {
            return Ok(Some((j.state, j.start_time.is_some())));
        }
        if let Some(s) = self.policy.depend().ended(id) {
            return Ok(Some(s));
        }
        // Not in memory: it ended (or never was); its outcome is history.
        let found = self.ended_state(id)?;
        if let Some(s) = found.filter(|(st, _)| st.is_finished()) {
            self.policy.depend_mut().remember_ended(id, s);
        }
        Ok(found)
    }

    /// Pending jobs that may not start yet (begin time to come, dependency not met), each with
    /// its reason; remembered for `berth jobs` (`DependState::reason`). Held jobs are left to
    /// the pass (their reason is the hold).
    pub fn ineligible(&mut self, now: f64) -> Result<HashSet<JobId>, StoreError> {
        let mut out = self.ineligible_by_depend(now)?;
        // Requeued jobs whose previous run has not ended everywhere yet (`crate::update`).
        for (id, why) in self.old_runs_waited_for(now)? {
            out.insert(id);
            self.policy.depend_mut().hold_out(id, why);
        }
        // Tasks beyond their array's running limit (`crate::array`).
        for (id, why) in self.throttled(&out) {
            out.insert(id);
            self.policy.depend_mut().hold_out(id, why);
        }
        Ok(out)
    }

    fn ineligible_by_depend(&mut self, now: f64) -> Result<HashSet<JobId>, StoreError> {
        let mut reasons = HashMap::new();
        let mut next_begin: Option<f64> = None;
        let candidates: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued && (j.options.dependency.is_some() || j.options.begin.is_some()))
            .map(|j| j.id)
            .collect();
        if candidates.is_empty() {
            self.policy.depend_mut().waiting(HashMap::new(), None);
            return Ok(HashSet::new());
        }
        // Singleton: per (user, name), whether a job runs, and the first pending singleton.
        let mut running: HashSet<(u32, &str)> = HashSet::new();
        let mut first_singleton: HashMap<(u32, &str), JobId> = HashMap::new();
        for j in self.jobs.values() {
            if j.state.has_allocation() {
                running.insert((j.user.uid, j.name.as_str()));
            } else if j.state.is_pending() && j.options.dependency.as_ref().is_some_and(Dependency::has_singleton) {
                first_singleton.entry((j.user.uid, j.name.as_str())).or_insert(j.id);
            }
        }
        let free: HashSet<JobId> = candidates
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| {
                let key = (j.user.uid, j.name.as_str());
                !running.contains(&key) && first_singleton.get(&key) == Some(&j.id)
            })
            .map(|j| j.id)
            .collect();
        for id in candidates {
            let Some(job) = self.jobs.get(&id) else { continue };
            if let Some(Begin::At(at)) = job.options.begin {
                let at = at as f64;
                if at > now {
                    next_begin = Some(next_begin.map_or(at, |n: f64| n.min(at)));
                    reasons.insert(id, PendingReason::BeginTime(BeginWait::At(local_text(at))));
                    continue;
                }
            }
            let Some(dep) = job.options.dependency.clone() else { continue };
            let task = job.options.array_task;
            let (dep, tasks) = self.corresponding_tasks(dep, task)?;
            // An `aftercorr` term's task is that task alone, even when its id is its array's.
            let task_only = |kind: DepKind, jid: JobId| kind == DepKind::Aftercorr && tasks.contains(&jid);
            let mut lookups = Vec::new();
            for term in &dep.terms {
                for &jid in &term.jobs {
                    let alone = task_only(term.kind, jid);
                    if !lookups.iter().any(|(k, a, _)| *k == jid && *a == alone) {
                        let found = if alone { self.job_lookup(jid)? } else { self.dep_lookup(jid)? };
                        lookups.push((jid, alone, found));
                    }
                }
            }
            let verdict = judge(
                &dep,
                |kind, jid| {
                    let alone = task_only(kind, jid);
                    lookups.iter().find(|(k, a, _)| *k == jid && *a == alone).and_then(|(_, _, s)| *s)
                },
                free.contains(&id),
            );
            match verdict {
                Verdict::Ready => {}
                Verdict::Wait(why) => {
                    reasons.insert(id, PendingReason::Dependency(why));
                }
                Verdict::Never(why) => {
                    reasons.insert(id, PendingReason::DependencyNeverSatisfied { why, job: id });
                }
            }
        }
        if self.cfg.scheduler.kill_invalid_depend {
            let never: Vec<(JobId, String)> =
                reasons.iter().filter_map(|(id, why)| Some((*id, why.never_satisfied()?))).collect();
            for (id, why) in never {
                reasons.remove(&id);
                self.cancel_never_satisfied(id, &why, now)?;
            }
        }
        let out = reasons.keys().copied().collect();
        self.policy.depend_mut().waiting(reasons, next_begin);
        Ok(out)
    }

    /// `[scheduler] kill_invalid_depend`: a job whose dependency can never be met is cancelled,
    /// with that reason.
    fn cancel_never_satisfied(&mut self, id: JobId, why: &str, now: f64) -> Result<(), StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let effects = crate::handlers::cancelled_pending(job, why, why, now);
        // Carried out before the job leaves memory (`retire`): a dependency on it is then read
        // from its history (`ended_state`), which must hold its end.
        self.queue(effects);
        self.carry_out_effects(now)?;
        self.retire(id);
        Ok(())
    }

    /// At a tick: a pass is due once the earliest begin time has come.
    pub fn check_begin(&mut self, now: f64) {
        if self.policy.depend_mut().begin_due(now) {
            self.dirty = true;
        }
    }
}

#[cfg(test)]
mod tests;
