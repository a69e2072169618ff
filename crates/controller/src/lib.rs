//! berth-controller: the queue, the nodes and the durable state (`berth server`).

pub mod admin;
pub mod advance;
pub mod alloc;
pub mod api;
pub mod array;
pub mod clock;
pub mod command;
pub mod config;
mod conn;
pub mod depend;
mod exclusive;
pub mod fault;
pub mod handlers;
mod history;
pub mod lease;
pub mod lifecycle;
pub mod model;
pub mod notify;
pub mod pacing;
pub mod policy;
pub mod reservations;
pub mod server;
pub mod state;
pub mod steps;
pub mod store;
pub mod suspend;
pub mod update;
pub mod users;
pub mod views;

#[cfg(test)]
pub(crate) mod testkit;

pub use command::ServerError;
pub use config::ControllerConfig;
pub use server::serve;
pub use users::user_name;
