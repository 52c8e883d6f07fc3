//! Sessions: one authenticated client–server association.
//!
//! A session is a control channel (this module drives it: hello, heartbeats, requests,
//! goodbye) plus streams, one per visitor connection ([`stream`]). A session's two sides
//! open, accept and recycle streams through [`link`], which hides the transport: code above
//! this layer never sees how a stream is carried ([`tcp`] holds the TCP transports' way,
//! with its pool of pre-opened data channels). UDP services use [`datagram`] channels: one
//! channel per service carries every flow's datagrams.

pub mod datagram;
pub mod datagram_queue;
pub mod io;
pub mod link;
pub mod quic;
pub mod quic_datagram;
pub mod stream;
pub mod tcp;
pub mod vitals;

#[cfg(test)]
mod conformance;

use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren_proto::liveness::{Heartbeat, HeartbeatAction, HeartbeatConfig, PeerState};
use warren_proto::message::{self, ControlMessage};

use stream::{Stream, StreamError};
use vitals::Vitals;

/// Capacity of a session's outgoing control queue; senders that find it full drop the
/// message (requests are retried) rather than block the data path.
pub const CONTROL_QUEUE: usize = 64;

/// Why a control channel ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionEnd {
    /// We are shutting down (a goodbye was sent).
    #[error("shutting down")]
    Cancelled,
    /// The peer said goodbye.
    #[error("peer closed the session: {0}")]
    Goodbye(String),
    /// Nothing heard from the peer within the heartbeat timeout.
    #[error("no heartbeat from the peer for {0:?}; the connection is dead")]
    HeartbeatTimeout(Duration),
    /// The connection failed.
    #[error("control connection lost: {0}")]
    Transport(StreamError),
    /// The connection closed without a goodbye.
    #[error("control connection closed by the peer")]
    Closed,
    /// The peer sent something the protocol does not allow here.
    #[error("protocol violation by the peer: {0}")]
    Protocol(String),
}

/// Sends one control message.
///
/// # Errors
/// Socket errors.
pub async fn send_control(
    channel: &mut Stream,
    message: &ControlMessage,
) -> Result<(), StreamError> {
    channel.writer.send_message(&message::encode(message)).await
}

/// Receives one control message (no deadline: callers add one).
///
/// # Errors
/// [`SessionEnd`] for a closed connection or a record that is not a control message.
/// A message of a kind from a later version is skipped (see [`message::DecodeError::UnknownKind`]).
pub async fn recv_control(channel: &mut Stream) -> Result<ControlMessage, SessionEnd> {
    loop {
        match channel.reader.read_message().await {
            Ok(Ok(bytes)) => match message::decode_control(bytes) {
                Ok(message) => return Ok(message),
                Err(message::DecodeError::UnknownKind(kind)) => {
                    tracing::debug!(
                        event = "control_ignored",
                        kind,
                        "skipping a control message of a kind from a later version"
                    );
                }
                Err(error) => return Err(SessionEnd::Protocol(error.to_string())),
            },
            Ok(Err(reason)) => return Err(SessionEnd::Goodbye(reason.into_owned())),
            Err(StreamError::Cut) => return Err(SessionEnd::Closed),
            Err(StreamError::Protocol(what)) => return Err(SessionEnd::Protocol(what.into())),
            Err(error) => return Err(SessionEnd::Transport(error)),
        }
    }
}

/// Heartbeat settings of one side.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// How often this side pings while the session carries no stream.
    pub idle_interval: Duration,
    /// The longest an answer may be outstanding before the peer counts as dead (the
    /// heartbeat shortens it on a fast path; see [`HeartbeatConfig::new`]).
    pub timeout: Duration,
}

impl Liveness {
    fn heartbeat(self) -> HeartbeatConfig {
        HeartbeatConfig::new(self.idle_interval, self.timeout)
    }
}

/// Drives an established control channel until it ends: answers pings, sends our pings and
/// the messages queued on `outgoing`, judges the peer's liveness (publishing it in
/// `vitals`, and telling `on_state` of each change), and hands every other message to
/// `on_message`. When `cancel` fires it says goodbye with `goodbye_reason()`.
#[allow(clippy::too_many_arguments)] // one call site per side; a struct would only rename them
pub async fn run_control(
    mut channel: Stream,
    liveness: Liveness,
    vitals: &Vitals,
    mut outgoing: mpsc::Receiver<ControlMessage>,
    cancel: CancellationToken,
    goodbye_reason: impl Fn() -> String,
    mut on_state: impl FnMut(PeerState, &Heartbeat),
    mut on_message: impl FnMut(ControlMessage),
) -> SessionEnd {
    let mut heartbeat = Heartbeat::new(Instant::now().into_std(), liveness.heartbeat());
    let mut outgoing_open = true;
    loop {
        let wake = Instant::from_std(heartbeat.poll_timeout());
        let to_send = tokio::select! {
            () = cancel.cancelled() => {
                let goodbye = ControlMessage::Goodbye { reason: goodbye_reason() };
                let _ = tokio::time::timeout(Duration::from_secs(1), send_control(&mut channel, &goodbye)).await;
                let _ = channel.writer.shutdown().await;
                return SessionEnd::Cancelled;
            }
            received = recv_control(&mut channel) => {
                match on_control(received, &mut heartbeat, vitals, &mut on_message) {
                    Ok(answer) => answer,
                    Err(end) => return end,
                }
            }
            queued = outgoing.recv(), if outgoing_open => {
                outgoing_open = queued.is_some();
                queued
            }
            () = vitals.turned_busy() => {
                heartbeat.set_busy(Instant::now().into_std(), true);
                None
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now().into_std();
                heartbeat.set_busy(now, vitals.open_streams() > 0);
                // A last look before giving up: a side that was itself frozen (SIGSTOP, a
                // paused VM) wakes with its timers due and its peer's messages unread.
                let waiting = (heartbeat.state(now) == PeerState::Dead)
                    .then(|| recv_control(&mut channel).now_or_never())
                    .flatten();
                if let Some(received) = waiting {
                    match on_control(received, &mut heartbeat, vitals, &mut on_message) {
                        Ok(answer) => answer,
                        Err(end) => return end,
                    }
                } else {
                match heartbeat.handle_timeout(now) {
                    Some(HeartbeatAction::SendPing { seq }) => Some(ControlMessage::Ping { seq }),
                    Some(HeartbeatAction::PeerDead) => {
                        publish(vitals, &heartbeat, &mut on_state);
                        return SessionEnd::HeartbeatTimeout(heartbeat.dead_after());
                    }
                    None => None,
                }
                }
            }
        };
        publish(vitals, &heartbeat, &mut on_state);
        if let Some(message) = to_send {
            // A peer that stops reading must not wedge us past its dead deadline.
            match tokio::time::timeout(heartbeat.dead_after(), send_control(&mut channel, &message))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return SessionEnd::Transport(e),
                Err(_) => return SessionEnd::HeartbeatTimeout(heartbeat.dead_after()),
            }
        }
    }
}

/// Handles one received control message: it answers whatever the heartbeat waited for; a
/// ping wants its pong sent (`Ok(Some)`), a goodbye or an error ends the session (`Err`),
/// anything else goes to `on_message`.
fn on_control(
    received: Result<ControlMessage, SessionEnd>,
    heartbeat: &mut Heartbeat,
    vitals: &Vitals,
    on_message: &mut impl FnMut(ControlMessage),
) -> Result<Option<ControlMessage>, SessionEnd> {
    let now = Instant::now().into_std();
    heartbeat.on_received(now);
    match received? {
        ControlMessage::Ping { seq } => Ok(Some(ControlMessage::Pong { seq })),
        ControlMessage::Pong { seq } => {
            heartbeat.on_pong(now, seq);
            if let Some(srtt) = heartbeat.srtt() {
                vitals.record_rtt(srtt);
            }
            Ok(None)
        }
        ControlMessage::Goodbye { reason } => Err(SessionEnd::Goodbye(reason)),
        other => {
            on_message(other);
            Ok(None)
        }
    }
}

/// Publishes the heartbeat's judgement, telling `on_state` when it changed.
fn publish(
    vitals: &Vitals,
    heartbeat: &Heartbeat,
    on_state: &mut impl FnMut(PeerState, &Heartbeat),
) {
    let state = heartbeat.state(Instant::now().into_std());
    if vitals.set_state(state) {
        on_state(state, heartbeat);
    }
}

/// Short printable form of a session id for logs.
pub fn short_id(id: &[u8]) -> String {
    id.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// At most the first few names of a long list, for a log line.
pub fn summarize(names: &[String]) -> String {
    const SHOWN: usize = 16;
    if names.len() <= SHOWN {
        return names.join(",");
    }
    format!("{},… ({} in all)", names[..SHOWN].join(","), names.len())
}
