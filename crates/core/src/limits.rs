//! Bounds on every number and string a user gives at submission.
//!
//! A submission arrives as typed values (the client's `SubmitOptions`, the script, the
//! environment): a hostile client can send any of them, so the controller checks them all here
//! before anything is written. Each bound is an admin setting (`[limits]` in the controller's
//! configuration) with a default that no legitimate job comes near.

use crate::directives::SubmitOptions;
use crate::units::format_size;
use serde::Deserialize;

/// Why a submission breaks a bound of `[limits]`. The messages name the flag or field, show what
/// the user gave with control characters escaped, and say what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{what} is empty; give one or leave the option out")]
    LabelEmpty { what: String },
    #[error("{what} is {len} bytes long, more than the {max} allowed; shorten it")]
    LabelTooLong { what: String, len: usize, max: usize },
    /// `shown` is the value with control characters escaped.
    #[error("{what} {shown} holds the control character {found:?}; use printable characters only")]
    LabelControl { what: String, shown: String, found: char },
    #[error("{flag} must be at least 1")]
    CountZero { flag: &'static str },
    #[error("{flag} {n} is more than this cluster allows ({max})")]
    CountTooLarge { flag: &'static str, n: u32, max: u32 },
    #[error("{flag} 0 asks for no memory, and no process starts in none; give a size such as 1G")]
    MemoryZero { flag: &'static str },
    #[error("{flag} {} is less than the {} a job needs at least; ask for more", format_size(*bytes), format_size(*min))]
    MemoryTooSmall { flag: &'static str, bytes: u64, min: u64 },
    #[error("{flag} {} is more than this cluster allows ({})", format_size(*bytes), format_size(*max))]
    MemoryTooLarge { flag: &'static str, bytes: u64, max: u64 },
    /// `shown` is the name with control characters escaped.
    #[error("{flag} needs a name of 1 to 64 letters, digits, _ - and ., got {shown}")]
    BadName { flag: &'static str, shown: String },
    #[error("umask {0:o} is not a file mode mask (0 to 777 octal)")]
    BadUmask(u32),
    #[error("{n} properties asked for; at most {max} are allowed")]
    TooManyProperties { n: usize, max: usize },
    /// `shown` is the property with control characters escaped.
    #[error("--property needs names of 1 to 64 letters, digits, _ and -, got {shown}")]
    BadProperty { shown: String },
    #[error("--walltime must be at least one second")]
    WalltimeZero,
    #[error("--walltime {secs} s is longer than this cluster allows ({max} s = {} days); ask for less", max / 86400)]
    WalltimeTooLong { secs: u64, max: u64 },
    #[error("{what} is empty")]
    PathEmpty { what: String },
    #[error("{what} is {len} bytes long, more than the {max} allowed")]
    PathTooLong { what: String, len: usize, max: usize },
    /// `shown` is the path with control characters escaped.
    #[error("{what} {shown} holds a control character (newline, escape, ...); use a plain path")]
    PathControl { what: String, shown: String },
    #[error("the script is {}, larger than the {} this cluster accepts; keep data out of the script", format_size(*bytes as u64), format_size(*max as u64))]
    ScriptTooLarge { bytes: usize, max: usize },
    #[error("line {line} ends with a carriage return (DOS line endings); convert the script, e.g. with dos2unix")]
    DosLineEnding { line: usize },
    #[error("the environment holds {n} variables, more than the {max} allowed; unset some")]
    TooManyVariables { n: usize, max: usize },
    #[error("the environment is {}, larger than the {} allowed; unset large variables", format_size(*bytes as u64), format_size(*max as u64))]
    EnvironmentTooLarge { bytes: usize, max: usize },
}

/// `[limits]`: what one submission may ask for and carry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubmitLimits {
    /// The longest walltime a job may ask for (and a queue default may give), seconds.
    pub max_walltime_secs: u64,
    /// The largest count of cores, nodes, tasks per node or CPUs per task.
    pub max_count: u32,
    /// The most memory per node (`--mem`) or per CPU (`--mem-per-cpu`), bytes.
    pub max_mem_bytes: u64,
    /// The least memory a job may ask for: below it not even its shell starts.
    pub min_mem_bytes: u64,
    /// The longest job name, bytes.
    pub max_name_bytes: usize,
    /// The longest output, error or submit-directory path, bytes.
    pub max_path_bytes: usize,
    /// The largest batch script, bytes (Slurm's default `max_script_size` is 4 MB).
    pub max_script_bytes: usize,
    /// The largest environment (names and values), bytes.
    pub max_env_bytes: usize,
    /// The most environment variables.
    pub max_env_vars: usize,
    /// The most subnode properties a job may ask for.
    pub max_properties: usize,
    /// Processes a job may have at once on a node: this many, plus `pids_per_core` for each
    /// of its cores there (both 0: no limit). A fork bomb stays inside its job.
    pub pids_base: u64,
    pub pids_per_core: u64,
}

impl Default for SubmitLimits {
    fn default() -> Self {
        SubmitLimits {
            max_walltime_secs: 365 * 86400,
            max_count: 1 << 20,
            max_mem_bytes: 1 << 50,
            min_mem_bytes: 1 << 20,
            max_name_bytes: 256,
            max_path_bytes: 4096,
            max_script_bytes: 4 << 20,
            max_env_bytes: 1 << 20,
            max_env_vars: 4096,
            max_properties: 64,
            pids_base: 512,
            pids_per_core: 512,
        }
    }
}

/// A short string shown to people (job names, queue names): printable, and not too long.
pub fn check_label(what: &str, value: &str, max_bytes: usize) -> Result<(), LimitError> {
    if value.is_empty() {
        return Err(LimitError::LabelEmpty { what: what.into() });
    }
    if value.len() > max_bytes {
        return Err(LimitError::LabelTooLong { what: what.into(), len: value.len(), max: max_bytes });
    }
    if let Some(found) = value.chars().find(|c| c.is_control()) {
        return Err(LimitError::LabelControl { what: what.into(), shown: escape_control(value).into_owned(), found });
    }
    Ok(())
}

/// `text` with every control character written as an escape (`\n`, `\u{1b}`), so that what
/// a user wrote cannot forge lines or drive the terminal of whoever reads it.
pub fn escape_control(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The first line of `script` that ends with a carriage return (1-based), if any: a script
/// saved with DOS line endings, whose interpreter line names `/bin/sh\r`.
pub fn crlf_line(script: &str) -> Option<usize> {
    script.split('\n').position(|l| l.ends_with('\r')).map(|i| i + 1)
}

impl SubmitLimits {
    /// The process limit of a job holding `cores` cores on a node; none when unlimited.
    pub fn pids_max(&self, cores: u32) -> Option<u64> {
        let n = self.pids_base.saturating_add(self.pids_per_core.saturating_mul(u64::from(cores)));
        (n > 0).then_some(n)
    }

    /// Check every option a user set against these bounds.
    pub fn check_options(&self, o: &SubmitOptions) -> Result<(), LimitError> {
        let counts = [
            ("--cores", o.cores),
            ("--nodes", o.nodes),
            ("--tasks-per-node", o.tasks_per_node),
            ("--cpus-per-task", o.cpus_per_task),
        ];
        for (flag, value) in counts {
            if let Some(n) = value {
                if n == 0 {
                    return Err(LimitError::CountZero { flag });
                }
                if n > self.max_count {
                    return Err(LimitError::CountTooLarge { flag, n, max: self.max_count });
                }
            }
        }
        for (flag, value) in [("--mem", o.mem), ("--mem-per-cpu", o.mem_per_cpu), ("--mem-per-gpu", o.mem_per_gpu)] {
            if let Some(bytes) = value {
                if bytes == 0 {
                    return Err(LimitError::MemoryZero { flag });
                }
                if bytes < self.min_mem_bytes {
                    return Err(LimitError::MemoryTooSmall { flag, bytes, min: self.min_mem_bytes });
                }
                if bytes > self.max_mem_bytes {
                    return Err(LimitError::MemoryTooLarge { flag, bytes, max: self.max_mem_bytes });
                }
            }
        }
        if let Some(w) = o.walltime {
            self.check_walltime(w)?;
        }
        if let Some(name) = &o.name {
            check_label("the job name", name, self.max_name_bytes)?;
        }
        for (flag, path) in [("--output", &o.output), ("--error", &o.error)] {
            if let Some(p) = path {
                self.check_path(flag, p)?;
            }
        }
        if let Some(q) = &o.queue {
            check_label("the queue name", q, 64)?;
        }
        if let Some(a) = &o.account {
            if !crate::directives::valid_name(a) {
                return Err(LimitError::BadName { flag: "--account", shown: escape_control(a).into_owned() });
            }
        }
        if let Some(r) = &o.reservation {
            if !crate::directives::valid_name(r) {
                return Err(LimitError::BadName { flag: "--reservation", shown: escape_control(r).into_owned() });
            }
        }
        if let Some(mask) = o.umask.filter(|m| *m > 0o777) {
            return Err(LimitError::BadUmask(mask));
        }
        if let Some(props) = &o.properties {
            if props.len() > self.max_properties {
                return Err(LimitError::TooManyProperties { n: props.len(), max: self.max_properties });
            }
            if let Some(p) = props.iter().find(|p| !crate::directives::valid_name(p)) {
                return Err(LimitError::BadProperty { shown: escape_control(p).into_owned() });
            }
        }
        Ok(())
    }

    pub fn check_walltime(&self, secs: u64) -> Result<(), LimitError> {
        if secs == 0 {
            return Err(LimitError::WalltimeZero);
        }
        if secs > self.max_walltime_secs {
            return Err(LimitError::WalltimeTooLong { secs, max: self.max_walltime_secs });
        }
        Ok(())
    }

    /// An output, error or working-directory path.
    pub fn check_path(&self, what: &str, path: &str) -> Result<(), LimitError> {
        if path.is_empty() {
            return Err(LimitError::PathEmpty { what: what.into() });
        }
        if path.len() > self.max_path_bytes {
            return Err(LimitError::PathTooLong { what: what.into(), len: path.len(), max: self.max_path_bytes });
        }
        if path.contains(|c: char| c.is_control()) {
            return Err(LimitError::PathControl { what: what.into(), shown: escape_control(path).into_owned() });
        }
        Ok(())
    }

    /// The script and the environment a submission carries.
    pub fn check_payload(&self, script: &str, env: &[(String, String)]) -> Result<(), LimitError> {
        if script.len() > self.max_script_bytes {
            return Err(LimitError::ScriptTooLarge { bytes: script.len(), max: self.max_script_bytes });
        }
        if let Some(line) = crlf_line(script) {
            return Err(LimitError::DosLineEnding { line });
        }
        if env.len() > self.max_env_vars {
            return Err(LimitError::TooManyVariables { n: env.len(), max: self.max_env_vars });
        }
        let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if bytes > self.max_env_bytes {
            return Err(LimitError::EnvironmentTooLarge { bytes, max: self.max_env_bytes });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_is_bounded_with_a_message_naming_the_flag() {
        let l = SubmitLimits::default();
        let huge = SubmitOptions { walltime: Some(9223372036854775807), ..Default::default() };
        let e = l.check_options(&huge).unwrap_err().to_string();
        assert!(e.contains("--walltime") && e.contains("365 days"), "{e}");
        assert!(l.check_options(&SubmitOptions { walltime: Some(365 * 86400), ..Default::default() }).is_ok());
        let e =
            l.check_options(&SubmitOptions { cores: Some(u32::MAX), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("--cores"), "{e}");
        let e = l.check_options(&SubmitOptions { nodes: Some(0), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("--nodes must be at least 1"), "{e}");
        let e = l.check_options(&SubmitOptions { mem: Some(0), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("--mem 0"), "{e}");
        let e =
            l.check_options(&SubmitOptions { mem_per_cpu: Some(1000), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("--mem-per-cpu") && e.contains("at least"), "{e}");
        let e = l.check_options(&SubmitOptions { mem: Some(u64::MAX), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("more than this cluster allows"), "{e}");
    }

    #[test]
    fn names_and_paths_are_printable_and_short() {
        let l = SubmitLimits::default();
        for bad in ["a\nb", "\u{1b}]0;owned\u{7}", "x\u{9b}31m"] {
            let o = SubmitOptions { name: Some(bad.into()), ..Default::default() };
            let e = l.check_options(&o).unwrap_err().to_string();
            assert!(!e.chars().any(|c| c.is_control()), "the error itself is escaped: {e:?}");
        }
        let o = SubmitOptions { name: Some("x".repeat(120_000)), ..Default::default() };
        assert!(l.check_options(&o).unwrap_err().to_string().contains("120000 bytes"));
        let o = SubmitOptions { name: Some("résumé run 3".into()), ..Default::default() };
        assert!(l.check_options(&o).is_ok(), "non-ASCII printable names are fine");
        let o = SubmitOptions { output: Some("/tmp/a\nb".into()), ..Default::default() };
        assert!(l.check_options(&o).unwrap_err().to_string().contains("--output"));
    }

    #[test]
    fn errors_are_typed_and_their_messages_unchanged() {
        let l = SubmitLimits::default();
        let e = l.check_walltime(u64::MAX).unwrap_err();
        assert_eq!(e, LimitError::WalltimeTooLong { secs: u64::MAX, max: 365 * 86400 });
        assert_eq!(
            e.to_string(),
            "--walltime 18446744073709551615 s is longer than this cluster allows (31536000 s = 365 days); ask for less"
        );
        let e = l.check_options(&SubmitOptions { mem: Some(1000), ..Default::default() }).unwrap_err();
        assert_eq!(e.to_string(), "--mem 1000B is less than the 1M a job needs at least; ask for more");
        let e = check_label("the job name", "a\tb", 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the job name a\\tb holds the control character '\\t'; use printable characters only"
        );
        let e = l.check_options(&SubmitOptions { umask: Some(0o1777), ..Default::default() }).unwrap_err();
        assert_eq!(
            (e.clone(), e.to_string()),
            (LimitError::BadUmask(0o1777), "umask 1777 is not a file mode mask (0 to 777 octal)".into())
        );
        assert_eq!(l.check_payload("a\r\n", &[]).unwrap_err(), LimitError::DosLineEnding { line: 1 });
    }

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(escape_control("plain name"), "plain name");
        assert_eq!(escape_control("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
        assert!(!escape_control("\u{9b}\u{7f}\r").chars().any(char::is_control));
    }

    #[test]
    fn dos_scripts_are_refused_naming_the_line() {
        let l = SubmitLimits::default();
        let e = l.check_payload("#!/bin/sh\r\necho hi\r\n", &[]).unwrap_err().to_string();
        assert!(e.starts_with("line 1 ends with a carriage return") && e.contains("dos2unix"), "{e}");
        let e = l.check_payload("#!/bin/sh\necho hi\r\n", &[]).unwrap_err().to_string();
        assert!(e.starts_with("line 2 "), "{e}");
        assert!(l.check_payload("#!/bin/sh\necho 'a\rb'\n", &[]).is_ok(), "a CR inside a line is the user's business");
        let big = format!("#!/bin/sh\n#{}\n", "x".repeat(5 << 20));
        assert!(l.check_payload(&big, &[]).unwrap_err().to_string().contains("larger than the 4M"));
        let env = vec![("K".to_string(), "v".repeat(2 << 20))];
        assert!(l.check_payload("#!/bin/sh\n", &env).unwrap_err().to_string().contains("environment"));
    }
}
