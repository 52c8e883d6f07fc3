//! A session's streams, whatever carries them: open one, serve the ones the peer opens,
//! hand a finished one back.
//!
//! [`ServerLink`] and [`ClientLink`] are the two sides of one session's stream layer. They
//! are enums over the transports (a `match`, no virtual call), so server and client code
//! never branch on the transport:
//! * `Tcp`: data channels, pre-opened by the client ([`super::tcp`]).
//! * `Quic`: native streams of the session's one QUIC connection ([`super::quic`]).
//!
//! Reverse streams are opened by the server ([`ServerLink::open_stream`]) and served by the
//! client's [`StreamHandler`]; forward streams are opened by the client
//! ([`ClientLink::open_stream`]). A stream that ended cleanly in both directions is handed
//! back ([`ServerLink::recycle`]; the client's handler returns it): a transport that can
//! carry another stream on it does so.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use warren_proto::message::{ControlMessage, StreamOpen};

use super::quic::QuicLink;
use super::stream::Stream;
use super::tcp::{ClientPool, ServerPool};

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The session ended while the stream was being opened.
    #[error("the session ended")]
    SessionGone,
    /// The transport failed to open it.
    #[error("could not open a stream: {0}")]
    Failed(String),
}

/// Serves the streams a peer opens (the client's reverse streams).
pub trait StreamHandler: Send + Sync + 'static {
    /// Serves one stream, whose `StreamOpen` is `open`. Returns the stream if it ended
    /// cleanly in both directions (the transport may reuse it), `None` otherwise.
    ///
    /// `replenish` tells the transport the stream is under way, so it can prepare the next
    /// one (the TCP pool dials a replacement channel); call [`Replenish::now`] once the
    /// stream's first step is done, so that work does not compete with it. Dropping it
    /// does the same.
    fn serve(
        &self,
        open: StreamOpen,
        stream: Stream,
        replenish: Replenish,
    ) -> impl Future<Output = Option<Stream>> + Send;
}

/// What a transport does once a stream it handed out is under way (see
/// [`StreamHandler::serve`]). Runs at most once.
pub struct Replenish(Option<Box<dyn FnOnce() + Send>>);

impl Replenish {
    /// Runs `then` when the stream is under way.
    pub fn new(then: impl FnOnce() + Send + 'static) -> Self {
        Replenish(Some(Box::new(then)))
    }

    /// Nothing to do (a transport without a pool, or a test).
    pub fn nothing() -> Self {
        Replenish(None)
    }

    /// The stream is under way.
    pub fn now(&mut self) {
        if let Some(then) = self.0.take() {
            then();
        }
    }
}

impl Drop for Replenish {
    fn drop(&mut self) {
        self.now();
    }
}

/// What a session's connection runs on, as its handshake found it.
pub enum Carrier {
    /// A TCP transport: streams are data channels (the control channel is one more), each
    /// under the congestion control the control connection reported.
    Tcp {
        /// The control connection's TCP congestion control, as the kernel reports it.
        congestion: Option<String>,
    },
    /// A QUIC connection: streams are its streams.
    Quic(quinn::Connection),
}

impl Carrier {
    /// The congestion control the session's connection runs: the kernel's name for a TCP
    /// transport, quinn's controller (asked of the connection itself) for QUIC.
    pub fn congestion(&self) -> Option<String> {
        match self {
            Carrier::Tcp { congestion } => congestion.clone(),
            Carrier::Quic(connection) => {
                let controller = connection.congestion_state().into_any();
                let name = if controller.is::<quinn::congestion::Cubic>() {
                    "cubic"
                } else if controller.is::<quinn::congestion::Bbr>() {
                    "bbr"
                } else if controller.is::<crate::transport::quic::congestion::Combined>() {
                    "model"
                } else if controller.is::<quinn::congestion::NewReno>() {
                    "newreno"
                } else {
                    "custom"
                };
                Some(name.to_owned())
            }
        }
    }
}

/// The server's side of a session's streams.
pub enum ServerLink {
    /// Data channels pre-opened by the client.
    Tcp(ServerPool),
    /// Streams of a QUIC connection.
    Quic(QuicLink),
}

impl ServerLink {
    /// The link for a session on `carrier`; `control` is its control queue (the TCP pool
    /// asks for channels there) and `cancel` ends it. Accept loops run on `tasks`.
    pub fn new(
        carrier: Carrier,
        control: mpsc::Sender<ControlMessage>,
        cancel: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        match carrier {
            Carrier::Tcp { .. } => ServerLink::Tcp(ServerPool::new(control, cancel)),
            Carrier::Quic(connection) => ServerLink::Quic(QuicLink::new(connection, tasks)),
        }
    }

    /// Opens a stream towards the client; `open` is its first message.
    ///
    /// # Errors
    /// The session ended, or the transport could not open a stream.
    pub async fn open_stream(&self, open: &StreamOpen) -> Result<Stream, OpenError> {
        match self {
            ServerLink::Tcp(pool) => pool.open_stream(open).await,
            ServerLink::Quic(link) => link.open_stream(open).await,
        }
    }

    /// Starts handing the streams the client opens (forward services) to `handler`. The
    /// TCP transports' forward channels arrive at the server's listener instead, which
    /// hands them to the same handler.
    pub fn serve<H: StreamHandler>(&self, handler: &Arc<H>) {
        match self {
            ServerLink::Tcp(_) => {}
            ServerLink::Quic(link) => link.serve(handler),
        }
    }

    /// Stops taking streams from the client (the session is over).
    pub fn close(&self) {
        match self {
            ServerLink::Tcp(_) => {}
            ServerLink::Quic(link) => link.close(),
        }
    }

    /// The pool of a session on a TCP transport, which takes the data channels the client
    /// opens at the server's listener; `None` on other transports.
    pub fn tcp_pool(&self) -> Option<&ServerPool> {
        match self {
            ServerLink::Tcp(pool) => Some(pool),
            ServerLink::Quic(_) => None,
        }
    }

    /// The QUIC path of a session on QUIC.
    pub fn quic_path(&self) -> Option<super::quic::QuicPath> {
        match self {
            ServerLink::Tcp(_) => None,
            ServerLink::Quic(link) => Some(link.path()),
        }
    }

    /// Takes back a stream that ended cleanly in both directions.
    pub async fn recycle(&self, stream: Stream) {
        match self {
            ServerLink::Tcp(pool) => pool.recycle(stream).await,
            // A QUIC stream is not reused: opening another costs nothing.
            ServerLink::Quic(_) => drop(stream),
        }
    }
}

/// The client's side of a session's streams.
pub enum ClientLink {
    /// Data channels: a pool for the server's streams, a new one per forward stream.
    Tcp(Arc<ClientPool>),
    /// Streams of a QUIC connection.
    Quic(QuicLink),
}

impl ClientLink {
    /// The link for a session on `carrier`; a TCP one dials its data channels with
    /// `dialer`. Accept loops and pooled channels run on `tasks`.
    pub fn new(carrier: Carrier, dialer: super::tcp::Dialer, tasks: TaskTracker) -> Self {
        match carrier {
            Carrier::Tcp { .. } => ClientLink::Tcp(ClientPool::new(dialer, tasks)),
            Carrier::Quic(connection) => ClientLink::Quic(QuicLink::new(connection, tasks)),
        }
    }

    /// Opens a stream towards the server (a forward service); `open` is its first message.
    ///
    /// # Errors
    /// The transport could not open a stream.
    pub async fn open_stream(&self, open: &StreamOpen) -> Result<Stream, OpenError> {
        match self {
            ClientLink::Tcp(pool) => pool.open_stream(open).await,
            ClientLink::Quic(link) => link.open_stream(open).await,
        }
    }

    /// Starts handing the streams the server opens to `handler`.
    pub fn serve<H: StreamHandler>(&self, handler: &Arc<H>) {
        match self {
            ClientLink::Tcp(pool) => pool.serve(handler, super::tcp::POOL_SIZE),
            ClientLink::Quic(link) => link.serve(handler),
        }
    }

    /// The server asks for more room for streams (`NeedChannels`).
    pub fn more_streams<H: StreamHandler>(&self, handler: &Arc<H>, count: u16) {
        match self {
            ClientLink::Tcp(pool) => pool.serve(handler, usize::from(count)),
            ClientLink::Quic(_) => {}
        }
    }

    /// The QUIC path of a session on QUIC.
    pub fn quic_path(&self) -> Option<super::quic::QuicPath> {
        match self {
            ClientLink::Tcp(_) => None,
            ClientLink::Quic(link) => Some(link.path()),
        }
    }

    /// Stops taking new streams from the server (the session is over); streams under way
    /// go on.
    pub fn close(&self) {
        match self {
            ClientLink::Tcp(pool) => pool.close(),
            ClientLink::Quic(link) => link.close(),
        }
    }
}
