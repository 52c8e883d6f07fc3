//! The middleware chain of an HTTP service: an ordered list of steps that may inspect and
//! change a request, answer it themselves (a 401, a 429, a redirect), and see or change the
//! response on its way back.
//!
//! Library users implement [`Middleware`]; the built-ins implement the same trait, with no
//! private fast path. A chain runs like an onion: `on_request` in config order, and
//! `on_response` in reverse order over the middleware whose `on_request` ran, so a
//! middleware listed first (an access log) sees every answer, including those a later one
//! gave. A middleware that panics answers 500 for that request only.
//!
//! Every middleware reads the request's one route decision from [`RequestContext`] (host,
//! path, client address), never raw headers of its own choosing.
//!
//! # Layout
//!
//! * [`chain`]: [`Chain`], the runner (order, onion, panics, rejection counters).
//! * [`build`](mod@build): [`build_chain`], from the validated config
//!   ([`crate::config::middleware::MiddlewareSpec`]) to a [`Chain`].
//! * The built-ins, one module each: [`ip_filter`] (`ip_allow`, `ip_deny`),
//!   [`basic_auth`], [`bearer_auth`], [`rate_limit`], [`headers`], [`access_log`],
//!   [`redirect_https`], [`max_body`], [`timeout`].

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, Request, Response};

use super::Body;

pub mod access_log;
pub mod basic_auth;
pub mod bearer_auth;
pub mod build;
pub mod chain;
pub mod headers;
pub mod ip_filter;
pub mod max_body;
pub mod rate_limit;
pub mod redirect_https;
pub mod timeout;

pub use build::build_chain;
pub use chain::Chain;

/// A boxed future of a middleware hook.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One step of a service's chain.
pub trait Middleware: Send + Sync + 'static {
    /// Short name shown in logs, metrics and the inspector (`"basic_auth"`).
    fn name(&self) -> &str;

    /// Looks at (and may change) the request before it is forwarded. Answer it with
    /// [`Flow::Respond`] to stop the chain; later middleware and the backend never see it.
    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow>;

    /// Looks at (and may change) the response on its way back: the backend's, or one a
    /// later middleware gave. Default: nothing.
    fn on_response(&self, response: &mut Response<Body>, cx: &RequestContext) {
        let _ = (response, cx);
    }
}

/// What a middleware decided about a request.
pub enum Flow {
    /// Go on to the next middleware (and then the backend).
    Continue,
    /// Answer with this response; the request goes no further.
    Respond(Response<Body>),
}

/// The one route decision for a request, and what the chain adds to it.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// Request number, unique in this process (the inspector's id).
    pub id: u64,
    /// The service the request was routed to.
    pub service: Arc<str>,
    /// The host the route was decided on (lowercase, no port).
    pub host: String,
    /// The normalized path the route was decided on (before any `strip_prefix`).
    pub path: String,
    /// The TCP peer of the visitor's connection.
    pub peer: SocketAddr,
    /// The visitor's address: the peer's, or the last untrusted address of
    /// `X-Forwarded-For` when the peer is one of `trusted_proxies`.
    pub client_ip: IpAddr,
    /// The request came in over TLS (the `[server.http]` TLS port).
    pub tls: bool,
    /// When the request arrived.
    pub started: tokio::time::Instant,
    /// The longest the backend may take to answer, set by the `timeout` middleware.
    pub timeout: Option<Duration>,
    /// What each middleware decided that mattered (`("basic_auth", "denied: bad
    /// password")`), for the access log and the inspector.
    pub decisions: Vec<(String, String)>,
    /// Per-request values a middleware keeps from `on_request` for its `on_response`
    /// (the access log keeps the method and the request line here). A middleware is
    /// shared by every request, so this is where its per-request state lives.
    pub extensions: Extensions,
}

impl RequestContext {
    /// The context of a request just routed to `service`: no timeout, no decisions, no
    /// extensions yet, `started` now.
    pub fn new(
        id: u64,
        service: Arc<str>,
        host: String,
        path: String,
        peer: SocketAddr,
        client_ip: IpAddr,
        tls: bool,
    ) -> RequestContext {
        RequestContext {
            id,
            service,
            host,
            path,
            peer,
            client_ip,
            tls,
            started: tokio::time::Instant::now(),
            timeout: None,
            decisions: Vec::new(),
            extensions: Extensions::new(),
        }
    }

    /// Notes what `middleware` decided, for the log and the inspector.
    pub fn decide(&mut self, middleware: &str, outcome: impl Into<String>) {
        self.decisions.push((middleware.to_owned(), outcome.into()));
    }
}

/// Helpers for the middleware tests: a context, requests, bodies.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Arc;

    use http::{Request, Response};
    use http_body_util::BodyExt;

    use super::RequestContext;
    use crate::http::Body;

    /// The context of a plain-HTTP request from 203.0.113.7 to `web` at `example.com`.
    pub(crate) fn context() -> RequestContext {
        context_from("203.0.113.7".parse().expect("valid IP"))
    }

    /// Like [`context`], from `client_ip`.
    pub(crate) fn context_from(client_ip: IpAddr) -> RequestContext {
        RequestContext::new(
            1,
            Arc::from("web"),
            "example.com".to_owned(),
            "/".to_owned(),
            SocketAddr::new(client_ip, 40_000),
            client_ip,
            false,
        )
    }

    /// A GET of `uri` with an empty body.
    pub(crate) fn get(uri: &str) -> Request<Body> {
        Request::builder()
            .uri(uri)
            .header("host", "example.com")
            .body(crate::http::empty())
            .expect("valid request")
    }

    /// The whole body of `response` as text.
    pub(crate) async fn body_text(response: Response<Body>) -> String {
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body completes")
            .to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Runs `on_request` of `middleware`; the answer if it gave one.
    pub(crate) async fn run(
        middleware: &dyn super::Middleware,
        request: &mut Request<Body>,
        cx: &mut RequestContext,
    ) -> Option<Response<Body>> {
        match middleware.on_request(request, cx).await {
            super::Flow::Continue => None,
            super::Flow::Respond(response) => Some(response),
        }
    }
}
