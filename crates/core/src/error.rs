use thiserror::Error;

/// Errors of the pure core: parsing user input and validating requests.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    #[error("bad cpu list {input:?}: {reason} (expected kernel format like 0-3,8,10-11)")]
    BadCpuList { input: String, reason: String },
    #[error("bad size {input:?}: expected a number with an optional unit K, M, G or T (e.g. 512M, 4G)")]
    BadSize { input: String },
    #[error("bad duration {input:?}: expected SECONDS, MM:SS, HH:MM:SS, D-HH:MM:SS or a number with s/m/h/d (e.g. 90s, 10m, 2h)")]
    BadDuration { input: String },
    #[error("line {line}: {message}")]
    Directive { line: usize, message: String },
    #[error("bad topology: {0}")]
    BadTopology(String),
    #[error("invalid request: {0}")]
    BadRequest(String),
}
