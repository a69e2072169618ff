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
//! Decided without a store: the pure functions below (`suspended`, `resumed`,
//! `waiting_reason`, `resume_answered`, `resync_orders`, ...) change the in-memory model (the
//! job, the cluster's books) and return the effects to carry out in order (rows, events,
//! orders to agents; unit-tested without SQLite in `effect_tests.rs`); where a job resumes is
//! decided by berth-core's round (its resume step, `Controller::resume_round`). The
//! `Controller` methods queue the effects and carry them out in the caller's transaction
//! before they return; the messages to the agents are sent after it commits, like every other
//! handler.

use crate::model::effect::Effect;
use crate::model::job::JobRecord;
use crate::model::request::Peer;
use crate::model::suspension::Resuming;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::{Allocation, JobState, NodeAllocation};
use berth_core::sched::backfill::PassLimits;
use berth_core::sched::preempt::{resumed_on, PartsJob, Resume, ResumeWait, SuspendedJob};
use berth_core::sched::reason::SuspendedReason;
use berth_core::sched::round::{round_keeping, ResumeRule, RoundDecisions, RoundInput, SuspendedInput};
use berth_core::sched::ClusterState;
use berth_core::{JobId, NodeId};
use berth_protocol::agent::{CgroupReport, ControllerMessage};
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode, IdResult};
use std::collections::BTreeMap;

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
    /// It stays suspended: why (also in the job's reason).
    Waiting(ResumeWait),
}

fn api(code: ErrorCode, message: String) -> ApiError {
    ApiError::new(code, message)
}

impl Controller {
    /// Suspend running job `id`: written as suspended (with an event) in the current
    /// transaction, its PUs given back (its memory stays claimed), and `suspend` sent to every
    /// node of its allocation once the transaction commits. Refused (the inner error) for a
    /// job that is not running, is ending, is an interactive allocation, or has a node not
    /// connected (it could not be frozen there). Decided by [`suspended`] (and
    /// [`taken_over_by_admin`]); the effects are queued with the command's.
    pub fn suspend_job(&mut self, id: JobId, now: f64, by: SuspendBy) -> Result<Result<(), ApiError>, StoreError> {
        Ok(self.suspend_queued(id, now, by))
    }

    /// `suspend_job`'s decision, its effects queued (the pass's preemptions carry them out
    /// with the rest of the round's).
    pub(crate) fn suspend_queued(&mut self, id: JobId, now: f64, by: SuspendBy) -> Result<(), ApiError> {
        let Some(job) = self.jobs.get(&id) else {
            return Err(api(ErrorCode::UnknownJob, format!("job {id} is not running")));
        };
        if let Some(e) = suspend_refusal(job, |n| self.connected(n)) {
            return Err(e);
        }
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let effects = match job.state {
            // An admin's suspension of a job the pass suspended makes it the admin's.
            JobState::Suspended => taken_over_by_admin(job, &by),
            _ => suspended(job, &mut self.cluster, &by, now),
        };
        self.queue(effects);
        Ok(())
    }

    /// Resume suspended job `id` if it can run now, part by part by the scheduling round's
    /// resume step (berth-core's `sched::round`, with this job alone and no queue, beside the
    /// advance reservations it would run into): on its own PUs where they are free, else on as
    /// many free cores of the same node (same NUMA nodes first; memory follows the CPUs, in the
    /// per-NUMA books too; the allocation is rewritten). Written as running in the current
    /// transaction and `resume` sent to its nodes after the commit; otherwise it stays suspended
    /// with the reason returned (e.g. "waiting for 4 cores on n2 to resume (1 free)"). Refused
    /// (the inner error) for a job that is not suspended or is ending. Admin suspensions are
    /// resumed too (the pass's round leaves them out).
    pub fn try_resume(&mut self, id: JobId, now: f64) -> Result<Result<Resumed, ApiError>, StoreError> {
        let Some(job) = self.jobs.get(&id) else {
            return Ok(Err(api(ErrorCode::UnknownJob, format!("job {id} is not suspended"))));
        };
        if let Some(e) = resume_refusal(job) {
            return Ok(Err(e));
        }
        let d = self.resume_round(vec![self.suspended_input(job, now)], now);
        let how = match (d.resumes.into_iter().next(), d.still_suspended.into_iter().next()) {
            (Some((_, how)), _) => Ok(how),
            (None, Some((_, why))) => Err(why),
            (None, None) => Err(ResumeWait::Unstated),
        };
        let outcome = match how {
            Ok(how) => self.resume_with(id, &how, now),
            Err(why) => {
                self.resume_waits(id, &why);
                Resumed::Waiting(why)
            }
        };
        // Queued with the command's effects: no caller reads them back or queues an order
        // directly after this.
        Ok(Ok(outcome))
    }

    /// The round's resume step alone (no queue, no pass, no preemption) for `suspended`, in
    /// the order given, beside the live advance reservations: what `try_resume` and the
    /// pass's first step decide by.
    pub(crate) fn resume_round(&self, suspended: Vec<SuspendedInput>, now: f64) -> RoundDecisions<Allocation> {
        let machine = self.sched_view();
        let (advance, _) = self.advance_pass_input();
        let connected = |n: NodeId| self.connected(n.0 as usize);
        let input = RoundInput {
            machine: &machine,
            running: &[],
            queue: &[],
            priority: None,
            user_limits: None,
            usage: None,
            barred: None,
            suspended: &suspended,
            resume: ResumeRule::Parts { connected: &connected },
            preempt: None,
            limits: PassLimits { policy: self.cfg.scheduler.policy, max_reservations: 0, deadline: None },
            reasons: false,
            idle_unless: None,
        };
        round_keeping(&input, &advance, &mut None, now)
    }

    /// Suspended `job` as the round's resume step sees it: its allocation, how its parts may
    /// move, and (outside the live advance reservations) the seconds it has left to run, for
    /// which it keeps off their windows.
    pub(crate) fn suspended_input(&self, job: &JobRecord, now: f64) -> SuspendedInput {
        SuspendedInput {
            parts: self.parts_job(job),
            keep_off: self.resume_keeps_off(job, now),
            ..SuspendedInput::whole(SuspendedJob { id: job.id, alloc: job.allocation.clone() }, now, None)
        }
    }

    /// A suspended job that cannot resume now: its reason says why (`waiting_reason`), queued.
    pub(crate) fn resume_waits(&mut self, id: JobId, why: &ResumeWait) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let effects = waiting_reason(job, why);
        self.queue(effects);
    }

    /// Resume job `id` as `how` says (the round's decision), by [`resumed`]: its effects queued.
    pub(crate) fn resume_with(&mut self, id: JobId, how: &Resume, now: f64) -> Resumed {
        let Some(job) = self.jobs.get_mut(&id) else { return Resumed::InPlace };
        let plan = parts_moved(&job.allocation, how);
        let (outcome, effects) = resumed(job, &mut self.cluster, plan, now);
        self.queue(effects);
        outcome
    }

    /// For a job outside the live advance reservations (while there are any): the seconds it
    /// has left to run, during which it keeps off their windows once resumed.
    pub(crate) fn resume_keeps_off(&self, job: &JobRecord, now: f64) -> Option<f64> {
        if self.policy.advance().is_empty() || self.in_advance(job) {
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
        let steps_hold = self.steps.hold_pus(job.id);
        PartsJob { threads: request.threads, system_cpus: request.system_cpus, steps_hold }
    }

    /// Seconds job `id` has spent suspended up to `now` (for the bound on suspension).
    #[cfg(test)]
    pub fn suspended_seconds(&self, id: JobId, now: f64) -> f64 {
        self.jobs.get(&id).map(|j| j.suspension.seconds(now)).unwrap_or(0.0)
    }

    pub(crate) fn connected(&self, node: usize) -> bool {
        self.extra.get(node).is_some_and(|e| e.connected())
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
                if let Some(job) = self.jobs.get_mut(&id) {
                    let effects = admin_hold_lifted(job);
                    self.queue(effects);
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
        Ok(Err(match self.ended_job(id)? {
            Some(j) => api(ErrorCode::InvalidState, format!("job {id} has already ended ({})", j.state.as_str())),
            None => unknown(id),
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
                self.denied(peer, what, Some(*id), &owner, now)?;
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
        // Written after the command, in its transaction, before the reply leaves (server loop).
        Ok(ClientResponse::Done { results })
    }

    /// A node answered `suspend`. A failure there (its processes there still run) is logged
    /// and shown as the job's reason ([`freezing_failed`]); the job is resumed at once if its
    /// PUs are still free.
    pub(crate) fn suspend_answer(
        &mut self,
        node: usize,
        id: JobId,
        error: Option<String>,
        now: f64,
    ) -> Result<(), StoreError> {
        let name = self.cluster.nodes().get(node).map(|n| n.name.clone()).unwrap_or_default();
        let Some(e) = error else { return Ok(()) };
        tracing::warn!(job = %id, node = %name, "suspend failed: {e}");
        let effects = freezing_failed(id, self.jobs.get_mut(&id), &name, &e);
        self.queue(effects);
        // Undo the suspension if nothing took its PUs yet (the job resumes on its nodes).
        let in_place = self.jobs.get(&id).filter(|j| j.state == JobState::Suspended).is_some_and(|job| {
            job.allocation
                .iter()
                .all(|na| self.cluster.nodes().get(na.node_id.0 as usize).is_some_and(|cap| cap.pus_free_for(na)))
        });
        if in_place {
            self.try_resume(id, now)?.ok();
        }
        // Queued with the command's effects: nothing after this in `handle_agent` reads them
        // back or queues an order directly.
        Ok(())
    }

    /// A node answered `resume` ([`resume_answered`]). On a failure the resume is undone: the
    /// job is suspended again everywhere (`suspend` to its nodes; a node still frozen answers
    /// at once), its PUs are given back and the error is its reason. A moved allocation stays
    /// as recorded; the next resume sends the moved nodes their part again, so each cgroup
    /// matches the record.
    pub(crate) fn resume_answer(&mut self, node: usize, id: JobId, error: Option<String>, cgroups: Vec<CgroupReport>) {
        let name = self.cluster.nodes().get(node).map(|n| n.name.clone()).unwrap_or_default();
        if !cgroups.is_empty() && self.jobs.contains_key(&id) {
            self.cgroups.resumed(id, &name, cgroups);
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if let Some(e) = &error {
            if job.suspension.resuming.is_some() {
                tracing::warn!(job = %id, node = %name, "resume failed: {e}");
            }
        }
        let effects = resume_answered(job, &mut self.cluster, node, &name, error);
        // Queued with the command's effects: nothing after this in `handle_agent` reads them
        // back or queues an order directly.
        self.queue(effects);
    }

    /// A node's agent (same process) registered again: it holds what it held, but a
    /// `suspend` or `resume` sent while it was away was lost. Send them again (both are
    /// idempotent on the agent): [`resync_orders`].
    /// Queued with the command's effects: nothing after this in a registration reads them back
    /// or queues an order directly.
    pub(crate) fn resync_suspensions(&mut self, node: usize) {
        let effects = resync_orders(&self.jobs, node);
        self.queue(effects);
    }
}

/// Job `id` is not known.
fn unknown(id: JobId) -> ApiError {
    api(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs"))
}

/// Why `job` cannot be suspended now (None: it can, or is suspended already); `connected`
/// says whether a node's agent (by index) is connected.
pub(crate) fn suspend_refusal(job: &JobRecord, connected: impl Fn(usize) -> bool) -> Option<ApiError> {
    let id = job.id;
    if job.state == JobState::Suspended {
        return None;
    }
    if job.state != JobState::Running {
        let message = format!("job {id} is {}; only running jobs can be suspended", job.state.as_str());
        return Some(api(ErrorCode::InvalidState, message));
    }
    if let Some(r) = &job.kill_sent {
        return Some(api(ErrorCode::InvalidState, format!("job {id} is ending ({r}); it is not suspended")));
    }
    if job.is_interactive() || job.script.is_empty() {
        let message = format!(
            "job {id} has no batch script (an interactive allocation or a reservation); those are not suspended"
        );
        return Some(api(ErrorCode::InvalidState, message));
    }
    if let Some(a) = job.allocation.iter().find(|a| !connected(a.node_id.0 as usize)) {
        let message = format!("node {} of job {id} is not connected; it cannot be frozen there now", a.node);
        return Some(api(ErrorCode::Unavailable, message));
    }
    None
}

/// Why suspended `job` cannot be resumed (None: it may be).
pub(crate) fn resume_refusal(job: &JobRecord) -> Option<ApiError> {
    let id = job.id;
    if job.state != JobState::Suspended {
        let message = format!("job {id} is {}; only suspended jobs can be resumed", job.state.as_str());
        return Some(api(ErrorCode::InvalidState, message));
    }
    if let Some(r) = &job.kill_sent {
        return Some(api(ErrorCode::InvalidState, format!("job {id} is ending ({r}); it is not resumed")));
    }
    None
}

/// Suspended `job` suspended again by an admin: a suspension of the pass's becomes the
/// admin's (its reason says who); its row and suspension to write. Nothing for others.
pub(crate) fn taken_over_by_admin(job: &mut JobRecord, by: &SuspendBy) -> Vec<Effect> {
    if !matches!(by, SuspendBy::Admin(_)) || job.suspension.by_admin {
        return vec![];
    }
    job.suspension.by_admin = true;
    give_reason(job, reason_of(by));
    vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::SaveSuspension { job: job.id, suspension: job.suspension.clone() },
    ]
}

/// Running `job` is suspended at `now` by `by`: its PUs given back on `cluster` (its memory
/// stays claimed); its row, its suspension, the event, `suspend` to each of its nodes and a
/// pass, in that order.
pub(crate) fn suspended(job: &mut JobRecord, cluster: &mut ClusterState, by: &SuspendBy, now: f64) -> Vec<Effect> {
    let id = job.id;
    job.state = JobState::Suspended;
    // A resume still unanswered is overtaken: each agent carries out a job's requests in
    // order, and a late failure of the resume finds nothing to undo.
    job.suspension.resuming = None;
    job.suspension.since = Some(now);
    job.suspension.by_admin = matches!(by, SuspendBy::Admin(_));
    job.suspension.count += 1;
    give_reason(job, reason_of(by));
    let detail = match by {
        SuspendBy::Admin(who) => format!("by admin {who}"),
        SuspendBy::Policy(why) => why.clone(),
    };
    let mut effects = vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::SaveSuspension { job: id, suspension: job.suspension.clone() },
        Effect::job_event("suspend", id, None, detail),
    ];
    for na in &job.allocation {
        if let Some(mut n) = cluster.node_mut(na.node_id) {
            n.release_pus(na);
        }
        effects.push(Effect::Send { node: na.node_id.0 as usize, msg: ControllerMessage::Suspend { id } });
    }
    effects.push(Effect::Reschedule);
    effects
}

/// Suspended `job` cannot resume now (`why`): its reason says so, after what suspended it
/// ("suspended: preempted by job 12; waiting for ...": [`SuspendedReason::waiting`]); its row
/// to write when its words changed.
pub(crate) fn waiting_reason(job: &mut JobRecord, why: &ResumeWait) -> Vec<Effect> {
    let reason = SuspendedReason::waiting(job.suspension.reason.as_ref(), why.clone());
    if !give_reason(job, reason) {
        return vec![];
    }
    vec![Effect::UpdateJob(Box::new(job.clone()))]
}

/// Suspended `job`'s reason becomes `reason`, typed (`job.suspension.reason`) and in words (the
/// job's `reason`, what its row keeps and users read); whether the words changed.
fn give_reason(job: &mut JobRecord, reason: SuspendedReason) -> bool {
    let words = reason.to_string();
    let changed = job.reason.as_deref() != Some(words.as_str());
    job.reason = Some(words);
    job.suspension.reason = Some(reason);
    changed
}

/// Per part of `old`, where it resumes as the round decided (None: in place).
pub(crate) fn parts_moved(old: &Allocation, how: &Resume) -> Vec<Option<NodeAllocation>> {
    match how {
        Resume::InPlace => vec![None; old.len()],
        Resume::Relocated(new) => old.iter().zip(new).map(|(o, n)| (o != n).then(|| n.clone())).collect(),
    }
}

/// Suspended `job` resumes at `now` by `plan` (per part of its allocation: where it moves,
/// None: in place): its memory books follow moved parts and its PUs are claimed on `cluster`,
/// it runs again with the resume in flight recorded; its row, its suspension, the event and
/// `resume` to each of its nodes (with the new part where it moved, or where a failed move
/// left its cgroup unsynced), in that order.
pub(crate) fn resumed(
    job: &mut JobRecord,
    cluster: &mut ClusterState,
    plan: Vec<Option<NodeAllocation>>,
    now: f64,
) -> (Resumed, Vec<Effect>) {
    let id = job.id;
    let mut moved = Vec::new();
    let mut details = Vec::new();
    let mut msgs = Vec::new();
    let old = job.allocation.clone();
    // Its memory moves with it (the agent migrates the pages): so do the books.
    job.allocation = resumed_on(cluster, &old, &plan);
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
    job.suspension.reason = None;
    let detail = if details.is_empty() { "in place".to_string() } else { format!("moved {}", details.join("; ")) };
    let mut effects = vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::SaveSuspension { job: id, suspension: job.suspension.clone() },
        Effect::job_event("resume", id, None, detail),
    ];
    effects.extend(msgs.into_iter().map(|(node, _, msg)| Effect::Send { node, msg }));
    (if moved.is_empty() { Resumed::InPlace } else { Resumed::Moved(moved) }, effects)
}

/// `berth resume` of `job` that cannot resume now: the admin's hold on it is lifted (it
/// resumes by itself as soon as it can); its suspension to write when it was the admin's.
pub(crate) fn admin_hold_lifted(job: &mut JobRecord) -> Vec<Effect> {
    if !job.suspension.by_admin {
        return vec![];
    }
    job.suspension.by_admin = false;
    vec![Effect::SaveSuspension { job: job.id, suspension: job.suspension.clone() }]
}

/// Node `name` failed to freeze job `id` (`e`; its processes there still run): the event,
/// then, for `job` still suspended, its reason saying so and its row.
pub(crate) fn freezing_failed(id: JobId, job: Option<&mut JobRecord>, name: &str, e: &str) -> Vec<Effect> {
    let mut effects = vec![Effect::job_event("suspend_failed", id, Some(name), e)];
    if let Some(job) = job.filter(|j| j.state == JobState::Suspended) {
        give_reason(job, SuspendedReason::FreezingFailed { node: name.to_string(), error: e.to_string() });
        effects.push(Effect::UpdateJob(Box::new(job.clone())));
    }
    effects
}

/// Node `node` (`name`) answered the resume of `job` in flight (`error`: it failed there).
/// Once every node answered well the resume is over. On a failure: the event, then, for a job
/// not ending, the resume undone: its PUs given back on `cluster`, its suspension going on
/// from where it began, the parts a move may have left unsynced noted, the error its reason;
/// its row, its suspension, `suspend` to each of its nodes and a pass, in that order.
pub(crate) fn resume_answered(
    job: &mut JobRecord,
    cluster: &mut ClusterState,
    node: usize,
    name: &str,
    error: Option<String>,
) -> Vec<Effect> {
    let id = job.id;
    let Some(resuming) = job.suspension.resuming.as_mut() else { return vec![] };
    resuming.waiting.retain(|n| *n != node);
    let Some(e) = error else {
        if resuming.waiting.is_empty() {
            job.suspension.resuming = None;
        }
        return vec![];
    };
    let mut effects = vec![Effect::job_event("resume_failed", id, Some(name), e.as_str())];
    let Some(resuming) = job.suspension.resuming.take() else { return effects };
    if job.state != JobState::Running || job.kill_sent.is_some() {
        return effects; // ending anyway
    }
    for na in &job.allocation {
        if let Some(mut n) = cluster.node_mut(na.node_id) {
            n.release_pus(na);
        }
    }
    // It never ran: the suspension goes on from where it began.
    job.suspension.total_secs = (job.suspension.total_secs - (resuming.at - resuming.since)).max(0.0);
    job.suspension.since = Some(resuming.since);
    job.suspension.by_admin = resuming.by_admin;
    job.suspension.unsynced = resuming.moved;
    job.state = JobState::Suspended;
    give_reason(job, SuspendedReason::ResumeFailed { node: name.to_string(), error: e, waits: None });
    effects.push(Effect::UpdateJob(Box::new(job.clone())));
    effects.push(Effect::SaveSuspension { job: id, suspension: job.suspension.clone() });
    for na in &job.allocation {
        effects.push(Effect::Send { node: na.node_id.0 as usize, msg: ControllerMessage::Suspend { id } });
    }
    effects.push(Effect::Reschedule);
    effects
}

/// Node `node`'s agent registered again: `suspend` again for each job suspended there, and
/// `resume` again (with the part where it moved) where a resume waits for its answer.
pub(crate) fn resync_orders(jobs: &BTreeMap<JobId, JobRecord>, node: usize) -> Vec<Effect> {
    let mut effects = Vec::new();
    for job in jobs.values().filter(|j| j.on_node(node) && j.kill_sent.is_none()) {
        let msg = if job.state == JobState::Suspended {
            ControllerMessage::Suspend { id: job.id }
        } else if let Some(r) = job.suspension.resuming.as_ref().filter(|r| r.waiting.contains(&node)) {
            let part = job.allocation.iter().find(|a| a.node_id.0 as usize == node);
            let allocation = part.filter(|_| r.moved.contains(&node)).cloned();
            ControllerMessage::Resume { id: job.id, allocation }
        } else {
            continue;
        };
        effects.push(Effect::Send { node, msg });
    }
    effects
}

fn reason_of(by: &SuspendBy) -> SuspendedReason {
    match by {
        SuspendBy::Admin(who) => SuspendedReason::ByAdmin { who: who.clone() },
        SuspendBy::Policy(why) => SuspendedReason::Preempted { why: why.clone(), waits: None },
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod effect_tests;
