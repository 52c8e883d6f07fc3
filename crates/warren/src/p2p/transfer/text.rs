//! A text instead of files (`warren send --text`, croc's `--text`): the sender's Text
//! takes the place of the manifest, the receiver shows it and answers Done. No Accept, no
//! data stream, nothing written to disk.

use quinn::{RecvStream, SendStream};
use tokio::time::Instant;
use warren_proto::files::ControlMessage;
use warren_proto::files::control::MAX_TEXT_LEN;

use super::Summary;
use super::error::TransferError;
use super::events::Events;
use super::send::{CLOSE_TIMEOUT, HELLO_TIMEOUT, expect_hello, open_control, unexpected};
use super::stream;

/// Sends `text` over `connection` to one receiver.
///
/// # Errors
///
/// [`TransferError`]: the text is too long, the receiver refused, the connection failed.
pub async fn send_text(
    connection: &quinn::Connection,
    text: &str,
    events: &Events,
) -> Result<Summary, TransferError> {
    let mut control = None;
    let result = run(connection, text, &mut control).await;
    stream::conclude(connection, control.as_mut(), events, result).await
}

async fn run(
    connection: &quinn::Connection,
    text: &str,
    control: &mut Option<SendStream>,
) -> Result<Summary, TransferError> {
    if text.len() > MAX_TEXT_LEN {
        return Err(TransferError::TextTooLong {
            len: text.len(),
            max: MAX_TEXT_LEN,
        });
    }
    let started = Instant::now();
    let (ctl, mut recv) = open_control(connection, control).await?;
    stream::write_message(
        ctl,
        &ControlMessage::Text(text.to_owned()),
        "sending the text",
    )
    .await?;
    expect_hello(&mut recv, "waiting for the receiver's hello").await?;
    match stream::read_message(&mut recv, HELLO_TIMEOUT, "waiting for the receiver").await? {
        Some(ControlMessage::Done) => {}
        other => return Err(unexpected(other, "done")),
    }
    stream::finish_and_wait_close(connection, ctl, CLOSE_TIMEOUT).await;
    Ok(summary(text, started, None))
}

/// The receiver's side, once the sender's Text arrived in place of a manifest: says Done
/// and hands the text up in the [`Summary`] (`receive` reports it finished).
pub(crate) async fn received(
    connection: &quinn::Connection,
    ctl: &mut SendStream,
    recv: &mut RecvStream,
    text: String,
    started: Instant,
) -> Result<Summary, TransferError> {
    stream::write_message(ctl, &ControlMessage::Done, "finishing").await?;
    let _ = ctl.finish();
    let _ = stream::read_message(recv, CLOSE_TIMEOUT, "finishing").await;
    stream::close_done(connection);
    Ok(summary(&text, started, Some(text.clone())))
}

fn summary(text: &str, started: Instant, kept: Option<String>) -> Summary {
    Summary {
        files: 0,
        bytes: text.len() as u64,
        sent_bytes: text.len() as u64,
        resumed_bytes: 0,
        resent_chunks: 0,
        elapsed: started.elapsed(),
        text: kept,
    }
}
