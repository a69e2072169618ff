//! berth-agent: everything that happens on one host (`berth agent`).

pub mod auth;
pub mod binding;
pub mod cgroup;
pub mod compat_env;
pub mod conn;
pub mod cpumap;
pub mod daemon;
pub mod fence;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod gpu_devices;
pub mod gpus;
pub mod hwguard;
pub mod hwtopo;
pub mod job;
pub mod launcher;
pub mod ports;
pub mod priority;
pub mod records;
pub mod resident;
pub mod spawn;
pub mod step;
pub mod tasks;

pub use daemon::{run, AgentConfig, AgentError};

pub(crate) fn now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
