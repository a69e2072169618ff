//! `berth`: the user commands (the client). Daemons and local-cluster helpers are `berthd`;
//! `berth server|agent|up|down|demo` run it with the same arguments.

use berth_cli::{commands, run, Cli};
use clap::Parser;

fn main() {
    // The batch script's shim, which the agent starts from this smaller binary when it is
    // installed beside berthd (the berth-shim crate): nothing else first.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == berth_shim::SHIM_ARG) {
        berth_shim::main(&args.collect::<Vec<_>>());
    }
    berth_protocol::probe::mark("client main");
    // Invoked as berth-rsh (`berth task rsh`, an MPI launcher's ssh).
    if let Some(code) = berth_cli::task::main_as_rsh(&std::env::args_os().collect::<Vec<_>>()) {
        std::process::exit(code);
    }
    // Invoked as sbatch, squeue, qsub, ... (links `berth compat install` makes).
    if let Some(code) = berth_cli::compat::main_by_name(std::env::args_os().collect()) {
        std::process::exit(code);
    }
    let args = run::rewrite_np(std::env::args().collect());
    if let Some(line) = run::run_command_line(&args) {
        let cli = berth_cli::run_line::parse_line(line);
        berth_protocol::probe::mark("client parsed");
        berth_cli::default_sigpipe();
        let dir = berth_cli::client::cluster_dir(cli.dir);
        berth_cli::run_to_exit(cli.json, berth_cli::Role::Client, run::run(&dir, cli.json, cli.args));
    }
    let cli = Cli::parse_from(args);
    if let Some(secs) = cli.timeout {
        berth_cli::client::set_wait_secs(secs);
    }
    berth_cli::default_sigpipe();
    let json = cli.json;
    berth_cli::run_to_exit(json, berth_cli::Role::Client, commands::dispatch(cli.dir, cli.json, cli.command));
}
