use super::*;
use crate::testkit::*;
use berth_core::directives::ArraySpec;
use berth_core::job::JobOutcome;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::client::{ClientRequest, SubmitRequest};

fn opts(array: &str) -> SubmitOptions {
    SubmitOptions {
        cores: Some(1),
        walltime: Some(600),
        mem: Some(1 << 20),
        output: Some("out/%A_%a.out".into()),
        array: Some(ArraySpec::parse_slurm(array).unwrap()),
        ..Default::default()
    }
}

fn submit_req(options: SubmitOptions) -> ClientRequest {
    ClientRequest::Submit(Box::new(SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options,
        env: vec![("SLURM_ARRAY_TASK_ID".into(), "99".into())],
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

fn running(h: &Harness, array: JobId) -> usize {
    h.ctl
        .jobs
        .values()
        .filter(|j| j.options.array_task.is_some_and(|t| t.job == array.0) && j.state.has_allocation())
        .count()
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
fn one_task_per_index_with_consecutive_ids_patterns_and_environment() {
    let mut h = Harness::new(2);
    let a = submit(&mut h, opts("1,3,5-9:2"));
    let tasks = h.ctl.array_tasks(a);
    assert_eq!(tasks, (a.0..a.0 + 5).map(JobId).collect::<Vec<_>>());
    let facts: Vec<_> = tasks.iter().map(|id| h.ctl.jobs[id].options.array_task.unwrap()).collect();
    assert_eq!(facts.iter().map(|t| t.index).collect::<Vec<_>>(), vec![1, 3, 5, 7, 9]);
    assert!(facts.iter().all(|t| t.job == a.0 && t.count == 5 && t.min == 1 && t.max == 9 && t.step == 2));
    assert!(tasks.iter().all(|id| h.ctl.jobs[id].options.array.is_none()));
    assert_eq!(h.ctl.jobs[&tasks[2]].stdout, format!("/tmp/out/{a}_5.out"));
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: tasks[1] }, &ann()) else { panic!() };
    assert_eq!((job.array_job, job.array_index), (Some(a), Some(3)));
    // Started: each task's environment says which it is; the submitter's stale value is gone.
    h.ctl.schedule(h.now).unwrap();
    let spec = h.ctl.launch_spec(&h.ctl.jobs[&tasks[1]], 0);
    let get = |k: &str| spec.env.iter().filter(|(n, _)| n == k).map(|(_, v)| v.clone()).collect::<Vec<_>>();
    assert_eq!(get("SLURM_ARRAY_TASK_ID"), vec!["3"]);
    assert_eq!(get("SLURM_ARRAY_JOB_ID"), vec![a.to_string()]);
    assert_eq!(get("BERTH_ARRAY_TASK_ID"), vec!["3"]);
    assert_eq!(get("PBS_ARRAY_INDEX"), vec!["3"]);
    assert_eq!(get("PBS_ARRAY_ID"), vec![format!("{a}[]")]);
    assert_eq!(
        (
            get("SLURM_ARRAY_TASK_COUNT"),
            get("SLURM_ARRAY_TASK_MIN"),
            get("SLURM_ARRAY_TASK_MAX"),
            get("SLURM_ARRAY_TASK_STEP")
        ),
        (vec!["5".to_string()], vec!["1".to_string()], vec!["9".to_string()], vec!["2".to_string()])
    );
    // A plain job gets none, even from a submitter inside a task.
    let plain = submit(&mut h, SubmitOptions { array: None, ..opts("1") });
    h.ctl.schedule(h.now).unwrap();
    if h.ctl.jobs[&plain].state == JobState::Running {
        let spec = h.ctl.launch_spec(&h.ctl.jobs[&plain], 0);
        assert!(!spec.env.iter().any(|(k, _)| k.contains("ARRAY")), "{:?}", spec.env);
    }
    assert!(h.ctl.array_tasks(plain).is_empty());
    assert!(h.ctl.array_tasks(tasks[1]).is_empty(), "a task's own id is not its array's");
}

#[test]
fn too_big_or_forged_arrays_are_refused() {
    let mut h = Harness::with_config(1, |c| c.scheduler.max_array_size = 100);
    match h.call(submit_req(opts("0-100")), &ann()) {
        ClientResponse::Error(e) => assert!(e.message.contains("max_array_size"), "{}", e.message),
        other => panic!("{other:?}"),
    }
    assert!(h.ctl.jobs.is_empty());
    assert!(matches!(h.call(submit_req(opts("0-99")), &ann()), ClientResponse::Submitted { .. }));
    assert_eq!(h.ctl.jobs.len(), 100);
    // A client may not make its job a task of someone's array.
    let mut forged = opts("1");
    forged.array = None;
    forged.array_task = Some(berth_core::directives::array::tasks(1, &[7], Some(1))[0]);
    let id = submit(&mut h, forged);
    assert_eq!(h.ctl.jobs[&id].options.array_task, None);
    // Arrays are not taken in a batch.
    let ClientRequest::Submit(sub) = submit_req(opts("1-2")) else { panic!() };
    let r = h.call(ClientRequest::SubmitBatch { jobs: vec![*sub] }, &ann());
    assert!(matches!(r, ClientResponse::Error(_)), "{r:?}");
}

#[test]
fn the_running_limit_holds() {
    let mut h = Harness::new(2);
    let a = submit(&mut h, opts("0-5%2"));
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(running(&h, a), 2, "8 free cores, at most 2 tasks");
    let tasks = h.ctl.array_tasks(a);
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: tasks[5] }, &ann()) else { panic!() };
    assert!(job.reason.unwrap_or_default().starts_with("JobArrayTaskLimit"));
    // Others' jobs are not held back by it.
    let other = submit(&mut h, SubmitOptions { array: None, ..opts("1") });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, other), JobState::Running);
    let mut seen = 2;
    while seen < 6 {
        let run: Vec<JobId> =
            tasks.iter().copied().filter(|t| h.ctl.jobs.get(t).is_some_and(|j| j.state == JobState::Running)).collect();
        assert!(run.len() <= 2);
        end(&mut h, run[0], 0);
        assert!(running(&h, a) <= 2);
        seen += 1;
    }
    while let Some(t) = tasks.iter().copied().find(|t| h.ctl.jobs.contains_key(t)) {
        end(&mut h, t, 0);
    }
    assert!(tasks.iter().all(|t| state(&h, *t) == JobState::Completed));
}

#[test]
fn cancel_hold_and_release_a_whole_array_or_one_task() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, opts("0-9%2"));
    h.ctl.schedule(h.now).unwrap();
    let tasks = h.ctl.array_tasks(a);
    // One task by its own id.
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![tasks[7]], only: vec![] }, &ann())
    else {
        panic!()
    };
    assert!(results[0].ok);
    assert_eq!(state(&h, tasks[7]), JobState::Cancelled);
    assert_eq!(state(&h, tasks[8]), JobState::Queued);
    // The first task named `A_0` (its id is the array's): that task alone.
    let ClientResponse::Done { results } = h.call(ClientRequest::Hold { ids: vec![a], only: vec![a] }, &ann()) else {
        panic!()
    };
    assert!(!results[0].ok, "the first task runs: nothing to hold, and no other task held: {results:?}");
    assert_eq!(state(&h, tasks[8]), JobState::Queued);
    assert_eq!(state(&h, tasks[0]), JobState::Running);
    // Hold and release of the array: its pending tasks.
    let ClientResponse::Done { results } = h.call(ClientRequest::Hold { ids: vec![a], only: vec![] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok, "{results:?}");
    assert_eq!(state(&h, tasks[8]), JobState::Held);
    assert_eq!(state(&h, tasks[0]), JobState::Running);
    let ClientResponse::Done { results } = h.call(ClientRequest::Release { ids: vec![a], only: vec![] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok, "{results:?}");
    assert_eq!(state(&h, tasks[8]), JobState::Queued);
    // Someone else may not.
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![a], only: vec![] }, &bob()) else {
        panic!()
    };
    assert!(!results[0].ok);
    // The first task ended: the array's id still names the rest.
    end(&mut h, a, 0);
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![a], only: vec![] }, &ann()) else {
        panic!()
    };
    assert_eq!(results.len(), 1);
    assert!(results[0].ok, "{results:?}");
    h.sent();
    // Running tasks were sent a kill; pending ones are cancelled at once.
    assert_eq!(state(&h, tasks[9]), JobState::Cancelled);
    assert_eq!(state(&h, a), JobState::Completed);
    for t in &tasks[1..] {
        if let Some(j) = h.ctl.jobs.get(t) {
            assert!(j.kill_sent.is_some(), "task {t} neither cancelled nor killed");
        }
    }
}

#[test]
fn afterok_on_an_array_waits_for_every_task() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, opts("1-3"));
    let dep = SubmitOptions {
        array: None,
        dependency: Some(berth_core::directives::Dependency::parse_slurm(&format!("afterok:{a}")).unwrap()),
        ..opts("1")
    };
    let after = submit(&mut h, dep.clone());
    h.ctl.schedule(h.now).unwrap();
    let tasks = h.ctl.array_tasks(a);
    end(&mut h, tasks[0], 0);
    end(&mut h, tasks[1], 0);
    assert_eq!(state(&h, after), JobState::Queued, "task 3 still runs");
    end(&mut h, tasks[2], 0);
    assert_eq!(state(&h, after), JobState::Running);
    // One task failing: never.
    let b = submit(&mut h, opts("1-2"));
    let never = submit(
        &mut h,
        SubmitOptions {
            dependency: Some(berth_core::directives::Dependency::parse_slurm(&format!("afterok:{b}")).unwrap()),
            ..dep
        },
    );
    h.ctl.schedule(h.now).unwrap();
    let bt = h.ctl.array_tasks(b);
    for t in bt {
        if h.ctl.jobs.get(&t).is_some_and(|j| j.state == JobState::Running) {
            end(&mut h, t, if t == b { 1 } else { 0 });
        }
    }
    while let Some(t) = h.ctl.array_tasks(b).first().copied() {
        end(&mut h, t, 0);
    }
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id: never }, &ann()) else { panic!() };
    assert!(job.reason.unwrap_or_default().starts_with("DependencyNeverSatisfied"));
}

#[test]
fn an_array_survives_a_restart() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, opts("0-5%1"));
    h.ctl.schedule(h.now).unwrap();
    let before: Vec<_> = h.ctl.array_tasks(a);
    let mut h = h.restart();
    assert_eq!(h.ctl.array_tasks(a), before);
    let t = h.ctl.jobs[&before[4]].options.array_task.unwrap();
    assert_eq!((t.job, t.index, t.count, t.limit), (a.0, 4, 6, Some(1)));
    // The script and environment, written once for the array, are every task's again.
    for id in &before {
        let j = &h.ctl.jobs[id];
        assert_eq!(&*j.script, "#!/bin/sh\ntrue\n", "task {id}");
        assert_eq!(*j.env, vec![("SLURM_ARRAY_TASK_ID".to_string(), "99".to_string())], "task {id}");
    }
    assert!(std::sync::Arc::ptr_eq(&h.ctl.jobs[&before[1]].script, &h.ctl.jobs[&before[5]].script));
    let stored = h.ctl.store.get_job(before[3]).unwrap().unwrap();
    assert_eq!(&*stored.script, "#!/bin/sh\ntrue\n");
    // One `submit` event for the whole array.
    assert_eq!(h.ctl.store.count_events(a, "submit").unwrap(), 1);
    assert_eq!(h.ctl.store.count_events(before[2], "submit").unwrap(), 0);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(running(&h, a), 1, "the limit holds after a restart");
    let _ = h.sent().into_iter().filter(|(_, m)| matches!(m, ControllerMessage::Launch(_))).count();
}

#[test]
fn the_first_task_named_alone_is_cancelled_alone() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, opts("0-3%1"));
    let tasks = h.ctl.array_tasks(a);
    assert_eq!(tasks[0], a, "the first task has the array's id");
    // `A_0` (the client sends it in `only`): that task, pending, and no other.
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![a], only: vec![a] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok, "{results:?}");
    assert_eq!(state(&h, a), JobState::Cancelled);
    for t in &tasks[1..] {
        assert_eq!(state(&h, *t), JobState::Queued, "task {t}");
    }
    // The array's id without `only` still names every task left.
    let ClientResponse::Done { results } = h.call(ClientRequest::Cancel { ids: vec![a], only: vec![] }, &ann()) else {
        panic!()
    };
    assert!(results[0].ok, "{results:?}");
    assert!(tasks.iter().all(|t| state(&h, *t) == JobState::Cancelled));
}
