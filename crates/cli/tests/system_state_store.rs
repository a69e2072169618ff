//! System tests (issue 16, items 2 and 5): the controller's state is private, and neither a
//! lock another process takes on it nor a full disk stops the controller.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "package:1 core:2 pu:1";

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777
}

/// Poll `f` until it returns Some, or panic after `limit` saying what was awaited.
fn wait_for<T>(what: &str, limit: Duration, c: &Cluster, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if t0.elapsed() > limit {
            panic!("{what}: not within {limit:?}\nlogs:\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `berth submit --json` of a script; the parsed answer and whether it succeeded.
fn try_submit(c: &Cluster, path: &Path, flags: &[&str]) -> (bool, Value) {
    let p = path.display().to_string();
    let mut args = vec!["submit", "--json"];
    args.extend_from_slice(flags);
    args.push(&p);
    let o = c.berth(&args);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| Value::String(text(&o)));
    (o.status.success(), v)
}

/// `berth status --json`: its exit code and answer.
fn status(c: &Cluster) -> (i32, Value) {
    let o = c.berth(&["status", "--json"]);
    (o.status.code().unwrap_or(-1), serde_json::from_slice(&o.stdout).unwrap_or(Value::Null))
}

/// A job that runs until `flag` exists.
fn waiting_script(c: &Cluster, flag: &Path) -> PathBuf {
    let p = c.root().join("wait.sh");
    std::fs::write(&p, format!("#!/bin/sh\nwhile [ ! -e {} ]; do sleep 0.1; done\necho done\n", flag.display()))
        .unwrap();
    p
}

#[test]
fn the_controller_state_is_private_and_made_so_at_start() {
    require_root();
    let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // As an older berth left it: the directory and the database open to everyone.
    let state = tmp.path().join("cluster").join("controller");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(state.join("state.db"), b"").unwrap();
    std::fs::set_permissions(state.join("state.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let c = Cluster::up_with(tmp, 1, TOPOLOGY, &[]);
    let flag = c.root().join("flag-a");
    let script = waiting_script(&c, &flag);
    let id = c.submit("secret.sh", &std::fs::read_to_string(&script).unwrap(), &[]);
    c.wait_state(id, &["running"], Duration::from_secs(60));

    assert_eq!(mode(&state), 0o700, "state directory");
    let mut files = vec![];
    for e in std::fs::read_dir(&state).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 0, "{} owned by the daemon's user", p.display());
        files.push(p);
    }
    assert!(files.iter().any(|p| p.ends_with("state.db-wal")) && files.iter().any(|p| p.ends_with("state.db-shm")));
    // Another user reads none of it: not the database, nor its WAL, nor the listing.
    for p in files.iter().chain([&state]) {
        let o = std::process::Command::new("runuser").args(["-u", "berthtest", "--", "cat"]).arg(p).output().unwrap();
        assert!(!o.status.success() && text(&o).contains("Permission denied"), "{}: {}", p.display(), text(&o));
    }
    let o = std::process::Command::new("runuser")
        .args(["-u", "berthtest", "--", "sqlite3"])
        .arg(state.join("state.db"))
        .arg("SELECT count(*) FROM jobs")
        .output()
        .unwrap();
    // It ran (scripts/setup.sh installs sqlite3) and could not open the database.
    assert!(!o.status.success() && !text(&o).contains("failed to execute"), "sqlite3 as another user: {}", text(&o));
    // The agent's records of the running job (its environment) are private too; the job's
    // own spool directory belongs to its user.
    let agent = c.dir.join("agents").join("node1");
    assert_eq!(mode(&agent.join("jobs")), 0o700, "agent jobs/");
    assert_eq!(mode(&agent.join("ended.log")), 0o600, "agent ended.log");
    let o = std::process::Command::new("runuser")
        .args(["-u", "berthtest", "--", "ls"])
        .arg(agent.join("jobs"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "agent records listed by another user: {}", text(&o));
    std::fs::write(&flag, b"").unwrap();
    assert_eq!(c.wait_finished(id, Duration::from_secs(60))["state"], "completed");
}

/// A read lock on SQLite's WAL write-lock byte of `state.db-shm` (offset 120: the WAL-index
/// lock bytes follow the 120-byte header; byte 120 is WAL_WRITE_LOCK), held by this process.
struct ShmLock {
    _file: std::fs::File,
}

impl ShmLock {
    fn take(shm: &Path) -> ShmLock {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(shm).unwrap_or_else(|e| panic!("{}: {e}", shm.display()));
        // SAFETY: a plain flock struct, zeroed then filled; fcntl reads it.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_RDLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = 120;
        fl.l_len = 1;
        // SAFETY: valid descriptor and struct; F_SETLKW waits while the controller writes.
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLKW, &fl) };
        assert_eq!(rc, 0, "fcntl: {}", std::io::Error::last_os_error());
        ShmLock { _file: f }
    }
}

#[test]
fn a_lock_on_the_database_makes_writes_wait_and_fail_but_not_the_controller() {
    let c = Cluster::up(1, TOPOLOGY);
    let pid = c.pid_of("server");
    let ok = c.root().join("ok.sh");
    std::fs::write(&ok, "#!/bin/sh\ntrue\n").unwrap();
    let first = c.submit("ok.sh", "#!/bin/sh\ntrue\n", &[]);
    c.wait_finished(first, Duration::from_secs(60));

    let lock = ShmLock::take(&c.dir.join("controller").join("state.db-shm"));
    let t0 = Instant::now();
    let (accepted, answer) = try_submit(&c, &ok, &[]);
    let refused_after = t0.elapsed();
    assert!(!accepted, "a submission that cannot be written is refused: {answer}");
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
    let msg = answer["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("locked") && msg.contains("state.db"), "{msg}");
    assert!(pid_alive(pid), "the controller is still running\n{}", c.logs());
    // Reads go on; admins see the condition.
    let jobs = c.json(&["jobs", "--all"]);
    assert_eq!(jobs.as_array().map(|a| a.len()), Some(1), "{jobs}");
    let (code, st) = status(&c);
    assert_eq!((code, st["state_store"]["problem"].as_str()), (2, Some("busy")), "{st}");
    let log = std::fs::read_to_string(c.dir.join("logs").join("server.log")).unwrap_or_default();
    assert!(log.contains("cannot write the state database"), "{log}");

    drop(lock);
    let t1 = Instant::now();
    wait_for("the controller writes again", Duration::from_secs(30), &c, || (status(&c).0 == 0).then_some(()));
    let resumed_after = t1.elapsed();
    let id = c.submit("ok.sh", "#!/bin/sh\ntrue\n", &[]);
    assert_eq!(c.wait_finished(id, Duration::from_secs(60))["state"], "completed");
    assert!(pid_alive(pid), "same controller process throughout");
    eprintln!("FIGURES lock: refused after {refused_after:?}; writable again {resumed_after:?} after the release");
}

/// A tmpfs mounted for a test; unmounted (and its directory removed) when dropped.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        require_root();
        let dir = tempfile::Builder::new().prefix("berth-tmpfs-").tempdir().unwrap();
        let path = dir.path().join("state");
        std::fs::create_dir(&path).unwrap();
        let o = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "mount tmpfs: {}", text(&o));
        Tmpfs { path, _dir: dir }
    }

    fn free(&self) -> u64 {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path; statvfs writes only into st.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }

    /// Fill it up with a file of zeros: what is left is less than a page.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let p = self.path.join("filler");
        let mut f = std::fs::File::create(&p).unwrap();
        for chunk in [1 << 20, 4096, 512] {
            let zeros = vec![0u8; chunk];
            while f.write_all(&zeros).is_ok() {}
        }
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

fn on_tmpfs(fs: &Tmpfs) -> Cluster {
    Cluster::up_configured(1, TOPOLOGY, &format!("state_dir = {:?}\n", fs.path.display().to_string()))
}

#[test]
fn a_full_disk_refuses_submissions_keeps_job_ends_and_resumes_by_itself() {
    let fs = Tmpfs::mount("24m");
    let c = on_tmpfs(&fs);
    let pid = c.pid_of("server");
    let wal = std::fs::metadata(fs.path.join("state.db-wal")).map(|m| m.len()).unwrap_or(0);
    let flag = c.root().join("flag-c");
    let script = waiting_script(&c, &flag);
    let running = c.submit("wait.sh", &std::fs::read_to_string(&script).unwrap(), &[]);
    c.wait_state(running, &["running"], Duration::from_secs(60));

    let filler = fs.fill();
    // Big scripts, held (they need not run), until the disk refuses one.
    let big = c.root().join("big.sh");
    let pad: String = (0..4000).map(|i| format!("# padding line {i:06} {}\n", "x".repeat(40))).collect();
    std::fs::write(&big, format!("#!/bin/sh\n{pad}true\n")).unwrap();
    let mut accepted_when_full = 0;
    let refusal = loop {
        let (ok, v) = try_submit(&c, &big, &["--hold"]);
        if !ok {
            break v;
        }
        accepted_when_full += 1;
        assert!(accepted_when_full < 400, "never refused: the disk did not fill?");
    };
    assert_eq!(refusal["error"]["code"], "no_space", "{refusal}");
    let msg = refusal["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains(&fs.path.display().to_string()), "the message names the path: {msg}");
    assert!(pid_alive(pid), "the controller is still running\n{}", c.logs());
    // Still refused (up front now), reads served, the condition reported.
    let (ok, again) = try_submit(&c, &big, &[]);
    assert!(!ok && again["error"]["code"] == "no_space", "{again}");
    let jobs = c.json(&["jobs"]);
    assert_eq!(jobs.as_array().map(|a| a.len()), Some(1 + accepted_when_full), "{jobs}");
    let (code, st) = status(&c);
    assert_eq!((code, st["state_store"]["problem"].as_str()), (2, Some("no_space")), "{st}");

    // The running job ends meanwhile: its end waits, unacknowledged, until it can be written.
    std::fs::write(&flag, b"").unwrap();
    let log = c.dir.join("logs").join("server.log");
    wait_for("the job's end is kept", Duration::from_secs(60), &c, || {
        std::fs::read_to_string(&log).ok().filter(|l| l.contains("job end kept in memory")).map(drop)
    });
    assert_eq!(c.show(running)["state"], "running", "not recorded yet");

    std::fs::remove_file(&filler).unwrap();
    let t0 = Instant::now();
    let ended = c.wait_finished(running, Duration::from_secs(60));
    let recorded_after = t0.elapsed();
    assert_eq!(ended["state"], "completed", "{ended}");
    wait_for("status ok again", Duration::from_secs(30), &c, || (status(&c).0 == 0).then_some(()));
    let id = c.submit("ok.sh", "#!/bin/sh\ntrue\n", &[]);
    assert_eq!(c.wait_finished(id, Duration::from_secs(60))["state"], "completed");
    assert!(pid_alive(pid), "same controller process throughout");
    eprintln!(
        "FIGURES full disk: WAL preallocated {wal} bytes on 24 MiB; {accepted_when_full} big submissions \
         accepted after the fill; job end recorded {recorded_after:?} after space was freed"
    );
}

#[test]
fn the_controller_starts_on_a_3_mb_disk_or_says_why() {
    let fs = Tmpfs::mount("3m");
    {
        let c = on_tmpfs(&fs);
        let id = c.submit("ok.sh", "#!/bin/sh\necho hi\n", &[]);
        assert_eq!(c.wait_finished(id, Duration::from_secs(60))["state"], "completed");
        let wal = std::fs::metadata(fs.path.join("state.db-wal")).map(|m| m.len()).unwrap_or(0);
        eprintln!("FIGURES 3 MB: started, WAL {wal} bytes, {} bytes free", fs.free());
        // The WAL's preallocation did not take the disk (before: 3 MB of zeros, 0 bytes left).
        assert!(fs.free() > 1 << 20, "{} bytes free, WAL {wal} bytes", fs.free());
        assert!(c.berth(&["down"]).status.success());
    }
    // Full to the last page: `berth up` says why the controller cannot start.
    for e in std::fs::read_dir(&fs.path).unwrap() {
        let _ = std::fs::remove_file(e.unwrap().path());
    }
    let _filler = fs.fill();
    let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("berth.toml"), format!("state_dir = {:?}\n", fs.path.display().to_string())).unwrap();
    let up = |args: &[&str]| std::process::Command::new(BIN).arg("--dir").arg(&dir).args(args).output().unwrap();
    let t0 = Instant::now();
    let o = up(&["up", "--agents", "1", "--topology", TOPOLOGY]);
    let said_after = t0.elapsed();
    let _ = up(&["down"]);
    assert!(!o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("no space left") && out.contains(&fs.path.display().to_string()), "{out}");
    eprintln!("FIGURES full 3 MB: `berth up` failed after {said_after:?} saying: {out}");
}
