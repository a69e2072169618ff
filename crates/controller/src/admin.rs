//! Admin settings of nodes: state (drain/resume), system CPUs, subnode states and properties.
//! Settings other than the state are kept in the store's `meta` table under
//! `node_admin:<name>`, so they survive restarts and re-registrations.

use crate::model::effect::Effect;
use crate::model::node_settings::{key, NodeSettings};
use crate::model::request::{error, Peer};
use crate::state::Controller;
use crate::store::StoreError;
use berth_core::node::{NodeCapacity, NodeState, SubnodeState};
use berth_core::CpuSet;
use berth_protocol::client::{ClientResponse, ErrorCode};

impl Controller {
    /// The index of node `name` if `peer` is an admin, else the error to reply.
    /// A refusal is recorded (`denied`) with the command's effects: the command ends with it.
    fn admin_target(&mut self, peer: &Peer, name: &str, what: &str) -> Result<usize, ClientResponse> {
        if !self.is_admin(peer) {
            self.queue([crate::handlers::denial(peer, &format!("change {what} of node {name}"), None, "")]);
            return Err(error(ErrorCode::NotPermitted, format!("only admins may change {what} (config key `admins`)")));
        }
        self.node_by_name(name).ok_or_else(|| {
            error(ErrorCode::UnknownNode, format!("no node is named {name:?}; `berth nodes` lists them"))
        })
    }

    pub fn node_admin(
        &mut self,
        name: &str,
        action: &str,
        value: Option<&str>,
        peer: &Peer,
        now: f64,
    ) -> Result<ClientResponse, StoreError> {
        let i = match self.admin_target(peer, name, "nodes") {
            Ok(i) => i,
            Err(reply) => return Ok(reply),
        };
        let detail = format!("{} {}", peer.user.name, value.unwrap_or(""));
        if matches!(action, "down" | "up") {
            self.node_down_up(i, action, value, now)?;
            self.queue([Effect::node_event(action, name, detail)]);
        } else {
            let busy = !self.jobs_on_node(i).is_empty();
            let ex = &mut self.extra[i];
            let connected = ex.connected();
            let changed =
                node_change(i, &mut ex.state, connected, busy, &mut self.cluster.node_at_mut(i), action, value);
            match changed {
                Ok(effects) => self.queue(effects),
                Err(refused) => return Ok(refused),
            }
            self.queue([Effect::node_event(action, name, detail)]);
        }
        self.dirty = true;
        Ok(ClientResponse::Nodes { nodes: vec![self.node_info(i, false)], licenses: self.license_info() })
    }

    /// `berth node NAME subnode INDEX ACTION`: the change is decided by `subnode_change`
    /// (pure), its writes carried out by the server loop (`Controller::carry_out_effects`).
    pub fn subnode_admin(
        &mut self,
        node: &str,
        index: u32,
        action: &str,
        value: Option<&str>,
        peer: &Peer,
    ) -> Result<ClientResponse, StoreError> {
        let i = match self.admin_target(peer, node, "subnodes") {
            Ok(i) => i,
            Err(reply) => return Ok(reply),
        };
        let changed = subnode_change(&mut self.cluster.node_at_mut(i), index, action, value);
        match changed {
            Ok(effects) => self.out.effects.extend(effects),
            Err(refused) => return Ok(refused),
        }
        Ok(ClientResponse::Nodes { nodes: vec![self.node_info(i, false)], licenses: self.license_info() })
    }
}

/// An admin's drain, resume or system-cpus of node `i` (its state `state`, its agent
/// `connected` or not, running jobs or not: `busy`; its capacity `cap`), made on them; what is
/// to be written (the node's row, or its settings) is returned. Refused (the reply) with the
/// node unchanged. Needs no store; the caller adds the event.
pub(crate) fn node_change(
    i: usize,
    state: &mut NodeState,
    connected: bool,
    busy: bool,
    cap: &mut NodeCapacity,
    action: &str,
    value: Option<&str>,
) -> Result<Vec<Effect>, ClientResponse> {
    match action {
        "drain" | "resume" => {
            *state = match action {
                "drain" if busy => NodeState::Draining,
                "drain" => NodeState::Drained,
                _ if connected => NodeState::Up,
                _ => NodeState::Down,
            };
            Ok(vec![Effect::UpsertNode { node: i }])
        }
        "system-cpus" => {
            let list = value.unwrap_or("");
            let set = CpuSet::parse_list(list).map_err(|e| error(ErrorCode::BadRequest, e.to_string()))?;
            let all = cap.topology.all_pus();
            if !set.is_subset_of(&all) {
                return Err(error(
                    ErrorCode::BadRequest,
                    format!("node {} has PUs {}; {list:?} names others", cap.name, all.to_list()),
                ));
            }
            // Running jobs keep what they have; the change applies to new placements.
            cap.system_pus = set;
            cap.refresh();
            let (key, value) = settings_of(cap);
            Ok(vec![Effect::SetMeta { key, value }])
        }
        other => Err(error(
            ErrorCode::BadRequest,
            format!("unknown node action {other:?}; use drain, resume, down, up or system-cpus"),
        )),
    }
}

/// The `meta` key and value of what an admin set for node `cap`.
fn settings_of(cap: &NodeCapacity) -> (String, String) {
    let s = NodeSettings {
        system_cpus: Some(cap.system_pus.to_list()),
        subnodes: cap.subnodes.iter().map(|s| (s.state, s.properties.clone())).collect(),
    };
    (key(&cap.name), serde_json::to_string(&s).unwrap_or_default())
}

/// An admin's change of subnode `index` of node `cap` (drain, offline, resume, properties),
/// made on `cap`; what is to be written (the node's settings, the event, a pass) is returned,
/// in order. Refused (the reply) with `cap` unchanged. Needs no store.
pub fn subnode_change(
    cap: &mut NodeCapacity,
    index: u32,
    action: &str,
    value: Option<&str>,
) -> Result<Vec<Effect>, ClientResponse> {
    let count = cap.subnodes.len();
    let Some(sub) = cap.subnodes.get_mut(index as usize) else {
        return Err(error(
            ErrorCode::BadRequest,
            format!(
                "node {} has {count} subnode(s){}",
                cap.name,
                if count == 0 { " (set subnode_numa in the controller config)" } else { "" }
            ),
        ));
    };
    match action {
        "drain" => sub.state = SubnodeState::Drained,
        "offline" => sub.state = SubnodeState::Offline,
        "resume" => sub.state = SubnodeState::Up,
        "properties" => {
            let props: Vec<String> =
                value.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
            if props.iter().any(|p| !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')) {
                return Err(error(ErrorCode::BadRequest, "properties are names of letters, digits, _ and -"));
            }
            sub.properties = props;
        }
        other => {
            return Err(error(
                ErrorCode::BadRequest,
                format!("unknown subnode action {other:?}; use drain, offline, resume or properties"),
            ))
        }
    }
    let (key, value_json) = settings_of(cap);
    Ok(vec![
        Effect::SetMeta { key, value: value_json },
        Effect::node_event(&format!("subnode_{action}"), &cap.name, format!("{index} {}", value.unwrap_or(""))),
        Effect::Reschedule,
    ])
}

#[cfg(test)]
mod tests;
