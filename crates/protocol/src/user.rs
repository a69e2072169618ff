//! Who a job or step runs as, carried by launch orders and step grants.

use serde::{Deserialize, Serialize};

/// Who a job runs as. Taken from the kernel at submission, never from the client's word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserIdentity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub name: String,
}
