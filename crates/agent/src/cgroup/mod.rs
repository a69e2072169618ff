//! Job containment with Linux control groups.
//!
//! Policy apart from mechanism: the agent decides *what* a job gets
//! ([`JobLimits`]) and *when* to freeze, kill or account it; a
//! [`CgroupBackend`] knows *how* on this host (cgroup v1 hierarchies in
//! [`v1`], the unified hierarchy in [`v2`]). [`detect`] picks one. Unit tests of job
//! supervision use an in-memory backend instead (`fake`, test builds only).
//!
//! Everything lives under one subtree (e.g. `berth/<cluster>/<agent>`) so the
//! agent never touches cgroups it did not create.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(test)]
pub mod fake;
mod procs;
mod util;
pub mod v1;
pub mod v2;

#[cfg(test)]
mod real_tests;

pub use procs::join_from_child;

const ROOT_HINT: &str =
    "berth agent must run as root with cgroup v1 cpuset/memory/freezer/cpuacct mounted or cgroup v2";

/// Errors from cgroup operations. I/O errors carry the path and a hint.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot {op} {}: {source}; {}", path.display(), io_hint(op, source))]
    Io { op: &'static str, path: PathBuf, source: io::Error },
    /// `create` found the job cgroup already present (leftover of an earlier run).
    #[error("cgroup {} already exists (leftover of an earlier run?): open() it to kill and remove it, or use another name", path.display())]
    AlreadyExists { path: PathBuf },
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// The host's cgroup setup cannot be used (missing controllers, ...).
    #[error("cgroups unusable: {0}")]
    Unsupported(String),
    #[error("cannot parse {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },
    #[error("timed out after {waited:?} waiting for {what} in {}", path.display())]
    Timeout { what: &'static str, path: PathBuf, waited: Duration },
    /// Processes still alive after `kill_all`'s deadline (stuck in D state?).
    #[error("processes survived SIGKILL until the deadline: {pids:?} (uninterruptible sleep, e.g. hung NFS?)")]
    Unkillable { pids: Vec<i32> },
    #[error("cannot send signal {signal} to pid {pid}: {source}")]
    Signal { pid: i32, signal: i32, source: io::Error },
    /// The cgroup v2 device program could not be made, loaded or attached.
    #[error(transparent)]
    Devices(#[from] v2::devices::DeviceFilterError),
}

/// What to tell the operator for a failed cgroupfs operation.
fn io_hint(op: &str, e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => ROOT_HINT,
        Some(libc::ENOENT) => "it does not exist: is the controller mounted/enabled and has prepare_root() run?",
        Some(libc::EBUSY) => "the cgroup still has processes or child cgroups (kill_all() them first)",
        Some(libc::ENOSPC) => "no usable CPUs/memory nodes: cpuset.cpus/cpuset.mems are empty or offline",
        Some(libc::EINVAL) | Some(libc::ERANGE) if op.contains("write") => {
            "the kernel rejected the value (CPUs/memory nodes outside the parent's set, malformed list, or limit below current usage)"
        }
        _ => ROOT_HINT,
    }
}

/// Resources a job cgroup is confined to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobLimits {
    /// Kernel CPU list, e.g. "0-1,3". Empty means all of the root's CPUs.
    pub cpus: String,
    /// Kernel memory-node list, e.g. "0". Empty means all of the root's nodes.
    pub mems: String,
    /// Hard memory limit (swap included). None means unlimited.
    pub memory_limit_bytes: Option<u64>,
    /// The most processes (and threads) the job may have at once; None leaves the limit as
    /// it is (unlimited in a new cgroup). Hitting it makes fork fail in the job (EAGAIN).
    pub pids_max: Option<u64>,
    /// Character devices (major, minor) the job must not open: the node's GPUs it does not
    /// hold (crate::gpu_devices::deny_rules). Written to the v1 `devices` controller, or on v2
    /// attached as a device eBPF program ([`v2::devices`]), when the backend contains devices
    /// ([`CgroupBackend::contains_devices`]); rules are only ever added, so an `update` with
    /// none leaves the job's as they are.
    pub deny_devices: Vec<(u32, u32)>,
}

/// Accounting of a job cgroup (cumulative since creation, descendants included).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupUsage {
    pub user_cpu_usec: u64,
    pub system_cpu_usec: u64,
    pub peak_memory_bytes: u64,
    /// Processes killed by the OOM killer. 0 if the kernel does not count them.
    pub oom_kills: u64,
    /// Forks refused because the job was at its process limit (`pids.events` "max").
    pub pids_limit_hits: u64,
}

/// What [`JobCgroup::retire`] made of an ended job's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retired {
    /// It is the spare now (its counters reset), for the next job to take.
    Spare,
    /// Removed: the backend keeps no ended job's cgroup, or a spare is there already.
    Removed,
    /// Removed: the job left what cannot be reset (an OOM kill or a refused fork counted, a
    /// nested cgroup, device rules).
    NotClean,
    /// Removed: this much memory was still charged to it, after the kernel was asked to
    /// reclaim it when that was little enough to try.
    Charged { bytes: u64 },
}

/// Creates and removes the agent's cgroup subtree and its job cgroups.
pub trait CgroupBackend: Send + Sync + std::fmt::Debug {
    /// Create (idempotently) the agent's subtree root, e.g. relative path
    /// `berth/<cluster>/<agent>`, under every controller used; for cpuset,
    /// copy cpuset.cpus/cpuset.mems down from the parent at each new level.
    fn prepare_root(&self) -> Result<(), CgroupError>;
    /// Real CPUs and memory nodes the root may use, as kernel list strings.
    fn root_cpus_mems(&self) -> Result<(String, String), CgroupError>;
    /// Create child cgroup `name` under the root with `limits` (cpuset, memory
    /// limit without extra swap, thawed freezer, cpuacct/pids membership).
    /// Fails with [`CgroupError::AlreadyExists`] if it is already there
    /// (even partially); nothing is left behind on other failures.
    fn create(&self, name: &str, limits: &JobLimits) -> Result<Box<dyn JobCgroup>, CgroupError>;
    /// Make, unless there is one, a spare child that the next `create` takes by renaming it
    /// (making the directories is the costliest part of a job's set-up; done ahead, it is off
    /// the launch's path). `list` shows it; `remove_root` removes it. Ok(()) for a backend
    /// that keeps none.
    fn make_spare(&self) -> Result<(), CgroupError> {
        Ok(())
    }
    /// Open an existing child (re-adoption after an agent restart); Ok(None)
    /// if absent. A partially created child counts as present.
    fn open(&self, name: &str) -> Result<Option<Box<dyn JobCgroup>>, CgroupError>;
    /// Names of existing children of the root (sorted).
    fn list(&self) -> Result<Vec<String>, CgroupError>;
    /// Kill and remove all children, then remove the root and the ancestors
    /// that became empty, up to and including the top directory of the subtree.
    fn remove_root(&self) -> Result<(), CgroupError>;
    /// Whether jobs' `JobLimits::deny_devices` are enforced: a v1 backend made with the
    /// `devices` hierarchy, a v2 one that can load device eBPF programs
    /// ([`detect_with_devices`], [`v2::devices`]).
    fn contains_devices(&self) -> bool {
        false
    }
    /// Why devices are not contained though the backend was asked to (a v2 backend whose
    /// device program could not be loaded: the bpf() error); None otherwise.
    fn devices_error(&self) -> Option<String> {
        None
    }
    /// The cgroup version: 1 or 2.
    fn version(&self) -> u8;
    /// Mount point of the hierarchy holding the cpuset controller; job cpuset
    /// paths are reported relative to it.
    fn cpuset_mount(&self) -> PathBuf;
}

/// One job's cgroup.
pub trait JobCgroup: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    /// Open, for writing, the file by which a process joins this cgroup in
    /// every hierarchy it lives in ([`JobCgroup::join_file_name`]). A forked,
    /// single-threaded child joins before exec by writing b"0" (= itself) to
    /// each fd in `pre_exec`, see [`join_from_child`]. The files are
    /// O_CLOEXEC; keep them open until `spawn` returns.
    fn join_files(&self) -> Result<Vec<std::fs::File>, CgroupError>;
    /// The file a single-threaded child writes b"0" to, to join a cgroup directory of this
    /// job (its own, or a child made by `make_child`): v2 `cgroup.procs`; v1 `tasks`, which
    /// moves only the calling thread (the whole process, for a child before exec) and so
    /// spares the kernel's global threadgroup lock: a v1 `cgroup.procs` write after an idle
    /// moment waits ~7 ms for an RCU grace period, `tasks` 0.04 ms (BENCHMARKS.md, issue 4).
    fn join_file_name(&self) -> &'static str {
        "cgroup.procs"
    }
    /// The spawn path started process `pid` in this cgroup (it joined through
    /// [`JobCgroup::join_files`] before its exec). A real cgroup knows its processes already:
    /// nothing to do; the test backend (`fake`) learns its members so.
    fn joined(&self, _pid: i32) {}
    /// Every pid in the cgroup (and in cgroups nested below it), sorted.
    /// Zombies are not listed by the kernel.
    fn pids(&self) -> Result<Vec<i32>, CgroupError>;
    fn is_empty(&self) -> Result<bool, CgroupError>;
    /// Send `signal` to every process; returns how many were signalled.
    /// ESRCH is ignored. On v1, frozen processes act on it only once thawed.
    fn signal_all(&self, signal: i32) -> Result<usize, CgroupError>;
    /// Freeze and wait (up to ~2 s) until the kernel reports it frozen
    /// (v1 freezer.state FROZEN, v2 "frozen 1" in cgroup.events); on timeout
    /// it is thawed again and [`CgroupError::Timeout`] returned.
    fn freeze(&self) -> Result<(), CgroupError>;
    fn thaw(&self) -> Result<(), CgroupError>;
    /// Frozen, or being frozen (v1 freezer.state FROZEN/FREEZING, v2 cgroup.freeze 1):
    /// how a restarted agent finds the jobs that were suspended.
    fn is_frozen(&self) -> Result<bool, CgroupError>;
    /// Kill every process so none survives, even fork loops and double-forked
    /// daemons: v2 cgroup.kill where present, else freeze, SIGKILL all, thaw,
    /// repeat until empty. [`CgroupError::Unkillable`] if some remain at `deadline`.
    fn kill_all(&self, deadline: Duration) -> Result<(), CgroupError>;
    /// CPU time, peak memory and OOM kills so far (readable until `remove`).
    /// v1: cpuacct.usage_user/usage_sys (or cpuacct.stat ticks),
    /// memory.max_usage_in_bytes, "oom_kill" of memory.oom_control (0 on
    /// kernels before 4.13, where memory.failcnt cannot tell an OOM kill from
    /// reclaim). v2: cpu.stat, memory.peak (0 before 5.19), memory.events.
    fn usage(&self) -> Result<CgroupUsage, CgroupError>;
    /// Change cpus/mems/memory limit of the existing cgroup.
    fn update(&self, limits: &JobLimits) -> Result<(), CgroupError>;
    /// The job ended, `kill_all` emptied the cgroup and `usage` is what was read of it last:
    /// [`JobCgroup::remove`] it, or, on a backend that keeps a spare
    /// ([`CgroupBackend::make_spare`]) and has none, make it the spare when nothing of this
    /// job can show in the next one's accounting, verdict or limits (counters that cannot be
    /// reset, as v1's OOM kills and refused forks, are zero; the others are reset). What
    /// became of it: [`Retired::Spare`] needs no new spare made.
    fn retire(&self, _usage: &CgroupUsage) -> Result<Retired, CgroupError> {
        self.remove().map(|()| Retired::Removed)
    }
    /// rmdir in every hierarchy (nested cgroups such as rank sub-cpusets
    /// first, or the rmdir fails); it must be empty (`kill_all` first, which
    /// covers nested cgroups too). Retries briefly on EBUSY; Ok if already gone.
    fn remove(&self) -> Result<(), CgroupError>;
    /// The job's directory in the cpuset hierarchy (v1) or the unified one (v2).
    fn cpuset_dir(&self) -> PathBuf;
    /// Create child cpuset cgroup `name` (e.g. a rank's sub-cpuset) inside the
    /// job's cpuset cgroup with kernel lists `cpus`/`mems` (empty: the job's
    /// own), and return its directory. Processes are not moved. Fails with
    /// [`CgroupError::AlreadyExists`] if present; nothing is left behind on
    /// other failures. Removed with the job by `remove`.
    fn make_child(&self, name: &str, cpus: &str, mems: &str) -> Result<PathBuf, CgroupError>;
    /// The CPUs and memory nodes the kernel holds for the job (`child` None)
    /// or its child cgroup `child`: v1 cpuset.cpus/cpuset.mems, v2 the
    /// .effective files (what is enforced). Ok(None) if the cgroup has no
    /// cpuset files (controller absent).
    fn read_cpuset(&self, child: Option<&str>) -> Result<Option<(String, String)>, CgroupError>;
    /// Give the job's user its cpuset cgroup: chown (never following
    /// symlinks) the job's cpuset directory and the files that move processes
    /// (v1 tasks + cgroup.procs, v2 cgroup.procs + cgroup.threads), and the
    /// same for each existing child. The user can then make sub-cpusets and
    /// move its own processes between them, but not change their limits.
    /// Call before the job starts, when the only children are `make_child`'s.
    fn chown_cpuset(&self, uid: u32, gid: u32) -> Result<(), CgroupError>;
}

/// Detect this host's cgroup setup and return the backend for subtree
/// `root_rel` (e.g. "berth/demo/node1"): v2 if /sys/fs/cgroup is cgroup2 or
/// another cgroup2 mount (e.g. /sys/fs/cgroup/unified) offers cpuset and
/// memory; else v1 if the cpuset and memory hierarchies are mounted.
pub fn detect(root_rel: &str) -> Result<Box<dyn CgroupBackend>, CgroupError> {
    detect_with_devices(root_rel, false)
}

/// [`detect`], containing devices when `devices` (a node with GPUs to contain): on cgroup v1
/// with the `devices` hierarchy too when it is mounted (jobs then join a devices cgroup that
/// denies `JobLimits::deny_devices`), on v2 with a device eBPF program attached to each job's
/// cgroup when one can be loaded.
pub fn detect_with_devices(root_rel: &str, devices: bool) -> Result<Box<dyn CgroupBackend>, CgroupError> {
    let path = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(path).map_err(|e| util::io_err("read", path, e))?;
    let mounts = parse_mountinfo(&text);
    let read = |p: &Path| std::fs::read_to_string(p.join("cgroup.controllers")).ok();
    match choose(&mounts, &read)? {
        Choice::V2(mount) => Ok(Box::new(v2::V2Backend::with_devices(mount, root_rel, devices)?)),
        Choice::V1 => Ok(Box::new(v1::V1Backend::from_mounts_with(&mounts, root_rel, devices)?)),
    }
}

#[derive(Debug, PartialEq)]
pub(crate) enum Choice {
    V1,
    V2(PathBuf),
}

/// The detection policy, apart from the file system for testing.
/// `controllers` returns the text of `<mount>/cgroup.controllers`.
pub(crate) fn choose(
    mounts: &[MountInfo],
    controllers: &dyn Fn(&Path) -> Option<String>,
) -> Result<Choice, CgroupError> {
    let v2_mounts = mounts.iter().filter(|m| m.fs_type == "cgroup2");
    let mut v2_notes = Vec::new();
    for m in v2_mounts {
        if m.mount_point == Path::new("/sys/fs/cgroup") {
            return Ok(Choice::V2(m.mount_point.clone()));
        }
        let text = controllers(&m.mount_point).unwrap_or_default();
        let have: Vec<&str> = text.split_whitespace().collect();
        if have.contains(&"cpuset") && have.contains(&"memory") {
            return Ok(Choice::V2(m.mount_point.clone()));
        }
        v2_notes.push(format!("{} offers only [{}]", m.mount_point.display(), have.join(" ")));
    }
    let missing: Vec<&str> = ["cpuset", "memory"].into_iter().filter(|c| v1_mount(mounts, c).is_none()).collect();
    if missing.is_empty() {
        return Ok(Choice::V1);
    }
    let v2_part = if v2_notes.is_empty() {
        "no cgroup2 mount".to_string()
    } else {
        format!("cgroup2 mount {}", v2_notes.join(", "))
    };
    Err(CgroupError::Unsupported(format!(
        "/sys/fs/cgroup is not cgroup2, {v2_part} without cpuset+memory, and cgroup v1 controller(s) {} not mounted; {ROOT_HINT}",
        missing.join(", ")
    )))
}

/// One line of /proc/self/mountinfo (the fields berth needs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MountInfo {
    /// Root of the mount within its file system (field 4).
    pub root: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// Per-superblock options; for cgroup v1 these name the controllers.
    pub super_options: Vec<String>,
}

/// Parse /proc/self/mountinfo; malformed lines are skipped.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let fields: Vec<&str> = line.split(' ').collect();
    // Optional fields end at a lone "-"; fs type, source, super options follow.
    let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    if fields.len() < 6 || fields.len() < sep + 4 {
        return None;
    }
    Some(MountInfo {
        root: unescape_octal(fields[3]),
        mount_point: PathBuf::from(unescape_octal(fields[4])),
        fs_type: fields[sep + 1].to_string(),
        super_options: fields[sep + 3].split(',').map(str::to_string).collect(),
    })
}

/// The kernel escapes space, tab, newline and backslash as \NNN octal.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount point of the v1 hierarchy carrying `controller` (first one wins).
pub(crate) fn v1_mount(mounts: &[MountInfo], controller: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller))
        .map(|m| m.mount_point.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime master:3 shared:4 - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
50 23 0:40 /a\\040b /mnt/with\\040space rw - ext4 /dev/sda1 rw
garbage line
";

    #[test]
    fn mountinfo_fields_and_escapes() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(m.len(), 9);
        assert_eq!(m[1].mount_point, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m[1].fs_type, "cgroup");
        assert_eq!(m[1].super_options, vec!["rw", "cpu", "cpuacct"]);
        assert_eq!(m[3].fs_type, "cgroup", "optional fields are skipped");
        assert_eq!(m[8].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[8].root, "/a b");
    }

    #[test]
    fn v1_comounted_controllers() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(v1_mount(&m, "cpuacct"), Some("/sys/fs/cgroup/cpu,cpuacct".into()));
        assert_eq!(v1_mount(&m, "cpu"), Some("/sys/fs/cgroup/cpu,cpuacct".into()));
        assert_eq!(v1_mount(&m, "memory"), Some("/sys/fs/cgroup/memory".into()));
        assert_eq!(v1_mount(&m, "blkio"), None);
        assert_eq!(v1_mount(&m, "systemd"), None, "name=systemd is not a controller");
    }

    #[test]
    fn choose_hybrid_without_v2_controllers_is_v1() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(choose(&m, &|_| Some(String::new())).ok(), Some(Choice::V1));
    }

    #[test]
    fn choose_hybrid_with_v2_controllers_is_v2() {
        let m = parse_mountinfo(HYBRID);
        let c = choose(&m, &|p| (p == Path::new("/sys/fs/cgroup/unified")).then(|| "cpuset cpu memory pids\n".into()));
        assert_eq!(c.ok(), Some(Choice::V2("/sys/fs/cgroup/unified".into())));
    }

    #[test]
    fn choose_pure_v2() {
        let m = parse_mountinfo("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
        assert_eq!(choose(&m, &|_| None).ok(), Some(Choice::V2("/sys/fs/cgroup".into())));
    }

    #[test]
    fn choose_nothing_says_what_is_missing() {
        let m = parse_mountinfo(
            "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
             35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        );
        let err = choose(&m, &|_| Some("pids\n".into())).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("cpuset"), "{err}");
        assert!(!err.contains("cpuset, memory"), "{err}");
        assert!(err.contains("/sys/fs/cgroup/unified offers only [pids]"), "{err}");
    }

    #[test]
    fn io_error_message_has_path_and_hint() {
        let e = util::io_err(
            "create",
            Path::new("/sys/fs/cgroup/cpuset/berth/x"),
            io::Error::from_raw_os_error(libc::EACCES),
        );
        let s = e.to_string();
        assert!(s.starts_with("cannot create /sys/fs/cgroup/cpuset/berth/x: Permission denied (os error 13); berth agent must run as root"), "{s}");
    }
}
