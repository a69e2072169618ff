//! The per-job shim: the batch script's parent, so that its exit status outlives the agent.
//!
//! The agent starts `<shim binary> __berth-shim <status file> <script>` instead of the
//! script, with the job's setup (cgroup, user, session, cwd, environment, output files). The
//! shim binary is the `berth` client beside the agent's `berthd` when it answers
//! [`CHECK_ARG`] with [`check_reply`] (it starts faster: no daemon libraries, and a static,
//! non-relocated executable in release builds), else `berthd` itself; both run [`main`]
//! for [`SHIM_ARG`] before anything else. The shim starts the script, waits for it, writes its
//! exit status to `<spool>/exit_status` (in place: a part of it never decodes) and ends the same way: the same exit
//! code, or killed by the same signal. An agent that is alive sees the script's status as the
//! shim's; an agent restarted while the job ran (re-adoption, see the agent's `adopt.rs`)
//! waits for the shim with a pidfd and reads the file.
//!
//! The shim is accounted in the job's cgroup: it uses only std and libc, no runtime, and
//! allocates next to nothing. It lives here, in a crate both binaries link, so that the client
//! need not link the agent (and its topology libraries) to be the shim.

use std::ffi::OsString;
use std::io::Write;

/// The hidden first argument of `berth` and `berthd` that runs [`main`].
pub const SHIM_ARG: &str = "__berth-shim";
/// `<binary> __berth-shim --check` prints [`check_reply`] and exits 0: how the agent tells a
/// `berth` beside it that is a shim of this format from an older one (which has no shim).
pub const CHECK_ARG: &str = "--check";
/// The version of the shim's contract (its arguments, the status file): bumped when it changes.
const SHIM_VERSION: u32 = 1;

/// What [`CHECK_ARG`] prints.
pub fn check_reply() -> String {
    format!("berth-shim {SHIM_VERSION}\n")
}

/// The status file's name in the job's spool directory.
pub const STATUS_FILE: &str = "exit_status";
/// The shim's exit code when the script could not be started (as shells do).
const CANNOT_EXEC: i32 = 127;

/// How the batch script ended, as the shim records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Code(i32),
    Signal(i32),
    /// The script could not be started: the errno of the attempt.
    LaunchError(i32),
}

impl Status {
    /// `{"exit_code":N}`, `{"signal":N}` or `{"launch_error":ERRNO}`.
    pub fn encode(self) -> String {
        match self {
            Status::Code(c) => format!("{{\"exit_code\":{c}}}\n"),
            Status::Signal(s) => format!("{{\"signal\":{s}}}\n"),
            Status::LaunchError(e) => format!("{{\"launch_error\":{e}}}\n"),
        }
    }

    /// The reverse of [`Status::encode`]; None for anything else (a file the job's user may
    /// have changed is not trusted beyond its shape).
    pub fn decode(text: &str) -> Option<Status> {
        let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
        let (key, value) = inner.split_once(':')?;
        let value: i32 = value.trim().parse().ok()?;
        match key.trim() {
            "\"exit_code\"" => Some(Status::Code(value)),
            "\"signal\"" if value > 0 && value < 65 => Some(Status::Signal(value)),
            "\"launch_error\"" => Some(Status::LaunchError(value)),
            _ => None,
        }
    }

    /// Read the status file of a job's spool directory; None if absent, malformed, or not a
    /// plain file. The job's processes may replace it after the shim is gone: a FIFO is never
    /// waited on (O_NONBLOCK), a symbolic link never followed, at most 64 bytes are read.
    pub fn read(spool: &std::path::Path) -> Option<Status> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(spool.join(STATUS_FILE))
            .ok()?;
        if !file.metadata().ok()?.file_type().is_file() {
            return None;
        }
        let mut text = String::new();
        file.take(64).read_to_string(&mut text).ok()?;
        Status::decode(&text)
    }
}

/// Signals berth and users send to the whole job (`berth signal`, cancel, walltime): the shim
/// lets them pass to the script and outlives them. A handler (not SIG_IGN, which exec would
/// keep) is reset to the default in the script by exec.
const PASSED: [libc::c_int; 11] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGWINCH,
];

extern "C" fn ignore(_: libc::c_int) {}

/// `berth __berth-shim <status file> <script>`: never returns.
pub fn main(args: &[OsString]) -> ! {
    if args.len() == 1 && args[0] == CHECK_ARG {
        let ok = std::io::stdout().write_all(check_reply().as_bytes()).and_then(|_| std::io::stdout().flush());
        std::process::exit(if ok.is_ok() { 0 } else { 1 });
    }
    let (Some(status_file), Some(script)) = (args.first(), args.get(1)) else {
        let _ = writeln!(std::io::stderr(), "berth: {SHIM_ARG} needs a status file and a script");
        std::process::exit(2);
    };
    for sig in PASSED {
        // SAFETY: installing a handler that does nothing; sigaction with a zeroed mask.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    let status = match spawn(script) {
        Ok(mut child) => match child.wait() {
            Ok(st) => {
                use std::os::unix::process::ExitStatusExt;
                match (st.code(), st.signal()) {
                    (Some(c), _) => Status::Code(c),
                    (None, Some(s)) => Status::Signal(s),
                    (None, None) => Status::Code(CANNOT_EXEC),
                }
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "berth: lost track of the batch script: {e}");
                Status::Code(CANNOT_EXEC)
            }
        },
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "berth: cannot start the batch script: {e}");
            Status::LaunchError(e.raw_os_error().unwrap_or(libc::ENOEXEC))
        }
    };
    write_status(std::path::Path::new(status_file), status);
    match status {
        Status::Code(c) => std::process::exit(c),
        Status::LaunchError(_) => std::process::exit(CANNOT_EXEC),
        Status::Signal(s) => die_of(s),
    }
}

/// Write the status file in place, with one write: no temporary file and rename, since a part
/// of it never decodes ([`Status::decode`] needs the closing brace, written last) and the
/// agent reads it only once the shim is gone. Anything but a plain file the script may have
/// left in its place (a symbolic link, a FIFO) is replaced, never written through or waited on.
fn write_status(path: &std::path::Path, status: Status) {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |new: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        if new {
            o.create_new(true);
        } else {
            o.create(true).truncate(true);
        }
        o.open(path)
    };
    let plain = open(false).ok().filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_file()));
    let file = match plain {
        Some(f) => Ok(f),
        None => {
            let _ = std::fs::remove_file(path);
            open(true)
        }
    };
    if let Ok(mut f) = file {
        let _ = f.write_all(status.encode().as_bytes());
    }
}

/// Start the script with everything inherited; retry briefly on ETXTBSY (another child of
/// the agent, forked while the agent wrote the script, may hold it open until its own exec).
fn spawn(script: &OsString) -> std::io::Result<std::process::Child> {
    let mut attempt = 0;
    loop {
        match std::process::Command::new(script).spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 50 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            other => return other,
        }
    }
}

/// End killed by `sig`, as the script was (without a core dump of the shim).
fn die_of(sig: libc::c_int) -> ! {
    // SAFETY: plain system calls on this process.
    unsafe {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // A signal whose default is not to end the process (it could not have killed the script).
    std::process::exit(128 + sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("berth-shim-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    /// The status replaces a longer one in place, and nothing but the status file is made.
    #[test]
    fn the_status_is_written_in_place() {
        let dir = scratch("in-place");
        let path = dir.join(STATUS_FILE);
        std::fs::write(&path, "{\"launch_error\":2}\n{\"signal\":9}\n").unwrap();
        write_status(&path, Status::Code(3));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"exit_code\":3}\n");
        assert_eq!(Status::read(&dir), Some(Status::Code(3)));
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [STATUS_FILE]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What a write cut short leaves (any prefix of the encoding) never decodes as a status.
    #[test]
    fn no_part_of_a_status_decodes() {
        for s in [Status::Code(0), Status::Code(127), Status::Signal(9), Status::LaunchError(13)] {
            let text = s.encode();
            let whole = text.trim_end().len();
            for cut in 0..whole {
                assert_eq!(Status::decode(&text[..cut]), None, "{:?}", &text[..cut]);
            }
            assert_eq!(Status::decode(&text[..whole]), Some(s));
        }
    }

    /// A symbolic link or a FIFO the script left as the status file is replaced by the status,
    /// not written through nor waited on.
    #[test]
    fn a_link_or_a_fifo_in_its_place_is_replaced() {
        let dir = scratch("link");
        let target = dir.join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        std::os::unix::fs::symlink(&target, dir.join(STATUS_FILE)).unwrap();
        write_status(&dir.join(STATUS_FILE), Status::Code(4));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
        assert_eq!(Status::read(&dir), Some(Status::Code(4)));
        std::fs::remove_file(dir.join(STATUS_FILE)).unwrap();
        let fifo = std::ffi::CString::new(dir.join(STATUS_FILE).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        write_status(&dir.join(STATUS_FILE), Status::Signal(9)); // returns: no reader awaited
        assert!(std::fs::symlink_metadata(dir.join(STATUS_FILE)).unwrap().file_type().is_file());
        assert_eq!(Status::read(&dir), Some(Status::Signal(9)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO or a symbolic link the job left as the status file is no status, and reading it
    /// never blocks (the agent reads it as root when it adopts a job).
    #[test]
    fn a_fifo_or_link_is_no_status_and_never_blocks() {
        let dir = scratch("read-odd");
        let path = dir.join(STATUS_FILE);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(Status::read(&dir), None);
        std::fs::remove_file(&path).unwrap();
        let target = dir.join("elsewhere");
        std::fs::write(&target, Status::Code(0).encode()).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert_eq!(Status::read(&dir), None);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, Status::Signal(9).encode()).unwrap();
        assert_eq!(Status::read(&dir), Some(Status::Signal(9)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
