//! HTTP services (`type = "http"`): many web services behind one public port, routed by
//! host name and path, shaped by a middleware chain.
//!
//! The server parses requests only on its `[server.http]` ports. Each request gets **one**
//! route decision ([`route`]), computed from one well-defined host; every later step (the
//! middleware chain, the rewrite, the capture, the log) reads that decision and never the
//! raw headers again (frp's CVE-2026-40910 came from routing and auth reading different
//! headers). The request then goes to the service's backend through a stream of a session
//! serving it, like any visitor: the client at the far end only dials its target and
//! relays bytes, so it needs to know nothing about HTTP.
//!
//! * [`route`]: the route key of a request (host, normalized path) and the route table.
//! * [`middleware`]: the [`middleware::Middleware`] trait and the built-ins.
//! * [`forwarded`]: the visitor's address behind trusted proxies (`X-Forwarded-For`).
//! * [`page`]: the small error pages visitors see.
//! * [`capture`]: recent requests for the inspector.
//! * [`body`]: a response body watched to its end (the access log and the capture).

pub mod body;
pub mod capture;
pub mod forwarded;
pub mod middleware;
pub mod page;
pub mod route;

use bytes::Bytes;

/// The error type of bodies flowing through the HTTP layer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request or response body as it flows through Warren: streamed, never buffered whole.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    use http_body_util::BodyExt;
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body of `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}
