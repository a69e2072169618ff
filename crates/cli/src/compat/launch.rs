//! The launchers: `srun` (Slurm) and `aprun` (Cray ALPS, seeds/002) are `berth run` with
//! their spellings. Inside a job (`BERTH_JOB_ID` set, or srun's `--jobid`) a run is a step
//! of the job on its allocation; outside one, an interactive allocation, as `berth run`'s.
//! Each option is translated into `berth run`'s (docs/compat.md, "Command names"); one that
//! berth cannot honour is refused naming it, never dropped (`--ignore-unsupported`, berth's
//! own, makes that a warning).

use super::format::{self as f, both, long, Arg, Opt};
use crate::run::RunArgs;
use anyhow::Result;
use std::path::Path;

/// Where a standard stream of the launcher goes (srun's `-i`, `-o`, `-e`): the ranks'
/// streams are relayed through the launcher's own, so redirecting these redirects theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `none`: /dev/null.
    Null,
    File(String),
}

/// A launcher command line translated.
#[derive(Debug, Default, PartialEq)]
pub struct LaunchPlan {
    pub args: RunArgs,
    pub stdin: Option<Redirect>,
    pub stdout: Option<Redirect>,
    pub stderr: Option<Redirect>,
    pub chdir: Option<String>,
    /// Variables set for the ranks (`--export=ALL,VAR=value`, aprun's `-e VAR=value`).
    pub env: Vec<(String, String)>,
    /// Options not honoured, when `--ignore-unsupported` lets the run go without them; and
    /// notes (srun's `-t` inside a job).
    pub warnings: Vec<String>,
    pub quiet: bool,
    /// `--help`, `--version`, `--mpi=list`: print this and exit 0.
    pub info: Option<String>,
}

/// The job a run would be a step of: `--jobid`/`--job`, else `$BERTH_JOB_ID`.
fn in_job(args: &RunArgs) -> bool {
    args.job.is_some() || std::env::var("BERTH_JOB_ID").is_ok_and(|s| !s.is_empty())
}

fn refuse(plan: &mut LaunchPlan, ignore: bool, what: String) -> Result<(), String> {
    if ignore {
        plan.warnings.push(format!("{what}: ignored"));
        Ok(())
    } else {
        Err(format!("{what}; --ignore-unsupported runs without it"))
    }
}

fn count(key: &str, v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{key}: expected a positive number, got {v:?}"))
}

// ---------------------------------------------------------------------------------------
// srun

/// srun's options (Slurm 23.11's), so that one berth lacks is named as unsupported rather
/// than unknown.
const SRUN_OPTS: &[Opt] = &[
    both('A', "account", Arg::Required),
    long("acctg-freq", Arg::Required),
    long("bb", Arg::Required),
    long("bbf", Arg::Required),
    both('b', "begin", Arg::Required),
    long("bcast", Arg::Optional),
    long("bcast-exclude", Arg::Required),
    both('D', "chdir", Arg::Required),
    long("cluster-constraint", Arg::Required),
    both('M', "clusters", Arg::Required),
    long("comment", Arg::Required),
    long("compress", Arg::Optional),
    both('C', "constraint", Arg::Required),
    long("container", Arg::Required),
    long("contiguous", Arg::No),
    both('S', "core-spec", Arg::Required),
    long("cores-per-socket", Arg::Required),
    long("cpu-bind", Arg::Required),
    long("cpu_bind", Arg::Required),
    long("cpu-freq", Arg::Required),
    long("cpus-per-gpu", Arg::Required),
    both('c', "cpus-per-task", Arg::Required),
    long("deadline", Arg::Required),
    long("delay-boot", Arg::Required),
    both('d', "dependency", Arg::Required),
    both('X', "disable-status", Arg::No),
    both('m', "distribution", Arg::Required),
    long("epilog", Arg::Required),
    both('e', "error", Arg::Required),
    long("exact", Arg::No),
    both('x', "exclude", Arg::Required),
    long("exclusive", Arg::Optional),
    long("export", Arg::Required),
    long("external-launcher", Arg::No),
    both('B', "extra-node-info", Arg::Required),
    long("gid", Arg::Required),
    long("gpu-bind", Arg::Required),
    long("gpu-freq", Arg::Required),
    both('G', "gpus", Arg::Required),
    long("gpus-per-node", Arg::Required),
    long("gpus-per-socket", Arg::Required),
    long("gpus-per-task", Arg::Required),
    long("gres", Arg::Required),
    long("gres-flags", Arg::Required),
    both('h', "help", Arg::No),
    long("het-group", Arg::Required),
    long("hint", Arg::Required),
    both('H', "hold", Arg::No),
    both('I', "immediate", Arg::Optional),
    both('i', "input", Arg::Required),
    both('J', "job-name", Arg::Required),
    long("jobid", Arg::Required),
    both('K', "kill-on-bad-exit", Arg::Optional),
    both('l', "label", Arg::No),
    both('L', "licenses", Arg::Required),
    long("mail-type", Arg::Required),
    long("mail-user", Arg::Required),
    long("mcs-label", Arg::Required),
    long("mem", Arg::Required),
    long("mem-bind", Arg::Required),
    long("mem-per-cpu", Arg::Required),
    long("mem-per-gpu", Arg::Required),
    long("mincpus", Arg::Required),
    long("mpi", Arg::Required),
    long("multi-prog", Arg::No),
    long("network", Arg::Required),
    long("nice", Arg::Optional),
    both('Z', "no-allocate", Arg::No),
    both('k', "no-kill", Arg::Optional),
    both('F', "nodefile", Arg::Required),
    both('w', "nodelist", Arg::Required),
    both('N', "nodes", Arg::Required),
    both('n', "ntasks", Arg::Required),
    long("ntasks-per-core", Arg::Required),
    long("ntasks-per-gpu", Arg::Required),
    long("ntasks-per-node", Arg::Required),
    long("ntasks-per-socket", Arg::Required),
    long("open-mode", Arg::Required),
    both('o', "output", Arg::Required),
    both('O', "overcommit", Arg::No),
    long("overlap", Arg::No),
    both('s', "oversubscribe", Arg::No),
    both('p', "partition", Arg::Required),
    long("power", Arg::Required),
    long("prefer", Arg::Required),
    both('E', "preserve-env", Arg::No),
    long("priority", Arg::Required),
    long("profile", Arg::Required),
    long("prolog", Arg::Required),
    long("propagate", Arg::Optional),
    long("pty", Arg::No),
    both('q', "qos", Arg::Required),
    both('Q', "quiet", Arg::No),
    long("quit-on-interrupt", Arg::No),
    long("reboot", Arg::No),
    both('r', "relative", Arg::Required),
    long("reservation", Arg::Required),
    long("resv-ports", Arg::Optional),
    long("send-libs", Arg::Optional),
    long("signal", Arg::Required),
    long("slurmd-debug", Arg::Required),
    long("sockets-per-node", Arg::Required),
    long("spread-job", Arg::No),
    long("switches", Arg::Required),
    long("task-epilog", Arg::Required),
    long("task-prolog", Arg::Required),
    long("test-only", Arg::No),
    long("thread-spec", Arg::Required),
    long("threads-per-core", Arg::Required),
    both('T', "threads", Arg::Required),
    both('t', "time", Arg::Required),
    long("time-min", Arg::Required),
    long("tmp", Arg::Required),
    long("tres-bind", Arg::Required),
    long("tres-per-task", Arg::Required),
    long("uid", Arg::Required),
    both('u', "unbuffered", Arg::No),
    long("usage", Arg::No),
    long("use-min-nodes", Arg::No),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
    both('W', "wait", Arg::Required),
    long("wckey", Arg::Required),
    long("x11", Arg::Optional),
    // berth's own: run although some options are not supported.
    long("ignore-unsupported", Arg::No),
];

const SRUN_USAGE: &str = "Usage: srun [OPTIONS(0)...] executable [args...]
berth's srun is `berth run`: a step of the job in BERTH_JOB_ID (or --jobid), else an
interactive allocation. It supports: -n/--ntasks -N/--nodes --ntasks-per-node
  -c/--cpus-per-task -l/--label -O/--overcommit -K/--kill-on-bad-exit -k/--no-kill
  --mpi=none|pmi2|pmi1|pmi|pmix|auto --cpu-bind=none|cores|threads|rank[,quiet|verbose]
  -m/--distribution=block[:block|cyclic] -i/--input=none|0|FILE -o/--output=none|FILE
  -e/--error=none|FILE -t/--time -D/--chdir --jobid --export=ALL[,VAR=value]
  -w/--nodelist (the job's first nodes only) --exclusive -u -Q -v --multi-prog FILE
  --gpus-per-task --gpu-bind; outside a job: -G/--gpus --gpus-per-node --gpus-per-socket
  --sockets-per-node --gres -L/--licenses
  --ignore-unsupported (berth: run without options berth does not support)
Other Slurm options are refused by name; docs/compat.md lists what is supported.
";

/// Read an srun command line (pure but for reading `BERTH_JOB_ID`, `BERTH_NODES` and
/// `SLURM_MPI_TYPE`).
pub fn srun_plan(argv: &[String]) -> Result<LaunchPlan, String> {
    let p = f::getopt(argv, SRUN_OPTS, true)?;
    let mut plan = LaunchPlan::default();
    let ignore = p.has("--ignore-unsupported");
    plan.args.binding = "linear".into();
    plan.args.fanout = "8".into();
    let mut bind_given = false;
    let mut multi_prog = false;
    let mut nodelist: Option<String> = None;
    let mut time: Option<String> = None;
    let mut mpi: Option<String> = std::env::var("SLURM_MPI_TYPE").ok().filter(|s| !s.is_empty());
    // -i/-o/-e FILE, read once the step's shape is known (their patterns depend on it).
    let mut streams: [Option<(String, String)>; 3] = [None, None, None];
    // GPUs, generic resources and licenses: an interactive allocation's (outside a job).
    let mut resources: Vec<(String, String)> = Vec::new();
    for (key, value) in &p.options {
        let v = value.clone().unwrap_or_default();
        let shown = match value {
            Some(v) => format!("{key}={v}"),
            None => key.clone(),
        };
        let a = &mut plan.args;
        match key.as_str() {
            "--ntasks" => a.ntasks = Some(count(key, &v)?),
            "--nodes" => {
                // min[-max]: berth runs on exactly the minimum, as sbatch -N.
                let min = v.split('-').next().unwrap_or("");
                a.nodes = Some(count(key, min).map_err(|_| format!("{key}: expected N or MIN-MAX, got {v:?}"))?);
            }
            "--ntasks-per-node" => a.tasks_per_node = Some(count(key, &v)?),
            "--cpus-per-task" => a.cpus_per_task = Some(count(key, &v)?),
            // [TYPE:]N: the type is the job's to choose (its GPUs are of it already).
            "--gpus-per-task" => a.gpus_per_task = Some(count(key, v.rsplit(':').next().unwrap_or(""))?),
            "--gpu-bind" => match berth_core::gpu::GpuBind::parse(v.trim_start_matches("verbose,")) {
                Ok(b) => a.gpu_bind = Some(b.to_string()),
                Err(why) => refuse(&mut plan, ignore, format!("{shown}: {why}"))?,
            },
            "--gpus" | "--gpus-per-node" | "--gpus-per-socket" | "--sockets-per-node" | "--gres" | "--licenses" => {
                resources.push((key.clone(), v))
            }
            "--label" => a.label = true,
            "--overcommit" => a.overcommit = true,
            "--jobid" => {
                let id = v.split('.').next().unwrap_or("").trim();
                if id.parse::<u64>().is_err() {
                    return Err(format!("--jobid: {v:?} is not a job id"));
                }
                a.job = Some(id.to_string());
            }
            "--no-kill" => match value.as_deref() {
                None | Some("on") => a.no_kill = true,
                Some("off") => a.no_kill = false,
                Some(other) => return Err(format!("--no-kill takes on or off, got {other:?}")),
            },
            // berth's default kills the step on the first failure: -K 1. -K 0 lets the
            // others go on, berth's --no-kill.
            "--kill-on-bad-exit" => match value.as_deref() {
                None | Some("1") => a.no_kill = false,
                Some("0") => a.no_kill = true,
                Some(other) => return Err(format!("--kill-on-bad-exit takes 0 or 1, got {other:?}")),
            },
            "--mpi" => mpi = Some(v),
            "--cpu-bind" | "--cpu_bind" => {
                bind_given = true;
                match cpu_bind(&v) {
                    Ok(Some(b)) => a.binding = b.into(),
                    Ok(None) => {}
                    Err(why) => refuse(&mut plan, ignore, format!("{shown}: {why}"))?,
                }
            }
            "--distribution" => match distribution(&v) {
                Ok(Some(b)) if !bind_given || a.binding != "none" => a.binding = b.into(),
                Ok(_) => {}
                Err(why) => refuse(&mut plan, ignore, format!("{shown}: {why}"))?,
            },
            "--input" => match v.as_str() {
                "none" => plan.stdin = Some(Redirect::Null),
                "0" => plan.stdin = None,
                "all" => refuse(
                    &mut plan,
                    ignore,
                    format!("{shown}: berth sends standard input to rank 0 only (--input=0)"),
                )?,
                _ => streams[0] = Some((key.clone(), v)),
            },
            "--output" => streams[1] = Some((key.clone(), v)),
            "--error" => streams[2] = Some((key.clone(), v)),
            "--time" => time = Some(v),
            "--chdir" => plan.chdir = Some(v.trim().to_string()).filter(|d| !d.is_empty()),
            "--export" => {
                let mut items = v.split(',');
                if items.next().map(str::trim) != Some("ALL") {
                    refuse(
                        &mut plan,
                        ignore,
                        format!("{shown}: only ALL (optionally ALL,VAR=value,...) is supported: ranks get srun's environment"),
                    )?;
                }
                for item in items {
                    match item.split_once('=') {
                        Some((k, val)) if !k.is_empty() => plan.env.push((k.to_string(), val.to_string())),
                        _ => refuse(&mut plan, ignore, format!("--export=...,{item}: give VAR=value after ALL"))?,
                    }
                }
            }
            "--nodelist" => nodelist = Some(v),
            // The first operand is the file (docs/launcher.md, "Several programs in one step").
            "--multi-prog" => multi_prog = true,
            // Steps never share cores in berth (Slurm's --exclusive for steps); output is
            // relayed as it comes; srun's own messages are few.
            "--exclusive" | "--unbuffered" | "--verbose" | "--ignore-unsupported" => {}
            "--quiet" => plan.quiet = true,
            "--help" | "--usage" => plan.info = Some(SRUN_USAGE.to_string()),
            "--version" => {
                plan.info =
                    Some(format!("slurm {} (berth {})\n", super::slurm::SLURM_VERSION, env!("CARGO_PKG_VERSION")))
            }
            _ => refuse(&mut plan, ignore, format!("{shown} is not supported by berth's srun"))?,
        }
    }
    if let Some(m) = &mpi {
        match m.as_str() {
            // berth serves PMI-1 and PMI-2 on every rank's PMI_FD, and PMIx (docs/launcher.md,
            // "PMI", "PMIx").
            "list" => {
                plan.info = Some("MPI plugin types are...\n\tnone\n\tpmi2\n\tpmi1\n\tpmix\n\tauto\n".into());
            }
            other => match berth_core::step::MpiKind::parse(other) {
                Some(_) => plan.args.mpi = Some(other.to_string()),
                None => refuse(
                    &mut plan,
                    ignore,
                    format!("--mpi={other}: berth serves {}, not {other}", berth_core::step::MPI_KINDS),
                )?,
            },
        }
    }
    if plan.info.is_some() {
        return Ok(plan);
    }
    plan.args.command = p.operands;
    if plan.args.command.is_empty() {
        return Err("No command given to execute.".into());
    }
    if multi_prog {
        let file = plan.args.command.remove(0);
        if !plan.args.command.is_empty() {
            return Err(format!(
                "--multi-prog {file}: the programs come from the file; give nothing after it (not {:?})",
                plan.args.command.join(" ")
            ));
        }
        plan.args.multi_prog = Some(file);
    }
    // MPICH's hydra starts one hydra_pmi_proxy per node through srun; the proxy forks the
    // ranks, which would inherit a binding to the proxy's one core.
    let first = plan.args.command.first().map(String::as_str).unwrap_or("");
    let program = Path::new(first).file_name().and_then(|n| n.to_str()).unwrap_or("");
    if program == "hydra_pmi_proxy" && !bind_given {
        plan.args.binding = "none".into();
    }
    if let (Some(n), Some(k), None) = (plan.args.ntasks, plan.args.tasks_per_node, plan.args.nodes) {
        plan.args.nodes = Some(n.div_ceil(k));
    }
    let names = StepNames::from_env(&plan.args);
    for (slot, stream) in streams.into_iter().enumerate() {
        if let Some((key, v)) = stream {
            let r = Some(stream_file(&key, &v, &names)?);
            match slot {
                0 => plan.stdin = r,
                1 => plan.stdout = r,
                _ => plan.stderr = r,
            }
        }
    }
    if !resources.is_empty() {
        srun_resources(&mut plan, ignore, resources)?;
    }
    if let Some(t) = time {
        let secs = slurm_time(&t)?;
        if in_job(&plan.args) {
            plan.warnings.push(format!("--time={t}: a step ends with its job; only the job's time limit applies"));
        } else {
            plan.args.walltime = Some(secs.to_string());
        }
    }
    if let Some(list) = nodelist {
        // The job's nodes in its order (the first runs the script), as its processes see them.
        let own = std::env::var("BERTH_JOB_ID").ok();
        let job: Vec<String> = std::env::var("BERTH_NODES")
            .ok()
            .filter(|_| plan.args.job.is_none() || plan.args.job == own)
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        match nodes_for(&list, plan.args.nodes, in_job(&plan.args), &job) {
            Ok(names) => {
                plan.args.nodes = Some(names.len() as u32);
                plan.args.nodelist = names;
            }
            Err(why) => refuse(&mut plan, ignore, format!("--nodelist={list}: {why}"))?,
        }
    }
    Ok(plan)
}

/// srun's `--gres`, `-G/--gpus`, `--gpus-per-node`, `--gpus-per-socket`, `--sockets-per-node`
/// and `-L/--licenses`: outside a job, what the interactive allocation holds (`berth run`'s
/// options of those names; a GPU count's `TYPE:` prefix is `--gpu-type`). Inside one a step
/// runs on its job's GPUs, generic resources and licenses: refused naming the option
/// (`--ignore-unsupported`: a warning), never dropped silently.
fn srun_resources(plan: &mut LaunchPlan, ignore: bool, resources: Vec<(String, String)>) -> Result<(), String> {
    if in_job(&plan.args) {
        for (key, v) in resources {
            refuse(
                plan,
                ignore,
                format!(
                    "{key}={v}: a step runs on its job's GPUs, generic resources and licenses (ask for them in the job's #SBATCH lines); --gpus-per-task gives each rank its own of the job's"
                ),
            )?;
        }
        return Ok(());
    }
    let a = &mut plan.args;
    for (key, v) in resources {
        // A GPU count is [TYPE:]N, as Slurm's.
        let (kind, count) = match key.as_str() {
            "--gpus" | "--gpus-per-node" | "--gpus-per-socket" => match v.rsplit_once(':') {
                Some((kind, n)) => (Some(kind.to_string()), n.to_string()),
                None => (None, v),
            },
            _ => (None, v),
        };
        if kind.is_some() {
            a.gpu_type = kind;
        }
        let slot = match key.as_str() {
            "--gpus" => &mut a.gpus,
            "--gpus-per-node" => &mut a.gpus_per_node,
            "--gpus-per-socket" => &mut a.gpus_per_socket,
            "--sockets-per-node" => &mut a.sockets_per_node,
            "--gres" => &mut a.gres,
            _ => &mut a.licenses,
        };
        *slot = Some(count);
    }
    Ok(())
}

/// `--cpu-bind`: berth's binding, None for "as it is" (only quiet/verbose given).
fn cpu_bind(v: &str) -> Result<Option<&'static str>, String> {
    let mut out = None;
    for item in v.split(',').map(str::trim) {
        let kind = item.split(':').next().unwrap_or("");
        match kind {
            "quiet" | "q" | "verbose" | "v" => {}
            "none" | "no" => out = Some("none"),
            "cores" | "threads" | "rank" => out = Some("linear"),
            "sockets" | "ldoms" | "rank_ldom" | "map_cpu" | "mask_cpu" | "map_ldom" | "mask_ldom" => {
                return Err(format!(
                    "berth binds each rank to cores of its own (cores, threads, rank) or not at all (none); {kind} is not supported"
                ))
            }
            _ => return Err(format!("unknown binding {item:?}")),
        }
    }
    Ok(out)
}

/// `-m/--distribution`: ranks fill nodes in order (block); the second level picks how cores
/// are taken: block (consecutive, linear) or cyclic (alternating packages, striding).
fn distribution(v: &str) -> Result<Option<&'static str>, String> {
    let main = v.split(',').next().unwrap_or("");
    let mut levels = main.split(':');
    match levels.next().unwrap_or("") {
        "block" | "*" => {}
        other => return Err(format!("berth fills nodes in order (block); {other} is not supported")),
    }
    match levels.next() {
        None | Some("block" | "*") => Ok(None),
        Some("cyclic") => Ok(Some("striding")),
        Some(other) => {
            Err(format!("cores are taken in order (block) or across packages (cyclic); {other} is not supported"))
        }
    }
}

/// What srun's file name patterns stand for in this step, where one value holds for every
/// rank (berth relays every rank's stream through srun's own: one file for the step).
#[derive(Debug, Default)]
struct StepNames {
    /// `%j`: the job's id (`--jobid`, else `$SLURM_JOB_ID`/`$BERTH_JOB_ID`).
    job: Option<String>,
    /// `%x`: the job's name.
    name: Option<String>,
    /// `%A`/`%a`: the array's id and the task's index.
    array: Option<(String, String)>,
    /// `%u`: the user.
    user: Option<String>,
    /// The step's task count, when known: `-n`, else the job's (`$SLURM_NTASKS`) when the
    /// step takes the job's shape (no `-N`/`--ntasks-per-node`).
    tasks: Option<u32>,
}

impl StepNames {
    fn from_env(args: &RunArgs) -> StepNames {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let in_own_job = args.job.is_none() || args.job == var("BERTH_JOB_ID");
        let job_tasks = (in_job(args) && in_own_job && args.nodes.is_none() && args.tasks_per_node.is_none())
            .then(|| var("SLURM_NTASKS").and_then(|n| n.parse().ok()))
            .flatten();
        StepNames {
            job: args.job.clone().or_else(|| var("SLURM_JOB_ID")).or_else(|| var("BERTH_JOB_ID")),
            name: var("SLURM_JOB_NAME").filter(|_| in_own_job),
            array: var("SLURM_ARRAY_JOB_ID").zip(var("SLURM_ARRAY_TASK_ID")).filter(|_| in_own_job),
            user: var("USER").or_else(|| var("LOGNAME")),
            tasks: args.ntasks.or(job_tasks),
        }
    }
}

/// `-i/-o/-e FILE`: one file for every rank's stream. srun's patterns that mean the same for
/// every rank are expanded (`%j %x %u %A %a %%`, and `%t %n` of a one-task step: 0); the
/// others would need a file per rank and are refused naming the pattern.
fn stream_file(key: &str, v: &str, names: &StepNames) -> Result<Redirect, String> {
    if v == "none" {
        return Ok(Redirect::Null);
    }
    if v.trim().is_empty() {
        return Err(format!("{key} needs a value"));
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key}={v}: one task's stream alone is not supported; give a file name"));
    }
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // Slurm's optional zero-padding width (`%4t`) before the letter.
        let mut width = String::new();
        let letter = loop {
            match chars.next() {
                Some(d) if d.is_ascii_digit() && width.len() < 2 => width.push(d),
                other => break other,
            }
        };
        let width: usize = width.parse().unwrap_or(0);
        let single = names.tasks == Some(1);
        let value = match letter {
            Some('%') => Some("%".to_string()),
            Some('j') => names.job.clone(),
            Some('x') => names.name.clone(),
            Some('u') => names.user.clone(),
            Some('A') => names.array.as_ref().map(|a| a.0.clone()),
            Some('a') => names.array.as_ref().map(|a| a.1.clone()),
            Some('t' | 'n') if single => Some("0".into()),
            _ => None,
        };
        match value {
            Some(text) => out.push_str(&format!("{text:0>width$}")),
            None => {
                let pat = letter.map(|l| format!("%{l}")).unwrap_or_else(|| "%".into());
                let why = match letter {
                    Some('t' | 'n') => {
                        "berth writes every rank's stream to one file, so per-task patterns need a one-task step (-n 1)"
                    }
                    Some('j' | 'x' | 'A' | 'a' | 'u') => "its value is not known here (not inside a job of that kind)",
                    _ => "berth's srun expands %j %x %u %A %a %% (and %t %n of a one-task step)",
                };
                return Err(format!("{key}={v}: pattern {pat}: {why}"));
            }
        }
    }
    Ok(Redirect::File(out))
}

/// A Slurm time (`-t`), read by the `#SBATCH` reader so that it means what it means there.
fn slurm_time(v: &str) -> Result<u64, String> {
    if v.contains(['"', '\n', '\r']) || v.contains(" #") {
        return Err(format!("--time: {v:?} is not a Slurm time"));
    }
    let script = format!("#!/bin/sh\n#SBATCH \"--time={v}\"\n");
    let foreign = berth_core::directives::parse_foreign(&script).map_err(|e| e.to_string())?;
    if let Some((_, why)) = foreign.unsupported.first() {
        return Err(why.trim_start_matches("#SBATCH").trim_start_matches(':').trim().to_string());
    }
    foreign.options.walltime.ok_or_else(|| format!("--time: {v:?} is not a Slurm time"))
}

/// `--nodelist`: berth places a step on the job's first nodes with free cores and cannot be
/// told which; a list that names exactly the job's first K nodes (any order) is `-N K`, and
/// the grant is checked to be on them. Anything else is refused.
fn nodes_for(list: &str, nodes: Option<u32>, in_job: bool, job: &[String]) -> Result<Vec<String>, String> {
    if list.contains('/') {
        return Err("a file of node names is not supported".into());
    }
    let mut want = berth_core::hostlist::expand(list)?;
    want.sort();
    want.dedup();
    if want.is_empty() {
        return Err("no node named".into());
    }
    if !in_job {
        return Err("berth places an interactive run itself and cannot be given nodes by name".into());
    }
    if job.is_empty() {
        return Err("the job's nodes are not known here (BERTH_NODES is not set)".into());
    }
    let mut first: Vec<String> = job.iter().take(want.len()).cloned().collect();
    first.sort();
    if first != want {
        return Err(format!(
            "berth runs a step on the job's first nodes ({}); it cannot choose {} (`berth task spawn --node INDEX` starts a process on a chosen node)",
            job.iter().take(want.len()).cloned().collect::<Vec<_>>().join(","),
            want.join(",")
        ));
    }
    if let Some(n) = nodes.filter(|&n| n as usize != want.len()) {
        return Err(format!("-N {n} but {} nodes listed", want.len()));
    }
    Ok(want)
}

/// srun: `berth run` with srun's options; its exit status is the worst rank's.
pub async fn srun(dir: &Path, args: Vec<String>) -> Result<i32> {
    let plan = match srun_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("srun: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    launch("srun: warning: ", "srun: error: ", dir, plan).await
}

/// Apply a plan's redirections, directory and variables in this process, then run.
async fn launch(warn: &str, err: &str, dir: &Path, plan: LaunchPlan) -> Result<i32> {
    if let Some(info) = &plan.info {
        print!("{info}");
        return Ok(0);
    }
    if !plan.quiet {
        for w in &plan.warnings {
            eprintln!("{warn}{}", crate::output::terminal_safe(w));
        }
    }
    if let Some(d) = &plan.chdir {
        if let Err(e) = std::env::set_current_dir(d) {
            eprintln!("{err}chdir({}): {e}", crate::output::terminal_safe(d));
            return Ok(1);
        }
    }
    for (fd, target) in [(0, &plan.stdin), (1, &plan.stdout), (2, &plan.stderr)] {
        if let Some(r) = target {
            if let Err(e) = redirect(fd, r) {
                eprintln!("{err}{}", crate::output::terminal_safe(&e));
                return Ok(1);
            }
        }
    }
    // -o without -e: standard error goes to the same file (one file description, so that
    // neither overwrites the other), as srun's.
    // SAFETY: dup2 of descriptor 1 onto 2.
    if plan.stdout.is_some() && plan.stderr.is_none() && unsafe { libc::dup2(1, 2) } < 0 {
        eprintln!("{err}cannot send standard error to the --output file: {}", std::io::Error::last_os_error());
        return Ok(1);
    }
    for (k, v) in &plan.env {
        std::env::set_var(k, v);
    }
    crate::run::run(dir, false, plan.args).await
}

/// Point descriptor `fd` at the file (created or truncated for output, as srun's default
/// `--open-mode=truncate`), or at /dev/null.
fn redirect(fd: i32, r: &Redirect) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = match r {
        Redirect::Null => "/dev/null",
        Redirect::File(p) => p.as_str(),
    };
    let file = if fd == 0 {
        std::fs::File::open(path)
    } else {
        std::fs::OpenOptions::new().write(true).create(true).truncate(r != &Redirect::Null).open(path)
    };
    let what = ["input", "output", "error"][fd as usize];
    let file = file.map_err(|e| format!("Could not open {what} file {path}: {e}"))?;
    // SAFETY: dup2 of a descriptor we own onto 0, 1 or 2.
    if unsafe { libc::dup2(file.as_raw_fd(), fd) } < 0 {
        return Err(format!("Could not redirect {what} to {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// aprun

/// aprun's options (ALPS's), each a word of its own: `-n 4` or `-n4`; `-cc` is one option.
const APRUN_OPTS: &[(&str, bool)] = &[
    ("-n", true),
    ("-N", true),
    ("-d", true),
    ("-cc", true),
    ("-cp", true),
    ("-j", true),
    ("-S", true),
    ("-sl", true),
    ("-sn", true),
    ("-ss", false),
    ("-L", true),
    ("-l", true),
    ("-m", true),
    ("-t", true),
    ("-e", true),
    ("-a", true),
    ("-b", false),
    ("-B", false),
    ("-D", true),
    ("-F", true),
    ("-p", true),
    ("-r", true),
    ("-R", true),
    ("-T", false),
    ("-z", false),
    ("-q", false),
    ("-C", false),
    ("-E", true),
    ("--help", false),
    ("-h", false),
    ("--version", false),
    ("--ignore-unsupported", false),
];

const APRUN_USAGE: &str = "Usage: aprun [options] executable [args...]
berth's aprun is `berth run`: a step of the job in BERTH_JOB_ID, else an interactive
allocation. It supports: -n PEs, -N PEs per node, -d depth (CPUs per PE),
  -cc cpu|depth|none, -e VAR=value, -q, -b, -B
  --ignore-unsupported (berth: run without options berth does not support)
Other ALPS options are refused by name; docs/compat.md lists what is supported.
";

/// Read an aprun command line. Its colon form (`aprun -n 2 a.out : -n 4 b.out`, MPMD) gives
/// each segment after the first as a part of `berth run`'s colon line, with its `-n`, `-N`,
/// `-d`, `-cc` and `-e` translated; ranks are numbered across the segments.
pub fn aprun_plan(argv: &[String]) -> Result<LaunchPlan, String> {
    let mut segments = argv.split(|w| w == ":");
    let mut plan = aprun_segment(segments.next().unwrap_or_default())?;
    if plan.info.is_some() {
        return Ok(plan);
    }
    for (i, words) in segments.enumerate() {
        let part = aprun_segment(words).map_err(|e| format!("executable {} (after `:`): {e}", i + 2))?;
        if part.info.is_some() || part.quiet {
            return Err(format!("executable {}: -q, --help and --version go before the first executable", i + 2));
        }
        let a = &part.args;
        let mut words: Vec<String> = vec![":".into()];
        for (flag, value) in
            [("-n", a.ntasks), ("--ntasks-per-node", a.tasks_per_node), ("-N", a.nodes), ("-d", a.cpus_per_task)]
        {
            if let Some(v) = value {
                words.extend([flag.to_string(), v.to_string()]);
            }
        }
        words.extend(["--binding".to_string(), a.binding.clone()]);
        for (k, v) in &part.env {
            words.extend(["--env".to_string(), format!("{k}={v}")]);
        }
        plan.warnings.extend(part.warnings);
        words.extend(part.args.command);
        plan.args.command.extend(words);
    }
    Ok(plan)
}

/// One segment of an aprun line (the whole line without MPMD).
fn aprun_segment(argv: &[String]) -> Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    plan.args.binding = "linear".into();
    plan.args.fanout = "8".into();
    // Refusals wait for the whole line: --ignore-unsupported may come after them.
    let (mut ignore, mut refused) = (false, Vec::new());
    let mut i = 0;
    while i < argv.len() {
        let word = &argv[i];
        if word == "--" {
            i += 1;
            break;
        }
        if !word.starts_with('-') || word == "-" {
            break;
        }
        i += 1;
        // The option, exactly or with its value against it (`-n4`, `-ccnone`); longest first.
        let found = APRUN_OPTS
            .iter()
            .filter(|(name, takes)| word == name || (*takes && word.starts_with(name) && !word.starts_with("--")))
            .max_by_key(|(name, _)| name.len());
        let Some(&(name, takes)) = found else {
            return Err(format!("invalid option {word}"));
        };
        let value = if !takes {
            String::new()
        } else if word.len() > name.len() {
            word[name.len()..].to_string()
        } else {
            let v = argv.get(i).ok_or_else(|| format!("option {name} requires an argument"))?;
            i += 1;
            v.clone()
        };
        let shown = if takes { format!("{name} {value}") } else { name.to_string() };
        let a = &mut plan.args;
        match name {
            "-n" => a.ntasks = Some(count(name, &value)?),
            "-N" => a.tasks_per_node = Some(count(name, &value)?),
            "-d" => a.cpus_per_task = Some(count(name, &value)?),
            "-cc" => match value.as_str() {
                // cpu: each PE on CPUs of its own; depth: a PE and its threads on its -d
                // CPUs. berth binds each rank to its own -d cores: both.
                "cpu" | "depth" => a.binding = "linear".into(),
                "none" => a.binding = "none".into(),
                other => refused.push(format!(
                    "-cc {other}: berth chooses each PE's cores (cpu, depth) or binds none (none); CPU lists and numa_node are not supported"
                )),
            },
            "-e" => match value.split_once('=') {
                Some((k, v)) if !k.is_empty() => plan.env.push((k.to_string(), v.to_string())),
                _ => return Err(format!("-e {value}: expected VAR=value")),
            },
            "-q" => plan.quiet = true,
            // -b: no binary transfer (berth never transfers one); -B: the batch job's
            // resources, berth's default inside a job.
            "-b" | "-B" => {}
            "--ignore-unsupported" => ignore = true,
            "--help" | "-h" => plan.info = Some(APRUN_USAGE.to_string()),
            "--version" => plan.info = Some(format!("aprun (berth {})\n", env!("CARGO_PKG_VERSION"))),
            _ => refused.push(format!("{shown} is not supported by berth's aprun")),
        }
    }
    for what in refused {
        refuse(&mut plan, ignore, what)?;
    }
    if plan.info.is_some() {
        return Ok(plan);
    }
    plan.args.command = argv[i.min(argv.len())..].to_vec();
    if plan.args.command.is_empty() {
        return Err("no executable given".into());
    }
    // -N is PEs per node: the PEs need ceil(n / N) nodes (berth's -N counts nodes).
    if let (Some(n), Some(k)) = (plan.args.ntasks, plan.args.tasks_per_node) {
        plan.args.nodes = Some(n.div_ceil(k));
    }
    Ok(plan)
}

/// aprun: `berth run` with ALPS's options.
pub async fn aprun(dir: &Path, args: Vec<String>) -> Result<i32> {
    let plan = match aprun_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("aprun: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    launch("aprun: warning: ", "aprun: ", dir, plan).await
}

#[cfg(test)]
#[path = "launch/tests.rs"]
mod tests;
