//! The jobs running on this agent, for steps (`berth run`), tasks and signals to find them.

use crate::cgroup::JobCgroup;
use berth_core::JobId;
use berth_protocol::agent::LaunchSpec;
use berth_protocol::agent::StepRef;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// A job's presence on this node: its cgroup, spool and running steps.
pub struct JobHandle {
    pub spec: LaunchSpec,
    pub cgroup: Arc<dyn JobCgroup>,
    /// The job's spool directory here (TMPDIR is `spool/tmp`).
    pub spool: PathBuf,
    /// The job's cpuset directory (`BERTH_CPUSET`).
    pub cpuset_dir: PathBuf,
    /// Signals for the local ranks of each running step.
    pub steps: Mutex<HashMap<u32, mpsc::UnboundedSender<i32>>>,
    /// Tasks started through this agent's task API (`berth task`).
    pub tasks: crate::tasks::JobTasks,
    /// Frozen or not, and for how long (its walltime does not count it).
    pub suspension: Arc<crate::suspend::Suspension>,
}

impl JobHandle {
    pub fn tmpdir(&self) -> PathBuf {
        self.spool.join("tmp")
    }

    /// This node's part of the allocation now: the launch's, or where a resume moved it.
    pub fn allocation(&self) -> berth_core::job::NodeAllocation {
        self.suspension.allocation().unwrap_or_else(|| self.spec.allocation.clone())
    }

    /// Send `signal` to the local ranks of `step`; false if the step has none here.
    pub fn signal_step(&self, step: u32, signal: i32) -> bool {
        let tx = self.steps.lock().ok().and_then(|s| s.get(&step).cloned());
        tx.is_some_and(|tx| tx.send(signal).is_ok())
    }
}

#[derive(Default)]
pub struct Registry {
    jobs: Mutex<HashMap<JobId, Arc<JobHandle>>>,
    changed: Notify,
    /// Steps started from their job's launch order, waiting for their `berth run`.
    pub attach: crate::attach::Attachments,
}

impl Registry {
    pub fn insert(&self, job: Arc<JobHandle>) {
        if let Ok(mut j) = self.jobs.lock() {
            j.insert(job.spec.id, job);
        }
        self.changed.notify_waiters();
    }

    pub fn remove(&self, id: JobId) {
        if let Ok(mut j) = self.jobs.lock() {
            j.remove(&id);
        }
    }

    /// Every job running here now.
    pub fn all(&self) -> Vec<Arc<JobHandle>> {
        self.jobs.lock().map(|j| j.values().cloned().collect()).unwrap_or_default()
    }

    pub fn get(&self, id: JobId) -> Option<Arc<JobHandle>> {
        self.jobs.lock().ok().and_then(|j| j.get(&id).cloned())
    }

    /// The job, waiting up to `timeout` for its launch to finish setting it up (a step may
    /// reach a node just before the job's own launch does).
    pub async fn wait_for(&self, id: JobId, timeout: Duration) -> Option<Arc<JobHandle>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if let Some(j) = self.get(id) {
                return Some(j);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.get(id);
            }
        }
    }
}

/// Steps whose control tree is rooted on this node and whose end the controller has not
/// taken yet (running, or ended with the report still on its way): listed in registrations
/// and heartbeats, so the controller closes only the steps no agent knows
/// (docs/protocol/02-agent.md, "Step ends from agents").
#[derive(Default)]
pub struct RootSteps(Mutex<BTreeSet<StepRef>>);

impl RootSteps {
    pub fn insert(&self, job: JobId, step: u32) {
        self.0.lock().map(|mut s| s.insert(StepRef { job, step })).ok();
    }

    pub fn remove(&self, job: JobId, step: u32) {
        self.0.lock().map(|mut s| s.remove(&StepRef { job, step })).ok();
    }

    pub fn list(&self) -> Vec<StepRef> {
        self.0.lock().map(|s| s.iter().copied().collect()).unwrap_or_default()
    }
}
