//! `berth run`'s command line (`parse_line`). A plain one is parsed without clap: `run` is
//! started once per launch, and clap's parser (its code paged in, its command built) costs
//! each ~0.1 ms of the ~5 ms small launch (BENCHMARKS.md, issue 4). Only the plain forms are
//! taken without clap:
//! `--flag value` and bare switches, each at most once, before the program. Anything else
//! (`--flag=value`, `-n4`, `--`, help, version, a repeated or unknown flag, a value that
//! does not parse) is left to clap, so errors and help read as they always did; a test
//! checks that every line parsed here gives what clap gives.

use crate::run::{RunArgs, RunCli};

/// Parse, or print the error or help (as `berth run`) and exit, as clap's `parse_from`.
/// The usual short lines take [`parse_plain`] (clap's parser costs every launch ~0.1 ms);
/// anything else, errors and help included, is clap's.
pub fn parse_line(line: Vec<String>) -> RunCli {
    use clap::{CommandFactory, FromArgMatches};
    if let Some(cli) = parse_plain(&line) {
        return cli;
    }
    let matches = RunCli::command().bin_name("berth run").get_matches_from(line);
    RunCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The `RunCli` of a plain line (`line[0]` is the program name), or None for clap.
pub fn parse_plain(line: &[String]) -> Option<RunCli> {
    let mut cli = RunCli {
        dir: None,
        json: false,
        args: RunArgs { binding: "linear".into(), fanout: "8".into(), ..Default::default() },
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 1;
    while i < line.len() {
        let flag = line[i].as_str();
        if !flag.starts_with('-') {
            cli.args.command = line[i..].to_vec();
            return Some(cli);
        }
        if seen.contains(&flag) {
            return None;
        }
        seen.push(flag);
        let a = &mut cli.args;
        let switch = match flag {
            "--json" => &mut cli.json,
            "--rank-cpusets" => &mut a.rank_cpusets,
            "-l" | "--label" => &mut a.label,
            "--no-kill" => &mut a.no_kill,
            "--overcommit" => &mut a.overcommit,
            "--timing" => &mut a.timing,
            _ => {
                // A flag with a value: the next word, which must not look like a flag.
                let value = line.get(i + 1).filter(|v| !v.starts_with('-'))?.clone();
                let number = || value.parse::<u32>().ok();
                match flag {
                    "--dir" => cli.dir = Some(value.clone().into()),
                    "-n" | "--ntasks" => a.ntasks = Some(number()?),
                    "-N" | "--nodes" => a.nodes = Some(number()?),
                    "--ntasks-per-node" | "--tasks-per-node" => a.tasks_per_node = Some(number()?),
                    "-d" | "--cpus-per-task" => a.cpus_per_task = Some(number()?),
                    "--binding" => a.binding = value,
                    "--notify-signal" => a.notify_signal = Some(value),
                    "--fanout" => a.fanout = value,
                    "--job" => a.job = Some(value),
                    "--walltime" => a.walltime = Some(value),
                    "--mpi" => a.mpi = Some(value),
                    _ => return None,
                }
                i += 2;
                continue;
            }
        };
        *switch = true;
        i += 1;
    }
    None // no program: clap says so
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn every_plain_line_parses_as_clap_parses_it() {
        let plain = [
            "berth true",
            "berth -n 2 true",
            "berth --dir /tmp/c -n 2 true",
            "berth --dir /tmp/c --json -n 2 -N 1 -d 2 --label --no-kill ./a.out -n 5 --label",
            "berth --ntasks 4 --tasks-per-node 2 --cpus-per-task 1 --binding striding --rank-cpusets prog",
            "berth -n 8 -N 2 --ntasks-per-node 4 --label ./a.out",
            "berth -l --overcommit --timing --fanout flat --job 12 --nodes 3 --walltime 10m prog x",
            "berth --no-kill --notify-signal USR1 --fanout 2 sh -c x",
            "berth -n 0 prog",
            "berth --mpi pmix -n 2 ./a.out",
        ];
        for line in plain {
            let parsed = parse_plain(&v(line)).unwrap_or_else(|| panic!("not taken as plain: {line}"));
            let clap = RunCli::try_parse_from(v(line)).unwrap();
            assert_eq!(parsed, clap, "{line}");
        }
    }

    #[test]
    fn anything_else_is_left_to_clap() {
        for line in [
            "berth",
            "berth -n 2",
            "berth --help",
            "berth -h",
            "berth --version",
            "berth -n2 true",
            "berth --ntasks=2 true",
            "berth -- true",
            "berth -n 2 -n 3 true",
            "berth -n x true",
            "berth -n -1 true",
            "berth --nodes true",
            "berth --bogus true",
            "berth -ln 2 true",
        ] {
            assert_eq!(parse_plain(&v(line)), None, "{line}");
        }
    }
}
