//! TLS 1.3 on TCP for the `tls` and `wss` transports: rustls (aws-lc-rs) runs the
//! handshake, then [`record`] seals and opens every record in our own buffers; this module
//! drives the handshake and splits the connection into a read half and a write half for
//! [`super::wire`].
//!
//! Why not rustls for the records too (`tokio_rustls::TlsStream`, or rustls's buffered
//! connection behind a mutex, which Warren used until issue 19's measurements): rustls
//! copies each received record's plaintext into a fresh `Vec` and then into the caller's
//! buffer, and each sent record's plaintext into its own buffer and the sealed record into
//! another `Vec`. On AMD Zen 3 with glibc 2.36 (this project's machines) the per-record
//! `Vec` copy runs at ~3 GB/s instead of ~60 (`rep movsb` with the destination 1 to 31
//! bytes past the source modulo 64; malloc's 16-byte headers against the 5-byte record
//! header put every 16 KiB record there): a third of the receiver's CPU. rustls's
//! unbuffered API still copies into a `Vec` per record and has no exporter, which the
//! `tls` binding needs. So rustls does what it is best at, the handshake, and hands over
//! the application traffic secrets through its key log hook (the supported way to learn
//! them, one collector per connection); the handshake is fed one record at a time, so
//! nothing after it is left inside rustls, and both directions start at record 0 (the
//! server sends no tickets). After that the connection is plain TLS 1.3 on the wire,
//! including key updates.
//!
//! Authentication is not this layer's: in `psk` mode the client accepts any server
//! certificate unless it pins one (`server_cert_sha256`), and the PSK is proven inside by
//! the Noise handshake. On `tls` that handshake is bound to this connection's exporter
//! ([`TlsSession::binding`]), so a relay that terminates TLS with another certificate cannot
//! pass it on. `wss` is not bound: a CDN or reverse proxy may terminate its TLS, and the
//! records inside stay encrypted end to end.

pub mod record;

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use self::record::{HEADER_LEN, MAX_BODY, MAX_CONTENT, Opened, Opener, Sealer, Suite};

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
        let keys = Arc::new(TrafficSecrets::default());
        let mut config = (*self.config).clone();
        config.key_log = Arc::clone(&keys) as Arc<dyn rustls::KeyLog>;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| tls_failure("the TLS handshake with the server failed", e))?;
        handshake(stream, rustls::Connection::Client(conn), &keys)
            .await
            .map_err(|e| {
                let what = match e.kind() {
                    // What a Warren server without a certificate does to a ClientHello.
                    io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => {
                        "the server closed the connection during the TLS handshake (does it \
                         take TLS? its transport, or one of its transports, must be \
                         \"tls\" or \"wss\")"
                    }
                    _ => "the TLS handshake with the server failed",
                };
                io_failure(what, e)
            })
    }
}

/// A server's TLS settings: its certificate.
#[derive(Clone)]
pub struct TlsServer {
    config: Arc<rustls::ServerConfig>,
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
        // No tickets: a Warren client resumes nothing (its sessions are long), a ticket is
        // one more record each connection would send for nothing, and the record layer
        // takes over the server's application keys at record 0 (see the module doc).
        config.send_tls13_tickets = 0;
        Ok(TlsServer {
            config: Arc::new(config),
        })
    }

    /// Runs the server handshake on `stream`.
    ///
    /// # Errors
    /// Socket errors and TLS failures.
    pub async fn accept(&self, stream: TcpStream) -> io::Result<TlsSession> {
        let keys = Arc::new(TrafficSecrets::default());
        let mut config = (*self.config).clone();
        config.key_log = Arc::clone(&keys) as Arc<dyn rustls::KeyLog>;
        let conn = rustls::ServerConnection::new(Arc::new(config))
            .map_err(|e| tls_failure("the TLS handshake with the client failed", e))?;
        handshake(stream, rustls::Connection::Server(conn), &keys)
            .await
            .map_err(|e| io_failure("the TLS handshake with the client failed", e))
    }
}

fn tls_failure(what: &str, error: rustls::Error) -> io::Error {
    let text = error.to_string();
    let hint = if text.contains("ProtocolVersion") || text.contains("protocol version") {
        " (Warren speaks TLS 1.3 only: enable it where the TLS ends, e.g. nginx's ssl_protocols TLSv1.2 TLSv1.3)"
    } else {
        ""
    };
    io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {text}{hint}"))
}

fn io_failure(what: &str, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// Collects one connection's application traffic secrets from rustls's key log hook.
#[derive(Default)]
struct TrafficSecrets {
    /// `CLIENT_TRAFFIC_SECRET_0`, `SERVER_TRAFFIC_SECRET_0`.
    secrets: Mutex<[Option<Vec<u8>>; 2]>,
}

impl std::fmt::Debug for TrafficSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrafficSecrets").finish_non_exhaustive()
    }
}

const CLIENT_SECRET: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_SECRET: &str = "SERVER_TRAFFIC_SECRET_0";

impl rustls::KeyLog for TrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let slot = match label {
            CLIENT_SECRET => 0,
            SERVER_SECRET => 1,
            _ => return,
        };
        if let Ok(mut secrets) = self.secrets.lock() {
            secrets[slot] = Some(secret.to_vec());
        }
    }

    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_SECRET || label == SERVER_SECRET
    }
}

impl TrafficSecrets {
    /// The sealer and opener of this side, once the handshake is done.
    fn take(&self, suite: Suite, is_client: bool) -> io::Result<(Sealer, Opener)> {
        let missing = || io::Error::other("rustls logged no application traffic secret");
        let mut secrets = self
            .secrets
            .lock()
            .map_err(|_| io::Error::other("TLS secrets poisoned by a panic"))?;
        let [client, server] = &mut *secrets;
        let client = client.take().ok_or_else(missing)?;
        let server = server.take().ok_or_else(missing)?;
        let (ours, theirs) = if is_client {
            (client, server)
        } else {
            (server, client)
        };
        let invalid = |e: record::RecordError| io::Error::new(io::ErrorKind::InvalidData, e);
        Ok((
            Sealer::new(suite, &ours).map_err(invalid)?,
            Opener::new(suite, &theirs).map_err(invalid)?,
        ))
    }
}

/// Ciphertext read from the socket and not yet consumed (`pos..end` of `buf`). No buffer
/// while empty: it goes back to the pool whenever it is drained.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl Inbox {
    /// The length of the whole record at `pos` (header and body), if it is all here;
    /// `body_len` checks the header as soon as it is in and returns the body's length.
    fn complete_record(
        &self,
        body_len: impl FnOnce([u8; HEADER_LEN]) -> io::Result<usize>,
    ) -> io::Result<Option<usize>> {
        let buffered = &self.buf[self.pos..self.end];
        let Some(header) = buffered.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = HEADER_LEN + body_len(*header)?;
        Ok((buffered.len() >= len).then_some(len))
    }

    /// Reads more of the socket after what is buffered (moving a partial record to the
    /// front first); `Ok(0)` at the peer's end.
    fn fill(&mut self, socket: &TcpStream) -> io::Result<usize> {
        if self.buf.is_empty() {
            self.buf = super::buffers::take_read();
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let result = super::records::ReadReady::try_read(socket, &mut self.buf[self.end..]);
        if let Ok(n) = result {
            self.end += n;
        }
        self.release_if_empty();
        result
    }

    fn release_if_empty(&mut self) {
        if self.pos == self.end && !self.buf.is_empty() {
            super::buffers::give_read(std::mem::take(&mut self.buf));
            self.pos = 0;
            self.end = 0;
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            super::buffers::give_read(std::mem::take(&mut self.buf));
        }
    }
}

/// The body length of a handshake-time record (any content type: rustls checks the rest).
fn handshake_body_len(header: [u8; HEADER_LEN]) -> io::Result<usize> {
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a TLS record of {len} bytes, more than TLS allows"),
        ));
    }
    Ok(len)
}

/// Runs the handshake on `socket`, feeding rustls one whole record at a time so that it
/// holds nothing of what follows, then takes the traffic secrets out of `keys`.
async fn handshake(
    socket: TcpStream,
    mut conn: rustls::Connection,
    keys: &TrafficSecrets,
) -> io::Result<TlsSession> {
    let mut inbox = Inbox::default();
    loop {
        while conn.wants_write() {
            match conn.write_tls(&mut Nonblocking(&socket)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket.writable().await?,
                Err(e) => return Err(e),
            }
        }
        if !conn.is_handshaking() {
            break;
        }
        let len = loop {
            if let Some(len) = inbox.complete_record(handshake_body_len)? {
                break len;
            }
            match inbox.fill(&socket) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the handshake",
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket.readable().await?,
                Err(e) => return Err(e),
            }
        };
        let mut record = &inbox.buf[inbox.pos..inbox.pos + len];
        while !record.is_empty() {
            if conn.read_tls(&mut record)? == 0 {
                return Err(io::Error::other(
                    "rustls took no more of a handshake record",
                ));
            }
        }
        inbox.pos += len;
        if let Err(e) = conn.process_new_packets() {
            // Tell the peer why (best effort), then fail.
            let _ = conn.write_tls(&mut Nonblocking(&socket));
            return Err(tls_failure("TLS", e));
        }
    }
    let binding = conn
        .export_keying_material([0u8; 32], BINDING_LABEL, None)
        .map_err(|e| io::Error::other(format!("TLS exporter failed: {e}")))?;
    let suite = conn
        .negotiated_cipher_suite()
        .and_then(|suite| Suite::from_rustls(suite.suite()))
        .ok_or_else(|| io::Error::other("the handshake ended without a TLS 1.3 cipher suite"))?;
    let (sealer, opener) = keys.take(suite, matches!(conn, rustls::Connection::Client(_)))?;
    inbox.release_if_empty();
    Ok(TlsSession {
        shared: Arc::new(Shared {
            socket,
            update_owed: AtomicBool::new(false),
        }),
        binding,
        sealer: Box::new(sealer),
        opener: Box::new(opener),
        inbox,
    })
}

/// An established TLS connection, before it is split.
pub struct TlsSession {
    shared: Arc<Shared>,
    binding: [u8; 32],
    // Boxed: aws-lc's expanded keys are hundreds of bytes, and the halves sit in enums.
    sealer: Box<Sealer>,
    opener: Box<Opener>,
    /// Records that came in behind the handshake's last one.
    inbox: Inbox,
}

/// What both halves use.
struct Shared {
    socket: TcpStream,
    /// The peer asked for a key update; the writer sends one before its next record.
    update_owed: AtomicBool,
}

impl TlsSession {
    /// 32 bytes both ends of *this* TLS connection compute and nobody else can: what the
    /// `tls` transport binds its PSK proof to.
    ///
    /// (Computed when the handshake ended, before rustls was let go.)
    pub fn binding(&self) -> [u8; 32] {
        self.binding
    }

    /// The two halves.
    pub fn split(self) -> (TlsReader, TlsWriter) {
        (
            TlsReader {
                shared: Arc::clone(&self.shared),
                opener: self.opener,
                inbox: self.inbox,
                plain: 0..0,
                closed: false,
                idle_records: 0,
            },
            TlsWriter {
                shared: self.shared,
                sealer: self.sealer,
                out: Vec::new(),
                sent: 0,
                closed: false,
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

/// The read half: plaintext out of TLS records, opened in place in the inbox and copied
/// once, into the caller's buffer.
pub struct TlsReader {
    shared: Arc<Shared>,
    opener: Box<Opener>,
    inbox: Inbox,
    /// The opened content not yet handed out, within `inbox.buf`.
    plain: std::ops::Range<usize>,
    /// The peer's `close_notify` came.
    closed: bool,
    /// Records in a row that carried no data (empty ones, tickets, key updates): bounded,
    /// so a peer cannot keep a worker opening them without ever handing anything out.
    idle_records: u8,
}

/// Records in a row without data before the connection is dropped (as rustls does).
const MAX_IDLE_RECORDS: u8 = 32;

impl TlsReader {
    /// Ready when plaintext or a whole record is buffered, the peer closed, or the socket
    /// has bytes.
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.plain.is_empty() || self.closed || !matches!(self.next_record(), Ok(None)) {
            return Poll::Ready(Ok(()));
        }
        self.shared.socket.poll_read_ready(cx)
    }

    /// Hands out opened plaintext, reading and opening more records while there is none;
    /// `WouldBlock` once the socket is drained.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.plain.is_empty() {
                let n = buf.len().min(self.plain.len());
                let from = self.plain.start;
                buf[..n].copy_from_slice(&self.inbox.buf[from..from + n]);
                self.plain.start += n;
                if self.plain.is_empty() {
                    self.inbox.release_if_empty();
                }
                return Ok(n);
            }
            if self.closed {
                return Ok(0);
            }
            if let Some(len) = self.next_record()? {
                self.open_next(len)?;
                continue;
            }
            match self.inbox.fill(&self.shared.socket) {
                // A TCP end without close_notify: the records above say whether anything
                // was cut (a stream's `End`, a channel's `Close`), so this is EOF too,
                // unless it cut a TLS record.
                Ok(0) if self.inbox.pos == self.inbox.end => return Ok(0),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended inside a TLS record",
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The length of the whole record at the inbox's front, if it is all here. Its header
    /// is checked as soon as it is: bytes that are not TLS fail at once, not at the end.
    fn next_record(&self) -> io::Result<Option<usize>> {
        self.inbox.complete_record(|header| {
            Opener::parse_header(header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        })
    }

    /// Opens the whole record of `len` bytes at the inbox's front.
    fn open_next(&mut self, len: usize) -> io::Result<()> {
        let invalid = |e: record::RecordError| io::Error::new(io::ErrorKind::InvalidData, e);
        let at = self.inbox.pos;
        let (header, body) = self.inbox.buf[at..at + len].split_at_mut(HEADER_LEN);
        let header: [u8; HEADER_LEN] = (&*header).try_into().expect("split at HEADER_LEN");
        let opened = self.opener.open(header, body).map_err(invalid)?;
        self.inbox.pos += len;
        if self.opener.take_update_request() {
            self.shared.update_owed.store(true, Ordering::Release);
        }
        match opened {
            Opened::Data(n) if n > 0 => {
                self.plain = at + HEADER_LEN..at + HEADER_LEN + n;
                self.idle_records = 0;
            }
            Opened::Closed => self.closed = true,
            Opened::Data(_) | Opened::Nothing => {
                self.idle_records += 1;
                if self.idle_records > MAX_IDLE_RECORDS {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "more than 32 TLS records in a row without data",
                    ));
                }
            }
        }
        if self.plain.is_empty() {
            self.inbox.release_if_empty();
        }
        Ok(())
    }
}

/// The write half: plaintext into TLS records, sealed in place in one buffer per write.
pub struct TlsWriter {
    shared: Arc<Shared>,
    sealer: Box<Sealer>,
    /// Sealed records not yet written (`sent..`). No buffer while idle.
    out: Vec<u8>,
    sent: usize,
    /// `close_notify` is sealed.
    closed: bool,
}

/// Content taken per write: five full records, so one 64 KiB Warren record (with its
/// header) goes out in one syscall instead of four plus a tiny fifth.
const WRITE_BATCH: usize = 5 * MAX_CONTENT;

impl TlsWriter {
    /// Writes out every sealed record; pending while the socket is full.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            match self.shared.socket.try_write(&self.out[self.sent..]) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.shared.socket.poll_write_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        if !self.out.is_empty() {
            super::buffers::give_write(std::mem::take(&mut self.out));
            self.sent = 0;
        }
        Poll::Ready(Ok(()))
    }

    /// Seals `records` (appended to `out`) and starts writing them.
    fn seal(
        &mut self,
        records: impl FnOnce(&mut Sealer, &mut Vec<u8>) -> Result<(), record::RecordError>,
    ) -> io::Result<()> {
        if self.out.is_empty() {
            self.out = super::buffers::take_write();
        }
        if self.shared.update_owed.swap(false, Ordering::AcqRel) {
            self.sealer
                .key_update(&mut self.out, false)
                .map_err(io::Error::other)?;
        }
        records(&mut self.sealer, &mut self.out).map_err(io::Error::other)?;
        // Start sending now; what the socket does not take goes out with the next write
        // or the flush.
        while self.sent < self.out.len() {
            match self.shared.socket.try_write(&self.out[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    /// Gathers the slices into records (a record may span slices): a WebSocket frame's
    /// header and payload go out without being joined first.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(WRITE_BATCH);
        this.seal(|sealer, out| {
            let mut left = total;
            // Where the record being filled starts, and the content it still takes.
            let mut open: Option<(usize, usize)> = None;
            for slice in bufs {
                let mut slice = &slice[..slice.len().min(left)];
                left -= slice.len();
                while !slice.is_empty() {
                    let (start, room) = *open.get_or_insert_with(|| {
                        let start = out.len();
                        out.extend_from_slice(&[0; HEADER_LEN]);
                        (start, MAX_CONTENT)
                    });
                    let take = room.min(slice.len());
                    out.extend_from_slice(&slice[..take]);
                    slice = &slice[take..];
                    open = Some((start, room - take));
                    if room == take {
                        sealer.seal(out, start)?;
                        open = None;
                    }
                }
            }
            if let Some((start, _)) = open {
                sealer.seal(out, start)?;
            }
            Ok(())
        })?;
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if !this.closed {
            this.closed = true;
            this.seal(|sealer, out| sealer.close_notify(out))?;
            ready!(this.poll_drain(cx))?;
        }
        let _ = socket2::SockRef::from(&this.shared.socket).shutdown(std::net::Shutdown::Write);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    //! Our records against rustls's own on the other end: the wire is plain TLS 1.3.

    use std::time::Duration;

    use rand::RngCore;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::transport::quic::certs;
    use crate::transport::wire::{Source, poll_read_source};

    const LIMIT: Duration = Duration::from_secs(20);

    fn cert() -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let issued = certs::self_signed(&["localhost".to_owned()]).expect("certificate");
        let key = issued.private_key().expect("key");
        (vec![issued.cert_der.clone()], key)
    }

    fn payload(len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        rand::rng().fill_bytes(&mut bytes);
        bytes
    }

    impl Source for TlsReader {
        fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            TlsReader::poll_read_ready(self, cx)
        }
        fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            TlsReader::try_read(self, buf)
        }
    }

    async fn read_exact(reader: &mut TlsReader, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            let mut buf = tokio::io::ReadBuf::new(&mut got[filled..]);
            std::future::poll_fn(|cx| poll_read_source(reader, cx, &mut buf))
                .await
                .expect("read");
            let n = buf.filled().len();
            assert!(n > 0, "EOF after {filled} of {len} bytes");
            filled += n;
        }
        got
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    /// Our server, rustls's client (which asks for a key update midway): data both ways,
    /// bytes checked, then `close_notify` both ways.
    #[tokio::test]
    async fn our_server_talks_to_a_rustls_client_across_key_updates() {
        use rustls::crypto::aws_lc_rs::cipher_suite::{
            TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
        };
        // Each suite: the key schedule's hash (SHA-384 for AES-256) and AEAD must match.
        for suite in [
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
        ] {
            let mut only = (*provider()).clone();
            only.cipher_suites = vec![suite];
            let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(only))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinVerifier::new(CertPin::Any)))
                .with_no_client_auth();
            config.alpn_protocols = vec![ALPN.to_vec()];
            talk_to_a_rustls_client(Arc::new(config), suite.suite()).await;
        }
    }

    async fn talk_to_a_rustls_client(
        config: Arc<rustls::ClientConfig>,
        suite: rustls::CipherSuite,
    ) {
        tokio::time::timeout(LIMIT, async {
            let (chain, key) = cert();
            let server = TlsServer::new(chain, key).unwrap();
            let (client_tcp, server_tcp) = pair().await;
            let connector = tokio_rustls::TlsConnector::from(config);
            let name = ServerName::try_from("localhost").unwrap();
            let (ours, theirs) = tokio::join!(
                server.accept(server_tcp),
                connector.connect(name, client_tcp)
            );
            let (mut reader, mut writer) = ours.unwrap().split();
            let mut theirs = theirs.unwrap();
            let negotiated = theirs.get_ref().1.negotiated_cipher_suite().unwrap();
            assert_eq!(negotiated.suite(), suite);

            let up = payload(200_000);
            let down = payload(300_000);
            theirs.write_all(&up[..100_000]).await.unwrap();
            theirs.get_mut().1.refresh_traffic_keys().unwrap();
            theirs.write_all(&up[100_000..]).await.unwrap();
            theirs.flush().await.unwrap();
            assert_eq!(read_exact(&mut reader, up.len()).await, up);

            // Our first record after their update answers it with one of ours.
            let send = async {
                writer.write_all(&down).await.unwrap();
                writer.shutdown().await.unwrap();
            };
            let receive = async {
                let mut got = Vec::new();
                theirs.read_to_end(&mut got).await.unwrap();
                got
            };
            let ((), got) = tokio::join!(send, receive);
            assert_eq!(got, down);
            theirs.shutdown().await.unwrap();
            let mut end = [0u8; 1];
            let mut buf = tokio::io::ReadBuf::new(&mut end);
            std::future::poll_fn(|cx| poll_read_source(&mut reader, cx, &mut buf))
                .await
                .unwrap();
            assert!(buf.filled().is_empty(), "close_notify reads as the end");
        })
        .await
        .expect("in time");
    }

    /// Our client, rustls's server with its default two tickets: the tickets are skipped,
    /// our own key update (asked for by the server) is followed.
    #[tokio::test]
    async fn our_client_talks_to_a_rustls_server_that_sends_tickets() {
        tokio::time::timeout(LIMIT, async {
            let (chain, key) = cert();
            let mut config = rustls::ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
            config.alpn_protocols = vec![ALPN.to_vec()];
            assert!(config.send_tls13_tickets > 0);
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let (client_tcp, server_tcp) = pair().await;
            let client = TlsClient::new(None, None).unwrap();
            let (ours, theirs) = tokio::join!(
                client.connect(client_tcp, "localhost"),
                acceptor.accept(server_tcp)
            );
            let (mut reader, mut writer) = ours.unwrap().split();
            let mut theirs = theirs.unwrap();

            let down = payload(70_000);
            theirs.write_all(&down).await.unwrap();
            theirs.get_mut().1.refresh_traffic_keys().unwrap();
            theirs.write_all(b"after").await.unwrap();
            theirs.flush().await.unwrap();
            assert_eq!(
                read_exact(&mut reader, down.len() + 5).await[..down.len()],
                down
            );

            let up = payload(100_000);
            writer.write_all(&up).await.unwrap();
            writer.flush().await.unwrap();
            let mut got = vec![0u8; up.len()];
            theirs.read_exact(&mut got).await.unwrap();
            assert_eq!(got, up);
        })
        .await
        .expect("in time");
    }

    /// A record cut by the end of the connection, or bytes that are not a TLS record, are
    /// errors that say so; a clean TCP end between records reads as the end.
    #[tokio::test]
    async fn a_cut_record_or_garbage_is_an_error() {
        for (bytes, expect) in [
            (
                &[23u8, 3, 3, 0, 100, 1, 2, 3][..],
                Some("inside a TLS record"),
            ),
            (&b"GET / HTTP/1.1\r\n\r\n"[..], Some("not a TLS 1.3 record")),
            (&[23u8, 3, 3, 0xff, 0xff][..], Some("length 65535")),
            (&[][..], None),
        ] {
            let (chain, key) = cert();
            let server = TlsServer::new(chain, key).unwrap();
            let client = TlsClient::new(None, None).unwrap();
            let (client_tcp, server_tcp) = pair().await;
            let (a, b) = tokio::join!(
                client.connect(client_tcp, "localhost"),
                server.accept(server_tcp)
            );
            let (_, a_writer) = a.unwrap().split();
            let (mut b_reader, _) = b.unwrap().split();
            let socket = &a_writer.shared.socket;
            socket.writable().await.unwrap();
            assert_eq!(socket.try_write(bytes).unwrap(), bytes.len());
            socket2::SockRef::from(socket)
                .shutdown(std::net::Shutdown::Write)
                .unwrap();
            let mut buf = [0u8; 64];
            let mut read = tokio::io::ReadBuf::new(&mut buf);
            let result = tokio::time::timeout(
                LIMIT,
                std::future::poll_fn(|cx| poll_read_source(&mut b_reader, cx, &mut read)),
            )
            .await
            .expect("in time");
            match expect {
                Some(text) => {
                    let error = result.expect_err("an error");
                    assert!(error.to_string().contains(text), "{error}");
                }
                None => {
                    result.expect("a clean end");
                    assert!(read.filled().is_empty());
                }
            }
        }
    }

    /// A peer that sends record after record with nothing in them is cut off, not served
    /// forever.
    #[tokio::test]
    async fn endless_empty_records_end_the_connection() {
        let (chain, key) = cert();
        let server = TlsServer::new(chain, key).unwrap();
        let client = TlsClient::new(None, None).unwrap();
        let (client_tcp, server_tcp) = pair().await;
        let (a, b) = tokio::join!(
            client.connect(client_tcp, "localhost"),
            server.accept(server_tcp)
        );
        let (_, mut a_writer) = a.unwrap().split();
        let (mut b_reader, _) = b.unwrap().split();
        a_writer.write_all(b"data first").await.unwrap();
        let mut wire = Vec::new();
        for _ in 0..=MAX_IDLE_RECORDS {
            let start = wire.len();
            wire.extend_from_slice(&[0; HEADER_LEN]);
            a_writer.sealer.seal(&mut wire, start).unwrap();
        }
        let socket = &a_writer.shared.socket;
        socket.writable().await.unwrap();
        assert_eq!(socket.try_write(&wire).unwrap(), wire.len());
        let mut buf = [0u8; 64];
        let mut read = tokio::io::ReadBuf::new(&mut buf);
        let mut result = Ok(());
        // The data record sent first is handed out; then the empty ones end it.
        for _ in 0..2 {
            result = tokio::time::timeout(
                LIMIT,
                std::future::poll_fn(|cx| poll_read_source(&mut b_reader, cx, &mut read)),
            )
            .await
            .expect("in time");
            if result.is_err() {
                break;
            }
        }
        let error = result.expect_err("an error");
        assert!(error.to_string().contains("without data"), "{error}");
    }

    /// One vectored write of slices of odd sizes becomes full records spanning them.
    #[tokio::test]
    async fn a_vectored_write_fills_records_across_slices() {
        let (chain, key) = cert();
        let server = TlsServer::new(chain, key).unwrap();
        let client = TlsClient::new(None, None).unwrap();
        let (client_tcp, server_tcp) = pair().await;
        let (a, b) = tokio::join!(
            client.connect(client_tcp, "localhost"),
            server.accept(server_tcp)
        );
        let (_, mut a_writer) = a.unwrap().split();
        let (mut b_reader, _) = b.unwrap().split();
        let bytes = payload(70_003);
        let slices = [
            io::IoSlice::new(&bytes[..3]),
            io::IoSlice::new(&bytes[3..20_003]),
            io::IoSlice::new(&[]),
            io::IoSlice::new(&bytes[20_003..]),
        ];
        assert!(a_writer.is_write_vectored());
        assert_eq!(a_writer.write_vectored(&slices).await.unwrap(), bytes.len());
        a_writer.flush().await.unwrap();
        let got = tokio::time::timeout(LIMIT, read_exact(&mut b_reader, bytes.len()))
            .await
            .expect("in time");
        assert_eq!(got, bytes);
    }

    /// A server that drops a ClientHello (a Warren server without a certificate does)
    /// gets an error that says what to check.
    #[tokio::test]
    async fn a_server_that_refuses_tls_gets_a_hint() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            socket.readable().await.unwrap();
            drop(socket);
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let client = TlsClient::new(None, None).unwrap();
        let error = tokio::time::timeout(LIMIT, client.connect(stream, "localhost"))
            .await
            .expect("in time")
            .err()
            .expect("an error");
        assert!(
            error.to_string().contains("must be \"tls\" or \"wss\""),
            "{error}"
        );
        server.await.unwrap();
    }

    /// Our client and our server agree on the exporter and on every byte.
    #[tokio::test]
    async fn our_two_ends_share_the_binding_and_the_bytes() {
        tokio::time::timeout(LIMIT, async {
            let (chain, key) = cert();
            let server = TlsServer::new(chain, key).unwrap();
            let client = TlsClient::new(None, None).unwrap();
            let (client_tcp, server_tcp) = pair().await;
            let (a, b) = tokio::join!(
                client.connect(client_tcp, "localhost"),
                server.accept(server_tcp)
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.binding(), b.binding());
            let (_, mut a_writer) = a.split();
            let (mut b_reader, _) = b.split();
            let bytes = payload(1 << 20);
            let (_, got) = tokio::join!(
                async { a_writer.write_all(&bytes).await.unwrap() },
                read_exact(&mut b_reader, bytes.len())
            );
            assert_eq!(got, bytes);
        })
        .await
        .expect("in time");
    }
}
