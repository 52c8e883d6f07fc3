//! Streams: one visitor connection (or a control channel, or a datagram channel) carried by
//! a session, whatever the transport underneath.
//!
//! A [`Stream`] is a pair of byte directions with half-close, as the design promises:
//! chunks of bytes, an end of stream (`finish`), an abort with a reason (`reset`), and a
//! stream that dies without either surfaces as [`StreamError::Cut`], so a cut transfer never
//! looks complete. Whole messages ([`StreamReader::read_message`],
//! [`StreamWriter::send_message`]) carry the `StreamOpen` at a stream's start and the
//! control channel's messages.
//!
//! The implementations are the variants of an enum ([`StreamReader`], [`StreamWriter`]), so
//! the relay's hot path dispatches with a `match`, not a virtual call. An async method's
//! future is as large as its largest arm's, and every open stream holds one per direction,
//! on both sides: the QUIC arms' futures are boxed (one small allocation per chunk, next
//! to QUIC's per-packet work), so the TCP transports' streams stay as small as before
//! (measured: +0.9 KB per idle connection without the boxes).
//! * `Tcp`: a data channel of the TCP transports (plaintext or Noise-keyed records, see
//!   [`crate::transport::records`]). Data is `Data` records, the end an `End` record, a
//!   reset a `Close` record with its reason, a message a `Control` record.
//! * `Quic`: a native QUIC stream ([`super::quic`]): bytes, FIN, `RESET_STREAM` with a
//!   reason code, length-prefixed messages.
//!
//! Code above this module (relay, server, client) never matches on the variants; only the
//! transports' own modules and [`super::datagram`] do.

use std::borrow::Cow;

use crate::transport::wire::{WireReader, WireWriter};

use super::quic::{QuicReader, QuicWriter};
use crate::crypto::record::RecordKind;
use crate::transport::Channel;
use crate::transport::compress::Compressor;
use crate::transport::records::{
    ReadReady, Record, RecordIoError, RecordReader, RecordWriter, SendFromError,
};

/// One piece of a stream as it arrives.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// Stream bytes (borrowing the reader's buffer until the next read).
    Data(&'a [u8]),
    /// The peer finished this direction (half-close); the other one may go on.
    End,
    /// The peer aborted the stream, with its reason.
    Reset(Cow<'a, str>),
}

/// Why a stream could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The connection under the stream failed (socket error, forged or malformed record).
    #[error("tunnel connection failed: {0}")]
    Transport(#[from] RecordIoError),
    /// The QUIC stream or connection failed.
    #[error("QUIC stream failed: {0}")]
    Quic(String),
    /// The stream ended without an end of stream or a reset: its connection or session
    /// died.
    #[error("the stream was cut (its connection closed without end-of-stream)")]
    Cut,
    /// The peer sent something a stream does not allow here.
    #[error("protocol violation by the peer: {0}")]
    Protocol(&'static str),
}

/// Which side of [`StreamWriter::send_from`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Reading the local source failed.
    #[error("reading the local connection failed: {0}")]
    Source(std::io::Error),
    /// Writing into the stream failed.
    #[error(transparent)]
    Sink(StreamError),
}

/// Both directions of one stream.
pub struct Stream {
    /// What the peer sends.
    pub reader: StreamReader,
    /// What we send.
    pub writer: StreamWriter,
}

impl Stream {
    /// A stream carried by one TCP data channel.
    pub fn tcp(channel: Channel) -> Self {
        let Channel { reader, writer } = channel;
        Stream {
            reader: StreamReader::Tcp(reader),
            writer: StreamWriter::Tcp(writer),
        }
    }

    /// The TCP data channel under a `Tcp` stream (for the TCP transport's pool); `None`
    /// for any other transport.
    pub(crate) fn into_tcp(self) -> Option<Channel> {
        match (self.reader, self.writer) {
            (StreamReader::Tcp(reader), StreamWriter::Tcp(writer)) => {
                Some(Channel { reader, writer })
            }
            _ => None,
        }
    }
}

/// The receiving direction of a stream.
pub enum StreamReader {
    /// Records on a TCP data channel.
    Tcp(RecordReader<WireReader>),
    /// A QUIC stream.
    Quic(QuicReader),
}

impl StreamReader {
    /// The next chunk of the stream. After [`Chunk::End`] this direction is over.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// [`StreamError::Cut`] when the stream died without an end or a reset; transport
    /// failures; a message or datagram inside a stream is a protocol violation.
    pub async fn read(&mut self) -> Result<Chunk<'_>, StreamError> {
        match self {
            StreamReader::Tcp(reader) => match reader.read().await? {
                Some(Record::Data(bytes)) => Ok(Chunk::Data(bytes)),
                Some(Record::End) => Ok(Chunk::End),
                Some(Record::Close(reason)) => Ok(Chunk::Reset(String::from_utf8_lossy(reason))),
                Some(Record::Control(_) | Record::Datagram(_)) => Err(StreamError::Protocol(
                    "a control or datagram record inside a stream",
                )),
                None => Err(StreamError::Cut),
            },
            StreamReader::Quic(reader) => Box::pin(reader.read()).await,
        }
    }

    /// The bytes of the last [`Chunk::Data`] [`StreamReader::read`] returned, until the next
    /// read: for a caller that hands them out piecewise once the read's borrow has ended.
    pub fn last_data(&self) -> &[u8] {
        match self {
            StreamReader::Tcp(reader) => reader.last_data(),
            StreamReader::Quic(reader) => reader.last_data(),
        }
    }

    /// The next whole message (a `StreamOpen`, a control message). `Ok(Err(reason))` when
    /// the peer reset the stream instead.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`StreamReader::read`]; stream bytes where a message belongs are a protocol
    /// violation.
    pub async fn read_message(&mut self) -> Result<Result<&[u8], Cow<'_, str>>, StreamError> {
        match self {
            StreamReader::Tcp(reader) => match reader.read().await? {
                Some(Record::Control(bytes)) => Ok(Ok(bytes)),
                Some(Record::Close(reason)) => Ok(Err(String::from_utf8_lossy(reason))),
                Some(_) => Err(StreamError::Protocol("stream data where a message belongs")),
                None => Err(StreamError::Cut),
            },
            StreamReader::Quic(reader) => Box::pin(reader.read_message()).await,
        }
    }

    /// Lets go of the read buffer if it holds nothing: for a direction that ended while
    /// the other goes on, or a stream about to wait idle.
    pub fn shrink(&mut self) {
        match self {
            StreamReader::Tcp(reader) => reader.shrink(),
            StreamReader::Quic(reader) => reader.shrink(),
        }
    }
}

/// The sending direction of a stream.
pub enum StreamWriter {
    /// Records on a TCP data channel.
    Tcp(RecordWriter<WireWriter>),
    /// A QUIC stream.
    Quic(QuicWriter),
}

impl StreamWriter {
    /// Sends stream bytes.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => {
                for chunk in bytes.chunks(crate::crypto::record::MAX_PAYLOAD) {
                    writer.send(RecordKind::Data, chunk).await?;
                }
                Ok(())
            }
            StreamWriter::Quic(writer) => Box::pin(writer.send(bytes)).await,
        }
    }

    /// Waits for bytes on `src` and sends what it has, reading straight into the
    /// transport's buffer. Returns the bytes sent; 0 means `src` reached EOF (nothing was
    /// sent, the stream is not finished).
    ///
    /// # Errors
    /// Which side failed.
    pub async fn send_from<S: ReadReady>(&mut self, src: &S) -> Result<usize, SendError> {
        self.send_from_compressing(src, None).await
    }

    /// [`StreamWriter::send_from`], compressing with `compressor` what it shrinks. Only
    /// the record transports compress; a QUIC stream sends the bytes as they are.
    ///
    /// # Errors
    /// Which side failed.
    pub async fn send_from_compressing<S: ReadReady>(
        &mut self,
        src: &S,
        compressor: Option<&mut Compressor>,
    ) -> Result<usize, SendError> {
        match self {
            StreamWriter::Tcp(writer) => writer
                .send_from_compressing(src, compressor)
                .await
                .map_err(|e| match e {
                    SendFromError::Source(e) => SendError::Source(e),
                    SendFromError::Sink(e) => SendError::Sink(e.into()),
                }),
            StreamWriter::Quic(writer) => Box::pin(writer.send_from(src)).await,
        }
    }

    /// Ends this direction (half-close): the peer reads [`Chunk::End`].
    ///
    /// # Errors
    /// Transport failures.
    pub async fn finish(&mut self) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.send(RecordKind::End, &[]).await?),
            StreamWriter::Quic(writer) => Box::pin(writer.finish()).await,
        }
    }

    /// Like [`StreamWriter::finish`], but the end leaves with the next write (or
    /// [`StreamWriter::flush`]): one segment and one wake-up of the peer fewer when
    /// something follows at once.
    ///
    /// # Errors
    /// Transport failures.
    pub fn stage_finish(&mut self) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.stage(RecordKind::End, &[])?),
            StreamWriter::Quic(writer) => writer.stage_finish(),
        }
    }

    /// Aborts the stream: the peer reads [`Chunk::Reset`] with `reason`. Not bounded in
    /// time: callers that may meet a stuck peer put a timeout around it.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn reset(&mut self, reason: &str) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => {
                Ok(writer.send(RecordKind::Close, reason.as_bytes()).await?)
            }
            StreamWriter::Quic(writer) => writer.reset(reason),
        }
    }

    /// Sends one whole message.
    ///
    /// # Errors
    /// Transport failures; a message over the transport's limit.
    pub async fn send_message(&mut self, message: &[u8]) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.send(RecordKind::Control, message).await?),
            StreamWriter::Quic(writer) => Box::pin(writer.send_message(message)).await,
        }
    }

    /// Queues one whole message to leave with the next write (a `StreamOpen` and the
    /// visitor's first bytes share a segment).
    ///
    /// # Errors
    /// A message over the transport's limit.
    pub fn stage_message(&mut self, message: &[u8]) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.stage(RecordKind::Control, message)?),
            StreamWriter::Quic(writer) => writer.stage_message(message),
        }
    }

    /// Sends whatever the `stage_*` calls left waiting.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn flush(&mut self) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.flush_staged().await?),
            StreamWriter::Quic(writer) => Box::pin(writer.flush()).await,
        }
    }

    /// Flushes and closes the connection's sending side (a control channel's goodbye).
    ///
    /// # Errors
    /// Transport failures.
    pub async fn shutdown(&mut self) -> Result<(), StreamError> {
        match self {
            StreamWriter::Tcp(writer) => Ok(writer.shutdown().await?),
            StreamWriter::Quic(writer) => Box::pin(writer.shutdown()).await,
        }
    }
}
