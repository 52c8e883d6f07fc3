//! The opening of a stream that its far end may still refuse: what the visitor sends is kept
//! until the first answer comes back, so a stream refused before any byte reached the
//! visitor can be replayed on another session (the server's *retry before reset*).
//!
//! The visitor's bytes are not held back: they go into the tunnel at once, as they would
//! through [`super::pump`], and a copy is kept (up to [`REPLAY_LIMIT`]). The opening ends
//! with the first chunk from the far end: data or its end commits the stream to this
//! session and the pump takes over ([`super::pump_from`]); a reset, or a stream cut first,
//! means nothing reached the visitor and the caller may try again elsewhere with the
//! same [`Opening`]. A visitor that sends more than the limit before any answer commits the
//! stream too: past that point a replay could not be complete.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::{RelayError, StreamStart, Transferred};
use crate::session::stream::{Chunk, Stream};

/// Most visitor bytes kept for a replay.
pub const REPLAY_LIMIT: usize = 64 * 1024;

/// Largest write a replay makes.
const CHUNK: usize = 16 * 1024;

/// What one read of the visitor takes while the stream opens: its first bytes are usually
/// a small request, and the pump takes over with its pooled buffers once the far end
/// answers, so a waiting visitor holds little.
const READ_LEN: usize = 4 * 1024;

/// How long telling the far end of an abort may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long telling a session that stopped answering of an abandoned stream may take.
const ABANDON_TIMEOUT: Duration = Duration::from_millis(100);

/// What the visitor has sent so far on a stream that no session has answered yet.
#[derive(Debug, Default)]
pub struct Opening {
    sent: Vec<u8>,
    /// The visitor half-closed (its `End` is part of the replay).
    ended: bool,
    /// More than [`REPLAY_LIMIT`] was sent: no replay is possible any more.
    overflowed: bool,
}

/// How the opening of a stream on one session ended.
#[derive(Debug)]
pub enum Opened {
    /// The far end answered (or the visitor sent more than a replay keeps): relay the rest
    /// with [`super::pump_from`] on this stream.
    Answered(StreamStart),
    /// The far end refused the stream, or it was cut, before any byte went back to the
    /// visitor: the stream may be replayed on another session.
    Refused(String),
    /// The visitor failed or we are shutting down: the stream is over (the far end was told).
    Aborted(RelayError),
}

impl Opening {
    /// Opens the stream on `channel` (whose `StreamOpen` is staged or sent): replays what
    /// the visitor sent on earlier attempts, then relays until the first answer. If
    /// `abandon` resolves first (the session stopped answering), the stream is reset and
    /// counts as refused: nothing reached the visitor, so another session may take it.
    pub async fn open(
        &mut self,
        visitor: &mut TcpStream,
        channel: &mut Stream,
        cancel: &CancellationToken,
        abandon: impl Future<Output = ()>,
    ) -> Opened {
        if let Err(error) = self.replay(visitor, channel).await {
            return Opened::Refused(error);
        }
        let mut buf = vec![0u8; READ_LEN];
        let mut abandon = std::pin::pin!(abandon);
        loop {
            let Stream { reader, writer } = &mut *channel;
            tokio::select! {
                () = cancel.cancelled() => {
                    close(channel, "shutting down").await;
                    return Opened::Aborted(RelayError::Cancelled);
                }
                () = &mut abandon => {
                    // Bounded tighter than a close: the peer may not read, and the visitor
                    // waits for its next session.
                    let reason = "the session stopped answering; the stream was moved";
                    let _ = tokio::time::timeout(ABANDON_TIMEOUT, channel.writer.reset(reason)).await;
                    return Opened::Refused(reason.to_owned());
                }
                chunk = reader.read() => {
                    return match chunk {
                        Ok(Chunk::Data(bytes)) => match visitor.write_all(bytes).await {
                            Ok(()) => Opened::Answered(self.start(false, bytes.len())),
                            Err(error) => {
                                close(channel, "the visitor's connection failed").await;
                                Opened::Aborted(RelayError::Local(error))
                            }
                        },
                        Ok(Chunk::End) => match visitor.shutdown().await {
                            Ok(()) => Opened::Answered(self.start(true, 0)),
                            Err(error) => Opened::Aborted(RelayError::Local(error)),
                        },
                        Ok(Chunk::Reset(reason)) => Opened::Refused(reason.into_owned()),
                        Err(error) => Opened::Refused(RelayError::from(error).to_string()),
                    };
                }
                read = visitor.read(&mut buf), if !self.ended => match read {
                    Ok(0) => {
                        self.ended = true;
                        if let Err(error) = writer.finish().await {
                            return Opened::Refused(error.to_string());
                        }
                    }
                    Ok(n) => {
                        // Kept before it is sent: a send that fails is replayed whole on
                        // the next channel, these bytes included.
                        self.overflowed = self.sent.len() + n > REPLAY_LIMIT;
                        self.sent.extend_from_slice(&buf[..n]);
                        if let Err(error) = writer.send(&buf[..n]).await {
                            return Opened::Refused(error.to_string());
                        }
                        if self.overflowed {
                            return Opened::Answered(self.start(false, 0));
                        }
                    }
                    Err(error) => {
                        close(channel, "the visitor's connection failed").await;
                        return Opened::Aborted(RelayError::Local(error));
                    }
                },
            }
        }
    }

    /// Whether another attempt could replay everything the visitor sent.
    pub fn replayable(&self) -> bool {
        !self.overflowed
    }

    /// Sends what earlier attempts carried (the staged `StreamOpen` leaves with the first
    /// write), or whatever the visitor already sent; then makes sure the `StreamOpen` is out
    /// even if the visitor waits for the far end to speak first.
    async fn replay(&mut self, visitor: &TcpStream, channel: &mut Stream) -> Result<(), String> {
        let writer = &mut channel.writer;
        if self.sent.is_empty() && !self.ended {
            // On the heap: an array here would live in every visitor task's future, for
            // the whole life of the connection.
            let mut first = vec![0u8; READ_LEN];
            match visitor.try_read(&mut first) {
                Ok(0) => self.ended = true,
                Ok(n) => self.sent.extend_from_slice(&first[..n]),
                Err(_) => {} // nothing yet (or an error the main loop will meet)
            }
        }
        for chunk in self.sent.chunks(CHUNK) {
            writer.send(chunk).await.map_err(|e| e.to_string())?;
        }
        if self.ended {
            writer.finish().await.map_err(|e| e.to_string())?;
        }
        writer.flush().await.map_err(|e| e.to_string())
    }

    fn start(&self, down_ended: bool, to_local: usize) -> StreamStart {
        StreamStart {
            up_ended: self.ended,
            down_ended,
            moved: Transferred {
                to_tunnel: self.sent.len() as u64,
                to_local: to_local as u64,
            },
        }
    }
}

/// Tells the far end the stream is aborted (best effort, bounded).
async fn close(channel: &mut Stream, reason: &str) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, channel.writer.reset(reason)).await;
}
