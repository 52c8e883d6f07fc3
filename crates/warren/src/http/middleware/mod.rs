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

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};

use super::Body;

pub mod chain;

pub use chain::Chain;

/// Builds a chain (stub).
///
/// # Errors
/// Never (stub).
pub fn build_chain(_specs: &[crate::config::middleware::MiddlewareSpec]) -> Result<Chain, String> {
    Ok(Chain::empty())
}

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
}

impl RequestContext {
    /// Notes what `middleware` decided, for the log and the inspector.
    pub fn decide(&mut self, middleware: &str, outcome: impl Into<String>) {
        self.decisions.push((middleware.to_owned(), outcome.into()));
    }
}
