//! System test of the reservations API (docs/reservations.md) on a real local cluster: an
//! external scheduler's view over HTTP on the controller's API socket, with a real HTTP
//! client (hyper). Inventory, reserve, confirm with the pid of a process, a claim by
//! `berth run --job` whose ranks run in the reservation's cgroups, and the release that
//! follows when the process goes away.

mod common;

use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// 4 cores per agent.
const TOPO: &str = "package:2 core:2 pu:1";

/// One HTTP request on the API socket: status and JSON body.
fn http(sock: &Path, method: &str, uri: &str, body: &str) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let stream = tokio::net::UnixStream::connect(sock).await.expect("connect to the API socket");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
            .await
            .expect("an answer within 30 s")
            .expect("a response");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{method} {uri}: not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, v)
    })
}

fn api_socket(c: &Cluster) -> PathBuf {
    let sock = c.dir.join("api.sock");
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no API socket at {}:\n{}", sock.display(), c.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    sock
}

/// Every node's free cores, by name.
fn free_cores(sock: &Path) -> Vec<(String, u64)> {
    let (s, inv) = http(sock, "GET", "/v1/inventory", "");
    assert_eq!(s, 200, "{inv}");
    let mut v: Vec<(String, u64)> = inv["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_string(), n["free_cores"].as_u64().unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn an_external_scheduler_reserves_confirms_claims_and_its_holder_going_away_releases() {
    let c = Cluster::up(2, TOPO);
    let sock = api_socket(&c);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o666);

    // Inventory: both nodes, their topology, all free.
    let (s, inv) = http(&sock, "GET", "/v1/inventory", "");
    assert_eq!(s, 200, "{inv}");
    let nodes = inv["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{inv}");
    for n in nodes {
        assert_eq!((n["state"].as_str(), n["topology"].as_str()), (Some("up"), Some("SCCSCC")), "{n}");
        assert_eq!((n["free_cores"].as_u64(), n["free_pus"].as_u64()), (Some(4), Some(4)), "{n}");
        assert!(n["holders"].as_array().unwrap().is_empty());
        assert!(!n["numa_free"].as_array().unwrap().is_empty());
    }
    let before = free_cores(&sock);

    // Reserve 2 nodes x 2 cores, atomically, now.
    let (s, r) =
        http(&sock, "POST", "/v1/reservations", r#"{"resources":{"nodes":2,"tasks_per_node":2},"walltime":"10:00"}"#);
    assert_eq!(s, 201, "{r}");
    let id = r["id"].as_u64().unwrap();
    let job = r["job"].as_u64().unwrap();
    assert_eq!(r["state"], "unconfirmed");
    let reserved: Vec<(String, String)> = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node"].as_str().unwrap().to_string(), n["cpus"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(reserved.len(), 2, "{r}");
    assert_eq!(free_cores(&sock).iter().map(|(_, f)| f).sum::<u64>(), 8 - 4);
    // What does not fit now is "try again", with the reason; what never fits is 422.
    let (s, e) =
        http(&sock, "POST", "/v1/reservations", r#"{"resources":{"nodes":2,"tasks_per_node":4},"walltime":60}"#);
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("try_again")), "{e}");
    let (s, e) = http(&sock, "POST", "/v1/reservations", r#"{"resources":{"cores":64},"walltime":60}"#);
    assert_eq!((s, e["error"]["code"].as_str()), (422, Some("infeasible")), "{e}");

    // Confirm: held by a process of ours (the external scheduler's job shell, say).
    let mut holder = Command::new("sleep").arg("300").spawn().unwrap();
    let (s, r) =
        http(&sock, "POST", &format!("/v1/reservations/{id}/confirm"), &format!(r#"{{"pid":{}}}"#, holder.id()));
    assert_eq!(
        (s, r["state"].as_str(), r["holder"]["pid"].as_u64()),
        (200, Some("confirmed"), Some(holder.id() as u64)),
        "{r}"
    );
    let listed = c.json(&["reservations"]);
    assert_eq!(listed[0]["id"].as_u64(), Some(id), "{listed}");
    let human = c.berth(&["reservations"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains(&format!("pid {}", holder.id())));

    // Claim: `berth run --job` launches ranks in the reservation's cgroups, on its CPUs.
    let out = Command::new(BIN)
        .arg("--dir")
        .arg(&c.dir)
        .args(["run", "--job", &job.to_string(), "-n", "4", "--label", "sh", "-c"])
        .arg("echo \"node=$BERTH_NODEID cpus=$BERTH_RANK_CPUS cg=$(grep cpuset /proc/self/cgroup | cut -d: -f3) tmp=$TMPDIR\"")
        .current_dir(c.root())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "claim failed: {stdout}{stderr}\n{}", c.logs());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}{stderr}");
    for l in &lines {
        assert!(l.contains(&format!("/job_{job}")), "rank not in the reservation's cgroup: {l}");
        assert!(l.contains("tmp=/") && !l.contains("cpus= "), "{l}");
    }
    assert_eq!(lines.iter().filter(|l| l.contains("node=0")).count(), 2, "{stdout}");
    assert_eq!(lines.iter().filter(|l| l.contains("node=1")).count(), 2, "{stdout}");
    // The claim is shown with the reservation.
    let (s, r) = http(&sock, "GET", &format!("/v1/reservations/{id}"), "");
    assert_eq!(s, 200);
    let claims = r["claims"].as_array().unwrap();
    assert_eq!(
        (claims.len(), claims[0]["exit_code"].as_i64(), claims[0]["size"].as_u64()),
        (1, Some(0), Some(4)),
        "{r}"
    );

    // The holder goes away: released within the check period (1 s), its job ended.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let t0 = Instant::now();
    let r = loop {
        let (_, r) = http(&sock, "GET", &format!("/v1/reservations/{id}"), "");
        if r["state"] == "released" {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "not released: {r}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(r["release_reason"].as_str().unwrap().contains("holder process"), "{r}");
    assert_eq!(c.show(job)["state"], "completed");
    let (_, list) = http(&sock, "GET", "/v1/reservations", "");
    assert!(list["reservations"].as_array().unwrap().is_empty(), "{list}");

    // An explicit resource list, released by DELETE.
    let (node, cpus) = &reserved[0];
    let (s, r) = http(
        &sock,
        "POST",
        "/v1/reservations",
        &format!(r#"{{"walltime":120,"node_list":[{{"node":"{node}","cpus":"{cpus}"}}],"resources":{{"mem":"64M"}}}}"#),
    );
    assert_eq!((s, r["nodes"][0]["cpus"].as_str()), (201, Some(cpus.as_str())), "{r}");
    let id2 = r["id"].as_u64().unwrap();
    let job2 = r["job"].as_u64().unwrap();
    let (s, e) = http(
        &sock,
        "POST",
        "/v1/reservations",
        &format!(r#"{{"walltime":60,"node_list":[{{"node":"{node}","cpus":"{cpus}"}}]}}"#),
    );
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("try_again")), "{e}");
    let (s, r) = http(&sock, "DELETE", &format!("/v1/reservations/{id2}"), "");
    assert_eq!((s, r["state"].as_str()), (200, Some("released")), "{r}");
    c.wait_finished(job2, Duration::from_secs(10));

    // Nothing left: every core free again, no job cgroup, no claim process.
    let t0 = Instant::now();
    while free_cores(&sock) != before {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?} != {before:?}", free_cores(&sock));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_job_cgroups(&c);
    let (s, e) = http(&sock, "GET", "/v1/reservations/999", "");
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("unknown_reservation")));
}
