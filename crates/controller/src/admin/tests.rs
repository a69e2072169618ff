//! `subnode_change` decides without a store: these tests build a node and read the effects.

use super::*;
use berth_core::topology::Topology;
use berth_core::NodeId;
use std::sync::Arc;

/// A node of 2 NUMA nodes, one subnode each.
fn node() -> NodeCapacity {
    let mut cap = NodeCapacity::new(NodeId(0), "n0", Arc::new(Topology::uniform(2, 1, 4, 1, 1 << 30)));
    cap.set_subnode_size(1);
    assert_eq!(cap.subnodes.len(), 2);
    cap
}

fn settings(effect: &Effect) -> NodeSettings {
    match effect {
        Effect::SetMeta { key, value } => {
            assert_eq!(key, "node_admin:n0");
            serde_json::from_str(value).expect("the node's settings as JSON")
        }
        other => panic!("not the settings: {other:?}"),
    }
}

#[test]
fn a_subnode_drained_is_changed_then_written_logged_and_rescheduled_in_that_order() {
    let mut cap = node();
    let effects = subnode_change(&mut cap, 1, "drain", None).expect("a valid change");
    assert_eq!((cap.subnodes[0].state, cap.subnodes[1].state), (SubnodeState::Up, SubnodeState::Drained));
    assert_eq!(effects.len(), 3, "{effects:?}");
    let written = settings(&effects[0]);
    assert_eq!(written.subnodes, vec![(SubnodeState::Up, vec![]), (SubnodeState::Drained, vec![])]);
    assert_eq!(written.system_cpus, Some(cap.system_pus.to_list()));
    assert_eq!(
        effects[1],
        Effect::Event { kind: "subnode_drain".into(), job: None, node: Some("n0".into()), detail: "1 ".into() }
    );
    assert_eq!(effects[2], Effect::Reschedule);

    // Properties: trimmed, empty ones dropped; the settings written carry them.
    let effects = subnode_change(&mut cap, 0, "properties", Some(" fast, ib ,,")).unwrap();
    assert_eq!(cap.subnodes[0].properties, vec!["fast".to_string(), "ib".to_string()]);
    assert_eq!(settings(&effects[0]).subnodes[0], (SubnodeState::Up, vec!["fast".into(), "ib".into()]));
    assert!(matches!(&effects[1], Effect::Event { detail, .. } if detail == "0  fast, ib ,,"));
}

#[test]
fn a_refused_subnode_change_changes_nothing_and_writes_nothing() {
    let mut cap = node();
    let refused = |r: Result<Vec<Effect>, ClientResponse>| match r {
        Err(ClientResponse::Error(e)) => (e.code, e.message),
        other => panic!("not refused: {other:?}"),
    };
    let (code, why) = refused(subnode_change(&mut cap, 2, "drain", None));
    assert_eq!((code, why.as_str()), (ErrorCode::BadRequest, "node n0 has 2 subnode(s)"));
    let (code, why) = refused(subnode_change(&mut cap, 0, "reboot", None));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(why.contains("unknown subnode action \"reboot\""), "{why}");
    let (_, why) = refused(subnode_change(&mut cap, 0, "properties", Some("ok,not ok")));
    assert!(why.contains("letters, digits"), "{why}");
    assert!(cap.subnodes.iter().all(|s| s.state == SubnodeState::Up && s.properties.is_empty()));

    // A node without subnodes says how to have them.
    let mut plain = NodeCapacity::new(NodeId(1), "n1", Arc::new(Topology::uniform(1, 1, 2, 1, 1 << 30)));
    let (_, why) = refused(subnode_change(&mut plain, 0, "drain", None));
    assert!(why.contains("0 subnode(s) (set subnode_numa"), "{why}");
}

#[test]
fn a_node_drained_or_resumed_takes_the_state_its_jobs_and_agent_say_and_its_row_is_written() {
    let mut cap = node();
    let change = |state: NodeState, connected: bool, busy: bool, action: &str, cap: &mut NodeCapacity| {
        let mut state = state;
        let effects = node_change(3, &mut state, connected, busy, cap, action, None).expect("a valid change");
        assert_eq!(effects, vec![Effect::UpsertNode { node: 3 }]);
        state
    };
    assert_eq!(change(NodeState::Up, true, true, "drain", &mut cap), NodeState::Draining);
    assert_eq!(change(NodeState::Up, true, false, "drain", &mut cap), NodeState::Drained);
    assert_eq!(change(NodeState::Drained, true, false, "resume", &mut cap), NodeState::Up);
    assert_eq!(change(NodeState::Drained, false, false, "resume", &mut cap), NodeState::Down);
}

#[test]
fn system_cpus_set_on_a_node_are_its_settings_written_and_refused_ones_change_nothing() {
    let mut cap = node();
    let mut state = NodeState::Up;
    let effects = node_change(0, &mut state, true, false, &mut cap, "system-cpus", Some("0-1")).expect("valid PUs");
    assert_eq!(cap.system_pus.to_list(), "0-1");
    assert_eq!(effects.len(), 1);
    assert_eq!(settings(&effects[0]).system_cpus.as_deref(), Some("0-1"));
    assert_eq!(state, NodeState::Up);
    let refused = |r: Result<Vec<Effect>, ClientResponse>| match r {
        Err(ClientResponse::Error(e)) => (e.code, e.message),
        other => panic!("not refused: {other:?}"),
    };
    let (code, why) = refused(node_change(0, &mut state, true, false, &mut cap, "system-cpus", Some("0-99")));
    assert_eq!(code, ErrorCode::BadRequest);
    assert!(why.starts_with("node n0 has PUs 0-7;"), "{why}");
    let (code, _) = refused(node_change(0, &mut state, true, false, &mut cap, "system-cpus", Some("x")));
    assert_eq!(code, ErrorCode::BadRequest);
    let (_, why) = refused(node_change(0, &mut state, true, false, &mut cap, "reboot", None));
    assert!(why.starts_with("unknown node action \"reboot\""), "{why}");
    assert_eq!((cap.system_pus.to_list(), state), ("0-1".to_string(), NodeState::Up));
}
