//! `berth resv`: advance reservations (docs/scheduling.md, "Advance reservations"). Times are
//! read here, in the local time zone, and sent as Unix times.

use crate::client::request;
use anyhow::{anyhow, bail, Result};
use berth_core::gres::Counts;
use berth_core::units::{parse_duration_secs, parse_size};
use berth_protocol::client::{AdvanceCreate, AdvanceInfo, ClientRequest, ClientResponse};
use clap::Subcommand;
use std::path::Path;

// Parsed once per command: the size of `Create` costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum ResvCommand {
    /// Admins: reserve whole nodes, cores placed for the window, or licenses alone, for users
    /// and/or accounts.
    Create {
        /// now, +2h (+SECONDS, +10m, +1d, +HH:MM:SS), HH:MM (the next one), or 2026-11-22T10:00.
        #[arg(long, default_value = "now")]
        start: String,
        /// When it ends (same forms as --start; +D counts from the start).
        #[arg(long, conflicts_with = "duration")]
        end: Option<String>,
        /// How long it lasts: SECONDS, HH:MM:SS, D-HH:MM:SS, or 10m / 2h.
        #[arg(long)]
        duration: Option<String>,
        /// Whole nodes, comma-separated.
        #[arg(long, conflicts_with_all = ["cores", "nodes_count", "mem"])]
        nodes: Option<String>,
        /// Or this many cores, placed by the controller for the window.
        #[arg(long)]
        cores: Option<u32>,
        /// With --cores: on this many nodes.
        #[arg(long = "nodes-count", requires = "cores")]
        nodes_count: Option<u32>,
        /// With --cores: memory per node (default: the default memory per CPU for each core).
        #[arg(long, requires = "cores")]
        mem: Option<String>,
        /// With --cores: this many GPUs in all, spread evenly over the nodes, placed with cores
        /// near them (whole --nodes hold all their GPUs).
        #[arg(long, requires = "cores")]
        gpus: Option<u32>,
        /// With --cores: generic resources on each node, NAME:COUNT[,...] (`[gres]` names; whole
        /// --nodes hold all theirs).
        #[arg(long, requires = "cores")]
        gres: Option<String>,
        /// Cluster-wide licenses held for the window, NAME[:COUNT][,...] (its jobs' licenses
        /// come from these); alone (without --nodes or --cores), licenses only: its jobs run
        /// on any node.
        #[arg(long, short = 'L')]
        licenses: Option<String>,
        /// Users whose jobs may use it, comma-separated.
        #[arg(long)]
        users: Option<String>,
        /// Accounts (projects) whose jobs may use it, comma-separated.
        #[arg(long)]
        accounts: Option<String>,
        /// Its name (default resvN).
        #[arg(long)]
        name: Option<String>,
    },
    /// Every advance reservation: window, resources, for whom, its jobs.
    List,
    /// Admins: delete one (its running jobs keep running; its queued jobs never start).
    Delete { name: String },
}

pub async fn run(dir: &Path, json: bool, command: ResvCommand) -> Result<i32> {
    let now = now();
    let single = matches!(command, ResvCommand::Create { .. });
    let req = match command {
        ResvCommand::Create {
            start,
            end,
            duration,
            nodes,
            cores,
            nodes_count,
            mem,
            gpus,
            gres,
            licenses,
            users,
            accounts,
            name,
        } => {
            let start_t = parse_time(&start, now, now)?;
            let end = end.map(|e| parse_time(&e, now, start_t)).transpose()?;
            let duration_secs =
                duration.map(|d| parse_duration_secs(&d).map_err(|e| anyhow!("--duration: {e}"))).transpose()?;
            let mem = mem.map(|m| parse_size(&m).map_err(|e| anyhow!("--mem: {e}"))).transpose()?;
            let counts = |what: &str, v: Option<String>| -> Result<Counts> {
                v.map(|t| berth_core::gres::parse_list(what, &t).map_err(|e| anyhow!("{e}")))
                    .transpose()
                    .map(Option::unwrap_or_default)
            };
            let (gres, licenses) = (counts("--gres", gres)?, counts("--licenses", licenses)?);
            ClientRequest::AdvanceCreate(Box::new(AdvanceCreate {
                name,
                start: (start.trim() != "now").then_some(start_t),
                end,
                duration_secs,
                nodes: list(nodes),
                cores,
                nodes_count,
                mem,
                gpus,
                gres,
                licenses,
                users: list(users),
                accounts: list(accounts),
            }))
        }
        ResvCommand::List => ClientRequest::AdvanceList,
        ResvCommand::Delete { name } => ClientRequest::AdvanceDelete { name },
    };
    match request(dir, req).await? {
        ClientResponse::Advance { reservations } => {
            if json && single && reservations.len() == 1 {
                println!("{}", serde_json::to_string_pretty(&reservations[0])?);
            } else if json {
                println!("{}", serde_json::to_string_pretty(&reservations)?);
            } else {
                print!("{}", crate::output::terminal_safe(&table(&reservations, now)));
            }
        }
        ClientResponse::AdvanceDeleted { reservation: r } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("advance reservation {} deleted", r.name);
                if !r.running_jobs.is_empty() {
                    println!("its running jobs {} keep running until they end", ids(&r.running_jobs));
                }
                if !r.queued_jobs.is_empty() {
                    println!("its queued jobs {} will not start; cancel them", ids(&r.queued_jobs));
                }
            }
        }
        _ => bail!("unexpected answer from the controller"),
    }
    Ok(0)
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn list(v: Option<String>) -> Vec<String> {
    v.map(|s| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect()).unwrap_or_default()
}

fn ids(v: &[berth_core::JobId]) -> String {
    v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// A time as given to `--start`/`--end`: `now`, `+DURATION` (after `base`), `HH:MM` (the next
/// such local time after `now`), or a local `YYYY-MM-DDTHH:MM[:SS]` (or with a space).
pub fn parse_time(text: &str, now: f64, base: f64) -> Result<f64> {
    let t = text.trim();
    let bad =
        || anyhow!("{text:?} is not a time; use now, +2h (+30m, +90, +1d, +HH:MM:SS), HH:MM, or 2026-11-22T10:00");
    if t == "now" {
        return Ok(now);
    }
    if let Some(d) = t.strip_prefix('+') {
        let secs = if let Some(days) = d.strip_suffix('d') {
            days.parse::<u64>().ok().and_then(|n| n.checked_mul(86_400)).ok_or_else(bad)?
        } else {
            parse_duration_secs(d).map_err(|_| bad())?
        };
        return Ok(base + secs as f64);
    }
    let hm = |s: &str| -> Option<(i32, i32, i32)> {
        let mut it = s.split(':');
        let h: i32 = it.next()?.parse().ok()?;
        let m: i32 = it.next()?.parse().ok()?;
        let sec: i32 = match it.next() {
            Some(x) => x.parse().ok()?,
            None => 0,
        };
        (it.next().is_none() && (0..24).contains(&h) && (0..60).contains(&m) && (0..60).contains(&sec))
            .then_some((h, m, sec))
    };
    if let Some((date, time)) = t.split_once(['T', ' ']) {
        let mut d = date.split('-');
        let (Some(y), Some(mo), Some(day), None) = (d.next(), d.next(), d.next(), d.next()) else { return Err(bad()) };
        let (y, mo, day): (i32, i32, i32) =
            (y.parse().map_err(|_| bad())?, mo.parse().map_err(|_| bad())?, day.parse().map_err(|_| bad())?);
        let (h, m, s) = hm(time).ok_or_else(bad)?;
        if !(1..=12).contains(&mo) || !(1..=31).contains(&day) || !(1970..=9999).contains(&y) {
            return Err(bad());
        }
        return local(y, mo, day, h, m, s).ok_or_else(bad);
    }
    let (h, m, s) = hm(t).ok_or_else(bad)?;
    // Today at that time, else tomorrow.
    let today = broken_down(now).ok_or_else(bad)?;
    let (y, mo, d) = (today.tm_year + 1900, today.tm_mon + 1, today.tm_mday);
    let at = local(y, mo, d, h, m, s).ok_or_else(bad)?;
    if at > now {
        Ok(at)
    } else {
        local(y, mo, d + 1, h, m, s).ok_or_else(bad)
    }
}

fn broken_down(t: f64) -> Option<libc::tm> {
    let secs = t as libc::time_t;
    // SAFETY: an all-zero tm is valid; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals.
    (!unsafe { libc::localtime_r(&secs, &mut tm) }.is_null()).then_some(tm)
}

/// A local time (day past the month's end rolls over) as a Unix time.
fn local(y: i32, mo: i32, d: i32, h: i32, m: i32, s: i32) -> Option<f64> {
    // SAFETY: an all-zero tm is valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = m;
    tm.tm_sec = s;
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalizes our tm.
    let t = unsafe { libc::mktime(&mut tm) };
    (t != -1).then_some(t as f64)
}

/// `YYYY-MM-DD HH:MM`, local.
fn when(t: f64) -> String {
    match broken_down(t) {
        Some(tm) => {
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}",
                tm.tm_year + 1900,
                tm.tm_mon + 1,
                tm.tm_mday,
                tm.tm_hour,
                tm.tm_min
            )
        }
        None => format!("{t:.0}"),
    }
}

pub fn table(reservations: &[AdvanceInfo], now: f64) -> String {
    let reservations = &crate::output::escaped(reservations)[..];
    let mut rows: Vec<[String; 8]> =
        vec![["NAME", "START", "END", "STATE", "CORES", "NODES[CPUS]", "FOR", "JOBS"].map(String::from)];
    for r in reservations {
        let mut who = vec![];
        if !r.users.is_empty() {
            who.push(format!("users {}", r.users.join(",")));
        }
        if !r.accounts.is_empty() {
            who.push(format!("accounts {}", r.accounts.join(",")));
        }
        rows.push([
            r.name.clone(),
            when(r.start),
            when(r.end),
            if r.active || r.start <= now { "active".into() } else { "waiting".into() },
            {
                let mut what = match r.gpus {
                    0 => r.cores.to_string(),
                    g => format!("{} +{g} GPU", r.cores),
                };
                if !r.gres.is_empty() {
                    what.push_str(&format!(" +{}", berth_core::gres::render(&r.gres)));
                }
                if !r.licenses.is_empty() {
                    what.push_str(&format!(" +license {}", berth_core::gres::render(&r.licenses)));
                }
                what
            },
            // A reservation of licenses alone holds no node.
            match r
                .allocation
                .iter()
                .filter(|a| !a.node.is_empty())
                .map(|a| format!("{}[{}]", a.node, a.cpus))
                .collect::<Vec<_>>()
            {
                nodes if nodes.is_empty() => "-".into(),
                nodes => nodes.join(","),
            },
            who.join("; "),
            format!("{} running, {} queued", r.running_jobs.len(), r.queued_jobs.len()),
        ]);
    }
    let widths: Vec<usize> = (0..8).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        let now = local(2026, 11, 22, 9, 30, 0).unwrap();
        assert_eq!(parse_time("now", now, now).unwrap(), now);
        assert_eq!(parse_time("+2h", now, now).unwrap(), now + 7200.0);
        assert_eq!(parse_time("+90", now, now + 10.0).unwrap(), now + 100.0);
        assert_eq!(parse_time("+1d", now, now).unwrap(), now + 86_400.0);
        assert_eq!(parse_time("10:00", now, now).unwrap(), now + 1800.0);
        assert_eq!(parse_time("09:00", now, now).unwrap(), local(2026, 11, 23, 9, 0, 0).unwrap());
        assert_eq!(parse_time("2026-11-22T10:00", now, now).unwrap(), now + 1800.0);
        assert_eq!(parse_time("2026-11-22 10:00:30", now, now).unwrap(), now + 1830.0);
        for bad in ["", "soon", "25:00", "10:61", "2026-13-01T10:00", "2026-11-22T", "+", "+x", "1:2:3:4"] {
            assert!(parse_time(bad, now, now).is_err(), "{bad:?}");
        }
    }
}
