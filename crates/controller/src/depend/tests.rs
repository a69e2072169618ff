use super::*;
use crate::testkit::*;
use berth_core::directives::SubmitOptions;
use berth_core::job::JobOutcome;
use berth_protocol::agent::AgentMessage;
use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, SubmitRequest};

fn opts(dependency: Option<&str>) -> SubmitOptions {
    SubmitOptions {
        cores: Some(1),
        walltime: Some(600),
        mem: Some(1 << 20),
        dependency: dependency.map(|d| Dependency::parse_slurm(d).unwrap()),
        ..Default::default()
    }
}

fn submit_req(options: SubmitOptions) -> ClientRequest {
    ClientRequest::Submit(Box::new(SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options,
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    }))
}

fn submit(h: &mut Harness, options: SubmitOptions) -> JobId {
    match h.call(submit_req(options), &ann()) {
        ClientResponse::Submitted { id } => id,
        other => panic!("not submitted: {other:?}"),
    }
}

fn state(h: &Harness, id: JobId) -> JobState {
    h.ctl.jobs.get(&id).map(|j| j.state).unwrap_or_else(|| h.ctl.store.job_state(id).unwrap().unwrap().0)
}

fn reason(h: &mut Harness, id: JobId) -> String {
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    // The code comes with the words, from the same reason: these begin with their code.
    if let Some(code) =
        job.reason_code.as_deref().filter(|c| ["Dependency", "DependencyNeverSatisfied", "BeginTime"].contains(c))
    {
        let words = job.reason.as_deref().unwrap_or_default();
        assert!(words.starts_with(&format!("{code}:")), "{code}: {words}");
    }
    if job.state.is_pending() {
        assert_eq!(job.reason.is_some(), job.reason_code.is_some(), "{:?}", job.reason);
    }
    job.reason.unwrap_or_default()
}

fn end(h: &mut Harness, id: JobId, exit_code: i32) {
    let node = h.ctl.jobs[&id].allocation[0].node_id.0 as usize;
    h.agent(
        node,
        AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(exit_code), ..Default::default() } },
    );
    h.ctl.schedule(h.now).unwrap();
}

#[test]
fn afterok_afternotok_afterany_after_wait_then_run_or_never() {
    let mut h = Harness::new(2);
    let a = h.batch(opts(None), &ann());
    let ok = submit(&mut h, opts(Some(&format!("afterok:{a}"))));
    let notok = submit(&mut h, opts(Some(&format!("afternotok:{a}"))));
    let any = submit(&mut h, opts(Some(&format!("afterany:{a}"))));
    let after = submit(&mut h, opts(Some(&format!("after:{a}"))));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, after), JobState::Running, "after: A has started");
    for id in [ok, notok, any] {
        assert_eq!(state(&h, id), JobState::Queued);
        let why = reason(&mut h, id);
        assert!(why.starts_with("Dependency: waits for job"), "{why}");
    }
    // Jobs ahead of nothing else still start: the waiting ones take no reservation.
    let free = submit(&mut h, opts(None));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, free), JobState::Running);
    end(&mut h, a, 0);
    assert_eq!(state(&h, ok), JobState::Running);
    assert_eq!(state(&h, any), JobState::Running);
    assert_eq!(state(&h, notok), JobState::Queued, "never runs: A succeeded");
    let why = reason(&mut h, notok);
    assert!(why.starts_with("DependencyNeverSatisfied: job") && why.contains("completed"), "{why}");
    // It stays so (Slurm's default) until cancelled.
    h.ctl.schedule(h.now + 100.0).unwrap();
    assert_eq!(state(&h, notok), JobState::Queued);
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![notok], only: vec![] }, &ann())
    else {
        panic!()
    };
    assert!(results[0].ok);
    assert_eq!(state(&h, notok), JobState::Cancelled);
}

#[test]
fn a_failed_job_runs_afternotok_and_never_afterok_and_unknown_ids_are_refused() {
    let mut h = Harness::new(1);
    let a = h.batch(opts(None), &ann());
    let ok = submit(&mut h, opts(Some(&format!("afterok:{a}"))));
    let notok = submit(&mut h, opts(Some(&format!("afternotok:{a}"))));
    end(&mut h, a, 3);
    assert_eq!(state(&h, a), JobState::Failed);
    assert_eq!(state(&h, notok), JobState::Running);
    assert_eq!(state(&h, ok), JobState::Queued);
    assert!(reason(&mut h, ok).starts_with("DependencyNeverSatisfied"));
    // A finished job may still be named (read from the store); an unknown one may not.
    let later = submit(&mut h, opts(Some(&format!("afterany:{a}"))));
    h.ctl.schedule(h.now).unwrap();
    assert_ne!(state(&h, later), JobState::Queued);
    let ClientResponse::Error(e) = h.call(submit_req(opts(Some("afterok:999"))), &ann()) else { panic!() };
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert!(e.message.contains("job 999 does not exist"), "{e}");
}

#[test]
fn any_of_and_singleton() {
    let mut h = Harness::new(2);
    let a = h.batch(opts(None), &ann());
    let held = submit(&mut h, SubmitOptions { hold: Some(true), ..opts(None) });
    assert_eq!(state(&h, held), JobState::Held, "--hold in the options submits held");
    let either = submit(&mut h, opts(Some(&format!("afterok:{held}?after:{a}"))));
    let both = submit(&mut h, opts(Some(&format!("afterok:{held},after:{a}"))));
    let named = |h: &mut Harness| {
        let mut o = opts(Some("singleton"));
        o.name = Some("one".into());
        submit(h, o)
    };
    let (s1, s2) = (named(&mut h), named(&mut h));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, either), JobState::Running, "one of them is enough");
    assert_eq!(state(&h, both), JobState::Queued);
    assert_eq!(state(&h, s1), JobState::Running);
    assert_eq!(state(&h, s2), JobState::Queued, "one job of a name at a time");
    assert!(reason(&mut h, s2).contains("singleton"));
    end(&mut h, s1, 0);
    assert_eq!(state(&h, s2), JobState::Running);
}

#[test]
fn begin_time_defers_the_start_and_is_bounded() {
    let mut h = Harness::new(1);
    let later = submit(&mut h, SubmitOptions { begin: Some(Begin::In(100)), ..opts(None) });
    assert_eq!(h.ctl.jobs[&later].options.begin, Some(Begin::At(1100)), "resolved at submission");
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, later), JobState::Queued);
    assert!(reason(&mut h, later).starts_with("BeginTime: starts no earlier than"));
    h.ctl.check_begin(h.now + 50.0);
    assert!(!h.ctl.dirty);
    h.now += 100.0;
    h.ctl.check_begin(h.now);
    assert!(h.ctl.dirty, "a pass is due when the time comes");
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, later), JobState::Running);
    let far = SubmitOptions { begin: Some(Begin::At(h.now as u64 + 2 * 366 * 86_400)), ..opts(None) };
    let ClientResponse::Error(e) = h.call(submit_req(far), &ann()) else { panic!() };
    assert!(e.message.contains("more than a year ahead"), "{e}");
    // A time already past starts at once.
    let past = submit(&mut h, SubmitOptions { begin: Some(Begin::At(10)), ..opts(None) });
    h.ctl.schedule(h.now).unwrap();
    assert_ne!(state(&h, past), JobState::Queued);
}

#[test]
fn a_waiting_dependency_survives_a_restart() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, SubmitOptions { hold: Some(true), ..opts(None) });
    let b = submit(&mut h, SubmitOptions { begin: Some(Begin::In(5)), ..opts(Some(&format!("afterok:{a}"))) });
    h.ctl.schedule(h.now).unwrap();
    let mut h = h.restart();
    assert_eq!(h.ctl.jobs[&b].options.dependency.as_ref().map(ToString::to_string), Some(format!("afterok:{a}")));
    assert_eq!(h.ctl.jobs[&b].options.begin, Some(Begin::At(1005)));
    h.now += 10.0;
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, b), JobState::Queued);
    assert!(reason(&mut h, b).starts_with("Dependency:"));
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: b }, &ann()) else { panic!() };
    assert_eq!((job.dependency, job.begin_time), (Some(format!("afterok:{a}")), Some(1005.0)));
    let ClientResponse::Done { results } = h.call(ClientRequest::Release { ids: vec![a], only: vec![] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, a), JobState::Running);
    end(&mut h, a, 0);
    assert_eq!(state(&h, b), JobState::Running);
}

#[test]
fn judging() {
    let dep = |s: &str| Dependency::parse_slurm(s).unwrap();
    let states = |_, id: JobId| match id.0 {
        1 => Some((JobState::Completed, true)),
        2 => Some((JobState::Failed, true)),
        3 => Some((JobState::Running, true)),
        _ => None,
    };
    assert_eq!(judge(&dep("afterok:1"), states, true), Verdict::Ready);
    assert!(matches!(judge(&dep("afterok:1:2"), states, true), Verdict::Never(_)));
    assert!(matches!(judge(&dep("afterok:1:3"), states, true), Verdict::Wait(_)));
    assert_eq!(judge(&dep("afterok:2?afterok:1"), states, true), Verdict::Ready);
    assert!(matches!(judge(&dep("afterok:2?afterany:3"), states, true), Verdict::Wait(_)));
    assert!(matches!(judge(&dep("afterok:2?afterok:4"), states, true), Verdict::Never(_)));
    assert!(matches!(judge(&dep("afterany:1,singleton"), states, false), Verdict::Wait(_)));
    assert_eq!(judge(&dep("afterany:1,singleton"), states, true), Verdict::Ready);
}

#[test]
fn begin_times_resolve_in_local_time() {
    let now = 1_800_000_000.0;
    assert_eq!(resolve_begin(Begin::In(60), now), Ok(1_800_000_060));
    let clock = resolve_begin(Begin::Clock { hour: 0, minute: 0, second: 0 }, now).unwrap();
    assert!(clock as f64 > now && clock as f64 <= now + 86_400.0 + 3600.0, "the next midnight: {clock}");
    let tomorrow = resolve_begin(Begin::Tomorrow, now).unwrap();
    assert_eq!(tomorrow, clock, "tomorrow is the next midnight");
    let date = Begin::Date { year: 2027, month: 2, day: 30, hour: 0, minute: 0, second: 0 };
    assert!(resolve_begin(date, now).unwrap_err().contains("no such date"));
    let date = Begin::Date { year: 2027, month: 2, day: 3, hour: 4, minute: 5, second: 6 };
    let t = resolve_begin(date, now).unwrap();
    assert_eq!(local_text(t as f64), "2027-02-03T04:05:06");
    assert!(resolve_begin(Begin::In(400 * 86_400), now).is_err());
    assert!(resolve_begin(Begin::In(u64::MAX), now).is_err(), "no wrap-around");
    assert!(resolve_begin(Begin::At(u64::MAX), now).is_err(), "no wrap-around");
}

#[test]
fn kill_invalid_depend_cancels_instead_of_waiting() {
    let mut h = Harness::with_config(1, |c| c.scheduler.kill_invalid_depend = true);
    let a = h.batch(opts(None), &ann());
    let ok = submit(&mut h, opts(Some(&format!("afterok:{a}"))));
    let notok = submit(&mut h, opts(Some(&format!("afternotok:{a}"))));
    end(&mut h, a, 0);
    assert_eq!(state(&h, ok), JobState::Running);
    assert_eq!(state(&h, notok), JobState::Cancelled);
    let j = h.ctl.store.get_job(notok).unwrap().unwrap();
    assert!(j.reason.as_deref().is_some_and(|r| r.starts_with("DependencyNeverSatisfied: job")), "{:?}", j.reason);
}

#[test]
fn malformed_dependencies_from_api_clients_are_refused() {
    let mut h = Harness::new(1);
    let a = h.batch(opts(None), &ann());
    for dep in [
        Dependency { terms: vec![], any: false },
        Dependency {
            terms: vec![berth_core::directives::DepTerm { kind: DepKind::Afterok, jobs: vec![] }],
            any: false,
        },
        Dependency {
            terms: vec![berth_core::directives::DepTerm { kind: DepKind::Singleton, jobs: vec![a] }],
            any: false,
        },
        Dependency {
            terms: vec![berth_core::directives::DepTerm { kind: DepKind::Afterany, jobs: vec![a; 65] }],
            any: false,
        },
    ] {
        let o = SubmitOptions { dependency: Some(dep.clone()), ..opts(None) };
        let ClientResponse::Error(e) = h.call(submit_req(o), &ann()) else { panic!("{dep:?} accepted") };
        assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    }
}

fn array(spec: &str, dependency: Option<&str>) -> SubmitOptions {
    SubmitOptions { array: Some(berth_core::directives::ArraySpec::parse_slurm(spec).unwrap()), ..opts(dependency) }
}

#[test]
fn aftercorr_waits_for_the_task_of_the_same_index_else_for_the_whole_job() {
    let mut h = Harness::new(2);
    let a = submit(&mut h, array("0-1", None));
    h.ctl.schedule(h.now).unwrap();
    let (a0, a1) = (a, JobId(a.0 + 1));
    assert_eq!((state(&h, a0), state(&h, a1)), (JobState::Running, JobState::Running));
    // Task i of b follows task i of a; task 2, of no counterpart, follows a as a whole.
    let b = submit(&mut h, array("0-2", Some(&format!("aftercorr:{a}"))));
    let (b0, b1, b2) = (b, JobId(b.0 + 1), JobId(b.0 + 2));
    // A job of no array follows a as a whole too (Slurm's rule).
    let lone = submit(&mut h, opts(Some(&format!("aftercorr:{a}"))));
    h.ctl.schedule(h.now).unwrap();
    for id in [b0, b1, b2, lone] {
        assert_eq!(state(&h, id), JobState::Queued);
        assert!(reason(&mut h, id).starts_with("Dependency: waits for job"), "{}", reason(&mut h, id));
    }
    // Task 0 of a, whose id is the array's, alone.
    end(&mut h, a0, 0);
    assert_eq!(state(&h, b0), JobState::Running, "its counterpart completed, while task 1 runs");
    assert_eq!(state(&h, b1), JobState::Queued);
    assert_eq!(state(&h, b2), JobState::Queued, "a is not over yet");
    assert_eq!(state(&h, lone), JobState::Queued);
    end(&mut h, a1, 0);
    assert_eq!(state(&h, b1), JobState::Running, "its counterpart completed");
    assert_eq!(state(&h, b2), JobState::Running, "a completed as a whole");
    assert_eq!(state(&h, lone), JobState::Running);
    // Shown as given.
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: b1 }, &ann()) else { panic!() };
    assert_eq!(job.dependency, Some(format!("aftercorr:{a}")));
}

#[test]
fn aftercorr_never_runs_a_task_whose_counterpart_failed_and_finds_tasks_of_uneven_indexes() {
    let mut h = Harness::new(2);
    let a = submit(&mut h, array("1,4,9", None));
    h.ctl.schedule(h.now).unwrap();
    let (a1, a4, a9) = (a, JobId(a.0 + 1), JobId(a.0 + 2));
    let b = submit(&mut h, array("4,9", Some(&format!("aftercorr:{a}"))));
    let (b4, b9) = (b, JobId(b.0 + 1));
    end(&mut h, a9, 0);
    assert_eq!(state(&h, b9), JobState::Running, "task 9 of a is the third of its ids");
    end(&mut h, a4, 2);
    assert_eq!(state(&h, b4), JobState::Queued);
    let why = reason(&mut h, b4);
    assert!(why.starts_with("DependencyNeverSatisfied") && why.contains(&a4.to_string()), "{why}");
    end(&mut h, a1, 0);
    assert_eq!(state(&h, b4), JobState::Queued, "never, whatever the other tasks do");
}
