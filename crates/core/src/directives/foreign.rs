//! `#SBATCH` (Slurm) and `#PBS` (PBS Pro / Torque) directives, read as their own tools read
//! them and mapped onto berth's options (the table is docs/compat.md). A directive berth does
//! not support is never dropped silently: it is an error naming the line and the directive,
//! or, when the submitter asks (`--ignore-unsupported`), a warning.

use super::array::{ArrayError, ArraySpec};
use super::depend::{Begin, BeginError, DepError, Dependency};
use super::extra::OptionValueError;
use super::{Join, OptionError, SubmitOptions, UnterminatedQuote};
use crate::job::{MAX_GPUS_PER_JOB, MAX_GPUS_PER_NODE};
use crate::units::parse_size;

/// What the foreign directives of a script give.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Foreign {
    pub options: SubmitOptions,
    /// Directives berth does not support: (line, what and why).
    pub unsupported: Vec<(usize, String)>,
}

/// Why a script's foreign directives are refused: the line (1-based) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct ForeignError {
    pub line: usize,
    pub kind: LineError,
}

/// What is wrong with a directive line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error(transparent)]
    Quote(#[from] UnterminatedQuote),
    /// A directive of the line's dialect (`#SBATCH`, `#PBS`), malformed.
    #[error("{prefix}: {error}")]
    Directive { prefix: &'static str, error: DirectiveError },
}

/// Why a supported directive's value is refused (an unsupported directive is a warning or
/// an error of its own: [`Foreign::unsupported`]). Each message names the flag, as the
/// directive spells it, and what to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectiveError {
    #[error("expected an option, found {0:?}")]
    NotAnOption(String),
    #[error("{0} needs a value")]
    NeedsValue(String),
    #[error("{flag} needs a positive number, got {value:?}")]
    NotPositive { flag: String, value: String },
    #[error("{flag} needs a node count or min-max, got {value:?}")]
    NodeCount { flag: String, value: String },
    #[error("{flag} needs a size such as {example}, got {value:?}")]
    Size { flag: String, example: &'static str, value: String },
    #[error("{flag}: {value:?} is not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)")]
    SlurmTime { flag: String, value: String },
    #[error("{flag}: {why}")]
    Dependency { flag: String, why: String },
    #[error("{flag}: {source}")]
    Begin { flag: String, source: BeginError },
    #[error("{flag} takes no value (or =off), got {value:?}")]
    NoValue { flag: String, value: String },
    #[error("{flag} takes append or truncate, got {value:?}")]
    OpenMode { flag: String, value: String },
    #[error("{flag}: {source}")]
    Array { flag: String, source: ArrayError },
    /// PBS's `-J` (its message names no flag).
    #[error(transparent)]
    PbsArray(ArrayError),
    #[error("{flag}: {item:?} is not gpu[:type][:count]")]
    Gres { flag: String, item: String },
    #[error("{flag} needs a GPU count from 1 to {max}, got {value:?}")]
    GpuCount { flag: String, max: u32, value: String },
    #[error("{flag} needs a socket count from 1 to {max}, got {value:?}")]
    SocketCount { flag: String, max: u32, value: String },
    #[error(transparent)]
    Option(#[from] OptionError),
    #[error(transparent)]
    GresList(#[from] crate::gres::GresError),
    #[error(transparent)]
    Value(#[from] OptionValueError),
    /// A value refused by berth's own parser, whose message names berth's flag (`from`):
    /// the directive's flag (`to`) is named instead.
    #[error("{}", .source.to_string().replace(.from, .to))]
    Renamed { source: OptionValueError, from: &'static str, to: String },
    #[error("-n is too large")]
    TooManyTasks,
    #[error("-S needs the path of a shell")]
    NoShell,
    #[error("-j takes oe, eo or n, got {0:?}")]
    Join(String),
    #[error("-r takes y or n, got {0:?}")]
    Rerun(String),
    #[error("-l {0}: expected name=value")]
    Resource(String),
    #[error("-l {res}: expected name=value, got {item:?}")]
    ChunkItem { res: String, item: String },
    #[error("-l {res}: bad size {value:?}")]
    BadSize { res: String, value: String },
    #[error("-l {res}: ncpus={ncpus} is not a multiple of mpiprocs={procs}")]
    NotMultiple { res: String, ncpus: u32, procs: u32 },
    #[error("-l walltime needs [[HH:]MM:]SS, got {0:?}")]
    Walltime(String),
    #[error("the pattern %{0} is not supported (%j or %J job id, %x job name, %u user, %A array id, %a array index, %% a percent sign are)")]
    OutputPattern(String),
}

/// A directive line's dialect, by its prefix.
fn dialect(line: &str) -> Option<(&'static str, &str)> {
    for prefix in ["#SBATCH", "#PBS"] {
        if let Some(rest) = line.strip_prefix(prefix) {
            if rest.is_empty() || rest.starts_with(char::is_whitespace) {
                return Some((prefix, rest));
            }
        }
    }
    None
}

/// Read the `#SBATCH` and `#PBS` lines of `script`'s directive block (the lines after `#!`
/// up to the first command). A malformed value of a supported directive is always an error,
/// with its line.
pub fn parse_foreign(script: &str) -> Result<Foreign, ForeignError> {
    let mut out = Foreign::default();
    // Resolved once every line is read: their meaning depends on other directives.
    let mut later = Later {
        shebang: script
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("#!"))
            .and_then(|l| l.split_whitespace().next())
            .map(String::from),
        ..Later::default()
    };
    let mut slurm = false;
    for (index, raw) in script.lines().enumerate().skip(1) {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some((prefix, rest)) = dialect(line) else { continue };
        // Slurm stops reading a line at its first `#` after the directive (a comment).
        let rest = if prefix == "#SBATCH" { rest.split(" #").next().unwrap_or(rest) } else { rest };
        let tokens = super::tokenize(rest).map_err(|q| ForeignError { line: line_no, kind: q.into() })?;
        let mut o = out.options.clone();
        let mut unsupported = Vec::new();
        let result = if prefix == "#SBATCH" {
            slurm = true;
            slurm_line(&tokens, &mut o, &mut later, &mut unsupported)
        } else {
            pbs_line(&tokens, &mut o, &mut later, &mut unsupported)
        };
        result.map_err(|error| ForeignError { line: line_no, kind: LineError::Directive { prefix, error } })?;
        if let Some((line @ 0, n)) = later.ntasks {
            later.ntasks = Some((line + line_no, n));
        }
        out.options = o;
        out.unsupported.extend(unsupported.into_iter().map(|m| (line_no, format!("{prefix} {m}"))));
    }
    let o = &mut out.options;
    // A Slurm script's outputs follow Slurm's rule (`output_patterns`), unless `#PBS -j` says.
    if slurm && o.join.is_none() {
        o.join = Some(Join::Slurm);
    }
    // `-n` is tasks: per node when the node count is known, else the job's total cores.
    if let Some((line, n)) = later.ntasks {
        match (o.nodes, o.tasks_per_node) {
            (Some(nodes), None) => {
                o.tasks_per_node = Some(n.div_ceil(nodes));
                // Uneven (`-N 2 -n 5`): 3 CPUs a node, and the job's 5 tasks kept (3 + 2).
                if !n.is_multiple_of(nodes) {
                    o.tasks = Some(super::JobTasks { total: n, per_node: None });
                }
            }
            (None, Some(per)) => o.nodes = Some(n.div_ceil(per)),
            (Some(_), Some(_)) => {}
            (None, None) => {
                let error = DirectiveError::TooManyTasks;
                let too_large = ForeignError { line, kind: LineError::Directive { prefix: "#SBATCH", error } };
                o.cores = Some(n.checked_mul(o.cpus_per_task.unwrap_or(1)).ok_or(too_large)?)
            }
        }
    }
    // PBS `-l mem` is the job's total: per node when the node count is known.
    if let Some(total) = later.pbs_mem {
        o.mem = Some(total.div_ceil(u64::from(o.nodes.unwrap_or(1))));
    }
    Ok(out)
}

/// Directives whose meaning depends on others, wherever those are written.
#[derive(Default)]
struct Later {
    /// Slurm's `-n`, with its line.
    ntasks: Option<(usize, u32)>,
    /// PBS's `-l mem`.
    pbs_mem: Option<u64>,
    /// The script's interpreter, from its `#!` line (PBS's `-S` must name it).
    shebang: Option<String>,
}

/// Options of one directive line: `(flag, value)` pairs, from `--long=value`, `--long value`,
/// `-x value` and `-xvalue`; `takes_value` tells which flags have one.
fn pairs(
    tokens: &[String],
    takes_value: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Option<String>)>, DirectiveError> {
    pairs_with(tokens, takes_value, |_| false)
}

/// `pairs`, where a flag for which `optional` holds (one berth does not know, so it cannot
/// tell whether it takes a value) has none when no value follows it (the line ends, or the
/// next word is an option): `#SBATCH --get-user-env` is then an unsupported directive, not
/// a malformed one.
fn pairs_with(
    tokens: &[String],
    takes_value: impl Fn(&str) -> bool,
    optional: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Option<String>)>, DirectiveError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let tok = &tokens[i];
        i += 1;
        let (flag, inline) = if let Some(long) = tok.strip_prefix("--") {
            match long.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
                None => (tok.clone(), None),
            }
        } else if tok.starts_with('-') && tok.len() > 1 {
            // `-x` and what follows it (a value written against the flag); `x` may be any char.
            let cut = tok.char_indices().nth(2).map_or(tok.len(), |(i, _)| i);
            let (f, v) = tok.split_at(cut);
            (f.to_string(), (!v.is_empty()).then(|| v.trim_start_matches('=').to_string()))
        } else {
            return Err(DirectiveError::NotAnOption(tok.clone()));
        };
        let value = match (inline, takes_value(&flag)) {
            (Some(v), _) => Some(v),
            (None, true) if optional(&flag) && tokens.get(i).is_none_or(|t| t.starts_with('-')) => None,
            (None, true) => {
                let v = tokens.get(i).cloned().ok_or_else(|| DirectiveError::NeedsValue(flag.clone()))?;
                i += 1;
                Some(v)
            }
            (None, false) => None,
        };
        out.push((flag, value));
    }
    Ok(out)
}

/// Slurm's flags that take no value (all others take one).
const SLURM_SWITCHES: &[&str] = &[
    "--requeue",
    "--no-requeue",
    "--exclusive",
    "-H",
    "--hold",
    "-W",
    "--wait",
    "--parsable",
    "--overcommit",
    "-O",
    "-k",
    "--no-kill",
    "--contiguous",
    "--spread-job",
    "--use-min-nodes",
    "--test-only",
    "--reboot",
    "--ignore-pbs",
    "-s",
    "--oversubscribe",
    "-Q",
    "--quiet",
    "-v",
    "--verbose",
];

/// Slurm's flags that take a value and that berth reads (`slurm_line`): a value is required.
/// Any other flag may be written without one (`--get-user-env`).
const SLURM_VALUED: &[&str] = &[
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "--ntasks-per-node",
    "-c",
    "--cpus-per-task",
    "--mem",
    "--mem-per-cpu",
    "-t",
    "--time",
    "-J",
    "--job-name",
    "-o",
    "--output",
    "-e",
    "--error",
    "-p",
    "--partition",
    "-A",
    "--account",
    "-d",
    "--dependency",
    "-b",
    "--begin",
    "--comment",
    "-D",
    "--chdir",
    "--export",
    "--signal",
    "--mail-type",
    "--mail-user",
    "-q",
    "--qos",
    "-a",
    "--array",
    "-C",
    "--constraint",
    "--gres",
    "-L",
    "--licenses",
    "-G",
    "--gpus",
    "--gpus-per-node",
    "--gpus-per-task",
    "--gpus-per-socket",
    "--sockets-per-node",
    "--cpus-per-gpu",
    "--mem-per-gpu",
    "--gpu-bind",
    "--gres-flags",
];

fn slurm_line(
    tokens: &[String],
    o: &mut SubmitOptions,
    later: &mut Later,
    unsupported: &mut Vec<String>,
) -> Result<(), DirectiveError> {
    for (flag, value) in pairs_with(tokens, |f| !SLURM_SWITCHES.contains(&f), |f| !SLURM_VALUED.contains(&f))? {
        let v = value.clone().unwrap_or_default();
        let shown = match &value {
            Some(v) => format!("{flag}={v}"),
            None => flag.clone(),
        };
        let count = |what: &str| -> Result<u32, DirectiveError> {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| DirectiveError::NotPositive { flag: what.into(), value: v.clone() })
        };
        match flag.as_str() {
            "-N" | "--nodes" => {
                // min[-max]: berth allocates exactly the minimum.
                let min = v.split('-').next().unwrap_or("");
                o.nodes = Some(
                    min.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| DirectiveError::NodeCount { flag: flag.clone(), value: v.clone() })?,
                );
            }
            "-n" | "--ntasks" => later.ntasks = Some((0, count(&flag)?)),
            "--ntasks-per-node" => o.tasks_per_node = Some(count(&flag)?),
            "-c" | "--cpus-per-task" => o.cpus_per_task = Some(count(&flag)?),
            "--mem" => {
                let bytes = slurm_size(&v).ok_or_else(|| size(&flag, "4000 (MB) or 4G", &v))?;
                if bytes == 0 {
                    unsupported.push(format!("{shown}: all of a node's memory is not supported; give a size"));
                } else {
                    o.mem = Some(bytes);
                }
            }
            "--mem-per-cpu" => {
                o.mem_per_cpu =
                    Some(slurm_size(&v).filter(|b| *b > 0).ok_or_else(|| size(&flag, "2000 (MB) or 2G", &v))?)
            }
            "-t" | "--time" => match slurm_time(&v) {
                Some(Some(secs)) => o.walltime = Some(secs),
                Some(None) => unsupported.push(format!("{shown}: an unlimited time is not supported; give a limit")),
                None => return Err(DirectiveError::SlurmTime { flag, value: v }),
            },
            "-J" | "--job-name" => o.name = Some(nonempty(&flag, &v)?),
            "-o" | "--output" => match output_pattern(&v) {
                Ok(p) => o.output = Some(p),
                Err(why) => unsupported.push(format!("{shown}: {why}")),
            },
            "-e" | "--error" => match output_pattern(&v) {
                Ok(p) => o.error = Some(p),
                Err(why) => unsupported.push(format!("{shown}: {why}")),
            },
            "-p" | "--partition" => {
                if v.contains(',') {
                    unsupported.push(format!("{shown}: a list of partitions is not supported; give one queue"));
                } else {
                    o.queue = Some(nonempty(&flag, &v)?);
                }
            }
            "-A" | "--account" => o.account = Some(nonempty(&flag, &v)?),
            "--requeue" => o.requeue = Some(true),
            "--no-requeue" => o.requeue = Some(false),
            "-d" | "--dependency" => match Dependency::parse_slurm(&v) {
                Ok(d) => o.dependency = Some(d),
                Err(DepError::Unsupported(why)) => unsupported.push(format!("{shown}: {why}")),
                Err(DepError::Bad(why)) => return Err(DirectiveError::Dependency { flag, why }),
            },
            "-b" | "--begin" => {
                o.begin = Some(Begin::parse(&v).map_err(|source| DirectiveError::Begin { flag, source })?)
            }
            "-H" | "--hold" => o.hold = Some(true),
            // Keep running when one of the job's nodes fails: berth's `--no-kill`.
            "-k" | "--no-kill" => match value.as_deref() {
                None => o.no_kill = Some(true),
                Some(v) if v.eq_ignore_ascii_case("off") => o.no_kill = Some(false),
                Some(_) => return Err(DirectiveError::NoValue { flag, value: v }),
            },
            "--comment" => {
                let comment = super::extra::parse_comment(&v);
                let renamed = |source| DirectiveError::Renamed { source, from: "--comment", to: flag.clone() };
                o.comment = Some(comment.map_err(renamed)?)
            }
            "-D" | "--chdir" => o.chdir = Some(super::extra::parse_chdir(&v)?),
            "--export" => o.export = Some(super::Export::parse_slurm(&v)?),
            "--signal" => o.signal = Some(super::SignalSpec::parse(&v)?),
            "--mail-type" => o.mail_type = Some(super::MailTypes::parse_slurm(&v)?),
            "--mail-user" => o.mail_user = Some(super::extra::parse_mail_user(&v)?),
            "--exclusive" => match value.as_deref() {
                None => o.exclusive = Some(true),
                Some(_) => {
                    unsupported.push(format!("{shown}: only --exclusive (whole nodes) is supported, not =user or =mcs"))
                }
            },
            "-q" | "--qos" => o.qos = Some(nonempty(&flag, &v)?),
            "--open-mode" => {
                o.open_append = Some(match v.trim() {
                    "append" | "a" | "A" => true,
                    "truncate" | "t" | "T" => false,
                    _ => return Err(DirectiveError::OpenMode { flag, value: v }),
                })
            }
            // Accounting's workload key: recorded by Slurm only with TrackWCKey=yes (off by
            // default), where it changes nothing about the job; berth tracks none either.
            "--wckey" => {
                nonempty(&flag, &v)?;
            }
            "-a" | "--array" => {
                o.array = Some(ArraySpec::parse_slurm(&v).map_err(|source| DirectiveError::Array { flag, source })?)
            }
            "-C" | "--constraint" => {
                let props: Vec<String> = v.split(['&', ',']).map(|p| p.trim().to_string()).collect();
                if v.contains(['|', '[', ']', '*']) || props.iter().any(|p| p.is_empty()) {
                    unsupported.push(format!("{shown}: only a list of required features (a&b or a,b) is supported"));
                } else {
                    o.properties = Some(props);
                }
            }
            // Generic resources per node: `gpu[:type][:count]` items are GPUs, others
            // `name[:type][:count]` counts of the nodes' `[gres]` (no type: any type).
            "--gres" => {
                let mut gres = o.gres.clone().unwrap_or_default();
                // A job's GPUs are of one type: several gpu items are not read (the last
                // silently won before).
                let gpu_items = v.split(',').filter(|i| i.trim().split(':').next() == Some("gpu")).count();
                if gpu_items > 1 {
                    unsupported.push(format!(
                        "{shown}: GPUs of several types (or gpu twice) in one job are not supported: give one gpu item"
                    ));
                }
                for item in v.split(',').map(str::trim) {
                    let mut parts = item.split(':');
                    let name = parts.next().unwrap_or("");
                    if name == "gpu" && gpu_items > 1 {
                        continue;
                    }
                    if name != "gpu" {
                        let (name, kind, count) = crate::gres::split_item(&flag, item)?;
                        if kind.is_some_and(|k| !crate::gres::valid_name(k)) {
                            return Err(DirectiveError::Gres { flag, item: item.into() });
                        }
                        let key = crate::gres::key(name, kind);
                        gres.remove(&key);
                        crate::gres::insert(&flag, &mut gres, &key, count)?;
                        continue;
                    }
                    let rest: Vec<&str> = parts.collect();
                    let (kind, count) = match rest.as_slice() {
                        [] => (None, "1"),
                        [one] if one.parse::<u64>().is_ok() => (None, *one),
                        [kind] => (Some(*kind), "1"),
                        [kind, count] => (Some(*kind), *count),
                        _ => return Err(DirectiveError::Gres { flag, item: item.into() }),
                    };
                    o.gpus_per_node = Some(slurm_gpu_count(&flag, count, MAX_GPUS_PER_NODE)?);
                    if let Some(kind) = kind {
                        o.gpu_type = Some(super::gpu_type(flag.trim_start_matches('-'), kind)?);
                    }
                }
                if !gres.is_empty() {
                    o.gres = Some(gres);
                }
            }
            // Cluster-wide licenses: `name[:count][,...]`; Slurm's `|` (any of) and remote
            // `name@server` licenses are not supported.
            "-L" | "--licenses" => {
                if v.contains(['|', '@']) {
                    unsupported.push(format!(
                        "{shown}: not supported: only a list of NAME[:COUNT] is (no | alternatives, no @server licenses)"
                    ));
                } else {
                    o.licenses = Some(crate::gres::parse_list(&flag, &v)?);
                }
            }
            // `[type:]count`, for the whole job or for each node.
            "-G" | "--gpus" | "--gpus-per-node" => {
                if v.contains(',') {
                    unsupported.push(format!("{shown}: GPUs of several types in one job are not supported"));
                    continue;
                }
                let (kind, count) = match v.rsplit_once(':') {
                    Some((kind, count)) => (Some(kind), count),
                    None => (None, v.as_str()),
                };
                if flag == "--gpus-per-node" {
                    o.gpus_per_node = Some(slurm_gpu_count(&flag, count, MAX_GPUS_PER_NODE)?);
                } else {
                    o.gpus = Some(slurm_gpu_count(&flag, count, MAX_GPUS_PER_JOB)?);
                }
                if let Some(kind) = kind {
                    o.gpu_type = Some(super::gpu_type(flag.trim_start_matches('-'), kind)?);
                }
            }
            "--cpus-per-gpu" => o.cpus_per_gpu = Some(count(&flag)?),
            "--mem-per-gpu" => {
                o.mem_per_gpu =
                    Some(slurm_size(&v).filter(|b| *b > 0).ok_or_else(|| size(&flag, "16000 (MB) or 16G", &v))?)
            }
            "--gpus-per-task" | "--gpus-per-socket" => {
                if v.contains(',') {
                    unsupported.push(format!("{shown}: GPUs of several types in one job are not supported"));
                    continue;
                }
                let (kind, n) = match v.rsplit_once(':') {
                    Some((kind, n)) => (Some(kind), n),
                    None => (None, v.as_str()),
                };
                let n = Some(slurm_gpu_count(&flag, n, MAX_GPUS_PER_NODE)?);
                if flag == "--gpus-per-task" {
                    o.gpus_per_task = n;
                } else {
                    o.gpus_per_socket = n;
                }
                if let Some(kind) = kind {
                    o.gpu_type = Some(super::gpu_type(flag.trim_start_matches('-'), kind)?);
                }
            }
            // Slurm's verbose, and every binding form berth knows (berth_core::gpu::GpuBind).
            "--gpu-bind" => match crate::gpu::GpuBind::parse(v.trim_start_matches("verbose,")) {
                Ok(b) => o.gpu_bind = Some(b.to_string()),
                Err(e) => unsupported.push(format!("{shown}: {e}")),
            },
            // Slurm's GRES binding: enforce-binding waits for cores next to the GPUs,
            // disable-binding takes any core of the node (berth's --gpu-locality).
            "--gres-flags" => {
                for flag_word in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                    match flag_word {
                        "enforce-binding" => o.gpu_locality = Some(crate::gpu::GpuLocality::Strict),
                        "disable-binding" => o.gpu_locality = Some(crate::gpu::GpuLocality::Prefer),
                        _ => unsupported.push(format!(
                            "{shown}: {:?} is not supported (of --gres-flags, enforce-binding and disable-binding are)",
                            flag_word.escape_debug().to_string()
                        )),
                    }
                }
            }
            "--sockets-per-node" => {
                o.sockets_per_node = Some(
                    v.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|s| (1..=crate::job::MAX_SOCKETS_PER_NODE).contains(s))
                        .ok_or_else(|| DirectiveError::SocketCount {
                            flag: flag.to_string(),
                            max: crate::job::MAX_SOCKETS_PER_NODE,
                            value: v.to_string(),
                        })?,
                )
            }
            _ => unsupported.push(format!("{shown}: not supported (docs/compat.md lists what is)")),
        }
    }
    Ok(())
}

/// PBS flags that take no value.
const PBS_SWITCHES: &[&str] = &["-V", "-h"];

fn pbs_line(
    tokens: &[String],
    o: &mut SubmitOptions,
    later: &mut Later,
    unsupported: &mut Vec<String>,
) -> Result<(), DirectiveError> {
    for (flag, value) in pairs(tokens, |f| !PBS_SWITCHES.contains(&f) && f.starts_with('-'))? {
        let v = value.clone().unwrap_or_default();
        let shown = match &value {
            Some(v) => format!("{flag} {v}"),
            None => flag.clone(),
        };
        match flag.as_str() {
            "-l" => {
                for res in v.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                    pbs_resource(res, o, later, unsupported)?;
                }
            }
            "-N" => o.name = Some(nonempty(&flag, &v)?),
            // The interpreter of the script: berth runs a script with its `#!` line, so `-S`
            // naming that interpreter (`#!/bin/bash` and `-S /bin/bash`, as parsl writes) is
            // what happens anyway; another one is not supported.
            "-S" => {
                let shell = v.split(',').next().unwrap_or("").split('@').next().unwrap_or("").trim();
                if shell.is_empty() {
                    return Err(DirectiveError::NoShell);
                }
                if later.shebang.as_deref() != Some(shell) {
                    unsupported.push(format!(
                        "{shown}: berth runs the script with its #! line ({}); make that line #!{shell}",
                        later.shebang.as_deref().unwrap_or("none")
                    ));
                }
            }
            "-q" => o.queue = Some(nonempty(&flag, &v)?),
            "-A" => o.account = Some(nonempty(&flag, &v)?),
            "-o" | "-e" => {
                if v.contains(':') {
                    unsupported.push(format!("{shown}: a host:path destination is not supported; give a path"));
                } else if flag == "-o" {
                    o.output = Some(nonempty(&flag, &v)?);
                } else {
                    o.error = Some(nonempty(&flag, &v)?);
                }
            }
            "-j" => {
                o.join = Some(match v.trim() {
                    "oe" => Join::Output,
                    "eo" => Join::Error,
                    "n" => Join::Neither,
                    _ => return Err(DirectiveError::Join(v)),
                })
            }
            "-r" => match v.as_str() {
                "y" => o.requeue = Some(true),
                "n" => o.requeue = Some(false),
                _ => return Err(DirectiveError::Rerun(v)),
            },
            "-h" => o.hold = Some(true),
            // berth passes the whole submitting environment, as -V asks.
            "-V" => {
                o.export = Some(
                    o.export
                        .take()
                        .map(|e| super::Export { all: true, ..e })
                        .unwrap_or(super::Export { all: true, vars: vec![] }),
                )
            }
            "-v" => {
                let mut e = super::Export::parse_pbs(&v)?;
                if let Some(before) = o.export.take() {
                    e.vars.splice(0..0, before.vars);
                }
                o.export = Some(e)
            }
            "-m" => o.mail_type = Some(super::MailTypes::parse_pbs(&v)?),
            "-M" => {
                let renamed = |source| DirectiveError::Renamed { source, from: "--mail-user", to: "-M".into() };
                o.mail_user = Some(super::extra::parse_mail_user(&v).map_err(renamed)?)
            }
            "-J" => o.array = Some(ArraySpec::parse_pbs(&v).map_err(DirectiveError::PbsArray)?),
            "-W" => match v.trim().strip_prefix("depend=") {
                Some(list) => match Dependency::parse_pbs(list) {
                    Ok(d) => o.dependency = Some(d),
                    Err(DepError::Unsupported(why)) => unsupported.push(format!("{shown}: {why}")),
                    Err(DepError::Bad(why)) => {
                        return Err(DirectiveError::Dependency { flag: "-W depend".into(), why })
                    }
                },
                None => {
                    unsupported.push(format!("{shown}: only -W depend=... is supported (docs/compat.md lists what is)"))
                }
            },
            _ => unsupported.push(format!("{shown}: not supported (docs/compat.md lists what is)")),
        }
    }
    Ok(())
}

/// PBS resources for GPUs berth does not read (`ngpus` and `gpu_type` in a chunk, Torque's
/// `gpus=` on `nodes=` and a job-wide `ngpus` it does).
const PBS_GPU_RESOURCES: &[&str] = &["ngpus", "gpus", "gpu_type", "gpu_model", "naccelerators", "accelerator_model"];

/// PBS's own resources (PBS Pro's "Resources built into PBS", Torque's): a `name=COUNT` of
/// one of these is not a site's custom resource, so never read as a generic resource or a
/// license (those that berth reads are matched before).
const PBS_BUILTIN_RESOURCES: &[&str] = &[
    "accelerator",
    "accelerator_memory",
    "aoe",
    "arch",
    "cpupercent",
    "cput",
    "eoe",
    "exec_vnode",
    "file",
    "host",
    "max_walltime",
    "mem",
    "min_walltime",
    "model",
    "mpiprocs",
    "naccelerators",
    "nchunk",
    "ncpus",
    "nice",
    "nodect",
    "nodes",
    "ompthreads",
    "pcput",
    "pmem",
    "preempt_targets",
    "pvmem",
    "select",
    "site",
    "soft_walltime",
    "software",
    "start_time",
    "vmem",
    "vnode",
    "vntype",
    "walltime",
];

/// A site's custom PBS resource `name=COUNT`: a name berth may count (not one of PBS's own)
/// with a whole number; the count checked as a `[gres]` or `[licenses]` count.
fn pbs_custom(res: &str, name: &str, value: &str) -> Result<Option<u32>, DirectiveError> {
    let counted = crate::gres::valid_name(name)
        && !PBS_BUILTIN_RESOURCES.contains(&name)
        && !PBS_GPU_RESOURCES.contains(&name)
        && !value.is_empty()
        && value.chars().all(|c| c.is_ascii_digit());
    if !counted {
        return Ok(None);
    }
    Ok(Some(crate::gres::parse_count(&format!("-l {res}"), name, value)?))
}

/// Add `name = count` to the counts `to` (a job's gres or licenses), the last one given
/// winning as for every other PBS resource.
fn add_count(res: &str, to: &mut Option<crate::gres::Counts>, name: &str, count: u32) -> Result<(), DirectiveError> {
    let mut counts = to.take().unwrap_or_default();
    counts.remove(name);
    crate::gres::insert(&format!("-l {res}"), &mut counts, name, count)?;
    *to = Some(counts);
    Ok(())
}

/// A GPU count from a foreign directive: 1 to `max`.
fn slurm_gpu_count(flag: &str, v: &str, max: u32) -> Result<u32, DirectiveError> {
    v.trim().parse::<u32>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| DirectiveError::GpuCount {
        flag: flag.into(),
        max,
        value: v.into(),
    })
}

/// A size refused: `example` shows what to give.
fn size(flag: &str, example: &'static str, v: &str) -> DirectiveError {
    DirectiveError::Size { flag: flag.into(), example, value: v.into() }
}

/// One `-l` resource: `select=...`, `nodes=N:ppn=P`, `walltime`, `mem`, `ncpus`, `place`.
fn pbs_resource(
    res: &str,
    o: &mut SubmitOptions,
    later: &mut Later,
    unsupported: &mut Vec<String>,
) -> Result<(), DirectiveError> {
    let (name, value) = res.split_once('=').ok_or_else(|| DirectiveError::Resource(res.into()))?;
    let number = |what: &str, v: &str| -> Result<u32, DirectiveError> {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| DirectiveError::NotPositive { flag: format!("-l {what}"), value: v.into() })
    };
    let bad_size = |res: &str, v: &str| DirectiveError::BadSize { res: res.into(), value: v.into() };
    match name.trim() {
        "select" => {
            if value.contains('+') {
                unsupported.push(format!("-l {res}: several chunk kinds (+) are not supported"));
                return Ok(());
            }
            let mut parts = value.split(':');
            let count = parts.next().unwrap_or("");
            // `select=ncpus=4` has no leading count: one chunk.
            let (chunks, rest): (u32, Vec<&str>) = if count.contains('=') {
                (1, std::iter::once(count).chain(parts).collect())
            } else {
                (number("select", count)?, parts.collect())
            };
            let (mut ncpus, mut procs) = (1u32, None);
            for kv in rest {
                let (k, v) =
                    kv.split_once('=').ok_or_else(|| DirectiveError::ChunkItem { res: res.into(), item: kv.into() })?;
                match k {
                    "ncpus" => ncpus = number("ncpus", v)?,
                    "mpiprocs" => procs = Some(number("mpiprocs", v)?),
                    "mem" => o.mem = Some(pbs_size(v).ok_or_else(|| bad_size(res, v))?),
                    // OpenMP threads per rank: the job gets ncpus/mpiprocs CPUs per rank in
                    // any case; the count itself only sets OMP_NUM_THREADS under PBS.
                    "ompthreads" => {
                        number("ompthreads", v)?;
                    }
                    // GPUs of each chunk, so of each node.
                    "ngpus" => o.gpus_per_node = Some(slurm_gpu_count("-l ngpus", v, MAX_GPUS_PER_NODE)?),
                    "gpu_type" => o.gpu_type = Some(super::gpu_type("gpu_type", v)?),
                    k if PBS_GPU_RESOURCES.contains(&k) => unsupported.push(format!(
                        "-l {res}: chunk resource {k} is not supported (of the GPU resources, ngpus and gpu_type are)"
                    )),
                    // A site's host-level resource (`nvme=10`): so many of the `[gres]` of
                    // that name on each chunk's node (docs/gres.md).
                    k => match pbs_custom(res, k, v)? {
                        Some(n) => add_count(res, &mut o.gres, k, n)?,
                        None => unsupported.push(format!("-l {res}: chunk resource {k} is not supported")),
                    },
                }
            }
            let procs = procs.unwrap_or(1);
            if ncpus % procs != 0 {
                return Err(DirectiveError::NotMultiple { res: res.into(), ncpus, procs });
            }
            o.nodes = Some(chunks);
            o.tasks_per_node = Some(procs);
            o.cpus_per_task = Some(ncpus / procs);
        }
        "nodes" => {
            let mut parts = value.split(':');
            o.nodes = Some(number("nodes", parts.next().unwrap_or(""))?);
            for kv in parts {
                match kv.split_once('=') {
                    Some(("ppn", p)) => o.tasks_per_node = Some(number("ppn", p)?),
                    // Torque's GPUs per node.
                    Some(("gpus", g)) => o.gpus_per_node = Some(slurm_gpu_count("-l gpus", g, MAX_GPUS_PER_NODE)?),
                    Some((k, _)) if PBS_GPU_RESOURCES.contains(&k) => unsupported
                        .push(format!("-l {res}: node resource {k} is not supported (of the GPU resources, gpus is)")),
                    _ => unsupported.push(format!("-l {res}: node property {kv:?} is not supported")),
                }
            }
        }
        "walltime" => {
            o.walltime = Some(hms(value).filter(|s| *s > 0).ok_or_else(|| DirectiveError::Walltime(value.into()))?)
        }
        "mem" => {
            later.pbs_mem = Some(pbs_size(value).filter(|b| *b > 0).ok_or_else(|| bad_size("mem", value))?);
        }
        "ncpus" => o.cores = Some(number("ncpus", value)?),
        "place" => {
            // berth puts each chunk on its own node, as `scatter` asks; `excl` (and `exclhost`)
            // is berth's `--exclusive`, `shared` its default.
            for p in value.split(':') {
                match p {
                    "scatter" | "free" | "shared" => {}
                    "excl" | "exclhost" => o.exclusive = Some(true),
                    _ => {
                        unsupported.push(format!(
                            "-l {res}: only place=scatter (and free), with excl, exclhost or shared, is supported"
                        ));
                        break;
                    }
                }
            }
        }
        // PBS Pro's job-wide GPU count.
        "ngpus" => o.gpus = Some(slurm_gpu_count("-l ngpus", value, MAX_GPUS_PER_JOB)?),
        k if PBS_GPU_RESOURCES.contains(&k) => unsupported.push(format!(
            "-l {res}: resource {k} is not supported (of the GPU resources, ngpus and select's ngpus and gpu_type are)"
        )),
        // A site's server-level resource requested job-wide (`-l matlab=2`), PBS's floating
        // licenses: so many of the cluster's `[licenses]` of that name (docs/gres.md).
        k => match pbs_custom(res, k, value.trim())? {
            Some(n) => add_count(res, &mut o.licenses, k, n)?,
            None => unsupported.push(format!("-l {res}: resource {name} is not supported")),
        },
    }
    Ok(())
}

fn nonempty(flag: &str, v: &str) -> Result<String, DirectiveError> {
    if v.trim().is_empty() {
        Err(DirectiveError::NeedsValue(flag.into()))
    } else {
        Ok(v.trim().to_string())
    }
}

/// The output and error patterns of a job with these options (relative to its working
/// directory): those it names, else the defaults of its dialect (`SubmitOptions::join`).
/// berth's own: `berth-%j.out` and `berth-%j.err`. Slurm's: standard error with standard
/// output unless `--error` names a file, the output `slurm-%j.out` (`slurm-%A_%a.out` for an
/// array). PBS's `-j oe`: standard error into the output file; `-j eo`: the other way round.
/// Equal patterns are one file, both streams open on it (the agent's `same_output`).
pub fn output_patterns(o: &SubmitOptions) -> (String, String) {
    let join = o.join;
    let default_out = match join {
        Some(Join::Slurm) if o.array.is_some() || o.array_task.is_some() => "slurm-%A_%a.out",
        Some(Join::Slurm) => "slurm-%j.out",
        _ => "berth-%j.out",
    };
    let out = o.output.clone().unwrap_or_else(|| default_out.to_string());
    let err = match (join, &o.error) {
        (Some(Join::Output), _) | (Some(Join::Slurm), None) => out.clone(),
        (_, Some(e)) => e.clone(),
        (_, None) => "berth-%j.err".to_string(),
    };
    if join == Some(Join::Error) {
        (err.clone(), err)
    } else {
        (out, err)
    }
}

/// Output paths: berth expands `%j`, `%x`, `%u` and `%%` (`super::expand_output`); Slurm's
/// others (arrays, nodes, tasks, padded widths) are not yet.
fn output_pattern(v: &str) -> Result<String, DirectiveError> {
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('j' | 'J' | 'x' | 'u' | 'A' | 'a' | 'N' | 'n' | 't' | '%') => {}
                other => return Err(DirectiveError::OutputPattern(other.map(String::from).unwrap_or_default())),
            }
        }
    }
    nonempty("output", v)
}

/// Slurm sizes: a bare number is megabytes; K, M, G, T suffixes (powers of 1024).
fn slurm_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let bare = v.chars().all(|c| c.is_ascii_digit());
    parse_size(&if bare { format!("{v}M") } else { v.to_string() }).ok()
}

/// PBS sizes: b, kb, mb, gb, tb (case-insensitive); a bare number is bytes.
fn pbs_size(v: &str) -> Option<u64> {
    parse_size(v.trim()).ok()
}

/// Slurm's time formats, in seconds, rounded up to whole minutes as Slurm does (its limits
/// are minutes: `-t 45:30` is 46 minutes, `0:06` one); `Some(None)` for unlimited.
fn slurm_time(v: &str) -> Option<Option<u64>> {
    let v = v.trim();
    if matches!(v.to_ascii_lowercase().as_str(), "unlimited" | "infinite") {
        return Some(None);
    }
    let secs = match v.split_once('-') {
        Some((days, rest)) => {
            let days: u64 = days.parse().ok()?;
            let f: Vec<u64> = rest.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
            let (h, m, s) = match f.as_slice() {
                [h] => (*h, 0, 0),
                [h, m] => (*h, *m, 0),
                [h, m, s] => (*h, *m, *s),
                _ => return None,
            };
            days.checked_mul(86_400)?
                .checked_add(h.checked_mul(3600)?)?
                .checked_add(m.checked_mul(60)?)?
                .checked_add(s)?
        }
        None => {
            let f: Vec<u64> = v.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
            match f.as_slice() {
                [m] => m.checked_mul(60)?,
                [m, s] => m.checked_mul(60)?.checked_add(*s)?,
                [h, m, s] => h.checked_mul(3600)?.checked_add(m.checked_mul(60)?)?.checked_add(*s)?,
                _ => return None,
            }
        }
    };
    (secs > 0).then_some(Some(secs.div_ceil(60).checked_mul(60)?))
}

/// PBS walltime: `[[HH:]MM:]SS`.
fn hms(v: &str) -> Option<u64> {
    let f: Vec<u64> = v.trim().split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    match f.as_slice() {
        [s] => Some(*s),
        [m, s] => m.checked_mul(60)?.checked_add(*s),
        [h, m, s] => h.checked_mul(3600)?.checked_add(m.checked_mul(60)?)?.checked_add(*s),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
