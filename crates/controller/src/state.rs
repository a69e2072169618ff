//! The controller's in-memory state, rebuilt from the store at start, and the scheduling step.

use crate::clock::{Clock, SystemClock};
use crate::config::ControllerConfig;
use crate::model::advance::AdvanceBook;
use crate::model::alloc::AllocHolders;
use crate::model::cgroups::JobCgroups;
use crate::model::counts::JobCounts;
use crate::model::effect::Effect;
use crate::model::ids::{JobIds, JOB_ID_BOUND};
use crate::model::job::{JobRecord, OldRun};
use crate::model::node_settings::{admin_down_key, key, NodeSettings};
use crate::model::policy::PolicyState;
use crate::model::reservation::Reservations;
use crate::model::step::{LiveStep, LiveSteps};
use crate::store::{NodeRow, Store, StoreError};
use berth_core::hierarchy::Hierarchy;
use berth_core::job::{Allocation, JobState};
use berth_core::node::{NodeCapacity, NodeState};
use berth_core::sched::ClusterState;
use berth_core::topology::Topology;
use berth_core::{CpuSet, JobId, NodeId};
use berth_protocol::agent::ControllerMessage;
use berth_protocol::client::ClientResponse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

mod features;

pub type AgentTx = mpsc::UnboundedSender<ControllerMessage>;

/// What the controller knows of a node beyond its capacity.
pub struct NodeExtra {
    pub state: NodeState,
    pub address: String,
    pub real_cpus: String,
    pub instance: String,
    /// The live connection to the node's agent, with its id.
    conn: Option<(u64, AgentTx)>,
    last_heard: Instant,
    /// Why an admin took the node down (`berth node down`), until `berth node up`: it stays
    /// down when its agent registers again. Kept in the store's `meta` table too (across
    /// restarts: restored at load), read from here.
    admin_down: Option<String>,
}

impl NodeExtra {
    /// A node in `state` whose agent is not connected, last heard from `heard`, not taken
    /// down by an admin.
    pub fn new(state: NodeState, address: String, real_cpus: String, instance: String, heard: Instant) -> Self {
        NodeExtra { state, address, real_cpus, instance, conn: None, last_heard: heard, admin_down: None }
    }

    /// Whether the node's agent ever registered (its instance known, kept across restarts).
    pub fn ever_registered(&self) -> bool {
        !self.instance.is_empty()
    }

    /// Whether the node's agent is connected.
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Whether the node takes work: up, with its agent connected.
    pub fn usable(&self) -> bool {
        self.state == NodeState::Up && self.connected()
    }

    /// Whether `conn_id` is the agent's live connection (not one replaced since).
    pub fn is_connection(&self, conn_id: u64) -> bool {
        self.connection_id() == Some(conn_id)
    }

    /// The id of the agent's live connection, if connected.
    pub fn connection_id(&self) -> Option<u64> {
        self.conn.as_ref().map(|c| c.0)
    }

    /// Where to send the agent messages, if connected.
    pub fn agent(&self) -> Option<&AgentTx> {
        self.conn.as_ref().map(|c| &c.1)
    }

    /// The agent connected as `conn_id`, sending on `tx`, heard from `at` (replacing any
    /// connection before).
    pub fn connect(&mut self, conn_id: u64, tx: AgentTx, at: Instant) {
        self.conn = Some((conn_id, tx));
        self.last_heard = at;
    }

    /// The agent's connection is gone.
    pub fn disconnect(&mut self) {
        self.conn = None;
    }

    /// When the agent was last heard from.
    pub fn last_heard(&self) -> Instant {
        self.last_heard
    }

    /// The agent was heard from at `at`.
    pub fn heard(&mut self, at: Instant) {
        self.last_heard = at;
    }

    /// Why an admin took the node down, if one did (until `berth node up`).
    pub fn admin_down(&self) -> Option<&str> {
        self.admin_down.as_deref()
    }

    /// An admin took the node down (`berth node down`) for `reason`, or (None) let it up.
    pub fn set_admin_down(&mut self, reason: Option<String>) {
        self.admin_down = reason;
    }
}

/// Messages to send once the current batch is committed.
#[derive(Default)]
pub struct Outbox {
    pub replies: Vec<(oneshot::Sender<ClientResponse>, ClientResponse)>,
    pub agents: Vec<(AgentTx, ControllerMessage)>,
    /// Writes decided by the last command, carried out before the next
    /// (`Controller::carry_out_effects`).
    pub effects: Vec<Effect>,
}

pub struct Controller {
    pub(crate) cfg: ControllerConfig,
    pub(crate) store: Store,
    /// Queued, held and running jobs. Finished jobs live only in the store.
    pub(crate) jobs: BTreeMap<JobId, JobRecord>,
    /// Capacity per node, indexed by node id.
    pub(crate) cluster: ClusterState,
    pub(crate) extra: Vec<NodeExtra>,
    /// The job ids given and reserved (`crate::model::ids`): a restarted controller starts
    /// above every reserved id, so an id an agent may have heard of is never given again.
    pub(crate) ids: JobIds,
    /// The interconnect tree nodes are placed in.
    pub(crate) hierarchy: Hierarchy,
    /// What the agents report of each running job's cgroups, per node.
    pub(crate) cgroups: JobCgroups,
    /// Steps (`berth run`) that have not ended, per running job.
    pub(crate) steps: LiveSteps,
    /// Each live job's requeues and last step id (`crate::model::counts`): the failure
    /// policy's limit and the next step's id decided from memory.
    pub(crate) counts: JobCounts,
    /// Something changed that may let a job start.
    pub(crate) dirty: bool,
    pub(crate) out: Outbox,
    /// Fair share, priorities and expected starts (see `policy`).
    pub(crate) policy: PolicyState,
    /// Reservations of the reservations API (see `reservations`).
    pub(crate) reservations: Reservations,
    /// The cluster key step grants are signed with (set by `serve`; without it grants are
    /// unsigned and agents refuse them).
    pub(crate) key: Option<std::sync::Arc<berth_protocol::auth::ClusterKey>>,
    /// Set while the store cannot be written (disk full, database locked): reported by
    /// `Ping` (`berth status`); see server.rs, `run_actor`.
    pub(crate) store_health: Option<berth_protocol::client::StoreHealth>,
    /// The client connection holding each allocation of `berth alloc` (see `alloc`), and the
    /// window after a start for holders to come back (`crate::model::alloc`).
    pub(crate) alloc_holders: AllocHolders,
    /// Where time comes from (`crate::clock`): the system's, or a fake one in unit tests.
    pub(crate) clock: Arc<dyn Clock>,
}

impl Controller {
    /// Rebuild the state from the store, on the system's clock.
    pub fn load(cfg: ControllerConfig, store: Store) -> Result<Self, StoreError> {
        Self::load_with_clock(cfg, store, Arc::new(SystemClock))
    }

    /// Rebuild the state from the store, reading time from `clock`.
    pub fn load_with_clock(cfg: ControllerConfig, store: Store, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let mut c = Controller {
            cfg: cfg.clone(),
            ids: JobIds::starting_at(0),
            store,
            jobs: BTreeMap::new(),
            cluster: ClusterState::from_parts(
                vec![],
                cfg.placement.clone(),
                berth_core::gres::Licenses::new(cfg.licenses.clone()),
            ),
            hierarchy: cfg.hierarchy().unwrap_or_default(),
            cgroups: JobCgroups::default(),
            steps: LiveSteps::default(),
            counts: JobCounts::default(),
            extra: Vec::new(),
            dirty: true,
            out: Outbox::default(),
            policy: Default::default(),
            reservations: Default::default(),
            key: None,
            store_health: None,
            alloc_holders: AllocHolders::default(),
            clock,
        };
        let reserved = c.store.get_meta(JOB_ID_BOUND)?.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        c.ids = JobIds::starting_at((c.store.max_job_id()? + 1).max(reserved));
        c.policy.restore_usage(c.store.load_fair_share(cfg.fair_share.clone())?);
        for row in c.store.load_nodes()? {
            let Ok(topology) = serde_json::from_str::<Topology>(&row.topology) else {
                tracing::warn!(node = %row.name, "stored topology unreadable; the node must re-register");
                continue;
            };
            let id = row.id as usize;
            // Node ids are dense; fill any hole with a placeholder that never takes work.
            while c.cluster.nodes().len() < id {
                let hole = c.cluster.nodes().len() as u32;
                c.push_node(
                    NodeId(hole),
                    format!("(missing-{hole})"),
                    Topology::uniform(1, 1, 1, 1, 0),
                    NodeState::Down,
                    "",
                    "",
                    "",
                );
            }
            let state = NodeState::parse(&row.state).unwrap_or(NodeState::Down);
            c.push_node(NodeId(row.id), row.name, topology, state, &row.address, &row.real_cpus, &row.instance);
        }
        // Once for all loaded nodes: building blocks and the order depend on every node.
        c.nodes_changed();
        for (cap, ex) in c.cluster.nodes().iter().zip(c.extra.iter_mut()) {
            ex.admin_down = c.store.get_meta(&admin_down_key(&cap.name))?;
        }
        for job in c.store.load_active_jobs()? {
            match job.state {
                JobState::Running => c.cluster.claim(&job.allocation),
                // A suspended job's PUs are free; its memory stays claimed.
                JobState::Suspended => crate::model::suspension::claim_memory(&mut c.cluster, &job.allocation),
                _ => {}
            }
            c.jobs.insert(job.id, job);
        }
        c.counts = c.store.job_counts()?;
        c.reservations = Reservations::load(&c.store)?;
        *c.policy.advance_mut() = AdvanceBook::load(&c.store)?;
        c.load_old_runs()?;
        // Steps still open hold their cores again; those of jobs that are not running are closed.
        let now = c.clock.unix();
        for row in c.store.live_steps()? {
            if c.jobs.get(&row.job).is_some_and(|j| j.state.has_allocation()) {
                c.steps.add(
                    row.job,
                    LiveStep {
                        step: row.step,
                        uid: row.uid,
                        user: row.user,
                        claims: row.claims,
                        nodes: row.nodes,
                        conn: None,
                        interactive: row.interactive,
                        granted_at: row.start_time,
                    },
                );
            } else {
                c.store.close_steps(row.job, now, "job ended")?;
            }
        }
        Ok(c)
    }

    /// The state as the store holds it, after a batch was rolled back (its writes failed:
    /// server.rs, `run_actor`). The in-memory changes the batch made are undone by reading
    /// everything back, as a restarted controller would; what lives only in memory and was
    /// true before the batch is carried over: the agents' connections and when each was last
    /// heard, the jobs' cgroup reports and kills sent, the steps' client connections, the
    /// cluster key and the store's health. Nothing of the batch left this process (its
    /// replies and orders are dropped by the caller), so agents and clients agree with it.
    pub fn reload(self) -> Result<Controller, StoreError> {
        let Controller {
            cfg,
            store,
            jobs,
            cluster,
            extra,
            cgroups,
            steps,
            key,
            store_health,
            alloc_holders,
            clock,
            ..
        } = self;
        let mut c = Controller::load_with_clock(cfg, store, clock)?;
        c.alloc_holders = alloc_holders;
        c.key = key;
        c.store_health = store_health;
        let old: HashMap<&str, &NodeExtra> = cluster.nodes().iter().map(|n| n.name.as_str()).zip(&extra).collect();
        for (cap, ex) in c.cluster.nodes().iter().zip(c.extra.iter_mut()) {
            if let Some(o) = old.get(cap.name.as_str()) {
                ex.conn = o.conn.clone();
                ex.last_heard = o.last_heard;
            }
        }
        for (id, job) in c.jobs.iter_mut() {
            if let Some(o) = jobs.get(id) {
                job.kill_sent = o.kill_sent.clone();
            }
        }
        c.cgroups = cgroups;
        c.cgroups.keep_only(|id| c.jobs.contains_key(&id));
        c.steps.keep_connections(&steps);
        Ok(c)
    }

    /// At start: the waits a previous controller recorded (see [`Controller::await_old_run`]).
    pub(crate) fn load_old_runs(&mut self) -> Result<(), StoreError> {
        self.store.init_old_runs()?;
        for (id, nodes, since) in self.store.load_old_runs()? {
            self.policy.depend_mut().await_old_run(id, OldRun { nodes, since });
        }
        Ok(())
    }

    /// Config defaults, then what an admin set for this node.
    pub fn apply_admin_settings(&self, cap: &mut NodeCapacity) {
        let all = cap.topology.all_pus();
        cap.system_pus = self.cfg.system_cpu_set().iter().filter(|&p| all.contains(p)).collect();
        cap.set_subnode_size(self.cfg.subnode_numa as usize);
        cap.set_gres(self.cfg.gres_of(&cap.name));
        let stored = self.store.get_meta(&key(&cap.name)).ok().flatten();
        if let Some(s) = stored.and_then(|t| serde_json::from_str::<NodeSettings>(&t).ok()) {
            if let Some(list) = s.system_cpus.and_then(|l| CpuSet::parse_list(&l).ok()) {
                cap.system_pus = list.iter().filter(|&p| all.contains(p)).collect();
            }
            for (sub, (state, props)) in cap.subnodes.iter_mut().zip(s.subnodes) {
                sub.state = state;
                sub.properties = props;
            }
        }
        cap.refresh();
    }

    #[allow(clippy::too_many_arguments)]
    pub fn push_node(
        &mut self,
        id: NodeId,
        name: String,
        topology: Topology,
        state: NodeState,
        address: &str,
        real_cpus: &str,
        instance: &str,
    ) {
        // Nodes of the same hardware share one topology (placement fits each kind once).
        let topology = berth_core::node::shared_topology(self.cluster.nodes(), topology);
        let mut cap = NodeCapacity::new(id, name, topology);
        self.apply_admin_settings(&mut cap);
        self.cluster.push(cap);
        let heard = self.clock.instant();
        self.extra.push(NodeExtra::new(state, address.to_string(), real_cpus.to_string(), instance.to_string(), heard));
    }

    pub fn node_row(&self, id: usize) -> NodeRow {
        let cap = &self.cluster.nodes()[id];
        let ex = &self.extra[id];
        NodeRow {
            id: id as u32,
            name: cap.name.clone(),
            state: ex.state.as_str().to_string(),
            address: ex.address.clone(),
            topology: serde_json::to_string(&*cap.topology).unwrap_or_default(),
            real_cpus: ex.real_cpus.clone(),
            instance: ex.instance.clone(),
        }
    }

    pub fn node_by_name(&self, name: &str) -> Option<usize> {
        self.cluster.nodes().iter().position(|n| n.name == name)
    }

    /// Node indexes in the cluster's node order: the config's `[interconnect] order`, then
    /// names in natural order; never registration order. The one order nodes are listed in,
    /// grouped into blocks, tried by placement and listed in a job's allocation (core's
    /// `ClusterState::arrange`, kept by `nodes_changed`).
    pub fn nodes_in_order(&self) -> Vec<usize> {
        self.cluster.in_order()
    }

    /// After nodes were added or replaced: their interconnect locations and the cluster's node
    /// order follow the whole set of nodes again.
    pub fn nodes_changed(&mut self) {
        self.cluster.update_nodes(|nodes| self.hierarchy.locate_all(nodes));
        // The config was checked at start (`node_order` is valid there); natural order else.
        self.cluster.arrange(&self.cfg.node_order().unwrap_or_default());
    }

    /// Running (or suspended) jobs whose allocation includes node `id`.
    pub fn jobs_on_node(&self, id: usize) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| j.state.has_allocation() && j.allocation.iter().any(|a| a.node_id.0 as usize == id))
            .map(|j| j.id)
            .collect()
    }

    pub fn reply(&mut self, tx: oneshot::Sender<ClientResponse>, r: ClientResponse) {
        self.out.replies.push((tx, r));
    }

    /// Whether node `id`'s agent ever registered (a node that did is judged as if up when a
    /// request is checked for whether it can ever be placed: a down node may return).
    pub fn ever_registered(&self, id: usize) -> bool {
        self.extra.get(id).is_some_and(NodeExtra::ever_registered)
    }

    /// The address node `id`'s agent listens on (empty when the node is unknown).
    pub fn agent_address(&self, id: usize) -> String {
        self.extra.get(id).map(|e| e.address.clone()).unwrap_or_default()
    }

    /// Queue a message to node `id`'s agent, if it is connected.
    pub fn send_to_node(&mut self, id: usize, msg: ControllerMessage) -> bool {
        match self.extra.get(id).and_then(NodeExtra::agent) {
            Some(tx) => {
                self.out.agents.push((tx.clone(), msg));
                true
            }
            None => false,
        }
    }

    /// Queue effects a feature decided: carried out in order after the command, or sooner when
    /// a feature calls [`Self::carry_out_effects`] itself (`crate::model::effect`'s docs say
    /// when that matters).
    pub fn queue(&mut self, effects: impl IntoIterator<Item = Effect>) {
        self.out.effects.extend(effects);
    }

    /// Carry out the effects decided so far, in order: written in the batch's transaction, the
    /// orders queued behind the writes (the server loop calls this after each command).
    pub fn carry_out_effects(&mut self, now: f64) -> Result<(), StoreError> {
        for effect in std::mem::take(&mut self.out.effects) {
            match effect {
                Effect::SetMeta { key, value } => self.store.set_meta(&key, &value)?,
                Effect::DeleteMeta { key } => self.store.delete_meta(&key)?,
                Effect::Event { kind, job, node, detail } => {
                    self.store.event(now, &kind, job, node.as_deref(), &detail)?
                }
                Effect::Reschedule => self.dirty = true,
                Effect::InsertJob(job) => self.store.insert_job(&job)?,
                Effect::InsertArray { template, first, tasks } => self.store.insert_array(&template, first, &tasks)?,
                Effect::UpdateJob(job) => self.store.update_job(&job)?,
                Effect::RewriteJob(job) => self.store.rewrite_job(&job)?,
                Effect::ForgetRun { job } => self.store.forget_run(job)?,
                Effect::SaveOldRun { job, nodes, since } => self.store.save_old_run(job, &nodes, since)?,
                Effect::ForgetOldRun { job } => self.store.forget_old_run(job)?,
                Effect::AddMemberUsage { job, node, usage, to_accounting } => {
                    if self.store.add_member_usage(job, &node, &usage)? && to_accounting {
                        self.store.add_to_accounting(job, &usage)?;
                    }
                }
                Effect::InsertAccounting(job) => self.store.insert_accounting(&job)?,
                Effect::SaveSuspension { job, suspension } => self.store.save_suspension(job, &suspension)?,
                Effect::UpsertNode { node } => {
                    if node < self.cluster.nodes().len() {
                        self.store.upsert_node(&self.node_row(node))?
                    }
                }
                Effect::InsertStep(row) => self.store.insert_step(&row)?,
                Effect::EndStep { job, step, time, exit_code, failure } => {
                    self.store.end_step(job, step, time, exit_code, failure.as_deref())?
                }
                Effect::CloseSteps { job, time, failure } => self.store.close_steps(job, time, &failure)?,
                Effect::SaveAdvance(r) => self.store.save_advance(&r)?,
                Effect::DeleteAdvance { name } => self.store.delete_advance(&name)?,
                Effect::SaveReservation(r) => self.store.save_reservation(&r)?,
                Effect::SaveFairShare(share) => self.store.save_fair_share(&share)?,
                Effect::Send { node, msg } => {
                    self.send_to_node(node, msg);
                }
            }
        }
        Ok(())
    }

    /// The first node of a job runs its batch script.
    pub fn head_node(alloc: &Allocation) -> Option<usize> {
        alloc.first().map(|a| a.node_id.0 as usize)
    }

    /// The cluster as placement sees it: only nodes up and connected take work.
    pub fn sched_view(&self) -> ClusterState {
        let mut view = self.cluster.clone();
        view.update_nodes(|nodes| {
            for (cap, ex) in nodes.iter_mut().zip(&self.extra) {
                cap.state = if ex.usable() { NodeState::Up } else { NodeState::Down };
            }
        });
        view
    }
}

impl Controller {
    /// The next job id (see [`Self::take_job_ids`]).
    pub(crate) fn take_job_id(&mut self) -> JobId {
        self.take_job_ids(1)
    }

    /// `n` consecutive job ids (at least one), the first returned. Ids are reserved ahead in
    /// blocks, written with the batch that takes them (`JobIds::take`'s effect), so that the
    /// next batches' ids are already reserved on disk (`JobIds::agents_before_sync`).
    pub(crate) fn take_job_ids(&mut self, n: u64) -> JobId {
        let (id, bound) = self.ids.take(n);
        self.queue(bound);
        id
    }

    /// A clean stop: the next start continues at the next id (no reserved ids are skipped).
    pub fn closing(&mut self) -> Result<(), StoreError> {
        let next = self.ids.closing();
        self.store.set_meta(JOB_ID_BOUND, &next.to_string())
    }
}

#[cfg(test)]
mod tests;
