//! A refused action decided without a store: the event `denied` is a plain value.

use super::*;
use crate::testkit::{ann, bob};

fn denied_event(job: Option<JobId>, detail: &str) -> Effect {
    Effect::Event { kind: "denied".into(), job, node: None, detail: detail.into() }
}

#[test]
fn a_refusal_names_the_user_the_action_the_job_and_its_owner_when_known() {
    assert_eq!(
        denial(&bob(), "cancel", Some(JobId(7)), "ann"),
        denied_event(Some(JobId(7)), "user bob may not cancel job 7 of user ann")
    );
    // A job whose owner is not known (it is not in memory): no owner named.
    assert_eq!(
        denial(&ann(), "suspend", Some(JobId(9)), ""),
        denied_event(Some(JobId(9)), "user ann may not suspend job 9")
    );
    // No job: a node's settings.
    assert_eq!(
        denial(&ann(), "change nodes of node n0", None, ""),
        denied_event(None, "user ann may not change nodes of node n0")
    );
}

#[test]
fn a_pending_job_cancelled_ends_now_with_its_reason_then_the_event_follows_its_row() {
    let mut job = crate::testkit::running_job(7, &ann(), &[]);
    job.state = JobState::Queued;
    let effects = cancelled_pending(&mut job, "cancelled before it started", "", 1500.0);
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.end_time, Some(1500.0));
    assert_eq!(job.reason.as_deref(), Some("cancelled before it started"));
    assert_eq!(
        effects,
        vec![Effect::UpdateJob(Box::new(job.clone())), Effect::job_event("cancel", JobId(7), None, "")]
    );
    // A dependency never met: the reason is the event's detail too.
    let mut other = crate::testkit::running_job(8, &ann(), &[]);
    other.state = JobState::Queued;
    let effects = cancelled_pending(&mut other, "dependency afterok:7 failed", "dependency afterok:7 failed", 1600.0);
    assert_eq!(effects[1], Effect::job_event("cancel", JobId(8), None, "dependency afterok:7 failed"));
}

#[test]
fn the_live_connection_of_a_node_closing_leaves_it_without_agent_and_is_logged_an_old_one_is_not() {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut ex = NodeExtra {
        state: NodeState::Up,
        address: String::new(),
        real_cpus: String::new(),
        instance: "i1".into(),
        conn: Some((5, tx)),
        last_heard: std::time::Instant::now(),
    };
    // A connection replaced already: nothing changes.
    assert!(disconnected(&mut ex, "n0", 4).is_empty());
    assert!(ex.conn.is_some());
    assert_eq!(disconnected(&mut ex, "n0", 5), vec![Effect::node_event("node_disconnect", "n0", "")]);
    assert!(ex.conn.is_none());
    // Once gone, a second close of it changes nothing.
    assert!(disconnected(&mut ex, "n0", 5).is_empty());
}
