use super::*;
use crate::testkit::*;
use berth_core::job::JobOutcome;
use berth_core::step::StepRequest;
use berth_protocol::agent::{AgentMessage, LaunchSpec};
use berth_protocol::client::{ClientRequest, SubmitRequest};
use berth_protocol::step::{InteractiveAsk, RankExit};
use berth_protocol::user::UserIdentity;
use tokio::sync::mpsc;

fn run(job: Option<JobId>, request: StepRequest) -> ClientRequest {
    ClientRequest::StepCreate(Box::new(step_create(job, request)))
}

fn interactive(request: StepRequest, nodes: Option<u32>) -> ClientRequest {
    let ClientRequest::StepCreate(mut c) = run(None, request) else { unreachable!() };
    c.interactive = InteractiveAsk { nodes, walltime_seconds: None, ..Default::default() };
    ClientRequest::StepCreate(c)
}

fn tasks(n: u32) -> StepRequest {
    StepRequest { ntasks: Some(n), ..Default::default() }
}

fn granted(r: ClientResponse) -> StepGrant {
    match r {
        ClientResponse::StepGranted { grant, .. } => *grant,
        other => panic!("not granted: {other:?}"),
    }
}

fn err(r: ClientResponse) -> ApiError {
    match r {
        ClientResponse::Error(e) => e,
        other => panic!("not an error: {other:?}"),
    }
}

fn done(r: ClientResponse) -> IdResult {
    match r {
        ClientResponse::Done { mut results } if results.len() == 1 => results.pop().unwrap(),
        other => panic!("not one result: {other:?}"),
    }
}

fn cpus(g: &StepGrant) -> Vec<String> {
    g.nodes.iter().flat_map(|n| n.ranks.iter().map(move |r| format!("{}:{}", n.name, r.cpus.to_list()))).collect()
}

fn end_outcome(code: i32) -> StepOutcome {
    StepOutcome { exit_code: code, ..Default::default() }
}

#[test]
fn launch_goes_to_every_node_and_the_first_decides() {
    let mut h = Harness::new(3);
    let id = h.batch(SubmitOptions { nodes: Some(2), cores: Some(8), ..Default::default() }, &ann());
    let launches: Vec<(usize, LaunchSpec)> = h
        .sent()
        .into_iter()
        .filter_map(|(n, m)| match m {
            ControllerMessage::Launch(s) => Some((n, *s)),
            _ => None,
        })
        .collect();
    assert_eq!(launches.len(), 2);
    let alloc = h.ctl.jobs[&id].allocation.clone();
    for (k, (n, spec)) in launches.iter().enumerate() {
        assert_eq!(*n, alloc[k].node_id.0 as usize);
        assert_eq!(spec.allocation, alloc[k]);
        assert_eq!(spec.head, k == 0);
        let want: Vec<String> = alloc.iter().map(|a| format!("127.0.0.1:{}", 7200 + a.node_id.0)).collect();
        assert_eq!(spec.addresses, want);
    }
    let (head, member) = (alloc[0].node_id.0 as usize, alloc[1].node_id.0 as usize);
    // A member's end is acknowledged and changes nothing; its CPU time is kept.
    let member_end = JobOutcome { exit_code: Some(0), user_cpu_us: 5_000_000, ..Default::default() };
    h.agent(member, AgentMessage::JobEnded { id, outcome: member_end.clone() });
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert_eq!(
        h.sent().iter().map(|(n, m)| (*n, m.clone())).collect::<Vec<_>>(),
        vec![(member, ControllerMessage::EndAck { id })]
    );
    // The first node's end finishes the job and kills the rest.
    let head_end = JobOutcome { exit_code: Some(0), user_cpu_us: 10_000_000, wall_ms: 100, ..Default::default() };
    h.agent(head, AgentMessage::JobEnded { id, outcome: head_end });
    assert!(!h.ctl.jobs.contains_key(&id));
    let sent = h.sent();
    assert!(sent.contains(&(member, ControllerMessage::Kill { id, reason: "job ended".into() })), "{sent:?}");
    assert!(sent.contains(&(head, ControllerMessage::EndAck { id })));
    assert!(!sent.iter().any(|(n, m)| *n == head && matches!(m, ControllerMessage::Kill { .. })));
    let job = h.ctl.store.get_job(id).unwrap().unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.usage.unwrap().user_cpu_us, 15_000_000);
    // A resent member end is not counted twice.
    h.agent(member, AgentMessage::JobEnded { id, outcome: member_end });
    assert_eq!(h.ctl.store.get_job(id).unwrap().unwrap().usage.unwrap().user_cpu_us, 15_000_000);
    assert_eq!(h.free_cores(), 24);
}

#[test]
fn cancel_and_node_loss_kill_every_node() {
    let mut h = Harness::new(2);
    let id = h.batch(SubmitOptions { nodes: Some(2), cores: Some(4), ..Default::default() }, &ann());
    h.sent();
    assert!(done(h.call(ClientRequest::Cancel { ids: vec![id], only: vec![] }, &ann())).ok);
    let kills: Vec<usize> = h
        .sent()
        .into_iter()
        .filter(|(_, m)| matches!(m, ControllerMessage::Kill { reason, .. } if reason == "cancelled"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(kills, vec![0, 1]);

    let id =
        h.batch(SubmitOptions { nodes: Some(2), cores: Some(4), requeue: Some(false), ..Default::default() }, &bob());
    h.sent();
    // Node 1 stops answering: the job fails (it asked not to be requeued) and node 0 is told
    // to kill its part.
    let long_ago = std::time::Instant::now().checked_sub(std::time::Duration::from_secs(3600)).unwrap();
    h.ctl.extra[1].heard(long_ago);
    h.ctl.check_heartbeats(h.now).unwrap();
    assert_eq!(h.ctl.store.get_job(id).unwrap().unwrap().state, JobState::NodeFail);
    let sent = h.sent();
    assert!(sent.iter().any(|(n, m)| *n == 0 && matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)));
}

/// A member node's agent restarting: the job goes on when the new agent re-adopted its part,
/// gets its launch again when the same agent lost it in transit, and is handled as on a failed
/// node (requeued by default) when a new agent knows nothing of it (the node rebooted).
#[test]
fn a_member_agent_restarting_keeps_requeues_or_relaunches_by_what_it_knows() {
    let mut h = Harness::new(2);
    let id = h.batch(SubmitOptions { nodes: Some(2), cores: Some(4), ..Default::default() }, &ann());
    h.sent();
    let register = |h: &mut Harness, instance: &str, running: Vec<JobId>, conn: u64| {
        let (tx, rx) = mpsc::unbounded_channel();
        h.txs[1] = tx.clone();
        h.ctl.handle_register(registration(1, instance, running), conn, tx, h.now).unwrap();
        rx
    };
    // A new agent that re-adopted the job's part.
    let _rx = register(&mut h, "new", vec![id], 99);
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    h.sent();
    // The same agent reconnecting without the job (its launch was lost) gets it again.
    let _rx2 = register(&mut h, "new", vec![], 100);
    let sent = h.sent();
    assert!(sent.iter().any(|(n, m)| *n == 1 && matches!(m, ControllerMessage::Launch(s) if s.id == id && !s.head)));
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    // A newer agent that knows nothing of it: its part is lost, the job is requeued and what
    // is left of it on its first node killed.
    let _rx3 = register(&mut h, "newer", vec![], 101);
    assert_eq!(h.ctl.jobs[&id].state, JobState::Queued);
    let sent = h.sent();
    assert!(sent.iter().any(|(n, m)| *n == 0 && matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)));
}

#[test]
fn steps_share_a_job_on_disjoint_cores() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    let g1 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    assert_eq!((g1.job, g1.step, g1.size, g1.kvsname.as_str()), (id, 1, 4, format!("berth_{}_1", id.0).as_str()));
    assert_eq!(g1.user, ann().user);
    assert!(g1.bind && !g1.interactive);
    assert_eq!(g1.nodes[0].address, "127.0.0.1:7200");
    assert_eq!(g1.kill_grace_ms, 10_000);
    let g2 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    assert_eq!(g2.step, 2);
    let (c1, c2) = (cpus(&g1), cpus(&g2));
    assert!(c1.iter().all(|c| !c2.contains(c)), "{c1:?} {c2:?}");
    // All 8 cores are held: one more rank is refused, unless it overcommits.
    let e = err(h.call(run(Some(id), tasks(1)), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.contains("--overcommit"), "{e}");
    let over = StepRequest { ntasks: Some(2), overcommit: true, ..Default::default() };
    let g3 = granted(h.call(run(Some(id), over), &ann()));
    assert_eq!(g3.step, 3);
    // Bad requests.
    let e = err(h.call(run(Some(id), StepRequest { cpus_per_task: Some(0), ..Default::default() }), &ann()));
    assert_eq!(e.code, ErrorCode::BadRequest);
    let ClientRequest::StepCreate(mut c) = run(Some(id), tasks(1)) else { unreachable!() };
    c.fanout = 1;
    assert_eq!(err(h.call(ClientRequest::StepCreate(c.clone()), &ann())).code, ErrorCode::BadRequest);
    c.fanout = 33;
    assert_eq!(err(h.call(ClientRequest::StepCreate(c), &ann())).code, ErrorCode::BadRequest);
    // The first step ends: its cores are free for the next.
    let out = StepOutcome {
        exit_code: 3,
        failures: vec![RankExit { rank: 2, node: "n0".into(), exit_code: Some(3), signal: None, reason: None }],
        ..Default::default()
    };
    assert!(done(h.call(ClientRequest::StepEnd { job: id, step: 1, outcome: out }, &ann())).ok);
    let g4 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    assert_eq!(cpus(&g4), c1);
    // The steps survive a controller restart, with their claims.
    let mut h = h.restart();
    let e = err(h.call(run(Some(id), tasks(1)), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    // The invocation log, newest first; `show` lists the job's steps.
    let ClientResponse::Steps { steps } = h.call(
        ClientRequest::Acct {
            limit: None,
            steps: true,
            since: None,
            until: None,
            users: vec![],
            active: false,
            with_steps: false,
        },
        &bob(),
    ) else {
        panic!()
    };
    assert_eq!(steps.iter().map(|s| s.step).collect::<Vec<_>>(), vec![4, 3, 2, 1]);
    assert_eq!(steps[3].exit_code, Some(3));
    assert_eq!(steps[3].failure.as_deref(), Some("rank 2 on n0 exited with status 3"));
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    assert_eq!(job.steps.len(), 4);
    // The job ends: its open steps are closed.
    h.agent(0, AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } });
    let s2 = h.ctl.store.get_step(id, 2).unwrap().unwrap();
    assert_eq!(s2.failure.as_deref(), Some("job ended"));
    assert!(s2.end_time.is_some());
    assert!(h.ctl.store.live_steps().unwrap().is_empty());
}

#[test]
fn steps_need_a_running_job_of_ones_own() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    let e = err(h.call(run(Some(id), tasks(1)), &bob()));
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
    let root = Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![], name: "root".into() }, conn: 3 };
    // An admin may run in ann's job, but the ranks run as ann, never as root.
    assert_eq!(granted(h.call(run(Some(id), tasks(1)), &root)).user.uid, ann().user.uid);
    let e = err(h.call(run(Some(JobId(77)), tasks(1)), &ann()));
    assert_eq!(e.code, ErrorCode::UnknownJob);
    // A queued job (the node is full).
    let sub = SubmitRequest {
        script: "#!/bin/sh\n".into(),
        script_name: "q.sh".into(),
        options: SubmitOptions { cores: Some(1), ..Default::default() },
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    let ClientResponse::Submitted { id: q } = h.call(ClientRequest::Submit(Box::new(sub)), &ann()) else { panic!() };
    let e = err(h.call(run(Some(q), tasks(1)), &ann()));
    assert_eq!(e.code, ErrorCode::InvalidState, "{e}");
    assert!(e.message.contains("queued"), "{e}");
    // StepEnd: only the step's user; unknown steps.
    let e = err(h.call(ClientRequest::StepEnd { job: id, step: 1, outcome: end_outcome(0) }, &ann()));
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
    let e = err(h.call(ClientRequest::StepEnd { job: id, step: 9, outcome: end_outcome(0) }, &ann()));
    assert_eq!((e.code, e.message.as_str()), (ErrorCode::UnknownJob, format!("job {id} has no step 9").as_str()));
}

#[test]
fn signals_go_to_the_nodes_of_the_job_or_step() {
    let mut h = Harness::new(2);
    let id = h.batch(SubmitOptions { nodes: Some(2), cores: Some(8), ..Default::default() }, &ann());
    h.sent();
    let sig = |step, signal| ClientRequest::Signal { job: id, step, signal };
    let r = done(h.call(sig(None, 10), &bob()));
    assert_eq!(r.error.unwrap().code, ErrorCode::NotPermitted);
    assert!(h.sent().is_empty());
    assert_eq!(err(h.call(sig(None, 0), &ann())).code, ErrorCode::BadRequest);
    assert_eq!(err(h.call(sig(None, 65), &ann())).code, ErrorCode::BadRequest);
    assert!(done(h.call(sig(None, 10), &ann())).ok);
    let mut nodes: Vec<usize> = h.sent().iter().map(|(n, _)| *n).collect();
    nodes.sort();
    assert_eq!(nodes, vec![0, 1]);
    // A step on the first node only.
    let g = granted(h.call(run(Some(id), StepRequest { ntasks: Some(2), ..Default::default() }), &ann()));
    assert_eq!(g.nodes.len(), 1);
    assert!(done(h.call(sig(Some(g.step), 2), &ann())).ok);
    let sent = h.sent();
    let first = h.ctl.jobs[&id].allocation[0].node_id.0 as usize;
    assert_eq!(sent, vec![(first, ControllerMessage::Signal { id, step: Some(g.step), signal: 2 })]);
    let r = done(h.call(sig(Some(9), 2), &ann()));
    let e = r.error.unwrap();
    assert_eq!((e.code, e.message), (ErrorCode::UnknownJob, format!("job {id} has no step 9")));
    let r = done(h.call(ClientRequest::Signal { job: JobId(99), step: None, signal: 2 }, &ann()));
    assert_eq!(r.error.unwrap().code, ErrorCode::UnknownJob);
}

#[test]
fn interactive_limits() {
    let mut h = Harness::new(3);
    h.ctl.cfg.interactive.max_cores = 6;
    h.ctl.cfg.interactive.max_nodes = 2;
    let e = err(h.call(interactive(tasks(8), None), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.contains("max_cores"), "{e}");
    let e = err(h.call(interactive(tasks(3), Some(3)), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.contains("max_nodes"), "{e}");
    // Larger than any node could ever hold.
    h.ctl.cfg.interactive.max_cores = 64;
    let e = err(h.call(interactive(StepRequest { tasks_per_node: Some(9), ..Default::default() }, Some(1)), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    h.ctl.cfg.interactive.enabled = false;
    let e = err(h.call(interactive(tasks(1), None), &ann()));
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
    assert!(h.ctl.jobs.is_empty());
    assert_eq!(h.free_cores(), 24);
}

#[test]
fn interactive_allocation_lives_and_ends_with_its_step() {
    let mut h = Harness::new(2);
    let g =
        granted(h.call(interactive(StepRequest { tasks_per_node: Some(2), ..Default::default() }, Some(2)), &ann()));
    assert!(g.interactive);
    assert_eq!((g.step, g.size, g.nodes.len()), (1, 4, 2));
    let id = g.job;
    let job = &h.ctl.jobs[&id];
    assert_eq!((job.state, job.queue.as_str(), job.user.uid), (JobState::Running, "interactive", 1000));
    assert_eq!(job.walltime, Some(3600));
    assert_eq!(h.free_cores(), 12);
    let launches: Vec<(usize, bool)> = h
        .sent()
        .into_iter()
        .filter_map(|(n, m)| match m {
            ControllerMessage::Launch(s) => Some((n, s.head)),
            _ => None,
        })
        .collect();
    assert_eq!(launches.len(), 2);
    assert!(launches.iter().all(|(_, head)| !head));
    // It is durable like a submission.
    assert_eq!(h.ctl.store.get_job(id).unwrap().unwrap().state, JobState::Running);
    // Another user may not end it.
    assert_eq!(
        err(h.call(ClientRequest::StepEnd { job: id, step: 1, outcome: end_outcome(0) }, &bob())).code,
        ErrorCode::NotPermitted
    );
    assert!(done(h.call(ClientRequest::StepEnd { job: id, step: 1, outcome: end_outcome(0) }, &ann())).ok);
    assert!(!h.ctl.jobs.contains_key(&id));
    assert_eq!(h.free_cores(), 16);
    let job = h.ctl.store.get_job(id).unwrap().unwrap();
    assert_eq!((job.state, job.exit_code), (JobState::Completed, Some(0)));
    let kills = h.sent().iter().filter(|(_, m)| matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)).count();
    assert_eq!(kills, 2);
    // A failed step fails its allocation.
    let g = granted(h.call(interactive(tasks(2), None), &ann()));
    h.call(ClientRequest::StepEnd { job: g.job, step: 1, outcome: end_outcome(7) }, &ann());
    let job = h.ctl.store.get_job(g.job).unwrap().unwrap();
    assert_eq!((job.state, job.exit_code), (JobState::Failed, Some(7)));
    assert_eq!(h.free_cores(), 16);
}

#[test]
fn interactive_waits_for_busy_cores_outside_the_queue() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(6), ..Default::default() }, &bob());
    let r = h.call(interactive(tasks(4), None), &ann());
    let ClientResponse::TryAgain { reason } = r else { panic!("{r:?}") };
    assert!(!reason.is_empty());
    assert!(h.ctl.jobs.len() == 1);
    // Two cores are free: that fits now.
    let g = granted(h.call(interactive(tasks(2), None), &ann()));
    assert_ne!(g.job, id);
    assert_eq!(h.free_cores(), 0);
}

#[test]
fn client_gone_frees_its_interactive_allocation() {
    let mut h = Harness::new(1);
    let batch = h.batch(SubmitOptions { cores: Some(4), ..Default::default() }, &bob());
    let in_batch = granted(h.call(run(Some(batch), tasks(2)), &bob()));
    let g = granted(h.call(interactive(tasks(2), None), &ann()));
    assert_eq!(h.free_cores(), 2);
    h.sent();
    // Another connection closing changes nothing.
    h.ctl.client_gone(77, h.now).unwrap();
    assert!(h.ctl.jobs.contains_key(&g.job));
    h.ctl.client_gone(ann().conn, h.now).unwrap();
    assert!(!h.ctl.jobs.contains_key(&g.job));
    assert_eq!(h.free_cores(), 4);
    let job = h.ctl.store.get_job(g.job).unwrap().unwrap();
    assert_eq!((job.state, job.reason.as_deref()), (JobState::Failed, Some(RUN_DISCONNECTED)));
    let step = h.ctl.store.get_step(g.job, 1).unwrap().unwrap();
    assert_eq!(step.failure.as_deref(), Some(RUN_DISCONNECTED));
    assert!(h.sent().iter().any(|(_, m)| matches!(m, ControllerMessage::Kill { id, .. } if *id == g.job)));
    // A step in a batch job whose `run` went away gives its cores back; the job runs on.
    // Its end is written as the server loop writes a command's effects, after it.
    h.ctl.client_gone(bob().conn, h.now).unwrap();
    assert!(h.ctl.steps.of(batch).is_empty());
    assert_eq!(h.ctl.store.get_step(batch, in_batch.step).unwrap().unwrap().end_time, None);
    h.ctl.carry_out_effects(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&batch].state, JobState::Running);
    assert!(h.ctl.steps.of(batch).is_empty());
    let s = h.ctl.store.get_step(batch, in_batch.step).unwrap().unwrap();
    assert_eq!(s.failure.as_deref(), Some(RUN_DISCONNECTED));
}

#[test]
fn interactive_walltime_and_cancel() {
    let mut h = Harness::new(1);
    let ClientRequest::StepCreate(mut c) = interactive(tasks(1), None) else { unreachable!() };
    c.interactive.walltime_seconds = Some(60);
    let g = granted(h.call(ClientRequest::StepCreate(c), &ann()));
    assert_eq!(h.ctl.jobs[&g.job].walltime, Some(60));
    h.ctl.check_interactive(h.now + 30.0).unwrap();
    assert!(h.ctl.jobs.contains_key(&g.job));
    h.ctl.check_interactive(h.now + 60.0).unwrap();
    assert_eq!(h.ctl.store.get_job(g.job).unwrap().unwrap().state, JobState::Timeout);
    let g = granted(h.call(interactive(tasks(1), None), &ann()));
    assert!(done(h.call(ClientRequest::Cancel { ids: vec![g.job], only: vec![] }, &ann())).ok);
    assert_eq!(h.ctl.store.get_job(g.job).unwrap().unwrap().state, JobState::Cancelled);
    assert_eq!(h.free_cores(), 8);
    // `run` reports afterwards: its status is kept, the allocation stays ended.
    assert!(done(h.call(ClientRequest::StepEnd { job: g.job, step: 1, outcome: end_outcome(143) }, &ann())).ok);
    assert_eq!(h.ctl.store.get_step(g.job, 1).unwrap().unwrap().exit_code, Some(143));
}

fn events_of(h: &Harness, kind: &str) -> Vec<berth_protocol::client::EventInfo> {
    let q = berth_protocol::client::EventQuery { kinds: vec![kind.into()], ..Default::default() };
    h.ctl.store.events(&q).unwrap()
}

#[test]
fn refusals_of_other_users_jobs_are_logged_as_denied() {
    let mut h = Harness::new(2);
    let id = h.batch(SubmitOptions { cores: Some(1), ..Default::default() }, &ann());
    for (req, action) in [
        (ClientRequest::Cancel { ids: vec![id], only: vec![] }, "cancel"),
        (ClientRequest::Hold { ids: vec![id], only: vec![] }, "hold"),
        (ClientRequest::Release { ids: vec![id], only: vec![] }, "release"),
        (ClientRequest::Signal { job: id, step: None, signal: 10 }, "signal"),
    ] {
        let r = done(h.call(req, &bob()));
        assert_eq!(r.error.unwrap().code, ErrorCode::NotPermitted);
        let want = format!("user bob may not {action} job {id} of user ann");
        assert!(events_of(&h, "denied").iter().any(|e| e.detail == want && e.job == Some(id)), "{want}");
    }
    assert_eq!(err(h.call(run(Some(id), tasks(1)), &bob())).code, ErrorCode::NotPermitted);
    assert!(events_of(&h, "denied").iter().any(|e| e.detail.contains("may not run steps in job")));
    let n = events_of(&h, "denied").len();
    // The owner is not denied anything.
    assert!(done(h.call(ClientRequest::Signal { job: id, step: None, signal: 10 }, &ann())).ok);
    assert_eq!(events_of(&h, "denied").len(), n);
}

#[test]
fn grants_are_signed_with_the_cluster_key_and_agent_refusals_logged() {
    use berth_protocol::auth::{now_ms, verify_grant, ClusterKey};
    use berth_protocol::error::Refusal;
    let mut h = Harness::new(2);
    let key = ClusterKey::from_bytes([5; 32]);
    h.ctl.key = Some(std::sync::Arc::new(key.clone()));
    h.now = crate::clock::unix_now();
    let id = h.batch(SubmitOptions { cores: Some(2), ..Default::default() }, &ann());
    let ClientResponse::StepGranted { grant: g, link_key } = h.call(run(Some(id), tasks(2)), &ann()) else {
        panic!("not granted")
    };
    verify_grant(&key, &g, now_ms()).unwrap();
    // `run` gets the tree's link key, the one every agent derives from the signed grant.
    assert_eq!(link_key, berth_protocol::auth::LinkKey::of_grant(&key, &g).to_hex());
    assert!(g.expires_ms > now_ms() + 60_000, "{}", g.expires_ms);
    assert!(verify_grant(&ClusterKey::from_bytes([6; 32]), &g, now_ms()).is_err());
    h.agent(0, AgentMessage::Refused { what: Refusal::Launch, job: Some(id), detail: "cpus 9 outside".into() });
    h.agent(1, AgentMessage::Refused { what: Refusal::Auth, job: None, detail: "bad signature".into() });
    let l = events_of(&h, "launch_refused");
    assert_eq!((l.len(), l[0].job, l[0].detail.as_str()), (1, Some(id), "cpus 9 outside"));
    assert_eq!(l[0].node.as_deref(), Some(h.ctl.cluster.nodes()[0].name.as_str()));
    assert_eq!(events_of(&h, "auth_refused").len(), 1);
}

#[test]
fn an_interactive_step_rides_signed_on_its_first_nodes_launch_order() {
    use berth_protocol::auth::{now_ms, verify_grant, ClusterKey};
    let mut h = Harness::new(2);
    let key = ClusterKey::from_bytes([5; 32]);
    h.ctl.key = Some(std::sync::Arc::new(key.clone()));
    h.now = crate::clock::unix_now();
    let g =
        granted(h.call(interactive(StepRequest { tasks_per_node: Some(2), ..Default::default() }, Some(2)), &ann()));
    assert!(g.attach, "the first node starts it from the order; run attaches");
    verify_grant(&key, &g, now_ms()).expect("attach is set before the grant is signed");
    let launches: Vec<(usize, LaunchSpec)> = h
        .sent()
        .into_iter()
        .filter_map(|(n, m)| match m {
            ControllerMessage::Launch(s) if s.id == g.job => Some((n, *s)),
            _ => None,
        })
        .collect();
    assert_eq!(launches.len(), 2);
    let carried: Vec<&str> =
        launches.iter().filter_map(|(_, s)| s.step.as_ref().map(|_| s.allocation.node.as_str())).collect();
    assert_eq!(carried, vec![g.nodes[0].name.as_str()], "only the step's first node starts it");
    let on_order = launches.iter().find_map(|(_, s)| s.step.clone()).unwrap();
    assert_eq!(*on_order, g, "the order carries the very grant run gets");
    // A step in a batch job is started by run's launch, as before.
    let id = h.batch(SubmitOptions { cores: Some(2), ..Default::default() }, &ann());
    let in_job = granted(h.call(run(Some(id), tasks(2)), &ann()));
    assert!(!in_job.attach);
    assert!(h.sent().iter().all(|(_, m)| !matches!(m, ControllerMessage::Launch(s) if s.step.is_some())));
}

#[test]
fn steps_no_client_watches_are_closed_when_their_root_agent_does_not_know_them() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    let g1 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    let g2 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    assert_eq!(g1.nodes[0].name, g2.nodes[0].name);
    // Grants name the agent process they are for: a restarted agent refuses them.
    assert_eq!(g1.nodes[0].instance, "inst0");
    let root = g1.nodes[0].name.clone();
    let root_index = h.ctl.node_by_name(&root).unwrap();
    // The controller restarts: no `run` watches the steps any more.
    let mut h = h.restart();
    let live = |h: &Harness| h.ctl.steps.of(id).len();
    assert_eq!(live(&h), 2);
    let listed = |steps: &[u32]| Some(steps.iter().map(|&step| StepRef { job: id, step }).collect::<Vec<_>>());
    // Within the grant's lifetime a step the agent does not list may still start: kept.
    h.agent(root_index, AgentMessage::Heartbeat { running: vec![id], seq: 1, steps: listed(&[g1.step]) });
    assert_eq!(live(&h), 2);
    // An agent that does not say which steps it has: nothing is closed.
    h.now += 1000.0;
    h.agent(root_index, AgentMessage::Heartbeat { running: vec![id], seq: 2, steps: None });
    assert_eq!(live(&h), 2);
    // Past it, the step the root agent does not list is closed; the listed one stays.
    h.agent(root_index, AgentMessage::Heartbeat { running: vec![id], seq: 3, steps: listed(&[g1.step]) });
    assert_eq!(live(&h), 1);
    let row = h.ctl.store.get_step(id, g2.step).unwrap().unwrap();
    assert_eq!((row.end_time, row.failure.as_deref()), (Some(h.now), Some(ROOT_LOST)));
    assert!(h.ctl.store.get_step(id, g1.step).unwrap().unwrap().end_time.is_none());
    // Its cores are the job's again: a 4-rank step fits beside step 1.
    let h3 = granted(h.call(run(Some(id), tasks(4)), &ann()));
    assert_eq!(h3.size, 4);
    // The root agent restarts (its ranks were killed, its grants refused): open steps rooted
    // there that it does not list close at once, whatever their age.
    let (tx, _rx) = mpsc::unbounded_channel();
    h.txs[root_index] = tx.clone();
    let mut reg = registration(root_index, "reborn", vec![id]);
    reg.steps = Some(vec![]);
    h.ctl.handle_register(reg, 50, tx, h.now).unwrap();
    // Step 1 (no client since the restart) is closed; step 3's `run` is connected: it reports.
    assert!(h.ctl.store.get_step(id, g1.step).unwrap().unwrap().end_time.is_some());
    assert!(h.ctl.store.get_step(id, h3.step).unwrap().unwrap().end_time.is_none());
    assert_eq!(live(&h), 1);
}

#[test]
fn a_plain_run_in_a_job_submitted_with_rank_cpusets_gets_rank_cpusets() {
    let mut h = Harness::new(1);
    let with = h.batch(SubmitOptions { cores: Some(4), rank_cpusets: Some(true), ..Default::default() }, &ann());
    let without = h.batch(SubmitOptions { cores: Some(4), ..Default::default() }, &ann());
    assert!(granted(h.call(run(Some(with), tasks(2)), &ann())).rank_cpusets);
    assert!(!granted(h.call(run(Some(without), tasks(2)), &ann())).rank_cpusets);
}

#[test]
fn step_counts_are_bounded_before_planning() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(4), ..Default::default() }, &ann());
    let huge = StepRequest { ntasks: Some(u32::MAX), overcommit: true, ..Default::default() };
    let e = err(h.call(run(Some(id), huge), &ann()));
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert!(e.message.contains("-n 4294967295 is out of range"), "{e}");
    let e = err(h.call(run(Some(id), StepRequest { nodes: Some(2), ..Default::default() }), &ann()));
    assert!(e.message.contains("-N 2 asks for 2 nodes but the job has 1"), "{e}");
}

/// An MPMD step: colon parts planned one after another (each its own binding), multi-prog
/// lines over the step's layout; the grant carries each program's ranks, the invocation log
/// every program; a bad part is refused naming it.
#[test]
fn mpmd_steps_are_granted_with_each_programs_ranks() {
    use berth_core::step::mpmd::App;
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    let part = |argv: &str, request: StepRequest| App {
        argv: argv.split(' ').map(String::from).collect(),
        request: Some(request),
        ..Default::default()
    };
    let mpmd = |apps: Vec<App>| {
        let ClientRequest::StepCreate(mut c) = run(Some(id), tasks(2)) else { unreachable!() };
        c.apps = apps;
        ClientRequest::StepCreate(c)
    };
    let unbound = StepRequest { ntasks: Some(3), binding: RankBinding::None, ..Default::default() };
    let b = App { env: vec![("X".into(), "1".into())], ..part("./b.out -v", unbound) };
    let g = granted(h.call(mpmd(vec![part("./a.out", tasks(2)), b]), &ann()));
    assert_eq!(g.size, 5);
    assert_eq!(
        g.apps.iter().map(|a| (a.ranks.clone(), a.bind)).collect::<Vec<_>>(),
        [(vec![(0, 1)], Some(true)), (vec![(2, 4)], Some(false))]
    );
    assert!(g.apps.iter().all(|a| a.request.is_none()), "layouts stay with the controller");
    assert_eq!(g.rank_apps().unwrap(), vec![0, 0, 1, 1, 1]);
    let p = g.program_of(3, 1);
    assert_eq!(
        (p.argv.to_vec(), p.env.to_vec(), p.bind, p.app_rank),
        (vec!["./b.out".to_string(), "-v".into()], vec![("X".to_string(), "1".to_string())], false, 1)
    );
    assert_eq!(cpus(&g).len(), 5);
    let row = h.ctl.store.get_step(id, g.step).unwrap().unwrap();
    assert_eq!(row.argv.join(" "), "--ranks 0-1 ./a.out : --ranks 2-4 --env X=1 ./b.out -v");
    // 3 cores are left: a part that does not fit is named.
    let e = err(h.call(mpmd(vec![part("a", tasks(2)), part("b", tasks(2))]), &ann()));
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.starts_with("part 2 of the MPMD command"), "{e}");
    // Multi-prog lines: their ranks over the step's 3.
    let line = |ranks: Vec<(u32, u32)>, rest: bool| App {
        argv: vec!["x".into()],
        ranks,
        rest,
        expand: true,
        ..Default::default()
    };
    let ClientRequest::StepCreate(mut c) = run(Some(id), tasks(3)) else { unreachable!() };
    c.apps = vec![line(vec![(1, 1)], false), line(vec![], true)];
    let g = granted(h.call(ClientRequest::StepCreate(c.clone()), &ann()));
    assert_eq!(g.rank_apps().unwrap(), vec![1, 0, 1]);
    c.request.overcommit = true; // the job's cores are all held now
    c.apps = vec![line(vec![(1, 3)], false)];
    let e = err(h.call(ClientRequest::StepCreate(c.clone()), &ann()));
    assert!(e.message.contains("--multi-prog") && e.message.contains("names rank 3"), "{e}");
    // Mixed kinds and empty programs are bad requests.
    c.apps = vec![line(vec![(0, 0)], false), part("a", tasks(1))];
    assert_eq!(err(h.call(ClientRequest::StepCreate(c.clone()), &ann())).code, ErrorCode::BadRequest);
    c.apps = vec![part("", tasks(1))];
    assert!(err(h.call(ClientRequest::StepCreate(c), &ann()))
        .message
        .contains("program 1 of the MPMD command is empty"));
}

fn counts(items: &[(&str, u32)]) -> berth_core::gres::Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// `berth run`/`srun` outside a job asking for GPUs, generic resources and licenses.
fn interactive_with(gpus: Option<u32>, gres: &[(&str, u32)], licenses: &[(&str, u32)]) -> ClientRequest {
    let ClientRequest::StepCreate(mut c) = interactive(tasks(1), None) else { unreachable!() };
    c.interactive.gpus = gpus;
    c.interactive.gres = counts(gres);
    c.interactive.licenses = counts(licenses);
    ClientRequest::StepCreate(c)
}

/// Issue 20: an interactive allocation (`berth run --gpus 1 --gres nvme:500 -L matlab:2`
/// outside a job) holds its GPU, generic resources and licenses while its step runs, others
/// are told to try again (naming the license), and its end gives everything back; asks no
/// node or the cluster could ever give, or malformed ones, are refused as a submission's.
#[test]
fn interactive_allocations_hold_gpus_gres_and_licenses_until_they_end() {
    let mut t = Topology::uniform(1, 2, 4, 1, 1 << 30);
    t.add_emulated_gpus(1).expect("emulated GPUs");
    let mut h = Harness::with_config_and_topology(2, t, |c| {
        c.licenses = counts(&[("matlab", 2)]);
        c.gres.insert("n1".into(), counts(&[("nvme", 800)]));
    });
    let g = granted(h.call(interactive_with(Some(1), &[("nvme", 500)], &[("matlab", 2)]), &ann()));
    let part = &h.ctl.jobs[&g.job].allocation;
    assert_eq!(part.len(), 1);
    assert_eq!((part[0].node.as_str(), part[0].gpus.len()), ("n1", 1));
    assert_eq!(part[0].gres, counts(&[("nvme", 500)]));
    assert_eq!(part[0].licenses, counts(&[("matlab", 2)]));
    assert_eq!(h.ctl.jobs[&g.job].options.licenses, Some(counts(&[("matlab", 2)])));
    assert_eq!(h.ctl.license_info()[0].used, 2);
    assert_eq!(h.ctl.node_info(1, false).gpus_allocated, 1);
    assert_eq!(h.ctl.node_info(1, false).gres[0].used, 500);
    // The licenses are all held: another user's ask waits, told which.
    let r = h.call(interactive_with(None, &[], &[("matlab", 1)]), &bob());
    let ClientResponse::TryAgain { reason } = r else { panic!("{r:?}") };
    assert!(reason.contains("matlab"), "{reason}");
    // Never, or malformed: refused, nothing made.
    for (req, code, want) in [
        (interactive_with(None, &[], &[("matlab", 3)]), ErrorCode::Infeasible, "the cluster has 2"),
        (interactive_with(None, &[], &[("ansys", 1)]), ErrorCode::Infeasible, "ansys"),
        (interactive_with(None, &[("fpga", 1)], &[]), ErrorCode::Infeasible, "no node has generic resource fpga"),
        (interactive_with(None, &[("nvme", 900)], &[]), ErrorCode::Infeasible, "the most a node has is 800"),
        (interactive_with(None, &[("bad name", 1)], &[]), ErrorCode::BadRequest, "--gres"),
        (interactive_with(None, &[("gpu", 1)], &[]), ErrorCode::BadRequest, "--gpus"),
        (interactive_with(Some(0), &[], &[]), ErrorCode::BadRequest, "at least 1"),
        (interactive_with(Some(5000), &[], &[]), ErrorCode::BadRequest, "at most"),
    ] {
        let e = err(h.call(req, &bob()));
        assert_eq!(e.code, code, "{want}: {e}");
        assert!(e.message.contains(want), "{want}: {e}");
    }
    // --gpus-per-task sets the GPUs from the ranks: not beside a GPU count.
    let ClientRequest::StepCreate(mut c) = interactive_with(Some(1), &[], &[]) else { unreachable!() };
    c.request.gpus_per_task = Some(1);
    let e = err(h.call(ClientRequest::StepCreate(c), &bob()));
    assert!(e.message.contains("not both"), "{e}");
    // --sockets-per-node alone is refused naming it.
    let ClientRequest::StepCreate(mut c) = interactive_with(None, &[], &[]) else { unreachable!() };
    c.interactive.sockets_per_node = Some(1);
    let e = err(h.call(ClientRequest::StepCreate(c), &bob()));
    assert!(e.message.contains("--sockets-per-node"), "{e}");
    assert_eq!(h.ctl.jobs.len(), 1);
    // The step ends: everything is free again, and another may have them.
    assert!(done(h.call(ClientRequest::StepEnd { job: g.job, step: 1, outcome: end_outcome(0) }, &ann())).ok);
    assert_eq!(h.ctl.license_info()[0].used, 0);
    assert_eq!(h.ctl.node_info(1, false).gpus_allocated, 0);
    assert_eq!(h.ctl.node_info(1, false).gres[0].used, 0);
    let g2 = granted(h.call(interactive_with(Some(1), &[("nvme", 800)], &[("matlab", 2)]), &bob()));
    assert_eq!(h.ctl.jobs[&g2.job].allocation[0].licenses, counts(&[("matlab", 2)]));
}

/// The next step id is decided from memory (`Controller::counts`): what the store would say
/// (one more than any step the job had), across a restart, and for an ended job requeued
/// (its ids go on from its earlier runs').
#[test]
fn step_ids_come_from_memory_as_the_store_would_give_them_across_a_restart_and_a_requeue() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    let from_store = |h: &Harness| h.ctl.store.job_counts_of(id).unwrap().1 + 1;
    assert_eq!((h.ctl.counts.next_step(id), from_store(&h)), (1, 1));
    for want in 1..=2 {
        let g = granted(h.call(run(Some(id), tasks(2)), &ann()));
        assert_eq!(g.step, want);
        assert!(done(h.call(ClientRequest::StepEnd { job: id, step: want, outcome: end_outcome(0) }, &ann())).ok);
    }
    assert_eq!((h.ctl.counts.next_step(id), from_store(&h)), (3, 3));
    // No step is open any more; a restarted controller still knows the next id.
    let mut h = h.restart();
    assert!(h.ctl.steps.of(id).is_empty());
    assert_eq!((h.ctl.counts.next_step(id), from_store(&h)), (3, 3));
    assert_eq!(granted(h.call(run(Some(id), tasks(2)), &ann())).step, 3);
    // The job ends: it leaves memory, and its counts with it.
    h.agent(0, AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } });
    assert!(!h.ctl.jobs.contains_key(&id));
    assert_eq!(h.ctl.counts, crate::model::counts::JobCounts::default());
    // Requeued once ended, it comes back with what its history says.
    let ClientResponse::Done { results } = h.call(ClientRequest::Requeue { ids: vec![id], only: vec![] }, &ann())
    else {
        panic!("requeue not answered")
    };
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    assert_eq!((h.ctl.counts.next_step(id), from_store(&h)), (4, 4));
    assert_eq!(h.ctl.counts.requeues(id), h.ctl.store.count_events(id, "requeue").unwrap());
    assert_eq!(h.ctl.counts.requeues(id), 1);
}

/// A step's end is decided from memory (its owner, whether it made its allocation, whether it
/// is still open): the live steps in memory are the store's open rows, before and after a
/// restart; an agent's report of a step ended already changes nothing.
#[test]
fn live_steps_in_memory_are_the_open_rows_and_a_late_report_of_an_ended_one_is_ignored() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(8), ..Default::default() }, &ann());
    for _ in 0..2 {
        granted(h.call(run(Some(id), tasks(2)), &ann()));
    }
    let same = |h: &Harness| {
        let mut rows: Vec<_> =
            h.ctl.store.live_steps().unwrap().into_iter().map(|r| (r.step, r.uid, r.user, r.interactive)).collect();
        let mut live: Vec<_> =
            h.ctl.steps.iter().map(|(_, s)| (s.step, s.uid, s.user.clone(), s.interactive)).collect();
        rows.sort();
        live.sort();
        assert_eq!(live, rows);
        live.len()
    };
    assert_eq!(same(&h), 2);
    let mut h = h.restart();
    assert_eq!(same(&h), 2);
    assert!(done(h.call(ClientRequest::StepEnd { job: id, step: 1, outcome: end_outcome(0) }, &ann())).ok);
    assert_eq!(same(&h), 1);
    let ends = |h: &Harness| events_of(h, "step_end").len();
    assert_eq!(ends(&h), 1);
    h.agent(0, AgentMessage::StepEnded { job: id, step: 1, exit_code: 9, failure: None });
    assert_eq!(ends(&h), 1, "ended already: not closed again");
    h.agent(0, AgentMessage::StepEnded { job: id, step: 2, exit_code: 0, failure: None });
    assert_eq!((ends(&h), same(&h)), (2, 0), "open: closed by the agent's report");
}
