//! The controller's plain model: what it keeps of jobs and their suspensions, advance
//! reservations and reservations of the reservations API, and who sent a request. Types and
//! pure functions only: the store (`crate::store`) reads and writes them, the in-memory state
//! (`crate::state`) holds them, the features (`impl Controller` blocks) change them.

pub mod advance;
pub mod alloc;
pub mod array;
pub mod cgroups;
pub mod counts;
pub mod depend;
pub mod effect;
pub mod ids;
pub mod job;
pub mod node_settings;
pub mod policy;
pub mod request;
pub mod reservation;
pub mod step;
pub mod suspension;
