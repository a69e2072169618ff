//! A real local cluster for system tests: `berth up` in a temp dir, `berth down` on drop.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_berth");

/// A command's output as text (lossy).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run a command name installed by `berth compat install` (`ROOT/bin/NAME`) against `c`.
pub fn named(c: &Cluster, name: &str, args: &[&str]) -> Output {
    Command::new(c.root().join("bin").join(name))
        .args(args)
        .env("BERTH_DIR", &c.dir)
        .current_dir(c.root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"))
}

/// [`named`], which must succeed: its standard output.
pub fn named_ok(c: &Cluster, name: &str, args: &[&str]) -> String {
    let o = named(c, name, args);
    assert!(o.status.success(), "{name} {args:?}: {:?}\n{}{}", o.status, text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

/// System tests need root and cgroup v1/v2 controllers: say so loudly instead of passing.
pub fn require_root() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this system test needs root (it creates cgroups and runs jobs as other users); run `bash scripts/test.sh` as root");
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    pub fn up(agents: usize, topology: &str) -> Cluster {
        require_root();
        let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().expect("tempdir");
        // Other users (the test user) must reach the socket and their own directories.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Self::up_with(tmp, agents, topology, &[])
    }

    /// `berth up` with controller settings `toml` (e.g. a `[preempt]` table) in its berth.toml;
    /// `berth up` adds the cluster's own keys (listen, heartbeats) in front.
    pub fn up_configured(agents: usize, topology: &str, toml: &str) -> Cluster {
        require_root();
        let tmp = tempfile::Builder::new().prefix("berth-test-").tempdir().expect("tempdir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("cluster");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("berth.toml"), toml).unwrap();
        Self::up_with(tmp, agents, topology, &[])
    }

    /// `berth up` in `tmp` with extra flags (e.g. `--netns`).
    pub fn up_with(tmp: tempfile::TempDir, agents: usize, topology: &str, extra: &[&str]) -> Cluster {
        let dir = tmp.path().join("cluster");
        let c = Cluster { dir, _tmp: tmp };
        let agents = agents.to_string();
        let mut args = vec!["up", "--agents", &agents, "--topology", topology];
        args.extend_from_slice(extra);
        let out = c.berth(&args);
        assert!(
            out.status.success(),
            "berth up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    pub fn root(&self) -> &Path {
        self._tmp.path()
    }

    pub fn berth(&self, args: &[&str]) -> Output {
        Command::new(BIN).arg("--dir").arg(&self.dir).args(args).current_dir(self.root()).output().expect("run berth")
    }

    /// `berth run ARGS` in the cluster (from its root, `env` added to the caller's
    /// environment), killed and failed if it has not ended within 90 s.
    pub fn run_step(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg("--dir").arg(&self.dir).arg("run").args(args).current_dir(self.root());
        cmd.envs(env.iter().copied());
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start berth run");
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > std::time::Duration::from_secs(90) {
                let _ = child.kill();
                panic!("berth run {args:?} did not end within 90 s\n{}", self.logs());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }

    /// Run berth and parse its --json output; panics with stderr on failure.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.berth(&a);
        assert!(
            out.status.success(),
            "berth {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("berth {args:?}: bad json {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Write `text` as a script in the test dir and submit it with extra flags; returns the id.
    pub fn submit(&self, name: &str, text: &str, flags: &[&str]) -> u64 {
        let path = self.root().join(name);
        std::fs::write(&path, text).unwrap();
        let mut args = vec!["submit"];
        args.extend_from_slice(flags);
        let p = path.display().to_string();
        args.push(&p);
        self.json(&args)["id"].as_u64().expect("id")
    }

    /// Run berth as another (non-root) user, e.g. `berthtest` (scripts/test.sh creates it),
    /// from a copy of the binary that user can execute.
    pub fn berth_as(&self, user: &str, args: &[&str]) -> Output {
        let bin = self.root().join("berth-bin");
        if !bin.exists() {
            std::fs::copy(BIN, &bin).expect("copy the berth binary for another user");
        }
        Command::new("runuser")
            .args(["-u", user, "--"])
            .arg(&bin)
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .current_dir(self.root())
            .output()
            .expect("runuser")
    }

    pub fn show(&self, id: u64) -> Value {
        self.json(&["show", &id.to_string()])
    }

    /// Wait until job `id` is in one of `states`; returns its record.
    pub fn wait_state(&self, id: u64, states: &[&str], timeout: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let j = self.show(id);
            if states.contains(&j["state"].as_str().unwrap_or("")) {
                return j;
            }
            if t0.elapsed() > timeout {
                panic!("job {id} not in {states:?} after {timeout:?}: {j:#}\nlogs:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_finished(&self, id: u64, timeout: Duration) -> Value {
        self.wait_state(id, &["completed", "failed", "cancelled", "timeout", "node_fail"], timeout)
    }

    pub fn pid_of(&self, who: &str) -> i32 {
        std::fs::read_to_string(self.dir.join("run").join(format!("{who}.pid"))).unwrap().trim().parse().unwrap()
    }

    pub fn cluster_id(&self) -> String {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(self.dir.join("cluster.json")).unwrap()).unwrap();
        v["id"].as_str().unwrap().to_string()
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("logs")) {
            for e in rd.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                s.push_str(&format!(
                    "== {}\n{}\n",
                    e.path().display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.berth(&["down"]);
    }
}

pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false)
}

/// Where cgroup controller `ctrl` is mounted (v1).
pub fn cgroup_mount(ctrl: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup").join(ctrl)
}

/// The MPI test programs (crates/agent/tests/mpi/*.c), built with MPICH's mpicc into a
/// directory named after their sources: built once, reused by later test processes, never
/// piling up.
pub fn mpi_programs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| build_mpi_programs("mpicc.mpich", "install mpich libmpich-dev (scripts/setup.sh)"))
}

/// The same programs built with Open MPI's mpicc (they run through the agents' PMIx server).
pub fn openmpi_programs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        build_mpi_programs("mpicc.openmpi", "install openmpi-bin libopenmpi-dev libpmix-dev (scripts/setup.sh)")
    })
}

fn build_mpi_programs(mpicc: &str, install: &str) -> PathBuf {
    const PROGRAMS: [&str; 10] =
        ["hello", "allreduce", "ring", "abort", "survivor", "appnum", "allgather", "locality", "spawn", "comm_split"];
    {
        use std::hash::{Hash, Hasher};
        use std::os::unix::fs::PermissionsExt;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/mpi");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        mpicc.hash(&mut h);
        for name in PROGRAMS {
            name.hash(&mut h);
            std::fs::read(src.join(format!("{name}.c"))).expect("read an MPI test source").hash(&mut h);
        }
        let out = std::env::temp_dir().join(format!("berth-mpi-{:016x}", h.finish()));
        if PROGRAMS.iter().all(|p| out.join(p).exists()) {
            return out;
        }
        // Built aside, then renamed into place whole: a reader never sees half a set.
        let tmp = std::env::temp_dir().join(format!("berth-mpi-build-{mpicc}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        for name in PROGRAMS {
            let status = Command::new(mpicc)
                .arg("-o")
                .arg(tmp.join(name))
                .arg(src.join(format!("{name}.c")))
                .status()
                .unwrap_or_else(|e| panic!("cannot run {mpicc} ({e}): {install}"));
            assert!(status.success(), "{mpicc} {name}.c failed");
        }
        if std::fs::rename(&tmp, &out).is_err() {
            // Another test process (another checkout's tests too) put the same set there first.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        out
    }
}

/// `NAME.c` of crates/agent/tests/mpi, a PMIx client, compiled by `compiler` (`cc`, or
/// `mpicc.openmpi` for one that is also an Open MPI program) against libpmix into the
/// cluster's directory: the program's path.
pub fn build_pmix_program(c: &Cluster, compiler: &str, name: &str) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/mpi").join(format!("{name}.c"));
    let prog = c.root().join(name);
    let install = if compiler == "cc" {
        "install build-essential and libpmix-dev (scripts/setup.sh)"
    } else {
        "install openmpi-bin libopenmpi-dev libpmix-dev (scripts/setup.sh)"
    };
    let built = Command::new(compiler)
        .arg("-o")
        .arg(&prog)
        .arg(&src)
        .args(["-I/usr/lib/x86_64-linux-gnu/pmix2/include", "-lpmix"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler} ({e}): {install}"));
    assert!(built.success(), "{compiler} {name}.c -lpmix failed: {install}");
    prog.display().to_string()
}

/// What every rank of `allgather.c` (crates/agent/tests/mpi) prints when all `ranks` blocks
/// of `mib` MiB arrived intact: the FNV-1a 64 checksum of the gathered buffer, computed here
/// from the program's pattern.
pub fn allgather_checksum(ranks: usize, mib: usize) -> String {
    let block = mib << 20;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in 0..ranks {
        for i in 0..block {
            let b = (r.wrapping_mul(131).wrapping_add(i.wrapping_mul(7)).wrapping_add(i >> 12)) as u8;
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Every rank's line of `allgather.c` with `ranks` ranks of `mib` MiB is in `stdout`, and
/// no rank saw a wrong byte.
pub fn assert_allgather_ok(stdout: &str, ranks: usize, mib: usize) {
    assert!(!stdout.contains("allgather bad"), "{stdout}");
    let sum = allgather_checksum(ranks, mib);
    let bytes = ranks * (mib << 20);
    for r in 0..ranks {
        let want = format!("allgather ok rank={r} bytes={bytes} checksum={sum}");
        assert!(stdout.contains(&want), "no `{want}`: {stdout}");
    }
}

/// No process of ours left: `marker` is a unique argument of the test's rank commands.
pub fn assert_no_process(marker: &str) {
    let t0 = Instant::now();
    loop {
        let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
        if !out.status.success() {
            return;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            panic!("processes matching {marker:?} survived: {}", String::from_utf8_lossy(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// No job cgroup left under the cluster's subtree once its jobs ended (waits up to 15 s).
pub fn assert_no_job_cgroups(c: &Cluster) {
    let root = cgroup_mount("cpuset").join("berth").join(c.cluster_id());
    // A wrong path must not pass as "nothing left": the cluster's root exists while it is up.
    assert!(root.is_dir(), "no cgroup root {} for this cluster: the check looks in the wrong place", root.display());
    let t0 = Instant::now();
    loop {
        let left: Vec<PathBuf> = std::fs::read_dir(&root)
            .map(|rd| rd.flatten().flat_map(|n| std::fs::read_dir(n.path()).into_iter().flatten().flatten()))
            .into_iter()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("job_")))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "job cgroups left: {left:?}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}
