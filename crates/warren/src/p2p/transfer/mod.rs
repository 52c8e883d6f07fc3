//! The transfer itself: files from one peer to another over one established QUIC
//! connection, with the file protocol `warren-files/1` (`docs/protocol.md`, "Peer-to-peer
//! file transfer"; the messages are [`warren_proto::files::control`]).
//!
//! ```text
//! both:     Identity::generate()            (ephemeral certificate; its fingerprint goes
//!                                            into the PAKE)
//!           server_config / client_config   (QUIC pinned to the peer's fingerprint from
//!                                            pake::Outcome, both ways)
//! sender:   Sources::walk(paths, excludes)  (names, sizes, no file contents read)
//!           send(&connection, &sources, &events)
//! receiver: receive(&connection, out_dir, options, confirm, &events)
//! ```
//!
//! The sender opens the control stream and the data stream, so it does not matter which
//! peer dialled. Both functions return a [`Summary`] or a [`TransferError`]; progress goes
//! to an [`Events`] queue (nothing is printed here).
//!
//! * [`identity`]: the ephemeral certificate and the pinned rustls / quinn configs.
//! * [`sources`]: walking the files to send into a manifest.
//! * [`events`]: the progress events.
//! * [`stream`](mod@stream): control messages and data frames over quinn streams, with bounds and
//!   timeouts.
//! * [`send`](mod@send) and [`receive`](mod@receive): the two sides.
//! * [`text`](mod@text): a text instead of files (`warren send --text`).
//! * [`error`]: the [`TransferError`] type.

pub mod error;
pub mod events;
pub mod identity;
pub mod receive;
pub mod send;
pub mod sources;
pub mod stream;
pub mod text;

use std::time::Duration;

pub use error::TransferError;
pub use events::{Event, Events};
pub use identity::{ALPN, Identity, SERVER_NAME, client_config, server_config};
pub use receive::{Offer, ReceiveOptions, receive};
pub use send::send;
pub use sources::{Skipped, SourceError, Sources};
pub use text::send_text;

/// Runs blocking disk work from async code: on a multi-threaded runtime the worker hands
/// its other tasks to the rest of the pool first (`block_in_place`), so a slow disk does
/// not stall the connection's other tasks; elsewhere (a current-thread runtime, where
/// that is not allowed) it runs inline.
pub(crate) fn on_disk<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// What a finished transfer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Files in the manifest.
    pub files: usize,
    /// Bytes in the manifest's files.
    pub bytes: u64,
    /// Chunk bytes that crossed the connection this time (resends included).
    pub sent_bytes: u64,
    /// Bytes the receiver already had (resumed chunks and files complete from a past run).
    pub resumed_bytes: u64,
    /// Chunks sent again after arriving damaged.
    pub resent_chunks: u64,
    /// Wall time from the first message to the last.
    pub elapsed: Duration,
    /// A text transfer's text (the receiver's side; escape it before showing it).
    pub text: Option<String>,
}
