//! What the parts of the agent share, and the one owner of its job table: the lower modules
//! (suspension, tasks, steps, the task API, the control tree's shepherds) depend on this
//! module, never on `job.rs` or `daemon.rs`, which use them.
//!
//! [`JobTable`] is the agent's only record of the jobs on this node: the jobs set up here
//! (for steps, tasks and signals), the kill channels of those launched and not ended, the
//! ends and step ends the controller has not acknowledged, the steps rooted here, the
//! connection and the lease. One lock guards it all; nothing holds it across an `await`.

pub mod attach;
pub mod suspension;
pub mod task_table;

use crate::cgroup::{CgroupBackend, JobCgroup};
use crate::cpumap::CpuMap;
use crate::ports::suspension::Suspension;
use berth_core::job::JobOutcome;
use berth_core::topology::Topology;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, LaunchSpec, StepRef};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// What every job on this agent shares.
pub struct JobContext {
    pub cgroups: Arc<dyn CgroupBackend>,
    pub cpumap: CpuMap,
    /// This node's topology (as registered), for mapping bound cores to PUs.
    pub topology: Topology,
    /// Root of the per-job spool and TMPDIR directories of this agent.
    pub spool_root: PathBuf,
    /// The jobs on this node: the agent's one job table.
    pub registry: JobTable,
    /// The agent's local socket for the task API (`BERTH_AGENT_SOCKET`).
    pub agent_socket: PathBuf,
    /// The berth binary, started as the batch script's shim (`berth __berth-shim`); None
    /// starts the script directly (its exit status then dies with the agent).
    pub shim: Option<PathBuf>,
    /// The agent's `berth-rsh` link (`crate::launcher`), set in its jobs' environments for
    /// mpirun/mpiexec; None sets no launcher variables.
    pub rsh: Option<PathBuf>,
    /// The agent's durable job records (re-adoption after a restart); None keeps none.
    pub records: Option<Arc<crate::records::Records>>,
    /// Messages for the controller (step ends seen at a control tree's root); None: none sent.
    pub reports: Option<mpsc::UnboundedSender<AgentMessage>>,
    /// The agent's nice value and its jobs' (`berth agent --nice`).
    pub priority: crate::priority::Priority,
    /// What the agent's connections share: frame bytes in flight, handshakes waiting.
    pub conns: Arc<crate::conn::ConnBudgets>,
    /// The agent's key and grant checks; None (tests) signs nothing and accepts no grant.
    pub auth: Option<Arc<crate::auth::AgentAuth>>,
}

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
    pub tasks: crate::ports::task_table::JobTasks,
    /// Frozen or not, and for how long (its walltime does not count it).
    pub suspension: Arc<Suspension>,
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

/// The job table's contents (see [`JobTable`]).
pub struct Jobs {
    /// Jobs set up here (cgroup made, script started), for steps, tasks and signals.
    pub set_up: HashMap<JobId, Arc<JobHandle>>,
    /// Jobs launched here and not ended: where their kill requests go (the reason).
    pub running: BTreeMap<JobId, mpsc::UnboundedSender<String>>,
    /// Ended jobs whose end the controller has not acknowledged.
    pub unacked: BTreeMap<JobId, JobOutcome>,
    /// Step ends reported to the controller and not yet acknowledged: sent again on the
    /// next registration (a controller restart may have lost them).
    pub unacked_steps: BTreeMap<(JobId, u32), AgentMessage>,
    /// Steps whose control tree is rooted on this node and whose end the controller has not
    /// taken yet (running, or ended with the report still on its way): listed in
    /// registrations and heartbeats, so the controller closes only the steps no agent knows
    /// (docs/protocol/02-agent.md, "Step ends from agents").
    pub root_steps: BTreeSet<StepRef>,
    /// Registered with the controller now.
    pub connected: bool,
    /// The controller's lease on this agent's fenced jobs (crate::fence).
    pub lease: crate::fence::LeaseState,
    /// The agent is stopping: nothing is made ahead for the next job (it would outlive the
    /// agent; crate::job::make_spares).
    pub stopping: bool,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs {
            set_up: HashMap::new(),
            running: BTreeMap::new(),
            unacked: BTreeMap::new(),
            unacked_steps: BTreeMap::new(),
            root_steps: BTreeSet::new(),
            connected: false,
            lease: crate::fence::LeaseState::new(std::time::Instant::now()),
            stopping: false,
        }
    }
}

impl Jobs {
    /// The steps rooted here that the controller may not close: running, or ended and
    /// reported but not acknowledged.
    pub fn open_steps(&self) -> Vec<StepRef> {
        let mut steps: Vec<StepRef> = self.root_steps.iter().copied().collect();
        steps.extend(self.unacked_steps.keys().map(|&(job, step)| StepRef { job, step }));
        steps.sort();
        steps.dedup();
        steps
    }
}

/// The agent's job table: one [`Jobs`] behind one lock.
#[derive(Default)]
pub struct JobTable {
    jobs: Mutex<Jobs>,
    /// A job was set up (for [`JobTable::wait_for`]).
    changed: Notify,
    /// Steps started from their job's launch order, waiting for their `berth run`.
    pub attach: crate::ports::attach::Attachments,
}

impl JobTable {
    fn lock(&self) -> MutexGuard<'_, Jobs> {
        // Every change is a single assignment or insertion: a panic elsewhere while holding
        // the lock leaves the table consistent.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read or change the table (never across an `await`: `f` is synchronous).
    pub fn with<T>(&self, f: impl FnOnce(&mut Jobs) -> T) -> T {
        f(&mut self.lock())
    }

    /// The job is set up here: steps, tasks and signals find it from now on.
    pub fn insert(&self, job: Arc<JobHandle>) {
        self.lock().set_up.insert(job.spec.id, job);
        self.changed.notify_waiters();
    }

    pub fn remove(&self, id: JobId) {
        self.lock().set_up.remove(&id);
    }

    /// Every job set up here now.
    pub fn all(&self) -> Vec<Arc<JobHandle>> {
        self.lock().set_up.values().cloned().collect()
    }

    pub fn get(&self, id: JobId) -> Option<Arc<JobHandle>> {
        self.lock().set_up.get(&id).cloned()
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

    /// A step's control tree is rooted here from now until its end is reported.
    pub fn root_step_started(&self, job: JobId, step: u32) {
        self.lock().root_steps.insert(StepRef { job, step });
    }

    /// The step rooted here ended (its report is on its way, or it needs none).
    pub fn root_step_ended(&self, job: JobId, step: u32) {
        self.lock().root_steps.remove(&StepRef { job, step });
    }

    /// The kill channel of a job launched here and not ended.
    pub fn kill_sender(&self, id: JobId) -> Option<mpsc::UnboundedSender<String>> {
        self.lock().running.get(&id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeBackend;
    use crate::cgroup::JobLimits;

    fn handle(id: u64, cgroups: &FakeBackend) -> Arc<JobHandle> {
        let spec: LaunchSpec = serde_json::from_value(serde_json::json!({
            "id": id, "name": "t", "user": {"uid": 1, "gid": 1, "groups": [], "name": "u"},
            "env": [], "cwd": "/", "script": "", "stdout": "o", "stderr": "e",
            "allocation": {"node_id": 0, "node": "n", "cpus": "0", "cores": 1, "mems": "0", "memory_bytes": 1024},
            "nodes": [["n", 1]], "walltime_seconds": null, "kill_grace_ms": 0
        }))
        .unwrap();
        let cgroup = Arc::from(cgroups.create(&format!("job_{id}"), &JobLimits::default()).unwrap());
        Arc::new(JobHandle {
            suspension: Arc::new(Suspension::new(spec.allocation.clone())),
            spec,
            cgroup,
            spool: "/nonexistent".into(),
            cpuset_dir: "/nonexistent".into(),
            steps: Default::default(),
            tasks: Default::default(),
        })
    }

    #[tokio::test]
    async fn a_step_waits_for_its_job_to_be_set_up_and_no_longer_than_told() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = FakeBackend::new(dir.path());
        let table = Arc::new(JobTable::default());
        let waiting = tokio::spawn({
            let table = table.clone();
            async move { table.wait_for(JobId(7), Duration::from_secs(5)).await.map(|j| j.spec.id) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        table.insert(handle(7, &cgroups));
        assert_eq!(waiting.await.unwrap(), Some(JobId(7)));
        assert!(table.wait_for(JobId(8), Duration::from_millis(20)).await.is_none());
        assert_eq!(table.all().len(), 1);
        table.remove(JobId(7));
        assert!(table.get(JobId(7)).is_none());
    }

    #[test]
    fn open_steps_are_the_running_root_steps_and_the_unacknowledged_ends_once_each() {
        let table = JobTable::default();
        table.root_step_started(JobId(2), 1);
        table.root_step_started(JobId(1), 3);
        table.with(|jobs| {
            let end = AgentMessage::Heartbeat { running: vec![], seq: 0, steps: None };
            jobs.unacked_steps.insert((JobId(1), 3), end.clone());
            jobs.unacked_steps.insert((JobId(1), 2), end);
        });
        let steps = |t: &JobTable| t.with(|jobs| jobs.open_steps());
        let s = |job, step| StepRef { job: JobId(job), step };
        assert_eq!(steps(&table), [s(1, 2), s(1, 3), s(2, 1)]);
        table.root_step_ended(JobId(2), 1);
        table.with(|jobs| jobs.unacked_steps.remove(&(JobId(1), 2)));
        assert_eq!(steps(&table), [s(1, 3)]);
    }
}
