//! WebSocket (RFC 6455) for the `ws` and `wss` transports: Warren's records ride inside
//! binary frames, so a CDN or a reverse proxy that passes WebSocket upgrades (nginx
//! `proxy_pass` with `Upgrade`) can carry a tunnel.
//!
//! * [`client_upgrade`] and [`server_upgrade`]: the HTTP/1.1 upgrade on the base halves
//!   ([`BaseReader`], [`BaseWriter`]), TCP or TLS. A server answers requests that are not an
//!   upgrade at its path with a plain page (or 404) so the port looks like a web server.
//! * [`framed`]: the two halves after the upgrade. [`WsReader`] is a [`Source`] of the
//!   payload bytes of binary frames; [`WsWriter`] turns each write into one binary frame.
//!
//! Why the framing is written here rather than taken from tungstenite: on the data path the
//! record reader hands its own buffer to [`Source::try_read`], and the payload lands there
//! directly, unmasked in place, with frame headers parsed between the reads. No intermediate
//! buffer, and none held while idle, since the reader waits for readiness without one.
//! tungstenite reads whole messages into a `Vec` per message, and its single stream would
//! need a lock to be used by a reading task and a writing task at once.
//!
//! Message boundaries mean nothing here: records are a byte stream, and intermediaries may
//! re-fragment frames, so binary frames and their continuations are read as one stream.
//! Text frames and extensions are refused: Warren never negotiates them.
//!
//! Neither handshake has a deadline of its own: every wait in them is bounded by the caller,
//! which wraps the whole upgrade in its handshake timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::wire::{BaseReader, BaseWriter, Source, poll_read_source};

/// Most payload bytes one [`WsWriter`] write puts in a frame: a full record and then some,
/// so records are not split across frames.
pub const MAX_FRAME_PAYLOAD: usize = 64 * 1024 + 64;

/// Longest frame header: 2 bytes, a 64-bit length and a masking key.
const MAX_FRAME_HEAD: usize = 14;

/// Longest control frame payload (RFC 6455 §5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// How long a writer with a stream to carry stays silent before it pings: under nginx's
/// default `proxy_read_timeout` (60 s) and the 100 s after which Cloudflare closes an idle
/// WebSocket, so a stream that is quiet for minutes (an SSH session) is not cut by them.
pub const PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest HTTP head either side reads during the upgrade.
const MAX_HTTP_HEAD: usize = 8 * 1024;

/// Most header lines in an HTTP head (CDNs add a few of their own).
const MAX_HTTP_HEADERS: usize = 96;

/// Appended to the client's key before hashing it into `Sec-WebSocket-Accept` (§1.3).
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The one protocol version there is (§4.1).
const VERSION: &str = "13";

/// Close status "normal closure" (§7.4.1).
const CLOSE_NORMAL: u16 = 1000;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

const FIN: u8 = 0x80;
const RSV: u8 = 0x70;
const MASK: u8 = 0x80;

/// Which end of the WebSocket this is: clients mask what they send, servers do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that sent the upgrade request.
    Client,
    /// The side that answered it.
    Server,
}

/// A ping's payload, passed from the reader (which sees the ping) to the writer (which owes
/// the pong). The flag lets the writer's hot path check an atomic instead of a lock.
#[derive(Default)]
struct PongSlot {
    pending: AtomicBool,
    payload: Mutex<Option<Vec<u8>>>,
    /// Wakes a writer waiting idle
    /// ([`keepalive_due`](super::wire::Keepalive::keepalive_due)) to send the pong.
    posted: tokio::sync::Notify,
}

impl PongSlot {
    /// Only the latest ping needs an answer (§5.5.3), so a new one replaces an unsent one.
    fn post(&self, payload: &[u8]) {
        *self.payload.lock().unwrap_or_else(PoisonError::into_inner) = Some(payload.to_vec());
        self.pending.store(true, Ordering::Release);
        self.posted.notify_one();
    }

    fn take(&self) -> Option<Vec<u8>> {
        if !self.pending.swap(false, Ordering::Acquire) {
            return None;
        }
        self.payload
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Where a [`WsReader`] is in the frame stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadState {
    /// Collecting a frame header in `head`.
    Head,
    /// Inside a frame's payload.
    Payload,
    /// A Close frame came (or the stream ended): EOF from now on.
    Closed,
    /// The peer broke the protocol; every read fails.
    Failed,
}

/// Binary frames in, bytes out: a [`Source`] of the payload of the peer's binary frames.
///
/// Nothing is buffered but a partial frame header and a partial control frame: payload goes
/// straight into the caller's buffer, so readiness is the inner source's.
pub struct WsReader<R> {
    inner: R,
    role: Role,
    pong: Arc<PongSlot>,
    state: ReadState,
    /// A frame header that may arrive split across reads.
    head: [u8; MAX_FRAME_HEAD],
    head_len: usize,
    /// Opcode of the frame being read.
    opcode: u8,
    /// Payload bytes of the frame still to come.
    remaining: u64,
    /// The frame's masking key, if masked.
    mask: Option<[u8; 4]>,
    /// Payload bytes of the frame already unmasked, mod 4: where the key resumes.
    mask_offset: usize,
    /// A data message (binary, then continuations) has started and not finished.
    in_message: bool,
    /// The payload of the control frame being read (control frames are not data).
    control: [u8; MAX_CONTROL_PAYLOAD],
    control_len: usize,
}

/// Bytes in, binary frames out.
///
/// Each write becomes one binary frame with FIN set, built in `out` (masked there by a
/// client) so a write the socket takes only in part resumes where it stopped.
pub struct WsWriter<W> {
    inner: W,
    role: Role,
    pong: Arc<PongSlot>,
    /// Whole frames not yet written, from `sent`.
    out: Vec<u8>,
    sent: usize,
    /// A Close frame has been queued: nothing may follow it.
    closed: bool,
    /// When the next keepalive ping is due; made at the first idle wait (a writer that
    /// never waits idle never needs one).
    ping_at: Option<Pin<Box<tokio::time::Sleep>>>,
    /// How long between pings.
    ping_interval: std::time::Duration,
}

/// Frames the two halves of an upgraded connection.
pub fn framed<R: Source, W: AsyncWrite + Unpin + Send>(
    reader: R,
    writer: W,
    role: Role,
) -> (WsReader<R>, WsWriter<W>) {
    let pong = Arc::new(PongSlot::default());
    (
        WsReader {
            inner: reader,
            role,
            pong: pong.clone(),
            state: ReadState::Head,
            head: [0; MAX_FRAME_HEAD],
            head_len: 0,
            opcode: OP_BINARY,
            remaining: 0,
            mask: None,
            mask_offset: 0,
            in_message: false,
            control: [0; MAX_CONTROL_PAYLOAD],
            control_len: 0,
        },
        WsWriter {
            inner: writer,
            role,
            pong,
            out: Vec::new(),
            sent: 0,
            closed: false,
            ping_at: None,
            ping_interval: PING_INTERVAL,
        },
    )
}

/// XORs `data` with `key`, starting `offset` bytes into the key: 8 bytes at a time.
fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    let mut key = key;
    key.rotate_left(offset & 3);
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let (words, rest) = data.as_chunks_mut::<8>();
    for word in words {
        *word = (u64::from_ne_bytes(*word) ^ wide).to_ne_bytes();
    }
    // Whole words keep the key aligned, so the tail starts at key[0].
    for (byte, k) in rest.iter_mut().zip(key.iter().cycle()) {
        *byte ^= k;
    }
}

/// The header of a frame with FIN set: its bytes and length.
fn frame_head(opcode: u8, len: usize, key: Option<[u8; 4]>) -> ([u8; MAX_FRAME_HEAD], usize) {
    let mask_bit = if key.is_some() { MASK } else { 0 };
    let mut head = [0u8; MAX_FRAME_HEAD];
    head[0] = FIN | opcode;
    let mut at = 2;
    if len < 126 {
        // `len < 126`: the cast keeps it.
        head[1] = mask_bit | len as u8;
    } else if let Ok(short) = u16::try_from(len) {
        head[1] = mask_bit | 126;
        head[2..4].copy_from_slice(&short.to_be_bytes());
        at = 4;
    } else {
        head[1] = mask_bit | 127;
        head[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        at = 10;
    }
    if let Some(key) = key {
        head[at..at + 4].copy_from_slice(&key);
        at += 4;
    }
    (head, at)
}

/// Length of the frame header whose second byte is `second`.
fn head_size(second: u8) -> usize {
    let length = match second & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & MASK != 0 { 4 } else { 0 };
    2 + length + mask
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("WebSocket: {message}"))
}

impl<R> WsReader<R> {
    /// The reader below the frames.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Decodes the `len` bytes just read into `buf`: payload moves down to the front of
    /// `buf` (unmasked), headers and control frames are taken out. Returns how many
    /// payload bytes there are.
    fn decode(&mut self, buf: &mut [u8], len: usize) -> io::Result<usize> {
        let mut src = 0;
        let mut dst = 0;
        while src < len {
            match self.state {
                ReadState::Head => {
                    let want = if self.head_len < 2 {
                        2
                    } else {
                        head_size(self.head[1])
                    };
                    let take = (want - self.head_len).min(len - src);
                    self.head[self.head_len..self.head_len + take]
                        .copy_from_slice(&buf[src..src + take]);
                    self.head_len += take;
                    src += take;
                    if self.head_len >= 2 && self.head_len == head_size(self.head[1]) {
                        self.start_frame()?;
                    }
                }
                ReadState::Payload => {
                    // Bounded by `len - src`, so the cast cannot truncate.
                    let take = self.remaining.min((len - src) as u64) as usize;
                    if self.opcode & 0x8 != 0 {
                        self.control[self.control_len..self.control_len + take]
                            .copy_from_slice(&buf[src..src + take]);
                        self.control_len += take;
                    } else {
                        if src != dst {
                            buf.copy_within(src..src + take, dst);
                        }
                        if let Some(key) = self.mask {
                            apply_mask(&mut buf[dst..dst + take], key, self.mask_offset);
                            self.mask_offset = (self.mask_offset + take) & 3;
                        }
                        dst += take;
                    }
                    src += take;
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.end_frame();
                    }
                }
                // Whatever follows a Close frame is not part of the stream.
                ReadState::Closed | ReadState::Failed => break,
            }
        }
        Ok(dst)
    }

    /// Checks the header in `head` and starts reading its payload.
    fn start_frame(&mut self) -> io::Result<()> {
        let [first, second, ..] = self.head;
        if first & RSV != 0 {
            return Err(invalid(
                "the peer set reserved bits (an extension Warren did not offer)",
            ));
        }
        let fin = first & FIN != 0;
        let opcode = first & 0x0f;
        let masked = second & MASK != 0;
        match (self.role, masked) {
            (Role::Server, false) => return Err(invalid("the client sent an unmasked frame")),
            (Role::Client, true) => return Err(invalid("the server sent a masked frame")),
            _ => {}
        }
        let (length, key_at) = match second & 0x7f {
            126 => (
                u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
                4,
            ),
            127 => {
                let mut bytes = [0; 8];
                bytes.copy_from_slice(&self.head[2..10]);
                (u64::from_be_bytes(bytes), 10)
            }
            short => (u64::from(short), 2),
        };
        if length >> 63 != 0 {
            return Err(invalid("a frame length has its top bit set"));
        }
        match opcode {
            OP_BINARY if self.in_message => {
                return Err(invalid("a binary frame inside an unfinished message"));
            }
            OP_CONTINUATION if !self.in_message => {
                return Err(invalid("a continuation frame with no message to continue"));
            }
            OP_BINARY | OP_CONTINUATION => self.in_message = !fin,
            OP_TEXT => {
                return Err(invalid(
                    "the peer sent a text frame; Warren carries binary frames only",
                ));
            }
            OP_CLOSE | OP_PING | OP_PONG => {
                if !fin {
                    return Err(invalid("a fragmented control frame"));
                }
                if length > MAX_CONTROL_PAYLOAD as u64 {
                    return Err(invalid("a control frame over 125 bytes"));
                }
            }
            _ => return Err(invalid("a frame with a reserved opcode")),
        }
        self.mask = masked.then(|| {
            let mut key = [0; 4];
            key.copy_from_slice(&self.head[key_at..key_at + 4]);
            key
        });
        self.opcode = opcode;
        self.remaining = length;
        self.mask_offset = 0;
        self.control_len = 0;
        self.head_len = 0;
        self.state = ReadState::Payload;
        if length == 0 {
            self.end_frame();
        }
        Ok(())
    }

    /// The frame's payload is all in: acts on control frames, then expects a header.
    fn end_frame(&mut self) {
        self.state = ReadState::Head;
        let control = &mut self.control[..self.control_len];
        if let Some(key) = self.mask {
            apply_mask(control, key, 0);
        }
        match self.opcode {
            OP_CLOSE => self.state = ReadState::Closed,
            OP_PING => self.pong.post(control),
            _ => {}
        }
    }
}

impl<R: Source> Source for WsReader<R> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.state {
            ReadState::Closed | ReadState::Failed => Poll::Ready(Ok(())),
            ReadState::Head | ReadState::Payload => self.inner.poll_read_ready(cx),
        }
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.state {
            ReadState::Closed => return Ok(0),
            ReadState::Failed => return Err(invalid("the stream failed earlier")),
            ReadState::Head | ReadState::Payload => {}
        }
        let mut filled = 0;
        loop {
            let room = &mut buf[filled..];
            if room.is_empty() {
                return Ok(filled);
            }
            // Reads end where the frame being read ends, and a header is read on its own
            // (with at most a few payload bytes behind it): so payload lands where the
            // caller wants it and is never moved down over a header, which was a copy of
            // every byte when reads spanned frames. Below is TLS (a memory copy per read)
            // or TCP (one more small read per frame: cheaper than moving 64 KiB).
            let (want, payload) = match self.state {
                ReadState::Payload => (usize::try_from(self.remaining).unwrap_or(usize::MAX), true),
                _ => (MAX_FRAME_HEAD, false),
            };
            let want = want.min(room.len());
            let n = match self.inner.try_read(&mut room[..want]) {
                Ok(n) => n,
                Err(e) if filled > 0 && e.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(filled);
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                if filled > 0 {
                    // The end shows again on the next read.
                    return Ok(filled);
                }
                let mid_frame = self.state == ReadState::Payload || self.head_len > 0;
                self.state = ReadState::Closed;
                if mid_frame {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "WebSocket: the connection ended in the middle of a frame",
                    ));
                }
                return Ok(0);
            }
            filled += self.decode(room, n).inspect_err(|_| {
                self.state = ReadState::Failed;
            })?;
            // Bytes that held only headers, control frames or empty frames are no EOF:
            // read on until data, WouldBlock or the Close. After a header, read on into
            // its payload.
            if (payload && filled > 0) || self.state == ReadState::Closed {
                return Ok(filled);
            }
        }
    }
}

impl<R: Source + Unpin> AsyncRead for WsReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read_source(self.get_mut(), cx, buf)
    }
}

impl<W: AsyncWrite + Unpin + Send> WsWriter<W> {
    /// Appends one frame with FIN set to `out`, masked with a fresh key by a client.
    fn push_frame(&mut self, opcode: u8, payload: &[u8]) {
        let key = match self.role {
            Role::Client => Some(rand::random::<[u8; 4]>()),
            Role::Server => None,
        };
        let (head, head_len) = frame_head(opcode, payload.len(), key);
        if self.out.capacity() == 0 {
            self.out = super::buffers::take_write();
        }
        self.out.reserve(head_len + payload.len());
        self.out.extend_from_slice(&head[..head_len]);
        let start = self.out.len();
        self.out.extend_from_slice(payload);
        if let Some(key) = key {
            apply_mask(&mut self.out[start..], key, 0);
        }
    }

    /// A server's binary frame written straight from `payload`, header and payload in one
    /// vectored write, when nothing is queued: no copy into `out` (a client masks, so its
    /// frames are always built there). What the socket does not take is queued. `None`
    /// when this does not apply.
    fn poll_write_direct(
        &mut self,
        cx: &mut Context<'_>,
        payload: &[u8],
    ) -> Option<io::Result<()>> {
        if self.role != Role::Server
            || self.sent < self.out.len()
            || !self.inner.is_write_vectored()
        {
            return None;
        }
        let (head, head_len) = frame_head(OP_BINARY, payload.len(), None);
        let slices = [
            io::IoSlice::new(&head[..head_len]),
            io::IoSlice::new(payload),
        ];
        let written = match Pin::new(&mut self.inner).poll_write_vectored(cx, &slices) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Some(Err(e)),
            Poll::Pending => 0,
        };
        if written < head_len + payload.len() {
            if self.out.capacity() == 0 {
                self.out = super::buffers::take_write();
            }
            if written < head_len {
                self.out.extend_from_slice(&head[written..head_len]);
                self.out.extend_from_slice(payload);
            } else {
                self.out.extend_from_slice(&payload[written - head_len..]);
            }
        }
        Some(Ok(()))
    }

    /// Completes when a keepalive ping is due: [`PING_INTERVAL`] after the previous ping
    /// (or after the first call). Not pushed back by data in between: a ping every 30 s on
    /// a busy connection costs nothing, and re-arming a timer on every idle wait would.
    /// Cancel safe.
    pub async fn ping_due(&mut self) {
        let interval = self.ping_interval;
        let at = self
            .ping_at
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(interval)));
        at.as_mut().await;
    }

    /// Whether the keepalive timer has fired (a ping is owed).
    fn ping_elapsed(&self) -> bool {
        self.ping_at.as_ref().is_some_and(|at| at.is_elapsed())
    }

    /// Pings every `interval` instead of [`PING_INTERVAL`].
    pub fn set_ping_interval(&mut self, interval: std::time::Duration) {
        self.ping_interval = interval;
    }

    /// Sends a ping (with a pong owed to the peer, if any) and flushes it.
    ///
    /// # Errors
    /// The connection's write error.
    pub async fn ping(&mut self) -> io::Result<()> {
        if let Some(at) = &mut self.ping_at {
            at.as_mut()
                .reset(tokio::time::Instant::now() + self.ping_interval);
        }
        if self.closed {
            return Ok(());
        }
        std::future::poll_fn(|cx| self.poll_drain(cx)).await?;
        self.push_pong();
        self.push_frame(OP_PING, b"");
        self.flush().await
    }

    /// Queues the pong the reader asked for, if any.
    fn push_pong(&mut self) {
        if let Some(payload) = self.pong.take()
            && !self.closed
        {
            self.push_frame(OP_PONG, &payload);
        }
    }

    /// Writes out every queued frame.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent = 0;
        // An idle writer holds no buffer (as the record writer below it does not).
        if self.out.capacity() != 0 {
            super::buffers::give_write(std::mem::take(&mut self.out));
        }
        Poll::Ready(Ok(()))
    }
}

/// An idle writer sends the pong the peer's ping asked for at once, and a ping of its own
/// every ping interval.
impl<W: AsyncWrite + Unpin + Send> super::wire::Keepalive for WsWriter<W> {
    async fn keepalive_due(&mut self) {
        let pong = Arc::clone(&self.pong);
        tokio::select! {
            () = self.ping_due() => {}
            () = pong.posted.notified() => {}
        }
    }

    async fn send_keepalive(&mut self) -> io::Result<()> {
        if self.ping_elapsed() {
            return self.ping().await;
        }
        // Only a pong (it may have left with data already: then this flushes nothing).
        self.flush().await
    }
}

impl<W: AsyncWrite + Unpin + Send> AsyncWrite for WsWriter<W> {
    /// Takes at most [`MAX_FRAME_PAYLOAD`] bytes as one frame. Pending only while earlier
    /// frames still wait for the socket; what the socket does not take of this frame is
    /// written on the next call.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if this.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "WebSocket: write after close",
            )));
        }
        this.push_pong();
        let n = buf.len().min(MAX_FRAME_PAYLOAD);
        if n > 0 {
            match this.poll_write_direct(cx, &buf[..n]) {
                Some(Ok(())) => {}
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => this.push_frame(OP_BINARY, &buf[..n]),
            }
        }
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        this.push_pong();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    /// Sends a Close frame (normal closure), then shuts the connection's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if !this.closed {
            this.push_frame(OP_CLOSE, &CLOSE_NORMAL.to_be_bytes());
            this.closed = true;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// A server's WebSocket settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsServer {
    /// The path upgrades must ask for (`/warren`).
    pub path: String,
    /// Answer other HTTP requests with a plain page (else 404).
    pub decoy: bool,
    /// How long a connection carrying a stream may stay silent before the server pings.
    pub ping_interval: std::time::Duration,
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
    /// Our own settings cannot be put in a request (a host or path with spaces or line
    /// breaks).
    #[error("{0}")]
    Settings(String),
}

/// How reading an HTTP head went wrong.
enum HeadError {
    Io(io::Error),
    /// The stream ended after `read` bytes, before the head did.
    Eof {
        read: usize,
    },
    /// Not HTTP.
    Invalid(httparse::Error),
    /// Over [`MAX_HTTP_HEAD`] bytes.
    TooLarge,
}

/// Reads an HTTP head that `parse` recognises, at most [`MAX_HTTP_HEAD`] bytes; bytes read
/// past it go back to `reader`. Returns the head.
async fn read_head(
    reader: &mut BaseReader,
    parse: fn(&[u8]) -> httparse::Result<usize>,
) -> Result<Vec<u8>, HeadError> {
    let mut buf = vec![0; MAX_HTTP_HEAD];
    let mut filled = 0;
    loop {
        let n = reader
            .read(&mut buf[filled..])
            .await
            .map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Eof { read: filled });
        }
        filled += n;
        match parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(len)) => {
                reader.unread(&buf[len..filled]);
                buf.truncate(len);
                return Ok(buf);
            }
            Ok(httparse::Status::Partial) if filled == MAX_HTTP_HEAD => {
                return Err(HeadError::TooLarge);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(HeadError::Invalid(e)),
        }
    }
}

fn parse_response(head: &[u8]) -> httparse::Result<usize> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    httparse::Response::new(&mut headers).parse(head)
}

fn parse_request(head: &[u8]) -> httparse::Result<usize> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    httparse::Request::new(&mut headers).parse(head)
}

/// Values of every `name` header, trimmed.
fn header_values<'h>(
    headers: &'h [httparse::Header<'_>],
    name: &'h str,
) -> impl Iterator<Item = &'h [u8]> {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.trim_ascii())
}

/// Whether a `name` header lists `token` (comma-separated, any case).
fn has_token(headers: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    header_values(headers, name).any(|value| {
        value
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
fn accept_key(key: &[u8]) -> String {
    let mut input = Vec::with_capacity(key.len() + ACCEPT_GUID.len());
    input.extend_from_slice(key);
    input.extend_from_slice(ACCEPT_GUID);
    let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    BASE64.encode(hash.as_ref())
}

/// Client: asks for the upgrade at `path` naming `host`, and checks the answer. Bytes the
/// server sent after its answer stay in `reader` for the frames.
///
/// Waits on the server with no deadline: the caller bounds the whole upgrade.
///
/// # Errors
/// [`WsError::Refused`] when the server answers anything but a valid upgrade (or not HTTP),
/// [`WsError::Malformed`] for a broken or oversized answer, [`WsError::Settings`] for a
/// host or path that cannot be sent, [`WsError::Io`] when the connection fails.
pub async fn client_upgrade(
    reader: &mut BaseReader,
    writer: &mut BaseWriter,
    host: &str,
    path: &str,
) -> Result<(), WsError> {
    let unsendable = |s: &str| s.is_empty() || s.bytes().any(|b| b.is_ascii_whitespace());
    if unsendable(host) {
        return Err(WsError::Settings(format!(
            "the WebSocket host {host:?} is empty or holds spaces"
        )));
    }
    if unsendable(path) || !path.starts_with('/') {
        return Err(WsError::Settings(format!(
            "the WebSocket path {path:?} must start with / and hold no spaces"
        )));
    }
    let key = BASE64.encode(rand::random::<[u8; 16]>());
    let request = format!(
        "GET {path} HTTP/1.1\r\n\
         Host: {host}\r\n\
         Upgrade: websocket\r\n\
         Connection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\n\
         Sec-WebSocket-Version: {VERSION}\r\n\
         User-Agent: warren/{}\r\n\
         \r\n",
        env!("CARGO_PKG_VERSION")
    );
    writer.write_all(request.as_bytes()).await?;
    writer.flush().await?;
    let head = match read_head(reader, parse_response).await {
        Ok(head) => head,
        Err(HeadError::Io(e)) => return Err(WsError::Io(e)),
        Err(HeadError::Eof { read: 0 }) => {
            return Err(WsError::Refused(
                "the server closed the connection without answering the WebSocket upgrade: \
                 is this a ws/wss port (and wss, not ws, if it expects TLS)?"
                    .to_owned(),
            ));
        }
        Err(HeadError::Eof { .. }) => {
            return Err(WsError::Malformed(
                "the server's answer to the WebSocket upgrade ended in its HTTP head".to_owned(),
            ));
        }
        Err(HeadError::Invalid(_)) => {
            return Err(WsError::Refused(
                "the server did not answer with HTTP: is this a ws/wss port?".to_owned(),
            ));
        }
        Err(HeadError::TooLarge) => {
            return Err(WsError::Malformed(format!(
                "the server's answer to the WebSocket upgrade has an HTTP head over {} KiB",
                MAX_HTTP_HEAD / 1024
            )));
        }
    };
    check_response(&head, key.as_bytes(), path)
}

/// Checks the server's answer to our upgrade request.
fn check_response(head: &[u8], key: &[u8], path: &str) -> Result<(), WsError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    if !matches!(response.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(WsError::Malformed(
            "the server's HTTP answer could not be parsed".to_owned(),
        ));
    }
    let code = response.code.unwrap_or(0);
    let reason = response.reason.unwrap_or("");
    let headers = response.headers;
    let refused = |hint: &str| {
        WsError::Refused(format!(
            "the server answered {code} {reason} to the WebSocket upgrade at {path}: {hint}"
        ))
    };
    match code {
        101 => {}
        404 | 200 => {
            // A decoy page answers 200 to anything that is not an upgrade at its path.
            return Err(refused(
                "is [client.ws] path the same as the server's [server.ws] path, and does \
                 any proxy in front pass the Upgrade and Connection headers on?",
            ));
        }
        426 => return Err(refused("the server wants another WebSocket version")),
        502..=504 => {
            return Err(refused(
                "a proxy in front could not reach the Warren server behind it: is it running?",
            ));
        }
        _ => {
            return Err(refused(
                "is this a Warren ws/wss port, and does any proxy in front pass WebSocket \
                 upgrades on?",
            ));
        }
    }
    if !has_token(headers, "upgrade", "websocket") {
        return Err(WsError::Refused(
            "the server answered 101 without `Upgrade: websocket`".to_owned(),
        ));
    }
    if !has_token(headers, "connection", "upgrade") {
        return Err(WsError::Refused(
            "the server answered 101 without `Connection: upgrade`".to_owned(),
        ));
    }
    let expected = accept_key(key);
    let mut accepts = header_values(headers, "sec-websocket-accept");
    if accepts.next() != Some(expected.as_bytes()) || accepts.next().is_some() {
        return Err(WsError::Refused(
            "the server's Sec-WebSocket-Accept does not match our key: a proxy in front \
             may not speak WebSocket"
                .to_owned(),
        ));
    }
    // We asked for neither, so the server must choose neither (§4.1).
    for name in ["sec-websocket-extensions", "sec-websocket-protocol"] {
        if header_values(headers, name).any(|v| !v.is_empty()) {
            return Err(WsError::Refused(format!(
                "the server chose a {name} Warren did not ask for"
            )));
        }
    }
    Ok(())
}

/// How the server answers one request.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// A WebSocket upgrade at our path: 101 with this accept key.
    Upgrade(String),
    /// An upgrade at our path in a version we do not speak.
    WrongVersion,
    /// An upgrade at our path with a missing or broken key.
    BadUpgrade,
    /// Anything else; `body` is false for HEAD.
    Other { body: bool },
}

/// Decides how to answer the request whose complete head is `head`.
fn reply_to(head: &[u8], ws: &WsServer) -> Option<Reply> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    if !matches!(request.parse(head), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let method = request.method.unwrap_or("");
    let target = request.path.unwrap_or("");
    let path = target.split_once('?').map_or(target, |(path, _query)| path);
    let headers = request.headers;
    let upgrade = method == "GET"
        && request.version == Some(1)
        && path == ws.path
        && has_token(headers, "upgrade", "websocket")
        && has_token(headers, "connection", "upgrade");
    if !upgrade {
        return Some(Reply::Other {
            body: method != "HEAD",
        });
    }
    let mut versions = header_values(headers, "sec-websocket-version");
    if versions.next() != Some(VERSION.as_bytes()) || versions.next().is_some() {
        return Some(Reply::WrongVersion);
    }
    let mut keys = header_values(headers, "sec-websocket-key");
    match (keys.next(), keys.next()) {
        (Some(key), None) if BASE64.decode(key).is_ok_and(|decoded| decoded.len() == 16) => {
            Some(Reply::Upgrade(accept_key(key)))
        }
        _ => Some(Reply::BadUpgrade),
    }
}

/// The decoy page: what a freshly installed web server shows.
const DECOY_PAGE: &str = "<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome</title>\n\
<style>body { width: 35em; margin: 0 auto; font-family: sans-serif; }</style>\n\
</head>\n<body>\n<h1>Welcome</h1>\n\
<p>If you see this page, the web server is installed and working.</p>\n\
</body>\n</html>\n";

const NOT_FOUND_PAGE: &str = "<html>\n<head><title>404 Not Found</title></head>\n\
<body>\n<h1>404 Not Found</h1>\n</body>\n</html>\n";

const BAD_REQUEST_PAGE: &str = "<html>\n<head><title>400 Bad Request</title></head>\n\
<body>\n<h1>400 Bad Request</h1>\n</body>\n</html>\n";

/// A complete response that ends the connection.
fn page(status: &str, page: &str, body: bool, extra: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n\
         Content-Type: text/html; charset=utf-8\r\n\
         Content-Length: {}\r\n\
         {extra}\
         Connection: close\r\n\
         \r\n\
         {}",
        page.len(),
        if body { page } else { "" }
    )
}

/// Server: reads one HTTP request head and answers it: 101 for a WebSocket upgrade at
/// `ws.path` (bytes the client sent after its head stay in `reader` for the frames); for
/// anything else the decoy page or 404, 426 for an unknown WebSocket version.
///
/// Waits on the client with no deadline: the caller bounds the whole upgrade.
///
/// # Errors
/// [`WsError::Malformed`] (after a best-effort 400) for a head that is not HTTP, is over
/// 8 KiB or ends early; [`WsError::Io`] when the connection fails.
pub async fn server_upgrade(
    reader: &mut BaseReader,
    writer: &mut BaseWriter,
    ws: &WsServer,
) -> Result<Upgrade, WsError> {
    let problem = match read_head(reader, parse_request).await {
        Ok(head) => match reply_to(&head, ws) {
            Some(reply) => return answer(writer, reply, ws).await,
            None => "the client's HTTP request could not be parsed".to_owned(),
        },
        Err(HeadError::Io(e)) => return Err(WsError::Io(e)),
        Err(HeadError::Eof { read: 0 }) => {
            return Err(WsError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed the connection before sending an HTTP request",
            )));
        }
        Err(HeadError::Eof { .. }) => {
            "the client closed the connection in the middle of its HTTP request".to_owned()
        }
        Err(HeadError::Invalid(e)) => format!("the client did not send HTTP ({e})"),
        Err(HeadError::TooLarge) => format!(
            "the client's HTTP request head is over {} KiB",
            MAX_HTTP_HEAD / 1024
        ),
    };
    // Best effort: the peer may be gone or not speak HTTP at all.
    let bad = page("400 Bad Request", BAD_REQUEST_PAGE, true, "");
    if writer.write_all(bad.as_bytes()).await.is_ok() {
        let _ = writer.flush().await;
    }
    Err(WsError::Malformed(problem))
}

/// Sends the answer `reply` calls for.
async fn answer(writer: &mut BaseWriter, reply: Reply, ws: &WsServer) -> Result<Upgrade, WsError> {
    let (response, upgrade) = match reply {
        Reply::Upgrade(accept) => (
            format!(
                "HTTP/1.1 101 Switching Protocols\r\n\
                 Upgrade: websocket\r\n\
                 Connection: Upgrade\r\n\
                 Sec-WebSocket-Accept: {accept}\r\n\
                 \r\n"
            ),
            Upgrade::WebSocket,
        ),
        Reply::WrongVersion => (
            page(
                "426 Upgrade Required",
                "",
                true,
                "Sec-WebSocket-Version: 13\r\n",
            ),
            Upgrade::NotWebSocket,
        ),
        Reply::BadUpgrade => (
            page("400 Bad Request", BAD_REQUEST_PAGE, true, ""),
            Upgrade::NotWebSocket,
        ),
        Reply::Other { body } if ws.decoy => {
            (page("200 OK", DECOY_PAGE, body, ""), Upgrade::NotWebSocket)
        }
        Reply::Other { body } => (
            page("404 Not Found", NOT_FOUND_PAGE, body, ""),
            Upgrade::NotWebSocket,
        ),
    };
    writer.write_all(response.as_bytes()).await?;
    writer.flush().await?;
    Ok(upgrade)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use rand::{Rng, RngCore};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_tungstenite::tungstenite::Message;

    use super::*;

    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (client, server) = (client.unwrap(), server.unwrap().0);
        client.set_nodelay(true).unwrap();
        server.set_nodelay(true).unwrap();
        (client, server)
    }

    fn base(stream: TcpStream) -> (BaseReader, BaseWriter) {
        crate::transport::wire::tcp_halves(stream)
    }

    fn settings(decoy: bool) -> WsServer {
        WsServer {
            path: "/warren".to_owned(),
            decoy,
            ping_interval: PING_INTERVAL,
        }
    }

    /// An in-memory source: one chunk per read, `WouldBlock` between chunks, then EOF.
    struct Script {
        chunks: VecDeque<Vec<u8>>,
        stall: bool,
    }

    impl Script {
        fn new(chunks: impl IntoIterator<Item = Vec<u8>>) -> Script {
            Script {
                chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
                stall: false,
            }
        }
    }

    impl Source for Script {
        fn poll_read_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.stall {
                self.stall = false;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let Some(mut chunk) = self.chunks.pop_front() else {
                return Ok(0);
            };
            let n = buf.len().min(chunk.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            if n < chunk.len() {
                self.chunks.push_front(chunk.split_off(n));
            } else {
                self.stall = true;
            }
            Ok(n)
        }
    }

    /// A frame whose first byte is `first`, with the payload length in `width` form (0 for
    /// the shortest), masked with `key` if given.
    fn frame_with(first: u8, payload: &[u8], key: Option<[u8; 4]>, width: u8) -> Vec<u8> {
        let mask_bit = if key.is_some() { MASK } else { 0 };
        let len = payload.len();
        let mut out = vec![first];
        match width {
            0 if len < 126 => out.push(mask_bit | len as u8),
            0 | 126 if len <= 0xffff => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        let start = out.len() + if key.is_some() { 4 } else { 0 };
        if let Some(key) = key {
            out.extend_from_slice(&key);
        }
        out.extend_from_slice(payload);
        if let Some(key) = key {
            apply_mask(&mut out[start..], key, 0);
        }
        out
    }

    fn frame(first: u8, payload: &[u8], key: Option<[u8; 4]>) -> Vec<u8> {
        frame_with(first, payload, key, 0)
    }

    /// Reads `reader` to EOF (or its first error) in reads of at most `chunk` bytes.
    fn drain<R: Source>(reader: &mut WsReader<R>, chunk: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            match reader.try_read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn script_reader(
        chunks: impl IntoIterator<Item = Vec<u8>>,
        role: Role,
    ) -> (WsReader<Script>, WsWriter<Vec<u8>>) {
        framed(Script::new(chunks), Vec::new(), role)
    }

    const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// Masked frames of every length form, split messages, a ping and a close, and the data
    /// they carry.
    fn client_stream() -> (Vec<u8>, Vec<u8>) {
        let long: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let mut stream = Vec::new();
        stream.extend(frame(FIN | OP_BINARY, b"hello", Some(KEY)));
        stream.extend(frame(FIN | OP_BINARY, b"", Some(KEY)));
        stream.extend(frame(FIN | OP_PING, b"p", Some(KEY)));
        stream.extend(frame(FIN | OP_BINARY, &long, Some([1, 2, 3, 4])));
        stream.extend(frame(OP_BINARY, b"ab", Some(KEY)));
        stream.extend(frame(FIN | OP_PONG, b"ignored", Some(KEY)));
        stream.extend(frame(FIN | OP_CONTINUATION, b"cde", Some(KEY)));
        stream.extend(frame_with(FIN | OP_BINARY, b"wide!", Some(KEY), 127));
        stream.extend(frame_with(FIN | OP_BINARY, b"mid", Some(KEY), 126));
        stream.extend(frame(FIN | OP_CLOSE, &1000u16.to_be_bytes(), Some(KEY)));
        stream.extend(frame(FIN | OP_BINARY, b"after close", Some(KEY)));
        let mut data = b"hello".to_vec();
        data.extend_from_slice(&long);
        data.extend_from_slice(b"abcdewide!mid");
        (stream, data)
    }

    #[test]
    fn unmask_matches_bytewise() {
        let mut rng = rand::rng();
        for len in 0..70 {
            for offset in 0..8 {
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                let mut expected = data.clone();
                for (i, b) in expected.iter_mut().enumerate() {
                    *b ^= KEY[(i + offset) % 4];
                }
                apply_mask(&mut data, KEY, offset);
                assert_eq!(data, expected, "len {len} offset {offset}");
            }
        }
    }

    #[test]
    fn headers_split_at_every_byte() {
        let (stream, data) = client_stream();
        for at in 0..=stream.len() {
            let (mut reader, _writer) =
                script_reader([stream[..at].to_vec(), stream[at..].to_vec()], Role::Server);
            assert_eq!(
                drain(&mut reader, 64 * 1024).unwrap(),
                data,
                "split at {at}"
            );
        }
        for chunk in [1, 2, 3, 5, 7, 13, 64 * 1024] {
            let bytes = stream.iter().map(|&b| vec![b]);
            let (mut reader, _writer) = script_reader(bytes, Role::Server);
            assert_eq!(drain(&mut reader, chunk).unwrap(), data, "reads of {chunk}");
            let (mut reader, _writer) = script_reader([stream.clone()], Role::Server);
            assert_eq!(
                drain(&mut reader, chunk).unwrap(),
                data,
                "whole, reads of {chunk}"
            );
        }
    }

    #[tokio::test]
    async fn headers_split_over_tcp() {
        let (mut client, server) = tcp_pair().await;
        let (stream, data) = client_stream();
        let sender = tokio::spawn(async move {
            for byte in stream {
                client.write_all(&[byte]).await.unwrap();
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
            client
        });
        let (read, write) = server.into_split();
        let (mut reader, _writer) = framed(read, write, Role::Server);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, data);
        drop(sender.await.unwrap());
    }

    #[test]
    fn masking_is_enforced() {
        let unmasked = frame(FIN | OP_BINARY, b"x", None);
        let (mut reader, _writer) = script_reader([unmasked.clone()], Role::Server);
        let err = drain(&mut reader, 100).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("unmasked"), "{err}");
        // The stream stays broken.
        let err = reader.try_read(&mut [0; 10]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        let masked = frame(FIN | OP_BINARY, b"x", Some(KEY));
        let (mut reader, _writer) = script_reader([masked.clone()], Role::Client);
        let err = drain(&mut reader, 100).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("masked"), "{err}");

        let (mut reader, _writer) = script_reader([unmasked], Role::Client);
        assert_eq!(drain(&mut reader, 100).unwrap(), b"x");
        let (mut reader, _writer) = script_reader([masked], Role::Server);
        assert_eq!(drain(&mut reader, 100).unwrap(), b"x");
    }

    #[test]
    fn protocol_violations_fail() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("text", frame(FIN | OP_TEXT, b"hi", None)),
            ("rsv1", frame(FIN | 0x40 | OP_BINARY, b"hi", None)),
            ("rsv3", frame(FIN | 0x10 | OP_BINARY, b"hi", None)),
            ("big ping", frame(FIN | OP_PING, &[0; 126], None)),
            ("big close", frame(FIN | OP_CLOSE, &[0; 200], None)),
            ("split ping", frame(OP_PING, b"hi", None)),
            (
                "top bit",
                vec![FIN | OP_BINARY, 127, 0x80, 0, 0, 0, 0, 0, 0, 1],
            ),
            ("opcode 3", frame(FIN | 0x3, b"hi", None)),
            ("opcode 11", frame(FIN | 0xB, b"hi", None)),
            (
                "lone continuation",
                frame(FIN | OP_CONTINUATION, b"hi", None),
            ),
            (
                "binary in a message",
                [
                    frame(OP_BINARY, b"a", None),
                    frame(FIN | OP_BINARY, b"b", None),
                ]
                .concat(),
            ),
        ];
        for (name, bytes) in cases {
            let (mut reader, _writer) = script_reader([bytes], Role::Client);
            let err = drain(&mut reader, 1000).expect_err(name);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{name}: {err}");
        }
    }

    #[test]
    fn close_is_eof() {
        let bytes = [
            frame(FIN | OP_BINARY, b"ab", None),
            frame(FIN | OP_CLOSE, &1000u16.to_be_bytes(), None),
            frame(FIN | OP_BINARY, b"cd", None),
        ]
        .concat();
        let (mut reader, _writer) = script_reader([bytes], Role::Client);
        let mut buf = [0; 100];
        assert_eq!(reader.try_read(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"ab");
        assert_eq!(reader.try_read(&mut buf).unwrap(), 0);
        assert_eq!(reader.try_read(&mut buf).unwrap(), 0);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(reader.poll_read_ready(&mut cx).is_ready());
    }

    #[test]
    fn empty_binary_frame_is_not_eof() {
        let (mut reader, _writer) = script_reader(
            [
                frame(FIN | OP_BINARY, b"", None),
                frame(FIN | OP_BINARY, b"z", None),
            ],
            Role::Client,
        );
        let mut buf = [0; 100];
        let err = reader.try_read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(reader.try_read(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], b'z');
    }

    #[test]
    fn eof_inside_a_frame_is_an_error() {
        let whole = frame(FIN | OP_BINARY, b"abcdef", None);
        for cut in 1..whole.len() {
            let (mut reader, _writer) = script_reader([whole[..cut].to_vec()], Role::Client);
            let err = drain(&mut reader, 100).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        let (mut reader, _writer) = script_reader([whole], Role::Client);
        assert_eq!(drain(&mut reader, 100).unwrap(), b"abcdef");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_writer_pings_every_interval_with_the_pong_it_owes() {
        let (_, mut writer) = framed(Script::new([]), Vec::new(), Role::Client);
        let started = tokio::time::Instant::now();
        writer.ping_due().await;
        assert_eq!(started.elapsed(), PING_INTERVAL);
        writer.pong.post(b"owed");
        writer.ping().await.unwrap();
        // A client masks both; the keys are random, so compare the unmasked frames.
        let (mut reader, _) = script_reader([std::mem::take(&mut writer.inner)], Role::Server);
        assert!(drain(&mut reader, 100).unwrap().is_empty());
        assert_eq!(
            reader.pong.take().as_deref(),
            Some(&b""[..]),
            "the ping came last"
        );
        // The next ping is an interval after this one, not at once.
        let again = tokio::time::Instant::now();
        writer.ping_due().await;
        assert_eq!(again.elapsed(), PING_INTERVAL);
        // A closed writer sends nothing more.
        writer.shutdown().await.unwrap();
        writer.inner.clear();
        writer.ping().await.unwrap();
        assert!(writer.inner.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_writer_sends_an_owed_pong_at_once() {
        use super::super::wire::Keepalive;
        let (_, mut writer) = framed(Script::new([]), Vec::new(), Role::Server);
        let pong = Arc::clone(&writer.pong);
        let started = tokio::time::Instant::now();
        let wait = async {
            writer.keepalive_due().await;
            writer.send_keepalive().await.unwrap();
        };
        let post = async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            pong.post(b"now");
        };
        tokio::join!(wait, post);
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(1));
        assert_eq!(
            writer.inner,
            frame(FIN | OP_PONG, b"now", None),
            "the pong alone"
        );
    }

    #[tokio::test]
    async fn ping_is_answered_with_pong() {
        let (mut reader, mut writer) = script_reader(
            [
                frame(FIN | OP_PING, b"hi", Some(KEY)),
                frame(FIN | OP_BINARY, b"x", Some(KEY)),
                frame(FIN | OP_PING, b"again", Some(KEY)),
            ],
            Role::Server,
        );
        assert_eq!(drain(&mut reader, 100).unwrap(), b"x");
        // Only the latest unanswered ping is owed.
        writer.write_all(b"data").await.unwrap();
        let expected = [
            frame(FIN | OP_PONG, b"again", None),
            frame(FIN | OP_BINARY, b"data", None),
        ]
        .concat();
        assert_eq!(writer.inner, expected);

        writer.inner.clear();
        writer.pong.post(b"flush me");
        writer.flush().await.unwrap();
        assert_eq!(writer.inner, frame(FIN | OP_PONG, b"flush me", None));
        writer.inner.clear();
        writer.flush().await.unwrap();
        assert!(writer.inner.is_empty());
    }

    #[tokio::test]
    async fn writes_become_bounded_frames_that_round_trip() {
        let mut data = vec![0u8; 200_000];
        rand::rng().fill_bytes(&mut data);
        for role in [Role::Client, Role::Server] {
            let (_, mut writer) = framed(Script::new([]), Vec::new(), role);
            writer.write_all(&data).await.unwrap();
            writer.shutdown().await.unwrap();
            let wire = std::mem::take(&mut writer.inner);
            // Every frame is a FIN binary frame of at most MAX_FRAME_PAYLOAD bytes.
            let mut at = 0;
            let mut frames = 0;
            while at < wire.len() {
                assert_eq!(wire[at] & FIN, FIN);
                let size = head_size(wire[at + 1]);
                let len = match wire[at + 1] & 0x7f {
                    126 => usize::from(u16::from_be_bytes([wire[at + 2], wire[at + 3]])),
                    127 => usize::try_from(u64::from_be_bytes(
                        wire[at + 2..at + 10].try_into().unwrap(),
                    ))
                    .unwrap(),
                    n => usize::from(n),
                };
                assert!(len <= MAX_FRAME_PAYLOAD);
                assert_eq!(wire[at + 1] & MASK != 0, role == Role::Client);
                at += size + len;
                frames += 1;
            }
            assert_eq!(at, wire.len());
            assert_eq!(frames, data.len().div_ceil(MAX_FRAME_PAYLOAD) + 1);
            let peer = match role {
                Role::Client => Role::Server,
                Role::Server => Role::Client,
            };
            let (mut reader, _w) = script_reader([wire], peer);
            assert_eq!(drain(&mut reader, 10_000).unwrap(), data);
            assert!(writer.write(b"late").await.is_err());
        }
    }

    /// A socket that takes at most 7 bytes per write and says it writes vectored: a
    /// server's frames written straight from the caller's buffer resume where it stopped.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(7);
            self.get_mut().0.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let mut left = 7;
            for buf in bufs {
                let n = buf.len().min(left);
                this.0.extend_from_slice(&buf[..n]);
                left -= n;
            }
            Poll::Ready(Ok(7 - left))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn frames_written_in_pieces_arrive_whole() {
        let mut data = vec![0u8; 150_000];
        rand::rng().fill_bytes(&mut data);
        for role in [Role::Client, Role::Server] {
            let (_, mut writer) = framed(Script::new([]), Trickle(Vec::new()), role);
            for piece in [&data[..3], &data[3..100], &data[100..]] {
                writer.write_all(piece).await.unwrap();
            }
            writer.shutdown().await.unwrap();
            let wire = std::mem::take(&mut writer.inner.0);
            let peer = match role {
                Role::Client => Role::Server,
                Role::Server => Role::Client,
            };
            let (mut reader, _w) = script_reader([wire], peer);
            assert_eq!(drain(&mut reader, 10_000).unwrap(), data, "{role:?}");
        }
    }

    /// Writes `data` in random-sized pieces, then closes.
    async fn send_all<W: AsyncWrite + Unpin>(writer: &mut W, data: &[u8]) {
        let mut at = 0;
        while at < data.len() {
            let n = rand::rng().random_range(1..150_000).min(data.len() - at);
            writer.write_all(&data[at..at + n]).await.unwrap();
            at += n;
        }
        writer.shutdown().await.unwrap();
    }

    async fn receive_all<R: AsyncRead + Unpin>(reader: &mut R) -> blake3::Hash {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        blake3::hash(&got)
    }

    #[tokio::test]
    async fn upgrade_then_4mib_each_way_concurrently() {
        let (client, server) = tcp_pair().await;
        let (mut client_read, mut client_write) = base(client);
        let (mut server_read, mut server_write) = base(server);
        let ws = settings(true);
        let (upgraded, accepted) = tokio::join!(
            client_upgrade(
                &mut client_read,
                &mut client_write,
                "example.com",
                "/warren"
            ),
            server_upgrade(&mut server_read, &mut server_write, &ws),
        );
        upgraded.unwrap();
        assert_eq!(accepted.unwrap(), Upgrade::WebSocket);

        let mut up = vec![0u8; 4 << 20];
        let mut down = vec![0u8; 4 << 20];
        rand::rng().fill_bytes(&mut up);
        rand::rng().fill_bytes(&mut down);
        let (mut cr, mut cw) = framed(client_read, client_write, Role::Client);
        let (mut sr, mut sw) = framed(server_read, server_write, Role::Server);
        let ((), (), at_server, at_client) = tokio::join!(
            send_all(&mut cw, &up),
            send_all(&mut sw, &down),
            receive_all(&mut sr),
            receive_all(&mut cr),
        );
        assert_eq!(at_server, blake3::hash(&up));
        assert_eq!(at_client, blake3::hash(&down));
    }

    #[tokio::test]
    async fn bytes_after_the_head_reach_the_frames() {
        let (mut client, server) = tcp_pair().await;
        let (mut read, mut write) = base(server);
        let request = "GET /warren?x=1 HTTP/1.1\r\nHost: a\r\nUpgrade: WebSocket\r\n\
            Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Sec-WebSocket-Version: 13\r\n\r\n";
        let mut bytes = request.as_bytes().to_vec();
        bytes.extend(frame(FIN | OP_BINARY, b"early", Some(KEY)));
        client.write_all(&bytes).await.unwrap();
        let upgrade = server_upgrade(&mut read, &mut write, &settings(false)).await;
        assert_eq!(upgrade.unwrap(), Upgrade::WebSocket);
        let mut answer = vec![0; 1000];
        let n = client.read(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 101 "), "{answer}");
        // The example in RFC 6455 §1.3.
        assert!(
            answer.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{answer}"
        );
        let (mut reader, _writer) = framed(read, write, Role::Server);
        let mut got = [0; 5];
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
    }

    /// Sends `request` raw to a server upgrade; returns its outcome and the whole answer.
    async fn raw_request(request: &[u8], ws: &WsServer) -> (Result<Upgrade, WsError>, String) {
        let (mut client, server) = tcp_pair().await;
        client.write_all(request).await.unwrap();
        let (mut read, mut write) = base(server);
        let outcome = server_upgrade(&mut read, &mut write, ws).await;
        drop((read, write));
        let mut answer = Vec::new();
        let _ = client.read_to_end(&mut answer).await;
        (outcome, String::from_utf8_lossy(&answer).into_owned())
    }

    fn body(answer: &str) -> &str {
        answer.split_once("\r\n\r\n").unwrap().1
    }

    #[tokio::test]
    async fn plain_get_gets_the_decoy_page() {
        let get = b"GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: Mozilla/5.0\r\n\r\n";
        let (outcome, answer) = raw_request(get, &settings(true)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("Content-Type: text/html; charset=utf-8\r\n"));
        assert!(answer.contains("Connection: close\r\n"));
        let length = format!("Content-Length: {}\r\n", body(&answer).len());
        assert!(answer.contains(&length), "{answer}");
        assert!(!answer.to_ascii_lowercase().contains("warren"), "{answer}");

        let head = b"HEAD / HTTP/1.1\r\nHost: example.com\r\n\r\n";
        let (outcome, answer) = raw_request(head, &settings(true)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert_eq!(body(&answer), "");

        // An upgrade elsewhere is just another request.
        let elsewhere = b"GET /other HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Sec-WebSocket-Version: 13\r\n\r\n";
        let (outcome, answer) = raw_request(elsewhere, &settings(true)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }

    #[tokio::test]
    async fn plain_get_gets_404_without_decoy() {
        let get = b"GET /warren HTTP/1.1\r\nHost: example.com\r\n\r\n";
        let (outcome, answer) = raw_request(get, &settings(false)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");
        assert!(!body(&answer).is_empty());
    }

    #[tokio::test]
    async fn wrong_version_gets_426_and_bad_key_400() {
        let old = b"GET /warren HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Sec-WebSocket-Version: 8\r\n\r\n";
        let (outcome, answer) = raw_request(old, &settings(true)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(
            answer.starts_with("HTTP/1.1 426 Upgrade Required\r\n"),
            "{answer}"
        );
        assert!(answer.contains("Sec-WebSocket-Version: 13\r\n"), "{answer}");

        let short_key = b"GET /warren HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: c2hvcnQ=\r\n\
            Sec-WebSocket-Version: 13\r\n\r\n";
        let (outcome, answer) = raw_request(short_key, &settings(true)).await;
        assert_eq!(outcome.unwrap(), Upgrade::NotWebSocket);
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn malformed_heads_are_refused() {
        let mut flood = b"GET / HTTP/1.1\r\nHost: a\r\nX-Flood: ".to_vec();
        flood.resize(9 * 1024, b'a');
        let (outcome, _answer) = raw_request(&flood, &settings(true)).await;
        let err = outcome.unwrap_err();
        assert!(matches!(err, WsError::Malformed(_)), "{err:?}");
        assert!(err.to_string().contains("8 KiB"), "{err}");

        let (outcome, answer) =
            raw_request(b"\x16\x03\x01\x02\x00junk\r\n\r\n", &settings(true)).await;
        assert!(matches!(outcome, Err(WsError::Malformed(_))), "{outcome:?}");
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn wrong_path_is_refused_naming_it() {
        for decoy in [false, true] {
            let (client, server) = tcp_pair().await;
            let (mut cr, mut cw) = base(client);
            let (mut sr, mut sw) = base(server);
            let ws = settings(decoy);
            let (upgraded, accepted) = tokio::join!(
                client_upgrade(&mut cr, &mut cw, "example.com", "/elsewhere"),
                server_upgrade(&mut sr, &mut sw, &ws),
            );
            assert_eq!(accepted.unwrap(), Upgrade::NotWebSocket);
            let err = upgraded.unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, WsError::Refused(_)), "{err:?}");
            assert!(text.contains("/elsewhere"), "{text}");
            assert!(text.contains("[client.ws] path"), "{text}");
            let status = if decoy { "200 OK" } else { "404 Not Found" };
            assert!(text.contains(status), "{text}");
        }
    }

    #[tokio::test]
    async fn client_refuses_what_is_not_an_upgrade() {
        let answers: [(&[u8], &str); 5] = [
            (b"SSH-2.0-OpenSSH_9.6\r\n", "did not answer with HTTP"),
            (b"", "closed the connection"),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade\r\nSec-WebSocket-Accept: bm9wZQ==\r\n\r\n",
                "Sec-WebSocket-Accept",
            ),
            (
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
                "502 Bad Gateway",
            ),
            (b"HTTP/1.1 200 OK\r\nX: y\r\n", "ended"),
        ];
        for (answer, expected) in answers {
            let (client, mut server) = tcp_pair().await;
            let (mut cr, mut cw) = base(client);
            let peer = async move {
                let mut request = vec![0; 4096];
                let _ = server.read(&mut request).await.unwrap();
                server.write_all(answer).await.unwrap();
                drop(server);
            };
            let (upgraded, ()) = tokio::join!(client_upgrade(&mut cr, &mut cw, "a", "/w"), peer);
            let text = upgraded.unwrap_err().to_string();
            assert!(text.contains(expected), "{expected}: {text}");
        }

        let (client, _server) = tcp_pair().await;
        let (mut cr, mut cw) = base(client);
        let err = client_upgrade(&mut cr, &mut cw, "a", "no slash")
            .await
            .unwrap_err();
        assert!(matches!(err, WsError::Settings(_)), "{err:?}");
    }

    #[tokio::test]
    async fn our_client_against_tungstenite_server() {
        let (client, server) = tcp_pair().await;
        let echo = tokio::spawn(async move {
            let mut ws = tokio_tungstenite::accept_async(server).await.unwrap();
            while let Some(message) = ws.next().await {
                match message {
                    Ok(Message::Binary(bytes)) => ws.send(Message::Binary(bytes)).await.unwrap(),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        let (mut cr, mut cw) = base(client);
        client_upgrade(&mut cr, &mut cw, "127.0.0.1", "/warren")
            .await
            .unwrap();
        let (mut reader, mut writer) = framed(cr, cw, Role::Client);
        let mut data = vec![0u8; 1 << 20];
        rand::rng().fill_bytes(&mut data);
        let (back, ()) = tokio::join!(
            async {
                let mut back = vec![0; data.len()];
                reader.read_exact(&mut back).await.unwrap();
                back
            },
            async {
                let mut at = 0;
                for n in [1, 100, 70_000, 200_000, 65_600] {
                    writer.write_all(&data[at..at + n]).await.unwrap();
                    at += n;
                }
                writer.write_all(&data[at..]).await.unwrap();
                writer.flush().await.unwrap();
            },
        );
        assert!(back == data);
        // Our Close, then theirs: EOF.
        writer.shutdown().await.unwrap();
        assert_eq!(reader.read(&mut [0; 16]).await.unwrap(), 0);
        echo.await.unwrap();
    }

    #[tokio::test]
    async fn tungstenite_client_against_our_server() {
        let (client, server) = tcp_pair().await;
        let port = client.peer_addr().unwrap().port();
        let ours = tokio::spawn(async move {
            let (mut read, mut write) = base(server);
            let upgrade = server_upgrade(&mut read, &mut write, &settings(false)).await;
            assert_eq!(upgrade.unwrap(), Upgrade::WebSocket);
            let (mut reader, mut writer) = framed(read, write, Role::Server);
            let mut buf = vec![0; 100_000];
            loop {
                let n = reader.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                writer.write_all(&buf[..n]).await.unwrap();
                writer.flush().await.unwrap();
            }
            writer.shutdown().await.unwrap();
        });
        let url = format!("ws://127.0.0.1:{port}/warren");
        let (mut ws, _response) = tokio_tungstenite::client_async(url, client).await.unwrap();
        ws.send(Message::Ping(b"there?".to_vec().into()))
            .await
            .unwrap();
        ws.send(Message::binary(b"x".to_vec())).await.unwrap();
        match ws.next().await.unwrap().unwrap() {
            Message::Pong(payload) => assert_eq!(&payload[..], b"there?"),
            other => panic!("expected the pong first, got {other:?}"),
        }
        let mut data = vec![0u8; 300_000];
        rand::rng().fill_bytes(&mut data);
        let mut expected = b"x".to_vec();
        expected.extend_from_slice(&data);
        for piece in data.chunks(70_000) {
            ws.send(Message::binary(piece.to_vec())).await.unwrap();
        }
        let mut back = Vec::new();
        while back.len() < expected.len() {
            match ws.next().await.unwrap().unwrap() {
                Message::Binary(bytes) => back.extend_from_slice(&bytes),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(back == expected);
        ws.close(None).await.unwrap();
        while let Some(message) = ws.next().await {
            if message.is_err() {
                break;
            }
        }
        ours.await.unwrap();
    }
}
