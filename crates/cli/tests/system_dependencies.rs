//! System test: job dependencies, begin times and holds at submission (issue 19, "Batch
//! essentials"; docs/compat.md), natively and through sbatch/qsub/squeue on a live cluster; a
//! waiting dependency survives a controller restart.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// squeue's reason for job `id` (`%r`).
fn squeue_reason(c: &Cluster, id: u64) -> String {
    named_ok(c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%r"]).trim().to_string()
}

fn reason(j: &Value) -> &str {
    j["reason"].as_str().unwrap_or("")
}

/// Wait until job `id`'s reason starts with `prefix` (the first pass after a change sets it).
fn wait_reason(c: &Cluster, id: u64, prefix: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let j = c.show(id);
        if reason(&j).starts_with(prefix) {
            return j;
        }
        assert!(t0.elapsed() < LONG, "job {id}: no reason {prefix:?}: {j:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dependencies_begin_times_and_holds() {
    let c = Cluster::up(1, "package:1 core:4 pu:1");
    let bin = c.root().join("bin");
    c.json(&["compat", "install", &bin.display().to_string()]);
    let go = c.root().join("go");
    // A waits for the test's go-ahead, then succeeds.
    let a = c.submit("a.sh", &format!("#!/bin/sh\nwhile [ ! -e {} ]; do sleep 0.1; done\n", go.display()), &[]);
    let b = c.submit("b.sh", "#!/bin/sh\ntrue\n", &["--dependency", &format!("afterok:{a}")]);
    let cc = c.submit("c.sh", "#!/bin/sh\ntrue\n", &["-d", &format!("afternotok:{a}")]);
    // #SBATCH lines carry them too: a begin time a few seconds ahead, and a hold.
    let d = c.submit("d.sh", "#!/bin/sh\n#SBATCH --begin=now+3\ntrue\n", &[]);
    let held = c.submit("held.sh", "#!/bin/sh\n#SBATCH -H\ntrue\n", &[]);
    let d_submitted = c.show(d)["submit_time"].as_f64().unwrap();
    c.wait_state(a, &["running"], LONG);

    let jb = wait_reason(&c, b, "Dependency:");
    assert_eq!((jb["state"].as_str(), jb["dependency"].as_str()), (Some("queued"), Some(&*format!("afterok:{a}"))));
    wait_reason(&c, cc, "Dependency:");
    assert_eq!(c.show(held)["state"], "held");
    assert_eq!(squeue_reason(&c, b), "Dependency");
    assert_eq!(squeue_reason(&c, held), "JobHeldUser");
    let q = named_ok(&c, "qstat", &[&b.to_string()]);
    assert!(
        q.lines().any(|l| l.starts_with(&format!("{b}.")) && l.contains(" H ")),
        "qstat: held by a dependency\n{q}"
    );
    let detail = text(&c.berth(&["show", &b.to_string()]).stdout);
    assert!(detail.contains(&format!("dependency: afterok:{a}")) && detail.contains("reason: Dependency"), "{detail}");
    let record = named_ok(&c, "scontrol", &["show", "job", &b.to_string()]);
    assert!(record.contains(&format!("Dependency=afterok:{a}")) && record.contains("Reason=Dependency"), "{record}");

    // D waits for its time (BeginTime), then runs.
    let jd = c.show(d);
    if jd["state"] == "queued" {
        assert!(reason(&jd).starts_with("BeginTime") || reason(&jd).is_empty(), "{jd:#}");
    }
    let jd = c.wait_finished(d, LONG);
    assert_eq!(jd["state"], "completed");
    let began = jd["start_time"].as_f64().unwrap();
    assert!(began >= d_submitted + 2.5, "--begin=now+3 started {:.1} s after submission", began - d_submitted);
    assert!(jd["begin_time"].as_f64().is_some_and(|t| (t - d_submitted - 3.0).abs() < 1.5), "{jd:#}");

    // The controller restarts while B and C wait: they keep their dependency.
    let pid = c.pid_of("server");
    // SAFETY: kill(2) on the controller this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    while pid_alive(pid) {
        assert!(t0.elapsed() < LONG, "the killed controller lingers");
        std::thread::sleep(Duration::from_millis(20));
    }
    let up = c.berth(&["up"]);
    assert!(up.status.success(), "restart: {}", text(&up.stderr));
    let jb = wait_reason(&c, b, "Dependency:");
    assert_eq!(jb["dependency"].as_str(), Some(&*format!("afterok:{a}")));
    assert_eq!(c.show(a)["state"], "running", "A ran on through the restart");

    // A succeeds: B runs after it; C can never run and says so.
    std::fs::write(&go, "").unwrap();
    let ja = c.wait_finished(a, LONG);
    assert_eq!(ja["state"], "completed");
    let jb = c.wait_finished(b, LONG);
    assert_eq!(jb["state"], "completed");
    assert!(jb["start_time"].as_f64().unwrap() >= ja["end_time"].as_f64().unwrap(), "B started before A ended");
    let jc = wait_reason(&c, cc, "DependencyNeverSatisfied");
    assert_eq!(jc["state"], "queued", "never satisfied: it waits, and never runs (Slurm's default)");
    assert_eq!(squeue_reason(&c, cc), "DependencyNeverSatisfied");
    let default = named_ok(&c, "squeue", &["-h", "-j", &cc.to_string()]);
    assert!(default.contains("(DependencyNeverSatisfied)"), "{default}");
    assert!(c.berth(&["cancel", &cc.to_string()]).status.success());
    assert_eq!(c.wait_finished(cc, LONG)["state"], "cancelled");

    // The hold: released, it runs.
    assert!(c.berth(&["release", &held.to_string()]).status.success());
    assert_eq!(c.wait_finished(held, LONG)["state"], "completed");

    // A failing job, through the dialects: sbatch -d afterok never runs, qsub -W
    // depend=afternotok (PBS's N.server id) does.
    let f = named_ok(&c, "sbatch", &["--parsable", "--wrap", "exit 1"]).trim().parse::<u64>().unwrap();
    let ok = named_ok(&c, "sbatch", &["--parsable", "-d", &format!("afterok:{f}"), "--wrap", "true"]);
    let ok: u64 = ok.trim().parse().unwrap();
    let notok = named_ok(&c, "qsub", &["-W", &format!("depend=afternotok:{f}.server"), "--", "/bin/true"]);
    let notok: u64 = notok.trim().split('.').next().unwrap().parse().unwrap();
    assert_eq!(c.wait_finished(f, LONG)["state"], "failed");
    assert_eq!(c.wait_finished(notok, LONG)["state"], "completed");
    let jok = wait_reason(&c, ok, "DependencyNeverSatisfied");
    assert!(reason(&jok).contains(&format!("job {f} ended failed")), "{jok:#}");
    assert!(c.berth(&["cancel", &ok.to_string()]).status.success());

    // Refused at submission: an unknown job, a malformed list, a time more than a year ahead.
    let script = c.root().join("b.sh").display().to_string();
    for (flags, needle) in [
        (vec!["--dependency", "afterok:99999"], "job 99999 does not exist"),
        (vec!["--dependency", "afterok:x"], "not a job id"),
        (vec!["--begin", "now+400days"], "a year"),
    ] {
        let mut args = vec!["submit"];
        args.extend(flags.iter().copied());
        args.push(&script);
        let o = c.berth(&args);
        assert!(!o.status.success(), "{flags:?} accepted");
        assert!(text(&o.stderr).contains(needle), "{flags:?}: {}", text(&o.stderr));
    }
    let o = named(&c, "sbatch", &["-d", "afterok:99999", "--wrap", "true"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("does not exist"), "{}", text(&o.stderr));
}
