//! berth-protocol: every message between berth processes, and how they are framed.
//!
//! See `docs/protocol/` (README.md, the index) for the written specification. A frame is a 4-byte big-endian
//! length followed by that many bytes of JSON: an object with `"v"` (the protocol version)
//! and the message's own fields.

pub mod agent;
pub mod auth;
pub mod client;
pub mod error;
pub mod frame;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod limits;
pub mod node;
pub mod probe;
pub mod reservation;
pub mod step;
pub mod tree;
pub mod user;

pub use error::ErrorCode;
pub use frame::{
    read_frame, read_frame_limited, read_raw_frame, read_raw_frame_limited, write_frame, FrameBudget, FrameLimits,
    ProtocolError, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
