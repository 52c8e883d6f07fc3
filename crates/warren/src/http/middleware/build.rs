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

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use serde::Deserialize;

    use super::*;
    use crate::config::middleware::{FileMiddleware, parse_chain_checked};
    use crate::http::middleware::testing::{context, context_from, get};

    #[derive(Deserialize)]
    struct Wrapper {
        middleware: Vec<FileMiddleware>,
    }

    fn specs(text: &str) -> Vec<MiddlewareSpec> {
        let file: Wrapper = toml::from_str(text).expect("parses");
        parse_chain_checked("server.services.web.middleware", &file.middleware)
            .expect("valid middleware")
    }

    #[tokio::test]
    async fn a_config_becomes_a_running_chain() {
        let chain = build_chain(&specs(
            r#"
            [[middleware]]
            type = "access_log"
            [[middleware]]
            type = "ip_deny"
            cidrs = ["198.51.100.0/24"]
            [[middleware]]
            type = "bearer_auth"
            tokens = ["0123456789abcdef0123"]
            [[middleware]]
            type = "timeout"
            duration = "7s"
            "#,
        ))
        .expect("builds");
        assert_eq!(
            chain.names(),
            ["access_log", "ip_deny", "bearer_auth", "timeout"]
        );

        // Refused by ip_deny: the access log (first) still sees the answer.
        let mut cx = context_from("198.51.100.3".parse().expect("ip"));
        let (ran, response) = chain
            .request(&mut get("/"), &mut cx)
            .await
            .expect_err("denied");
        assert_eq!((ran, response.status()), (2, StatusCode::FORBIDDEN));

        // No token: 401 from bearer_auth.
        let (ran, response) = chain
            .request(&mut get("/"), &mut context())
            .await
            .expect_err("no token");
        assert_eq!((ran, response.status()), (3, StatusCode::UNAUTHORIZED));

        // With the token: through, with the timeout set.
        let mut request = get("/");
        request.headers_mut().insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer 0123456789abcdef0123"),
        );
        let mut cx = context();
        assert_eq!(chain.request(&mut request, &mut cx).await.ok(), Some(4));
        assert_eq!(cx.timeout, Some(std::time::Duration::from_secs(7)));
        assert_eq!(
            chain.rejections(),
            [
                ("access_log".into(), 0),
                ("ip_deny".into(), 1),
                ("bearer_auth".into(), 1),
                ("timeout".into(), 0)
            ]
        );
    }

    #[test]
    fn an_unopenable_log_file_names_the_middleware() {
        let spec = MiddlewareSpec::AccessLog {
            format: crate::http::middleware::access_log::Format::Json,
            file: Some("/nonexistent-warren-dir/access.log".into()),
        };
        let error = build_chain(&[spec]).expect_err("cannot open");
        assert!(
            error.starts_with("middleware[0] (access_log): cannot open access log"),
            "{error}"
        );
        assert!(build_chain(&[]).expect("empty").is_empty());
    }
}
