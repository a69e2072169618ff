//! Job dependencies (`--dependency`, Slurm's `-d`, PBS's `-W depend=`) and deferred starts
//! (`--begin`, Slurm's `-b`), as written; their meaning against other jobs' states and the
//! clock is the controller's (`crates/controller/src/depend.rs`). Pure: no clock here.

use crate::job::JobState;
use crate::JobId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most job ids one dependency may name (all its terms together).
pub const MAX_DEPENDENCY_IDS: usize = 64;

/// The latest begin time accepted, in seconds after the submission.
pub const MAX_BEGIN_AHEAD_SECS: u64 = 366 * 86_400;

/// What a dependency term waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepKind {
    /// The jobs have started (or were cancelled before they could).
    After,
    /// The jobs have ended, however.
    Afterany,
    /// The jobs have completed successfully (exit 0).
    Afterok,
    /// The jobs have ended unsuccessfully (failed, cancelled, timed out, node failure).
    Afternotok,
    /// No other job of the same name and user runs (one at a time, in submission order).
    Singleton,
    /// Of job arrays: task `i` of this array waits for task `i` of the named array to end
    /// successfully (Slurm's `aftercorr`). A job that is no array task, or whose index the
    /// named job has no task of, waits for the named job as a whole, as with `afterok`
    /// (Slurm's rule); the controller finds the corresponding task (`depend.rs`).
    Aftercorr,
}

impl DepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DepKind::After => "after",
            DepKind::Afterany => "afterany",
            DepKind::Afterok => "afterok",
            DepKind::Afternotok => "afternotok",
            DepKind::Singleton => "singleton",
            DepKind::Aftercorr => "aftercorr",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            DepKind::After,
            DepKind::Afterany,
            DepKind::Afterok,
            DepKind::Afternotok,
            DepKind::Singleton,
            DepKind::Aftercorr,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    /// Whether a job the term names, in `state` (`started`: it ever ran), lets the term
    /// pass (`Some(true)`), can never let it (`Some(false)`), or not yet (`None`).
    pub fn judge(self, state: JobState, started: bool) -> Option<bool> {
        match self {
            DepKind::After if started || state.has_allocation() || state.is_finished() => Some(true),
            DepKind::Afterany if state.is_finished() => Some(true),
            DepKind::Afterok | DepKind::Aftercorr if state.is_finished() => Some(state == JobState::Completed),
            DepKind::Afternotok if state.is_finished() => Some(state != JobState::Completed),
            _ => None,
        }
    }
}

/// One term: a kind and the jobs it names (none for `singleton`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepTerm {
    pub kind: DepKind,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobId>,
}

/// A job's dependency: every term must pass (Slurm's `,`), or any one (`?`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub terms: Vec<DepTerm>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub any: bool,
}

/// Why a dependency could not be read: malformed (`Bad`), or a kind berth does not have
/// (`Unsupported`, which `--ignore-unsupported` may turn into a warning in a directive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DepError {
    Bad(String),
    Unsupported(String),
}

impl fmt::Display for DepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DepError::Bad(m) | DepError::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DepError {}

impl Dependency {
    /// Slurm's syntax: `afterok:ID[:ID...]`, `afterany:`, `afternotok:`, `after:`,
    /// `aftercorr:` (arrays), `singleton`, terms separated by `,` (all) or `?` (any), not both.
    pub fn parse_slurm(s: &str) -> Result<Self, DepError> {
        Self::parse(s, false)
    }

    /// PBS's `depend=` value (after `depend=`): `afterok:ID[:ID...]` (also `afterany`,
    /// `afternotok`, `after`), terms separated by `,`; an id may be `N.server`.
    pub fn parse_pbs(s: &str) -> Result<Self, DepError> {
        Self::parse(s, true)
    }

    fn parse(s: &str, pbs: bool) -> Result<Self, DepError> {
        let bad = |m: String| DepError::Bad(m);
        let s = s.trim();
        if s.is_empty() {
            return Err(bad("a dependency needs a value such as afterok:12".into()));
        }
        if s.len() > 4096 {
            return Err(bad("the dependency is too long".into()));
        }
        let any = s.contains('?');
        if any && (s.contains(',') || pbs) {
            return Err(bad(format!("{s:?} mixes `,` (all of) and `?` (any of); use one of them, as Slurm requires")));
        }
        let mut terms: Vec<DepTerm> = Vec::new();
        let mut count = 0usize;
        for item in s.split(if any { '?' } else { ',' }) {
            let item = item.trim();
            let mut parts = item.split(':');
            let word = parts.next().unwrap_or("").to_ascii_lowercase();
            // `aftercorr` is Slurm's alone: PBS has no such kind.
            let Some(kind) = DepKind::parse(&word).filter(|k| !(pbs && *k == DepKind::Aftercorr)) else {
                let known = if pbs {
                    "after, afterany, afterok, afternotok"
                } else {
                    "after, afterany, afterok, afternotok, aftercorr, singleton"
                };
                return Err(match word.as_str() {
                    "" => bad(format!("{s:?} has an empty dependency term")),
                    "afterburstbuffer" | "expand" | "before" | "beforeok" | "beforenotok" | "beforeany" | "on" => {
                        DepError::Unsupported(format!("dependency {item}: {word} is not supported (berth has {known})"))
                    }
                    _ => bad(format!("dependency {item:?}: unknown kind {word:?}; use one of {known}")),
                });
            };
            if kind == DepKind::Singleton {
                if pbs || parts.next().is_some() {
                    return Err(bad(format!("dependency {item:?}: singleton takes no job ids")));
                }
                terms.push(DepTerm { kind, jobs: vec![] });
                continue;
            }
            let mut jobs = Vec::new();
            for id in parts {
                count += 1;
                if count > MAX_DEPENDENCY_IDS {
                    return Err(bad(format!(
                        "a dependency may name at most {MAX_DEPENDENCY_IDS} jobs; wait for fewer, or chain them"
                    )));
                }
                jobs.push(parse_id(id, pbs, item)?);
            }
            if jobs.is_empty() {
                return Err(bad(format!("dependency {item:?} names no job; write {word}:ID[:ID...]")));
            }
            terms.push(DepTerm { kind, jobs });
        }
        Ok(Dependency { terms, any })
    }

    /// Every job id it names.
    pub fn job_ids(&self) -> impl Iterator<Item = JobId> + '_ {
        self.terms.iter().flat_map(|t| t.jobs.iter().copied())
    }

    pub fn has_singleton(&self) -> bool {
        self.terms.iter().any(|t| t.kind == DepKind::Singleton)
    }
}

fn parse_id(id: &str, pbs: bool, item: &str) -> Result<JobId, DepError> {
    let id = id.trim();
    // PBS ids are `N.server` (the server is this one: berth has one controller).
    let number = if pbs { id.split('.').next().unwrap_or("") } else { id };
    if !pbs && id.contains('+') {
        return Err(DepError::Unsupported(format!(
            "dependency {item}: a delay after a job's start (ID+minutes) is not supported"
        )));
    }
    if id.contains('_') {
        return Err(DepError::Unsupported(format!(
            "dependency {item}: a task of an array (ID_N) cannot be named; name the array (ID: all its tasks) or use aftercorr:ID"
        )));
    }
    match number.parse::<u64>() {
        Ok(n) if n > 0 && !number.starts_with('+') => Ok(JobId(n)),
        _ => Err(DepError::Bad(format!("dependency {item:?}: {id:?} is not a job id"))),
    }
}

/// Slurm's syntax, which `parse_slurm` reads back.
impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(if self.any { "?" } else { "," })?;
            }
            f.write_str(t.kind.as_str())?;
            for j in &t.jobs {
                write!(f, ":{j}")?;
            }
        }
        Ok(())
    }
}

/// When a job may start at the earliest, as written (`--begin`); the controller resolves it
/// against its clock and local time zone to `At` when the job is submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Begin {
    /// This many seconds after the submission (`now+1hour`, `now+60`).
    In(u64),
    /// The next time the local clock shows this (today, or tomorrow if it has passed):
    /// `HH:MM[:SS]`, `midnight`, `noon`, `teatime`, ...
    Clock { hour: u8, minute: u8, second: u8 },
    /// A local date and time (`YYYY-MM-DD[THH:MM[:SS]]`).
    Date { year: u16, month: u8, day: u8, hour: u8, minute: u8, second: u8 },
    /// Tomorrow at 00:00 local time.
    Tomorrow,
    /// Resolved: a Unix time (seconds).
    At(u64),
}

/// Why a `--begin` value is refused; the message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BeginError {
    #[error(
        "--begin {0:?} is not a time: give now+N[seconds|minutes|hours|days|weeks], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], midnight, noon, teatime, today or tomorrow"
    )]
    NotATime(String),
    #[error("--begin {0}: at most a year ahead")]
    TooFarAhead(String),
}

impl Begin {
    /// Slurm's `--begin` forms: `now[+N[seconds|minutes|hours|days|weeks]]` (a bare count
    /// is seconds), `HH:MM[:SS]`, `YYYY-MM-DD[THH:MM[:SS]]`, `midnight`, `noon`, `elevenses`,
    /// `fika`, `teatime`, `today`, `tomorrow`.
    pub fn parse(s: &str) -> Result<Begin, BeginError> {
        let s = s.trim();
        let lower = s.to_ascii_lowercase();
        let bad = || BeginError::NotATime(s.to_string());
        let clock = |hour, minute| Ok(Begin::Clock { hour, minute, second: 0 });
        match lower.as_str() {
            "now" | "today" => return Ok(Begin::In(0)),
            "midnight" => return clock(0, 0),
            "elevenses" => return clock(11, 0),
            "noon" => return clock(12, 0),
            "fika" => return clock(15, 0),
            "teatime" => return clock(16, 0),
            "tomorrow" => return Ok(Begin::Tomorrow),
            _ => {}
        }
        if let Some(rest) = lower.strip_prefix("now+") {
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            let (count, unit) = rest.split_at(digits);
            let count: u64 = count.parse().map_err(|_| bad())?;
            let unit_secs = match unit.trim() {
                "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
                "m" | "min" | "mins" | "minute" | "minutes" => 60,
                "h" | "hour" | "hours" => 3600,
                "d" | "day" | "days" => 86_400,
                "w" | "week" | "weeks" => 7 * 86_400,
                _ => return Err(bad()),
            };
            let secs = count
                .checked_mul(unit_secs)
                .filter(|s| *s <= MAX_BEGIN_AHEAD_SECS)
                .ok_or_else(|| BeginError::TooFarAhead(s.to_string()))?;
            return Ok(Begin::In(secs));
        }
        let hms = |t: &str| -> Option<(u8, u8, u8)> {
            let f: Vec<u8> =
                t.split(':').map(|x| (x.len() <= 2).then(|| x.parse().ok()).flatten()).collect::<Option<_>>()?;
            let (h, m, sec) = match f.as_slice() {
                [h, m] => (*h, *m, 0),
                [h, m, sec] => (*h, *m, *sec),
                _ => return None,
            };
            (h < 24 && m < 60 && sec < 60).then_some((h, m, sec))
        };
        if !s.contains('-') {
            let (hour, minute, second) = hms(s).ok_or_else(bad)?;
            return Ok(Begin::Clock { hour, minute, second });
        }
        let (date, time) = match s.split_once(['T', 't']) {
            Some((d, t)) => (d, Some(t)),
            None => (s, None),
        };
        let d: Vec<&str> = date.split('-').collect();
        let [y, mo, day] = d.as_slice() else { return Err(bad()) };
        let (year, month, day) = (
            y.parse::<u16>().ok().filter(|n| (1970..=9999).contains(n) && y.len() == 4),
            mo.parse::<u8>().ok().filter(|m| (1..=12).contains(m) && mo.len() <= 2),
            day.parse::<u8>().ok().filter(|d| (1..=31).contains(d) && day.len() <= 2),
        );
        let (Some(year), Some(month), Some(day)) = (year, month, day) else { return Err(bad()) };
        let (hour, minute, second) = match time {
            Some(t) => hms(t).ok_or_else(bad)?,
            None => (0, 0, 0),
        };
        Ok(Begin::Date { year, month, day, hour, minute, second })
    }
}

/// The form `Begin::parse` reads back (`At`: `@UNIX`, not readable: only the controller makes it).
impl fmt::Display for Begin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begin::In(s) => write!(f, "now+{s}"),
            Begin::Clock { hour, minute, second } => write!(f, "{hour:02}:{minute:02}:{second:02}"),
            Begin::Date { year, month, day, hour, minute, second } => {
                write!(f, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}")
            }
            Begin::Tomorrow => f.write_str("tomorrow"),
            Begin::At(t) => write!(f, "@{t}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slurm(s: &str) -> Dependency {
        Dependency::parse_slurm(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn slurm_dependencies() {
        let d = slurm("afterok:12:13,afterany:14");
        assert!(!d.any);
        assert_eq!(d.terms[0], DepTerm { kind: DepKind::Afterok, jobs: vec![JobId(12), JobId(13)] });
        assert_eq!(d.terms[1], DepTerm { kind: DepKind::Afterany, jobs: vec![JobId(14)] });
        assert_eq!(d.to_string(), "afterok:12:13,afterany:14");
        let d = slurm("afternotok:5?after:6");
        assert!(d.any);
        assert_eq!(d.to_string(), "afternotok:5?after:6");
        let d = slurm("singleton");
        assert!(d.has_singleton() && d.job_ids().next().is_none());
        assert_eq!(slurm(" AfterOK:7 ").to_string(), "afterok:7");
        assert_eq!(slurm("singleton,afterok:3").job_ids().collect::<Vec<_>>(), vec![JobId(3)]);
        for s in ["afterok:1", "afterany:1:2?singleton", "after:9,afternotok:10:11"] {
            assert_eq!(slurm(s).to_string(), s, "reads back");
        }
    }

    #[test]
    fn slurm_dependency_errors() {
        let bad = |s: &str| match Dependency::parse_slurm(s) {
            Err(DepError::Bad(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        let unsupported = |s: &str| match Dependency::parse_slurm(s) {
            Err(DepError::Unsupported(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        assert!(bad("").contains("needs a value"));
        assert!(bad("afterok").contains("names no job"));
        assert!(bad("afterok:").contains("is not a job id"));
        assert!(bad("afterok:x").contains("is not a job id"));
        assert!(bad("afterok:0").contains("is not a job id"));
        assert!(bad("afterok:-1").contains("is not a job id"));
        assert!(bad("afterok:1.srv").contains("is not a job id"), "Slurm ids have no server");
        assert!(bad("afterok:1,afterany:2?after:3").contains("mixes"));
        assert!(bad("waitfor:1").contains("unknown kind"));
        assert!(bad("afterok:1,,afterok:2").contains("empty"));
        assert!(bad("singleton:4").contains("takes no job ids"));
        assert_eq!(slurm("aftercorr:4").terms[0], DepTerm { kind: DepKind::Aftercorr, jobs: vec![JobId(4)] });
        assert_eq!(slurm("aftercorr:4,afterok:5").to_string(), "aftercorr:4,afterok:5", "reads back");
        assert!(unsupported("after:4+10").contains("delay"));
        assert!(unsupported("afterok:4_1").contains("array"));
        assert!(unsupported("expand:4").contains("not supported"));
        let many = format!("afterok:{}", (1..=65).map(|i| i.to_string()).collect::<Vec<_>>().join(":"));
        assert!(bad(&many).contains("at most 64"));
        let enough = format!("afterok:{}", (1..=64).map(|i| i.to_string()).collect::<Vec<_>>().join(":"));
        assert_eq!(slurm(&enough).job_ids().count(), 64);
    }

    #[test]
    fn pbs_dependencies() {
        let d = Dependency::parse_pbs("afterok:12.server1:13,afternotok:14").unwrap();
        assert_eq!(d.to_string(), "afterok:12:13,afternotok:14");
        assert!(matches!(Dependency::parse_pbs("beforeok:3"), Err(DepError::Unsupported(_))));
        assert!(matches!(Dependency::parse_pbs("on:3"), Err(DepError::Unsupported(_))));
        assert!(matches!(Dependency::parse_pbs("afterok:x.srv"), Err(DepError::Bad(_))));
        assert!(matches!(Dependency::parse_pbs("afterok:1?afterok:2"), Err(DepError::Bad(_))));
        assert!(matches!(Dependency::parse_pbs("singleton"), Err(DepError::Bad(_))));
        assert!(matches!(Dependency::parse_pbs("aftercorr:3"), Err(DepError::Bad(_))), "Slurm's alone");
    }

    #[test]
    fn judged_by_state() {
        use JobState::*;
        assert_eq!(DepKind::Afterok.judge(Completed, true), Some(true));
        assert_eq!(DepKind::Afterok.judge(Failed, true), Some(false));
        assert_eq!(DepKind::Afterok.judge(Cancelled, false), Some(false));
        assert_eq!(DepKind::Afterok.judge(Running, true), None);
        assert_eq!(DepKind::Aftercorr.judge(Completed, true), Some(true));
        assert_eq!(DepKind::Aftercorr.judge(Failed, true), Some(false), "never, once it failed");
        assert_eq!(DepKind::Aftercorr.judge(Queued, false), None);
        assert_eq!(DepKind::Afternotok.judge(Timeout, true), Some(true));
        assert_eq!(DepKind::Afternotok.judge(Completed, true), Some(false));
        assert_eq!(DepKind::Afternotok.judge(Queued, false), None);
        assert_eq!(DepKind::Afterany.judge(NodeFail, true), Some(true));
        assert_eq!(DepKind::Afterany.judge(Suspended, true), None);
        assert_eq!(DepKind::After.judge(Running, true), Some(true));
        assert_eq!(DepKind::After.judge(Queued, true), Some(true), "requeued after it started");
        assert_eq!(DepKind::After.judge(Held, false), None);
        assert_eq!(DepKind::After.judge(Cancelled, false), Some(true), "Slurm: started or cancelled");
    }

    #[test]
    fn begin_forms() {
        let p = |s: &str| Begin::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(p("now+60"), Begin::In(60), "a bare count is seconds");
        assert_eq!(p("now+2"), Begin::In(2));
        assert_eq!(p("now+1hour"), Begin::In(3600));
        assert_eq!(p("now+10minutes"), Begin::In(600));
        assert_eq!(p("now+3days"), Begin::In(3 * 86_400));
        assert_eq!(p("now+1week"), Begin::In(7 * 86_400));
        assert_eq!(p("NOW+5s"), Begin::In(5));
        assert_eq!(p("now"), Begin::In(0));
        assert_eq!(p("16:00"), Begin::Clock { hour: 16, minute: 0, second: 0 });
        assert_eq!(p("teatime"), p("16:00"));
        assert_eq!(p("noon"), p("12:00:00"));
        assert_eq!(p("midnight"), p("00:00"));
        assert_eq!(p("tomorrow"), Begin::Tomorrow);
        assert_eq!(p("23:59:58"), Begin::Clock { hour: 23, minute: 59, second: 58 });
        assert_eq!(p("2027-01-31"), Begin::Date { year: 2027, month: 1, day: 31, hour: 0, minute: 0, second: 0 });
        assert_eq!(
            p("2027-01-31T08:30"),
            Begin::Date { year: 2027, month: 1, day: 31, hour: 8, minute: 30, second: 0 }
        );
        for s in ["now+7", "08:30:05", "2027-02-03T04:05:06", "tomorrow"] {
            assert_eq!(p(s).to_string(), s, "reads back");
        }
        for bad in [
            "",
            "later",
            "now+",
            "now+5parsecs",
            "now-5",
            "24:00",
            "12:60",
            "12",
            "1:2:3:4",
            "2027-13-01",
            "2027-1",
            "27-01-01",
            "2027-01-01T25:00",
            "now+2years",
            "now+99999999999999999999",
        ] {
            assert!(Begin::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Begin::parse("now+400days").unwrap_err().to_string(), "--begin now+400days: at most a year ahead");
        assert_eq!(Begin::parse(" 25:00 ").unwrap_err(), BeginError::NotATime("25:00".into()));
        assert_eq!(p("now+366days"), Begin::In(MAX_BEGIN_AHEAD_SECS));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,80}") {
            let _ = Dependency::parse_slurm(&s);
            let _ = Dependency::parse_pbs(&s);
            let _ = Begin::parse(&s);
        }
    }
}
