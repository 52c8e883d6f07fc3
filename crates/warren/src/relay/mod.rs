//! Byte pumps between a local TCP connection (a visitor, or the target service) and a
//! session's [`Stream`]; UDP flow tables and counters live in [`udp`].
//!
//! Semantics both sides rely on:
//! * EOF from the local side finishes the stream's direction; the peer's end of stream
//!   becomes a write shutdown (FIN) towards the local side. Each direction closes on its
//!   own, so half-closed protocols work.
//! * A stream that is cut (its transport died without an end), or that the peer resets,
//!   resets the local connection (RST): a cut transfer must never look complete.
//! * A local connection that fails (e.g. reset by the visitor) resets the stream, and the
//!   peer resets its own local connection in turn.

pub mod limit;
pub mod opening;
pub mod udp;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use warren_proto::proxy_header;

use crate::config::ProxyProtocol;
use crate::metrics::Meter;
use crate::session::stream::{Chunk, SendError, Stream, StreamError, StreamReader, StreamWriter};
use crate::transport::compress::Compressor;
use crate::transport::records::RecordIoError;
use crate::transport::tcp;

/// How a relayed connection ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The tunnel side failed; the local connection was reset.
    #[error("tunnel stream failed: {0}")]
    Tunnel(StreamError),
    /// The stream was cut without an end of stream; the local connection was reset.
    #[error("tunnel stream closed without end-of-stream")]
    TunnelCut,
    /// The peer aborted the stream; the local connection was reset.
    #[error("peer aborted the stream: {0}")]
    PeerAborted(String),
    /// The local connection failed; the peer was told to abort.
    #[error("local connection failed: {0}")]
    Local(io::Error),
    /// The peer sent something a stream does not allow.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// Warren is shutting down.
    #[error("shutting down")]
    Cancelled,
}

/// Bytes moved by one relayed connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Transferred {
    /// From the local connection into the tunnel.
    pub to_tunnel: u64,
    /// From the tunnel to the local connection.
    pub to_local: u64,
}

/// Writes a PROXY protocol header to a freshly dialed `target`, before any relayed byte:
/// the stream came from `visitor` to `local` (an "unknown" header when either is missing).
/// On failure the stream is reset. The header (at most 232
/// bytes) fits the new socket's send buffer, so this never waits on the target.
///
/// # Errors
/// The write error (the stream is then over).
pub async fn write_proxy_header(
    target: &mut TcpStream,
    channel: &mut Stream,
    version: ProxyProtocol,
    visitor: Option<SocketAddr>,
    local: Option<SocketAddr>,
) -> io::Result<()> {
    let header = proxy_header::encode(version, visitor.zip(local));
    let written = target.write_all(&header).await;
    if written.is_err() {
        let _ = channel.writer.reset("target closed").await;
    }
    written
}

/// Relays `local` and `channel` until both directions have ended or one fails.
///
/// On success both sides have sent and seen `End`, so the channel is idle again and may
/// carry another stream (both ends know it: the peer's pump finished the same way). On
/// failure the local connection is reset, the peer is sent `Close` where possible, and the
/// channel must be dropped.
///
/// # Errors
/// How the relay failed; a clean finish in both directions is `Ok`.
pub async fn pump(
    local: TcpStream,
    channel: &mut Stream,
    cancel: &CancellationToken,
) -> Result<Transferred, RelayError> {
    pump_metered(local, channel, cancel, None).await
}

/// [`pump`], also adding every record's bytes to `meter` as it flows (one atomic add per
/// record), so metrics and the admin API see a transfer while it runs.
///
/// # Errors
/// As [`pump`].
pub async fn pump_metered(
    local: TcpStream,
    channel: &mut Stream,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
) -> Result<Transferred, RelayError> {
    pump_inner(
        local,
        channel,
        cancel,
        meter,
        LastEnd::Send,
        StreamStart::default(),
    )
    .await
}

/// [`pump_metered`] for a stream whose opening already moved bytes (see [`opening`]):
/// directions that `start` says ended are not pumped again, and its byte counts are
/// included in the result (the caller adds them to `meter` itself).
///
/// # Errors
/// As [`pump`].
pub async fn pump_from(
    local: TcpStream,
    channel: &mut Stream,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
    start: StreamStart,
) -> Result<Transferred, RelayError> {
    pump_inner(local, channel, cancel, meter, LastEnd::Send, start).await
}

/// Where a stream stands when the pump takes it over.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    /// The local side already ended (its `End` was sent).
    pub up_ended: bool,
    /// The peer already ended (the local side was shut down for writing).
    pub down_ended: bool,
    /// Bytes already moved.
    pub moved: Transferred,
}

/// [`pump_metered`] for a stream the caller means to hand back for reuse: the end of the
/// direction that finishes last is staged instead of sent, so it leaves in one segment with
/// what the transport sends next (the TCP pool's "idle again": one write and one wake-up of
/// the peer fewer per stream). After `Ok`, the caller must send something or call
/// [`StreamWriter::flush`] before it drops the stream, or the peer never sees that end.
///
/// # Errors
/// As [`pump`].
pub async fn pump_for_reuse(
    local: TcpStream,
    channel: &mut Stream,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
) -> Result<Transferred, RelayError> {
    pump_inner(
        local,
        channel,
        cancel,
        meter,
        LastEnd::Stage,
        StreamStart::default(),
    )
    .await
}

/// What the direction that finishes last does with its `End` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastEnd {
    /// Sends it at once.
    Send,
    /// Stages it for the caller's next write ([`pump_for_reuse`]).
    Stage,
}

async fn pump_inner(
    mut local: TcpStream,
    channel: &mut Stream,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
    last_end: LastEnd,
    start: StreamStart,
) -> Result<Transferred, RelayError> {
    let Stream { reader, writer } = channel;
    // Until the stream ends cleanly, closing `local` means a reset: if this process dies
    // (even by SIGKILL), the kernel aborts the connection instead of sending a FIN that
    // would make a cut transfer look complete. Cleared below on the clean path.
    let _ = socket2::SockRef::from(&local).set_linger(Some(std::time::Duration::ZERO));
    let mut moved = start.moved;
    let outcome = {
        let (mut local_read, mut local_write) = local.split();
        let up_tally = Tally::new(&mut moved.to_tunnel, meter, Towards::Tunnel);
        let down_tally = Tally::new(&mut moved.to_local, meter, Towards::Local);
        // Set once the tunnel-to-local direction has ended: the other one then ends last.
        let down_ended = AtomicBool::new(start.down_ended);
        let both = async {
            let up = async {
                if start.up_ended {
                    return Ok(());
                }
                local_to_tunnel(&mut local_read, writer, up_tally, (last_end, &down_ended)).await
            };
            let down = async {
                if start.down_ended {
                    return Ok(());
                }
                tunnel_to_local(reader, &mut local_write, down_tally, &down_ended).await
            };
            tokio::try_join!(up, down).map(|_| ())
        };
        tokio::select! {
            result = both => result,
            () = cancel.cancelled() => Err(RelayError::Cancelled),
        }
    };
    match outcome {
        Ok(()) => {
            let _ = socket2::SockRef::from(&local).set_linger(None);
            Ok(moved)
        }
        Err(error) => {
            if let RelayError::Tunnel(StreamError::Transport(RecordIoError::Inflate(refused))) =
                &error
            {
                // The peer's doing, and worth an operator's eye: a bomb or a broken peer.
                warn!(event = "compressed_record_refused", error = %refused, "the peer sent a compressed record that does not inflate within bounds; the connection is reset");
            }
            if matches!(error, RelayError::Local(_) | RelayError::Cancelled) {
                // Best effort: the channel may be the thing that is broken.
                let reason = error.to_string();
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(1), writer.reset(&reason))
                        .await;
            }
            tcp::reset(local);
            Err(error)
        }
    }
}

/// Which way a direction's bytes go.
#[derive(Debug, Clone, Copy)]
enum Towards {
    Tunnel,
    Local,
}

/// Counts one direction's bytes: into the caller's totals and, as they flow, the metrics.
struct Tally<'a> {
    total: &'a mut u64,
    meter: Option<&'a Meter>,
    towards: Towards,
}

impl<'a> Tally<'a> {
    fn new(total: &'a mut u64, meter: Option<&'a Meter>, towards: Towards) -> Self {
        Tally {
            total,
            meter,
            towards,
        }
    }

    /// Counts `bytes` moved, then waits while they are over the service's bandwidth limit.
    async fn add(&mut self, bytes: usize) {
        *self.total += bytes as u64;
        let Some(meter) = self.meter else {
            return;
        };
        let pace = match self.towards {
            Towards::Tunnel => {
                meter.to_tunnel(bytes as u64);
                meter.limit().map(|limit| &limit.to_tunnel)
            }
            Towards::Local => {
                meter.to_local(bytes as u64);
                meter.limit().map(|limit| &limit.to_local)
            }
        };
        if let Some(pace) = pace {
            pace.spend(bytes).await;
        }
    }
}

async fn local_to_tunnel(
    local: &mut ReadHalf<'_>,
    writer: &mut StreamWriter,
    mut tally: Tally<'_>,
    (last_end, down_ended): (LastEnd, &AtomicBool),
) -> Result<(), RelayError> {
    let mut compressor = tally.meter.and_then(Meter::codec).map(Compressor::new);
    loop {
        match writer
            .send_from_compressing(&*local, compressor.as_mut())
            .await
        {
            Ok(0) => {
                let finished = if last_end == LastEnd::Stage && down_ended.load(Ordering::Relaxed) {
                    writer.stage_finish()
                } else {
                    writer.finish().await
                };
                return finished.map_err(RelayError::from);
            }
            Ok(n) => tally.add(n).await,
            Err(SendError::Source(e)) => return Err(RelayError::Local(e)),
            Err(SendError::Sink(e)) => return Err(e.into()),
        }
    }
}

async fn tunnel_to_local(
    reader: &mut StreamReader,
    local: &mut WriteHalf<'_>,
    mut tally: Tally<'_>,
    ended: &AtomicBool,
) -> Result<(), RelayError> {
    loop {
        let chunk = reader.read().await?;
        if deliver(chunk, local, &mut tally).await? == Flow::Ended {
            reader.shrink();
            ended.store(true, Ordering::Relaxed);
            return Ok(());
        }
    }
}

/// Whether a direction goes on after a chunk.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    More,
    Ended,
}

/// Acts on one chunk from the tunnel: bytes to the local side, the end as a half-close, a
/// reset as the failure it is.
async fn deliver(
    chunk: Chunk<'_>,
    local: &mut WriteHalf<'_>,
    tally: &mut Tally<'_>,
) -> Result<Flow, RelayError> {
    match chunk {
        Chunk::Data(bytes) => {
            local.write_all(bytes).await.map_err(RelayError::Local)?;
            tally.add(bytes.len()).await;
            Ok(Flow::More)
        }
        Chunk::End => {
            // Half-close towards the local side; the other direction carries on.
            local.shutdown().await.map_err(RelayError::Local)?;
            Ok(Flow::Ended)
        }
        Chunk::Reset(reason) => Err(RelayError::PeerAborted(reason.into_owned())),
    }
}

impl From<StreamError> for RelayError {
    fn from(error: StreamError) -> Self {
        match error {
            StreamError::Cut => RelayError::TunnelCut,
            StreamError::Protocol(what) => RelayError::Protocol(what),
            other => RelayError::Tunnel(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use warren_proto::CipherSuite;

    use super::*;
    use crate::crypto::record::{DirectionKeys, Opener, RecordKind, Sealer};
    use crate::transport::Channel;
    use crate::transport::records::Record;

    const SUITE: CipherSuite = CipherSuite::Aes128Gcm;

    fn keys(label: &[u8]) -> DirectionKeys {
        DirectionKeys::derive(SUITE, &[9u8; 32], label)
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (near, far)
    }

    /// Both ends of a channel: ours (a stream, for the pump) and the peer's (records).
    async fn channels() -> (Stream, Channel) {
        let (ours, theirs) = pair().await;
        let ours = Channel::new(
            crate::transport::wire::Wire::tcp(ours),
            Sealer::new(SUITE, keys(b"up")),
            Opener::new(SUITE, keys(b"down")),
        );
        let theirs = Channel::new(
            crate::transport::wire::Wire::tcp(theirs),
            Sealer::new(SUITE, keys(b"down")),
            Opener::new(SUITE, keys(b"up")),
        );
        (Stream::tcp(ours), theirs)
    }

    /// The peer half-closes first, then the local side ends: the local side's `End` is the
    /// last one, and `pump_for_reuse` stages it.
    async fn stream_that_ends_locally_last(
        ours: &mut Stream,
        theirs: &mut Channel,
    ) -> Result<Transferred, RelayError> {
        let (mut app, local) = pair().await;
        theirs.writer.send(RecordKind::Data, b"ping").await.unwrap();
        theirs.writer.send(RecordKind::End, &[]).await.unwrap();
        let app_side = async {
            let mut got = Vec::new();
            app.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"ping");
            app.write_all(b"pong").await.unwrap();
            drop(app);
        };
        let cancel = CancellationToken::new();
        let (moved, ()) = tokio::join!(pump_for_reuse(local, ours, &cancel, None), app_side);
        moved
    }

    #[tokio::test]
    async fn the_last_end_leaves_with_the_next_message() {
        let (mut ours, mut theirs) = channels().await;
        let moved = stream_that_ends_locally_last(&mut ours, &mut theirs)
            .await
            .unwrap();
        assert_eq!((moved.to_tunnel, moved.to_local), (4, 4));
        assert_eq!(
            theirs.reader.read().await.unwrap(),
            Some(Record::Data(b"pong"))
        );
        ours.writer.send_message(&[]).await.unwrap();
        assert_eq!(theirs.reader.read().await.unwrap(), Some(Record::End));
        assert_eq!(
            theirs.reader.read().await.unwrap(),
            Some(Record::Control(&[]))
        );
    }

    #[tokio::test]
    async fn a_staged_end_is_sent_by_a_flush() {
        let (mut ours, mut theirs) = channels().await;
        stream_that_ends_locally_last(&mut ours, &mut theirs)
            .await
            .unwrap();
        ours.writer.flush().await.unwrap();
        drop(ours);
        assert_eq!(
            theirs.reader.read().await.unwrap(),
            Some(Record::Data(b"pong"))
        );
        assert_eq!(theirs.reader.read().await.unwrap(), Some(Record::End));
        assert_eq!(theirs.reader.read().await.unwrap(), None);
    }

    #[tokio::test]
    async fn pump_sends_the_last_end_at_once() {
        let (mut ours, mut theirs) = channels().await;
        let (mut app, local) = pair().await;
        theirs.writer.send(RecordKind::End, &[]).await.unwrap();
        let app_side = async {
            let mut got = Vec::new();
            app.read_to_end(&mut got).await.unwrap();
            drop(app);
        };
        let cancel = CancellationToken::new();
        let (moved, ()) = tokio::join!(pump(local, &mut ours, &cancel), app_side);
        moved.unwrap();
        // Nothing staged: the End is already on its way without another write.
        assert_eq!(theirs.reader.read().await.unwrap(), Some(Record::End));
    }
}
