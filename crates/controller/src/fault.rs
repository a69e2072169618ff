//! Node failures: a node is marked down (missed heartbeats, or an admin's `berth node down`),
//! and each of its jobs is requeued, failed, or kept running on its other nodes (`--no-kill`),
//! by policy. A node that comes back is given work again only once it is clean.

use crate::model::job::JobRecord;
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::job::{JobOutcome, JobState};
use berth_core::node::NodeState;
use berth_core::JobId;

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

const ADMIN_DOWN_KEY: &str = "node_down:";

impl Controller {
    /// Node `i` failed (`why`: "missed heartbeats", "admin: ..."): mark it down and apply the
    /// policy to each of its jobs.
    pub fn node_failed(&mut self, i: usize, why: &str, now: f64) -> Result<(), StoreError> {
        self.extra[i].state = NodeState::Down;
        let name = self.cluster.nodes[i].name.clone();
        let row = self.node_row(i);
        self.store.upsert_node(&row)?;
        self.store.event(now, "node_down", None, Some(&name), why)?;
        for id in self.jobs_on_node(i) {
            self.job_lost_on_node(id, i, why, now)?;
        }
        self.dirty = true;
        Ok(())
    }

    /// Job `id` lost its part on node `i` (the node failed, or its agent restarted without
    /// it): requeue, fail, or go on without it, by policy.
    pub fn job_lost_on_node(&mut self, id: JobId, i: usize, why: &str, now: f64) -> Result<(), StoreError> {
        let name = self.cluster.nodes[i].name.clone();
        let Some(job) = self.jobs.get(&id) else { return Ok(()) };
        let head = Self::head_node(&job.allocation) == Some(i);
        let requeued = self.store.count_events(id, "requeue")?;
        match failure_action(job, head, requeued, &self.cfg.fault) {
            FailureAction::KeepRunning => {
                tracing::warn!(job = %id, node = %name, "node lost; the no-kill job goes on without it");
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.reason = Some(format!("running without {name} (no-kill)"));
                }
                self.store.event(now, "node_lost_kept", Some(id), Some(&name), why)?;
            }
            FailureAction::Requeue => {
                tracing::warn!(job = %id, node = %name, "node lost; requeueing the job");
                self.requeue(id, now, &name, &format!("node {name} failed: {why}"), Some(i))?;
            }
            FailureAction::Fail(not_requeued) => {
                let Some(job) = self.jobs.get_mut(&id) else { return Ok(()) };
                let outcome = JobOutcome { reason: Some("node_fail".into()), ..Default::default() };
                job.finish(&outcome, now);
                job.usage = None;
                job.reason = Some(format!("node {name} failed ({why}); {not_requeued}"));
                self.store.update_job(job)?;
                self.store.event(now, "node_fail", Some(id), Some(&name), why)?;
                self.end_running(id, now, &format!("node {name} of the job was lost"), Some(i))?;
            }
        }
        self.dirty = true;
        Ok(())
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
        let suspended = std::mem::take(&mut job.suspension).since.is_some();
        self.store.save_suspension(id, &job.suspension)?;
        let alloc = std::mem::take(&mut job.allocation);
        job.state = JobState::Queued;
        job.start_time = None;
        job.kill_sent = None;
        job.reason = Some(format!("requeued: {why}"));
        self.store.update_job(job)?;
        crate::notify::notify(&self.cfg.notify, job, crate::notify::Event::Requeue);
        self.store.event(now, "requeue", Some(id), Some(node), why)?;
        self.store.close_steps(id, now, "job requeued")?;
        self.steps.remove(&id);
        self.cgroups.remove(&id);
        self.kill_on_nodes(id, &alloc, "job requeued", except);
        // It starts again once its old run has ended where it was killed (`crate::update`).
        self.await_old_run(id, &alloc, except, now)?;
        crate::model::suspension::release(&mut self.cluster, &alloc, suspended);
        self.dirty = true;
        Ok(())
    }

    /// `berth node down NAME [REASON]` (admins): the node's jobs are handled as for a failed
    /// node, and it takes no work until `berth node up`, across controller restarts too.
    pub fn admin_node_down(&mut self, i: usize, reason: &str, now: f64) -> Result<(), StoreError> {
        let name = self.cluster.nodes[i].name.clone();
        let reason = if reason.is_empty() { "no reason given" } else { reason };
        self.store.set_meta(&format!("{ADMIN_DOWN_KEY}{name}"), reason)?;
        // The agent may still be alive: what runs there for the jobs handled below is killed.
        let mut on_node = self.jobs_on_node(i);
        on_node.retain(|id| {
            let job = &self.jobs[id];
            let head = Self::head_node(&job.allocation) == Some(i);
            !(job.options.no_kill == Some(true) && !head && job.allocation.len() > 1)
        });
        for id in &on_node {
            if let Some(job) = self.jobs.get(id) {
                if let Some(a) = job.allocation.iter().find(|a| a.node_id.0 as usize == i) {
                    let alloc = vec![a.clone()];
                    self.kill_on_nodes(*id, &alloc, &format!("node {name} taken down by an admin"), None);
                }
            }
        }
        if self.extra[i].state == NodeState::Down {
            self.store.event(now, "node_down", None, Some(&name), &format!("admin: {reason}"))?;
            return Ok(());
        }
        self.node_failed(i, &format!("admin: {reason}"), now)
    }

    /// `berth node up NAME` (admins): the node may take work again once its agent is
    /// connected and clean.
    pub fn admin_node_up(&mut self, i: usize, now: f64) -> Result<(), StoreError> {
        let name = self.cluster.nodes[i].name.clone();
        self.store.delete_meta(&format!("{ADMIN_DOWN_KEY}{name}"))?;
        self.store.event(now, "node_admin_up", None, Some(&name), "")?;
        if self.extra[i].conn.is_some() && self.extra[i].state == NodeState::Down {
            self.extra[i].state = NodeState::Cleaning;
            self.store.upsert_node(&self.node_row(i))?;
            self.check_clean(i, &[], now)?;
        }
        Ok(())
    }

    /// Why an admin took node `name` down, if they did.
    pub fn admin_down_reason(&self, name: &str) -> Option<String> {
        self.store.get_meta(&format!("{ADMIN_DOWN_KEY}{name}")).ok().flatten()
    }

    /// A cleaning node's agent reports what it runs: once that is only jobs that belong
    /// there, the node is up. `running` empty means "as far as we know" (after admin up).
    pub fn check_clean(&mut self, i: usize, running: &[JobId], now: f64) -> Result<(), StoreError> {
        if self.extra[i].state != NodeState::Cleaning {
            return Ok(());
        }
        let stray =
            running.iter().any(|id| !self.jobs.get(id).is_some_and(|j| j.state.has_allocation() && j.on_node(i)));
        if stray {
            return Ok(());
        }
        self.extra[i].state = NodeState::Up;
        let name = self.cluster.nodes[i].name.clone();
        self.store.upsert_node(&self.node_row(i))?;
        self.store.event(now, "node_up", None, Some(&name), "clean")?;
        self.dirty = true;
        Ok(())
    }

    /// The request behind `berth node down|up`.
    pub fn node_down_up(&mut self, i: usize, action: &str, value: Option<&str>, now: f64) -> Result<(), StoreError> {
        match action {
            "down" => self.admin_node_down(i, value.unwrap_or(""), now),
            _ => self.admin_node_up(i, now),
        }
    }
}

#[cfg(test)]
mod tests;
