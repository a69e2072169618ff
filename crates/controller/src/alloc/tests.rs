use super::*;
use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobOutcome;
use berth_core::step::StepRequest;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::client::{ClientRequest, SubmitRequest};

fn alloc_req(options: SubmitOptions, no_shell: bool) -> ClientRequest {
    ClientRequest::Alloc(Box::new(AllocRequest {
        submit: SubmitRequest {
            script: String::new(),
            script_name: "sh".into(),
            options,
            env: vec![("PATH".into(), "/bin".into())],
            cwd: "/home/ann".into(),
            hold: false,
            ignore_unsupported: false,
        },
        no_shell,
    }))
}

fn cores(n: u32) -> SubmitOptions {
    SubmitOptions { cores: Some(n), ..Default::default() }
}

fn alloc(h: &mut Harness, options: SubmitOptions, no_shell: bool) -> JobId {
    match h.call(alloc_req(options, no_shell), &ann()) {
        ClientResponse::Submitted { id } => id,
        other => panic!("not submitted: {other:?}"),
    }
}

fn state(h: &Harness, id: JobId) -> JobState {
    match h.ctl.jobs.get(&id) {
        Some(j) => j.state,
        None => h.ctl.store.get_job(id).unwrap().expect("a stored job").state,
    }
}

fn stored(h: &Harness, id: JobId) -> crate::model::job::JobRecord {
    h.ctl.store.get_job(id).unwrap().expect("a stored job")
}

#[test]
fn queued_behind_a_batch_job_then_granted_and_released_with_the_exit_code() {
    let mut h = Harness::new(1);
    let batch = h.batch(cores(8), &ann());
    let id = alloc(&mut h, cores(2), false);
    // Durable before its id was returned, and queued like a batch job.
    assert_eq!(stored(&h, id).options.alloc, Some(AllocKind::Held));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Queued);
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    assert_eq!(job.kind.as_deref(), Some("alloc"));
    h.sent();
    // The batch job ends: the allocation is granted; its node holds it, runs no script.
    h.agent(0, AgentMessage::JobEnded { id: batch, outcome: JobOutcome { exit_code: Some(0), ..Default::default() } });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    let launches: Vec<bool> = h
        .sent()
        .into_iter()
        .filter_map(|(_, m)| match m {
            ControllerMessage::Launch(s) if s.id == id => Some(s.head),
            _ => None,
        })
        .collect();
    assert_eq!(launches, vec![false], "one hold, no batch script");
    // `berth run` inside it is a step of it.
    let step = step_create(Some(id), StepRequest { ntasks: Some(1), ..Default::default() });
    assert!(matches!(h.call(ClientRequest::StepCreate(Box::new(step)), &ann()), ClientResponse::StepGranted { .. }));
    // Someone else may not release it; its holder does, with its command's exit code.
    assert!(
        matches!(h.call(ClientRequest::AllocEnd { id, exit_code: 0 }, &bob()), ClientResponse::Error(e) if e.code == ErrorCode::NotPermitted)
    );
    assert!(matches!(h.call(ClientRequest::AllocEnd { id, exit_code: 7 }, &ann()), ClientResponse::Done { .. }));
    let j = stored(&h, id);
    assert_eq!((j.state, j.exit_code), (JobState::Failed, Some(7)));
    assert_eq!(h.free_cores(), 8);
    assert!(h.ctl.alloc_holders.is_empty());
    // Releasing it again is no error; a batch job is not an allocation.
    assert!(matches!(h.call(ClientRequest::AllocEnd { id, exit_code: 7 }, &ann()), ClientResponse::Done { .. }));
    let other = h.batch(cores(1), &ann());
    assert!(
        matches!(h.call(ClientRequest::AllocEnd { id: other, exit_code: 0 }, &ann()), ClientResponse::Error(e) if e.code == ErrorCode::InvalidState)
    );
}

#[test]
fn released_when_its_connection_drops_pending_or_granted() {
    let mut h = Harness::new(1);
    let running = alloc(&mut h, cores(8), false);
    let waiting = alloc(&mut h, cores(8), false);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!((state(&h, running), state(&h, waiting)), (JobState::Running, JobState::Queued));
    h.ctl.client_gone(ann().conn, h.now).unwrap();
    let r = stored(&h, running);
    assert_eq!((r.state, r.reason.as_deref()), (JobState::Failed, Some(ALLOC_DISCONNECTED)));
    assert_eq!(stored(&h, waiting).state, JobState::Cancelled);
    assert_eq!(h.free_cores(), 8);
    // Another connection's allocation is not touched.
    let kept = alloc(&mut h, cores(1), false);
    h.ctl.client_gone(bob().conn, h.now).unwrap();
    assert_eq!(state(&h, kept), JobState::Queued);
}

#[test]
fn ends_at_its_walltime() {
    let mut h = Harness::new(1);
    let id = alloc(&mut h, SubmitOptions { cores: Some(2), walltime: Some(60), ..Default::default() }, false);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    h.ctl.check_interactive(h.now + 30.0).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    h.ctl.check_interactive(h.now + 61.0).unwrap();
    let j = stored(&h, id);
    assert_eq!((j.state, j.reason.as_deref()), (JobState::Timeout, Some("walltime")));
    assert_eq!(h.free_cores(), 8);
}

#[test]
fn no_shell_outlives_its_connection_once_granted_until_cancelled() {
    let mut h = Harness::new(1);
    let id = alloc(&mut h, cores(4), true);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    h.ctl.client_gone(ann().conn, h.now).unwrap();
    h.ctl.check_interactive(h.now + 1.0).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![id], only: vec![] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok);
    assert_eq!(stored(&h, id).state, JobState::Cancelled);
    assert_eq!(h.free_cores(), 8);
}

#[test]
fn after_a_restart_allocations_whose_client_is_gone_end() {
    let mut h = Harness::new(1);
    let held = alloc(&mut h, cores(2), false);
    let no_shell = alloc(&mut h, cores(2), true);
    h.ctl.schedule(h.now).unwrap();
    let waiting_held = alloc(&mut h, cores(8), false);
    let waiting_no_shell = alloc(&mut h, cores(8), true);
    h.ctl.schedule(h.now).unwrap();
    let mut h = h.restart();
    // Their holders have a minute to hold them again (`berth alloc` reconnects).
    h.ctl.check_interactive(h.now).unwrap();
    assert_eq!(state(&h, held), JobState::Running);
    assert_eq!(state(&h, waiting_held), JobState::Queued);
    h.now += berth_protocol::client::ALLOC_RECLAIM_SECS + 1.0;
    h.ctl.check_interactive(h.now).unwrap();
    assert_eq!(stored(&h, held).state, JobState::Failed);
    assert_eq!(stored(&h, held).reason.as_deref(), Some(ALLOC_CLIENT_GONE));
    assert_eq!(state(&h, no_shell), JobState::Running);
    assert_eq!(stored(&h, waiting_held).state, JobState::Cancelled);
    assert_eq!(stored(&h, waiting_no_shell).state, JobState::Cancelled);
}

#[test]
fn after_a_restart_holders_hold_their_allocations_again_and_only_theirs() {
    let mut h = Harness::new(1);
    let held = alloc(&mut h, cores(2), false);
    h.ctl.schedule(h.now).unwrap();
    let waiting = alloc(&mut h, cores(8), false);
    let batch = h.batch(cores(1), &ann());
    let mut h = h.restart();
    h.ctl.check_interactive(h.now).unwrap();
    let hold = |h: &mut Harness, id: JobId, peer: &Peer| h.call(ClientRequest::AllocHold { id }, peer);
    let ClientResponse::Error(e) = hold(&mut h, held, &bob()) else { panic!("bob held ann's allocation") };
    assert_eq!(e.code, ErrorCode::NotPermitted);
    let ClientResponse::Error(e) = hold(&mut h, batch, &ann()) else { panic!("a batch job held") };
    assert_eq!(e.code, ErrorCode::InvalidState);
    let ClientResponse::Error(e) = hold(&mut h, JobId(999), &ann()) else { panic!("an unknown job held") };
    assert_eq!(e.code, ErrorCode::UnknownJob);
    for id in [held, waiting] {
        assert!(matches!(hold(&mut h, id, &ann()), ClientResponse::Done { .. }), "job {id}");
    }
    // Another connection of ann's cannot take it over while the first holds it.
    let mut other = ann();
    other.conn += 1000;
    let ClientResponse::Error(e) = hold(&mut h, held, &other) else { panic!("held twice") };
    assert!(e.message.contains("held by another"), "{e}");
    h.now += berth_protocol::client::ALLOC_RECLAIM_SECS + 1.0;
    h.ctl.check_interactive(h.now).unwrap();
    assert_eq!(state(&h, held), JobState::Running, "held again: kept");
    assert_eq!(state(&h, waiting), JobState::Queued);
    // The holder's connection closes: it ends as before.
    h.ctl.allocs_gone(ann().conn, h.now).unwrap();
    assert_eq!(stored(&h, held).state, JobState::Failed);
}

#[test]
fn a_batch_submission_cannot_make_itself_an_allocation_nor_an_allocation_an_array() {
    let mut h = Harness::new(1);
    let id = h.batch(SubmitOptions { cores: Some(1), alloc: Some(AllocKind::NoShell), ..Default::default() }, &ann());
    assert_eq!(h.ctl.jobs[&id].options.alloc, None);
    assert!(!h.ctl.jobs[&id].is_interactive());
    let mut options = cores(1);
    options.set("array", "0-3").unwrap();
    let ClientResponse::Error(e) = h.call(alloc_req(options, false), &ann()) else { panic!("an array allocation") };
    assert!(e.message.contains("array"), "{e}");
    let ClientRequest::Alloc(mut req) = alloc_req(cores(1), false) else { unreachable!() };
    req.submit.script = "#!/bin/sh\ntrue\n".into();
    let ClientResponse::Error(e) = h.call(ClientRequest::Alloc(req), &ann()) else { panic!("a script") };
    assert_eq!(e.code, ErrorCode::BadRequest);
}
