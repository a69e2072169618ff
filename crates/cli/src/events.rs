//! `berth events`: the controller's event log (node up/down, job starts, ends, requeues,
//! refusals), listed or followed as it grows.

use crate::client::request;
use anyhow::{bail, Result};
use berth_protocol::client::{ClientRequest, ClientResponse, EventInfo, EventQuery};
use clap::Args;
use std::path::Path;
use std::time::Duration;

#[derive(Args)]
pub struct EventsArgs {
    /// Keep printing new events as they are logged (Ctrl-C stops).
    #[arg(long, short)]
    follow: bool,
    /// Only events of these kinds (repeatable or comma-separated), e.g. node_down,node_up.
    #[arg(long, value_delimiter = ',')]
    kind: Vec<String>,
    /// Only events about this job.
    #[arg(long)]
    job: Option<String>,
    /// Only events about this node.
    #[arg(long)]
    node: Option<String>,
    /// Only events after this event id.
    #[arg(long)]
    after: Option<u64>,
    /// At most this many (the most recent, unless --after is given).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Print the node_down / node_up events as an event script for `berth faults replay`.
    #[arg(long, conflicts_with = "follow")]
    script: bool,
}

pub async fn run(dir: &Path, json: bool, args: EventsArgs) -> Result<i32> {
    let job = match &args.job {
        Some(j) => Some(j.parse().map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let mut query = EventQuery {
        after_id: args.after,
        kinds: args.kind.iter().filter(|k| !k.is_empty()).cloned().collect(),
        job,
        node: args.node.clone(),
        limit: Some(args.limit),
    };
    let events = fetch(dir, &query).await?;
    if args.script {
        print!("{}", berth_core::faults::format_script(&as_script(&events)));
        return Ok(0);
    }
    if !args.follow {
        if json {
            println!("{}", serde_json::to_string_pretty(&events)?);
        } else {
            print!("{}", crate::output::terminal_safe(&table(&events, true)));
        }
        return Ok(0);
    }
    // Following: one JSON object per line with --json, so a consumer can stream it.
    let mut header = !json;
    let mut last = events.last().map(|e| e.id).or(args.after).unwrap_or(0);
    let mut batch = events;
    loop {
        for e in &batch {
            if json {
                println!("{}", serde_json::to_string(e)?);
            }
            last = last.max(e.id);
        }
        if !json && !batch.is_empty() {
            print!("{}", crate::output::terminal_safe(&table(&batch, header)));
            header = false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        query.after_id = Some(last);
        query.limit = Some(10_000);
        batch = fetch(dir, &query).await?;
    }
}

/// Node downs and ups as a script, times from the first one.
fn as_script(events: &[EventInfo]) -> Vec<berth_core::faults::ScriptEvent> {
    use berth_core::faults::{NodeAction, ScriptEvent};
    let nodes: Vec<&EventInfo> =
        events.iter().filter(|e| e.node.is_some() && (e.kind == "node_down" || e.kind == "node_up")).collect();
    let start = nodes.first().map(|e| e.time).unwrap_or(0.0);
    nodes
        .into_iter()
        .map(|e| ScriptEvent {
            at: e.time - start,
            action: if e.kind == "node_down" { NodeAction::Down } else { NodeAction::Up },
            nodes: vec![e.node.clone().unwrap_or_default()],
            reason: if e.kind == "node_down" { e.detail.clone() } else { String::new() },
        })
        .collect()
}

async fn fetch(dir: &Path, query: &EventQuery) -> Result<Vec<EventInfo>> {
    match request(dir, ClientRequest::Events(query.clone())).await? {
        ClientResponse::Events { events } => Ok(events),
        _ => bail!("unexpected answer from the controller"),
    }
}

fn table(events: &[EventInfo], header: bool) -> String {
    let events = &crate::output::escaped(events)[..];
    let mut out = String::new();
    if header {
        out.push_str(&format!("{:>7}  {:<23} {:<16} {:>7} {:<10} {}\n", "ID", "TIME", "KIND", "JOB", "NODE", "DETAIL"));
    }
    for e in events {
        out.push_str(&format!(
            "{:>7}  {:<23} {:<16} {:>7} {:<10} {}\n",
            e.id,
            crate::output::date_time(e.time),
            e.kind,
            e.job.map(|j| j.to_string()).unwrap_or_else(|| "-".into()),
            e.node.as_deref().unwrap_or("-"),
            e.detail
        ));
    }
    out
}
