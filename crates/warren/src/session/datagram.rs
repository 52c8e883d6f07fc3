//! Datagrams over a session: whole UDP datagrams, tagged with a flow id, carried by one
//! channel.
//!
//! On the TCP-based transports a [`DatagramChannel`] is a stream (a data channel, after its
//! `StreamOpen`) that carries `Datagram` records only; each record
//! is one datagram, so a datagram arrives whole or not at all and two are never merged:
//!
//! ```text
//! record kind 4 (Datagram), payload = flow_id: u32 BE || datagram (0..=65,507 bytes)
//! ```
//!
//! `65,507 + 4` fits in one record (64 KiB), so nothing is ever split. The flow id names the
//! visitor the datagram belongs to; the server assigns ids, the client keeps one socket per
//! id. A `Close` record or the end of the connection ends the channel; the next datagram
//! opens a new one.
//!
//! On QUIC the channel is a QUIC stream that carries no bytes: its datagrams are QUIC
//! datagrams tagged with the stream's id and the flow ([`super::quic_datagram`]), and the
//! stream only marks the channel's life (finished or reset: closed).
//!
//! Main types: [`DatagramChannel`], split into [`DatagramSender`] and [`DatagramReceiver`]
//! so each direction can run in its own future.

use std::sync::Arc;

use crate::transport::wire::{WireReader, WireWriter};
use bytes::Bytes;

use super::datagram_queue::QueuedDatagrams;
use super::quic::{QuicReader, QuicWriter};
use super::quic_datagram::Datagrams;
use super::stream::{Chunk, Stream, StreamError, StreamReader, StreamWriter};
use crate::crypto::record::RecordKind;
use crate::transport::records::{Record, RecordIoError, RecordReader, RecordWriter};

/// The largest UDP payload over IPv4 (65,535 − 8 UDP − 20 IP header bytes); larger
/// datagrams are dropped and counted, never truncated.
pub const MAX_DATAGRAM_LEN: usize = 65_507;

/// Bytes of the flow id in front of each datagram.
pub const FLOW_ID_LEN: usize = 4;

/// Names one visitor's flow within one service: assigned by the server, never reused
/// while the server runs (it wraps after 2^32 flows).
pub type FlowId = u32;

/// Errors on a datagram channel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// The channel failed: socket error or a record that did not authenticate.
    #[error(transparent)]
    Io(#[from] RecordIoError),
    /// The QUIC connection failed or takes no datagrams.
    #[error("QUIC datagrams: {0}")]
    Quic(String),
    /// A datagram larger than [`MAX_DATAGRAM_LEN`] was offered; nothing was sent.
    #[error("datagram of {len} bytes is larger than the maximum of {MAX_DATAGRAM_LEN}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// The peer sent something other than a well-formed datagram record.
    #[error("protocol violation on a datagram channel: {0}")]
    Protocol(&'static str),
}

/// A channel that carries datagrams of many flows of one service.
pub struct DatagramChannel {
    sender: DatagramSender,
    receiver: DatagramReceiver,
}

impl DatagramChannel {
    /// Uses `stream` (whose `StreamOpen` has been sent or received) for datagrams.
    pub fn new(stream: Stream) -> Self {
        let (sender, receiver) = match (stream.reader, stream.writer) {
            (StreamReader::Tcp(reader), StreamWriter::Tcp(writer)) => {
                (Sender::Tcp(writer), Receiver::Tcp(reader))
            }
            (StreamReader::Quic(reader), StreamWriter::Quic(writer)) => {
                match writer.datagram_channel() {
                    Some((datagrams, channel)) => {
                        let queue = datagrams.register(channel);
                        (
                            Sender::Quic {
                                datagrams: Arc::clone(&datagrams),
                                channel,
                                writer,
                                opened: false,
                            },
                            Receiver::Quic(QuicReceiver {
                                datagrams,
                                channel,
                                queue,
                                reader,
                                current: Bytes::new(),
                            }),
                        )
                    }
                    // A control stream is never a datagram channel.
                    None => (Sender::Gone, Receiver::Gone),
                }
            }
            // A stream's halves always come from one transport.
            (reader, writer) => {
                drop((reader, writer));
                (Sender::Gone, Receiver::Gone)
            }
        };
        DatagramChannel {
            sender: DatagramSender(sender),
            receiver: DatagramReceiver(receiver),
        }
    }

    /// Splits into the two directions.
    pub fn split(self) -> (DatagramSender, DatagramReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half of a [`DatagramChannel`].
pub struct DatagramSender(Sender);

enum Sender {
    Tcp(RecordWriter<WireWriter>),
    Quic {
        datagrams: Arc<Datagrams>,
        channel: u32,
        /// The channel's stream: its `StreamOpen`, then only its end.
        writer: QuicWriter,
        /// Whether the stream's `StreamOpen` has left.
        opened: bool,
    },
    Gone,
}

impl DatagramSender {
    /// Sends one datagram of `flow` (one record on TCP; one QUIC datagram, or its
    /// fragments, on QUIC).
    ///
    /// Not cancel safe: a cancelled send may leave half a record on the connection, so
    /// drop the channel after cancelling.
    ///
    /// # Errors
    /// [`DatagramError::TooLarge`] (nothing sent, the channel is still usable), or a
    /// channel failure.
    pub async fn send_datagram(&mut self, flow: FlowId, bytes: &[u8]) -> Result<(), DatagramError> {
        if bytes.len() > MAX_DATAGRAM_LEN {
            return Err(DatagramError::TooLarge { len: bytes.len() });
        }
        match &mut self.0 {
            Sender::Tcp(writer) => {
                writer
                    .send_prefixed(RecordKind::Datagram, &flow.to_be_bytes(), bytes)
                    .await?;
                Ok(())
            }
            Sender::Quic {
                datagrams,
                channel,
                writer,
                opened,
            } => {
                if !*opened {
                    // The peer learns of the channel from its stream: open it first.
                    writer.flush().await.map_err(quic_error)?;
                    *opened = true;
                }
                datagrams.send(*channel, flow, bytes).await
            }
            Sender::Gone => Err(DatagramError::Protocol("a stream of mixed transports")),
        }
    }

    /// Sends the datagrams `queue` brings until it closes. On TCP whatever is already
    /// queued when one arrives goes out in the same write (up to [`BATCH_BYTES`]): a burst
    /// of datagrams costs one system call and one wake-up of the peer, not one per
    /// datagram, and each datagram is still its own record.
    ///
    /// # Errors
    /// As [`DatagramSender::send_datagram`]; the batch that failed is lost.
    pub async fn send_queued(&mut self, queue: &mut QueuedDatagrams) -> Result<(), DatagramError> {
        while let Some((flow, bytes)) = queue.recv().await {
            let Sender::Tcp(writer) = &mut self.0 else {
                self.send_datagram(flow, &bytes).await?;
                continue;
            };
            stage_datagram(writer, flow, &bytes)?;
            while writer.staged_len() < BATCH_BYTES
                && let Some((flow, bytes)) = queue.try_recv()
            {
                stage_datagram(writer, flow, &bytes)?;
            }
            writer.flush_staged().await?;
        }
        Ok(())
    }

    /// Tells the peer the channel is closing, with a reason.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn close(&mut self, reason: &str) -> Result<(), DatagramError> {
        match &mut self.0 {
            Sender::Tcp(writer) => {
                writer.send(RecordKind::Close, reason.as_bytes()).await?;
                Ok(())
            }
            Sender::Quic { writer, .. } => writer.reset(reason).map_err(quic_error),
            Sender::Gone => Ok(()),
        }
    }
}

/// Staged bytes past which a batch of datagrams is written ([`DatagramSender::send_queued`]):
/// about 90 datagrams of 1,400 bytes, few enough that the first waits little.
pub const BATCH_BYTES: usize = 128 * 1024;

/// Seals one datagram as a record waiting for the batch's write.
fn stage_datagram(
    writer: &mut RecordWriter<WireWriter>,
    flow: FlowId,
    bytes: &[u8],
) -> Result<(), DatagramError> {
    if bytes.len() > MAX_DATAGRAM_LEN {
        return Err(DatagramError::TooLarge { len: bytes.len() });
    }
    writer.stage_prefixed(RecordKind::Datagram, &flow.to_be_bytes(), bytes)?;
    Ok(())
}

fn quic_error(error: StreamError) -> DatagramError {
    DatagramError::Quic(error.to_string())
}

/// The receiving half of a [`DatagramChannel`].
pub struct DatagramReceiver(Receiver);

enum Receiver {
    Tcp(RecordReader<WireReader>),
    Quic(QuicReceiver),
    Gone,
}

struct QuicReceiver {
    datagrams: Arc<Datagrams>,
    channel: u32,
    queue: QueuedDatagrams<Bytes>,
    /// The channel's stream: it only ends.
    reader: QuicReader,
    /// The datagram the last receive handed out.
    current: Bytes,
}

impl Drop for QuicReceiver {
    fn drop(&mut self) {
        self.datagrams.unregister(self.channel);
    }
}

impl DatagramReceiver {
    /// Receives the next datagram and its flow; `Ok(None)` when the peer closed the channel.
    /// The bytes borrow the channel's buffer until the next call.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// A channel failure, or a record that is not a well-formed datagram.
    pub async fn recv_datagram(&mut self) -> Result<Option<(FlowId, &[u8])>, DatagramError> {
        match &mut self.0 {
            Receiver::Tcp(reader) => match reader.read().await? {
                Some(Record::Datagram(payload)) => {
                    let Some((id, bytes)) = payload.split_first_chunk::<FLOW_ID_LEN>() else {
                        return Err(DatagramError::Protocol("datagram record without a flow id"));
                    };
                    if bytes.len() > MAX_DATAGRAM_LEN {
                        return Err(DatagramError::Protocol("datagram larger than 65,507 bytes"));
                    }
                    Ok(Some((FlowId::from_be_bytes(*id), bytes)))
                }
                Some(Record::Close(_) | Record::End) | None => Ok(None),
                Some(Record::Data(_) | Record::Control(_)) => Err(DatagramError::Protocol(
                    "stream or control record on a datagram channel",
                )),
            },
            Receiver::Quic(quic) => {
                let flow = tokio::select! {
                    received = quic.queue.recv() => match received {
                        Some((flow, bytes)) => {
                            quic.current = bytes;
                            flow
                        }
                        None => return Ok(None),
                    },
                    chunk = quic.reader.read() => return match chunk {
                        Ok(Chunk::End | Chunk::Reset(_)) | Err(StreamError::Cut) => Ok(None),
                        Ok(Chunk::Data(_)) => Err(DatagramError::Protocol(
                            "stream bytes on a datagram channel",
                        )),
                        Err(error) => Err(quic_error(error)),
                    },
                };
                Ok(Some((flow, &quic.current)))
            }
            Receiver::Gone => Ok(None),
        }
    }
}
