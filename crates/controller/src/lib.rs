//! berth-controller: the queue, the nodes and the durable state (`berth server`).

mod admin;
mod advance;
mod alloc;
mod api;
mod array;
mod clock;
mod command;
mod config;
mod conn;
mod depend;
mod exclusive;
mod fault;
mod handlers;
mod history;
mod lease;
mod lifecycle;
mod model;
mod notify;
mod pacing;
mod policy;
mod reservations;
mod server;
mod state;
mod steps;
pub mod store;
mod suspend;
mod update;
mod users;
mod views;

#[cfg(test)]
pub(crate) mod testkit;

pub use command::ServerError;
pub use config::ControllerConfig;
pub use server::serve;
pub use users::user_name;
