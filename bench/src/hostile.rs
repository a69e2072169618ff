//! `berth-bench hostile [--hostile N] [--idle M] [--seconds S]`: hostile local peers against a
//! local cluster (issue 16, items 3 and 4). N connections each announce a 16 MiB frame and send
//! nothing more (spread over the controller's socket, its agent port, the agent's port and its
//! task socket), M idle connections to the controller's socket send nothing at all; meanwhile
//! `berth jobs` runs in a loop. Reports the controller's and the agent's VmRSS growth (peak
//! over the run) and the latency of `berth jobs` (p50, p99, max), before and among them.
//! Not a timed test: figures for RELIABILITY.md.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn flag(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).with_context(|| format!("{name} needs a value"))?.parse().context(name.to_string()),
        None => Ok(default),
    }
}

fn status_kb(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

fn pid(dir: &Path, who: &str) -> Result<i32> {
    let p = dir.join("run").join(format!("{who}.pid"));
    std::fs::read_to_string(&p)?.trim().parse().with_context(|| format!("{}", p.display()))
}

/// `berth jobs` latencies for `secs`, sampling both daemons' VmRSS; returns (latencies, peak
/// controller kB, peak agent kB).
fn jobs_loop(bin: &Path, dir: &Path, secs: u64, ctl: i32, agent: i32) -> Result<(Vec<f64>, u64, u64)> {
    let t0 = Instant::now();
    let (mut lat, mut peak_c, mut peak_a) = (Vec::new(), 0, 0);
    while t0.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        let st = Command::new(bin).arg("--dir").arg(dir).arg("jobs").stdout(Stdio::null()).status()?;
        if !st.success() {
            bail!("`berth jobs` failed among hostile peers");
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        peak_c = peak_c.max(status_kb(ctl, "VmRSS:"));
        peak_a = peak_a.max(status_kb(agent, "VmRSS:"));
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((lat, peak_c, peak_a))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

pub async fn run(args: &[String]) -> Result<()> {
    let hostile = flag(args, "--hostile", 1000)? as usize;
    let idle = flag(args, "--idle", 1000)? as usize;
    let secs = flag(args, "--seconds", 20)?;
    let soft = berth_protocol::limits::raise_nofile()?;
    if (soft as usize) < hostile + idle + 64 {
        bail!("open-file limit {soft} is too low for {} connections", hostile + idle);
    }
    let c = super::Cluster::up(1, "package:1 numa:1 core:2 pu:1")?;
    let (dir, bin) = (c.dir.clone(), c.bin.clone());
    let ctl = pid(&dir, "server")?;
    let agent = pid(&dir, "node1")?;
    let toml = std::fs::read_to_string(dir.join("berth.toml"))?;
    let listen = toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen").map(|v| v.trim_start_matches([' ', '=']).trim_matches('"')))
        .context("listen in berth.toml")?
        .to_string();
    let nodes: serde_json::Value =
        serde_json::from_slice(&Command::new(&bin).arg("--dir").arg(&dir).args(["nodes", "--json"]).output()?.stdout)?;
    let agent_addr = nodes
        .as_array()
        .and_then(|a| a.first())
        .and_then(|n| n["address"].as_str())
        .context("the agent's address in `berth nodes --json`")?
        .to_string();
    let agent_sock = std::fs::read_dir(dir.join("agents").join("node1"))
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "sock")))
        .or_else(|| Some(dir.join("node1").join("agent.sock")).filter(|p| p.exists()));
    let agent_sock = match agent_sock {
        Some(p) => p,
        None => bail!("cannot find the agent's task socket under {}", dir.display()),
    };

    // Before: a baseline of the same loop.
    let (mut before, _, _) = jobs_loop(&bin, &dir, 5, ctl, agent)?;
    let (rss_c0, rss_a0, fds_c0, fds_a0) = (status_kb(ctl, "VmRSS:"), status_kb(agent, "VmRSS:"), fds(ctl), fds(agent));

    let announce = (16u32 << 20).to_be_bytes();
    let mut held: Vec<Box<dyn Write>> = Vec::new();
    let mut refused = 0;
    let t_open = Instant::now();
    for i in 0..hostile {
        let conn: std::io::Result<Box<dyn Write>> = match i % 4 {
            0 => UnixStream::connect(dir.join("controller.sock")).map(|s| Box::new(s) as Box<dyn Write>),
            1 => std::net::TcpStream::connect(&listen).map(|s| Box::new(s) as Box<dyn Write>),
            2 => std::net::TcpStream::connect(&agent_addr).map(|s| Box::new(s) as Box<dyn Write>),
            _ => UnixStream::connect(&agent_sock).map(|s| Box::new(s) as Box<dyn Write>),
        };
        match conn.and_then(|mut s| s.write_all(&announce).map(|()| s)) {
            Ok(s) => held.push(s),
            Err(_) => refused += 1,
        }
    }
    for _ in 0..idle {
        match UnixStream::connect(dir.join("controller.sock")) {
            Ok(s) => held.push(Box::new(s)),
            Err(_) => refused += 1,
        }
    }
    let opened_ms = t_open.elapsed().as_secs_f64() * 1000.0;
    let (fds_c1, fds_a1) = (fds(ctl), fds(agent));
    let (mut among, peak_c, peak_a) = jobs_loop(&bin, &dir, secs, ctl, agent)?;
    let (fds_c2, fds_a2) = (fds(ctl), fds(agent));
    drop(held);
    let grow_c = peak_c.saturating_sub(rss_c0);
    let grow_a = peak_a.saturating_sub(rss_a0);
    let v = serde_json::json!({
        "bench": "hostile", "hostile": hostile, "idle": idle, "seconds": secs, "open_ms": opened_ms,
        "connect_errors": refused,
        "controller_rss_kb": {"before": rss_c0, "peak": peak_c, "growth": grow_c},
        "agent_rss_kb": {"before": rss_a0, "peak": peak_a, "growth": grow_a},
        "growth_total_mb": (grow_c + grow_a) as f64 / 1024.0,
        "controller_fds": {"before": fds_c0, "after_open": fds_c1, "at_end": fds_c2},
        "agent_fds": {"before": fds_a0, "after_open": fds_a1, "at_end": fds_a2},
        "jobs_ms_before": {"n": before.len(), "p50": pct(&mut before, 0.5), "p99": pct(&mut before, 0.99), "max": pct(&mut before, 1.0)},
        "jobs_ms_among": {"n": among.len(), "p50": pct(&mut among, 0.5), "p99": pct(&mut among, 0.99), "max": pct(&mut among, 1.0)},
    });
    println!("{v}");
    Ok(())
}
