//! Async record streams: the AEAD record layer ([`crate::crypto::record`]) over a socket.
//!
//! [`RecordReader`] reads as many bytes as the socket has into one buffer and opens records
//! in place, so a busy stream costs one `read` per several records and no allocation per
//! record. [`RecordWriter`] reads plaintext straight into its send buffer
//! ([`RecordWriter::send_from`]), seals it in place and writes it with one `write`.
//!
//! Memory: both wait for readiness *without* a buffer and return their buffer to
//! [`super::buffers`] as soon as the socket has nothing more, so an idle channel
//! holds no buffer at all.

use std::future::Future;
use std::io;

use bytes::BufMut;
use tokio::io::{AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, ReadHalf};

use super::buffers;
use super::compress::{Compressor, InflateError, inflate};
use super::wire::{Keepalive, Source, readable};
use crate::crypto::record::{
    HEADER_LEN, MAX_PAYLOAD, MAX_TAG_LEN, Opener, RecordError, RecordKind, Sealer,
};

/// A socket that can wait for data without being read, then be read without blocking:
/// what lets channels hold no buffer while idle.
pub trait ReadReady {
    /// Waits until the socket is (probably) readable. Cancel safe.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Reads what is there now, or fails with `WouldBlock`. A read that leaves room in `buf`
    /// has drained the socket, so the next call fails with `WouldBlock` without a syscall.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Like `try_read`, into a buffer's spare capacity.
    fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize>;
}

impl ReadReady for TcpStream {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        TcpStream::readable(self)
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len();
        read_draining(self, want, || TcpStream::try_read(self, buf))
    }
    fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        let want = buf.remaining_mut();
        read_draining(self, want, || TcpStream::try_read_buf(self, buf))
    }
}

impl ReadReady for OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        OwnedReadHalf::readable(self)
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        ReadReady::try_read(self.as_ref(), buf)
    }
    fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        ReadReady::try_read_buf(self.as_ref(), buf)
    }
}

impl ReadReady for ReadHalf<'_> {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
        self.as_ref().readable()
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        ReadReady::try_read(self.as_ref(), buf)
    }
    fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        ReadReady::try_read_buf(self.as_ref(), buf)
    }
}

/// Runs `read` (a `try_read` of at most `want` bytes) and, when it returns fewer bytes
/// than asked for, marks `stream` as not readable: the socket is drained, and the next
/// bytes raise a fresh (edge-triggered) readiness event. Without this, every read that
/// empties the socket is followed by one more that fails with `EAGAIN` just to learn
/// that: one wasted syscall per hop of every round trip. tokio's own `AsyncRead` for
/// `TcpStream` does the same; `try_io` clears readiness only if no new event came in
/// since the read began, and never clears "read closed", so neither new bytes nor an EOF
/// can be missed.
fn read_draining(
    stream: &TcpStream,
    want: usize,
    read: impl FnOnce() -> io::Result<usize>,
) -> io::Result<usize> {
    if cfg!(windows) {
        // Level-triggered there: a short read says nothing about what is left.
        return read();
    }
    let mut short = None;
    let outcome = stream.try_io(Interest::READABLE, || {
        let n = read()?;
        if n > 0 && n < want {
            short = Some(n);
            // Makes `try_io` clear the readiness it saw before the read.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match short {
        Some(n) => Ok(n),
        None => outcome,
    }
}

/// Errors reading or writing records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordIoError {
    /// The socket failed.
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    /// A record was malformed or failed authentication.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A compressed record was refused (corrupt, or a decompression bomb).
    #[error(transparent)]
    Inflate(#[from] InflateError),
    /// The connection ended in the middle of a record.
    #[error("connection closed in the middle of a record")]
    Truncated,
}

/// One opened record, borrowing the reader's buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// Stream bytes.
    Data(&'a [u8]),
    /// End of stream in this direction (half-close).
    End,
    /// A control message.
    Control(&'a [u8]),
    /// The peer aborts the channel; the payload is its reason.
    Close(&'a [u8]),
    /// One datagram with its flow id in front (see [`crate::session::datagram`]).
    Datagram(&'a [u8]),
}

/// Reads and opens records from `R`.
pub struct RecordReader<R> {
    io: R,
    opener: Opener,
    /// Empty while idle; [`buffers::READ_BUF_LEN`] bytes while data flows.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The last `Compressed` record, inflated (empty until one comes).
    inflated: Vec<u8>,
    /// Where the last `Data` record's plaintext lies.
    last_data: LastData,
}

/// Where [`RecordReader::last_data`] finds the last `Data` record's plaintext.
#[derive(Debug, Clone, Copy)]
enum LastData {
    /// `buf[from..from + len]`.
    InBuf { from: usize, len: usize },
    /// `inflated` (the record came compressed).
    Inflated,
}

impl<R: Source> RecordReader<R> {
    /// Wraps `io`; `opener` holds the receive keys.
    pub fn new(io: R, opener: Opener) -> Self {
        RecordReader {
            io,
            opener,
            buf: Vec::new(),
            start: 0,
            end: 0,
            inflated: Vec::new(),
            last_data: LastData::InBuf { from: 0, len: 0 },
        }
    }

    /// Reads the next record. `Ok(None)` means the connection ended cleanly *between*
    /// records, which callers must still treat as an abort unless they saw `End`.
    ///
    /// Cancel safe: all progress lives in `self`, and a record is opened and consumed in
    /// the same poll that returns it.
    ///
    /// # Errors
    /// Socket errors, malformed or forged records, and EOF inside a record.
    pub async fn read(&mut self) -> Result<Option<Record<'_>>, RecordIoError> {
        loop {
            if let Some((kind, from, len)) = self.try_open()? {
                if kind == RecordKind::Data {
                    self.last_data = LastData::InBuf { from, len };
                }
                let payload = &self.buf[from..from + len];
                return Ok(Some(match kind {
                    RecordKind::Data => Record::Data(payload),
                    RecordKind::End => Record::End,
                    RecordKind::Control => Record::Control(payload),
                    RecordKind::Close => Record::Close(payload),
                    RecordKind::Datagram => Record::Datagram(payload),
                    RecordKind::Compressed => {
                        inflate(payload, &mut self.inflated)?;
                        self.last_data = LastData::Inflated;
                        Record::Data(&self.inflated)
                    }
                }));
            }
            if !self.fill().await? {
                return if self.start == self.end {
                    Ok(None)
                } else {
                    Err(RecordIoError::Truncated)
                };
            }
        }
    }

    /// The plaintext of the last `Data` record [`RecordReader::read`] returned, until the
    /// next read: for a caller that hands it out piecewise after the read's borrow ended
    /// (copying it out whole first would be a second copy of every byte).
    pub fn last_data(&self) -> &[u8] {
        match self.last_data {
            LastData::InBuf { from, len } => self.buf.get(from..from + len).unwrap_or_default(),
            LastData::Inflated => &self.inflated,
        }
    }

    /// Reads more bytes into the buffer; `false` at EOF. Holds no buffer while waiting on an
    /// idle socket.
    async fn fill(&mut self) -> Result<bool, RecordIoError> {
        loop {
            if self.buf.is_empty() {
                readable(&mut self.io).await?;
                self.buf = buffers::take_read();
            } else if self.end == self.buf.len() {
                // Invariant: a full record (< READ_BUF_LEN / 2) always fits after compaction.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match self.io.try_read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.start == self.end {
                        self.release();
                    } else {
                        readable(&mut self.io).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Opens the next complete record in the buffer, if there is one; returns its kind and
    /// where its plaintext lies.
    fn try_open(&mut self) -> Result<Option<(RecordKind, usize, usize)>, RecordIoError> {
        let available = self.end - self.start;
        if available < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        let (kind, body_len) = self.opener.parse_header(header)?;
        if available < HEADER_LEN + body_len {
            return Ok(None);
        }
        let body_start = self.start + HEADER_LEN;
        let plain_len = self
            .opener
            .open(header, &mut self.buf[body_start..body_start + body_len])?;
        self.start = body_start + body_len;
        Ok(Some((kind, body_start, plain_len)))
    }

    /// Returns the buffer to the pool if it holds no partial record: for a direction that
    /// has ended while the other goes on.
    pub fn shrink(&mut self) {
        if self.start == self.end && !self.buf.is_empty() {
            self.release();
        }
        self.inflated = Vec::new();
    }

    /// Whether a read buffer is held (an idle channel must hold none).
    #[cfg(test)]
    #[allow(dead_code)] // used by some test builds only
    pub(crate) fn holds_buffer(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Hands the (empty) buffer back to the pool.
    fn release(&mut self) {
        buffers::give_read(std::mem::take(&mut self.buf));
        self.start = 0;
        self.end = 0;
    }
}

impl<R> Drop for RecordReader<R> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            buffers::give_read(std::mem::take(&mut self.buf));
        }
    }
}

/// Seals and writes records to `W`.
pub struct RecordWriter<W> {
    io: W,
    sealer: Sealer,
    /// No capacity while idle; one record's worth while sending.
    buf: Vec<u8>,
    /// Sealed records waiting to go out with the next write ([`RecordWriter::stage`]).
    staged: Vec<u8>,
}

impl<W: AsyncWrite + Keepalive + Unpin> RecordWriter<W> {
    /// Wraps `io`; `sealer` holds the send keys.
    pub fn new(io: W, sealer: Sealer) -> Self {
        RecordWriter {
            io,
            sealer,
            buf: Vec::new(),
            staged: Vec::new(),
        }
    }

    /// Seals `payload` (at most 64 KiB) as one record of `kind` and writes it.
    ///
    /// # Errors
    /// Socket errors; [`RecordError::TooLarge`] for an oversized payload.
    pub async fn send(&mut self, kind: RecordKind, payload: &[u8]) -> Result<(), RecordIoError> {
        self.send_prefixed(kind, &[], payload).await
    }

    /// Seals `prefix || payload` (together at most 64 KiB) as one record of `kind` and
    /// writes it; saves the caller a copy when a record carries a small header.
    ///
    /// # Errors
    /// As [`RecordWriter::send`].
    pub async fn send_prefixed(
        &mut self,
        kind: RecordKind,
        prefix: &[u8],
        payload: &[u8],
    ) -> Result<(), RecordIoError> {
        let mut buf = buffers::take_write();
        buf.resize(HEADER_LEN, 0);
        buf.extend_from_slice(prefix);
        buf.extend_from_slice(payload);
        let result = self.seal_and_write(kind, &mut buf).await;
        buffers::give_write(buf);
        result
    }

    /// Waits for bytes on `src`, reads up to one record's worth straight into the send buffer
    /// and sends them as a `Data` record. Returns the number of plaintext bytes; 0 means `src`
    /// reached EOF and nothing was sent. The buffer goes back to the pool whenever `src` has
    /// nothing to read.
    ///
    /// # Errors
    /// [`SendFromError::Source`] when reading `src` fails, [`SendFromError::Sink`] when
    /// sealing or writing the record does.
    pub async fn send_from<S: ReadReady>(&mut self, src: &S) -> Result<usize, SendFromError> {
        self.send_from_compressing(src, None).await
    }

    /// Waits until `src` has something to send, meanwhile sending the keepalives the wire
    /// asks for (WebSocket pings: a quiet stream must not look like a dead connection to a
    /// CDN in the path).
    async fn wait_readable<S: ReadReady>(&mut self, src: &S) -> Result<(), SendFromError> {
        loop {
            tokio::select! {
                biased;
                ready = src.readable() => return ready.map_err(SendFromError::Source),
                () = self.io.keepalive_due() => {
                    self.io
                        .send_keepalive()
                        .await
                        .map_err(|e| SendFromError::Sink(e.into()))?;
                }
            }
        }
    }

    /// [`RecordWriter::send_from`], sending what `compressor` shrinks as a `Compressed`
    /// record (`None`: as it is).
    ///
    /// # Errors
    /// As [`RecordWriter::send_from`].
    pub async fn send_from_compressing<S: ReadReady>(
        &mut self,
        src: &S,
        mut compressor: Option<&mut Compressor>,
    ) -> Result<usize, SendFromError> {
        loop {
            if self.buf.capacity() == 0 {
                self.wait_readable(src).await?;
                self.buf = buffers::take_write();
            }
            self.buf.clear();
            self.buf.resize(HEADER_LEN, 0);
            match src.try_read_buf(&mut (&mut self.buf).limit(MAX_PAYLOAD)) {
                Ok(0) => {
                    self.release();
                    return Ok(0);
                }
                Ok(n) => {
                    let mut buf = std::mem::take(&mut self.buf);
                    let mut kind = RecordKind::Data;
                    if let Some(compressor) = compressor.as_deref_mut()
                        && !compressor.skips()
                    {
                        let mut packed = buffers::take_write();
                        packed.clear();
                        packed.resize(HEADER_LEN, 0);
                        if compressor.deflate(&buf[HEADER_LEN..], &mut packed) {
                            // The compressed record goes instead; the plaintext's buffer
                            // goes back to the pool.
                            std::mem::swap(&mut buf, &mut packed);
                            kind = RecordKind::Compressed;
                        }
                        buffers::give_write(packed);
                    }
                    let result = self.seal_and_write(kind, &mut buf).await;
                    self.buf = buf;
                    result.map_err(SendFromError::Sink)?;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.release();
                    // Nothing to send with: staged records go out alone before we wait.
                    self.flush_staged().await.map_err(SendFromError::Sink)?;
                }
                Err(e) => return Err(SendFromError::Source(e)),
            }
        }
    }

    async fn seal_and_write(
        &mut self,
        kind: RecordKind,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordIoError> {
        self.sealer.seal(kind, buf)?;
        if self.staged.is_empty() {
            self.io.write_all(buf).await?;
        } else {
            // One write for the staged records and this one: one segment, one wake-up.
            self.staged.extend_from_slice(buf);
            self.io.write_all(&self.staged).await?;
            self.staged = Vec::new();
        }
        // Free on TCP; TLS and WebSocket hold the tail of a record until flushed.
        self.io.flush().await?;
        Ok(())
    }

    /// Seals a small record now but sends it with the next write, so it shares a segment
    /// (and the peer's wake-up) with what follows: a stream's `StreamOpen` and the visitor's
    /// first bytes. Whatever is staged goes out at the latest when the writer would wait.
    ///
    /// # Errors
    /// [`RecordError`] for an oversized payload.
    pub fn stage(&mut self, kind: RecordKind, payload: &[u8]) -> Result<(), RecordIoError> {
        self.stage_prefixed(kind, &[], payload)
    }

    /// [`RecordWriter::stage`] of `prefix || payload`, as [`RecordWriter::send_prefixed`].
    ///
    /// # Errors
    /// [`RecordError`] for an oversized payload.
    pub fn stage_prefixed(
        &mut self,
        kind: RecordKind,
        prefix: &[u8],
        payload: &[u8],
    ) -> Result<(), RecordIoError> {
        // Sealed in place after the records already staged: no buffer and no copy each.
        let start = self.staged.len();
        self.staged
            .reserve(HEADER_LEN + prefix.len() + payload.len() + MAX_TAG_LEN);
        self.staged.resize(start + HEADER_LEN, 0);
        self.staged.extend_from_slice(prefix);
        self.staged.extend_from_slice(payload);
        let sealed = self.sealer.seal_at(kind, &mut self.staged, start);
        if sealed.is_err() {
            // What was staged before stays whole.
            self.staged.truncate(start);
        }
        Ok(sealed?)
    }

    /// Bytes staged and not yet written.
    pub fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// Sends whatever [`RecordWriter::stage`] left waiting.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn flush_staged(&mut self) -> Result<(), RecordIoError> {
        if !self.staged.is_empty() {
            self.io.write_all(&self.staged).await?;
            self.staged = Vec::new();
            self.io.flush().await?;
        }
        Ok(())
    }

    /// Flushes and shuts down the write side of the connection.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn shutdown(&mut self) -> Result<(), RecordIoError> {
        self.flush_staged().await?;
        self.io.shutdown().await?;
        Ok(())
    }

    fn release(&mut self) {
        buffers::give_write(std::mem::take(&mut self.buf));
    }
}

impl<W> Drop for RecordWriter<W> {
    fn drop(&mut self) {
        if self.buf.capacity() != 0 {
            buffers::give_write(std::mem::take(&mut self.buf));
        }
    }
}

/// Which side of [`RecordWriter::send_from`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SendFromError {
    /// Reading the plaintext source failed.
    #[error("reading the local connection failed: {0}")]
    Source(io::Error),
    /// Writing the record failed.
    #[error(transparent)]
    Sink(RecordIoError),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};
    use warren_proto::CipherSuite;

    use super::*;
    use crate::crypto::record::DirectionKeys;

    const SUITE: CipherSuite = CipherSuite::Aes128Gcm;

    fn keys() -> DirectionKeys {
        DirectionKeys::derive(SUITE, &[7u8; 32], b"records test")
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// Seals records into wire bytes, as the peer would send them.
    fn wire(records: &[(RecordKind, &[u8])]) -> Vec<u8> {
        let mut sealer = Sealer::new(SUITE, keys());
        let mut out = Vec::new();
        for (kind, payload) in records {
            let mut buf = vec![0u8; HEADER_LEN];
            buf.extend_from_slice(payload);
            sealer.seal(*kind, &mut buf).unwrap();
            out.extend_from_slice(&buf);
        }
        out
    }

    #[tokio::test]
    async fn records_split_at_every_awkward_boundary_arrive_whole() {
        let (mut tx, rx) = pair().await;
        let big = vec![0xabu8; MAX_PAYLOAD];
        let bytes = wire(&[
            (RecordKind::Data, b"hello"),
            (RecordKind::Data, &big),
            (RecordKind::Control, b"ctl"),
            (RecordKind::End, b""),
        ]);
        let writer = tokio::spawn(async move {
            // Dribble: one byte, then growing chunks, so headers and bodies split everywhere.
            let mut at = 0;
            let mut step = 1;
            while at < bytes.len() {
                let end = (at + step).min(bytes.len());
                tx.write_all(&bytes[at..end]).await.unwrap();
                tx.flush().await.unwrap();
                at = end;
                step = step * 3 + 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tx
        });
        let mut reader = RecordReader::new(rx, Opener::new(SUITE, keys()));
        assert_eq!(reader.read().await.unwrap(), Some(Record::Data(b"hello")));
        assert_eq!(reader.last_data(), b"hello", "kept until the next read");
        assert_eq!(reader.read().await.unwrap(), Some(Record::Data(&big[..])));
        assert_eq!(reader.last_data(), &big[..]);
        assert_eq!(reader.read().await.unwrap(), Some(Record::Control(b"ctl")));
        assert_eq!(reader.read().await.unwrap(), Some(Record::End));
        drop(writer.await.unwrap());
        assert_eq!(
            reader.read().await.unwrap(),
            None,
            "clean EOF between records"
        );
    }

    #[tokio::test]
    async fn compressed_records_arrive_as_data_and_a_bomb_is_refused() {
        use crate::transport::compress::{Codec, Compressor};
        let (tx, rx) = pair().await;
        let (_, tx) = tx.into_split();
        let mut writer = RecordWriter::new(tx, Sealer::new(SUITE, keys()));
        let mut reader = RecordReader::new(rx, Opener::new(SUITE, keys()));
        // Compressible bytes through send_from_compressing come out whole.
        let (source, mut feed) = pair().await;
        let text: Vec<u8> = b"GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n"
            .iter()
            .copied()
            .cycle()
            .take(40_000)
            .collect();
        feed.write_all(&text).await.unwrap();
        let mut compressor = Compressor::new(Codec::Lz4);
        let mut got = Vec::new();
        while got.len() < text.len() {
            let sent = writer
                .send_from_compressing(&source, Some(&mut compressor))
                .await
                .unwrap();
            assert!(sent > 0);
            let len = match reader.read().await.unwrap() {
                Some(Record::Data(bytes)) => bytes.len(),
                other => panic!("expected data, got {other:?}"),
            };
            // What `last_data` hands out is the inflated record too.
            assert_eq!(reader.last_data().len(), len);
            got.extend_from_slice(reader.last_data());
        }
        assert_eq!(got, text);
        // A record that inflates past 64 KiB is refused, not inflated.
        let zeros = vec![0u8; 4 * MAX_PAYLOAD];
        let mut packed = vec![0u8; lz4_flex::block::get_maximum_output_size(zeros.len())];
        let n = lz4_flex::block::compress_into(&zeros, &mut packed).unwrap();
        let mut bomb = vec![1u8];
        bomb.extend_from_slice(&packed[..n]);
        writer.send(RecordKind::Compressed, &bomb).await.unwrap();
        let refused = reader.read().await.unwrap_err();
        assert!(matches!(refused, RecordIoError::Inflate(_)), "{refused}");
        assert!(
            refused.to_string().contains("decompression bomb"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn an_idle_reader_holds_no_buffer() {
        let (mut tx, rx) = pair().await;
        let mut reader = RecordReader::new(rx, Opener::new(SUITE, keys()));
        tx.write_all(&wire(&[(RecordKind::Data, b"one")]))
            .await
            .unwrap();
        assert_eq!(reader.read().await.unwrap(), Some(Record::Data(b"one")));
        // Nothing more comes: the next read waits without a buffer.
        let waited = tokio::time::timeout(Duration::from_millis(50), reader.read()).await;
        assert!(waited.is_err());
        assert_eq!(reader.buf.capacity(), 0, "idle reader kept its buffer");
    }

    #[tokio::test]
    async fn eof_inside_a_record_is_an_error() {
        let (mut tx, rx) = pair().await;
        let bytes = wire(&[(RecordKind::Data, b"cut short")]);
        tx.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
        drop(tx);
        let mut reader = RecordReader::new(rx, Opener::new(SUITE, keys()));
        assert!(matches!(reader.read().await, Err(RecordIoError::Truncated)));
    }

    #[tokio::test]
    async fn a_flipped_byte_is_never_delivered() {
        let (mut tx, rx) = pair().await;
        let mut bytes = wire(&[(RecordKind::Data, b"integrity matters")]);
        bytes[HEADER_LEN + 3] ^= 0x20;
        tx.write_all(&bytes).await.unwrap();
        let mut reader = RecordReader::new(rx, Opener::new(SUITE, keys()));
        assert!(matches!(
            reader.read().await,
            Err(RecordIoError::Record(RecordError::Decrypt))
        ));
    }

    /// A sink whose keepalive is due every 10 s, counting the ones sent.
    #[derive(Default)]
    struct PingingSink {
        written: Vec<u8>,
        keepalives: usize,
    }

    impl AsyncWrite for PingingSink {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            self.get_mut().written.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl Keepalive for PingingSink {
        async fn keepalive_due(&mut self) {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        async fn send_keepalive(&mut self) -> io::Result<()> {
            self.keepalives += 1;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_source_gets_the_wires_keepalives_sent() {
        let (mut source_tx, source_rx) = pair().await;
        let mut writer = RecordWriter::new(PingingSink::default(), Sealer::new(SUITE, keys()));
        let waited =
            tokio::time::timeout(Duration::from_secs(35), writer.send_from(&source_rx)).await;
        assert!(waited.is_err(), "nothing to send yet");
        assert_eq!(writer.io.keepalives, 3);
        assert!(
            writer.io.written.is_empty(),
            "keepalives are the wire's, not records"
        );
        source_tx.write_all(b"at last").await.unwrap();
        assert_eq!(writer.send_from(&source_rx).await.unwrap(), 7);
        assert!(!writer.io.written.is_empty());
    }

    #[tokio::test]
    async fn send_from_moves_bytes_and_releases_its_buffer_when_idle() {
        let (mut source_tx, source_rx) = pair().await;
        let (sink_tx, sink_rx) = pair().await;
        let (_, sink_tx) = sink_tx.into_split();
        let mut writer = RecordWriter::new(sink_tx, Sealer::new(SUITE, keys()));
        let mut reader = RecordReader::new(sink_rx, Opener::new(SUITE, keys()));
        source_tx.write_all(b"through").await.unwrap();
        assert_eq!(writer.send_from(&source_rx).await.unwrap(), 7);
        assert_eq!(reader.read().await.unwrap(), Some(Record::Data(b"through")));
        let waited =
            tokio::time::timeout(Duration::from_millis(50), writer.send_from(&source_rx)).await;
        assert!(waited.is_err());
        assert_eq!(writer.buf.capacity(), 0, "idle writer kept its buffer");
        drop(source_tx);
        assert_eq!(writer.send_from(&source_rx).await.unwrap(), 0, "EOF");
    }
}
