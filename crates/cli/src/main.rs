//! `berth`: the user commands (the client). Daemons and local-cluster helpers are `berthd`;
//! `berth server|agent|up|down|demo` run it with the same arguments.

use berth_cli::{commands, run, Cli};
use clap::Parser;

fn main() {
    let cli = Cli::parse_from(run::rewrite_np(std::env::args().collect()));
    berth_cli::default_sigpipe();
    let json = cli.json;
    berth_cli::run_to_exit(json, false, commands::dispatch(cli.dir, cli.json, cli.command));
}
