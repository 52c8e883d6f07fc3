//! The backend connections of http services: tunnel streams to a session serving the
//! service, speaking HTTP to its target through the client, kept alive between requests.
//!
//! * HTTP/1.1 backends go through [`Http1Pool`], a small pool of hyper connections written
//!   here. A hyper client connection is a future that does the reading and writing; the
//!   usual way (hyper-util's pooled client) spawns it as a task, so every request and every
//!   response chunk crosses between that task and the visitor's through channels, with a
//!   wake-up each way (and hyper-util spawns one more task per request to put the
//!   connection back). Here the task that forwards a request drives the connection itself:
//!   while it waits for the response head, and then from the response body as the visitor
//!   reads it ([`DrivenBody`]); when that body ends, the connection goes back to the pool,
//!   and the next request's task drives it from there. Nothing runs for an idle connection.
//!   (Measured with wrk: hyper-util's client cost ~13 % more server CPU per 1 KiB request
//!   than a pool with one task per connection; driving the connection in the visitor's
//!   task cut another 3–21 % per 100 KiB request and nothing measurable at 1 KiB; see
//!   bench/RESULTS.md, session 19.)
//! * h2c backends keep hyper-util's client: one multiplexed connection per host, which
//!   spawns nothing per request.
//!
//! An idle HTTP/1 connection is closed once it has been idle for [`POOL_IDLE_TIMEOUT`] (one
//! sweeper task per pool looks every [`POOL_IDLE_TIMEOUT`] while connections are idle, and
//! ends when none are); at most [`POOL_IDLE_PER_SERVICE`] wait in a pool, the rest close
//! when their response ends. A kept connection the backend closed is noticed when it is
//! next taken (driving it reads the close) and skipped.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::{Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;
use tracing::{debug, warn};
use warren_proto::handshake::SessionId;

use super::serving::{Lease, ServiceSlot};
use super::{STREAM_OPEN_TIMEOUT, open_stream, short_id};
use crate::config::http::Backend;
use crate::http::{Body, BoxError};
use crate::session::io::StreamIo;

/// Idle backend connections kept per service.
const POOL_IDLE_PER_SERVICE: usize = 64;

/// How long an idle backend connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends an http service's requests to its backend.
pub(super) enum BackendClient {
    Http1(Arc<Http1Pool>),
    H2c(Box<Client<TunnelConnector, Body>>),
}

impl BackendClient {
    /// A client for `slot`'s backend, which speaks `backend`.
    pub(super) fn new(
        slot: &Arc<ServiceSlot>,
        backend: Backend,
        telemetry: &Arc<crate::metrics::Telemetry>,
    ) -> BackendClient {
        let connector = TunnelConnector {
            slot: Arc::clone(slot),
            telemetry: Arc::clone(telemetry),
        };
        match backend {
            Backend::Http1 => BackendClient::Http1(Arc::new(Http1Pool {
                connector,
                idle: Mutex::new(Idle::default()),
            })),
            Backend::H2c => {
                let mut builder = Client::builder(TokioExecutor::new());
                builder
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                    .pool_max_idle_per_host(POOL_IDLE_PER_SERVICE)
                    .set_host(false)
                    .http2_only(true);
                BackendClient::H2c(Box::new(builder.build(connector)))
            }
        }
    }

    /// Sends `request` (origin-form URI for HTTP/1, absolute for h2c) and returns the
    /// response head; its body streams from the backend.
    ///
    /// # Errors
    /// No session could open a stream, or the backend connection failed before a response.
    pub(super) async fn request(&self, request: Request<Body>) -> Result<Response<Body>, BoxError> {
        match self {
            BackendClient::Http1(pool) => pool.request(request).await,
            BackendClient::H2c(client) => {
                let response = client.request(request).await?;
                Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()))
            }
        }
    }
}

/// Keep-alive HTTP/1.1 connections to one service's backend (see the module doc).
pub(super) struct Http1Pool {
    connector: TunnelConnector,
    idle: Mutex<Idle>,
}

/// The idle connections of a pool.
#[derive(Default)]
struct Idle {
    /// Connections whose last response ended; the most recently used last (taken first:
    /// its stream is the warmest).
    conns: Vec<PooledConn>,
    /// A sweeper task is looking after them.
    swept: bool,
}

/// One HTTP/1 connection: the handle requests are sent with, and the connection future
/// that reads and writes the tunnel stream, driven by whichever task uses it.
struct PooledConn {
    sender: SendRequest<Body>,
    connection: Driven,
    /// What the connection, its response futures and its bodies are polled with.
    waker: Arc<ConnWaker>,
    /// When its last response ended.
    idle_since: Instant,
}

/// The waker a pooled connection and everything it feeds (the response future, the
/// response body) are polled with. Driving the connection completes those from inside the
/// task's own poll, and a task that wakes itself while it runs is rescheduled like a
/// yield, which tokio announces to a sleeping worker (a futex wake and a thread woken for
/// nothing, per request: measured +40 µs per request at one request at a time). So wakes
/// that happen while the task polls are only noted, and the poll looks again
/// ([`ConnWaker::poll`]); wakes from outside (the socket became readable) reach the task.
struct ConnWaker {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for ConnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl ConnWaker {
    fn new() -> Arc<ConnWaker> {
        Arc::new(ConnWaker {
            task: AtomicWaker::new(),
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
        })
    }

    /// Polls `f` on behalf of the task of `cx` (see the type's doc), again while it was
    /// woken during its own poll, up to a few times (then the task is woken, as a yield).
    fn poll<T>(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        /// Polls in a row before giving the worker to other tasks.
        const ROUNDS: usize = 4;
        self.task.register(cx.waker());
        let waker = Waker::from(Arc::clone(self));
        let mut inner = Context::from_waker(&waker);
        for _ in 0..ROUNDS {
            self.woken.store(false, Ordering::SeqCst);
            self.polling.store(true, Ordering::SeqCst);
            let polled = f(&mut inner);
            self.polling.store(false, Ordering::SeqCst);
            if polled.is_ready() || !self.woken.load(Ordering::SeqCst) {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Runs `f` (which hands the connection work: a request) without waking the task:
    /// the task drives the connection next anyway.
    fn quietly<T>(&self, f: impl FnOnce() -> T) -> T {
        self.polling.store(true, Ordering::SeqCst);
        let out = f();
        self.polling.store(false, Ordering::SeqCst);
        out
    }
}

/// A hyper connection future (with upgrades: hyper does not name that type), polled by
/// the task using it; `None` once it has ended (it must not be polled again).
type Driven = Option<Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>>;

/// Lets `connection` read and write what it can; `Ready` once it has ended (closed,
/// failed, or handed its stream to an upgrade).
fn drive(connection: &mut Driven, cx: &mut Context<'_>, service: &str) -> Poll<()> {
    let Some(running) = connection.as_mut() else {
        return Poll::Ready(());
    };
    let result = ready!(running.as_mut().poll(cx));
    *connection = None;
    if let Err(error) = result {
        debug!(event = "http_backend_closed", %service, %error, "a backend connection ended with an error");
    }
    Poll::Ready(())
}

/// Polls `work`, which needs `connection` to make progress, driving the connection
/// meanwhile. `None` if the connection ended and `work` did not finish with it.
async fn driving<F: Future>(
    connection: &mut Driven,
    waker: &Arc<ConnWaker>,
    service: &str,
    work: F,
) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    poll_fn(|cx| {
        waker.poll(cx, |cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            let ended = drive(connection, cx, service).is_ready();
            match work.as_mut().poll(cx) {
                Poll::Ready(out) => Poll::Ready(Some(out)),
                Poll::Pending if ended => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
    })
    .await
}

impl Http1Pool {
    fn service(&self) -> &str {
        &self.connector.slot.name
    }

    async fn request(
        self: &Arc<Self>,
        mut request: Request<Body>,
    ) -> Result<Response<Body>, BoxError> {
        loop {
            let (mut conn, reused) = match self.take() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            // Until it can take a request; a kept connection whose backend closed it
            // while idle reads that close here.
            let PooledConn {
                sender,
                connection,
                waker,
                ..
            } = &mut conn;
            let ready = driving(
                connection,
                waker,
                self.service(),
                poll_fn(|cx| sender.poll_ready(cx)),
            )
            .await;
            match ready {
                Some(Ok(())) => {}
                Some(Err(_)) | None if reused => continue, // closed while idle: the next one
                Some(Err(error)) => return Err(error.into()),
                None => return Err("the backend connection closed before a request".into()),
            }
            let sent = waker.quietly(|| sender.try_send_request(request));
            match driving(connection, waker, self.service(), sent).await {
                Some(Ok(response)) => return Ok(self.respond(conn, response)),
                Some(Err(mut error)) => match error.take_message() {
                    // Not sent: a kept connection that closed under us. Another one.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(error.into_error().into()),
                },
                None => {
                    return Err("the backend connection closed before its response".into());
                }
            }
        }
    }

    /// The most recently used idle connection, if it has not been idle too long.
    fn take(&self) -> Option<PooledConn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(conn) = idle.conns.pop() {
            if !conn.sender.is_closed() && conn.idle_since.elapsed() < POOL_IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    /// Opens a connection: a tunnel stream and the HTTP/1 handshake.
    async fn connect(&self) -> Result<PooledConn, BoxError> {
        let io = self.connector.connect().await?;
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .handshake(io)
            .await?;
        Ok(PooledConn {
            sender,
            connection: Some(Box::pin(connection.with_upgrades())),
            waker: ConnWaker::new(),
            idle_since: Instant::now(),
        })
    }

    /// The response, its body driving the connection: when the body ends whole, the
    /// connection goes back to the pool. (Dropped early, the connection cannot carry
    /// another request: it closes.) A `101 Switching Protocols` hands the stream to the
    /// upgrade: its connection is driven to that hand-off by a task of its own.
    fn respond(
        self: &Arc<Self>,
        mut conn: PooledConn,
        response: Response<Incoming>,
    ) -> Response<Body> {
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if conn.connection.is_some() {
                let (mut connection, service) = (conn.connection.take(), self.service().to_owned());
                tokio::spawn(
                    async move { poll_fn(|cx| drive(&mut connection, cx, &service)).await },
                );
            }
            return response.map(|body| body.map_err(BoxError::from).boxed_unsync());
        }
        let pool = Arc::clone(self);
        response.map(|inner| {
            DrivenBody {
                inner,
                conn: Some(conn),
                pool,
            }
            .boxed_unsync()
        })
    }

    /// A connection whose response ended, kept for the next request (or closed: the pool
    /// is full, or the connection cannot take another request).
    fn put_back(self: &Arc<Self>, mut conn: PooledConn) {
        if conn.sender.is_closed() || conn.connection.is_none() {
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.conns.len() < POOL_IDLE_PER_SERVICE {
            idle.conns.push(conn);
        }
        if !idle.swept {
            idle.swept = true;
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }
}

/// Closes a pool's connections idle for [`POOL_IDLE_TIMEOUT`], looking every
/// [`POOL_IDLE_TIMEOUT`]; ends when none are left idle or the pool is gone.
async fn sweep(pool: Weak<Http1Pool>) {
    loop {
        tokio::time::sleep(POOL_IDLE_TIMEOUT).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let before = idle.conns.len();
        idle.conns.retain(|conn| {
            conn.idle_since.elapsed() < POOL_IDLE_TIMEOUT && !conn.sender.is_closed()
        });
        let closed = before - idle.conns.len();
        if closed > 0 {
            debug!(event = "http_backend_idle", service = %pool.service(), closed, "closed backend connections idle for {POOL_IDLE_TIMEOUT:?}");
        }
        if idle.conns.is_empty() {
            idle.swept = false;
            return;
        }
    }
}

/// A response body from a pooled connection, which drives the connection as it is read
/// (the connection is what reads the body from the stream) and puts it back in the pool
/// when the body ends whole.
struct DrivenBody {
    inner: Incoming,
    /// `None` once the connection went back to the pool or ended.
    conn: Option<PooledConn>,
    pool: Arc<Http1Pool>,
}

impl DrivenBody {
    fn frame(
        &mut self,
        polled: Option<Result<Frame<Bytes>, hyper::Error>>,
    ) -> Option<Result<Frame<Bytes>, BoxError>> {
        match &polled {
            // A body of known length ends with its last frame: the reader may never poll
            // for the end.
            Some(Ok(_)) if self.inner.is_end_stream() => self.release(),
            Some(Ok(_)) => {}
            None => self.release(),
            Some(Err(_)) => self.conn = None,
        }
        polled.map(|frame| frame.map_err(BoxError::from))
    }

    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put_back(conn);
        }
    }
}

impl http_body::Body for DrivenBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            // The connection is gone: the body has what it buffered, then its end.
            let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            return Poll::Ready(this.frame(polled));
        };
        let inner = &mut this.inner;
        let service = &this.pool.connector.slot.name;
        let mut ended = false;
        let polled = conn.waker.poll(cx, |cx| {
            if let Poll::Ready(polled) = Pin::new(&mut *inner).poll_frame(cx) {
                return Poll::Ready(polled);
            }
            // Nothing buffered: let the connection read more, then look again.
            ended = ended || drive(&mut conn.connection, cx, service).is_ready();
            Pin::new(&mut *inner).poll_frame(cx)
        });
        if ended {
            // The body sees its end or its error from here on.
            this.conn = None;
        }
        match polled {
            Poll::Ready(polled) => Poll::Ready(this.frame(polled)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Opens backend connections: a stream on a session serving the service, the next session
/// when one fails.
#[derive(Clone)]
pub(super) struct TunnelConnector {
    slot: Arc<ServiceSlot>,
    telemetry: Arc<crate::metrics::Telemetry>,
}

impl TunnelConnector {
    async fn connect(&self) -> Result<TunnelConn, BoxError> {
        let slot = &self.slot;
        let mut tried: Vec<SessionId> = Vec::new();
        loop {
            let Some(lease) = slot.pick(&tried) else {
                return Err(if tried.is_empty() {
                    format!("no client serves `{}`", slot.name).into()
                } else {
                    format!(
                        "every session serving `{}` failed to open a stream",
                        slot.name
                    )
                    .into()
                });
            };
            tried.push(lease.session.id());
            match tokio::time::timeout(
                STREAM_OPEN_TIMEOUT,
                open_stream(&lease.session, &slot.name, None, None),
            )
            .await
            {
                Ok(Ok(stream)) => {
                    debug!(event = "http_backend_connection", service = %slot.name, session = %short_id(&lease.session.id()), "opened a backend connection");
                    // A backend connection counts as one of the service's connections,
                    // listed with the client it goes through; its bytes are the service's.
                    let (meter, guard) = self.telemetry.open(
                        &slot.meter,
                        &slot.name,
                        lease.session.peer,
                        crate::metrics::LocalEnd::Visitor,
                    );
                    return Ok(TunnelConn {
                        io: TokioIo::new(StreamIo::new(stream).metered(meter)),
                        _lease: lease,
                        _listed: guard,
                    });
                }
                Ok(Err(error)) => {
                    debug!(event = "stream_open_failed", service = %slot.name, %error, "could not open a backend stream; trying another session");
                }
                Err(_) => {
                    warn!(event = "stream_open_failed", service = %slot.name, "no stream from the client within {STREAM_OPEN_TIMEOUT:?}; trying another session");
                }
            }
        }
    }
}

impl tower_service::Service<http::Uri> for TunnelConnector {
    type Response = TunnelConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<TunnelConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let connector = self.clone();
        Box::pin(async move { connector.connect().await })
    }
}

/// A backend connection: a tunnel stream, holding its session's lease while it lives.
pub(super) struct TunnelConn {
    io: TokioIo<StreamIo>,
    _lease: Lease,
    /// Keeps the connection in the live table (and the active gauge) while it lives.
    _listed: crate::metrics::ConnectionGuard,
}

impl Connection for TunnelConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for TunnelConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TunnelConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts the wakes the task gets.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_during_the_poll_is_a_second_look_not_a_wake_of_the_task() {
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let conn = ConnWaker::new();
        // Woken once from inside (as a channel the connection fills would), ready on the
        // second look.
        let mut looks = 0;
        let polled = conn.poll(&mut cx, |inner| {
            looks += 1;
            if looks == 1 {
                inner.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        assert_eq!(polled, Poll::Ready(()));
        assert_eq!(looks, 2);
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "the task was not woken");

        // Pending with nothing woken: one look, and a wake from outside afterwards (the
        // socket became readable) reaches the task.
        let mut kept = None;
        let polled = conn.poll(&mut cx, |inner| {
            kept = Some(inner.waker().clone());
            Poll::<()>::Pending
        });
        assert_eq!(polled, Poll::Pending);
        kept.unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_poll_that_keeps_waking_itself_yields_to_the_task() {
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut looks = 0;
        let polled = ConnWaker::new().poll(&mut cx, |inner| {
            looks += 1;
            inner.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        assert_eq!(polled, Poll::Pending);
        assert!(looks <= 4, "bounded: {looks} looks");
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "woken once, as a yield");
    }
}
