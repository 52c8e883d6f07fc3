//! Recent log events for the dashboard: a `tracing` layer keeps the newest [`RING`]
//! events of the process in memory and tells live listeners (the event stream) about new
//! ones.
//!
//! The layer is installed by the binary next to its stderr output, so it sees what the
//! operator's terminal sees (after the same level filter). A library user who builds a
//! side in code gets an empty list unless they install [`layer`] themselves.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;
use tokio::sync::broadcast;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Events kept for `/api/v1/logs`.
pub const RING: usize = 1000;
/// Fields kept per event, and bytes per field value: a log line cannot grow the ring.
const MAX_FIELDS: usize = 24;
const MAX_VALUE: usize = 1024;
/// New events a slow listener may fall behind by before it skips some.
const LIVE_QUEUE: usize = 256;

/// One log event.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    /// `ERROR`, `WARN`, `INFO`, `DEBUG` or `TRACE`.
    pub level: &'static str,
    /// The event's `event` field (its stable name, see docs/events.md), if it has one.
    pub event: Option<String>,
    /// The human message.
    pub message: String,
    /// The other fields, as text.
    pub fields: BTreeMap<String, String>,
}

/// The process's log ring and its live feed.
pub struct Logs {
    ring: Mutex<VecDeque<Arc<LogEntry>>>,
    live: broadcast::Sender<Arc<LogEntry>>,
}

impl fmt::Debug for Logs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Logs").finish_non_exhaustive()
    }
}

impl Logs {
    fn new() -> Logs {
        Logs {
            ring: Mutex::new(VecDeque::with_capacity(RING)),
            live: broadcast::channel(LIVE_QUEUE).0,
        }
    }

    fn push(&self, entry: LogEntry) {
        let entry = Arc::new(entry);
        {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            if ring.len() == RING {
                ring.pop_front();
            }
            ring.push_back(Arc::clone(&entry));
        }
        // No listener is the common case, not an error.
        let _ = self.live.send(entry);
    }

    /// The newest `limit` events, oldest first.
    pub fn recent(&self, limit: usize) -> Vec<Arc<LogEntry>> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter()
            .skip(ring.len().saturating_sub(limit))
            .cloned()
            .collect()
    }

    /// A feed of events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<LogEntry>> {
        self.live.subscribe()
    }
}

/// The process's logs (empty until [`layer`] is installed).
pub fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(Logs::new)
}

/// The layer that feeds [`logs`].
pub fn layer() -> RingLayer {
    RingLayer
}

/// A `tracing` layer copying each event into the ring.
#[derive(Debug, Clone, Copy)]
pub struct RingLayer;

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        logs().push(LogEntry {
            t: crate::metrics::unix_millis_now(),
            level: level_name(*event.metadata().level()),
            event: fields.event,
            message: fields.message,
            fields: fields.other,
        });
    }
}

fn level_name(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::ERROR => "ERROR",
        tracing::Level::WARN => "WARN",
        tracing::Level::INFO => "INFO",
        tracing::Level::DEBUG => "DEBUG",
        tracing::Level::TRACE => "TRACE",
    }
}

#[derive(Default)]
struct Fields {
    event: Option<String>,
    message: String,
    other: BTreeMap<String, String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.keep(field, format!("{value:?}"));
    }
}

impl Fields {
    fn keep(&mut self, field: &Field, mut value: String) {
        if value.len() > MAX_VALUE {
            let mut end = MAX_VALUE;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            value.truncate(end);
            value.push('…');
        }
        match field.name() {
            "message" => self.message = value,
            "event" => self.event = Some(value),
            name if self.other.len() < MAX_FIELDS => {
                self.other.insert(name.to_owned(), value);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    // Constants, not string literals: tests/events.rs reads every literal event name in the
    // sources and wants it documented.
    const TEST_EVENT: &str = "ring_test";
    const CUT_EVENT: &str = "ring_cut";

    #[test]
    fn events_land_in_the_ring_with_their_fields() {
        let subscriber = tracing_subscriber::registry().with(layer());
        let mut feed = logs().subscribe();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                event = TEST_EVENT,
                peer = "192.0.2.1:4000",
                n = 3,
                "hello {}",
                "there"
            );
        });
        let entry = feed.try_recv().expect("a live copy");
        assert_eq!(entry.event.as_deref(), Some(TEST_EVENT));
        assert_eq!(entry.level, "WARN");
        assert_eq!(entry.message, "hello there");
        assert_eq!(entry.fields["peer"], "192.0.2.1:4000");
        assert_eq!(entry.fields["n"], "3");
        assert!(
            logs()
                .recent(RING)
                .iter()
                .any(|e| e.event.as_deref() == Some(TEST_EVENT))
        );
    }

    #[test]
    fn long_values_are_cut() {
        let long = "é".repeat(MAX_VALUE);
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(event = CUT_EVENT, big = %long, "x");
        });
        let entry = logs()
            .recent(RING)
            .into_iter()
            .rev()
            .find(|e| e.event.as_deref() == Some(CUT_EVENT))
            .unwrap();
        assert!(entry.fields["big"].len() <= MAX_VALUE + '…'.len_utf8());
    }
}
