//! Node failures: a node is marked down (missed heartbeats, or an admin's `berth node down`),
//! and each of its jobs is requeued, failed, or kept running on its other nodes (`--no-kill`),
//! by policy. A node that comes back is given work again only once it is clean.

use crate::model::effect::Effect;
use crate::model::job::JobRecord;
use crate::model::node_settings::admin_down_key;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::{Allocation, JobOutcome, JobState, NodeAllocation};
use berth_core::node::NodeState;
use berth_core::JobId;
use berth_protocol::agent::ControllerMessage;
use std::collections::BTreeMap;

/// What happens to one job of a failed node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureAction {
    /// `--no-kill`, and the node was not the one running its batch script: it goes on.
    KeepRunning,
    /// Back to the queue, to run again from the start.
    Requeue,
    /// Ended with `node_fail`; why it was not requeued.
    Fail(String),
}

/// The policy, as a pure function: the job, whether the failed node runs its batch script
/// (its first node), how often it was already requeued for failures, and the cluster default.
pub fn failure_action(
    job: &JobRecord,
    failed_is_head: bool,
    requeued_before: u32,
    cfg: &crate::config::FaultConfig,
) -> FailureAction {
    let several_nodes = job.allocation.len() > 1;
    if job.options.no_kill == Some(true) && !failed_is_head && several_nodes {
        return FailureAction::KeepRunning;
    }
    if job.is_interactive() {
        return FailureAction::Fail("an interactive allocation is not requeued".into());
    }
    if !job.options.requeue.unwrap_or(cfg.requeue) {
        return FailureAction::Fail("the job is not requeued on node failure (--no-requeue)".into());
    }
    if requeued_before >= cfg.max_requeues {
        return FailureAction::Fail(format!("already requeued {requeued_before} times (limit [fault] max_requeues)"));
    }
    FailureAction::Requeue
}

impl Controller {
    /// Node `i` failed (`why`: "missed heartbeats", "admin: ..."): mark it down and apply the
    /// policy to each of its jobs.
    pub fn node_failed(&mut self, i: usize, why: &str, now: f64) -> Result<(), StoreError> {
        self.extra[i].state = NodeState::Down;
        let name = self.cluster.nodes()[i].name.clone();
        // Queued first: each job's part (`job_lost_on_node`) carries these out with its own.
        self.queue(node_went(i, &name, "node_down", why));
        for id in self.jobs_on_node(i) {
            self.job_lost_on_node(id, i, why, now)?;
        }
        // Queued with the command's effects (each job's part is written already).
        self.queue([Effect::Reschedule]);
        Ok(())
    }

    /// Job `id` lost its part on node `i` (the node failed, or its agent restarted without
    /// it): requeue, fail, or go on without it, by policy.
    pub fn job_lost_on_node(&mut self, id: JobId, i: usize, why: &str, now: f64) -> Result<(), StoreError> {
        let name = self.cluster.nodes()[i].name.clone();
        let Some(job) = self.jobs.get(&id) else { return Ok(()) };
        let head = Self::head_node(&job.allocation) == Some(i);
        match failure_action(job, head, self.counts.requeues(id), &self.cfg.fault) {
            FailureAction::KeepRunning => {
                tracing::warn!(job = %id, node = %name, "node lost; the no-kill job goes on without it");
                if let Some(job) = self.jobs.get_mut(&id) {
                    let effects = kept_without(job, &name, why);
                    self.queue(effects);
                }
            }
            FailureAction::Requeue => {
                tracing::warn!(job = %id, node = %name, "node lost; requeueing the job");
                self.requeue(id, now, &name, &format!("node {name} failed: {why}"), Some(i))?;
            }
            FailureAction::Fail(not_requeued) => {
                let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
                let effects = failed_with_node(job, &name, why, &not_requeued, now);
                self.queue(effects);
                // Carried out before `end_running` retires the job (which may drain its nodes; it
                // carries out its own effects after these): a node's row queued before is
                // written as it is now.
                self.carry_out_effects(now)?;
                self.end_running(id, now, &format!("node {name} of the job was lost"), Some(i))?;
            }
        }
        self.queue([Effect::Reschedule]);
        // Carried out now: an agent's message that calls this then acks it with `send_to_node`
        // directly (`handle_agent`, `EndAck`), which must follow the orders queued here.
        self.carry_out_effects(now)
    }

    /// Put a running job back in the queue: its steps are closed, what is left of it on its
    /// other nodes (but `except`) is killed, its resources freed. Its next run starts with a
    /// fresh walltime clock, once the old one has ended on those nodes. Also `berth requeue`'s
    /// (`crate::update`).
    pub fn requeue(
        &mut self,
        id: JobId,
        now: f64,
        node: &str,
        why: &str,
        except: Option<usize>,
    ) -> Result<(), StoreError> {
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
        let Requeued { alloc, suspended, effects } = requeued(job, now, node, why, except);
        // The hook is told as the job's row is written (it runs in a thread of its own).
        crate::notify::notify(&self.cfg.notify, job, crate::notify::Event::Requeue);
        self.queue(effects);
        self.counts.requeued(id);
        self.steps.end_all_of(id);
        self.cgroups.forget(id);
        // It starts again once its old run has ended where it was killed (`crate::update`).
        self.await_old_run(id, &alloc, except, now)?;
        crate::model::suspension::release(&mut self.cluster, &alloc, suspended);
        self.dirty = true;
        Ok(())
    }

    /// `berth node down NAME [REASON]` (admins): the node's jobs are handled as for a failed
    /// node, and it takes no work until `berth node up`, across controller restarts too.
    pub fn admin_node_down(&mut self, i: usize, reason: &str, now: f64) -> Result<(), StoreError> {
        let name = self.cluster.nodes()[i].name.clone();
        let down_already = self.extra[i].state == NodeState::Down;
        let (reason, effects) = taken_down(&self.jobs, i, &name, reason, down_already);
        self.extra[i].set_admin_down(Some(reason.to_string()));
        self.queue(effects);
        if down_already {
            // Queued with the command's effects (`node_admin` only queues its event and reply
            // after this); else the node fails (`node_failed`).
            return Ok(());
        }
        self.node_failed(i, &format!("admin: {reason}"), now)
    }

    /// `berth node up NAME` (admins): the node may take work again once its agent is
    /// connected and clean. Its writes are queued with the command's effects.
    pub fn admin_node_up(&mut self, i: usize) {
        let name = self.cluster.nodes()[i].name.clone();
        self.extra[i].set_admin_down(None);
        self.queue([Effect::DeleteMeta { key: admin_down_key(&name) }, Effect::node_event("node_admin_up", &name, "")]);
        if self.extra[i].connected() && self.extra[i].state == NodeState::Down {
            self.extra[i].state = NodeState::Cleaning;
            self.queue([Effect::UpsertNode { node: i }]);
            self.check_clean(i, &[]);
        }
    }

    /// Why an admin took node `name` down, if they did (from memory: `NodeExtra::admin_down`).
    pub fn admin_down_reason(&self, name: &str) -> Option<String> {
        self.node_by_name(name).and_then(|i| self.extra[i].admin_down().map(str::to_string))
    }

    /// A cleaning node's agent reports what it runs: once that is only jobs that belong
    /// there, the node is up. `running` empty means "as far as we know" (after admin up).
    /// Its row and event are queued with the command's effects.
    pub fn check_clean(&mut self, i: usize, running: &[JobId]) {
        if self.extra[i].state != NodeState::Cleaning || !clean(&self.jobs, i, running) {
            return;
        }
        self.extra[i].state = NodeState::Up;
        let name = self.cluster.nodes()[i].name.clone();
        self.queue(node_went(i, &name, "node_up", "clean"));
        self.queue([Effect::Reschedule]);
    }

    /// The request behind `berth node down|up`.
    pub fn node_down_up(&mut self, i: usize, action: &str, value: Option<&str>, now: f64) -> Result<(), StoreError> {
        match action {
            "down" => self.admin_node_down(i, value.unwrap_or(""), now),
            _ => {
                self.admin_node_up(i);
                Ok(())
            }
        }
    }
}

/// Node `i` (`name`) changed state (set in the model): its row, then its event (`kind`:
/// node_down, node_up) to write.
pub(crate) fn node_went(i: usize, name: &str, kind: &str, why: &str) -> Vec<Effect> {
    vec![Effect::UpsertNode { node: i }, Effect::node_event(kind, name, why)]
}

/// A `--no-kill` job goes on without node `name`: its reason says so; the event to write.
pub(crate) fn kept_without(job: &mut JobRecord, name: &str, why: &str) -> Vec<Effect> {
    job.reason = Some(format!("running without {name} (no-kill)"));
    vec![Effect::job_event("node_lost_kept", job.id, Some(name), why)]
}

/// A job ends with its node `name` (`node_fail`, not requeued: `not_requeued` says why):
/// finished in the model; its row, then its event to write.
pub(crate) fn failed_with_node(
    job: &mut JobRecord,
    name: &str,
    why: &str,
    not_requeued: &str,
    now: f64,
) -> Vec<Effect> {
    let outcome = JobOutcome { reason: Some("node_fail".into()), ..Default::default() };
    job.finish(&outcome, now);
    job.usage = None;
    job.reason = Some(format!("node {name} failed ({why}); {not_requeued}"));
    vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("node_fail", job.id, Some(name), why)]
}

/// What requeueing a job decided (see [`requeued`]).
pub(crate) struct Requeued {
    /// The allocation it held (its old run ends there).
    pub alloc: Allocation,
    /// It was suspended (its PUs were free already).
    pub suspended: bool,
    pub effects: Vec<Effect>,
}

/// A running (or suspended) job back in the queue (`why`, seen on `node`): queued again in
/// the model, with no allocation nor suspension; to write and send, in order: its suspension,
/// its row, the event, its steps closed, then kills to its nodes but `except`.
pub(crate) fn requeued(job: &mut JobRecord, now: f64, node: &str, why: &str, except: Option<usize>) -> Requeued {
    let id = job.id;
    let suspended = std::mem::take(&mut job.suspension).since.is_some();
    let alloc = std::mem::take(&mut job.allocation);
    job.state = JobState::Queued;
    job.start_time = None;
    job.kill_sent = None;
    job.reason = Some(format!("requeued: {why}"));
    let mut effects = vec![
        Effect::SaveSuspension { job: id, suspension: job.suspension.clone() },
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::job_event("requeue", id, Some(node), why),
        Effect::CloseSteps { job: id, time: now, failure: "job requeued".into() },
    ];
    effects.extend(kills(id, &alloc, "job requeued", except));
    Requeued { alloc, suspended, effects }
}

/// Kills of job `id` to the agents of `alloc`'s nodes but `except`.
fn kills<'a>(
    id: JobId,
    alloc: &'a [NodeAllocation],
    reason: &'a str,
    except: Option<usize>,
) -> impl Iterator<Item = Effect> + 'a {
    alloc
        .iter()
        .map(|a| a.node_id.0 as usize)
        .filter(move |n| Some(*n) != except)
        .map(move |node| Effect::Send { node, msg: ControllerMessage::Kill { id, reason: reason.to_string() } })
}

/// An admin takes node `i` (`name`) down for `reason` (empty: none given): the reason as
/// recorded, and to write and send, in order: the reason (kept across restarts), kills on the
/// node of the jobs that will not go on without it (all but `--no-kill` jobs whose batch
/// script runs elsewhere), and, when the node is down already, the event (else the node
/// fails, `Controller::node_failed`).
pub(crate) fn taken_down<'r>(
    jobs: &BTreeMap<JobId, JobRecord>,
    i: usize,
    name: &str,
    reason: &'r str,
    down_already: bool,
) -> (&'r str, Vec<Effect>) {
    let reason = if reason.is_empty() { "no reason given" } else { reason };
    let mut effects = vec![Effect::SetMeta { key: admin_down_key(name), value: reason.into() }];
    // The agent may still be alive: what runs there for the jobs handled then is killed.
    let why = format!("node {name} taken down by an admin");
    for job in jobs.values().filter(|j| j.state.has_allocation()) {
        let head = Controller::head_node(&job.allocation) == Some(i);
        if job.options.no_kill == Some(true) && !head && job.allocation.len() > 1 {
            continue;
        }
        if let Some(a) = job.allocation.iter().find(|a| a.node_id.0 as usize == i) {
            effects.extend(kills(job.id, std::slice::from_ref(a), &why, None));
        }
    }
    if down_already {
        effects.push(Effect::node_event("node_down", name, format!("admin: {reason}")));
    }
    (reason, effects)
}

/// Whether a cleaning node `i` whose agent runs `running` runs only jobs that belong there
/// (`running` empty: as far as is known).
pub(crate) fn clean(jobs: &BTreeMap<JobId, JobRecord>, i: usize, running: &[JobId]) -> bool {
    !running.iter().any(|id| !jobs.get(id).is_some_and(|j| j.state.has_allocation() && j.on_node(i)))
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
