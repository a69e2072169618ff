//! Steps decided without a store: grants, ends, lost steps and signals, built from plain
//! values; the tests read the model and the effects returned (no SQLite, no controller).

use super::*;
use crate::testkit::{ann, bob, running_job, step_create};
use berth_core::node::NodeState;
use berth_core::step::{RankPlace, StepNodePlan, StepRequest};

fn extra(i: usize) -> NodeExtra {
    NodeExtra::new(
        NodeState::Up,
        format!("10.0.0.{i}:7200"),
        "0-7".into(),
        format!("inst{i}"),
        std::time::Instant::now(),
    )
}

fn create(overcommit: bool) -> StepCreate {
    step_create(Some(JobId(7)), StepRequest { ntasks: Some(4), overcommit, ..Default::default() })
}

/// Ranks 0-1 on the job's second node (n1), 2-3 on its first (n0).
fn plan() -> StepPlan {
    let place = |alloc_index: usize, node: &str, first: u32, cpus: &str| StepNodePlan {
        alloc_index,
        node: node.into(),
        ranks: (first..first + 2).map(|rank| RankPlace { rank, cpus: CpuSet::parse_list(cpus).unwrap() }).collect(),
        cpus: CpuSet::parse_list(cpus).unwrap(),
    };
    StepPlan { size: 4, nodes: vec![place(1, "n1", 0, "4-5"), place(0, "n0", 2, "0-1")] }
}

fn live(step: u32, conn: Option<u64>, nodes: &[&str], interactive: bool, granted_at: f64) -> LiveStep {
    LiveStep {
        step,
        uid: 1000,
        user: "ann".into(),
        claims: vec![],
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        conn,
        interactive,
        granted_at,
    }
}

#[test]
fn a_granted_step_is_written_then_logged_and_holds_its_cores() {
    let job = running_job(7, &ann(), &[(0, "0-3"), (1, "4-7")]);
    let extras = vec![extra(0), extra(1)];
    let given = Given { step: 3, peer: &ann(), now: 1234.0, interactive: false, kill_grace_ms: 5000 };
    let (grant, live, effects) = step_granted(&job, &extras, plan(), vec![], create(false), &given);

    assert_eq!(effects.len(), 2, "{effects:?}");
    let Effect::InsertStep(row) = &effects[0] else { panic!("the step's row first: {effects:?}") };
    assert_eq!((row.job, row.step, row.uid, row.start_time, row.size), (JobId(7), 3, 1000, 1234.0, 4));
    assert_eq!(row.nodes, vec!["n1".to_string(), "n0".to_string()]);
    assert_eq!(row.argv, vec!["./a.out".to_string()]);
    assert_eq!((row.end_time, row.interactive), (None, false));
    let held = vec![(1, CpuSet::parse_list("4-5").unwrap()), (0, CpuSet::parse_list("0-1").unwrap())];
    assert_eq!(row.claims, held);
    assert_eq!(effects[1], Effect::job_event("step", JobId(7), None, "step 3: 4 ranks on n1,n0, by ann"));

    assert_eq!((live.step, live.conn, live.granted_at), (3, Some(1), 1234.0));
    assert_eq!(live.claims, held);
    // The grant names each node's agent (address, instance) by the job's allocation.
    assert_eq!((grant.job, grant.step, grant.kvsname.as_str()), (JobId(7), 3, "berth_7_3"));
    assert_eq!(grant.nodes[0].address, "10.0.0.1:7200");
    assert_eq!(grant.nodes[1].instance, "inst0");
    assert_eq!((grant.kill_grace_ms, grant.mac.as_str(), grant.user.name.as_str()), (5000, "", "ann"));

    // Overcommitted: recorded with no cores held.
    let (_, live, effects) = step_granted(&job, &extras, plan(), vec![], create(true), &given);
    assert!(live.claims.is_empty());
    assert!(matches!(&effects[0], Effect::InsertStep(row) if row.claims.is_empty()));
}

#[test]
fn an_admin_granted_a_step_in_someone_elses_job_runs_it_as_the_jobs_owner() {
    let job = running_job(7, &bob(), &[(0, "0-3"), (1, "4-7")]);
    let given = Given { step: 1, peer: &ann(), now: 1.0, interactive: false, kill_grace_ms: 0 };
    let (grant, live, effects) = step_granted(&job, &[], plan(), vec![], create(false), &given);
    assert_eq!(grant.user.name, "bob");
    assert_eq!(live.uid, 1000, "the step is the requester's");
    // Unknown agents: no address rather than a panic.
    assert_eq!(grant.nodes[0].address, "");
    assert!(matches!(&effects[1], Effect::Event { detail, .. } if detail.ends_with("by ann")));
}

#[test]
fn a_closed_step_leaves_the_live_steps_and_is_written_then_logged() {
    let mut steps = LiveSteps::default();
    steps.add(JobId(7), live(1, Some(1), &["n0"], false, 0.0));
    steps.add(JobId(7), live(2, Some(1), &["n0"], false, 0.0));
    let end = StepEnd { time: 50.0, exit_code: Some(3), failure: Some("rank 1 failed".into()), node: None };
    let effects = step_closed(&mut steps, JobId(7), 1, end, "step 1: exit 3".into());
    assert_eq!(steps.of(JobId(7)).iter().map(|s| s.step).collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        effects,
        vec![
            Effect::EndStep {
                job: JobId(7),
                step: 1,
                time: 50.0,
                exit_code: Some(3),
                failure: Some("rank 1 failed".into())
            },
            Effect::job_event("step_end", JobId(7), None, "step 1: exit 3"),
        ]
    );
    // The job's last step gone: the job has no entry left.
    let end = StepEnd { time: 51.0, exit_code: None, failure: None, node: Some("n0".into()) };
    let effects = step_closed(&mut steps, JobId(7), 2, end, "gone".into());
    assert_eq!(steps.iter().count(), 0);
    assert_eq!(effects[1], Effect::job_event("step_end", JobId(7), Some("n0"), "gone"));
}

#[test]
fn an_interactive_allocation_ends_once_finished_written_accounted_then_logged() {
    let mut job = running_job(9, &ann(), &[(0, "0-1")]);
    job.queue = INTERACTIVE_QUEUE.into();
    let effects = interactive_ended(&mut job, JobState::Failed, Some(2), Some("rank lost"), 1010.0).unwrap();
    assert_eq!((job.state, job.exit_code, job.end_time), (JobState::Failed, Some(2), Some(1010.0)));
    assert_eq!(job.reason.as_deref(), Some("rank lost"));
    assert_eq!(job.usage.map(|u| u.wall_ms), Some(60_000), "started at 950");
    assert_eq!(effects.len(), 3);
    assert_eq!(effects[0], Effect::UpdateJob(Box::new(job.clone())));
    assert_eq!(effects[1], Effect::InsertAccounting(Box::new(job.clone())));
    assert_eq!(effects[2], Effect::job_event("end", JobId(9), None, "failed"));
    // Ended already: nothing more.
    assert_eq!(interactive_ended(&mut job, JobState::Completed, Some(0), None, 1020.0), None);
    assert_eq!(job.state, JobState::Failed);
}

#[test]
fn a_job_without_script_is_started_written_then_logged_on_its_first_node() {
    let mut job = running_job(0, &ann(), &[(1, "4-5"), (0, "0-1")]);
    job.state = JobState::Queued;
    job.queue = "reservation".into();
    let effects = started_without_script(&mut job, JobId(12), "reservation 3 for ann", 2000.0);
    assert_eq!((job.id, job.state, job.start_time), (JobId(12), JobState::Running, Some(2000.0)));
    assert_eq!(
        effects,
        vec![
            Effect::InsertJob(Box::new(job.clone())),
            Effect::job_event("reservation", JobId(12), Some("n1"), "reservation 3 for ann"),
        ]
    );
}

#[test]
fn lost_root_steps_are_those_unwatched_unlisted_and_past_their_grant() {
    let usable = berth_protocol::auth::GRANT_LIFETIME.as_secs_f64() + GRANT_CLOCK_MARGIN_SECS;
    let mut steps = LiveSteps::default();
    for s in [
        live(1, None, &["n0", "n1"], false, 0.0),
        live(2, Some(5), &["n0"], false, 0.0),    // watched by its run
        live(3, None, &["n1", "n0"], false, 0.0), // rooted elsewhere
        live(4, None, &["n0"], true, 0.0),
    ] {
        steps.add(JobId(8), s);
    }
    steps.add(JobId(7), live(1, None, &["n0"], false, usable));
    let now = usable + 1.0;
    assert_eq!(lost_root_steps(&steps, "n0", &[], false, now), vec![(JobId(8), 1, false), (JobId(8), 4, true)]);
    // Listed by the agent: still running there.
    let listed = [StepRef { job: JobId(8), step: 4 }];
    assert_eq!(lost_root_steps(&steps, "n0", &listed, false, now), vec![(JobId(8), 1, false)]);
    // An agent restarted since the grant refuses it: no waiting.
    assert_eq!(lost_root_steps(&steps, "n0", &listed, true, now), vec![(JobId(7), 1, false), (JobId(8), 1, false)]);
    assert_eq!(steps_of_connection(&steps, 5), vec![(JobId(8), 2, false)]);
    assert!(steps_of_connection(&steps, 6).is_empty());
}

#[test]
fn signals_go_to_the_whole_allocation_or_the_steps_nodes() {
    let job = running_job(7, &ann(), &[(0, "0-3"), (2, "0-3"), (1, "0-3")]);
    assert_eq!(signal_targets(&job, &[], None), Some(vec![0, 2, 1]));
    let live = [live(4, None, &["n1", "n0"], false, 0.0)];
    assert_eq!(signal_targets(&job, &live, Some(4)), Some(vec![0, 1]));
    assert_eq!(signal_targets(&job, &live, Some(5)), None);
    assert_eq!(signal_targets(&job, &[], Some(4)), None);
}

#[test]
fn interactive_allocations_past_their_walltime_are_found() {
    let mut over = running_job(1, &ann(), &[(0, "0")]);
    over.queue = INTERACTIVE_QUEUE.into();
    let mut within = over.clone();
    within.id = JobId(2);
    within.walltime = Some(10_000);
    let batch = running_job(3, &ann(), &[(0, "1")]);
    let jobs = [over, within, batch];
    assert_eq!(interactive_over(jobs.iter(), 950.0 + 600.0), vec![JobId(1)]);
    assert!(interactive_over(jobs.iter(), 1549.0).is_empty());
}
