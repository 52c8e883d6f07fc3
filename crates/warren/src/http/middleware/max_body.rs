//! `max_body`: refuse request bodies larger than a limit.
//!
//! A request whose `Content-Length` is over the limit is answered 413 at once, before a
//! byte of the body is read. Any other body (chunked uploads, or a `Content-Length` that
//! fits) is wrapped in a counter that fails the body as soon as more than the limit has
//! flowed; the proxy then fails the request, so **a chunked upload over the limit is cut
//! off mid-way** (the backend sees a broken upload, the visitor an error), not refused up
//! front: its size is not known up front.

use http::header::CONTENT_LENGTH;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::page::error_page;
use crate::http::{Body, empty};

/// The `max_body` middleware.
#[derive(Debug, Clone)]
pub struct MaxBody {
    limit: u64,
}

impl MaxBody {
    /// Bodies of at most `limit` bytes pass.
    pub fn new(limit: u64) -> MaxBody {
        MaxBody { limit }
    }
}

impl Middleware for MaxBody {
    fn name(&self) -> &str {
        "max_body"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        let flow = match declared {
            Some(length) if length > self.limit => {
                cx.decide("max_body", format!("refused: {length} bytes declared"));
                Flow::Respond(error_page(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Upload too large",
                    &format!(
                        "{} accepts request bodies of at most {} bytes; this one has {length}.",
                        cx.host, self.limit
                    ),
                ))
            }
            _ => {
                let body = std::mem::replace(request.body_mut(), empty());
                // `usize` is 64 bits on every platform Warren runs on; saturate elsewhere.
                let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
                *request.body_mut() = Limited::new(body, limit).boxed_unsync();
                Flow::Continue
            }
        };
        Box::pin(std::future::ready(flow))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::StreamBody;

    use super::*;
    use crate::http::BoxError;
    use crate::http::middleware::testing::{body_text, context, run};

    fn post(body: Body, length: Option<usize>) -> Request<Body> {
        let mut builder = Request::builder().method("POST").uri("/upload");
        if let Some(length) = length {
            builder = builder.header(CONTENT_LENGTH, length);
        }
        builder.body(body).expect("valid request")
    }

    fn chunked(chunks: usize, size: usize) -> Body {
        let frames = (0..chunks)
            .map(move |_| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(vec![b'x'; size]))));
        StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    #[tokio::test]
    async fn declared_length_over_the_limit_is_413_at_once() {
        let max = MaxBody::new(10);
        let mut cx = context();
        let response = run(
            &max,
            &mut post(crate::http::full("x".repeat(11)), Some(11)),
            &mut cx,
        )
        .await
        .expect("refused");
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(body_text(response).await.contains("at most 10 bytes"));
        assert_eq!(cx.decisions[0].1, "refused: 11 bytes declared");
    }

    #[tokio::test]
    async fn bodies_within_the_limit_flow_whole() {
        let max = MaxBody::new(10);
        let mut request = post(crate::http::full("0123456789"), Some(10));
        assert!(run(&max, &mut request, &mut context()).await.is_none());
        let body = request.into_body().collect().await.expect("fits");
        assert_eq!(body.to_bytes(), "0123456789");

        let mut request = post(chunked(2, 5), None);
        assert!(run(&max, &mut request, &mut context()).await.is_none());
        assert_eq!(
            request
                .into_body()
                .collect()
                .await
                .expect("fits")
                .to_bytes()
                .len(),
            10
        );
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_limit_is_cut() {
        let max = MaxBody::new(10);
        let mut request = post(chunked(3, 5), None);
        assert!(
            run(&max, &mut request, &mut context()).await.is_none(),
            "size unknown up front"
        );
        let error = request.into_body().collect().await.expect_err("cut off");
        assert!(error.to_string().contains("length limit"), "{error}");
    }
}
