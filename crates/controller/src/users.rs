//! Users and groups of this host (the passwd and group databases, NSS included) and the
//! identity of a socket's peer: lookups only, below everything else in the controller.

use berth_protocol::user::UserIdentity;
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::net::UnixStream;

/// A user of this name exists (the passwd database, NSS included).
pub fn user_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getpwnam_r writes into `pwd` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(c.as_ptr(), &mut pwd, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        rc == 0 && !found.is_null()
    }
}

/// A group of this name exists (the group database, NSS included).
pub fn group_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getgrnam_r writes into `grp` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        rc == 0 && !found.is_null()
    }
}

/// A user's primary group name (its number when the group has no name here).
pub fn default_account(gid: u32) -> String {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getgrgid_r writes into `grp` and `buf`, both ours and large enough or ERANGE.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut found);
        if rc == 0 && !found.is_null() && !grp.gr_name.is_null() {
            if let Ok(name) = std::ffi::CStr::from_ptr(grp.gr_name).to_str() {
                return name.to_string();
            }
        }
    }
    gid.to_string()
}

/// Identity of the process at the other end of a Unix socket, from the kernel.
pub(crate) fn peer_identity(stream: &UnixStream) -> Result<UserIdentity, String> {
    let cred = stream.peer_cred().map_err(|e| format!("cannot read peer credentials: {e}"))?;
    let (uid, gid) = (cred.uid(), cred.gid());
    // Supplementary groups: the kernel's, as the peer connected; else its process's now.
    let mut groups = Vec::new();
    if let Some(g) = peer_groups(stream.as_raw_fd()) {
        groups = g;
    } else if let Some(pid) = cred.pid() {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(line) = status.lines().find(|l| l.starts_with("Groups:")) {
                groups = line["Groups:".len()..].split_whitespace().filter_map(|g| g.parse().ok()).collect();
            }
        }
    }
    Ok(UserIdentity { uid, gid, groups, name: cached_user_name(uid) })
}

/// The supplementary groups of a Unix socket's peer, recorded by the kernel when it connected
/// (SO_PEERGROUPS, Linux 4.13): one call, where reading /proc/PID/status costs every client
/// request ~0.05 ms and races with a pid reused.
fn peer_groups(fd: std::os::fd::RawFd) -> Option<Vec<u32>> {
    // asm-generic/socket.h (x86_64, aarch64); the libc crate does not export it there yet.
    const SO_PEERGROUPS: libc::c_int = 59;
    let mut buf: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let size = std::mem::size_of::<libc::gid_t>();
        let mut len = (buf.len() * size) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes; the kernel writes at most that and sets len.
        let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_PEERGROUPS, buf.as_mut_ptr().cast(), &mut len) };
        let needed = len as usize / size;
        if rc == 0 {
            buf.truncate(needed);
            return Some(buf);
        }
        let too_small = std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE);
        if !too_small || needed <= buf.len() {
            return None;
        }
        buf.resize(needed, 0);
    }
}

/// [`user_name`], remembered for a minute: the lookup (NSS: files, maybe a directory service)
/// is on every client request's path, and a renamed user is rare and only cosmetic here.
fn cached_user_name(uid: u32) -> String {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;
    static NAMES: Mutex<Option<HashMap<u32, (String, Instant)>>> = Mutex::new(None);
    const KEEP: Duration = Duration::from_secs(60);
    if let Ok(mut names) = NAMES.lock() {
        if let Some((name, at)) = names.get_or_insert_with(HashMap::new).get(&uid) {
            if at.elapsed() < KEEP {
                return name.clone();
            }
        }
    }
    let name = user_name(uid);
    if let Ok(mut names) = NAMES.lock() {
        names.get_or_insert_with(HashMap::new).insert(uid, (name.clone(), Instant::now()));
    }
    name
}

/// The login name of `uid`, or the number if it has none.
pub fn user_name(uid: u32) -> String {
    let mut buf = vec![0u8; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: buffers are valid for the call; getpwuid_r writes only within them.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut result) };
    if rc == 0 && !result.is_null() && !pwd.pw_name.is_null() {
        // SAFETY: pw_name points into buf and is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        return name.to_string_lossy().into_owned();
    }
    uid.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_groups_come_from_the_socket_as_the_process_has_them() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut mine: Vec<libc::gid_t> = vec![0; 4096];
        // SAFETY: the buffer holds 4096 gids; the call writes at most that many.
        let n = unsafe { libc::getgroups(mine.len() as libc::c_int, mine.as_mut_ptr()) };
        mine.truncate(usize::try_from(n).unwrap());
        let mut theirs = peer_groups(a.as_raw_fd()).expect("SO_PEERGROUPS (Linux 4.13+)");
        mine.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(theirs, mine);
        // Names are looked up once, then remembered.
        assert_eq!(cached_user_name(0), user_name(0));
        assert_eq!(cached_user_name(0), cached_user_name(0));
    }
}
