//! Control messages and data frames over quinn streams: framing, bounds checked before
//! allocation, and a timeout on every wait.
//!
//! Also the two ways a transfer ends on the connection: `close_done` after the last
//! message, and `cancel`, which tells the peer why (a Cancel on the control stream and
//! the same message as the connection's close reason, so the peer learns it whichever it
//! reads first).

use std::future::Future;
use std::time::Duration;

use quinn::{ConnectionError, ReadExactError, RecvStream, SendStream, VarInt};
use warren_proto::files::chunk::{ChunkHeader, Decoded as FrameDecoded, MAX_HEADER_LEN};
use warren_proto::files::control::{Decoded, max_body_len};
use warren_proto::files::{CancelReason, ControlError, ControlMessage, escape_for_terminal};

use super::error::TransferError;

/// Connection close code of a transfer that ended well.
pub const CLOSE_DONE: VarInt = VarInt::from_u32(0);
/// Connection close code of a cancelled transfer; the reason bytes are a Cancel message.
pub const CLOSE_CANCEL: VarInt = VarInt::from_u32(1);

/// Longest Cancel detail put in a close frame (it must fit one packet).
const MAX_CLOSE_DETAIL: usize = 256;

/// How long a write may wait for the peer's flow control before the peer counts as gone.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `future` under `limit`; a timeout is [`TransferError::Timeout`].
pub(crate) async fn timed<T>(
    limit: Duration,
    during: &'static str,
    future: impl Future<Output = Result<T, TransferError>>,
) -> Result<T, TransferError> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| TransferError::Timeout {
            during,
            secs: limit.as_secs(),
        })?
}

fn lost(during: &'static str) -> impl FnOnce(String) -> TransferError {
    move |reason| TransferError::Lost { during, reason }
}

/// Writes `bytes` to `stream` within [`WRITE_TIMEOUT`] (copied once, as quinn's own
/// `write_all` would).
pub(crate) async fn write_all(
    stream: &mut SendStream,
    bytes: &[u8],
    during: &'static str,
) -> Result<(), TransferError> {
    write_chunks(stream, &mut [bytes::Bytes::copy_from_slice(bytes)], during).await
}

/// Writes `chunks` to `stream` within [`WRITE_TIMEOUT`], handing quinn the buffers
/// themselves (no copy).
pub(crate) async fn write_chunks(
    stream: &mut SendStream,
    chunks: &mut [bytes::Bytes],
    during: &'static str,
) -> Result<(), TransferError> {
    timed(WRITE_TIMEOUT, during, async {
        stream
            .write_all_chunks(chunks)
            .await
            .map_err(|e| lost(during)(e.to_string()))
    })
    .await
}

/// Writes one control message.
pub(crate) async fn write_message(
    stream: &mut SendStream,
    message: &ControlMessage,
    during: &'static str,
) -> Result<(), TransferError> {
    let mut out = Vec::new();
    message.encode(&mut out);
    write_all(stream, &out, during).await
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the stream ended cleanly before the
/// first byte and `at_boundary` allows that.
async fn read_exact(
    stream: &mut RecvStream,
    buf: &mut [u8],
    during: &'static str,
    at_boundary: bool,
) -> Result<bool, TransferError> {
    match stream.read_exact(buf).await {
        Ok(()) => Ok(true),
        Err(ReadExactError::FinishedEarly(0)) if at_boundary => Ok(false),
        Err(ReadExactError::FinishedEarly(_)) => Err(TransferError::Protocol(format!(
            "a stream ended inside a message while {during}"
        ))),
        Err(ReadExactError::ReadError(e)) => Err(lost(during)(e.to_string())),
    }
}

/// Reads a QUIC varint whose first byte is `first`, as raw bytes appended to `out`.
async fn read_varint_rest(
    stream: &mut RecvStream,
    first: u8,
    out: &mut Vec<u8>,
    during: &'static str,
) -> Result<(), TransferError> {
    out.push(first);
    let len = 1usize << (first >> 6);
    let start = out.len();
    out.resize(start + len - 1, 0);
    read_exact(stream, &mut out[start..], during, false).await?;
    Ok(())
}

/// Reads one control message within `limit`; `None` if the peer ended the stream cleanly
/// between messages. The length prefix is checked against the type's bound before the
/// body is allocated.
pub(crate) async fn read_message(
    stream: &mut RecvStream,
    limit: Duration,
    during: &'static str,
) -> Result<Option<ControlMessage>, TransferError> {
    timed(limit, during, async {
        let mut kind = [0u8; 1];
        if !read_exact(stream, &mut kind, during, true).await? {
            return Ok(None);
        }
        let kind = kind[0];
        let max = max_body_len(kind)?;
        let mut head = vec![kind];
        let mut first = [0u8; 1];
        read_exact(stream, &mut first, during, false).await?;
        read_varint_rest(stream, first[0], &mut head, during).await?;
        // Decoding the header alone says NeedMore (body missing) or refuses the length.
        if let Err(e) = ControlMessage::decode(&head) {
            return Err(e.into());
        }
        let len = decode_len(&head[1..]);
        if len > max as u64 {
            return Err(ControlError::TooLong { kind, len, max }.into());
        }
        // `len` ≤ max, a usize.
        let mut body = vec![0u8; len as usize];
        read_exact(stream, &mut body, during, false).await?;
        Ok(Some(ControlMessage::decode_body(kind, &body)?))
    })
    .await
}

/// The value of a complete varint (its canonical form was checked by the decoder).
fn decode_len(bytes: &[u8]) -> u64 {
    let mut value = u64::from(bytes.first().map_or(0, |b| b & 0x3f));
    for &b in bytes.iter().skip(1) {
        value = (value << 8) | u64::from(b);
    }
    value
}

/// Reads the next data frame's header within `limit`; `None` if the sender ended the
/// data stream cleanly between frames.
pub(crate) async fn read_frame_header(
    stream: &mut RecvStream,
    limit: Duration,
) -> Result<Option<ChunkHeader>, TransferError> {
    const DURING: &str = "receiving data";
    timed(limit, DURING, async {
        let mut raw = Vec::with_capacity(MAX_HEADER_LEN);
        for field in 0..3 {
            let mut first = [0u8; 1];
            if !read_exact(stream, &mut first, DURING, field == 0).await? {
                return Ok(None);
            }
            read_varint_rest(stream, first[0], &mut raw, DURING).await?;
        }
        let start = raw.len();
        raw.resize(start + 32, 0);
        read_exact(stream, &mut raw[start..], DURING, false).await?;
        match ChunkHeader::decode(&raw) {
            Ok(FrameDecoded::Header(header, _)) => Ok(Some(header)),
            Ok(FrameDecoded::NeedMore) => Err(TransferError::Protocol(
                "a data frame header is cut short".into(),
            )),
            Err(e) => Err(TransferError::Protocol(e.to_string())),
        }
    })
    .await
}

/// Reads a frame's payload into `buf` (resized to `len`) within `limit`.
pub(crate) async fn read_payload(
    stream: &mut RecvStream,
    buf: &mut Vec<u8>,
    len: u32,
    limit: Duration,
) -> Result<(), TransferError> {
    const DURING: &str = "receiving data";
    buf.resize(len as usize, 0);
    timed(limit, DURING, async {
        read_exact(stream, buf, DURING, false).await.map(|_| ())
    })
    .await
}

/// Ends the control stream after the last message, then waits (within `limit`) for the
/// connection to close: the peer closes it once it has read everything.
pub(crate) async fn finish_and_wait_close(
    connection: &quinn::Connection,
    control: &mut SendStream,
    limit: Duration,
) {
    let _ = control.finish();
    let _ = tokio::time::timeout(limit, connection.closed()).await;
}

/// Closes the connection after a transfer that ended well.
pub(crate) fn close_done(connection: &quinn::Connection) {
    connection.close(CLOSE_DONE, b"done");
}

/// Tells the peer the transfer stops and why, then closes the connection.
pub(crate) async fn cancel(
    connection: &quinn::Connection,
    control: Option<&mut SendStream>,
    reason: CancelReason,
    detail: &str,
) {
    let mut cut = detail.len().min(MAX_CLOSE_DETAIL);
    while !detail.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = ControlMessage::Cancel {
        reason,
        detail: detail[..cut].to_owned(),
    };
    if let Some(control) = control {
        // Best effort: the close frame carries the same message.
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            write_message(control, &message, "cancelling"),
        )
        .await;
    }
    let mut bytes = Vec::new();
    message.encode(&mut bytes);
    connection.close(CLOSE_CANCEL, &bytes);
}

/// If the peer closed the connection with a Cancel, the error that says so; otherwise
/// `error` unchanged. Network errors are often the first sign of a peer's Cancel.
pub(crate) fn explain(connection: &quinn::Connection, error: TransferError) -> TransferError {
    if !matches!(
        error,
        TransferError::Lost { .. } | TransferError::Timeout { .. } | TransferError::Protocol(_)
    ) {
        return error;
    }
    match connection.close_reason() {
        Some(ConnectionError::ApplicationClosed(close)) if close.error_code == CLOSE_CANCEL => {
            match ControlMessage::decode(&close.reason) {
                Ok(Decoded::Message(ControlMessage::Cancel { reason, detail }, _)) => {
                    TransferError::PeerCancelled {
                        reason,
                        detail: escape_for_terminal(&detail),
                    }
                }
                _ => TransferError::PeerCancelled {
                    reason: CancelReason::Other(0),
                    detail: "(no reason given)".into(),
                },
            }
        }
        _ => error,
    }
}

/// The error for a Cancel read from the control stream.
pub(crate) fn cancelled(reason: CancelReason, detail: &str) -> TransferError {
    TransferError::PeerCancelled {
        reason,
        detail: escape_for_terminal(detail),
    }
}

/// How either side ends a transfer: the summary announced, or the failure explained (the
/// peer's own reason when it cancelled), told to the peer unless it cancelled, and announced.
pub(crate) async fn conclude(
    connection: &quinn::Connection,
    control: Option<&mut SendStream>,
    events: &super::events::Events,
    result: Result<super::Summary, TransferError>,
) -> Result<super::Summary, TransferError> {
    use super::events::Event;
    match result {
        Ok(summary) => {
            events.emit(Event::Finished(summary.clone())).await;
            Ok(summary)
        }
        Err(error) => {
            let error = explain(connection, error);
            if !matches!(error, TransferError::PeerCancelled { .. }) {
                let detail = error.to_string();
                cancel(connection, control, error.cancel_reason(), &detail).await;
            }
            events
                .emit(Event::Failed {
                    error: error.to_string(),
                })
                .await;
            Err(error)
        }
    }
}
