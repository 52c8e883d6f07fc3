//! A client's peer-to-peer services (`p2p = true`): each runs on its own, beside the
//! sessions with the servers, through the servers' mailboxes (any server introduces the
//! two ends; losing one leaves the others).
//!
//! * An exit (`target`): offers the service by its name at every server of the config
//!   ([`listen::keep_offered`] each) and serves every client that visits it, each over its own pinned QUIC connection (direct
//!   when the NATs allow, else through the server's relay).
//! * An entrance (`bind`): binds its local port at start (a taken port stops the client,
//!   as for forward services) and keeps a connection to the exit
//!   ([`Entrance::keep_joined`]), joining again whenever it drops, at the servers in the
//!   config's order (the first that introduces it wins). A refusal that cannot
//!   pass by itself (a wrong token, the other kind of service) is logged and retried
//!   every [`REFUSED_RETRY`], since the other side's config may change.
//!
//! Neither takes part in the sessions: they are not claimed in the hello, not counted by
//! doctor, and a reload restarts only the P2P services whose settings changed.
//! What each one is doing (its peers, their route and RTT) is kept in a [`P2pState`] for
//! the admin API and `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{ClientError, Shared};
use crate::admin::{P2pInfo, P2pPeerInfo};
use crate::config::{ClientConfig, ClientP2p, HostPort, P2pEnd, ServiceKind, UdpSettings};
use crate::metrics::P2pGauges;
use crate::p2p::listen::{self, Listener};
use crate::p2p::mailbox::MailboxServer;
use crate::p2p::pake::CertFingerprint;
use crate::p2p::session::{Connected, Meeting, Options, Purpose, Route};
use crate::p2p::transfer::identity::Identity;
use crate::p2p::tunnel::{Entrance, Event, Exit, Kind, Reporter, TunnelError, TunnelStats};
use crate::p2p::upgrade::PathWatch;
use crate::reload::ReloadSummary;

/// Pause before an entrance tries again after a refusal that does not pass by itself.
pub(super) const REFUSED_RETRY: Duration = Duration::from_secs(30);
/// Peers an exit serves at once.
const MAX_PEERS: usize = 64;
/// How long a stopped P2P service may take to close its port and connections.
const STOP_TIMEOUT: Duration = Duration::from_secs(8);

/// One running P2P service.
pub(super) struct Running {
    /// Its settings when started.
    pub(super) config: ClientP2p,
    /// What it is doing.
    pub(super) state: Arc<P2pState>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops it and waits (bounded) until its port and connections are closed.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(STOP_TIMEOUT, self.task).await;
    }
}

/// What a P2P service is doing, as the admin API and `/metrics` show it.
#[derive(Debug)]
pub(super) struct P2pState {
    /// Its moves, counted into the service's metrics.
    pub(super) stats: Arc<TunnelStats>,
    /// The peers connected now.
    peers: Mutex<Vec<Peer>>,
    /// Why the last try failed, until a peer connects.
    last_error: Mutex<Option<String>>,
}

/// One connected peer.
#[derive(Debug)]
struct Peer {
    short: String,
    path: PathWatch,
    connection: quinn::Connection,
}

impl P2pState {
    fn connected(&self, connected: &Connected) {
        lock(&self.peers).push(Peer {
            short: connected.peer.short(),
            path: connected.path.clone(),
            connection: connected.connection.clone(),
        });
        *lock(&self.last_error) = None;
    }

    fn disconnected(&self, connected: &Connected) {
        let id = connected.connection.stable_id();
        lock(&self.peers).retain(|peer| peer.connection.stable_id() != id);
    }

    fn failed(&self, error: &str) {
        *lock(&self.last_error) = Some(error.to_owned());
    }

    /// `direct` or `relayed` (the first peer's route), `waiting` with no peer, `refused`
    /// after a failure.
    pub(super) fn state(&self) -> &'static str {
        match lock(&self.peers).first() {
            Some(peer) => peer.path.route().word(),
            None if lock(&self.last_error).is_some() => "refused",
            None => "waiting",
        }
    }

    /// The admin API's view.
    pub(super) fn info(&self, end: &P2pEnd) -> P2pInfo {
        P2pInfo {
            end: match end {
                P2pEnd::Exit { .. } => "exit",
                P2pEnd::Entrance { .. } => "entrance",
            },
            peers: lock(&self.peers)
                .iter()
                .map(|peer| P2pPeerInfo {
                    peer: peer.short.clone(),
                    route: peer.path.route().word(),
                    address: route_addr(peer.path.route()).to_string(),
                    rtt_ms: peer.connection.rtt().as_secs_f64() * 1e3,
                })
                .collect(),
            last_error: lock(&self.last_error).clone(),
        }
    }

    /// The gauges of `/metrics`.
    pub(super) fn gauges(&self, service: &str) -> Vec<P2pGauges> {
        lock(&self.peers)
            .iter()
            .map(|peer| P2pGauges {
                service: service.to_owned(),
                peer: peer.short.clone(),
                route: peer.path.route().word(),
                rtt_seconds: peer.connection.rtt().as_secs_f64(),
            })
            .collect()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn route_addr(route: Route) -> std::net::SocketAddr {
    match route {
        Route::Direct(addr) | Route::Relayed(addr) => addr,
    }
}

/// The tunnel's kind and UDP bounds for a service kind (config checks ruled out http).
fn tunnel_kind(kind: ServiceKind) -> (Kind, UdpSettings) {
    match kind {
        ServiceKind::Udp(settings) => (Kind::Udp, settings),
        ServiceKind::Tcp | ServiceKind::Http => (Kind::Tcp, UdpSettings::DEFAULT),
    }
}

/// How the P2P services of `config` reach the mailbox of `server` (one of its servers),
/// with its PSK and transport (`warren doctor` asks the first server the same way).
pub(crate) fn options(config: &ClientConfig, server: &HostPort) -> Options {
    let mut options = Options::new(MailboxServer {
        server: server.clone(),
        psk: config.psk.clone(),
        quic: (config.transport == crate::config::Transport::Quic).then(|| config.quic.clone()),
        deadline: config.handshake_timeout,
    });
    options.purpose = Purpose::Tunnel;
    options
}

/// [`options`] for `service`, one per server of `config` in its order: this client's
/// long-term identity, if it has one, and the other end's pinned identity, if the service
/// pins one.
///
/// # Errors
///
/// The identity file cannot be read, parsed or created (the message names it and the fix).
pub(crate) fn service_options(
    config: &ClientConfig,
    service: &ClientP2p,
) -> Result<Vec<Options>, String> {
    let identity = identity(config)?;
    Ok(config
        .servers()
        .into_iter()
        .map(|server| {
            let mut options = options(config, server);
            options.identity = identity.clone();
            options.pin = service.peer.map(CertFingerprint::from_bytes);
            options
        })
        .collect())
}

/// This client's long-term P2P identity (`p2p_identity`), created on first use.
fn identity(config: &ClientConfig) -> Result<Option<Arc<Identity>>, String> {
    config
        .p2p_identity
        .as_deref()
        .map(|path| {
            Identity::load_or_create(path)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .transpose()
}

/// Whether a change from `old` to `new` must restart every P2P service (the way to the
/// mailbox changed).
pub(super) fn mailbox_changed(old: &ClientConfig, new: &ClientConfig) -> bool {
    old.servers() != new.servers()
        || old.psk != new.psk
        || old.transport != new.transport
        || old.quic != new.quic
        || old.handshake_timeout != new.handshake_timeout
        || old.p2p_identity != new.p2p_identity
}

/// Starts `service` under `config`: binds an entrance's port first.
///
/// # Errors
///
/// [`ClientError::Bind`] when an entrance's port cannot be bound.
pub(super) async fn start(
    shared: &Arc<Shared>,
    config: &ClientConfig,
    service: &ClientP2p,
) -> Result<Running, ClientError> {
    let meter = shared.telemetry.metrics.service(&service.name);
    let state = Arc::new(P2pState {
        stats: Arc::new(TunnelStats::metered(&meter).limited(shared.limits.get(&service.name))),
        peers: Mutex::default(),
        last_error: Mutex::default(),
    });
    let (kind, udp) = tunnel_kind(service.kind);
    let stop = shared.cancel.child_token();
    let report = reporter(&service.name, &state);
    let options = service_options(config, service).map_err(ClientError::P2pIdentity)?;
    let task = match &service.end {
        P2pEnd::Exit { target } => {
            let exit = Arc::new(Exit {
                kind,
                target: target.clone(),
                udp,
            });
            // Offered at every server at once: a visitor meets it at whichever it reaches.
            let listeners: Vec<Listener> = options
                .into_iter()
                .map(|options| Listener {
                    exit: Arc::clone(&exit),
                    service: Some((service.name.clone(), service.token.clone())),
                    options,
                    max_peers: MAX_PEERS,
                    stats: Arc::clone(&state.stats),
                })
                .collect();
            let stop = stop.clone();
            shared.tasks.spawn(async move {
                // A named service is offered again and again: these end only with `stop`.
                let offering = listeners
                    .iter()
                    .map(|listener| listen::keep_offered(listener, &stop, &report));
                futures_util::future::join_all(offering).await;
            })
        }
        P2pEnd::Entrance { bind } => {
            let entrance = Entrance::bind(kind, *bind, udp, Arc::clone(&state.stats))
                .await
                .map_err(|error| ClientError::Bind {
                    service: service.name.clone(),
                    addr: *bind,
                    source: match error {
                        TunnelError::Bind { source, .. } => source,
                        other => std::io::Error::other(other.to_string()),
                    },
                })?;
            info!(event = "p2p_listening", service = %service.name, address = %entrance.local_addr(), kind = kind.word(), "P2P service listening");
            let meeting = Meeting::Service {
                name: service.name.clone(),
                token: service.token.clone(),
            };
            let (stop, name, state) = (stop.clone(), service.name.clone(), Arc::clone(&state));
            shared.tasks.spawn(async move {
                while !stop.is_cancelled() {
                    let Err(error) = entrance
                        .keep_joined(None, &meeting, &options, &stop, &report)
                        .await
                    else {
                        break;
                    };
                    state.failed(&error);
                    warn!(event = "p2p_refused", service = %name, %error, retry_s = REFUSED_RETRY.as_secs(), "P2P service refused; trying again later");
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(REFUSED_RETRY) => {}
                    }
                }
                entrance.close().await;
            })
        }
    };
    Ok(Running {
        config: service.clone(),
        state,
        stop,
        task,
    })
}

/// Logs a P2P service's events and keeps its state.
fn reporter(name: &str, state: &Arc<P2pState>) -> Reporter {
    let (name, state) = (name.to_owned(), Arc::clone(state));
    Arc::new(move |event| match event {
        Event::Offered(_) => {
            info!(event = "p2p_offered", service = %name, "P2P service offered at the server's mailbox")
        }
        Event::Connected(connected) => {
            state.connected(connected);
            info!(
                event = "p2p_connected",
                service = %name,
                peer = %connected.peer.short(),
                route = connected.route.word(),
                address = %route_addr(connected.route),
                rtt_ms = connected.connection.rtt().as_secs_f64() * 1e3,
                "P2P peer connected"
            );
        }
        Event::Moved { peer, route } => info!(
            event = "p2p_moved",
            service = %name,
            peer = %peer.peer.short(),
            route = route.word(),
            address = %route_addr(route),
            "P2P peer connection moved to another path, its streams untouched"
        ),
        Event::Disconnected { peer, reason } => {
            state.disconnected(peer);
            info!(event = "p2p_disconnected", service = %name, peer = %peer.peer.short(), %reason, "P2P peer disconnected");
        }
        Event::Retrying { error, pause } => {
            state.failed(error);
            warn!(event = "p2p_retrying", service = %name, %error, pause_ms = pause.as_millis() as u64, "P2P service could not connect; trying again");
        }
        Event::Notice(notice) => {
            warn!(event = "p2p_notice", service = %name, %notice, "P2P service notice")
        }
    })
}

/// Starts every P2P service of `config`.
///
/// # Errors
///
/// [`ClientError::Bind`] when an entrance's port cannot be bound (those started are
/// stopped again).
pub(super) async fn start_all(
    shared: &Arc<Shared>,
    config: &ClientConfig,
) -> Result<HashMap<String, Running>, ClientError> {
    let mut running = HashMap::new();
    if let Some(identity) = identity(config).map_err(ClientError::P2pIdentity)? {
        info!(event = "p2p_identity", fingerprint = %identity.fingerprint().hex(), "P2P identity (the other ends pin it with peer = \"...\")");
    }
    for service in config.p2p.values() {
        match start(shared, config, service).await {
            Ok(started) => {
                running.insert(service.name.clone(), started);
            }
            Err(error) => {
                for (_, started) in running {
                    started.stop().await;
                }
                return Err(error);
            }
        }
    }
    Ok(running)
}

/// Applies a reload's P2P services: stops those removed or changed (all of them when the
/// way to the mailbox changed), then starts the new and changed ones. A port that cannot
/// be bound is reported in the summary; the rest of the reload stands.
/// Whether two settings of a P2P service differ at most in their bandwidth limit, which a
/// reload changes in place.
fn same_but_limit(wanted: &ClientP2p, running: &ClientP2p) -> bool {
    let mut running = running.clone();
    running.bandwidth_limit = wanted.bandwidth_limit;
    running == *wanted
}

pub(super) async fn apply(
    shared: &Arc<Shared>,
    old: &ClientConfig,
    new: &ClientConfig,
    summary: &mut ReloadSummary,
) {
    let all = mailbox_changed(old, new);
    let stopping: Vec<Running> = {
        let mut running = shared.p2p_running();
        let names: Vec<String> = running
            .iter()
            .filter(|(name, running)| {
                all || new
                    .p2p
                    .get(*name)
                    .is_none_or(|wanted| !same_but_limit(wanted, &running.config))
            })
            .map(|(name, _)| name.clone())
            .collect();
        names
            .iter()
            .filter_map(|name| running.remove(name))
            .collect()
    };
    for running in stopping {
        let name = running.config.name.clone();
        running.stop().await;
        if !new.p2p.contains_key(&name) {
            summary.applied.push(format!("P2P service {name} stopped"));
        }
    }
    let missing: Vec<ClientP2p> = {
        let running = shared.p2p_running();
        new.p2p
            .values()
            .filter(|service| !running.contains_key(&service.name))
            .cloned()
            .collect()
    };
    for service in missing {
        match start(shared, new, &service).await {
            Ok(started) => {
                summary
                    .applied
                    .push(format!("P2P service {} (re)started", service.name));
                shared.p2p_running().insert(service.name.clone(), started);
            }
            Err(error) => summary.applied.push(format!(
                "P2P service {} did not start: {error}",
                service.name
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::secret::Secret;

    #[test]
    fn a_change_to_any_server_or_the_psk_restarts_the_p2p_services() {
        let server = |port: u16| HostPort::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let old = ClientConfig {
            more_servers: vec![server(2)],
            ..ClientConfig::new(server(1), Secret::new("p2p-test-psk-0123456789"))
        };
        assert!(!mailbox_changed(&old, &old.clone()));
        let second_moved = ClientConfig {
            more_servers: vec![server(3)],
            ..old.clone()
        };
        assert!(mailbox_changed(&old, &second_moved));
        let new_psk = ClientConfig {
            psk: Secret::new("another-p2p-test-psk-0123"),
            ..old.clone()
        };
        assert!(mailbox_changed(&old, &new_psk));
    }
}
