use super::*;
use crate::config::ApiConfig;
use crate::testkit::{ann, bob, Harness};
use hyper::HeaderMap;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// (METHOD, path) of every operation under `paths:` of the OpenAPI document.
fn documented() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in OPENAPI.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        let key = line.trim().trim_end_matches(':');
        if indent == 2 && line.trim_end().ends_with(':') {
            path = Some(key.trim_matches(['"', '\'']).to_string());
        } else if indent == 4 && ["get", "post", "put", "delete", "patch", "head", "options"].contains(&key) {
            out.insert((key.to_ascii_uppercase(), path.clone().expect("a method under a path")));
        }
    }
    out
}

#[test]
fn every_route_served_is_documented_and_every_documented_route_is_served() {
    let served: BTreeSet<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    assert_eq!(served.len(), ROUTES.len(), "a route is listed twice");
    assert_eq!(served, documented(), "docs/openapi.yaml and api::ROUTES differ");
    for (m, p) in ROUTES {
        assert!(route_of(m, p).is_some(), "{m} {p} has no handler");
        let concrete = p.replace("{id}", "7");
        let (route, param) = resolve(m, &concrete).unwrap();
        assert_eq!(Some(route), route_of(m, p));
        assert_eq!(param.is_some(), p.contains("{id}"));
    }
    // ErrorBody's code enum lists exactly the codes a reply can carry (docs/errors.md).
    let line =
        OPENAPI.lines().find(|l| l.trim_start().starts_with("enum: [bad_request")).expect("ErrorBody's code enum");
    let documented: BTreeSet<&str> =
        line.trim().trim_start_matches("enum: [").trim_end_matches(']').split(", ").collect();
    let replies: BTreeSet<&str> = Code::ALL.into_iter().filter(|c| c.is_reply()).map(|c| c.as_str()).collect();
    assert_eq!(documented, replies, "docs/openapi.yaml's error codes and ErrorCode differ");
}

#[test]
fn unknown_paths_and_methods() {
    let (e, allowed) = resolve("GET", "/v1/nothing").unwrap_err();
    assert_eq!((e.code, allowed.len()), (Code::NotFound, 0));
    let (e, allowed) = resolve("PUT", "/v1/reservations").unwrap_err();
    assert_eq!((e.code, allowed), (Code::MethodNotAllowed, vec!["GET", "POST"]));
    assert!(resolve("GET", "/v1/reservations/").is_err());
    assert!(resolve("GET", "/v1/reservations/1/confirm/x").is_err());
    assert_eq!(resolve("DELETE", "/v1/reservations/12").unwrap(), (Route::Release, Some("12".into())));
    assert_eq!(parse_list_query(Some("all=true")), Ok(true));
    assert_eq!(parse_list_query(None), Ok(false));
    assert!(parse_list_query(Some("al=1")).is_err());
}

#[test]
fn config_refuses_tcp_without_a_token_and_bad_numbers() {
    let mut c = ApiConfig::default();
    assert!(c.validate().is_ok());
    c.listen = Some("127.0.0.1:7118".into());
    assert!(c.validate().unwrap_err().contains("token_file"));
    c.token_file = Some("/etc/berth/token".into());
    assert!(c.validate().is_ok());
    c.listen = Some("everywhere".into());
    assert!(c.validate().unwrap_err().contains("listen"));
    let c = ApiConfig { confirm_timeout_secs: 0.0, ..Default::default() };
    assert!(c.validate().unwrap_err().contains("confirm_timeout_secs"));
    assert_eq!(
        ApiConfig::default().socket_path(Path::new("/run/berth/controller.sock")),
        PathBuf::from("/run/berth/api.sock")
    );
    // In the controller's TOML.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(&file, "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[api]\nconfirm_timeout_secs = 5\n")
        .unwrap();
    let cfg = crate::ControllerConfig::load(Some(&file), &vec![], &[], &vec![]).unwrap();
    assert_eq!(cfg.api.confirm_timeout_secs, 5.0);
    std::fs::write(&file, "state_dir = \"/tmp/s\"\nsocket = \"/tmp/s.sock\"\n[api]\nconfirm_timeout = 5\n").unwrap();
    assert!(crate::ControllerConfig::load(Some(&file), &vec![], &[], &vec![]).is_err());
}

#[tokio::test]
async fn bind_refuses_tcp_without_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::testkit::config(dir.path());
    cfg.api.listen = Some("127.0.0.1:0".into());
    let e = bind(&cfg).await.err().expect("refused").to_string();
    assert!(e.contains("token_file"), "{e}");
    let token = dir.path().join("token");
    std::fs::write(&token, "short\n").unwrap();
    cfg.api.token_file = Some(token.clone());
    let e = bind(&cfg).await.err().expect("refused").to_string();
    assert!(e.contains("shorter"), "{e}");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    let l = bind(&cfg).await.expect("bound");
    assert!(l.tcp.is_some() && dir.path().join("api.sock").exists());
    let (tx, _rx) = mpsc::channel(1);
    drop(l.serve(tx, Arc::new(AtomicU64::new(1))));
    assert!(!dir.path().join("api.sock").exists(), "the guard removes the socket");
}

/// The state thread of a test: a harness answering client requests as the real one does.
fn actor(mut h: Harness, mut rx: mpsc::Receiver<Command>) -> Harness {
    while let Some(cmd) = rx.blocking_recv() {
        if let Command::Client { req, peer, reply } = cmd {
            h.ctl.handle_client(req, &peer, reply, h.now).unwrap();
            h.ctl.carry_out_effects(h.now).unwrap();
            for (tx, r) in h.ctl.out.replies.drain(..) {
                let _ = tx.send(r);
            }
        }
    }
    h
}

/// An API server on a Unix socket in `dir` for `peer` (with `token`, as on TCP).
async fn server(dir: &Path, peer: Peer, token: Option<&str>) -> (PathBuf, std::thread::JoinHandle<Harness>) {
    let h = Harness::new(2);
    let (tx, rx) = mpsc::channel(64);
    let thread = std::thread::spawn(move || actor(h, rx));
    let path = dir.join("api.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let ctx = Arc::new(Ctx { tx, peer: Ok(peer), token: token.map(Arc::from) });
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, ctx.clone()));
        }
    });
    (path, thread)
}

/// One request with a real HTTP client: status, headers, body.
async fn http(sock: &Path, method: &str, uri: &str, body: &str, auth: Option<&str>) -> (u16, HeaderMap, String) {
    let stream = tokio::net::UnixStream::connect(sock).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut b = Request::builder().method(method).uri(uri).header("host", "localhost");
    if let Some(a) = auth {
        b = b.header("authorization", a);
    }
    let resp = sender.send_request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&bytes).into_owned())
}

async fn json(sock: &Path, method: &str, uri: &str, body: &str) -> (u16, Value) {
    let (status, headers, text) = http(sock, method, uri, body, None).await;
    if uri != "/v1/openapi.yaml" {
        assert_eq!(headers.get(CONTENT_TYPE).unwrap(), "application/json", "{text}");
    }
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reserve_confirm_release_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, _thread) = server(dir.path(), ann(), None).await;
    let (s, inv) = json(&sock, "GET", "/v1/inventory", "").await;
    assert_eq!(s, 200);
    assert_eq!(inv["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(inv["nodes"][0]["free_cores"], 8);
    assert_eq!(inv["nodes"][0]["topology"], "SCCCCSCCCC");
    // Reserve: 201, Location, the allocation.
    let body = r#"{"resources":{"nodes":2,"tasks_per_node":2,"mem":"64M"},"walltime":"10:00"}"#;
    let (s, headers, text) = http(&sock, "POST", "/v1/reservations", body, None).await;
    assert_eq!(s, 201, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(headers.get(LOCATION).unwrap(), "/v1/reservations/1");
    assert_eq!(
        (r["id"].as_u64(), r["state"].as_str(), r["user"].as_str()),
        (Some(1), Some("unconfirmed"), Some("ann"))
    );
    assert_eq!(r["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(r["nodes"][0]["memory_bytes"], 64 << 20);
    assert!(r["confirm_by"].as_f64().is_some() && r["job"].as_u64().is_some());
    // Errors: malformed, unknown field, busy, never, unknown id, path, method.
    let (s, v) = json(&sock, "POST", "/v1/reservations", "{not json").await;
    assert_eq!((s, code(&v)), (400, "bad_request"));
    let (s, v) = json(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"resources":{"license":1}}"#).await;
    assert_eq!((s, code(&v)), (400, "bad_request"));
    assert!(v["error"]["message"].as_str().unwrap().contains("unknown field `license`"), "{v}");
    // A license the cluster does not have: infeasible, named.
    let (s, v) =
        json(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"resources":{"cores":1,"licenses":"matlab:1"}}"#)
            .await;
    assert_eq!((s, code(&v)), (422, "infeasible"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("license matlab"), "{v}");
    // GPUs on a node without any: infeasible, with the reason.
    let (s, v) = json(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"resources":{"gpus":1}}"#).await;
    assert_eq!((s, code(&v)), (422, "infeasible"), "{v}");
    let (s, v) =
        json(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"resources":{"nodes":2,"tasks_per_node":7}}"#).await;
    assert_eq!((s, code(&v)), (409, "try_again"));
    assert!(v["error"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v}");
    let (s, v) = json(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"resources":{"cores":500}}"#).await;
    assert_eq!((s, code(&v)), (422, "infeasible"));
    let (s, v) = json(&sock, "GET", "/v1/reservations/99", "").await;
    assert_eq!((s, code(&v)), (404, "unknown_reservation"));
    let (s, v) = json(&sock, "GET", "/v1/reservations/abc", "").await;
    assert_eq!((s, code(&v)), (404, "unknown_reservation"));
    let (s, v) = json(&sock, "GET", "/v1/nothing", "").await;
    assert_eq!((s, code(&v)), (404, "not_found"));
    let (s, headers, _) = http(&sock, "PUT", "/v1/reservations", "", None).await;
    assert_eq!((s, headers.get(ALLOW).unwrap().to_str().unwrap()), (405, "GET, POST"));
    let big = format!(r#"{{"walltime":60,"user":"{}"}}"#, "x".repeat(MAX_BODY_BYTES));
    let (s, v) = json(&sock, "POST", "/v1/reservations", &big).await;
    assert_eq!((s, code(&v)), (413, "payload_too_large"));
    // Confirm with a session, renew, show, list, release.
    let (s, v) = json(&sock, "POST", "/v1/reservations/1/confirm", r#"{"session":"ext-7"}"#).await;
    assert_eq!((s, v["state"].as_str(), v["holder"]["kind"].as_str()), (200, Some("confirmed"), Some("session")));
    let (s, v) = json(&sock, "POST", "/v1/reservations/1/confirm", r#"{"job":1,"pid":2}"#).await;
    assert_eq!((s, code(&v)), (400, "bad_request"));
    let (s, v) = json(&sock, "POST", "/v1/reservations/1/renew", "").await;
    assert_eq!((s, v["renew_by"].is_number()), (200, true));
    let (s, v) = json(&sock, "POST", "/v1/reservations/1/renew", r#"{"x":1}"#).await;
    assert_eq!((s, code(&v)), (400, "bad_request"));
    let (s, v) = json(&sock, "GET", "/v1/reservations", "").await;
    assert_eq!((s, v["reservations"].as_array().unwrap().len()), (200, 1));
    let (s, v) = json(&sock, "DELETE", "/v1/reservations/1", "").await;
    assert_eq!((s, v["state"].as_str()), (200, Some("released")));
    let (s, v) = json(&sock, "GET", "/v1/reservations", "").await;
    assert_eq!((s, v["reservations"].as_array().unwrap().len()), (200, 0));
    let (s, v) = json(&sock, "GET", "/v1/reservations?all=true", "").await;
    assert_eq!((s, v["reservations"][0]["release_reason"].as_str()), (200, Some("released by ann")));
    let (s, v) = json(&sock, "POST", "/v1/reservations/1/confirm", r#"{"session":"late"}"#).await;
    assert_eq!((s, code(&v)), (409, "invalid_state"));
    let (s, headers, text) = http(&sock, "GET", "/v1/openapi.yaml", "", None).await;
    assert_eq!((s, headers.get(CONTENT_TYPE).unwrap().to_str().unwrap()), (200, "application/yaml"));
    assert!(text.starts_with("openapi: 3.0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_socket_is_refused_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, _thread) = server(dir.path(), bob(), None).await;
    for garbage in [
        &b"\x00\xff\xfe garbage\r\n\r\n"[..],
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/reservations HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
    ] {
        let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
        s.write_all(garbage).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
    }
    // A client that sends half a request and goes away.
    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(b"POST /v1/reservations HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"wall").await.unwrap();
    drop(s);
    let (s, _) = json(&sock, "GET", "/v1/inventory", "").await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_clients_need_the_token_and_name_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let admin = Peer { user: UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() }, conn: 5 };
    let token = "0123456789abcdef0123";
    let (sock, _thread) = server(dir.path(), admin, Some(token)).await;
    let (s, headers, text) = http(&sock, "GET", "/v1/inventory", "", None).await;
    assert_eq!((s, headers.get(WWW_AUTHENTICATE).unwrap().to_str().unwrap()), (401, "Bearer"));
    assert!(text.contains("unauthorized"));
    let (s, _, _) = http(&sock, "GET", "/v1/inventory", "", Some("Bearer 0123456789abcdef0124")).await;
    assert_eq!(s, 401);
    let bearer = format!("Bearer {token}");
    let (s, _, _) = http(&sock, "GET", "/v1/inventory", "", Some(&bearer)).await;
    assert_eq!(s, 200);
    let (s, _, text) = http(&sock, "POST", "/v1/reservations", r#"{"walltime":60}"#, Some(&bearer)).await;
    assert_eq!(s, 400, "{text}");
    assert!(text.contains("user"));
    let (s, _, text) = http(&sock, "POST", "/v1/reservations", r#"{"walltime":60,"user":"root"}"#, Some(&bearer)).await;
    assert_eq!(s, 201, "{text}");
}
