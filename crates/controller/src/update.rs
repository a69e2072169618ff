//! Changing jobs: `berth update` (`scontrol update`, `qalter`) and `berth requeue`
//! (`scontrol requeue`, `qrerun`).
//!
//! - **update** changes a pending (queued or held) job's walltime, size (cores, nodes, tasks
//!   per node, CPUs per task, tasks), queue, name and dependency, and, for admins, its
//!   priority. The changed job is checked exactly as a submission is (`check_fit`: limits,
//!   the queue's rules, its advance reservation, whether any node could ever hold it): a
//!   change it fails is refused with the reason, and nothing is changed. It is written with an
//!   `update` event in the batch's transaction (durable before the reply, which lists the jobs
//!   changed) and holds from the next scheduling pass.
//!   Of a running job only the walltime and the name (only shown) may change. Lowered (by
//!   its owner): its nodes enforce the walltime it started with, so the controller ends it
//!   at the lower one (`check_lowered_walltimes`); `--signal` still counts from the first.
//!   Raised (admins only, as Slurm; not an interactive allocation, whose client has its own
//!   clock): its nodes are told (`SetWalltime`, again when an agent registers).
//!   The id of an array changes every pending task of it (as `scontrol update JobId=A`), a
//!   task's own id that task; every task is checked before any is changed. Only the job's
//!   owner or an admin may change it; only an admin may set a priority, which then replaces
//!   the computed one (`policy::schedule`).
//! - **requeue** puts a running, suspended or ended batch job back in the queue, to run
//!   again from the start, as Slurm's: a running one through the node-failure path
//!   (`fault.rs`, `requeue`: killed on its nodes, its steps closed, its resources freed, a
//!   `requeue` event, which the requeue count of the failure policy counts); an ended one is
//!   read back from the store, its end and accounting forgotten. Interactive allocations are
//!   not requeued. A requeued job waits (`BeginTime`) until its previous run has ended on
//!   every node that was told to kill it (`OldRun`), so that no node is asked to run it while
//!   its old copy still ends there.

use crate::model::effect::Effect;
use crate::model::job::{JobRecord, OldRun};
use crate::model::request::{error, Peer};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::directives::Dependency;
use berth_core::job::{Allocation, JobState};
use berth_core::node::NodeState;
use berth_core::sched::reason::{BeginWait, PendingReason};
use berth_core::JobId;
use berth_protocol::agent::ControllerMessage;
use berth_protocol::client::{ApiError, ClientResponse, ErrorCode, IdResult, JobChange, MAX_IDS_PER_REQUEST};
use std::collections::HashSet;

/// How long a requeued job waits at most for its previous run's end to be reported (a node
/// that never reports it, nor fails, nor registers again, must not hold it for ever).
pub const OLD_RUN_PATIENCE_SECS: f64 = 300.0;

type Checked = Result<(JobRecord, Vec<String>), ApiError>;

impl Controller {
    /// `update`: see the module.
    /// `task_only`: `id` names one task (`A_i`), even its array's first.
    pub(crate) fn update_request(
        &mut self,
        (id, task_only): (JobId, bool),
        change: JobChange,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        if change.is_empty() {
            return Ok(error(
                ErrorCode::BadRequest,
                "nothing to change: give a walltime, cores, nodes, tasks per node, CPUs per task, tasks, queue, name, dependency or priority",
            ));
        }
        // The jobs it names: an array's id stands for its pending tasks.
        let members = if task_only { vec![] } else { self.array_tasks(id) };
        let array = !members.is_empty();
        let targets: Vec<JobId> = if array {
            members.iter().copied().filter(|t| self.jobs[t].state.is_pending()).collect()
        } else {
            vec![id]
        };
        let owner = match members.first().or(Some(&id)).and_then(|t| self.jobs.get(t)) {
            Some(j) => j.user.clone(),
            None => {
                return Ok(match self.ended_job(id)? {
                    Some(j) => error(
                        ErrorCode::InvalidState,
                        format!("job {id} has ended ({}); only pending jobs can be changed", j.state.as_str()),
                    ),
                    None => {
                        error(ErrorCode::UnknownJob, format!("job {id} does not exist; `berth jobs --all` lists jobs"))
                    }
                })
            }
        };
        let admin = self.is_admin(peer);
        if owner.uid != peer.user.uid && !admin {
            self.denied(peer, "update", Some(id), &owner.name, now)?;
            return Ok(error(
                ErrorCode::NotPermitted,
                format!("job {id} belongs to {}; you may only change your own jobs", owner.name),
            ));
        }
        if change.priority.is_some() && !admin {
            self.denied(peer, "set the priority of", Some(id), &owner.name, now)?;
            return Ok(error(ErrorCode::NotPermitted, "only admins may set a job's priority (config key `admins`)"));
        }
        if targets.is_empty() {
            return Ok(error(ErrorCode::InvalidState, format!("array {id} has no pending task to change")));
        }
        // Every job checked first: one refused, none changed. None may come to wait for a job
        // of this update, nor for its array.
        let mut own = members.clone();
        own.push(id);
        let mut changed = Vec::with_capacity(targets.len());
        for t in &targets {
            match self.changed(&self.jobs[t], &change, (&own, admin), now) {
                Ok(c) => changed.push(c),
                Err(e) if array => {
                    let message = format!("array {id}, task {t}: {}; nothing was changed", e.message);
                    return Ok(ClientResponse::Error(ApiError::new(e.code, message)));
                }
                Err(e) => return Ok(ClientResponse::Error(e)),
            }
        }
        // One result per job changed: ids only, so that the answer of a large array fits a frame.
        let mut results = Vec::with_capacity(changed.len());
        for (job, what) in changed {
            let effects = updated(&job, &what, &peer.user.name);
            self.queue(effects);
            tracing::info!(job = %job.id, "updated: {} (by {})", what.join(" "), peer.user.name);
            results.push(IdResult { id: job.id, ok: true, error: None });
            let raised = self.jobs.get(&job.id).is_some_and(|old| old.options.walltime != job.options.walltime);
            if raised && job.state.has_allocation() {
                self.send_walltime(&job);
            }
            self.jobs.insert(job.id, job);
        }
        self.dirty = true;
        Ok(ClientResponse::Done { results })
    }

    /// Job `job` as `change` makes it, checked as a submission is, and what changed (for the
    /// event); or why it cannot be. `own`: the jobs this update is about (the job, or its
    /// array's tasks), which its dependency may not lead back to; `admin`: the caller is one.
    fn changed(&self, job: &JobRecord, c: &JobChange, (own, admin): (&[JobId], bool), now: f64) -> Checked {
        let id = job.id;
        let bad = |m: String| ApiError::new(ErrorCode::BadRequest, m);
        let state = |m: String| ApiError::new(ErrorCode::InvalidState, m);
        let mut new = job.clone();
        let mut said = Vec::new();
        if let Some(name) = &c.name {
            let mut o = job.options.clone();
            o.name = Some(name.clone());
            self.cfg.limits.check_options(&o).map_err(|e| bad(e.to_string()))?;
            new.options.name = Some(name.clone());
            new.name = name.clone();
            said.push(format!("name={name}"));
        }
        if job.state.has_allocation() {
            let rest = JobChange { walltime: None, name: None, ..c.clone() };
            if !rest.is_empty() {
                return Err(state(format!(
                    "job {id} is {}: only its walltime (lowered) and name can be changed now",
                    job.state.as_str()
                )));
            }
            if let Some(w) = c.walltime {
                if let Some(current) = job.walltime.filter(|cur| w > *cur) {
                    if !admin {
                        return Err(ApiError::new(
                            ErrorCode::NotPermitted,
                            format!(
                                "job {id} is {}: only admins may raise its walltime (from {current} s to {w} s); you may lower it",
                                job.state.as_str()
                            ),
                        ));
                    }
                    if job.is_interactive() {
                        return Err(state(format!(
                            "job {id} is an interactive allocation: its walltime can only be lowered, from {current} s (asked for {w} s)"
                        )));
                    }
                }
                self.cfg.limits.check_walltime(w).map_err(|e| bad(e.to_string()))?;
                // `options.walltime` is what its nodes enforce: raised, they are told
                // (`update_request`); lowered, the controller ends it (`check_lowered_walltimes`).
                if job.options.walltime.is_some_and(|enforced| w > enforced) {
                    new.options.walltime = Some(w);
                }
                new.walltime = Some(w);
                said.push(format!("walltime={w}"));
            }
            return Ok((new, said));
        }
        if !job.state.is_pending() {
            return Err(state(format!("job {id} is {}; only pending jobs can be changed", job.state.as_str())));
        }
        // The queues of `berth run`'s allocations and of the reservations API are not queues
        // one may ask for; their jobs are not changed.
        if job.queue == crate::model::job::INTERACTIVE_QUEUE || job.queue == crate::model::job::RESERVATION_QUEUE {
            return Err(state(format!("job {id} is an interactive allocation; it cannot be changed")));
        }
        let mut o = job.options.clone();
        let mut resized = false;
        if let Some(n) = c.nodes {
            o.nodes = Some(n);
            resized = true;
            said.push(format!("nodes={n}"));
        }
        if let Some(n) = c.cores {
            // The job's size is now its cores (and its node count), no longer its tasks.
            o.cores = Some(n);
            if c.tasks_per_node.is_none() {
                o.tasks_per_node = None;
            }
            resized = true;
            said.push(format!("cores={n}"));
        }
        if let Some(n) = c.tasks_per_node {
            o.tasks_per_node = Some(n);
            if c.cores.is_none() {
                o.cores = None;
            }
            resized = true;
            said.push(format!("tasks_per_node={n}"));
        }
        if let Some(n) = c.cpus_per_task {
            o.cpus_per_task = Some(n);
            resized = true;
            said.push(format!("cpus_per_task={n}"));
        }
        if let Some(n) = c.tasks {
            if c.cores.is_some() || c.tasks_per_node.is_some() {
                return Err(bad("give the tasks, or the cores or tasks per node, not both".into()));
            }
            // As Slurm's `-n`: per node when the node count is known, else so many cores.
            match (o.nodes, o.tasks_per_node) {
                (Some(nodes), _) => {
                    o.tasks_per_node = Some(n.div_ceil(nodes));
                    o.cores = None;
                }
                (None, Some(per)) => {
                    o.nodes = Some(n.div_ceil(per));
                    o.cores = None;
                }
                (None, None) => {
                    o.cores =
                        Some(n.checked_mul(o.cpus_per_task.unwrap_or(1)).ok_or_else(|| bad("too many tasks".into()))?);
                }
            }
            resized = true;
            said.push(format!("tasks={n}"));
        }
        if resized {
            self.map_exclusive(&mut o).map_err(bad)?;
        }
        if let Some(q) = &c.queue {
            // A QOS named the queue at submission: the queue given now replaces it.
            o.queue = Some(q.clone());
            o.qos = None;
            new.queue = q.clone();
            said.push(format!("queue={q}"));
        }
        if let Some(d) = &c.dependency {
            o.dependency = match d.trim() {
                "" => None,
                text => Some(Dependency::parse_slurm(text).map_err(|e| bad(format!("--dependency: {e}")))?),
            };
            if let Some(dep) = &o.dependency {
                if self.reaches(dep, own) {
                    return Err(bad(format!(
                        "--dependency {dep}: job {id} would wait for itself (a circular dependency)"
                    )));
                }
            }
            self.check_depend_submission(&mut o, now)?;
            said.push(format!("dependency={}", o.dependency.as_ref().map(ToString::to_string).unwrap_or_default()));
        }
        if let Some(p) = c.priority {
            o.priority = Some(p);
            said.push(format!("priority={p}"));
        }
        // Checked below with the rest as at submission: bounds, then whether they can ever be had.
        if let Some(g) = &c.gres {
            berth_core::gres::check_node_config("--gres", g).map_err(|e| bad(e.to_string()))?;
            if g.keys().any(|k| berth_core::gres::split_key(k).0 == "gpu") {
                return Err(bad("--gres: GPUs are changed with --gpus, --gpus-per-node and --gpu-type".into()));
            }
            o.gres = (!g.is_empty()).then(|| g.clone());
            said.push(format!("gres={}", berth_core::gres::render(g)));
        }
        if let Some(l) = &c.licenses {
            berth_core::gres::check_config("--licenses", l).map_err(|e| bad(e.to_string()))?;
            o.licenses = (!l.is_empty()).then(|| l.clone());
            said.push(format!("licenses={}", berth_core::gres::render(l)));
        }
        if c.gpus.is_some() || c.gpus_per_node.is_some() {
            // The counts given replace the job's (`--gpus-per-socket`'s included); 0 removes
            // its GPUs, and with them its GPUs per task and binding.
            if c.gpus == Some(0) || c.gpus_per_node == Some(0) {
                if c.gpus.is_some_and(|n| n > 0) || c.gpus_per_node.is_some_and(|n| n > 0) {
                    return Err(
                        bad("--gpus 0 or --gpus-per-node 0 removes the job's GPUs; give no other count".into()),
                    );
                }
                (o.gpus_per_task, o.gpu_bind, o.gpu_type) = (None, None, None);
                (o.gpus, o.gpus_per_node) = (None, None);
                said.push("gpus=0".into());
            } else {
                (o.gpus, o.gpus_per_node) = (c.gpus, c.gpus_per_node);
                if let Some(n) = c.gpus {
                    said.push(format!("gpus={n}"));
                }
                if let Some(n) = c.gpus_per_node {
                    said.push(format!("gpus_per_node={n}"));
                }
            }
            (o.gpus_per_socket, o.sockets_per_node) = (None, None);
        }
        if let Some(t) = &c.gpu_type {
            // Checked (a valid name, and GPUs to be of it) with the rest below.
            o.gpu_type = Some(t.trim().to_string()).filter(|t| !t.is_empty());
            said.push(format!("gpu_type={}", t.trim()));
        }
        // The walltime asked for, else the job's; a new queue gives its default to a job that
        // has none, as at submission.
        let asked = c.walltime.or(job.walltime);
        let spec = self.cfg.queues.iter().find(|q| q.name == new.queue);
        let walltime = spec.and_then(|q| q.walltime_or_default(asked)).or(asked).or(self.cfg.default_walltime_secs());
        if let Some(w) = c.walltime {
            said.push(format!("walltime={w}"));
        }
        self.cfg.limits.check_options(&o).map_err(|e| bad(e.to_string()))?;
        self.check_fit(&o, &new.queue, walltime, &job.user, now)?;
        o.walltime = walltime;
        new.walltime = walltime;
        new.options = o;
        new.validate().map_err(bad)?;
        Ok((new, said))
    }

    /// Whether `dep` leads, through the dependencies of pending jobs, to one of `targets`.
    fn reaches(&self, dep: &Dependency, targets: &[JobId]) -> bool {
        let targets: HashSet<JobId> = targets.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut todo: Vec<JobId> = dep.job_ids().collect();
        while let Some(id) = todo.pop() {
            if targets.contains(&id) {
                return true;
            }
            if !seen.insert(id) || seen.len() > 10_000 {
                continue;
            }
            if let Some(d) =
                self.jobs.get(&id).filter(|j| j.state.is_pending()).and_then(|j| j.options.dependency.as_ref())
            {
                todo.extend(d.job_ids());
            }
        }
        false
    }

    /// Tell the nodes of `job` the walltime they enforce (`options.walltime`, raised by an
    /// admin); once more to an agent that registers again (it may have missed it).
    pub(crate) fn send_walltime(&mut self, job: &JobRecord) {
        let Some(walltime_seconds) = job.options.walltime else { return };
        for a in &job.allocation {
            self.send_to_node(a.node_id.0 as usize, ControllerMessage::SetWalltime { id: job.id, walltime_seconds });
        }
    }

    /// Running batch jobs whose walltime an update lowered below the one their nodes enforce
    /// (`options.walltime`), once it has passed (time suspended not counted): killed as at
    /// their walltime (`timeout`).
    pub fn check_lowered_walltimes(&mut self, now: f64) -> Result<(), StoreError> {
        let unlimited = self.cfg.scheduler.unlimited_walltime_secs as f64;
        let over: Vec<(JobId, Allocation)> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running && !j.is_interactive() && j.kill_sent.is_none())
            .filter(|j| j.walltime.is_some_and(|w| j.options.walltime.is_none_or(|given| w < given)))
            .filter(|j| j.suspension.since.is_none() && now >= j.expected_end(unlimited))
            .map(|j| (j.id, j.allocation.clone()))
            .collect();
        for (id, alloc) in over {
            if let Some(job) = self.jobs.get_mut(&id) {
                job.kill_sent = Some("walltime".into());
            }
            tracing::info!(job = %id, "the walltime it was lowered to has passed: killing it");
            self.queue([Effect::job_event("walltime", id, None, "lowered walltime reached: kill sent")]);
            // Sent directly: the tick's earlier checks carried out their own effects
            // (heartbeats, interactive ends), and the event above is a write, so no `Send`
            // decided before is overtaken.
            self.kill_on_nodes(id, &alloc, "walltime", None);
        }
        // The events are queued with the tick's effects: nothing after this reads them back.
        Ok(())
    }

    /// `requeue`: see the module. One result per id; an array's id requeues each of its
    /// tasks that started or ended (its pending ones are left as they are).
    pub(crate) fn requeue_request(
        &mut self,
        ids: Vec<JobId>,
        only: &[JobId],
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        if ids.len() > MAX_IDS_PER_REQUEST {
            return Ok(error(
                ErrorCode::BadRequest,
                format!(
                    "{} job ids in one request, more than the {MAX_IDS_PER_REQUEST} allowed; nothing was done",
                    ids.len()
                ),
            ));
        }
        let mut results = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = self.requeue_id(id, only.contains(&id), peer, now)?;
            results.push(match outcome {
                Ok(()) => IdResult { id, ok: true, error: None },
                Err(e) => IdResult { id, ok: false, error: Some(e) },
            });
        }
        Ok(ClientResponse::Done { results })
    }

    /// `task_only`: `id` names one task (`A_i`), even its array's first.
    fn requeue_id(
        &mut self,
        id: JobId,
        task_only: bool,
        peer: &Peer,
        now: f64,
    ) -> Result<Result<(), ApiError>, StoreError> {
        let tasks = if task_only { vec![] } else { self.array_ids(id)? };
        let Some(owner) = self.record(tasks.first().copied().unwrap_or(id))?.map(|j| j.user) else {
            return Ok(Err(ApiError::new(
                ErrorCode::UnknownJob,
                format!("job {id} does not exist; `berth jobs --all` lists jobs"),
            )));
        };
        if owner.uid != peer.user.uid && !self.is_admin(peer) {
            self.denied(peer, "requeue", Some(id), &owner.name, now)?;
            return Ok(Err(ApiError::new(
                ErrorCode::NotPermitted,
                format!("job {id} belongs to {}; you may only act on your own jobs", owner.name),
            )));
        }
        if tasks.is_empty() {
            return self.requeue_one(id, &peer.user.name, now);
        }
        let mut acted = 0;
        let mut failure = None;
        for t in tasks {
            if self.jobs.get(&t).is_some_and(|j| j.state.is_pending()) {
                continue;
            }
            acted += 1;
            if let Err(e) = self.requeue_one(t, &peer.user.name, now)? {
                failure.get_or_insert(e);
            }
        }
        if acted == 0 {
            failure =
                Some(ApiError::new(ErrorCode::InvalidState, format!("array {id} has no started task to requeue")));
        }
        Ok(failure.map_or(Ok(()), Err))
    }

    /// The task ids of array `id` (all of them, ended ones too), or none when `id` is no
    /// array's id.
    fn array_ids(&self, id: JobId) -> Result<Vec<JobId>, StoreError> {
        let in_memory = self.array_tasks(id);
        let task = match in_memory.first().and_then(|t| self.jobs.get(t)) {
            Some(j) => j.options.array_task,
            // No task in memory: `id` is a live job of its own, else an ended one.
            None => match self.jobs.get(&id) {
                Some(j) => j.options.array_task,
                None => self.ended_job(id)?.and_then(|j| j.options.array_task),
            },
        };
        Ok(match task.filter(|t| t.job == id.0) {
            Some(t) => (id.0..id.0.saturating_add(u64::from(t.count))).map(JobId).collect(),
            None => vec![],
        })
    }

    /// A job as it is now: in memory, else as the store has it.
    fn record(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        match self.jobs.get(&id) {
            Some(j) => Ok(Some(j.clone())),
            None => self.ended_job(id),
        }
    }

    fn requeue_one(&mut self, id: JobId, by: &str, now: f64) -> Result<Result<(), ApiError>, StoreError> {
        let state = |m: String| Ok(Err(ApiError::new(ErrorCode::InvalidState, m)));
        let why = format!("asked by {by}");
        if let Some(job) = self.jobs.get(&id) {
            if job.is_interactive() {
                return state(format!("job {id} is an interactive allocation; only batch jobs are requeued"));
            }
            if job.state.is_pending() {
                return state(format!("job {id} is {}; only started or ended jobs are requeued", job.state.as_str()));
            }
            if job.kill_sent.is_some() {
                return state(format!("job {id} is ending already; requeue it once it has ended"));
            }
            let node =
                Self::head_node(&job.allocation).map(|i| self.cluster.nodes()[i].name.clone()).unwrap_or_default();
            // The node-failure requeue (fault.rs): killed on its nodes, back in the queue.
            self.requeue(id, now, &node, &why, None)?;
            return Ok(Ok(()));
        }
        let Some(mut job) = self.ended_job(id)? else {
            return Ok(Err(ApiError::new(
                ErrorCode::UnknownJob,
                format!("job {id} does not exist; `berth jobs --all` lists jobs"),
            )));
        };
        if job.is_interactive() {
            return state(format!("job {id} was an interactive allocation; only batch jobs are requeued"));
        }
        // It enters memory again with what its earlier runs left: its requeues (this one
        // counted with them) and its last step id, read from its history once.
        let (requeues, last_step) = self.store.job_counts_of(id)?;
        self.counts.restore(id, requeues, last_step);
        self.counts.requeued(id);
        // Ended: back to the queue as it was submitted, its run forgotten.
        let effects = ended_requeued(&mut job, &why);
        self.queue(effects);
        crate::notify::notify(&self.cfg.notify, &job, crate::notify::Event::Requeue);
        self.policy.depend_mut().forget_ended(id);
        self.jobs.insert(id, job);
        self.dirty = true;
        Ok(Ok(()))
    }

    /// A requeued job's previous run (on `alloc`, but `except`) was told to end: the job
    /// waits until each of those nodes has reported it ended (`old_run_ended`), registered
    /// again without it, or is down. Kept in the store too: a restarted controller still waits.
    pub(crate) fn await_old_run(
        &mut self,
        id: JobId,
        alloc: &Allocation,
        except: Option<usize>,
        now: f64,
    ) -> Result<(), StoreError> {
        let nodes: Vec<usize> = alloc
            .iter()
            .map(|a| a.node_id.0 as usize)
            .filter(|n| Some(*n) != except && self.extra.get(*n).is_some_and(|e| e.state != NodeState::Down))
            .collect();
        if !nodes.is_empty() {
            self.queue([Effect::SaveOldRun { job: id, nodes: nodes.clone(), since: now }]);
            self.policy.depend_mut().await_old_run(id, OldRun { nodes, since: now });
        }
        // Carried out now: a registration that requeues a job (`reconcile_jobs_here`) then
        // queues orders directly, which must follow the kills queued here.
        self.carry_out_effects(now)
    }

    /// Node `node` reported job `id` ended while the job does not run there: if it is a
    /// requeued job's previous run, the job waits no more for that node. Once it has ended
    /// everywhere, what it used is forgotten: the job's accounting is of its last run.
    pub(crate) fn old_run_ended(&mut self, id: JobId, node: usize) {
        let pending = self.jobs.get(&id).is_some_and(|j| j.state.is_pending());
        let Some(w) = self.policy.depend_mut().old_run_mut(id) else { return };
        let (over, effects) = old_run_node_ended(id, w, node, pending);
        self.queue(effects);
        if over {
            self.policy.depend_mut().old_run_over(id);
            self.dirty = true;
        }
    }

    /// Node `node`'s agent registered, running `running` and reporting `ended`: a previous
    /// run it has neither of is over there.
    pub(crate) fn old_runs_on_register(&mut self, node: usize, running: &[JobId], ended: &[JobId]) {
        let gone: Vec<JobId> = self
            .policy
            .depend()
            .old_runs()
            .filter(|(id, w)| w.nodes.contains(&node) && !running.contains(id) && !ended.contains(id))
            .map(|(id, _)| id)
            .collect();
        for id in gone {
            self.old_run_ended(id, node);
        }
    }

    /// The requeued jobs still waiting for their previous run to end, with the reason shown
    /// (`BeginTime`, as a requeued job in Slurm). Down nodes wait no more (their jobs are
    /// handled as lost; a node back is clean before it takes work), nor waits that lasted
    /// `OLD_RUN_PATIENCE_SECS`.
    pub(crate) fn old_runs_waited_for(&mut self, now: f64) -> Result<Vec<(JobId, PendingReason)>, StoreError> {
        let (jobs, extra) = (&self.jobs, &self.extra);
        let mut over = Vec::new();
        self.policy.depend_mut().keep_old_runs(|id, w| {
            w.nodes.retain(|n| extra.get(*n).is_some_and(|e| e.state != NodeState::Down));
            let patient = now - w.since < OLD_RUN_PATIENCE_SECS;
            if !patient {
                tracing::warn!(job = %id, nodes = ?w.nodes, "no end of the requeued job's previous run reported: it may start again");
            }
            let waits = patient && !w.nodes.is_empty() && jobs.get(&id).is_some_and(|j| j.state.is_pending());
            if !waits {
                over.push(id);
            }
            waits
        });
        self.queue(over.into_iter().map(|job| Effect::ForgetOldRun { job }));
        let mut out: Vec<(JobId, PendingReason)> = self
            .policy
            .depend()
            .old_runs()
            .map(|(id, w)| {
                let names: Vec<String> =
                    w.nodes.iter().filter_map(|n| self.cluster.nodes().get(*n)).map(|c| c.name.clone()).collect();
                (id, PendingReason::BeginTime(BeginWait::OldRun(names)))
            })
            .collect();
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }
}

/// Job `job` changed by `berth update` (`what` changed, by user `by`): its row rewritten, then
/// the event `update` saying what and by whom. Needs no store.
pub(crate) fn updated(job: &JobRecord, what: &[String], by: &str) -> Vec<Effect> {
    let detail = format!("{} (by {by})", what.join(" "));
    vec![Effect::RewriteJob(Box::new(job.clone())), Effect::job_event("update", job.id, None, detail)]
}

/// Ended job `job` requeued (`why`: by whom): back in the queue as it was submitted, its run
/// forgotten (end, allocation, usage, suspensions), its reason saying so; then its row, its
/// suspensions, its run's usage forgotten and the event `requeue`. Needs no store.
pub(crate) fn ended_requeued(job: &mut JobRecord, why: &str) -> Vec<Effect> {
    job.state = JobState::Queued;
    job.start_time = None;
    job.end_time = None;
    job.exit_code = None;
    job.signal = None;
    job.allocation = vec![];
    job.usage = None;
    job.kill_sent = None;
    job.suspension = Default::default();
    job.reason = Some(format!("requeued: {why}"));
    vec![
        Effect::UpdateJob(Box::new(job.clone())),
        Effect::SaveSuspension { job: job.id, suspension: job.suspension.clone() },
        Effect::ForgetRun { job: job.id },
        Effect::job_event("requeue", job.id, None, why),
    ]
}

/// Node `node` reported the previous run of requeued job `id` (its wait `w`) ended: the wait as
/// it is now; once no node is left, the wait is over (`true`) and forgotten, and so is what
/// the run used while the job is pending (`pending`: its accounting is of its last run).
/// Needs no store.
pub(crate) fn old_run_node_ended(id: JobId, w: &mut OldRun, node: usize, pending: bool) -> (bool, Vec<Effect>) {
    w.nodes.retain(|n| *n != node);
    if !w.nodes.is_empty() {
        return (false, vec![Effect::SaveOldRun { job: id, nodes: w.nodes.clone(), since: w.since }]);
    }
    let mut effects = vec![Effect::ForgetOldRun { job: id }];
    if pending {
        effects.push(Effect::ForgetRun { job: id });
    }
    (true, effects)
}

#[cfg(test)]
mod effect_tests;
#[cfg(test)]
mod tests;
