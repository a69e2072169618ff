//! The cgroup v2 device filter (`cgroup::v2::devices`) against the real kernel: programs
//! loaded with bpf(2), attached to a cgroup of the unified hierarchy, processes of that
//! cgroup opening stand-in device files. A device program needs no controller, so this runs
//! on a host whose v2 mount has none enabled (a hybrid one), where a whole v2 job cannot.

use super::*;
use crate::cgroup::v2::devices::{self, DevKind, DeviceRule, ACC_ALL, ACC_READ, ACC_WRITE};
use crate::cgroup::v2::V2Job;

/// A cgroup `<v2 mount>/berth-test/<unique>/job`, and stand-in devices in a temp dir: `mine`
/// (/dev/full's numbers, 1:7) and `other` (/dev/random's, 1:8). Removed on drop.
struct Fixture {
    top: PathBuf,
    job: V2Job,
    tmp: tempfile::TempDir,
}

impl Fixture {
    fn new(test: &str) -> Option<Fixture> {
        if !is_root() {
            return precondition_failed(test, "not running as root");
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default();
        let Some(mount) = mounts.iter().find(|m| m.fs_type == "cgroup2").map(|m| m.mount_point.clone()) else {
            return precondition_failed(test, "no cgroup2 mount");
        };
        let top = mount.join(unique("berth-test/devbpf"));
        let dir = top.join("job");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let tmp = tempfile::tempdir().unwrap();
        for (name, minor) in [("mine", 7), ("other", 8)] {
            let path = tmp.path().join(name);
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid C path; mknod has no other precondition.
            let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
            assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
        }
        let job = V2Job::new("job".into(), dir, top.clone(), true);
        Some(Fixture { top, job, tmp })
    }

    fn dev(&self, name: &str) -> String {
        self.tmp.path().join(name).display().to_string()
    }

    /// Run `script` in the job's cgroup; its exit code.
    fn run(&self, script: &str) -> Option<i32> {
        let mut child = spawn_in(&self.job, script);
        wait_child(&mut child, Duration::from_secs(10)).code()
    }

    /// Empty and remove the job's cgroup; the ids of the programs that were attached to it.
    fn remove_job(&self) -> Vec<u32> {
        let ids = devices::attached(self.job.dir()).unwrap();
        self.job.kill_all(Duration::from_secs(5)).unwrap();
        self.job.remove().unwrap();
        ids
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.job.kill_all(Duration::from_secs(5));
        let _ = self.job.remove();
        // The unique directory, then berth-test if nothing else is in it.
        for d in [self.top.clone(), self.top.parent().map(Path::to_path_buf).unwrap_or_default()] {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The shell's test that `path` cannot be opened for reading with EPERM (exit 4 if it opens,
/// 5 if it fails otherwise).
fn refused(path: &str) -> String {
    format!(
        "if head -c1 {path} >/dev/null 2>/tmp/.e$$; then exit 4; fi; \
         grep -q 'Operation not permitted' /tmp/.e$$ || {{ rm -f /tmp/.e$$; exit 5; }}; rm -f /tmp/.e$$"
    )
}

/// A GPU node's job on cgroup v2, as the agent contains it: the program denies the other
/// GPU's stand-in (EPERM), the job's own GPU and /dev/null stay usable; the other opens
/// outside the job; a second update adds a program for new devices only; removing the cgroup
/// frees the programs.
#[test]
fn v2_device_program_denies_other_gpus() {
    let Some(f) = Fixture::new("v2_device_program_denies_other_gpus") else {
        return;
    };
    f.job.deny_devices(&[(1, 8)]).unwrap();
    let ids = devices::attached(f.job.dir()).unwrap();
    assert_eq!(ids.len(), 1, "one program attached: {ids:?}");
    let script = format!(
        "head -c1 {} >/dev/null || exit 3; {}; echo x >/dev/null || exit 6; exit 0",
        f.dev("mine"),
        refused(&f.dev("other"))
    );
    assert_eq!(f.run(&script), Some(0), "3: own GPU refused, 4: other GPU opened, 5: not EPERM, 6: /dev/null");
    assert!(std::fs::File::open(f.dev("other")).is_ok(), "outside the job the rule does not apply");

    f.job.deny_devices(&[(1, 8)]).unwrap();
    assert_eq!(devices::attached(f.job.dir()).unwrap(), ids, "nothing new: no second program");
    f.job.deny_devices(&[(1, 8), (1, 7)]).unwrap();
    assert_eq!(devices::attached(f.job.dir()).unwrap().len(), 2, "a program for 1:7 alone");
    assert_eq!(f.run(&refused(&f.dev("mine"))), Some(0), "both programs decide");

    // A child cgroup (a rank's) is held to its parent's programs.
    let rank = f.job.dir().join("rank0");
    std::fs::create_dir(&rank).unwrap();
    let rank_job = V2Job::at(rank.clone(), f.job.dir().to_path_buf());
    let mut child = spawn_in(&rank_job, &refused(&f.dev("other")));
    assert_eq!(wait_child(&mut child, Duration::from_secs(10)).code(), Some(0), "the rank's open refused too");

    let ids = f.remove_job();
    assert!(!f.job.dir().exists());
    let start = Instant::now();
    while ids.iter().any(|&id| devices::program_exists(id)) {
        assert!(start.elapsed() < Duration::from_secs(10), "programs {ids:?} outlive their cgroup");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The assembler's allow lists (as runc's): everything refused but the usual devices and the
/// job's GPU; read-only rules refuse writes.
#[test]
fn v2_device_allow_list_program() {
    let Some(f) = Fixture::new("v2_device_allow_list_program") else {
        return;
    };
    let allow = |major, minor: Option<u32>, access| DeviceRule {
        allow: true,
        kind: DevKind::Char,
        major: Some(major),
        minor,
        access,
    };
    let rules = [
        allow(1, Some(3), ACC_ALL),  // null
        allow(1, Some(5), ACC_READ), // zero, read only
        allow(5, Some(0), ACC_ALL),  // tty
        allow(5, Some(2), ACC_ALL),  // ptmx
        allow(136, None, ACC_READ | ACC_WRITE),
        allow(1, Some(7), ACC_ALL), // the job's GPU stand-in
    ];
    devices::load_and_attach(&devices::assemble(&rules, false).unwrap(), f.job.dir()).unwrap();
    let script = format!(
        "head -c1 {} >/dev/null || exit 3; {}; head -c1 /dev/zero >/dev/null || exit 6; \
         if echo x >/dev/zero 2>/dev/null; then exit 7; fi; exit 0",
        f.dev("mine"),
        refused(&f.dev("other"))
    );
    assert_eq!(f.run(&script), Some(0), "3: allowed refused, 4: denied opened, 5: not EPERM, 6/7: zero read-only");
    f.remove_job();
}
