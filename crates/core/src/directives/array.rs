//! Job arrays: `--array SPEC` (Slurm's syntax: `0-15`, `1,3,5-7`, `0-15:4`, a running limit
//! `%N`), `#PBS -J X-Y[:Z][%N]`. An array is one submission made of tasks, each an ordinary
//! job of its own id that knows its array and index (`ArrayTask`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest index any spec may name, whatever the controller allows (Slurm's own bound on
/// `MaxArraySize` is 4,000,001): keeps the expansion of a spec bounded.
pub const MAX_INDEX: u32 = 4_000_000;

/// Slurm's default `MaxArraySize`: indexes 0 to 10,000.
pub const DEFAULT_MAX_ARRAY_SIZE: u32 = 10_001;

/// One range of indexes: `start` to `end` (inclusive) by `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayRange {
    pub start: u32,
    pub end: u32,
    pub step: u32,
}

/// An array as asked for: its ranges (in the order written) and its running limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    pub ranges: Vec<ArrayRange>,
    /// At most this many tasks run at once (`%N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// What a task knows of its array (set by the controller, never by a user).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array's id: the id of its first task (as Slurm's `ArrayJobId`).
    pub job: u64,
    pub index: u32,
    /// Tasks of the array, its smallest and largest index, and its step (1 unless the indexes
    /// are evenly spaced), as `SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP`.
    pub count: u32,
    pub min: u32,
    pub max: u32,
    pub step: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Why an array specification is refused: the messages quote the whole specification
/// (`whole`) and say what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error("array {whole:?}: {what} {text:?} is not a whole number")]
    NotANumber { whole: String, what: &'static str, text: String },
    #[error("array {whole:?}: {what} {text} is above {MAX_INDEX}")]
    AboveMax { whole: String, what: &'static str, text: String },
    #[error("--array needs indexes, such as 0-15, 1,3,5-7, 0-15:4 or 0-99%10")]
    NoIndexes,
    #[error("array {0:?}: more than 1000 ranges")]
    TooManyRanges(String),
    #[error("-J {0:?}: give a range X-Y[:Z], such as 1-10 or 1-10:2")]
    PbsNotARange(String),
    #[error("-J {0:?}: a PBS array needs at least two indexes (X < Y)")]
    PbsOneIndex(String),
    #[error("--array: give 1 to 1000 ranges")]
    RangeCount,
    #[error("--array: the running limit %N must be at least 1")]
    ZeroLimit,
    #[error("--array: {0} is not a range (start <= end, step >= 1)")]
    BadRange(ArrayRange),
    #[error(
        "--array {spec}: index {index} is above the largest allowed here, {} (an array has at most {max_size} indexes, 0 to {}: the controller's [scheduler] max_array_size, as Slurm's MaxArraySize)",
        max_size.saturating_sub(1),
        max_size.saturating_sub(1)
    )]
    AboveMaxSize { spec: String, index: u32, max_size: u32 },
    #[error("array {whole:?}: the running limit %{text} must be a whole number of at least 1")]
    BadLimit { whole: String, text: String },
    #[error("array {whole:?}: {part} ends before it starts")]
    Reversed { whole: String, part: String },
    #[error("array {whole:?}: a step (:{step}) needs a range, such as 0-15:4")]
    StepWithoutRange { whole: String, step: String },
    #[error("array {0:?}: the step must be at least 1")]
    ZeroStep(String),
}

fn number(s: &str, what: &'static str, whole: &str) -> Result<u32, ArrayError> {
    let s = s.trim();
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return Err(ArrayError::NotANumber { whole: whole.into(), what, text: s.into() });
    }
    match s.parse::<u32>() {
        Ok(n) if n <= MAX_INDEX => Ok(n),
        _ => Err(ArrayError::AboveMax { whole: whole.into(), what, text: s.into() }),
    }
}

impl ArraySpec {
    /// Slurm's `--array`: `N`, `N-M`, `N-M:S`, separated by commas, then `%L`.
    pub fn parse_slurm(text: &str) -> Result<ArraySpec, ArrayError> {
        let whole = text.trim();
        let (list, limit) = split_limit(whole)?;
        if list.is_empty() {
            return Err(ArrayError::NoIndexes);
        }
        let mut ranges = Vec::new();
        for part in list.split(',') {
            ranges.push(range(part, whole)?);
        }
        if ranges.len() > 1000 {
            return Err(ArrayError::TooManyRanges(whole.into()));
        }
        Ok(ArraySpec { ranges, limit })
    }

    /// PBS's `-J X-Y[:Z][%L]`: one range of at least two indexes.
    pub fn parse_pbs(text: &str) -> Result<ArraySpec, ArrayError> {
        let whole = text.trim();
        let (list, limit) = split_limit(whole)?;
        if !list.contains('-') || list.contains(',') {
            return Err(ArrayError::PbsNotARange(whole.into()));
        }
        let r = range(list, whole)?;
        if r.start == r.end {
            return Err(ArrayError::PbsOneIndex(whole.into()));
        }
        Ok(ArraySpec { ranges: vec![r], limit })
    }

    /// Its indexes, ascending, each once: refused (saying why) when one is not below
    /// `max_size` (Slurm's `MaxArraySize`) or the spec is malformed (a request not made by
    /// `berth`).
    pub fn indexes(&self, max_size: u32) -> Result<Vec<u32>, ArrayError> {
        if self.ranges.is_empty() || self.ranges.len() > 1000 {
            return Err(ArrayError::RangeCount);
        }
        if self.limit == Some(0) {
            return Err(ArrayError::ZeroLimit);
        }
        let mut seen = vec![false; max_size.min(MAX_INDEX + 1) as usize];
        for r in &self.ranges {
            if r.step == 0 || r.start > r.end {
                return Err(ArrayError::BadRange(*r));
            }
            if r.end >= max_size || r.end > MAX_INDEX {
                return Err(ArrayError::AboveMaxSize { spec: self.to_string(), index: r.end, max_size });
            }
            let mut i = r.start;
            loop {
                seen[i as usize] = true;
                match i.checked_add(r.step) {
                    Some(n) if n <= r.end => i = n,
                    _ => break,
                }
            }
        }
        Ok(seen.iter().enumerate().filter(|(_, s)| **s).map(|(i, _)| i as u32).collect())
    }
}

fn split_limit(whole: &str) -> Result<(&str, Option<u32>), ArrayError> {
    match whole.split_once('%') {
        None => Ok((whole, None)),
        Some((list, l)) => {
            let l = l.trim();
            match l.parse::<u32>() {
                Ok(n) if n > 0 && l.chars().all(|c| c.is_ascii_digit()) => Ok((list.trim(), Some(n))),
                _ => Err(ArrayError::BadLimit { whole: whole.into(), text: l.into() }),
            }
        }
    }
}

fn range(part: &str, whole: &str) -> Result<ArrayRange, ArrayError> {
    let part = part.trim();
    let (span, step) = match part.split_once(':') {
        Some((span, step)) => (span, Some(step)),
        None => (part, None),
    };
    let (start, end) = match span.split_once('-') {
        Some((a, b)) => (number(a, "index", whole)?, number(b, "index", whole)?),
        None => {
            let n = number(span, "index", whole)?;
            (n, n)
        }
    };
    if start > end {
        return Err(ArrayError::Reversed { whole: whole.into(), part: part.into() });
    }
    let step = match step {
        Some(s) => {
            if !span.contains('-') {
                return Err(ArrayError::StepWithoutRange { whole: whole.into(), step: s.into() });
            }
            let s = number(s, "step", whole)?;
            if s == 0 {
                return Err(ArrayError::ZeroStep(whole.into()));
            }
            s
        }
        None => 1,
    };
    Ok(ArrayRange { start, end, step })
}

impl fmt::Display for ArrayRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else if self.step == 1 {
            write!(f, "{}-{}", self.start, self.end)
        } else {
            write!(f, "{}-{}:{}", self.start, self.end, self.step)
        }
    }
}

impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        if let Some(l) = self.limit {
            write!(f, "%{l}")?;
        }
        Ok(())
    }
}

/// The tasks' `ArrayTask`s, given the array's id and its indexes (ascending).
pub fn tasks(job: u64, indexes: &[u32], limit: Option<u32>) -> Vec<ArrayTask> {
    let (min, max) = (indexes.first().copied().unwrap_or(0), indexes.last().copied().unwrap_or(0));
    let step = match indexes {
        [a, b, ..] if indexes.windows(2).all(|w| w[1] - w[0] == b - a) => b - a,
        _ => 1,
    };
    let count = indexes.len() as u32;
    indexes.iter().map(|&index| ArrayTask { job, index, count, min, max, step, limit }).collect()
}

/// Indexes in Slurm's folded form: `1-3,5,7-9` (ascending input).
pub fn fold(indexes: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indexes.len() {
        let mut j = i;
        while j + 1 < indexes.len() && indexes[j + 1] == indexes[j] + 1 {
            j += 1;
        }
        out.push(if i == j { indexes[i].to_string() } else { format!("{}-{}", indexes[i], indexes[j]) });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(s: &str) -> Vec<u32> {
        ArraySpec::parse_slurm(s).unwrap().indexes(DEFAULT_MAX_ARRAY_SIZE).unwrap()
    }

    #[test]
    fn slurm_syntax() {
        assert_eq!(idx("0-3"), vec![0, 1, 2, 3]);
        assert_eq!(idx("7"), vec![7]);
        assert_eq!(idx("1,3,5-7"), vec![1, 3, 5, 6, 7]);
        assert_eq!(idx("0-15:4"), vec![0, 4, 8, 12]);
        assert_eq!(idx("5-7,1-6:5,6"), vec![1, 5, 6, 7]);
        let s = ArraySpec::parse_slurm("0-99%10").unwrap();
        assert_eq!((s.limit, s.indexes(10_001).unwrap().len()), (Some(10), 100));
        assert_eq!(ArraySpec::parse_slurm(" 1-4 %2 ").unwrap().to_string(), "1-4%2");
        assert_eq!(ArraySpec::parse_slurm("1,3-9:2,4-5").unwrap().to_string(), "1,3-9:2,4-5");
    }

    #[test]
    fn slurm_errors() {
        for bad in [
            "",
            "%4",
            "a",
            "1-",
            "-3",
            "3-1",
            "1-4:0",
            "1-4:x",
            "3:2",
            "1,,2",
            "1-4%0",
            "1-4%",
            "1-4%x",
            "1-4%-2",
            "4000001",
            "0-4000001",
            "+1",
            "1.5",
        ] {
            assert!(ArraySpec::parse_slurm(bad).is_err(), "{bad:?} accepted");
        }
        let msg = ArraySpec::parse_slurm("3-1").unwrap_err();
        assert_eq!(msg, ArrayError::Reversed { whole: "3-1".into(), part: "3-1".into() });
        assert_eq!(msg.to_string(), "array \"3-1\": 3-1 ends before it starts");
        assert_eq!(
            ArraySpec::parse_slurm("1-4%x").unwrap_err().to_string(),
            "array \"1-4%x\": the running limit %x must be a whole number of at least 1"
        );
    }

    #[test]
    fn bounded_by_max_array_size() {
        let s = ArraySpec::parse_slurm("0-10000").unwrap();
        assert_eq!(s.indexes(10_001).unwrap().len(), 10_001);
        let e = ArraySpec::parse_slurm("1-10001").unwrap().indexes(10_001).unwrap_err().to_string();
        assert_eq!(
            e,
            "--array 1-10001: index 10001 is above the largest allowed here, 10000 (an array has at most 10001 \
             indexes, 0 to 10000: the controller's [scheduler] max_array_size, as Slurm's MaxArraySize)"
        );
        assert!(ArraySpec::parse_slurm("1-100000%50").unwrap().indexes(100_001).is_ok());
        // Malformed specs from a client other than berth.
        let bad = ArraySpec { ranges: vec![ArrayRange { start: 3, end: 1, step: 1 }], limit: None };
        assert!(bad.indexes(100).is_err());
        let bad = ArraySpec { ranges: vec![ArrayRange { start: 1, end: 3, step: 0 }], limit: None };
        assert!(bad.indexes(100).is_err());
        assert!(ArraySpec { ranges: vec![], limit: None }.indexes(100).is_err());
        let zero = ArraySpec { ranges: vec![ArrayRange { start: 1, end: 3, step: 1 }], limit: Some(0) };
        assert!(zero.indexes(100).is_err());
    }

    #[test]
    fn pbs_syntax() {
        let s = ArraySpec::parse_pbs("1-10:2").unwrap();
        assert_eq!(s.indexes(10_001).unwrap(), vec![1, 3, 5, 7, 9]);
        assert_eq!(ArraySpec::parse_pbs("0-3%2").unwrap().limit, Some(2));
        for bad in ["5", "1,2", "3-1", "1-1", "1-4:0", "", "x-y"] {
            assert!(ArraySpec::parse_pbs(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn task_facts() {
        let t = tasks(40, &[0, 4, 8], Some(2));
        assert_eq!(t[1], ArrayTask { job: 40, index: 4, count: 3, min: 0, max: 8, step: 4, limit: Some(2) });
        assert_eq!(tasks(1, &[1, 2, 5], None)[0].step, 1);
        assert_eq!(tasks(1, &[5], None)[0].step, 1);
        assert_eq!(fold(&[1, 2, 3, 5, 7, 8]), "1-3,5,7-8");
        assert_eq!(fold(&[]), "");
    }
}
