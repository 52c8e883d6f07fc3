//! The admin HTTP API (axum): JSON status and Prometheus `/metrics`, off unless the config
//! has an `[admin]` section.
//!
//! Endpoints (all `GET` unless said; every one needs `Authorization: Bearer TOKEN` when
//! `[admin] token` is set; the full description is `docs/admin-api.md`):
//!
//! | path | what |
//! |---|---|
//! | `/api/v1/status` | version, side, start time, uptime |
//! | `/api/v1/sessions` | sessions: id, peer address, cipher, since, services |
//! | `/api/v1/services` | services: state, active and total connections, bytes each way, errors |
//! | `/api/v1/connections` | live connections: id, service, peer, since, bytes each way |
//! | `POST /api/v1/reload` | read the config file again and apply what changed ([`crate::reload`]) |
//! | `/metrics` | Prometheus text exposition ([`crate::metrics`]) |
//!
//! The API reads state through atomics and snapshots ([`AdminSource`]); it never takes a
//! lock the data path holds. The server task is owned by its side: it stops when the side's
//! cancellation token fires.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
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

/// One entry of `/api/v1/sessions`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    /// Short session id (as in the logs).
    pub id: String,
    /// The client's address (server side) or the server's (client side).
    pub peer: String,
    /// The negotiated cipher.
    pub cipher: String,
    /// How the cipher was chosen, with both sides' figures.
    pub cipher_choice: CipherChoiceInfo,
    /// Seconds since the Unix epoch when the session was established.
    pub since: u64,
    /// Services the session serves.
    pub services: Vec<String>,
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
    /// The live sessions.
    fn sessions(&self) -> Vec<SessionInfo>;
    /// Every configured service.
    fn services(&self) -> Vec<ServiceInfo>;
    /// Updates gauges that are computed rather than counted (called before `/metrics`).
    fn refresh_metrics(&self) {}
    /// Reads the config file again and applies it; `None` when the side was built in code
    /// with no file to read.
    fn reloader(&self) -> Option<Arc<dyn Reload>> {
        None
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

async fn sessions(State(ctx): State<Arc<Ctx>>) -> axum::Json<Vec<SessionInfo>> {
    axum::Json(ctx.source.sessions())
}

async fn services(State(ctx): State<Arc<Ctx>>) -> axum::Json<Vec<ServiceInfo>> {
    axum::Json(ctx.source.services())
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
