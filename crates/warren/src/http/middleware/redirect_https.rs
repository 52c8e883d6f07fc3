//! `redirect_https`: a request that came in over plain HTTP is answered
//! `308 Permanent Redirect` to the same host and path over HTTPS.
//!
//! 308 (not 301) keeps the method and body, so a form POST is redirected as a POST. The
//! target is built from the route decision's host ([`RequestContext::host`]), never from
//! a header, and from the request's path and query as sent. A request that already came
//! over TLS passes.

use http::header::{HeaderValue, LOCATION};
use http::{Request, StatusCode};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::page::error_page;

/// The `redirect_https` middleware.
#[derive(Debug, Clone)]
pub struct RedirectHttps {
    /// The HTTPS port to name in the target; `None` (or 443) names none.
    port: Option<u16>,
}

impl RedirectHttps {
    /// Redirects to `https://HOST[:port]/PATH?QUERY`.
    pub fn new(port: Option<u16>) -> RedirectHttps {
        RedirectHttps {
            port: port.filter(|&port| port != 443),
        }
    }

    /// The HTTPS URL for `request` on `host`.
    fn target(&self, request: &Request<Body>, host: &str) -> String {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |path| path.as_str());
        // An IPv6 literal needs its brackets back in a URL.
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        match self.port {
            Some(port) => format!("https://{host}:{port}{path}"),
            None => format!("https://{host}{path}"),
        }
    }
}

impl Middleware for RedirectHttps {
    fn name(&self) -> &str {
        "redirect_https"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        if cx.tls {
            return Box::pin(std::future::ready(Flow::Continue));
        }
        let target = self.target(request, &cx.host);
        let flow = match HeaderValue::from_str(&target) {
            Ok(location) => {
                cx.decide("redirect_https", "redirected to https");
                let mut response = error_page(
                    StatusCode::PERMANENT_REDIRECT,
                    "Moved to HTTPS",
                    &format!("{} is served over HTTPS: {target}", cx.host),
                );
                response.headers_mut().insert(LOCATION, location);
                Flow::Respond(response)
            }
            // The host and the path were parsed as a URI already; only a bug gets here.
            Err(_) => Flow::Respond(error_page(
                StatusCode::BAD_REQUEST,
                "Bad request",
                "this address cannot be redirected to HTTPS",
            )),
        };
        Box::pin(std::future::ready(flow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{context, get, run};

    #[tokio::test]
    async fn plain_http_is_redirected_with_path_and_query() {
        let redirect = RedirectHttps::new(None);
        let mut cx = context();
        let response = run(&redirect, &mut get("/a/b?c=d&e"), &mut cx)
            .await
            .expect("redirected");
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(
            response.headers()[LOCATION],
            "https://example.com/a/b?c=d&e"
        );

        let on_port = RedirectHttps::new(Some(8443));
        let response = run(&on_port, &mut get("/"), &mut context())
            .await
            .expect("redirected");
        assert_eq!(response.headers()[LOCATION], "https://example.com:8443/");
        let default_port = RedirectHttps::new(Some(443));
        let response = run(&default_port, &mut get("/x"), &mut context())
            .await
            .expect("redirected");
        assert_eq!(response.headers()[LOCATION], "https://example.com/x");

        let mut cx = context();
        cx.host = "2001:db8::1".to_owned();
        let response = run(&redirect, &mut get("/"), &mut cx)
            .await
            .expect("redirected");
        assert_eq!(response.headers()[LOCATION], "https://[2001:db8::1]/");
    }

    #[tokio::test]
    async fn tls_requests_pass() {
        let mut cx = context();
        cx.tls = true;
        assert!(
            run(&RedirectHttps::new(None), &mut get("/"), &mut cx)
                .await
                .is_none()
        );
        assert!(cx.decisions.is_empty());
    }
}
