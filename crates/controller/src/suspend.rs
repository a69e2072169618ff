//! Suspension of running jobs: the mechanism the scheduling pass (preemption) and admins
//! (`berth suspend` / `berth resume`) use.
//!
//! A suspended job is frozen on every node of its allocation. It gives its PUs back to the
//! machine but keeps its memory claimed per NUMA node (its pages stay where they are). It
//! resumes on its own PUs when they are free, else on as many free cores of the same nodes
//! (same NUMA nodes first; its memory and memory nodes follow the new CPUs as far as they have
//! room, the agent migrating the pages), else it waits, with the reason shown. Its
//! walltime does not count the time suspended (the agents' clocks stop; `expected_end` adds
//! it). Jobs suspended by the pass resume as soon as they can (first thing in each pass's
//! round, `berth_core::sched::round`, by the rule `try_resume` uses); jobs an admin suspended
//! only with `berth resume`.
//!
//! State changes are written in the caller's transaction and the messages to the agents are
//! sent after it commits, like every other handler.

use crate::model::job::JobRecord;
use crate::model::request::Peer;
use crate::model::suspension::Resuming;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::{JobState, NodeAllocation};
use berth_core::sched::preempt::{resume_parts, resumed_on, PartsJob};
use berth_core::{JobId, NodeId};
use berth_protocol::agent::{CgroupReport, ControllerMessage};
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode, IdResult};

/// Why a job is suspended, for its reason and the event log.
#[derive(Debug, Clone, PartialEq)]
pub enum SuspendBy {
    /// `berth suspend` by this admin: resumes only with `berth resume`.
    Admin(String),
    /// The scheduling pass (e.g. "preempted by job 12"): resumes as soon as it can.
    Policy(String),
}

/// What `try_resume` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Resumed {
    /// Resume sent; on the job's own PUs everywhere.
    InPlace,
    /// Resume sent; on other PUs on these nodes (names).
    Moved(Vec<String>),
    /// It stays suspended: why (also the job's reason).
    Waiting(String),
}

fn api(code: ErrorCode, message: String) -> ApiError {
    ApiError::new(code, message)
}

impl Controller {
    /// Suspend running job `id`: written as suspended (with an event) in the current
    /// transaction, its PUs given back (its memory stays claimed), and `suspend` sent to every
    /// node of its allocation once the transaction commits. Refused (the inner error) for a
    /// job that is not running, is ending, is an interactive allocation, or has a node not
    /// connected (it could not be frozen there).
    pub fn suspend_job(&mut self, id: JobId, now: f64, by: SuspendBy) -> Result<Result<(), ApiError>, StoreError> {
        let Some(job) = self.jobs.get(&id) else {
            return Ok(Err(api(ErrorCode::UnknownJob, format!("job {id} is not running"))));
        };
        if job.state == JobState::Suspended {
            // An admin's suspension of a job the pass suspended makes it the admin's.
            if let (SuspendBy::Admin(_), Some(job)) = (&by, self.jobs.get_mut(&id)) {
                if !job.suspension.by_admin {
                    job.suspension.by_admin = true;
                    job.reason = Some(reason_of(&by));
                    self.store.update_job(job)?;
                    self.store.save_suspension(id, &job.suspension)?;
                }
            }
            return Ok(Ok(()));
        }
        if job.state != JobState::Running {
            let message = format!("job {id} is {}; only running jobs can be suspended", job.state.as_str());
            return Ok(Err(api(ErrorCode::InvalidState, message)));
        }
        if let Some(r) = &job.kill_sent {
            return Ok(Err(api(ErrorCode::InvalidState, format!("job {id} is ending ({r}); it is not suspended"))));
        }
        if job.is_interactive() || job.script.is_empty() {
            let message = format!(
                "job {id} has no batch script (an interactive allocation or a reservation); those are not suspended"
            );
            return Ok(Err(api(ErrorCode::InvalidState, message)));
        }
        if let Some(a) = job.allocation.iter().find(|a| !self.connected(a.node_id.0 as usize)) {
            let message = format!("node {} of job {id} is not connected; it cannot be frozen there now", a.node);
            return Ok(Err(api(ErrorCode::Unavailable, message)));
        }
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(Ok(())) };
        job.state = JobState::Suspended;
        // A resume still unanswered is overtaken: each agent carries out a job's requests in
        // order, and a late failure of the resume finds nothing to undo.
        job.suspension.resuming = None;
        job.suspension.since = Some(now);
        job.suspension.by_admin = matches!(by, SuspendBy::Admin(_));
        job.suspension.count += 1;
        job.reason = Some(reason_of(&by));
        self.store.update_job(job)?;
        self.store.save_suspension(id, &job.suspension)?;
        let detail = match &by {
            SuspendBy::Admin(who) => format!("by admin {who}"),
            SuspendBy::Policy(why) => why.clone(),
        };
        self.store.event(now, "suspend", Some(id), None, &detail)?;
        let alloc = job.allocation.clone();
        for na in &alloc {
            if let Some(n) = self.cluster.node_mut(na.node_id) {
                n.release_pus(na);
            }
            self.send_to_node(na.node_id.0 as usize, ControllerMessage::Suspend { id });
        }
        self.dirty = true;
        Ok(Ok(()))
    }

    /// Resume suspended job `id` if it can run now: part by part by berth-core's rule
    /// (`sched::preempt::resume_parts`, as the scheduling round does): on its own PUs where
    /// they are free, else on as many free cores of the same node (same NUMA nodes first;
    /// memory follows the CPUs, in the per-NUMA books too; the allocation is rewritten).
    /// Written as running in the current transaction and `resume` sent to its nodes after the
    /// commit; otherwise it stays suspended with the reason returned (e.g. "waiting for 4 cores
    /// on n2 to resume (1 free)"). Refused (the inner error) for a job that is not suspended or
    /// is ending. Admin suspensions are resumed too (the pass's round leaves them out).
    pub fn try_resume(&mut self, id: JobId, now: f64) -> Result<Result<Resumed, ApiError>, StoreError> {
        let Some(job) = self.jobs.get(&id) else {
            return Ok(Err(api(ErrorCode::UnknownJob, format!("job {id} is not suspended"))));
        };
        if job.state != JobState::Suspended {
            let message = format!("job {id} is {}; only suspended jobs can be resumed", job.state.as_str());
            return Ok(Err(api(ErrorCode::InvalidState, message)));
        }
        if let Some(r) = &job.kill_sent {
            return Ok(Err(api(ErrorCode::InvalidState, format!("job {id} is ending ({r}); it is not resumed"))));
        }
        match self.resume_plan(job, now) {
            Ok(plan) => Ok(Ok(self.resume_with(id, plan, now)?)),
            Err(why) => {
                self.resume_waits(id, &why)?;
                Ok(Ok(Resumed::Waiting(why)))
            }
        }
    }

    /// A suspended job that cannot resume now: its reason says why, after what suspended it
    /// ("suspended: preempted by job 12; waiting for ...").
    pub(crate) fn resume_waits(&mut self, id: JobId, why: &str) -> Result<(), StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let cause = job
            .reason
            .as_deref()
            .and_then(|r| r.split("; ").next())
            .filter(|r| r.starts_with("suspended: ") && !r.contains("waiting for"));
        let reason = match cause {
            Some(cause) => format!("{cause}; {why}"),
            None => format!("suspended: {why}"),
        };
        if job.reason.as_deref() != Some(&reason) {
            job.reason = Some(reason);
            self.store.update_job(job)?;
        }
        Ok(())
    }

    /// Resume job `id` by `plan` (per part of its allocation: where it moves, None: in place):
    /// its memory books follow moved parts, its PUs are claimed, it is written as running and
    /// `resume` goes to each of its nodes after the commit (with the new part where it moved).
    pub(crate) fn resume_with(
        &mut self,
        id: JobId,
        plan: Vec<Option<NodeAllocation>>,
        now: f64,
    ) -> Result<Resumed, StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(Resumed::InPlace) };
        let mut moved = Vec::new();
        let mut details = Vec::new();
        let mut msgs = Vec::new();
        let old = job.allocation.clone();
        // Its memory moves with it (the agent migrates the pages): so do the books.
        job.allocation = resumed_on(&mut self.cluster, &old, &plan);
        for (k, to) in plan.into_iter().enumerate() {
            let node = job.allocation[k].node_id.0 as usize;
            let allocation = match to {
                Some(to) => {
                    let from = &old[k];
                    details.push(format!(
                        "{}: cpus {} -> {}, memory nodes {} -> {}",
                        to.node, from.cpus, to.cpus, from.mems, to.mems
                    ));
                    moved.push(to.node.clone());
                    Some(to)
                }
                // A part a failed move may have left elsewhere is sent as it is recorded.
                None if job.suspension.unsynced.contains(&node) => Some(job.allocation[k].clone()),
                None => None,
            };
            msgs.push((node, allocation.is_some(), ControllerMessage::Resume { id, allocation }));
        }
        let since = job.suspension.since.unwrap_or(now);
        let by_admin = job.suspension.by_admin;
        job.suspension.close(now);
        job.suspension.by_admin = false;
        job.suspension.unsynced.clear();
        job.suspension.resuming = Some(Resuming {
            since,
            at: now,
            by_admin,
            moved: msgs.iter().filter(|m| m.1).map(|m| m.0).collect(),
            waiting: msgs.iter().map(|m| m.0).collect(),
        });
        job.state = JobState::Running;
        job.reason = None;
        self.store.update_job(job)?;
        self.store.save_suspension(id, &job.suspension)?;
        let detail = if details.is_empty() { "in place".to_string() } else { format!("moved {}", details.join("; ")) };
        self.store.event(now, "resume", Some(id), None, &detail)?;
        for (node, _, msg) in msgs {
            self.send_to_node(node, msg);
        }
        Ok(if moved.is_empty() { Resumed::InPlace } else { Resumed::Moved(moved) })
    }

    /// Where each part of suspended `job` would resume now (None: in place), or why it cannot.
    /// A job outside the live advance reservations keeps off their windows for the rest of its
    /// walltime, as a new start would.
    fn resume_plan(&self, job: &JobRecord, now: f64) -> Result<Vec<Option<NodeAllocation>>, String> {
        let connected = |n: NodeId| self.connected(n.0 as usize);
        match self.resume_keeps_off(job, now) {
            Some(left) => {
                resume_parts(&self.advance_view(now, left).0, &job.allocation, self.parts_job(job), &connected)
            }
            None => resume_parts(&self.cluster, &job.allocation, self.parts_job(job), &connected),
        }
    }

    /// For a job outside the live advance reservations (while there are any): the seconds it
    /// has left to run, during which it keeps off their windows once resumed.
    pub(crate) fn resume_keeps_off(&self, job: &JobRecord, now: f64) -> Option<f64> {
        if self.policy.advance.live.is_empty() || self.in_advance(job) {
            return None;
        }
        Some(self.left_to_run(job, now))
    }

    /// What suspended `job` has left to run: its expected end counts the suspensions before
    /// this one.
    pub(crate) fn left_to_run(&self, job: &JobRecord, now: f64) -> f64 {
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        (job.expected_end(unlimited) - job.suspension.since.unwrap_or(now)).max(0.0)
    }

    /// How the parts of suspended `job` may move when it resumes.
    pub(crate) fn parts_job(&self, job: &JobRecord) -> PartsJob {
        let request = job.request();
        // Steps hold PUs by index in the allocation: a job with live steps resumes in place.
        let steps_hold = self.steps.get(&job.id).is_some_and(|v| v.iter().any(|s| !s.claims.is_empty()));
        PartsJob { threads: request.threads, system_cpus: request.system_cpus, steps_hold }
    }

    /// Seconds job `id` has spent suspended up to `now` (for the bound on suspension).
    pub fn suspended_seconds(&self, id: JobId, now: f64) -> f64 {
        self.jobs.get(&id).map(|j| j.suspension.seconds(now)).unwrap_or(0.0)
    }

    pub(crate) fn connected(&self, node: usize) -> bool {
        self.extra.get(node).is_some_and(|e| e.conn.is_some())
    }

    /// `berth suspend` (admins): one job.
    pub(crate) fn admin_suspend(
        &mut self,
        id: JobId,
        peer: &Peer,
        now: f64,
    ) -> Result<Result<(), ApiError>, StoreError> {
        if let Err(e) = self.known(id)? {
            return Ok(Err(e));
        }
        self.suspend_job(id, now, SuspendBy::Admin(peer.user.name.clone()))
    }

    /// `berth resume` (admins): one job. When it cannot run now it stays suspended and is
    /// resumed as soon as it can (the admin's hold on it is lifted).
    pub(crate) fn admin_resume(&mut self, id: JobId, now: f64) -> Result<Result<(), ApiError>, StoreError> {
        if let Err(e) = self.known(id)? {
            return Ok(Err(e));
        }
        if let Some(job) = self.jobs.get(&id).filter(|j| j.state == JobState::Running) {
            if job.suspension.resuming.is_some() {
                return Ok(Ok(())); // resuming already
            }
        }
        match self.try_resume(id, now)? {
            Ok(Resumed::InPlace | Resumed::Moved(_)) => Ok(Ok(())),
            Ok(Resumed::Waiting(why)) => {
                if let Some(job) = self.jobs.get_mut(&id).filter(|j| j.suspension.by_admin) {
                    job.suspension.by_admin = false;
                    self.store.save_suspension(id, &job.suspension)?;
                }
                Ok(Err(api(
                    ErrorCode::Unavailable,
                    format!("job {id} stays suspended for now: {why}; it resumes by itself as soon as it can"),
                )))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// The job exists in memory, else why not (ended or unknown).
    fn known(&self, id: JobId) -> Result<Result<(), ApiError>, StoreError> {
        if self.jobs.contains_key(&id) {
            return Ok(Ok(()));
        }
        Ok(Err(match self.store.get_job(id)? {
            Some(j) => api(ErrorCode::InvalidState, format!("job {id} has already ended ({})", j.state.as_str())),
            None => api(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs")),
        }))
    }

    /// `suspend` / `resume` requests: admins only, answered per id.
    pub(crate) fn suspend_request(
        &mut self,
        ids: Vec<JobId>,
        resume: bool,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        if !self.is_admin(peer) {
            let what = if resume { "resume" } else { "suspend" };
            for id in &ids {
                let owner = self.jobs.get(id).map(|j| j.user.name.clone()).unwrap_or_default();
                self.denied(peer, what, Some(*id), &owner)?;
            }
            return Ok(crate::model::request::error(
                ErrorCode::NotPermitted,
                format!("only admins may {what} jobs (config key `admins`); `berth cancel` or `berth hold` your own"),
            ));
        }
        let mut results = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = if resume { self.admin_resume(id, now)? } else { self.admin_suspend(id, peer, now)? };
            results.push(match outcome {
                Ok(()) => IdResult { id, ok: true, error: None },
                Err(e) => IdResult { id, ok: false, error: Some(e) },
            });
        }
        Ok(ClientResponse::Done { results })
    }

    /// A node answered `suspend`. A failure there (its processes there still run) is logged
    /// and shown as the job's reason; the job is resumed at once if its PUs are still free.
    pub(crate) fn suspend_answer(
        &mut self,
        node: usize,
        id: JobId,
        error: Option<String>,
        now: f64,
    ) -> Result<(), StoreError> {
        let name = self.cluster.nodes.get(node).map(|n| n.name.clone()).unwrap_or_default();
        let Some(e) = error else { return Ok(()) };
        tracing::warn!(job = %id, node = %name, "suspend failed: {e}");
        self.store.event(now, "suspend_failed", Some(id), Some(&name), &e)?;
        let Some(job) = self.jobs.get_mut(&id).filter(|j| j.state == JobState::Suspended) else { return Ok(()) };
        job.reason = Some(format!("suspended, but freezing failed on {name}: {e}"));
        self.store.update_job(job)?;
        // Undo the suspension if nothing took its PUs yet (the job resumes on its nodes).
        let in_place = job
            .allocation
            .iter()
            .all(|na| self.cluster.nodes.get(na.node_id.0 as usize).is_some_and(|cap| cap.pus_free_for(na)));
        if in_place {
            self.try_resume(id, now)?.ok();
        }
        Ok(())
    }

    /// A node answered `resume`. On a failure the resume is undone: the job is suspended
    /// again everywhere (`suspend` to its nodes; a node still frozen answers at once), its PUs
    /// are given back and the error is its reason. A moved allocation stays as recorded; the
    /// next resume sends the moved nodes their part again, so each cgroup matches the record.
    pub(crate) fn resume_answer(
        &mut self,
        node: usize,
        id: JobId,
        error: Option<String>,
        cgroups: Vec<CgroupReport>,
        now: f64,
    ) -> Result<(), StoreError> {
        let name = self.cluster.nodes.get(node).map(|n| n.name.clone()).unwrap_or_default();
        if !cgroups.is_empty() && self.jobs.contains_key(&id) {
            let entry = self.cgroups.entry(id).or_default();
            entry.retain(|(n, c)| !(*n == name && c.rank.is_none()));
            entry.extend(cgroups.into_iter().map(|c| (name.clone(), c)));
        }
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let Some(resuming) = job.suspension.resuming.as_mut() else { return Ok(()) };
        resuming.waiting.retain(|n| *n != node);
        let Some(e) = error else {
            if resuming.waiting.is_empty() {
                job.suspension.resuming = None;
            }
            return Ok(());
        };
        tracing::warn!(job = %id, node = %name, "resume failed: {e}");
        self.store.event(now, "resume_failed", Some(id), Some(&name), &e)?;
        let Some(resuming) = job.suspension.resuming.take() else { return Ok(()) };
        if job.state != JobState::Running || job.kill_sent.is_some() {
            return Ok(()); // ending anyway
        }
        for na in &job.allocation {
            if let Some(n) = self.cluster.node_mut(na.node_id) {
                n.release_pus(na);
            }
        }
        // It never ran: the suspension goes on from where it began.
        job.suspension.total_secs = (job.suspension.total_secs - (resuming.at - resuming.since)).max(0.0);
        job.suspension.since = Some(resuming.since);
        job.suspension.by_admin = resuming.by_admin;
        job.suspension.unsynced = resuming.moved;
        job.state = JobState::Suspended;
        job.reason = Some(format!("suspended: resuming failed on {name}: {e}"));
        self.store.update_job(job)?;
        self.store.save_suspension(id, &job.suspension)?;
        let nodes: Vec<usize> = job.allocation.iter().map(|a| a.node_id.0 as usize).collect();
        for n in nodes {
            self.send_to_node(n, ControllerMessage::Suspend { id });
        }
        self.dirty = true;
        Ok(())
    }

    /// A node's agent (same process) registered again: it holds what it held, but a
    /// `suspend` or `resume` sent while it was away was lost. Send them again (both are
    /// idempotent on the agent).
    pub(crate) fn resync_suspensions(&mut self, node: usize) {
        let mut msgs = Vec::new();
        for job in self.jobs.values().filter(|j| j.on_node(node) && j.kill_sent.is_none()) {
            if job.state == JobState::Suspended {
                msgs.push(ControllerMessage::Suspend { id: job.id });
            } else if let Some(r) = job.suspension.resuming.as_ref().filter(|r| r.waiting.contains(&node)) {
                let part = job.allocation.iter().find(|a| a.node_id.0 as usize == node);
                let allocation = part.filter(|_| r.moved.contains(&node)).cloned();
                msgs.push(ControllerMessage::Resume { id: job.id, allocation });
            }
        }
        for m in msgs {
            self.send_to_node(node, m);
        }
    }
}

fn reason_of(by: &SuspendBy) -> String {
    match by {
        SuspendBy::Admin(who) => format!("suspended by admin {who}: `berth resume` resumes it"),
        SuspendBy::Policy(why) => format!("suspended: {why}"),
    }
}

#[cfg(test)]
mod tests;
