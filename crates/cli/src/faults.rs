//! `berth faults`: feed a node event script into a running system (`replay`), or generate a
//! random one (`random`) for tests. Scripts are those of `berth events --script`
//! (berth_core::faults).

use crate::client::request;
use anyhow::{anyhow, bail, Context, Result};
use berth_core::faults::{format_script, parse_script, random_script, FaultMode, NodeAction, RandomFaults};
use berth_protocol::client::{ClientRequest, ClientResponse};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A generated script is held in memory: bound it.
const MAX_RANDOM_FAULTS: usize = 100_000;

#[derive(Subcommand)]
pub enum FaultsCommand {
    /// Apply an event script to the running cluster (admins): `down` takes nodes down as
    /// `berth node down` does (their jobs handled by policy), `up` brings them back.
    Replay {
        file: PathBuf,
        /// Play faster (2 = twice as fast); 0 applies every event at once.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
    },
    /// Write a reproducible random event script (to stdout; `--apply` also replays it).
    Random {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Number of failures.
        #[arg(long, default_value_t = 5)]
        count: usize,
        /// single, adjacent (a group of neighbouring nodes) or unrelated (nodes apart).
        #[arg(long, default_value = "single")]
        mode: String,
        /// Nodes failing together in the adjacent and unrelated modes.
        #[arg(long, default_value_t = 2)]
        group: usize,
        /// Seconds between failures.
        #[arg(long, default_value_t = 10.0)]
        interval: f64,
        /// Seconds each failed node stays down.
        #[arg(long, default_value_t = 5.0)]
        downtime: f64,
        /// The nodes to pick from, in physical order (default: the cluster's, as `berth nodes`
        /// lists them: `[interconnect] order`, then names in natural order, node2 before node10).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Replay it on the cluster too.
        #[arg(long)]
        apply: bool,
    },
}

pub async fn run(dir: &Path, json: bool, cmd: FaultsCommand) -> Result<i32> {
    match cmd {
        FaultsCommand::Replay { file, speed } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let events = parse_script(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
            replay(dir, json, &events, speed).await
        }
        FaultsCommand::Random { seed, count, mode, group, interval, downtime, nodes, apply } => {
            let mode: FaultMode = mode.parse()?;
            if count > MAX_RANDOM_FAULTS {
                bail!("--count {count} is more than {MAX_RANDOM_FAULTS} failures; generate fewer at a time");
            }
            if !(interval.is_finite() && interval >= 0.0 && downtime.is_finite() && downtime >= 0.0) {
                bail!("--interval and --downtime must be seconds (0 or more)");
            }
            let nodes = if nodes.is_empty() { cluster_nodes(dir).await? } else { nodes };
            let spec = RandomFaults { seed, count, mode, group, interval, downtime };
            let events = random_script(&nodes, &spec);
            if !apply {
                print!("{}", format_script(&events));
                return Ok(0);
            }
            eprint!("{}", format_script(&events));
            replay(dir, json, &events, 1.0).await
        }
    }
}

async fn cluster_nodes(dir: &Path) -> Result<Vec<String>> {
    match request(dir, ClientRequest::ListNodes { topology: false }).await? {
        ClientResponse::Nodes { nodes, .. } => Ok(nodes.into_iter().map(|n| n.name).collect()),
        _ => bail!("unexpected answer from the controller"),
    }
}

async fn replay(dir: &Path, json: bool, events: &[berth_core::faults::ScriptEvent], speed: f64) -> Result<i32> {
    if !(speed.is_finite() && speed >= 0.0) {
        bail!("--speed must be 0 or more");
    }
    let t0 = Instant::now();
    let mut failures = 0;
    for e in events {
        if speed > 0.0 {
            let due = Duration::from_secs_f64(e.at / speed);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        for node in &e.nodes {
            let req = ClientRequest::NodeAdmin {
                name: node.clone(),
                action: e.action.as_str().into(),
                value: (e.action == NodeAction::Down).then(|| format!("replay: {}", e.reason)),
            };
            let result = request(dir, req).await;
            let line = serde_json::json!({
                "at": e.at, "action": e.action.as_str(), "node": node,
                "ok": result.is_ok(), "error": result.as_ref().err().map(|e| e.to_string()),
            });
            if json {
                println!("{line}");
            } else {
                match &result {
                    Ok(_) => println!("{:8.3} {} {node}", e.at, e.action.as_str()),
                    Err(err) => println!("{:8.3} {} {node}: {err}", e.at, e.action.as_str()),
                }
            }
            failures += result.is_err() as usize;
        }
    }
    Ok(if failures > 0 { 1 } else { 0 })
}
