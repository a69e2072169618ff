//! Suspension decided without a store: the tests build jobs and the cluster's books as plain
//! values and read the model and the effects returned (no SQLite, no controller).

use super::*;
use crate::model::suspension::Suspension;
use crate::testkit::{ann, running_job, topo};
use berth_core::node::NodeCapacity;
use berth_core::placement::PlacementPolicy;
use berth_core::CpuSet;
use std::sync::Arc;

/// Two nodes of the harness's topology (PUs 0-7 each, two NUMA nodes of 1 GiB), with `jobs`
/// claimed.
fn cluster(jobs: &[&JobRecord]) -> ClusterState {
    let nodes = (0..2).map(|i| NodeCapacity::new(NodeId(i), format!("n{i}"), Arc::new(topo()))).collect();
    let mut c = ClusterState::new(nodes, PlacementPolicy::default());
    for j in jobs {
        c.claim(&j.allocation);
    }
    c
}

fn free(c: &ClusterState, node: usize) -> String {
    c.nodes()[node].free_pus.to_list()
}

fn numa_free(c: &ClusterState, node: usize) -> u64 {
    c.nodes()[node].numa_free.iter().sum()
}

fn send(node: usize, msg: ControllerMessage) -> Effect {
    Effect::Send { node, msg }
}

fn row(job: &JobRecord) -> Effect {
    Effect::UpdateJob(Box::new(job.clone()))
}

fn saved(job: &JobRecord) -> Effect {
    Effect::SaveSuspension { job: job.id, suspension: job.suspension.clone() }
}

/// Job 7 on n0 and n1 (PUs 0-3 on each), suspended by the pass at 1200.
fn suspended_job(c: &mut ClusterState) -> JobRecord {
    let mut job = running_job(7, &ann(), &[(0, "0-3"), (1, "0-3")]);
    c.claim(&job.allocation);
    suspended(&mut job, c, &SuspendBy::Policy("preempted by job 9".into()), 1200.0);
    job
}

#[test]
fn a_suspended_job_gives_back_its_pus_keeps_its_memory_then_is_written_logged_and_frozen() {
    let mut job = running_job(7, &ann(), &[(0, "0-3"), (1, "0-3")]);
    let mut c = cluster(&[&job]);
    let memory = numa_free(&c, 0);
    let effects = suspended(&mut job, &mut c, &SuspendBy::Policy("preempted by job 9".into()), 1200.0);
    assert_eq!(job.state, JobState::Suspended);
    assert_eq!((job.suspension.since, job.suspension.count, job.suspension.by_admin), (Some(1200.0), 1, false));
    assert_eq!(job.reason.as_deref(), Some("suspended: preempted by job 9"));
    assert_eq!((free(&c, 0), free(&c, 1)), ("0-7".to_string(), "0-7".to_string()));
    assert_eq!(numa_free(&c, 0), memory, "its memory stays claimed");
    assert_eq!(
        effects,
        vec![
            row(&job),
            saved(&job),
            Effect::job_event("suspend", JobId(7), None, "preempted by job 9"),
            send(0, ControllerMessage::Suspend { id: JobId(7) }),
            send(1, ControllerMessage::Suspend { id: JobId(7) }),
            Effect::Reschedule,
        ]
    );
    // An admin's: said so, and it resumes only with `berth resume`.
    let mut other = running_job(8, &ann(), &[(0, "4-5")]);
    c.claim(&other.allocation);
    let effects = suspended(&mut other, &mut c, &SuspendBy::Admin("root".into()), 1300.0);
    assert!(other.suspension.by_admin);
    assert_eq!(other.reason.as_deref(), Some("suspended by admin root: `berth resume` resumes it"));
    assert_eq!(effects[2], Effect::job_event("suspend", JobId(8), None, "by admin root"));
}

#[test]
fn a_resume_in_flight_is_overtaken_by_a_new_suspension() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    resumed(&mut job, &mut c, vec![None, None], 1230.0);
    assert!(job.suspension.resuming.is_some());
    suspended(&mut job, &mut c, &SuspendBy::Admin("root".into()), 1240.0);
    assert_eq!(job.suspension.resuming, None, "a late failure of the resume finds nothing to undo");
    assert_eq!((job.suspension.count, job.suspension.total_secs), (2, 30.0));
}

#[test]
fn an_admin_takes_over_a_pass_suspension_once() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    assert_eq!(taken_over_by_admin(&mut job, &SuspendBy::Policy("again".into())), vec![]);
    let effects = taken_over_by_admin(&mut job, &SuspendBy::Admin("root".into()));
    assert!(job.suspension.by_admin);
    assert_eq!(job.reason.as_deref(), Some("suspended by admin root: `berth resume` resumes it"));
    assert_eq!(effects, vec![row(&job), saved(&job)]);
    assert_eq!(taken_over_by_admin(&mut job, &SuspendBy::Admin("bob".into())), vec![], "the admin's already");
}

#[test]
fn suspension_is_refused_for_jobs_not_running_ending_without_a_script_or_off_line() {
    let code = |e: Option<ApiError>| e.map(|e| e.code);
    let job = running_job(3, &ann(), &[(0, "0-1"), (1, "0-1")]);
    assert_eq!(code(suspend_refusal(&job, |_| true)), None);
    assert_eq!(code(suspend_refusal(&job, |n| n == 0)), Some(ErrorCode::Unavailable), "n1 is not connected");
    let mut queued = job.clone();
    queued.state = JobState::Queued;
    assert_eq!(code(suspend_refusal(&queued, |_| true)), Some(ErrorCode::InvalidState));
    let mut ending = job.clone();
    ending.kill_sent = Some("walltime".into());
    assert_eq!(code(suspend_refusal(&ending, |_| true)), Some(ErrorCode::InvalidState));
    let mut bare = job.clone();
    bare.script = String::new().into();
    assert_eq!(code(suspend_refusal(&bare, |_| true)), Some(ErrorCode::InvalidState));
    let mut frozen = job.clone();
    frozen.state = JobState::Suspended;
    assert_eq!(code(suspend_refusal(&frozen, |_| false)), None, "suspended already: nothing to refuse");
    // Resumes: only of suspended jobs not ending.
    assert_eq!(code(resume_refusal(&frozen)), None);
    assert_eq!(code(resume_refusal(&job)), Some(ErrorCode::InvalidState));
    frozen.kill_sent = Some("cancelled".into());
    assert_eq!(code(resume_refusal(&frozen)), Some(ErrorCode::InvalidState));
}

#[test]
fn a_job_that_cannot_resume_says_why_after_what_suspended_it() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    let short = ResumeWait::Short { need: 4, unit: "cores", node: "n0".into(), free: 1 };
    let effects = waiting_reason(&mut job, &short);
    assert_eq!(
        job.reason.as_deref(),
        Some("suspended: preempted by job 9; waiting for 4 cores on n0 to resume (1 free)")
    );
    assert_eq!(job.suspension.reason.as_ref().map(SuspendedReason::code), Some("Resources"));
    assert_eq!(effects, vec![row(&job)]);
    assert_eq!(waiting_reason(&mut job, &short), vec![], "unchanged");
    waiting_reason(&mut job, &ResumeWait::NotConnected("n1".into()));
    assert_eq!(job.reason.as_deref(), Some("suspended: preempted by job 9; node n1 is not connected"));
    assert_eq!(job.suspension.reason.as_ref().map(SuspendedReason::code), Some("NodeDown"));
    // Without a cause of the pass's (an admin's hold, lifted), only why it waits.
    give_reason(&mut job, SuspendedReason::ByAdmin { who: "root".into() });
    assert_eq!(job.reason.as_deref(), Some("suspended by admin root: `berth resume` resumes it"));
    waiting_reason(&mut job, &ResumeWait::NotConnected("n1".into()));
    assert_eq!(job.reason.as_deref(), Some("suspended: node n1 is not connected"));
}

#[test]
fn a_resume_in_place_claims_its_pus_runs_again_then_is_written_logged_and_sent() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    let plan = parts_moved(&job.allocation, &Resume::InPlace);
    assert_eq!(plan, vec![None, None]);
    let (outcome, effects) = resumed(&mut job, &mut c, plan, 1230.0);
    assert_eq!(outcome, Resumed::InPlace);
    assert_eq!((job.state, job.reason.as_deref()), (JobState::Running, None));
    assert_eq!((job.suspension.since, job.suspension.total_secs, job.suspension.by_admin), (None, 30.0, false));
    let resuming = job.suspension.resuming.clone().expect("a resume in flight");
    assert_eq!((resuming.since, resuming.at, resuming.moved, resuming.waiting), (1200.0, 1230.0, vec![], vec![0, 1]));
    assert_eq!((free(&c, 0), free(&c, 1)), ("4-7".to_string(), "4-7".to_string()));
    assert_eq!(
        effects,
        vec![
            row(&job),
            saved(&job),
            Effect::job_event("resume", JobId(7), None, "in place"),
            send(0, ControllerMessage::Resume { id: JobId(7), allocation: None }),
            send(1, ControllerMessage::Resume { id: JobId(7), allocation: None }),
        ]
    );
}

#[test]
fn a_moved_part_is_sent_its_new_cpus_and_an_unsynced_one_its_recorded_part() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    job.suspension.unsynced = vec![1];
    let mut to = job.allocation[0].clone();
    to.cpus = CpuSet::parse_list("4-7").expect("a PU list");
    let mut relocated = job.allocation.clone();
    relocated[0] = to.clone();
    let plan = parts_moved(&job.allocation, &Resume::Relocated(relocated));
    assert_eq!(plan, vec![Some(to.clone()), None], "only the part that moves");
    let (outcome, effects) = resumed(&mut job, &mut c, plan, 1260.0);
    assert_eq!(outcome, Resumed::Moved(vec!["n0".into()]));
    assert_eq!(job.allocation[0], to);
    assert_eq!((free(&c, 0), free(&c, 1)), ("0-3".to_string(), "4-7".to_string()));
    assert!(job.suspension.unsynced.is_empty());
    assert_eq!(job.suspension.resuming.as_ref().map(|r| r.moved.clone()), Some(vec![0, 1]));
    let part1 = job.allocation[1].clone();
    assert_eq!(
        effects[2..],
        [
            Effect::job_event("resume", JobId(7), None, "moved n0: cpus 0-3 -> 4-7, memory nodes 0 -> 0"),
            send(0, ControllerMessage::Resume { id: JobId(7), allocation: Some(to) }),
            send(1, ControllerMessage::Resume { id: JobId(7), allocation: Some(part1) }),
        ]
    );
}

#[test]
fn a_failed_resume_is_undone_and_the_job_frozen_again_everywhere() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    resumed(&mut job, &mut c, vec![None, None], 1230.0);
    // n0 answers well: still waiting for n1.
    assert_eq!(resume_answered(&mut job, &mut c, 0, "n0", None), vec![]);
    assert_eq!(job.suspension.resuming.as_ref().map(|r| r.waiting.clone()), Some(vec![1]));
    let effects = resume_answered(&mut job, &mut c, 1, "n1", Some("kernel said no".into()));
    assert_eq!(job.state, JobState::Suspended);
    assert_eq!(job.reason.as_deref(), Some("suspended: resuming failed on n1: kernel said no"));
    let s = &job.suspension;
    assert_eq!((s.since, s.total_secs, s.by_admin, s.resuming.is_none()), (Some(1200.0), 0.0, false, true));
    assert_eq!((free(&c, 0), free(&c, 1)), ("0-7".to_string(), "0-7".to_string()));
    assert_eq!(
        effects,
        vec![
            Effect::job_event("resume_failed", JobId(7), Some("n1"), "kernel said no"),
            row(&job),
            saved(&job),
            send(0, ControllerMessage::Suspend { id: JobId(7) }),
            send(1, ControllerMessage::Suspend { id: JobId(7) }),
            Effect::Reschedule,
        ]
    );
    // A late answer, with no resume in flight: nothing.
    assert_eq!(resume_answered(&mut job, &mut c, 0, "n0", Some("late".into())), vec![]);
}

#[test]
fn a_resume_answered_everywhere_is_over_and_an_ending_job_is_not_frozen_again() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    resumed(&mut job, &mut c, vec![None, None], 1230.0);
    let mut ending = job.clone();
    assert_eq!(resume_answered(&mut job, &mut c, 0, "n0", None), vec![]);
    assert_eq!(resume_answered(&mut job, &mut c, 1, "n1", None), vec![]);
    assert_eq!(job.suspension.resuming, None);
    ending.kill_sent = Some("cancelled".into());
    let effects = resume_answered(&mut ending, &mut c, 1, "n1", Some("gone".into()));
    assert_eq!(effects, vec![Effect::job_event("resume_failed", JobId(7), Some("n1"), "gone")]);
    assert_eq!((ending.state, ending.suspension.resuming.is_none()), (JobState::Running, true));
}

#[test]
fn a_failed_freeze_is_logged_and_shown_on_a_suspended_job_only() {
    let mut c = cluster(&[]);
    let mut job = suspended_job(&mut c);
    let effects = freezing_failed(JobId(7), Some(&mut job), "n1", "EBUSY");
    assert_eq!(job.reason.as_deref(), Some("suspended, but freezing failed on n1: EBUSY"));
    assert_eq!(effects, vec![Effect::job_event("suspend_failed", JobId(7), Some("n1"), "EBUSY"), row(&job)]);
    // Gone from memory, or running again: only the event.
    assert_eq!(freezing_failed(JobId(5), None, "n1", "EBUSY").len(), 1);
    let mut running = running_job(6, &ann(), &[(1, "6-7")]);
    assert_eq!(freezing_failed(JobId(6), Some(&mut running), "n1", "EBUSY").len(), 1);
    assert_eq!(running.reason, None);
}

#[test]
fn berth_resume_of_a_job_that_cannot_resume_lifts_the_admins_hold() {
    let mut job = running_job(4, &ann(), &[(0, "0-3")]);
    job.state = JobState::Suspended;
    job.suspension = Suspension { since: Some(1100.0), by_admin: true, count: 1, ..Default::default() };
    let effects = admin_hold_lifted(&mut job);
    assert!(!job.suspension.by_admin);
    assert_eq!(effects, vec![saved(&job)]);
    assert_eq!(admin_hold_lifted(&mut job), vec![], "lifted already");
}

#[test]
fn a_reconnected_agent_is_told_again_what_it_missed() {
    let mut jobs = BTreeMap::new();
    let mut frozen = running_job(1, &ann(), &[(0, "0-1"), (1, "0-1")]);
    frozen.state = JobState::Suspended;
    let resuming = |moved: Vec<usize>, waiting: Vec<usize>| Resuming {
        since: 1100.0,
        at: 1150.0,
        by_admin: false,
        moved,
        waiting,
    };
    // Resuming, moved on n1 and waiting for its answer: its part is sent again.
    let mut moved = running_job(2, &ann(), &[(0, "2-3"), (1, "2-3")]);
    moved.suspension.resuming = Some(resuming(vec![1], vec![1]));
    // Resuming in place, waiting for n1.
    let mut in_place = running_job(3, &ann(), &[(1, "4-5")]);
    in_place.suspension.resuming = Some(resuming(vec![], vec![1]));
    // n1 answered already.
    let mut answered = running_job(4, &ann(), &[(1, "6")]);
    answered.suspension.resuming = Some(resuming(vec![], vec![0]));
    // Ending: not told.
    let mut ending = running_job(5, &ann(), &[(1, "7")]);
    ending.state = JobState::Suspended;
    ending.kill_sent = Some("cancelled".into());
    let part = moved.allocation[1].clone();
    for j in [frozen, moved, in_place, answered, ending] {
        jobs.insert(j.id, j);
    }
    assert_eq!(
        resync_orders(&jobs, 1),
        vec![
            send(1, ControllerMessage::Suspend { id: JobId(1) }),
            send(1, ControllerMessage::Resume { id: JobId(2), allocation: Some(part) }),
            send(1, ControllerMessage::Resume { id: JobId(3), allocation: None }),
        ]
    );
    assert_eq!(resync_orders(&jobs, 0), vec![send(0, ControllerMessage::Suspend { id: JobId(1) })]);
}
