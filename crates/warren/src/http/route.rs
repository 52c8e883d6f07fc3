//! The route key of a request and the route table (stub until the routing core lands:
//! exact hosts only, every path).

use std::sync::Arc;

/// A host pattern (stub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exact.
    Exact(String),
    /// Wildcard.
    Wildcard(String),
}

impl HostPattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// Never (stub).
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        Ok(HostPattern::Exact(text.to_ascii_lowercase()))
    }

    /// Whether `host` matches.
    pub fn matches(&self, host: &str) -> bool {
        matches!(self, HostPattern::Exact(h) if h == host)
    }
}

/// Normalizes a path (stub).
///
/// # Errors
/// Never (stub).
pub fn normalize_path(raw: &str) -> Result<String, String> {
    Ok(raw.to_owned())
}

/// The host and path a request is routed on.
pub struct RouteKey {
    /// Host.
    pub host: String,
    /// Port.
    pub port: Option<u16>,
    /// Path.
    pub path: String,
    /// Query.
    pub query: Option<String>,
}

/// Why a request has no route key (stub).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RouteKeyError(String);

impl RouteKeyError {
    /// The answer.
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::BAD_REQUEST
    }
}

/// The route key (stub).
///
/// # Errors
/// No host.
pub fn route_key<B>(request: &http::Request<B>) -> Result<RouteKey, RouteKeyError> {
    let host = request
        .uri()
        .authority()
        .map(|a| a.host().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| h.split(':').next().unwrap_or(h).to_owned())
        })
        .ok_or_else(|| RouteKeyError("no host".to_owned()))?;
    Ok(RouteKey {
        host: host.to_ascii_lowercase(),
        port: None,
        path: request.uri().path().to_owned(),
        query: request.uri().query().map(str::to_owned),
    })
}

/// Strips a prefix (stub).
pub fn strip_prefix(prefix: &str, path: &str) -> String {
    let rest = path
        .strip_prefix(prefix.trim_end_matches('/'))
        .unwrap_or(path);
    if rest.starts_with('/') {
        rest.to_owned()
    } else {
        format!("/{rest}")
    }
}

/// One service's routes.
pub struct RouteSpec {
    /// Service.
    pub service: Arc<str>,
    /// Hosts.
    pub hosts: Vec<HostPattern>,
    /// Paths.
    pub paths: Vec<String>,
}

/// Routes (stub).
#[derive(Default)]
pub struct RouteTable(Vec<RouteSpec>);

/// A conflict (stub).
#[derive(Debug)]
pub struct RouteConflict;

/// A match.
pub struct RouteMatch<'a> {
    /// Service.
    pub service: &'a Arc<str>,
    /// Prefix.
    pub prefix: &'a str,
}

impl RouteTable {
    /// Builds.
    ///
    /// # Errors
    /// Never (stub).
    pub fn build(specs: Vec<RouteSpec>) -> Result<RouteTable, Vec<RouteConflict>> {
        Ok(RouteTable(specs))
    }

    /// Looks up.
    pub fn lookup(&self, host: &str, _path: &str) -> Option<RouteMatch<'_>> {
        self.0
            .iter()
            .find(|s| s.hosts.iter().any(|h| h.matches(host)))
            .map(|s| RouteMatch {
                service: &s.service,
                prefix: &s.paths[0],
            })
    }
}
