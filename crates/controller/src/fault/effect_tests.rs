//! Node failures decided without a store: the tests build jobs as plain values and read the
//! model and the effects returned (no SQLite, no controller).

use super::*;
use crate::testkit::{ann, running_job};

fn kill(node: usize, id: u64, reason: &str) -> Effect {
    Effect::Send { node, msg: ControllerMessage::Kill { id: JobId(id), reason: reason.into() } }
}

#[test]
fn a_node_going_down_or_up_writes_its_row_then_the_event() {
    assert_eq!(
        node_went(3, "n3", "node_down", "missed heartbeats for 30.0 s"),
        vec![Effect::UpsertNode { node: 3 }, Effect::node_event("node_down", "n3", "missed heartbeats for 30.0 s")]
    );
}

#[test]
fn a_no_kill_job_kept_without_its_node_says_so() {
    let mut job = running_job(4, &ann(), &[(0, "0-3"), (1, "0-3")]);
    let effects = kept_without(&mut job, "n1", "missed heartbeats");
    assert_eq!(job.reason.as_deref(), Some("running without n1 (no-kill)"));
    assert_eq!(job.state, JobState::Running);
    assert_eq!(effects, vec![Effect::job_event("node_lost_kept", JobId(4), Some("n1"), "missed heartbeats")]);
}

#[test]
fn a_job_failed_with_its_node_is_finished_then_written_then_logged() {
    let mut job = running_job(5, &ann(), &[(0, "0-3")]);
    job.usage = Some(Default::default());
    let effects = failed_with_node(
        &mut job,
        "n0",
        "admin: disk",
        "the job is not requeued on node failure (--no-requeue)",
        1200.0,
    );
    assert_eq!(job.end_time, Some(1200.0));
    assert!(job.state.is_finished(), "{:?}", job.state);
    assert_eq!(job.usage, None);
    assert_eq!(
        job.reason.as_deref(),
        Some("node n0 failed (admin: disk); the job is not requeued on node failure (--no-requeue)")
    );
    assert_eq!(
        effects,
        vec![
            Effect::UpdateJob(Box::new(job.clone())),
            Effect::job_event("node_fail", JobId(5), Some("n0"), "admin: disk")
        ]
    );
}

#[test]
fn a_requeued_job_is_queued_written_logged_its_steps_closed_then_its_other_nodes_told() {
    let mut job = running_job(6, &ann(), &[(0, "0-3"), (1, "0-3"), (2, "0-3")]);
    job.kill_sent = Some("walltime".into());
    job.suspension.since = Some(1100.0);
    let held = job.allocation.clone();
    let Requeued { alloc, suspended, effects } = requeued(&mut job, 1300.0, "n1", "node n1 failed: gone", Some(1));
    assert_eq!(alloc, held);
    assert!(suspended);
    assert_eq!((job.state, job.start_time, job.kill_sent.as_deref()), (JobState::Queued, None, None));
    assert!(job.allocation.is_empty());
    assert_eq!(job.suspension, Default::default());
    assert_eq!(job.reason.as_deref(), Some("requeued: node n1 failed: gone"));
    assert_eq!(
        effects,
        vec![
            Effect::SaveSuspension { job: JobId(6), suspension: Default::default() },
            Effect::UpdateJob(Box::new(job.clone())),
            Effect::job_event("requeue", JobId(6), Some("n1"), "node n1 failed: gone"),
            Effect::CloseSteps { job: JobId(6), time: 1300.0, failure: "job requeued".into() },
            kill(0, 6, "job requeued"),
            kill(2, 6, "job requeued"),
        ]
    );
}

#[test]
fn a_node_taken_down_keeps_its_reason_and_kills_all_but_no_kill_jobs_headed_elsewhere() {
    let mut jobs = BTreeMap::new();
    // On n1, its batch script elsewhere (n0), --no-kill: goes on without n1.
    let mut spared = running_job(1, &ann(), &[(0, "0-1"), (1, "0-1")]);
    spared.options.no_kill = Some(true);
    // --no-kill, but its script runs on n1: killed there.
    let mut headed = running_job(2, &ann(), &[(1, "2-3"), (0, "2-3")]);
    headed.options.no_kill = Some(true);
    let plain = running_job(3, &ann(), &[(0, "4-5"), (1, "4-5")]);
    let elsewhere = running_job(4, &ann(), &[(0, "6-7")]);
    let mut queued = running_job(5, &ann(), &[(1, "6-7")]);
    queued.state = JobState::Queued;
    for j in [spared, headed, plain, elsewhere, queued] {
        jobs.insert(j.id, j);
    }
    let why = "node n1 taken down by an admin";
    let (reason, effects) = taken_down(&jobs, 1, "n1", "", false);
    assert_eq!(reason, "no reason given");
    assert_eq!(
        effects,
        vec![
            Effect::SetMeta { key: "node_down:n1".into(), value: "no reason given".into() },
            kill(1, 2, why),
            kill(1, 3, why),
        ]
    );
    // Down already: the event is written here (no failure to handle again).
    let (reason, effects) = taken_down(&jobs, 1, "n1", "fan broken", true);
    assert_eq!(reason, "fan broken");
    assert_eq!(effects.last(), Some(&Effect::node_event("node_down", "n1", "admin: fan broken")));
    assert_eq!(effects.len(), 4);
}

#[test]
fn a_cleaning_node_is_clean_when_it_runs_only_its_own_jobs() {
    let mut jobs = BTreeMap::new();
    let mine = running_job(1, &ann(), &[(1, "0-1")]);
    let other = running_job(2, &ann(), &[(0, "0-1")]);
    jobs.insert(mine.id, mine);
    jobs.insert(other.id, other);
    assert!(clean(&jobs, 1, &[]));
    assert!(clean(&jobs, 1, &[JobId(1)]));
    assert!(!clean(&jobs, 1, &[JobId(2)]), "job 2 does not run on n1");
    assert!(!clean(&jobs, 1, &[JobId(1), JobId(9)]), "job 9 is unknown");
}
