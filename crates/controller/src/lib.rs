//! berth-controller: the queue, the nodes and the durable state (`berth server`).

pub mod admin;
pub mod config;
pub mod handlers;
pub mod job;
pub mod server;
pub mod state;
pub mod steps;
pub mod store;
pub mod views;

pub use config::ControllerConfig;
pub use server::{serve, user_name, ServerError};
