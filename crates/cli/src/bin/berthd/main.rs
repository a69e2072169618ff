//! `berthd`: the daemons (`berthd server`, `berthd agent`), the local-cluster helpers
//! (`berthd up`, `down`, `demo`) and the batch script's shim. Users reach it through `berth`,
//! whose `server|agent|up|down|demo` run this binary with the same arguments.

mod cluster;
mod demo;
mod netns;

use berth_cli::client::cluster_dir;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "berthd",
    version,
    about = "berthd: berth's controller, node agent and local cluster",
    propagate_version = true
)]
struct Cli {
    /// Cluster directory; default $BERTH_DIR or ./.berth.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller.
    Server(cluster::ServerArgs),
    /// Run a node agent.
    Agent(cluster::AgentArgs),
    /// Start a local cluster (controller + agents) in the background.
    Up {
        #[arg(long)]
        agents: Option<usize>,
        /// hwloc synthetic string, `xml:FILE`, or `real`.
        #[arg(long)]
        topology: Option<String>,
        /// Put each agent in its own network namespace on a bridge (root; for multi-host tests).
        #[arg(long)]
        netns: bool,
        /// Emulate N GPUs on each NUMA node of every agent (not with --topology real).
        #[arg(long, value_name = "N")]
        gpus_per_numa: Option<u32>,
        /// The agents' GPU device files are in DIR (`DIR/nvidia0`, ...: stand-ins made with
        /// mknod for emulated GPUs); jobs' devices cgroups deny the GPUs they do not hold.
        #[arg(long, value_name = "DIR")]
        gpu_device_dir: Option<std::path::PathBuf>,
    },
    /// Stop the local cluster and remove its cgroups.
    Down,
    /// Bring a cluster up, run real jobs, show the results, take it down.
    Demo {
        /// Leave the cluster running afterwards.
        #[arg(long)]
        keep: bool,
    },
}

fn main() {
    // The batch script's shim (started by the agent in the job's cgroup, as the user): no
    // argument parsing, logging or runtime.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == berth_shim::SHIM_ARG) {
        berth_shim::main(&args.collect::<Vec<_>>());
    }
    let cli = Cli::parse();
    // `up`, `down` and the demo poll the controller themselves (and start it): a request
    // fails at once rather than waiting for a restart as users' commands do.
    berth_cli::client::set_wait_secs(0);
    let role = match cli.command {
        Command::Server(_) => berth_cli::Role::Controller,
        Command::Agent(_) => berth_cli::Role::Agent,
        _ => berth_cli::Role::Client,
    };
    let daemon = role != berth_cli::Role::Client;
    if role == berth_cli::Role::Agent && std::env::var_os("HWLOC_PLUGINS_BLACKLIST").is_none() {
        // hwloc loads every plugin it finds when it reads the topology; its libxml2 XML reader
        // brings libstdc++, which stays mapped for the agent's life (~0.85 MB of its ~11 MB
        // idle RSS). hwloc's own XML reader serves `xml:FILE` topologies as well. Set before
        // any thread starts; jobs get only their own environment (job.rs, `env_clear`).
        std::env::set_var("HWLOC_PLUGINS_BLACKLIST", "hwloc_xml_libxml");
    }
    // The PMIx server's job data in libpmix's hash store, not its per-namespace shared-memory
    // files (berth_agent::step::pmix::GDS_VAR says why). Before any thread starts, as above.
    let (gds, store) = berth_agent::step::pmix::GDS_VAR;
    if role == berth_cli::Role::Agent && std::env::var_os(gds).is_none() {
        std::env::set_var(gds, store);
    }
    if daemon {
        let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    } else {
        berth_cli::default_sigpipe();
    }
    let json = cli.json;
    let dir = cluster_dir(cli.dir);
    berth_cli::run_to_exit(json, role, async move {
        match cli.command {
            Command::Server(args) => cluster::server(&dir, args).await,
            Command::Agent(args) => cluster::agent(args).await,
            Command::Up { agents, topology, netns, gpus_per_numa, gpu_device_dir } => {
                cluster::up_with_gpus(&dir, json, agents, topology, netns, gpus_per_numa, gpu_device_dir).await
            }
            Command::Down => cluster::down(&dir, json).await,
            Command::Demo { keep } => demo::run(json, keep).await,
        }
    });
}
