//! The server's side of the hello exchange, in both protocol versions.
//!
//! v1 clients send one `Hello` (at most 256 claims, 16 KiB) and read one `HelloReply`; v2
//! clients send `HelloPart`s and read `HelloReplyPart`s, so a hello of thousands of claims
//! never meets the size cap, and can ask only to probe. Once a peer has proven the PSK, a
//! refusal says why before the connection closes: `Refuse` to a v2 client, `Goodbye` (the
//! one message a v1 client reads as a reason) to a v1 client.

use std::time::Duration;

use warren_proto::message::{
    self, ControlMessage, DecodeError, HelloAssembler, HelloClaim, HelloMode,
};

use super::Rejected;
use crate::session::stream::{Stream, StreamError};
use crate::session::{self as control, SessionEnd};

/// How long a refusal may take to send: the peer may not be reading.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// A received hello.
pub(super) struct Hello {
    pub(super) mode: HelloMode,
    pub(super) claims: Vec<HelloClaim>,
}

impl Hello {
    /// Whether the client only probes (diagnostics: serve nothing, take nothing over).
    pub(super) fn probe(&self) -> bool {
        self.mode == HelloMode::Probe
    }
}

/// Receives the whole hello of a client speaking `version`.
pub(super) async fn receive(channel: &mut Stream, version: u16) -> Result<Hello, Rejected> {
    if version < 2 {
        return match receive_v1(channel).await? {
            ControlMessage::Hello { services } => Ok(Hello {
                mode: HelloMode::Serve,
                claims: services
                    .into_iter()
                    .map(|claim| HelloClaim {
                        claim,
                        weight: 1,
                        ready: true,
                    })
                    .collect(),
            }),
            other => Err(unexpected(&other)),
        };
    }
    let mut assembler = HelloAssembler::default();
    loop {
        match control::recv_control(channel).await {
            Ok(ControlMessage::HelloPart { mode, claims, more }) => {
                match assembler.push(mode, claims, more) {
                    Ok(Some((mode, claims))) => return Ok(Hello { mode, claims }),
                    Ok(None) => {}
                    Err(error) => return Err(Rejected::Protocol(error.to_string())),
                }
            }
            Ok(other) => return Err(unexpected(&other)),
            Err(end) => return Err(protocol(end)),
        }
    }
}

/// Receives a v1 client's one hello message. A hello over v1's caps (one message of
/// [`message::MAX_CONTROL_LEN`] bytes, [`message::MAX_SERVICES_PER_SESSION`] claims) is
/// not the client's fault but its protocol's: it is told to upgrade.
async fn receive_v1(channel: &mut Stream) -> Result<ControlMessage, Rejected> {
    let bytes = match channel.reader.read_message().await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) | Err(StreamError::Cut) => return Err(protocol(SessionEnd::Closed)),
        Err(StreamError::Protocol(what)) => return Err(Rejected::Protocol(what.into())),
        Err(error) => return Err(protocol(SessionEnd::Transport(error))),
    };
    message::decode_control(bytes).map_err(|error| match error {
        DecodeError::TooLarge { .. }
        | DecodeError::FieldTooLong {
            field: "services", ..
        } => Rejected::HelloTooLarge(error.to_string()),
        other => Rejected::Protocol(other.to_string()),
    })
}

/// Sends the verdicts, in one message (v1) or in parts (v2).
pub(super) async fn reply(
    channel: &mut Stream,
    version: u16,
    verdicts: Vec<message::Verdict>,
) -> Result<(), StreamError> {
    if version < 2 {
        return control::send_control(channel, &ControlMessage::HelloReply { verdicts }).await;
    }
    for part in message::reply_parts(verdicts) {
        control::send_control(channel, &part).await?;
    }
    Ok(())
}

/// Tells an authenticated client why it is refused (best effort, bounded).
pub(super) async fn refuse(channel: &mut Stream, version: u16, reason: &str, retry: bool) {
    let mut reason = reason.to_owned();
    truncate(&mut reason, message::MAX_REASON_LEN);
    let message = if version < 2 {
        ControlMessage::Goodbye { reason }
    } else {
        ControlMessage::Refuse { reason, retry }
    };
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        let _ = control::send_control(channel, &message).await;
        let _ = channel.writer.shutdown().await;
    })
    .await;
}

/// Cuts `text` to at most `max` bytes on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

fn unexpected(message: &ControlMessage) -> Rejected {
    let name = format!("{message:?}");
    let name = name.split([' ', '{', '(']).next().unwrap_or("message");
    Rejected::Protocol(format!("expected a hello, got {name}"))
}

/// A hello that could not be read. A message that decodes to something the protocol does
/// not allow is a protocol violation, which the client is told about; a record that does
/// not open (forged, cut, oversized) may not come from the client at all, so it gets the
/// silence a wrong PSK gets.
fn protocol(end: SessionEnd) -> Rejected {
    match end {
        SessionEnd::Protocol(what) => Rejected::Protocol(what),
        _ => Rejected::Silent("the hello did not arrive as an authentic record"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        let mut text = "ééé".to_owned();
        truncate(&mut text, 3);
        assert_eq!(text, "é");
        let mut short = "ok".to_owned();
        truncate(&mut short, 10);
        assert_eq!(short, "ok");
    }
}
