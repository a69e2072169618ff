//! System tests of issue 16 (safe against its own users): what a hostile or careless local
//! user submits is refused at submission with a clear error, as that user, before anything is
//! written; and what is accepted runs as that user would expect (its umask).

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A directory the test user owns, with `script` written in it; returns the directory.
fn user_dir(c: &Cluster, name: &str) -> std::path::PathBuf {
    let d = c.root().join(name);
    std::fs::create_dir_all(&d).unwrap();
    let ok = Command::new("chown").args(["berthtest:", &d.display().to_string()]).status().unwrap();
    assert!(ok.success(), "chown berthtest {}", d.display());
    d
}

/// `berth ARGS` as the test user in `cwd`, under `umask`.
fn berth_user(c: &Cluster, cwd: &std::path::Path, umask: &str, args: &[&str]) -> Output {
    let bin = c.root().join("berth-bin");
    if !bin.exists() {
        std::fs::copy(BIN, &bin).unwrap();
    }
    let mut line = format!("umask {umask}; exec {} --dir {}", bin.display(), c.dir.display());
    for a in args {
        line.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
    }
    Command::new("runuser").args(["-u", "berthtest", "--", "sh", "-c", &line]).current_dir(cwd).output().unwrap()
}

/// SIGKILL the cluster's controller and wait until it is gone.
fn kill_controller(c: &Cluster) {
    let pid = c.pid_of("server");
    // SAFETY: kill(2) on the controller this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while pid_alive(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until job `id` has a step in the invocation log.
fn wait_first_step(c: &Cluster, id: u64) {
    let t0 = Instant::now();
    loop {
        let steps = c.json(&["acct", "--steps"]);
        if steps.as_array().is_some_and(|a| a.iter().any(|s| s["job"] == id)) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the first step never started: {steps:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn what_a_user_gives_is_bounded_and_checked_at_submission() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let dir = user_dir(&c, "u");
    let script = dir.join("short.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let s = script.display().to_string();
    let refused = |args: &[&str], code: &str, words: &[&str]| {
        let mut a = vec!["submit"];
        a.extend_from_slice(args);
        let o = berth_user(&c, &dir, "022", &a);
        let e = stderr_of(&o);
        assert!(!o.status.success(), "{args:?} was accepted: {}", String::from_utf8_lossy(&o.stdout));
        assert!(e.contains(code), "{args:?}: no code {code} in {e}");
        for w in words {
            assert!(e.contains(w), "{args:?}: no {w:?} in {e}");
        }
        assert!(!e.chars().any(|ch| ch.is_control() && ch != '\n'), "raw control characters in {e:?}");
    };
    // Item 1: a walltime that overflowed the agent's clock, and every other number.
    refused(&["--walltime", "9223372036854775807", &s], "bad_request", &["--walltime", "365 days"]);
    refused(&["--walltime", "366-00:00:00", &s], "bad_request", &["--walltime"]);
    // Item 10: nonsense.
    refused(&["--mem", "0", &s], "bad_request", &["--mem 0", "1G"]);
    refused(&["--mem-per-cpu", "100", &s], "bad_request", &["--mem-per-cpu"]);
    refused(&["--output", "/nonexistent/dir/x", &s], "", &["/nonexistent/dir", "does not exist"]);
    refused(&["-A", "nosuch", &s], "bad_request", &["account nosuch", "your groups"]);
    // Item 8: names that would forge rows or drive a terminal; a huge name.
    refused(&["--name", "a\nb", &s], "bad_request", &["control character"]);
    refused(&["--name", "x\u{1b}]0;owned\u{7}", &s], "bad_request", &["\\u{1b}"]);
    refused(&["--name", &"n".repeat(120_000), &s], "bad_request", &["120000 bytes"]);
    // Item 9: DOS line endings, refused naming the line and the cure.
    let crlf = dir.join("dos.sh");
    std::fs::write(&crlf, "#!/bin/sh\r\necho hi\r\n").unwrap();
    refused(&[&crlf.display().to_string()], "invalid_script", &["line 1 ends with a carriage return", "dos2unix"]);
    // Item 11: no endless or non-regular input, no huge script.
    let t0 = Instant::now();
    refused(&["/dev/zero"], "", &["not a regular file"]);
    assert!(t0.elapsed() < Duration::from_secs(20), "/dev/zero read for {:?}", t0.elapsed());
    let big = dir.join("big.sh");
    let mut text = b"#!/bin/sh\n".to_vec();
    text.resize(17 << 20, b'#');
    std::fs::write(&big, &text).unwrap();
    refused(&[&big.display().to_string()], "", &["script larger than 16 MiB"]);
    // A hostile name in a directive is refused the same way.
    let named = dir.join("named.sh");
    std::fs::write(&named, "#!/bin/sh\n#BERTH --name \"a\u{1b}[2Jb\"\ntrue\n").unwrap();
    refused(&[&named.display().to_string()], "bad_request", &["control character"]);
    // Reservations for users or accounts that do not exist help nobody.
    let o = c.berth(&["resv", "create", "--duration", "1h", "--users", "nosuchuser"]);
    assert!(!o.status.success() && stderr_of(&o).contains("no user nosuchuser"), "{}", stderr_of(&o));
    let o = c.berth(&["resv", "create", "--duration", "1h", "--accounts", "nosuchgroup"]);
    assert!(!o.status.success() && stderr_of(&o).contains("nosuchgroup is neither a group"), "{}", stderr_of(&o));
    let o = c.berth(&["resv", "create", "--json", "--duration", "1h", "--cores", "1", "--users", "berthtest"]);
    assert!(o.status.success(), "a known user: {}", String::from_utf8_lossy(&o.stdout));
    let made: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = c.berth(&["resv", "delete", made["name"].as_str().expect("its name")]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    // None of the above was written.
    assert_eq!(c.json(&["jobs", "--all"]).as_array().unwrap().len(), 0);

    // The largest walltime allowed is accepted, runs and is cancelled cleanly.
    let sleeper = dir.join("sleep.sh");
    std::fs::write(&sleeper, "#!/bin/sh\nsleep 300\n").unwrap();
    let o = berth_user(
        &c,
        &dir,
        "022",
        &["submit", "--json", "--walltime", "365-00:00:00", &sleeper.display().to_string()],
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
    c.wait_state(id, &["running"], Duration::from_secs(30));
    let o = c.berth(&["cancel", &id.to_string()]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "cancelled", "{j:#}");
    // An output directory that went away after submission: the job fails naming it.
    let gone = user_dir(&c, "gone");
    let out = gone.join("x.out").display().to_string();
    let o = berth_user(&c, &dir, "022", &["submit", "--json", "--hold", "--output", &out, &s]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let held = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
    std::fs::remove_dir(&gone).unwrap();
    assert!(c.berth(&["release", &held.to_string()]).status.success());
    let j = c.wait_finished(held, Duration::from_secs(30));
    let reason = j["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("the directory {} of the output file", gone.display())), "{j:#}");
    // Its cores are free again: the next job starts.
    let o = berth_user(&c, &dir, "022", &["submit", "--json", "--cores", "2", &s]);
    let next = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
    assert_eq!(c.wait_finished(next, Duration::from_secs(30))["state"], "completed");
    assert_no_job_cgroups(&c);
}

/// Item 7: the submitter's umask is the job's, and its output files are made with it.
#[test]
fn the_submitters_umask_is_the_jobs() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let dir = user_dir(&c, "u");
    let script = dir.join("mask.sh");
    let bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &bin).unwrap();
    // The batch script, a step's rank and a task all run with the submitter's umask.
    let text = format!("#!/bin/sh\numask\n{b} run -n 1 sh -c umask\n{b} task wait $({b} task spawn --node 0 --output task.out sh -c umask) >/dev/null\ncat task.out\ntouch made-by-job\n", b = bin.display());
    std::fs::write(&script, text).unwrap();
    let s = script.display().to_string();
    for (mask, file_mode, shown) in [("077", 0o600, "0077"), ("027", 0o640, "0027"), ("002", 0o664, "0002")] {
        let out = dir.join(format!("out-{mask}"));
        let _ = std::fs::remove_file(dir.join("made-by-job"));
        let _ = std::fs::remove_file(dir.join("task.out"));
        let o = berth_user(&c, &dir, mask, &["submit", "--json", "--output", &out.display().to_string(), &s]);
        assert!(o.status.success(), "{}", stderr_of(&o));
        let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
        assert_eq!(c.wait_finished(id, Duration::from_secs(30))["state"], "completed");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, file_mode, "output under umask {mask}: {mode:o}");
        let made = std::fs::metadata(dir.join("made-by-job")).unwrap().permissions().mode() & 0o777;
        assert_eq!(made, file_mode, "a file the job made under umask {mask}: {made:o}");
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text.lines().collect::<Vec<_>>(), [shown, shown, shown], "script, rank, task: {text}");
    }
}

/// Item 6: a job's processes are limited (`[limits] pids_base + pids_per_core x cores`), a
/// fork bomb stays inside it, and the job's end says why it failed.
#[test]
fn a_jobs_processes_are_limited_and_the_limit_is_its_end_reason() {
    let c = Cluster::up_configured(1, "package:1 core:2 pu:1", "[limits]\npids_base = 16\npids_per_core = 8\n");
    let bomb = "#!/bin/sh\ni=0\nwhile [ $i -lt 60 ]; do sleep 60 & i=$((i+1)); done\nwait\n";
    let id = c.submit("bomb.sh", bomb, &["--cores", "1", "--walltime", "120"]);
    let j = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(j["state"], "failed", "{j:#}");
    let reason = j["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("pids_limit: the job reached its limit of 24 processes"), "{j:#}");
    // A job within its limit is not affected.
    let ok = c.submit("ok.sh", "#!/bin/sh\nsleep 0.1 & sleep 0.1 & wait\n", &["--cores", "1"]);
    assert_eq!(c.wait_finished(ok, Duration::from_secs(30))["state"], "completed");
    assert_no_job_cgroups(&c);
}

/// Item 14: a command issued while the controller is down (killed, being restarted) waits
/// for it, says so once, and succeeds when it is back; a submission is not lost.
#[test]
fn commands_wait_out_a_controller_restart() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    kill_controller(&c);
    let script = c.root().join("later.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let submit = Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(["submit", "--json", &script.display().to_string()])
        .current_dir(c.root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The client is waiting (it said so) before the controller comes back.
    std::thread::sleep(Duration::from_millis(1500));
    let o = c.berth(&["up"]);
    assert!(o.status.success(), "restart: {}", stderr_of(&o));
    let o = submit.wait_with_output().unwrap();
    let e = stderr_of(&o);
    assert!(o.status.success(), "the submission during the restart failed: {e}");
    assert_eq!(e.matches("waiting up to 60 s").count(), 1, "{e}");
    let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
    assert_eq!(c.wait_finished(id, Duration::from_secs(30))["state"], "completed");
}

/// Item 13: a step that runs through a controller restart has its end recorded, and its
/// cores are the job's again: the job's next step runs.
#[test]
fn a_steps_end_survives_a_controller_restart() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let script = format!(
        "#!/bin/sh\n#BERTH --cores 2 --walltime 120\n{b} run -n 2 sleep 6; echo \"first=$?\" > steps.txt\n{b} run -n 2 true; echo \"second=$?\" >> steps.txt\n",
        b = BIN
    );
    let id = c.submit("steps.sh", &script, &[]);
    c.wait_state(id, &["running"], Duration::from_secs(30));
    // Wait for the first step to be running, then kill the controller under it.
    wait_first_step(&c, id);
    kill_controller(&c);
    std::thread::sleep(Duration::from_millis(1000));
    let o = c.berth(&["up"]);
    assert!(o.status.success(), "restart: {}", stderr_of(&o));
    let j = c.wait_finished(id, Duration::from_secs(90));
    assert_eq!(j["state"], "completed", "{j:#}");
    let text = std::fs::read_to_string(c.root().join("steps.txt")).unwrap();
    assert_eq!(text, "first=0\nsecond=0\n", "the second step was refused: {}", c.logs());
    let steps = c.json(&["acct", "--steps"]);
    let first = steps.as_array().unwrap().iter().find(|s| s["job"] == id && s["step"] == 1).cloned();
    assert_eq!(first.as_ref().map(|s| s["exit_code"].clone()), Some(serde_json::json!(0)), "{steps:#}");
}

/// Item 12: a request naming very many jobs gets an answer: `berth cancel` sends them in
/// batches; a raw request over the bound is refused whole with a clear error.
#[test]
fn a_request_on_very_many_jobs_gets_an_answer() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let held = c.submit("held.sh", "#!/bin/sh\ntrue\n", &["--hold"]);
    let mut ids: Vec<String> = (1_000_000..1_030_000u64).map(|i| i.to_string()).collect();
    ids.push(held.to_string());
    let mut args = vec!["cancel", "--json"];
    args.extend(ids.iter().map(String::as_str));
    let o = c.berth(&args);
    let results: serde_json::Value = serde_json::from_slice(&o.stdout).expect("an answer for every id");
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 30_001);
    assert!(results.iter().any(|r| r["id"] == held && r["ok"] == true), "the real job is cancelled");
    assert_eq!(c.show(held)["state"], "cancelled");
    // A raw request over the bound: refused, nothing done, said why.
    use berth_protocol::client::{ClientRequest, ClientResponse};
    let other = c.submit("other.sh", "#!/bin/sh\ntrue\n", &["--hold"]);
    let mut many: Vec<berth_core::JobId> = (2_000_000..2_010_001u64).map(berth_core::JobId).collect();
    many.push(berth_core::JobId(other));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let answer = rt.block_on(berth_cli::client::request(&c.dir, ClientRequest::Cancel { ids: many, only: vec![] }));
    let e = format!("{:#}", answer.map(|r: ClientResponse| format!("{r:?}")).unwrap_err());
    assert!(e.contains("10002 job ids") && e.contains("nothing was done"), "{e}");
    assert_eq!(c.show(other)["state"], "held");

    // An answer too large for a frame (2,200 jobs with 4 KB output paths in `berth jobs`) is
    // replaced by an error saying how to ask for less; the connection and controller go on.
    let long = format!("{}x", "./".repeat(1990));
    let sub = |i: usize| berth_protocol::client::SubmitRequest {
        script: "#!/bin/sh\ntrue\n".into(),
        script_name: format!("j{i}"),
        options: berth_core::directives::SubmitOptions {
            output: Some(long.clone()),
            error: Some(long.clone()),
            ..Default::default()
        },
        env: vec![],
        cwd: c.root().display().to_string(),
        hold: true,
        ignore_unsupported: false,
    };
    // A request too large for a frame is refused by the client at once.
    let batch = ClientRequest::SubmitBatch { jobs: (0..2200).map(sub).collect() };
    let e = format!("{:#}", rt.block_on(berth_cli::client::request(&c.dir, batch)).unwrap_err());
    assert!(e.contains("more than a frame holds"), "{e}");
    for part in 0..2 {
        let batch = ClientRequest::SubmitBatch { jobs: (part * 1100..(part + 1) * 1100).map(sub).collect() };
        let r = rt.block_on(berth_cli::client::request(&c.dir, batch)).expect("1,100 held jobs");
        assert!(matches!(r, ClientResponse::SubmittedBatch { ref ids } if ids.len() == 1100), "{r:?}");
    }
    let o = c.berth(&["jobs"]);
    let e = stderr_of(&o);
    assert!(!o.status.success() && e.contains("more than a frame holds") && e.contains("ask for less"), "{e}");
    assert_eq!(c.show(other)["state"], "held", "the controller still answers");
}

/// Item 13: a step whose `berth run` dies while the controller is down (so no closed
/// connection tells the restarted controller) is closed by the agent at the root of its
/// control tree, which saw every rank end and reports it when it registers again: the step's
/// cores are the job's again.
#[test]
fn a_step_whose_run_died_during_a_restart_is_closed_by_its_agents() {
    let c = Cluster::up(2, "package:1 core:2 pu:1");
    let script = format!(
        "#!/bin/sh\n#BERTH --nodes 2 --cores 4 --walltime 120\n{b} run -n 4 sleep 60 &\necho $! > run.pid\nwait\ni=0\nuntil {b} run -n 4 true 2>>refusals.txt; do i=$((i+1)); [ $i -ge 60 ] && break; sleep 0.5; done\necho \"second=$? tries=$i\" > steps.txt\n",
        b = BIN
    );
    let id = c.submit("dies.sh", &script, &[]);
    wait_first_step(&c, id);
    let run_pid: i32 = std::fs::read_to_string(c.root().join("run.pid")).unwrap().trim().parse().unwrap();
    kill_controller(&c);
    // SAFETY: kill(2) on the `berth run` this test's job started.
    assert_eq!(unsafe { libc::kill(run_pid, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(3000));
    let o = c.berth(&["up"]);
    assert!(o.status.success(), "restart: {}", stderr_of(&o));
    let j = c.wait_finished(id, Duration::from_secs(90));
    assert_eq!(j["state"], "completed", "{j:#}");
    let text = std::fs::read_to_string(c.root().join("steps.txt")).unwrap();
    assert!(text.starts_with("second=0 "), "the job's next step never ran: {text}\n{}", c.logs());
    let steps = c.json(&["acct", "--steps"]);
    let first = steps.as_array().unwrap().iter().find(|s| s["job"] == id && s["step"] == 1).cloned().unwrap();
    assert_eq!(first["exit_code"], 137, "closed with its ranks' SIGKILL: {first:#}");
    let ended = c.json(&["events", "--kind", "step_end", "--limit", "100"]);
    assert!(
        ended
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["job"] == id && e["detail"].as_str().unwrap_or("").contains("reported by")),
        "{ended:#}"
    );
}

/// Issue 16 item 13: a step no `run` watches any more (the controller restarted, then its
/// `run` died) whose root agent restarted (its ranks were killed with it, and with them the
/// agent's report) is closed when that agent registers again: the job's next step gets its
/// cores instead of being refused for ever.
#[test]
fn a_step_whose_root_agent_restarted_is_closed_when_it_registers() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let script = format!(
        "#!/bin/sh\n#BERTH --cores 2 --walltime 120\n{b} run -n 2 sleep 60 &\necho $! > run.pid\nwait\ni=0\nuntil {b} run -n 2 true 2>>refusals.txt; do i=$((i+1)); [ $i -ge 60 ] && break; sleep 0.5; done\necho \"second=$? tries=$i\" > steps.txt\n",
        b = BIN
    );
    let id = c.submit("rooted.sh", &script, &[]);
    wait_first_step(&c, id);
    let run_pid: i32 = std::fs::read_to_string(c.root().join("run.pid")).unwrap().trim().parse().unwrap();
    kill_controller(&c);
    let agent = c.pid_of("node1");
    // SAFETY: kill(2) on the agent this test started.
    assert_eq!(unsafe { libc::kill(agent, libc::SIGKILL) }, 0);
    while pid_alive(agent) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The run may already have ended by itself (its root agent's stream closed with the
    // agent, and the script's `wait` reaped it): either way no run watches the step any more.
    // SAFETY: kill(2) on the `berth run` this test's job started.
    let killed = unsafe { libc::kill(run_pid, libc::SIGKILL) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert!(killed == 0 || errno == Some(libc::ESRCH), "kill run: {killed} {errno:?}");
    let o = c.berth(&["up"]);
    assert!(o.status.success(), "restart: {}", stderr_of(&o));
    let j = c.wait_finished(id, Duration::from_secs(90));
    assert_eq!(j["state"], "completed", "{j:#}");
    let text = std::fs::read_to_string(c.root().join("steps.txt")).unwrap();
    let refusals = std::fs::read_to_string(c.root().join("refusals.txt")).unwrap_or_default();
    assert!(text.starts_with("second=0 "), "the job's next step never ran: {text}\n{refusals}\n{}", c.logs());
    let steps = c.json(&["acct", "--steps"]);
    let first = steps.as_array().unwrap().iter().find(|s| s["job"] == id && s["step"] == 1).cloned().unwrap();
    assert!(first["end_time"].is_number(), "{first:#}");
    assert!(
        first["failure"].as_str().unwrap_or("").contains("agent at the root of its control tree no longer runs it"),
        "{first:#}"
    );
}
