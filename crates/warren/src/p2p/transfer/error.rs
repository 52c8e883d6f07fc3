//! [`TransferError`]: why a transfer failed, which side it came from, and what to do.

use std::io;
use std::path::PathBuf;

use warren_proto::files::{CancelReason, ControlError, ManifestError};

use crate::p2p::resume::ResumeError;
use crate::p2p::write::WriteError;
use crate::transport::quic::error::QuicError;

/// Why a transfer failed. Network failures leave partial files and their sidecars in
/// place: running the same transfer again resumes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The QUIC configuration could not be built (local, not expected).
    #[error(transparent)]
    Config(#[from] QuicError),
    /// The connection or a stream failed.
    #[error(
        "the connection to the peer was lost while {during}: {reason}: run the same transfer again to resume"
    )]
    Lost {
        /// What was going on.
        during: &'static str,
        /// The transport's reason.
        reason: String,
    },
    /// The peer went quiet.
    #[error(
        "the peer did not answer within {secs} s while {during}: check its network, then run the same transfer again to resume"
    )]
    Timeout {
        /// What was going on.
        during: &'static str,
        /// The limit.
        secs: u64,
    },
    /// The peer stopped the transfer.
    #[error("the peer stopped the transfer ({reason}): {detail}")]
    PeerCancelled {
        /// Its reason.
        reason: CancelReason,
        /// Its words, escaped for a terminal.
        detail: String,
    },
    /// The peer speaks another version of the file protocol.
    #[error(
        "the peer speaks file-protocol versions {min}..={max} and this Warren speaks {ours}: update the older side"
    )]
    Incompatible {
        /// The peer's lowest version.
        min: u8,
        /// The peer's highest version.
        max: u8,
        /// Ours.
        ours: u8,
    },
    /// The peer sent something malformed or out of place.
    #[error("the peer broke the file protocol: {0}")]
    Protocol(String),
    /// A control message could not be decoded.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The receiver refused the sender's file list (unsafe names and the like); nothing
    /// was written.
    #[error("refused the sender's file list, nothing was written: {0}")]
    Manifest(#[from] ManifestError),
    /// The receiver cannot write an entry of the file list in the output folder; nothing
    /// was written.
    #[error("cannot receive into the output folder, nothing was written: {0}")]
    Preflight(#[source] WriteError),
    /// The user (receiver) declined the offer.
    #[error("the transfer was declined")]
    Declined,
    /// A text over the limit of a text transfer.
    #[error("the text is {len} bytes, over the {max}-byte limit of --text: send it as a file")]
    TextTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Writing a received file failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// Reading a partial file's resume state failed.
    #[error(transparent)]
    Resume(#[from] ResumeError),
    /// A file to send could not be read.
    #[error("cannot read {}: {source}: check that it still exists and is readable", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file to send shrank after the file list was made.
    #[error(
        "{} changed while it was being sent (it is shorter than when the transfer started): send it again when nothing writes to it",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// A partial file lost chunks already written in this transfer.
    #[error(
        "the partial file of `{name}` changed while it was being received: something else writes in the output folder; stop it and run the transfer again"
    )]
    PartChanged {
        /// The file, escaped.
        name: String,
    },
    /// The same chunk kept arriving damaged.
    #[error(
        "chunk {index} of `{name}` arrived damaged {times} times: the path or one of the machines corrupts data; check memory and disks, then retry"
    )]
    TooManyBadChunks {
        /// The file, escaped.
        name: String,
        /// The chunk.
        index: u64,
        /// How many times.
        times: u32,
    },
}

impl TransferError {
    /// Whether running the same transfer again may succeed (network trouble), as opposed
    /// to a refusal or a local problem that needs fixing first.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TransferError::Lost { .. }
                | TransferError::Timeout { .. }
                | TransferError::TooManyBadChunks { .. }
        )
    }

    /// The reason a Cancel to the peer gives for this error.
    pub(crate) fn cancel_reason(&self) -> CancelReason {
        match self {
            TransferError::Declined => CancelReason::Declined,
            TransferError::Manifest(_) | TransferError::Preflight(_) => CancelReason::Refused,
            TransferError::Write(_)
            | TransferError::Resume(_)
            | TransferError::Read { .. }
            | TransferError::Changed { .. }
            | TransferError::PartChanged { .. }
            | TransferError::TextTooLong { .. }
            | TransferError::Config(_) => CancelReason::LocalError,
            TransferError::TooManyBadChunks { .. } => CancelReason::TooManyBadChunks,
            TransferError::Protocol(_)
            | TransferError::Control(_)
            | TransferError::Incompatible { .. } => CancelReason::Protocol,
            TransferError::Lost { .. }
            | TransferError::Timeout { .. }
            | TransferError::PeerCancelled { .. } => CancelReason::Interrupted,
        }
    }
}
