//! `berth update` and `berth requeue` decided without a store: rows, forgotten runs and waits
//! for a previous run are plain values.

use super::*;
use crate::testkit::{ann, running_job};

#[test]
fn an_update_rewrites_the_row_then_says_what_changed_and_by_whom() {
    let mut job = running_job(7, &ann(), &[]);
    job.state = JobState::Queued;
    job.name = "renamed".into();
    let what = vec!["name=renamed".to_string(), "walltime=300".to_string()];
    assert_eq!(
        updated(&job, &what, "root"),
        vec![
            Effect::RewriteJob(Box::new(job.clone())),
            Effect::job_event("update", JobId(7), None, "name=renamed walltime=300 (by root)"),
        ]
    );
}

#[test]
fn an_ended_job_requeued_is_queued_as_submitted_with_its_run_forgotten_in_this_order() {
    let mut job = running_job(7, &ann(), &[(0, "0-1")]);
    job.state = JobState::Completed;
    job.end_time = Some(2000.0);
    job.exit_code = Some(0);
    job.usage = Some(Default::default());
    job.kill_sent = Some("job ended".into());
    let effects = ended_requeued(&mut job, "asked by ann");
    assert_eq!(job.state, JobState::Queued);
    assert_eq!((job.start_time, job.end_time, job.exit_code, job.signal), (None, None, None, None));
    assert!(job.allocation.is_empty() && job.usage.is_none() && job.kill_sent.is_none());
    assert_eq!(job.reason.as_deref(), Some("requeued: asked by ann"));
    assert_eq!(
        effects,
        vec![
            Effect::UpdateJob(Box::new(job.clone())),
            Effect::SaveSuspension { job: JobId(7), suspension: Default::default() },
            Effect::ForgetRun { job: JobId(7) },
            Effect::job_event("requeue", JobId(7), None, "asked by ann"),
        ]
    );
}

#[test]
fn a_previous_run_ends_node_by_node_and_its_usage_is_forgotten_only_for_a_pending_job() {
    let mut wait = OldRun { nodes: vec![1, 2], since: 500.0 };
    // One node left: the wait as it is now (a node reported twice changes nothing more).
    assert_eq!(
        old_run_node_ended(JobId(7), &mut wait, 1, true),
        (false, vec![Effect::SaveOldRun { job: JobId(7), nodes: vec![2], since: 500.0 }])
    );
    let mut again = wait.clone();
    assert_eq!(
        old_run_node_ended(JobId(7), &mut again, 1, true).1[0],
        Effect::SaveOldRun { job: JobId(7), nodes: vec![2], since: 500.0 }
    );
    // The last node: the wait is over, and a pending job's old run is forgotten.
    assert_eq!(
        old_run_node_ended(JobId(7), &mut wait.clone(), 2, true),
        (true, vec![Effect::ForgetOldRun { job: JobId(7) }, Effect::ForgetRun { job: JobId(7) }])
    );
    // Started again already (the wait was given up): its new run's usage is kept.
    assert_eq!(old_run_node_ended(JobId(7), &mut wait, 2, false), (true, vec![Effect::ForgetOldRun { job: JobId(7) }]));
    assert!(wait.nodes.is_empty());
}
