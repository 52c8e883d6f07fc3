//! Stub until the middleware work lands.

use http::{Response, StatusCode};

use super::Body;

/// An error page (stub).
pub fn error_page(status: StatusCode, title: &str, detail: &str) -> Response<Body> {
    let mut response = Response::new(super::full(format!("{title}\n{detail}\n")));
    *response.status_mut() = status;
    response
}
