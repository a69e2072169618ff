//! `berth reservations`: the reservations made through the reservations API
//! (docs/reservations.md), asked of the controller over its client socket.

use crate::client::request;
use anyhow::{bail, Result};
use berth_protocol::client::{ClientRequest, ClientResponse};
use berth_protocol::reservation::{ReservationInfo, ReservationReply, ReservationRequest, ReservationState};
use std::path::Path;

pub async fn list(dir: &Path, json: bool, all: bool) -> Result<i32> {
    let req = ClientRequest::Reservation { request: Box::new(ReservationRequest::List { all }) };
    let reservations = match request(dir, req).await? {
        ClientResponse::Reservation { reply: ReservationReply::List { reservations } } => reservations,
        ClientResponse::Reservation { reply: ReservationReply::Failed(e) } => {
            bail!("{} [{}]", e.message, e.code.as_str())
        }
        _ => bail!("unexpected answer from the controller"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&reservations)?);
    } else {
        print!("{}", crate::output::terminal_safe(&table(&reservations, now())));
    }
    Ok(0)
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A duration from now, short: `45s`, `12m`, `3h`, `2d`.
fn span(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// What happens next to the reservation.
fn deadline(r: &ReservationInfo, now: f64) -> String {
    match (r.state, r.confirm_by, r.renew_by) {
        (ReservationState::Released, _, _) => r.release_reason.clone().unwrap_or_else(|| "released".into()),
        (ReservationState::Unconfirmed, Some(t), _) => format!("confirm within {}", span(t - now)),
        (_, _, Some(t)) if t < r.ends => format!("renew within {}", span(t - now)),
        _ => format!("ends in {}", span(r.ends - now)),
    }
}

pub fn table(reservations: &[ReservationInfo], now: f64) -> String {
    let reservations = &crate::output::escaped(reservations)[..];
    let mut rows: Vec<[String; 7]> = vec![["ID", "JOB", "USER", "STATE", "HOLDER", "NEXT", "NODES"].map(String::from)];
    for r in reservations {
        let nodes: Vec<String> = r.nodes.iter().map(|n| format!("{}:{}", n.node, n.cpus)).collect();
        rows.push([
            r.id.to_string(),
            r.job.to_string(),
            r.user.clone(),
            r.state.as_str().to_string(),
            r.holder.as_ref().map(|h| h.to_string()).unwrap_or_else(|| "-".into()),
            deadline(r, now),
            nodes.join(","),
        ]);
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::JobId;
    use berth_protocol::reservation::{Holder, ReservedNode};

    fn info(state: ReservationState, holder: Option<Holder>) -> ReservationInfo {
        ReservationInfo {
            id: 3,
            job: JobId(12),
            user: "ann".into(),
            uid: 1000,
            state,
            created: 0.0,
            confirm_by: (state == ReservationState::Unconfirmed).then_some(60.0),
            ends: 3600.0,
            walltime_seconds: 3600,
            renew_by: matches!(holder, Some(Holder::Session { .. })).then_some(300.0),
            holder,
            explicit: false,
            nodes: vec![ReservedNode {
                node: "node1".into(),
                address: "127.0.0.1:7200".into(),
                cpus: "0-3".into(),
                cores: 4,
                mems: "0".into(),
                memory_bytes: 1 << 30,
                numa_memory: vec![],
                gpus: vec![],
                gres: Default::default(),
            }],
            licenses: Default::default(),
            released_at: None,
            release_reason: None,
            claims: vec![],
        }
    }

    #[test]
    fn table_says_what_comes_next() {
        let t = table(
            &[
                info(ReservationState::Unconfirmed, None),
                info(ReservationState::Confirmed, Some(Holder::Pid { pid: 42 })),
                info(ReservationState::Confirmed, Some(Holder::Session { session: "s".into() })),
            ],
            0.0,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("ID  JOB  USER  STATE"), "{t}");
        assert!(lines[1].contains("unconfirmed") && lines[1].contains("confirm within 60s"), "{t}");
        assert!(lines[1].ends_with("node1:0-3"), "{t}");
        assert!(lines[2].contains("pid 42") && lines[2].contains("ends in 60m"), "{t}");
        assert!(lines[3].contains("session s") && lines[3].contains("renew within 5m"), "{t}");
    }
}
