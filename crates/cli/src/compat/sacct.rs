//! Slurm's `sacct`: jobs (running and finished) with their accounting, in sacct's columns,
//! `-P`/`-p` parsable, `-o FIELD[%WIDTH],...`. berth records no job steps as sacct's
//! `N.batch` lines: each job is one line, as with `sacct -X`.

use super::format::{self as f, both, long, Arg, Opt};
use super::slurm::own_user_name;
use crate::client::request;
use anyhow::{bail, Result};
use berth_core::job::JobState;
use berth_protocol::client::{ClientRequest, ClientResponse, JobInfo};
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
                Some(w.parse::<usize>().ok().filter(|w| *w <= 4096).ok_or_else(|| format!("bad width in {item:?}"))?),
            ),
            None => (item, None),
        };
        let &(canon, default, left) = FIELDS
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("Invalid field requested: \"{name}\"; `sacct -e` lists the fields berth fills"))?;
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

/// sacct's time forms: `YYYY-MM-DD[THH:MM[:SS]]`, `HH:MM[:SS]` (today), `now[-N{seconds,
/// minutes,hours,days,weeks}]`, `today`, `midnight`.
pub fn parse_time(s: &str, now: f64) -> Option<f64> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    if lower == "now" {
        return Some(now);
    }
    if lower == "today" || lower == "midnight" {
        return Some(midnight(now));
    }
    if let Some(rest) = lower.strip_prefix("now-").or_else(|| lower.strip_prefix("now+")) {
        let sign = if lower.starts_with("now-") { -1.0 } else { 1.0 };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let n: f64 = digits.parse().ok()?;
        let unit = match &rest[digits.len()..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 7.0 * 86_400.0,
            _ => return None,
        };
        return Some(now + sign * n * unit);
    }
    let num = |v: &str| v.parse::<i32>().ok();
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (Some(d), Some(t)),
        None if s.contains('-') => (Some(s), None),
        None => (None, Some(s)),
    };
    // SAFETY: as in `midnight`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let secs = now as libc::time_t;
    unsafe { libc::localtime_r(&secs, &mut tm) };
    (tm.tm_hour, tm.tm_min, tm.tm_sec) = (0, 0, 0);
    if let Some(d) = date {
        let p: Vec<&str> = d.split('-').collect();
        let [y, m, day] = p.as_slice() else { return None };
        (tm.tm_year, tm.tm_mon, tm.tm_mday) = (num(y)? - 1900, num(m)? - 1, num(day)?);
    }
    if let Some(t) = time {
        let p: Vec<i32> = t.split(':').map(num).collect::<Option<_>>()?;
        match p.as_slice() {
            [h, m] => (tm.tm_hour, tm.tm_min) = (*h, *m),
            [h, m, sec] => (tm.tm_hour, tm.tm_min, tm.tm_sec) = (*h, *m, *sec),
            _ => return None,
        }
    }
    if !(0..12).contains(&tm.tm_mon) || !(1..=31).contains(&tm.tm_mday) || !(0..24).contains(&tm.tm_hour) {
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
        users: p.list("--user"),
        ids,
        names: p.list("--name"),
        partitions: p.list("--partition"),
        accounts: p.list("--accounts"),
        states,
        start: time("--starttime")?,
        end: time("--endtime")?,
        info,
    })
}

impl SacctQuery {
    /// Whether job `j` is listed: the filters, and (without ids) in the time window, by
    /// default since midnight.
    pub fn keeps(&self, j: &JobInfo, me: &str, now: f64) -> bool {
        if !self.ids.is_empty() {
            if !self.ids.contains(&j.id) {
                return false;
            }
        } else {
            let from = self.start.unwrap_or_else(|| midnight(now));
            let to = self.end.unwrap_or(f64::INFINITY);
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
    }
    out
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
    let mut jobs = if q.ids.is_empty() {
        let ClientResponse::Jobs { jobs } = request(dir, ClientRequest::ListJobs { states: vec![], all: true }).await?
        else {
            bail!("unexpected answer")
        };
        jobs
    } else {
        // An unknown id lists nothing, as in sacct.
        super::jobs_by_id(dir, &q.ids).await?
    };
    let me = own_user_name();
    jobs.retain(|j| q.keeps(j, &me, now));
    print!("{}", crate::output::terminal_safe(&sacct_table(&q, &jobs, now)));
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
        assert!(parse_time("2026-13-01", now).is_none());
    }
}
