//! System test: an agent killed with SIGKILL and restarted while its jobs run re-adopts them
//! (found by their cgroups): they finish normally, with the same processes, a job that ended
//! while the agent was down is reported with its exit status, a re-adopted job can still be
//! cancelled, and nothing is left behind.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn wait_file(path: &Path, lines: usize, timeout: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= lines {
            return text;
        }
        assert!(t0.elapsed() < timeout, "{} never got {lines} line(s): {text:?}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start time (field 22 of /proc/<pid>/stat) of a live process.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()
}

/// The job cgroups of `node` in every mounted v1 hierarchy (or v2).
fn job_cgroups(cluster: &str, node: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    for base in ["cpuset", "memory", "freezer", "cpuacct", "cpu,cpuacct", "pids", ""] {
        let dir = Path::new("/sys/fs/cgroup").join(base).join("berth").join(cluster).join(node);
        if let Ok(rd) = std::fs::read_dir(&dir) {
            out.extend(rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("job_")).map(|e| e.path()));
        }
    }
    out
}

/// Events of the controller's store (kind, job, node).
fn events(c: &Cluster) -> Vec<(String, Option<i64>, Option<String>)> {
    let db = c.dir.join("controller").join("state.db");
    let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = conn.prepare("SELECT kind, job_id, node FROM events ORDER BY rowid").unwrap();
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap();
    rows.map(|r| r.unwrap()).collect()
}

#[test]
fn agent_restart_readopts_running_jobs_and_reports_ended_ones() {
    // A node is down after 10 missed heartbeats here, not 3: the restart below (a pause, then
    // `berth up`) must not race the detection on a loaded machine. The only test of this
    // binary, so the variable (read by the controller `berth up` starts) reaches no other.
    std::env::set_var("BERTH_HEARTBEAT_MISSES", "10");
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    // Every job on node1: node2 takes no work.
    c.json(&["node", "drain", "node2"]);
    let root = c.root().to_path_buf();
    let a_log = root.join("a.log");
    let a_marks = root.join("a.marks");
    let b_log = root.join("b.log");
    let c_log = root.join("c.log");
    let a = c.submit(
        "a.sh",
        &format!(
            "#!/bin/sh\necho start $$ >> {log}\ni=0\nwhile [ $i -lt 10 ]; do i=$((i+1)); echo $i >> {marks}; sleep 1; done\necho end $$ >> {log}\nexit 0\n",
            log = a_log.display(),
            marks = a_marks.display()
        ),
        &["--cores", "1"],
    );
    let cj = c.submit(
        "c.sh",
        &format!("#!/bin/sh\necho start $$ >> {}\nsleep 300\n", c_log.display()),
        &["--cores", "1", "--name", "to-cancel"],
    );
    for id in [a, cj] {
        c.wait_state(id, &["running"], Duration::from_secs(20));
    }
    let a_start = wait_file(&a_log, 1, Duration::from_secs(20));
    wait_file(&c_log, 1, Duration::from_secs(20));
    let a_pid: i32 = a_start.split_whitespace().nth(1).unwrap().parse().unwrap();
    let a_started = start_time(a_pid).expect("job A's script runs");
    // B ends about a second after it starts: while node1's agent is down.
    let b = c.submit(
        "b.sh",
        &format!("#!/bin/sh\necho start $$ >> {}\nsleep 1\nexit 7\n", b_log.display()),
        &["--cores", "1"],
    );
    c.wait_state(b, &["running"], Duration::from_secs(20));
    wait_file(&b_log, 1, Duration::from_secs(20));
    // The agent reports a job started (its cgroups) once its record is durable: a kill before
    // that is an agent that never knew the job (on a busy disk the fsync can take seconds).
    let t0 = Instant::now();
    loop {
        let j = c.show(b);
        if j["cgroups"].as_array().is_some_and(|a| !a.is_empty()) || j["state"] != "running" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "B's start never reported: {j:#}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    let jobs = c.json(&["jobs"]);
    for id in [a, b, cj] {
        let j = jobs.as_array().unwrap().iter().find(|j| j["id"] == id).unwrap_or_else(|| panic!("{id}: {jobs:#}"));
        assert_eq!(j["allocation"][0]["node"], "node1", "{j:#}");
    }

    // Watch node1's state through the restart.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let watcher = {
        let (stop, seen, dir) = (stop.clone(), seen.clone(), c.dir.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = std::process::Command::new(BIN).arg("--dir").arg(&dir).args(["nodes", "--json"]).output();
                if let Ok(v) = out.map(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout)) {
                    if let Some(n) =
                        v.ok().and_then(|v| v.as_array().and_then(|a| a.iter().find(|n| n["name"] == "node1").cloned()))
                    {
                        seen.lock().unwrap().push(n["state"].as_str().unwrap_or("").to_string());
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let agent = c.pid_of("node1");
    // SAFETY: kill(2) on the agent this test started.
    assert_eq!(unsafe { libc::kill(agent, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(c.show(b)["state"], "running", "B ended while its agent was down: nobody could tell yet");
    let out = c.berth(&["up"]);
    assert!(
        out.status.success(),
        "restart: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(c.pid_of("node1"), agent);

    // B ended while the agent was down: reported with its exit status.
    let jb = c.wait_finished(b, Duration::from_secs(20));
    assert_eq!(jb["state"], "failed", "{jb:#}");
    assert_eq!(jb["exit_code"], 7, "{jb:#}");

    // C was re-adopted: cancelling it works as before.
    assert_eq!(c.show(cj)["state"], "running");
    assert!(c.berth(&["cancel", &cj.to_string()]).status.success());
    let jc = c.wait_finished(cj, Duration::from_secs(20));
    assert_eq!(jc["state"], "cancelled", "{jc:#}");

    // A runs on in the same process and completes normally.
    assert_eq!(start_time(a_pid), Some(a_started), "job A's script is the same process after the restart");
    let ja = c.wait_finished(a, Duration::from_secs(30));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(ja["state"], "completed", "{ja:#}\n{}", c.logs());
    assert_eq!(ja["exit_code"], 0, "{ja:#}");
    let marks: Vec<String> = std::fs::read_to_string(&a_marks).unwrap().lines().map(String::from).collect();
    assert_eq!(marks, (1..=10).map(|i| i.to_string()).collect::<Vec<_>>(), "A's marker");
    // Nothing ran twice: one start per job, A's end by the same shell.
    assert_eq!(std::fs::read_to_string(&a_log).unwrap(), format!("start {a_pid}\nend {a_pid}\n"));
    assert_eq!(std::fs::read_to_string(&b_log).unwrap().lines().count(), 1);
    assert_eq!(std::fs::read_to_string(&c_log).unwrap().lines().count(), 1);

    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty() && seen.iter().all(|s| s != "down"), "node1 was reported down: {seen:?}");
    let ev = events(&c);
    assert!(!ev.iter().any(|(k, _, n)| k == "node_down" && n.as_deref() == Some("node1")), "{ev:?}");
    let readopted: Vec<i64> = ev.iter().filter(|(k, _, _)| k == "job_readopted").filter_map(|(_, j, _)| *j).collect();
    assert!(readopted.contains(&(a as i64)) && readopted.contains(&(cj as i64)), "{ev:?}");
    assert!(!readopted.contains(&(b as i64)), "B had ended: {ev:?}");
    assert!(!ev.iter().any(|(k, _, _)| k == "node_fail"), "{ev:?}");

    // Nothing is left: cgroups, spool directories, job records.
    let cluster = c.cluster_id();
    let t0 = Instant::now();
    loop {
        let left = job_cgroups(&cluster, "node1");
        let spool = PathBuf::from(format!("/tmp/berth/{cluster}-node1"));
        // The agent's spare (made ahead for the next job) and its `berth-rsh` link (for MPI
        // launchers inside jobs) are no job's.
        let spools: Vec<_> = std::fs::read_dir(&spool)
            .map(|rd| {
                rd.flatten().map(|e| e.path()).filter(|p| !p.ends_with(".spare") && !p.ends_with("berth-rsh")).collect()
            })
            .unwrap_or_default();
        let state = c.dir.join("agents/node1");
        let mut records: Vec<_> = std::fs::read_dir(state.join("jobs"))
            .map(|rd| rd.flatten().map(|e| e.path().display().to_string()).collect::<Vec<_>>())
            .unwrap_or_default();
        records.extend(unacked_ends(&state.join("ended.log")).into_iter().map(|id| format!("end of job {id}")));
        if left.is_empty() && spools.is_empty() && records.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "left behind: cgroups {left:?}, spool {spools:?}, records {records:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!pid_alive(a_pid));
    // And the node takes work again.
    let d = c.submit("d.sh", "#!/bin/sh\nexit 0\n", &["--cores", "1"]);
    assert_eq!(c.wait_finished(d, Duration::from_secs(20))["state"], "completed");
}

/// The jobs whose end an agent's end log (`ended.log`) holds unacknowledged: `E <id> ...`
/// lines without a later `A <id>`.
fn unacked_ends(log: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split(' ');
        match (words.next(), words.next().and_then(|w| w.parse::<u64>().ok())) {
            (Some("E"), Some(id)) => {
                open.insert(id);
            }
            (Some("A"), Some(id)) => {
                open.remove(&id);
            }
            _ => {}
        }
    }
    open.into_iter().collect()
}
