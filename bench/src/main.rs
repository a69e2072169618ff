//! berth-bench: measures berth on this machine with a real local cluster.
//!
//! `berth-bench submit-api N [CONNS]`  durable submissions through the API (one job per request)
//! `berth-bench submit-api-queued N [CONNS]`  the same, jobs eligible but waiting (not held)
//! `berth-bench submit-batch N [SIZE]` durable submissions in batches of SIZE per request
//! `berth-bench submit-cli N [PAR]`    durable submissions through `berth submit`, PAR at a time
//! `berth-bench submit-cli-multi N [K]` through `berth submit` with K scripts per invocation
//! `berth-bench e2e N [AGENTS]`        N `/bin/true` jobs on AGENTS agents: first submit to all done
//! `berth-bench placement [--nodes N] [--fill F] [--repeats R] [--seed S] [--gpus] [--json]`
//!                                     decision time of `place` on emulated nodes (see placement.rs)
//! `berth-bench backfill [--nodes N] [--jobs J] [--policy easy|conservative] [--json]`  one scheduling pass (see backfill.rs)
//! `berth-bench sim [--trace FILE] [--jobs N] [--policy P|all] [--json]`  simulator speed (see sim.rs)
//! `berth-bench easy-oracle [--random N]`  berth's EASY against textbook EASY (see oracle.rs)
//! `berth-bench fuzz [--minutes M] [--targets a,b] [--seed N] [--json]`  bounded fuzzing run (see fuzz.rs)
//! `berth-bench seal [N] [--json]`         seal+open of a sealed launch order, no network (see seal.rs)
//! `berth-bench hostile [--hostile N] [--idle M] [--seconds S]`  hostile local peers: daemons' RSS, `berth jobs` latency (see hostile.rs)
//!
//! Each but `placement` prints one JSON line. It starts its own cluster (`berth up`) in a temp dir
//! with the `berth` binary next to this one (build with `cargo build --release`), and takes it down.

use anyhow::{bail, Context, Result};
use berth_protocol::client::{ClientRequest, ClientResponse, SubmitRequest};
use berth_protocol::{read_frame, write_frame};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;

mod backfill;
mod fuzz;
mod hostile;
mod oracle;
mod placement;
mod seal;
mod sim;

fn berth_bin() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("berth");
    if !bin.exists() {
        bail!("{} not found; run `cargo build --release` first", bin.display());
    }
    Ok(bin)
}

struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
}

impl Cluster {
    fn up(agents: usize, topology: &str) -> Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("berth-bench-{}", std::process::id()));
        let bin = berth_bin()?;
        // Controller settings to try (e.g. BERTH_BENCH_CONFIG=$'[scheduler]\npass_pace = 0'),
        // kept by `berth up` after its own.
        if let Ok(extra) = std::env::var("BERTH_BENCH_CONFIG") {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("berth.toml"), extra)?;
        }
        let out = Command::new(&bin)
            .arg("--dir")
            .arg(&dir)
            .args(["up", "--agents", &agents.to_string(), "--topology", topology])
            .output()?;
        if !out.status.success() {
            bail!("berth up: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Cluster { dir, bin })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin).arg("--dir").arg(&self.dir).arg("down").output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn submission(script: &str, hold: bool, cwd: &Path) -> SubmitRequest {
    SubmitRequest {
        script: script.into(),
        script_name: "bench.sh".into(),
        options: Default::default(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: cwd.display().to_string(),
        hold,
        ignore_unsupported: false,
    }
}

async fn call(s: &mut UnixStream, req: &ClientRequest) -> Result<ClientResponse> {
    write_frame(s, req).await?;
    match read_frame::<_, ClientResponse>(s).await? {
        Some(ClientResponse::Error(e)) => bail!("{e}"),
        Some(r) => Ok(r),
        None => bail!("controller closed the connection"),
    }
}

/// N single-job submissions over CONNS concurrent connections; returns elapsed.
async fn submit_api(sock: &Path, n: usize, conns: usize, script: &str, hold: bool, cwd: &Path) -> Result<Duration> {
    let t0 = Instant::now();
    let mut tasks = vec![];
    for c in 0..conns {
        let count = n / conns + usize::from(c < n % conns);
        let (sock, script, cwd) = (sock.to_path_buf(), script.to_string(), cwd.to_path_buf());
        tasks.push(tokio::spawn(async move {
            let mut s = UnixStream::connect(&sock).await?;
            for _ in 0..count {
                let r = call(&mut s, &ClientRequest::Submit(Box::new(submission(&script, hold, &cwd)))).await?;
                if !matches!(r, ClientResponse::Submitted { .. }) {
                    bail!("unexpected {r:?}");
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(t0.elapsed())
}

fn report(kind: &str, n: usize, param: usize, elapsed: Duration, extra: serde_json::Value) {
    let secs = elapsed.as_secs_f64();
    let mut v =
        serde_json::json!({"bench": kind, "n": n, "param": param, "seconds": secs, "jobs_per_second": n as f64 / secs});
    if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
        obj.extend(more.clone());
    }
    println!("{v}");
}

/// Errors (a usage mistake, a failed run) are printed as one message, never as a backtrace.
fn main() {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth-bench: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("berth-bench: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map(String::as_str).unwrap_or("");
    if kind == "backfill" {
        return backfill::run(&args[2..]);
    }
    if kind == "placement" {
        return placement::run(&args[2..]);
    }
    if kind == "sim" {
        return sim::run(&args[2..]);
    }
    if kind == "easy-oracle" {
        return oracle::run(&args[2..]);
    }
    if kind == "fuzz" {
        return fuzz::run(&args[2..]);
    }
    if kind == "seal" {
        return seal::run(&args[2..]).await;
    }
    if kind == "hostile" {
        return hostile::run(&args[2..]).await;
    }
    let n: usize = args.get(2).map(|s| s.parse()).transpose().context("N")?.unwrap_or(10_000);
    let param: Option<usize> = args.get(3).map(|s| s.parse()).transpose().context("param")?;
    let hold_script = "#!/bin/sh\ntrue\n";
    match kind {
        "submit-api" => {
            let c = Cluster::up(1, "package:1 core:2 pu:1")?;
            let conns = param.unwrap_or(8);
            let elapsed = submit_api(&c.dir.join("controller.sock"), n, conns, hold_script, true, &c.dir).await?;
            report(
                kind,
                n,
                conns,
                elapsed,
                serde_json::json!({"durable": "sqlite WAL synchronous=FULL, committed before reply"}),
            );
        }
        "submit-api-queued" => {
            // The same, but the jobs wait eligible behind one that holds the whole machine: each
            // pass plans them (a queue as a busy cluster has it, not a held one).
            let c = Cluster::up(1, "package:1 core:2 pu:1")?;
            let conns = param.unwrap_or(8);
            let sock = c.dir.join("controller.sock");
            let mut s = UnixStream::connect(&sock).await?;
            let mut blocker = submission("#!/bin/sh\nsleep 3600\n", false, &c.dir);
            blocker.options.cores = Some(2);
            blocker.options.walltime = Some(3600);
            call(&mut s, &ClientRequest::Submit(Box::new(blocker))).await?;
            let elapsed = submit_api(&sock, n, conns, hold_script, false, &c.dir).await?;
            report(kind, n, conns, elapsed, serde_json::json!({"queue": "eligible, behind a job holding every core"}));
        }
        "submit-batch" => {
            let c = Cluster::up(1, "package:1 core:2 pu:1")?;
            let size = param.unwrap_or(100);
            let mut s = UnixStream::connect(c.dir.join("controller.sock")).await?;
            let t0 = Instant::now();
            let mut left = n;
            while left > 0 {
                let k = left.min(size);
                let jobs = (0..k).map(|_| submission(hold_script, true, &c.dir)).collect();
                call(&mut s, &ClientRequest::SubmitBatch { jobs }).await?;
                left -= k;
            }
            report(kind, n, size, t0.elapsed(), serde_json::json!({}));
        }
        "submit-cli" => {
            let c = Cluster::up(1, "package:1 core:2 pu:1")?;
            let par = param.unwrap_or(1);
            let script = c.dir.join("bench.sh");
            std::fs::write(&script, hold_script)?;
            let t0 = Instant::now();
            let mut tasks = vec![];
            for p in 0..par {
                let count = n / par + usize::from(p < n % par);
                let (bin, dir, script) = (c.bin.clone(), c.dir.clone(), script.clone());
                tasks.push(std::thread::spawn(move || -> Result<()> {
                    for _ in 0..count {
                        let st = Command::new(&bin)
                            .arg("--dir")
                            .arg(&dir)
                            .args(["submit", "--hold"])
                            .arg(&script)
                            .stdout(std::process::Stdio::null())
                            .status()?;
                        if !st.success() {
                            bail!("berth submit failed");
                        }
                    }
                    Ok(())
                }));
            }
            for t in tasks {
                t.join().map_err(|_| anyhow::anyhow!("thread panicked"))??;
            }
            report(kind, n, par, t0.elapsed(), serde_json::json!({}));
        }
        "submit-cli-multi" => {
            // `berth submit a.sh b.sh ...`: K scripts per invocation, one transaction each.
            let c = Cluster::up(1, "package:1 core:2 pu:1")?;
            let k = param.unwrap_or(100).max(1);
            let scripts: Vec<PathBuf> = (0..k)
                .map(|i| {
                    let p = c.dir.join(format!("bench{i}.sh"));
                    std::fs::write(&p, hold_script).map(|_| p)
                })
                .collect::<std::io::Result<_>>()?;
            let t0 = Instant::now();
            let mut left = n;
            while left > 0 {
                let take = left.min(k);
                let st = Command::new(&c.bin)
                    .arg("--dir")
                    .arg(&c.dir)
                    .args(["submit", "--hold"])
                    .args(&scripts[..take])
                    .stdout(std::process::Stdio::null())
                    .status()?;
                if !st.success() {
                    bail!("berth submit failed");
                }
                left -= take;
            }
            report(kind, n, k, t0.elapsed(), serde_json::json!({}));
        }
        "e2e" => {
            let agents = param.unwrap_or(4);
            // Default: agents emulating 2x4-core nodes (8 job slots each), mapped onto the 2 real
            // CPUs; BERTH_BENCH_TOPOLOGY changes it (e.g. "package:1 core:2 pu:1" for 2 slots).
            let topo = std::env::var("BERTH_BENCH_TOPOLOGY").unwrap_or_else(|_| "package:2 core:4 pu:1".into());
            let c = Cluster::up(agents, &topo)?;
            let sock = c.dir.join("controller.sock");
            let script = "#!/bin/sh\n/bin/true\n";
            let t0 = Instant::now();
            submit_api(&sock, n, 4, script, false, &c.dir).await?;
            let submitted = t0.elapsed();
            let mut s = UnixStream::connect(&sock).await?;
            loop {
                let r = call(&mut s, &ClientRequest::ListJobs { states: vec![], all: false }).await?;
                let ClientResponse::Jobs { jobs } = r else { bail!("unexpected answer") };
                if jobs.is_empty() {
                    break;
                }
                if t0.elapsed() > Duration::from_secs(1800) {
                    bail!("not done after 30 minutes");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let elapsed = t0.elapsed();
            let r = call(
                &mut s,
                &ClientRequest::Acct {
                    limit: Some(n as u32),
                    steps: false,
                    since: None,
                    until: None,
                    users: vec![],
                    active: false,
                    with_steps: false,
                },
            )
            .await?;
            let ClientResponse::Acct { jobs } = r else { bail!("unexpected answer") };
            let completed = jobs.iter().filter(|j| j.state.as_str() == "completed").count();
            if completed != n {
                bail!("only {completed} of {n} jobs completed");
            }
            report(
                kind,
                n,
                agents,
                elapsed,
                serde_json::json!({"submit_seconds": submitted.as_secs_f64(), "completed": completed}),
            );
        }
        _ => bail!("usage: berth-bench submit-api|submit-api-queued|submit-batch|submit-cli|submit-cli-multi|e2e N [PARAM] | placement"),
    }
    Ok(())
}
