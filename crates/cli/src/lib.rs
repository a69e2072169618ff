//! The `berth` client: every user command, shared by the two binaries. `berth` (src/main.rs)
//! is this client alone: small, so that a command (above all `berth run`) starts fast; the
//! daemons and the local-cluster helpers live in `berthd` (src/bin/berthd), which `berth
//! server|agent|up|down|demo` execute.

pub mod advance;
pub mod alloc;
pub mod arrays;
pub mod changes;
pub mod client;
pub mod commands;
pub mod compat;
pub mod events;
pub mod faults;
pub mod fold;
pub mod mpmd;
pub mod output;
pub mod reservations;
pub mod run;
pub mod run_line;
pub mod sim;
pub mod status;
pub mod submission;
pub mod task;
pub mod topo_view;

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "berth", version, about = "berth: a topology-aware workload manager", propagate_version = true)]
pub struct Cli {
    /// Cluster directory (holds the controller socket); default $BERTH_DIR or ./.berth.
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for a controller that is down or restarting (default $BERTH_TIMEOUT,
    /// else 60). Given before the command (`berth --timeout 5 jobs`): `task wait` has its own.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Default, Clone)]
pub struct SubmitFlags {
    /// Total cores of the job.
    #[arg(long)]
    cores: Option<String>,
    #[arg(long)]
    nodes: Option<String>,
    #[arg(long = "tasks-per-node")]
    tasks_per_node: Option<String>,
    #[arg(long = "cpus-per-task")]
    cpus_per_task: Option<String>,
    /// Memory per node, e.g. 512M, 4G.
    #[arg(long)]
    mem: Option<String>,
    /// SECONDS, HH:MM:SS, D-HH:MM:SS, or 10m / 2h.
    #[arg(long)]
    walltime: Option<String>,
    #[arg(long)]
    name: Option<String>,
    /// Output file (default berth-<id>.out in the submit directory; %j is the job id).
    #[arg(long)]
    output: Option<String>,
    #[arg(long)]
    error: Option<String>,
    #[arg(long, short = 'q')]
    queue: Option<String>,
    /// Account (project) charged for fair share; default: your primary group.
    #[arg(long, short = 'A')]
    account: Option<String>,
    /// Memory per allocated CPU, e.g. 1G (instead of --mem per node).
    #[arg(long = "mem-per-cpu")]
    mem_per_cpu: Option<String>,
    /// GPUs of the whole job, spread evenly over its nodes (without --nodes: one node).
    #[arg(long)]
    gpus: Option<String>,
    /// GPUs on each node (at most 256).
    #[arg(long = "gpus-per-node")]
    gpus_per_node: Option<String>,
    /// Only GPUs of this type (as `berth nodes --topology` names them, e.g. a100).
    #[arg(long = "gpu-type")]
    gpu_type: Option<String>,
    /// CPUs per GPU: the job's CPUs on a node are its GPUs there times N (instead of --cores).
    #[arg(long = "cpus-per-gpu")]
    cpus_per_gpu: Option<String>,
    /// Memory per GPU, e.g. 16G: the job's memory on a node is its GPUs there times it.
    #[arg(long = "mem-per-gpu")]
    mem_per_gpu: Option<String>,
    /// GPUs per task: the job gets tasks x N, its `berth run` ranks N each (--gpu-bind).
    #[arg(long = "gpus-per-task")]
    gpus_per_task: Option<String>,
    /// GPUs on each socket the job uses on a node (Slurm's; with --sockets-per-node).
    #[arg(long = "gpus-per-socket")]
    gpus_per_socket: Option<String>,
    /// With --gpus-per-socket: how many sockets of each node the job uses.
    #[arg(long = "sockets-per-node")]
    sockets_per_node: Option<String>,
    /// Generic resources on each node, NAME:COUNT[,...] (the nodes' [gres]: `berth nodes`);
    /// `gpu[:TYPE]:N` items are --gpus-per-node N [--gpu-type TYPE].
    #[arg(long = "gres")]
    gres: Option<String>,
    /// Cluster-wide licenses the job holds while it runs, NAME[:COUNT][,...] (`berth licenses`).
    #[arg(long = "licenses", short = 'L')]
    licenses: Option<String>,
    /// How the job's `berth run` ranks get GPUs: closest, none or map:I,J,...
    #[arg(long = "gpu-bind")]
    gpu_bind: Option<String>,
    /// strict: only cores next to the job's GPUs (it waits for them); prefer: else cores
    /// elsewhere on the node. Default: the cluster's [placement] gpu_locality.
    #[arg(long = "gpu-locality")]
    gpu_locality: Option<String>,
    /// Count hardware threads (PUs) rather than whole cores.
    #[arg(long)]
    threads: bool,
    /// Core binding (Grid Engine): linear:N[:[S,]C], striding:F-L:STEP, striding:S,C-S,C:STEP,
    /// striding:N:STEP, explicit:S,C:S,C...
    #[arg(long)]
    binding: Option<String>,
    /// set (cpuset = the bound cores), env (BERTH_BINDING), pe (rankfile in BERTH_RANKFILE).
    #[arg(long = "binding-mode")]
    binding_mode: Option<String>,
    /// One sub-cpuset per rank (per --cpus-per-task CPUs) inside the job's cpuset on each node.
    #[arg(long = "rank-cpusets")]
    rank_cpusets: bool,
    /// What the job's steps offer their ranks unless `berth run --mpi` says: auto (PMI-1/PMI-2
    /// and PMIx), pmix, pmi2, pmi1, none.
    #[arg(long)]
    mpi: Option<String>,
    /// May use the nodes' system CPUs.
    #[arg(long = "system-cpus")]
    system_cpus: bool,
    /// If a node of the job fails, put the job back in the queue (rerun from the start).
    #[arg(long, conflicts_with = "no_requeue")]
    requeue: bool,
    /// If a node of the job fails, fail the job (default: the cluster's `[fault] requeue`).
    #[arg(long = "no-requeue")]
    no_requeue: bool,
    /// If one of the job's other nodes fails, keep running on the rest (ranks are told).
    #[arg(long = "no-kill")]
    no_kill: bool,
    /// Subnode properties the job needs, comma-separated.
    #[arg(long)]
    property: Option<String>,
    /// Run in this advance reservation (`berth resv list`; its users or accounts only).
    #[arg(long)]
    reservation: Option<String>,
    /// Start only after other jobs (Slurm's syntax): afterok:ID[:ID...], afterany:, afternotok:,
    /// after: (started), singleton; terms joined by `,` (all) or `?` (any).
    #[arg(long, short = 'd')]
    dependency: Option<String>,
    /// Start no earlier than: now+N[seconds|minutes|hours|days|weeks], HH:MM[:SS],
    /// YYYY-MM-DD[THH:MM[:SS]], midnight, noon, teatime, tomorrow (at most a year ahead).
    #[arg(long)]
    begin: Option<String>,
    /// A comment kept with the job (shown by `berth show`, `scontrol show job`).
    #[arg(long)]
    comment: Option<String>,
    /// The job's working directory (default: the submit directory, which stays
    /// BERTH_SUBMIT_DIR); relative output paths are taken from it.
    #[arg(long, short = 'D')]
    chdir: Option<String>,
    /// What of this environment the job gets: ALL (default), NONE, or [ALL,|NONE,]VAR[=value],...
    #[arg(long)]
    export: Option<String>,
    /// [B:]SIG[@SECS]: send SIG SECS seconds (default 60) before the walltime ends (B: the
    /// batch shell only).
    #[arg(long)]
    signal: Option<String>,
    /// BEGIN,END,FAIL,REQUEUE,ALL,NONE: events the cluster's notify hook is called for.
    #[arg(long = "mail-type")]
    mail_type: Option<String>,
    /// Who is notified (default: you).
    #[arg(long = "mail-user")]
    mail_user: Option<String>,
    /// Whole nodes: no other job shares the job's nodes.
    #[arg(long)]
    exclusive: bool,
    /// Slurm's QOS: the queue of that name (`normal`: none).
    #[arg(long)]
    qos: Option<String>,
    /// A job array, one task per index: 0-15, 1,3,5-7, 0-15:4, with a running limit 0-99%10
    /// (tasks shown A_i; %A and %a in output names).
    #[arg(long, short = 'a')]
    array: Option<String>,
    /// Submit although the script has `#SBATCH`/`#PBS` directives berth does not support
    /// (each is shown as a warning; docs/compat.md lists what is supported).
    #[arg(long = "ignore-unsupported")]
    ignore_unsupported: bool,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Submit batch scripts (options also read from `#BERTH`, `#SBATCH` and `#PBS` lines; flags
    /// win, then `#BERTH`). Several
    /// scripts are submitted in one transaction: all or none.
    Submit {
        /// Script files; `-` reads the script from standard input (at most 16 MiB, as a file).
        #[arg(required_unless_present = "wrap")]
        scripts: Vec<PathBuf>,
        /// Submit CMD as the job: a script `#!/bin/sh` then CMD (as sbatch --wrap; job name
        /// `wrap`).
        #[arg(long, value_name = "CMD", conflicts_with = "scripts")]
        wrap: Option<String>,
        #[command(flatten)]
        flags: SubmitFlags,
        /// Submit held: it waits for `berth release`.
        #[arg(long, short = 'H')]
        hold: bool,
        /// Do not exit until the jobs end; exit with the job's exit status (the worst of
        /// several; 128+N for a job killed by signal N, 1 for one that never ran), as sbatch's.
        #[arg(long, short = 'W')]
        wait: bool,
    },
    /// List jobs (queued, held, running; all with --all). The pending tasks of an array in
    /// the same state for the same reason are one line, `A_[3-9%2]` (not with --json).
    Jobs {
        #[arg(long)]
        all: bool,
        /// Only jobs in these states (comma-separated or repeated; `pending`: queued and held,
        /// `finished`: every end state).
        #[arg(long, short = 't', value_delimiter = ',')]
        state: Vec<String>,
        /// Only jobs of these users (comma-separated or repeated, as squeue -u).
        #[arg(long, short = 'u', value_delimiter = ',')]
        user: Vec<String>,
        /// Only your own jobs (with --user: theirs and yours).
        #[arg(long)]
        me: bool,
        /// Only jobs with these names (comma-separated or repeated, as squeue -n).
        #[arg(long, short = 'n', value_delimiter = ',')]
        name: Vec<String>,
        /// Only jobs in these queues (comma-separated or repeated, as squeue -p).
        #[arg(long, short = 'q', value_delimiter = ',')]
        queue: Vec<String>,
        /// Only the tasks of these arrays (their ids, comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        array: Vec<String>,
        /// One line per array task: pending tasks are not folded (squeue's -r).
        #[arg(long = "no-fold", short = 'r')]
        no_fold: bool,
    },
    /// Wait until jobs have ended: an array's id waits for all its tasks (`A_i`: that task).
    /// Prints how each ended; exits with the job's exit status (the highest of several; 128+N
    /// for a job killed by signal N, 1 for one that never ran), 124 on --timeout.
    Wait {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Give up after SECS seconds (at most a year; 0: look once).
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=crate::compat::wait::MAX_TIMEOUT_SECS))]
        timeout: Option<u64>,
    },
    /// Show one job in full.
    Show { id: String },
    /// Cancel jobs.
    Cancel {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Hold queued jobs.
    Hold {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Release held jobs.
    Release {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Change a pending job: walltime, cores, nodes, tasks, queue, name, dependency, and
    /// (admins) priority; checked as a submission. A running job's walltime may be lowered (raised by admins).
    Update(changes::UpdateArgs),
    /// Put running or ended batch jobs back in the queue, to run again from the start (a
    /// running one is killed first).
    Requeue {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Admins: suspend running jobs (frozen; their cores freed, their memory kept).
    Suspend {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Admins: resume suspended jobs (on other cores of their nodes if theirs are taken).
    Resume {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// List the cluster's licenses (`[licenses]`): how many exist, are held and are free.
    Licenses,
    /// List nodes: state, topology, free PUs, memory per NUMA node.
    Nodes {
        /// Draw each node: packages, NUMA nodes, cores, PUs and which job holds which.
        #[arg(long)]
        topology: bool,
        /// Line width of the drawing.
        #[arg(long, default_value_t = 100)]
        width: usize,
    },
    /// Admin a node: drain, resume, down (its jobs are requeued, failed or kept by policy;
    /// `down NODE REASON`), up (takes work again once clean), or set its system CPUs
    /// (`system-cpus NODE LIST`, "" for none).
    Node {
        #[arg(value_parser = ["drain", "resume", "down", "up", "system-cpus"])]
        action: String,
        name: String,
        value: Option<String>,
    },
    /// Admin a subnode NODE:INDEX: drain, offline, resume, or set its properties (comma list).
    Subnode {
        #[arg(value_parser = ["drain", "offline", "resume", "properties"])]
        action: String,
        /// NODE:INDEX, e.g. n1:0.
        target: String,
        value: Option<String>,
    },
    /// Accounting of finished jobs (sacct's filters and fields: --starttime, --endtime, --user,
    /// --name, --state, -j, --format), or with --steps the invocation log of `berth run`.
    Acct {
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Every `berth run`: time, host, pid, user, job, directory, command, exit, failure.
        #[arg(long)]
        steps: bool,
        #[command(flatten)]
        filter: compat::sacct::AcctArgs,
    },
    /// The event log: nodes up and down, job starts, ends and requeues, refused requests.
    Events(events::EventsArgs),
    /// Node failures on purpose: replay an event script, or generate a random one.
    Faults {
        #[command(subcommand)]
        command: faults::FaultsCommand,
    },
    /// Is the controller up, and can it write its state (a full disk, a locked database)?
    /// Exit status 2 while it cannot.
    Status,
    /// Fair share: each account's configured share, decayed usage and priority factor.
    Share,
    /// The queues: limits, defaults, priority, preemption class, and the jobs each holds.
    Queues,
    /// Reservations made by external schedulers through the reservations API (docs/reservations.md).
    Reservations {
        /// Also those released (the most recent 10,000).
        #[arg(long)]
        all: bool,
    },
    /// Advance reservations: resources set aside for a time window for some users or accounts
    /// (admins create and delete; jobs use one with `--reservation NAME`).
    Resv {
        #[command(subcommand)]
        command: advance::ResvCommand,
    },
    /// Run a parallel program: inside a job on its allocation, outside one interactively.
    Run(run::RunArgs),
    /// Wait in the queue for an allocation, then run CMD (default: your shell) here with it:
    /// `berth run` in CMD runs on its nodes (salloc). Released when CMD exits.
    Alloc(alloc::AllocArgs),
    /// Send a signal to a job's processes on every node, or to one step's ranks (JOB.STEP).
    Signal {
        /// JOB or JOB.STEP
        target: String,
        /// Name (USR1, SIGTERM) or number.
        signal: String,
    },
    /// Inside a job: node info, and tasks started on any node of the allocation (PBS TM).
    Task {
        #[command(subcommand)]
        command: task::TaskCommand,
    },
    /// Replay a job trace (SWF) through the scheduler on a virtual clock; needs no cluster.
    Sim(sim::SimArgs),
    /// Answer to Slurm's and PBS's command names: `compat install DIR` links sbatch, squeue,
    /// qsub, qstat and the others to berth in DIR (docs/compat.md, "Command names").
    Compat {
        #[command(subcommand)]
        command: compat::install::CompatCommand,
    },
    /// Run the controller (runs `berthd server`).
    Server(Passthrough),
    /// Run a node agent (runs `berthd agent`).
    Agent(Passthrough),
    /// Make a new cluster key (mode 0600) for `berth server --key-file` and `berth agent --key-file`.
    Keygen {
        /// Where to write it; refused if it exists.
        file: PathBuf,
    },
    /// Start a local cluster (controller + agents) in the background (runs `berthd up`).
    Up(Passthrough),
    /// Stop the local cluster and remove its cgroups (runs `berthd down`).
    Down(Passthrough),
    /// Bring a cluster up, run real jobs, show the results, take it down (runs `berthd demo`).
    Demo(Passthrough),
}

/// A command that `berthd` runs: its arguments go through untouched (`berthd CMD --help`).
#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct Passthrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

/// Where `berthd` is: beside this executable (an installation keeps both in one directory),
/// else on PATH.
pub fn sibling_binary(name: &str) -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::current_exe().ok().map(|e| e.with_file_name(name)).filter(|p| p.is_file()) {
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!("cannot find `{name}` beside this executable nor on PATH; install berth and berthd together")
    })
}

/// Replace this process with `berthd` given the same arguments (daemons keep their pid).
pub fn exec_berthd() -> anyhow::Result<i32> {
    use std::os::unix::process::CommandExt;
    let exe = sibling_binary("berthd")?;
    let err = std::process::Command::new(&exe).args(std::env::args_os().skip(1)).exec();
    Err(anyhow::anyhow!("cannot run {}: {err}", exe.display()))
}

/// What a process of berth is, for the shape of its runtime.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A client command: one thread, which starts fastest.
    Client,
    /// The controller: two worker threads parse and answer many clients at once (its state
    /// has its own thread).
    Controller,
    /// A node agent: one thread. Its work per event is small, and every thread it wakes
    /// competes with the user's ranks for the node's CPUs; handing a launch between worker
    /// threads cost `berth run -n 2 true` ~0.3-0.5 ms of its ~4 ms on a 2-CPU node
    /// (BENCHMARKS.md, issue 4). Slow work (cgroup freeze, kill, files) goes to blocking threads.
    Agent,
}

/// Run `body` on a tokio runtime shaped for `role`, print its error (JSON with --json), and exit.
pub fn run_to_exit<F>(json: bool, role: Role, body: F) -> !
where
    F: std::future::Future<Output = anyhow::Result<i32>>,
{
    let daemon = role != Role::Client;
    let built = if role == Role::Controller {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    };
    berth_protocol::probe::mark("client runtime built");
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("berth: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async move {
        match body.await {
            Ok(code) => code,
            Err(e) => {
                if json {
                    let v = serde_json::json!({"error": {"code": error_code(&e), "message": format!("{e:#}")}});
                    println!("{v}");
                } else {
                    eprintln!("berth: {}", output::terminal_safe(&format!("{e:#}")));
                }
                1
            }
        }
    });
    if daemon {
        rt.shutdown_timeout(std::time::Duration::from_millis(100));
    } else {
        // Nothing of a client command is left to finish; a thread blocked reading stdin (`berth
        // run` from a terminal or an open pipe) would hold a timed shutdown for its whole wait.
        rt.shutdown_background();
    }
    berth_protocol::probe::mark("client exit");
    std::process::exit(code);
}

fn error_code(e: &anyhow::Error) -> &'static str {
    match e.downcast_ref::<berth_protocol::client::ApiError>() {
        Some(api) => api.code.as_str(),
        None => berth_protocol::ErrorCode::Client.as_str(),
    }
}

/// A client piped into `head` should end quietly, like other Unix tools.
pub fn default_sigpipe() {
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

#[cfg(test)]
mod tests {
    /// clap checks a command tree only when it is parsed, and only in debug builds: a flag
    /// name used twice (a global flag and a subcommand's own) panics the client at run time.
    #[test]
    fn the_command_line_definitions_are_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
        crate::run::RunCli::command().debug_assert();
    }
}
