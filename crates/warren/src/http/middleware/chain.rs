//! Stub until the middleware work lands.

use http::{Request, Response};

use super::RequestContext;
use crate::http::Body;

/// A chain (stub: empty).
#[derive(Default)]
pub struct Chain;

impl Chain {
    /// No middleware.
    pub fn empty() -> Chain {
        Chain
    }

    /// Runs the requests hooks.
    ///
    /// # Errors
    /// Never (stub).
    pub async fn request(
        &self,
        _request: &mut Request<Body>,
        _cx: &mut RequestContext,
    ) -> Result<usize, (usize, Response<Body>)> {
        Ok(0)
    }

    /// Runs the response hooks.
    pub fn response(&self, _ran: usize, _response: &mut Response<Body>, _cx: &RequestContext) {}
}
