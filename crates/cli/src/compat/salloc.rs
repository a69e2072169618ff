//! `salloc`: `berth alloc` with Slurm's spellings and messages (docs/compat.md, "Command
//! names"). Its resource options are sbatch's, read as `#SBATCH` lines are (`-N -n -c -t -p
//! -J --mem -A -d --exclusive ...`, see `slurm::sbatch_plan`); its own are `--no-shell`,
//! `-Q/--quiet`, and the command after the options (or after `--`). It prints salloc's lines
//! on standard error: `salloc: Granted job allocation N`, `salloc: Relinquishing job
//! allocation N`.

use super::format::{self as f, long, Arg, Opt};
use crate::alloc::{run_alloc, AllocPlan, Voice};
use anyhow::Result;
use std::path::Path;

/// What a salloc command line asks for.
#[derive(Debug)]
pub struct SallocPlan {
    pub sbatch: super::slurm::SbatchPlan,
    pub no_shell: bool,
    pub command: Vec<String>,
}

const SALLOC_USAGE: &str = "Usage: salloc [OPTIONS...] [command [args...]]
berth's salloc supports sbatch's resource options (-N -n -c -t -p -J --mem --mem-per-cpu -A
  -d --exclusive -q/--qos --reservation ...), --no-shell and -Q/--quiet; the command runs
  here with the allocation (default: your shell). docs/compat.md lists what is supported.
";

/// Read a salloc command line (pure).
pub fn salloc_plan(args: &[String]) -> Result<SallocPlan, String> {
    // Where the options end: the first operand, or `--`.
    let mut table: Vec<Opt> = super::slurm::SBATCH_OPTS.to_vec();
    table.push(long("no-shell", Arg::No));
    let p = f::getopt(args, &table, true)?;
    let mut end = args.len() - p.operands.len();
    let dashes = end > 0 && args[end - 1] == "--" && !p.options.iter().any(|(_, v)| v.as_deref() == Some("--"));
    if dashes {
        end -= 1;
    }
    let no_shell = p.has("--no-shell");
    if p.has("--help") || p.has("--usage") {
        let sbatch = super::slurm::SbatchPlan { info: Some(SALLOC_USAGE.into()), ..Default::default() };
        return Ok(SallocPlan { sbatch, no_shell, command: vec![] });
    }
    let opts: Vec<String> =
        args[..end].iter().filter(|a| !(a.len() > 5 && "--no-shell".starts_with(a.as_str()))).cloned().collect();
    let sbatch = super::slurm::sbatch_plan(&opts)?;
    for (given, what) in [
        (sbatch.wrap.is_some(), "--wrap"),
        (sbatch.wait, "-W/--wait"),
        (sbatch.parsable, "--parsable"),
        (sbatch.hold, "-H/--hold"),
        (sbatch.flags.output.is_some(), "-o/--output"),
        (sbatch.flags.error.is_some(), "-e/--error"),
        (sbatch.flags.array.is_some() || sbatch.options.array.is_some(), "-a/--array"),
    ] {
        if given {
            return Err(format!("{what} is an sbatch option, not salloc's"));
        }
    }
    Ok(SallocPlan { sbatch, no_shell, command: p.operands })
}

/// salloc: wait for an allocation, run the command in it, release it.
pub async fn salloc(dir: &Path, args: Vec<String>) -> Result<i32> {
    let plan = match salloc_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("salloc: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    let mut sbatch = plan.sbatch;
    if let Some(info) = &sbatch.info {
        print!("{info}");
        return Ok(0);
    }
    for w in &sbatch.warnings {
        eprintln!("salloc: warning: {}: ignored", crate::output::terminal_safe(w));
    }
    if let Some(d) = &sbatch.chdir {
        std::env::set_current_dir(d).map_err(|e| anyhow::anyhow!("chdir({d}): {e}"))?;
    }
    let mut submit = crate::alloc::alloc_submission(&sbatch.flags, &plan.command)?;
    submit.options = submit.options.overlay(std::mem::take(&mut sbatch.options));
    for (k, v) in &sbatch.export {
        submit.env.retain(|(key, _)| key != k);
        submit.env.push((k.clone(), v.clone()));
    }
    let plan = AllocPlan {
        submit,
        no_shell: plan.no_shell,
        quiet: sbatch.quiet,
        json: false,
        command: plan.command,
        voice: Voice::Salloc,
    };
    run_alloc(dir, plan).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_then_the_command() {
        let p = salloc_plan(&v("-N 2 -n 4 -t 10 -J x --no-shell")).unwrap();
        assert!(p.no_shell && p.command.is_empty());
        assert_eq!((p.sbatch.options.nodes, p.sbatch.options.tasks_per_node), (Some(2), Some(2)));
        assert_eq!(p.sbatch.options.walltime, Some(600));
        assert_eq!(p.sbatch.flags.name.as_deref(), Some("x"));
        let p = salloc_plan(&v("-n 1 -- sh -c -N")).unwrap();
        assert_eq!(p.command, v("sh -c -N"));
        assert_eq!(p.sbatch.options.cores, Some(1));
        let p = salloc_plan(&v("-c 2 -p batch srun -n 2 hostname")).unwrap();
        assert_eq!(p.command, v("srun -n 2 hostname"));
        assert_eq!(p.sbatch.flags.queue.as_deref(), Some("batch"));
        assert!(!p.no_shell);
        let p = salloc_plan(&v("-Q --mem 1G")).unwrap();
        assert!(p.sbatch.quiet);
        assert!(salloc_plan(&v("--wrap true")).unwrap_err().contains("--wrap"));
        assert!(salloc_plan(&v("-o out")).unwrap_err().contains("--output"));
        assert!(salloc_plan(&v("--bogus")).is_err());
        assert!(salloc_plan(&v("--help")).unwrap().sbatch.info.is_some());
    }
}
