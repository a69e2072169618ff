//! A job's submission as the client builds it: the script (a file, standard input or
//! `--wrap`), the flags as options, the environment and working directory, output directories
//! checked where the user's view of the file system is. Used by `berth submit`, `berth alloc`,
//! `sbatch` and `qsub`.

use crate::SubmitFlags;
use anyhow::{anyhow, bail, Context, Result};
use berth_core::directives::SubmitOptions;
use berth_protocol::client::SubmitRequest;
use std::path::{Path, PathBuf};

/// The largest script the client sends (the controller has its own, smaller, configured bound).
const MAX_SCRIPT_BYTES: u64 = 16 << 20;

/// A batch script's text: a regular file of at most 16 MiB in UTF-8 (never a device or a pipe
/// read without end).
fn read_script(script: &Path) -> Result<String> {
    let file = std::fs::File::open(script).with_context(|| format!("cannot read batch script {}", script.display()))?;
    let meta = file.metadata().with_context(|| format!("cannot read batch script {}", script.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file (a directory, device or pipe); submit a script file", script.display());
    }
    read_bounded(file, &script.display().to_string())
}

/// At most 16 MiB of UTF-8 text from `from` (`what` names it in errors): a script file's or
/// standard input's.
pub fn read_bounded(from: impl std::io::Read, what: &str) -> Result<String> {
    use std::io::Read;
    let mut text = Vec::new();
    from.take(MAX_SCRIPT_BYTES + 1).read_to_end(&mut text).with_context(|| format!("cannot read {what}"))?;
    if text.len() as u64 > MAX_SCRIPT_BYTES {
        bail!("{what}: script larger than 16 MiB; keep data in files the script reads");
    }
    String::from_utf8(text).map_err(|_| anyhow!("{what} is not text (not UTF-8); submit a shell script"))
}

/// `berth submit -`: the script on standard input (at most 16 MiB, as a file); refused when
/// standard input is a terminal (nothing was piped in) or empty.
pub fn read_stdin_script() -> Result<String> {
    use std::io::IsTerminal;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!("`-` reads the script from standard input, which is a terminal; pipe a script in (`berth submit - < job.sh`) or give its file");
    }
    let text = read_bounded(stdin.lock(), "standard input")?;
    if text.trim().is_empty() {
        bail!("the script on standard input is empty");
    }
    Ok(text)
}

/// The script `--wrap CMD` submits (sbatch's and `berth submit`'s): `#!/bin/sh`, a comment
/// naming `by`, then CMD.
pub fn wrap_script(cmd: &str, by: &str) -> Result<String> {
    if cmd.trim().is_empty() {
        bail!("--wrap needs a command");
    }
    Ok(format!("#!/bin/sh\n# This script was created by {by}.\n\n{cmd}\n"))
}

/// Where a submitted script comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    /// `-`: standard input (job name `stdin`).
    Stdin,
    /// `--wrap CMD` (job name `wrap`).
    Wrap(String),
}

impl Source {
    /// A script argument: `-` is standard input.
    pub fn from_arg(p: PathBuf) -> Source {
        if p.as_os_str() == "-" {
            Source::Stdin
        } else {
            Source::File(p)
        }
    }
}

/// This process's umask (Linux 4.7+ reports it in /proc/self/status; reading it there does not
/// change it, as umask(2) would).
fn own_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
}

/// `--output`/`--error`: its directory must exist (`%j` and the like are in the file name).
fn check_output_dir(flag: &str, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            bail!(
                "--{flag} {}: the directory {} does not exist; create it or choose another path",
                berth_core::limits::escape_control(&path.display().to_string()),
                berth_core::limits::escape_control(&dir.display().to_string())
            );
        }
    }
    Ok(())
}

/// Build the submission of `script` with `flags` as the calling process sees it.
pub fn build_submission(script: &Path, flags: &SubmitFlags, hold: bool) -> Result<SubmitRequest> {
    let text = read_script(script)?;
    let script_name = script.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "job".into());
    build_text_submission(text, &script.display().to_string(), script_name, flags, hold)
}

/// Build the submission of a script from `source`.
pub fn build_source_submission(source: &Source, flags: &SubmitFlags, hold: bool) -> Result<SubmitRequest> {
    match source {
        Source::File(path) => build_submission(path, flags, hold),
        Source::Stdin => build_text_submission(read_stdin_script()?, "standard input", "stdin".into(), flags, hold),
        Source::Wrap(cmd) => {
            build_text_submission(wrap_script(cmd, "berth submit --wrap")?, "--wrap", "wrap".into(), flags, hold)
        }
    }
}

/// Build the submission of the script `text` (`label` names it in messages, `script_name`
/// is the job's name unless it is given one).
pub fn build_text_submission(
    text: String,
    label: &str,
    script_name: String,
    flags: &SubmitFlags,
    hold: bool,
) -> Result<SubmitRequest> {
    let mut options = SubmitOptions::default();
    let pairs = [
        ("cores", &flags.cores),
        ("nodes", &flags.nodes),
        ("tasks-per-node", &flags.tasks_per_node),
        ("cpus-per-task", &flags.cpus_per_task),
        ("mem", &flags.mem),
        ("walltime", &flags.walltime),
        ("name", &flags.name),
        ("output", &flags.output),
        ("error", &flags.error),
        ("queue", &flags.queue),
        ("account", &flags.account),
        ("mem-per-cpu", &flags.mem_per_cpu),
        ("gpus", &flags.gpus),
        ("gpus-per-node", &flags.gpus_per_node),
        ("gpu-type", &flags.gpu_type),
        ("cpus-per-gpu", &flags.cpus_per_gpu),
        ("mem-per-gpu", &flags.mem_per_gpu),
        ("gpus-per-task", &flags.gpus_per_task),
        ("gpus-per-socket", &flags.gpus_per_socket),
        ("sockets-per-node", &flags.sockets_per_node),
        ("gres", &flags.gres),
        ("licenses", &flags.licenses),
        ("gpu-bind", &flags.gpu_bind),
        ("gpu-locality", &flags.gpu_locality),
        ("binding", &flags.binding),
        ("binding-mode", &flags.binding_mode),
        ("mpi", &flags.mpi),
        ("property", &flags.property),
        ("reservation", &flags.reservation),
        ("dependency", &flags.dependency),
        ("begin", &flags.begin),
        ("comment", &flags.comment),
        ("chdir", &flags.chdir),
        ("export", &flags.export),
        ("signal", &flags.signal),
        ("mail-type", &flags.mail_type),
        ("mail-user", &flags.mail_user),
        ("qos", &flags.qos),
        ("array", &flags.array),
    ];
    for (name, value) in pairs {
        if let Some(v) = value {
            options.set(name, v).map_err(|e| anyhow!(e))?;
        }
    }
    for (name, on) in [
        ("threads", flags.threads),
        ("rank-cpusets", flags.rank_cpusets),
        ("system-cpus", flags.system_cpus),
        ("requeue", flags.requeue),
        ("no-requeue", flags.no_requeue),
        ("no-kill", flags.no_kill),
        ("exclusive", flags.exclusive),
    ] {
        if on {
            options.set(name, "").map_err(|e| anyhow!(e))?;
        }
    }
    let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    let cwd = std::env::current_dir().context("cannot determine the current directory")?;
    options.umask = own_umask();
    // Output directories are checked here, where the user's view of the file system is: the
    // script's directives count too (the controller reads them again).
    if let Ok((directives, warnings)) = berth_core::directives::parse_script_with(&text, flags.ignore_unsupported) {
        for w in &warnings {
            eprintln!("berth: warning: {}: {}", crate::output::terminal_safe(label), crate::output::terminal_safe(w));
        }
        let given = directives.overlay(options.clone());
        // `--chdir`: the job's working directory, from which relative outputs are taken.
        let work_dir = given.chdir.as_ref().map_or_else(|| cwd.clone(), |d| cwd.join(d));
        if given.chdir.is_some() && !work_dir.is_dir() {
            bail!("--chdir {}: no such directory", crate::output::terminal_safe(&work_dir.display().to_string()));
        }
        for (flag, path) in [("output", &given.output), ("error", &given.error)] {
            if let Some(p) = path {
                check_output_dir(flag, &work_dir.join(p))?;
            }
        }
    }
    Ok(SubmitRequest {
        script: text,
        script_name,
        options,
        env,
        cwd: cwd.to_string_lossy().into_owned(),
        hold,
        ignore_unsupported: flags.ignore_unsupported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_and_standard_input_scripts() {
        assert_eq!(
            wrap_script("echo hi; exit 3", "berth submit --wrap").unwrap(),
            "#!/bin/sh\n# This script was created by berth submit --wrap.\n\necho hi; exit 3\n"
        );
        assert!(wrap_script("  ", "x").unwrap_err().to_string().contains("needs a command"));
        assert_eq!(Source::from_arg("-".into()), Source::Stdin);
        assert_eq!(Source::from_arg("./-".into()), Source::File("./-".into()));
        let big = vec![b'#'; (MAX_SCRIPT_BYTES + 1) as usize];
        assert!(read_bounded(&big[..], "standard input").unwrap_err().to_string().contains("larger than 16 MiB"));
        assert!(read_bounded(&[0xff, 0xfe][..], "standard input").unwrap_err().to_string().contains("not UTF-8"));
        assert_eq!(read_bounded(&b"#!/bin/sh\ntrue\n"[..], "x").unwrap(), "#!/bin/sh\ntrue\n");
    }
}
