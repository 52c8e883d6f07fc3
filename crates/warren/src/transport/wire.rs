//! The byte stream under the record layer: a TCP connection, TLS on TCP, or WebSocket
//! frames on either ([`Wire`]).
//!
//! Every TCP-family transport (`noise`, `tcp`, `tls`, `ws`, `wss`) carries the same records
//! and the same preambles; only this layer differs. It is split in two halves like a
//! `TcpStream`, so the two directions of a channel run in different tasks, and the read
//! half keeps the property the record layer is built on ([`Source`]): it can wait for data
//! *without* a buffer, so an idle channel holds none.
//!
//! Dispatch is by `match` on small enums, never `dyn`: on plain TCP the extra cost per read
//! or write is one branch.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::records::ReadReady;
use super::tls::{TlsReader, TlsWriter};
use super::ws::{WsReader, WsWriter};

/// A byte source that can wait for data without being read, then be read without blocking:
/// what the record reader needs to hold no buffer while idle.
pub trait Source: Send {
    /// Ready when a `try_read` may make progress (data, EOF or an error). Registers the
    /// waker otherwise.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Reads what is there now, or fails with `WouldBlock` (after which
    /// `poll_read_ready` waits for more). `Ok(0)` is the end of the stream.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// A write half that may owe its connection a frame of its own while the caller has
/// nothing to send: a WebSocket ping, so that a CDN or reverse proxy in the path does not
/// close a connection that carries a quiet stream. The record writer polls
/// [`Keepalive::keepalive_due`] while it waits for data to send.
pub trait Keepalive {
    /// Completes when a keepalive is due; never, on transports that need none. Cancel safe.
    fn keepalive_due(&mut self) -> impl Future<Output = ()> + Send;
    /// Sends the keepalive.
    fn send_keepalive(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}

impl Keepalive for WireWriter {
    async fn keepalive_due(&mut self) {
        match self {
            WireWriter::Ws(ws) => ws.keepalive_due().await,
            WireWriter::Base(_) => std::future::pending().await,
        }
    }

    async fn send_keepalive(&mut self) -> io::Result<()> {
        match self {
            WireWriter::Ws(ws) => ws.send_keepalive().await,
            WireWriter::Base(_) => Ok(()),
        }
    }
}

/// Plain TCP halves need no keepalive (the record layer's tests write to them).
impl Keepalive for OwnedWriteHalf {
    async fn keepalive_due(&mut self) {
        std::future::pending().await
    }

    async fn send_keepalive(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Waits until `source` may be read. Cancel safe.
pub async fn readable<S: Source>(source: &mut S) -> io::Result<()> {
    poll_fn(|cx| source.poll_read_ready(cx)).await
}

impl Source for OwnedReadHalf {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.as_ref().poll_read_ready(cx)
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        ReadReady::try_read(self, buf)
    }
}

impl Source for TcpStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        ReadReady::try_read(self, buf)
    }
}

/// `AsyncRead` for any [`Source`]: for the preambles and handshakes, which read a few
/// bytes at a time.
pub fn poll_read_source<S: Source>(
    source: &mut S,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    loop {
        ready!(source.poll_read_ready(cx))?;
        match source.try_read(buf.initialize_unfilled()) {
            Ok(n) => {
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// The read half of a TCP connection or of TLS on one, with bytes that were read ahead
/// (while sniffing a protocol or parsing an HTTP head) handed out first.
pub struct BaseReader {
    /// Bytes read ahead, from `ahead_pos`.
    ahead: Vec<u8>,
    ahead_pos: usize,
    io: BaseIo,
}

enum BaseIo {
    Tcp(OwnedReadHalf),
    /// Boxed: the TLS half (keys, buffer state) is several times a TCP half.
    Tls(Box<TlsReader>),
}

impl BaseReader {
    fn new(io: BaseIo) -> BaseReader {
        BaseReader {
            ahead: Vec::new(),
            ahead_pos: 0,
            io,
        }
    }

    /// Whether TLS runs below.
    pub fn is_tls(&self) -> bool {
        matches!(self.io, BaseIo::Tls(_))
    }

    /// Puts `bytes` back in front of what is still to be read.
    pub fn unread(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut ahead = bytes.to_vec();
        ahead.extend_from_slice(&self.ahead[self.ahead_pos..]);
        self.ahead = ahead;
        self.ahead_pos = 0;
    }
}

impl Source for BaseReader {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ahead_pos < self.ahead.len() {
            return Poll::Ready(Ok(()));
        }
        match &mut self.io {
            BaseIo::Tcp(io) => io.poll_read_ready(cx),
            BaseIo::Tls(io) => io.poll_read_ready(cx),
        }
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.ahead_pos < self.ahead.len() {
            let n = buf.len().min(self.ahead.len() - self.ahead_pos);
            buf[..n].copy_from_slice(&self.ahead[self.ahead_pos..self.ahead_pos + n]);
            self.ahead_pos += n;
            if self.ahead_pos == self.ahead.len() {
                self.ahead = Vec::new();
                self.ahead_pos = 0;
            }
            return Ok(n);
        }
        match &mut self.io {
            BaseIo::Tcp(io) => io.try_read(buf),
            BaseIo::Tls(io) => io.try_read(buf),
        }
    }
}

impl AsyncRead for BaseReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read_source(self.get_mut(), cx, buf)
    }
}

/// The write half of a TCP connection or of TLS on one.
pub enum BaseWriter {
    /// Plain TCP.
    Tcp(OwnedWriteHalf),
    /// TLS 1.3 on TCP.
    Tls(TlsWriter),
}

impl AsyncWrite for BaseWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BaseWriter::Tcp(io) => Pin::new(io).poll_write(cx, buf),
            BaseWriter::Tls(io) => Pin::new(io).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BaseWriter::Tcp(io) => Pin::new(io).poll_flush(cx),
            BaseWriter::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BaseWriter::Tcp(io) => Pin::new(io).poll_shutdown(cx),
            BaseWriter::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BaseWriter::Tcp(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            BaseWriter::Tls(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            BaseWriter::Tcp(io) => io.is_write_vectored(),
            BaseWriter::Tls(io) => io.is_write_vectored(),
        }
    }
}

/// A connection below the records, both halves; [`Wire::into_split`] parts them.
pub struct Wire {
    /// Bytes from the peer.
    pub reader: WireReader,
    /// Bytes to the peer.
    pub writer: WireWriter,
}

/// The read half of a [`Wire`].
pub enum WireReader {
    /// TCP or TLS.
    Base(BaseReader),
    /// WebSocket binary frames over TCP or TLS.
    Ws(Box<WsReader<BaseReader>>),
}

/// The write half of a [`Wire`].
pub enum WireWriter {
    /// TCP or TLS.
    Base(BaseWriter),
    /// WebSocket binary frames over TCP or TLS.
    Ws(Box<WsWriter<BaseWriter>>),
}

/// The base halves of a plain TCP connection (what a WebSocket handshake runs on).
pub fn tcp_halves(stream: TcpStream) -> (BaseReader, BaseWriter) {
    let (read, write) = stream.into_split();
    (BaseReader::new(BaseIo::Tcp(read)), BaseWriter::Tcp(write))
}

/// The base halves of TLS on TCP, after its handshake.
pub fn tls_halves(reader: TlsReader, writer: TlsWriter) -> (BaseReader, BaseWriter) {
    (
        BaseReader::new(BaseIo::Tls(Box::new(reader))),
        BaseWriter::Tls(writer),
    )
}

impl Wire {
    /// A plain TCP connection.
    pub fn tcp(stream: TcpStream) -> Wire {
        let (reader, writer) = tcp_halves(stream);
        Wire::from_base(reader, writer)
    }

    /// TLS on TCP, after its handshake.
    pub fn tls(reader: TlsReader, writer: TlsWriter) -> Wire {
        let (reader, writer) = tls_halves(reader, writer);
        Wire::from_base(reader, writer)
    }

    /// TCP or TLS without framing.
    pub fn from_base(reader: BaseReader, writer: BaseWriter) -> Wire {
        Wire {
            reader: WireReader::Base(reader),
            writer: WireWriter::Base(writer),
        }
    }

    /// WebSocket framing over base halves whose upgrade is done.
    pub fn ws(reader: WsReader<BaseReader>, writer: WsWriter<BaseWriter>) -> Wire {
        Wire {
            reader: WireReader::Ws(Box::new(reader)),
            writer: WireWriter::Ws(Box::new(writer)),
        }
    }

    /// The two halves.
    pub fn into_split(self) -> (WireReader, WireWriter) {
        (self.reader, self.writer)
    }

    /// `ws` or `wss` when the bytes ride WebSocket frames (on TCP or on TLS).
    pub fn websocket(&self) -> Option<&'static str> {
        match &self.reader {
            WireReader::Ws(ws) if ws.get_ref().is_tls() => Some("wss"),
            WireReader::Ws(_) => Some("ws"),
            WireReader::Base(_) => None,
        }
    }
}

impl Source for WireReader {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            WireReader::Base(io) => io.poll_read_ready(cx),
            WireReader::Ws(io) => io.poll_read_ready(cx),
        }
    }
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            WireReader::Base(io) => io.try_read(buf),
            WireReader::Ws(io) => io.try_read(buf),
        }
    }
}

impl AsyncRead for WireReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read_source(self.get_mut(), cx, buf)
    }
}

impl AsyncWrite for WireWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WireWriter::Base(io) => Pin::new(io).poll_write(cx, buf),
            WireWriter::Ws(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireWriter::Base(io) => Pin::new(io).poll_flush(cx),
            WireWriter::Ws(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireWriter::Base(io) => Pin::new(io).poll_shutdown(cx),
            WireWriter::Ws(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_shutdown(cx)
    }
}
