//! The one table of berth's stable error codes (docs/errors.md).
//!
//! Every error a person or a script sees carries one of these codes: the controller's socket
//! replies (`{"result": "error", "code", "message"}`, `ApiError`), the HTTP API's bodies
//! (`{"error": {"code", "message", "reason"?}}`, `ReservationError`) and the agents' refusals
//! (`Refusal`, recorded as events of the same name), and the CLI's own failures (`client` in
//! `berth --json`'s error output). A code's spelling never changes: scripts
//! and peers match on it. Add a code at the end of `ALL`, with its HTTP status and meaning, and
//! run `cargo test -p berth-protocol --lib error` to regenerate the table in docs/errors.md.
//!
//! Also here, below every message module so that none of them imports another to name an
//! error: what an agent refuses (`Refusal`) and why a signed message is not accepted
//! (`AuthError`, carried by `frame::ProtocolError::Auth`).

use serde::{Deserialize, Serialize};

/// A stable error code: its wire spelling (`as_str`, also its JSON), its HTTP status
/// (`status`) and what it means (`meaning`).
///
/// A peer older than a code reads a reply carrying it as a malformed frame: a new code is
/// only sent in answer to requests that peer cannot have made (a new request), or in the
/// HTTP API, whose clients read codes as strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed request, an unknown field, a bad value.
    BadRequest,
    /// The job script or its directives cannot be read.
    InvalidScript,
    /// The request can never fit the cluster (the reason says why).
    Infeasible,
    /// No such job (on the HTTP API: the holder job named does not exist).
    UnknownJob,
    /// No such node.
    UnknownNode,
    /// Not yours, or not an admin.
    NotPermitted,
    /// The job or reservation is not in a state that allows this (e.g. already ended).
    InvalidState,
    /// The controller is stopping, or cannot write its state database for a while.
    Unavailable,
    /// A fault inside berth; the message says what failed.
    Internal,
    /// The job breaks a limit of its queue (walltime, cores, properties) or the queue is closed.
    QueueLimit,
    /// No advance reservation or API reservation of that name or id.
    UnknownReservation,
    /// The controller cannot record the request: the filesystem of its state database is
    /// full. The message names the path; retry once space is freed there.
    NoSpace,
    /// HTTP over TCP without a valid bearer token.
    Unauthorized,
    /// HTTP: no such path.
    NotFound,
    /// HTTP: the path exists, the method does not.
    MethodNotAllowed,
    /// Busy now; try again later (the reason says what is missing).
    TryAgain,
    /// HTTP: the request body is larger than the limit.
    PayloadTooLarge,
    /// The named user does not exist on the controller's host.
    UnknownUser,
    /// The holder process does not exist on the controller's host.
    UnknownProcess,
    /// An agent refused a request not proven to come from a holder of the cluster key
    /// (forged, replayed or expired): `Refusal::Auth`.
    AuthRefused,
    /// An agent refused a signed request that is not acceptable there (wrong node, job not
    /// there, CPUs outside the job's allocation): `Refusal::Launch`.
    LaunchRefused,
    /// The CLI's own failure, without an answer from the controller (cannot connect, a bad
    /// flag, a file it cannot read): the code of `berth --json`'s error output only.
    Client,
}

impl ErrorCode {
    /// Every code, in the order of the table in docs/errors.md.
    pub const ALL: [ErrorCode; 22] = [
        Self::BadRequest,
        Self::InvalidScript,
        Self::Infeasible,
        Self::UnknownJob,
        Self::UnknownNode,
        Self::NotPermitted,
        Self::InvalidState,
        Self::Unavailable,
        Self::Internal,
        Self::QueueLimit,
        Self::UnknownReservation,
        Self::NoSpace,
        Self::Unauthorized,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::TryAgain,
        Self::PayloadTooLarge,
        Self::UnknownUser,
        Self::UnknownProcess,
        Self::AuthRefused,
        Self::LaunchRefused,
        Self::Client,
    ];

    /// The wire spelling (the same as the JSON string).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::InvalidScript => "invalid_script",
            Self::Infeasible => "infeasible",
            Self::UnknownJob => "unknown_job",
            Self::UnknownNode => "unknown_node",
            Self::NotPermitted => "not_permitted",
            Self::InvalidState => "invalid_state",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::QueueLimit => "queue_limit",
            Self::UnknownReservation => "unknown_reservation",
            Self::NoSpace => "no_space",
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::TryAgain => "try_again",
            Self::PayloadTooLarge => "payload_too_large",
            Self::UnknownUser => "unknown_user",
            Self::UnknownProcess => "unknown_process",
            Self::AuthRefused => "auth_refused",
            Self::LaunchRefused => "launch_refused",
            Self::Client => "client",
        }
    }

    /// The HTTP status the API answers with.
    pub fn status(self) -> u16 {
        match self {
            Self::BadRequest | Self::InvalidScript | Self::Client => 400,
            Self::Unauthorized | Self::AuthRefused => 401,
            Self::NotPermitted | Self::LaunchRefused => 403,
            Self::NotFound | Self::UnknownReservation => 404,
            Self::MethodNotAllowed => 405,
            Self::TryAgain | Self::InvalidState => 409,
            Self::PayloadTooLarge => 413,
            Self::Infeasible
            | Self::UnknownNode
            | Self::UnknownUser
            | Self::UnknownJob
            | Self::UnknownProcess
            | Self::QueueLimit => 422,
            Self::Internal => 500,
            Self::Unavailable => 503,
            Self::NoSpace => 507,
        }
    }

    /// One line: what the code means and what to do.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::BadRequest => "malformed request, an unknown field or a bad value; fix the request",
            Self::InvalidScript => "the job script or its directives cannot be read; the message names the line",
            Self::Infeasible => "can never fit the cluster as it is configured; the reason says why",
            Self::UnknownJob => "no such job (HTTP: the holder job named does not exist)",
            Self::UnknownNode => "no such node",
            Self::NotPermitted => "not yours, or only an admin may do this",
            Self::InvalidState => "not in a state that allows this (e.g. already ended or released)",
            Self::Unavailable => "the controller is stopping or cannot write its state; retry later",
            Self::Internal => "a fault inside berth; the message says what failed (please report it)",
            Self::QueueLimit => {
                "breaks a limit of its queue, or the queue is closed; the message names one that takes it"
            }
            Self::UnknownReservation => "no advance reservation or API reservation of that name or id",
            Self::NoSpace => "the state database's filesystem is full; nothing was done; free space at the path named",
            Self::Unauthorized => "HTTP over TCP without a valid bearer token",
            Self::NotFound => "HTTP: no such path (see GET /v1/openapi.yaml)",
            Self::MethodNotAllowed => "HTTP: the path exists, the method does not (see the Allow header)",
            Self::TryAgain => "busy now; try again later (the reason says what is missing)",
            Self::PayloadTooLarge => "HTTP: the request body is larger than 1 MiB",
            Self::UnknownUser => "the named user does not exist on the controller's host",
            Self::UnknownProcess => "the holder process does not exist on the controller's host",
            Self::AuthRefused => "an agent refused a request without a valid signature (forged, replayed, expired)",
            Self::LaunchRefused => "an agent refused a signed request not acceptable there (node, job or CPUs)",
            Self::Client => "the CLI failed without an answer from the controller (connection, flags, files)",
        }
    }

    /// Whether the controller's replies (socket or HTTP) can carry it: every code but the
    /// agents' refusals (event kinds) and `client` (the CLI's own). docs/openapi.yaml lists
    /// exactly these.
    pub fn is_reply(self) -> bool {
        !matches!(self, Self::AuthRefused | Self::LaunchRefused | Self::Client)
    }

    /// The code of this spelling, if any.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The Markdown table of every code, as docs/errors.md holds it between its markers.
    pub fn markdown_table() -> String {
        let mut out = String::from("| code | HTTP status | meaning |\n|---|---|---|\n");
        for c in Self::ALL {
            out.push_str(&format!("| `{}` | {} | {} |\n", c.as_str(), c.status(), c.meaning()));
        }
        out
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an agent refused (the controller's event kind: `ErrorCode::from(refusal)`,
/// `auth_refused` or `launch_refused` in docs/errors.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// Not proven to come from a holder of the cluster key, or replayed, or expired:
    /// event `auth_refused`.
    Auth,
    /// Signed, but not acceptable here (wrong node, job not here, CPUs outside the job's
    /// allocation): event `launch_refused`.
    Launch,
}

impl Refusal {
    /// The event kind the controller records: the refusal's error code.
    pub fn event_kind(self) -> &'static str {
        ErrorCode::from(self).as_str()
    }
}

/// Why a message was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("not signed: {0}")]
    Unsigned(String),
    #[error("bad signature (the sender does not hold this cluster's key, or the message was altered)")]
    BadMac,
    #[error("timestamp is {0} ms in the past, outside the replay window; are the clocks synchronized?")]
    Stale(u64),
    #[error("timestamp is {0} ms in the future, outside the replay window; are the clocks synchronized?")]
    Future(u64),
    #[error("replayed: this nonce was already used")]
    Replayed,
    #[error("too many recent signed messages to remember ({0}); refused")]
    GuardFull(usize),
    #[error("out of sequence: expected frame {expected}, got {got} (replayed, dropped or reordered)")]
    Sequence { expected: u64, got: u64 },
    #[error("expired {0} ms ago")]
    Expired(u64),
    #[error("malformed signature fields: {0}")]
    Malformed(String),
}

impl From<Refusal> for ErrorCode {
    fn from(r: Refusal) -> ErrorCode {
        match r {
            Refusal::Auth => ErrorCode::AuthRefused,
            Refusal::Launch => ErrorCode::LaunchRefused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md");
    const BEGIN: &str = "<!-- BEGIN error table: generated from crates/protocol/src/error.rs -->\n";
    const END: &str = "<!-- END error table -->";

    #[test]
    fn every_code_is_listed_once_with_its_json_spelling_and_a_status() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "{} listed twice", c.as_str());
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&format!("\"{}\"", c.as_str())).unwrap(), c);
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
            assert!((400..600).contains(&c.status()), "{c}: {}", c.status());
            let m = c.meaning();
            assert!(!m.is_empty() && !m.contains('\n') && !m.contains('|'), "{c}: {m:?}");
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
    }

    #[test]
    fn spellings_and_statuses_peers_depend_on_are_unchanged() {
        // The controller's socket codes (protocol 1 to 3) and the HTTP API's (docs/openapi.yaml).
        let fixed = [
            ("bad_request", 400),
            ("invalid_script", 400),
            ("infeasible", 422),
            ("unknown_job", 422),
            ("unknown_node", 422),
            ("not_permitted", 403),
            ("invalid_state", 409),
            ("unavailable", 503),
            ("internal", 500),
            ("queue_limit", 422),
            ("unknown_reservation", 404),
            ("no_space", 507),
            ("unauthorized", 401),
            ("not_found", 404),
            ("method_not_allowed", 405),
            ("try_again", 409),
            ("payload_too_large", 413),
            ("unknown_user", 422),
            ("unknown_process", 422),
            ("auth_refused", 401),
            ("launch_refused", 403),
            ("client", 400),
        ];
        let got: Vec<(&str, u16)> = ErrorCode::ALL.iter().map(|c| (c.as_str(), c.status())).collect();
        assert_eq!(got, fixed);
    }

    #[test]
    fn refusals_map_to_the_event_codes() {
        assert_eq!(Refusal::Auth.event_kind(), "auth_refused");
        assert_eq!(Refusal::Launch.event_kind(), "launch_refused");
        assert_eq!(ErrorCode::from(Refusal::Launch).status(), 403);
        // The refusal itself keeps its own spelling inside the agent's message.
        assert_eq!(serde_json::to_string(&Refusal::Auth).unwrap(), "\"auth\"");
    }

    /// docs/errors.md holds the table generated from `ALL`. With `BERTH_BLESS=1` this test
    /// rewrites it; otherwise a difference fails with the table to paste.
    #[test]
    fn docs_errors_md_holds_the_generated_table() {
        let doc = std::fs::read_to_string(DOC_PATH).expect("docs/errors.md is readable");
        let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
            panic!("docs/errors.md lacks the markers {BEGIN:?} and {END:?}");
        };
        let current = &doc[b + BEGIN.len()..e];
        let wanted = ErrorCode::markdown_table();
        if current == wanted {
            return;
        }
        if std::env::var_os("BERTH_BLESS").is_some() {
            let fixed = format!("{}{}{}", &doc[..b + BEGIN.len()], wanted, &doc[e..]);
            std::fs::write(DOC_PATH, fixed).expect("docs/errors.md is writable");
            return;
        }
        panic!("docs/errors.md's table differs from ErrorCode (run with BERTH_BLESS=1 to rewrite it):\n{wanted}");
    }
}
