//! A job's end decided without a store: the nodes' books are plain values, and the effects
//! returned are read.

use super::*;
use crate::testkit::{ann, running_job};
use std::time::Instant;

fn node(state: NodeState) -> NodeExtra {
    NodeExtra::new(state, String::new(), String::new(), String::new(), Instant::now())
}

#[test]
fn a_draining_node_a_job_leaves_idle_is_drained_and_written_a_busy_or_up_one_is_not() {
    // Job 7 on n0 (draining, now idle), n1 (draining, still running job 8) and n2 (up).
    let job = running_job(7, &ann(), &[(0, "0-3"), (1, "0-3"), (2, "0-3")]);
    let mut extra = vec![node(NodeState::Draining), node(NodeState::Draining), node(NodeState::Up)];
    let effects = drained(&job.allocation, &mut extra, |n| n == 1);
    assert_eq!(effects, vec![Effect::UpsertNode { node: 0 }]);
    let states: Vec<NodeState> = extra.iter().map(|e| e.state).collect();
    assert_eq!(states, vec![NodeState::Drained, NodeState::Draining, NodeState::Up]);
    // When job 8 ends too, n1 is drained; then there is nothing more to write.
    assert_eq!(drained(&job.allocation, &mut extra, |_| false), vec![Effect::UpsertNode { node: 1 }]);
    assert!(drained(&job.allocation, &mut extra, |_| false).is_empty());
}

#[test]
fn a_node_not_known_is_left_alone() {
    let job = running_job(7, &ann(), &[(3, "0-1")]);
    let mut extra = vec![node(NodeState::Draining)];
    assert!(drained(&job.allocation, &mut extra, |_| false).is_empty());
    assert_eq!(extra[0].state, NodeState::Draining);
}

fn kill(node: usize, reason: &str) -> Effect {
    Effect::Send { node, msg: ControllerMessage::Kill { id: JobId(7), reason: reason.into() } }
}

#[test]
fn an_ended_job_closes_its_steps_then_kills_what_is_left_on_its_other_nodes() {
    let job = running_job(7, &ann(), &[(0, "0-3"), (2, "0-3"), (1, "0-1")]);
    let closed = Effect::CloseSteps { job: JobId(7), time: 1500.0, failure: "job ended".into() };
    // Node 2 reported its end: the others are told, in the allocation's order.
    assert_eq!(
        ended(JobId(7), Some(&job.allocation), 1500.0, "job ended", Some(2)),
        vec![closed.clone(), kill(0, "job ended"), kill(1, "job ended")]
    );
    // Lost with no node to spare: all of them, with the reason given.
    let lost = "node n2 of the job was lost";
    assert_eq!(
        ended(JobId(7), Some(&job.allocation), 1500.0, lost, None),
        vec![closed.clone(), kill(0, lost), kill(2, lost), kill(1, lost)]
    );
    // Not in memory any more: its steps close all the same, nothing to kill.
    assert_eq!(ended(JobId(7), None, 1500.0, "job ended", None), vec![closed]);
}
