//! Async record streams: the AEAD record layer ([`crate::crypto::record`]) over any byte
//! stream.
//!
//! [`RecordReader`] reads as many bytes as the socket has into one reusable buffer and opens
//! records in place, so a busy stream costs one `read` per several records and no allocation
//! per record. [`RecordWriter`] lets the caller read plaintext straight into its buffer
//! ([`RecordWriter::send_from`]), seals it in place and writes it out with one `write`.
//!
//! Memory: buffers start small and grow to hold a full record only when one arrives, so an
//! idle channel holds a few KiB, not 128.

use bytes::BufMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::crypto::record::{
    HEADER_LEN, MAX_PAYLOAD, MAX_TAG_LEN, Opener, RecordError, RecordKind, Sealer,
};

/// Initial read buffer: enough for control messages and small records.
const INITIAL_READ_BUF: usize = 4 * 1024;
/// Largest record on the wire.
const MAX_WIRE_RECORD: usize = HEADER_LEN + MAX_PAYLOAD + MAX_TAG_LEN;
/// Read buffer once bulk data flows: two full records, so one `read` can drain a lot.
const BULK_READ_BUF: usize = 2 * MAX_WIRE_RECORD;

/// Errors reading or writing records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordIoError {
    /// The socket failed.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// A record was malformed or failed authentication.
    #[error(transparent)]
    Record(#[from] RecordError),
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
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> RecordReader<R> {
    /// Wraps `io`; `opener` holds the receive keys.
    pub fn new(io: R, opener: Opener) -> Self {
        RecordReader {
            io,
            opener,
            buf: Vec::new(),
            start: 0,
            end: 0,
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
                let payload = &self.buf[from..from + len];
                return Ok(Some(match kind {
                    RecordKind::Data => Record::Data(payload),
                    RecordKind::End => Record::End,
                    RecordKind::Control => Record::Control(payload),
                    RecordKind::Close => Record::Close(payload),
                    RecordKind::Datagram => Record::Datagram(payload),
                }));
            }
            if self.buf.len() == self.end {
                self.make_room();
            }
            let n = self.io.read(&mut self.buf[self.end..]).await?;
            if n == 0 {
                return if self.start == self.end {
                    Ok(None)
                } else {
                    Err(RecordIoError::Truncated)
                };
            }
            self.end += n;
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
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(Some((kind, body_start, plain_len)))
    }

    /// Called when the buffer is full: moves the partial record to the front and grows the
    /// buffer if a full record would not fit.
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let new_len = match self.buf.len() {
                0 => INITIAL_READ_BUF,
                n if n < BULK_READ_BUF => BULK_READ_BUF,
                n => n, // unreachable: a full record always fits in BULK_READ_BUF
            };
            self.buf.resize(new_len, 0);
        }
    }

    /// Releases the read buffer if it holds no partial record (call when going idle).
    pub fn shrink(&mut self) {
        if self.start == self.end {
            self.buf = Vec::new();
            self.start = 0;
            self.end = 0;
        }
    }
}

/// Seals and writes records to `W`.
pub struct RecordWriter<W> {
    io: W,
    sealer: Sealer,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> RecordWriter<W> {
    /// Wraps `io`; `sealer` holds the send keys.
    pub fn new(io: W, sealer: Sealer) -> Self {
        RecordWriter {
            io,
            sealer,
            buf: Vec::new(),
        }
    }

    /// Seals `payload` (at most 64 KiB) as one record of `kind` and writes it.
    ///
    /// # Errors
    /// Socket errors; [`RecordError::TooLarge`] for an oversized payload.
    pub async fn send(&mut self, kind: RecordKind, payload: &[u8]) -> Result<(), RecordIoError> {
        self.buf.clear();
        self.buf.reserve(HEADER_LEN + payload.len() + MAX_TAG_LEN);
        self.buf.resize(HEADER_LEN, 0);
        self.buf.extend_from_slice(payload);
        self.seal_and_write(kind).await
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
        self.buf.clear();
        self.buf
            .reserve(HEADER_LEN + prefix.len() + payload.len() + MAX_TAG_LEN);
        self.buf.resize(HEADER_LEN, 0);
        self.buf.extend_from_slice(prefix);
        self.buf.extend_from_slice(payload);
        self.seal_and_write(kind).await
    }

    /// Reads up to one record's worth of bytes from `src` straight into the send buffer and
    /// sends them as a `Data` record. Returns the number of plaintext bytes; 0 means `src`
    /// reached EOF and nothing was sent.
    ///
    /// # Errors
    /// Errors from `src` come back as [`RecordIoError::Io`] too; callers that must tell the
    /// two sides apart read into their own buffer and call [`RecordWriter::send`].
    pub async fn send_from<S: AsyncRead + Unpin>(
        &mut self,
        src: &mut S,
    ) -> Result<usize, SendFromError> {
        if self.buf.capacity() < MAX_WIRE_RECORD {
            self.buf = Vec::with_capacity(MAX_WIRE_RECORD);
        }
        self.buf.clear();
        self.buf.resize(HEADER_LEN, 0);
        let n = src
            .read_buf(&mut (&mut self.buf).limit(MAX_PAYLOAD))
            .await
            .map_err(SendFromError::Source)?;
        if n == 0 {
            return Ok(0);
        }
        self.seal_and_write(RecordKind::Data)
            .await
            .map_err(SendFromError::Sink)?;
        Ok(n)
    }

    async fn seal_and_write(&mut self, kind: RecordKind) -> Result<(), RecordIoError> {
        self.sealer.seal(kind, &mut self.buf)?;
        self.io.write_all(&self.buf).await?;
        Ok(())
    }

    /// Flushes and shuts down the write side of the connection.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn shutdown(&mut self) -> Result<(), RecordIoError> {
        self.io.shutdown().await?;
        Ok(())
    }

    /// Releases the send buffer (call when going idle).
    pub fn shrink(&mut self) {
        self.buf = Vec::new();
    }
}

/// Which side of [`RecordWriter::send_from`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SendFromError {
    /// Reading the plaintext source failed.
    #[error("reading the local connection failed: {0}")]
    Source(std::io::Error),
    /// Writing the record failed.
    #[error(transparent)]
    Sink(RecordIoError),
}
