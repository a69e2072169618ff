use super::*;
use crate::model::request::Peer;
use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::client::{ClientRequest, ClientResponse, EventQuery};
use berth_protocol::user::UserIdentity;

fn root() -> Peer {
    Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 9 }
}

/// Two whole nodes of the harness (8 cores each), with the given failure options.
fn two_nodes(requeue: Option<bool>, no_kill: Option<bool>) -> SubmitOptions {
    SubmitOptions { nodes: Some(2), cores: Some(16), walltime: Some(600), requeue, no_kill, ..Default::default() }
}

fn one_node(requeue: Option<bool>) -> SubmitOptions {
    SubmitOptions { cores: Some(8), walltime: Some(600), requeue, ..Default::default() }
}

fn node_of(h: &Harness, id: JobId, k: usize) -> usize {
    h.ctl.jobs[&id].allocation[k].node_id.0 as usize
}

fn events(h: &Harness, kind: &str) -> Vec<(Option<JobId>, Option<String>)> {
    let q = EventQuery { kinds: vec![kind.into()], limit: Some(1000), ..Default::default() };
    h.ctl.store.events(&q).unwrap().into_iter().map(|e| (e.job, e.node)).collect()
}

/// The job's state and reason, live or from the store once finished.
fn state_of(h: &mut Harness, id: JobId) -> (JobState, Option<String>) {
    if let Some(j) = h.ctl.jobs.get(&id) {
        return (j.state, j.reason.clone());
    }
    match h.call(ClientRequest::ShowJob { id }, &ann()) {
        ClientResponse::Job { job } => (job.state, job.reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_policy_requeues_by_default_fails_when_asked_and_keeps_no_kill_jobs_without_their_head() {
    let cfg = crate::config::FaultConfig::default();
    let mut h = Harness::new(2);
    let a = h.batch(two_nodes(None, Some(true)), &ann());
    let job = &h.ctl.jobs[&a];
    assert_eq!(failure_action(job, false, 0, &cfg), FailureAction::KeepRunning);
    // Its batch script's node is not something it can go on without.
    assert_eq!(failure_action(job, true, 0, &cfg), FailureAction::Requeue);
    assert!(matches!(failure_action(job, true, 3, &cfg), FailureAction::Fail(m) if m.contains("3 times")));
    let mut no = job.clone();
    no.options.requeue = Some(false);
    no.options.no_kill = None;
    assert!(matches!(failure_action(&no, false, 0, &cfg), FailureAction::Fail(m) if m.contains("--no-requeue")));
    let off = crate::config::FaultConfig { requeue: false, ..cfg.clone() };
    let mut plain = job.clone();
    plain.options.no_kill = None;
    assert!(matches!(failure_action(&plain, false, 0, &off), FailureAction::Fail(_)));
    plain.options.requeue = Some(true);
    assert_eq!(failure_action(&plain, false, 0, &off), FailureAction::Requeue);
}

#[test]
fn a_failed_node_requeues_fails_or_keeps_each_job_by_its_policy() {
    let mut h = Harness::new(3);
    let requeued = h.batch(one_node(None), &ann());
    let failed = h.batch(one_node(Some(false)), &ann());
    let (r_node, f_node) = (node_of(&h, requeued, 0), node_of(&h, failed, 0));
    assert_ne!(r_node, f_node);
    h.sent();
    h.ctl.node_failed(r_node, "missed heartbeats", h.now).unwrap();
    h.ctl.node_failed(f_node, "missed heartbeats", h.now).unwrap();
    let (state, reason) = state_of(&mut h, requeued);
    assert_eq!(state, JobState::Queued, "{reason:?}");
    assert!(reason.unwrap().contains("requeued: node"), "the reason says why");
    let (state, reason) = state_of(&mut h, failed);
    assert_eq!(state, JobState::NodeFail);
    assert!(reason.unwrap().contains("--no-requeue"));
    assert_eq!(events(&h, "requeue").len(), 1);
    assert_eq!(events(&h, "node_fail"), vec![(Some(failed), Some(format!("n{f_node}")))]);
    assert_eq!(events(&h, "node_down").len(), 2);
    // Only the third node is up: the requeued job runs there.
    h.ctl.schedule(h.now).unwrap();
    let third = (0..3).find(|n| *n != r_node && *n != f_node).unwrap();
    assert_eq!(h.ctl.jobs[&requeued].state, JobState::Running);
    assert_eq!(node_of(&h, requeued, 0), third);
}

#[test]
fn a_no_kill_job_goes_on_without_its_failed_node_but_not_without_its_first() {
    let mut h = Harness::new(2);
    let keep = h.batch(two_nodes(None, Some(true)), &ann());
    let other = node_of(&h, keep, 1);
    h.sent();
    h.ctl.node_failed(other, "missed heartbeats", h.now).unwrap();
    let (state, reason) = state_of(&mut h, keep);
    assert_eq!(state, JobState::Running);
    assert!(reason.unwrap().contains("no-kill"));
    assert_eq!(events(&h, "node_lost_kept"), vec![(Some(keep), Some(format!("n{other}")))]);
    // Nothing was killed on the surviving node.
    assert!(h.sent().iter().all(|(_, m)| !matches!(m, ControllerMessage::Kill { .. })));
    // Its first node fails too: now it is requeued, and what is left of it killed.
    let head = node_of(&h, keep, 0);
    h.ctl.extra[other].state = berth_core::node::NodeState::Up;
    h.ctl.node_failed(head, "missed heartbeats", h.now).unwrap();
    assert_eq!(state_of(&mut h, keep).0, JobState::Queued);
    assert!(h
        .sent()
        .iter()
        .any(|(n, m)| *n == other && matches!(m, ControllerMessage::Kill { id, .. } if *id == keep)));
}

#[test]
fn a_requeued_job_fails_after_max_requeues() {
    let mut h = Harness::with_config(1, |c| c.fault.max_requeues = 1);
    let id = h.batch(one_node(None), &ann());
    h.ctl.node_failed(0, "first", h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Queued);
    h.ctl.extra[0].state = berth_core::node::NodeState::Up;
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    h.ctl.node_failed(0, "second", h.now).unwrap();
    let (state, reason) = state_of(&mut h, id);
    assert_eq!(state, JobState::NodeFail);
    assert!(reason.unwrap().contains("requeued 1 times"));
}

fn register(h: &mut Harness, node: usize, instance: &str, running: Vec<JobId>) {
    let reg = registration(node, instance, running);
    h.ctl.handle_register(reg, node as u64 + 1, h.txs[node].clone(), h.now).unwrap();
}

#[test]
fn a_returning_node_takes_no_work_until_what_it_still_runs_is_gone() {
    let mut h = Harness::new(1);
    let id = h.batch(one_node(Some(false)), &ann());
    h.ctl.node_failed(0, "link cut", h.now).unwrap();
    assert_eq!(state_of(&mut h, id).0, JobState::NodeFail);
    // The link comes back: the same agent still runs the failed job's processes.
    register(&mut h, 0, "inst0", vec![id]);
    assert_eq!(h.ctl.extra[0].state, NodeState::Cleaning);
    assert!(h.sent().iter().any(|(_, m)| matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)));
    let queued = {
        let sub = berth_protocol::client::SubmitRequest {
            script: "#!/bin/sh\ntrue\n".into(),
            script_name: "j.sh".into(),
            options: one_node(None),
            env: vec![],
            cwd: "/tmp".into(),
            hold: false,
            ignore_unsupported: false,
        };
        match h.call(ClientRequest::Submit(Box::new(sub)), &ann()) {
            ClientResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    };
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&queued].state, JobState::Queued, "a cleaning node takes no work");
    h.agent(0, AgentMessage::Heartbeat { running: vec![id], seq: 0, steps: None });
    assert_eq!(h.ctl.extra[0].state, NodeState::Cleaning);
    h.agent(0, AgentMessage::Heartbeat { running: vec![], seq: 0, steps: None });
    assert_eq!(h.ctl.extra[0].state, NodeState::Up);
    assert_eq!(events(&h, "node_up"), vec![(None, Some("n0".into()))]);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&queued].state, JobState::Running);
}

#[test]
fn an_admin_down_holds_the_node_across_reconnects_until_admin_up() {
    let mut h = Harness::new(2);
    let id = h.batch(one_node(None), &ann());
    let node = node_of(&h, id, 0);
    h.sent();
    let name = format!("n{node}");
    let req = |action: &str, value: Option<&str>| ClientRequest::NodeAdmin {
        name: name.clone(),
        action: action.into(),
        value: value.map(String::from),
    };
    let refused = h.call(req("down", Some("disk")), &ann());
    assert!(matches!(refused, ClientResponse::Error(ref e) if e.message.contains("only admins")), "{refused:?}");
    let r = h.call(req("down", Some("bad disk")), &root());
    assert!(matches!(r, ClientResponse::Nodes { .. }), "{r:?}");
    assert_eq!(h.ctl.extra[node].state, NodeState::Down);
    // Its job was requeued (and killed there: the agent is alive) and runs on the other node.
    assert!(h.sent().iter().any(|(n, m)| *n == node && matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert_ne!(node_of(&h, id, 0), node);
    // The agent reconnects: still down.
    register(&mut h, node, &format!("inst{node}"), vec![]);
    assert_eq!(h.ctl.extra[node].state, NodeState::Down);
    assert_eq!(events(&h, "node_held_down").len(), 1);
    // So does a restarted controller's: the reason is held in memory, restored from the store.
    let mut h = h.restart();
    assert_eq!(h.ctl.extra[node].admin_down(), Some("bad disk"));
    register(&mut h, node, &format!("inst{node}"), vec![]);
    assert_eq!(h.ctl.extra[node].state, NodeState::Down);
    assert_eq!(events(&h, "node_held_down").len(), 2);
    let r = h.call(req("up", None), &root());
    assert!(matches!(r, ClientResponse::Nodes { .. }), "{r:?}");
    assert_eq!(h.ctl.extra[node].state, NodeState::Up);
    assert_eq!(h.ctl.extra[node].admin_down(), None);
    assert_eq!(h.ctl.store.get_meta(&format!("node_down:{name}")).unwrap(), None, "nor in the store");
    let downs = h.ctl.store.events(&EventQuery { kinds: vec!["node_down".into()], ..Default::default() }).unwrap();
    assert!(downs[0].detail.contains("admin: bad disk"), "{downs:?}");
}

#[test]
fn an_agent_restarted_without_its_jobs_is_a_node_failure_for_them() {
    let mut h = Harness::new(4);
    let requeued = h.batch(one_node(None), &ann());
    let failed = h.batch(one_node(Some(false)), &ann());
    let keep = h.batch(SubmitOptions { nodes: Some(2), cores: Some(8), no_kill: Some(true), ..one_node(None) }, &ann());
    let (r_node, f_node) = (node_of(&h, requeued, 0), node_of(&h, failed, 0));
    // The no-kill job's second node: a restart there that lost its part leaves it running.
    let k_other = node_of(&h, keep, 1);
    h.sent();
    // Each agent comes back as a new instance (the node rebooted) knowing nothing of its jobs.
    for n in [r_node, f_node, k_other] {
        register(&mut h, n, "rebooted", vec![]);
    }
    let (state, reason) = state_of(&mut h, requeued);
    assert_eq!(state, JobState::Queued, "{reason:?}");
    assert!(reason.unwrap().contains("agent restarted without the job"));
    let (state, reason) = state_of(&mut h, failed);
    assert_eq!(state, JobState::NodeFail);
    assert!(reason.unwrap().contains("--no-requeue"));
    assert_eq!(state_of(&mut h, keep).0, JobState::Running);
    assert_eq!(events(&h, "node_lost_kept"), vec![(Some(keep), Some(format!("n{k_other}")))]);
}

/// Submit a held job (it takes an id and no cores).
fn held(h: &mut Harness) -> JobId {
    let sub = berth_protocol::client::SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options: one_node(None),
        env: vec![],
        cwd: "/tmp".into(),
        hold: true,
        ignore_unsupported: false,
    };
    match h.call(ClientRequest::Submit(Box::new(sub)), &ann()) {
        ClientResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

#[test]
fn job_ids_are_reserved_ahead_so_that_agents_may_act_before_the_sync_and_no_id_is_given_twice() {
    let mut h = Harness::new(2);
    // A fresh controller has reserved nothing: the first job's launch waits for the sync.
    let first = held(&mut h);
    assert!(!h.ctl.ids.agents_before_sync(), "job {first}'s id is not below a bound on disk yet");
    h.ctl.ids.synced();
    // From then on, ids come from a block already on disk: launches may leave before the sync.
    let mut last = first;
    for _ in 0..crate::model::ids::JOB_ID_BLOCK {
        last = held(&mut h);
        assert!(h.ctl.ids.agents_before_sync(), "job {last} is below the bound synced before its batch");
        h.ctl.ids.synced();
    }
    // A crash (no clean stop): the restarted controller starts above every reserved id.
    let bound = h.ctl.ids.bound();
    assert!(bound > last.0 + 1);
    let mut h = h.restart();
    assert_eq!(h.ctl.ids.next(), bound, "ids an agent may have heard of are never given again");
    assert_eq!(held(&mut h).0, bound);
    // A clean stop records the exact next id: no ids are skipped.
    h.ctl.closing().unwrap();
    let next = h.ctl.ids.next();
    let mut h = h.restart();
    assert_eq!(held(&mut h).0, next);
}

/// Issue 16 item 15: the launch marks the jobs a node failure would requeue for fencing
/// (not `--no-requeue`, not a no-kill job's other nodes); the lease is the node timeout less
/// its margin; an end the agent reports as fenced requeues the job.
#[test]
fn requeueable_jobs_are_fenced_and_a_fenced_end_requeues() {
    let mut h = Harness::new(4);
    let lease = h.ctl.cfg.lease().expect("fencing is on by default");
    let timeout = h.ctl.cfg.node_timeout();
    assert!(lease < timeout && timeout - lease >= std::time::Duration::from_secs(1), "{lease:?} of {timeout:?}");
    let plain = h.batch(one_node(None), &ann());
    let no_requeue = h.batch(one_node(Some(false)), &ann());
    let no_kill = h.batch(two_nodes(None, Some(true)), &ann());
    for id in [plain, no_requeue, no_kill] {
        assert_eq!(h.ctl.jobs[&id].state, JobState::Running, "{id}");
    }
    let fence = |h: &Harness, id: JobId, k: usize| h.ctl.launch_spec(&h.ctl.jobs[&id], k).fence;
    assert!(fence(&h, plain, 0));
    assert!(!fence(&h, no_requeue, 0));
    assert!(fence(&h, no_kill, 0), "losing its script's node requeues a no-kill job");
    assert!(!fence(&h, no_kill, 1), "a no-kill job goes on without its other nodes");
    let off = Harness::with_config(1, |c| c.fault.fence = false);
    assert_eq!(off.ctl.cfg.lease(), None);

    // The agent fenced `plain` before we took its node for lost: it is requeued all the same.
    let node = node_of(&h, plain, 0);
    let outcome = JobOutcome { signal: Some(9), reason: Some("fenced: lease ran out".into()), ..Default::default() };
    h.agent(node, AgentMessage::JobEnded { id: plain, outcome });
    assert_eq!(state_of(&mut h, plain).0, JobState::Queued, "{:?}", state_of(&mut h, plain));
    assert!(events(&h, "requeue").iter().any(|(j, _)| *j == Some(plain)));
}

/// A node whose agent goes quiet is taken for lost once the heartbeat timeout has passed on
/// the controller's clock (a fake one: nothing sleeps), not a moment before; a node heard from
/// meanwhile stays up, and the lost node's job is requeued and killed on the other.
#[test]
fn a_silent_agent_is_lost_after_the_heartbeat_timeout_and_not_before() {
    let mut h = Harness::new(2);
    let id = h.batch(two_nodes(Some(true), None), &ann());
    h.sent();
    let timeout = h.ctl.cfg.node_timeout().as_secs_f64();
    assert!(timeout > 2.0, "the default timeout is several heartbeats: {timeout}");

    h.advance(timeout - 1.0);
    h.agent(0, AgentMessage::Heartbeat { running: vec![id], seq: 1, steps: None });
    h.ctl.check_heartbeats(h.now).unwrap();
    assert_eq!((h.ctl.extra[0].state, h.ctl.extra[1].state), (NodeState::Up, NodeState::Up));
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert!(events(&h, "node_down").is_empty());

    // Node 1 has now been silent for longer than the timeout; node 0 was heard 2 s ago.
    h.advance(2.0);
    h.ctl.check_heartbeats(h.now).unwrap();
    assert_eq!((h.ctl.extra[0].state, h.ctl.extra[1].state), (NodeState::Up, NodeState::Down));
    assert!(!h.ctl.extra[1].connected(), "the silent agent's connection is dropped");
    assert_eq!(events(&h, "node_down"), vec![(None, Some("n1".to_string()))]);
    assert_eq!(state_of(&mut h, id).0, JobState::Queued, "requeued by the failure policy");
    let sent = h.sent();
    assert!(
        sent.iter().any(|(n, m)| *n == 0 && matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)),
        "its part on the node still up is killed: {sent:?}"
    );
    // What users see: node 1 silent for as long as the fake clock says.
    let ago = h.ctl.node_info(1, false).last_heard_seconds_ago.expect("registered");
    assert!((ago - (timeout + 1.0)).abs() < 1e-6, "{ago} s");
}

/// The failure policy's requeue count is kept in memory (`Controller::counts`) as the store's
/// events count it, restored by a restart, and its limit still triggers.
#[test]
fn the_requeue_count_is_kept_in_memory_as_the_store_counts_it_and_still_limits_after_a_restart() {
    let mut h = Harness::with_config(1, |c| c.fault.max_requeues = 2);
    let id = h.batch(one_node(None), &ann());
    let from_store = |h: &Harness| h.ctl.store.count_events(id, "requeue").unwrap();
    for (n, why) in [(1, "first"), (2, "second")] {
        h.ctl.node_failed(0, why, h.now).unwrap();
        assert_eq!(h.ctl.jobs[&id].state, JobState::Queued);
        assert_eq!((h.ctl.counts.requeues(id), from_store(&h)), (n, n));
        // A restarted controller counts the same.
        h = h.restart();
        assert_eq!((h.ctl.counts.requeues(id), from_store(&h)), (n, n));
        h.ctl.extra[0].state = berth_core::node::NodeState::Up;
        h.ctl.schedule(h.now).unwrap();
        assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    }
    h.ctl.node_failed(0, "third", h.now).unwrap();
    let (state, reason) = state_of(&mut h, id);
    assert_eq!(state, JobState::NodeFail);
    assert!(reason.unwrap().contains("already requeued 2 times"));
    assert_eq!(h.ctl.counts.requeues(id), 0, "forgotten once the job left memory");
    assert_eq!(from_store(&h), 2, "its history keeps them");
}
