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
