//! Applying a new config to a running client: what changed is restarted, the rest is left
//! alone.
//!
//! * What the client asks of the server — its claims (service names, tokens, kinds,
//!   declared ports, forward targets) and how it reaches the server (address, PSK,
//!   transport, ciphers, proxy) — is fixed for a session: when any of it changes, the
//!   client ends its session and starts a new one at once with the new config. Streams
//!   already open keep flowing: they do not belong to the session.
//! * A reverse service's target, PROXY setting and UDP bounds apply to the next stream,
//!   with no new session.
//! * A forward service's local port: an unchanged one keeps its listener and connections;
//!   an added one is bound, a removed one stops (its connections end), a changed one
//!   restarts (on the same socket when its address and protocol stayed). Every new port is
//!   bound before anything changes, so a taken port refuses the whole reload.
//! * A P2P service runs beside the sessions: one whose settings changed (or all of them,
//!   when the first server, PSK, transport or handshake timeout changed) stops and starts
//!   again; a port that cannot be bound then is reported in the summary.
//! * Heartbeat and reconnect timings apply from the next session; the admin API moves only
//!   on restart (the summary says so).

use std::sync::{Arc, PoisonError};

use super::forward;
use super::{Shared, claims_of};
use crate::config::ClientConfig;
use crate::reload::{ReloadError, ReloadResult, ReloadSummary, sockets_for};

/// Validates `new` and applies what differs from the config in force.
pub(super) async fn apply(shared: &Arc<Shared>, new: ClientConfig) -> ReloadResult {
    new.validate().map_err(ReloadError::Invalid)?;
    let old = shared.config();
    let mut summary = ReloadSummary::default();
    if new.admin != old.admin {
        summary
            .needs_restart
            .push("[admin] (the admin API keeps its address and token)".to_owned());
    }

    // 1. Every local port the new config needs, before anything changes.
    let running = shared
        .forwards
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let fresh = sockets_for(
        new.forwards.values(),
        |forward| {
            let running = running.get(&forward.name)?;
            // A new bandwidth limit or compression applies in place (each connection
            // reads them when it comes): no reason to restart.
            let mut settings = running.forward.clone();
            settings.bandwidth_limit = forward.bandwidth_limit;
            settings.compression = forward.compression;
            Some((settings, running.socket.clone()))
        },
        |old, new| old.bind == new.bind && old.kind.same_protocol(new.kind),
        forward::bind_forward,
    )
    .await?;

    // 2. Swap the config (and make room for new services' counters).
    let new_session = claims_of(&old) != claims_of(&new)
        || !old.common().same_handshake(&new.common())
        || new.servers() != old.servers()
        || new.proxy != old.proxy
        || new.prefer_ipv6 != old.prefer_ipv6
        || new.tls != old.tls
        || new.ws != old.ws;
    {
        let mut meters = shared
            .meters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for name in new.services.keys() {
            meters
                .entry(name.clone())
                .or_insert_with(|| shared.telemetry.metrics.service(name));
        }
    }
    *shared
        .config
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Arc::new(new.clone());
    shared.limits.set(super::bandwidth_limits(&new));
    summary.note_table("service", &old.services, &new.services);
    summary.note_table("forward service", &old.forwards, &new.forwards);
    describe_settings(&old, &new, &mut summary);

    // 3. Forward services' ports.
    for name in running
        .keys()
        .filter(|name| !new.forwards.contains_key(*name))
    {
        let removed = shared
            .forwards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        if let Some(removed) = removed {
            removed.stop.cancel();
            shared.status.send_modify(|s| {
                s.forwards.remove(name);
            });
        }
    }
    for (forward, socket) in fresh {
        let name = forward.name.clone();
        let addr = socket
            .local_addr()
            .map_or_else(|_| forward.bind.to_string(), |addr| addr.to_string());
        if let Some(replaced) = forward::start(shared, forward, socket) {
            replaced.stop.cancel();
        }
        summary
            .applied
            .push(format!("forward service {name} listens on {addr}"));
    }

    // 4. P2P services: the changed ones restart.
    #[cfg(unix)]
    super::p2p::apply(shared, &old, &new, &mut summary).await;

    // 5. Health checks the new config adds (removed ones end by themselves).
    super::health::start_checks(shared);
    if new.servers().len() > old.servers().len() {
        summary
            .needs_restart
            .push("servers (a server added to the list is dialed after a restart)".to_owned());
    }

    // 6. A new session when the server must hear of it.
    if new_session {
        shared.restart_session();
        summary
            .applied
            .push("reconnecting to the server with the new config".to_owned());
    }
    Ok(summary)
}

/// Lines for the settings that take effect without restarting anything.
fn describe_settings(old: &ClientConfig, new: &ClientConfig, summary: &mut ReloadSummary) {
    summary.note_setting("servers", &old.servers(), &new.servers(), |list| {
        list.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    });
    summary.note_handshake(&old.common(), &new.common());
    // A proxy URL may hold a password: say only that it changed.
    summary.note_setting("proxy", &old.proxy, &new.proxy, |_| "(set)".to_owned());
    summary.note_setting("prefer_ipv6", &old.prefer_ipv6, &new.prefer_ipv6, |b| {
        b.to_string()
    });
    summary.note_setting(
        "heartbeat_timeout",
        &old.heartbeat_timeout,
        &new.heartbeat_timeout,
        |d| format!("{d:?}"),
    );
}
