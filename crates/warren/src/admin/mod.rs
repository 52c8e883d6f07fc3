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
//! | `/metrics` | Prometheus text exposition ([`crate::metrics`]) |
//!
//! The two lists that grow with the deployment (10,000 services, 1,000 sessions) answer one
//! page at a time: `?limit=N&offset=M` (default limit [`DEFAULT_PAGE`], at most
//! [`MAX_PAGE`]), the whole count in the `X-Total-Count` header. The body stays a bare JSON
//! list, so a client that ignores paging keeps working on small deployments.
//!
//! The API reads state through atomics and snapshots ([`AdminSource`]); it never takes a
//! lock the data path holds. The server task is owned by its side: it stops when the side's
//! cancellation token fires.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use subtle::ConstantTimeEq;
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
    /// Client side: the server this session is with, as configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// QUIC sessions: RTT, congestion window, packet size, losses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quic: Option<crate::session::quic::QuicPath>,
}

/// The transport name of a session, from what carries it and its record cipher.
pub fn transport_name(
    quic: Option<&crate::session::quic::QuicPath>,
    keys: &crate::crypto::keys::SessionKeys,
) -> &'static str {
    match (quic, keys.record_cipher()) {
        (Some(_), _) => "quic",
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
    /// Sends captured request `id` again; answers the new request's id and status.
    fn replay(
        &self,
        id: u64,
    ) -> crate::http::middleware::BoxFuture<'_, Result<(u64, u16), String>> {
        let _ = id;
        Box::pin(async { Err("this side serves no HTTP services".to_owned()) })
    }
}

struct Ctx {
    source: Arc<dyn AdminSource>,
    token: Option<Secret>,
}

/// Binds the admin listener.
///
/// # Errors
/// The OS error (port taken, address not local…).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The admin API's routes, for serving or testing.
pub fn router(source: Arc<dyn AdminSource>, token: Option<Secret>) -> Router {
    let ctx = Arc::new(Ctx { source, token });
    Router::new()
        .route("/api/v1/status", get(status))
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/services", get(services))
        .route("/api/v1/connections", get(connections))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/requests", get(requests))
        .route("/api/v1/requests/{id}", get(request))
        .route("/api/v1/requests/{id}/replay", post(replay))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(Arc::clone(&ctx), authorize))
        .with_state(ctx)
}

/// Serves the admin API on `listener` until `cancel` fires.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn AdminSource>,
    token: Option<Secret>,
    cancel: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(event = "admin_started", bind = %addr, auth = token.is_some(), "admin API listening");
    let app = router(source, token);
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        warn!(event = "admin_failed", %error, "the admin API stopped");
    }
}

async fn authorize(State(ctx): State<Arc<Ctx>>, request: Request, next: Next) -> Response {
    if let Some(token) = &ctx.token {
        let offered = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(offered.as_bytes().ct_eq(token.as_bytes())) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                axum::Json(ApiError {
                    error: "missing or wrong bearer token: send `Authorization: Bearer <[admin] token>`".into(),
                }),
            )
                .into_response();
        }
    }
    next.run(request).await
}

async fn status(State(ctx): State<Arc<Ctx>>) -> axum::Json<StatusInfo> {
    let started = ctx.source.telemetry().started();
    axum::Json(StatusInfo {
        version: env!("CARGO_PKG_VERSION"),
        side: ctx.source.side(),
        started: unix_seconds(started),
        uptime_seconds: started.elapsed().map_or(0, |d| d.as_secs()),
    })
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
            let body = ApiError {
                error: error.to_string(),
            };
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
) -> Response {
    if ctx.source.captures().is_none() {
        return no_http(ctx.source.side());
    }
    let id = match request_id(&id) {
        Ok(id) => id,
        Err(error) => return bad_request(error),
    };
    match ctx.source.replay(id).await {
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
