//! `timeout`: the longest the backend may take to answer a request of this service.
//!
//! This middleware only records the limit in [`RequestContext::timeout`]; the server's
//! proxy applies it to the exchange with the backend and answers 504 when it runs out.
//! When several `timeout`s are listed the shortest wins, so a later one can only tighten.

use std::time::Duration;

use http::Request;

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;

/// The `timeout` middleware.
#[derive(Debug, Clone)]
pub struct Timeout {
    limit: Duration,
}

impl Timeout {
    /// The backend gets at most `limit` to answer.
    pub fn new(limit: Duration) -> Timeout {
        Timeout { limit }
    }
}

impl Middleware for Timeout {
    fn name(&self) -> &str {
        "timeout"
    }

    fn on_request<'a>(
        &'a self,
        _request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        cx.timeout = Some(cx.timeout.map_or(self.limit, |set| set.min(self.limit)));
        Box::pin(std::future::ready(Flow::Continue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{context, get, run};

    #[tokio::test]
    async fn sets_the_shortest_timeout() {
        let mut cx = context();
        assert!(
            run(
                &Timeout::new(Duration::from_secs(30)),
                &mut get("/"),
                &mut cx
            )
            .await
            .is_none()
        );
        assert_eq!(cx.timeout, Some(Duration::from_secs(30)));
        assert!(
            run(
                &Timeout::new(Duration::from_secs(60)),
                &mut get("/"),
                &mut cx
            )
            .await
            .is_none()
        );
        assert_eq!(cx.timeout, Some(Duration::from_secs(30)));
        assert!(
            run(
                &Timeout::new(Duration::from_secs(5)),
                &mut get("/"),
                &mut cx
            )
            .await
            .is_none()
        );
        assert_eq!(cx.timeout, Some(Duration::from_secs(5)));
    }
}
