//! How the QUIC transport carries a session's streams: one native QUIC stream per Warren
//! stream (QUIC's own TLS 1.3 encryption; no second AEAD inside), on the one connection
//! between a client and a server.
//!
//! * Data is the stream's bytes; the end is QUIC's FIN; a reset is `RESET_STREAM` with one
//!   of Warren's reset codes ([`reset_code`]: QUIC carries a number, not a text, so the
//!   peer sees the reason's kind). A connection that dies cuts every stream on it.
//! * A message (a `StreamOpen`, a control message) is framed on the stream as a 4-byte
//!   big-endian length and the bytes, at most [`MAX_MESSAGE_LEN`].
//! * The server opens reverse streams ([`QuicLink::open_stream`]) and the client accepts
//!   them, and the other way round for forward streams ([`QuicLink::serve`]). Opening a
//!   stream costs no round trip: the peer learns of it with its first bytes, which carry
//!   the `StreamOpen`.
//!
//! quinn finishes a stream that is dropped; Warren must never make a cut stream look
//! complete, so [`QuicWriter`] resets a stream dropped before it was finished.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt;
use quinn::{ReadError, VarInt, WriteError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;
use warren_proto::message::{self, StreamOpen};

use super::link::{OpenError, Replenish, StreamHandler};
use super::quic_datagram::Datagrams;
use super::stream::{Chunk, SendError, Stream, StreamError, StreamReader, StreamWriter};
use crate::transport::records::ReadReady;

/// Largest message framed on a stream (a control message or a `StreamOpen`).
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;

/// Largest chunk one read hands out.
const READ_CHUNK: usize = 64 * 1024;

/// A chunk shorter than this is joined with the chunks already received behind it
/// ([`QuicReader::read`]).
const GATHER_BELOW: usize = 16 * 1024;

/// How long a shutdown waits for the peer to acknowledge the stream's end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// How long a peer that opened a stream may take to send its `StreamOpen`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Warren's reasons for a reset, as QUIC error codes: QUIC carries a number, not a text.
const RESET_REASONS: [&str; 6] = [
    "stream aborted",
    "target unreachable",
    "unknown service",
    "local connection failed",
    "shutting down",
    "not a forward service of this session",
];

/// The QUIC error code for a reset `reason` (the closest of [`RESET_REASONS`]).
pub fn reset_code(reason: &str) -> VarInt {
    let code = RESET_REASONS
        .iter()
        .position(|known| reason.starts_with(known))
        .or_else(|| reason.contains("failed").then_some(3))
        .unwrap_or(0);
    VarInt::from_u32(code as u32)
}

/// The reason a reset `code` stands for.
pub fn reset_reason(code: VarInt) -> Cow<'static, str> {
    match usize::try_from(code.into_inner())
        .ok()
        .and_then(|i| RESET_REASONS.get(i))
    {
        Some(reason) => Cow::Borrowed(reason),
        None => Cow::Owned(format!("stream reset by the peer (code {code})")),
    }
}

/// The TLS exporter value that binds a QUIC session's token proofs and names it (both
/// sides compute the same); `None` if the exporter fails (not expected after the
/// handshake).
pub fn session_binding(connection: &quinn::Connection) -> Option<[u8; 32]> {
    let mut binding = [0u8; 32];
    connection
        .export_keying_material(&mut binding, b"EXPORTER-warren-session", b"")
        .ok()?;
    Some(binding)
}

/// A stream on a QUIC connection whose datagrams `datagrams` carries.
pub fn stream(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    datagrams: &Arc<Datagrams>,
) -> Stream {
    make_stream(send, recv, Some(Arc::clone(datagrams)))
}

/// The control stream of a QUIC session (it never carries datagrams). It goes first when
/// streams compete for the connection: heartbeats and health reports must not wait behind
/// bulk data.
pub fn control_stream(send: quinn::SendStream, recv: quinn::RecvStream) -> Stream {
    let _ = send.set_priority(CONTROL_PRIORITY);
    make_stream(send, recv, None)
}

/// quinn's priority of the control stream (data streams have 0).
const CONTROL_PRIORITY: i32 = 100;

fn make_stream(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    datagrams: Option<Arc<Datagrams>>,
) -> Stream {
    Stream {
        reader: StreamReader::Quic(QuicReader {
            recv,
            pending: Vec::new(),
            consumed: 0,
            chunk: Bytes::new(),
            held: None,
        }),
        writer: StreamWriter::Quic(QuicWriter {
            datagrams,
            send,
            staged: Vec::new(),
            finish_staged: false,
            done: false,
        }),
    }
}

/// The receiving half of a QUIC stream.
pub struct QuicReader {
    recv: quinn::RecvStream,
    /// Bytes read but not handed out yet: a message being assembled, or stream bytes that
    /// came with one.
    pending: Vec<u8>,
    /// Bytes at the front of `pending` already handed out (the last message).
    consumed: usize,
    /// The chunk the last [`QuicReader::read`] handed out.
    chunk: Bytes,
    /// What gathering found behind the data it joined (the end, a reset, an error), for
    /// the next read: quinn reports a reset once, then only the end.
    held: Option<Result<Option<quinn::Chunk>, ReadError>>,
}

fn read_error(error: ReadError) -> StreamError {
    match error {
        ReadError::ConnectionLost(_) => StreamError::Cut,
        other => StreamError::Quic(other.to_string()),
    }
}

impl QuicReader {
    /// See [`StreamReader::read`].
    pub(super) async fn read(&mut self) -> Result<Chunk<'_>, StreamError> {
        self.drop_consumed();
        if !self.pending.is_empty() {
            // Stream bytes that arrived with a message.
            self.chunk = Bytes::from(std::mem::take(&mut self.pending));
            return Ok(Chunk::Data(&self.chunk));
        }
        match self.next_chunk(READ_CHUNK).await {
            Ok(Some(chunk)) => {
                self.chunk = self.gather(chunk.bytes);
                Ok(Chunk::Data(&self.chunk))
            }
            Ok(None) => Ok(Chunk::End),
            Err(ReadError::Reset(code)) => Ok(Chunk::Reset(reset_reason(code))),
            Err(error) => Err(read_error(error)),
        }
    }

    /// The next chunk: what gathering held back, or the stream's next one.
    async fn next_chunk(&mut self, max: usize) -> Result<Option<quinn::Chunk>, ReadError> {
        match self.held.take() {
            Some(held) => held,
            None => self.recv.read_chunk(max, true).await,
        }
    }

    /// Joins `first`, when it is short, with the chunks already received behind it (up to
    /// [`READ_CHUNK`]), waiting for nothing. quinn hands out one chunk per STREAM frame,
    /// so with 1452-byte packets each chunk is ~1.4 KB, and writing each to the target's
    /// socket on its own cost one `sendto` per packet (335,000 in a 4 s iperf3 run);
    /// copying them together is far cheaper than those system calls.
    fn gather(&mut self, first: Bytes) -> Bytes {
        if first.len() >= GATHER_BELOW {
            return first;
        }
        let mut joined: Option<BytesMut> = None;
        loop {
            let len = joined.as_ref().map_or(first.len(), BytesMut::len);
            let room = READ_CHUNK - len;
            if room == 0 {
                break;
            }
            // `read_chunk` is cancel-safe: a read that would wait takes nothing.
            match self.recv.read_chunk(room, true).now_or_never() {
                None => break,
                Some(Ok(Some(next))) => joined
                    .get_or_insert_with(|| {
                        let mut buf = BytesMut::with_capacity(READ_CHUNK);
                        buf.extend_from_slice(&first);
                        buf
                    })
                    .extend_from_slice(&next.bytes),
                Some(other) => {
                    self.held = Some(other);
                    break;
                }
            }
        }
        joined.map_or(first, BytesMut::freeze)
    }

    /// See [`StreamReader::last_data`].
    pub(super) fn last_data(&self) -> &[u8] {
        &self.chunk
    }

    /// See [`StreamReader::read_message`]. Cancel safe: what was read stays in `pending`.
    pub(super) async fn read_message(
        &mut self,
    ) -> Result<Result<&[u8], Cow<'_, str>>, StreamError> {
        self.drop_consumed();
        loop {
            if let Some(len) = self.complete_message()? {
                self.consumed = 4 + len;
                return Ok(Ok(&self.pending[4..4 + len]));
            }
            match self.next_chunk(READ_CHUNK).await {
                Ok(Some(chunk)) => self.pending.extend_from_slice(&chunk.bytes),
                // The stream ended where a message belongs.
                Ok(None) => return Err(StreamError::Cut),
                Err(ReadError::Reset(code)) => return Ok(Err(reset_reason(code))),
                Err(error) => return Err(read_error(error)),
            }
        }
    }

    /// The length of the message at the front of `pending`, once it is all there.
    fn complete_message(&self) -> Result<Option<usize>, StreamError> {
        let Some(prefix) = self.pending.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if len > MAX_MESSAGE_LEN {
            return Err(StreamError::Protocol("a message over the 64 KiB limit"));
        }
        Ok((self.pending.len() >= 4 + len).then_some(len))
    }

    fn drop_consumed(&mut self) {
        if self.consumed > 0 {
            self.pending.drain(..self.consumed);
            self.consumed = 0;
        }
    }

    /// Lets go of what the last read held.
    pub(super) fn shrink(&mut self) {
        self.chunk = Bytes::new();
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
    }
}

/// The sending half of a QUIC stream.
pub struct QuicWriter {
    /// The connection's datagrams (for a datagram channel on this stream); `None` on the
    /// control stream.
    datagrams: Option<Arc<Datagrams>>,
    send: quinn::SendStream,
    /// Bytes to go out with the next write.
    staged: Vec<u8>,
    /// Finish once the staged bytes are out.
    finish_staged: bool,
    /// Finished or reset: nothing to do on drop.
    done: bool,
}

fn write_error(error: WriteError) -> StreamError {
    match error {
        WriteError::ConnectionLost(_) => StreamError::Cut,
        WriteError::Stopped(code) => StreamError::Quic(format!(
            "the peer stopped reading the stream ({})",
            reset_reason(code)
        )),
        other => StreamError::Quic(other.to_string()),
    }
}

impl QuicWriter {
    /// The connection's datagrams and this stream's channel id among them (`None` on the
    /// control stream).
    pub(super) fn datagram_channel(&self) -> Option<(Arc<Datagrams>, u32)> {
        // Stream ids are unique per connection; the low 32 bits stay unique for the 2^30
        // streams of each kind a connection opens before they could repeat.
        let channel = u64::from(self.send.id()) as u32;
        self.datagrams.clone().map(|datagrams| (datagrams, channel))
    }

    pub(super) async fn send(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        self.flush().await?;
        self.send.write_all(bytes).await.map_err(write_error)
    }

    /// Reads what `src` has into a fresh buffer and hands that buffer to quinn as it is
    /// (`write_chunk`): quinn keeps the bytes until they are acknowledged anyway, so a
    /// buffer per chunk costs an allocation where `write_all` would cost a copy, and the
    /// copy measured slower (quinn's own ceiling here: 2.0 vs 2.6 Gbit/s at 1452-byte
    /// packets). While `src` is idle no buffer is held.
    pub(super) async fn send_from<S: ReadReady>(&mut self, src: &S) -> Result<usize, SendError> {
        loop {
            src.readable().await.map_err(SendError::Source)?;
            let mut chunk = BytesMut::with_capacity(READ_CHUNK);
            // Limited to the buffer's size: a read that fills less than that tells the
            // reader the socket is drained (see `ReadReady::try_read_buf`).
            match src.try_read_buf(&mut (&mut chunk).limit(READ_CHUNK)) {
                Ok(0) => return Ok(0),
                Ok(n) => {
                    self.flush().await.map_err(SendError::Sink)?;
                    let written = self.send.write_chunk(chunk.freeze()).await;
                    written.map_err(|e| SendError::Sink(write_error(e)))?;
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.flush().await.map_err(SendError::Sink)?;
                }
                Err(e) => return Err(SendError::Source(e)),
            }
        }
    }

    pub(super) async fn finish(&mut self) -> Result<(), StreamError> {
        self.flush().await?;
        self.finish_now()
    }

    /// Finishes and waits (at most a second) until the peer has everything: the control
    /// stream's goodbye must arrive before the connection is dropped, and dropping it
    /// discards what quinn has not sent yet.
    pub(super) async fn shutdown(&mut self) -> Result<(), StreamError> {
        self.finish().await?;
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, self.send.stopped()).await;
        Ok(())
    }

    fn finish_now(&mut self) -> Result<(), StreamError> {
        self.done = true;
        self.send
            .finish()
            .map_err(|e| StreamError::Quic(e.to_string()))
    }

    pub(super) fn stage_finish(&mut self) -> Result<(), StreamError> {
        if self.staged.is_empty() {
            self.finish_now()
        } else {
            self.finish_staged = true;
            Ok(())
        }
    }

    pub(super) fn reset(&mut self, reason: &str) -> Result<(), StreamError> {
        self.done = true;
        self.staged = Vec::new();
        self.send
            .reset(reset_code(reason))
            .map_err(|e| StreamError::Quic(e.to_string()))
    }

    pub(super) async fn send_message(&mut self, message: &[u8]) -> Result<(), StreamError> {
        self.stage_message(message)?;
        self.flush().await
    }

    pub(super) fn stage_message(&mut self, message: &[u8]) -> Result<(), StreamError> {
        let len = u32::try_from(message.len())
            .ok()
            .filter(|&len| len as usize <= MAX_MESSAGE_LEN)
            .ok_or(StreamError::Protocol("a message over the 64 KiB limit"))?;
        self.staged.extend_from_slice(&len.to_be_bytes());
        self.staged.extend_from_slice(message);
        Ok(())
    }

    pub(super) async fn flush(&mut self) -> Result<(), StreamError> {
        if !self.staged.is_empty() {
            let staged = std::mem::take(&mut self.staged);
            self.send.write_all(&staged).await.map_err(write_error)?;
        }
        if std::mem::take(&mut self.finish_staged) {
            self.finish_now()?;
        }
        Ok(())
    }
}

impl Drop for QuicWriter {
    fn drop(&mut self) {
        if !self.done {
            // quinn would finish it: a cut stream must not look complete.
            let _ = self.send.reset(reset_code("stream aborted"));
        }
    }
}

/// What a QUIC connection's path looks like now (for the admin API).
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuicPath {
    /// Smoothed round-trip time, milliseconds.
    pub rtt_ms: f64,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// UDP payload size PMTUD settled on, bytes.
    pub mtu: u16,
    /// Packets sent and declared lost so far.
    pub sent_packets: u64,
    /// Packets declared lost so far.
    pub lost_packets: u64,
    /// Congestion events so far.
    pub congestion_events: u64,
    /// The largest UDP-service datagram that fits one QUIC datagram now (larger ones are
    /// split).
    pub max_datagram: Option<usize>,
    /// UDP-service datagrams dropped (full queues, no channel, the path shrank).
    pub datagrams_dropped: u64,
}

/// Both sides' streams of one QUIC connection.
pub struct QuicLink {
    connection: quinn::Connection,
    datagrams: Arc<Datagrams>,
    tasks: TaskTracker,
    /// Stops accepting the peer's streams.
    closed: CancellationToken,
}

impl QuicLink {
    /// The streams of `connection`; accept loops run on `tasks`.
    pub fn new(connection: quinn::Connection, tasks: TaskTracker) -> Self {
        QuicLink {
            datagrams: Datagrams::new(connection.clone(), tasks.clone()),
            connection,
            tasks,
            closed: CancellationToken::new(),
        }
    }

    /// The connection under the link.
    pub fn connection(&self) -> &quinn::Connection {
        &self.connection
    }

    /// The connection's path now.
    pub fn path(&self) -> QuicPath {
        let stats = self.connection.stats();
        QuicPath {
            rtt_ms: stats.path.rtt.as_secs_f64() * 1e3,
            cwnd: stats.path.cwnd,
            mtu: stats.path.current_mtu,
            sent_packets: stats.path.sent_packets,
            lost_packets: stats.path.lost_packets,
            congestion_events: stats.path.congestion_events,
            max_datagram: self.connection.max_datagram_size(),
            datagrams_dropped: self.datagrams.dropped(),
        }
    }

    /// Opens a stream; its `StreamOpen` leaves with the first bytes.
    pub async fn open_stream(&self, open: &StreamOpen) -> Result<Stream, OpenError> {
        let (send, recv) = self.connection.open_bi().await.map_err(|e| match e {
            quinn::ConnectionError::LocallyClosed => OpenError::SessionGone,
            other => OpenError::Failed(other.to_string()),
        })?;
        let mut stream = stream(send, recv, &self.datagrams);
        stream
            .writer
            .stage_message(&message::encode(open))
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        Ok(stream)
    }

    /// Accepts the peer's streams until the link closes or the connection ends, handing
    /// each to `handler` in its own task.
    pub fn serve<H: StreamHandler>(&self, handler: &Arc<H>) {
        let connection = self.connection.clone();
        let closed = self.closed.clone();
        let tasks = self.tasks.clone();
        let handler = Arc::clone(handler);
        let datagrams = Arc::clone(&self.datagrams);
        self.tasks.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = closed.cancelled() => return,
                    accepted = connection.accept_bi() => accepted,
                };
                let Ok((send, recv)) = accepted else { return };
                let handler = Arc::clone(&handler);
                let closed = closed.clone();
                let datagrams = Arc::clone(&datagrams);
                tasks.spawn(async move {
                    let mut stream = stream(send, recv, &datagrams);
                    let open = tokio::select! {
                        () = closed.cancelled() => return,
                        open = tokio::time::timeout(OPEN_TIMEOUT, read_open(&mut stream)) => open,
                    };
                    match open {
                        Ok(Ok(open)) => {
                            handler.serve(open, stream, Replenish::nothing()).await;
                        }
                        Ok(Err(error)) => {
                            debug!(event = "protocol_error", %error, "bad stream open from the peer");
                        }
                        Err(_) => {
                            debug!(event = "stream_open_timeout", "the peer opened a stream and sent no stream open");
                        }
                    }
                });
            }
        });
    }

    /// Stops accepting the peer's streams (the connection itself is closed with the
    /// session).
    pub fn close(&self) {
        self.closed.cancel();
        self.datagrams.close();
    }
}

async fn read_open(stream: &mut Stream) -> Result<StreamOpen, String> {
    match stream.reader.read_message().await {
        Ok(Ok(bytes)) => message::decode_stream_open(bytes).map_err(|e| e.to_string()),
        Ok(Err(reason)) => Err(format!("reset before its stream open: {reason}")),
        Err(error) => Err(error.to_string()),
    }
}
