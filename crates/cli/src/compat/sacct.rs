//! Slurm's `sacct`: jobs (running and finished) with their accounting, in sacct's columns,
//! `-P`/`-p` parsable, `-o FIELD[%WIDTH],...`. Each job's line is followed by one per step
//! (`berth run`/`srun` inside it: `N.0`, `N.1`, ...; not with `-X`). berth has no `N.batch`
//! or `N.extern` steps: the batch script's accounting is the job's own line.

use super::format::{self as f, both, long, Arg, Opt};
use super::slurm::own_user_name;
use crate::client::request;
use anyhow::{bail, Result};
use berth_core::job::JobState;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo, ACCT_MAX_JOBS, ACCT_MAX_USERS};
use std::path::Path;

const SACCT_OPTS: &[Opt] = &[
    both('a', "allusers", Arg::No),
    both('A', "accounts", Arg::Required),
    both('b', "brief", Arg::No),
    both('D', "duplicates", Arg::No),
    both('e', "helpformat", Arg::No),
    both('E', "endtime", Arg::Required),
    both('h', "help", Arg::No),
    both('j', "jobs", Arg::Required),
    both('L', "allclusters", Arg::No),
    both('n', "noheader", Arg::No),
    long("name", Arg::Required),
    both('o', "format", Arg::Required),
    both('p', "parsable", Arg::No),
    both('P', "parsable2", Arg::No),
    both('r', "partition", Arg::Required),
    both('s', "state", Arg::Required),
    both('S', "starttime", Arg::Required),
    both('u', "user", Arg::Required),
    long("usage", Arg::No),
    both('X', "allocations", Arg::No),
    both('v', "verbose", Arg::No),
    both('V', "version", Arg::No),
];

/// Every field berth fills: (name, default width, left-justified).
const FIELDS: &[(&str, usize, bool)] = &[
    ("JobID", 12, true),
    ("JobIDRaw", 12, true),
    ("JobName", 10, false),
    ("Partition", 10, false),
    ("Account", 10, false),
    ("AllocCPUS", 10, false),
    ("ReqCPUS", 8, false),
    ("NCPUS", 10, false),
    ("State", 10, false),
    ("ExitCode", 8, false),
    ("DerivedExitCode", 15, false),
    ("User", 9, false),
    ("UID", 6, false),
    ("GID", 6, false),
    ("Elapsed", 10, false),
    ("ElapsedRaw", 10, false),
    ("Timelimit", 10, false),
    ("TimelimitRaw", 12, false),
    ("Submit", 19, false),
    ("Start", 19, false),
    ("End", 19, false),
    ("NNodes", 8, false),
    ("AllocNodes", 10, false),
    ("NodeList", 15, true),
    ("ReqMem", 10, false),
    ("MaxRSS", 10, false),
    ("TotalCPU", 10, false),
    ("UserCPU", 10, false),
    ("SystemCPU", 10, false),
    ("CPUTime", 10, false),
    ("CPUTimeRAW", 10, false),
    ("AllocTRES", 30, true),
    ("WorkDir", 20, true),
    ("Reason", 20, false),
    ("Priority", 10, false),
    ("QOS", 10, false),
];

pub const SACCT_FORMAT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
const SACCT_BRIEF: &str = "JobID,State,ExitCode";

/// A column: the field's canonical name, its width, how it is justified.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Column {
    pub name: &'static str,
    pub width: usize,
    pub left: bool,
}

/// `-o`: `field[%width]` names, any case.
pub fn parse_columns(spec: &str) -> Result<Vec<Column>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, width) = match item.split_once('%') {
            Some((n, w)) => (
                n,
                Some(w.parse::<usize>().ok().filter(|w| *w <= 4096).ok_or_else(|| {
                    let shown: String = item.chars().take(64).collect();
                    format!("bad width in {shown:?}")
                })?),
            ),
            None => (item, None),
        };
        let &(canon, default, left) =
            FIELDS.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(name)).ok_or_else(|| {
                // Shown as typed, but cut and with control characters escaped.
                let shown: String = berth_core::limits::escape_control(name).chars().take(64).collect();
                format!("Invalid field requested: \"{shown}\"; `sacct -e` lists the fields berth fills")
            })?;
        out.push(Column { name: canon, width: width.unwrap_or(default), left });
    }
    if out.is_empty() {
        return Err("no fields in --format".into());
    }
    Ok(out)
}

/// Local time `t` of today at 00:00, as a Unix time.
fn midnight(now: f64) -> f64 {
    let secs = now as libc::time_t;
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it, mktime reads it.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&secs, &mut tm);
        tm.tm_hour = 0;
        tm.tm_min = 0;
        tm.tm_sec = 0;
        tm.tm_isdst = -1;
        libc::mktime(&mut tm) as f64
    }
}

/// Local time of `now`'s day at `h:m:s`, `days` later, as a Unix time.
fn at_time_of_day(now: f64, days: i32, h: i32, m: i32, sec: i32) -> Option<f64> {
    let secs = now as libc::time_t;
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it, mktime reads it.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&secs, &mut tm);
        (tm.tm_hour, tm.tm_min, tm.tm_sec) = (h, m, sec);
        tm.tm_mday += days;
        tm.tm_isdst = -1;
        let t = libc::mktime(&mut tm);
        (t != -1).then_some(t as f64)
    }
}

/// A date read: (year, none for this year; month 1-12; day).
type Ymd = (Option<i32>, i32, i32);

/// Slurm's time forms (sacct `-S`/`-E`, as its `parse_time`): `YYYY-MM-DD[THH:MM[:SS]]`,
/// `MMDD[YY]`, `MM/DD[/YY]` and `MM.DD[.YY]` (each optionally `-HH:MM[:SS]`), `HH:MM[:SS]`
/// (today), `now[{+|-}N[seconds|minutes|hours|days|weeks]]`, `today`, `midnight`,
/// `tomorrow`, `noon`, `elevenses`, `fika`, `teatime`. A two-digit year is 20YY.
pub fn parse_time(s: &str, now: f64) -> Option<f64> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "now" => return Some(now),
        "today" | "midnight" => return Some(midnight(now)),
        "tomorrow" => return at_time_of_day(now, 1, 0, 0, 0),
        "noon" => return at_time_of_day(now, 0, 12, 0, 0),
        "elevenses" => return at_time_of_day(now, 0, 11, 0, 0),
        "fika" => return at_time_of_day(now, 0, 15, 0, 0),
        "teatime" => return at_time_of_day(now, 0, 16, 0, 0),
        _ => {}
    }
    if let Some(rest) = lower.strip_prefix("now-").or_else(|| lower.strip_prefix("now+")) {
        let sign = if lower.starts_with("now-") { -1.0 } else { 1.0 };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        // Bounded: at most 100 years either way.
        let n: f64 = digits.parse::<u32>().ok()?.into();
        let unit = match &rest[digits.len()..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 7.0 * 86_400.0,
            _ => return None,
        };
        let delta = n * unit;
        return (delta <= 100.0 * 366.0 * 86_400.0).then_some(now + sign * delta);
    }
    let num = |v: &str| -> Option<i32> {
        (!v.is_empty() && v.len() <= 4 && v.bytes().all(|b| b.is_ascii_digit())).then(|| v.parse().ok()).flatten()
    };
    let year = |v: &str| -> Option<i32> {
        let y = num(v)?;
        Some(if v.len() == 2 { 2000 + y } else { y })
    };
    // (date as (year or None for this year, month, day), time as (h, m, s)).
    let (date, time): (Option<Ymd>, Option<&str>) =
        if s.len() >= 10 && s.as_bytes()[4] == b'-' && s.as_bytes()[7] == b'-' {
            let (d, t) = match s.split_once('T') {
                Some((d, t)) => (d, Some(t)),
                None => (s, None),
            };
            let p: Vec<&str> = d.split('-').collect();
            let [y, m, day] = p.as_slice() else { return None };
            if y.len() != 4 {
                return None;
            }
            (Some((Some(num(y)?), num(m)?, num(day)?)), t)
        } else if s.contains(':') && !s.contains(['/', '.', '-']) {
            (None, Some(s))
        } else {
            let (d, t) = match s.split_once('-') {
                Some((d, t)) => (d, Some(t)),
                None => (s, None),
            };
            let date = if d.contains(['/', '.']) {
                let p: Vec<&str> = d.split(['/', '.']).collect();
                match p.as_slice() {
                    [m, day] => (None, num(m)?, num(day)?),
                    [m, day, y] => (Some(year(y)?), num(m)?, num(day)?),
                    _ => return None,
                }
            } else {
                match d.len() {
                    4 => (None, num(&d[..2])?, num(&d[2..])?),
                    6 => (Some(year(&d[4..])?), num(&d[..2])?, num(&d[2..4])?),
                    _ => return None,
                }
            };
            (Some(date), t)
        };
    // SAFETY: a zeroed tm is valid; localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let secs = now as libc::time_t;
    unsafe { libc::localtime_r(&secs, &mut tm) };
    (tm.tm_hour, tm.tm_min, tm.tm_sec) = (0, 0, 0);
    if let Some((y, m, day)) = date {
        if let Some(y) = y {
            if !(1970..=9999).contains(&y) {
                return None;
            }
            tm.tm_year = y - 1900;
        }
        (tm.tm_mon, tm.tm_mday) = (m - 1, day);
    }
    if let Some(t) = time {
        let p: Vec<i32> = t.split(':').map(num).collect::<Option<_>>()?;
        match p.as_slice() {
            [h, m] => (tm.tm_hour, tm.tm_min) = (*h, *m),
            [h, m, sec] => (tm.tm_hour, tm.tm_min, tm.tm_sec) = (*h, *m, *sec),
            _ => return None,
        }
    }
    if !(0..12).contains(&tm.tm_mon)
        || !(1..=31).contains(&tm.tm_mday)
        || !(0..24).contains(&tm.tm_hour)
        || !(0..60).contains(&tm.tm_min)
        || !(0..=60).contains(&tm.tm_sec)
    {
        return None;
    }
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalises the tm it is given.
    let t = unsafe { libc::mktime(&mut tm) };
    (t != -1).then_some(t as f64)
}

/// What a sacct command line asks for.
#[derive(Debug)]
pub struct SacctQuery {
    pub columns: Vec<Column>,
    pub header: bool,
    /// `-p` (a `|` after every field) or `-P` (between fields).
    pub parsable: Option<bool>,
    pub all_users: bool,
    pub users: Vec<String>,
    pub ids: Vec<berth_core::JobId>,
    pub names: Vec<String>,
    pub partitions: Vec<String>,
    pub accounts: Vec<String>,
    pub states: Option<Vec<JobState>>,
    pub start: Option<f64>,
    pub end: Option<f64>,
    pub info: Option<String>,
    /// A line for each step of a job (`N.0`) after its own; not with `-X`.
    pub steps: bool,
}

pub fn sacct_query(args: &[String], now: f64) -> Result<SacctQuery, String> {
    let p = f::getopt(args, SACCT_OPTS, false)?;
    if let Some(op) = p.operands.first() {
        return Err(format!("unrecognized argument {op:?}"));
    }
    let info = if p.has("--version") {
        Some(format!("slurm {} (berth {})\n", super::slurm::SLURM_VERSION, env!("CARGO_PKG_VERSION")))
    } else if p.has("--helpformat") {
        Some(format!("{}\n", FIELDS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(" ")))
    } else if p.has("--help") || p.has("--usage") {
        Some("Usage: sacct [-a] [-u USERS] [-j IDS] [--name NAMES] [-s STATES] [-r PARTITIONS] [-A ACCOUNTS] [-S TIME] [-E TIME] [-X] [-n] [-p|-P] [-b] [-o FIELDS]\n".into())
    } else {
        None
    };
    let spec = match p.last("--format") {
        Some(s) => s.to_string(),
        None if p.has("--brief") => SACCT_BRIEF.into(),
        None => SACCT_FORMAT.into(),
    };
    let columns = parse_columns(&spec)?;
    let ids = p
        .list("--jobs")
        .iter()
        .map(|s| f::parse_job_id(s).filter(|_| !s.contains('_')).ok_or_else(|| format!("invalid job id {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let states = if p.has("--state") {
        let mut all = Vec::new();
        for s in p.list("--state") {
            all.extend(f::slurm_states(&s).ok_or_else(|| format!("invalid job state specified: {s}"))?);
        }
        Some(all)
    } else {
        None
    };
    let time = |key: &str| -> Result<Option<f64>, String> {
        p.last(key)
            .map(|v| parse_time(v, now).ok_or_else(|| format!("invalid time specification {v:?} for {key}")))
            .transpose()
    };
    let users = p.list("--user");
    if users.len() > ACCT_MAX_USERS {
        return Err(format!("--user names {} users; at most {ACCT_MAX_USERS}", users.len()));
    }
    let parsable = if p.has("--parsable2") {
        Some(false)
    } else if p.has("--parsable") {
        Some(true)
    } else {
        None
    };
    Ok(SacctQuery {
        columns,
        header: !p.has("--noheader"),
        parsable,
        all_users: p.has("--allusers"),
        users,
        ids,
        names: p.list("--name"),
        partitions: p.list("--partition"),
        accounts: p.list("--accounts"),
        states,
        start: time("--starttime")?,
        end: time("--endtime")?,
        info,
        steps: !p.has("--allocations"),
    })
}

impl SacctQuery {
    /// The time window without `-j`: `-S` (default: midnight today, or now with `-s`, as
    /// sacct) to `-E` (default: none, i.e. now).
    pub fn window(&self, now: f64) -> (f64, Option<f64>) {
        let from = self.start.unwrap_or_else(|| if self.states.is_some() { now } else { midnight(now) });
        (from, self.end)
    }

    /// The controller's `acct` request that holds every job this query may list (the rest
    /// of the filtering is [`SacctQuery::keeps`]).
    pub fn request(&self, me: &str, now: f64, active: bool) -> ClientRequest {
        let (since, until) = if self.ids.is_empty() { (Some(self.window(now).0), self.end) } else { (None, None) };
        let users = if !self.users.is_empty() {
            self.users.clone()
        } else if self.all_users || !self.ids.is_empty() {
            vec![]
        } else {
            vec![me.to_string()]
        };
        let with_steps = self.steps;
        ClientRequest::Acct { limit: Some(ACCT_MAX_JOBS), steps: false, since, until, users, active, with_steps }
    }

    /// Whether job `j` is listed: the filters, and (without ids) in the time window, by
    /// default since midnight.
    pub fn keeps(&self, j: &JobInfo, me: &str, now: f64) -> bool {
        if !self.ids.is_empty() {
            if !self.ids.contains(&j.id) {
                return false;
            }
        } else {
            let (from, to) = self.window(now);
            let to = to.unwrap_or(f64::INFINITY);
            let began = j.start_time.unwrap_or(j.submit_time);
            if j.end_time.is_some_and(|e| e < from) || began > to {
                return false;
            }
        }
        let users_ok = if !self.users.is_empty() {
            self.users.contains(&j.user)
        } else {
            self.all_users || !self.ids.is_empty() || j.user == me
        };
        users_ok
            && self.states.as_ref().is_none_or(|s| s.contains(&j.state))
            && (self.names.is_empty() || self.names.contains(&j.name))
            && (self.partitions.is_empty() || self.partitions.contains(&j.queue))
            && (self.accounts.is_empty() || self.accounts.contains(&j.account))
    }
}

/// What a job holds, as Slurm's AllocTRES (`billing=4,cpu=4,gres/gpu=2,node=1`, types in
/// Slurm's order); empty for a job that holds nothing (yet). `billing` is what the controller
/// bills the job a second (its CPUs and GPUs by `[fair_share]`'s weights), a whole number as
/// Slurm prints it; the CPUs when the controller did not say.
fn alloc_tres(j: &JobInfo, cpus: u64) -> String {
    if j.allocation.is_empty() {
        return String::new();
    }
    let gpus: usize = j.allocation.iter().map(|a| a.gpus.len()).sum();
    let gpus = if gpus > 0 { format!(",gres/gpu={gpus}") } else { String::new() };
    // Other generic resources (summed over the nodes) and licenses, by name, after the GPUs.
    let held = match crate::output::held_tres(j) {
        h if h.is_empty() => h,
        h => format!(",{h}"),
    };
    let billing =
        j.billing.filter(|b| b.is_finite() && *b >= 0.0).map_or(cpus, |b| b.round().min(u64::MAX as f64) as u64);
    format!("billing={billing},cpu={cpus}{gpus}{held},node={}", f::job_node_count(j))
}

/// One field of a job as sacct prints it.
pub fn sacct_field(j: &JobInfo, name: &str, now: f64) -> String {
    let time = |t: Option<f64>| t.map(f::iso_time).unwrap_or_else(|| "Unknown".into());
    let hms = |secs: u64| {
        let d = secs / 86_400;
        if d > 0 {
            format!("{d}-{}", f::pbs_hms(secs % 86_400))
        } else {
            f::pbs_hms(secs)
        }
    };
    let alloc: u64 = j.allocation.iter().map(|a| a.cores as u64).sum();
    let nodes: Vec<&str> = j.allocation.iter().map(|a| a.node.as_str()).collect();
    let elapsed = f::elapsed(j, now);
    let cpu = j.accounting.as_ref().map(|a| (a.user_cpu_seconds, a.system_cpu_seconds));
    let cpu_text = |s: f64| format!("{:02}:{:06.3}", (s / 60.0) as u64, s % 60.0);
    match name {
        "JobID" | "JobIDRaw" => j.id.to_string(),
        "JobName" => j.name.clone(),
        "Partition" => j.queue.clone(),
        "Account" => j.account.clone(),
        "AllocCPUS" | "NCPUS" => alloc.to_string(),
        "ReqCPUS" => crate::output::job_cpus(j),
        "State" => match j.state {
            JobState::Running => "RUNNING".into(),
            _ => f::slurm_state(j).1.into(),
        },
        "ExitCode" | "DerivedExitCode" => format!("{}:{}", j.exit_code.unwrap_or(0), j.signal.unwrap_or(0)),
        "User" => j.user.clone(),
        "UID" => j.uid.to_string(),
        "GID" => j.gid.to_string(),
        "Elapsed" => hms(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "Timelimit" => j.walltime_seconds.map(hms).unwrap_or_else(|| "UNLIMITED".into()),
        "TimelimitRaw" => j.walltime_seconds.map(|w| (w / 60).to_string()).unwrap_or_else(|| "UNLIMITED".into()),
        "Submit" => f::iso_time(j.submit_time),
        "Start" => time(j.start_time),
        "End" => time(j.end_time),
        "NNodes" | "AllocNodes" => f::job_node_count(j).to_string(),
        "NodeList" => {
            if nodes.is_empty() {
                "None assigned".into()
            } else {
                f::hostlist(&nodes)
            }
        }
        "ReqMem" => match (j.request.mem_per_node, j.request.mem_per_cpu) {
            (Some(b), _) => format!("{}M", b >> 20),
            (None, Some(b)) => format!("{}M", b >> 20),
            _ => "0".into(),
        },
        "MaxRSS" => j.accounting.as_ref().map(|a| format!("{}K", a.peak_memory_bytes >> 10)).unwrap_or_default(),
        "TotalCPU" => cpu.map(|(u, s)| cpu_text(u + s)).unwrap_or_else(|| "00:00:00".into()),
        "UserCPU" => cpu.map(|(u, _)| cpu_text(u)).unwrap_or_else(|| "00:00:00".into()),
        "SystemCPU" => cpu.map(|(_, s)| cpu_text(s)).unwrap_or_else(|| "00:00:00".into()),
        "CPUTime" => hms(elapsed * alloc),
        "CPUTimeRAW" => (elapsed * alloc).to_string(),
        "AllocTRES" => alloc_tres(j, alloc),
        "WorkDir" => j.cwd.clone(),
        "Reason" => f::slurm_reason(j),
        "Priority" => j.priority.as_ref().map(|p| format!("{:.0}", p.total)).unwrap_or_else(|| "0".into()),
        "QOS" => "normal".into(),
        _ => String::new(),
    }
}

/// A value cut to its column: sacct marks the cut with `+`.
fn cut(s: &str, c: &Column) -> String {
    let s = if s.chars().count() > c.width {
        let mut t: String = s.chars().take(c.width.saturating_sub(1)).collect();
        t.push('+');
        t
    } else {
        s.to_string()
    };
    if c.left {
        format!("{s:<w$} ", w = c.width)
    } else {
        format!("{s:>w$} ", w = c.width)
    }
}

pub fn sacct_table(q: &SacctQuery, jobs: &[JobInfo], now: f64) -> String {
    let jobs = crate::output::escaped(jobs);
    let mut out = String::new();
    let line = |values: Vec<String>, out: &mut String| {
        match q.parsable {
            Some(trailing) => {
                out.push_str(&values.join("|"));
                if trailing {
                    out.push('|');
                }
            }
            None => {
                for (v, c) in values.iter().zip(&q.columns) {
                    out.push_str(&cut(v, c));
                }
            }
        }
        out.push('\n');
    };
    if q.header {
        line(q.columns.iter().map(|c| c.name.to_string()).collect(), &mut out);
        if q.parsable.is_none() {
            line(q.columns.iter().map(|c| "-".repeat(c.width)).collect(), &mut out);
        }
    }
    for j in &jobs {
        line(q.columns.iter().map(|c| sacct_field(j, c.name, now)).collect(), &mut out);
        if q.steps {
            for s in &j.steps {
                line(q.columns.iter().map(|c| step_field(j, s, c.name, now)).collect(), &mut out);
            }
        }
    }
    out
}

/// One field of a job's step (`berth run`/`srun` inside it) as sacct prints its `N.S` line;
/// what berth does not record per step is blank, as sacct leaves what it lacks.
pub fn step_field(j: &JobInfo, s: &berth_protocol::step::StepInfo, name: &str, now: f64) -> String {
    let elapsed = (s.end_time.unwrap_or(now) - s.start_time).max(0.0) as u64;
    let cpus = u64::from(s.size) * u64::from(j.request.cpus_per_task.unwrap_or(1));
    let hms = |secs: u64| match secs / 86_400 {
        0 => f::pbs_hms(secs),
        d => format!("{d}-{}", f::pbs_hms(secs % 86_400)),
    };
    // A rank ended by signal N reports 128+N (`berth run`'s status): sacct's `0:N`.
    let (code, signal) = match s.exit_code {
        Some(c) if (129..=128 + 64).contains(&c) => (0, c - 128),
        Some(c) => (c, 0),
        None => (0, 0),
    };
    match name {
        "JobID" | "JobIDRaw" => format!("{}.{}", j.id, s.step),
        "JobName" => s.argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default(),
        "Account" => j.account.clone(),
        "AllocCPUS" | "NCPUS" | "ReqCPUS" => cpus.to_string(),
        "State" => match (s.end_time, &s.failure, s.exit_code) {
            (None, _, _) => "RUNNING".into(),
            (Some(_), None, Some(0)) => "COMPLETED".into(),
            (Some(_), Some(f), _) if f.contains("cancel") => "CANCELLED".into(),
            _ => "FAILED".into(),
        },
        "ExitCode" => format!("{code}:{signal}"),
        "User" => s.user.clone(),
        "UID" => s.uid.to_string(),
        "GID" => j.gid.to_string(),
        "Elapsed" => hms(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "Submit" | "Start" => f::iso_time(s.start_time),
        "End" => s.end_time.map(f::iso_time).unwrap_or_else(|| "Unknown".into()),
        "NNodes" | "AllocNodes" => s.nodes.len().to_string(),
        "NodeList" => f::hostlist(&s.nodes),
        "CPUTime" => hms(elapsed * cpus),
        "CPUTimeRAW" => (elapsed * cpus).to_string(),
        "WorkDir" => s.cwd.clone(),
        _ => String::new(),
    }
}

pub async fn sacct(dir: &Path, args: Vec<String>) -> Result<i32> {
    let now = f::now();
    let q = match sacct_query(&args, now) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("sacct: error: {}", crate::output::terminal_safe(&e));
            return Ok(1);
        }
    };
    if let Some(info) = &q.info {
        print!("{info}");
        return Ok(0);
    }
    let me = own_user_name();
    let mut jobs = if q.ids.is_empty() {
        match request(dir, q.request(&me, now, true)).await? {
            ClientResponse::Acct { jobs } => jobs,
            ClientResponse::Error(e) => {
                eprintln!("sacct: error: {}", crate::output::terminal_safe(&e.message));
                return Ok(1);
            }
            _ => bail!("unexpected answer"),
        }
    } else {
        // An unknown id lists nothing, as in sacct.
        super::jobs_by_id_with(dir, &q.ids, q.steps).await?
    };
    jobs.retain(|j| q.keeps(j, &me, now));
    print!("{}", crate::output::terminal_safe(&sacct_table(&q, &jobs, now)));
    Ok(0)
}

/// `berth acct`'s filters and columns: sacct's, natively (docs/compat.md, "Accounting").
#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
pub struct AcctArgs {
    /// Columns, by sacct's field names with an optional width (`JobID,State,Elapsed%12`);
    /// `--format help` lists them. Default: berth's own table.
    #[arg(long, short = 'o', value_name = "FIELDS")]
    pub format: Option<String>,
    /// Jobs not ended before this time (Slurm's forms: YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS],
    /// now[-N[units]], MMDD[YY], MM/DD[/YY]). Default: midnight today (now with --state),
    /// none with --jobs.
    #[arg(long, short = 'S', value_name = "TIME")]
    pub starttime: Option<String>,
    /// Jobs started (or submitted) by this time. Default: now.
    #[arg(long, short = 'E', value_name = "TIME")]
    pub endtime: Option<String>,
    /// Only these users' jobs (comma list). Default: everyone's.
    #[arg(long, short = 'u', value_delimiter = ',')]
    pub user: Vec<String>,
    /// Only jobs of these names (comma list).
    #[arg(long, value_delimiter = ',')]
    pub name: Vec<String>,
    /// Only jobs in these states: berth's names or Slurm's (CD, F, CA, TO, NF, R, PD).
    #[arg(long, short = 's', value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only these jobs (comma list of ids); any time.
    #[arg(long = "jobs", short = 'j', value_delimiter = ',', value_name = "IDS")]
    pub jobs: Vec<String>,
}

impl AcctArgs {
    fn is_empty(&self) -> bool {
        *self == AcctArgs::default()
    }

    /// The query these arguments make: everyone's jobs unless `--user`.
    pub fn query(&self, now: f64) -> Result<SacctQuery, String> {
        let columns = match self.format.as_deref() {
            Some(spec) => parse_columns(spec)?,
            None => vec![],
        };
        if self.user.len() > ACCT_MAX_USERS {
            return Err(format!("--user names {} users; at most {ACCT_MAX_USERS}", self.user.len()));
        }
        let ids = self
            .jobs
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| f::parse_job_id(s.trim()).ok_or_else(|| format!("invalid job id {s:?} in --jobs")))
            .collect::<Result<Vec<_>, _>>()?;
        if ids.len() > berth_protocol::client::MAX_IDS_PER_REQUEST {
            return Err(format!(
                "--jobs names {} jobs; at most {}",
                ids.len(),
                berth_protocol::client::MAX_IDS_PER_REQUEST
            ));
        }
        let states = if self.state.is_empty() {
            None
        } else {
            let mut all = Vec::new();
            for s in &self.state {
                match JobState::parse(&s.to_ascii_lowercase()).map(|st| vec![st]).or_else(|| f::slurm_states(s)) {
                    Some(st) => all.extend(st),
                    None => {
                        return Err(format!(
                            "unknown state {s:?}: give berth's names ({}) or Slurm's (CD, F, CA, TO, NF, R, PD)",
                            JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        ))
                    }
                }
            }
            Some(all)
        };
        let time = |key: &str, v: &Option<String>| -> Result<Option<f64>, String> {
            v.as_deref()
                .map(|v| {
                    parse_time(v, now).ok_or_else(|| {
                        format!("{key} {v:?} is not a time; give YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS], now-2hours, MMDD[YY] or MM/DD[/YY]")
                    })
                })
                .transpose()
        };
        Ok(SacctQuery {
            columns,
            header: true,
            parsable: None,
            all_users: true,
            users: self.user.clone(),
            ids,
            names: self.name.clone(),
            partitions: vec![],
            accounts: vec![],
            states,
            start: time("--starttime", &self.starttime)?,
            end: time("--endtime", &self.endtime)?,
            info: None,
            // `berth acct --steps` is the step log; its job table has one line a job.
            steps: false,
        })
    }
}

/// `berth acct`: finished jobs (with `--state`, active ones too), filtered as sacct's; with
/// `--steps` the invocation log of `berth run`.
pub async fn native(dir: &Path, json: bool, limit: u32, steps: bool, args: AcctArgs) -> Result<i32> {
    if steps {
        if !args.is_empty() {
            bail!("--steps takes only --limit; the job filters (--user, --starttime, ...) are for jobs");
        }
        let req = ClientRequest::Acct {
            limit: Some(limit),
            steps: true,
            since: None,
            until: None,
            users: vec![],
            active: false,
            with_steps: false,
        };
        let ClientResponse::Steps { steps } = request(dir, req).await? else { bail!("unexpected answer") };
        if json {
            println!("{}", serde_json::to_string_pretty(&steps)?);
        } else {
            print!("{}", crate::output::terminal_safe(&crate::output::steps_table(&steps)));
        }
        return Ok(0);
    }
    if args.format.as_deref().is_some_and(|f| f.eq_ignore_ascii_case("help")) {
        println!("{}", FIELDS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(" "));
        return Ok(0);
    }
    let now = f::now();
    let q = args.query(now).map_err(|e| anyhow::anyhow!(e))?;
    let active = q.states.as_ref().is_some_and(|s| s.iter().any(|st| !st.is_finished()));
    let mut req = q.request("", now, active);
    if let ClientRequest::Acct { limit: l, .. } = &mut req {
        *l = Some(limit.min(ACCT_MAX_JOBS));
    }
    let mut jobs = if q.ids.is_empty() {
        match request(dir, req).await? {
            ClientResponse::Acct { jobs } => jobs,
            ClientResponse::Error(e) => bail!("{}", e.message),
            _ => bail!("unexpected answer"),
        }
    } else {
        super::jobs_by_id(dir, &q.ids).await?
    };
    jobs.retain(|j| q.keeps(j, "", now) && (active || j.state.is_finished()));
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
    } else if q.columns.is_empty() {
        print!("{}", crate::output::terminal_safe(&crate::output::acct_table(&jobs)));
    } else {
        print!("{}", crate::output::terminal_safe(&sacct_table(&q, &jobs, now)));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::slurm::tests::{job, running};

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn acct_requests_carry_the_filters() {
        let now = 2_000_000_000.0;
        let q = sacct_query(&args(&["-S", "now-1hours", "-E", "now"]), now).unwrap();
        assert_eq!(
            q.request("ann", now, true),
            ClientRequest::Acct {
                limit: Some(ACCT_MAX_JOBS),
                steps: false,
                since: Some(now - 3600.0),
                until: Some(now),
                users: vec!["ann".into()],
                active: true,
                with_steps: true,
            }
        );
        let q = sacct_query(&args(&["-a"]), now).unwrap();
        let ClientRequest::Acct { since, users, .. } = q.request("ann", now, true) else { panic!() };
        assert_eq!((since, users), (Some(midnight(now)), vec![]));
        let q = sacct_query(&args(&["-j", "4", "-u", "bob"]), now).unwrap();
        let ClientRequest::Acct { since, until, users, .. } = q.request("ann", now, true) else { panic!() };
        assert_eq!((since, until, users), (None, None, vec!["bob".to_string()]), "-j: any time");
        let many: Vec<String> = (0..=ACCT_MAX_USERS).map(|i| format!("u{i}")).collect();
        assert!(sacct_query(&args(&["-u", &many.join(",")]), now).unwrap_err().contains("at most"));
    }

    #[test]
    fn steps_follow_their_job_unless_x() {
        let now = 2_000_000_000.0;
        let mut j = job(7, "sim", "ann", "completed");
        j.request.cpus_per_task = Some(2);
        let step = |n: u32, exit: Option<i32>, end: Option<f64>| berth_protocol::step::StepInfo {
            job: j.id,
            step: n,
            user: "ann".into(),
            uid: 1000,
            start_time: now - 100.0,
            end_time: end,
            host: "login".into(),
            pid: 1,
            cwd: "/home/ann".into(),
            argv: vec!["/opt/bin/a.out".into()],
            size: 4,
            nodes: vec!["n1".into(), "n2".into()],
            exit_code: exit,
            failure: None,
            interactive: false,
        };
        j.steps = vec![step(0, Some(0), Some(now - 40.0)), step(1, Some(137), Some(now)), step(2, None, None)];
        let fields = ["-P", "-n", "-o", "JobID,JobName,AllocCPUS,State,ExitCode,Elapsed,NNodes,NodeList"];
        let q = sacct_query(&args(&fields), now).unwrap();
        assert!(q.steps);
        let table = sacct_table(&q, std::slice::from_ref(&j), now);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("7|"), "{table}");
        assert_eq!(lines[1], "7.0|a.out|8|COMPLETED|0:0|00:01:00|2|n[1-2]");
        assert_eq!(lines[2], "7.1|a.out|8|FAILED|0:9|00:01:40|2|n[1-2]", "killed by signal 9");
        assert_eq!(lines[3], "7.2|a.out|8|RUNNING|0:0|00:01:40|2|n[1-2]");
        let with_x: Vec<&str> = fields.iter().copied().chain(["-X"]).collect();
        let q = sacct_query(&args(&with_x), now).unwrap();
        assert_eq!(sacct_table(&q, std::slice::from_ref(&j), now).lines().count(), 1, "-X: the job alone");
        let ClientRequest::Acct { with_steps, .. } = q.request("ann", now, true) else { panic!() };
        assert!(!with_steps);
    }

    #[test]
    fn an_unknown_field_is_named_cut_and_escaped() {
        let long = format!("Bogus\x1b[31m{}", "x".repeat(5000));
        let e = parse_columns(&format!("jobid,{long}")).unwrap_err();
        assert!(e.starts_with("Invalid field requested: \"Bogus\\u{1b}[31m"), "{e}");
        assert!(e.len() < 200 && !e.contains('\x1b'), "{e}");
        let e = parse_columns(&format!("jobid%{}", "9".repeat(5000))).unwrap_err();
        assert!(e.starts_with("bad width in") && e.len() < 200, "{e}");
    }

    #[test]
    fn native_acct_arguments() {
        let now = 2_000_000_000.0;
        let a = AcctArgs {
            format: Some("jobid,state".into()),
            starttime: Some("now-2days".into()),
            user: vec!["ann".into()],
            state: vec!["completed".into(), "CA".into()],
            ..AcctArgs::default()
        };
        let q = a.query(now).unwrap();
        assert_eq!(q.columns.iter().map(|c| c.name).collect::<Vec<_>>(), ["JobID", "State"]);
        assert_eq!(q.states, Some(vec![JobState::Completed, JobState::Cancelled]));
        assert_eq!(q.start, Some(now - 2.0 * 86_400.0));
        let mut done = job(3, "x", "ann", "completed");
        done.end_time = Some(now - 3600.0);
        assert!(q.keeps(&done, "", now));
        assert!(!q.keeps(&job(4, "x", "bob", "completed"), "", now), "--user");
        let bad = AcctArgs { starttime: Some("someday".into()), ..AcctArgs::default() };
        assert!(bad.query(now).unwrap_err().contains("is not a time"));
        let bad = AcctArgs { state: vec!["sleeping".into()], ..AcctArgs::default() };
        assert!(bad.query(now).unwrap_err().contains("unknown state"));
        let bad = AcctArgs { jobs: vec!["x1".into()], ..AcctArgs::default() };
        assert!(bad.query(now).is_err());
        // Without -S or -j: today only, everyone's.
        let q = AcctArgs::default().query(now).unwrap();
        assert_eq!(q.window(now).0, midnight(now));
        assert!(q.all_users);
    }

    #[test]
    fn sacct_default_and_parsable_outputs() {
        let now = 2_000_000_000.0;
        let mut done = running(5, &["node1"], now - 100.0);
        done.state = JobState::Completed;
        done.end_time = Some(now - 40.0);
        done.exit_code = Some(0);
        let q = sacct_query(&[], now).unwrap();
        let t = sacct_table(&q, &[done.clone()], now);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ");
        assert_eq!(lines[1], "------------ ---------- ---------- ---------- ---------- ---------- -------- ");
        assert_eq!(lines[2], "5                   sim      batch    physics          2  COMPLETED      0:0 ");
        let q = sacct_query(&args(&["-P", "-n", "-o", "jobid,state,elapsed,nodelist,exitcode"]), now).unwrap();
        assert_eq!(sacct_table(&q, &[done.clone()], now), "5|COMPLETED|00:01:00|node1|0:0\n");
        let q = sacct_query(&args(&["-p", "-b"]), now).unwrap();
        assert_eq!(sacct_table(&q, &[done], now), "JobID|State|ExitCode|\n5|COMPLETED|0:0|\n");
        assert!(sacct_query(&args(&["-o", "JobID,Bogus"]), now).unwrap_err().contains("Bogus"));
        assert!(sacct_query(&args(&["-o", "JobName%3"]), now).is_ok());
        let q = sacct_query(&args(&["-o", "JobName%3", "-n"]), now).unwrap();
        assert_eq!(sacct_table(&q, &[job(1, "longname", "a", "queued")], now), "lo+ \n");
    }

    #[test]
    fn gpu_jobs_show_their_gpus_in_alloc_tres_and_gpu_seconds_in_berth_acct() {
        let now = 2_000_000_000.0;
        let mut j = running(6, &["node1"], now - 100.0);
        assert_eq!(sacct_field(&j, "AllocTRES", now), "billing=2,cpu=2,node=1");
        j.allocation[0].gpus = vec![0, 3];
        assert_eq!(sacct_field(&j, "AllocTRES", now), "billing=2,cpu=2,gres/gpu=2,node=1");
        // The controller's billing: 2 CPUs at 1 and 2 GPUs at 24.
        j.billing = Some(50.0);
        assert_eq!(sacct_field(&j, "AllocTRES", now), "billing=50,cpu=2,gres/gpu=2,node=1");
        j.billing = Some(2.4);
        assert_eq!(sacct_field(&j, "AllocTRES", now), "billing=2,cpu=2,gres/gpu=2,node=1", "a whole number");
        j.billing = Some(f64::NAN);
        assert_eq!(sacct_field(&j, "AllocTRES", now), "billing=2,cpu=2,gres/gpu=2,node=1", "nonsense: the CPUs");
        // Generic resources (summed over nodes) and licenses, as Slurm spells them.
        let mut two = running(7, &["node1", "node2"], now - 100.0);
        for a in &mut two.allocation {
            a.gres.insert("nvme".into(), 500);
        }
        two.allocation[0].licenses.insert("matlab".into(), 2);
        let tres = sacct_field(&two, "AllocTRES", now);
        assert!(tres.contains(",gres/nvme=1000,license/matlab=2,node=2"), "{tres}");
        let table = crate::output::acct_table(std::slice::from_ref(&two));
        assert!(table.contains("HELD") && table.contains("gres/nvme=1000,license/matlab=2"), "{table}");
        assert!(!crate::output::acct_table(std::slice::from_ref(&j)).contains("HELD"), "none held, no column");
        let table = crate::output::acct_table(std::slice::from_ref(&j));
        assert!(!table.contains("GPU(s)"), "no accounting yet, no GPU column: {table}");
        j.accounting = Some(berth_protocol::client::Accounting {
            wall_seconds: 60.0,
            user_cpu_seconds: 1.0,
            system_cpu_seconds: 0.5,
            peak_memory_bytes: 1 << 20,
            gpu_seconds: 120.0,
        });
        let table = crate::output::acct_table(std::slice::from_ref(&j));
        let (head, row) = table.split_once('\n').unwrap();
        assert!(head.contains("PEAKMEM    GPU(s)  NODES"), "{head}");
        assert!(row.contains("120.00  node1"), "{row}");
    }

    #[test]
    fn sacct_selects_as_slurm() {
        let now = 2_000_000_000.0;
        let q = sacct_query(&[], now).unwrap();
        let mut old = job(1, "x", "ann", "completed");
        old.end_time = Some(midnight(now) - 10.0);
        assert!(!q.keeps(&old, "ann", now), "ended before today");
        assert!(q.keeps(&job(2, "x", "ann", "queued"), "ann", now));
        assert!(!q.keeps(&job(2, "x", "bob", "queued"), "ann", now), "others' jobs only with -a or -u");
        let q = sacct_query(&args(&["-a", "-S", "2000-01-01"]), now).unwrap();
        assert!(q.keeps(&old, "ann", now) && q.keeps(&job(2, "x", "bob", "queued"), "ann", now));
        let q = sacct_query(&args(&["-j", "1"]), now).unwrap();
        assert!(q.keeps(&old, "eve", now), "by id: any time, any user");
        let q = sacct_query(&args(&["-s", "CD", "-u", "ann"]), now).unwrap();
        assert!(!q.keeps(&job(2, "x", "ann", "queued"), "ann", now));
        assert_eq!(parse_time("now-2hours", now), Some(now - 7200.0));
        assert!(parse_time("2026-11-25T10:00", now).is_some());
        assert!(parse_time("10:00:00", now).is_some());
        assert!(parse_time("yesterday-ish", now).is_none());
        // Slurm's other forms: MMDD[YY], MM/DD[/YY], MM.DD[.YY], each with -HH:MM[:SS].
        let iso = parse_time("2026-03-04", now).unwrap();
        assert_eq!(parse_time("030426", now), Some(iso));
        assert_eq!(parse_time("03/04/26", now), Some(iso));
        assert_eq!(parse_time("03.04.2026", now), Some(iso));
        assert_eq!(parse_time("03/04/26-10:30", now), Some(iso + 10.5 * 3600.0));
        assert_eq!(parse_time("2026-03-04T10:30:15", now), Some(iso + 10.5 * 3600.0 + 15.0));
        assert!(parse_time("0304", now).is_some());
        assert_eq!(parse_time("0304", now), parse_time("03/04", now));
        assert!(parse_time("0304-25:00", now).is_none() && parse_time("13/01", now).is_none());
        assert!(parse_time("now-99999999999weeks", now).is_none(), "bounded");
        assert_eq!(parse_time("noon", now), Some(midnight(now) + 12.0 * 3600.0));
        assert_eq!(parse_time("tomorrow", now), Some(midnight(midnight(now) + 36.0 * 3600.0)));
        // -s without -S: from now, as sacct.
        let q = sacct_query(&args(&["-s", "CD"]), now).unwrap();
        assert_eq!(q.window(now), (now, None));
        assert_eq!(sacct_query(&[], now).unwrap().window(now), (midnight(now), None));
        assert!(parse_time("2026-13-01", now).is_none());
    }
}
