//! Starting one rank of a step (or a task of the task API): in the job's cgroup (or the rank's
//! sub-cpuset), bound to its CPUs, as the user with their active gid and groups, in their
//! directory, with exactly their environment, stdio on pipes (or appended to files) and the PMI
//! socket on a known descriptor. No shell is involved.
//!
//! Why not `Command` with `pre_exec`: that forces a full `fork()` of the multi-threaded agent,
//! whose page tables are copied and torn down again for every rank (about 1.5 ms of CPU each,
//! the bulk of a 1,024-rank launch). Here the child is made with `clone(CLONE_VM |
//! CLONE_VFORK)`, as glibc's `posix_spawn` does: it borrows the agent's memory until `execve`,
//! so nothing is copied. The price is discipline in the child (see [`child_main`]): raw system
//! calls only, on values prepared by the parent, and credentials changed with the raw
//! `setres[ug]id` calls (glibc's wrappers would signal the agent's other threads).

use berth_protocol::user::UserIdentity;
use std::ffi::{c_void, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

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
    /// The file mode mask it runs with: its job's (the submitter's), else 022.
    pub umask: Option<u32>,
    /// The nice value it takes before exec: the jobs' (`Priority::job_nice`, when the agent
    /// raised its own priority); None keeps the agent's.
    pub nice: Option<i32>,
}

/// A started rank or task: its pid (a child of the agent, reaped only by [`Process::wait`]),
/// its stdio pipes, and a pidfd that becomes readable when it exits.
pub struct Process {
    pid: u32,
    exited: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

impl Process {
    /// The pid while the process has not been reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Wait for the process to end and reap it. Cancel-safe; later calls return the status.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        loop {
            let mut ready = self.exited.readable().await?;
            let mut raw = 0;
            // SAFETY: waitpid on our own unreaped child; WNOHANG never blocks.
            match unsafe { libc::waitpid(self.pid as i32, &mut raw, libc::WNOHANG) } {
                0 => ready.clear_ready(),
                -1 => return Err(std::io::Error::last_os_error()),
                _ => {
                    let st = ExitStatus::from_raw(raw);
                    self.status = Some(st);
                    return Ok(st);
                }
            }
        }
    }
}

/// Spawn the rank with its stdout and stderr on pipes.
pub fn spawn(l: RankLaunch<'_>) -> Result<Process, SpawnError> {
    spawn_with(l, None)
}

/// Like [`spawn`], but stdout and stderr are appended to `stdout` and `stderr` (a task of the
/// task API). The child opens them itself after dropping to the user and entering the working
/// directory: the user's permissions apply, and relative paths are relative to that directory.
pub fn spawn_to_files(l: RankLaunch<'_>, stdout: &str, stderr: &str) -> Result<Process, SpawnError> {
    let path = |what: &str, p: &str| CString::new(p).map_err(|_| format!("the {what} path contains a NUL byte"));
    let files =
        OutputFiles { stdout: path("output", stdout)?, stderr: path("error", stderr)?, ..OutputFiles::default() };
    spawn_with(l, Some(files))
}

/// Where a batch script's stdout and stderr go (see [`spawn_script`]).
pub struct ScriptOutput<'a> {
    pub stdout: &'a str,
    pub stderr: &'a str,
    /// Append (`--open-mode=append`) rather than truncate.
    pub append: bool,
    /// Exec'd through `/proc/self/fd/N` (the agent's open binary, so the user needs no path
    /// to it): the process, now wholly the user's, is made dumpable again so that it may read
    /// its own /proc/self/fd, as any exec of a plain binary would.
    pub dumpable: bool,
}

/// Why a process did not start: the message for the user, and the errno of the failing step
/// (0 when it failed before the clone).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SpawnError {
    pub errno: i32,
    pub message: String,
}

impl From<String> for SpawnError {
    fn from(message: String) -> Self {
        SpawnError { errno: 0, message }
    }
}

/// pipe2(2) failed for a rank's standard input or output.
#[derive(Debug, thiserror::Error)]
#[error("cannot make a pipe: {0}")]
struct PipeError(std::io::Error);

impl From<PipeError> for SpawnError {
    fn from(e: PipeError) -> Self {
        SpawnError { errno: 0, message: e.to_string() }
    }
}

/// Spawn a job's batch script (or the shim that runs it) the way ranks are spawned (no fork
/// of the agent), stdin on /dev/null and stdout/stderr to its output files, opened by the
/// child as the user: truncated unless `append`, one open file when both name the same path.
pub fn spawn_script(l: RankLaunch<'_>, out: &ScriptOutput<'_>) -> Result<Process, SpawnError> {
    let path = |what: &str, p: &str| CString::new(p).map_err(|_| format!("the {what} path contains a NUL byte"));
    let files = OutputFiles {
        stdout: path("output", out.stdout)?,
        stderr: path("error", out.stderr)?,
        truncate: !out.append,
        shared: out.stdout == out.stderr,
        dumpable: out.dumpable,
    };
    spawn_with(l, Some(files))
}

/// Output files the child opens as the user after entering its directory.
#[derive(Default)]
struct OutputFiles {
    stdout: CString,
    stderr: CString,
    /// O_TRUNC, else O_APPEND.
    truncate: bool,
    /// stdout and stderr name the same file: one open file, not two racing offsets.
    shared: bool,
    /// Made dumpable after dropping to the user (see [`ScriptOutput::dumpable`]).
    dumpable: bool,
}

/// Steps of the child, to say which one failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(i32)]
enum Stage {
    Ok = 0,
    Cgroup,
    Affinity,
    Session,
    Credentials,
    Cwd,
    OutputFiles,
    Stdio,
    Exec,
}

/// Everything the child reads, prepared before the clone; `errno`/`stage` are its answer
/// (shared memory: the parent reads them once the child has exec'd or exited).
struct ChildArgs {
    join_fds: Vec<RawFd>,
    affinity: Option<libc::cpu_set_t>,
    /// The parent thread's own CPUs, given back to the child when no binding is asked for
    /// (the child is made pinned to the parent's CPU: see `clone_vfork`).
    inherited: Option<libc::cpu_set_t>,
    groups: Vec<libc::gid_t>,
    /// Whether to set `groups`: only root may (the agent is root). Started by a user (unit
    /// tests), the child keeps that user's groups, and the setresuid below refuses any other
    /// user, so nothing is started as someone else.
    set_groups: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    cwd: CString,
    files: Option<OutputFiles>,
    /// Descriptors to put on 0, 1, 2 (-1: leave; with `files`, 1 and 2 are opened instead).
    stdio: [RawFd; 3],
    keep_fd: Option<RawFd>,
    umask: libc::mode_t,
    nice: Option<i32>,
    /// Paths to try in order (the PATH search), each a full or relative path.
    candidates: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    errno: i32,
    stage: Stage,
}

fn spawn_with(l: RankLaunch<'_>, files: Option<OutputFiles>) -> Result<Process, SpawnError> {
    let Some(program) = l.argv.first() else { return Err(SpawnError::from("no command to run".to_string())) };
    let nul = |what: &str| format!("{what} contains a NUL byte");
    let cwd =
        CString::new(std::path::Path::new(l.cwd).as_os_str().as_bytes()).map_err(|_| nul("the working directory"))?;
    let argv_c: Vec<CString> =
        l.argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().map_err(|_| nul("an argument"))?;
    let env_c: Vec<CString> = l
        .env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<_, _>>()
        .map_err(|_| nul("an environment variable"))?;
    // Exactly the user's environment: its PATH is also where `program` is looked up.
    let path_var = l.env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str());
    let candidates = search_path(program, path_var).map_err(|_| nul("the command"))?;

    let pipe_pair = || -> Result<(OwnedFd, OwnedFd), PipeError> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two new descriptors, owned here from now on.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(PipeError(std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are not owned elsewhere.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    };
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    let stdin_pipe = if l.stdin { Some(pipe_pair()?) } else { None };
    let out_pipes = if files.is_none() { Some((pipe_pair()?, pipe_pair()?)) } else { None };
    let stdio = [
        stdin_pipe.as_ref().map_or(null.as_raw_fd(), |(r, _)| r.as_raw_fd()),
        out_pipes.as_ref().map_or(null.as_raw_fd(), |((_, w), _)| w.as_raw_fd()),
        out_pipes.as_ref().map_or(null.as_raw_fd(), |(_, (_, w))| w.as_raw_fd()),
    ];
    let has_files = files.is_some();
    let mut args = ChildArgs {
        join_fds: l.join_fds,
        affinity: l.affinity,
        inherited: None,
        groups: l.user.groups.clone(),
        // SAFETY: geteuid cannot fail.
        set_groups: unsafe { libc::geteuid() } == 0,
        uid: l.user.uid,
        gid: l.user.gid,
        cwd,
        files,
        stdio,
        keep_fd: l.pmi_fd,
        umask: (l.umask.unwrap_or(0o022) & 0o777) as libc::mode_t,
        nice: l.nice,
        argv: null_terminated(&argv_c),
        envp: null_terminated(&env_c),
        candidates,
        errno: 0,
        stage: Stage::Ok,
    };
    berth_protocol::probe::mark("agent rank clone");
    let pid = clone_vfork(&mut args).map_err(|e| format!("cannot start {program}: {e}"))?;
    if args.stage != Stage::Ok {
        let mut raw = 0;
        // SAFETY: reap the child that failed before exec (it has exited: CLONE_VFORK).
        unsafe { libc::waitpid(pid, &mut raw, 0) };
        return Err(SpawnError {
            errno: args.errno,
            message: explain(program, l.cwd, has_files, args.stage, args.errno),
        });
    }
    berth_protocol::probe::mark("agent rank cloned");
    // SAFETY: pidfd_open on our unreaped child; the result is a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    if pidfd < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: our child, not reaped: kill and reap it rather than lose track of it.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Err(format!("cannot watch {program} (pidfd_open): {e}").into());
    }
    // SAFETY: a new descriptor owned from here on, registered once and closed only by `exited`.
    let exited = unsafe { AsyncFd::register(OwnedFd::from_raw_fd(pidfd)) }
        .map_err(|e| format!("cannot watch {program}: {}", e.into_parts().1))?;
    let stdin = match stdin_pipe {
        Some((_, w)) => Some(pipe::Sender::from_owned_fd(w).map_err(|e| format!("stdin pipe: {e}"))?),
        None => None,
    };
    let (stdout, stderr) = match out_pipes {
        Some(((out, _), (err, _))) => (
            Some(pipe::Receiver::from_owned_fd(out).map_err(|e| format!("stdout pipe: {e}"))?),
            Some(pipe::Receiver::from_owned_fd(err).map_err(|e| format!("stderr pipe: {e}"))?),
        ),
        None => (None, None),
    };
    Ok(Process { pid: pid as u32, exited, status: None, stdin, stdout, stderr })
}

/// The paths `execve` tries: the program itself if it names a path, else each PATH entry
/// (an empty entry is the current directory, as execvp does). The first entry that holds a
/// regular file (as this root agent sees it) is moved to the front, so the child, which the
/// agent waits for until it has exec'd, usually makes one `execve` and not one per PATH
/// entry; the outcome is execvp's: if that file fails for the user (EACCES), the child goes
/// on through the others in PATH order.
fn search_path(program: &str, path: Option<&str>) -> Result<Vec<CString>, std::ffi::NulError> {
    if program.contains('/') {
        return Ok(vec![CString::new(program)?]);
    }
    let path = path.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    let mut candidates: Vec<CString> = path
        .split(':')
        .map(|dir| if dir.is_empty() { CString::new(program) } else { CString::new(format!("{dir}/{program}")) })
        .collect::<Result<_, _>>()?;
    let is_file = |c: &CString| std::fs::metadata(std::ffi::OsStr::from_bytes(c.as_bytes())).is_ok_and(|m| m.is_file());
    if let Some(found) = candidates.iter().position(is_file) {
        let first = candidates.remove(found);
        candidates.insert(0, first);
    }
    Ok(candidates)
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// The user-facing message for a child that failed at `stage` with `errno`.
fn explain(program: &str, cwd: &str, has_files: bool, stage: Stage, errno: i32) -> String {
    let e = std::io::Error::from_raw_os_error(errno);
    let outputs = if has_files { " or its output files" } else { "" };
    match stage {
        Stage::Exec if errno == libc::ENOENT => format!("{program}: command not found (PATH as in your environment)"),
        Stage::Exec if errno == libc::EACCES => format!(
            "{program}: permission denied: not executable, or not in a PATH directory you may enter, or {cwd}{outputs} is not accessible to you"
        ),
        Stage::Exec => format!("{program}: {e}"),
        Stage::Cwd => format!("cannot enter the working directory {cwd} as you: {e}"),
        Stage::OutputFiles => format!("cannot open the output files (in {cwd}) as you: {e}; does their directory exist?"),
        Stage::Cgroup => format!("cannot join the job's cgroup: {e}"),
        Stage::Affinity => format!("cannot bind to the rank's CPUs: {e}"),
        Stage::Credentials => format!("cannot take your user and group ids: {e}"),
        Stage::Session | Stage::Stdio | Stage::Ok => format!("cannot start {program}: {e}"),
    }
}

const CHILD_STACK: usize = 64 * 1024;

/// clone(CLONE_VM | CLONE_VFORK) into [`child_main`], with every signal blocked around it so
/// no handler of the agent runs on the child's stack. Returns once the child has exec'd or
/// exited (its pid, not yet reaped).
///
/// The calling thread is pinned to its CPU for the clone, so the child starts there: this CPU
/// is the one that frees up (we wait), whereas the scheduler's choice for a new task is the
/// least loaded CPU at that instant, often one busy with a rank started just before, where the
/// child would wait its turn (~1 ms on a 2-CPU host). The child takes back the thread's CPUs
/// (or its binding) before exec; the thread gets them back when clone returns.
fn clone_vfork(args: &mut ChildArgs) -> std::io::Result<libc::pid_t> {
    let pinned = pin_to_current_cpu();
    args.inherited = pinned;
    let result = clone_vfork_unpinned(args);
    if let Some(mask) = &pinned {
        // SAFETY: a valid mask of the CPUs this thread had a moment ago.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask) };
    }
    result
}

/// Pin the calling thread to the CPU it runs on; its previous CPUs, if that worked.
fn pin_to_current_cpu() -> Option<libc::cpu_set_t> {
    // SAFETY: plain calls on this thread with masks we own.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let cpu = libc::sched_getcpu();
        if cpu < 0 || libc::CPU_COUNT(&old) <= 1 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        (libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0).then_some(old)
    }
}

fn clone_vfork_unpinned(args: &mut ChildArgs) -> std::io::Result<libc::pid_t> {
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: the stack is ours and outlives the child's use of it (CLONE_VFORK: the child is
    // done with it when clone returns); signal masks are restored before returning.
    unsafe {
        let top = (stack.as_mut_ptr().add(CHILD_STACK) as usize & !15) as *mut c_void;
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            args as *mut ChildArgs as *mut c_void,
        );
        let err = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        drop(stack);
        if pid < 0 {
            return Err(err);
        }
        Ok(pid)
    }
}

/// The child, on the agent's memory until exec: raw system calls only, no allocation, no
/// locks, nothing written but `errno`/`stage` in its own `ChildArgs`.
extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's ChildArgs, untouched by anyone else until we exec or exit
    // (the parent thread waits: CLONE_VFORK).
    let a = unsafe { &mut *(arg as *mut ChildArgs) };
    let stage = match unsafe { prepare(a) } {
        Ok(()) => unsafe { exec(a) },
        Err(stage) => stage,
    };
    a.stage = stage;
    // SAFETY: errno of this (borrowed) thread, then leave without running any exit handler.
    unsafe {
        a.errno = *libc::__errno_location();
        libc::_exit(127)
    }
}

/// Everything between clone and exec; the failing stage on error (errno says why).
unsafe fn prepare(a: &ChildArgs) -> Result<(), Stage> {
    let check = |ok: bool, stage: Stage| if ok { Ok(()) } else { Err(stage) };
    // Handlers of the agent must not run here, and what the agent ignores (SIGHUP when it was
    // started under nohup, SIGPIPE by Rust's runtime) is not the job's: every signal at its
    // default, as a login shell would give it (a `trap ... HUP` in a script works; a shell
    // cannot trap a signal ignored on entry).
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction != libc::SIG_DFL {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
    for &fd in &a.join_fds {
        check(libc::write(fd, b"0".as_ptr() as *const c_void, 1) == 1, Stage::Cgroup)?;
    }
    // Its own session and process group, so signals reach what it forks.
    check(libc::setsid() >= 0, Stage::Session)?;
    for (target, &fd) in a.stdio.iter().enumerate() {
        if fd >= 0 {
            check(libc::dup2(fd, target as i32) >= 0, Stage::Stdio)?;
        }
    }
    // Raw calls: they change this task only (glibc's wrappers would broadcast to the agent).
    if a.set_groups {
        check(libc::syscall(libc::SYS_setgroups, a.groups.len(), a.groups.as_ptr()) == 0, Stage::Credentials)?;
    }
    check(libc::syscall(libc::SYS_setresgid, a.gid, a.gid, a.gid) == 0, Stage::Credentials)?;
    // The binding as late as can be: it moves this child off the agent's CPU (idle while the
    // agent waits for the exec) to the rank's, which may be busy; little is left to run there,
    // at the agent's priority until the nice value below. After the cgroups: the kernel keeps
    // an affinity within the job's cpuset.
    if let Some(mask) = &a.affinity {
        check(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask) == 0, Stage::Affinity)?;
    } else if let Some(mask) = &a.inherited {
        // Undo the pin of `clone_vfork` (the kernel would keep it within a cpuset holding that
        // CPU). Best effort: it fails only for an agent whose CPUs are all outside the job's
        // cpuset, and then the cpuset's CPUs replaced the pin when the child joined it.
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask);
    }
    // The jobs' nice value, not the agent's (crate::priority); while still root, which may
    // be needed to set it.
    check(crate::priority::enter_job_nice(a.nice), Stage::Session)?;
    check(libc::syscall(libc::SYS_setresuid, a.uid, a.uid, a.uid) == 0, Stage::Credentials)?;
    check(libc::chdir(a.cwd.as_ptr()) == 0, Stage::Cwd)?;
    libc::umask(a.umask);
    if let Some(f) = &a.files {
        let mode = if f.truncate { libc::O_TRUNC } else { libc::O_APPEND };
        for (path, target) in [(&f.stdout, 1), (&f.stderr, 2)] {
            if target == 2 && f.shared {
                check(libc::dup2(1, 2) >= 0, Stage::OutputFiles)?;
                break;
            }
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | mode | libc::O_CLOEXEC, 0o666);
            check(fd >= 0 && libc::dup2(fd, target) >= 0, Stage::OutputFiles)?;
            libc::close(fd);
        }
        // The mm is shared with the agent until exec: this sets the agent's flag as well,
        // which is a root process's default anyway (the setresuid above had cleared it).
        if f.dumpable {
            check(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) == 0, Stage::Session)?;
        }
    }
    if let Some(fd) = a.keep_fd {
        check(libc::fcntl(fd, libc::F_SETFD, 0) == 0, Stage::Stdio)?;
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    Ok(())
}

/// Try each candidate path; returns only on failure (EACCES wins over "not found", as execvp).
unsafe fn exec(a: &ChildArgs) -> Stage {
    let mut denied = false;
    for path in &a.candidates {
        libc::execve(path.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
        match *libc::__errno_location() {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => {}
            _ => return Stage::Exec,
        }
    }
    *libc::__errno_location() = if denied { libc::EACCES } else { libc::ENOENT };
    Stage::Exec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_entry_holding_the_program_is_tried_first_then_the_rest_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("b/prog"), "").unwrap();
        std::fs::create_dir(dir.path().join("c")).unwrap();
        std::fs::create_dir(dir.path().join("c/prog")).unwrap(); // a directory is not it
        let path = format!("{d}/a:{d}/c:{d}/b:");
        let got: Vec<String> =
            search_path("prog", Some(&path)).unwrap().iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let want = [format!("{d}/b/prog"), format!("{d}/a/prog"), format!("{d}/c/prog"), "prog".to_string()];
        assert_eq!(got, want);
        assert_eq!(search_path("./x", Some(&path)).unwrap(), vec![CString::new("./x").unwrap()]);
        let none: Vec<String> = search_path("nothing-here", Some(&format!("{d}/a:{d}/c")))
            .unwrap()
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        assert_eq!(none, [format!("{d}/a/nothing-here"), format!("{d}/c/nothing-here")]);
    }

    fn me() -> UserIdentity {
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        UserIdentity { name: "me".into(), uid, gid, groups: vec![gid] }
    }

    fn launch<'a>(argv: &'a [String], user: &'a UserIdentity, cwd: &'a str) -> RankLaunch<'a> {
        RankLaunch {
            argv,
            env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("GREETING".into(), "hi there".into())],
            cwd,
            user,
            join_fds: vec![],
            affinity: None,
            pmi_fd: None,
            stdin: true,
            umask: None,
            nice: None,
        }
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn runs_with_exactly_the_given_environment_stdio_and_directory() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let user = me();
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().to_str().unwrap().to_string();
        let a = argv(&["sh", "-c", "read line; echo \"$line $GREETING $(pwd)\"; env | wc -l; echo err >&2; exit 3"]);
        let mut p = spawn(launch(&a, &user, &cwd)).unwrap();
        let mut stdin = p.stdin.take().unwrap();
        stdin.write_all(b"hello\n").await.unwrap();
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        p.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        p.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
        let status = p.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        let real = std::fs::canonicalize(&cwd).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("hello hi there {}", real.display()));
        // PATH, GREETING, and what sh itself adds (PWD, SHLVL, _): nothing of the agent's.
        assert!(lines[1].trim().parse::<u32>().unwrap() <= 5, "{out}");
        assert_eq!(err, "err\n");
        assert_eq!(p.id(), None, "reaped");
        assert_eq!(p.wait().await.unwrap().code(), Some(3), "status kept");
    }

    #[tokio::test]
    async fn a_missing_command_or_directory_is_a_clear_error_and_nothing_is_left() {
        let user = me();
        let a = argv(&["no-such-command-here"]);
        let e = spawn(launch(&a, &user, "/")).err().unwrap().to_string();
        assert!(e.contains("command not found"), "{e}");
        let a = argv(&["true"]);
        let e = spawn(launch(&a, &user, "/no/such/dir")).err().unwrap().to_string();
        assert!(e.contains("cannot enter the working directory /no/such/dir"), "{e}");
        let a = argv(&["/etc/passwd"]);
        let e = spawn(launch(&a, &user, "/")).err().unwrap().to_string();
        assert!(e.contains("permission denied"), "{e}");
        // Failed children were reaped: no zombie child that never exec'd (its name is still
        // this thread's) remains. Not waitpid(-1): it would reap the children of the tests
        // running beside this one.
        let me = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        let zombies = || {
            let mut found = vec![];
            for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for pid in children.split_whitespace() {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
                    if zombie && std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() == me {
                        found.push(pid.to_string());
                    }
                }
            }
            found
        };
        // A test beside this one may hold such a child for a moment (its own failed spawn, not
        // reaped yet); one of ours would stay.
        let mut left = zombies();
        for _ in 0..50 {
            if left.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            left = zombies();
        }
        assert!(left.is_empty(), "unreaped children {left:?}");
    }

    #[tokio::test]
    async fn a_batch_script_truncates_or_appends_and_shares_one_output_file() {
        let user = me();
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().to_str().unwrap().to_string();
        // As the agent starts a batch script: stdin on /dev/null.
        let script = |a| RankLaunch { stdin: false, ..launch(a, &user, &cwd) };
        std::fs::write(dir.path().join("job.out"), "an older run's output, longer than this one\n").unwrap();
        let a = argv(&["sh", "-c", "echo 1; echo 2 >&2; echo 3; read x || echo stdin-empty"]);
        let out = ScriptOutput { stdout: "job.out", stderr: "job.out", append: false, dumpable: false };
        let mut p = spawn_script(script(&a), &out).unwrap();
        assert!(p.stdin.is_none() && p.stdout.is_none());
        assert!(p.wait().await.unwrap().success());
        // Truncated, and one open file: the lines in the order written, none overwritten.
        assert_eq!(std::fs::read_to_string(dir.path().join("job.out")).unwrap(), "1\n2\n3\nstdin-empty\n");
        let out = ScriptOutput { stdout: "job.out", stderr: "job.err", append: true, dumpable: false };
        let a = argv(&["sh", "-c", "echo 4; echo e >&2"]);
        assert!(spawn_script(script(&a), &out).unwrap().wait().await.unwrap().success());
        assert_eq!(std::fs::read_to_string(dir.path().join("job.out")).unwrap(), "1\n2\n3\nstdin-empty\n4\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("job.err")).unwrap(), "e\n");
        // A missing program: the stage and errno, for the agent's message and its ETXTBSY retry.
        let a = argv(&[&format!("{cwd}/no-such-script")]);
        let Err(e) = spawn_script(script(&a), &out) else { panic!("a missing script started") };
        assert_eq!(e.errno, libc::ENOENT, "{e:?}");
        assert!(e.message.contains("command not found"), "{e:?}");
    }

    #[tokio::test]
    async fn signals_and_files_and_kept_descriptor() {
        let user = me();
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().to_str().unwrap().to_string();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = theirs.as_raw_fd();
        // bash: dash cannot redirect to descriptors above 9.
        let a = argv(&["bash", "-c", &format!("echo kept >&{fd}; echo out; echo err >&2")]);
        let mut l = launch(&a, &user, &cwd);
        l.pmi_fd = Some(fd);
        l.stdin = false;
        let mut p = spawn_to_files(l, "o.txt", "e.txt").unwrap();
        drop(theirs);
        assert!(p.stdout.is_none() && p.stdin.is_none());
        assert!(p.wait().await.unwrap().success());
        let mut got = String::new();
        use std::io::Read;
        (&ours).read_to_string(&mut got).unwrap();
        assert_eq!(got, "kept\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("o.txt")).unwrap(), "out\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("e.txt")).unwrap(), "err\n");
        // A process in its own session gets default dispositions: SIGTERM ends it.
        let a = argv(&["sleep", "30"]);
        let mut p = spawn(launch(&a, &user, &cwd)).unwrap();
        let pid = p.id().unwrap() as i32;
        // SAFETY: our child, not reaped yet.
        assert_eq!(unsafe { libc::getsid(pid) }, pid, "its own session");
        unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(p.wait().await.unwrap().signal(), Some(libc::SIGTERM));
        // No signal ignored, though this (Rust) process ignores SIGPIPE and, here, SIGHUP (as an
        // agent started under nohup would): a writer to a closed pipe dies of SIGPIPE, and a
        // script's `trap ... HUP` works, as under any shell.
        let a = argv(&["sh", "-c", "sleep 0.2; grep SigIgn /proc/self/status"]);
        // SAFETY: a disposition of this test process, put back right after the spawn (no test
        // here expects SIGHUP).
        let before = unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let spawned = spawn(launch(&a, &user, &cwd));
        unsafe { libc::signal(libc::SIGHUP, before) };
        let mut p = spawned.unwrap();
        let mut out = String::new();
        use tokio::io::AsyncReadExt;
        p.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        assert!(p.wait().await.unwrap().success());
        let ignored = u64::from_str_radix(out.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
        // Signals 32 and 33 are the C library's own (glibc's sigaction refuses them): left out.
        let libc_own = 0b11u64 << 31;
        assert_eq!(ignored & !libc_own, 0, "no signal is ignored in a rank (SIGPIPE, SIGHUP were in the agent): {out}");
    }

    fn allowed_cpus(status: &str) -> String {
        status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("?").trim().to_string()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_cpu_pin_around_clone_is_undone_in_the_child_and_in_the_caller() {
        use tokio::io::AsyncReadExt;
        let user = me();
        let mine = allowed_cpus(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
        let a = argv(&["cat", "/proc/self/status"]);
        let mut p = spawn(launch(&a, &user, "/")).unwrap();
        let mut out = String::new();
        p.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        assert!(p.wait().await.unwrap().success());
        assert_eq!(allowed_cpus(&out), mine, "an unbound rank runs where its parent may");
        let after = allowed_cpus(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
        assert_eq!(after, mine, "the spawning thread got its CPUs back");
        // A binding still wins over the parent's CPUs.
        // SAFETY: a mask we own.
        let mut cpu0: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(0, &mut cpu0) };
        let mut l = launch(&a, &user, "/");
        l.affinity = Some(cpu0);
        let mut p = spawn(l).unwrap();
        let mut out = String::new();
        p.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        assert!(p.wait().await.unwrap().success());
        assert_eq!(allowed_cpus(&out), "0");
    }
}
