//! Users and groups of this host (the passwd and group databases, NSS included) and the
//! identity of a socket's peer: lookups only, below everything else in the controller.

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
