//! Progress events of a transfer, for the CLI to render (indicatif, `--json`). The library
//! never prints; it pushes [`Event`]s into a bounded queue the caller drains.
//!
//! Progress events are dropped when the queue is full (each carries running totals, so the
//! next one catches up); the others wait a moment for room, and a consumer that stopped
//! reading never stalls the transfer for long.

use std::time::Duration;

use tokio::sync::mpsc;

use super::Summary;

/// How long a lifecycle event waits for room in a full queue before it is dropped.
const LIFECYCLE_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// One thing that happened in a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The receiver accepted: what will be transferred.
    Started {
        /// Files in the manifest.
        files: usize,
        /// Bytes in the manifest's files.
        bytes: u64,
        /// Of those, bytes the receiver already has.
        resumed_bytes: u64,
    },
    /// Running totals, including resumed bytes and files.
    Progress {
        /// Bytes sent (sender) or written and verified (receiver).
        bytes: u64,
        /// Files complete.
        files_done: usize,
    },
    /// A file is complete under its final name.
    FileDone {
        /// Its id in the manifest.
        file_id: u32,
        /// Its name, escaped for a terminal.
        name: String,
    },
    /// The transfer is complete.
    Finished(Summary),
    /// The transfer failed (the error is also returned).
    Failed {
        /// The error, as the user should read it.
        error: String,
    },
}

/// Where a transfer reports its [`Event`]s: a bounded queue, or nowhere.
#[derive(Debug, Clone, Default)]
pub struct Events {
    queue: Option<mpsc::Sender<Event>>,
}

impl Events {
    /// Events into `queue` (make it bounded: 64 is plenty).
    pub fn new(queue: mpsc::Sender<Event>) -> Events {
        Events { queue: Some(queue) }
    }

    /// No events.
    pub fn none() -> Events {
        Events::default()
    }

    /// A running total: dropped if the queue is full.
    pub(crate) fn progress(&self, bytes: u64, files_done: usize) {
        if let Some(queue) = &self.queue {
            let _ = queue.try_send(Event::Progress { bytes, files_done });
        }
    }

    /// Anything else: waits up to a second for room.
    pub(crate) async fn emit(&self, event: Event) {
        if let Some(queue) = &self.queue {
            let _ = queue.send_timeout(event, LIFECYCLE_SEND_TIMEOUT).await;
        }
    }
}
