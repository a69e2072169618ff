//! `berth run`: start a parallel application through the agents' control tree.
//!
//! The controller grants a step (inside the caller's job, or in a fresh interactive
//! allocation); `run` hands it to the first node's agent, whose shepherd spreads it down the
//! tree. `run` then relays stdin to rank 0, signals to every rank, prints what the ranks
//! write, and decides: an abnormal rank end kills the application (unless --no-kill), the
//! worst exit status is returned, and the step's end is recorded in the invocation log.

use crate::client::Client;
use anyhow::{anyhow, bail, Context, Result};
use berth_core::step::{RankBinding, StepRequest};
use berth_core::JobId;
use berth_protocol::agent::AgentQuery;
use berth_protocol::auth::{write_sealed, LinkKey, TreeEnd};
use berth_protocol::client::{ClientRequest, ClientResponse};
use berth_protocol::step::{
    parse_signal, signal_name, Chunk, Found, InteractiveAsk, ProcName, RankExit, ServiceReply, SpawnReply, StepCreate,
    StepGrant, StepOutcome, TreeDown, TreeUp, RANK_WILDCARD,
};
use berth_protocol::write_frame;
use clap::Args;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

#[derive(Args, Debug, Default, PartialEq)]
pub struct RunArgs {
    /// Number of ranks (also -np); default: one per free core of the allocation.
    #[arg(short = 'n', long = "ntasks")]
    pub(crate) ntasks: Option<u32>,
    /// Nodes to use, as srun's -N: in a job, that many of its nodes; outside one, the
    /// interactive allocation's nodes. Ranks are spread evenly over them.
    #[arg(short = 'N', long = "nodes")]
    pub(crate) nodes: Option<u32>,
    /// Ranks per node (srun --ntasks-per-node).
    #[arg(long = "ntasks-per-node", visible_alias = "tasks-per-node")]
    pub(crate) tasks_per_node: Option<u32>,
    /// Cores per rank (aprun -d).
    #[arg(short = 'd', long = "cpus-per-task")]
    pub(crate) cpus_per_task: Option<u32>,
    /// How ranks are bound: linear (consecutive cores), striding (alternate sockets), none.
    #[arg(long, default_value = "linear")]
    pub(crate) binding: String,
    /// Put each rank in its own sub-cpuset (CPUs and local memory) inside the job's.
    #[arg(long = "rank-cpusets")]
    pub(crate) rank_cpusets: bool,
    /// GPUs per rank, each rank's own and nearest its cores (outside a job, the interactive
    /// allocation gets ranks x N GPUs); default: the job's --gpus-per-task.
    #[arg(long = "gpus-per-task")]
    pub(crate) gpus_per_task: Option<u32>,
    /// How ranks get GPUs: closest (default with --gpus-per-task), none (every rank all the
    /// job's GPUs on its node), map:I,J,... (local rank i the node's GPU in place i).
    #[arg(long = "gpu-bind")]
    pub(crate) gpu_bind: Option<String>,
    /// Outside a job: GPUs of the interactive allocation, spread evenly over its nodes.
    #[arg(long = "gpus", value_name = "N")]
    pub(crate) gpus: Option<String>,
    /// Outside a job: GPUs on each node of the interactive allocation.
    #[arg(long = "gpus-per-node", value_name = "N")]
    pub(crate) gpus_per_node: Option<String>,
    /// Outside a job: only GPUs of this type.
    #[arg(long = "gpu-type", value_name = "TYPE")]
    pub(crate) gpu_type: Option<String>,
    /// Outside a job: GPUs on each of --sockets-per-node sockets of a node.
    #[arg(long = "gpus-per-socket", value_name = "N")]
    pub(crate) gpus_per_socket: Option<String>,
    /// Outside a job, with --gpus-per-socket: the sockets of each node used.
    #[arg(long = "sockets-per-node", value_name = "S")]
    pub(crate) sockets_per_node: Option<String>,
    /// Outside a job: generic resources on each node (NAME[:TYPE][:COUNT],...; gpu items are
    /// GPUs per node).
    #[arg(long = "gres", value_name = "LIST")]
    pub(crate) gres: Option<String>,
    /// Outside a job: cluster-wide licenses held while the allocation lives (NAME[:COUNT],...).
    #[arg(short = 'L', long = "licenses", value_name = "LIST")]
    pub(crate) licenses: Option<String>,
    /// Prefix each output line with its rank ("3: ...").
    #[arg(long, short = 'l')]
    pub(crate) label: bool,
    /// Keep the other ranks running when one fails; they are told (BERTH_FAILED_RANKS).
    #[arg(long = "no-kill")]
    pub(crate) no_kill: bool,
    /// With --no-kill: also send this signal to the survivors when a rank fails.
    #[arg(long = "notify-signal")]
    pub(crate) notify_signal: Option<String>,
    /// Control tree fanout: 2..32, or "flat".
    #[arg(long, default_value = "8")]
    pub(crate) fanout: String,
    /// Allow more ranks than free cores: extra ranks share the allocation's CPUs.
    #[arg(long)]
    pub(crate) overcommit: bool,
    /// The job whose allocation to use (default $BERTH_JOB_ID; none: interactive).
    #[arg(long)]
    pub(crate) job: Option<String>,
    /// Interactive only: time limit (SECONDS, HH:MM:SS, 10m, ...).
    #[arg(long)]
    pub(crate) walltime: Option<String>,
    /// What the ranks are offered: auto (PMI-1/PMI-2 and PMIx: MPICH and Open MPI), pmix,
    /// pmi2, pmi1, none. Default: the job's `--mpi`, else auto.
    #[arg(long)]
    pub(crate) mpi: Option<String>,
    /// Print launch timings to stderr.
    #[arg(long, hide = true)]
    pub(crate) timing: bool,
    /// Variables set for the ranks, over this environment (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub(crate) env: Vec<String>,
    /// The ranks' working directory (default: the current one).
    #[arg(long = "chdir", value_name = "DIR")]
    pub(crate) chdir: Option<String>,
    /// Several programs, one per rank range, from FILE (srun's --multi-prog format: lines
    /// `RANKS PROGRAM ARGS...`, RANKS as 0,2-3 or *, %t the rank, %o its offset in the line's
    /// ranks); -n defaults to the ranks it names.
    #[arg(long = "multi-prog", value_name = "FILE")]
    pub(crate) multi_prog: Option<String>,
    /// The program and its arguments; a lone `:` starts another program of the same step
    /// (MPMD: `-n 2 ./a.out : -n 4 ./b.out`, each part with its own -n, -N,
    /// --ntasks-per-node, -d, --binding, --env and --chdir before its program).
    #[arg(required_unless_present = "multi_prog", trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) command: Vec<String>,
    /// The nodes the step must be on (srun's `--nodelist`, mapped onto `-N`): a grant on
    /// others is given back unlaunched, with an error.
    #[arg(skip)]
    pub(crate) nodelist: Vec<String>,
}

/// Flags of `run` that take a value (for rewriting mpirun's `-np`).
const VALUE_FLAGS: &[&str] = &[
    "-n",
    "--ntasks",
    "-N",
    "--nodes",
    "--ntasks-per-node",
    "--tasks-per-node",
    "-d",
    "--cpus-per-task",
    "--binding",
    "--notify-signal",
    "--fanout",
    "--job",
    "--walltime",
    "--dir",
    "--env",
    "--chdir",
    "--multi-prog",
    "--mpi",
    "--gpus-per-task",
    "--gpu-bind",
    "--gpus",
    "--gpus-per-node",
    "--gpu-type",
    "--gpus-per-socket",
    "--sockets-per-node",
    "--gres",
    "-L",
    "--licenses",
];

/// Where the subcommand is: the first word that is neither a flag nor --dir's value.
fn subcommand_at(args: &[String]) -> Option<usize> {
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--dir" => i += 2,
            a if a.starts_with('-') => i += 1,
            _ => return Some(i),
        }
    }
    None
}

/// `berth [--dir D] [--json] run ...` alone, without building clap's tree of every command
/// (~0.2 ms that every launch would pay): the same flags, `berth run --help` the same help.
#[derive(clap::Parser, Debug, PartialEq)]
#[command(
    name = "berth run",
    version,
    about = "Run a parallel program: inside a job on its allocation, outside one interactively"
)]
pub struct RunCli {
    /// Cluster directory (holds the controller socket); default $BERTH_DIR or ./.berth.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub args: RunArgs,
}

/// The command line of a `berth run` (after `rewrite_np`) without its `run` word, for
/// [`RunCli`] (`crate::run_line::parse_line`); None for every other command.
pub fn run_command_line(args: &[String]) -> Option<Vec<String>> {
    let at = subcommand_at(args).filter(|&i| args[i] == "run")?;
    let mut out = args.to_vec();
    out.remove(at);
    Some(out)
}

/// Accept mpirun's `-np N` for `run`: rewritten to `-n N` before the program name.
pub fn rewrite_np(args: Vec<String>) -> Vec<String> {
    let Some(at) = subcommand_at(&args).filter(|&i| args[i] == "run") else { return args };
    let mut out: Vec<String> = args[..=at].to_vec();
    let mut i = at + 1;
    while i < args.len() {
        let a = &args[i];
        if a == "-np" {
            out.push("-n".into());
        } else {
            out.push(a.clone());
        }
        if !a.starts_with('-') {
            out.extend_from_slice(&args[i + 1..]);
            return out;
        }
        if (a == "-np" || VALUE_FLAGS.contains(&a.as_str())) && i + 1 < args.len() {
            out.push(args[i + 1].clone());
            i += 1;
        }
        i += 1;
    }
    out
}

fn parse_fanout(s: &str) -> Result<u32> {
    if s == "flat" {
        return Ok(0);
    }
    match s.parse::<u32>() {
        Ok(f) if (2..=32).contains(&f) => Ok(f),
        _ => bail!("--fanout {s}: expected a number from 2 to 32, or \"flat\""),
    }
}

/// What an interactive allocation asks for (`berth run` outside a job): its nodes, walltime,
/// GPUs, generic resources and licenses, read as a batch job's options of the same names
/// (`#BERTH --gres ...`). Inside a job a step runs on what its job holds: those options are
/// refused there, naming them.
pub(crate) fn interactive_ask(args: &RunArgs, in_job: bool, walltime_seconds: Option<u64>) -> Result<InteractiveAsk> {
    let given = [
        ("gpus", &args.gpus),
        ("gpus-per-node", &args.gpus_per_node),
        ("gpu-type", &args.gpu_type),
        ("gpus-per-socket", &args.gpus_per_socket),
        ("sockets-per-node", &args.sockets_per_node),
        ("gres", &args.gres),
        ("licenses", &args.licenses),
    ];
    let mut options = berth_core::directives::SubmitOptions::default();
    for (name, value) in given {
        let Some(v) = value else { continue };
        if in_job {
            bail!(
                "--{name}: a step runs on its job's GPUs, generic resources and licenses; ask for them when submitting the job (outside a job, `berth run --{name}` makes an allocation with them)"
            );
        }
        options.set(name, v).map_err(|e| anyhow!("--{name} {}: {e}", v.escape_debug()))?;
    }
    Ok(InteractiveAsk {
        nodes: args.nodes,
        walltime_seconds,
        gpus: options.gpus,
        gpus_per_node: options.gpus_per_node,
        gpu_type: options.gpu_type,
        gpus_per_socket: options.gpus_per_socket,
        sockets_per_node: options.sockets_per_node,
        gres: options.gres.unwrap_or_default(),
        licenses: options.licenses.unwrap_or_default(),
    })
}

pub async fn run(dir: &Path, json: bool, args: RunArgs) -> Result<i32> {
    berth_protocol::probe::mark("client run");
    let t0 = Instant::now();
    let binding = RankBinding::parse(&args.binding)
        .ok_or_else(|| anyhow!("--binding {}: expected linear, striding or none", args.binding))?;
    let fanout = parse_fanout(&args.fanout)?;
    let notify_signal = match &args.notify_signal {
        Some(s) => Some(parse_signal(s).ok_or_else(|| anyhow!("--notify-signal {s}: unknown signal"))?),
        None => None,
    };
    let job_text = args.job.clone().or_else(|| std::env::var("BERTH_JOB_ID").ok().filter(|s| !s.is_empty()));
    let job = match job_text {
        Some(t) => Some(JobId(t.trim().parse().map_err(|_| anyhow!("bad job id {t:?}"))?)),
        None => None,
    };
    let walltime_seconds = match &args.walltime {
        Some(w) => Some(berth_core::units::parse_duration_secs(w)?),
        None => None,
    };
    let mpi = match &args.mpi {
        Some(m) => Some(
            berth_core::step::MpiKind::parse(m)
                .ok_or_else(|| anyhow!("--mpi takes {}, not {m:?}", berth_core::step::MPI_KINDS))?,
        ),
        None => None,
    };
    let here = std::env::current_dir().context("reading the current directory")?.display().to_string();
    let cwd = match &args.chdir {
        Some(d) if d.starts_with('/') => d.clone(),
        Some(d) => format!("{}/{d}", here.trim_end_matches('/')),
        None => here,
    };
    let mut env = gpu_binding_env(std::env::vars().collect(), args.gpus_per_task, args.gpu_bind.as_deref())?;
    for e in &args.env {
        let (k, v) = crate::mpmd::env_pair(e).map_err(anyhow::Error::msg)?;
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    }
    let mut request = StepRequest {
        ntasks: args.ntasks,
        nodes: args.nodes,
        tasks_per_node: args.tasks_per_node,
        cpus_per_task: args.cpus_per_task,
        overcommit: args.overcommit,
        binding,
        gpus_per_task: args.gpus_per_task,
    };
    // MPMD: a multi-prog file's lines, or the parts of a colon line (docs/launcher.md).
    let (argv, apps) = match &args.multi_prog {
        Some(file) => {
            if !args.command.is_empty() {
                bail!("--multi-prog {file} takes every program from the file; give no program after it");
            }
            let apps = crate::mpmd::multi_prog_apps(file)?;
            request.ntasks = request.ntasks.or(berth_core::step::mpmd::multi_prog_size(&apps));
            (vec!["--multi-prog".to_string(), file.clone()], apps)
        }
        None => {
            let apps = crate::mpmd::colon_apps(&args.command, &request, &cwd)?.unwrap_or_default();
            (args.command.clone(), apps)
        }
    };
    let interactive = interactive_ask(&args, job.is_some(), walltime_seconds)?;
    let create = StepCreate {
        job,
        request,
        interactive,
        argv,
        env,
        cwd,
        host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
        pid: std::process::id(),
        fanout,
        no_kill: args.no_kill,
        rank_cpusets: args.rank_cpusets,
        notify_signal,
        mpi,
        apps,
        spawned_by: None,
    };
    berth_protocol::probe::mark("client request built");
    // One connection for the whole run: an interactive allocation lives as long as it.
    let mut client = Client::connect(dir).await?;
    berth_protocol::probe::mark("client connected");
    let (grant, link) = request_step(&mut client, &create).await?;
    berth_protocol::probe::mark("client granted");
    let granted_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if let Some(msg) = nodelist_mismatch(&args.nodelist, &grant) {
        let outcome = StepOutcome { exit_code: 1, failed_at: Some(msg.clone()), ..Default::default() };
        let _ = client.call(&ClientRequest::StepEnd { job: grant.job, step: grant.step, outcome }).await;
        bail!(msg);
    }
    let mut tree = Tree::new(&args, &grant);
    tree.spawner = Some(Spawner::new(dir, &args, tree.services.clone()));
    let outcome = tree.drive(&grant, &link, t0, args.timing).await;
    if let Some(spawner) = tree.spawner.take() {
        spawner.finish(outcome.exit_code != 0).await;
    }
    let code = outcome.exit_code;
    if args.timing {
        eprintln!(
            "berth run: timing granted_ms={granted_ms:.2} running_ms={:.2} total_ms={:.2}",
            tree.running_ms.unwrap_or(f64::NAN),
            t0.elapsed().as_secs_f64() * 1000.0
        );
    }
    if json {
        let v = serde_json::json!({
            "job": grant.job, "step": grant.step, "size": grant.size, "exit_code": code,
            "failures": outcome.failures, "failed_at": outcome.failed_at,
        });
        eprintln!("{v}");
    }
    let end = ClientRequest::StepEnd { job: grant.job, step: grant.step, outcome };
    let mut answer = client.call(&end).await;
    if answer.is_err() {
        // The controller restarted while the step ran (the connection broke): its record of
        // the step survived and still holds the step's cores, so the end is sent again once
        // it is back (the connection waits for it), or the job's later steps would be refused.
        answer = match Client::connect(dir).await {
            Ok(mut again) => again.call(&end).await,
            Err(e) => Err(e),
        };
    }
    match answer {
        Ok(ClientResponse::Error(e)) => eprintln!("berth run: recording the step's end: {e}"),
        Err(e) => eprintln!("berth run: recording the step's end: {e:#}"),
        Ok(_) => {}
    }
    berth_protocol::probe::mark("client end recorded");
    if args.timing {
        eprintln!("berth run: timing end_recorded_ms={:.2}", t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(code)
}

/// Why a grant is not on the nodes asked for (`nodelist`, any order), if it is not.
fn nodelist_mismatch(nodelist: &[String], grant: &StepGrant) -> Option<String> {
    if nodelist.is_empty() {
        return None;
    }
    let mut want: Vec<&str> = nodelist.iter().map(String::as_str).collect();
    let mut got: Vec<&str> = grant.nodes.iter().map(|n| n.name.as_str()).collect();
    want.sort_unstable();
    want.dedup();
    got.sort_unstable();
    got.dedup();
    (want != got).then(|| {
        format!(
            "the step was placed on {} (the job's first nodes with free cores), not on the nodes asked for ({}); nothing was started",
            got.join(","),
            want.join(",")
        )
    })
}

/// The grant, and the key the control tree's frames are MAC'd with.
async fn request_step(client: &mut Client, create: &StepCreate) -> Result<(StepGrant, LinkKey)> {
    let mut last_reason = String::new();
    loop {
        match client.call(&ClientRequest::StepCreate(Box::new(create.clone()))).await? {
            ClientResponse::StepGranted { grant, link_key } => {
                let link = LinkKey::from_hex(&link_key).ok_or_else(|| {
                    anyhow!("the controller granted the step without a valid link key (has it a cluster key?); agents would refuse it")
                })?;
                return Ok((*grant, link));
            }
            ClientResponse::TryAgain { reason } => {
                if reason != last_reason {
                    eprintln!("berth run: waiting for resources: {reason}");
                    last_reason = reason;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            ClientResponse::Error(e) => return Err(anyhow!(e)),
            other => bail!("unexpected answer from the controller: {other:?}"),
        }
    }
}

/// `run`'s end of the control tree.
struct Tree {
    label: bool,
    no_kill: bool,
    size: u32,
    exits: Vec<RankExit>,
    failures: Vec<RankExit>,
    abort: Option<(u32, String, i32, String)>,
    failed_at: Option<String>,
    killing: bool,
    partial: HashMap<(u32, u8), Vec<u8>>,
    running_ms: Option<f64>,
    /// The step's spawns (`PMIx_Spawn`): started as steps of the job by this `run`. None in a
    /// spawned step's own tree (its spawns are refused).
    spawner: Option<Spawner>,
    /// A spawned step's tree: told when its ranks run (or cannot), and its way down given to
    /// the parent's `run`.
    spawned: Option<Spawned>,
    /// Publish, lookup and connect, shared by the step and its spawned steps.
    services: Arc<Mutex<Services>>,
}

impl Tree {
    fn new(args: &RunArgs, grant: &StepGrant) -> Tree {
        Tree {
            label: args.label,
            no_kill: args.no_kill,
            size: grant.size,
            exits: vec![],
            failures: vec![],
            abort: None,
            failed_at: None,
            killing: false,
            partial: HashMap::new(),
            running_ms: None,
            spawner: None,
            spawned: None,
            services: Arc::default(),
        }
    }

    async fn drive(&mut self, grant: &StepGrant, link: &LinkKey, t0: Instant, timing: bool) -> StepOutcome {
        let first = &grant.nodes[0];
        let stream = match TcpStream::connect(&first.address).await {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("cannot reach the agent of {} at {}: {e}", first.name, first.address);
                eprintln!("berth run: {msg}");
                return StepOutcome { exit_code: 1, failed_at: Some(msg), ..Default::default() };
            }
        };
        berth_protocol::probe::mark("client agent connected");
        let nspace = link.pmix_namespace(grant.job, grant.step);
        if let Ok(mut s) = self.services.lock() {
            s.steps.insert(
                nspace.clone(),
                grant.nodes.iter().map(|n| (n.name.clone(), n.ranks.iter().map(|r| r.rank).collect())).collect(),
            );
        }
        let _ = stream.set_nodelay(true);
        berth_protocol::tree::keepalive(&stream);
        let (mut rd, mut wr) = stream.into_split();
        let (mut sealer, mut opener) = link.link(0, TreeEnd::Above);
        let subtree: Vec<u32> = (0..grant.nodes.len() as u32).collect();
        let launch = AgentQuery::StepLaunch { grant: Box::new(grant.clone()), subtree };
        if let Err(e) = write_frame(&mut wr, &launch).await {
            let msg = format!("sending the launch to {}: {e}", first.name);
            eprintln!("berth run: {msg}");
            return StepOutcome { exit_code: 1, failed_at: Some(msg), ..Default::default() };
        }
        let (down_tx, mut down_rx) = mpsc::unbounded_channel::<TreeDown>();
        tokio::spawn(async move {
            while let Some(m) = down_rx.recv().await {
                if write_sealed(&mut wr, &mut sealer, &m).await.is_err() {
                    break;
                }
            }
        });
        // A spawned step's tree takes no signals nor stdin of its own: the parent's `run` kills
        // it (Spawner::finish).
        let mut stdin_fwd = None;
        match &mut self.spawned {
            None => {
                forward_signals(down_tx.clone());
                // stdin is read by a thread of its own, started once the ranks run: its
                // creation would take a CPU from the launch (nothing typed meanwhile is lost).
                stdin_fwd = Some(down_tx.clone());
            }
            Some(s) => {
                if let Ok(mut downs) = s.downs.lock() {
                    downs.push(down_tx.clone());
                }
            }
        }
        let deadline = berth_protocol::tree::launch_deadline(grant.nodes.len(), grant.fanout);
        let mut answered = false;
        loop {
            let Some(frame) = berth_protocol::tree::read_up(&mut rd, &mut opener, answered, deadline).await else {
                let msg = format!(
                    "the agent of {} did not answer the launch within {} s (a hung node?); nothing was started there",
                    first.name,
                    deadline.as_secs()
                );
                eprintln!("berth run: {msg}");
                self.failed_at.get_or_insert(msg);
                break;
            };
            answered = true;
            let msg = match frame {
                Ok(Some(m)) => m,
                Ok(None) | Err(_) => {
                    let why = match frame {
                        Err(berth_protocol::ProtocolError::Auth(e)) => format!(" (a frame failed authentication: {e})"),
                        _ => String::new(),
                    };
                    let msg = format!("lost the connection to {}'s agent{why}; the ranks were killed", first.name);
                    eprintln!("berth run: {msg}");
                    self.failed_at.get_or_insert(msg);
                    break;
                }
            };
            match msg {
                TreeUp::Started { nodes, ranks } => {
                    berth_protocol::probe::mark("client started");
                    if let Some(tx) = self.spawned.as_mut().and_then(|s| s.started.take()) {
                        let _ = tx.send(Ok(()));
                    }
                    if let Some(tx) = stdin_fwd.take() {
                        tokio::spawn(forward_stdin(tx));
                    }
                    let ms = t0.elapsed().as_secs_f64() * 1000.0;
                    self.running_ms = Some(ms);
                    if timing {
                        eprintln!("berth run: {ranks} ranks on {nodes} nodes running after {ms:.2} ms");
                    }
                }
                TreeUp::Output { rank, stream, data } => self.output(rank, stream, &data),
                TreeUp::Exited { ranks } => {
                    for exit in ranks {
                        self.exited(exit, &down_tx);
                    }
                }
                TreeUp::LaunchFailed { node, reason } => {
                    let msg = format!("launch failed on {node}: {reason}");
                    if let Some(tx) = self.spawned.as_mut().and_then(|s| s.started.take()) {
                        let _ = tx.send(Err(msg.clone()));
                    }
                    eprintln!("berth run: {msg}");
                    self.failed_at.get_or_insert(msg.clone());
                    self.kill(&down_tx, msg);
                }
                TreeUp::Abort { rank, node, code, message } => {
                    eprintln!(
                        "berth run: rank {rank} on {node} called MPI_Abort (code {code}){}; killing the other ranks",
                        if message.is_empty() { String::new() } else { format!(": {message}") }
                    );
                    self.abort.get_or_insert((rank, node, code, message));
                    self.kill(&down_tx, "MPI_Abort".into());
                }
                TreeUp::SubtreeLost { nodes, ranks, reason } => {
                    eprintln!("berth run: lost nodes {} ({reason})", nodes.join(","));
                    // --no-kill: the survivors are told of each node first, then of its ranks.
                    if self.no_kill && !self.killing {
                        for node in &nodes {
                            let _ = down_tx.send(TreeDown::NodeLost { node: node.clone() });
                        }
                    }
                    for rank in ranks {
                        let node = grant
                            .nodes
                            .iter()
                            .find(|n| n.ranks.iter().any(|r| r.rank == rank))
                            .map(|n| n.name.clone())
                            .unwrap_or_default();
                        let exit = RankExit {
                            rank,
                            node,
                            exit_code: None,
                            signal: None,
                            reason: Some(format!("node lost: {reason}")),
                        };
                        self.exited(exit, &down_tx);
                    }
                }
                // The root shepherd completes barriers and routes direct modex itself: nothing
                // of either comes up to `run`.
                TreeUp::BarrierIn { .. } | TreeUp::ModexRequest(_) | TreeUp::ModexReply(_) => {}
                TreeUp::Publish(req) => {
                    let reply = self.services.lock().map(|mut s| s.publish(&nspace, req.clone()));
                    let reply = reply.unwrap_or_else(|_| Some("berth run's table is unusable".into()));
                    let _ = down_tx.send(TreeDown::ServiceReply(ServiceReply {
                        id: req.id,
                        to: req.from,
                        error: reply,
                        found: vec![],
                    }));
                    self.answer_lookups();
                }
                TreeUp::Lookup(req) => {
                    if let Ok(mut s) = self.services.lock() {
                        s.lookup(req, down_tx.clone());
                    }
                }
                TreeUp::Connect(req) => {
                    if let Ok(mut s) = self.services.lock() {
                        s.connect(&nspace, req, down_tx.clone());
                    }
                }
                TreeUp::Spawn(req) => {
                    let reply = |error: String| {
                        TreeDown::SpawnReply(SpawnReply {
                            id: req.id,
                            to: req.from,
                            nspace: String::new(),
                            error: Some(error),
                        })
                    };
                    match &mut self.spawner {
                        Some(spawner) => spawner.spawn(grant, link, req, down_tx.clone()),
                        None => {
                            eprintln!("berth run: rank {} of a spawned step called MPI_Comm_spawn: refused (a spawned step spawns no further)", req.rank);
                            let _ = down_tx.send(reply("a spawned step spawns no further".into()));
                        }
                    }
                }
                TreeUp::Done => {
                    berth_protocol::probe::mark("client done");
                    break;
                }
            }
        }
        self.flush();
        if let Some(tx) = self.spawned.as_mut().and_then(|s| s.started.take()) {
            let _ =
                tx.send(Err(self.failed_at.clone().unwrap_or_else(|| "the step ended before its ranks ran".into())));
        }
        self.outcome(t0)
    }

    /// Lookups waiting for keys a publish may have brought.
    fn answer_lookups(&self) {
        if let Ok(mut s) = self.services.lock() {
            s.answer_waiting();
        }
    }

    fn kill(&mut self, down: &mpsc::UnboundedSender<TreeDown>, reason: String) {
        if !self.killing {
            self.killing = true;
            let _ = down.send(TreeDown::Kill { reason });
        }
    }

    fn exited(&mut self, exit: RankExit, down: &mpsc::UnboundedSender<TreeDown>) {
        if exit.abnormal() && !self.killing {
            self.failures.push(exit.clone());
            if self.no_kill {
                eprintln!("berth run: {}; the other ranks go on (--no-kill)", exit.describe());
                let _ = down.send(TreeDown::RankFailed { exit: exit.clone() });
            } else {
                eprintln!("berth run: {}; killing the other ranks", exit.describe());
                self.kill(down, format!("rank {} failed", exit.rank));
            }
        }
        self.exits.push(exit);
    }

    fn output(&mut self, rank: u32, stream: u8, data: &Chunk) {
        let bytes = data.as_bytes();
        if !self.label {
            write_stream(stream, bytes);
            return;
        }
        let buf = self.partial.entry((rank, stream)).or_default();
        buf.extend_from_slice(bytes);
        if let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') {
            let rest = buf.split_off(last_nl + 1);
            let complete = std::mem::replace(buf, rest);
            let mut out = Vec::with_capacity(complete.len() + 16);
            for line in complete.split_inclusive(|&b| b == b'\n') {
                out.extend_from_slice(format!("{rank}: ").as_bytes());
                out.extend_from_slice(line);
            }
            write_stream(stream, &out);
        }
    }

    fn flush(&mut self) {
        for ((rank, stream), buf) in std::mem::take(&mut self.partial) {
            if !buf.is_empty() {
                let mut out = format!("{rank}: ").into_bytes();
                out.extend_from_slice(&buf);
                out.push(b'\n');
                write_stream(stream, &out);
            }
        }
    }

    fn outcome(&self, t0: Instant) -> StepOutcome {
        let status = |e: &RankExit| match (e.exit_code, e.signal) {
            (_, Some(s)) => 128 + s,
            (Some(c), None) => c,
            (None, None) => 1,
        };
        let worst = self.exits.iter().map(status).max().unwrap_or(0);
        // When a failure killed the others, their SIGTERM is not the story: the failure is.
        let mut exit_code = match (&self.abort, self.failures.first()) {
            (Some((_, _, code, _)), _) => (*code).max(1),
            (None, Some(first)) if !self.no_kill => status(first).max(1),
            _ => worst,
        };
        let missing = self.size as usize > self.exits.len();
        if exit_code == 0 && (self.failed_at.is_some() || missing) {
            exit_code = 1;
        }
        if self.no_kill && !self.failures.is_empty() {
            eprintln!("berth run: {} of {} ranks failed:", self.failures.len(), self.size);
            for f in &self.failures {
                eprintln!("  {}", f.describe());
            }
        }
        let mut failures = self.failures.clone();
        if let Some((rank, node, code, message)) = &self.abort {
            failures.insert(
                0,
                RankExit {
                    rank: *rank,
                    node: node.clone(),
                    exit_code: Some(*code),
                    signal: None,
                    reason: Some(format!("MPI_Abort {message}").trim().to_string()),
                },
            );
        }
        StepOutcome { exit_code, failures, failed_at: self.failed_at.clone(), wall_ms: t0.elapsed().as_millis() as u64 }
    }
}

/// A way down a step's tree to the node that asked (its request `id`).
struct Replier {
    down: mpsc::UnboundedSender<TreeDown>,
    id: u64,
    to: u32,
}

impl Replier {
    fn send(&self, error: Option<String>, found: Vec<Found>) {
        let _ = self.down.send(TreeDown::ServiceReply(ServiceReply { id: self.id, to: self.to, error, found }));
    }
}

/// The most values `run` keeps published, and lookups it keeps waiting.
const MAX_PUBLISHED: usize = 4096;
const MAX_WAITING_LOOKUPS: usize = 4096;
/// The most connects `run` keeps waiting for their nodes.
const MAX_CONNECTS: usize = 4096;

/// `PMIx_Publish`/`Lookup` and `PMIx_Connect` of a step and its spawned steps, carried out by
/// their `run` (docs/protocol/03-control-tree.md, "Publish, lookup and connect"): the
/// published values (the range is the run's steps), the lookups waiting for theirs, and the
/// connects waiting for every node of theirs.
#[derive(Default)]
struct Services {
    /// Each step's namespace → its nodes (name, ranks), in node order.
    steps: HashMap<String, Vec<(String, Vec<u32>)>>,
    published: HashMap<String, (Found, bool)>,
    waiting: Vec<(Vec<String>, Replier)>,
    /// A connect (its procs, sorted) → the nodes it waits for, those in, and their repliers.
    connects: HashMap<Vec<ProcName>, Connecting>,
}

/// A connect in progress: the nodes it waits for, and those in with their repliers.
type Connecting = (std::collections::BTreeSet<String>, Vec<(String, Replier)>);

impl Services {
    /// A publish of a rank of `nspace`: None when stored, else why not.
    fn publish(&mut self, nspace: &str, req: berth_protocol::step::PublishRequest) -> Option<String> {
        if req.values.iter().any(|v| self.published.contains_key(&v.key)) {
            return Some("a key is published already".into());
        }
        if self.published.len() + req.values.len() > MAX_PUBLISHED {
            return Some(format!("at most {MAX_PUBLISHED} values are published at once"));
        }
        for value in req.values {
            let publisher = ProcName { nspace: nspace.to_string(), rank: req.rank };
            self.published.insert(value.key.clone(), (Found { value, publisher }, req.first_read));
        }
        None
    }

    /// Every key of `keys` when all are published (first-read ones are taken).
    fn take(&mut self, keys: &[String]) -> Option<Vec<Found>> {
        if !keys.iter().all(|k| self.published.contains_key(k)) {
            return None;
        }
        let mut found = Vec::with_capacity(keys.len());
        for k in keys {
            let first_read = self.published.get(k).is_some_and(|(_, f)| *f);
            let f = if first_read {
                self.published.remove(k).map(|(f, _)| f)
            } else {
                self.published.get(k).map(|(f, _)| f.clone())
            };
            found.extend(f);
        }
        Some(found)
    }

    fn lookup(&mut self, req: berth_protocol::step::LookupRequest, down: mpsc::UnboundedSender<TreeDown>) {
        let replier = Replier { down, id: req.id, to: req.from };
        if let Some(found) = self.take(&req.keys) {
            return replier.send(None, found);
        }
        if !req.wait {
            // What is there, if anything (PMIx answers a partial lookup without waiting).
            let found: Vec<Found> =
                req.keys.iter().filter_map(|k| self.published.get(k).map(|(f, _)| f.clone())).collect();
            let error = found.is_empty().then(|| "not found".to_string());
            return replier.send(error, found);
        }
        // Lookups whose node gave up (it answers them itself) leave no trace beyond the bound.
        self.waiting.retain(|(_, r)| !r.down.is_closed());
        if self.waiting.len() >= MAX_WAITING_LOOKUPS {
            return replier.send(Some(format!("at most {MAX_WAITING_LOOKUPS} lookups wait at once")), vec![]);
        }
        self.waiting.push((req.keys, replier));
    }

    fn answer_waiting(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            let keys = self.waiting[i].0.clone();
            match self.take(&keys) {
                Some(found) => {
                    let (_, r) = self.waiting.remove(i);
                    r.send(None, found);
                }
                None => i += 1,
            }
        }
    }

    /// Node `req.from` of step `nspace` is in a connect: answered, with every other node in
    /// it, once every node hosting one of its procs is.
    fn connect(
        &mut self,
        nspace: &str,
        mut req: berth_protocol::step::ConnectRequest,
        down: mpsc::UnboundedSender<TreeDown>,
    ) {
        let replier = Replier { down, id: req.id, to: req.from };
        let Some(node) = self.steps.get(nspace).and_then(|n| n.get(req.from as usize)).map(|(name, _)| name.clone())
        else {
            return replier.send(Some("not found: the asking node is not of the step".into()), vec![]);
        };
        let mut expected = std::collections::BTreeSet::new();
        for p in &req.procs {
            let Some(nodes) = self.steps.get(&p.nspace) else {
                return replier.send(
                    Some(format!("not found: namespace {} is not of this run", p.nspace.escape_debug())),
                    vec![],
                );
            };
            for (name, ranks) in nodes {
                if p.rank == RANK_WILDCARD || ranks.contains(&p.rank) {
                    expected.insert(name.clone());
                }
            }
            if p.rank != RANK_WILDCARD && !nodes.iter().any(|(_, r)| r.contains(&p.rank)) {
                return replier
                    .send(Some(format!("not found: no rank {} in {}", p.rank, p.nspace.escape_debug())), vec![]);
            }
        }
        req.procs.sort();
        req.procs.dedup();
        if !self.connects.contains_key(&req.procs) && self.connects.len() >= MAX_CONNECTS {
            return replier.send(Some(format!("at most {MAX_CONNECTS} connects wait at once")), vec![]);
        }
        let entry = self.connects.entry(req.procs.clone()).or_insert_with(|| (expected, Vec::new()));
        entry.1.retain(|(n, _)| *n != node);
        entry.1.push((node, replier));
        let arrived: std::collections::BTreeSet<&String> = entry.1.iter().map(|(n, _)| n).collect();
        if entry.0.iter().all(|n| arrived.contains(n)) {
            if let Some((_, repliers)) = self.connects.remove(&req.procs) {
                for (_, r) in repliers {
                    r.send(None, vec![]);
                }
            }
        }
    }
}

/// How long a spawn waits for its step to be granted (the job's cores may all be taken: a
/// spawned step overcommits them, so this is the controller's answer, not resources).
const SPAWN_GRANT_WAIT: Duration = Duration::from_secs(30);
/// After its parent step ended, how long its spawned steps may run on before they are killed.
const SPAWNED_LINGER: Duration = Duration::from_secs(10);

/// A spawned step's tree (`Tree::spawned`).
struct Spawned {
    started: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    downs: std::sync::Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<TreeDown>>>>,
}

/// The spawns of `run`'s step: each `PMIx_Spawn` (`MPI_Comm_spawn`) a rank makes becomes a step
/// of the same job, with a control tree of its own driven here, its output beside the
/// parent's (docs/launcher.md, "MPI_Comm_spawn").
struct Spawner {
    services: Arc<Mutex<Services>>,
    dir: std::path::PathBuf,
    label: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The spawned steps' ways down (to kill them).
    downs: std::sync::Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<TreeDown>>>>,
}

impl Spawner {
    fn new(dir: &Path, args: &RunArgs, services: Arc<Mutex<Services>>) -> Spawner {
        Spawner { services, dir: dir.to_path_buf(), label: args.label, tasks: vec![], downs: Default::default() }
    }

    /// Start the step `req` asks for; its answer goes down `parent_down` once its ranks run.
    fn spawn(
        &mut self,
        parent: &StepGrant,
        link: &LinkKey,
        req: berth_protocol::step::SpawnRequest,
        parent_down: mpsc::UnboundedSender<TreeDown>,
    ) {
        let create = spawn_create(parent, link, &req);
        let dir = self.dir.clone();
        let label = self.label;
        let downs = self.downs.clone();
        let services = self.services.clone();
        self.tasks.push(tokio::spawn(async move {
            let answer = |nspace: String, error: Option<String>| {
                let _ = parent_down.send(TreeDown::SpawnReply(SpawnReply { id: req.id, to: req.from, nspace, error }));
            };
            let create = match create {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("berth run: MPI_Comm_spawn of rank {} refused: {e}", req.rank);
                    return answer(String::new(), Some(e));
                }
            };
            let granted = async {
                let mut client = Client::connect(&dir).await?;
                let g = request_step(&mut client, &create).await?;
                Ok::<_, anyhow::Error>((client, g))
            };
            let (mut client, (grant, child_link)) = match tokio::time::timeout(SPAWN_GRANT_WAIT, granted).await {
                Ok(Ok(g)) => g,
                Ok(Err(e)) => {
                    eprintln!("berth run: MPI_Comm_spawn of rank {}: {e:#}", req.rank);
                    return answer(String::new(), Some(format!("{e:#}")));
                }
                Err(_) => {
                    let e = format!("no step granted within {} s", SPAWN_GRANT_WAIT.as_secs());
                    eprintln!("berth run: MPI_Comm_spawn of rank {}: {e}", req.rank);
                    return answer(String::new(), Some(e));
                }
            };
            let nspace = child_link.pmix_namespace(grant.job, grant.step);
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            let mut tree = Tree {
                label,
                no_kill: grant.no_kill,
                size: grant.size,
                exits: vec![],
                failures: vec![],
                abort: None,
                failed_at: None,
                killing: false,
                partial: HashMap::new(),
                running_ms: None,
                spawner: None,
                spawned: Some(Spawned { started: Some(started_tx), downs }),
                services,
            };
            let t0 = Instant::now();
            let drive = tree.drive(&grant, &child_link, t0, false);
            tokio::pin!(drive);
            let mut started_rx = Some(started_rx);
            let outcome = loop {
                tokio::select! {
                    outcome = &mut drive => break outcome,
                    started = async { started_rx.as_mut().expect("polled while Some").await }, if started_rx.is_some() => {
                        started_rx = None;
                        match started {
                            Ok(Ok(())) => answer(nspace.clone(), None),
                            Ok(Err(e)) => answer(String::new(), Some(e)),
                            Err(_) => answer(String::new(), Some("the spawned step ended".into())),
                        }
                    }
                }
            };
            if let Some(rx) = started_rx {
                match rx.await {
                    Ok(Ok(())) => answer(nspace, None),
                    Ok(Err(e)) => answer(String::new(), Some(e)),
                    Err(_) => answer(String::new(), Some("the spawned step ended".into())),
                }
            }
            // As under Open MPI's own mpirun, children that fail take their parent with them:
            // the parent's ranks may be waiting on them for ever (a child that aborts in
            // MPI_Init leaves its parent in MPI_Comm_spawn).
            if outcome.exit_code != 0 {
                let why = outcome
                    .failures
                    .first()
                    .map(RankExit::describe)
                    .or_else(|| outcome.failed_at.clone())
                    .unwrap_or_else(|| format!("status {}", outcome.exit_code));
                let reason = format!("spawned step {}.{} failed ({why})", grant.job, grant.step);
                eprintln!("berth run: {reason}; ending the step that spawned it");
                let _ = parent_down.send(TreeDown::Kill { reason });
            }
            let end = ClientRequest::StepEnd { job: grant.job, step: grant.step, outcome };
            if let Ok(ClientResponse::Error(e)) = client.call(&end).await {
                eprintln!("berth run: recording the spawned step's end: {e}");
            }
        }));
    }

    /// The parent step ended: its spawned steps may end on their own for a while (at once
    /// when `kill`), then they are killed; returns when every one is recorded.
    async fn finish(self, kill: bool) {
        let mut tasks = self.tasks;
        let all = async {
            for t in tasks.iter_mut() {
                let _ = t.await;
            }
        };
        if !kill && tokio::time::timeout(SPAWNED_LINGER, all).await.is_ok() {
            return;
        }
        if let Ok(downs) = self.downs.lock() {
            for d in downs.iter() {
                let _ = d.send(TreeDown::Kill { reason: "the spawning step ended".into() });
            }
        }
        for t in tasks {
            let _ = tokio::time::timeout(SPAWNED_LINGER, t).await;
        }
    }
}

/// The step a rank's `PMIx_Spawn` asks for, in its parent's job: every program with its
/// copies (ranks in program order), the parent step's environment under each program's own
/// variables, overcommitting the job's cores (the parent's ranks hold them).
fn spawn_create(
    parent: &StepGrant,
    link: &LinkKey,
    req: &berth_protocol::step::SpawnRequest,
) -> std::result::Result<StepCreate, String> {
    use berth_protocol::step::{SpawnParent, MAX_SPAWN_APPS, MAX_SPAWN_PROCS};
    if req.apps.is_empty() || req.apps.len() > MAX_SPAWN_APPS {
        return Err(format!("a spawn names 1 to {MAX_SPAWN_APPS} programs, not {}", req.apps.len()));
    }
    let total: u64 = req.apps.iter().map(|a| u64::from(a.maxprocs)).sum();
    if req.apps.iter().any(|a| a.maxprocs == 0 || a.argv.first().is_none_or(|p| p.is_empty()))
        || total > u64::from(MAX_SPAWN_PROCS)
    {
        return Err(format!("each program needs a command and 1 or more processes, at most {MAX_SPAWN_PROCS} in all"));
    }
    let cwd_of = |a: &berth_protocol::step::SpawnApp| match &a.cwd {
        Some(c) if c.starts_with('/') => c.clone(),
        Some(c) => format!("{}/{c}", parent.cwd.trim_end_matches('/')),
        None => parent.cwd.clone(),
    };
    let mut env = parent.env.clone();
    let (argv, cwd, apps) = if req.apps.len() == 1 {
        let a = &req.apps[0];
        for (k, v) in &a.env {
            env.retain(|(n, _)| n != k);
            env.push((k.clone(), v.clone()));
        }
        (a.argv.clone(), cwd_of(a), vec![])
    } else {
        let mut first = 0u32;
        let apps = req
            .apps
            .iter()
            .map(|a| {
                let app = berth_core::step::mpmd::App {
                    argv: a.argv.clone(),
                    env: a.env.clone(),
                    cwd: Some(cwd_of(a)),
                    ranks: vec![(first, first + a.maxprocs - 1)],
                    ..Default::default()
                };
                first += a.maxprocs;
                app
            })
            .collect();
        let argv = req.apps.iter().flat_map(|a| a.argv.iter().cloned().chain([":".to_string()])).collect::<Vec<_>>();
        (argv[..argv.len() - 1].to_vec(), parent.cwd.clone(), apps)
    };
    Ok(StepCreate {
        job: Some(parent.job),
        request: StepRequest {
            ntasks: Some(total as u32),
            overcommit: true,
            binding: RankBinding::None,
            ..Default::default()
        },
        interactive: InteractiveAsk::default(),
        argv,
        env,
        cwd,
        host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
        pid: std::process::id(),
        fanout: parent.fanout,
        no_kill: false,
        rank_cpusets: false,
        notify_signal: None,
        mpi: Some(parent.mpi),
        apps,
        spawned_by: Some(SpawnParent { nspace: link.pmix_namespace(parent.job, parent.step), rank: req.rank }),
    })
}

fn write_stream(stream: u8, bytes: &[u8]) {
    if stream == 2 {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(bytes);
        let _ = e.flush();
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(bytes);
        let _ = o.flush();
    }
}

/// stdin to rank 0. A terminal, pipe or socket is read on the runtime when it is readable;
/// /dev/null is at its end at once; anything else (a file, another device) by a thread of its
/// own (tokio's stdin). No thread in the common cases: making one costs the launch ~0.1 ms of
/// a CPU, and one blocked in read(2) must be woken and reaped when `run` exits.
async fn forward_stdin(down: mpsc::UnboundedSender<TreeDown>) {
    let send = |data: &[u8]| down.send(TreeDown::Stdin { data: Chunk::from_bytes(data.to_vec()) }).is_ok();
    match stdin_kind() {
        StdinKind::Null => {}
        StdinKind::Pollable(fd) => {
            if read_pollable(fd, send).await.is_err() {
                return;
            }
        }
        StdinKind::Other => {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if !send(&buf[..n]) {
                            return;
                        }
                    }
                }
            }
        }
    }
    let _ = down.send(TreeDown::StdinEof);
}

enum StdinKind {
    Null,
    /// A descriptor epoll watches (a duplicate of 0, left blocking: its file description is
    /// shared with the shell, whose terminal must not turn non-blocking).
    Pollable(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    Other,
}

fn stdin_kind() -> StdinKind {
    use std::os::fd::AsFd;
    // SAFETY: fstat of descriptor 0 into a zeroed struct of ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let stat_ok = unsafe { libc::fstat(0, &mut st) } == 0;
    let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else { return StdinKind::Other };
    // SAFETY: an OwnedFd, open until the AsyncFd owning it is dropped.
    match unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
        Ok(async_fd) => StdinKind::Pollable(async_fd),
        // epoll refuses regular files and devices without poll, /dev/null among them.
        Err(_) if stat_ok && st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3) => {
            StdinKind::Null
        }
        Err(_) => StdinKind::Other,
    }
}

/// Read a pollable descriptor to its end, a read(2) only when it is readable (so it never
/// blocks); `send` false stops. Err: the receiver is gone.
async fn read_pollable(
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    mut send: impl FnMut(&[u8]) -> bool,
) -> Result<(), ()> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(mut ready) = fd.readable().await else { return Ok(()) };
        loop {
            // SAFETY: reading into our own buffer from our own descriptor.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                return Ok(());
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Ok(());
            }
            if !send(&buf[..n as usize]) {
                return Err(());
            }
            // Edge-triggered: read on while more is there, else wait for the next edge.
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd of ours, no wait.
            if unsafe { libc::poll(&mut p, 1, 0) } <= 0 {
                ready.clear_ready();
                break;
            }
        }
    }
}

/// Signals `run` receives reach every rank. Two Ctrl-C within a second kill the step.
fn forward_signals(down: mpsc::UnboundedSender<TreeDown>) {
    use tokio::signal::unix::{signal, SignalKind};
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGCONT,
        libc::SIGTSTP,
        libc::SIGWINCH,
    ] {
        let Ok(mut stream) = signal(SignalKind::from_raw(sig)) else { continue };
        let down = down.clone();
        tokio::spawn(async move {
            let mut last_int: Option<Instant> = None;
            while stream.recv().await.is_some() {
                if sig == libc::SIGINT {
                    if last_int.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                        eprintln!("berth run: second interrupt: killing the step");
                        let _ = down.send(TreeDown::Kill { reason: "interrupted".into() });
                        continue;
                    }
                    last_int = Some(Instant::now());
                }
                tracing::debug!("forwarding SIG{}", signal_name(sig));
                if down.send(TreeDown::Signal { signal: sig }).is_err() {
                    return;
                }
            }
        });
    }
}

/// The step's environment with `--gpus-per-task`/`--gpu-bind` as `BERTH_GPUS_PER_TASK` and
/// `BERTH_GPU_BIND`, which the agents read to give each rank its GPUs; without the flags the
/// job's (inherited from its script's environment) stay.
fn gpu_binding_env(
    mut env: Vec<(String, String)>,
    per_task: Option<u32>,
    bind: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    if per_task == Some(0) {
        anyhow::bail!("--gpus-per-task must be at least 1");
    }
    if let Some(b) = bind {
        berth_core::gpu::GpuBind::parse(b).map_err(anyhow::Error::msg)?;
    }
    for (name, value) in
        [("BERTH_GPUS_PER_TASK", per_task.map(|n| n.to_string())), ("BERTH_GPU_BIND", bind.map(String::from))]
    {
        if let Some(v) = value {
            env.retain(|(k, _)| k != name);
            env.push((name.to_string(), v));
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_flags_reach_the_ranks_environment() {
        let env = vec![("BERTH_GPUS_PER_TASK".to_string(), "3".to_string()), ("HOME".into(), "/h".into())];
        let got = gpu_binding_env(env.clone(), Some(1), Some("map_gpu:1")).unwrap();
        let get = |k: &str| got.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!((get("BERTH_GPUS_PER_TASK"), get("BERTH_GPU_BIND")), (vec!["1"], vec!["map_gpu:1"]));
        assert_eq!(gpu_binding_env(env.clone(), None, None).unwrap(), env, "the job's stay without flags");
        assert!(gpu_binding_env(env.clone(), Some(0), None).is_err());
        assert!(gpu_binding_env(env, None, Some("sockets")).unwrap_err().to_string().contains("--gpu-bind"));
    }

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn np_is_rewritten_only_before_the_program() {
        assert_eq!(rewrite_np(v("berth run -np 4 ./a.out -np 2")), v("berth run -n 4 ./a.out -np 2"));
        assert_eq!(rewrite_np(v("berth --dir x run --label -np 2 prog")), v("berth --dir x run --label -n 2 prog"));
        assert_eq!(rewrite_np(v("berth submit -np")), v("berth submit -np"));
        // Values of the interactive allocation's options are not the program.
        assert_eq!(
            rewrite_np(v("berth run -L matlab:2 --gres nvme:1 -np 2 prog")),
            v("berth run -L matlab:2 --gres nvme:1 -n 2 prog")
        );
        assert_eq!(rewrite_np(v("berth task spawn run -np 4")), v("berth task spawn run -np 4"));
    }

    #[test]
    fn a_run_command_line_is_parsed_alone_with_the_global_flags() {
        use clap::Parser;
        let line = run_command_line(&rewrite_np(v("berth --dir /c --json run -np 4 --label ./a.out --dir x"))).unwrap();
        assert_eq!(line, v("berth --dir /c --json -n 4 --label ./a.out --dir x"));
        let cli = RunCli::try_parse_from(line).unwrap();
        assert_eq!(cli.dir.as_deref(), Some(std::path::Path::new("/c")));
        assert!(cli.json && cli.args.label);
        assert_eq!(cli.args.ntasks, Some(4));
        assert_eq!(cli.args.command, v("./a.out --dir x"), "the program's own arguments stay its own");
        let cli = RunCli::try_parse_from(run_command_line(&v("berth run --json true")).unwrap()).unwrap();
        assert!(cli.json && cli.dir.is_none());
        assert_eq!(run_command_line(&v("berth --dir run jobs")), None, "run as --dir's value is not the command");
        assert_eq!(run_command_line(&v("berth jobs run")), None);
        assert!(RunCli::try_parse_from(run_command_line(&v("berth run --fanout")).unwrap()).is_err());
    }

    #[tokio::test]
    async fn a_pipe_is_read_to_its_end_without_a_thread_even_past_one_edge() {
        use std::io::Write as _;
        let (r, w) = nix::unistd::pipe().unwrap();
        // SAFETY: r is an OwnedFd, registered once.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(r, tokio::io::Interest::READABLE) }.unwrap();
        // More than one read's worth (16 KB) arrives before the first readiness: read on while there is more.
        let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let writer = std::thread::spawn({
            let sent = sent.clone();
            move || {
                let mut f = std::fs::File::from(w);
                f.write_all(&sent[..60_000]).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                f.write_all(&sent[60_000..]).unwrap();
            }
        });
        let mut got = Vec::new();
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            read_pollable(fd, |d| {
                got.extend_from_slice(d);
                true
            }),
        )
        .await;
        writer.join().unwrap();
        assert!(matches!(r, Ok(Ok(()))), "read to the end, not stuck on a missed edge");
        assert_eq!(got, sent);
    }

    fn replies(rx: &mut mpsc::UnboundedReceiver<TreeDown>) -> Vec<ServiceReply> {
        let mut out = vec![];
        while let Ok(TreeDown::ServiceReply(r)) = rx.try_recv() {
            out.push(r);
        }
        out
    }

    fn text_value(key: &str, v: &str) -> berth_protocol::step::PublishedValue {
        berth_protocol::step::PublishedValue { key: key.into(), text: Some(v.into()), bytes: None }
    }

    /// A lookup that waits is answered by the publish that brings its key (a first-read value
    /// is then gone); one that does not wait is told "not found"; a key is published once.
    #[test]
    fn a_waiting_lookup_is_answered_by_the_publish_of_its_key() {
        use berth_protocol::step::{LookupRequest, PublishRequest};
        let mut s = Services::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let lookup = |id, wait| LookupRequest { id, from: 1, rank: 0, keys: vec!["port".into()], wait };
        s.lookup(lookup(1, false), tx.clone());
        let r = replies(&mut rx);
        assert_eq!((r.len(), r[0].error.as_deref()), (1, Some("not found")), "{r:?}");
        s.lookup(lookup(2, true), tx.clone());
        assert!(replies(&mut rx).is_empty(), "it waits");
        let publish =
            PublishRequest { id: 9, from: 0, rank: 3, values: vec![text_value("port", "p0")], first_read: true };
        assert_eq!(s.publish("ns.parent", publish.clone()), None);
        assert_eq!(s.publish("ns.parent", publish).as_deref(), Some("a key is published already"));
        s.answer_waiting();
        let r = replies(&mut rx);
        assert_eq!((r.len(), r[0].id, r[0].to), (1, 2, 1), "{r:?}");
        assert_eq!(r[0].found[0].value, text_value("port", "p0"));
        assert_eq!(r[0].found[0].publisher, ProcName { nspace: "ns.parent".into(), rank: 3 });
        s.lookup(lookup(3, false), tx);
        assert_eq!(replies(&mut rx)[0].error.as_deref(), Some("not found"), "the first read took it");
    }

    /// A connect over two steps' namespaces is answered, on every node in it, once every node
    /// hosting a participant has called (a node hosting both steps' ranks calls once); a
    /// namespace of no step of the run is refused at once.
    #[test]
    fn a_connect_waits_for_every_node_of_both_steps() {
        use berth_protocol::step::ConnectRequest;
        let mut s = Services::default();
        s.steps.insert("p".into(), vec![("n1".into(), vec![0]), ("n2".into(), vec![1])]);
        s.steps.insert("c".into(), vec![("n1".into(), vec![0, 1])]);
        let procs = vec![
            ProcName { nspace: "p".into(), rank: RANK_WILDCARD },
            ProcName { nspace: "c".into(), rank: RANK_WILDCARD },
        ];
        let (tx, mut rx) = mpsc::unbounded_channel();
        // n1 (named by the children's step) first, then n2 (the parent's node 1).
        s.connect("c", ConnectRequest { id: 1, from: 0, procs: procs.clone() }, tx.clone());
        assert!(replies(&mut rx).is_empty(), "n2 is not in yet");
        let mut reversed = procs.clone();
        reversed.reverse();
        s.connect("p", ConnectRequest { id: 7, from: 1, procs: reversed }, tx.clone());
        let mut r: Vec<(u64, u32, Option<String>)> =
            replies(&mut rx).into_iter().map(|r| (r.id, r.to, r.error)).collect();
        r.sort();
        assert_eq!(r, [(1, 0, None), (7, 1, None)]);
        assert!(s.connects.is_empty());
        let stranger = vec![ProcName { nspace: "x".into(), rank: 0 }];
        s.connect("p", ConnectRequest { id: 8, from: 0, procs: stranger }, tx);
        let r = replies(&mut rx);
        assert!(r[0].error.as_deref().is_some_and(|e| e.starts_with("not found")), "{r:?}");
    }

    #[test]
    fn fanout_range() {
        assert_eq!(parse_fanout("flat").unwrap(), 0);
        assert_eq!(parse_fanout("2").unwrap(), 2);
        assert!(parse_fanout("1").is_err());
        assert!(parse_fanout("33").is_err());
    }
}
