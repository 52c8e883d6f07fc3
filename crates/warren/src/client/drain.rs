//! Graceful drain for rolling restarts: the client tells every server to send it no new
//! visitors, lets the streams in flight finish (up to `drain_timeout`), then stops.
//!
//! Withdrawal reuses the `Health` message that a failed target check sends (protocol v2),
//! so any server that serves health checks drains a client too: it stops picking this
//! client's sessions at once and its visitors go to the other clients of each service.
//! While draining, a session that comes up (a reconnect) claims its services withdrawn,
//! and a target whose check passes again is not offered.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{Shared, health};

/// How long the drain waits at least before it trusts a count of zero: a visitor that a
/// server picked just before it read the withdrawal still reaches this client, within a
/// round trip.
const SETTLE: Duration = Duration::from_millis(500);

/// How often the drain looks at the streams still open.
const POLL: Duration = Duration::from_millis(50);

/// Drains and returns once no stream is open, `drain_timeout` passed, or the client is
/// stopped outright; the caller then stops the client.
pub(super) async fn drain(shared: &Shared) {
    shared
        .draining
        .store(true, std::sync::atomic::Ordering::Release);
    let timeout = shared.config().drain_timeout;
    let sessions = shared.sessions_now();
    for session in &sessions {
        let services: Vec<String> = session.services.iter().cloned().collect();
        health::report(session, services, false);
    }
    let started = Instant::now();
    info!(
        event = "drain_started",
        sessions = sessions.len(),
        open_streams = open_streams(shared),
        timeout_ms = timeout.as_millis() as u64,
        "draining: the servers send this client no new visitors; waiting for the streams in flight (a second SIGTERM stops at once)"
    );
    let deadline = started + timeout;
    loop {
        let open = open_streams(shared);
        if open == 0 && started.elapsed() >= SETTLE.min(timeout) {
            info!(
                event = "drain_finished",
                waited_ms = started.elapsed().as_millis() as u64,
                "drained: no stream is open; stopping"
            );
            return;
        }
        if Instant::now() >= deadline {
            warn!(
                event = "drain_timeout",
                open_streams = open,
                timeout_ms = timeout.as_millis() as u64,
                "drain_timeout passed with streams still open; stopping and cutting them"
            );
            return;
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(POLL.min(deadline - Instant::now())) => {}
        }
    }
}

/// Streams open on every session up now.
fn open_streams(shared: &Shared) -> u64 {
    shared
        .sessions_now()
        .iter()
        .map(|session| session.vitals.open_streams())
        .sum()
}
