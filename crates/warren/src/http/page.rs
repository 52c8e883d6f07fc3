//! The error pages a visitor sees: small, self-contained HTML that says what happened and
//! what to do, and never what the backend said or where it lives.
//!
//! Every answer Warren gives on its own (a 401 from `basic_auth`, a 429 from
//! `rate_limit`, the server's 404 for an unknown host, a 502 when no client serves a
//! service) goes through [`error_page`], so they all look alike and all escape what they
//! print: a title or detail may hold the visitor's host name, which is input.

use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use super::{Body, full};

/// A small HTML page for `status` with a `title` and a one-line `detail`, both
/// HTML-escaped. Sent with `Content-Type: text/html; charset=utf-8` and
/// `Cache-Control: no-store`, so a browser or a cache in between never keeps an answer
/// that only held for this moment (a 429, a 502).
pub fn error_page(status: StatusCode, title: &str, detail: &str) -> Response<Body> {
    let code = status.as_u16();
    let reason = status.canonical_reason().unwrap_or("");
    let title = escape_html(title);
    let detail = escape_html(detail);
    let html = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{code} {title}</title>\n<style>body{{font-family:system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em;color:#222}}h1{{font-size:1.4em}}p{{line-height:1.5}}small{{color:#777}}</style></head>\n<body>\n<h1>{code} {title}</h1>\n<p>{detail}</p>\n<p><small>{code} {reason} &middot; Warren</small></p>\n</body>\n</html>\n"
    );
    let mut response = Response::new(full(html));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by entities, safe in HTML text and in
/// quoted attributes.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn page_is_escaped_and_not_cached() {
        let response = error_page(
            StatusCode::NOT_FOUND,
            "No such site",
            "<script>alert('x')</script> & \"more\"",
        );
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
        let body = response.into_body().collect().await.expect("full body");
        let text = String::from_utf8(body.to_bytes().to_vec()).expect("utf-8");
        assert!(!text.contains("<script>"));
        assert!(
            text.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;more&quot;")
        );
        assert!(text.contains("404 No such site"));
    }
}
