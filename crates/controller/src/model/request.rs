//! Who sent a request, and the refusal it may get.

use berth_protocol::client::{ApiError, ClientResponse, ErrorCode};
use berth_protocol::user::UserIdentity;

/// Who sent a request, as the kernel told us.
#[derive(Debug, Clone)]
pub struct Peer {
    pub user: UserIdentity,
    /// The client connection (unique while the controller runs): interactive allocations
    /// made on it end when it closes.
    pub conn: u64,
}

pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> ClientResponse {
    ClientResponse::Error(ApiError::new(code, message))
}
