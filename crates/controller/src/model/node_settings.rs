//! What an admin set for a node (`berth node`): kept in the store's `meta` table under
//! `node_admin:<name>`, so it survives restarts and re-registrations.

use berth_core::node::SubnodeState;
use serde::{Deserialize, Serialize};

/// A node's settings as written (other than its state, which its row holds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeSettings {
    /// Kernel list; None means the config's default.
    pub system_cpus: Option<String>,
    pub subnodes: Vec<(SubnodeState, Vec<String>)>,
}

/// The `meta` key of node `name`'s settings.
pub fn key(name: &str) -> String {
    format!("node_admin:{name}")
}

/// The `meta` key of why an admin took node `name` down (`berth node down`, `crate::fault`).
pub fn admin_down_key(name: &str) -> String {
    format!("node_down:{name}")
}
