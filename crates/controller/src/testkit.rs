//! A controller with registered nodes and no sockets, for unit tests of handlers and policy.

use crate::clock::FakeClock;
use crate::config::ControllerConfig;
use crate::model::request::Peer;
use crate::state::{AgentTx, Controller};
use crate::store::Store;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::step::StepRequest;
use berth_core::topology::Topology;
use berth_core::JobId;
use berth_protocol::agent::{AgentMessage, ControllerMessage, Registration};
use berth_protocol::client::{ClientRequest, ClientResponse, SubmitRequest};
use berth_protocol::step::{InteractiveAsk, StepCreate};
use berth_protocol::user::UserIdentity;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// A controller with registered nodes and no sockets: requests go straight to the handlers,
/// and what it would send to agents is collected per node.
pub(crate) struct Harness {
    pub ctl: Controller,
    pub dir: tempfile::TempDir,
    pub txs: Vec<AgentTx>,
    // Kept so the agents' channels stay open.
    _rxs: Vec<mpsc::UnboundedReceiver<ControllerMessage>>,
    pub now: f64,
    /// The controller's clock: it moves only with `advance` (`now` may be set apart from it).
    pub clock: Arc<FakeClock>,
}

pub(crate) fn ann() -> Peer {
    Peer { user: UserIdentity { uid: 1000, gid: 100, groups: vec![100, 27], name: "ann".into() }, conn: 1 }
}

pub(crate) fn bob() -> Peer {
    Peer { user: UserIdentity { uid: 1001, gid: 100, groups: vec![100], name: "bob".into() }, conn: 2 }
}

/// 2 packages x 4 cores x 1 PU, 1 GiB per package: PUs 0-3 and 4-7.
/// A `berth run` of `./a.out` by ann (PATH=/bin, from /home/ann on login1) asking `request`
/// of `job`'s allocation (None: an interactive allocation). Tests set other fields on it.
pub(crate) fn step_create(job: Option<JobId>, request: StepRequest) -> StepCreate {
    StepCreate {
        job,
        request,
        interactive: InteractiveAsk::default(),
        argv: vec!["./a.out".into()],
        env: vec![("PATH".into(), "/bin".into())],
        cwd: "/home/ann".into(),
        host: "login1".into(),
        pid: 4242,
        fanout: 0,
        no_kill: false,
        rank_cpusets: false,
        notify_signal: None,
        mpi: None,
        apps: vec![],
        spawned_by: None,
    }
}

pub(crate) fn topo() -> Topology {
    Topology::uniform(2, 1, 4, 1, 1 << 30)
}

pub(crate) fn config(dir: &std::path::Path) -> ControllerConfig {
    let d = |k: &str, v: String| (k.to_string(), v);
    let defaults =
        vec![d("state_dir", dir.display().to_string()), d("socket", dir.join("c.sock").display().to_string())];
    let mut cfg = ControllerConfig::load(None, &defaults, &[], &vec![]).unwrap();
    // The harness's users (ann, bob) and accounts are made up.
    cfg.verify_names = false;
    cfg
}

/// Harness node `node`'s agent registering as `instance`, running `running`.
pub fn registration(node: usize, instance: &str, running: Vec<JobId>) -> Registration {
    Registration {
        name: format!("n{node}"),
        hostname: format!("n{node}"),
        address: format!("127.0.0.1:{}", 7200 + node),
        instance: instance.into(),
        version: "test".into(),
        topology: topo(),
        real_cpus: "0-7".into(),
        running,
        ended: vec![],
        lease: false,
        steps: None,
    }
}

impl Harness {
    pub fn new(nodes: usize) -> Harness {
        Self::with_config(nodes, |_| {})
    }

    /// Like `new`, with nodes of this topology (e.g. with GPUs).
    pub fn with_topology(nodes: usize, topology: Topology) -> Harness {
        Self::with_config_and_topology(nodes, topology, |_| {})
    }

    /// [`Harness::with_topology`] with the config edited first (as [`Harness::with_config`]).
    pub fn with_config_and_topology(
        nodes: usize,
        topology: Topology,
        edit: impl FnOnce(&mut ControllerConfig),
    ) -> Harness {
        let mut h = Self::with_config(0, edit);
        for i in 0..nodes {
            let (tx, rx) = mpsc::unbounded_channel();
            let reg = Registration { topology: topology.clone(), ..registration(i, &format!("inst{i}"), vec![]) };
            h.ctl.handle_register(reg, i as u64 + 1, tx.clone(), h.now).unwrap();
            h.txs.push(tx);
            h._rxs.push(rx);
        }
        h.sent();
        h
    }

    /// Like `new`, with the config changed by `edit` first (queues, policy, ...).
    pub fn with_config(nodes: usize, edit: impl FnOnce(&mut ControllerConfig)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        edit(&mut cfg);
        cfg.validate().expect("a valid test config");
        let clock = Arc::new(FakeClock::new(1000.0));
        let ctl = Controller::load_with_clock(cfg, Store::open(dir.path()).unwrap(), clock.clone()).unwrap();
        let mut h = Harness { ctl, dir, txs: vec![], _rxs: vec![], now: 1000.0, clock };
        for i in 0..nodes {
            let (tx, rx) = mpsc::unbounded_channel();
            let reg = registration(i, &format!("inst{i}"), vec![]);
            h.ctl.handle_register(reg, i as u64 + 1, tx.clone(), h.now).unwrap();
            h.txs.push(tx);
            h._rxs.push(rx);
        }
        h.sent();
        h
    }

    /// A controller loaded again from the same state (a restart), nodes reconnected.
    pub fn restart(self) -> Harness {
        let Harness { ctl, dir, txs, _rxs, now, clock } = self;
        let cfg = ctl.cfg.clone();
        drop(ctl);
        let mut ctl = Controller::load_with_clock(cfg, Store::open(dir.path()).unwrap(), clock.clone()).unwrap();
        for (i, tx) in txs.iter().enumerate() {
            let heard = ctl.extra[i].last_heard();
            ctl.extra[i].connect(i as u64 + 1, tx.clone(), heard);
        }
        Harness { ctl, dir, txs, _rxs, now, clock }
    }

    /// Time passes: `now` and the controller's clock move on by `secs`.
    pub fn advance(&mut self, secs: f64) {
        self.now += secs;
        self.clock.advance(secs);
    }

    pub fn call(&mut self, req: ClientRequest, peer: &Peer) -> ClientResponse {
        let (tx, mut rx) = oneshot::channel();
        self.ctl.handle_client(req, peer, tx, self.now).unwrap();
        self.ctl.carry_out_effects(self.now).unwrap();
        for (tx, r) in self.ctl.out.replies.drain(..) {
            let _ = tx.send(r);
        }
        rx.try_recv().expect("a reply")
    }

    /// Messages queued for agents since the last call, as (node index, message).
    pub fn sent(&mut self) -> Vec<(usize, ControllerMessage)> {
        let out: Vec<_> = self.ctl.out.agents.drain(..).collect();
        out.into_iter()
            .map(|(tx, m)| (self.txs.iter().position(|t| t.same_channel(&tx)).expect("a known agent"), m))
            .collect()
    }

    pub fn agent(&mut self, node: usize, msg: AgentMessage) {
        self.ctl.handle_agent(node, node as u64 + 1, msg, self.now).unwrap();
        self.ctl.carry_out_effects(self.now).unwrap();
    }

    /// Submit a batch job (`hold`: held), not scheduled yet.
    pub fn submit_as(&mut self, options: SubmitOptions, hold: bool, peer: &Peer) -> JobId {
        let sub = SubmitRequest {
            script: "#!/bin/sh\ntrue\n".into(),
            script_name: "job.sh".into(),
            options,
            env: vec![],
            cwd: "/tmp".into(),
            hold,
            ignore_unsupported: false,
        };
        match self.call(ClientRequest::Submit(Box::new(sub)), peer) {
            ClientResponse::Submitted { id } => id,
            other => panic!("not submitted: {other:?}"),
        }
    }

    /// Submit a batch job and start it.
    pub fn batch(&mut self, options: SubmitOptions, peer: &Peer) -> JobId {
        let id = self.submit_as(options, false, peer);
        self.ctl.schedule(self.now).unwrap();
        assert_eq!(self.ctl.jobs[&id].state, JobState::Running);
        id
    }

    pub fn free_cores(&self) -> u32 {
        self.ctl.cluster.nodes().iter().map(|n| n.free_core_count).sum()
    }
}

/// A running job of `peer` on the harness's nodes `nodes` (index, PUs there), as plain values:
/// for unit tests of features that decide without a store.
pub(crate) fn running_job(id: u64, peer: &Peer, nodes: &[(u32, &str)]) -> crate::model::job::JobRecord {
    use berth_core::job::NodeAllocation;
    use berth_core::{CpuSet, NodeId};
    let allocation = nodes
        .iter()
        .map(|&(i, cpus)| {
            let cpus = CpuSet::parse_list(cpus).expect("a PU list");
            NodeAllocation {
                gres: Default::default(),
                licenses: Default::default(),
                node_id: NodeId(i),
                node: format!("n{i}"),
                cores: cpus.len() as u32,
                cpus,
                mems: CpuSet::parse_list("0").expect("a NUMA list"),
                memory_bytes: 1 << 20,
                numa_memory: vec![],
                exclusive_numa: CpuSet::new(),
                subnodes: vec![],
                binding: vec![],
                ranks: vec![],
                gpus: vec![],
            }
        })
        .collect();
    crate::model::job::JobRecord {
        id: JobId(id),
        name: "job".into(),
        user: peer.user.clone(),
        state: JobState::Running,
        queue: "batch".into(),
        options: SubmitOptions::default(),
        walltime: Some(600),
        submit_time: 900.0,
        start_time: Some(950.0),
        end_time: None,
        allocation,
        exit_code: None,
        signal: None,
        reason: None,
        cwd: "/tmp".into(),
        stdout: "/tmp/out".into(),
        stderr: "/tmp/err".into(),
        script: "#!/bin/sh\ntrue\n".into(),
        env: Arc::new(vec![]),
        usage: None,
        kill_sent: None,
        suspension: Default::default(),
    }
}
