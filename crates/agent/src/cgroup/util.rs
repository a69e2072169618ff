//! Small cgroupfs helpers shared by the v1 and v2 backends.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::CgroupError;

/// How long `freeze` waits for the kernel to report the cgroup frozen.
pub(crate) const FREEZE_WAIT: Duration = Duration::from_secs(5);
/// How long `remove` retries rmdir on EBUSY (exiting tasks linger briefly).
pub(crate) const RMDIR_WAIT: Duration = Duration::from_secs(2);
/// Deadline for killing a leftover job in `remove_root`.
pub(crate) const REMOVE_KILL_DEADLINE: Duration = Duration::from_secs(10);

pub(crate) fn io_err(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io { op, path: path.to_path_buf(), source }
}

fn is_enoent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

pub(crate) fn read_string(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|e| io_err("read", path, e))
}

/// Like `read_string`, but a missing file is `None` (optional interface files).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if is_enoent(&e) => Ok(None),
        Err(e) => Err(io_err("read", path, e)),
    }
}

pub(crate) fn read_trimmed(path: &Path) -> Result<String, CgroupError> {
    Ok(read_string(path)?.trim().to_string())
}

/// [`write_value`] to a file the kernel may not have (false then).
pub(crate) fn write_optional(path: &Path, value: &str) -> Result<bool, CgroupError> {
    match write_value(path, value) {
        Ok(()) => Ok(true),
        Err(CgroupError::Io { source, .. }) if is_enoent(&source) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Write `value` with a single write(2): cgroupfs parses each write separately.
pub(crate) fn write_value(path: &Path, value: &str) -> Result<(), CgroupError> {
    // O_TRUNC is ignored by cgroupfs but keeps plain-file fixtures exact.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| io_err("open for writing", path, e))?;
    match f.write(value.as_bytes()) {
        Ok(n) if n == value.len() => Ok(()),
        Ok(n) => Err(io_err(
            "write",
            path,
            io::Error::new(io::ErrorKind::WriteZero, format!("short write {n}/{} bytes", value.len())),
        )),
        Err(e) => Err(io_err("write", path, e)),
    }
}

/// mkdir; Ok(true) if created, Ok(false) if it already existed.
pub(crate) fn create_dir(path: &Path) -> Result<bool, CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err("create", path, e)),
    }
}

pub(crate) fn is_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).map(|m| m.is_dir()).unwrap_or(false)
}

pub(crate) fn is_file(path: &Path) -> bool {
    fs::symlink_metadata(path).map(|m| m.is_file()).unwrap_or(false)
}

/// Names of the subdirectories (child cgroups) of `path`; empty if `path` is gone.
pub(crate) fn subdirs(path: &Path) -> Result<Vec<String>, CgroupError> {
    let rd = match fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if is_enoent(&e) => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", path, e)),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list", path, e))?;
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// rmdir `path` and any nested cgroups, deepest first. Missing is fine;
/// EBUSY is retried for `busy_wait` because exiting tasks detach lazily.
pub(crate) fn remove_tree(path: &Path, busy_wait: Duration) -> Result<(), CgroupError> {
    // Most have no child (a rank's sub-cpuset is one): listing is left for a refused rmdir.
    match fs::remove_dir(path) {
        Ok(()) => return Ok(()),
        Err(e) if is_enoent(&e) => return Ok(()),
        Err(_) => {}
    }
    for child in subdirs(path)? {
        remove_tree(&path.join(child), busy_wait)?;
    }
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if is_enoent(&e) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < busy_wait => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(io_err("remove", path, e)),
        }
    }
}

/// Remove the subtree root `mount/rel`, then its ancestors up to and
/// including the first component of `rel`, stopping at the first ancestor
/// that still has children or cannot be removed (someone else's).
pub(crate) fn remove_chain(mount: &Path, rel: &Path) -> Result<(), CgroupError> {
    remove_tree(&mount.join(rel), RMDIR_WAIT)?;
    let mut cur = rel.parent();
    while let Some(p) = cur.filter(|p| !p.as_os_str().is_empty()) {
        let dir = mount.join(p);
        if !subdirs(&dir)?.is_empty() {
            break;
        }
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if is_enoent(&e) => {}
            Err(e) => {
                tracing::debug!(path = %dir.display(), error = %e, "keeping cgroup ancestor");
                break;
            }
        }
        cur = p.parent();
    }
    Ok(())
}

/// Run `f`, retrying a few times while it fails with ENOENT, or ENODEV (a file of a cgroup
/// removed after it was opened): another agent may be removing an empty shared ancestor
/// (remove_root) at the same time.
pub(crate) fn retry_vanished(mut f: impl FnMut() -> Result<(), CgroupError>) -> Result<(), CgroupError> {
    let mut tries = 0;
    loop {
        match f() {
            Err(CgroupError::Io { ref source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) && tries < 3 =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Value of `key` in flat-keyed cgroup files ("key value" lines:
/// cpu.stat, memory.events, memory.stat, cpuacct.stat, memory.oom_control).
pub(crate) fn keyed_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok()).flatten()
    })
}

pub(crate) fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        detail: format!("expected an integer, got {:?}", text.trim()),
    })
}

/// mkdir `parent/name` (with `mkdir`, a seam for fixtures that must also fake
/// the kernel's interface files) and write its cpuset.cpus and cpuset.mems;
/// rmdir again on failure. Returns the new directory.
pub(crate) fn create_cpuset_child(
    parent: &Path,
    name: &str,
    cpus: &str,
    mems: &str,
    mkdir: &dyn Fn(&Path) -> Result<bool, CgroupError>,
) -> Result<PathBuf, CgroupError> {
    validate_name(name)?;
    let dir = parent.join(name);
    if is_dir(&dir) || !mkdir(&dir)? {
        return Err(CgroupError::AlreadyExists { path: dir });
    }
    // Both lists before anything joins: a v1 cpuset starts empty and takes no tasks.
    let result = write_value(&dir.join("cpuset.cpus"), cpus).and_then(|()| write_value(&dir.join("cpuset.mems"), mems));
    match result {
        Ok(()) => Ok(dir),
        Err(e) => {
            if let Err(e2) = remove_tree(&dir, Duration::from_millis(200)) {
                tracing::warn!(error = %e2, "cleanup after failed child cgroup create");
            }
            Err(e)
        }
    }
}

/// `dir` itself or its child cgroup `child` (a validated plain name).
pub(crate) fn child_dir(dir: &Path, child: Option<&str>) -> Result<PathBuf, CgroupError> {
    match child {
        None => Ok(dir.to_path_buf()),
        Some(name) => {
            validate_name(name)?;
            Ok(dir.join(name))
        }
    }
}

/// The trimmed contents of a cgroup's `cpus`/`mems` files; None if either is missing.
pub(crate) fn read_cpuset_pair(dir: &Path, cpus: &str, mems: &str) -> Result<Option<(String, String)>, CgroupError> {
    let (Some(c), Some(m)) = (read_optional(&dir.join(cpus))?, read_optional(&dir.join(mems))?) else {
        return Ok(None);
    };
    Ok(Some((c.trim().to_string(), m.trim().to_string())))
}

/// Give `dir`, its `files` and every direct child directory (with the same
/// files) to `uid`:`gid`. lchown never follows a symlink (cgroupfs has none,
/// but a wrong path must not hand out something else). Missing files are skipped.
pub(crate) fn chown_cgroup(dir: &Path, files: &[&str], uid: u32, gid: u32) -> Result<(), CgroupError> {
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(subdirs(dir)?.into_iter().map(|c| dir.join(c)));
    for d in dirs {
        std::os::unix::fs::lchown(&d, Some(uid), Some(gid)).map_err(|e| io_err("chown", &d, e))?;
        for f in files {
            let p = d.join(f);
            match std::os::unix::fs::lchown(&p, Some(uid), Some(gid)) {
                Ok(()) => {}
                Err(e) if is_enoent(&e) => tracing::debug!(path = %p.display(), "no such cgroup file to chown"),
                Err(e) => return Err(io_err("chown", &p, e)),
            }
        }
    }
    Ok(())
}

/// A job or subtree name must be one plain path component.
pub(crate) fn validate_name(name: &str) -> Result<(), CgroupError> {
    let bad = |reason| Err(CgroupError::InvalidName { name: name.to_string(), reason });
    if name.is_empty() || name.len() > 200 {
        return bad("must be 1 to 200 characters");
    }
    if !name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return bad("must start with a letter or digit");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        return bad("only letters, digits, '.', '_' and '-' are allowed");
    }
    if matches!(name, "tasks" | "notify_on_release" | "release_agent") {
        return bad("clashes with a cgroup control file");
    }
    Ok(())
}

/// Validate a relative subtree path like "berth/demo/node1".
pub(crate) fn validate_rel(root_rel: &str) -> Result<PathBuf, CgroupError> {
    if root_rel.is_empty() {
        return Err(CgroupError::InvalidName {
            name: root_rel.to_string(),
            reason: "the subtree root must not be empty",
        });
    }
    for comp in root_rel.split('/') {
        validate_name(comp).map_err(|_| CgroupError::InvalidName {
            name: root_rel.to_string(),
            reason: "subtree root must be relative components of letters, digits, '.', '_', '-' separated by '/'",
        })?;
    }
    Ok(PathBuf::from(root_rel))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_vanishing_under_a_neighbour_is_retried_other_errors_are_not() {
        let failing = |errno: i32, times: usize| {
            let mut calls = 0;
            let r = retry_vanished(|| {
                calls += 1;
                match calls <= times {
                    true => Err(io_err("read", Path::new("/x"), io::Error::from_raw_os_error(errno))),
                    false => Ok(()),
                }
            });
            (r.is_ok(), calls)
        };
        assert_eq!(failing(libc::ENOENT, 2), (true, 3));
        assert_eq!(failing(libc::ENODEV, 3), (true, 4), "a file of a cgroup removed after its open");
        assert_eq!(failing(libc::ENODEV, 4), (false, 4), "not forever");
        assert_eq!(failing(libc::EACCES, 1), (false, 1));
    }

    #[test]
    fn keyed_values() {
        let cpu_stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(keyed_u64(cpu_stat, "user_usec"), Some(100000));
        assert_eq!(keyed_u64(cpu_stat, "system_usec"), Some(23456));
        assert_eq!(keyed_u64(cpu_stat, "usage"), None, "no prefix matching");
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_u64(oom, "oom_kill"), Some(3));
        assert_eq!(keyed_u64("oom_kill x\n", "oom_kill"), None);
    }

    #[test]
    fn names() {
        for ok in ["job_42", "42", "job-1.2", "A"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", ".hidden", "tasks", "sp ace", "-x", "é"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_rel("berth/demo/node1").is_ok());
        for bad in ["", "/berth", "berth/", "berth//x", "berth/../x"] {
            assert!(validate_rel(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chain_removal_stops_at_shared_ancestor() {
        // Plain directories behave like cgroup dirs for rmdir purposes.
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path();
        fs::create_dir_all(m.join("berth/a/n1/job_1")).unwrap();
        fs::create_dir_all(m.join("berth/b")).unwrap();
        remove_chain(m, Path::new("berth/a/n1")).unwrap();
        assert!(!m.join("berth/a").exists());
        assert!(m.join("berth/b").exists(), "sibling kept");
        remove_chain(m, Path::new("berth/b")).unwrap();
        assert!(!m.join("berth").exists());
        remove_chain(m, Path::new("berth/b")).unwrap();
        assert!(m.exists(), "never goes above the subtree's top");
    }
}
