//! berth-core: the models, topology, and scheduling of berth.
//!
//! Nothing here does I/O, reads a clock or opens a socket: every function takes the state and
//! the time it needs as arguments, so it can be tested with plain values.

pub mod binding;
pub mod cpuset;
pub mod directives;
pub mod error;
pub mod faults;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod gpu;
pub mod gres;
pub mod hierarchy;
pub mod hostlist;
pub mod ids;
pub mod job;
pub mod limits;
pub mod node;
pub mod placement;
pub mod sched;
pub mod step;
pub mod topology;
pub mod units;

pub use cpuset::CpuSet;
pub use error::CoreError;
pub use ids::{JobId, NodeId};
