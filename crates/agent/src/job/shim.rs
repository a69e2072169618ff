//! The per-job shim (see [`berth_shim`], its own small crate, so that the `berth` client
//! can be it), and which binary the agent starts as the shim.

pub use berth_shim::*;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The binary to start as every batch script's shim, opened (close-on-exec) so that it is
/// exec'd as `/proc/self/fd/N` and the job's user needs no search permission on its directory.
///
/// The `berth` client beside `agent_exe` (the running `berthd`) when it is a shim of this
/// contract ([`CHECK_ARG`] answered with [`check_reply`]), has the same owner as the agent's
/// binary and is writable by no one else: it starts in a fraction of the time `berthd` takes
/// (a smaller executable without the daemon's libraries, static in release builds), and a
/// shim starts for every batch job. Else `agent_exe` itself, which always is one.
pub fn open_binary(agent_exe: &Path) -> std::io::Result<std::fs::File> {
    if let Some(client) = agent_exe.parent().map(|d| d.join("berth")) {
        match open_client(agent_exe, &client) {
            Ok(f) => return Ok(f),
            Err(why) => tracing::debug!(client = %client.display(), "the job shim is this binary: {why}"),
        }
    }
    std::fs::File::open(agent_exe)
}

/// Why the `berth` client beside the agent does not serve as the shim (logged; the agent's
/// own binary serves instead).
#[derive(Debug, thiserror::Error)]
enum NotAShim {
    #[error("cannot open it: {0}")]
    Open(std::io::Error),
    #[error("{0}")]
    Metadata(std::io::Error),
    #[error("not an executable of the agent binary's owner writable by no one else (uid {uid}, mode {mode:o})")]
    Unsafe { uid: u32, mode: u32 },
    #[error("cannot run it: {0}")]
    Run(std::io::Error),
    #[error("it did not answer within {0:?}")]
    Silent(std::time::Duration),
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
    #[error("it is no shim of this version ({0})")]
    OtherVersion(std::process::ExitStatus),
}

/// `client`, opened, if it may serve as the shim (see [`open_binary`]).
fn open_client(agent_exe: &Path, client: &Path) -> Result<std::fs::File, NotAShim> {
    let file = std::fs::File::open(client).map_err(NotAShim::Open)?;
    let meta = file.metadata().map_err(NotAShim::Metadata)?;
    let ours = std::fs::metadata(agent_exe).map_err(NotAShim::Metadata)?;
    if !meta.is_file() || meta.uid() != ours.uid() || meta.mode() & 0o022 != 0 || meta.mode() & 0o111 == 0 {
        return Err(NotAShim::Unsafe { uid: meta.uid(), mode: meta.mode() & 0o7777 });
    }
    // The very file opened answers (a rename in between changes nothing).
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let mut child = std::process::Command::new(&path)
        .arg(SHIM_ARG)
        .arg(CHECK_ARG)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(NotAShim::Run)?;
    // A shim answers at once; anything else does not hold up the agent's start.
    let deadline = std::time::Instant::now() + CHECK_DEADLINE;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(NotAShim::Silent(CHECK_DEADLINE));
            }
            Err(e) => return Err(NotAShim::Wait(e)),
        }
    };
    let mut answer = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_end(&mut answer);
    }
    if !status.success() || answer != check_reply().as_bytes() {
        return Err(NotAShim::OtherVersion(status));
    }
    Ok(file)
}

/// How long the `berth` beside the agent may take to answer [`CHECK_ARG`].
const CHECK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip() {
        for s in [Status::Code(0), Status::Code(7), Status::Code(255), Status::Signal(9), Status::LaunchError(13)] {
            assert_eq!(Status::decode(&s.encode()), Some(s), "{}", s.encode());
        }
        assert_eq!(Status::Code(7).encode(), "{\"exit_code\":7}\n");
        assert_eq!(Status::Signal(15).encode(), "{\"signal\":15}\n");
        assert_eq!(Status::decode("{\"exit_code\": 3}"), Some(Status::Code(3)));
        for bad in ["", "{}", "{\"exit_code\":x}", "{\"signal\":0}", "{\"other\":1}", "exit_code:1"] {
            assert_eq!(Status::decode(bad), None, "{bad}");
        }
    }

    /// Which file `open_binary` chose, by inode.
    fn same_file(f: &std::fs::File, path: &Path) -> bool {
        f.metadata().unwrap().ino() == std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn the_agent_binary_is_the_shim_unless_a_checked_client_is_beside_it() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let agent = tmp.path().join("berthd");
        std::fs::write(&agent, b"agent").unwrap();
        // No client beside it.
        assert!(same_file(&open_binary(&agent).unwrap(), &agent));
        // A client that is no shim of this version (an older berth: a usage error).
        let client = tmp.path().join("berth");
        std::fs::copy("/bin/false", &client).unwrap();
        assert!(same_file(&open_binary(&agent).unwrap(), &agent));
        // One that answers anything else on stdout.
        std::fs::copy("/bin/echo", &client).unwrap();
        assert!(open_client(&agent, &client).unwrap_err().to_string().contains("no shim"));
        assert!(same_file(&open_binary(&agent).unwrap(), &agent));
        // Writable by its group: never run, whatever it is.
        std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(open_client(&agent, &client).unwrap_err().to_string().contains("writable"));
        assert!(same_file(&open_binary(&agent).unwrap(), &agent));
    }

    #[test]
    fn read_from_spool() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(Status::read(tmp.path()), None);
        std::fs::write(tmp.path().join(STATUS_FILE), Status::Signal(15).encode()).unwrap();
        assert_eq!(Status::read(tmp.path()), Some(Status::Signal(15)));
    }
}
