//! `berth status`: is the controller up, and can it write its state.

use crate::client::request;
use anyhow::{bail, Result};
use berth_protocol::client::{ClientRequest, ClientResponse};
use std::path::Path;

/// Ask the controller (`Ping`) and print its version, counts and the health of its state
/// store. Exit status 0 when all is well, 2 when the store cannot be written (the controller
/// serves reads and keeps job ends meanwhile, but refuses changes).
pub async fn run(dir: &Path, json: bool) -> Result<i32> {
    let ClientResponse::Pong { version, protocol, nodes, jobs, state_store } =
        request(dir, ClientRequest::Ping).await?
    else {
        bail!("unexpected answer")
    };
    let code = if state_store.is_some() { 2 } else { 0 };
    if json {
        let v = serde_json::json!({
            "version": version, "protocol": protocol, "nodes": nodes, "jobs": jobs, "state_store": state_store,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    println!("controller: up, version {version} (protocol {protocol}), {nodes} nodes, {jobs} active jobs");
    match state_store {
        None => println!("state store: ok"),
        Some(h) => {
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64() - h.since)
                .unwrap_or(0.0);
            println!(
                "state store: {} for {since:.0} s: {}\n  (reads are served and running jobs go on; changes are refused until it can be written)",
                h.problem,
                h.message.escape_debug()
            );
        }
    }
    Ok(code)
}
