//! [`Chain`]: runs a service's middleware in order, like an onion, and keeps one
//! misbehaving middleware from hurting more than the request it panicked on.
//!
//! The call order for one request, as the HTTP server drives it:
//!
//! ```text
//! match chain.request(&mut request, &mut cx).await {
//!     Ok(ran) => { response = backend(request).await; chain.response(ran, &mut response, &cx) }
//!     Err((ran, answer)) => { response = answer; chain.response(ran, &mut response, &cx) }
//! }
//! ```
//!
//! `ran` counts the middleware whose `on_request` ran; exactly those see the response, last
//! first. The one that answered is among them, so a middleware sees its own answers too.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::FutureExt;
use http::{Request, Response, StatusCode};

use super::{Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::page::error_page;

/// A service's ordered middleware, fixed when the config loads (a reload builds a new
/// chain and swaps it in whole), with counters for the admin API.
pub struct Chain {
    layers: Vec<Layer>,
}

/// One middleware and what it did so far.
struct Layer {
    middleware: Arc<dyn Middleware>,
    /// Requests it answered itself (`Flow::Respond`): refused, redirected, limited.
    rejections: AtomicU64,
    /// Times one of its hooks panicked.
    panics: AtomicU64,
}

impl Chain {
    /// A chain of `layers`, run in this order.
    pub fn new(layers: Vec<Arc<dyn Middleware>>) -> Chain {
        Chain {
            layers: layers
                .into_iter()
                .map(|middleware| Layer {
                    middleware,
                    rejections: AtomicU64::new(0),
                    panics: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The chain of a service without middleware.
    pub fn empty() -> Chain {
        Chain { layers: Vec::new() }
    }

    /// Whether the chain has no middleware (the server may skip it).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The middleware's names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.layers
            .iter()
            .map(|layer| layer.middleware.name())
            .collect()
    }

    /// For each middleware in order, its name and how many requests it answered itself.
    pub fn rejections(&self) -> Vec<(String, u64)> {
        self.layers
            .iter()
            .map(|layer| {
                (
                    layer.middleware.name().to_owned(),
                    layer.rejections.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// For each middleware in order, its name and how many times its hooks panicked.
    pub fn panics(&self) -> Vec<(String, u64)> {
        self.layers
            .iter()
            .map(|layer| {
                (
                    layer.middleware.name().to_owned(),
                    layer.panics.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Runs every `on_request` in order.
    ///
    /// Returns `Ok(ran)` (`ran` = all of them) when the request may go on to the backend,
    /// or `Err((ran, response))` when middleware number `ran - 1` answered it. Pass `ran`
    /// to [`Chain::response`] either way.
    ///
    /// A panic in a hook answers 500 (a Warren page naming the middleware), is logged as
    /// `middleware_panicked` and counted; only this request is affected. The panicking
    /// middleware's `on_response` is not run (its state for this request is unknown), so
    /// `ran` then counts only those before it.
    pub async fn request(
        &self,
        request: &mut Request<Body>,
        cx: &mut RequestContext,
    ) -> Result<usize, (usize, Response<Body>)> {
        for (index, layer) in self.layers.iter().enumerate() {
            let middleware = &layer.middleware;
            // The hook's future is built inside the guarded block, so a panic while
            // building it is caught like one while polling it.
            let outcome = AssertUnwindSafe(async { middleware.on_request(request, cx).await })
                .catch_unwind()
                .await;
            match outcome {
                Ok(Flow::Continue) => {}
                Ok(Flow::Respond(response)) => {
                    layer.rejections.fetch_add(1, Ordering::Relaxed);
                    return Err((index + 1, response));
                }
                Err(panic) => {
                    let response = self.panicked(layer, "on_request", panic.as_ref(), cx);
                    return Err((index, response));
                }
            }
        }
        Ok(self.layers.len())
    }

    /// Runs `on_response` of the first `ran` middleware, last first. A panic in one turns
    /// the response into a 500 (logged and counted as in [`Chain::request`]); the
    /// middleware further out still see it, so the access log records the 500.
    pub fn response(&self, ran: usize, response: &mut Response<Body>, cx: &RequestContext) {
        let ran = ran.min(self.layers.len());
        for layer in self.layers[..ran].iter().rev() {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                layer.middleware.on_response(response, cx);
            }));
            if let Err(panic) = outcome {
                *response = self.panicked(layer, "on_response", panic.as_ref(), cx);
            }
        }
    }

    /// Logs and counts a panic of `layer`'s `hook`; the 500 page the visitor gets.
    fn panicked(
        &self,
        layer: &Layer,
        hook: &str,
        panic: &(dyn std::any::Any + Send),
        cx: &RequestContext,
    ) -> Response<Body> {
        layer.panics.fetch_add(1, Ordering::Relaxed);
        let name = layer.middleware.name();
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        tracing::error!(
            event = "middleware_panicked",
            middleware = name,
            hook,
            service = %cx.service,
            request = cx.id,
            panic = message,
            "a middleware panicked; the request was answered 500"
        );
        error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal error",
            &format!(
                "internal error in middleware {name} of {}; try again later, and tell the site's operator if it persists",
                cx.host
            ),
        )
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http::HeaderValue;

    use super::*;
    use crate::http::middleware::BoxFuture;
    use crate::http::middleware::testing::{body_text, context, get};

    /// Appends its name to `x-trail` on the way in and out; optionally answers or panics.
    struct Probe {
        name: &'static str,
        answer: Option<StatusCode>,
        panic_in_request: bool,
        panic_in_response: bool,
        seen: Arc<Mutex<Vec<String>>>,
    }

    impl Probe {
        fn new(name: &'static str, seen: &Arc<Mutex<Vec<String>>>) -> Probe {
            Probe {
                name,
                answer: None,
                panic_in_request: false,
                panic_in_response: false,
                seen: Arc::clone(seen),
            }
        }
    }

    impl Middleware for Probe {
        fn name(&self) -> &str {
            self.name
        }

        fn on_request<'a>(
            &'a self,
            request: &'a mut Request<Body>,
            cx: &'a mut RequestContext,
        ) -> BoxFuture<'a, Flow> {
            Box::pin(async move {
                self.seen
                    .lock()
                    .expect("not poisoned")
                    .push(format!("in:{}", self.name));
                tokio::task::yield_now().await;
                assert!(!self.panic_in_request, "probe {} panics", self.name);
                request
                    .headers_mut()
                    .append("x-trail", HeaderValue::from_static("x"));
                cx.decide(self.name, "saw it");
                match self.answer {
                    Some(status) => Flow::Respond(error_page(status, "probe", "answered")),
                    None => Flow::Continue,
                }
            })
        }

        fn on_response(&self, response: &mut Response<Body>, _cx: &RequestContext) {
            self.seen
                .lock()
                .expect("not poisoned")
                .push(format!("out:{}", self.name));
            assert!(!self.panic_in_response, "probe {} panics", self.name);
            response
                .headers_mut()
                .append("x-out", HeaderValue::from_str(self.name).expect("ascii"));
        }
    }

    fn trail(seen: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        std::mem::take(&mut *seen.lock().expect("not poisoned"))
    }

    #[tokio::test]
    async fn runs_in_order_and_unwinds_like_an_onion() {
        let seen = Arc::default();
        let chain = Chain::new(vec![
            Arc::new(Probe::new("a", &seen)),
            Arc::new(Probe::new("b", &seen)),
            Arc::new(Probe::new("c", &seen)),
        ]);
        assert_eq!(chain.names(), ["a", "b", "c"]);
        assert!(!chain.is_empty());
        let mut request = get("/");
        let mut cx = context();
        let ran = chain
            .request(&mut request, &mut cx)
            .await
            .expect("continues");
        assert_eq!(ran, 3);
        assert_eq!(request.headers().get_all("x-trail").iter().count(), 3);
        assert_eq!(cx.decisions.len(), 3);
        let mut response = Response::new(crate::http::empty());
        chain.response(ran, &mut response, &cx);
        assert_eq!(
            trail(&seen),
            ["in:a", "in:b", "in:c", "out:c", "out:b", "out:a"]
        );
        let outs: Vec<_> = response.headers().get_all("x-out").iter().collect();
        assert_eq!(outs, ["c", "b", "a"]);
        assert_eq!(
            chain.rejections(),
            [("a".into(), 0), ("b".into(), 0), ("c".into(), 0)]
        );
    }

    #[tokio::test]
    async fn an_answer_stops_the_chain_and_is_counted() {
        let seen = Arc::default();
        let mut b = Probe::new("b", &seen);
        b.answer = Some(StatusCode::FORBIDDEN);
        let chain = Chain::new(vec![
            Arc::new(Probe::new("a", &seen)),
            Arc::new(b),
            Arc::new(Probe::new("c", &seen)),
        ]);
        for _ in 0..2 {
            let mut cx = context();
            let (ran, mut response) = chain
                .request(&mut get("/"), &mut cx)
                .await
                .expect_err("b answers");
            assert_eq!(ran, 2);
            assert_eq!(response.status(), StatusCode::FORBIDDEN);
            chain.response(ran, &mut response, &cx);
            assert_eq!(trail(&seen), ["in:a", "in:b", "out:b", "out:a"]);
        }
        assert_eq!(
            chain.rejections(),
            [("a".into(), 0), ("b".into(), 2), ("c".into(), 0)]
        );
    }

    #[tokio::test]
    async fn a_panic_answers_500_for_that_request_only() {
        let seen = Arc::default();
        let mut boom = Probe::new("boom", &seen);
        boom.panic_in_request = true;
        let chain = Chain::new(vec![Arc::new(Probe::new("log", &seen)), Arc::new(boom)]);
        let mut cx = context();
        let (ran, mut response) = chain
            .request(&mut get("/"), &mut cx)
            .await
            .expect_err("the panic answers");
        assert_eq!(ran, 1, "the panicking middleware's on_response is skipped");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        chain.response(ran, &mut response, &cx);
        assert_eq!(trail(&seen), ["in:log", "in:boom", "out:log"]);
        let text = body_text(response).await;
        assert!(text.contains("internal error in middleware boom"), "{text}");
        assert_eq!(chain.panics(), [("log".into(), 0), ("boom".into(), 1)]);
        assert_eq!(chain.rejections(), [("log".into(), 0), ("boom".into(), 0)]);

        // The chain and the runtime are fine: a chain without the bad middleware, sharing
        // nothing, still works, and so does this one for the middleware before it.
        let good = Chain::new(vec![Arc::new(Probe::new("log", &seen))]);
        assert_eq!(
            good.request(&mut get("/"), &mut context()).await.ok(),
            Some(1)
        );
    }

    #[tokio::test]
    async fn a_panic_in_on_response_becomes_500_and_outer_layers_see_it() {
        let seen = Arc::default();
        let mut boom = Probe::new("boom", &seen);
        boom.panic_in_response = true;
        let chain = Chain::new(vec![
            Arc::new(Probe::new("outer", &seen)),
            Arc::new(boom),
            Arc::new(Probe::new("inner", &seen)),
        ]);
        let mut cx = context();
        let ran = chain
            .request(&mut get("/"), &mut cx)
            .await
            .expect("continues");
        let mut response = Response::new(crate::http::full("backend"));
        chain.response(ran, &mut response, &cx);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let outs: Vec<_> = response.headers().get_all("x-out").iter().collect();
        assert_eq!(
            outs,
            ["outer"],
            "the 500 replaced the response inner had marked"
        );
        assert_eq!(chain.panics()[1], ("boom".into(), 1));
    }

    /// The server drives the chain inside hyper's service futures, which must be `Send`.
    #[test]
    fn the_chain_and_its_future_are_send() {
        fn is_send<T: Send>(_: &T) {}
        fn is_sync<T: Sync>() {}
        is_sync::<Chain>();
        let chain = Chain::empty();
        let mut request = get("/");
        let mut cx = context();
        let future = chain.request(&mut request, &mut cx);
        is_send(&future);
    }

    #[tokio::test]
    async fn empty_chain_passes_everything() {
        let chain = Chain::empty();
        assert!(chain.is_empty());
        let mut cx = context();
        assert_eq!(chain.request(&mut get("/"), &mut cx).await.ok(), Some(0));
        let mut response = Response::new(crate::http::empty());
        chain.response(0, &mut response, &cx);
        // A `ran` larger than the chain is clamped, not a panic.
        chain.response(7, &mut response, &cx);
        assert_eq!(response.status(), StatusCode::OK);
    }
}
