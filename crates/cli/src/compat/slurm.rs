//! Slurm's commands: `sbatch`, `squeue`, `scancel`, `sinfo`.
//!
//! sbatch's resource options are read exactly as `#SBATCH` lines are (the directive table in
//! docs/compat.md): each is handed to the same reader as a one-line directive, so a Slurm
//! option means the same on the command line and in a script, and one berth does not support
//! is refused naming it (`--ignore-unsupported` makes that a warning).

use super::format::{self as f, both, long, Arg, Opt, Parsed, Piece};
use crate::client::request;
use crate::SubmitFlags;
use anyhow::{anyhow, bail, Result};
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, JobInfo, QueueInfo};
use berth_protocol::node::NodeInfo;
use std::path::{Path, PathBuf};

/// The Slurm version the personalities answer `--version` with (their output follows it).
pub const SLURM_VERSION: &str = "23.11.0";

fn version_line() -> String {
    format!("slurm {SLURM_VERSION} (berth {})", env!("CARGO_PKG_VERSION"))
}

// ---------------------------------------------------------------------------------------
// sbatch

/// sbatch's options (all of Slurm 23.11's, so that one berth lacks is named as unsupported
/// rather than unknown).
pub(crate) const SBATCH_OPTS: &[Opt] = &[
    both('A', "account", Arg::Required),
    long("acctg-freq", Arg::Required),
    both('a', "array", Arg::Required),
    long("batch", Arg::Required),
    long("bb", Arg::Required),
    long("bbf", Arg::Required),
    both('b', "begin", Arg::Required),
    both('D', "chdir", Arg::Required),
    long("cluster-constraint", Arg::Required),
    both('M', "clusters", Arg::Required),
    long("comment", Arg::Required),
    both('C', "constraint", Arg::Required),
    long("container", Arg::Required),
    long("contiguous", Arg::No),
    both('S', "core-spec", Arg::Required),
    long("cores-per-socket", Arg::Required),
    long("cpu-freq", Arg::Required),
    long("cpus-per-gpu", Arg::Required),
    both('c', "cpus-per-task", Arg::Required),
    long("deadline", Arg::Required),
    long("delay-boot", Arg::Required),
    both('d', "dependency", Arg::Required),
    both('m', "distribution", Arg::Required),
    both('e', "error", Arg::Required),
    both('x', "exclude", Arg::Required),
    long("exclusive", Arg::Optional),
    long("export", Arg::Required),
    long("export-file", Arg::Required),
    both('B', "extra-node-info", Arg::Required),
    long("get-user-env", Arg::Optional),
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
    long("hint", Arg::Required),
    both('H', "hold", Arg::No),
    long("ignore-pbs", Arg::No),
    both('i', "input", Arg::Required),
    both('J', "job-name", Arg::Required),
    long("kill-on-invalid-dep", Arg::Required),
    both('L', "licenses", Arg::Required),
    long("mail-type", Arg::Required),
    long("mail-user", Arg::Required),
    long("mcs-label", Arg::Required),
    long("mem", Arg::Required),
    long("mem-bind", Arg::Required),
    long("mem-per-cpu", Arg::Required),
    long("mem-per-gpu", Arg::Required),
    long("mincpus", Arg::Required),
    long("network", Arg::Required),
    long("nice", Arg::Optional),
    both('k', "no-kill", Arg::Optional),
    long("no-requeue", Arg::No),
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
    both('s', "oversubscribe", Arg::No),
    long("parsable", Arg::No),
    both('p', "partition", Arg::Required),
    long("power", Arg::Required),
    long("priority", Arg::Required),
    long("profile", Arg::Required),
    long("propagate", Arg::Optional),
    both('q', "qos", Arg::Required),
    both('Q', "quiet", Arg::No),
    long("reboot", Arg::No),
    long("requeue", Arg::No),
    long("reservation", Arg::Required),
    long("signal", Arg::Required),
    long("sockets-per-node", Arg::Required),
    long("spread-job", Arg::No),
    long("switches", Arg::Required),
    long("test-only", Arg::No),
    long("thread-spec", Arg::Required),
    long("threads-per-core", Arg::Required),
    both('t', "time", Arg::Required),
    long("time-min", Arg::Required),
    long("tmp", Arg::Required),
    long("uid", Arg::Required),
    long("usage", Arg::No),
    long("use-min-nodes", Arg::No),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
    both('W', "wait", Arg::No),
    long("wait-all-nodes", Arg::Required),
    long("wckey", Arg::Required),
    long("wrap", Arg::Required),
    // berth's own: submit although some options or directives are not supported.
    long("ignore-unsupported", Arg::No),
];

/// sbatch options handled here rather than as directives.
const SBATCH_LOCAL: &[&str] = &[
    "--job-name",
    "--output",
    "--error",
    "--partition",
    "--account",
    "--reservation",
    "--no-kill",
    "--hold",
    "--parsable",
    "--wait",
    "--wrap",
    "--quiet",
    "--verbose",
    "--ignore-unsupported",
    "--help",
    "--usage",
    "--version",
];

/// What an sbatch command line asks for.
#[derive(Debug, Default)]
pub struct SbatchPlan {
    /// Options given as berth's flags (paths, names: checked and sent as `berth submit` does).
    pub flags: SubmitFlags,
    /// Resource options, read as `#SBATCH` lines are; they override the script's directives.
    pub options: SubmitOptions,
    pub hold: bool,
    pub parsable: bool,
    pub quiet: bool,
    /// `-W/--wait`: exit when the job ends, with its exit code.
    pub wait: bool,
    pub wrap: Option<String>,
    pub chdir: Option<String>,
    /// `--export=ALL,VAR=value`: variables set for the job.
    pub export: Vec<(String, String)>,
    pub script: Option<String>,
    /// Options berth does not support, when `--ignore-unsupported` lets the job go without.
    pub warnings: Vec<String>,
    /// `--help`, `--usage` or `--version`: print this and exit 0.
    pub info: Option<String>,
}

const SBATCH_USAGE: &str = "Usage: sbatch [OPTIONS...] script | --wrap=\"command\"
berth's sbatch supports: -A/--account -b/--begin -c/--cpus-per-task -C/--constraint
  -d/--dependency -D/--chdir -e/--error -H/--hold -J/--job-name -k/--no-kill --mem --mem-per-cpu -N/--nodes
  -n/--ntasks --ntasks-per-node -o/--output -p/--partition --parsable -Q/--quiet
  --requeue --no-requeue --reservation -t/--time --export=ALL|NONE|[ALL,]VAR[=value],... -W/--wait --wrap
  --comment --signal --mail-type --mail-user --exclusive -q/--qos
  --ignore-unsupported (berth: submit without options berth does not support)
Other Slurm options are refused by name; docs/compat.md lists what is supported.
";

/// Read an sbatch command line (pure: no file or controller is touched).
pub fn sbatch_plan(args: &[String]) -> Result<SbatchPlan, String> {
    let p = f::getopt(args, SBATCH_OPTS, true)?;
    let mut plan = SbatchPlan::default();
    let ignore = p.has("--ignore-unsupported");
    plan.flags.ignore_unsupported = ignore;
    let mut directives = String::from("#!/bin/sh\n");
    for (key, value) in &p.options {
        let v = value.clone().unwrap_or_default();
        if !SBATCH_LOCAL.contains(&key.as_str()) {
            if v.contains(['"', '\n', '\r']) || v.contains(" #") {
                return Err(format!("{key}: the value {v:?} holds a character berth cannot read in it"));
            }
            let token = match value {
                Some(v) => format!("{key}={v}"),
                None => key.clone(),
            };
            directives.push_str(&format!("#SBATCH \"{token}\"\n"));
            continue;
        }
        match key.as_str() {
            "--job-name" => plan.flags.name = Some(nonempty(key, &v)?),
            "--output" => plan.flags.output = Some(output_pattern(key, &v)?),
            "--error" => plan.flags.error = Some(output_pattern(key, &v)?),
            "--partition" => {
                if v.contains(',') {
                    unsupported(
                        &mut plan,
                        ignore,
                        format!("{key}={v}: a list of partitions is not supported; give one"),
                    )?
                } else {
                    plan.flags.queue = Some(nonempty(key, &v)?)
                }
            }
            "--account" => plan.flags.account = Some(nonempty(key, &v)?),
            "--reservation" => plan.flags.reservation = Some(nonempty(key, &v)?),
            "--no-kill" => match value.as_deref() {
                None | Some("on") => plan.flags.no_kill = true,
                Some("off") => plan.flags.no_kill = false,
                Some(other) => return Err(format!("--no-kill takes on or off, got {other:?}")),
            },
            "--hold" => plan.hold = true,
            "--parsable" => plan.parsable = true,
            "--wait" => plan.wait = true,
            "--quiet" => plan.quiet = true,
            "--verbose" => {}
            "--wrap" => plan.wrap = Some(v),
            "--chdir" => plan.chdir = Some(nonempty(key, &v)?),
            "--export" => {
                let mut items = v.split(',');
                if items.next().map(str::trim) != Some("ALL") {
                    unsupported(
                        &mut plan,
                        ignore,
                        format!("--export={v}: only ALL (optionally ALL,VAR=value,...) is supported: jobs get the submitting environment"),
                    )?;
                }
                for item in items {
                    match item.split_once('=') {
                        Some((k, val)) if !k.is_empty() => plan.export.push((k.to_string(), val.to_string())),
                        _ => unsupported(&mut plan, ignore, format!("--export=...,{item}: give VAR=value after ALL"))?,
                    }
                }
            }
            "--ignore-unsupported" => {}
            "--help" | "--usage" => plan.info = Some(SBATCH_USAGE.to_string()),
            "--version" => plan.info = Some(format!("{}\n", version_line())),
            _ => {}
        }
    }
    if plan.info.is_some() {
        return Ok(plan);
    }
    let foreign = berth_core::directives::parse_foreign(&directives).map_err(|e| strip_prefix(&e.to_string()))?;
    plan.options = foreign.options;
    for (_, what) in foreign.unsupported {
        unsupported(&mut plan, ignore, strip_prefix(&what))?;
    }
    let mut operands = p.operands.into_iter();
    plan.script = operands.next();
    let rest: Vec<String> = operands.collect();
    if plan.wrap.is_some() && plan.script.is_some() {
        return Err("--wrap takes the place of a script; give one or the other".into());
    }
    if !rest.is_empty() {
        return Err(format!(
            "arguments to the batch script ({}) are not supported by berth; set variables with --export=ALL,VAR=value",
            rest.join(" ")
        ));
    }
    Ok(plan)
}

fn unsupported(plan: &mut SbatchPlan, ignore: bool, what: String) -> Result<(), String> {
    if ignore {
        plan.warnings.push(what);
        Ok(())
    } else {
        Err(format!("{what}; --ignore-unsupported submits without it"))
    }
}

/// A directive reader's message without its `#SBATCH` prefix: here it was an option.
fn strip_prefix(m: &str) -> String {
    m.trim_start_matches("#SBATCH").trim_start_matches(':').trim().to_string()
}

fn nonempty(key: &str, v: &str) -> Result<String, String> {
    if v.trim().is_empty() {
        Err(format!("{key} needs a value"))
    } else {
        Ok(v.trim().to_string())
    }
}

/// `-o`/`-e`: berth expands `%j`, `%x`, `%u` and `%%` (as the `#SBATCH` reader accepts).
fn output_pattern(key: &str, v: &str) -> Result<String, String> {
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '%' && !matches!(chars.next(), Some('j' | 'J' | 'x' | 'u' | 'A' | 'a' | 'N' | 'n' | 't' | '%')) {
            return Err(format!(
                "{key}={v}: only the patterns %j and %J (job id), %x (job name), %u (user), %A (array id), %a (array index) and %% are supported"
            ));
        }
    }
    nonempty(key, v)
}

/// sbatch: submit a script (a file, `--wrap`, or standard input) and print
/// `Submitted batch job N` (`N` with `--parsable`).
pub async fn sbatch(dir: &Path, args: Vec<String>) -> Result<i32> {
    let mut plan = match sbatch_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sbatch: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if let Some(info) = &plan.info {
        print!("{info}");
        return Ok(0);
    }
    for w in &plan.warnings {
        eprintln!("sbatch: warning: {}: ignored", crate::output::terminal_safe(w));
    }
    let (temp, script_name) = match (&plan.wrap, &plan.script) {
        (Some(cmd), _) => {
            let text = crate::submission::wrap_script(cmd, "sbatch --wrap")?;
            (Some(super::TempScript::new(&text)?), Some("wrap"))
        }
        (None, Some(_)) => (None, None),
        (None, None) => {
            let text = super::read_stdin_script()?;
            (Some(super::TempScript::new(&text)?), Some("sbatch"))
        }
    };
    let path: PathBuf = match (&temp, &plan.script) {
        (Some(t), _) => t.path.clone(),
        (None, Some(p)) => std::env::current_dir()?.join(p),
        (None, None) => bail!("no script"),
    };
    if let Some(d) = &plan.chdir {
        std::env::set_current_dir(d).map_err(|e| anyhow!("chdir({d}): {e}"))?;
    }
    let mut sub = crate::submission::build_submission(&path, &plan.flags, plan.hold)?;
    drop(temp);
    sub.options = sub.options.overlay(std::mem::take(&mut plan.options));
    // Slurm's outputs: stderr with stdout unless -e, by default slurm-%j.out (slurm-%A_%a.out
    // for an array); the controller applies it (berth_core::directives::output_patterns).
    sub.options.join = Some(berth_core::directives::Join::Slurm);
    if let Some(name) = script_name {
        sub.script_name = name.into();
    }
    for (k, v) in &plan.export {
        sub.env.retain(|(key, _)| key != k);
        sub.env.push((k.clone(), v.clone()));
    }
    let ClientResponse::Submitted { id } = request(dir, ClientRequest::Submit(Box::new(sub))).await? else {
        bail!("unexpected answer")
    };
    if plan.parsable {
        println!("{id}");
    } else if !plan.quiet {
        println!("Submitted batch job {id}");
    }
    if plan.wait {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        return super::wait::wait_for(dir, &[id], super::wait::ExitRule::Slurm).await;
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// squeue

const SQUEUE_OPTS: &[Opt] = &[
    both('A', "account", Arg::Required),
    both('a', "all", Arg::No),
    both('r', "array", Arg::No),
    both('h', "noheader", Arg::No),
    long("help", Arg::No),
    long("usage", Arg::No),
    both('j', "jobs", Arg::Required),
    both('l', "long", Arg::No),
    long("me", Arg::No),
    both('n', "name", Arg::Required),
    both('o', "format", Arg::Required),
    both('p', "partition", Arg::Required),
    both('t', "states", Arg::Required),
    both('u', "user", Arg::Required),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
];

/// squeue's default and `-l` formats.
pub const SQUEUE_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
pub const SQUEUE_LONG: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
const SQUEUE_FIELDS: &str = "iAPjuatTMlLDRrNCSVeZQqm";

/// Which jobs and how: an squeue command line read.
#[derive(Debug, PartialEq)]
pub struct SqueueQuery {
    pub header: bool,
    pub format: Vec<Piece>,
    pub users: Vec<String>,
    pub me: bool,
    pub ids: Vec<JobId>,
    pub names: Vec<String>,
    pub partitions: Vec<String>,
    pub accounts: Vec<String>,
    /// None: pending, running, suspended and completing jobs (squeue's default).
    pub states: Option<Vec<JobState>>,
    pub info: Option<String>,
    /// `-r`: one line per array task (else an array's queued tasks are one line, `A_[3-9]`).
    pub array: bool,
}

pub fn squeue_query(args: &[String]) -> Result<SqueueQuery, String> {
    let p: Parsed = f::getopt(args, SQUEUE_OPTS, false)?;
    if let Some(op) = p.operands.first() {
        return Err(format!("unrecognized argument {op:?}"));
    }
    let info = if p.has("--version") {
        Some(format!("{}\n", version_line()))
    } else if p.has("--help") || p.has("--usage") {
        Some("Usage: squeue [-h] [-l] [--me] [-u USERS] [-j IDS] [-n NAMES] [-t STATES] [-p PARTITIONS] [-A ACCOUNTS] [-o FORMAT]\n".into())
    } else {
        None
    };
    let spec = match p.last("--format") {
        Some(s) => s.to_string(),
        None if p.has("--long") => SQUEUE_LONG.into(),
        None => SQUEUE_FORMAT.into(),
    };
    let format = f::parse_format(&spec)?;
    f::check_fields(&format, SQUEUE_FIELDS)?;
    let ids = p
        .list("--jobs")
        .iter()
        .map(|s| f::parse_job_id(s).ok_or_else(|| format!("invalid job id {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let states = if p.has("--states") {
        let mut all = Vec::new();
        for s in p.list("--states") {
            all.extend(f::slurm_states(&s).ok_or_else(|| format!("invalid job state specified: {s}"))?);
        }
        Some(all)
    } else {
        None
    };
    Ok(SqueueQuery {
        header: !p.has("--noheader"),
        format,
        users: p.list("--user"),
        me: p.has("--me"),
        ids,
        names: p.list("--name"),
        partitions: p.list("--partition"),
        accounts: p.list("--account"),
        states,
        info,
        array: p.has("--array"),
    })
}

impl SqueueQuery {
    /// Whether finished jobs must be fetched.
    fn wants_finished(&self) -> bool {
        !self.ids.is_empty() || self.states.as_ref().is_some_and(|s| s.iter().any(|s| s.is_finished()))
    }

    pub fn keeps(&self, j: &JobInfo) -> bool {
        let state_ok = match &self.states {
            Some(states) => states.contains(&j.state),
            None => !self.ids.is_empty() || !j.state.is_finished(),
        };
        state_ok
            && (self.ids.is_empty() || self.ids.contains(&j.id) || j.array_job.is_some_and(|a| self.ids.contains(&a)))
            && (self.users.is_empty() || self.users.contains(&j.user))
            && (self.names.is_empty() || self.names.contains(&j.name))
            && (self.partitions.is_empty() || self.partitions.contains(&j.queue))
            && (self.accounts.is_empty() || self.accounts.contains(&j.account))
    }
}

/// squeue's header text for a field.
fn squeue_header(c: char) -> &'static str {
    match c {
        'i' | 'A' => "JOBID",
        'P' => "PARTITION",
        'j' => "NAME",
        'u' => "USER",
        'a' => "ACCOUNT",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'r' => "REASON",
        'N' => "NODELIST",
        'C' => "CPUS",
        'S' => "START_TIME",
        'V' => "SUBMIT_TIME",
        'e' => "END_TIME",
        'Z' => "WORK_DIR",
        'Q' => "PRIORITY",
        'q' => "QOS",
        'm' => "MIN_MEMORY",
        _ => "",
    }
}

/// One field of a job, as squeue prints it.
pub fn squeue_field(j: &JobInfo, c: char, now: f64) -> String {
    let nodes: Vec<&str> = j.allocation.iter().map(|a| a.node.as_str()).collect();
    match c {
        'i' => crate::arrays::shown_id(j),
        'A' => j.array_job.unwrap_or(j.id).to_string(),
        'P' => j.queue.clone(),
        'j' => j.name.clone(),
        'u' => j.user.clone(),
        'a' => j.account.clone(),
        't' => f::slurm_state(j).0.into(),
        'T' => f::slurm_state(j).1.into(),
        'M' => f::slurm_duration(f::elapsed(j, now)),
        'l' => j.walltime_seconds.map(f::slurm_duration).unwrap_or_else(|| "UNLIMITED".into()),
        'L' => match j.walltime_seconds {
            None => "UNLIMITED".into(),
            Some(w) => f::slurm_duration(w.saturating_sub(f::elapsed(j, now))),
        },
        'D' => f::job_node_count(j).to_string(),
        'R' => {
            if j.state.is_pending() || nodes.is_empty() {
                format!("({})", f::slurm_reason(j))
            } else {
                f::hostlist(&nodes)
            }
        }
        'r' => f::slurm_reason(j),
        'N' => f::hostlist(&nodes),
        'C' => crate::output::job_cpus(j),
        'S' => j.start_time.or(j.expected_start).map(f::iso_time).unwrap_or_else(|| "N/A".into()),
        'V' => f::iso_time(j.submit_time),
        'e' => j.end_time.map(f::iso_time).unwrap_or_else(|| "N/A".into()),
        'Z' => j.cwd.clone(),
        'Q' => j.priority.as_ref().map(|p| format!("{:.0}", p.total)).unwrap_or_else(|| "0".into()),
        'q' => "normal".into(),
        'm' => match (j.request.mem_per_node, j.request.mem_per_cpu) {
            (Some(b), _) => format!("{}M", b.div_ceil(1 << 20)),
            (None, Some(b)) => format!("{}M", b.div_ceil(1 << 20)),
            _ => "0".into(),
        },
        _ => String::new(),
    }
}

/// squeue's lines: pending tasks of an array with the same state and reason as squeue shows
/// them (`PD`, `(Priority)`) fold (`crate::fold`).
pub fn squeue_lines(jobs: &[JobInfo]) -> Vec<(&JobInfo, Option<String>)> {
    use crate::fold::{fold, pending_task, slurm_max_len};
    fold(jobs, |j| pending_task(j, |j| (f::slurm_state(j).0, f::slurm_reason(j))), slurm_max_len())
}

/// squeue's output for `jobs` (already filtered).
pub fn squeue_table(q: &SqueueQuery, jobs: &[JobInfo], now: f64) -> String {
    let jobs = crate::output::escaped(jobs);
    let mut out = String::new();
    if q.header {
        out.push_str(f::render(&q.format, |c| squeue_header(c).to_string()).trim_end());
        out.push('\n');
    }
    let folded = if q.array { crate::fold::unfolded(&jobs) } else { squeue_lines(&jobs) };
    for (j, id) in folded {
        out.push_str(&f::render(&q.format, |c| match (&id, c) {
            (Some(id), 'i') => id.clone(),
            _ => squeue_field(j, c, now),
        }));
        out.push('\n');
    }
    out
}

pub async fn squeue(dir: &Path, args: Vec<String>) -> Result<i32> {
    let mut q = match squeue_query(&args) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("squeue: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if let Some(info) = &q.info {
        print!("{info}");
        return Ok(0);
    }
    if q.me {
        q.users.push(own_user_name());
    }
    let mut jobs = if q.ids.is_empty() {
        let ClientResponse::Jobs { jobs } =
            request(dir, ClientRequest::ListJobs { states: vec![], all: q.wants_finished() }).await?
        else {
            bail!("unexpected answer")
        };
        jobs
    } else {
        super::jobs_by_id(dir, &q.ids).await?
    };
    jobs.retain(|j| q.keeps(j));
    if q.ids.len() == 1 && jobs.is_empty() {
        eprintln!("slurm_load_jobs error: Invalid job id specified");
        return Ok(1);
    }
    print!("{}", crate::output::terminal_safe(&squeue_table(&q, &jobs, f::now())));
    Ok(0)
}

/// The calling user's name (uid if it has none).
pub fn own_user_name() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid).ok().flatten().map(|u| u.name).unwrap_or_else(|| uid.to_string())
}

// ---------------------------------------------------------------------------------------
// scancel

const SCANCEL_OPTS: &[Opt] = &[
    both('A', "account", Arg::Required),
    both('b', "batch", Arg::No),
    both('f', "full", Arg::No),
    both('H', "hurry", Arg::No),
    long("help", Arg::No),
    long("usage", Arg::No),
    long("me", Arg::No),
    both('n', "name", Arg::Required),
    long("jobname", Arg::Required),
    both('p', "partition", Arg::Required),
    both('Q', "quiet", Arg::No),
    both('s', "signal", Arg::Required),
    both('t', "state", Arg::Required),
    both('u', "user", Arg::Required),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
];

/// What an scancel command line asks: the jobs (ids and filters), and a signal instead of a
/// cancel.
#[derive(Debug, PartialEq)]
pub struct ScancelQuery {
    pub ids: Vec<JobId>,
    /// Tasks of arrays named `A_i`: (array, index), looked up before cancelling.
    pub tasks: Vec<(JobId, u32)>,
    pub filter: SqueueQuery,
    pub signal: Option<i32>,
    pub quiet: bool,
    pub verbose: bool,
    pub info: Option<String>,
}

pub fn scancel_query(args: &[String]) -> Result<ScancelQuery, String> {
    let p = f::getopt(args, SCANCEL_OPTS, false)?;
    let info = if p.has("--version") {
        Some(format!("{}\n", version_line()))
    } else if p.has("--help") || p.has("--usage") {
        Some(
            "Usage: scancel [-u USER] [-n NAME] [-t STATE] [-p PARTITION] [-A ACCOUNT] [-s SIGNAL] [--me] [JOBID...]\n"
                .into(),
        )
    } else {
        None
    };
    let (mut ids, mut tasks) = (Vec::new(), Vec::new());
    for s in &p.operands {
        match crate::arrays::split_task(s) {
            Some(t) => tasks.push(t),
            None => {
                ids.push(f::parse_job_id(s).filter(|_| !s.contains('_')).ok_or_else(|| format!("Invalid job id {s}"))?)
            }
        }
    }
    let signal = match p.last("--signal") {
        Some(s) => Some(berth_protocol::step::parse_signal(s).ok_or_else(|| format!("Invalid signal name {s}"))?),
        None => None,
    };
    let mut names = p.list("--name");
    names.extend(p.list("--jobname"));
    let states = if p.has("--state") {
        let mut all = Vec::new();
        for s in p.list("--state") {
            all.extend(f::slurm_states(&s).ok_or_else(|| format!("Invalid job state specified: {s}"))?);
        }
        Some(all)
    } else {
        None
    };
    let filter = SqueueQuery {
        header: false,
        format: vec![],
        users: p.list("--user"),
        me: p.has("--me"),
        ids: vec![],
        names,
        partitions: p.list("--partition"),
        accounts: p.list("--account"),
        states,
        info: None,
        array: true,
    };
    Ok(ScancelQuery { ids, tasks, filter, signal, quiet: p.has("--quiet"), verbose: p.has("--verbose"), info })
}

impl ScancelQuery {
    fn has_filter(&self) -> bool {
        let f = &self.filter;
        f.me || !f.users.is_empty()
            || !f.names.is_empty()
            || !f.partitions.is_empty()
            || !f.accounts.is_empty()
            || f.states.is_some()
    }
}

/// Slurm's words for why a job could not be cancelled.
pub(crate) fn slurm_error(e: &berth_protocol::client::ApiError) -> String {
    match e.code {
        ErrorCode::UnknownJob => "Invalid job id specified".into(),
        ErrorCode::InvalidState => "Job/step already completing or completed".into(),
        ErrorCode::NotPermitted => "Access/permission denied".into(),
        _ => e.message.clone(),
    }
}

pub async fn scancel(dir: &Path, args: Vec<String>) -> Result<i32> {
    let mut q = match scancel_query(&args) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("scancel: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if let Some(info) = &q.info {
        print!("{info}");
        return Ok(0);
    }
    if q.filter.me {
        q.filter.users.push(own_user_name());
    }
    if q.ids.is_empty() && q.tasks.is_empty() && !q.has_filter() {
        eprintln!("scancel: error: No job identification provided");
        return Ok(1);
    }
    // Ids given as `A_i`: that task alone, even an array's first (whose id is the array's).
    let mut only = Vec::new();
    if !q.tasks.is_empty() {
        // `A_i`: the task's own id (Slurm: an unknown task is an invalid job id).
        let ClientResponse::Jobs { jobs } =
            request(dir, ClientRequest::ListJobs { states: vec![], all: false }).await?
        else {
            bail!("unexpected answer")
        };
        for (array, index) in q.tasks.clone() {
            match crate::arrays::find_task(&jobs, array, index) {
                Some(id) => {
                    q.ids.push(id);
                    only.push(id);
                }
                None => {
                    if !q.quiet {
                        eprintln!("scancel: error: Kill job error on job id {array}_{index}: Invalid job id specified");
                    }
                    return Ok(1);
                }
            }
        }
    }
    let mut ids = q.ids.clone();
    if q.has_filter() {
        // The active jobs that pass every filter (and are among the ids, when given).
        let ClientResponse::Jobs { jobs } =
            request(dir, ClientRequest::ListJobs { states: vec![], all: false }).await?
        else {
            bail!("unexpected answer")
        };
        ids = jobs
            .iter()
            .filter(|j| q.filter.keeps(j) && (q.ids.is_empty() || q.ids.contains(&j.id)))
            .map(|j| j.id)
            .collect();
    }
    let mut failed = false;
    for chunk in ids.chunks(berth_protocol::client::MAX_IDS_PER_REQUEST) {
        let results = match q.signal {
            Some(signal) => {
                let mut results = Vec::new();
                for &job in chunk {
                    match request(dir, ClientRequest::Signal { job, step: None, signal }).await {
                        Ok(ClientResponse::Done { results: r }) => results.extend(r),
                        Ok(_) => bail!("unexpected answer"),
                        Err(e) => match e.downcast::<berth_protocol::client::ApiError>() {
                            Ok(api) => {
                                results.push(berth_protocol::client::IdResult { id: job, ok: false, error: Some(api) })
                            }
                            Err(e) => return Err(e),
                        },
                    }
                }
                results
            }
            None => {
                let ClientResponse::Done { results } = request(
                    dir,
                    ClientRequest::Cancel {
                        ids: chunk.to_vec(),
                        only: only.iter().copied().filter(|i| chunk.contains(i)).collect(),
                    },
                )
                .await?
                else {
                    bail!("unexpected answer")
                };
                results
            }
        };
        for r in results {
            match (&r.error, r.ok) {
                (_, true) => {
                    if q.verbose {
                        eprintln!("scancel: Terminating job {}", r.id);
                    }
                }
                (Some(e), false) => {
                    failed = true;
                    if !q.quiet {
                        let verb = if q.signal.is_some() { "Signal" } else { "Kill" };
                        eprintln!("scancel: error: {verb} job error on job id {}: {}", r.id, slurm_error(e));
                    }
                }
                (None, false) => failed = true,
            }
        }
    }
    Ok(if failed { 1 } else { 0 })
}

// ---------------------------------------------------------------------------------------
// sinfo

const SINFO_OPTS: &[Opt] = &[
    both('a', "all", Arg::No),
    both('h', "noheader", Arg::No),
    long("help", Arg::No),
    long("usage", Arg::No),
    both('l', "long", Arg::No),
    both('N', "Node", Arg::No),
    both('n', "nodes", Arg::Required),
    both('o', "format", Arg::Required),
    both('p', "partition", Arg::Required),
    both('r', "responding", Arg::No),
    both('s', "summarize", Arg::No),
    both('t', "states", Arg::Required),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
];

pub const SINFO_FORMAT: &str = "%#P %.5a %.10l %.6D %.6t %N";
pub const SINFO_NODE_FORMAT: &str = "%#N %.6D %#P %6t";
pub const SINFO_SUMMARY: &str = "%#P %.5a %.10l %.16F %N";
pub const SINFO_LONG: &str = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N";
const SINFO_FIELDS: &str = "PalDtTNncmCFzsrhg";

#[derive(Debug, PartialEq)]
pub struct SinfoQuery {
    pub header: bool,
    pub per_node: bool,
    pub format: String,
    pub partitions: Vec<String>,
    pub nodes: Vec<String>,
    pub states: Vec<String>,
    pub responding: bool,
    pub info: Option<String>,
}

pub fn sinfo_query(args: &[String]) -> Result<SinfoQuery, String> {
    let p = f::getopt(args, SINFO_OPTS, false)?;
    if let Some(op) = p.operands.first() {
        return Err(format!("unrecognized argument {op:?}"));
    }
    let info = if p.has("--version") {
        Some(format!("{}\n", version_line()))
    } else if p.has("--help") || p.has("--usage") {
        Some("Usage: sinfo [-h] [-N] [-s] [-l] [-r] [-p PARTITIONS] [-n NODES] [-t STATES] [-o FORMAT]\n".into())
    } else {
        None
    };
    let per_node = p.has("--Node");
    let format = match p.last("--format") {
        Some(s) => s.to_string(),
        None if per_node => SINFO_NODE_FORMAT.into(),
        None if p.has("--summarize") => SINFO_SUMMARY.into(),
        None if p.has("--long") => SINFO_LONG.into(),
        None => SINFO_FORMAT.into(),
    };
    // `%#X`: as wide as its widest value (checked once the values are known).
    let pieces = f::parse_format(&format.replace("%#", "%"))?;
    f::check_fields(&pieces, SINFO_FIELDS)?;
    Ok(SinfoQuery {
        header: !p.has("--noheader"),
        per_node,
        format,
        partitions: p.list("--partition"),
        nodes: p.list("--nodes"),
        states: p.list("--states").iter().map(|s| s.to_ascii_lowercase()).collect(),
        responding: p.has("--responding"),
        info,
    })
}

/// A node's state as sinfo's short and long names (`*`: not responding).
pub fn node_state(n: &NodeInfo) -> (String, String) {
    let (short, long) = match n.state.split_whitespace().next().unwrap_or("") {
        "up" if n.cpus_allocated == 0 => ("idle", "idle"),
        "up" if n.cpus_allocated >= n.pus => ("alloc", "allocated"),
        "up" => ("mix", "mixed"),
        "down" => ("down", "down"),
        "draining" if n.jobs.is_empty() => ("drain", "drained"),
        "draining" => ("drng", "draining"),
        "drained" => ("drain", "drained"),
        "cleaning" => ("comp", "completing"),
        _ => ("unk", "unknown"),
    };
    let star = if n.state.contains("not connected") { "*" } else { "" };
    (format!("{short}{star}"), format!("{long}{star}"))
}

/// The nodes a queue's jobs may run on: all, or those with a subnode that has every one of
/// the queue's target properties.
pub(crate) fn queue_nodes<'a>(q: &QueueInfo, nodes: &'a [NodeInfo]) -> Vec<&'a NodeInfo> {
    let props = &q.spec.target_properties;
    nodes
        .iter()
        .filter(|n| props.is_empty() || n.subnodes.iter().any(|s| props.iter().all(|p| s.properties.contains(p))))
        .collect()
}

/// sinfo's output: one line per partition and node state (per node and partition with `-N`).
pub fn sinfo_table(q: &SinfoQuery, queues: &[QueueInfo], nodes: &[NodeInfo]) -> String {
    let queues = crate::output::escaped(queues);
    let nodes = crate::output::escaped(nodes);
    let default = queues.iter().find(|q| q.spec.enabled).or(queues.first()).map(|q| q.spec.name.clone());
    // Rows: (partition display name, queue, its nodes in the row).
    let mut rows: Vec<(String, &QueueInfo, Vec<&NodeInfo>)> = Vec::new();
    for queue in &queues {
        if !q.partitions.is_empty() && !q.partitions.contains(&queue.spec.name) {
            continue;
        }
        let shown = if Some(&queue.spec.name) == default.as_ref() {
            format!("{}*", queue.spec.name)
        } else {
            queue.spec.name.clone()
        };
        let members: Vec<&NodeInfo> = queue_nodes(queue, &nodes)
            .into_iter()
            .filter(|n| q.nodes.is_empty() || q.nodes.contains(&n.name))
            .filter(|n| {
                let (short, long) = node_state(n);
                let base = |s: &str| s.trim_end_matches('*').to_string();
                q.states.is_empty() || q.states.contains(&base(&short)) || q.states.contains(&base(&long))
            })
            .filter(|n| !q.responding || !n.state.contains("not connected"))
            .collect();
        if q.per_node {
            for n in members {
                rows.push((shown.clone(), queue, vec![n]));
            }
        } else {
            // Nodes grouped by the fields shown of a node (its state, CPUs, memory...).
            let pieces = f::parse_format(&q.format.replace("%#", "%")).unwrap_or_default();
            let mut groups: Vec<(String, Vec<&NodeInfo>)> = Vec::new();
            for n in members {
                let key =
                    f::render(&pieces, |c| if "tTczm".contains(c) { sinfo_node_field(n, c) } else { String::new() });
                match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, g)) => g.push(n),
                    None => groups.push((key, vec![n])),
                }
            }
            if groups.is_empty() {
                rows.push((shown.clone(), queue, vec![]));
            }
            for (_, g) in groups {
                rows.push((shown.clone(), queue, g));
            }
        }
    }
    if q.per_node {
        rows.sort_by(|a, b| a.2[0].name.cmp(&b.2[0].name));
    }
    let value = |(part, queue, group): &(String, &QueueInfo, Vec<&NodeInfo>), c: char| -> String {
        match c {
            'P' => part.clone(),
            'a' => if queue.spec.enabled { "up" } else { "drain" }.into(),
            'l' => queue.spec.max_walltime_secs.map(f::slurm_duration).unwrap_or_else(|| "infinite".into()),
            'D' => group.len().to_string(),
            'N' => f::hostlist(&group.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()),
            'n' => group.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(","),
            'F' => {
                let count = |s: &str| group.iter().filter(|n| node_state(n).0.trim_end_matches('*') == s).count();
                let (a, i) = (count("alloc") + count("mix"), count("idle"));
                format!("{a}/{i}/{}/{}", group.len() - a - i, group.len())
            }
            'C' => {
                let alloc: usize = group.iter().map(|n| n.cpus_allocated.min(n.pus)).sum();
                let total: usize = group.iter().map(|n| n.pus).sum();
                let other: usize = group
                    .iter()
                    .filter(|n| !n.state.starts_with("up"))
                    .map(|n| n.pus - n.cpus_allocated.min(n.pus))
                    .sum();
                format!("{alloc}/{}/{other}/{total}", total.saturating_sub(alloc + other))
            }
            's' => "unlimited".into(),
            'r' => "no".into(),
            'h' => "NO".into(),
            'g' => "all".into(),
            other => group.first().map(|n| sinfo_node_field(n, other)).unwrap_or_default(),
        }
    };
    // `%#X` widths: the widest of the header and the values.
    let mut spec = q.format.clone();
    while let Some(at) = spec.find("%#") {
        let field = spec[at + 2..].chars().next().unwrap_or('P');
        let width = rows
            .iter()
            .map(|r| value(r, field).chars().count())
            .chain(std::iter::once(sinfo_header(field).len()))
            .max()
            .unwrap_or(0);
        spec.replace_range(at..at + 2, &format!("%{width}"));
    }
    let pieces = f::parse_format(&spec).unwrap_or_default();
    let mut out = String::new();
    if q.header {
        out.push_str(f::render(&pieces, |c| sinfo_header(c).to_string()).trim_end());
        out.push('\n');
    }
    for r in &rows {
        out.push_str(&f::render(&pieces, |c| value(r, c)));
        out.push('\n');
    }
    out
}

fn sinfo_node_field(n: &NodeInfo, c: char) -> String {
    match c {
        't' => node_state(n).0,
        'T' => node_state(n).1,
        'c' => n.pus.to_string(),
        'm' => (n.memory_bytes >> 20).to_string(),
        'z' => {
            let cores = n.cores / n.sockets.max(1);
            let threads = n.pus / n.cores.max(1);
            format!("{}:{cores}:{threads}", n.sockets)
        }
        _ => String::new(),
    }
}

fn sinfo_header(c: char) -> &'static str {
    match c {
        'P' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' | 'n' => "NODELIST",
        'c' => "CPUS",
        'm' => "MEMORY",
        'C' => "CPUS(A/I/O/T)",
        'F' => "NODES(A/I/O/T)",
        'z' => "S:C:T",
        's' => "JOB_SIZE",
        'r' => "ROOT",
        'h' => "OVERSUBS",
        'g' => "GROUPS",
        _ => "",
    }
}

pub async fn sinfo(dir: &Path, args: Vec<String>) -> Result<i32> {
    let q = match sinfo_query(&args) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("sinfo: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if let Some(info) = &q.info {
        print!("{info}");
        return Ok(0);
    }
    let ClientResponse::Queues { queues } = request(dir, ClientRequest::Queues).await? else {
        bail!("unexpected answer")
    };
    let ClientResponse::Nodes { nodes, .. } = request(dir, ClientRequest::ListNodes { topology: false }).await? else {
        bail!("unexpected answer")
    };
    print!("{}", crate::output::terminal_safe(&sinfo_table(&q, &queues, &nodes)));
    Ok(0)
}

#[cfg(test)]
pub(crate) mod tests;
