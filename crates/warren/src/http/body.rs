//! A response body watched on its way out: its data bytes counted, its first bytes kept if
//! asked, and one call when it ends, fails or is dropped unread. The access log and the
//! inspector's capture both finish their record this way, when the last byte left rather
//! than when the head did.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;

use super::{Body, BoxError};

/// How a watched body ended.
#[derive(Debug, Default)]
pub struct BodyEnd {
    /// Data bytes that went out.
    pub bytes: u64,
    /// It reached its end (not an error, not dropped with bytes left).
    pub completed: bool,
    /// Its first bytes, as many as asked for.
    pub prefix: Vec<u8>,
}

/// Wraps `body`: counts it, keeps its first `keep` bytes, and calls `on_end` once.
pub fn observe(body: Body, keep: usize, on_end: impl FnOnce(BodyEnd) + Send + 'static) -> Body {
    Observed {
        inner: body,
        keep,
        end: BodyEnd::default(),
        on_end: Some(Box::new(on_end)),
    }
    .boxed_unsync()
}

struct Observed {
    inner: Body,
    keep: usize,
    end: BodyEnd,
    on_end: Option<Box<dyn FnOnce(BodyEnd) + Send>>,
}

impl Observed {
    fn finish(&mut self, completed: bool) {
        if let Some(on_end) = self.on_end.take() {
            self.end.completed = completed;
            on_end(std::mem::take(&mut self.end));
        }
    }
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.end.bytes += data.len() as u64;
                    let room = this.keep.saturating_sub(this.end.prefix.len());
                    this.end
                        .prefix
                        .extend_from_slice(&data[..data.len().min(room)]);
                }
                // A body of known length ends with its last frame: the reader may never
                // poll for the end.
                if this.inner.is_end_stream() {
                    this.finish(true);
                }
            }
            Poll::Ready(None) => this.finish(true),
            Poll::Ready(Some(Err(_))) => this.finish(false),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // Dropped unread: complete only if there was nothing (left) to send.
        let completed = self.inner.is_end_stream();
        self.finish(completed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test]
    async fn counts_keeps_a_prefix_and_ends_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let body = observe(crate::http::full("hello world"), 5, move |end| {
            record.lock().unwrap().push(end);
        });
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello world");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "called once");
        assert_eq!((seen[0].bytes, seen[0].completed), (11, true));
        assert_eq!(seen[0].prefix, b"hello");
    }

    #[tokio::test]
    async fn a_body_dropped_unread_ends_incomplete() {
        let seen = Arc::new(Mutex::new(None));
        let record = Arc::clone(&seen);
        let body = observe(crate::http::full("unread"), 0, move |end| {
            *record.lock().unwrap() = Some(end.completed);
        });
        drop(body);
        assert_eq!(*seen.lock().unwrap(), Some(false));
    }
}
