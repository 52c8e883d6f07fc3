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
//! opens a new one. QUIC will carry the same `(flow, bytes)` pairs as QUIC datagrams behind
//! this same API.
//!
//! Main types: [`DatagramChannel`], split into [`DatagramSender`] and [`DatagramReceiver`]
//! so each direction can run in its own future.

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::stream::{Stream, StreamReader, StreamWriter};
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
        let (StreamReader::Tcp(reader), StreamWriter::Tcp(writer)) = (stream.reader, stream.writer)
        else {
            todo!("QUIC datagrams")
        };
        DatagramChannel {
            sender: DatagramSender { writer },
            receiver: DatagramReceiver { reader },
        }
    }

    /// Splits into the two directions.
    pub fn split(self) -> (DatagramSender, DatagramReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half of a [`DatagramChannel`].
pub struct DatagramSender {
    writer: RecordWriter<OwnedWriteHalf>,
}

impl DatagramSender {
    /// Sends one datagram of `flow` as one record.
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
        self.writer
            .send_prefixed(RecordKind::Datagram, &flow.to_be_bytes(), bytes)
            .await?;
        Ok(())
    }

    /// Tells the peer the channel is closing, with a reason.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn close(&mut self, reason: &str) -> Result<(), DatagramError> {
        self.writer
            .send(RecordKind::Close, reason.as_bytes())
            .await?;
        Ok(())
    }
}

/// The receiving half of a [`DatagramChannel`].
pub struct DatagramReceiver {
    reader: RecordReader<OwnedReadHalf>,
}

impl DatagramReceiver {
    /// Receives the next datagram and its flow; `Ok(None)` when the peer closed the channel.
    /// The bytes borrow the channel's buffer until the next call.
    ///
    /// Cancel safe (the record reader is).
    ///
    /// # Errors
    /// A channel failure, or a record that is not a well-formed datagram.
    pub async fn recv_datagram(&mut self) -> Result<Option<(FlowId, &[u8])>, DatagramError> {
        match self.reader.read().await? {
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
        }
    }
}
