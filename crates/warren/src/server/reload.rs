//! Applying a new config to a running server: what changed is restarted, the rest is left
//! alone.
//!
//! * A service whose settings are unchanged keeps its socket, its sessions and every
//!   connection; so does one whose only change is `load_balance`, which applies to the next
//!   visitor.
//! * An added service is bound and served; a removed one stops (its port closes and its
//!   visitors' streams end); a changed one restarts on a new slot (on the same socket when
//!   its address and protocol stayed, else on a new one).
//! * Every new socket is bound before anything changes, so a taken port refuses the whole
//!   reload and the running config stays.
//! * A session authenticated with a PSK, transport or cipher list that changed, or holding
//!   client-declared ports while the declared rules changed, is closed with a goodbye; its
//!   client reconnects and authenticates again.
//! * A session whose grant changed otherwise — it serves a removed or changed service or
//!   forward service, or claimed one the server refused then and offers now — is asked to
//!   claim again (`Reclaim`): its client establishes a new session before it ends this one,
//!   so visitors of its unchanged services are never turned away. The server closes it
//!   after `RECLAIM_GRACE` (10 s) if the client does not.
//! * Streams of unchanged services keep flowing through all of that: they do not belong to
//!   a session.
//! * Timeouts and heartbeats apply to connections and sessions that start afterwards; the
//!   server port and the admin API move only on restart (the summary says so).
//! * `[server.p2p]`: the mailbox's and the relay's limits, and the PSK the relay checks
//!   binds with, apply at once (pairs already relayed keep their byte counts); the P2P UDP
//!   port is bound, moved or closed only on restart.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, PoisonError};

use super::{Binding, Live, ServiceSocket, Shared, spawn_service};
use crate::config::{ServerConfig, ServerForward, Transport};
use crate::reload::{ReloadError, ReloadResult, ReloadSummary, sockets_for};

/// What a reconnecting client reads in the goodbye.
pub(super) const RECONNECT_REASON: &str =
    "the server's config changed; reconnecting to authenticate again";

/// Whether a session authenticated under `old` must authenticate again under `new`: the
/// handshake itself (PSK, transport, ciphers) changed.
pub(super) fn handshake_changed(old: &ServerConfig, new: &ServerConfig) -> bool {
    !old.common().same_handshake(&new.common())
}

/// Validates `new` and applies what differs from the config in force.
pub(super) async fn apply(shared: &Arc<Shared>, mut new: ServerConfig) -> ReloadResult {
    new.validate().map_err(ReloadError::Invalid)?;
    if shared.drain.is_draining() {
        return Err(ReloadError::Unappliable(
            "the server is draining for a restart; start the new one with the new config"
                .to_owned(),
        ));
    }
    let live = shared.live();
    let old = &live.config;
    let mut summary = ReloadSummary::default();
    if new.bind != old.bind {
        summary.needs_restart.push(format!(
            "bind {} -> {} (the server port)",
            old.bind, new.bind
        ));
    }
    if new.admin != old.admin {
        summary
            .needs_restart
            .push("[admin] (the admin API keeps its address and token)".to_owned());
    }
    // What is bound: TCP or UDP (QUIC), each on `bind`'s port or its own. Another transport
    // on the same ports (noise and tcp, say) is judged by the new config at once.
    let ports = |config: &ServerConfig| {
        let mut ports: Vec<(bool, Option<u16>)> = config
            .transport_list()
            .iter()
            .map(|e| (e.transport == Transport::Quic, e.port))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    };
    if ports(&new) != ports(old) {
        let names = |config: &ServerConfig| {
            let list: Vec<String> = config
                .transport_list()
                .iter()
                .map(|e| e.to_string())
                .collect();
            list.join(", ")
        };
        summary
            .needs_restart
            .push(if new.transports.is_empty() && old.transports.is_empty() {
                format!(
                    "transport {} -> {} (the server port is TCP for one, UDP for the other)",
                    old.transport, new.transport
                )
            } else {
                format!(
                    "transports [{}] -> [{}] (their ports are bound at start)",
                    names(old),
                    names(&new)
                )
            });
        // The ports keep speaking what they speak until the restart: the config in force
        // says so too, so handshakes and sessions are judged by the transports they use
        // (and nobody is sent to reconnect over a transport no port offers).
        new.transport = old.transport;
        new.transports = old.transports.clone();
        new.quic = old.quic.clone();
    } else if new.uses_transport(Transport::Quic) && (new.quic != old.quic || new.psk != old.psk) {
        let listener = shared
            .quic
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(listener) = listener {
            listener.reload(&new).map_err(|e| {
                ReloadError::Unappliable(format!("the QUIC certificates or PSK: {e}"))
            })?;
        }
        if new.quic.max_packet != old.quic.max_packet || new.quic.congestion != old.quic.congestion
        {
            summary.needs_restart.push(
                "[server.quic] max_packet / congestion (the UDP endpoint keeps them)".to_owned(),
            );
        }
    }

    // TLS and WebSocket on the server port are set up at start (see `web::layers`).
    let web_setup = |config: &ServerConfig| {
        (
            super::web::takes(config),
            config.tls.clone(),
            config.ws.clone(),
        )
    };
    if web_setup(&new) != web_setup(old) {
        summary.needs_restart.push(
            "transport tls/ws/wss, [server.tls] or [server.ws] (the server port keeps its TLS certificate and WebSocket settings)"
                .to_owned(),
        );
    }

    // The P2P UDP port stays as bound at start (see `Server::bind`); its relay's limits
    // and key (the PSK) follow the new config once it is in force (step 3).
    let udp_bind = |config: &ServerConfig| config.p2p.as_ref().map(|p2p| p2p.udp_bind);
    if udp_bind(&new) != udp_bind(old) {
        summary.needs_restart.push(
            "[server.p2p] added, removed or udp_bind moved (the P2P UDP port stays as it was)"
                .to_owned(),
        );
    }

    let http_ports =
        |config: &ServerConfig| config.http.as_ref().map(|http| (http.bind, http.tls_bind));
    if http_ports(&new) != http_ports(old) {
        summary
            .needs_restart
            .push("[server.http] bind / tls_bind (the HTTP ports keep their addresses)".to_owned());
    }

    // 0. A new `load_balance` or http route alone applies in place: the service keeps its
    //    socket, its sessions and its streams.
    let InPlace {
        rebalanced,
        rerouted,
        reshaped,
    } = apply_in_place(shared, &new);
    for name in &rebalanced {
        summary.applied.push(format!(
            "service {name} now spreads its visitors by {}",
            new.services[name].load_balance.name()
        ));
    }
    for name in &rerouted {
        summary.applied.push(format!(
            "http service {name}: routes and middleware updated"
        ));
    }
    for name in &reshaped {
        let service = &new.services[name];
        summary.applied.push(format!(
            "service {name}: bandwidth limit now {}, compression {}",
            describe_limit(service.bandwidth_limit),
            service.compression.map_or("none", |codec| codec.name()),
        ));
    }
    let mut old_services = old.services.clone();
    for name in rebalanced.iter().chain(&rerouted).chain(&reshaped) {
        if let Some(service) = old_services.get_mut(name) {
            service.load_balance = new.services[name].load_balance;
            service.http.clone_from(&new.services[name].http);
            service.bandwidth_limit = new.services[name].bandwidth_limit;
            service.compression = new.services[name].compression;
        }
    }

    // 1. Every socket the new config needs, before anything changes.
    let current = shared
        .services
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let fresh: Vec<Binding> = sockets_for(
        new.services.values(),
        |service| {
            let binding = current.get(&service.name)?;
            Some((binding.service.clone(), binding.socket.clone()))
        },
        |old, new| old.bind == new.bind && old.kind.same_protocol(new.kind),
        ServiceSocket::bind,
    )
    .await?
    .into_iter()
    .map(|(service, socket)| Binding::new(&service, socket, &shared.telemetry, &shared.cancel))
    .collect();

    // 2. Which sessions must authenticate again, judged against the old config.
    let reauthenticate_all = handshake_changed(old, &new);
    let changed_services = differing(&old_services, &new.services);
    // A forward's new bandwidth limit or compression applies in place: not a change to
    // claim.
    let unlimited = |forwards: &BTreeMap<String, ServerForward>| {
        let mut forwards = forwards.clone();
        forwards.values_mut().for_each(|f| {
            f.bandwidth_limit = None;
            f.compression = None;
        });
        forwards
    };
    let changed_forwards = differing(&unlimited(&old.forwards), &unlimited(&new.forwards));
    let declared_rules_changed = new.allow_ports != old.allow_ports
        || new.allow_bind_addrs != old.allow_bind_addrs
        || new.default_token != old.default_token;

    // 3. Swap the config, then the services. A cipher first allowed now is measured here,
    // off the accept path; the others keep their start-up figures.
    crate::crypto::speed::prepare(&new.ciphers, new.cipher_choice).await;
    *shared.live.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(Live::new(new.clone()));
    shared.limits.set(super::bandwidth_limits(&new));
    if let Some(settings) = &shared.p2p_settings {
        let mut next = super::relay_settings(
            new.p2p
                .as_ref()
                .or(old.p2p.as_ref())
                .unwrap_or(&Default::default()),
            &new.psk,
        );
        // Without the section the mailbox refuses everything; the relay stops pairing too.
        next.config.enabled &= new.p2p.is_some();
        settings.send_replace(next);
    }
    if new.p2p.is_some() && old.p2p.is_some() && new.p2p != old.p2p {
        summary
            .applied
            .push("[server.p2p]: the mailbox's and the relay's limits updated".to_owned());
    }
    {
        let mut services = shared
            .services
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for name in current
            .keys()
            .filter(|name| !new.services.contains_key(*name))
        {
            if let Some(binding) = services.remove(name) {
                binding.slot.stop.cancel();
                summary.applied.push(format!("removed service {name}"));
            }
        }
        for binding in fresh {
            let name = binding.service.name.clone();
            let addr = binding
                .socket
                .local_addr()
                .map_or_else(|_| binding.service.bind.to_string(), |a| a.to_string());
            match services.insert(name.clone(), binding.clone()) {
                Some(before) => {
                    before.slot.stop.cancel();
                    summary
                        .applied
                        .push(format!("restarted service {name} on {addr}"));
                }
                None => summary
                    .applied
                    .push(format!("added service {name} on {addr}")),
            }
            spawn_service(shared, binding);
        }
        // Routes, certificates and chains follow the services (a request in flight keeps
        // the front it started with).
        drop(services);
        super::http::rebuild_front(shared);
        shared
            .captures
            .retain_services(&|name| new.services.contains_key(name));
    }
    summary.note_table("forward service", &old.forwards, &new.forwards);
    describe_settings(old, &new, &mut summary);

    // 4. Sessions the new config may not grant as before: a changed handshake, or declared
    //    ports under changed rules, end now; a changed grant is claimed again.
    let (mut closed, mut reclaimed) = (0, 0);
    for session in shared.sessions_now() {
        let holds_declared = session
            .services
            .iter()
            .any(|name| !old.services.contains_key(name));
        // A changed name among what the session serves or was refused.
        let regrant = session
            .services
            .iter()
            .chain(&session.unserved)
            .any(|name| changed_services.contains(name) || changed_forwards.contains(name))
            || session
                .forwards
                .values()
                .any(|forward| changed_forwards.contains(&forward.name));
        if reauthenticate_all || (declared_rules_changed && holds_declared) {
            session.close(RECONNECT_REASON);
            closed += 1;
        } else if regrant {
            session.reclaim(&shared.tasks);
            reclaimed += 1;
        }
    }
    if closed > 0 {
        summary.applied.push(format!(
            "closed {closed} client session(s); their clients reconnect and authenticate again"
        ));
    }
    if reclaimed > 0 {
        summary.applied.push(format!(
            "asked {reclaimed} client session(s) to reconnect and claim their services again"
        ));
    }
    Ok(summary)
}

/// Services whose change applied to their running slot.
struct InPlace {
    /// A new `load_balance`.
    rebalanced: Vec<String>,
    /// New http routes, TLS or middleware (the HTTP front is rebuilt after the swap).
    rerouted: Vec<String>,
    /// A new `bandwidth_limit` or `compression` (the buckets change with the config swap;
    /// each visitor's relay reads the codec from the config in force).
    reshaped: Vec<String>,
}

/// Applies a changed `load_balance`, http route, bandwidth limit or compression to the
/// running slot of every service where that is all that changed.
fn apply_in_place(shared: &Shared, new: &ServerConfig) -> InPlace {
    let mut services = shared
        .services
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    let mut in_place = InPlace {
        rebalanced: Vec::new(),
        rerouted: Vec::new(),
        reshaped: Vec::new(),
    };
    for (name, wanted) in &new.services {
        let Some(binding) = services.get_mut(name) else {
            continue;
        };
        let mut same = binding.service.clone();
        same.load_balance = wanted.load_balance;
        same.http.clone_from(&wanted.http);
        same.bandwidth_limit = wanted.bandwidth_limit;
        same.compression = wanted.compression;
        if same != *wanted {
            continue;
        }
        if (binding.service.bandwidth_limit, binding.service.compression)
            != (wanted.bandwidth_limit, wanted.compression)
        {
            binding.service.bandwidth_limit = wanted.bandwidth_limit;
            binding.service.compression = wanted.compression;
            in_place.reshaped.push(name.clone());
        }
        if binding.service.load_balance != wanted.load_balance {
            binding.slot.set_strategy(wanted.load_balance);
            binding.service.load_balance = wanted.load_balance;
            in_place.rebalanced.push(name.clone());
        }
        if binding.service.http != wanted.http {
            binding.service.http.clone_from(&wanted.http);
            in_place.rerouted.push(name.clone());
        }
    }
    in_place
}

/// A bandwidth limit as a reload summary says it.
fn describe_limit(limit: Option<u64>) -> String {
    match limit {
        Some(rate) => format!("{rate} bytes/s each way"),
        None => "none".to_owned(),
    }
}

/// Names added, removed or changed between `old` and `new`.
fn differing<V: PartialEq>(
    old: &BTreeMap<String, V>,
    new: &BTreeMap<String, V>,
) -> HashSet<String> {
    old.keys()
        .chain(new.keys())
        .filter(|name| old.get(*name) != new.get(*name))
        .cloned()
        .collect()
}

/// Lines for the settings that take effect without restarting anything.
fn describe_settings(old: &ServerConfig, new: &ServerConfig, summary: &mut ReloadSummary) {
    summary.note_handshake(&old.common(), &new.common());
    summary.note_setting(
        "default_token",
        &old.default_token,
        &new.default_token,
        |_| "(secret)".to_owned(),
    );
    summary.note_setting(
        "heartbeat_interval",
        &old.heartbeat_interval,
        &new.heartbeat_interval,
        |d| format!("{d:?}"),
    );
    summary.note_setting(
        "handshake_timeout",
        &old.handshake_timeout,
        &new.handshake_timeout,
        |d| format!("{d:?}"),
    );
    summary.note_setting("allow_ports", &old.allow_ports, &new.allow_ports, |p| {
        p.map_or_else(|| "(none)".to_owned(), |p| p.to_string())
    });
    summary.note_setting(
        "allow_bind_addrs",
        &old.allow_bind_addrs,
        &new.allow_bind_addrs,
        |a| format!("{a:?}"),
    );
}
