//! TLS 1.3 on TCP for the `tls` and `wss` transports: rustls (aws-lc-rs) does the
//! handshake and every record; this module splits the connection into a read half and a
//! write half for [`super::wire`].
//!
//! Why not `tokio_rustls::TlsStream` with `tokio::io::split`: the record layer needs a read
//! half that can wait for data without a buffer ([`super::wire::Source`]), and `split`
//! hides readiness behind `poll_read`. Here both halves share the socket (tokio's
//! `TcpStream` reads and writes through `&self`) and the rustls connection behind a mutex
//! held only while rustls copies and seals or opens, never across an `await`.
//!
//! Why rustls's buffered API and not its unbuffered one (rustls 0.23.46, checked for issue
//! 19): `UnbufferedConnectionCommon` has no `export_keying_material`, so there would be no
//! [`TlsSession::binding`]. Nor would it save the copies that cost: it opens a record in
//! our buffer but still copies the plaintext into a fresh `Vec` before `next_record` hands
//! it out, and `WriteTraffic::encrypt` seals into a `Vec` of its own, then copies that into
//! ours. The buffered API costs one memory copy more per read byte (`read_tls`, fed from
//! [`TlsReader`]'s buffer) and one fewer per written byte. That per-record `Vec` is most of
//! the receiver's memcpy time on AMD Zen 3 with glibc 2.36 (measured here): `rep movsb` runs at
//! ~3 GB/s instead of ~60 when the destination lies 1 to 31 bytes past the source modulo
//! 64, and malloc's 16-byte chunk headers against the 5-byte record header put every
//! 16 KiB record we traced there. rustls 0.24's split connection opens records in the
//! caller's buffer and keeps an exporter: the way to in-place records once it is released.
//!
//! Authentication is not this layer's: in `psk` mode the client accepts any server
//! certificate unless it pins one (`server_cert_sha256`), and the PSK is proven inside by
//! the Noise handshake. On `tls` that handshake is bound to this connection's exporter
//! ([`TlsSession::binding`]), so a relay that terminates TLS with another certificate cannot
//! pass it on. `wss` is not bound: a CDN or reverse proxy may terminate its TLS, and the
//! records inside stay encrypted end to end.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use crate::transport::quic::tls::{Pin as CertPin, PinVerifier, provider};

/// ALPN offered and accepted: what a browser's HTTPS or WebSocket connection says.
pub const ALPN: &[u8] = b"http/1.1";

/// The exporter label of the `tls` transport's binding.
const BINDING_LABEL: &[u8] = b"EXPORTER-warren-tls-binding";

/// A client's TLS settings: how it checks the server.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Accepts any server certificate (the PSK authenticates), or only the one whose DER
    /// has the SHA-256 `pin`; with `ca`, the server's chain must verify against it and the
    /// name dialled instead.
    ///
    /// # Errors
    /// A CA that holds no usable certificate.
    pub fn new(
        pin: Option<[u8; 32]>,
        ca: Option<Vec<CertificateDer<'static>>>,
    ) -> Result<TlsClient, String> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS 1.3 unavailable: {e}"))?;
        let mut config = match ca {
            Some(cas) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in cas {
                    roots
                        .add(ca)
                        .map_err(|e| format!("a CA certificate is unusable: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("the CA file holds no certificate".to_owned());
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            None => {
                let pin = pin.map_or(CertPin::Any, CertPin::CertSha256);
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(PinVerifier::new(pin)))
                    .with_no_client_auth()
            }
        };
        config.alpn_protocols = vec![ALPN.to_vec()];
        config.enable_early_data = false;
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }

    /// Runs the client handshake on `stream`, naming `server_name` (SNI).
    ///
    /// # Errors
    /// Socket errors and TLS failures (an untrusted or unpinned certificate, an alert).
    pub async fn connect(&self, stream: TcpStream, server_name: &str) -> io::Result<TlsSession> {
        let name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{server_name:?} is not a valid TLS server name"),
            )
        })?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        let tls = connector
            .connect(name, stream)
            .await
            .map_err(|e| tls_failure("the TLS handshake with the server failed", e))?;
        let (socket, conn) = tls.into_inner();
        Ok(TlsSession::new(socket, rustls::Connection::Client(conn)))
    }
}

/// A server's TLS settings: its certificate.
#[derive(Clone)]
pub struct TlsServer {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer").finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Presents `chain` (leaf first) with `key`.
    ///
    /// # Errors
    /// A key rustls cannot use with the certificate.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsServer, String> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS 1.3 unavailable: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("the TLS certificate or key is unusable: {e}"))?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        // No tickets: a Warren client resumes nothing (its sessions are long), and a
        // ticket is one more record each connection would send for nothing.
        config.send_tls13_tickets = 0;
        Ok(TlsServer {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Runs the server handshake on `stream`.
    ///
    /// # Errors
    /// Socket errors and TLS failures.
    pub async fn accept(&self, stream: TcpStream) -> io::Result<TlsSession> {
        let tls = self
            .acceptor
            .accept(stream)
            .await
            .map_err(|e| tls_failure("the TLS handshake with the client failed", e))?;
        let (socket, conn) = tls.into_inner();
        Ok(TlsSession::new(socket, rustls::Connection::Server(conn)))
    }
}

fn tls_failure(what: &str, error: io::Error) -> io::Error {
    let text = error.to_string();
    let hint = if text.contains("ProtocolVersion") {
        " (Warren speaks TLS 1.3 only: enable it where the TLS ends, e.g. nginx's ssl_protocols TLSv1.2 TLSv1.3)"
    } else {
        ""
    };
    io::Error::new(error.kind(), format!("{what}: {text}{hint}"))
}

/// An established TLS connection, before it is split.
pub struct TlsSession {
    shared: Arc<Shared>,
}

struct Shared {
    socket: TcpStream,
    conn: Mutex<rustls::Connection>,
}

impl Shared {
    fn lock(&self) -> io::Result<MutexGuard<'_, rustls::Connection>> {
        self.conn
            .lock()
            .map_err(|_| io::Error::other("TLS state poisoned by a panic"))
    }
}

impl TlsSession {
    fn new(socket: TcpStream, conn: rustls::Connection) -> TlsSession {
        TlsSession {
            shared: Arc::new(Shared {
                socket,
                conn: Mutex::new(conn),
            }),
        }
    }

    /// 32 bytes both ends of *this* TLS connection compute and nobody else can: what the
    /// `tls` transport binds its PSK proof to.
    ///
    /// # Errors
    /// Only if rustls refuses the export (not after a finished handshake).
    pub fn binding(&self) -> io::Result<[u8; 32]> {
        let conn = self.shared.lock()?;
        conn.export_keying_material([0u8; 32], BINDING_LABEL, None)
            .map_err(|e| io::Error::other(format!("TLS exporter failed: {e}")))
    }

    /// The two halves.
    pub fn split(self) -> (TlsReader, TlsWriter) {
        (
            TlsReader {
                shared: Arc::clone(&self.shared),
                inbox: Vec::new(),
                pos: 0,
                end: 0,
            },
            TlsWriter {
                shared: self.shared,
            },
        )
    }
}

/// Reads and writes the socket without waiting, for rustls's `read_tls` / `write_tls`.
struct Nonblocking<'a>(&'a TcpStream);

impl Read for Nonblocking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Nonblocking<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The read half: plaintext out of TLS records.
///
/// rustls's own `read_tls` reads at most 4 KiB per call, i.e. four syscalls per full TLS
/// record; this half reads the socket into its own buffer in one call and hands rustls
/// the bytes from memory.
pub struct TlsReader {
    shared: Arc<Shared>,
    /// Ciphertext read from the socket, not yet handed to rustls (`pos..end`). No buffer
    /// while idle: it goes back to the pool whenever it is drained.
    inbox: Vec<u8>,
    pos: usize,
    end: usize,
}

impl TlsReader {
    /// Ready when plaintext is buffered, the peer closed, or the socket has bytes.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pos < self.end {
            return Poll::Ready(Ok(()));
        }
        {
            let mut conn = self.shared.lock()?;
            match conn.process_new_packets() {
                Ok(state) if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() => {
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => {}
                // try_read reports it.
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
        self.shared.socket.poll_read_ready(cx)
    }

    /// Hands out buffered plaintext, reading and opening more records from the socket
    /// while there is none; `WouldBlock` once the socket is drained.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let shared = &*self.shared;
                let mut conn = shared.lock()?;
                loop {
                    let state = conn.process_new_packets().map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
                    })?;
                    if conn.wants_write() {
                        // A key update's answer or an alert: best effort now, the writer
                        // sends the rest with its next record.
                        let _ = conn.write_tls(&mut Nonblocking(&shared.socket));
                    }
                    if state.plaintext_bytes_to_read() > 0 {
                        return conn.reader().read(buf);
                    }
                    if state.peer_has_closed() {
                        return Ok(0);
                    }
                    if self.pos == self.end {
                        break;
                    }
                    // A memory copy, not a syscall.
                    let n = conn
                        .read_tls(&mut &self.inbox[self.pos..self.end])
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    self.pos += n;
                }
            }
            if self.inbox.is_empty() {
                self.inbox = super::buffers::take_read();
            }
            match super::records::ReadReady::try_read(&self.shared.socket, &mut self.inbox[..]) {
                // A TCP end without close_notify: the records above say whether anything
                // was cut (a stream's `End`, a channel's `Close`), so this is EOF too.
                Ok(0) => return Ok(0),
                Ok(n) => {
                    self.pos = 0;
                    self.end = n;
                }
                Err(e) => {
                    self.pos = 0;
                    self.end = 0;
                    super::buffers::give_read(std::mem::take(&mut self.inbox));
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for TlsReader {
    fn drop(&mut self) {
        if !self.inbox.is_empty() {
            super::buffers::give_read(std::mem::take(&mut self.inbox));
        }
    }
}

/// The write half: plaintext into TLS records.
pub struct TlsWriter {
    shared: Arc<Shared>,
}

impl TlsWriter {
    /// Writes out every sealed record rustls holds; pending while the socket is full.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            {
                let mut conn = self.shared.lock()?;
                if !conn.wants_write() {
                    return Poll::Ready(Ok(()));
                }
                match conn.write_tls(&mut Nonblocking(&self.shared.socket)) {
                    Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            ready!(self.shared.socket.poll_write_ready(cx))?;
        }
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let mut conn = this.shared.lock()?;
        let n = conn.writer().write(buf)?;
        // Start sending now; whatever the socket does not take goes out with the next
        // write or the flush.
        match conn.write_tls(&mut Nonblocking(&this.shared.socket)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.shared.lock()?.send_close_notify();
        ready!(this.poll_drain(cx))?;
        let _ = socket2::SockRef::from(&this.shared.socket).shutdown(std::net::Shutdown::Write);
        Poll::Ready(Ok(()))
    }
}
