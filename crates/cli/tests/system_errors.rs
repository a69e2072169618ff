//! System tests: bad input gets a clear error and loses nothing.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;

fn stderr_of(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_submissions_are_refused_with_reasons() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let write = |name: &str, text: &str| {
        let p = c.root().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let bad_directive = write("bad.sh", "#!/bin/sh\n#BERTH --cores 1\n#BERTH --colour blue\necho\n");
    let o = c.berth(&["submit", &bad_directive]);
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("line 3") && stderr_of(&o).contains("--colour"), "{}", stderr_of(&o));

    let no_shebang = write("plain.sh", "echo hi\n");
    let o = c.berth(&["submit", "--json", &no_shebang]);
    assert!(!o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["error"]["code"], "invalid_script");

    let ok = write("ok.sh", "#!/bin/sh\ntrue\n");
    let o = c.berth(&["submit", "--cores", "64", &ok]);
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("can never run here") && stderr_of(&o).contains("infeasible"), "{}", stderr_of(&o));
    let o = c.berth(&["submit", "--mem", "1T", &ok]);
    assert!(stderr_of(&o).contains("infeasible"), "{}", stderr_of(&o));
    let o = c.berth(&["submit", "--mem", "lots", &ok]);
    assert!(stderr_of(&o).contains("bad size"), "{}", stderr_of(&o));
    let o = c.berth(&["submit", "--nodes", "3", "--cores", "4", &ok]);
    assert!(stderr_of(&o).contains("evenly"), "{}", stderr_of(&o));
    let o = c.berth(&["submit", "--queue", "nope", &ok]);
    let e = stderr_of(&o);
    assert!(e.contains("no queue \"nope\"; queues are: batch") && e.contains("queue_limit"), "{e}");
    let o = c.berth(&["submit", &c.root().join("missing.sh").display().to_string()]);
    assert!(stderr_of(&o).contains("cannot read batch script"), "{}", stderr_of(&o));

    let o = c.berth(&["show", "4242"]);
    assert!(!o.status.success() && stderr_of(&o).contains("job 4242 does not exist"), "{}", stderr_of(&o));
    let o = c.berth(&["show", "abc"]);
    assert!(!o.status.success() && stderr_of(&o).contains("not a job id"), "{}", stderr_of(&o));
    // Nothing above created a job.
    let jobs = c.json(&["jobs", "--all"]);
    assert_eq!(jobs.as_array().unwrap().len(), 0, "{jobs:#}");
}

#[test]
fn garbage_on_the_socket_is_answered_and_the_controller_goes_on() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let id = c.submit("keep.sh", "#!/bin/sh\ntrue\n", &["--hold"]);
    let sock = c.dir.join("controller.sock");
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0, 0, 0, 3, b'{', b'x', b'}'], &[0, 0, 0, 0], &[0xff; 64]] {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        s.write_all(garbage).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.contains("bad_request"), "garbage {garbage:?} answered with {text:?}");
    }
    // Garbage on the agent port too.
    let cluster: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.join("cluster.json")).unwrap()).unwrap();
    let mut t = std::net::TcpStream::connect(cluster["controller"].as_str().unwrap()).unwrap();
    t.write_all(b"\x00\x00\x00\x05hello").unwrap();
    let _ = t.read_to_end(&mut Vec::new());
    assert_eq!(c.show(id)["state"], "held");
    assert_eq!(c.json(&["nodes"]).as_array().unwrap()[0]["state"], "up");
}

#[test]
fn unreachable_controller_and_bad_config_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(BIN).args(["--dir"]).arg(tmp.path()).arg("jobs").output().unwrap();
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("berth up"), "{}", stderr_of(&o));
    // A stale socket file with nobody behind it.
    std::os::unix::net::UnixListener::bind(tmp.path().join("controller.sock")).unwrap();
    // Nobody behind it may be a restart: the command waits for its --timeout, says so once.
    let t0 = std::time::Instant::now();
    let o = Command::new(BIN).args(["--timeout", "1", "--dir"]).arg(tmp.path()).arg("jobs").output().unwrap();
    assert!(!o.status.success());
    let e = stderr_of(&o);
    assert!(e.contains("not answering after 1 s") && e.matches("waiting up to 1 s").count() == 1, "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "waited {:?}", t0.elapsed());

    std::fs::write(tmp.path().join("berth.toml"), "heartbeat_interval_secs = 1\nkill_grac_secs = 3\n").unwrap();
    let o = Command::new(BIN).args(["--dir"]).arg(tmp.path()).arg("server").output().unwrap();
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("kill_grac_secs"), "{}", stderr_of(&o));
    std::fs::write(tmp.path().join("berth.toml"), "heartbeat_misses = 0\n").unwrap();
    let o = Command::new(BIN).args(["--dir"]).arg(tmp.path()).arg("server").output().unwrap();
    assert!(stderr_of(&o).contains("heartbeat_misses"), "{}", stderr_of(&o));
}

#[test]
fn corrupt_state_database_is_reported_not_reset() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("controller");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("state.db"), vec![0x42u8; 8192]).unwrap();
    let o =
        Command::new(BIN).args(["--dir"]).arg(tmp.path()).args(["server", "--listen", "127.0.0.1:0"]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("corrupt") || stderr_of(&o).contains("not a database"), "{}", stderr_of(&o));
    assert_eq!(
        std::fs::read(state.join("state.db")).unwrap(),
        vec![0x42u8; 8192],
        "the corrupt file must be left as it was"
    );
}

#[test]
fn several_scripts_in_one_submit_are_all_or_nothing() {
    let c = Cluster::up(1, "package:1 core:2 pu:1");
    let a = c.root().join("a.sh");
    let b = c.root().join("b.sh");
    let bad = c.root().join("bad.sh");
    std::fs::write(&a, "#!/bin/sh\ntrue\n").unwrap();
    std::fs::write(&b, "#!/bin/sh\n#BERTH --name bee\ntrue\n").unwrap();
    std::fs::write(&bad, "#!/bin/sh\n#BERTH --bogus 1\n").unwrap();
    let (a, b, bad) = (a.display().to_string(), b.display().to_string(), bad.display().to_string());
    let o = c.berth(&["submit", "--hold", &a, &bad, &b]);
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("nothing was submitted"), "{}", stderr_of(&o));
    assert_eq!(c.json(&["jobs", "--all"]).as_array().unwrap().len(), 0);
    let v = c.json(&["submit", "--hold", &a, &b]);
    let ids: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(c.show(ids[1])["name"], "bee");
    assert_eq!(c.show(ids[0])["state"], "held");
}
