//! System test (issue 19, "Batch essentials"): `berth submit --wrap` and `berth submit -`
//! (the script on standard input), `berth wait` (the job's exit status; every task of an
//! array; `--timeout`), `berth jobs --me/--queue/--state/--array`, and an array's pending
//! tasks folded into one line by `berth jobs` and squeue (read by a shell snippet written for
//! Slurm), and shown as one `A[].server` line by qstat (`-t`: its subjobs).

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// `berth ARGS` with `stdin` on its standard input.
fn berth_stdin(c: &Cluster, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(args)
        .current_dir(c.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// A shell snippet, with the installed command names first on PATH and the cluster's dir.
fn sh(c: &Cluster, script: &str) -> String {
    let path = format!("{}:{}", c.root().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new("sh")
        .args(["-c", script])
        .env("PATH", path)
        .env("BERTH_DIR", &c.dir)
        .current_dir(c.root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{script}: {}{}", text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

fn ids(list: &Value) -> Vec<u64> {
    list.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect()
}

#[test]
fn wait_wrap_stdin_filters_and_folding() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    c.json(&["compat", "install", &c.root().join("bin").display().to_string()]);

    // --wrap: a job that exits 3; `berth wait` exits 3 and says so.
    let wrapped = c.json(&["submit", "--wrap", "sleep 0.3; exit 3"])["id"].as_u64().unwrap();
    let o = c.berth(&["wait", &wrapped.to_string()]);
    assert_eq!(o.status.code(), Some(3), "{}{}", text(&o.stdout), text(&o.stderr));
    assert_eq!(text(&o.stdout), format!("job {wrapped}: failed, exit code 3; exit 3\n"));
    let j = c.show(wrapped);
    assert_eq!((j["name"].as_str(), j["exit_code"].as_i64()), (Some("wrap"), Some(3)));

    // `-`: an array of 3 from standard input, on 2 cores: task 2 starts only once one of the
    // first two ended. The wait returns when all three have ended, with the highest status.
    let script = "#!/bin/sh\nsleep 1\necho \"task $BERTH_ARRAY_TASK_ID\"\nexit $BERTH_ARRAY_TASK_ID\n";
    let o = berth_stdin(&c, &["submit", "--json", "--array", "0-2", "--output", "%A_%a.out", "-"], script);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let a = serde_json::from_slice::<Value>(&o.stdout).unwrap()["id"].as_u64().unwrap();
    let t0 = Instant::now();
    let o = c.berth(&["wait", "--json", &a.to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}{}", text(&o.stdout), text(&o.stderr));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["exit"], 2);
    assert_eq!(report["jobs"][0]["tasks"], 3, "{report:#}");
    assert_eq!(report["jobs"][0]["task_states"]["failed"], 2, "{report:#}");
    assert!(t0.elapsed() >= Duration::from_millis(1500), "returned before the third task could end");
    for (k, id) in (a..a + 3).enumerate() {
        let j = c.show(id);
        assert!(
            ["completed", "failed"].contains(&j["state"].as_str().unwrap()),
            "task {k} not ended when the wait returned: {j:#}"
        );
        assert_eq!(j["name"], "stdin");
        let out = std::fs::read_to_string(c.root().join(format!("{a}_{k}.out"))).unwrap();
        assert_eq!(out, format!("task {k}\n"));
    }
    // A_i waits for that task alone.
    let o = c.berth(&["wait", &format!("{a}_1")]);
    assert_eq!(o.status.code(), Some(1));
    // An empty standard input is refused saying why.
    let o = berth_stdin(&c, &["submit", "-"], "");
    assert!(!o.status.success() && text(&o.stderr).contains("empty"), "{}", text(&o.stderr));

    // An array of 6 that runs one task at a time: 1 running, 5 pending for the same reason.
    let b = c.submit("long.sh", "#!/bin/sh\nsleep 30\n", &["--array", "0-5%1", "--output", "/dev/null"]);
    c.wait_state(b, &["running"], LONG);
    let t0 = Instant::now();
    while !c
        .json(&["jobs", "--array", &b.to_string()])
        .as_array()
        .unwrap()
        .iter()
        .all(|j| j["state"] == "running" || j["reason"].as_str().unwrap_or("").starts_with("JobArrayTaskLimit"))
    {
        assert!(t0.elapsed() < LONG, "tasks never all waiting for the limit");
        std::thread::sleep(Duration::from_millis(100));
    }
    // --timeout: gives up with 124, saying what has not ended.
    let o = c.berth(&["wait", "--timeout", "0", &b.to_string()]);
    assert_eq!(o.status.code(), Some(124), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).contains("not ended"), "{}", text(&o.stdout));

    // berth jobs folds the pending tasks; -r one line per task; JSON one object per task.
    let table = text(&c.berth(&["jobs", "--array", &b.to_string()]).stdout);
    let first: Vec<&str> = table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(first, vec![format!("{b}_0"), format!("{b}_[1-5%1]")], "{table}");
    let table = text(&c.berth(&["jobs", "-r", "--array", &b.to_string()]).stdout);
    assert_eq!(table.lines().count(), 7, "{table}");
    assert_eq!(c.json(&["jobs", "--array", &b.to_string()]).as_array().unwrap().len(), 6);

    // Filters.
    assert_eq!(ids(&c.json(&["jobs", "--state", "running"])), vec![b]);
    assert_eq!(
        ids(&c.json(&["jobs", "--state", "queued,held", "--array", &b.to_string()])),
        (b + 1..b + 6).collect::<Vec<_>>()
    );
    assert_eq!(ids(&c.json(&["jobs", "--state", "failed", "--array", &a.to_string()])), vec![a + 1, a + 2]);
    let queue = c.show(b)["queue"].as_str().unwrap().to_string();
    assert_eq!(ids(&c.json(&["jobs", "--queue", &queue])).len(), 6);
    assert!(ids(&c.json(&["jobs", "--queue", "nosuchqueue"])).is_empty());
    assert_eq!(ids(&c.json(&["jobs", "--me"])).len(), 6, "root's own");
    let o = c.berth_as("berthtest", &["jobs", "--me", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&o.stdout).unwrap(), serde_json::json!([]), "berthtest has none");

    // squeue folds them as Slurm does, for a snippet written for Slurm to read.
    let out = sh(
        &c,
        "squeue -h -o '%i %t' | while read id st; do case $id in *_\\[*\\]) echo \"folded ${id%%_*} ${id#*_} $st\";; *) echo \"one $id $st\";; esac; done",
    );
    assert_eq!(out, format!("one {b}_0 R\nfolded {b} [1-5%1] PD\n"));
    let out = sh(&c, "squeue -h -r -o '%i' | wc -l");
    assert_eq!(out.trim(), "6");
    // qstat: the array is one line (state B: begun); -t adds its subjobs.
    let out = sh(&c, "qstat | awk 'NR>2 {print $1, $5}'");
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        vec![format!("{b}[].{}", server(&out)), "B".into()],
        "{out}"
    );
    let out = sh(&c, "qstat -t | awk 'NR>2 {print $1}' | cut -d. -f1");
    let mut expect = vec![format!("{b}[]")];
    expect.extend((0..6).map(|i| format!("{b}[{i}]")));
    assert_eq!(out.lines().collect::<Vec<_>>(), expect, "{out}");
    c.berth(&["cancel", &b.to_string()]);
}

/// The server part of a qstat id in `out` (`12[].host` -> `host`).
fn server(out: &str) -> String {
    out.split_whitespace().next().and_then(|id| id.split_once('.')).map(|(_, s)| s.to_string()).unwrap_or_default()
}
