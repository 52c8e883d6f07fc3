//! `headers`: set, add or remove request headers (before forwarding) and response headers
//! (before the visitor sees them).
//!
//! Each direction applies `remove`, then `set` (replacing every value of the name), then
//! `add` (appending one more value). Names and values are checked when the config loads,
//! and the framing headers (`Content-Length`, `Transfer-Encoding`) cannot be set or added:
//! a wrong one would corrupt the exchange, and hyper keeps them right on its own.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;

/// The edits of one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderRules {
    /// Names whose every value is removed.
    pub remove: Vec<HeaderName>,
    /// Names whose values are replaced by this one.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Values appended.
    pub add: Vec<(HeaderName, HeaderValue)>,
}

impl HeaderRules {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// Applies the edits to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// Why a header name may not be set or added.
///
/// # Errors
/// A sentence for the framing headers, which hyper must keep control of.
pub fn check_settable(name: &HeaderName) -> Result<(), String> {
    if name == http::header::CONTENT_LENGTH || name == http::header::TRANSFER_ENCODING {
        return Err(format!(
            "{name} describes the body's framing and cannot be set; Warren and the backend keep it right"
        ));
    }
    Ok(())
}

/// The `headers` middleware.
#[derive(Debug, Clone)]
pub struct Headers {
    request: HeaderRules,
    response: HeaderRules,
}

impl Headers {
    /// Edits of the request and of the response.
    pub fn new(request: HeaderRules, response: HeaderRules) -> Headers {
        Headers { request, response }
    }
}

impl Middleware for Headers {
    fn name(&self) -> &str {
        "headers"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        _cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        self.request.apply(request.headers_mut());
        Box::pin(std::future::ready(Flow::Continue))
    }

    fn on_response(&self, response: &mut Response<Body>, _cx: &RequestContext) {
        self.response.apply(response.headers_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{context, get, run};

    fn name(text: &'static str) -> HeaderName {
        HeaderName::from_static(text)
    }

    fn value(text: &'static str) -> HeaderValue {
        HeaderValue::from_static(text)
    }

    #[tokio::test]
    async fn edits_requests_and_responses() {
        let middleware = Headers::new(
            HeaderRules {
                remove: vec![name("cookie")],
                set: vec![(name("x-forwarded-proto"), value("https"))],
                add: vec![(name("x-tag"), value("two"))],
            },
            HeaderRules {
                remove: vec![name("server")],
                set: vec![(name("strict-transport-security"), value("max-age=600"))],
                add: vec![(name("vary"), value("origin"))],
            },
        );
        let mut request = get("/");
        let headers = request.headers_mut();
        headers.insert("cookie", value("a=b"));
        headers.insert("x-forwarded-proto", value("spoofed"));
        headers.append("x-forwarded-proto", value("spoofed-again"));
        headers.insert("x-tag", value("one"));
        let mut cx = context();
        assert!(run(&middleware, &mut request, &mut cx).await.is_none());
        let headers = request.headers();
        assert!(!headers.contains_key("cookie"));
        let proto: Vec<_> = headers.get_all("x-forwarded-proto").iter().collect();
        assert_eq!(proto, ["https"]);
        let tags: Vec<_> = headers.get_all("x-tag").iter().collect();
        assert_eq!(tags, ["one", "two"]);

        let mut response = Response::new(crate::http::empty());
        response
            .headers_mut()
            .insert("server", value("secret-backend/1.2"));
        response.headers_mut().insert("vary", value("accept"));
        middleware.on_response(&mut response, &cx);
        let headers = response.headers();
        assert!(!headers.contains_key("server"));
        assert_eq!(headers["strict-transport-security"], "max-age=600");
        assert_eq!(headers.get_all("vary").iter().count(), 2);
    }

    #[test]
    fn framing_headers_cannot_be_set() {
        assert!(check_settable(&name("content-length")).is_err());
        assert!(check_settable(&name("transfer-encoding")).is_err());
        assert!(check_settable(&name("x-anything")).is_ok());
        assert!(HeaderRules::default().is_empty());
    }
}
