//! System tests of generic resources and licenses (issue 20) on a real controller and two
//! real agents: `[licenses] matlab = 4` and `[gres] node2 = { nvme = 800 }` in berth.toml.

mod common;

use common::*;
use std::time::Duration;

const TOML: &str = "[licenses]\nmatlab = 4\n\n[gres]\nnode2 = { nvme = 800 }\n";

/// Two jobs each wanting 3 of the 4 licenses, on a cluster with cores for both: the second
/// waits (its reason names the license) and starts only once the first has ended. A job
/// wanting `--gres=nvme:500` runs on node2, the only node with nvme. The views count them.
#[test]
fn licenses_serialize_jobs_and_gres_pick_the_node() {
    let c = Cluster::up_configured(2, "package:1 core:2 pu:1", TOML);
    c.json(&["compat", "install", &c.root().join("bin").display().to_string()]);
    // The first holds its licenses until told to go: a file it waits for.
    let go = c.root().join("go");
    let first = format!(
        "#!/bin/sh\n#SBATCH -L matlab:3\ndate +%s.%N > first.start\nwhile [ ! -e {} ]; do sleep 0.1; done\ndate +%s.%N > first.end\n",
        go.display()
    );
    let a = c.submit("first.sh", &first, &[]);
    c.wait_state(a, &["running"], Duration::from_secs(60));
    let second = "#!/bin/sh\n#BERTH --licenses matlab:3\ndate +%s.%N > second.start\n";
    let b = c.submit("second.sh", second, &[]);
    // Cores are free on the other node: only the licenses hold it back.
    std::thread::sleep(Duration::from_secs(3));
    let shown = c.show(b);
    assert_eq!(shown["state"], "queued", "{shown:#}\n{}", c.logs());
    let reason = shown["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("license matlab: 3 wanted, 1 of 4 free"), "{reason}");
    let lic = c.json(&["licenses"]);
    assert_eq!(lic, serde_json::json!([{"name": "matlab", "total": 4, "used": 3}]), "{lic:#}");
    let text = String::from_utf8_lossy(&c.berth(&["licenses"]).stdout).into_owned();
    assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["matlab", "4", "3", "1"]), "{text}");
    let scontrol = named_ok(&c, "scontrol", &["show", "licenses"]);
    assert!(scontrol.contains("LicenseName=matlab") && scontrol.contains("Total=4 Used=3 Free=1"), "{scontrol}");

    // The gres job: on node2 only, counted there.
    let g = c.submit("gres.sh", "#!/bin/sh\nhostname > gres.host\nsleep 2\n", &["--gres", "nvme:500"]);
    let job = c.wait_state(g, &["running", "completed"], Duration::from_secs(60));
    assert_eq!(job["allocation"][0]["node"], "node2", "{job:#}");
    assert_eq!(job["allocation"][0]["gres"], serde_json::json!({"nvme": 500}), "{job:#}");
    let nodes = c.json(&["nodes"]);
    let node2 = nodes.as_array().unwrap().iter().find(|n| n["name"] == "node2").unwrap().clone();
    let node1 = nodes.as_array().unwrap().iter().find(|n| n["name"] == "node1").unwrap().clone();
    assert!(node1.get("gres").is_none(), "{node1:#}");
    if job["state"] == "running" {
        assert_eq!(node2["gres"], serde_json::json!([{"name": "nvme", "total": 800, "used": 500}]), "{node2:#}");
    }
    let record = named_ok(&c, "scontrol", &["show", "node", "node2"]);
    assert!(record.lines().any(|l| l.trim() == "Gres=nvme:800"), "{record}");
    let job = c.wait_finished(g, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}");
    let show = String::from_utf8_lossy(&c.berth(&["show", &g.to_string()]).stdout).into_owned();
    assert!(show.contains("nvme:500"), "{show}");

    // Never: refused at submission.
    let never = c.root().join("never.sh");
    std::fs::write(
        &never,
        "#!/bin/sh
true
",
    )
    .unwrap();
    let never = never.display().to_string();
    for (flags, want) in [
        (["--licenses", "matlab:5"], "the cluster has 4"),
        (["--gres", "fpga:1"], "no node has generic resource fpga"),
        (["--gres", "nvme:801"], "the most a node has is 800"),
    ] {
        let out = c.berth(&["submit", flags[0], flags[1], &never]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{flags:?}: {err}");
    }

    // The first ends: the second starts after it, never beside it.
    std::fs::write(&go, "").unwrap();
    let ja = c.wait_finished(a, Duration::from_secs(60));
    let jb = c.wait_finished(b, Duration::from_secs(60));
    assert_eq!((ja["state"].as_str(), jb["state"].as_str()), (Some("completed"), Some("completed")), "{}", c.logs());
    let read = |f: &str| -> f64 {
        std::fs::read_to_string(c.root().join(f)).unwrap_or_default().trim().parse().unwrap_or(f64::NAN)
    };
    let (first_end, second_start) = (read("first.end"), read("second.start"));
    assert!(second_start >= first_end, "second started at {second_start}, before the first ended at {first_end}");
    let lic = c.json(&["licenses"]);
    assert_eq!(lic[0]["used"], 0, "{lic:#}");
    assert_no_job_cgroups(&c);
}

/// An advance reservation holding 3 of the 4 licenses and nvme on node2 (`berth resv create
/// -L --gres`), then a held job's licenses changed by `berth update` (the impossible refused),
/// run beside the reservation on the one license it does not hold, and shown by sacct's
/// AllocTRES and `berth acct`: on a real controller and agents.
#[test]
fn reservations_hold_licenses_and_update_changes_them() {
    let c = Cluster::up_configured(2, "package:1 core:2 pu:1", TOML);
    c.json(&["compat", "install", &c.root().join("bin").display().to_string()]);
    let r = c.json(&[
        "resv",
        "create",
        "--duration",
        "1h",
        "--cores",
        "1",
        "--gres",
        "nvme:300",
        "-L",
        "matlab:3",
        "--users",
        "root",
        "--name",
        "lab",
    ]);
    assert_eq!((&r["licenses"], &r["gres"]), (&serde_json::json!({"matlab": 3}), &serde_json::json!({"nvme": 300})));
    assert_eq!(r["allocation"][0]["node"], "node2", "{r:#}");
    let list = String::from_utf8_lossy(&c.berth(&["resv", "list"]).stdout).into_owned();
    assert!(list.contains("+nvme:300 +license matlab:3"), "{list}");
    // More than exist: infeasible, said at once.
    let out = c.berth(&["resv", "create", "--duration", "1h", "--cores", "1", "-L", "matlab:5", "--users", "root"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("the cluster has 4"));

    let id = c.submit("lic.sh", "#!/bin/sh\ntrue\n", &["--hold", "--walltime", "60", "-L", "matlab:2"]);
    let id_s = id.to_string();
    let out = c.berth(&["update", &id_s, "--licenses", "matlab:9"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains("the cluster has 4"), "{err}");
    assert_eq!(c.show(id)["request"]["licenses"], serde_json::json!({"matlab": 2}), "nothing changed");
    let out = c.berth(&["update", &id_s, "--licenses", "matlab:1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.berth(&["release", &id_s]);
    let job = c.wait_finished(id, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    assert_eq!(job["allocation"][0]["licenses"], serde_json::json!({"matlab": 1}), "{job:#}");
    let sacct = named_ok(&c, "sacct", &["-j", &id_s, "-o", "AllocTRES", "-P", "-n"]);
    assert!(sacct.contains("license/matlab=1"), "{sacct}");
    let acct = String::from_utf8_lossy(&c.berth(&["acct"]).stdout).into_owned();
    assert!(acct.contains("HELD") && acct.contains("license/matlab=1"), "{acct}");
    assert_no_job_cgroups(&c);
}

/// The request side on real agents (issue 20): `berth run --gres -L` outside a job holds
/// nvme on node2 and 2 licenses while its step runs and gives them back when it ends (and
/// `berth acct` shows what it held); `srun -L` more than exist is refused; a reservation of
/// licenses alone (`berth resv create -L` without nodes or cores) holds no node; `qalter -l`
/// changes a held job's licenses; an unprivileged user may change their own pending job's
/// licenses but not another's, and may not make a reservation.
#[test]
fn interactive_licenses_license_reservations_and_unprivileged_changes() {
    let c = Cluster::up_configured(2, "package:1 core:2 pu:1", TOML);
    c.json(&["compat", "install", &c.root().join("bin").display().to_string()]);
    let go = c.root().join("go");
    let wait_go = format!("while [ ! -e {} ]; do sleep 0.1; done", go.display());
    let mut run = std::process::Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(["run", "-n", "1", "--gres", "nvme:100", "-L", "matlab:2", "sh", "-c", &wait_go])
        .current_dir(c.root())
        .env_remove("BERTH_JOB_ID")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start berth run");
    let node2_gres = |c: &Cluster| {
        let nodes = c.json(&["nodes"]);
        nodes.as_array().unwrap().iter().find(|n| n["name"] == "node2").map(|n| n["gres"].clone()).unwrap()
    };
    let t0 = std::time::Instant::now();
    while c.json(&["licenses"])[0]["used"] != 2 {
        if t0.elapsed() > Duration::from_secs(60) || run.try_wait().unwrap().is_some() {
            let _ = run.kill();
            let out = run.wait_with_output().unwrap();
            panic!("the interactive allocation holds no licenses: {}\n{}", text(&out.stderr), c.logs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node2_gres(&c), serde_json::json!([{"name": "nvme", "total": 800, "used": 100}]));
    // Its licenses are held: srun asking for more than are left waits, more than exist is refused.
    let out = named(&c, "srun", &["-L", "matlab:5", "true"]);
    assert!(!out.status.success() && text(&out.stderr).contains("the cluster has 4"), "{}", text(&out.stderr));
    std::fs::write(&go, "").unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "berth run: {}\n{}", text(&out.stderr), c.logs());
    assert_eq!(c.json(&["licenses"])[0]["used"], 0);
    assert_eq!(node2_gres(&c), serde_json::json!([{"name": "nvme", "total": 800, "used": 0}]));
    let acct = text(&c.berth(&["acct"]).stdout);
    assert!(acct.contains("gres/nvme=100,license/matlab=2"), "{acct}");
    // srun outside a job with licenses: an interactive allocation holding them.
    let out = named(&c, "srun", &["-L", "matlab:4", "--gres=nvme:800", "true"]);
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), c.logs());

    // Licenses alone for the window: no node held.
    let r = c.json(&["resv", "create", "--duration", "1h", "-L", "matlab:3", "--users", "root", "--name", "lic"]);
    assert_eq!((&r["licenses"], &r["cores"]), (&serde_json::json!({"matlab": 3}), &serde_json::json!(0)), "{r:#}");
    let list = text(&c.berth(&["resv", "list"]).stdout);
    let line = list.lines().find(|l| l.starts_with("lic ")).unwrap_or_default().to_string();
    assert!(line.contains("0 +license matlab:3") && line.split_whitespace().any(|w| w == "-"), "{list}");
    // A member runs on any node with the reservation's licenses.
    let m = c.submit("member.sh", "#!/bin/sh\ntrue\n", &["--reservation", "lic", "--walltime", "60", "-L", "matlab:3"]);
    let job = c.wait_finished(m, Duration::from_secs(60));
    assert_eq!(job["state"], "completed", "{job:#}\n{}", c.logs());
    assert_eq!(job["allocation"][0]["licenses"], serde_json::json!({"matlab": 3}), "{job:#}");

    // qalter of a held job's licenses (PBS's job-wide custom resource).
    let held = c.submit("held.sh", "#!/bin/sh\ntrue\n", &["--hold", "--walltime", "60", "-L", "matlab:1"]);
    let held_s = held.to_string();
    named_ok(&c, "qalter", &["-l", "matlab=1", &held_s]);
    let out = named(&c, "qalter", &["-l", "matlab=9", &held_s]);
    assert!(!out.status.success() && text(&out.stderr).contains("the cluster has 4"), "{}", text(&out.stderr));

    // An unprivileged user: no reservations, their own pending job only.
    let out =
        c.berth_as("berthtest", &["resv", "create", "--duration", "1h", "-L", "matlab:1", "--users", "berthtest"]);
    assert!(!out.status.success() && text(&out.stderr).contains("only admins"), "{}", text(&out.stderr));
    let out = c.berth_as("berthtest", &["update", &held_s, "--licenses", "matlab:2"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("you may only change your own jobs"),
        "{}",
        text(&out.stderr)
    );
    let script = std::env::temp_dir().join(format!("berth-gres-{}.sh", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let script_s = script.display().to_string();
    let out = c.berth_as("berthtest", &["submit", "--json", "--hold", "--walltime", "60", "-L", "matlab:1", &script_s]);
    let _ = std::fs::remove_file(&script);
    assert!(out.status.success(), "berthtest's submit: {}", text(&out.stderr));
    let own: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let own_s = own["id"].as_u64().unwrap().to_string();
    let out = c.berth_as("berthtest", &["update", &own_s, "--licenses", "matlab:2"]);
    assert!(out.status.success(), "berthtest's update: {}", text(&out.stderr));
    assert_eq!(c.show(own["id"].as_u64().unwrap())["request"]["licenses"], serde_json::json!({"matlab": 2}));
    let out = c.berth_as("berthtest", &["update", &own_s, "--licenses", "matlab:9"]);
    assert!(!out.status.success() && text(&out.stderr).contains("the cluster has 4"), "{}", text(&out.stderr));
    c.berth(&["cancel", &own_s, &held_s]);
    assert_no_job_cgroups(&c);
}
