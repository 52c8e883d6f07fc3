//! WebSocket for the `ws` and `wss` transports (STUB: being written on branch `ws`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use super::wire::{BaseReader, BaseWriter, Source};

/// Which end of the WebSocket this is: clients mask what they send, servers do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that sent the upgrade request.
    Client,
    /// The side that answered it.
    Server,
}

/// Binary frames in, bytes out.
pub struct WsReader<R> {
    inner: R,
}

/// Bytes in, binary frames out.
pub struct WsWriter<W> {
    inner: W,
}

/// Frames the two halves of an upgraded connection.
pub fn framed<R: Source, W: AsyncWrite + Unpin + Send>(
    reader: R,
    writer: W,
    _role: Role,
) -> (WsReader<R>, WsWriter<W>) {
    (WsReader { inner: reader }, WsWriter { inner: writer })
}

impl<R: Source> Source for WsReader<R> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read_ready(cx)
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.try_read(buf)
    }
}

impl<W: AsyncWrite + Unpin + Send> AsyncWrite for WsWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A server's WebSocket settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsServer {
    /// The path upgrades must ask for (`/warren`).
    pub path: String,
    /// Answer other HTTP requests with a plain page (else 404).
    pub decoy: bool,
}

/// What an HTTP request on the server port turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// A WebSocket upgrade at our path: answered 101, frames follow.
    WebSocket,
    /// Anything else: answered (decoy page or 404); the caller closes.
    NotWebSocket,
}

/// WebSocket handshake failures.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// The socket failed.
    #[error("connection error during the WebSocket upgrade: {0}")]
    Io(#[from] io::Error),
    /// The server answered something other than an upgrade.
    #[error("{0}")]
    Refused(String),
    /// The peer's HTTP head was malformed or too large.
    #[error("{0}")]
    Malformed(String),
}

/// Client: asks for the upgrade at `path` naming `host`, and checks the answer.
///
/// # Errors
/// [`WsError`].
pub async fn client_upgrade(
    _reader: &mut BaseReader,
    _writer: &mut BaseWriter,
    _host: &str,
    _path: &str,
) -> Result<(), WsError> {
    Err(WsError::Refused("WebSocket not built yet".into()))
}

/// Server: reads one HTTP request head and answers it.
///
/// # Errors
/// [`WsError`].
pub async fn server_upgrade(
    _reader: &mut BaseReader,
    _writer: &mut BaseWriter,
    _ws: &WsServer,
) -> Result<Upgrade, WsError> {
    Err(WsError::Malformed("WebSocket not built yet".into()))
}
