//! [`build_chain`]: from a service's validated middleware config to a running [`Chain`].
//!
//! The config layer ([`crate::config::middleware`]) checks every value when the file
//! loads; building only fails for what cannot be known then (an access log file that
//! cannot be opened). A reload builds a new chain and swaps it in whole, so the old one
//! (its rate-limit tables, its password cache, its log writer) lives on only as long as
//! the requests still using it.

use std::sync::Arc;

use super::access_log::AccessLog;
use super::basic_auth::BasicAuth;
use super::bearer_auth::BearerAuth;
use super::headers::Headers;
use super::ip_filter::{IpFilter, Rule};
use super::max_body::MaxBody;
use super::rate_limit::RateLimit;
use super::redirect_https::RedirectHttps;
use super::timeout::Timeout;
use super::{Chain, Middleware};
use crate::config::middleware::MiddlewareSpec;

/// The chain of `specs`, in order.
///
/// # Errors
/// A sentence naming the middleware (by position and type) that could not be built, e.g.
/// `middleware[2] (access_log): cannot open access log /var/log/x: Permission denied`.
pub fn build_chain(specs: &[MiddlewareSpec]) -> Result<Chain, String> {
    let mut layers: Vec<Arc<dyn Middleware>> = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        let layer = build_one(spec)
            .map_err(|problem| format!("middleware[{index}] ({}): {problem}", spec.kind()))?;
        layers.push(layer);
    }
    Ok(Chain::new(layers))
}

fn build_one(spec: &MiddlewareSpec) -> Result<Arc<dyn Middleware>, String> {
    Ok(match spec {
        MiddlewareSpec::IpAllow(ranges) => Arc::new(IpFilter::new(Rule::Allow, ranges.clone())),
        MiddlewareSpec::IpDeny(ranges) => Arc::new(IpFilter::new(Rule::Deny, ranges.clone())),
        MiddlewareSpec::BasicAuth {
            realm,
            users,
            strip,
        } => Arc::new(BasicAuth::new(realm, users.clone(), *strip)?),
        MiddlewareSpec::BearerAuth {
            realm,
            tokens,
            strip,
        } => Arc::new(BearerAuth::new(realm, tokens.clone(), *strip)?),
        MiddlewareSpec::RateLimit {
            rate,
            burst,
            key,
            max_keys,
        } => Arc::new(RateLimit::new(*rate, *burst, key.clone(), *max_keys)?),
        MiddlewareSpec::Headers { request, response } => {
            Arc::new(Headers::new(request.clone(), response.clone()))
        }
        MiddlewareSpec::AccessLog { format, file } => {
            Arc::new(AccessLog::new(*format, file.as_deref())?)
        }
        MiddlewareSpec::RedirectHttps { port } => Arc::new(RedirectHttps::new(*port)),
        MiddlewareSpec::MaxBody { limit } => Arc::new(MaxBody::new(*limit)),
        MiddlewareSpec::Timeout(limit) => Arc::new(Timeout::new(*limit)),
    })
}
