//! The task API (seeds/001, the PBS TM interface): from inside a job, node information and
//! asynchronous spawn of tasks on any node of the job's allocation, each in the job's cgroup
//! there (so accounted with the job and killed at its end), then list, wait and kill.
//!
//! Served on the agent's local Unix socket (`BERTH_AGENT_SOCKET`) to the job's own processes
//! only: the caller's uid (SO_PEERCRED) must be the job's owner or root, and a non-root
//! caller's pid must be inside the job's cgroup on this node. The agent called keeps the job's
//! task table ([`crate::ports::task_table`]); a task for another node is started by that
//! node's agent over one TCP connection per task (`remote_spawn`), kept open while the task
//! runs: its end comes back on it, signals go down it, and if it breaks the remote agent kills
//! the task's process group. See docs/protocol/04-task-api.md.
//!
//! Its files, each using only those after it in this list:
//! - `socket.rs`: the local socket, its connections, and what each request does;
//! - `exec.rs`: `exec` (`berth task rsh`), one task attached to its caller's connection;
//! - `peer.rs`: requests from other agents: `remote_info`, and `remote_spawn` run here;
//! - `spawn.rs`: `spawn`, copies with their output in files, and starting a task here;
//! - `info.rs`: `info`, the nodes of the allocation and their CPUs;
//! - `remote.rs`: a task on another node, driven from the agent that spawned it;
//! - `process.rs`: a task's process here: waiting, signals, its session's end, stdio relay;
//! - `access.rs`: who may call, what a request may ask, and the refusals;
//! - `env.rs`: a task's environment and output paths.
//!
//! This file only declares them and names what the rest of the agent uses.

mod access;
mod env;
mod exec;
mod info;
mod peer;
mod process;
mod remote;
mod socket;
mod spawn;

pub use access::{cgroup_contains, Caller, TaskRefusal, MAX_SPAWN};
pub use env::{expand, task_env};
pub use peer::serve_agent;
pub use socket::{bind_socket, handle_local, serve_socket, SocketError};
pub use spawn::TaskSpawnError;
