//! Options carried with a job beyond its resources: `--comment`, `--chdir`, `--export`,
//! `--signal`, `--mail-type`/`--mail-user`, `--qos` (docs/compat.md). Each is parsed here from
//! its Slurm spelling (berth's own flags use the same) and, where PBS has one, from PBS's.

use serde::{Deserialize, Serialize};

/// The longest `--comment` kept (Slurm's limit is larger; berth's bound is its own).
pub const MAX_COMMENT_BYTES: usize = 1024;
/// The most variables an `--export` list may name.
pub const MAX_EXPORT_VARS: usize = 1024;
/// The longest `--mail-user` address.
pub const MAX_MAIL_USER_BYTES: usize = 256;
/// The latest `--signal` may come before the walltime ends (Slurm's limit: 65535 s).
pub const MAX_SIGNAL_SECS: u32 = 65_535;

/// Why the value of one of these options is refused; the message names the option (Slurm's
/// spelling; the PBS front end renames it) and what to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionValueError {
    #[error("--comment needs a value")]
    CommentEmpty,
    #[error("--comment is {0} bytes, more than the {MAX_COMMENT_BYTES} allowed")]
    CommentTooLong(usize),
    #[error("--comment must not hold control characters (newlines, escapes)")]
    CommentControl,
    #[error("--chdir needs a directory")]
    ChdirEmpty,
    #[error("--chdir: the directory name must not hold control characters")]
    ChdirControl,
    #[error("--export needs ALL, NONE or variables, got {0:?}")]
    ExportEmpty(String),
    #[error("-v needs VAR[=value],..., got {0:?}")]
    PbsVarsEmpty(String),
    #[error("{flag}: {name:?} is not a variable name (letters, digits and _)")]
    BadVariableName { flag: &'static str, name: String },
    #[error("{flag}: the value of {name} holds a NUL byte")]
    NulInValue { flag: &'static str, name: String },
    #[error("{flag} names more than {MAX_EXPORT_VARS} variables")]
    TooManyVariables { flag: &'static str },
    #[error("--signal: {0:?} is not a number of seconds (0 to {MAX_SIGNAL_SECS})")]
    SignalSeconds(String),
    #[error("--signal: {0:?} is not a signal (a number 1-64 or a name such as USR1, SIGTERM)")]
    NotASignal(String),
    #[error("--mail-type: {0} is not supported (BEGIN, END, FAIL, REQUEUE, ALL and NONE are)")]
    MailType(String),
    #[error("--mail-type needs a value")]
    MailTypeEmpty,
    #[error("-m takes a, b, e (any of them) or n, got {0:?}")]
    PbsMailType(String),
    #[error("-m needs a value")]
    PbsMailTypeEmpty,
    #[error("--mail-user needs an address")]
    MailUserEmpty,
    #[error("--mail-user is longer than {MAX_MAIL_USER_BYTES} bytes")]
    MailUserTooLong,
    #[error("--mail-user: {0:?} is not an address")]
    NotAnAddress(String),
}

/// The option parsers that still gather errors as text (`SubmitOptions::set`, the Slurm and
/// PBS directives) take these as their messages.
impl From<OptionValueError> for String {
    fn from(e: OptionValueError) -> String {
        e.to_string()
    }
}

/// `--comment TEXT`: any printable text (no control characters), at most
/// [`MAX_COMMENT_BYTES`].
pub fn parse_comment(v: &str) -> Result<String, OptionValueError> {
    if v.is_empty() {
        return Err(OptionValueError::CommentEmpty);
    }
    if v.len() > MAX_COMMENT_BYTES {
        return Err(OptionValueError::CommentTooLong(v.len()));
    }
    if v.chars().any(char::is_control) {
        return Err(OptionValueError::CommentControl);
    }
    Ok(v.to_string())
}

/// `--chdir DIR`: a path without NUL or control characters; a relative one is taken from the
/// submit directory (the controller makes it absolute).
pub fn parse_chdir(v: &str) -> Result<String, OptionValueError> {
    if v.trim().is_empty() {
        return Err(OptionValueError::ChdirEmpty);
    }
    if v.chars().any(char::is_control) {
        return Err(OptionValueError::ChdirControl);
    }
    Ok(v.to_string())
}

/// What environment the job takes from the submitter (`--export`, `#PBS -V`/`-v`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    /// Every variable of the submitting environment (`ALL`, the default; PBS `-V`).
    pub all: bool,
    /// Variables named: `VAR` takes the submitter's value (if it has one), `VAR=value` this
    /// value; in order, later ones win.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<(String, Option<String>)>,
}

impl Export {
    /// Slurm's `--export=ALL|NONE|[ALL,]VAR[=value][,...]` (`NONE,VAR=value` too). Without
    /// `ALL` only the variables named are passed, as Slurm does.
    pub fn parse_slurm(v: &str) -> Result<Export, OptionValueError> {
        let mut items = v.split(',').map(str::trim).peekable();
        let mut e = Export::default();
        match items.peek().copied() {
            Some("ALL") => {
                e.all = true;
                items.next();
            }
            Some("NONE") => {
                items.next();
            }
            _ => {}
        }
        e.vars = parse_vars(items, "--export")?;
        if !e.all && e.vars.is_empty() && v.trim() != "NONE" {
            return Err(OptionValueError::ExportEmpty(v.to_string()));
        }
        Ok(e)
    }

    /// PBS's `-v VAR[=value],...`: those variables besides the rest of the environment
    /// (berth passes the whole submitting environment as `-V` does).
    pub fn parse_pbs(v: &str) -> Result<Export, OptionValueError> {
        let vars = parse_vars(v.split(',').map(str::trim), "-v")?;
        if vars.is_empty() {
            return Err(OptionValueError::PbsVarsEmpty(v.to_string()));
        }
        Ok(Export { all: true, vars })
    }

    /// This export applied to the submitting environment `env`: what the job gets.
    pub fn apply(&self, env: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = if self.all { env.to_vec() } else { Vec::new() };
        for (k, v) in &self.vars {
            let value = match v {
                Some(v) => Some(v.clone()),
                None => env.iter().rev().find(|(ek, _)| ek == k).map(|(_, v)| v.clone()),
            };
            if let Some(value) = value {
                out.retain(|(ok, _)| ok != k);
                out.push((k.clone(), value));
            }
        }
        out
    }
}

fn parse_vars<'a>(
    items: impl Iterator<Item = &'a str>,
    flag: &'static str,
) -> Result<Vec<(String, Option<String>)>, OptionValueError> {
    let mut vars = Vec::new();
    for item in items {
        if item.is_empty() {
            continue;
        }
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (item, None),
        };
        let valid = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(OptionValueError::BadVariableName { flag, name: k.to_string() });
        }
        if v.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(OptionValueError::NulInValue { flag, name: k.to_string() });
        }
        vars.push((k.to_string(), v));
        if vars.len() > MAX_EXPORT_VARS {
            return Err(OptionValueError::TooManyVariables { flag });
        }
    }
    Ok(vars)
}

/// `--signal=[B:][R:]SIG[@TIME]`: send SIG TIME seconds (default 60) before the walltime ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSpec {
    /// The signal's number (Linux numbering).
    pub signal: i32,
    /// Seconds before the end of the walltime.
    pub secs: u32,
    /// `B:`: only the batch shell, not the job's other processes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch_only: bool,
}

impl SignalSpec {
    pub fn parse(v: &str) -> Result<SignalSpec, OptionValueError> {
        let mut rest = v.trim();
        let mut batch_only = false;
        loop {
            if let Some(r) = rest.strip_prefix("B:") {
                batch_only = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix("R:") {
                // Slurm's R: (also at a reservation's end); berth's advance reservations do
                // not cut a job short, so the walltime is the only end it is sent before.
                rest = r;
            } else {
                break;
            }
        }
        let (sig, secs) = match rest.split_once('@') {
            Some((s, t)) => (
                s,
                t.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= MAX_SIGNAL_SECS)
                    .ok_or_else(|| OptionValueError::SignalSeconds(t.to_string()))?,
            ),
            None => (rest, 60),
        };
        let signal = signal_number(sig).ok_or_else(|| OptionValueError::NotASignal(sig.to_string()))?;
        Ok(SignalSpec { signal, secs, batch_only })
    }
}

/// A signal by number (1-64) or name (`USR1`, `SIGUSR1`, case-insensitive).
pub fn signal_number(s: &str) -> Option<i32> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    Some(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "URG" => 23,
        "XCPU" => 24,
        "XFSZ" => 25,
        "VTALRM" => 26,
        "PROF" => 27,
        "WINCH" => 28,
        "IO" | "POLL" => 29,
        "PWR" => 30,
        _ => return None,
    })
}

/// Events a job's notifications are sent for (`--mail-type`, PBS `-m`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailTypes {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub begin: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requeue: bool,
}

impl MailTypes {
    /// Slurm's `--mail-type=BEGIN,END,FAIL,REQUEUE,ALL,NONE` (`ALL`: all four; `NONE`: none).
    pub fn parse_slurm(v: &str) -> Result<MailTypes, OptionValueError> {
        let mut m = MailTypes::default();
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.to_ascii_uppercase().as_str() {
                "NONE" => m = MailTypes::default(),
                "BEGIN" => m.begin = true,
                "END" => m.end = true,
                "FAIL" => m.fail = true,
                "REQUEUE" => m.requeue = true,
                "ALL" => m = MailTypes { begin: true, end: true, fail: true, requeue: true },
                other => return Err(OptionValueError::MailType(other.to_string())),
            }
        }
        if v.trim().is_empty() {
            return Err(OptionValueError::MailTypeEmpty);
        }
        Ok(m)
    }

    /// PBS's `-m`: `a` (aborted: FAIL), `b` (begin), `e` (end), or `n` (none).
    pub fn parse_pbs(v: &str) -> Result<MailTypes, OptionValueError> {
        let v = v.trim();
        if v == "n" {
            return Ok(MailTypes::default());
        }
        let mut m = MailTypes::default();
        for c in v.chars() {
            match c {
                'a' => m.fail = true,
                'b' => m.begin = true,
                'e' => m.end = true,
                _ => return Err(OptionValueError::PbsMailType(v.to_string())),
            }
        }
        if v.is_empty() {
            return Err(OptionValueError::PbsMailTypeEmpty);
        }
        Ok(m)
    }

    pub fn any(&self) -> bool {
        self.begin || self.end || self.fail || self.requeue
    }

    /// Slurm's spelling (`BEGIN,END`; `NONE`).
    pub fn slurm(&self) -> String {
        let names: Vec<&str> =
            [(self.begin, "BEGIN"), (self.end, "END"), (self.fail, "FAIL"), (self.requeue, "REQUEUE")]
                .into_iter()
                .filter_map(|(on, n)| on.then_some(n))
                .collect();
        if names.is_empty() {
            "NONE".into()
        } else {
            names.join(",")
        }
    }
}

/// `--mail-user ADDR` (PBS `-M`): one address of printable characters, no spaces.
pub fn parse_mail_user(v: &str) -> Result<String, OptionValueError> {
    let v = v.trim();
    if v.is_empty() {
        return Err(OptionValueError::MailUserEmpty);
    }
    if v.len() > MAX_MAIL_USER_BYTES {
        return Err(OptionValueError::MailUserTooLong);
    }
    if v.chars().any(|c| c.is_control() || c.is_whitespace()) || v.starts_with('-') {
        return Err(OptionValueError::NotAnAddress(v.to_string()));
    }
    Ok(v.to_string())
}

/// Whether an output path has a pattern only known once the job starts: `%N` (the first
/// node's short name), `%n` (node index), `%t` (task id); `%%` is no pattern.
pub fn has_node_patterns(pattern: &str) -> bool {
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '%' && matches!(chars.next(), Some('N' | 'n' | 't')) {
            return true;
        }
    }
    false
}

/// An output path expanded when the job starts on `first_node`: `%N` its short name (up to
/// the first dot), `%n` and `%t` 0 (the batch script is task 0 on the job's node 0, as in
/// Slurm), and every pattern `expand_output_in` knows.
pub fn expand_at_start(
    pattern: &str,
    id: u64,
    name: &str,
    user: &str,
    array: Option<&super::ArrayTask>,
    first_node: &str,
) -> String {
    super::expand_percent(pattern, |c| match c {
        'N' => Some(first_node.split('.').next().unwrap_or(first_node).to_string()),
        'n' | 't' => Some("0".into()),
        '%' => None,
        other => {
            let raw = format!("%{other}");
            let e = super::expand_output_in(&raw, id, name, user, array);
            (e != raw).then_some(e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_bounded_and_printable() {
        assert_eq!(parse_comment("run 3 of 5").unwrap(), "run 3 of 5");
        assert!(parse_comment("").is_err());
        assert!(parse_comment("a\nb").is_err());
        assert!(parse_comment("\x1b[31m").is_err());
        assert!(parse_comment(&"x".repeat(MAX_COMMENT_BYTES + 1)).is_err());
        assert!(parse_comment(&"x".repeat(MAX_COMMENT_BYTES)).is_ok());
    }

    #[test]
    fn chdir_values() {
        assert_eq!(parse_chdir("/tmp/x").unwrap(), "/tmp/x");
        assert_eq!(parse_chdir("rel/dir").unwrap(), "rel/dir");
        assert!(parse_chdir(" ").is_err());
        assert!(parse_chdir("a\nb").is_err());
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn export_as_slurm_reads_it() {
        let sub = env(&[("PATH", "/bin"), ("FOO", "sub"), ("HOME", "/h")]);
        let all = Export::parse_slurm("ALL").unwrap();
        assert_eq!(all.apply(&sub), sub);
        let none = Export::parse_slurm("NONE").unwrap();
        assert!(none.apply(&sub).is_empty());
        let none_foo = Export::parse_slurm("NONE,FOO=bar").unwrap();
        assert_eq!(none_foo.apply(&sub), env(&[("FOO", "bar")]));
        let all_foo = Export::parse_slurm("ALL,FOO=bar,NEW=1").unwrap();
        assert_eq!(all_foo.apply(&sub), env(&[("PATH", "/bin"), ("HOME", "/h"), ("FOO", "bar"), ("NEW", "1")]));
        // Without ALL: only the variables named, a bare name with the submitter's value.
        let only = Export::parse_slurm("PATH,X=1,MISSING").unwrap();
        assert_eq!(only.apply(&sub), env(&[("PATH", "/bin"), ("X", "1")]));
        assert!(Export::parse_slurm("").is_err());
        assert!(Export::parse_slurm("ALL,1BAD=x").is_err());
        assert!(Export::parse_slurm("ALL,A-B=x").is_err());
        // A value may hold '=' and spaces.
        let eq = Export::parse_slurm("ALL,A=x=y z").unwrap();
        assert_eq!(eq.vars, vec![("A".to_string(), Some("x=y z".to_string()))]);
    }

    #[test]
    fn export_as_pbs_reads_it() {
        let sub = env(&[("PATH", "/bin"), ("FOO", "sub")]);
        let v = Export::parse_pbs("FOO=bar,PATH").unwrap();
        assert_eq!(v.apply(&sub), env(&[("FOO", "bar"), ("PATH", "/bin")]));
        assert!(Export::parse_pbs("").is_err());
        assert!(Export::parse_pbs("=x").is_err());
    }

    #[test]
    fn errors_are_typed_and_their_messages_unchanged() {
        assert_eq!(SignalSpec::parse("USR1@x").unwrap_err(), OptionValueError::SignalSeconds("x".into()));
        assert_eq!(
            SignalSpec::parse("USR3").unwrap_err().to_string(),
            "--signal: \"USR3\" is not a signal (a number 1-64 or a name such as USR1, SIGTERM)"
        );
        assert_eq!(
            Export::parse_slurm("ALL,1BAD=x").unwrap_err().to_string(),
            "--export: \"1BAD\" is not a variable name (letters, digits and _)"
        );
        assert_eq!(
            MailTypes::parse_slurm("TIME_LIMIT_90").unwrap_err().to_string(),
            "--mail-type: TIME_LIMIT_90 is not supported (BEGIN, END, FAIL, REQUEUE, ALL and NONE are)"
        );
        assert_eq!(String::from(OptionValueError::CommentEmpty), "--comment needs a value");
    }

    #[test]
    fn signals() {
        assert_eq!(SignalSpec::parse("USR1@3").unwrap(), SignalSpec { signal: 10, secs: 3, batch_only: false });
        assert_eq!(SignalSpec::parse("B:SIGUSR2").unwrap(), SignalSpec { signal: 12, secs: 60, batch_only: true });
        assert_eq!(SignalSpec::parse("R:B:10@120").unwrap(), SignalSpec { signal: 10, secs: 120, batch_only: true });
        assert_eq!(SignalSpec::parse("term").unwrap().signal, 15);
        assert!(SignalSpec::parse("USR3").is_err());
        assert!(SignalSpec::parse("0").is_err());
        assert!(SignalSpec::parse("65").is_err());
        assert!(SignalSpec::parse("USR1@x").is_err());
        assert!(SignalSpec::parse("USR1@70000").is_err());
        assert!(SignalSpec::parse("").is_err());
    }

    #[test]
    fn mail_types() {
        let m = MailTypes::parse_slurm("BEGIN,END").unwrap();
        assert!(m.begin && m.end && !m.fail);
        assert_eq!(m.slurm(), "BEGIN,END");
        let all = MailTypes::parse_slurm("all").unwrap();
        assert_eq!(all.slurm(), "BEGIN,END,FAIL,REQUEUE");
        assert!(!MailTypes::parse_slurm("NONE").unwrap().any());
        assert!(MailTypes::parse_slurm("TIME_LIMIT_90").is_err());
        assert!(MailTypes::parse_slurm("").is_err());
        let p = MailTypes::parse_pbs("abe").unwrap();
        assert!(p.begin && p.end && p.fail && !p.requeue);
        assert!(!MailTypes::parse_pbs("n").unwrap().any());
        assert!(MailTypes::parse_pbs("x").is_err());
        assert!(MailTypes::parse_pbs("").is_err());
        assert_eq!(parse_mail_user("ann@example.org").unwrap(), "ann@example.org");
        assert!(parse_mail_user("a b").is_err());
        assert!(parse_mail_user("-oops").is_err());
        assert!(parse_mail_user("").is_err());
    }

    #[test]
    fn node_patterns_expand_at_start() {
        assert!(has_node_patterns("o-%N.%j"));
        assert!(has_node_patterns("%n-%t"));
        assert!(!has_node_patterns("o-%%N-%j"));
        assert!(!has_node_patterns("o-%j%"));
        assert_eq!(
            expand_at_start("%N-%n-%t-%j-%x-%u-%%N-%q", 7, "a/b", "ann", None, "node2.example.org"),
            "node2-0-0-7-a_b-ann-%N-%q"
        );
    }

    fn foreign(lines: &str) -> crate::directives::Foreign {
        crate::directives::parse_foreign(&format!("#!/bin/sh\n{lines}\necho\n")).unwrap()
    }

    #[test]
    fn slurm_directives_map_onto_the_options() {
        let f = foreign(
            "#SBATCH --comment \"run 3\" -D /scratch/x --export=NONE,FOO=bar\n#SBATCH --signal=B:USR1@30 --mail-type=END,FAIL --mail-user=ann@x.org\n#SBATCH --exclusive -q high",
        );
        assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
        let o = &f.options;
        assert_eq!(o.comment.as_deref(), Some("run 3"));
        assert_eq!(o.chdir.as_deref(), Some("/scratch/x"));
        assert_eq!(o.export, Some(Export { all: false, vars: vec![("FOO".into(), Some("bar".into()))] }));
        assert_eq!(o.signal, Some(SignalSpec { signal: 10, secs: 30, batch_only: true }));
        assert_eq!(o.mail_type.map(|m| m.slurm()).as_deref(), Some("END,FAIL"));
        assert_eq!(o.mail_user.as_deref(), Some("ann@x.org"));
        assert_eq!(o.exclusive, Some(true));
        assert_eq!(o.qos.as_deref(), Some("high"));
        let f = foreign("#SBATCH --exclusive=user");
        assert!(f.unsupported[0].1.contains("--exclusive=user"), "{:?}", f.unsupported);
        for bad in [
            "#SBATCH --signal=NOPE",
            "#SBATCH --mail-type=SOMETIMES",
            "#SBATCH --export=1X=2",
            "#SBATCH --comment=\"\"",
        ] {
            assert!(crate::directives::parse_foreign(&format!("#!/bin/sh\n{bad}\n")).is_err(), "{bad}");
        }
    }

    #[test]
    fn pbs_directives_map_onto_the_options() {
        let f = foreign("#PBS -V\n#PBS -v FOO=bar,HOME\n#PBS -m abe -M ann@x.org");
        assert!(f.unsupported.is_empty(), "{:?}", f.unsupported);
        let o = &f.options;
        assert_eq!(
            o.export,
            Some(Export { all: true, vars: vec![("FOO".into(), Some("bar".into())), ("HOME".into(), None)] })
        );
        let m = o.mail_type.unwrap_or_default();
        assert!(m.begin && m.end && m.fail);
        assert_eq!(o.mail_user.as_deref(), Some("ann@x.org"));
        assert_eq!(foreign("#PBS -V").options.export, Some(Export { all: true, vars: vec![] }));
        assert!(crate::directives::parse_foreign("#!/bin/sh\n#PBS -m q\n").is_err());
    }

    #[test]
    fn berth_directives_and_flags() {
        let o = crate::directives::parse_script(
            "#!/bin/sh\n#BERTH --comment \"a b\" --chdir sub --export ALL,X=1 --signal USR2@5\n#BERTH --mail-type BEGIN --mail-user ann --exclusive --qos normal\n",
        )
        .unwrap();
        assert_eq!(o.comment.as_deref(), Some("a b"));
        assert_eq!(o.chdir.as_deref(), Some("sub"));
        assert_eq!(o.export.as_ref().map(|e| e.all), Some(true));
        assert_eq!(o.signal.as_ref().map(|s| (s.signal, s.secs)), Some((12, 5)));
        assert!(o.mail_type.is_some_and(|m| m.begin && !m.end));
        assert_eq!(o.mail_user.as_deref(), Some("ann"));
        assert_eq!(o.exclusive, Some(true));
        assert_eq!(o.qos.as_deref(), Some("normal"));
        // Stored and read back as they were given.
        let back: crate::directives::SubmitOptions = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
        let mut flags = crate::directives::SubmitOptions::default();
        flags.set("comment", "over").unwrap();
        assert_eq!(o.overlay(flags).comment.as_deref(), Some("over"));
    }
}
