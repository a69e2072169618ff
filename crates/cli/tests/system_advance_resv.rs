//! Advance reservations on a real local cluster: node1 reserved from now for root; a job of
//! another user (berthtest) that would run into the window goes to node2, root's job in the
//! reservation runs on node1; deleting the reservation leaves that job running.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// 2 single-thread cores per node.
const MAPPED: &str = "package:1 core:2 pu:1";

fn node_of(j: &Value) -> String {
    j["allocation"][0]["node"].as_str().unwrap_or("").to_string()
}

#[test]
fn a_reserved_node_runs_only_the_reservations_jobs() {
    let c = Cluster::up(2, MAPPED);
    let r = c.json(&[
        "resv",
        "create",
        "--start",
        "now",
        "--duration",
        "1h",
        "--nodes",
        "node1",
        "--users",
        "root",
        "--name",
        "sys",
    ]);
    assert_eq!(r["name"], "sys", "{r:#}");
    assert_eq!(r["allocation"][0]["node"], "node1", "{r:#}");
    assert_eq!(r["active"], true);

    // The test user submits first: without the reservation its job would take node1.
    let uid = Command::new("id").args(["-u", "berthtest"]).output().unwrap();
    assert!(uid.status.success(), "user berthtest is missing: scripts/test.sh creates it");
    let home = c.root().join("userdir");
    std::fs::create_dir(&home).unwrap();
    assert!(Command::new("chown").args(["berthtest:berthtest"]).arg(&home).status().unwrap().success());
    let script = home.join("other.sh");
    std::fs::write(&script, "#!/bin/sh\n#BERTH --cores 2 --mem 32M --walltime 600\nsleep 60\n").unwrap();
    let bin = c.root().join("berth-bin");
    std::fs::copy(BIN, &bin).unwrap();
    let as_user = |args: &[&str]| {
        Command::new("runuser")
            .args(["-u", "berthtest", "--"])
            .arg(&bin)
            .arg("--dir")
            .arg(&c.dir)
            .args(args)
            .current_dir(&home)
            .output()
            .unwrap()
    };
    let out = as_user(&["submit", "--json", &script.display().to_string()]);
    assert!(out.status.success(), "submit as berthtest: {}", String::from_utf8_lossy(&out.stderr));
    let other = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    // Not a member: refused.
    let out = as_user(&["submit", "--json", "--reservation", "sys", &script.display().to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("not_permitted"), "{}", String::from_utf8_lossy(&out.stdout));
    // Nor may it create or delete reservations.
    let out = as_user(&["resv", "delete", "sys"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only admins"), "{}", String::from_utf8_lossy(&out.stderr));

    let member = c.submit(
        "member.sh",
        "#!/bin/sh\necho on $BERTH_NODES\nsleep 60\n",
        &["--reservation", "sys", "--cores", "1", "--mem", "32M", "--walltime", "600"],
    );
    let o = c.wait_state(other, &["running"], Duration::from_secs(30));
    let m = c.wait_state(member, &["running"], Duration::from_secs(30));
    assert_eq!(node_of(&o), "node2", "a job that is not a member keeps off node1: {o:#}");
    assert_eq!(node_of(&m), "node1", "the reservation's job runs on node1: {m:#}");

    // A second job of the test user finds node2 busy and node1's free core reserved: it
    // waits, saying so.
    let out = as_user(&["submit", "--json", "--cores", "1", &script.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let waiting = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    // Wait for the scheduler to say so; the job stays queued all along.
    let t0 = Instant::now();
    loop {
        let w = c.show(waiting);
        assert_eq!(w["state"], "queued", "{w:#}");
        if w["reason"].as_str().unwrap_or("").contains("advance reservation sys") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no reservation named in the reason: {w:#}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let l = c.json(&["resv", "list"]);
    assert_eq!(l[0]["running_jobs"][0], member, "{l:#}");
    // Deleting it leaves its running job running.
    let d = c.json(&["resv", "delete", "sys"]);
    assert_eq!(d["running_jobs"][0], member, "{d:#}");
    assert!(c.json(&["resv", "list"]).as_array().is_some_and(|a| a.is_empty()));
    // With the reservation gone, the waiting job may use node1's free core: wait for the
    // scheduler to start it there (no fixed sleep), and the member still runs beside it.
    let w = c.wait_state(waiting, &["running"], Duration::from_secs(30));
    assert_eq!(node_of(&w), "node1", "{w:#}");
    assert_eq!(c.show(member)["state"], "running");
    for id in [other, member, waiting] {
        assert!(c.berth(&["cancel", &id.to_string()]).status.success());
    }
    for id in [other, member, waiting] {
        c.wait_finished(id, Duration::from_secs(30));
    }
}
