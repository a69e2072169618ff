//! System test: changing jobs and requeueing them (issue 19, "berth update", `scontrol
//! update`, `scontrol requeue`, `qalter`, `qrerun`; docs/compat.md "Changing jobs"), and
//! `aftercorr` between two arrays, on a live cluster.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// Wait until `cond` holds of job `id`'s record.
fn wait_for(c: &Cluster, id: u64, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let j = c.show(id);
        if cond(&j) {
            return j;
        }
        assert!(t0.elapsed() < LONG, "job {id}: not {what}: {j:#}\nlogs:\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

fn wait_lines(path: &std::path::Path, n: usize) {
    let t0 = Instant::now();
    while lines(path) < n {
        assert!(t0.elapsed() < LONG, "{}: fewer than {n} lines", path.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn update_requeue_and_aftercorr() {
    let c = Cluster::up(1, "package:1 core:4 pu:1");
    let bin = c.root().join("bin");
    c.json(&["compat", "install", &bin.display().to_string()]);

    // A held job: its walltime and cores changed, as `berth show` then says.
    let held = c.submit("held.sh", "#!/bin/sh\ntrue\n", &["--hold", "--walltime", "600", "--cores", "1"]);
    let id = held.to_string();
    let changed = c.json(&["update", &id, "--walltime", "20:00", "--cores", "2"]);
    assert_eq!(changed[0]["id"], held);
    let j = c.show(held);
    assert_eq!((j["walltime_seconds"].as_u64(), j["request"]["cores"].as_u64()), (Some(1200), Some(2)), "{j:#}");
    assert_eq!(j["state"], "held");
    let human = c.berth(&["update", &id, "--name", "renamed"]);
    assert!(human.status.success());
    assert_eq!(text(&human.stdout).trim(), format!("job {held} updated"));
    // An impossible change is refused with the reason, and changes nothing.
    let o = c.berth(&["update", &id, "--cores", "64"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("can never run here"), "{}", text(&o.stderr));
    assert_eq!(c.show(held)["request"]["cores"], 2);
    // Under Slurm's name: TimeLimit in Slurm's formats, relative too; scontrol shows it.
    named_ok(&c, "scontrol", &["update", &format!("JobId={held}"), "TimeLimit=1:30:00", "JobName=slurmy"]);
    let j = c.show(held);
    assert_eq!((j["walltime_seconds"].as_u64(), j["name"].as_str()), (Some(5400), Some("slurmy")));
    named_ok(&c, "scontrol", &["update", &format!("jobid={held}"), "TimeLimit=+30"]);
    assert_eq!(c.show(held)["walltime_seconds"], 7200);
    let record = named_ok(&c, "scontrol", &["show", "job", &id]);
    assert!(record.contains("TimeLimit=02:00:00"), "{record}");
    let o = named(&c, "scontrol", &["update", &format!("JobId={held}"), "NumCPUs=64"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("slurm_update error:"), "{}", text(&o.stderr));
    // Under PBS's: qalter -l walltime.
    named_ok(&c, "qalter", &["-l", "walltime=00:45:00", &id]);
    assert_eq!(c.show(held)["walltime_seconds"], 2700);
    c.json(&["release", &id]);
    let done = c.wait_finished(held, LONG);
    assert_eq!(done["state"], "completed", "{done:#}");
    let cores: u64 = done["allocation"].as_array().unwrap().iter().map(|a| a["cores"].as_u64().unwrap()).sum();
    assert_eq!(cores, 2, "it ran with its new size");

    // A running job requeued runs again from the start; an ended one too (scontrol).
    let runs = c.root().join("runs.txt");
    let go = c.root().join("go");
    let script =
        format!("#!/bin/sh\necho run >> {}\nwhile [ ! -e {} ]; do sleep 0.1; done\n", runs.display(), go.display());
    let r = c.submit("rerun.sh", &script, &[]);
    c.wait_state(r, &["running"], LONG);
    wait_lines(&runs, 1);
    let out = c.berth(&["requeue", &r.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), format!("job {r} requeued"));
    wait_lines(&runs, 2);
    let j = c.wait_state(r, &["running"], LONG);
    assert!(j["start_time"].as_f64().is_some());
    std::fs::write(&go, "").unwrap();
    assert_eq!(c.wait_finished(r, LONG)["state"], "completed");
    let events = c.json(&["events", "--kind", "requeue", "--job", &r.to_string()]);
    assert_eq!(events.as_array().map(Vec::len), Some(1), "{events:#}");
    named_ok(&c, "scontrol", &["requeue", &r.to_string()]);
    wait_lines(&runs, 3);
    assert_eq!(c.wait_finished(r, LONG)["state"], "completed");
    // A pending job is not requeued.
    let p = c.submit("p.sh", "#!/bin/sh\ntrue\n", &["--hold"]);
    let o = c.berth(&["requeue", &p.to_string()]);
    assert!(!o.status.success());

    // aftercorr on a 2-task array: task i of b follows task i of a, and never if it failed.
    let gate = c.root().join("gate");
    let a_script = format!(
        "#!/bin/sh\nwhile [ ! -e {}$BERTH_ARRAY_TASK_ID ]; do sleep 0.1; done\nexit $BERTH_ARRAY_TASK_ID\n",
        gate.display()
    );
    let a = c.submit("a.sh", &a_script, &["--array", "0-1"]);
    let b = c.submit("b.sh", "#!/bin/sh\ntrue\n", &["--array", "0-1", "--dependency", &format!("aftercorr:{a}")]);
    let (a0, a1, b0, b1) = (a, a + 1, b, b + 1);
    for t in [b0, b1] {
        wait_for(&c, t, "waiting for its dependency", |j| {
            j["reason"].as_str().unwrap_or("").starts_with("Dependency:")
        });
    }
    std::fs::write(format!("{}0", gate.display()), "").unwrap();
    assert_eq!(c.wait_finished(a0, LONG)["state"], "completed");
    assert_eq!(c.wait_finished(b0, LONG)["state"], "completed", "its counterpart completed");
    assert_eq!(c.show(b1)["state"], "queued", "task 1 of a still runs");
    std::fs::write(format!("{}1", gate.display()), "").unwrap();
    assert_eq!(c.wait_finished(a1, LONG)["state"], "failed");
    let j = wait_for(&c, b1, "never satisfied", |j| {
        j["reason"].as_str().unwrap_or("").starts_with("DependencyNeverSatisfied")
    });
    assert_eq!(j["state"], "queued");
    c.json(&["cancel", &b1.to_string()]);
}

#[test]
fn an_admin_raises_a_running_jobs_walltime_past_the_one_it_started_with() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    c.json(&["compat", "install", &c.root().join("bin").display().to_string()]);
    let out = c.root().join("raised.out");
    let script = "#!/bin/sh\nsleep 10\necho finished\n";
    let id = c.submit("raised.sh", script, &["--walltime", "6", "--output", &out.display().to_string()]);
    c.wait_state(id, &["running"], LONG);
    // root is an admin: raised well before the 6 s pass; its node is told and keeps it running.
    named_ok(&c, "scontrol", &["update", &format!("JobId={id}"), "TimeLimit=+1"]);
    assert_eq!(c.show(id)["walltime_seconds"], 66, "6 s and one more minute");
    let done = c.wait_finished(id, LONG);
    assert_eq!(done["state"], "completed", "it ran past the 6 s it started with: {done:#}\n{}", c.logs());
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default().trim(), "finished");
}
