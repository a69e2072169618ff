//! PBS's commands: `qsub`, `qstat`, `qdel`, `qhold`, `qrls`, `qalter`, `qrerun`, `pbsnodes`.
//!
//! Job ids are printed as PBS prints them, `N.SERVER`, SERVER being this host's name up to its
//! first dot (the controller is reached through a Unix socket on this host); `N` and
//! `N.anything` are accepted. qsub's `-l` and `-r` are read exactly as `#PBS` lines are (the
//! directive table in docs/compat.md).

use super::format::{self as f, short, Arg, Opt};
use crate::client::request;
use crate::fold::PbsLine;
use crate::SubmitFlags;
use anyhow::{bail, Result};
use berth_core::directives::SubmitOptions;
use berth_core::job::JobState;
use berth_core::JobId;
use berth_protocol::client::{ClientRequest, ClientResponse, ErrorCode, JobChange, JobInfo};
use std::path::{Path, PathBuf};

/// PBS's exit status for an unknown job id (PBSE_UNKJOBID 15001, modulo 256).
pub const EXIT_UNKNOWN_JOB: i32 = 153;
/// PBS's exit status for a job that has finished (PBSE_HISTJOBID 15139, modulo 256).
pub const EXIT_FINISHED_JOB: i32 = 35;

fn version_line() -> String {
    format!("pbs_version = 2022.1.0 (berth {})", env!("CARGO_PKG_VERSION"))
}

// ---------------------------------------------------------------------------------------
// qsub

const QSUB_OPTS: &[Opt] = &[
    short('a', Arg::Required),
    short('A', Arg::Required),
    short('c', Arg::Required),
    short('C', Arg::Required),
    short('d', Arg::Required),
    short('e', Arg::Required),
    short('f', Arg::No),
    short('F', Arg::Required),
    short('h', Arg::No),
    short('I', Arg::No),
    short('j', Arg::Required),
    short('J', Arg::Required),
    short('k', Arg::Required),
    short('l', Arg::Required),
    short('m', Arg::Required),
    short('M', Arg::Required),
    short('N', Arg::Required),
    short('o', Arg::Required),
    short('p', Arg::Required),
    short('P', Arg::Required),
    short('q', Arg::Required),
    short('r', Arg::Required),
    short('S', Arg::Required),
    short('t', Arg::Required),
    short('u', Arg::Required),
    short('v', Arg::Required),
    short('V', Arg::No),
    short('w', Arg::Required),
    short('W', Arg::Required),
    short('X', Arg::No),
    short('z', Arg::No),
    f::long("version", Arg::No),
    // berth's own: submit although some options or directives are not supported.
    f::long("ignore-unsupported", Arg::No),
];

/// What a qsub command line asks for.
#[derive(Debug, Default)]
pub struct QsubPlan {
    pub flags: SubmitFlags,
    /// `-l` and `-r`, read as `#PBS` lines are.
    pub options: SubmitOptions,
    pub hold: bool,
    pub quiet: bool,
    /// `-W block=true`: exit when the job ends, with its exit status.
    pub block: bool,
    /// `-j oe` / `-j eo`: which stream the other joins ('o' or 'e').
    pub join: Option<char>,
    pub chdir: Option<String>,
    pub vars: Vec<(String, String)>,
    /// The script file; None: standard input (or `command` after `--`).
    pub script: Option<String>,
    /// `qsub [options] -- executable [args]`.
    pub command: Vec<String>,
    pub warnings: Vec<String>,
    pub info: Option<String>,
    /// `-S PATH`: the shell the job runs under (its script's `#!` line must name it; a
    /// command or a script from standard input without one gets it).
    pub shell: Option<String>,
}

fn unsupported(plan: &mut QsubPlan, ignore: bool, what: String) -> Result<(), String> {
    if ignore {
        plan.warnings.push(what);
        Ok(())
    } else {
        Err(format!("{what}; --ignore-unsupported submits without it"))
    }
}

/// Read a qsub command line (pure).
pub fn qsub_plan(args: &[String]) -> Result<QsubPlan, String> {
    let dashdash = args.iter().position(|a| a == "--");
    let (opts, command) = match dashdash {
        Some(i) => (&args[..i], args[i + 1..].to_vec()),
        None => (args, vec![]),
    };
    let p = f::getopt(opts, QSUB_OPTS, true)?;
    let mut plan = QsubPlan { command, ..Default::default() };
    let ignore = p.has("--ignore-unsupported");
    plan.flags.ignore_unsupported = ignore;
    let mut directives = String::from("#!/bin/sh\n");
    for (key, value) in &p.options {
        let v = value.clone().unwrap_or_default();
        let nonempty = |v: &str| -> Result<String, String> {
            if v.trim().is_empty() {
                Err(format!("option {key} needs a value"))
            } else {
                Ok(v.trim().to_string())
            }
        };
        match key.as_str() {
            "-l" | "-r" => {
                if v.contains(['"', '\n', '\r']) || v.chars().any(char::is_whitespace) {
                    return Err(format!("illegal {key} value {v:?}"));
                }
                directives.push_str(&format!("#PBS {key} {v}\n"));
            }
            "-N" => plan.flags.name = Some(nonempty(&v)?),
            "-q" => plan.flags.queue = Some(nonempty(&v)?),
            "-A" | "-P" => plan.flags.account = Some(nonempty(&v)?),
            "-o" | "-e" => {
                if v.contains(':') {
                    unsupported(
                        &mut plan,
                        ignore,
                        format!("{key} {v}: a host:path destination is not supported; give a path"),
                    )?;
                } else if key == "-o" {
                    plan.flags.output = Some(nonempty(&v)?);
                } else {
                    plan.flags.error = Some(nonempty(&v)?);
                }
            }
            "-j" => {
                plan.join = match v.as_str() {
                    "oe" => Some('o'),
                    "eo" => Some('e'),
                    "n" => None,
                    _ => return Err(format!("illegal -j value {v:?}: oe, eo or n")),
                };
                // Recorded as `#PBS -j` is (`SubmitOptions::join`): over the script's own.
                directives.push_str(&format!("#PBS -j {v}\n"));
            }
            "-h" => plan.hold = true,
            "-z" => plan.quiet = true,
            // The job gets the submitting environment in any case.
            "-V" => {}
            "-v" => {
                for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match item.split_once('=') {
                        Some((k, val)) if !k.is_empty() => plan.vars.push((k.to_string(), val.to_string())),
                        // A name alone: its value here (PBS's meaning).
                        _ => plan.vars.push((item.to_string(), std::env::var(item).unwrap_or_default())),
                    }
                }
            }
            "-d" | "-w" => plan.chdir = Some(nonempty(&v)?),
            // `-S path[@host][,...]`: the first path (berth has one host per submission).
            "-S" => {
                let shell = v.split(',').next().unwrap_or("").split('@').next().unwrap_or("").trim();
                if !shell.starts_with('/') || shell.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(format!("illegal -S value {v:?}: give the absolute path of a shell"));
                }
                plan.shell = Some(shell.to_string());
            }
            // Arrays are read as `#PBS -J` lines are.
            "-J" => {
                if v.contains(['"', '\n', '\r']) || v.chars().any(char::is_whitespace) {
                    return Err(format!("illegal {key} value {v:?}"));
                }
                directives.push_str(&format!("#PBS -J {v}\n"));
            }
            // Notifications are read as `#PBS -m`/`-M` lines are.
            "-m" | "-M" => {
                if v.contains(['"', '\n', '\r']) || v.chars().any(char::is_whitespace) {
                    return Err(format!("illegal {key} value {v:?}"));
                }
                directives.push_str(&format!("#PBS {key} {v}\n"));
            }
            // Dependencies are read as `#PBS -W depend=...` lines are.
            "-W" if v.trim().starts_with("depend=") => {
                if v.contains(['"', '\n', '\r']) || v.chars().any(char::is_whitespace) {
                    return Err(format!("illegal {key} value {v:?}"));
                }
                directives.push_str(&format!("#PBS -W {v}\n"));
            }
            "-W" if v.split_once('=').is_some_and(|(k, _)| k.trim() == "block") => {
                match v.split_once('=').map(|(_, b)| b.trim().to_ascii_lowercase()).as_deref() {
                    Some("true") => plan.block = true,
                    Some("false") => plan.block = false,
                    _ => return Err(format!("illegal -W value {v:?}: block=true or block=false")),
                }
            }
            "--ignore-unsupported" => {}
            "--version" => plan.info = Some(format!("{}\n", version_line())),
            _ => {
                let shown = match value {
                    Some(v) => format!("{key} {v}"),
                    None => key.clone(),
                };
                unsupported(
                    &mut plan,
                    ignore,
                    format!("{shown}: not supported by berth (docs/compat.md lists what is)"),
                )?
            }
        }
    }
    if plan.info.is_some() {
        return Ok(plan);
    }
    let foreign = berth_core::directives::parse_foreign(&directives)
        .map_err(|e| e.to_string().trim_start_matches("#PBS").trim_start_matches(':').trim().to_string())?;
    plan.options = foreign.options;
    for (_, what) in foreign.unsupported {
        unsupported(&mut plan, ignore, what.trim_start_matches("#PBS").trim().to_string())?;
    }
    let mut operands = p.operands.into_iter();
    plan.script = operands.next();
    if let Some(extra) = operands.next() {
        return Err(format!("too many arguments ({extra}); arguments to a job go after `--` with an executable"));
    }
    if plan.script.is_some() && !plan.command.is_empty() {
        return Err("give a script or `-- executable [args]`, not both".into());
    }
    Ok(plan)
}

/// A job id as PBS prints it.
pub fn pbs_id(id: JobId, server: &str) -> String {
    format!("{}.{server}", id.0)
}

/// A job's id as qstat shows it: a task of an array as PBS's subjob `A[i].server`.
pub fn pbs_job_id(j: &JobInfo, server: &str) -> String {
    match (j.array_job, j.array_index) {
        (Some(a), Some(i)) => format!("{}[{i}].{server}", a.0),
        _ => pbs_id(j.id, server),
    }
}

/// A single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// qsub: submit a script (a file, standard input, or `-- executable args`) and print its id.
pub async fn qsub(dir: &Path, args: Vec<String>) -> Result<i32> {
    let mut plan = match qsub_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("qsub: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: qsub [-A account] [-e path] [-h] [-j oe|eo|n] [-l resource_list] [-N name] [-o path] [-q queue] [-r y|n] [-v variable_list] [-V] [-W block=true|depend=afterok:ID[:ID]] [-z] [script | -- command [arg1 ...]]");
            return Ok(2);
        }
    };
    if let Some(info) = &plan.info {
        print!("{info}");
        return Ok(0);
    }
    for w in &plan.warnings {
        eprintln!("qsub: warning: {}: ignored", crate::output::terminal_safe(w));
    }
    let interpreter = plan.shell.clone().unwrap_or_else(|| "/bin/sh".into());
    let (text, temp, script_name) = match (&plan.script, plan.command.is_empty()) {
        (Some(path), _) => (std::fs::read_to_string(path).unwrap_or_default(), None, None),
        (None, false) => {
            let words: Vec<String> = plan.command.iter().map(|w| shell_quote(w)).collect();
            let text = format!("#!{interpreter}\n{}\n", words.join(" "));
            let name = Path::new(&plan.command[0]).file_name().map(|n| n.to_string_lossy().into_owned());
            (text.clone(), Some(super::TempScript::new(&text)?), name)
        }
        (None, true) => {
            let mut text = super::read_stdin_script()?;
            if !text.starts_with("#!") {
                text = format!("#!{interpreter}\n{text}");
            }
            (text.clone(), Some(super::TempScript::new(&text)?), Some("STDIN".to_string()))
        }
    };
    // berth runs a script with its `#!` line: `-S` naming that interpreter is what happens.
    if let Some(shell) = &plan.shell {
        let first = text.lines().next().and_then(|l| l.strip_prefix("#!")).and_then(|l| l.split_whitespace().next());
        if first != Some(shell.as_str()) {
            let what = format!(
                "-S {shell}: berth runs the script with its #! line ({}); make that line #!{shell}",
                first.unwrap_or("none")
            );
            if !plan.flags.ignore_unsupported {
                eprintln!("qsub: {}", crate::output::terminal_safe(&what));
                return Ok(2);
            }
            eprintln!("qsub: warning: {}: ignored", crate::output::terminal_safe(&what));
        }
    }
    let path: PathBuf = match (&temp, &plan.script) {
        (Some(t), _) => t.path.clone(),
        (None, Some(p)) => std::env::current_dir()?.join(p),
        (None, None) => bail!("no script"),
    };
    if let Some(d) = &plan.chdir {
        std::env::set_current_dir(d).map_err(|e| anyhow::anyhow!("cannot change to {d}: {e}"))?;
    }
    // PBS's default outputs: NAME.oID and NAME.eID (a subjob's NAME.oID.INDEX), unless joined.
    let script = berth_core::directives::parse_script_with(&text, true).map(|(o, _)| o).unwrap_or_default();
    let array = plan.options.array.is_some() || script.array.is_some();
    let seq = if array { "%A.%a" } else { "%j" };
    if plan.flags.output.is_none() && script.output.is_none() {
        plan.flags.output = Some(format!("%x.o{seq}"));
    }
    if plan.flags.error.is_none() && script.error.is_none() {
        plan.flags.error = Some(format!("%x.e{seq}"));
    }
    // A path that is a directory (`-o logs/`, as dask-jobqueue writes): the default name in it.
    for (given, from_script, kind) in
        [(&mut plan.flags.output, &script.output, 'o'), (&mut plan.flags.error, &script.error, 'e')]
    {
        if let Some(p) = given.as_ref().or(from_script.as_ref()) {
            if p.ends_with('/') || Path::new(p).is_dir() {
                *given = Some(format!("{}/%x.{kind}{seq}", p.trim_end_matches('/')));
            }
        }
    }
    match plan.join {
        Some('o') => plan.flags.error = plan.flags.output.clone().or(script.output),
        Some('e') => plan.flags.output = plan.flags.error.clone().or(script.error),
        _ => {}
    }
    let mut sub = crate::submission::build_submission(&path, &plan.flags, plan.hold)?;
    drop(temp);
    sub.options = sub.options.overlay(std::mem::take(&mut plan.options));
    if let Some(name) = script_name {
        sub.script_name = name;
    }
    for (k, v) in &plan.vars {
        sub.env.retain(|(key, _)| key != k);
        sub.env.push((k.clone(), v.clone()));
    }
    let ClientResponse::Submitted { id } = request(dir, ClientRequest::Submit(Box::new(sub))).await? else {
        bail!("unexpected answer")
    };
    if !plan.quiet {
        // An array's id as PBS prints it: `N[].server`.
        let shown = if array { format!("{}[].{}", id.0, f::server_name()) } else { pbs_id(id, &f::server_name()) };
        println!("{shown}");
    }
    if plan.block {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        return super::wait::wait_for(dir, &[id], super::wait::ExitRule::Shell).await;
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// qstat

const QSTAT_OPTS: &[Opt] = &[
    short('a', Arg::No),
    short('D', Arg::Required),
    short('f', Arg::No),
    short('F', Arg::Required),
    short('H', Arg::No),
    short('J', Arg::No),
    short('n', Arg::No),
    short('q', Arg::No),
    short('Q', Arg::No),
    short('s', Arg::No),
    short('t', Arg::No),
    short('u', Arg::Required),
    short('w', Arg::No),
    short('x', Arg::No),
    short('1', Arg::No),
    f::long("version", Arg::No),
];

/// A job's PBS state letter. A waiting job's kind of wait comes from the controller's reason
/// code when it sends one berth knows, else from the start of the reason's words (older ones).
pub fn pbs_state(j: &JobInfo) -> char {
    let code = j.reason_code.as_deref().filter(|c| berth_core::sched::reason::PendingReason::CODES.contains(c));
    let waits = |what: &str| match code {
        Some(c) => c.starts_with(what),
        None => j.reason.as_deref().is_some_and(|r| r.starts_with(what)),
    };
    match j.state {
        // As PBS: a job waiting for a dependency is held (`H`), for its begin time waiting (`W`).
        JobState::Queued if waits("Dependency") => 'H',
        JobState::Queued if waits("BeginTime") => 'W',
        JobState::Queued => 'Q',
        JobState::Held => 'H',
        JobState::Running if j.reason.as_deref().is_some_and(|r| r.starts_with("ending")) => 'E',
        JobState::Running => 'R',
        JobState::Suspended => 'S',
        _ => 'F',
    }
}

/// CPU time used, as PBS shows it (`0` before the job started).
fn cpu_time(j: &JobInfo) -> String {
    match (&j.accounting, j.start_time) {
        (Some(a), _) => f::pbs_hms((a.user_cpu_seconds + a.system_cpu_seconds) as u64),
        (None, Some(_)) => f::pbs_hms(0),
        (None, None) => "0".into(),
    }
}

/// PBS cuts a value too wide for its column and marks the cut with `*`.
fn cut(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(w.saturating_sub(1)).collect();
        t.push('*');
        t
    }
}

/// qstat's default table, a line per job.
pub fn qstat_table(jobs: &[JobInfo], server: &str) -> String {
    let jobs = crate::output::escaped(jobs);
    let lines: Vec<PbsLine> = jobs.iter().map(|job| PbsLine { job, array: None }).collect();
    qstat_lines_table(&lines, server)
}

/// A line's id, state and CPU time: an array's `A[].server` (`crate::fold::pbs_lines`).
fn line_fields(l: &PbsLine, server: &str) -> (String, char, String) {
    match &l.array {
        Some(a) => (format!("{}[].{server}", a.id), a.state, "0".into()),
        None => (pbs_job_id(l.job, server), pbs_state(l.job), cpu_time(l.job)),
    }
}

/// qstat's default table of `lines` (their jobs' strings already escaped).
pub fn qstat_lines_table(lines: &[PbsLine], server: &str) -> String {
    let mut out = String::from(
        "Job id            Name             User              Time Use S Queue\n----------------  ---------------- ----------------  -------- - -----\n",
    );
    for l in lines {
        let (j, (id, state, cpu)) = (l.job, line_fields(l, server));
        out.push_str(&format!(
            "{:<17} {:<16} {:<17} {:>8} {} {}\n",
            cut(&id, 17),
            cut(&j.name, 16),
            cut(&j.user, 16),
            cpu,
            state,
            cut(&j.queue, 5)
        ));
    }
    out
}

/// qstat's alternate table (`-a`, `-u`): requested nodes, tasks, memory, time, and elapsed.
pub fn qstat_alt_table(jobs: &[JobInfo], server: &str, now: f64) -> String {
    let jobs = crate::output::escaped(jobs);
    let lines: Vec<PbsLine> = jobs.iter().map(|job| PbsLine { job, array: None }).collect();
    qstat_lines_alt_table(&lines, server, now)
}

/// qstat's alternate table of `lines` (their jobs' strings already escaped).
pub fn qstat_lines_alt_table(lines: &[PbsLine], server: &str, now: f64) -> String {
    let mut out = format!(
        "\n{server}: \n                                                            Req'd  Req'd   Elap\nJob ID          Username Queue    Jobname    SessID NDS TSK Memory Time  S Time\n--------------- -------- -------- ---------- ------ --- --- ------ ----- - -----\n"
    );
    for l in lines {
        let (j, (id, state, _)) = (l.job, line_fields(l, server));
        let hm = |secs: u64| format!("{:02}:{:02}", secs / 3600, secs / 60 % 60);
        let mem = match (j.request.mem_per_node, j.request.mem_per_cpu) {
            (Some(b), _) => format!("{}mb", (b * u64::from(f::job_node_count(j))) >> 20),
            _ => "--".into(),
        };
        let elapsed = if j.start_time.is_some() && l.array.is_none() { hm(f::elapsed(j, now)) } else { "--".into() };
        out.push_str(&format!(
            "{:<15} {:<8} {:<8} {:<10} {:>6} {:>3} {:>3} {:>6} {:>5} {} {:>5}\n",
            cut(&id, 15),
            cut(&j.user, 8),
            cut(&j.queue, 8),
            cut(&j.name, 10),
            "--",
            f::job_node_count(j),
            crate::output::job_cpus(j),
            mem,
            j.walltime_seconds.map(hm).unwrap_or_else(|| "--".into()),
            state,
            elapsed
        ));
    }
    out
}

/// `qstat -f`: a job's attributes, one per line.
pub fn qstat_full(j: &JobInfo, server: &str, now: f64) -> String {
    let j = &crate::output::escaped(std::slice::from_ref(j))[0];
    qstat_line_full(&PbsLine { job: j, array: None }, server, now)
}

/// `qstat -f` of a line (its job's strings already escaped): an array's record has its
/// first subjob's request, `array = True` and its subjobs' counts, as PBS's.
pub fn qstat_line_full(l: &PbsLine, server: &str, now: f64) -> String {
    let mut whole;
    let j = match &l.array {
        Some(_) => {
            // What is the first subjob's own (where it runs, its end) is not the array's.
            whole = l.job.clone();
            (whole.allocation, whole.start_time, whole.end_time) = (vec![], None, None);
            (whole.exit_code, whole.signal, whole.accounting, whole.reason) = (None, None, None, None);
            &whole
        }
        None => l.job,
    };
    let (id, state, _) = line_fields(l, server);
    let mut s = format!("Job Id: {id}\n");
    let mut kv = |k: &str, v: String| s.push_str(&format!("    {k} = {v}\n"));
    kv("Job_Name", j.name.clone());
    kv("Job_Owner", format!("{}@{server}", j.user));
    if let Some(a) = &j.accounting {
        kv("resources_used.cput", f::pbs_hms((a.user_cpu_seconds + a.system_cpu_seconds) as u64));
        kv("resources_used.mem", format!("{}kb", a.peak_memory_bytes >> 10));
    }
    if j.start_time.is_some() {
        kv("resources_used.walltime", f::pbs_hms(f::elapsed(j, now)));
    }
    kv("job_state", state.to_string());
    kv("queue", j.queue.clone());
    kv("Account_Name", j.account.clone());
    if !j.allocation.is_empty() {
        let hosts: Vec<String> = j.allocation.iter().map(|a| format!("{}/0*{}", a.node, a.cores)).collect();
        kv("exec_host", hosts.join("+"));
    }
    kv("Error_Path", format!("{server}:{}", j.stderr));
    kv("Output_Path", format!("{server}:{}", j.stdout));
    kv("Resource_List.ncpus", crate::output::job_cpus(j));
    kv("Resource_List.nodect", f::job_node_count(j).to_string());
    if let Some(w) = j.walltime_seconds {
        kv("Resource_List.walltime", f::pbs_hms(w));
    }
    kv("ctime", f::ctime(j.submit_time));
    if let Some(t) = j.start_time {
        kv("stime", f::ctime(t));
    }
    if let Some(t) = j.end_time {
        kv("obittime", f::ctime(t));
    }
    if let Some(r) = &j.reason {
        kv("comment", r.clone());
    }
    if let Some(c) = j.exit_code {
        kv("Exit_status", c.to_string());
    } else if let Some(sig) = j.signal {
        kv("Exit_status", (256 + sig).to_string());
    }
    kv("Variable_List", format!("PBS_O_WORKDIR={}", j.cwd));
    if let Some(a) = &l.array {
        kv("array", "True".into());
        kv("array_indices_submitted", berth_core::directives::array::fold(&a.indexes));
        kv("array_state_count", format!("Queued:{} Running:{} Exiting:0 Expired:{}", a.queued, a.running, a.expired));
    }
    s.push('\n');
    s
}

/// `qstat -f -F json`: the `-f` records as PBS Pro's JSON: `{"timestamp", "pbs_version",
/// "pbs_server", "Jobs": {ID: {attribute: value}}}`, dotted attributes (`Resource_List.ncpus`)
/// nested, whole numbers as numbers, `Variable_List` an object.
pub fn qstat_json(full: &str, server: &str, now: f64) -> String {
    use serde_json::{Map, Value};
    let value = |v: &str| match v.parse::<i64>() {
        Ok(n) if !v.starts_with('+') && (v == "0" || !v.starts_with('0')) => Value::from(n),
        _ => Value::from(v),
    };
    let mut jobs = Map::new();
    let mut current: Option<(String, Map<String, Value>)> = None;
    for line in full.lines() {
        if let Some(id) = line.strip_prefix("Job Id: ") {
            if let Some((id, attrs)) = current.take() {
                jobs.insert(id, Value::Object(attrs));
            }
            current = Some((id.to_string(), Map::new()));
        } else if let (Some((_, attrs)), Some((k, v))) = (current.as_mut(), line.trim().split_once(" = ")) {
            if k == "Variable_List" {
                let vars: Map<String, Value> = v
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(a, b)| (a.to_string(), Value::from(b)))
                    .collect();
                attrs.insert(k.to_string(), Value::Object(vars));
            } else if let Some((outer, inner)) = k.split_once('.') {
                let slot = attrs.entry(outer.to_string()).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = slot {
                    m.insert(inner.to_string(), value(v));
                }
            } else {
                attrs.insert(k.to_string(), value(v));
            }
        }
    }
    if let Some((id, attrs)) = current {
        jobs.insert(id, Value::Object(attrs));
    }
    let out = serde_json::json!({
        "timestamp": now as i64,
        "pbs_version": "2022.1.0",
        "pbs_server": server,
        "Jobs": jobs,
    });
    format!("{}\n", serde_json::to_string_pretty(&out).unwrap_or_default())
}

/// `qstat -f -F dsv [-D DELIM]`: each `-f` record on one line, PBS Pro's way:
/// `Job Id: ID|attribute=value|...`, a delimiter inside a value escaped with `\\`.
pub fn qstat_dsv(full: &str, delimiter: &str) -> String {
    let escape = |v: &str| v.replace('\\', "\\\\").replace(delimiter, &format!("\\{delimiter}"));
    let mut out = String::new();
    let mut fields: Vec<String> = Vec::new();
    let flush = |fields: &mut Vec<String>, out: &mut String| {
        if !fields.is_empty() {
            out.push_str(&fields.join(delimiter));
            out.push('\n');
            fields.clear();
        }
    };
    for line in full.lines() {
        if let Some(id) = line.strip_prefix("Job Id: ") {
            flush(&mut fields, &mut out);
            fields.push(format!("Job Id: {}", escape(id)));
        } else if let (false, Some((k, v))) = (fields.is_empty(), line.trim().split_once(" = ")) {
            fields.push(format!("{k}={}", escape(v)));
        }
    }
    flush(&mut fields, &mut out);
    out
}

pub async fn qstat(dir: &Path, args: Vec<String>) -> Result<i32> {
    let p = match f::getopt(&args, QSTAT_OPTS, false) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("qstat: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: qstat [-a] [-f] [-t] [-J] [-x] [-u user_list] [job_identifier...]");
            return Ok(2);
        }
    };
    if p.has("--version") {
        println!("{}", version_line());
        return Ok(0);
    }
    let format = match p.last("-F") {
        None => None,
        Some(f @ ("json" | "dsv")) if p.has("-f") => Some(f),
        Some(f @ ("json" | "dsv")) => {
            eprintln!("qstat: -F {f} needs -f (qstat -f -F {f})");
            return Ok(2);
        }
        Some(other) => {
            eprintln!("qstat: -F {}: berth's qstat writes json or dsv", crate::output::terminal_safe(other));
            return Ok(2);
        }
    };
    let delimiter = p.last("-D").unwrap_or("|");
    if delimiter.is_empty() || delimiter.chars().any(|c| c.is_control() || c == '=') {
        eprintln!("qstat: -D: give a delimiter of printable characters other than '='");
        return Ok(2);
    }
    for unsupported in ["-q", "-Q"] {
        if p.has(unsupported) {
            eprintln!("qstat: {unsupported}: queue status is not supported by berth; `berth queues` shows the queues");
            return Ok(2);
        }
    }
    let server = f::server_name();
    let mut ids = Vec::new();
    for op in &p.operands {
        match f::parse_job_id(op) {
            Some(id) => ids.push(id),
            None => {
                eprintln!("qstat: illegally formed job identifier: {}", crate::output::terminal_safe(op));
                return Ok(1);
            }
        }
    }
    let history = p.has("-x") || p.has("-H");
    let jobs = if ids.is_empty() {
        let ClientResponse::Jobs { jobs } =
            request(dir, ClientRequest::ListJobs { states: vec![], all: history }).await?
        else {
            bail!("unexpected answer")
        };
        jobs
    } else {
        super::jobs_by_id(dir, &ids).await?
    };
    let users = p.list("-u");
    let mut code = 0;
    let mut shown: Vec<JobInfo> = Vec::new();
    // An array's id (`A[]`, or A): its subjobs, from one list of the jobs.
    let mut listed: Option<Vec<JobInfo>> = None;
    if ids.is_empty() {
        shown = jobs
            .into_iter()
            .filter(|j| history || !j.state.is_finished())
            .filter(|j| users.is_empty() || users.contains(&j.user))
            .collect();
    } else {
        for id in &ids {
            match jobs.iter().find(|j| j.id == *id) {
                Some(j) if j.array_job == Some(*id) => {
                    if listed.is_none() {
                        let ClientResponse::Jobs { jobs } =
                            request(dir, ClientRequest::ListJobs { states: vec![], all: history }).await?
                        else {
                            bail!("unexpected answer")
                        };
                        listed = Some(jobs);
                    }
                    let tasks = listed.iter().flatten().filter(|t| t.array_job == Some(*id));
                    let before = shown.len();
                    shown.extend(tasks.filter(|t| history || !t.state.is_finished()).cloned());
                    if shown.len() == before {
                        eprintln!(
                            "qstat: {}[].{server} Job has finished, use -x or -H to obtain historical job information",
                            id.0
                        );
                        code = EXIT_FINISHED_JOB;
                    }
                }
                Some(j) if j.state.is_finished() && !history => {
                    eprintln!(
                        "qstat: {} Job has finished, use -x or -H to obtain historical job information",
                        pbs_id(*id, &server)
                    );
                    code = EXIT_FINISHED_JOB;
                }
                Some(j) => shown.push(j.clone()),
                None => {
                    eprintln!("qstat: Unknown Job Id {}", pbs_id(*id, &server));
                    code = EXIT_UNKNOWN_JOB;
                }
            }
        }
    }
    let now = f::now();
    // PBS's rule: an array is one line `A[].server`; `-t` adds its subjobs, `-J` shows arrays only.
    let shown = crate::output::escaped(&shown);
    let lines = crate::fold::pbs_lines(&shown, p.has("-t"), p.has("-J"));
    let text = if let Some(format) = format {
        let full = lines.iter().map(|l| qstat_line_full(l, &server, now)).collect::<String>();
        if format == "json" {
            qstat_json(&full, &server, now)
        } else {
            qstat_dsv(&full, delimiter)
        }
    } else if p.has("-f") {
        lines.iter().map(|l| qstat_line_full(l, &server, now)).collect::<String>()
    } else if p.has("-a") || !users.is_empty() {
        qstat_lines_alt_table(&lines, &server, now)
    } else if lines.is_empty() {
        String::new()
    } else {
        qstat_lines_table(&lines, &server)
    };
    print!("{}", crate::output::terminal_safe(&text));
    Ok(code)
}

// ---------------------------------------------------------------------------------------
// qdel

const QDEL_OPTS: &[Opt] = &[short('W', Arg::Required), short('x', Arg::No), f::long("version", Arg::No)];

pub async fn qdel(dir: &Path, args: Vec<String>) -> Result<i32> {
    let p = match f::getopt(&args, QDEL_OPTS, false) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("qdel: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: qdel [-W force|suppress_email=X] [-x] job_identifier...");
            return Ok(2);
        }
    };
    if p.has("--version") {
        println!("{}", version_line());
        return Ok(0);
    }
    if p.operands.is_empty() {
        eprintln!("usage: qdel [-W force|suppress_email=X] [-x] job_identifier...");
        return Ok(2);
    }
    on_each_job(dir, "qdel", &p.operands, |ids| ClientRequest::Cancel { ids, only: vec![] }).await
}

// ---------------------------------------------------------------------------------------
// qhold, qrls

/// qhold (`hold`) or qrls (release): `-h u` (user holds, the only kind berth has) accepted.
pub async fn qhold(dir: &Path, args: Vec<String>, hold: bool) -> Result<i32> {
    let name = if hold { "qhold" } else { "qrls" };
    let p = match f::getopt(&args, &[short('h', Arg::Required), f::long("version", Arg::No)], false) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{name}: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: {name} [-h hold_list] job_identifier...");
            return Ok(2);
        }
    };
    if p.has("--version") {
        println!("{}", version_line());
        return Ok(0);
    }
    if let Some(kind) = p.last("-h").filter(|k| *k != "u") {
        eprintln!(
            "{name}: hold type {} is not supported by berth (only u, a user hold)",
            crate::output::terminal_safe(kind)
        );
        return Ok(2);
    }
    if p.operands.is_empty() {
        eprintln!("usage: {name} [-h hold_list] job_identifier...");
        return Ok(2);
    }
    let make: fn(Vec<JobId>) -> ClientRequest = if hold {
        |ids| ClientRequest::Hold { ids, only: vec![] }
    } else {
        |ids| ClientRequest::Release { ids, only: vec![] }
    };
    on_each_job(dir, name, &p.operands, make).await
}

/// qdel, qhold, qrls, qrerun: `make` a request for the jobs named (`N`, `N.server`, `N[]`),
/// in batches; PBS's message for each job refused (or not a job identifier), the exit status
/// of the last one.
async fn on_each_job(
    dir: &Path,
    name: &str,
    operands: &[String],
    make: fn(Vec<JobId>) -> ClientRequest,
) -> Result<i32> {
    let server = f::server_name();
    let mut code = 0;
    let mut ids = Vec::new();
    for op in operands {
        match f::parse_job_id(op) {
            Some(id) => ids.push(id),
            None => {
                eprintln!("{name}: illegally formed job identifier: {}", crate::output::terminal_safe(op));
                code = 1;
            }
        }
    }
    for chunk in ids.chunks(berth_protocol::client::MAX_IDS_PER_REQUEST) {
        let ClientResponse::Done { results } = request(dir, make(chunk.to_vec())).await? else {
            bail!("unexpected answer")
        };
        for r in results.iter().filter(|r| !r.ok) {
            let (text, status) = pbs_error(r.error.as_ref().map(|e| e.code));
            eprintln!("{name}: {text} {}", pbs_id(r.id, &server));
            code = status;
        }
    }
    Ok(code)
}

/// PBS's message and exit status for a request refused for one job.
fn pbs_error(code: Option<ErrorCode>) -> (&'static str, i32) {
    match code {
        Some(ErrorCode::UnknownJob) => ("Unknown Job Id", EXIT_UNKNOWN_JOB),
        Some(ErrorCode::InvalidState) => ("Job has finished", EXIT_FINISHED_JOB),
        Some(ErrorCode::NotPermitted) => ("Unauthorized Request", 159),
        _ => ("Request invalid for state of job", 170),
    }
}

// ---------------------------------------------------------------------------------------
// qalter, qrerun

const QALTER_OPTS: &[Opt] = &[
    short('l', Arg::Required),
    short('N', Arg::Required),
    short('q', Arg::Required),
    short('W', Arg::Required),
    f::long("version", Arg::No),
];

const QALTER_USAGE: &str =
    "usage: qalter [-l resource_list] [-N name] [-q queue] [-W depend=dependency_list] job_identifier...";

/// What a qalter command line asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QalterPlan {
    pub ids: Vec<JobId>,
    pub change: JobChange,
    pub info: Option<String>,
}

/// Read a qalter command line (pure): `-l` read as `#PBS -l` lines are (walltime, select,
/// nodes, ncpus, ngpus, custom resources: a chunk's generic resources, job-wide licenses),
/// `-N`, `-q`, `-W depend=`.
pub fn qalter_plan(args: &[String]) -> Result<QalterPlan, String> {
    let p = f::getopt(args, QALTER_OPTS, false)?;
    let mut plan = QalterPlan::default();
    if p.has("--version") {
        plan.info = Some(format!("{}\n", version_line()));
        return Ok(plan);
    }
    let mut directives = String::from("#!/bin/sh\n");
    for (key, value) in &p.options {
        let v = value.clone().unwrap_or_default();
        if v.trim().is_empty() {
            return Err(format!("option {key} needs a value"));
        }
        match key.as_str() {
            "-l" => {
                if v.contains(['"', '\n', '\r']) || v.chars().any(char::is_whitespace) {
                    return Err(format!("illegal -l value {v:?}"));
                }
                directives.push_str(&format!("#PBS -l {v}\n"));
            }
            "-N" => plan.change.name = Some(v.trim().to_string()),
            "-q" => plan.change.queue = Some(v.trim().to_string()),
            "-W" => match v.trim().strip_prefix("depend=") {
                Some(d) => {
                    let dep = berth_core::directives::Dependency::parse_pbs(d)
                        .map_err(|e| format!("illegal -W value {v:?}: {e}"))?;
                    plan.change.dependency = Some(dep.to_string());
                }
                None => return Err(format!("-W {v}: only depend= is supported by berth")),
            },
            _ => {}
        }
    }
    let foreign = berth_core::directives::parse_foreign(&directives)
        .map_err(|e| e.to_string().trim_start_matches("#PBS").trim_start_matches(':').trim().to_string())?;
    if let Some((_, what)) = foreign.unsupported.first() {
        return Err(what.trim_start_matches("#PBS").trim().to_string());
    }
    let o = foreign.options;
    if o.mem.is_some() || o.exclusive.is_some() {
        return Err("-l: changing a job's memory or placement is not supported by berth".into());
    }
    let c = &mut plan.change;
    (c.walltime, c.nodes, c.tasks_per_node, c.cpus_per_task, c.cores) =
        (o.walltime, o.nodes, o.tasks_per_node, o.cpus_per_task, o.cores);
    // A chunk's custom resources are generic resources, job-wide ones licenses, `ngpus` GPUs
    // per node: each replaces the job's (checked by the controller as at submission).
    (c.gres, c.licenses, c.gpus_per_node, c.gpus) = (o.gres, o.licenses, o.gpus_per_node, o.gpus);
    for op in &p.operands {
        plan.ids.push(f::parse_job_id(op).ok_or_else(|| format!("illegally formed job identifier: {op}"))?);
    }
    if plan.ids.is_empty() {
        return Err("no job identifier given".into());
    }
    if plan.change.is_empty() {
        return Err("no attribute to alter given".into());
    }
    Ok(plan)
}

/// qalter: change queued jobs (a running one's walltime: lowered, or raised by an admin). Silent when done, as PBS's.
pub async fn qalter(dir: &Path, args: Vec<String>) -> Result<i32> {
    let plan = match qalter_plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("qalter: {}", crate::output::terminal_safe(&e));
            eprintln!("{QALTER_USAGE}");
            return Ok(2);
        }
    };
    if let Some(info) = &plan.info {
        print!("{info}");
        return Ok(0);
    }
    let server = f::server_name();
    let mut code = 0;
    for id in plan.ids {
        if let Err(e) = crate::changes::send(dir, id, false, plan.change.clone()).await {
            let Some(api) = e.downcast_ref::<berth_protocol::client::ApiError>() else { return Err(e) };
            let (text, status) = pbs_error(Some(api.code));
            let text = match api.code {
                ErrorCode::UnknownJob | ErrorCode::NotPermitted => text.to_string(),
                _ => api.message.clone(),
            };
            eprintln!("qalter: {} {}", crate::output::terminal_safe(&text), pbs_id(id, &server));
            code = status;
        }
    }
    Ok(code)
}

/// qrerun: requeue running (or ended) jobs, to run again from the start.
pub async fn qrerun(dir: &Path, args: Vec<String>) -> Result<i32> {
    let p = match f::getopt(&args, &[short('W', Arg::Required), f::long("version", Arg::No)], false) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("qrerun: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: qrerun [-W force] job_identifier...");
            return Ok(2);
        }
    };
    if p.has("--version") {
        println!("{}", version_line());
        return Ok(0);
    }
    if p.operands.is_empty() {
        eprintln!("usage: qrerun [-W force] job_identifier...");
        return Ok(2);
    }
    on_each_job(dir, "qrerun", &p.operands, |ids| ClientRequest::Requeue { ids, only: vec![] }).await
}

// ---------------------------------------------------------------------------------------
// pbsnodes

/// A node's PBS state: free, job-busy, offline (drained or draining), down.
pub fn pbs_node_state(n: &berth_protocol::node::NodeInfo) -> &'static str {
    match n.state.split_whitespace().next().unwrap_or("") {
        _ if n.state.contains("not connected") => "down",
        "up" if n.cpus_allocated >= n.pus => "job-busy",
        "up" => "free",
        "draining" | "drained" => "offline",
        "cleaning" => "job-exclusive",
        _ => "down",
    }
}

/// `pbsnodes -a`: each node's attributes (PBS Pro's layout).
pub fn pbsnodes_full(nodes: &[berth_protocol::node::NodeInfo], server: &str) -> String {
    let nodes = crate::output::escaped(nodes);
    let mut s = String::new();
    for n in &nodes {
        s.push_str(&format!("{}\n", n.name));
        let mut kv = |k: &str, v: String| s.push_str(&format!("     {k} = {v}\n"));
        kv("Mom", n.name.clone());
        kv("ntype", "PBS".into());
        kv("state", pbs_node_state(n).into());
        kv("pcpus", n.pus.to_string());
        if !n.jobs.is_empty() {
            let jobs: Vec<String> = n.jobs.iter().map(|j| pbs_id(*j, server)).collect();
            kv("jobs", jobs.join(", "));
        }
        kv("resources_available.ncpus", n.pus.to_string());
        kv("resources_available.mem", format!("{}kb", n.memory_bytes >> 10));
        kv("resources_assigned.ncpus", n.cpus_allocated.to_string());
        kv("resources_assigned.mem", format!("{}kb", n.memory_allocated_bytes >> 10));
        s.push('\n');
    }
    s
}

pub async fn pbsnodes(dir: &Path, args: Vec<String>) -> Result<i32> {
    let table = [
        short('a', Arg::No),
        short('l', Arg::No),
        short('o', Arg::No),
        short('r', Arg::No),
        short('C', Arg::Required),
        short('S', Arg::No),
        f::long("version", Arg::No),
    ];
    let p = match f::getopt(&args, &table, false) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pbsnodes: {}", crate::output::terminal_safe(&e));
            eprintln!("usage: pbsnodes [-a] [-l] [-o | -r [-C comment]] [node ...]");
            return Ok(1);
        }
    };
    if p.has("--version") {
        println!("{}", version_line());
        return Ok(0);
    }
    if p.has("-S") {
        eprintln!("pbsnodes: -S is not supported by berth; `berth nodes` shows the nodes");
        return Ok(1);
    }
    // -o / -r: mark nodes offline (drain) or clear that (resume); admins only.
    for (flag, action) in [("-o", "drain"), ("-r", "resume")] {
        if p.has(flag) {
            if p.operands.is_empty() {
                eprintln!("pbsnodes: {flag} needs node names");
                return Ok(1);
            }
            let mut code = 0;
            for node in &p.operands {
                let req = ClientRequest::NodeAdmin { name: node.clone(), action: action.into(), value: None };
                if let Err(e) = request(dir, req).await {
                    eprintln!(
                        "pbsnodes: {}: {}",
                        crate::output::terminal_safe(node),
                        crate::output::terminal_safe(&format!("{e:#}"))
                    );
                    code = 1;
                }
            }
            return Ok(code);
        }
    }
    let ClientResponse::Nodes { nodes, .. } = request(dir, ClientRequest::ListNodes { topology: false }).await? else {
        bail!("unexpected answer")
    };
    let mut shown = Vec::new();
    let mut code = 0;
    if p.operands.is_empty() {
        shown = nodes;
    } else {
        for name in &p.operands {
            match nodes.iter().find(|n| n.name == *name) {
                Some(n) => shown.push(n.clone()),
                None => {
                    eprintln!("pbsnodes: Unknown node  {}", crate::output::terminal_safe(name));
                    code = 1;
                }
            }
        }
    }
    let text = if p.has("-l") {
        let mut s = String::new();
        for n in crate::output::escaped(&shown).iter().filter(|n| matches!(pbs_node_state(n), "down" | "offline")) {
            s.push_str(&format!("{:<20} {}\n", n.name, pbs_node_state(n)));
        }
        s
    } else {
        pbsnodes_full(&shown, &f::server_name())
    };
    print!("{}", crate::output::terminal_safe(&text));
    Ok(code)
}

#[cfg(test)]
mod tests;
