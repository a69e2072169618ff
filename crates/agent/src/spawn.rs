//! Starting a user's process: in the job's cgroup, as the user, in a new session.
//!
//! Everything the child does between fork and exec is a plain system call on values prepared
//! before the fork (no allocation, no locks), since the agent is multi-threaded.

use berth_protocol::agent::UserIdentity;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Everything the child needs, prepared in the parent.
pub struct ChildSetup {
    pub join_files: Vec<File>,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub cwd: CString,
    pub stdout: CString,
    pub stderr: CString,
    /// stdout and stderr name the same file: share one open file, not two racing offsets.
    pub same_output: bool,
    /// CPU affinity to set after joining the cgroup (binding mode `set`).
    pub affinity: Option<libc::cpu_set_t>,
    /// The program is exec'd through `/proc/self/fd/N` (the agent's open berth binary, so the
    /// user needs no path to it): the process, now wholly the user's, is made dumpable again
    /// so that it may read its own /proc/self/fd, as any exec of a plain binary would.
    pub exec_through_proc_fd: bool,
    /// The file mode mask the process runs with, set before the output files are made.
    pub umask: libc::mode_t,
    /// Append to the output files rather than truncate them (`--open-mode=append`).
    pub append: bool,
}

/// A kernel CPU mask of `cpus`, built before the fork. Errors for CPUs beyond CPU_SETSIZE.
pub fn cpu_mask(cpus: &berth_core::CpuSet) -> Result<libc::cpu_set_t, String> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter() {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(format!("CPU {cpu} is beyond the affinity mask's {} CPUs", libc::CPU_SETSIZE));
        }
        // SAFETY: cpu is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(cpu as usize, &mut mask) };
    }
    Ok(mask)
}

fn cstring(what: &str, s: &[u8]) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} contains a NUL byte"))
}

/// In a forked child before exec: join the job's cgroups (writing "0" to each cgroup.procs
/// fd, as root), set the CPU affinity if any (inside the cpuset just joined), start a new
/// session (its own process group, so signals reach what it forks), drop to the user's
/// groups and ids, enter `cwd`. Only async-signal-safe system calls.
pub(crate) fn enter_job_as_user(
    join_fds: &[RawFd],
    affinity: Option<&libc::cpu_set_t>,
    groups: &[libc::gid_t],
    gid: u32,
    uid: u32,
    cwd: &std::ffi::CStr,
) -> std::io::Result<()> {
    // SAFETY: plain system calls on values the caller prepared before the fork.
    unsafe {
        for &fd in join_fds {
            if libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(mask) = affinity {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if !crate::priority::enter_job_nice() || libc::setsid() < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl ChildSetup {
    pub fn new(
        join_files: Vec<File>,
        user: &UserIdentity,
        cwd: &str,
        stdout: &str,
        stderr: &str,
    ) -> Result<Self, String> {
        Ok(ChildSetup {
            join_files,
            uid: user.uid,
            gid: user.gid,
            groups: user.groups.clone(),
            cwd: cstring("working directory", cwd.as_bytes())?,
            stdout: cstring("output path", Path::new(stdout).as_os_str().as_bytes())?,
            stderr: cstring("error path", Path::new(stderr).as_os_str().as_bytes())?,
            same_output: stdout == stderr,
            affinity: None,
            exec_through_proc_fd: false,
            umask: 0o022,
            append: false,
        })
    }

    /// Install the setup on a command. Steps, in the child: join the cgroup (as root), set the
    /// CPU affinity if any (inside the cpuset just joined), new session, drop to the user's
    /// groups and ids, enter the submit directory, open the output files as the user.
    pub fn apply(self, cmd: &mut tokio::process::Command) {
        let fds: Vec<RawFd> = self.join_files.iter().map(|f| f.as_raw_fd()).collect();
        // Keep the files open until the command is dropped (the fds must be valid at fork).
        let keep = self.join_files;
        let same_output = self.same_output;
        let affinity = self.affinity;
        let dumpable = self.exec_through_proc_fd;
        let umask = self.umask & 0o777;
        let mode = if self.append { libc::O_APPEND } else { libc::O_TRUNC };
        let setup = (self.uid, self.gid, self.groups, self.cwd, self.stdout, self.stderr);
        // SAFETY: the closure only makes async-signal-safe system calls on data prepared above.
        unsafe {
            cmd.pre_exec(move || {
                let _ = &keep;
                let (uid, gid, groups, cwd, out, err) = &setup;
                enter_job_as_user(&fds, affinity.as_ref(), groups, *gid, *uid, cwd)?;
                // The submitter's mask: the output files below and everything the job makes.
                libc::umask(umask);
                for (path, target) in [(out, 1), (err, 2)] {
                    if target == 2 && same_output {
                        if libc::dup2(1, 2) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        break;
                    }
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | mode | libc::O_CLOEXEC, 0o666);
                    if fd < 0 || libc::dup2(fd, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                if dumpable && libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::CpuSet;

    #[test]
    fn cpu_mask_bits() {
        let mask = cpu_mask(&CpuSet::parse_list("0,2-3").unwrap()).unwrap();
        // SAFETY: in range of the mask.
        let on: Vec<usize> = (0..8).filter(|&c| unsafe { libc::CPU_ISSET(c, &mask) }).collect();
        assert_eq!(on, [0, 2, 3]);
        assert!(cpu_mask(&CpuSet::parse_list("1024").unwrap()).unwrap_err().contains("CPU 1024"));
    }
}
