//! An opt-in launch timeline: with `BERTH_TT=1` in a process's environment, [`mark`] writes
//! `TT <pid> <µs since the epoch> <what>` to its stderr (agents' and the controller's go to
//! their logs), so one launch can be followed across `run`, the controller and the agents
//! by sorting on the time. Off (one relaxed load) otherwise.

use std::sync::OnceLock;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("BERTH_TT").is_some_and(|v| v == "1"))
}

/// Record that `what` happens now.
pub fn mark(what: &str) {
    if enabled() {
        let us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
        // One write: stderr is unbuffered, and eprintln! would make one per piece.
        let line = format!("TT {} {us} {what}\n", std::process::id());
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }
}
