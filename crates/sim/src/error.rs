//! The simulator's errors: each says what is wrong and, where it can, what to do.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    /// A job line without the 18 fields of the Standard Workload Format.
    #[error("trace line {line}: a job line has 18 whitespace-separated fields, this one has {found}")]
    FieldCount { line: usize, found: usize },
    /// A field that is not a number, or not a valid value for that field.
    #[error("trace line {line}, field {field} ({name}): {problem}, found {value:?}")]
    BadField { line: usize, field: usize, name: &'static str, value: String, problem: &'static str },
    /// A header comment (`; MaxProcs: 256`) whose value is not a number.
    #[error("trace line {line}: header {key} should be a whole number, found {value:?}")]
    BadHeader { line: usize, key: &'static str, value: String },
    #[error("the trace has no job lines")]
    EmptyTrace,
    /// No way to size the machine.
    #[error("cannot size the machine: {0}")]
    NoMachine(String),
    #[error("bad topology {spec:?}: {problem} (use e.g. \"package:2 numa:2 core:8 pu:1\")")]
    BadTopology { spec: String, problem: String },
    #[error("{0}")]
    BadOption(String),
    #[error("{0}")]
    Unsupported(&'static str),
    /// The scheduler left work queued on an idle machine with nothing left to happen: a bug
    /// in the scheduler or the machine model, reported rather than looping forever.
    #[error("simulation stuck at t={time}: {queued} job(s) queued, none running and no submission left ({detail})")]
    Stuck { time: f64, queued: usize, detail: String },
}
