//! The client's side of a graceful drain (see [`crate::drain`]): it tells every server to
//! send it no new visitors, lets the streams in flight finish (up to `drain_timeout`), then
//! stops.
//!
//! Withdrawal reuses the `Health` message that a failed target check sends (protocol v2),
//! so any server that serves health checks drains a client too: it stops picking this
//! client's sessions at once and its visitors go to the other clients of each service.
//! While draining, a session that comes up (a reconnect) claims its services withdrawn,
//! and a target whose check passes again is not offered.

use tracing::info;

use super::{Shared, health};

/// Drains and returns once no stream is open, `drain_timeout` passed, or the client is
/// stopped outright; the caller then stops the client.
pub(super) async fn drain(shared: &Shared) {
    shared.drain.began();
    let timeout = shared.config().drain_timeout;
    let sessions = shared.sessions_now();
    for session in &sessions {
        let services: Vec<String> = session.services.iter().cloned().collect();
        health::report(session, services, false);
    }
    info!(
        event = "drain_started",
        side = "client",
        sessions = sessions.len(),
        open_streams = open_streams(shared),
        timeout_ms = timeout.as_millis() as u64,
        "draining: the servers send this client no new visitors; waiting for the streams in flight (a second SIGTERM stops at once)"
    );
    crate::drain::wait_for_streams("client", || open_streams(shared), timeout, &shared.cancel)
        .await;
}

/// Streams open on every session up now.
fn open_streams(shared: &Shared) -> u64 {
    shared
        .sessions_now()
        .iter()
        .map(|session| session.vitals.open_streams())
        .sum()
}
