//! A running job's way on its nodes: its start (written, then `Launch` to every node of its
//! allocation), the launch orders, kills, and its end (steps closed, what is left of it
//! killed, its resources freed, dropped from memory).

use crate::model::effect::Effect;
use crate::model::job::JobRecord;
use crate::state::{Controller, NodeExtra};
use crate::store::StoreError;
use berth_core::job::{Allocation, JobState, NodeAllocation};
use berth_core::node::NodeState;
use berth_core::sched::ClusterState;
use berth_core::JobId;
use berth_protocol::agent::{ControllerMessage, LaunchSpec};

impl Controller {
    /// Release a running job's resources and drop it from memory after it is finished and
    /// written to the store. The rows of nodes it leaves drained ([`drained`]) are queued
    /// with the command's effects.
    pub fn retire(&mut self, id: JobId) {
        if let Some(job) = self.jobs.remove(&id) {
            if let Some(event) = crate::notify::end_event(&job) {
                crate::notify::notify(&self.cfg.notify, &job, event);
            }
            if !job.allocation.is_empty() {
                // A job that ended suspended gave its PUs back when it was suspended.
                crate::model::suspension::release(&mut self.cluster, &job.allocation, job.suspension.since.is_some());
                let jobs = &self.jobs;
                let busy = |n: usize| jobs.values().any(|j| j.state.has_allocation() && j.on_node(n));
                let effects = drained(&job.allocation, &mut self.extra, busy);
                self.queue(effects);
            }
            self.policy.forget(id);
            self.cgroups.forget(id);
            self.steps.end_all_of(id);
            self.counts.forget(id);
            self.dirty = true;
        }
    }

    /// Start job `id` on `alloc` (the round's decision), by [`started`]; the hook told, and
    /// `Launch` to every node of its allocation queued behind its row and event.
    pub(crate) fn start(&mut self, id: JobId, alloc: Allocation, now: f64) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let effects = started(job, &mut self.cluster, alloc, now);
        crate::notify::notify(&self.cfg.notify, job, crate::notify::Event::Begin);
        self.queue(effects);
        let orders = self.launch_orders(id).into_iter().map(|(node, msg)| Effect::Send { node, msg });
        self.queue(orders.collect::<Vec<_>>());
    }

    /// What node `k` (index in the allocation) of a running job is told to launch.
    pub fn launch_spec(&self, job: &JobRecord, k: usize) -> LaunchSpec {
        // `berth run` and friends inside the job find this controller.
        let mut env: Vec<(String, String)> = job.env.iter().filter(|(k, _)| k != "BERTH_SOCKET").cloned().collect();
        env.push(("BERTH_SOCKET".into(), self.cfg.socket.display().to_string()));
        crate::array::environment(job, self.cfg.compat.environment, &mut env);
        LaunchSpec {
            id: job.id,
            name: job.name.clone(),
            user: job.user.clone(),
            env,
            cwd: job.cwd.clone(),
            script: job.script.to_string(),
            stdout: output_at_start(job, &job.stdout),
            stderr: output_at_start(job, &job.stderr),
            allocation: job.allocation[k].clone(),
            nodes: job.allocation.iter().map(|a| (a.node.clone(), a.cores)).collect(),
            walltime_seconds: job.walltime,
            head: k == 0 && !job.is_interactive(),
            addresses: job.allocation.iter().map(|a| self.agent_address(a.node_id.0 as usize)).collect(),
            kill_grace_ms: self.kill_grace_ms(),
            binding_mode: job.options.binding.as_ref().map(|_| job.options.binding_mode.unwrap_or_default()),
            rankfile: job.options.binding.as_ref().map(|_| berth_core::placement::ranks::rankfile(&job.allocation)),
            step: None,
            umask: job.options.umask,
            pids_max: self.cfg.limits.pids_max(job.allocation[k].cores),
            fence: self.cfg.lease().is_some() && self.requeued_if_lost(job, k),
            compat: self.cfg.compat.environment.then(|| berth_protocol::agent::CompatEnv {
                cpus_per_task: job.options.cpus_per_task,
                // An --exclusive job's own (its options hold whole nodes).
                tasks_per_node: job.options.tasks.map_or(job.options.tasks_per_node, |t| t.per_node),
                queue: job.queue.clone(),
                tasks: job.options.tasks,
            }),
            workdir: job.options.chdir.clone(),
            early_signal: job.options.signal.clone(),
            open_append: job.options.open_append.unwrap_or(false),
            node_gpus: if job.allocation.iter().any(|a| !a.gpus.is_empty()) {
                job.allocation.iter().map(|a| a.gpus.clone()).collect()
            } else {
                vec![]
            },
        }
    }

    /// Whether losing node `k` of the job's allocation would requeue the job (the failure
    /// policy, crate::fault, without its count of earlier requeues: past it the job fails,
    /// and a fenced copy is ended all the same).
    fn requeued_if_lost(&self, job: &JobRecord, k: usize) -> bool {
        matches!(crate::fault::failure_action(job, k == 0, 0, &self.cfg.fault), crate::fault::FailureAction::Requeue)
    }

    pub fn kill_grace_ms(&self) -> u64 {
        (self.cfg.kill_grace_secs * 1000.0) as u64
    }

    /// Send a running job's launch to every node of its allocation (the first one runs the
    /// batch script; the others hold the job's cgroup for its steps).
    pub fn launch_all(&mut self, id: JobId) {
        for (node, msg) in self.launch_orders(id) {
            self.send_to_node(node, msg);
        }
    }

    /// `Launch` for each node of running job `id`'s allocation, by node index.
    fn launch_orders(&self, id: JobId) -> Vec<(usize, ControllerMessage)> {
        let Some(job) = self.jobs.get(&id) else { return vec![] };
        (0..job.allocation.len())
            .map(|k| {
                (job.allocation[k].node_id.0 as usize, ControllerMessage::Launch(Box::new(self.launch_spec(job, k))))
            })
            .collect()
    }

    /// Send a kill for job `id` to every node of `alloc` but `except`.
    pub fn kill_on_nodes(&mut self, id: JobId, alloc: &Allocation, reason: &str, except: Option<usize>) {
        for a in alloc {
            let n = a.node_id.0 as usize;
            if Some(n) != except {
                self.send_to_node(n, ControllerMessage::Kill { id, reason: reason.to_string() });
            }
        }
    }

    /// A running job has been finished (state, end written): its steps closed and what is
    /// left of it killed on its nodes (by [`ended`]), its resources freed; written and queued
    /// before this returns.
    pub fn end_running(
        &mut self,
        id: JobId,
        now: f64,
        kill_reason: &str,
        except: Option<usize>,
    ) -> Result<(), StoreError> {
        let effects = ended(id, self.jobs.get(&id).map(|j| j.allocation.as_slice()), now, kill_reason, except);
        self.queue(effects);
        self.retire(id);
        // Carried out now: callers then ack the end with `send_to_node` directly (`handle_agent`,
        // `EndAck`), which must follow the kills queued here.
        self.carry_out_effects(now)
    }
}

/// Running job `id` (on `alloc`, when it is in memory) ended at `now`: its open steps close,
/// then every node of it but `except` (the node that reported its end) is told to kill what is
/// left of it.
pub(crate) fn ended(
    id: JobId,
    alloc: Option<&[NodeAllocation]>,
    now: f64,
    kill_reason: &str,
    except: Option<usize>,
) -> Vec<Effect> {
    let mut effects = vec![Effect::CloseSteps { job: id, time: now, failure: "job ended".into() }];
    let nodes = alloc.unwrap_or_default().iter().map(|a| a.node_id.0 as usize);
    effects.extend(
        nodes
            .filter(|n| Some(*n) != except)
            .map(|node| Effect::Send { node, msg: ControllerMessage::Kill { id, reason: kill_reason.to_string() } }),
    );
    effects
}

/// A job on `alloc` ended and left memory: each node of it that was draining and runs nothing
/// now (`busy` says whether a node still runs a job) is drained, and its row written.
pub(crate) fn drained(alloc: &Allocation, extra: &mut [NodeExtra], busy: impl Fn(usize) -> bool) -> Vec<Effect> {
    let mut effects = Vec::new();
    for a in alloc {
        let n = a.node_id.0 as usize;
        if let Some(e) = extra.get_mut(n).filter(|e| e.state == NodeState::Draining) {
            if !busy(n) {
                e.state = NodeState::Drained;
                effects.push(Effect::UpsertNode { node: n });
            }
        }
    }
    effects
}

/// An output path with `%N`, `%n`, `%t` (and the rest) expanded now that the job has nodes;
/// other paths were expanded when the job was accepted.
fn output_at_start(job: &JobRecord, path: &str) -> String {
    match job.allocation.first() {
        Some(first) if berth_core::directives::extra::has_node_patterns(path) => {
            berth_core::directives::extra::expand_at_start(
                path,
                job.id.0,
                &job.name,
                &job.user.name,
                job.options.array_task.as_ref(),
                &first.node,
            )
        }
        _ => path.to_string(),
    }
}

/// Queued `job` starts at `now` on `alloc`: claimed on `cluster`, running; its row, then the
/// event (on its first node), to write in that order. Needs no store.
pub(crate) fn started(job: &mut JobRecord, cluster: &mut ClusterState, alloc: Allocation, now: f64) -> Vec<Effect> {
    cluster.claim(&alloc);
    job.state = JobState::Running;
    job.start_time = Some(now);
    job.allocation = alloc;
    job.reason = None;
    let head = job.allocation.first().map(|a| a.node.as_str());
    vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("start", job.id, head, "")]
}

#[cfg(test)]
mod effect_tests;
