//! The reservations API over HTTP/1.1 + JSON (docs/reservations.md, docs/openapi.yaml).
//!
//! Served on a Unix socket next to the controller's (`[api] socket`, default
//! `<controller socket dir>/api.sock`, mode 0666), where the caller is who the kernel says
//! (`SO_PEERCRED`), and optionally on TCP (`[api] listen`), where every request needs
//! `Authorization: Bearer <token>` with the token of `[api] token_file` and has admin rights.
//!
//! Connections are tasks; each request becomes a `ClientRequest::Reservation` sent to the
//! state thread exactly like a CLI request, and is answered once the state thread has
//! committed it. Nothing here touches the state.

use crate::command::{Command, ServerError};
use crate::model::request::Peer;
use berth_protocol::client::{ApiError, ClientRequest, ClientResponse};
use berth_protocol::reservation::{
    ConfirmRequest, ErrorBody, ReservationError, ReservationReply, ReservationRequest, ReserveRequest,
};
use berth_protocol::user::UserIdentity;
use berth_protocol::ErrorCode as Code;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};

/// The OpenAPI document, served at `GET /v1/openapi.yaml`.
pub const OPENAPI: &str = include_str!("../../../../docs/openapi.yaml");

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Every route the server serves: (method, path template). The dispatcher serves exactly
/// these (`route_of`), and docs/openapi.yaml documents exactly these (checked by a test).
pub const ROUTES: [(&str, &str); 8] = [
    ("GET", "/v1/inventory"),
    ("GET", "/v1/reservations"),
    ("POST", "/v1/reservations"),
    ("GET", "/v1/reservations/{id}"),
    ("DELETE", "/v1/reservations/{id}"),
    ("POST", "/v1/reservations/{id}/confirm"),
    ("POST", "/v1/reservations/{id}/renew"),
    ("GET", "/v1/openapi.yaml"),
];

/// The bound listeners, before they serve.
pub struct Listeners {
    unix: Option<(UnixListener, PathBuf)>,
    tcp: Option<(TcpListener, Arc<str>)>,
}

/// Removes the API socket when the controller stops.
pub struct Guard {
    socket: Option<PathBuf>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn listen_error(what: &'static str, addr: &str, message: String) -> ServerError {
    ServerError::Listen {
        what,
        addr: addr.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, message),
    }
}

/// Bind the API's sockets (nothing when `[api] enabled = false`). Refuses TCP without a token.
pub async fn bind(cfg: &crate::ControllerConfig) -> Result<Listeners, ServerError> {
    let api = &cfg.api;
    if !api.enabled {
        return Ok(Listeners { unix: None, tcp: None });
    }
    api.validate().map_err(|m| listen_error("reservations API", api.listen.as_deref().unwrap_or(""), m))?;
    let path = api.socket_path(&cfg.socket);
    // The controller's own socket was checked first: nobody else serves this directory.
    let _ = std::fs::remove_file(&path);
    let unix = UnixListener::bind(&path).map_err(|source| ServerError::Listen {
        what: "reservations API socket",
        addr: path.display().to_string(),
        source,
    })?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
    let tcp = match &api.listen {
        None => None,
        Some(addr) => {
            let file = api.token_file.clone().unwrap_or_default();
            let token = std::fs::read_to_string(&file)
                .map_err(|e| {
                    listen_error(
                        "reservations API",
                        addr,
                        format!("cannot read [api] token_file {}: {e}", file.display()),
                    )
                })?
                .trim()
                .to_string();
            if token.len() < 16 {
                return Err(listen_error(
                    "reservations API",
                    addr,
                    format!("the token in {} is shorter than 16 characters; write a long random one", file.display()),
                ));
            }
            if let Ok(meta) = std::fs::metadata(&file) {
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(file = %file.display(), "the API token file is readable by other users; chmod 600 it");
                }
            }
            let l = TcpListener::bind(addr).await.map_err(|source| ServerError::Listen {
                what: "reservations API",
                addr: addr.clone(),
                source,
            })?;
            Some((l, Arc::from(token)))
        }
    };
    tracing::info!(socket = %path.display(), tcp = ?api.listen, "reservations API listening");
    Ok(Listeners { unix: Some((unix, path)), tcp })
}

impl Listeners {
    /// Accept connections until the controller stops; requests go to the state thread.
    pub fn serve(self, tx: mpsc::Sender<Command>, conn_ids: Arc<AtomicU64>) -> Guard {
        let guard = Guard { socket: self.unix.as_ref().map(|(_, p)| p.clone()) };
        if let Some((unix, _)) = self.unix {
            let (tx, ids) = (tx.clone(), conn_ids.clone());
            tokio::spawn(async move {
                loop {
                    match unix.accept().await {
                        Ok((stream, _)) => {
                            let peer = crate::users::peer_identity(&stream)
                                .map(|user| Peer { user, conn: ids.fetch_add(1, Ordering::Relaxed) });
                            let ctx = Arc::new(Ctx { tx: tx.clone(), peer, token: None });
                            tokio::spawn(serve_connection(stream, ctx));
                        }
                        Err(e) => {
                            tracing::warn!("accept on the API socket: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        if let Some((tcp, token)) = self.tcp {
            tokio::spawn(async move {
                loop {
                    match tcp.accept().await {
                        Ok((stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            let user = UserIdentity { uid: 0, gid: 0, groups: vec![0], name: "root".into() };
                            let peer = Ok(Peer { user, conn: conn_ids.fetch_add(1, Ordering::Relaxed) });
                            let ctx = Arc::new(Ctx { tx: tx.clone(), peer, token: Some(token.clone()) });
                            tokio::spawn(serve_connection(stream, ctx));
                        }
                        Err(e) => {
                            tracing::warn!("accept on the API port: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        guard
    }
}

/// One connection's context.
pub(crate) struct Ctx {
    pub tx: mpsc::Sender<Command>,
    /// Who is calling (Unix: from the kernel; TCP: an admin once the token is checked).
    pub peer: Result<Peer, String>,
    /// TCP: the token every request must carry.
    pub token: Option<Arc<str>>,
}

pub(crate) async fn serve_connection<S>(stream: S, ctx: Arc<Ctx>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let ctx = ctx.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(req, &ctx).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(io, svc);
    if let Err(e) = conn.await {
        tracing::debug!("API connection: {e}");
    }
}

/// The route a method and path template name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Inventory,
    List,
    Reserve,
    Show,
    Release,
    Confirm,
    Renew,
    OpenApi,
}

/// The route served for `(method, template)` of [`ROUTES`].
pub fn route_of(method: &str, template: &str) -> Option<Route> {
    Some(match (method, template) {
        ("GET", "/v1/inventory") => Route::Inventory,
        ("GET", "/v1/reservations") => Route::List,
        ("POST", "/v1/reservations") => Route::Reserve,
        ("GET", "/v1/reservations/{id}") => Route::Show,
        ("DELETE", "/v1/reservations/{id}") => Route::Release,
        ("POST", "/v1/reservations/{id}/confirm") => Route::Confirm,
        ("POST", "/v1/reservations/{id}/renew") => Route::Renew,
        ("GET", "/v1/openapi.yaml") => Route::OpenApi,
        _ => return None,
    })
}

/// Match `path` against a template; the `{id}` segment, if any, is returned.
fn matches<'a>(template: &str, path: &'a str) -> Option<Option<&'a str>> {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    if t.len() != p.len() {
        return None;
    }
    let mut param = None;
    for (ts, ps) in t.iter().zip(&p) {
        if ts.starts_with('{') {
            if ps.is_empty() {
                return None;
            }
            param = Some(*ps);
        } else if ts != ps {
            return None;
        }
    }
    Some(param)
}

/// Why a request has no route, and the methods its path takes (for `Allow`).
pub type Unresolved = (ReservationError, Vec<&'static str>);

/// Find the route of a request: 404 for an unknown path, 405 (with the allowed methods) for
/// a known path with another method.
pub fn resolve(method: &str, path: &str) -> Result<(Route, Option<String>), Unresolved> {
    let mut allowed = Vec::new();
    for (m, template) in ROUTES {
        if let Some(param) = matches(template, path) {
            if m == method {
                return match route_of(m, template) {
                    Some(r) => Ok((r, param.map(str::to_string))),
                    None => Err((
                        ReservationError::new(Code::Internal, format!("route {m} {template} has no handler")),
                        vec![],
                    )),
                };
            }
            allowed.push(m);
        }
    }
    if allowed.is_empty() {
        Err((ReservationError::new(Code::NotFound, format!("no such path {path:?}; see GET /v1/openapi.yaml")), vec![]))
    } else {
        let message = format!("{path} takes {}, not {method}", allowed.join(", "));
        Err((ReservationError::new(Code::MethodNotAllowed, message), allowed))
    }
}

fn json_response(status: u16, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut r = Response::new(Full::new(Bytes::from(bytes)));
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => error_response(ReservationError::new(Code::Internal, format!("cannot encode the answer: {e}"))),
    }
}

fn error_response(error: ReservationError) -> Response<Full<Bytes>> {
    let status = error.code.status();
    let unauthorized = error.code == Code::Unauthorized;
    let mut r = json_response(status, &ErrorBody { error });
    if unauthorized {
        r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// Compare without leaking where the first difference is.
fn same_token(given: &[u8], want: &[u8]) -> bool {
    given.len() == want.len() && given.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Read a request body as JSON of `T` (an empty body reads as `{}`).
async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, ReservationError> {
    let collected = Limited::new(body, MAX_BODY_BYTES).collect().await.map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            ReservationError::new(
                Code::PayloadTooLarge,
                format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            )
        } else {
            ReservationError::new(Code::BadRequest, format!("cannot read the request body: {e}"))
        }
    })?;
    let bytes = collected.to_bytes();
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
    serde_json::from_slice(text).map_err(|e| ReservationError::new(Code::BadRequest, format!("request body: {e}")))
}

/// A body that must be empty or `{}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

fn parse_id(param: Option<String>) -> Result<u64, ReservationError> {
    let p = param.unwrap_or_default();
    p.parse::<u64>().map_err(|_| {
        ReservationError::new(Code::UnknownReservation, format!("{p:?} is not a reservation id (a whole number)"))
    })
}

/// `?all=true` and nothing else.
fn parse_list_query(query: Option<&str>) -> Result<bool, ReservationError> {
    let mut all = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "true")) {
            ("all", "true" | "1" | "yes") => all = true,
            ("all", "false" | "0" | "no") => all = false,
            (k, v) => {
                return Err(ReservationError::new(
                    Code::BadRequest,
                    format!("unknown query parameter {k}={v}; only all=true|false is understood"),
                ))
            }
        }
    }
    Ok(all)
}

async fn handle(req: Request<Incoming>, ctx: &Ctx) -> Response<Full<Bytes>> {
    if let Some(token) = &ctx.token {
        let given = req.headers().get(AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if !given.is_some_and(|g| same_token(g, token.as_bytes())) {
            return error_response(ReservationError::new(
                Code::Unauthorized,
                "send `Authorization: Bearer <token>` with the token of the controller's [api] token_file",
            ));
        }
    }
    let (route, param) = match resolve(req.method().as_str(), req.uri().path()) {
        Ok(r) => r,
        Err((e, allowed)) => {
            let mut r = error_response(e);
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                if !allowed.is_empty() {
                    r.headers_mut().insert(ALLOW, v);
                }
            }
            return r;
        }
    };
    match build(route, param, req, ctx).await {
        Ok(Some(request)) => call(request, ctx).await,
        Ok(None) => {
            let mut r = Response::new(Full::new(Bytes::from_static(OPENAPI.as_bytes())));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
            r
        }
        Err(e) => error_response(e),
    }
}

/// The controller request of a route (None: the OpenAPI document, answered here).
async fn build(
    route: Route,
    param: Option<String>,
    req: Request<Incoming>,
    ctx: &Ctx,
) -> Result<Option<ReservationRequest>, ReservationError> {
    let query = req.uri().query().map(str::to_string);
    Ok(Some(match route {
        Route::OpenApi => return Ok(None),
        Route::Inventory => ReservationRequest::Inventory,
        Route::List => ReservationRequest::List { all: parse_list_query(query.as_deref())? },
        Route::Show => ReservationRequest::Show { id: parse_id(param)? },
        Route::Release => ReservationRequest::Release { id: parse_id(param)? },
        Route::Reserve => {
            let body: ReserveRequest = read_json(req.into_body()).await?;
            if ctx.token.is_some() && body.user.is_none() {
                return Err(ReservationError::new(
                    Code::BadRequest,
                    "over TCP name the user the reservation is for (\"user\": \"login\")",
                ));
            }
            ReservationRequest::Reserve { body }
        }
        Route::Confirm => {
            let id = parse_id(param)?;
            let body: ConfirmRequest = read_json(req.into_body()).await?;
            ReservationRequest::Confirm { id, body }
        }
        Route::Renew => {
            let id = parse_id(param)?;
            let _: Empty = read_json(req.into_body()).await?;
            ReservationRequest::Renew { id }
        }
    }))
}

/// Send a request to the state thread and turn its answer into HTTP.
async fn call(request: ReservationRequest, ctx: &Ctx) -> Response<Full<Bytes>> {
    let peer = match &ctx.peer {
        Ok(p) => p.clone(),
        Err(e) => return error_response(ReservationError::new(Code::Internal, e.clone())),
    };
    let (reply, rx) = oneshot::channel();
    let req = ClientRequest::Reservation { request: Box::new(request) };
    let stopping = || ReservationError::new(Code::Unavailable, "the controller is stopping; try again when it is back");
    if ctx.tx.send(Command::Client { req, peer, reply }).await.is_err() {
        return error_response(stopping());
    }
    match rx.await {
        Ok(ClientResponse::Reservation { reply }) => reply_response(reply),
        Ok(ClientResponse::Error(e)) => error_response(from_api_error(e)),
        Ok(other) => error_response(ReservationError::new(Code::Internal, format!("unexpected answer {other:?}"))),
        Err(_) => error_response(stopping()),
    }
}

fn reply_response(reply: ReservationReply) -> Response<Full<Bytes>> {
    match reply {
        ReservationReply::Failed(e) => error_response(e),
        ReservationReply::Inventory(inv) => json_response(200, &inv),
        ReservationReply::List { reservations } => {
            json_response(200, &serde_json::json!({ "reservations": reservations }))
        }
        ReservationReply::One { reservation, created } => {
            let mut r = json_response(if created { 201 } else { 200 }, &reservation);
            if created {
                if let Ok(v) = HeaderValue::from_str(&format!("/v1/reservations/{}", reservation.id)) {
                    r.headers_mut().insert(LOCATION, v);
                }
            }
            r
        }
    }
}

/// A refusal of the controller's socket as an HTTP error: the same code (one table,
/// docs/errors.md), whose `status()` the response carries.
fn from_api_error(e: ApiError) -> ReservationError {
    ReservationError::new(e.code, e.message)
}

#[cfg(test)]
mod tests;
