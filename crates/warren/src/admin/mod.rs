//! The admin HTTP API (axum): JSON status and Prometheus `/metrics`, off unless the config
//! has an `[admin]` section.
//!
//! Endpoints (all `GET` unless said; every one needs `Authorization: Bearer TOKEN` when
//! `[admin] token` is set; the full description is `docs/admin-api.md`):
//!
//! | path | what |
//! |---|---|
//! | `/api/v1/status` | version, side, start time, uptime |
//! | `/api/v1/sessions` | sessions: id, peer address, cipher, since, services (paginated) |
//! | `/api/v1/services` | services: state, active and total connections, bytes each way, errors (paginated) |
//! | `/api/v1/connections` | live connections: id, service, peer, since, bytes each way |
//! | `POST /api/v1/reload` | read the config file again and apply what changed ([`crate::reload`]) |
//! | `/api/v1/config` | the config file in force, secrets masked ([`config_view`]) |
//! | `/api/v1/logs` | recent log events ([`logs`]) |
//! | `/api/v1/events` | the dashboard's live stream, Server-Sent Events ([`events`]) |
//! | `POST /api/v1/sessions/{id}/disconnect` | close a session (its client reconnects) |
//! | `/api/v1/requests`, `/api/v1/requests/{id}`, `POST …/replay` | the HTTP inspector |
//! | `/metrics` | Prometheus text exposition ([`crate::metrics`]) |
//! | `/`, `/login`, `/assets/…` | the dashboard ([`assets`]), its login ([`auth`]) |
//!
//! The two lists that grow with the deployment (10,000 services, 1,000 sessions) answer one
//! page at a time: `?limit=N&offset=M` (default limit [`DEFAULT_PAGE`], at most
//! [`MAX_PAGE`]), the whole count in the `X-Total-Count` header. The body stays a bare JSON
//! list, so a client that ignores paging keeps working on small deployments.
//!
//! The API reads state through atomics and snapshots ([`AdminSource`]); it never takes a
//! lock the data path holds. The server task is owned by its side: it stops when the side's
//! cancellation token fires. Who may ask, and from which page, is [`auth`]'s job.

pub mod assets;
pub mod auth;
pub mod config_view;
pub mod events;
pub mod logs;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use warren_proto::SuiteSpeed;
use warren_proto::handshake::Negotiation;

use crate::crypto::secret::Secret;
use crate::http::capture::Captures;
use crate::metrics::{ConnectionInfo, Telemetry, unix_seconds};
use crate::reload::{Reload, ReloadError};

/// `/api/v1/status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusInfo {
    /// Warren's version.
    pub version: &'static str,
    /// `server` or `client`.
    pub side: &'static str,
    /// Seconds since the Unix epoch when this process started serving.
    pub started: u64,
    /// Seconds since then.
    pub uptime_seconds: u64,
    /// Whether the admin listener asks for a token (the dashboard then has a Log out).
    pub auth: bool,
    /// Server: where clients connect (`bind`), for the command the dashboard suggests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// Whether the side is draining for a restart (SIGTERM or `POST /api/v1/drain`).
    pub draining: bool,
    /// How long the drain has been going, while draining.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining_for_ms: Option<u64>,
}

/// Entries of a list answered when the request names no `limit`.
pub const DEFAULT_PAGE: usize = 1000;
/// Most entries of a list in one answer, whatever `limit` asks.
pub const MAX_PAGE: usize = 10_000;
/// The header carrying a paginated list's whole length.
const TOTAL_COUNT: HeaderName = HeaderName::from_static("x-total-count");

/// A window on a sorted list: skip `offset` entries, answer at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Entries skipped.
    pub offset: usize,
    /// Most entries answered (at most [`MAX_PAGE`]).
    pub limit: usize,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            offset: 0,
            limit: DEFAULT_PAGE,
        }
    }
}

impl Page {
    /// Parses `limit=N&offset=M` (either may be missing; other keys are ignored). A limit
    /// above [`MAX_PAGE`] is cut to it.
    ///
    /// # Errors
    /// A message naming the parameter whose value is not a whole number.
    pub fn parse(query: Option<&str>) -> Result<Page, String> {
        let mut page = Page::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "limit" => &mut page.limit,
                "offset" => &mut page.offset,
                _ => continue,
            };
            *slot = value.parse().map_err(|_| {
                format!("`{key}={value}` is not a whole number: use e.g. `?limit=100&offset=200`")
            })?;
        }
        page.limit = page.limit.min(MAX_PAGE);
        Ok(page)
    }

    /// The indices of this page in a list of `total` entries.
    pub fn range(&self, total: usize) -> std::ops::Range<usize> {
        let start = self.offset.min(total);
        start..start.saturating_add(self.limit).min(total)
    }
}

/// One page of a list and the list's whole length.
#[derive(Debug, Clone)]
pub struct Paged<T> {
    /// The entries of the page, in the list's order.
    pub items: Vec<T>,
    /// Entries in the whole list.
    pub total: usize,
}

/// One entry of `/api/v1/sessions`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    /// Short session id (as in the logs).
    pub id: String,
    /// The client's address (server side) or the server's (client side).
    pub peer: String,
    /// `"noise"`, `"tcp"` or `"quic"`.
    pub transport: &'static str,
    /// The negotiated cipher.
    pub cipher: String,
    /// How the cipher was chosen, with both sides' figures.
    pub cipher_choice: CipherChoiceInfo,
    /// Seconds since the Unix epoch when the session was established.
    pub since: u64,
    /// Services the session serves.
    pub services: Vec<String>,
    /// Streams open on the session now.
    pub open_streams: u64,
    /// `"alive"`, or `"suspect"` while the peer leaves a heartbeat unanswered past its
    /// deadline (a suspect session is given no new stream).
    pub state: &'static str,
    /// Client side: the server this session is with, as configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The Warren protocol version the session speaks.
    pub version: u16,
    /// Round trip in milliseconds: the heartbeats' smoothed round trip (server side `None`
    /// before the first pong; client side the handshake's until then).
    pub rtt_ms: Option<f64>,
    /// QUIC sessions: RTT, congestion window, packet size, losses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quic: Option<crate::session::quic::QuicPath>,
    /// The congestion control of the session's connection: the kernel's (`TCP_CONGESTION`
    /// of the control connection; `tcp_congestion` sets it) on TCP transports, quinn's
    /// controller on QUIC. `None` where the platform cannot say.
    pub congestion: Option<String>,
}

/// The transport name of a session on the server, from what carries it and its keys: a
/// `tls` session has no record cipher either, but is not plaintext; `ws` and `wss` carry
/// records inside WebSocket frames (of their own cipher, or none on a `wss` whose TLS is
/// end to end).
pub fn transport_name(
    quic: Option<&crate::session::quic::QuicPath>,
    keys: &crate::crypto::keys::SessionKeys,
) -> &'static str {
    match (quic, keys.record_cipher()) {
        (Some(_), _) => "quic",
        (None, _) if let Some(websocket) = keys.websocket() => websocket,
        (None, _) if keys.is_on_tls() => "tls",
        (None, Some(warren_proto::CipherSuite::None)) => "tcp",
        (None, _) => "noise",
    }
}

/// One session serving a service (server side of `/api/v1/services`).
#[derive(Debug, Clone, Serialize)]
pub struct ServingSession {
    /// Short session id.
    pub session: String,
    /// The client's address.
    pub peer: String,
    /// Its share of the service's visitors.
    pub weight: u32,
    /// `false` while the client reports the service's target unhealthy (never picked).
    pub ready: bool,
    /// The service's streams open on it now.
    pub open_streams: u32,
    /// The service's visitors it was picked for since it joined.
    pub picked: u64,
}

/// How a session's cipher was chosen (`cipher_choice` of a [`SessionInfo`]).
#[derive(Debug, Clone, Serialize)]
pub struct CipherChoiceInfo {
    /// `fastest` (both sides' measured speeds decided) or `ordered` (the client's order did,
    /// also when a peer predates figures).
    pub decided_by: &'static str,
    /// The client's figures (empty when it sent none).
    pub client: Vec<CipherSpeedInfo>,
    /// The server's figures (empty when it measured none or predates figures).
    pub server: Vec<CipherSpeedInfo>,
}

/// One side's measured speed for one cipher.
#[derive(Debug, Clone, Serialize)]
pub struct CipherSpeedInfo {
    /// The cipher.
    pub cipher: &'static str,
    /// Seal speed, MB/s on one core.
    pub seal_mbps: u32,
    /// Open speed, MB/s on one core.
    pub open_mbps: u32,
}

impl From<&Negotiation> for CipherChoiceInfo {
    fn from(negotiation: &Negotiation) -> Self {
        let speeds = |speeds: &[SuiteSpeed]| {
            speeds
                .iter()
                .map(|speed| CipherSpeedInfo {
                    cipher: speed.suite.name(),
                    seal_mbps: speed.seal_mbps,
                    open_mbps: speed.open_mbps,
                })
                .collect()
        };
        CipherChoiceInfo {
            decided_by: negotiation.decided_by.name(),
            client: speeds(&negotiation.client_speeds),
            server: speeds(&negotiation.server_speeds),
        }
    }
}

/// One entry of `/api/v1/services`.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceInfo {
    /// The service name.
    pub name: String,
    /// `tcp` or `udp`.
    pub kind: String,
    /// `serving` (a session serves it), `waiting` (no client yet / not connected) or
    /// `refused` (client: the server refused its token).
    pub state: &'static str,
    /// Connections being relayed now.
    pub active_connections: i64,
    /// Connections since start.
    pub total_connections: u64,
    /// Bytes visitor → target.
    pub bytes_in: u64,
    /// Bytes target → visitor.
    pub bytes_out: u64,
    /// Failed connections.
    pub errors: u64,
    /// Server: how visitors are spread over the sessions serving the service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balance: Option<&'static str>,
    /// Server: the sessions serving the service, in the order they joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<ServingSession>>,
    /// Server: visitors a failed session handed on to another one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u64>,
    /// Client: `up`, `down` or `unchecked` (the target's health check).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<&'static str>,
    /// Where it is reached: the server's bind of a tcp/udp service, the client's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Server, http services: the host patterns routed to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Server, http services: the path prefixes routed to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// Server, http services: the middleware chain in order, with what each refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub middleware: Option<Vec<MiddlewareInfo>>,
    /// Client, P2P services: which end this is and its peers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p: Option<P2pInfo>,
}

impl ServiceInfo {
    /// A service with nothing counted yet and none of the optional parts.
    pub fn new(name: &str, kind: &str, state: &'static str) -> ServiceInfo {
        ServiceInfo {
            name: name.to_owned(),
            kind: kind.to_owned(),
            state,
            active_connections: 0,
            total_connections: 0,
            bytes_in: 0,
            bytes_out: 0,
            errors: 0,
            load_balance: None,
            sessions: None,
            retries: None,
            health: None,
            address: None,
            hosts: None,
            paths: None,
            middleware: None,
            p2p: None,
        }
    }
}

/// A client's P2P service (its `state` is `direct` or `relayed` as its first peer's route,
/// `waiting` with no peer, `refused` after a failed try).
#[derive(Debug, Clone, Serialize)]
pub struct P2pInfo {
    /// `exit` (this client has the service) or `entrance` (the visitors' end).
    pub end: &'static str,
    /// The peers connected now.
    pub peers: Vec<P2pPeerInfo>,
    /// Why the last try to connect failed, until a peer connects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One peer of a P2P service.
#[derive(Debug, Clone, Serialize)]
pub struct P2pPeerInfo {
    /// The peer's certificate fingerprint, short.
    pub peer: String,
    /// `direct` or `relayed`.
    pub route: &'static str,
    /// The peer's address (direct) or the relay's (relayed).
    pub address: String,
    /// The path's round trip now, in milliseconds.
    pub rtt_ms: f64,
}

/// One middleware of an http service's chain.
#[derive(Debug, Clone, Serialize)]
pub struct MiddlewareInfo {
    /// Its name (`basic_auth`, `rate_limit`, …).
    pub name: String,
    /// Requests it answered itself (refused, redirected, limited) since the chain was built.
    pub rejected: u64,
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize)]
pub struct ApiError {
    /// What went wrong and how to fix it (a refused reload lists every config error, one
    /// per line).
    pub error: String,
}

/// What a side exposes to the admin API.
pub trait AdminSource: Send + Sync + 'static {
    /// The side's metrics and live connections.
    fn telemetry(&self) -> &Arc<Telemetry>;
    /// `server` or `client`.
    fn side(&self) -> &'static str;
    /// One page of the live sessions (in a stable order: oldest first).
    fn sessions(&self, page: Page) -> Paged<SessionInfo>;
    /// One page of the configured services (by name); only the page's entries are built.
    fn services(&self, page: Page) -> Paged<ServiceInfo>;
    /// Updates gauges that are computed rather than counted (called before `/metrics`).
    fn refresh_metrics(&self) {}
    /// Reads the config file again and applies it; `None` when the side was built in code
    /// with no file to read.
    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        None
    }
    /// Recent HTTP requests (the inspector); `None` on a side without HTTP services.
    fn captures(&self) -> Option<&Arc<Captures>> {
        None
    }
    /// Sends captured request `id` again, changed by `edit` when given; answers the new
    /// request's id and status.
    fn replay(
        &self,
        id: u64,
        edit: Option<ReplayEdit>,
    ) -> crate::http::middleware::BoxFuture<'_, Result<(u64, u16), String>> {
        let _ = (id, edit);
        Box::pin(async { Err("this side serves no HTTP services".to_owned()) })
    }

    /// Server: the address clients connect to.
    fn bind(&self) -> Option<String> {
        None
    }

    /// The side's graceful drain.
    fn drain(&self) -> &crate::drain::Drain;

    /// Whether a load balancer should send this side visitors (`GET /readyz`); `Err` says
    /// why not, without naming services (the answer is public).
    fn readiness(&self) -> Result<(), String> {
        if self.drain().is_draining() {
            Err("draining".to_owned())
        } else {
            Ok(())
        }
    }

    /// Closes the session whose short id is `id` (its client connects again); `Err` says
    /// why not.
    fn disconnect(&self, id: &str) -> Result<(), String> {
        Err(format!(
            "no session {id} to disconnect on this {}",
            self.side()
        ))
    }
}

/// Changes to a captured request before it is replayed (`Edit and replay`); a field left
/// out keeps the captured value.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayEdit {
    /// The method, e.g. `POST`.
    pub method: Option<String>,
    /// The path and query, e.g. `/api/items?page=2`.
    pub uri: Option<String>,
    /// Every header, replacing the captured ones.
    pub headers: Option<Vec<(String, String)>>,
    /// The body, as text.
    pub body: Option<String>,
}

pub(crate) struct Ctx {
    source: Arc<dyn AdminSource>,
    gate: auth::Gate,
    /// The side's shutdown: live event streams end with it.
    cancel: CancellationToken,
    /// Event streams that may still open.
    streams: Arc<tokio::sync::Semaphore>,
}

/// Who may use the admin listener: see [`auth`].
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The bearer token (and dashboard password); `None` leaves it open (loopback only).
    pub token: Option<Secret>,
    /// Host names the dashboard answers to besides IP addresses and `localhost`.
    pub hosts: Vec<String>,
}

impl From<&crate::config::AdminConfig> for Access {
    fn from(config: &crate::config::AdminConfig) -> Self {
        Access {
            token: config.token.clone(),
            hosts: config.hosts.clone(),
        }
    }
}

/// Binds the admin listener.
///
/// # Errors
/// The OS error (port taken, address not local…).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The admin API's routes and the dashboard, for serving or testing; live streams end when
/// `cancel` fires.
pub fn router(source: Arc<dyn AdminSource>, access: Access, cancel: CancellationToken) -> Router {
    let ctx = Arc::new(Ctx {
        source,
        gate: auth::Gate::new(access.token, access.hosts),
        cancel,
        streams: Arc::new(tokio::sync::Semaphore::new(events::MAX_STREAMS)),
    });
    Router::new()
        .route("/", get(assets::index))
        .route("/index.html", get(assets::index))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(assets::asset))
        .route("/api/v1/status", get(status))
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/sessions/{id}/disconnect", post(disconnect))
        .route("/api/v1/services", get(services))
        .route("/api/v1/connections", get(connections))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/drain", post(drain))
        .route("/readyz", get(readyz))
        .route("/api/v1/config", get(config))
        .route("/api/v1/logs", get(recent_logs))
        .route("/api/v1/events", get(events::events))
        .route("/api/v1/requests", get(requests))
        .route("/api/v1/requests/{id}", get(request))
        .route("/api/v1/requests/{id}/replay", post(replay))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(Arc::clone(&ctx), guard))
        .with_state(ctx)
}

/// Largest request body the admin API reads (an edited replay: its body and headers).
const MAX_BODY: usize = 128 * 1024;

/// Serves the admin API and the dashboard on `listener` until `cancel` fires.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn AdminSource>,
    access: Access,
    cancel: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(event = "admin_started", bind = %addr, auth = access.token.is_some(), "admin API and dashboard listening on http://{addr}/");
    let app = router(source, access, cancel.clone());
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        warn!(event = "admin_failed", %error, "the admin API stopped");
    }
}

/// Screens every request ([`auth::screen`]) and hardens every answer ([`auth::harden`]).
async fn guard(State(ctx): State<Arc<Ctx>>, request: Request, next: Next) -> Response {
    let mut response = match auth::screen(&ctx.gate, &request) {
        Some(refused) => refused,
        None => next.run(request).await,
    };
    auth::harden(&mut response);
    response
}

async fn login_page(State(ctx): State<Arc<Ctx>>) -> Response {
    if ctx.gate.needs_login() {
        assets::login_page()
    } else {
        auth::redirect("/")
    }
}

/// The login form's fields.
#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(ctx): State<Arc<Ctx>>,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !ctx.gate.needs_login() {
        return auth::redirect("/");
    }
    // A form without the field is a wrong token, not a different answer.
    let offered = form.map(|f| f.0.token).unwrap_or_default();
    match ctx.gate.login(offered.trim()).await {
        Some(cookie) => {
            let mut response = auth::redirect("/");
            response
                .headers_mut()
                .insert(header::SET_COOKIE, auth::set_cookie(Some(&cookie)));
            response
        }
        None => {
            warn!(
                event = "admin_login_failed",
                "a dashboard login with a wrong token was refused"
            );
            auth::redirect("/login?failed=1")
        }
    }
}

async fn logout(State(ctx): State<Arc<Ctx>>, headers: axum::http::HeaderMap) -> Response {
    ctx.gate.logout(&headers);
    let mut response = auth::redirect("/login");
    response
        .headers_mut()
        .insert(header::SET_COOKIE, auth::set_cookie(None));
    response
}

/// What `/api/v1/status` and the event stream's `hello` say.
fn status_info(ctx: &Ctx) -> StatusInfo {
    let started = ctx.source.telemetry().started();
    StatusInfo {
        version: env!("CARGO_PKG_VERSION"),
        side: ctx.source.side(),
        started: unix_seconds(started),
        uptime_seconds: started.elapsed().map_or(0, |d| d.as_secs()),
        auth: ctx.gate.needs_login(),
        bind: ctx.source.bind(),
        draining: ctx.source.drain().is_draining(),
        draining_for_ms: ctx
            .source
            .drain()
            .elapsed()
            .map(|elapsed| elapsed.as_millis() as u64),
    }
}

/// `POST /api/v1/drain`: what SIGTERM does (see [`crate::drain`]); the side stops once its
/// streams finished.
async fn drain(State(ctx): State<Arc<Ctx>>) -> axum::Json<serde_json::Value> {
    let drain = ctx.source.drain();
    if !drain.is_draining() {
        info!(
            event = "admin_drain",
            side = ctx.source.side(),
            "drain asked for from the admin API"
        );
    }
    drain.ask();
    axum::Json(serde_json::json!({ "draining": true }))
}

/// `GET /readyz`, for load balancers' health checks (public: it says no more than ready or
/// not): `200 ready`, or `503` and why not (draining; services with no client).
async fn readyz(State(ctx): State<Arc<Ctx>>) -> Response {
    match ctx.source.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn status(State(ctx): State<Arc<Ctx>>) -> axum::Json<StatusInfo> {
    axum::Json(status_info(&ctx))
}

async fn disconnect(
    State(ctx): State<Arc<Ctx>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match ctx.source.disconnect(&id) {
        Ok(()) => {
            info!(event = "admin_disconnect", session = %id, "session closed from the admin API");
            axum::Json(serde_json::json!({ "disconnected": id })).into_response()
        }
        Err(error) => (StatusCode::NOT_FOUND, axum::Json(ApiError { error })).into_response(),
    }
}

async fn config(State(ctx): State<Arc<Ctx>>) -> Response {
    let Some(reloader) = ctx.source.reloader() else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            axum::Json(ApiError {
                error: format!(
                    "this {} was not started from a config file, so there is none to show",
                    ctx.source.side()
                ),
            }),
        )
            .into_response();
    };
    let (path, text) = reloader.in_force();
    let path = path.display().to_string();
    match text.as_deref().and_then(config_view::mask) {
        Some(text) => axum::Json(serde_json::json!({ "path": path, "text": text })).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(ApiError {
                error: format!(
                    "{path} could not be read when it was applied; reload to read it again"
                ),
            }),
        )
            .into_response(),
    }
}

async fn recent_logs(RawQuery(query): RawQuery) -> Response {
    match Page::parse(query.as_deref()) {
        Ok(page) => {
            let limit = if query.as_deref().is_some_and(|q| q.contains("limit=")) {
                page.limit
            } else {
                logs::RING
            };
            let recent: Vec<logs::LogEntry> = logs::logs()
                .recent(limit)
                .iter()
                .map(|entry| entry.as_ref().clone())
                .collect();
            axum::Json(recent).into_response()
        }
        Err(error) => bad_request(error),
    }
}

async fn sessions(State(ctx): State<Arc<Ctx>>, RawQuery(query): RawQuery) -> Response {
    match Page::parse(query.as_deref()) {
        Ok(page) => paged(ctx.source.sessions(page)),
        Err(error) => bad_request(error),
    }
}

async fn services(State(ctx): State<Arc<Ctx>>, RawQuery(query): RawQuery) -> Response {
    match Page::parse(query.as_deref()) {
        Ok(page) => paged(ctx.source.services(page)),
        Err(error) => bad_request(error),
    }
}

/// A page as a bare JSON list, with the whole count in a header.
fn paged<T: Serialize>(page: Paged<T>) -> Response {
    (
        [(TOTAL_COUNT, page.total.to_string())],
        axum::Json(page.items),
    )
        .into_response()
}

fn bad_request(error: String) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(ApiError { error })).into_response()
}

async fn connections(State(ctx): State<Arc<Ctx>>) -> axum::Json<Vec<ConnectionInfo>> {
    axum::Json(ctx.source.telemetry().connections())
}

async fn reload(State(ctx): State<Arc<Ctx>>) -> Response {
    let outcome = match ctx.source.reloader() {
        Some(reloader) => reloader.reload().await,
        None => Err(ReloadError::NoSource(ctx.source.side())),
    };
    match outcome {
        Ok(summary) => axum::Json(serde_json::json!({
            "reloaded": true,
            "summary": summary.to_string(),
            "applied": summary.applied,
            "needs_restart": summary.needs_restart,
        }))
        .into_response(),
        Err(error) => {
            let status = match error {
                ReloadError::Invalid(_) | ReloadError::Unappliable(_) => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                ReloadError::NoSource(_) => StatusCode::NOT_IMPLEMENTED,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            // Each config error on its own, with its position, for the dashboard to list.
            let errors: Vec<_> = match &error {
                ReloadError::Invalid(errors) => errors
                    .errors()
                    .iter()
                    .map(|e| {
                        serde_json::json!({
                            "key": e.key,
                            "line": e.line,
                            "column": e.column,
                            "message": e.message,
                            "hint": e.hint,
                        })
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let body = serde_json::json!({ "error": error.to_string(), "errors": errors });
            (status, axum::Json(body)).into_response()
        }
    }
}

fn no_http(side: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(ApiError {
            error: format!("the {side} has no request inspector: HTTP services run on the server"),
        }),
    )
        .into_response()
}

/// `?service=NAME` of a query, if any.
fn service_filter(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "service")
        .map(|(_, value)| value.to_owned())
}

async fn requests(State(ctx): State<Arc<Ctx>>, RawQuery(query): RawQuery) -> Response {
    let Some(captures) = ctx.source.captures() else {
        return no_http(ctx.source.side());
    };
    let page = match Page::parse(query.as_deref()) {
        Ok(page) => page,
        Err(error) => return bad_request(error),
    };
    let mut all = captures.list(service_filter(query.as_deref()).as_deref());
    let total = all.len();
    let range = page.range(total);
    let items: Vec<_> = all.drain(range).collect();
    paged(Paged { items, total })
}

fn request_id(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| {
        format!("`{text}` is not a request id: use the `id` of an entry of /api/v1/requests")
    })
}

async fn request(
    State(ctx): State<Arc<Ctx>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let Some(captures) = ctx.source.captures() else {
        return no_http(ctx.source.side());
    };
    let id = match request_id(&id) {
        Ok(id) => id,
        Err(error) => return bad_request(error),
    };
    match captures.get(id) {
        Some(record) => axum::Json(record).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(ApiError {
                error: format!("no captured request {id}: it may have left the ring (the newest {} per service are kept)", crate::http::capture::RING_PER_SERVICE),
            }),
        )
            .into_response(),
    }
}

async fn replay(
    State(ctx): State<Arc<Ctx>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if ctx.source.captures().is_none() {
        return no_http(ctx.source.side());
    }
    let id = match request_id(&id) {
        Ok(id) => id,
        Err(error) => return bad_request(error),
    };
    // No body: replay as captured. A body: the edit, as JSON.
    let edit = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<ReplayEdit>(&body) {
            Ok(edit) => Some(edit),
            Err(error) => {
                return bad_request(format!(
                    "the edit is not valid: {error}; send JSON like {{\"method\": \"GET\", \"uri\": \"/path\", \"headers\": [[\"name\", \"value\"]], \"body\": \"text\"}} (every field optional)"
                ));
            }
        }
    };
    match ctx.source.replay(id, edit).await {
        Ok((new_id, status)) => axum::Json(serde_json::json!({
            "replayed": id,
            "id": new_id,
            "status": status,
        }))
        .into_response(),
        Err(error) => (StatusCode::CONFLICT, axum::Json(ApiError { error })).into_response(),
    }
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    ctx.source.refresh_metrics();
    // Per-session gauges, the same on both sides: from the sessions as the API lists them.
    let sessions = ctx.source.sessions(Page {
        offset: 0,
        limit: MAX_PAGE,
    });
    ctx.source
        .telemetry()
        .metrics
        .set_sessions(
            sessions
                .items
                .into_iter()
                .map(|s| crate::metrics::SessionGauges {
                    session: s.id,
                    peer: s.peer,
                    open_streams: s.open_streams,
                    rtt_seconds: s.rtt_ms.map(|ms| ms / 1e3),
                    quic: s.quic.map(|q| crate::metrics::QuicGauges {
                        cwnd: q.cwnd,
                        lost_packets: q.lost_packets,
                        mtu: q.mtu,
                        datagrams_dropped: q.datagrams_dropped,
                    }),
                }),
        );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ctx.source.telemetry().metrics.encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_parse_and_clamp() {
        assert_eq!(Page::parse(None), Ok(Page::default()));
        assert_eq!(
            Page::parse(Some("offset=20&limit=5&x=y")),
            Ok(Page {
                offset: 20,
                limit: 5
            })
        );
        assert_eq!(
            Page::parse(Some("limit=999999")).map(|p| p.limit),
            Ok(MAX_PAGE)
        );
        let error = Page::parse(Some("limit=ten")).unwrap_err();
        assert!(error.contains("limit=ten"), "{error}");
    }

    #[test]
    fn ranges_stay_inside_the_list() {
        let page = Page {
            offset: 8,
            limit: 5,
        };
        assert_eq!(page.range(10), 8..10);
        assert_eq!(page.range(3), 3..3);
        let huge = Page {
            offset: usize::MAX,
            limit: usize::MAX,
        };
        assert_eq!(huge.range(4), 4..4);
    }
}
