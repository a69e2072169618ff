//! System test: interactive allocations (`berth alloc`, `salloc`) on a live cluster: a command
//! whose `berth run` runs in the allocation, a shell under a real pseudo-terminal, `--no-shell`
//! then `berth cancel`, an allocation that waits behind a batch job, and `salloc`.

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// PATH with `first` (then berth's own directory) in front: commands in the allocation find
/// `berth`, and `srun` is berth's rather than a Slurm installed on the host.
fn path_with(first: &Path) -> String {
    let bin_dir = Path::new(BIN).parent().expect("berth's directory");
    format!("{}:{}:{}", first.display(), bin_dir.display(), std::env::var("PATH").unwrap_or_default())
}

/// A command against the cluster, outside any job, bounded by `secs`.
fn cmd(c: &Cluster, program: &Path, args: &[&str], path: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg(program)
        .args(args)
        .env("BERTH_DIR", &c.dir)
        .env("PATH", path)
        .env("SHELL", "/bin/sh")
        .env_remove("BERTH_JOB_ID")
        .env_remove("SLURM_JOB_ID")
        .current_dir(c.root());
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run a command")
}

/// The job id in a `granted job N` / `Granted job allocation N` line.
fn granted_id(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("berth alloc: granted job ")
                .or_else(|| l.strip_prefix("salloc: Granted job allocation "))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no grant line in: {stderr}"))
}

/// The one active allocation of the cluster in `state`, waited for up to 20 s.
fn active_alloc(c: &Cluster, state: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        let v = c.json(&["jobs"]);
        let found = v.as_array().into_iter().flatten().find(|j| j["kind"] == "alloc" && j["state"] == state);
        if let Some(j) = found {
            return j["id"].as_u64().expect("an id");
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no {state} allocation: {v:#}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Signal `child` and wait (at most 20 s) for it to exit; its exit status.
fn signal_and_wait(child: &mut std::process::Child, sig: i32) -> std::process::ExitStatus {
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("berth alloc did not exit after signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `berth alloc ARGS` against the cluster, not waited for (no `timeout` between: the test
/// signals it).
fn spawn_alloc(c: &Cluster, args: &[&str], path: &str) -> std::process::Child {
    Command::new(BIN)
        .arg("alloc")
        .args(args)
        .env("BERTH_DIR", &c.dir)
        .env("PATH", path)
        .env_remove("BERTH_JOB_ID")
        .current_dir(c.root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn berth alloc")
}

fn host() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

#[test]
fn alloc_runs_a_command_and_a_terminal_shell_in_its_allocation() {
    let c = Cluster::up(2, "package:1 core:2 pu:1");
    let bin = PathBuf::from(BIN);
    let path = path_with(&c.root().join("bin"));

    // A command: `berth run` in it is a step of the allocation; its variables are set.
    let o = output(cmd(
        &c,
        &bin,
        &["alloc", "-n", "1", "--", "sh", "-c", "berth run -n 1 hostname; echo $SLURM_JOB_ID"],
        &path,
    ));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "berth alloc: {out}{err}\n{}", c.logs());
    let id = granted_id(&err);
    assert_eq!(out.lines().collect::<Vec<_>>(), vec![host(), id.to_string()], "{out}{err}");
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(
        (j["state"].as_str(), j["kind"].as_str(), j["exit_code"].as_i64()),
        (Some("completed"), Some("alloc"), Some(0)),
        "{j:#}"
    );
    assert_eq!(j["steps"].as_array().map(Vec::len), Some(1), "its step: {j:#}");

    // Under a real terminal (`script` makes the pty): the shell gets it; what is typed runs
    // there, and the allocation ends with the shell's exit code.
    let script = Path::new("/usr/bin/script");
    assert!(script.exists(), "this test needs `script` (bsdutils / util-linux) to make a pseudo-terminal");
    let line = format!("{} --dir {} alloc -n 1", BIN, c.dir.display());
    let mut child = cmd(&c, script, &["-qec", &line, "/dev/null"], &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script");
    let mut stdin = child.stdin.take().expect("script's stdin");
    // Typed once the shell may be up; the terminal keeps it until the shell reads it.
    std::thread::sleep(Duration::from_millis(1500));
    stdin.write_all(b"berth run -n 1 true; tty; exit 7\n").expect("type into the terminal");
    let o = child.wait_with_output().expect("script's output");
    drop(stdin);
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(7), "the shell's exit code: {all}\n{}", c.logs());
    assert!(all.contains("/dev/pts/"), "the shell had the terminal: {all}");
    let id = granted_id(&all.replace('\r', ""));
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!((j["state"].as_str(), j["exit_code"].as_i64()), (Some("failed"), Some(7)), "{j:#}");

    // --no-shell: the id once granted; it stays until `berth cancel`.
    let o = output(cmd(&c, &bin, &["alloc", "--no-shell", "--cores", "2", "--json"], &path));
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let id = v["id"].as_u64().expect("an id");
    std::thread::sleep(Duration::from_millis(1500));
    let j = c.show(id);
    assert_eq!((j["state"].as_str(), j["kind"].as_str()), (Some("running"), Some("alloc")), "{j:#}");
    let o = c.berth(&["cancel", &id.to_string()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(j["state"].as_str(), Some("cancelled"));

    // The client killed outright: its connection drops, the allocation ends, and the command
    // (told by its parent-death signal) goes with it.
    let marker = c.root().join("still-running");
    let script = format!("sleep 3; touch {}", marker.display());
    let mut child = spawn_alloc(&c, &["-n", "1", "--", "sh", "-c", &script], &path);
    let id = active_alloc(&c, "running");
    let status = signal_and_wait(&mut child, libc::SIGKILL);
    assert!(!status.success());
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(
        (j["state"].as_str(), j["reason"].as_str()),
        (Some("failed"), Some("berth alloc disconnected")),
        "{j:#}"
    );
    std::thread::sleep(Duration::from_secs(4));
    assert!(!marker.exists(), "the command outlived its berth alloc");
    assert_no_job_cgroups(&c);
}

#[test]
fn alloc_waits_behind_a_batch_job_and_salloc_speaks_slurm() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let bin = c.root().join("bin");
    let v = c.json(&["compat", "install", &bin.display().to_string()]);
    assert!(v.to_string().contains("salloc"), "salloc not installed: {v:#}");
    let path = path_with(&bin);

    // Every core busy for a while: the allocation waits, then is granted once the job ends.
    let batch = c.submit("busy.sh", "#!/bin/sh\nsleep 3\n", &["--cores", "2"]);
    c.wait_state(batch, &["running"], Duration::from_secs(20));
    let t0 = Instant::now();
    let o =
        output(cmd(&c, &PathBuf::from(BIN), &["alloc", "--cores", "2", "--", "sh", "-c", "echo $SLURM_NNODES"], &path));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}\n{}", c.logs());
    assert!(err.contains("berth alloc: pending job"), "it waited: {err}");
    let id = granted_id(&err);
    assert_eq!(out.trim(), "1");
    let b = c.wait_finished(batch, Duration::from_secs(5));
    let a = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(b["state"].as_str(), Some("completed"));
    assert!(
        a["start_time"].as_f64().unwrap() >= b["end_time"].as_f64().unwrap(),
        "granted only after the batch job ended: {a:#} {b:#}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30));

    // salloc: Slurm's options and messages; srun in it is berth's, in the allocation.
    let o = output(cmd(
        &c,
        &bin.join("salloc"),
        &["-N", "1", "-n", "1", "-J", "inter", "--", "sh", "-c", "srun -n 1 hostname; echo $SLURM_JOB_NAME"],
        &path,
    ));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "salloc: {out}{err}\n{}", c.logs());
    let id = granted_id(&err);
    assert!(err.contains(&format!("salloc: Relinquishing job allocation {id}")), "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), vec![host(), "inter".to_string()], "{out}{err}");
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!((j["state"].as_str(), j["name"].as_str()), (Some("completed"), Some("inter")));

    // Ctrl-C while it waits cancels the request.
    let busy = c.submit("busy2.sh", "#!/bin/sh\nsleep 30\n", &["--cores", "2"]);
    c.wait_state(busy, &["running"], Duration::from_secs(20));
    let mut child = spawn_alloc(&c, &["--cores", "1", "--", "true"], &path);
    let id = active_alloc(&c, "queued");
    let status = signal_and_wait(&mut child, libc::SIGINT);
    assert_eq!(status.code(), Some(1));
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!((j["state"].as_str(), j["start_time"].as_f64()), (Some("cancelled"), None), "{j:#}");
    let o = c.berth(&["cancel", &busy.to_string()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    c.wait_finished(busy, Duration::from_secs(20));

    // A salloc that exits with its command's code; an unsupported option is named.
    let o = output(cmd(&c, &bin.join("salloc"), &["-n", "1", "sh", "-c", "exit 5"], &path));
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    let o = output(cmd(&c, &bin.join("salloc"), &["--wrap", "true"], &path));
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("salloc: error: --wrap"), "{}", text(&o.stderr));
}

/// A controller restart does not end an allocation: `berth alloc` connects again and holds it
/// over the new connection (`AllocHold`), its command runs on, and its exit releases it.
#[test]
fn an_allocation_outlives_a_controller_restart() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let path = path_with(&c.root().join("no-bin"));
    let err = std::fs::File::create(c.root().join("alloc.err")).unwrap();
    let mut child = Command::new(BIN)
        .args(["alloc", "--cores", "1", "--", "sh", "-c", "sleep 8; echo done > held.txt"])
        .env("BERTH_DIR", &c.dir)
        .env("PATH", &path)
        .env_remove("BERTH_JOB_ID")
        .current_dir(c.root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn berth alloc");
    let id = active_alloc(&c, "running");
    let server = c.pid_of("server");
    // SAFETY: kill(2) of the controller this test started.
    assert_eq!(unsafe { libc::kill(server, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    // SAFETY: signal 0 only checks that the pid exists.
    while unsafe { libc::kill(server, 0) } == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let o = c.berth(&["up"]);
    assert!(o.status.success(), "restart: {}", text(&o.stderr));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("berth alloc did not end: {}", std::fs::read_to_string(c.root().join("alloc.err")).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = std::fs::read_to_string(c.root().join("alloc.err")).unwrap();
    assert!(status.success(), "{status:?}: {err}\n{}", c.logs());
    assert!(err.contains(&format!("holding job {id} again")), "{err}");
    assert_eq!(std::fs::read_to_string(c.root().join("held.txt")).unwrap_or_default(), "done\n", "{err}");
    let j = c.wait_finished(id, Duration::from_secs(20));
    assert_eq!(j["state"].as_str(), Some("completed"), "released by its command's exit: {j:#}");
}
