//! System test: job arrays (issue 19, "Batch essentials"; docs/compat.md "Arrays") on a live
//! cluster: `#SBATCH --array=1-4%2` runs its four tasks two at a time, each writing
//! `%A_%a.out` with its `SLURM_ARRAY_TASK_ID`; tasks are shown `A_i` by `berth jobs` and
//! squeue; `scancel A_i` cancels one task, `scancel A` every task of an array.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(90);

/// The active tasks of array `a` (`berth jobs --json`).
fn tasks(c: &Cluster, a: u64) -> Vec<Value> {
    let jobs = c.json(&["jobs"]);
    let list = jobs.as_array().cloned().or_else(|| jobs["jobs"].as_array().cloned()).unwrap_or_default();
    list.into_iter().filter(|j| j["array_job"].as_u64() == Some(a)).collect()
}

/// Nanosecond times after `key ` in a task's output.
fn stamp(out: &str, key: &str) -> u128 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {out:?}"))
}

#[test]
fn arrays_run_within_their_limit_and_cancel_whole_or_one_task() {
    let c = Cluster::up(1, "package:1 core:4 pu:1");
    let bin = c.root().join("bin");
    c.json(&["compat", "install", &bin.display().to_string()]);

    // Four tasks, at most two at once, on a node with room for four.
    let a = c.submit(
        "arr.sh",
        "#!/bin/sh\n#SBATCH --array=1-4%2\n#SBATCH -o %A_%a.out -t 5\necho \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID count $SLURM_ARRAY_TASK_COUNT pbs $PBS_ARRAY_INDEX berth $BERTH_ARRAY_TASK_ID\"\necho \"start $(date +%s%N)\"\nsleep 1.5\necho \"end $(date +%s%N)\"\n",
        &[],
    );
    let ids: Vec<u64> = (a..a + 4).collect();
    let t0 = Instant::now();
    let mut max_running = 0;
    let mut saw_limit_reason = false;
    let mut saw_shown = false;
    let mut saw_folded = false;
    loop {
        let live = tasks(&c, a);
        let running = live.iter().filter(|j| j["state"] == "running").count();
        max_running = max_running.max(running);
        saw_limit_reason |= live.iter().any(|j| j["reason"].as_str().unwrap_or("").starts_with("JobArrayTaskLimit"));
        if !saw_shown && !live.is_empty() {
            let table = text(&c.berth(&["jobs"]).stdout);
            saw_shown = table.contains(&format!("{a}_"));
            let q = named_ok(&c, "squeue", &["-h", "-o", "%i %A %r"]);
            assert!(q.contains(&format!("{a}_")), "squeue shows A_i: {q}");
        }
        if live.iter().filter(|j| j["state"] == "queued").count() >= 2 {
            // squeue folds an array's queued tasks into one line (`-r`: one per task).
            let q = named_ok(&c, "squeue", &["-h", "-o", "%i %t"]);
            saw_folded |= q.lines().any(|l| l.starts_with(&format!("{a}_[")) && l.ends_with("%2] PD"));
            let r = named_ok(&c, "squeue", &["-h", "-r", "-o", "%i"]);
            assert!(!r.contains('['), "squeue -r: {r}");
        }
        if live.is_empty() {
            break;
        }
        assert!(t0.elapsed() < LONG, "array {a} not done: {live:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(max_running <= 2, "{max_running} tasks ran at once");
    assert!(saw_limit_reason, "no task waited with reason JobArrayTaskLimit");
    assert!(saw_shown, "berth jobs shows A_i");
    assert!(saw_folded, "squeue never showed the queued tasks as {a}_[...%2]");
    let mut spans = Vec::new();
    for (k, id) in ids.iter().enumerate() {
        let j = c.wait_finished(*id, LONG);
        assert_eq!(j["state"], "completed", "{j:#}");
        assert_eq!((j["array_job"].as_u64(), j["array_index"].as_u64()), (Some(a), Some(k as u64 + 1)));
        let path = c.root().join(format!("{a}_{}.out", k + 1));
        let out = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            out.contains(&format!("task {} of {a} count 4 pbs {} berth {}", k + 1, k + 1, k + 1)),
            "{}: {out}",
            path.display()
        );
        spans.push((stamp(&out, "start"), stamp(&out, "end")));
    }
    assert_eq!(c.json(&["show", &format!("{a}_2")])["id"].as_u64(), Some(a + 1), "berth show A_i");
    let record = named_ok(&c, "scontrol", &["show", "job", &(a + 2).to_string()]);
    assert!(record.contains(&format!("ArrayJobId={a} ArrayTaskId=3")), "{record}");
    // From the tasks' own clocks too: never three at once.
    for (s, _) in &spans {
        let at_once = spans.iter().filter(|(s2, e2)| s2 <= s && s < e2).count();
        assert!(at_once <= 2, "{at_once} tasks ran at once: {spans:?}");
    }

    // Another array through sbatch: one task cancelled by A_i, then all by A.
    let long = c.root().join("long.sh");
    std::fs::write(&long, "#!/bin/sh\nsleep 60\n").unwrap();
    let out = named_ok(&c, "sbatch", &["--parsable", "-a", "0-5", "-o", "/dev/null", &long.display().to_string()]);
    let b: u64 = out.trim().parse().unwrap_or_else(|_| panic!("sbatch --parsable: {out:?}"));
    c.wait_state(b, &["running"], LONG);
    named_ok(&c, "scancel", &[&format!("{b}_5")]);
    let j = c.wait_finished(b + 5, LONG);
    assert_eq!(j["state"], "cancelled");
    assert!(tasks(&c, b).iter().all(|j| j["state"] != "cancelled"), "only task 5 cancelled");
    assert_eq!(tasks(&c, b).len(), 5);
    // `A_0` names the first task alone, though its id is the array's (`berth cancel` too).
    let o = c.berth(&["cancel", &format!("{b}_0")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(c.wait_finished(b, LONG)["state"], "cancelled");
    assert_eq!(tasks(&c, b).len(), 4, "only task 0 cancelled: {:?}", tasks(&c, b));
    let o = named(&c, "scancel", &[&format!("{b}_9")]);
    assert!(!o.status.success() && text(&o.stderr).contains("Invalid job id"), "{}", text(&o.stderr));
    named_ok(&c, "scancel", &[&b.to_string()]);
    for id in b + 1..b + 5 {
        assert_eq!(c.wait_finished(id, LONG)["state"], "cancelled", "task {id}");
    }
    // Too big an array is refused, saying why.
    let o = c.berth(&["submit", "--array", "0-20000", &long.display().to_string()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("max_array_size"), "{}", text(&o.stderr));
}
