//! What the Slurm and PBS personalities share: their option parsing (getopt as those tools
//! use it), Slurm's `%[.][width]X` format strings, times, host lists and job states.

use berth_core::job::JobState;
use berth_core::sched::reason::SuspendedReason;
use berth_core::sched::PendingReason;
use berth_protocol::client::JobInfo;

/// Whether an option takes a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arg {
    No,
    Required,
    /// Only written against the flag: `--exclusive=user`, `-kval`.
    Optional,
}

/// One option of a personality: its short letter, its long name, and whether it takes a value.
#[derive(Clone, Copy, Debug)]
pub struct Opt {
    pub short: Option<char>,
    pub long: Option<&'static str>,
    pub arg: Arg,
}

impl Opt {
    /// The name an option is known by once parsed: `--long`, else `-x`.
    pub fn key(&self) -> String {
        match (self.long, self.short) {
            (Some(l), _) => format!("--{l}"),
            (None, Some(s)) => format!("-{s}"),
            (None, None) => String::new(),
        }
    }
}

/// Shorthands for option tables.
pub const fn long(name: &'static str, arg: Arg) -> Opt {
    Opt { short: None, long: Some(name), arg }
}
pub const fn both(short: char, name: &'static str, arg: Arg) -> Opt {
    Opt { short: Some(short), long: Some(name), arg }
}
pub const fn short(letter: char, arg: Arg) -> Opt {
    Opt { short: Some(letter), long: None, arg }
}

/// A command line as getopt reads it: the options (by their `key`, with their values, in
/// order) and the operands.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub options: Vec<(String, Option<String>)>,
    pub operands: Vec<String>,
}

impl Parsed {
    /// The last value of an option given by its key.
    pub fn last(&self, key: &str) -> Option<&str> {
        self.options.iter().rev().find(|(k, _)| k == key).and_then(|(_, v)| v.as_deref())
    }

    pub fn has(&self, key: &str) -> bool {
        self.options.iter().any(|(k, _)| k == key)
    }

    /// Every value of an option, comma lists split (`-u ann,bob -u eve`).
    pub fn list(&self, key: &str) -> Vec<String> {
        self.options
            .iter()
            .filter(|(k, _)| k == key)
            .filter_map(|(_, v)| v.as_deref())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }
}

/// Parse `args` (without the program name) as getopt_long does: `--long=v`, `--long v`, a
/// unique prefix of a long name, `-xv`, `-x v`, bundled switches `-hl`, `--` ending options.
/// With `stop_at_operand` (sbatch, qsub) the first operand ends the options: what follows
/// belongs to the script. Errors are getopt's messages, naming the option.
pub fn getopt(args: &[String], table: &[Opt], stop_at_operand: bool) -> Result<Parsed, String> {
    let mut out = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            out.operands.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let exact = table.iter().find(|o| o.long == Some(name));
            let opt: &Opt = match exact {
                Some(o) => o,
                None => {
                    let mut matches = table.iter().filter(|o| o.long.is_some_and(|l| l.starts_with(name)));
                    match (matches.next(), matches.next()) {
                        (Some(o), None) if !name.is_empty() => o,
                        (None, _) | (Some(_), None) => return Err(format!("unrecognized option '--{name}'")),
                        (Some(_), Some(_)) => return Err(format!("option '--{name}' is ambiguous")),
                    }
                }
            };
            let value = match (opt.arg, inline) {
                (Arg::No, Some(_)) => return Err(format!("option '{}' doesn't allow an argument", opt.key())),
                (Arg::No, None) => None,
                (Arg::Optional, v) => v,
                (Arg::Required, Some(v)) => Some(v),
                (Arg::Required, None) => match args.get(i) {
                    Some(v) => {
                        i += 1;
                        Some(v.clone())
                    }
                    None => return Err(format!("option '{}' requires an argument", opt.key())),
                },
            };
            out.options.push((opt.key(), value));
            continue;
        }
        if arg.len() > 1 && arg.starts_with('-') {
            let letters: Vec<(usize, char)> = arg.char_indices().skip(1).collect();
            let mut k = 0;
            while k < letters.len() {
                let (at, c) = letters[k];
                k += 1;
                let opt =
                    table.iter().find(|o| o.short == Some(c)).ok_or_else(|| format!("invalid option -- '{c}'"))?;
                let rest = &arg[at + c.len_utf8()..];
                match opt.arg {
                    Arg::No => out.options.push((opt.key(), None)),
                    Arg::Optional => {
                        out.options.push((opt.key(), (!rest.is_empty()).then(|| rest.to_string())));
                        break;
                    }
                    Arg::Required => {
                        let value = if !rest.is_empty() {
                            rest.to_string()
                        } else if let Some(v) = args.get(i) {
                            i += 1;
                            v.clone()
                        } else {
                            return Err(format!("option requires an argument -- '{c}'"));
                        };
                        out.options.push((opt.key(), Some(value)));
                        break;
                    }
                }
            }
            continue;
        }
        out.operands.push(arg.clone());
        if stop_at_operand {
            out.operands.extend(args[i..].iter().cloned());
            break;
        }
    }
    Ok(out)
}

/// One piece of a Slurm format string (`squeue -o`, `sinfo -o`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `%[.][width]X`: right-justified with `.`; a width pads and truncates.
    Field {
        field: char,
        width: Option<usize>,
        right: bool,
    },
}

/// Parse `%[.][width]X` fields and the text between them (`%%` is a percent sign).
pub fn parse_format(spec: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let right = chars.peek() == Some(&'.');
        if right {
            chars.next();
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let Some(field) = chars.next() else { return Err(format!("{spec:?} ends inside a field")) };
        let width = if digits.is_empty() {
            None
        } else {
            Some(digits.parse::<usize>().ok().filter(|w| *w <= 4096).ok_or_else(|| format!("bad width in {spec:?}"))?)
        };
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(Piece::Field { field, width, right });
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// Fields of `pieces` not in `known`: each is an error naming it.
pub fn check_fields(pieces: &[Piece], known: &str) -> Result<(), String> {
    for p in pieces {
        if let Piece::Field { field, .. } = p {
            if !known.contains(*field) {
                return Err(format!(
                    "invalid format field %{field}; supported: %{}",
                    known.chars().map(String::from).collect::<Vec<_>>().join(" %")
                ));
            }
        }
    }
    Ok(())
}

/// One line of a format: each field's text from `value`, padded or cut to its width.
pub fn render(pieces: &[Piece], value: impl Fn(char) -> String) -> String {
    let mut line = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => line.push_str(t),
            Piece::Field { field, width, right } => line.push_str(&fit(&value(*field), *width, *right)),
        }
    }
    line
}

/// `s` padded to `width` (right-justified if `right`) and cut to it, as `%*.*s`.
pub fn fit(s: &str, width: Option<usize>, right: bool) -> String {
    let Some(w) = width else { return s.to_string() };
    let cut: String = s.chars().take(w).collect();
    if right {
        format!("{cut:>w$}")
    } else {
        format!("{cut:<w$}")
    }
}

/// Slurm's `secs2time_str`: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
pub fn slurm_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// PBS times: `HH:MM:SS` (hours unbounded).
pub fn pbs_hms(secs: u64) -> String {
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Local date and time as Slurm prints them: `2026-11-25T21:30:00`.
pub fn iso_time(t: f64) -> String {
    let tm = local_tm(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Local date and time as PBS's `qstat -f` prints them: `Wed Nov 25 21:30:00 2026`.
pub fn ctime(t: f64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let tm = local_tm(t);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS.get(tm.tm_wday as usize).unwrap_or(&"?"),
        MONTHS.get(tm.tm_mon as usize).unwrap_or(&"?"),
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        tm.tm_year + 1900
    )
}

fn local_tm(t: f64) -> libc::tm {
    let secs = t as libc::time_t;
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    tm
}

/// Unix time now.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Node names in Slurm's host list form, sorted as Slurm lists a job's or a partition's nodes
/// (by name, numbers compared as numbers, each once): `node[1-3,5],login`. The ranged form is
/// `berth_core::hostlist::compress`'s.
pub fn hostlist<S: AsRef<str>>(names: &[S]) -> String {
    // (prefix, number, the name): `node10` after `node9`; a name without digits by its text.
    let key = |n: &str| {
        let digits = n.bytes().rev().take_while(u8::is_ascii_digit).count();
        let (prefix, num) = n.split_at(n.len() - digits);
        (prefix.to_string(), num.parse::<u128>().ok(), n.to_string())
    };
    let mut sorted: Vec<_> = names.iter().map(|n| key(n.as_ref())).collect();
    sorted.sort();
    sorted.dedup();
    let names: Vec<String> = sorted.into_iter().map(|(_, _, n)| n).collect();
    berth_core::hostlist::compress(&names)
}

/// A job's state as Slurm's short code (`squeue %t`) and long name (`%T`).
pub fn slurm_state(j: &JobInfo) -> (&'static str, &'static str) {
    let ending = j.reason.as_deref().is_some_and(|r| r.starts_with("ending"));
    match j.state {
        JobState::Queued | JobState::Held => ("PD", "PENDING"),
        JobState::Running if ending => ("CG", "COMPLETING"),
        JobState::Running => ("R", "RUNNING"),
        JobState::Suspended => ("S", "SUSPENDED"),
        JobState::Completed => ("CD", "COMPLETED"),
        JobState::Failed if j.reason.as_deref() == Some("oom") => ("OOM", "OUT_OF_MEMORY"),
        JobState::Failed => ("F", "FAILED"),
        JobState::Cancelled => ("CA", "CANCELLED"),
        JobState::Timeout => ("TO", "TIMEOUT"),
        JobState::NodeFail => ("NF", "NODE_FAIL"),
    }
}

/// The berth states a Slurm state name (`squeue -t`, `scancel -t`) stands for, short or long,
/// any case; `all` is every state.
pub fn slurm_states(name: &str) -> Option<Vec<JobState>> {
    use JobState::*;
    Some(match name.to_ascii_uppercase().as_str() {
        "ALL" => JobState::ALL.to_vec(),
        "PD" | "PENDING" => vec![Queued, Held],
        "R" | "RUNNING" | "CG" | "COMPLETING" => vec![Running],
        "S" | "SUSPENDED" => vec![Suspended],
        "CD" | "COMPLETED" => vec![Completed],
        "F" | "FAILED" | "OOM" | "OUT_OF_MEMORY" => vec![Failed],
        "CA" | "CANCELLED" => vec![Cancelled],
        "TO" | "TIMEOUT" => vec![Timeout],
        "NF" | "NODE_FAIL" => vec![NodeFail],
        _ => return None,
    })
}

/// Why a pending job waits, or why a suspended one does not run, in Slurm's words (`squeue
/// %r`): one word scripts can match; `None` for any other job.
pub fn slurm_reason(j: &JobInfo) -> String {
    if j.state == JobState::Held {
        return "JobHeldUser".into();
    }
    if j.state == JobState::Suspended {
        return suspended_reason(j).into();
    }
    if !j.state.is_pending() {
        return "None".into();
    }
    // The controller's code, when it sends one berth knows (older ones send only the words).
    if let Some(code) = j.reason_code.as_deref().and_then(|c| PendingReason::CODES.iter().find(|k| **k == c)) {
        return (*code).into();
    }
    let r = j.reason.as_deref().unwrap_or("").to_ascii_lowercase();
    if r.is_empty() {
        "None"
    } else if r.starts_with("dependencyneversatisfied") {
        "DependencyNeverSatisfied"
    } else if r.starts_with("dependency") {
        "Dependency"
    } else if r.starts_with("begintime") {
        "BeginTime"
    } else if r.starts_with("jobarraytasklimit") {
        "JobArrayTaskLimit"
    } else if r.starts_with("resources") {
        "Resources"
    } else if r.starts_with("priority") {
        "Priority"
    } else if r.starts_with("no suitable node") {
        "ReqNodeNotAvail"
    } else if r.starts_with("queue limit") {
        if r.contains("user") {
            "QOSMaxCpuPerUserLimit"
        } else {
            "PartitionConfig"
        }
    } else if r.contains("reservation") {
        "Reservation"
    } else if r.starts_with("held") {
        "JobHeldUser"
    } else {
        "None"
    }
    .into()
}

/// A suspended job's code (docs/protocol/01-client.md): `Resources` or `NodeDown` while it
/// waits to resume, else what suspended it (`Preempted`, `SuspendedByAdmin`, `SystemFailure`).
/// From an older controller, which sends only the words, what suspended it as the words say;
/// `None` when neither names one (a wait with no cause kept, after a controller restart).
fn suspended_reason(j: &JobInfo) -> &'static str {
    if let Some(code) = j.reason_code.as_deref().and_then(|c| SuspendedReason::CODES.iter().find(|k| **k == c)) {
        return code;
    }
    j.reason.as_deref().and_then(SuspendedReason::from_words).map_or("None", |r| r.code())
}

/// The nodes a job has, or asks for while it waits (Slurm's `%D`).
pub fn job_node_count(j: &JobInfo) -> u32 {
    if !j.allocation.is_empty() {
        return j.allocation.len() as u32;
    }
    j.request.nodes.unwrap_or(1)
}

/// Seconds a job has run (its suspensions not counted), as of `now`.
pub fn elapsed(j: &JobInfo, now: f64) -> u64 {
    let Some(start) = j.start_time else { return 0 };
    let end = j.end_time.unwrap_or(now);
    (end - start - j.suspended_seconds.unwrap_or(0.0)).max(0.0) as u64
}

/// This host's name up to its first dot: the PBS "server" part of job ids (the controller is
/// reached through a Unix socket, so it runs on this host).
pub fn server_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    let name = if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    let short = name.split('.').next().unwrap_or("").to_string();
    if short.is_empty() || !short.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        "localhost".into()
    } else {
        short
    }
}

/// A job id as users of either dialect write it: `12`, `12.server`, `12.server.domain`.
pub fn parse_job_id(s: &str) -> Option<berth_core::JobId> {
    // PBS names an array `N[]` (`N[].server`): its id, which stands for all its tasks.
    let head = s.trim().split('.').next()?;
    let head = head.strip_suffix("[]").unwrap_or(head);
    head.parse::<u64>().ok().filter(|n| *n > 0).map(berth_core::JobId)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn getopt_reads_every_spelling() {
        let table = [
            both('J', "job-name", Arg::Required),
            both('H', "hold", Arg::No),
            both('h', "help", Arg::No),
            long("exclusive", Arg::Optional),
            long("parsable", Arg::No),
        ];
        let p = getopt(
            &args(&["-Jx", "--job", "y", "-Hh", "--exclusive", "--exclusive=user", "--pars", "s.sh", "-J", "z"]),
            &table,
            true,
        )
        .unwrap();
        assert_eq!(
            p.options,
            vec![
                ("--job-name".into(), Some("x".into())),
                ("--job-name".into(), Some("y".into())),
                ("--hold".into(), None),
                ("--help".into(), None),
                ("--exclusive".into(), None),
                ("--exclusive".into(), Some("user".into())),
                ("--parsable".into(), None),
            ]
        );
        assert_eq!(p.operands, args(&["s.sh", "-J", "z"]), "options end at the script");
        let p = getopt(&args(&["1", "-J", "n", "2", "--", "-3"]), &table, false).unwrap();
        assert_eq!(p.operands, args(&["1", "2", "-3"]));
        assert_eq!(getopt(&args(&["--bogus"]), &table, false).unwrap_err(), "unrecognized option '--bogus'");
        assert_eq!(getopt(&args(&["-x"]), &table, false).unwrap_err(), "invalid option -- 'x'");
        assert!(getopt(&args(&["--job-name"]), &table, false).unwrap_err().contains("requires an argument"));
        assert!(getopt(&args(&["--hold=1"]), &table, false).unwrap_err().contains("doesn't allow"));
        assert!(getopt(&args(&["--e"]), &[long("exclusive", Arg::No), long("export", Arg::No)], false)
            .unwrap_err()
            .contains("ambiguous"));
    }

    #[test]
    fn formats_pad_cut_and_justify_as_slurm() {
        let p = parse_format("%.18i %.9P %8j|%t %%").unwrap();
        let v = |c: char| match c {
            'i' => "42".to_string(),
            'P' => "verylongpartition".to_string(),
            'j' => "job".to_string(),
            't' => "R".to_string(),
            _ => unreachable!(),
        };
        assert_eq!(render(&p, v), format!("{:>18} {} job     |R %", "42", "verylongp"));
        assert!(check_fields(&p, "iPjt").is_ok());
        assert!(check_fields(&p, "iP").unwrap_err().contains("%j"));
        assert!(parse_format("%.").is_err());
    }

    #[test]
    fn times_as_slurm_and_pbs_print_them() {
        assert_eq!(slurm_duration(0), "0:00");
        assert_eq!(slurm_duration(65), "1:05");
        assert_eq!(slurm_duration(3600), "1:00:00");
        assert_eq!(slurm_duration(90_061), "1-01:01:01");
        assert_eq!(pbs_hms(3661), "01:01:01");
        assert_eq!(pbs_hms(100 * 3600), "100:00:00");
    }

    #[test]
    fn host_lists_fold_ranges() {
        assert_eq!(hostlist(&["node3", "node1", "node2"]), "node[1-3]");
        assert_eq!(hostlist(&["node1", "node3", "node4"]), "node[1,3-4]");
        assert_eq!(hostlist(&["n01", "n02", "login", "gpu7"]), "gpu7,login,n[01-02]");
        assert_eq!(hostlist(&["node10", "node9", "node9"]), "node[9-10]");
        assert_eq!(hostlist(&["node1"]), "node1");
        assert_eq!(hostlist::<&str>(&[]), "");
    }

    #[test]
    fn job_ids_of_either_dialect() {
        assert_eq!(parse_job_id("12"), Some(berth_core::JobId(12)));
        assert_eq!(parse_job_id("12.server.example.org"), Some(berth_core::JobId(12)));
        assert_eq!(parse_job_id("x"), None);
        assert_eq!(parse_job_id("12[].server"), Some(berth_core::JobId(12)));
        assert_eq!(parse_job_id("12[3]"), None);
        assert_eq!(parse_job_id("0"), None);
        assert!(slurm_states("pd").unwrap().contains(&JobState::Held));
        assert_eq!(slurm_states("ALL").unwrap().len(), JobState::ALL.len());
        assert!(slurm_states("bogus").is_none());
    }
}
