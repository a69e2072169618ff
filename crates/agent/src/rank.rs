//! Starting one rank of a step: in the job's cgroup (or the rank's sub-cpuset), bound to its
//! CPUs, as the user with their active gid and groups, in their directory, with exactly their
//! environment, stdio on pipes and the PMI socket on a known descriptor. No shell is involved.

use berth_protocol::agent::UserIdentity;
use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

pub struct RankLaunch<'a> {
    pub argv: &'a [String],
    pub env: Vec<(String, String)>,
    pub cwd: &'a str,
    pub user: &'a UserIdentity,
    /// Open cgroup.procs files to join, in order (job cgroups, then the rank's sub-cpuset);
    /// the caller keeps them open until spawn returns (one set serves every rank of a step).
    pub join_fds: Vec<RawFd>,
    pub affinity: Option<libc::cpu_set_t>,
    /// The rank's end of its PMI socketpair (kept open across exec).
    pub pmi_fd: Option<RawFd>,
    pub stdin: bool,
}

/// Spawn the rank; the caller reads its stdout/stderr pipes and waits for it.
pub fn spawn(l: RankLaunch<'_>) -> Result<tokio::process::Child, String> {
    spawn_with(l, None)
}

/// Like [`spawn`], but stdout and stderr are appended to `stdout` and `stderr` (a task of the
/// task API). The child opens them itself after dropping to the user and entering the working
/// directory: the user's permissions apply, and relative paths are relative to that directory.
pub fn spawn_to_files(l: RankLaunch<'_>, stdout: &str, stderr: &str) -> Result<tokio::process::Child, String> {
    let path = |what: &str, p: &str| CString::new(p).map_err(|_| format!("the {what} path contains a NUL byte"));
    let files = (path("output", stdout)?, path("error", stderr)?);
    spawn_with(l, Some(files))
}

fn spawn_with(l: RankLaunch<'_>, files: Option<(CString, CString)>) -> Result<tokio::process::Child, String> {
    let Some(program) = l.argv.first() else { return Err("no command to run".into()) };
    let cwd = CString::new(std::path::Path::new(l.cwd).as_os_str().as_bytes())
        .map_err(|_| "the working directory contains a NUL byte".to_string())?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&l.argv[1..]);
    // Exactly the user's environment: `PATH` in it is also where `program` is looked up.
    cmd.env_clear();
    cmd.envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd.stdin(if l.stdin { Stdio::piped() } else { Stdio::null() });
    let has_files = files.is_some();
    if has_files {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    cmd.kill_on_drop(false);
    let fds = l.join_fds;
    let (uid, gid, groups) = (l.user.uid, l.user.gid, l.user.groups.clone());
    let affinity = l.affinity;
    let pmi_fd = l.pmi_fd;
    // SAFETY: only async-signal-safe system calls on values prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            crate::spawn::enter_job_as_user(&fds, affinity.as_ref(), &groups, gid, uid, &cwd)?;
            if let Some(fd) = pmi_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
        // Registered second, so it runs as the user in `cwd`.
        if let Some((out, err)) = files {
            cmd.pre_exec(move || {
                for (path, target) in [(&out, 1), (&err, 2)] {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 || libc::dup2(fd, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                Ok(())
            });
        }
    }
    let outputs = if has_files { " or its output files" } else { "" };
    cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound if has_files => {
            format!("{program}: command not found (PATH as in your environment), or the directory of its output files does not exist")
        }
        std::io::ErrorKind::NotFound => format!("{program}: command not found (PATH as in your environment)"),
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "{program}: permission denied: not executable, not found in the PATH directories you may enter, or {}{outputs} is not accessible to you",
                l.cwd
            )
        }
        _ => format!("{program}: {e}"),
    })
}
