//! Daemons (`berth server`, `berth agent`) and the local cluster (`berth up`, `berth down`).

use crate::netns::NetLayout;
use anyhow::{anyhow, bail, Context, Result};
use berth_agent::hwtopo::{parse_spec, TopologySource};
use berth_cli::client::{request, socket_path};
use berth_controller::ControllerConfig;
use berth_protocol::client::{ClientRequest, ClientResponse};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Config file (TOML); default DIR/berth.toml when it exists.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Address agents connect to.
    #[arg(long)]
    listen: Option<String>,
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The cluster key (default DIR/cluster.key; `berth keygen FILE` makes one).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// This node's name.
    #[arg(long)]
    name: String,
    /// The controller's agent address.
    #[arg(long, default_value = "127.0.0.1:7117")]
    controller: String,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Port to listen on (shorthand for --listen 127.0.0.1:PORT).
    #[arg(long)]
    port: Option<u16>,
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Emulate a node: hwloc synthetic string, e.g. "package:2 numa:2 core:4 pu:2".
    #[arg(long, conflicts_with = "topology_xml")]
    topology_synthetic: Option<String>,
    /// Emulate a node from an hwloc XML export.
    #[arg(long)]
    topology_xml: Option<PathBuf>,
    /// Add N emulated GPUs to each NUMA node of the emulated node (with --topology-synthetic
    /// or --topology-xml), local to it; for tests and demos of GPU nodes.
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpus_per_numa: u32,
    /// Where the GPUs' device files are: stand-ins for an emulated node's GPUs, GPU N's
    /// named as on a real node (`DIR/nvidiaN`, made e.g. with `mknod DIR/nvidia0 c 195 0`);
    /// jobs' devices cgroups deny the other GPUs' (default: /dev on the real machine, none
    /// on an emulated one).
    #[arg(long, value_name = "DIR")]
    gpu_device_dir: Option<PathBuf>,
    /// Memory of the NUMA nodes, over what hwloc and the OS say: one size for each ("64G"),
    /// sizes by NUMA node number ("0=64G,1=64G"), or both ("32G,3=16G").
    #[arg(long)]
    numa_memory: Option<String>,
    /// The agent's cgroup subtree (default berth/NAME).
    #[arg(long)]
    cgroup_root: Option<String>,
    /// Parent of per-job spool directories (default /tmp/berth/<cgroup root>).
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// Local socket of the task API for jobs' processes (default STATE_DIR/agent.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The cluster key, the same file as the controller's (mode 0600; `berth keygen FILE`).
    #[arg(long, default_value = DEFAULT_AGENT_KEY)]
    key_file: PathBuf,
    /// The agent's nice value: negative, its short work on a launch's path preempts busy
    /// ranks; jobs run at the nice the agent was started with. 0 leaves it.
    #[arg(long, default_value_t = -5, allow_negative_numbers = true)]
    nice: i32,
}

/// Where an agent looks for the cluster key when not told.
const DEFAULT_AGENT_KEY: &str = "/etc/berth/cluster.key";

/// The cluster key file of a cluster directory.
pub fn key_path(dir: &Path) -> PathBuf {
    dir.join("cluster.key")
}

pub async fn server(dir: &Path, args: ServerArgs) -> Result<i32> {
    let file = args.config.clone().or_else(|| Some(dir.join("berth.toml")).filter(|p| p.exists()));
    let defaults = vec![
        ("state_dir".to_string(), dir.join("controller").display().to_string()),
        ("socket".to_string(), socket_path(dir).display().to_string()),
        ("key_file".to_string(), key_path(dir).display().to_string()),
    ];
    let mut flags = vec![];
    if let Some(s) = args.state_dir {
        flags.push(("state_dir".to_string(), s.display().to_string()));
    }
    if let Some(l) = args.listen {
        flags.push(("listen".to_string(), l));
    }
    if let Some(s) = args.socket {
        flags.push(("socket".to_string(), s.display().to_string()));
    }
    if let Some(k) = args.key_file {
        flags.push(("key_file".to_string(), k.display().to_string()));
    }
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = ControllerConfig::load(file.as_deref(), &defaults, &env, &flags)?;
    berth_controller::serve(cfg).await?;
    Ok(0)
}

pub async fn agent(args: AgentArgs) -> Result<i32> {
    let topology = match (args.topology_synthetic, args.topology_xml) {
        (Some(s), _) => TopologySource::Synthetic(s),
        (None, Some(x)) => TopologySource::Xml(x),
        (None, None) => TopologySource::Real,
    }
    .with_emulated_gpus(args.gpus_per_numa);
    let numa_memory = match &args.numa_memory {
        Some(spec) => berth_agent::hwtopo::NumaMemory::parse(spec)?,
        None => Default::default(),
    };
    let cgroup_root = args.cgroup_root.unwrap_or_else(|| format!("berth/{}", args.name));
    let spool_dir = args.spool_dir.unwrap_or_else(|| PathBuf::from(SPOOL_PARENT).join(cgroup_root.replace('/', "_")));
    let listen = match args.port {
        Some(p) => format!("127.0.0.1:{p}"),
        None => args.listen,
    };
    let state_dir = args.state_dir.unwrap_or_else(|| PathBuf::from(format!("/var/lib/berth/{}", args.name)));
    // No key, no agent: it could neither prove itself nor check what it is asked to start.
    let key = std::sync::Arc::new(berth_protocol::auth::ClusterKey::load(&args.key_file)?);
    let cfg = berth_agent::AgentConfig {
        key,
        socket: args.socket.unwrap_or_else(|| state_dir.join("agent.sock")),
        state_dir,
        name: args.name,
        controller: args.controller,
        listen,
        topology,
        numa_memory,
        cgroup_root,
        spool_dir,
        nice: args.nice,
        gpu_device_dir: args.gpu_device_dir,
    };
    berth_agent::run(cfg).await?;
    Ok(0)
}

/// What `berth up` recorded about a local cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterFile {
    id: String,
    controller: String,
    agents: usize,
    topology: String,
    /// Each agent in its own network namespace (`berth up --netns`).
    #[serde(default)]
    netns: bool,
    /// Emulated GPUs per NUMA node of each agent (`berth up --gpus-per-numa`).
    #[serde(default, skip_serializing_if = "is_zero")]
    gpus_per_numa: u32,
    /// The agents' `--gpu-device-dir` (`berth up --gpu-device-dir`): their GPUs' stand-in
    /// device files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu_device_dir: Option<PathBuf>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The agent's flags for a topology source.
fn source_args(source: &TopologySource) -> Vec<String> {
    match source {
        TopologySource::Real => vec![],
        TopologySource::Synthetic(s) => vec!["--topology-synthetic".into(), s.clone()],
        TopologySource::Xml(p) => vec!["--topology-xml".into(), p.display().to_string()],
        TopologySource::WithGpus { base, per_numa } => {
            let mut args = source_args(base);
            args.extend(["--gpus-per-numa".into(), per_numa.to_string()]);
            args
        }
    }
}

/// Where local agents keep per-job directories; root-owned, 0711.
const SPOOL_PARENT: &str = "/tmp/berth";

const DEFAULT_TOPOLOGY: &str = "package:2 numa:2 core:2 pu:2";

fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

fn read_cluster(dir: &Path) -> Result<Option<ClusterFile>> {
    match std::fs::read_to_string(cluster_file(dir)) {
        Ok(t) => Ok(Some(serde_json::from_str(&t).with_context(|| {
            format!("{} is corrupt; remove the directory to start over", cluster_file(dir).display())
        })?)),
        Err(_) => Ok(None),
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr()?.port())
}

fn pid_file(dir: &Path, who: &str) -> PathBuf {
    dir.join("run").join(format!("{who}.pid"))
}

/// The pid in `who`'s pid file, if that process is alive and is a berth process.
fn live_pid(dir: &Path, who: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file(dir, who)).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmd = String::from_utf8_lossy(&cmdline);
    (cmd.contains("berth") && cmd.contains(if who == "server" { "server" } else { "agent" })).then_some(pid)
}

/// Start a berth daemon in the background, detached, logging to DIR/logs/WHO.log.
fn spawn_daemon(dir: &Path, who: &str, args: &[String], netns: Option<&str>) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the berth executable")?;
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::create_dir_all(dir.join("run"))?;
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("logs").join(format!("{who}.log")))?;
    // Enter the network namespace with setns(2) only: `ip netns exec` would also remount
    // /sys, hiding the cgroup mounts the agent needs.
    let ns_file = match netns {
        Some(ns) => Some(
            std::fs::File::open(Path::new("/var/run/netns").join(ns))
                .with_context(|| format!("cannot open network namespace {ns}"))?,
        ),
        None => None,
    };
    let ns_fd = ns_file.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let mut cmd = std::process::Command::new(exe);
    if let Some(fd) = ns_fd {
        // SAFETY: setns is async-signal-safe; fd stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.args(args).stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("cannot start {who}"))?;
    drop(ns_file);
    let pid = child.id() as i32;
    std::fs::write(pid_file(dir, who), pid.to_string())?;
    Ok(pid)
}

/// How a child of ours ended, if it has (reaped here).
fn exit_status(pid: i32) -> Option<String> {
    let mut st = 0;
    // SAFETY: waitpid on our own child, WNOHANG: returns at once; writes only `st`.
    if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } != pid {
        return None;
    }
    Some(if libc::WIFEXITED(st) {
        format!("status {}", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!("killed by signal {}", libc::WTERMSIG(st))
    } else {
        format!("wait status {st}")
    })
}

/// Why the controller is not up: `what`, then the end of its log; an empty log (it could not
/// write it: a full disk, typically) says so with the space left where it keeps its state.
fn why_not_up(dir: &Path, what: &str) -> String {
    let tail = log_tail(dir, "server");
    if !tail.trim().is_empty() {
        return format!("{what}; its log ends with:\n{tail}");
    }
    let state = [dir.join("controller"), dir.to_path_buf()].into_iter().find(|p| p.exists()).unwrap_or_default();
    let free = berth_controller::store::free_bytes(&state.join("state.db"));
    format!(
        "{what}, and its log {} is empty: it could not write it or died first. {} bytes are free on the \
         filesystem of {} (a full disk? free space there); run `berth server --dir {}` in the foreground to see its error",
        dir.join("logs").join("server.log").display(),
        free,
        state.display(),
        dir.display()
    )
}

fn log_tail(dir: &Path, who: &str) -> String {
    let text = std::fs::read_to_string(dir.join("logs").join(format!("{who}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

pub async fn up(dir: &Path, json: bool, agents: Option<usize>, topology: Option<String>, netns: bool) -> Result<i32> {
    up_with_gpus(dir, json, agents, topology, netns, None, None).await
}

/// `berth up`, with `--gpus-per-numa N` when given (kept in the cluster file for later `up`s).
pub async fn up_with_gpus(
    dir: &Path,
    json: bool,
    agents: Option<usize>,
    topology: Option<String>,
    netns: bool,
    gpus_per_numa: Option<u32>,
    gpu_device_dir: Option<PathBuf>,
) -> Result<i32> {
    // The agents run elsewhere (their own working directory): the path must be absolute.
    let gpu_device_dir = match gpu_device_dir {
        Some(d) if !d.is_dir() => bail!("--gpu-device-dir {}: no such directory", d.display()),
        Some(d) => Some(std::fs::canonicalize(&d).with_context(|| format!("--gpu-device-dir {}", d.display()))?),
        None => None,
    };
    if gpus_per_numa.is_some_and(|n| n > berth_core::gpu::MAX_EMULATED_PER_NUMA) {
        bail!("--gpus-per-numa must be at most {}", berth_core::gpu::MAX_EMULATED_PER_NUMA);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let previous = read_cluster(dir)?;
    let cluster = match previous {
        Some(mut c) => {
            if let Some(n) = agents {
                c.agents = n;
            }
            if let Some(t) = topology {
                c.topology = t;
            }
            if let Some(n) = gpus_per_numa {
                c.gpus_per_numa = n;
            }
            if gpu_device_dir.is_some() {
                c.gpu_device_dir = gpu_device_dir;
            }
            c
        }
        None => {
            let id = format!("{:08x}", (std::process::id() as u64 ^ berth_now_nanos()) & 0xffff_ffff);
            let host = if netns { NetLayout::new(&id, 0).host_ip() } else { "127.0.0.1".into() };
            // A berth.toml written beforehand (an admin's settings) keeps its `listen`, if any;
            // the rest of it is read by the controller as usual.
            let configured = std::fs::read_to_string(dir.join("berth.toml"))
                .ok()
                .and_then(|t| t.parse::<toml::Table>().ok())
                .and_then(|t| t.get("listen").and_then(|v| v.as_str()).map(String::from));
            ClusterFile {
                controller: match configured {
                    Some(listen) => listen,
                    None => format!("{host}:{}", free_port()?),
                },
                id,
                agents: agents.unwrap_or(3),
                topology: topology.unwrap_or_else(|| DEFAULT_TOPOLOGY.into()),
                netns,
                gpus_per_numa: gpus_per_numa.unwrap_or(0),
                gpu_device_dir,
            }
        }
    };
    let layout = NetLayout::new(&cluster.id, cluster.agents);
    if cluster.netns {
        layout.setup().context("setting up the agents' network namespaces")?;
    }
    if cluster.agents == 0 || cluster.agents > 64 {
        bail!("--agents must be between 1 and 64");
    }
    // Check the topology before starting anything.
    if let TopologySource::Xml(p) = parse_spec(&cluster.topology) {
        if !p.exists() {
            bail!("topology file {} does not exist", p.display());
        }
    }
    if cluster.gpus_per_numa > 0 && parse_spec(&cluster.topology) == TopologySource::Real {
        bail!("--gpus-per-numa emulates GPUs on emulated nodes: give --topology too (a synthetic string or xml:FILE)");
    }
    std::fs::write(cluster_file(dir), serde_json::to_string_pretty(&cluster)?)?;
    // The key the controller and the agents prove themselves with (made once, kept).
    let key_file = key_path(dir);
    berth_protocol::auth::ClusterKey::load_or_generate(&key_file)?;
    let config = dir.join("berth.toml");
    let defaults = format!(
        "# berth controller configuration for the local cluster in this directory.\nlisten = \"{}\"\nheartbeat_interval_secs = 1.0\nheartbeat_misses = 3\nkill_grace_secs = 2.0\n# per CPU of a job without --mem, capped at the roomiest node's memory per PU\ndefault_mem_per_core = \"256M\"\n",
        cluster.controller
    );
    match std::fs::read_to_string(&config) {
        Err(_) => std::fs::write(&config, defaults)?,
        // Settings written beforehand without the cluster's own keys get them added in front
        // (TOML top-level keys must precede the first [table]).
        Ok(text) if !text.lines().any(|l| l.trim_start().starts_with("listen")) => {
            std::fs::write(&config, format!("{defaults}{text}"))?
        }
        Ok(_) => {}
    }
    let dir_s = dir.display().to_string();
    let mut started = vec![];
    if live_pid(dir, "server").is_none() || request(dir, ClientRequest::Ping).await.is_err() {
        let pid = spawn_daemon(dir, "server", &["server".into(), "--dir".into(), dir_s.clone()], None)?;
        started.push("server".to_string());
        let t0 = Instant::now();
        while request(dir, ClientRequest::Ping).await.is_err() {
            if let Some(status) = exit_status(pid) {
                bail!("{}", why_not_up(dir, &format!("the controller exited ({status})")));
            }
            if t0.elapsed() > Duration::from_secs(15) {
                bail!("{}", why_not_up(dir, "the controller did not come up within 15 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let source = parse_spec(&cluster.topology).with_emulated_gpus(cluster.gpus_per_numa);
    let names: Vec<String> = (1..=cluster.agents).map(|i| format!("node{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        if live_pid(dir, name).is_some() {
            continue;
        }
        let i = i + 1;
        let mut args = vec![
            "agent".into(),
            "--name".into(),
            name.clone(),
            "--controller".into(),
            cluster.controller.clone(),
            "--state-dir".into(),
            dir.join("agents").join(name).display().to_string(),
            "--cgroup-root".into(),
            format!("berth/{}/{name}", cluster.id),
            "--spool-dir".into(),
            format!("{SPOOL_PARENT}/{}-{name}", cluster.id),
            "--key-file".into(),
            key_file.display().to_string(),
        ];
        args.extend(source_args(&source));
        if let Some(d) = &cluster.gpu_device_dir {
            args.extend(["--gpu-device-dir".into(), d.display().to_string()]);
        }
        let ns = layout.namespace(i);
        if cluster.netns {
            args.extend(["--listen".into(), format!("{}:0", layout.agent_ip(i))]);
        }
        spawn_daemon(dir, name, &args, cluster.netns.then_some(ns.as_str()))?;
        started.push(name.clone());
    }
    // Return once the agents started here are registered and connected (all of them when the
    // controller was started too). An agent left running is not waited for: its node may be
    // down for reasons of its own (a cut link).
    let wait_for: Vec<&String> = if started.iter().any(|s| s == "server") || started.is_empty() {
        names.iter().collect()
    } else {
        names.iter().filter(|n| started.contains(n)).collect()
    };
    let t0 = Instant::now();
    loop {
        let ready = match request(dir, ClientRequest::ListNodes { topology: false }).await {
            Ok(ClientResponse::Nodes { nodes, .. }) => wait_for.iter().all(|n| {
                nodes.iter().any(|x| &x.name == *n && x.state != "down" && !x.state.contains("not connected"))
            }),
            _ => false,
        };
        if ready {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let dead: Vec<&String> = names.iter().filter(|n| live_pid(dir, n).is_none()).collect();
            let detail =
                dead.first().map(|n| format!("\n{n}'s log ends with:\n{}", log_tail(dir, n))).unwrap_or_default();
            bail!("agents did not all register within 30 s (not running: {dead:?}){detail}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"dir": dir_s, "controller": cluster.controller, "agents": names, "started": started, "topology": cluster.topology})
        );
    } else {
        println!(
            "berth cluster up in {dir_s}: controller + {} agents ({}); started: {}",
            names.len(),
            cluster.topology,
            if started.is_empty() { "nothing (all were running)".into() } else { started.join(", ") }
        );
        println!("use it with: export BERTH_DIR={dir_s}");
    }
    Ok(0)
}

fn berth_now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Stop `who` by its pid file: SIGTERM, wait, SIGKILL.
async fn stop(dir: &Path, who: &str) -> Option<i32> {
    let pid = live_pid(dir, who)?;
    // SAFETY: plain kill(2) on a pid we started and verified is a berth process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && live_pid(dir, who).is_some() {
        if t0.elapsed() > Duration::from_secs(15) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_file(pid_file(dir, who));
    Some(pid)
}

pub async fn down(dir: &Path, json: bool) -> Result<i32> {
    let cluster = read_cluster(dir)?
        .ok_or_else(|| anyhow!("no local cluster in {} (no cluster.json); nothing to stop", dir.display()))?;
    let mut stopped = vec![];
    let mut agent_names: Vec<String> = std::fs::read_dir(dir.join("run"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".pid")).map(String::from))
                .collect()
        })
        .unwrap_or_default();
    agent_names.retain(|n| n != "server");
    agent_names.sort();
    for name in &agent_names {
        if stop(dir, name).await.is_some() {
            stopped.push(name.clone());
        }
    }
    if stop(dir, "server").await.is_some() {
        stopped.push("server".into());
    }
    // Whatever the agents left: kill and remove the cluster's whole cgroup subtree.
    let root = format!("berth/{}", cluster.id);
    let cleanup =
        tokio::task::spawn_blocking(move || berth_agent::cgroup::detect(&root).and_then(|b| b.remove_root())).await;
    if let Ok(Err(e)) = cleanup {
        eprintln!("berth: removing the cluster's cgroups: {e}");
    }
    if cluster.netns {
        NetLayout::new(&cluster.id, cluster.agents).teardown();
    }
    // And the agents' spool directories (an agent killed with SIGKILL leaves its own behind).
    if let Ok(entries) = std::fs::read_dir(SPOOL_PARENT) {
        let prefix = format!("{}-", cluster.id);
        for e in entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    if json {
        println!("{}", serde_json::json!({"dir": dir.display().to_string(), "stopped": stopped}));
    } else {
        println!(
            "berth cluster in {} down; stopped: {}",
            dir.display(),
            if stopped.is_empty() { "nothing was running".into() } else { stopped.join(", ") }
        );
    }
    Ok(0)
}
