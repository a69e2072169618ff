//! Standard Workload Format (the Parallel Workloads Archive's trace format) reader.
//!
//! One job per line, 18 whitespace-separated fields: 1 job id, 2 submit time, 3 wait, 4 run
//! time, 5 allocated processors, 6 average CPU time, 7 used memory, 8 requested processors,
//! 9 requested time, 10 requested memory, 11 status, 12 user, 13 group, 14 executable,
//! 15 queue, 16 partition, 17 preceding job, 18 think time. `-1` means unknown. Lines starting
//! with `;` are comments; some carry header fields (`; MaxProcs: 256`). Times are seconds and
//! may be fractional. Only the fields the simulator uses are checked; the others only count.

use crate::error::SimError;

/// Fields of a job line.
pub const FIELDS: usize = 18;

/// One job of a trace, as written (`None` where the trace says `-1`).
#[derive(Debug, Clone, PartialEq)]
pub struct SwfJob {
    /// Line number in the trace (1-based), for messages.
    pub line: usize,
    /// Field 1.
    pub id: u64,
    /// Field 2, seconds.
    pub submit: f64,
    /// Field 4, seconds.
    pub run_time: Option<f64>,
    /// Field 5.
    pub allocated_procs: Option<u64>,
    /// Field 8.
    pub requested_procs: Option<u64>,
    /// Field 9, seconds.
    pub requested_time: Option<f64>,
    /// Field 12.
    pub user: Option<u64>,
    /// Field 13.
    pub group: Option<u64>,
    /// Field 15.
    pub queue: Option<u64>,
}

impl SwfJob {
    /// Processors the job needs: requested (field 8) if known and positive, else allocated (5).
    pub fn procs(&self) -> Option<u64> {
        self.requested_procs.filter(|&p| p > 0).or(self.allocated_procs.filter(|&p| p > 0))
    }

    /// The account fair share charges: the group (field 13), else the user (field 12).
    pub fn account(&self) -> String {
        match (self.group, self.user) {
            (Some(g), _) => format!("group{g}"),
            (None, Some(u)) => format!("user{u}"),
            (None, None) => "unknown".into(),
        }
    }
}

/// A whole trace: header fields and jobs in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    pub max_procs: Option<u64>,
    pub max_nodes: Option<u64>,
    pub unix_start_time: Option<i64>,
    pub jobs: Vec<SwfJob>,
}

/// Parse a whole trace. Blank lines are skipped; any malformed line is an error naming it.
pub fn parse(text: &str) -> Result<Trace, SimError> {
    let mut trace = Trace::default();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.trim();
        if content.is_empty() {
            continue;
        }
        if let Some(comment) = content.strip_prefix(';') {
            parse_header(comment, line, &mut trace)?;
            continue;
        }
        trace.jobs.push(parse_job(content, line)?);
    }
    if trace.jobs.is_empty() {
        return Err(SimError::EmptyTrace);
    }
    Ok(trace)
}

/// `; Key: value` lines the simulator uses; other comments are ignored.
fn parse_header(comment: &str, line: usize, trace: &mut Trace) -> Result<(), SimError> {
    let Some((key, value)) = comment.split_once(':') else { return Ok(()) };
    let value = value.trim();
    let bad = |key: &'static str| SimError::BadHeader { line, key, value: value.to_string() };
    // Non-positive sizes are treated as absent: some archives write `-1` for unknown.
    match key.trim() {
        "MaxProcs" => trace.max_procs = Some(value.parse::<i64>().map_err(|_| bad("MaxProcs"))?).and_then(positive),
        "MaxNodes" => trace.max_nodes = Some(value.parse::<i64>().map_err(|_| bad("MaxNodes"))?).and_then(positive),
        "UnixStartTime" => trace.unix_start_time = Some(value.parse::<i64>().map_err(|_| bad("UnixStartTime"))?),
        _ => {}
    }
    Ok(())
}

fn positive(v: i64) -> Option<u64> {
    u64::try_from(v).ok().filter(|&v| v > 0)
}

fn parse_job(content: &str, line: usize) -> Result<SwfJob, SimError> {
    let fields: Vec<&str> = content.split_whitespace().collect();
    if fields.len() != FIELDS {
        return Err(SimError::FieldCount { line, found: fields.len() });
    }
    let field = |number: usize, name: &'static str| Field { line, number, name, text: fields[number - 1] };
    let id = field(1, "job id").whole()?.ok_or_else(|| field(1, "job id").error("the job id is missing"))?;
    let submit = field(2, "submit time").time()?.ok_or_else(|| field(2, "submit time").error("missing"))?;
    Ok(SwfJob {
        line,
        id,
        submit,
        run_time: field(4, "run time").time()?,
        allocated_procs: field(5, "allocated processors").whole()?,
        requested_procs: field(8, "requested processors").whole()?,
        requested_time: field(9, "requested time").time()?,
        user: field(12, "user id").whole()?,
        group: field(13, "group id").whole()?,
        queue: field(15, "queue number").whole()?,
    })
}

/// One field of a job line, with what an error about it needs.
struct Field<'a> {
    line: usize,
    number: usize,
    name: &'static str,
    text: &'a str,
}

impl Field<'_> {
    fn error(&self, problem: &'static str) -> SimError {
        SimError::BadField { line: self.line, field: self.number, name: self.name, value: self.text.into(), problem }
    }

    /// A non-negative number, `None` for `-1`.
    fn number(&self) -> Result<Option<f64>, SimError> {
        let v: f64 = self.text.parse().map_err(|_| self.error("not a number"))?;
        if !v.is_finite() {
            return Err(self.error("not a finite number"));
        }
        if v == -1.0 {
            return Ok(None);
        }
        if v < 0.0 {
            return Err(self.error("negative (only -1, meaning unknown, is allowed)"));
        }
        Ok(Some(v))
    }

    fn time(&self) -> Result<Option<f64>, SimError> {
        self.number()
    }

    fn whole(&self) -> Result<Option<u64>, SimError> {
        match self.number()? {
            None => Ok(None),
            Some(v) if v.fract() != 0.0 => Err(self.error("not a whole number")),
            Some(v) if v > u64::MAX as f64 => Err(self.error("too large")),
            Some(v) => Ok(Some(v as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "1 5094 -1 12072 16 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1";

    #[test]
    fn reads_header_and_jobs() {
        let text = format!("; Version: 2\n; MaxNodes: 256\n; MaxProcs: 512\n; UnixStartTime: 100\n\n{LINE}\n");
        let t = parse(&text).unwrap();
        assert_eq!((t.max_nodes, t.max_procs, t.unix_start_time), (Some(256), Some(512), Some(100)));
        let j = &t.jobs[0];
        assert_eq!((j.line, j.id, j.submit, j.run_time), (6, 1, 5094.0, Some(12072.0)));
        assert_eq!((j.allocated_procs, j.requested_procs, j.requested_time), (Some(16), None, None));
        assert_eq!((j.user, j.group, j.queue), (None, None, Some(0)));
        assert_eq!(j.procs(), Some(16));
        assert_eq!(j.account(), "unknown");
    }

    #[test]
    fn requested_procs_win_and_fractions_are_kept() {
        let t = parse("7 2.5 0 88.51 4 -1 -1 2 149.0 -1 1 3 9 -1 -1 -1 -1 -1").unwrap();
        let j = &t.jobs[0];
        assert_eq!((j.submit, j.run_time, j.requested_time), (2.5, Some(88.51), Some(149.0)));
        assert_eq!(j.procs(), Some(2));
        assert_eq!(j.account(), "group9");
        let t = parse("7 2.5 0 88.51 4 -1 -1 0 149.0 -1 1 3 -1 -1 -1 -1 -1 -1").unwrap();
        assert_eq!(t.jobs[0].procs(), Some(4), "0 requested falls back to allocated");
        assert_eq!(t.jobs[0].account(), "user3");
    }

    #[test]
    fn malformed_lines_name_line_and_field() {
        let e = parse(&format!("{LINE}\n1 2 3\n")).unwrap_err();
        assert_eq!(e, SimError::FieldCount { line: 2, found: 3 });
        assert!(e.to_string().contains("line 2"), "{e}");

        let e = parse("; c\n1 x -1 5 1 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SimError::BadField { line: 2, field: 2, .. }), "{e:?}");
        assert_eq!(e.to_string(), "trace line 2, field 2 (submit time): not a number, found \"x\"");

        let e = parse("1 0 -1 5 2.5 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SimError::BadField { field: 5, problem: "not a whole number", .. }), "{e:?}");

        let e = parse("1 0 -1 -7 2 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SimError::BadField { field: 4, .. }), "{e:?}");

        let e = parse("1 -1 -1 7 2 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SimError::BadField { field: 2, problem: "missing", .. }), "{e:?}");

        let e = parse("1 0 -1 inf 2 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SimError::BadField { field: 4, .. }), "{e:?}");
    }

    #[test]
    fn bad_header_and_empty_trace() {
        let e = parse(&format!("; MaxProcs: lots\n{LINE}")).unwrap_err();
        assert_eq!(e, SimError::BadHeader { line: 1, key: "MaxProcs", value: "lots".into() });
        assert_eq!(parse("; only comments\n\n").unwrap_err(), SimError::EmptyTrace);
        let t = parse(&format!("; MaxProcs: -1\n; Note: free text: here\n{LINE}")).unwrap();
        assert_eq!(t.max_procs, None);
    }
}
