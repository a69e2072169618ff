//! Authentication between daemons and permissions between users (docs/protocol/06-auth.md,
//! "Authentication"), on a real local cluster, as root: forged and replayed agent messages,
//! a user cancelling another user's job, launches with tampered grants or on CPUs the job
//! does not hold, forged and replayed frames on a step's control tree. Everything is refused
//! and logged.

mod common;

use berth_core::step::RankPlace;
use berth_core::{CpuSet, JobId};
use berth_protocol::agent::{AgentMessage, AgentQuery, ControllerMessage, Registration};
use berth_protocol::auth::{
    random_nonce, registered_label, session, sign_grant, ClusterKey, Envelope, LinkKey, Opener, Role, SessionFrame,
    TreeEnd, LABEL_REGISTER,
};
use berth_protocol::frame::{decode, encode};
use berth_protocol::step::{StepGrant, StepNode, TreeDown};
use berth_protocol::user::UserIdentity;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn controller_address(c: &Cluster) -> String {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(c.dir.join("cluster.json")).unwrap()).unwrap();
    v["controller"].as_str().unwrap().to_string()
}

fn send<T: serde::Serialize>(s: &mut TcpStream, msg: &T) {
    s.write_all(&encode(msg).unwrap()).unwrap();
}

/// The next frame's body; None when the peer closed the connection.
fn recv(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// The event log entries of `kind`.
fn events(c: &Cluster, kind: &str) -> Vec<Value> {
    c.json(&["events", "--kind", kind]).as_array().cloned().unwrap_or_default()
}

/// Wait for an event of `kind` whose detail contains `text`.
fn wait_event(c: &Cluster, kind: &str, text: &str) -> Value {
    let t0 = Instant::now();
    loop {
        if let Some(e) = events(c, kind).into_iter().find(|e| e["detail"].as_str().unwrap_or("").contains(text)) {
            return e;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no {kind} event with {text:?}: {:#}\n{}",
            c.json(&["events"]),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn node_names(c: &Cluster) -> Vec<String> {
    c.json(&["nodes"]).as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap().to_string()).collect()
}

fn key(c: &Cluster) -> ClusterKey {
    ClusterKey::load(&c.dir.join("cluster.key")).expect("the test runs as root and reads the cluster key")
}

fn registration(name: &str) -> AgentMessage {
    let topology =
        berth_agent::hwtopo::load(&berth_agent::hwtopo::TopologySource::Synthetic("package:1 core:1 pu:1".into()))
            .unwrap();
    AgentMessage::Register(Box::new(Registration {
        name: name.into(),
        hostname: "nowhere".into(),
        address: "127.0.0.1:9".into(),
        instance: "test".into(),
        version: "test".into(),
        topology,
        real_cpus: "0".into(),
        running: vec![],
        ended: vec![],
        lease: false,
        steps: None,
    }))
}

#[test]
fn forged_and_replayed_agent_messages_are_refused_and_logged() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let addr = controller_address(&c);
    let key = key(&c);

    // (a) A registration signed with another key: refused, closed, no node, logged.
    let mut s = connect(&addr);
    let wrong = ClusterKey::random().unwrap();
    send(&mut s, &Envelope::seal(&wrong, LABEL_REGISTER, &registration("forged1")).unwrap());
    let answer: ControllerMessage = decode(&recv(&mut s).expect("an answer")).unwrap();
    assert!(
        matches!(&answer, ControllerMessage::Rejected { reason } if reason.contains("bad signature")),
        "{answer:?}"
    );
    assert!(recv(&mut s).is_none(), "the connection must be closed");
    let e = wait_event(&c, "auth_refused", "bad signature");
    assert_eq!(e["node"], "forged1", "{e:#}");
    assert!(e["detail"].as_str().unwrap().contains("127.0.0.1:"), "the peer's address: {e:#}");

    // An unsigned registration (the old protocol's shape) too.
    let mut s = connect(&addr);
    send(&mut s, &registration("forged2"));
    let answer: ControllerMessage = decode(&recv(&mut s).expect("an answer")).unwrap();
    assert!(matches!(&answer, ControllerMessage::Rejected { reason } if reason.contains("not signed")), "{answer:?}");
    assert!(recv(&mut s).is_none());
    assert_eq!(wait_event(&c, "auth_refused", "not signed")["node"], "forged2");

    // An agent of the previous protocol version (its signed body a string holding the
    // message): refused, both versions named, to it and in the event.
    let mut s = connect(&addr);
    let inner = serde_json::json!({"v": 2, "op": "register", "name": "old2"}).to_string();
    let old = serde_json::json!({"v": 2, "ts": 1, "nonce": "00".repeat(16), "body": inner, "mac": "00".repeat(32)});
    let old = serde_json::to_vec(&old).unwrap();
    s.write_all(&[&(old.len() as u32).to_be_bytes()[..], &old].concat()).unwrap();
    let answer: ControllerMessage = decode(&recv(&mut s).expect("an answer")).unwrap();
    assert!(
        matches!(&answer, ControllerMessage::Rejected { reason } if reason.contains("protocol version 2, not 3")),
        "{answer:?}"
    );
    assert!(recv(&mut s).is_none());
    assert_eq!(wait_event(&c, "auth_refused", "protocol version 2")["node"], "old2");

    // A registration with a good MAC but a stale timestamp.
    let mut s = connect(&addr);
    let old = berth_protocol::auth::now_ms() - 300_000;
    send(&mut s, &Envelope::seal_at(&key, LABEL_REGISTER, &registration("stale1"), old, random_nonce()).unwrap());
    assert!(recv(&mut s).is_some());
    assert!(recv(&mut s).is_none());
    assert_eq!(wait_event(&c, "auth_refused", "in the past")["node"], "stale1");

    // (b) A correctly signed registration, accepted once; the controller proves the key
    // back, bound to our nonce.
    let nonce = random_nonce();
    let hello =
        Envelope::seal_at(&key, LABEL_REGISTER, &registration("replay1"), berth_protocol::auth::now_ms(), nonce)
            .unwrap();
    let mut s = connect(&addr);
    send(&mut s, &hello);
    let reply: Envelope = decode(&recv(&mut s).expect("an answer")).unwrap();
    let controller_nonce = reply.verify(&key, &registered_label(&nonce)).expect("the controller proves the key");
    assert!(matches!(reply.message::<ControllerMessage>().unwrap(), ControllerMessage::Registered { .. }));
    assert!(node_names(&c).contains(&"replay1".to_string()));
    // On the session: a heartbeat with a bad MAC closes the connection and is logged.
    let (mut sealer, _) = session(&key, &nonce, &controller_nonce, Role::Agent);
    let mut frame = sealer.seal(&AgentMessage::Heartbeat { running: vec![], seq: 0, steps: None }).unwrap();
    frame.mac = "00".repeat(32);
    send(&mut s, &frame);
    let t0 = Instant::now();
    // Frames the controller had queued may come first; then the close.
    while recv(&mut s).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the connection stays open after a forged frame");
    }
    let e = wait_event(&c, "auth_refused", "frame refused");
    assert_eq!(e["node"], "replay1", "{e:#}");
    assert!(e["detail"].as_str().unwrap().contains("bad signature"), "{e:#}");

    // The same registration bytes on a second connection: a replay.
    let mut s = connect(&addr);
    send(&mut s, &hello);
    let answer: ControllerMessage = decode(&recv(&mut s).expect("an answer")).unwrap();
    assert!(matches!(&answer, ControllerMessage::Rejected { reason } if reason.contains("replayed")), "{answer:?}");
    assert!(recv(&mut s).is_none());
    assert_eq!(wait_event(&c, "auth_refused", "replayed")["node"], "replay1");

    let names = node_names(&c);
    for forged in ["forged1", "forged2", "stale1"] {
        assert!(!names.contains(&forged.to_string()), "{forged} was added: {names:?}");
    }
    // The real agent never noticed.
    let id = c.submit("ok.sh", "#!/bin/sh\necho fine\n", &["--cores", "1"]);
    let j = c.wait_finished(id, Duration::from_secs(30));
    assert_eq!(j["state"], "completed", "{j:#}\n{}", c.logs());
}

/// A control tree opened with a StepLaunch to `address`, as `berth run` opens it: the
/// connection, and the halves of its session under the grant's link key (derived from `key`).
fn open_tree(address: &str, grant: &StepGrant, key: &ClusterKey) -> (TcpStream, berth_protocol::auth::Sealer, Opener) {
    let mut s = connect(address);
    send(&mut s, &AgentQuery::StepLaunch { grant: Box::new(grant.clone()), subtree: vec![0] });
    let (sealer, opener) = LinkKey::of_grant(key, grant).link(0, TreeEnd::Above);
    (s, sealer, opener)
}

/// The next upward frame, checked and opened (as JSON); None at the close.
fn next_up(s: &mut TcpStream, opener: &mut Opener) -> Option<Value> {
    let b = recv(s)?;
    let f: SessionFrame = decode(&b).expect("upward tree frames are sealed");
    Some(opener.open::<Value>(&f).expect("upward tree frames verify under the link key"))
}

/// The upward frames until `done` or the close.
fn rest_of_tree(s: &mut TcpStream, opener: &mut Opener) -> Vec<Value> {
    let mut out = vec![];
    while let Some(v) = next_up(s, opener) {
        let done = v["op"] == "done";
        out.push(v);
        if done {
            break;
        }
    }
    out
}

/// A StepLaunch to `address`; the frames that come back (as JSON) until `done` or the close.
fn step_launch(address: &str, grant: &StepGrant, key: &ClusterKey) -> Vec<Value> {
    let (mut s, _, mut opener) = open_tree(address, grant, key);
    rest_of_tree(&mut s, &mut opener)
}

/// Open a tree for `grant` (a long `sleep`), wait until its rank runs, send `frames` down it:
/// the agent must take the step for lost (its rank killed) and log `refusal`.
fn tree_refuses(
    c: &Cluster,
    address: &str,
    grant: &StepGrant,
    key: &ClusterKey,
    frames: &[SessionFrame],
    refusal: &str,
) {
    let (mut s, _, mut opener) = open_tree(address, grant, key);
    loop {
        let v = next_up(&mut s, &mut opener).expect("the step starts");
        assert_ne!(v["op"], "launch_failed", "{v}");
        if v["op"] == "started" {
            break;
        }
    }
    for f in frames {
        send(&mut s, f);
    }
    let rest = rest_of_tree(&mut s, &mut opener);
    assert!(
        rest.iter().any(|f| f["op"] == "exited" && f["ranks"][0]["signal"] == libc::SIGKILL),
        "the rank is killed: {rest:#?}"
    );
    wait_event(c, "auth_refused", refusal);
}

fn launch_failure(frames: &[Value]) -> Option<String> {
    frames.iter().find(|f| f["op"] == "launch_failed").map(|f| f["reason"].as_str().unwrap_or("").to_string())
}

#[test]
fn users_and_launches_are_checked() {
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let id = c.submit("long.sh", "#!/bin/sh\nsleep 300\n", &["--cores", "1"]);
    let job = c.wait_state(id, &["running"], Duration::from_secs(30));
    let alloc = &job["allocation"][0];
    let node = alloc["node"].as_str().unwrap().to_string();
    let cpus = CpuSet::parse_list(alloc["cpus"].as_str().unwrap()).unwrap();

    // (c) berthtest cancels root's job: not permitted, denied event, the job runs on.
    let out = c.berth_as("berthtest", &["cancel", &id.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_permitted"), "{}", String::from_utf8_lossy(&out.stderr));
    let e = wait_event(&c, "denied", &format!("user berthtest may not cancel job {id} of user root"));
    assert_eq!(e["job"], id, "{e:#}");
    // And signalling or holding it.
    for args in [vec!["signal", &id.to_string(), "USR1"], vec!["hold", &id.to_string()]] {
        let a: Vec<&str> = args.iter().map(|s| s.as_ref()).collect();
        let out = c.berth_as("berthtest", &a);
        assert!(!out.status.success(), "{a:?}");
    }
    wait_event(&c, "denied", &format!("user berthtest may not signal job {id} of user root"));
    wait_event(&c, "denied", &format!("user berthtest may not hold job {id} of user root"));
    assert_eq!(c.show(id)["state"], "running");

    // (d) Launches straight to the agent's port.
    let nodes = c.json(&["nodes"]);
    let address = nodes.as_array().unwrap().iter().find(|n| n["name"] == node.as_str()).unwrap()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let key = key(&c);
    let grant = |step: u32, rank_cpus: CpuSet, argv: &[&str]| {
        let mut g = StepGrant {
            job: JobId(id),
            step,
            kvsname: format!("berth_{id}_{step}"),
            user: UserIdentity { uid: 0, gid: 0, groups: vec![], name: "root".into() },
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/".into(),
            size: 1,
            fanout: 0,
            no_kill: false,
            rank_cpusets: false,
            bind: true,
            notify_signal: None,
            kill_grace_ms: 500,
            mpi: Default::default(),
            nodes: vec![StepNode {
                name: node.clone(),
                address: address.clone(),
                ranks: vec![RankPlace { rank: 0, cpus: rank_cpus }],
                instance: String::new(),
            }],
            interactive: false,
            attach: false,
            expires_ms: 0,
            apps: vec![],
            spawned_by: None,
            mac: String::new(),
        };
        sign_grant(&key, &mut g, berth_protocol::auth::now_ms() + 60_000);
        g
    };

    // A signed grant for the job's own CPUs runs; sent again, it is a replay.
    let good = grant(101, cpus.clone(), &["true"]);
    let frames = step_launch(&address, &good, &key);
    assert!(launch_failure(&frames).is_none(), "{frames:#?}\n{}", c.logs());
    assert!(frames.iter().any(|f| f["op"] == "exited" && f["ranks"][0]["exit_code"] == 0), "{frames:#?}");
    let frames = step_launch(&address, &good, &key);
    let why = launch_failure(&frames).expect("a replayed grant is refused");
    assert!(why.contains("already launched"), "{why}");
    wait_event(&c, "auth_refused", "already launched");

    // Tampered: the signed grant, its command changed.
    let mut tampered = grant(102, cpus.clone(), &["true"]);
    tampered.argv = vec!["sh".into(), "-c".into(), "touch /tmp/berth-auth-pwned".into()];
    let frames = step_launch(&address, &tampered, &key);
    let why = launch_failure(&frames).expect("a tampered grant is refused");
    assert!(why.contains("bad signature"), "{why}");
    assert!(frames.iter().any(|f| f["op"] == "exited"), "{frames:#?}");
    let e = wait_event(&c, "auth_refused", &format!("step grant {id}.102"));
    assert_eq!(e["node"], node.as_str(), "{e:#}");
    assert!(!std::path::Path::new("/tmp/berth-auth-pwned").exists());

    // Unsigned.
    let mut unsigned = grant(103, cpus.clone(), &["true"]);
    unsigned.mac.clear();
    let why = launch_failure(&step_launch(&address, &unsigned, &key)).expect("an unsigned grant is refused");
    assert!(why.contains("not signed"), "{why}");

    // Correctly signed, on CPUs that are not the job's on this node.
    let all = CpuSet::parse_list("0-3").unwrap();
    let others: Vec<u32> = all.iter().filter(|c| !cpus.contains(*c)).collect();
    let outside = CpuSet::parse_list(&others.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")).unwrap();
    let frames = step_launch(&address, &grant(104, outside.clone(), &["sleep", "60"]), &key);
    let why = launch_failure(&frames).expect("a launch outside the allocation is refused");
    assert!(why.contains("are not inside job"), "{why}");
    let e = wait_event(&c, "launch_refused", &format!("step {id}.104"));
    assert_eq!(e["job"], id, "{e:#}");
    assert_eq!(e["node"], node.as_str(), "{e:#}");

    // Named for another node.
    let other = if node == "node1" { "node2" } else { "node1" };
    let mut elsewhere = grant(105, cpus.clone(), &["true"]);
    elsewhere.nodes[0].name = other.into();
    sign_grant(&key, &mut elsewhere, berth_protocol::auth::now_ms() + 60_000);
    let why = launch_failure(&step_launch(&address, &elsewhere, &key)).expect("a launch for another node is refused");
    assert!(why.contains(&format!("for node {other}")), "{why}");

    // Expired.
    let mut expired = grant(106, cpus.clone(), &["true"]);
    sign_grant(&key, &mut expired, berth_protocol::auth::now_ms() - 1000);
    let why = launch_failure(&step_launch(&address, &expired, &key)).expect("an expired grant is refused");
    assert!(why.contains("expired"), "{why}");

    // (e) After the grant, every frame on the tree is MAC'd under the step's link key and
    // numbered. A frame forged by someone without the cluster key, or a genuine frame sent
    // again, ends the step (its rank killed) as a broken connection would, and is logged.
    let forged_step = grant(107, cpus.clone(), &["sleep", "60"]);
    let (mut forger, _) = LinkKey::of_grant(&ClusterKey::from_bytes([9; 32]), &forged_step).link(0, TreeEnd::Above);
    let forged = forger.seal(&TreeDown::Signal { signal: libc::SIGUSR1 }).unwrap();
    tree_refuses(&c, &address, &forged_step, &key, &[forged], &format!("step {id}.107 refused: bad signature"));
    let replay_step = grant(108, cpus.clone(), &["sleep", "60"]);
    let (mut sealer, _) = LinkKey::of_grant(&key, &replay_step).link(0, TreeEnd::Above);
    let genuine = sealer.seal(&TreeDown::Signal { signal: libc::SIGCONT }).unwrap();
    tree_refuses(
        &c,
        &address,
        &replay_step,
        &key,
        &[genuine.clone(), genuine],
        &format!("step {id}.108 refused: out of sequence"),
    );

    // An unsigned agent-to-agent task request.
    let mut s = connect(&address);
    send(&mut s, &AgentQuery::Task { request: berth_protocol::step::TaskRequest::RemoteInfo { job: JobId(id) } });
    let reply: Value = serde_json::from_slice(&recv(&mut s).unwrap()).unwrap();
    assert!(reply["message"].as_str().unwrap_or("").contains("unsigned task request"), "{reply}");
    wait_event(&c, "auth_refused", "unsigned task request");

    // Nothing touched the job.
    let j = c.show(id);
    assert_eq!(j["state"], "running", "{j:#}");
    assert!(j["end_time"].is_null(), "{j:#}");
    // And `berth run` (grants from the controller) still works.
    let out = c.berth(&["run", "--job", &id.to_string(), "-n", "1", "true"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stderr), c.logs());
    assert!(c.berth(&["cancel", &id.to_string()]).status.success());
}

#[test]
fn daemons_refuse_to_start_without_a_private_key() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // No key.
    let out =
        Command::new(BIN).args(["agent", "--name", "x", "--key-file"]).arg(dir.join("missing.key")).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("berth keygen"), "{}", String::from_utf8_lossy(&out.stderr));
    // A key others can read.
    let key = dir.join("cluster.key");
    let out = Command::new(BIN).arg("keygen").arg(&key).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(BIN).arg("--dir").arg(dir).args(["server", "--key-file"]).arg(&key).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"), "{}", String::from_utf8_lossy(&out.stderr));
    // keygen does not replace a key.
    assert!(!Command::new(BIN).arg("keygen").arg(&key).output().unwrap().status.success());
}

#[test]
fn agents_refuse_a_controller_that_cannot_prove_the_key() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let key_file = tmp.path().join("cluster.key");
    let key = ClusterKey::generate(&key_file).unwrap();
    // A controller impostor: listens where the agent is told the controller is.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let id = format!("authtest{}", std::process::id());
    let log = tmp.path().join("agent.log");
    let mut agent = Command::new(BIN)
        .args(["agent", "--name", "n1", "--controller", &addr, "--topology-synthetic", "package:1 core:1 pu:1"])
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(["--cgroup-root", &format!("berth/{id}/n1"), "--spool-dir", &format!("/tmp/berth/{id}-n1")])
        .arg("--key-file")
        .arg(&key_file)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The agent's registration is signed with the key.
    let hello: Envelope = decode(&recv(&mut s).expect("a registration")).unwrap();
    let nonce = hello.verify(&key, LABEL_REGISTER).expect("signed with the cluster key");
    // Answered with another key: the agent must not take it.
    let wrong = ClusterKey::random().unwrap();
    let reply =
        ControllerMessage::Registered { node_id: 0, heartbeat_interval_ms: 1000, lease_ms: None, step_ends: false };
    send(&mut s, &Envelope::seal(&wrong, &registered_label(&nonce), &reply).unwrap());
    // Nor a correctly signed answer recorded for another registration (bound to its nonce).
    let (mut s2, _) = listener.accept().unwrap();
    s2.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _: Envelope = decode(&recv(&mut s2).expect("a second registration")).unwrap();
    send(&mut s2, &Envelope::seal(&key, &registered_label(&nonce), &reply).unwrap());
    let t0 = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.matches("could not prove it holds the cluster key").count() >= 2 {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the agent did not refuse the impostor:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!text.contains(" registered"), "{text}");
    // SAFETY: plain kill(2) of the agent this test started.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    let root = format!("berth/{id}");
    let _ = berth_agent::cgroup::detect(&root).and_then(|b| b.remove_root());
}

/// An interactive allocation and its step, asked over the controller's socket as `berth run`
/// asks (kept open: the allocation lives as long as the connection): the grant, the link key.
fn interactive_grant(c: &Cluster, argv: &[&str]) -> (std::os::unix::net::UnixStream, StepGrant) {
    use berth_protocol::client::{ClientRequest, ClientResponse};
    use berth_protocol::step::{InteractiveAsk, StepCreate};
    let mut s = std::os::unix::net::UnixStream::connect(c.dir.join("controller.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let create = StepCreate {
        job: None,
        request: berth_core::step::StepRequest { ntasks: Some(1), ..Default::default() },
        interactive: InteractiveAsk::default(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        host: "test".into(),
        pid: std::process::id(),
        fanout: 8,
        no_kill: false,
        rank_cpusets: false,
        notify_signal: None,
        mpi: None,
        apps: vec![],
        spawned_by: None,
    };
    s.write_all(&encode(&ClientRequest::StepCreate(Box::new(create))).unwrap()).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    match decode::<ClientResponse>(&body).unwrap() {
        ClientResponse::StepGranted { grant, .. } => (s, *grant),
        other => panic!("not granted: {other:?}"),
    }
}

fn rank_running(marker: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    out.status.success()
}

/// The first node of an interactive step starts it from the job's launch order; `run`
/// attaches to it (docs/protocol/01-client.md, "An interactive step starts from its launch
/// order"): what the ranks wrote meanwhile waits for
/// it, a second attach with the same grant is refused, and a step nobody attaches to is
/// killed after the attach wait.
#[test]
fn interactive_steps_start_from_the_order_and_run_attaches_once() {
    let c = Cluster::up(2, "package:1 core:4 pu:1");
    let key = key(&c);
    // Nobody attaches to this one: its rank dies after the wait (30 s), its allocation stays.
    let (_orphan_conn, orphan) = interactive_grant(&c, &["sleep", "300.31"]);
    assert!(orphan.attach, "an interactive grant rides on the launch order");
    let t0 = Instant::now();

    let (_conn, g) = interactive_grant(&c, &["sh", "-c", "echo early-bird; exec sleep 300.32"]);
    let t1 = Instant::now();
    while !rank_running("sleep 300.32") {
        assert!(t1.elapsed() < Duration::from_secs(10), "the rank never started before run attached\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(rank_running("sleep 300.31"), "the unattached step runs too");
    std::thread::sleep(Duration::from_millis(200));
    let address = g.nodes[0].address.clone();
    let (mut s, mut sealer, mut opener) = open_tree(&address, &g, &key);
    let mut seen = vec![];
    while !seen.iter().any(|f: &Value| f["op"] == "output") {
        seen.push(next_up(&mut s, &mut opener).expect("the step's frames come once attached"));
    }
    assert_eq!(seen[0]["op"], "started", "{seen:#?}");
    let out = seen.iter().find(|f| f["op"] == "output").unwrap();
    assert!(out.to_string().contains("early-bird") || out.to_string().contains("ZWFybHktYmlyZA"), "{out}");
    // The same grant again: refused, the attached step undisturbed.
    let frames = step_launch(&address, &g, &key);
    let why = launch_failure(&frames).expect("a second attach is refused");
    assert!(why.contains("already has its `berth run`"), "{why}");
    wait_event(&c, "launch_refused", "already has its `berth run`");
    assert!(rank_running("sleep 300.32"));
    // run's frames reach the attached step: a kill ends it.
    let kill = sealer.seal(&TreeDown::Kill { reason: "test".into() }).unwrap();
    send(&mut s, &kill);
    let rest = rest_of_tree(&mut s, &mut opener);
    assert!(rest.iter().any(|f| f["op"] == "exited"), "{rest:#?}");
    assert!(!rank_running("sleep 300.32"));

    // The unattached step is killed once the wait is over, not before.
    while rank_running("sleep 300.31") {
        assert!(t0.elapsed() < Duration::from_secs(45), "an unattached step outlived the attach wait");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(t0.elapsed() >= Duration::from_secs(29), "killed after {:?}, before the wait", t0.elapsed());
    // A run attaching now is told the step ended.
    let frames = step_launch(&orphan.nodes[0].address, &orphan, &key);
    let why = launch_failure(&frames).expect("a late attach is refused");
    assert!(why.contains("has ended") || why.contains("did not run"), "{why}");
}
