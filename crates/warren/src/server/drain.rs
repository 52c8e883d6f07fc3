//! The server's side of a graceful drain (see [`crate::drain`]), for a rolling restart of
//! servers behind a load balancer:
//!
//! 1. `/readyz` answers 503 at once, every client is told (`Draining`: it opens no new
//!    forward streams here), and new sessions are refused with "draining, retry" (which is
//!    what `warren doctor` shows).
//! 2. After `drain_grace` (default none: time for a load balancer that checks `/readyz`
//!    to stop sending visitors), the service ports close (TCP listeners and the HTTP
//!    ports), so a load balancer's next connection is refused and goes to another server,
//!    and a TCP health check fails over. Visitors the kernel had already taken are served;
//!    one that lands in the instant of the close is reset (which is why a load balancer
//!    should check `/readyz` and the grace outlast its check). Idle HTTP keep-alive
//!    connections close; requests in flight finish. UDP services keep their sockets: a
//!    datagram flow has no end to wait for, so they serve until the server stops.
//! 3. The streams in flight finish, up to `drain_timeout`; then the server stops as on
//!    any shutdown (goodbyes, and the clients reconnect — to the successor once it is up).

use std::sync::{Arc, PoisonError};

use tracing::info;
use warren_proto::message::ControlMessage;

use super::{ServiceSocket, Shared};

/// What clients are told.
const REASON: &str = "the server is draining for a restart";

/// Drains and returns once no stream is open, `drain_timeout` passed, or the server is
/// stopped outright; the caller then stops the server.
pub(super) async fn drain(shared: &Arc<Shared>) {
    shared.drain.began();
    let (timeout, grace) = {
        let live = shared.live();
        (live.config.drain_timeout, live.config.drain_grace)
    };
    let sessions = shared.sessions_now();
    for session in &sessions {
        // A full queue means a client not reading its control channel: it will not open
        // streams either.
        let _ = session.control_sender().try_send(ControlMessage::Draining {
            reason: REASON.to_owned(),
        });
    }
    info!(
        event = "drain_started",
        side = "server",
        sessions = sessions.len(),
        open_streams = open_streams(shared),
        grace_ms = grace.as_millis() as u64,
        timeout_ms = timeout.as_millis() as u64,
        "draining: /readyz says so and the clients are told; the service ports close after drain_grace, then the streams in flight finish (a second SIGTERM stops at once)"
    );
    tokio::select! {
        () = shared.cancel.cancelled() => return,
        () = tokio::time::sleep(grace) => {}
    }
    // The bindings let go of the listeners first, so that each accept loop, the last
    // owner, closes its port the moment it has taken the visitors already queued.
    let closed = close_service_ports(shared);
    shared.taking_visitors.cancel();
    info!(
        event = "service_ports_closed",
        ports = closed,
        open_streams = open_streams(shared),
        "draining: the service ports are closed; waiting for the streams in flight"
    );
    crate::drain::wait_for_streams("server", || open_streams(shared), timeout, &shared.cancel)
        .await;
}

/// Closes the TCP listeners of the config's services (their accept loops already ended);
/// answers how many.
fn close_service_ports(shared: &Shared) -> usize {
    let mut services = shared
        .services
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    let mut closed = 0;
    for binding in services.values_mut() {
        if let ServiceSocket::Tcp(_) = binding.socket {
            binding.socket = ServiceSocket::Closed;
            closed += 1;
        }
    }
    closed
}

/// Streams open on every session now (visitors' and forward streams).
fn open_streams(shared: &Shared) -> u64 {
    shared
        .sessions_now()
        .iter()
        .map(|session| session.vitals.open_streams())
        .sum()
}

/// Whether the server should be sent visitors (`GET /readyz`): not draining, and every
/// service of the config has a client ready to serve it. `Err` says why not.
pub(super) fn readiness(shared: &Shared) -> Result<(), String> {
    if shared.drain.is_draining() {
        return Err("draining".to_owned());
    }
    let services = shared
        .services
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    let unserved = services
        .values()
        .filter(|binding| binding.slot.readiness().0 == 0)
        .count();
    if unserved > 0 {
        return Err(format!(
            "{unserved} of {} services have no client ready to serve them",
            services.len()
        ));
    }
    Ok(())
}
