use super::*;
use crate::testkit::*;
use berth_core::directives::{ArraySpec, SubmitOptions};
use berth_core::job::JobOutcome;
use berth_protocol::agent::{AgentMessage, ControllerMessage};
use berth_protocol::client::{ClientRequest, EventQuery, JobInfo, SubmitRequest};
use berth_protocol::user::UserIdentity;

fn root() -> Peer {
    Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 9 }
}

fn opts(cores: u32) -> SubmitOptions {
    SubmitOptions { cores: Some(cores), walltime: Some(600), mem: Some(1 << 20), ..Default::default() }
}

fn submit(h: &mut Harness, options: SubmitOptions, hold: bool) -> JobId {
    h.submit_as(options, hold, &ann())
}

fn update(h: &mut Harness, id: JobId, change: JobChange, peer: &Peer) -> Result<Vec<JobInfo>, ApiError> {
    match h.call(ClientRequest::Update { id, change: Box::new(change), task_only: false }, peer) {
        ClientResponse::Done { results } => {
            assert!(results.iter().all(|r| r.ok), "{results:?}");
            Ok(results.iter().map(|r| h.ctl.job_info(&h.ctl.jobs[&r.id])).collect())
        }
        ClientResponse::Error(e) => Err(e),
        other => panic!("{other:?}"),
    }
}

fn walltime(w: u64) -> JobChange {
    JobChange { walltime: Some(w), ..Default::default() }
}

fn events(h: &Harness, kind: &str) -> Vec<(Option<JobId>, String)> {
    let q = EventQuery { kinds: vec![kind.into()], limit: Some(1000), ..Default::default() };
    h.ctl.store.events(&q).unwrap().into_iter().map(|e| (e.job, e.detail)).collect()
}

fn end(h: &mut Harness, id: JobId, exit_code: i32) {
    let node = h.ctl.jobs[&id].allocation[0].node_id.0 as usize;
    h.agent(
        node,
        AgentMessage::JobEnded { id, outcome: JobOutcome { exit_code: Some(exit_code), ..Default::default() } },
    );
}

fn state(h: &Harness, id: JobId) -> JobState {
    h.ctl.jobs.get(&id).map(|j| j.state).unwrap_or_else(|| h.ctl.store.job_state(id).unwrap().unwrap().0)
}

fn requeue(h: &mut Harness, id: JobId, peer: &Peer) -> Result<(), ApiError> {
    match h.call(ClientRequest::Requeue { ids: vec![id], only: vec![] }, peer) {
        ClientResponse::Done { mut results } => match results.pop().unwrap() {
            IdResult { ok: true, .. } => Ok(()),
            IdResult { error, .. } => Err(error.unwrap()),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_held_jobs_walltime_and_cores_change_durably_and_hold_from_the_next_pass() {
    let mut h = Harness::new(1);
    let id = submit(&mut h, opts(1), true);
    let change = JobChange { walltime: Some(1200), cores: Some(4), name: Some("bigger".into()), ..Default::default() };
    let jobs = update(&mut h, id, change, &ann()).unwrap();
    assert_eq!(jobs.len(), 1);
    let j = &jobs[0];
    assert_eq!((j.id, j.walltime_seconds, j.request.cores, j.name.as_str()), (id, Some(1200), Some(4), "bigger"));
    assert_eq!(j.state, JobState::Held, "still held");
    let logged = events(&h, "update");
    assert_eq!(logged.len(), 1);
    assert!(logged[0].1.contains("walltime=1200") && logged[0].1.contains("cores=4") && logged[0].1.contains("ann"));
    // On disk: a restarted controller has the change.
    let mut h = h.restart();
    let job = &h.ctl.jobs[&id];
    assert_eq!((job.walltime, job.options.walltime, job.options.cores), (Some(1200), Some(1200), Some(4)));
    assert_eq!(job.name, "bigger");
    // Released, it runs with its new size.
    let ClientResponse::Done { results } = h.call(ClientRequest::Release { ids: vec![id], only: vec![] }, &ann())
    else {
        panic!()
    };
    assert!(results[0].ok);
    h.ctl.schedule(h.now).unwrap();
    let job = &h.ctl.jobs[&id];
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.allocation.iter().map(|a| a.cores).sum::<u32>(), 4);
}

#[test]
fn only_the_owner_or_an_admin_changes_a_job_and_only_an_admin_its_priority() {
    let mut h = Harness::new(1);
    let id = submit(&mut h, opts(1), true);
    let e = update(&mut h, id, walltime(60), &bob()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted);
    assert!(e.message.contains("belongs to ann"), "{e}");
    assert!(events(&h, "denied").iter().any(|(j, d)| *j == Some(id) && d.contains("bob may not update")));
    assert_eq!(h.ctl.jobs[&id].walltime, Some(600), "unchanged");
    update(&mut h, id, walltime(60), &root()).expect("an admin may");
    let e = update(&mut h, id, JobChange { priority: Some(5), ..Default::default() }, &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted);
    assert!(e.message.contains("only admins"), "{e}");
    assert_eq!(h.ctl.jobs[&id].options.priority, None);
    // Nor at submission.
    let sub = SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: "job.sh".into(),
        options: SubmitOptions { priority: Some(9), ..opts(1) },
        env: vec![],
        cwd: "/tmp".into(),
        hold: false,
        ignore_unsupported: false,
    };
    let r = h.call(ClientRequest::Submit(Box::new(sub)), &ann());
    assert!(matches!(r, ClientResponse::Error(ref e) if e.code == ErrorCode::NotPermitted), "{r:?}");
    // Nothing to change is a bad request.
    let e = update(&mut h, id, JobChange::default(), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
}

#[test]
fn an_admins_priority_replaces_the_computed_one() {
    let mut h = Harness::new(1);
    let busy = h.batch(opts(8), &ann());
    let first = submit(&mut h, opts(8), false);
    let second = submit(&mut h, opts(8), false);
    h.ctl.schedule(h.now).unwrap();
    let jobs = update(&mut h, second, JobChange { priority: Some(1_000_000), ..Default::default() }, &root()).unwrap();
    assert_eq!(jobs[0].id, second);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.policy.priority(second).unwrap().total, 1_000_000.0);
    end(&mut h, busy, 0);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, second), JobState::Running, "the admin's priority goes first");
    assert_eq!(state(&h, first), JobState::Queued);
}

#[test]
fn a_running_jobs_walltime_is_lowered_by_its_owner_raised_by_admins_and_enforced() {
    let mut h = Harness::new(1);
    let id = h.batch(opts(1), &ann());
    let e = update(&mut h, id, walltime(1200), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted);
    assert!(e.message.contains("only admins may raise"), "{e}");
    assert_eq!(h.ctl.jobs[&id].walltime, Some(600), "unchanged");
    h.sent();
    let e = update(&mut h, id, JobChange { cores: Some(2), ..Default::default() }, &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState);
    assert!(e.message.contains("is running"), "{e}");
    let jobs = update(&mut h, id, walltime(100), &ann()).unwrap();
    assert_eq!(jobs[0].walltime_seconds, Some(100));
    assert_eq!(h.ctl.jobs[&id].options.walltime, Some(600), "what its node enforces");
    h.sent();
    // Not yet: nothing is killed.
    h.ctl.check_lowered_walltimes(h.now + 50.0).unwrap();
    assert!(h.sent().is_empty());
    // Past it: killed as at its walltime; once only.
    h.ctl.check_lowered_walltimes(h.now + 101.0).unwrap();
    let sent = h.sent();
    assert!(
        matches!(sent.as_slice(), [(0, ControllerMessage::Kill { id: k, reason })] if *k == id && reason == "walltime"),
        "{sent:?}"
    );
    h.ctl.check_lowered_walltimes(h.now + 102.0).unwrap();
    assert!(h.sent().is_empty());
    h.agent(
        0,
        AgentMessage::JobEnded { id, outcome: JobOutcome { reason: Some("walltime".into()), ..Default::default() } },
    );
    assert_eq!(state(&h, id), JobState::Timeout);
}

#[test]
fn an_admin_raises_a_running_jobs_walltime_and_its_nodes_are_told() {
    let mut h = Harness::new(2);
    let id = h.batch(SubmitOptions { nodes: Some(2), ..opts(2) }, &ann());
    h.sent();
    // Lowered by its owner, then raised back by an admin below what the nodes enforce:
    // the controller alone ends it, nothing is sent.
    update(&mut h, id, walltime(100), &ann()).unwrap();
    update(&mut h, id, walltime(300), &root()).unwrap();
    assert_eq!((h.ctl.jobs[&id].walltime, h.ctl.jobs[&id].options.walltime), (Some(300), Some(600)));
    assert!(h.sent().is_empty());
    // Above it: both nodes are told, durably recorded (a restarted controller keeps it).
    let jobs = update(&mut h, id, walltime(7200), &root()).unwrap();
    assert_eq!(jobs[0].walltime_seconds, Some(7200));
    let job = &h.ctl.jobs[&id];
    assert_eq!((job.walltime, job.options.walltime), (Some(7200), Some(7200)));
    let stored = h.ctl.store.get_job(id).unwrap().expect("stored");
    assert_eq!((stored.walltime, stored.options.walltime), (Some(7200), Some(7200)));
    let mut sent = h.sent();
    sent.sort_by_key(|(n, _)| *n);
    let told = ControllerMessage::SetWalltime { id, walltime_seconds: 7200 };
    assert_eq!(sent, vec![(0, told.clone()), (1, told)]);
    // Not killed at the old limit: the controller's own check leaves it.
    h.ctl.check_lowered_walltimes(h.now + 700.0).unwrap();
    assert!(h.sent().is_empty());
}

#[test]
fn an_impossible_change_is_refused_with_the_reason_and_changes_nothing() {
    let mut h = Harness::with_config(2, |c| {
        let q = |name: &str, max: u64| berth_core::sched::queue::QueueSpec {
            name: name.into(),
            max_walltime_secs: Some(max),
            ..Default::default()
        };
        c.queues = vec![q("batch", 3600), q("short", 600)];
    });
    let id = submit(&mut h, SubmitOptions { queue: Some("batch".into()), ..opts(1) }, true);
    let before = h.ctl.store.get_job(id).unwrap().unwrap().options;
    let refused = |h: &mut Harness, change: JobChange| update(h, id, change, &ann()).unwrap_err();
    let e = refused(&mut h, JobChange { cores: Some(100), ..Default::default() });
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.contains("can never run here"), "{e}");
    let e = refused(&mut h, JobChange { nodes: Some(2), cores: Some(3), ..Default::default() });
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert!(e.message.contains("evenly"), "{e}");
    let e = refused(&mut h, walltime(7200));
    assert_eq!(e.code, ErrorCode::QueueLimit, "{e}");
    let e = refused(&mut h, JobChange { queue: Some("nosuch".into()), ..Default::default() });
    assert_eq!(e.code, ErrorCode::QueueLimit, "{e}");
    let e = refused(&mut h, JobChange { queue: Some("short".into()), walltime: Some(1200), ..Default::default() });
    assert_eq!(e.code, ErrorCode::QueueLimit, "{e}");
    let e = refused(&mut h, JobChange { dependency: Some("afterok:999".into()), ..Default::default() });
    assert!(e.message.contains("does not exist"), "{e}");
    let e = refused(&mut h, JobChange { dependency: Some(format!("afterok:{id}")), ..Default::default() });
    assert!(e.message.contains("circular"), "{e}");
    assert_eq!(h.ctl.store.get_job(id).unwrap().unwrap().options, before, "nothing changed on disk");
    assert_eq!(h.ctl.jobs[&id].options, before, "nor in memory");
    assert!(events(&h, "update").is_empty());
    // What fits is taken: a queue whose limit the walltime meets.
    let jobs = update(
        &mut h,
        id,
        JobChange { queue: Some("short".into()), walltime: Some(300), ..Default::default() },
        &ann(),
    )
    .unwrap();
    assert_eq!((jobs[0].queue.as_str(), jobs[0].walltime_seconds), ("short", Some(300)));
    // Nodes and tasks per node: a shape of 2 x 4.
    let jobs = update(&mut h, id, JobChange { nodes: Some(2), tasks_per_node: Some(4), ..Default::default() }, &ann())
        .unwrap();
    assert_eq!(
        (jobs[0].request.nodes, jobs[0].request.tasks_per_node, jobs[0].request.cores),
        (Some(2), Some(4), None)
    );
    // Slurm's NumTasks on a job of 2 nodes: 6 tasks are 3 per node.
    let jobs = update(&mut h, id, JobChange { tasks: Some(6), ..Default::default() }, &ann()).unwrap();
    assert_eq!(jobs[0].request.tasks_per_node, Some(3));
}

#[test]
fn a_dependency_is_set_checked_and_removed() {
    let mut h = Harness::new(1);
    let a = submit(&mut h, opts(1), true);
    let b = submit(&mut h, opts(1), true);
    let dep = |d: &str| JobChange { dependency: Some(d.into()), ..Default::default() };
    let jobs = update(&mut h, b, dep(&format!("afterok:{a}")), &ann()).unwrap();
    assert_eq!(jobs[0].dependency.as_deref(), Some(format!("afterok:{a}").as_str()));
    // a waiting for b, which waits for a: refused.
    let e = update(&mut h, a, dep(&format!("afterany:{b}")), &ann()).unwrap_err();
    assert!(e.message.contains("circular"), "{e}");
    let e = update(&mut h, a, dep("afterok:x"), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest);
    assert!(e.message.contains("not a job id"), "{e}");
    let jobs = update(&mut h, b, dep(""), &ann()).unwrap();
    assert_eq!(jobs[0].dependency, None, "removed");
}

#[test]
fn an_array_id_changes_every_pending_task_and_a_task_id_that_task() {
    let mut h = Harness::new(1);
    let options = SubmitOptions { array: Some(ArraySpec::parse_slurm("0-3%1").unwrap()), ..opts(1) };
    let a = submit(&mut h, options, false);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, a), JobState::Running, "task 0 runs; the limit holds the others");
    let jobs = update(&mut h, a, walltime(300), &ann()).unwrap();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![JobId(a.0 + 1), JobId(a.0 + 2), JobId(a.0 + 3)], "the pending tasks");
    assert!(jobs.iter().all(|j| j.walltime_seconds == Some(300)));
    assert_eq!(h.ctl.jobs[&a].walltime, Some(600), "the running task is left as it is");
    assert_eq!(events(&h, "update").len(), 3);
    let task = JobId(a.0 + 2);
    let jobs = update(&mut h, task, JobChange { name: Some("two".into()), ..Default::default() }, &ann()).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(h.ctl.jobs[&task].name, "two");
    assert_ne!(h.ctl.jobs[&JobId(a.0 + 3)].name, "two");
    // Its tasks may not come to wait for their own array.
    let e = update(&mut h, a, JobChange { dependency: Some(format!("afterany:{a}")), ..Default::default() }, &ann())
        .unwrap_err();
    assert!(e.message.contains("circular"), "{e}");
    // Refused for one task, changed for none.
    let e = update(&mut h, a, JobChange { cores: Some(100), ..Default::default() }, &ann()).unwrap_err();
    assert!(e.message.contains("nothing was changed"), "{e}");
    assert!((1..4).all(|k| h.ctl.jobs[&JobId(a.0 + k)].options.cores == Some(1)));
    let e = update(&mut h, a, walltime(60), &bob()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted);
    // `A_0` (task_only): the first task alone, though its id is the array's; it runs, so
    // only its walltime may go down, and no pending task changes.
    let change = JobChange { walltime: Some(500), ..Default::default() };
    let ClientResponse::Done { results } =
        h.call(ClientRequest::Update { id: a, change: Box::new(change), task_only: true }, &ann())
    else {
        panic!("not done")
    };
    assert_eq!(results.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a], "{results:?}");
    assert_eq!(h.ctl.jobs[&a].walltime, Some(500));
    assert!((1..4).all(|k| h.ctl.jobs[&JobId(a.0 + k)].walltime == Some(300)));
}

#[test]
fn an_ended_or_unknown_job_is_not_changed() {
    let mut h = Harness::new(1);
    let id = h.batch(opts(1), &ann());
    end(&mut h, id, 0);
    let e = update(&mut h, id, walltime(60), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState);
    assert!(e.message.contains("has ended"), "{e}");
    let e = update(&mut h, JobId(999), walltime(60), &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownJob);
}

#[test]
fn a_requeued_running_job_runs_again_once_its_old_run_has_ended() {
    let mut h = Harness::new(1);
    let id = h.batch(opts(8), &ann());
    h.sent();
    assert_eq!(requeue(&mut h, id, &bob()).unwrap_err().code, ErrorCode::NotPermitted);
    requeue(&mut h, id, &ann()).unwrap();
    let sent = h.sent();
    assert!(sent.iter().any(|(n, m)| *n == 0 && matches!(m, ControllerMessage::Kill { id: k, .. } if *k == id)));
    assert_eq!(state(&h, id), JobState::Queued);
    assert_eq!(h.ctl.store.count_events(id, "requeue").unwrap(), 1, "counted as the failure policy counts");
    assert_eq!(h.free_cores(), 8, "its cores are free");
    // Not started again while its old run still ends on its node.
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Queued);
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    let why = job.reason.unwrap_or_default();
    assert!(why.starts_with("BeginTime: requeued") && why.contains("n0"), "{why}");
    // Its end comes: it starts again.
    h.agent(0, AgentMessage::JobEnded { id, outcome: JobOutcome { signal: Some(15), ..Default::default() } });
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    // Pending jobs are not requeued.
    let queued = submit(&mut h, opts(8), false);
    let e = requeue(&mut h, queued, &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState);
}

#[test]
fn a_requeued_jobs_wait_for_its_old_run_survives_a_controller_restart() {
    let mut h = Harness::new(1);
    let id = h.batch(opts(8), &ann());
    requeue(&mut h, id, &ann()).unwrap();
    h.sent();
    let mut h = h.restart();
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Queued, "the restarted controller still waits for the old run");
    let ClientResponse::Job { job } = h.call(ClientRequest::ShowJob { id }, &ann()) else { panic!() };
    let why = job.reason.unwrap_or_default();
    assert!(why.starts_with("BeginTime: requeued") && why.contains("n0"), "{why}");
    h.agent(0, AgentMessage::JobEnded { id, outcome: JobOutcome { signal: Some(9), ..Default::default() } });
    assert!(h.ctl.store.load_old_runs().unwrap().is_empty(), "the wait is forgotten once over");
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    // And a wait that ran out of patience is forgotten in the store as well.
    requeue(&mut h, id, &ann()).unwrap();
    assert_eq!(h.ctl.store.load_old_runs().unwrap().len(), 1);
    h.now += OLD_RUN_PATIENCE_SECS + 1.0;
    h.ctl.schedule(h.now).unwrap();
    assert!(h.ctl.store.load_old_runs().unwrap().is_empty());
}

#[test]
fn an_ended_job_is_requeued_and_runs_again_and_so_is_an_arrays_every_started_task() {
    let mut h = Harness::new(1);
    let id = h.batch(opts(1), &ann());
    end(&mut h, id, 3);
    assert_eq!(state(&h, id), JobState::Failed);
    requeue(&mut h, id, &ann()).unwrap();
    let job = &h.ctl.jobs[&id];
    assert_eq!((job.state, job.exit_code, job.end_time, job.start_time), (JobState::Queued, None, None, None));
    // Durable: a restarted controller has it queued.
    let mut h = h.restart();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Queued);
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(state(&h, id), JobState::Running);
    end(&mut h, id, 0);
    assert_eq!(state(&h, id), JobState::Completed);
    assert_eq!(h.ctl.store.count_events(id, "requeue").unwrap(), 1);
    // An array: its ended tasks and its running one, not its pending ones.
    let options = SubmitOptions { array: Some(ArraySpec::parse_slurm("0-2%1").unwrap()), ..opts(1) };
    let a = submit(&mut h, options, false);
    h.ctl.schedule(h.now).unwrap();
    end(&mut h, a, 0);
    h.ctl.schedule(h.now).unwrap();
    let second = JobId(a.0 + 1);
    assert_eq!(state(&h, second), JobState::Running);
    requeue(&mut h, a, &ann()).unwrap();
    assert_eq!(state(&h, a), JobState::Queued, "ended, requeued");
    assert_eq!(state(&h, second), JobState::Queued, "running, requeued");
    assert_eq!(h.ctl.store.count_events(JobId(a.0 + 2), "requeue").unwrap(), 0, "pending, left");
}

fn counts(items: &[(&str, u32)]) -> berth_core::gres::Counts {
    items.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// A pending job's generic resources and licenses change as at submission: what can never be
/// had is refused (nothing changed), what can is kept, on disk too, and counted when it starts.
#[test]
fn gres_and_licenses_of_a_pending_job_change_checked_as_at_submission() {
    let mut h = Harness::with_config(2, |c| {
        c.licenses = counts(&[("matlab", 4)]);
        c.gres.insert("n1".into(), counts(&[("nvme", 800)]));
    });
    let id = submit(&mut h, opts(1), true);
    let refused = |h: &mut Harness, change: JobChange| update(h, id, change, &ann()).unwrap_err();
    for (change, want) in [
        (JobChange { licenses: Some(counts(&[("matlab", 5)])), ..Default::default() }, "the cluster has 4"),
        (JobChange { licenses: Some(counts(&[("ansys", 1)])), ..Default::default() }, "license ansys"),
        (JobChange { gres: Some(counts(&[("nvme", 900)])), ..Default::default() }, "the most a node has is 800"),
        (JobChange { gres: Some(counts(&[("fpga", 1)])), ..Default::default() }, "generic resource fpga"),
    ] {
        let e = refused(&mut h, change);
        assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
        assert!(e.message.contains(want), "{want}: {e}");
    }
    let e = refused(&mut h, JobChange { licenses: Some(counts(&[("matlab", 0)])), ..Default::default() });
    assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    let e = refused(&mut h, JobChange { gres: Some(counts(&[("gpu", 1)])), ..Default::default() });
    assert!(e.message.contains("GPUs"), "{e}");
    assert_eq!((h.ctl.jobs[&id].options.gres.clone(), h.ctl.jobs[&id].options.licenses.clone()), (None, None));
    let change = JobChange {
        gres: Some(counts(&[("nvme", 500)])),
        licenses: Some(counts(&[("matlab", 3)])),
        ..Default::default()
    };
    update(&mut h, id, change, &ann()).unwrap();
    let stored = h.ctl.store.get_job(id).unwrap().unwrap().options;
    assert_eq!((stored.gres, stored.licenses), (Some(counts(&[("nvme", 500)])), Some(counts(&[("matlab", 3)]))));
    assert!(events(&h, "update").iter().any(|(_, d)| d.contains("licenses=matlab:3")), "{:?}", events(&h, "update"));
    h.call(ClientRequest::Release { ids: vec![id], only: vec![] }, &ann());
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&id].allocation[0].node, "n1");
    assert_eq!(h.ctl.license_info()[0].used, 3);
}

/// Issue 20: a pending job's GPUs change as at submission (`berth update --gpus
/// --gpus-per-node --gpu-type`, qalter's `ngpus`): more than any node has is refused, 0
/// removes them, a type no node has is refused; its owner may, another user may not, and a
/// running job's GPUs are not changed.
#[test]
fn gpus_of_a_pending_job_change_checked_as_at_submission() {
    let mut t = berth_core::topology::Topology::uniform(1, 2, 4, 1, 1 << 30);
    t.add_emulated_gpus(1).expect("emulated GPUs");
    let mut h = Harness::with_topology(1, t);
    let id = submit(&mut h, SubmitOptions { gpus: Some(1), ..opts(1) }, true);
    let refused = |h: &mut Harness, change: JobChange, peer: &Peer| update(h, id, change, peer).unwrap_err();
    let e = refused(&mut h, JobChange { gpus_per_node: Some(3), ..Default::default() }, &ann());
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    let e = refused(&mut h, JobChange { gpus: Some(2), gpu_type: Some("h100".into()), ..Default::default() }, &ann());
    assert_eq!(e.code, ErrorCode::Infeasible, "{e}");
    assert!(e.message.contains("h100"), "{e}");
    let e = refused(&mut h, JobChange { gpus: Some(0), gpus_per_node: Some(1), ..Default::default() }, &ann());
    assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    let e = refused(&mut h, JobChange { gres: Some(counts(&[("gpu:a100", 1)])), ..Default::default() }, &ann());
    assert!(e.message.contains("--gpus-per-node"), "{e}");
    let e = refused(&mut h, JobChange { gpus_per_node: Some(2), ..Default::default() }, &bob());
    assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
    assert_eq!(h.ctl.jobs[&id].options.gpus, Some(1), "nothing changed");
    // The owner: 2 per node of the emulated type; stored, and the job gets them.
    update(
        &mut h,
        id,
        JobChange { gpus_per_node: Some(2), gpu_type: Some("emulated".into()), ..Default::default() },
        &ann(),
    )
    .unwrap();
    let stored = h.ctl.store.get_job(id).unwrap().unwrap().options;
    assert_eq!((stored.gpus, stored.gpus_per_node, stored.gpu_type.as_deref()), (None, Some(2), Some("emulated")));
    assert!(events(&h, "update").iter().any(|(_, d)| d.contains("gpus_per_node=2")), "{:?}", events(&h, "update"));
    // 0 removes them (and the type with them).
    let plain = submit(&mut h, SubmitOptions { gpus_per_task: Some(1), ..opts(1) }, true);
    update(&mut h, plain, JobChange { gpus: Some(0), ..Default::default() }, &ann()).unwrap();
    let o = &h.ctl.jobs[&plain].options;
    assert_eq!((o.gpus, o.gpus_per_node, o.gpus_per_task), (None, None, None));
    h.call(ClientRequest::Release { ids: vec![id], only: vec![] }, &ann());
    h.ctl.schedule(h.now).unwrap();
    assert_eq!(h.ctl.jobs[&id].state, JobState::Running);
    assert_eq!(h.ctl.jobs[&id].allocation[0].gpus.len(), 2);
    let e = update(&mut h, id, JobChange { gpus: Some(1), ..Default::default() }, &ann()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidState, "{e}");
}
