//! The side behind NAT: `warren client`.
//!
//! The client dials the server, authenticates (PSK through the Noise handshake, then one
//! token proof per service), and keeps a small pool of pre-opened data channels at the
//! server. When a visitor arrives there, the server sends `StreamOpen` on one of them; the
//! client dials the service's target and relays. A lost session is re-established with
//! exponential backoff and jitter; a refusal that retrying cannot fix (every token wrong, no
//! common cipher) ends the client with an error instead.
//!
//! A running client takes a new config through its [`Reloader`] (`SIGHUP`, a file change or
//! the admin API, see [`crate::reload`]); [`reload`] says what a reload touches.
//!
//! Main types: [`Client`] (validated config, built with [`Client::builder`]),
//! [`ClientStatus`] (watch the connection from outside).

mod admin;
mod drain;
pub mod establish;
mod forward;
pub(crate) use forward::{client_layers, dial_server, offered_ciphers};
mod health;
#[cfg(unix)]
pub(crate) mod p2p;
pub mod quic;
mod race;
mod reload;
mod reverse;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rand::RngCore;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};
use warren_proto::CipherSuite;
use warren_proto::handshake::Refusal;
use warren_proto::liveness::{Backoff, Heartbeat, PeerState};
use warren_proto::message::{ClaimKind, ControlMessage, HelloMode, Verdict};

use crate::Side;
use crate::admin::SessionInfo;
use crate::config::ha::HealthCheck;
use crate::config::proxy::ProxySetting;
use crate::config::{
    ClientConfig, ClientForward, ClientService, ConfigErrors, HostPort, ProxyProtocol, ServiceKind,
    Transport, TransportEntry, UdpSettings,
};
use crate::crypto::keys::SessionKeys;
use crate::crypto::secret::Secret;
use crate::metrics::{HandshakeFailure, ServiceMeter, Telemetry, unix_seconds};
use crate::relay::limit::Limits;
use crate::reload::{ConfigSource, Reloader, Requests};
use crate::session::link::ClientLink;
use crate::session::stream::Stream;
use crate::session::tcp::Dialer;
use crate::session::vitals::Vitals;
use crate::session::{self as control, CONTROL_QUEUE, Liveness, SessionEnd, short_id, summarize};
use crate::transport::compress::Codec;
use crate::transport::layers::ClientLayers;
use establish::{Claim, EstablishError, EstablishedSession};

/// Errors that end the client (everything else is retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server refused the session for a reason retrying cannot fix.
    #[error("the server refused this client: {0}")]
    Refused(Refusal),
    /// The server refused the hello for a reason retrying cannot fix (it said why).
    #[error("{0}")]
    HelloRefused(String),
    /// Every service was refused: wrong tokens, or services the server does not have.
    #[error(
        "the server refused every service ({0}): wrong token, or the service is not in the server's config; check `token` / `default_token` on both sides"
    )]
    AllServicesRefused(String),
    /// The P2P identity file (`p2p_identity`) could not be read, parsed or created.
    #[error("p2p_identity: {0}")]
    P2pIdentity(String),
    /// A forward service's local port could not be bound.
    #[error(
        "cannot bind forward service `{service}` on {addr}: {source}; is another process using it? (choose another port)"
    )]
    Bind {
        /// The service.
        service: String,
        /// Its `bind`.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The admin API's port could not be bound.
    #[error(
        "cannot bind the admin API on {addr}: {source}; is another process using it? (change [admin] bind)"
    )]
    AdminBind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Connection state, observable through [`Client::status`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStatus {
    /// Whether a session is up right now.
    pub connected: bool,
    /// Sessions established so far (reconnects included).
    pub sessions: u64,
    /// Services the server accepted in the current session.
    pub services: Vec<String>,
    /// The negotiated cipher of the current session.
    pub cipher: Option<CipherSuite>,
    /// Client-declared services: the address the server bound for each, as it reported it.
    pub bound: BTreeMap<String, SocketAddr>,
    /// Client-declared HTTP services: the URLs the server routes to each.
    pub urls: BTreeMap<String, Vec<String>>,
    /// The servers a session is up with now, as configured.
    pub servers: Vec<String>,
    /// The transport of each of those sessions, in the same order (`"noise"`, `"wss:443"`).
    pub transports: Vec<String>,
    /// Forward services: the local address each listens on (bound once, at start).
    pub forwards: BTreeMap<String, SocketAddr>,
}

/// A validated client, ready to run.
pub struct Client {
    config: ClientConfig,
    status: watch::Sender<ClientStatus>,
    reloader: Reloader<ClientConfig>,
    reloads: Requests<ClientConfig>,
    /// The config file, when the client reloads from one.
    source: Option<ConfigSource<ClientConfig>>,
}

/// Builds a [`Client`] in code; the CLI uses [`Client::from_config`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = warren::Client::builder("tunnel.example.com:7000".parse()?)
///     .psk("a-long-random-pre-shared-key")
///     .default_token("a-long-random-service-token")
///     .tcp_service("web", "127.0.0.1:3000".parse()?)
///     .build()?;
/// client.run(tokio_util::sync::CancellationToken::new()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    config: ClientConfig,
    services: Vec<(String, ServiceKind, HostPort, Option<Secret>)>,
    /// Declared services' `remote_bind`, by name.
    remote_binds: HashMap<String, SocketAddr>,
    /// PROXY protocol versions, by service name.
    proxy_protocols: HashMap<String, ProxyProtocol>,
    /// Forward services: name, protocol, local bind, optional target selector.
    forwards: Vec<(String, ServiceKind, SocketAddr, Option<HostPort>)>,
    /// Balancing weights, by service name.
    weights: HashMap<String, u16>,
    /// Target health checks, by service name.
    health_checks: HashMap<String, HealthCheck>,
    /// Bandwidth limits (bytes per second each way), by service name.
    bandwidth_limits: HashMap<String, u64>,
    /// How services compress what this side sends, by name.
    compression: HashMap<String, Codec>,
}

impl ClientBuilder {
    crate::builder::common_setters!();

    /// How `tls` / `wss` check the server's certificate (default: any; the PSK decides).
    pub fn tls(mut self, tls: crate::config::web::ClientTlsConfig) -> Self {
        self.config.tls = tls;
        self
    }

    /// Silence from the server after which the session is declared dead.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.config.heartbeat_timeout = timeout;
        self
    }

    /// How often a session on a later transport of the list tries the earlier ones again.
    pub fn transport_retry(mut self, every: Duration) -> Self {
        self.config.transport_retry = every;
        self
    }

    /// First and longest wait between reconnects.
    pub fn reconnect_delays(mut self, initial: Duration, max: Duration) -> Self {
        self.config.reconnect_initial_delay = initial;
        self.config.reconnect_max_delay = max;
        self
    }

    /// A reverse TCP service: visitors of the server's `name` port reach `target`.
    pub fn tcp_service(mut self, name: impl Into<String>, target: HostPort) -> Self {
        self.services
            .push((name.into(), ServiceKind::Tcp, target, None));
        self
    }

    /// A client-declared TCP service: the server binds `remote_bind` (port 0: any port in
    /// its `allow_ports`) and visitors there reach `target`. Authenticated by the default
    /// token; the bound address appears in [`ClientStatus::bound`].
    pub fn declared_service(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        remote_bind: SocketAddr,
    ) -> Self {
        let name = name.into();
        self.remote_binds.insert(name.clone(), remote_bind);
        self.services.push((name, ServiceKind::Tcp, target, None));
        self
    }

    /// Sends a PROXY protocol header to the target of service `name` (added before or after).
    pub fn proxy_protocol(mut self, name: impl Into<String>, version: ProxyProtocol) -> Self {
        self.proxy_protocols.insert(name.into(), version);
        self
    }

    /// A forward TCP service: the client listens on `bind` (port 0: any free port, see
    /// [`ClientStatus::forwards`]) and the server dials the target of its forward service
    /// `name`.
    pub fn forward_service(mut self, name: impl Into<String>, bind: SocketAddr) -> Self {
        self.forwards
            .push((name.into(), ServiceKind::Tcp, bind, None));
        self
    }

    /// A forward UDP service: the client binds a UDP socket on `bind` (port 0: any free
    /// port, see [`ClientStatus::forwards`]); each visitor address is a flow, and the
    /// server sends its datagrams to the target of its forward service `name`.
    pub fn udp_forward_service(
        mut self,
        name: impl Into<String>,
        bind: SocketAddr,
        settings: UdpSettings,
    ) -> Self {
        self.forwards
            .push((name.into(), ServiceKind::Udp(settings), bind, None));
        self
    }

    /// A client-declared UDP service: the server binds a UDP socket on `remote_bind`
    /// (port 0: any port in its `allow_ports`) and datagrams there reach `target`.
    pub fn declared_udp_service(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        remote_bind: SocketAddr,
        settings: UdpSettings,
    ) -> Self {
        let name = name.into();
        self.remote_binds.insert(name.clone(), remote_bind);
        self.services
            .push((name, ServiceKind::Udp(settings), target, None));
        self
    }

    /// A forward TCP service selecting the server's forward service by its `target`.
    pub fn forward_to(
        mut self,
        name: impl Into<String>,
        bind: SocketAddr,
        target: HostPort,
    ) -> Self {
        self.forwards
            .push((name.into(), ServiceKind::Tcp, bind, Some(target)));
        self
    }

    /// Keeps a session with `server` too, besides the first one (high availability).
    pub fn also_server(mut self, server: HostPort) -> Self {
        self.config.more_servers.push(server);
        self
    }

    /// This client's share of service `name`'s visitors when several clients serve it.
    pub fn weight(mut self, name: impl Into<String>, weight: u16) -> Self {
        self.weights.insert(name.into(), weight);
        self
    }

    /// Checks the target of service `name`; while it fails, the service is withdrawn.
    pub fn health_check(mut self, name: impl Into<String>, check: HealthCheck) -> Self {
        self.health_checks.insert(name.into(), check);
        self
    }

    /// Reaches the server through a proxy.
    pub fn proxy(mut self, proxy: ProxySetting) -> Self {
        self.config.proxy = Some(proxy);
        self
    }

    /// Tries IPv6 addresses first when a name resolves to both.
    pub fn prefer_ipv6(mut self, prefer: bool) -> Self {
        self.config.prefer_ipv6 = prefer;
        self
    }

    /// A reverse UDP service with default settings: datagrams to the server's `name` port
    /// reach `target`, one socket per visitor.
    pub fn udp_service(self, name: impl Into<String>, target: HostPort) -> Self {
        self.udp_service_with(name, target, UdpSettings::DEFAULT)
    }

    /// A reverse UDP service with its own idle timeout and flow bound.
    pub fn udp_service_with(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        settings: UdpSettings,
    ) -> Self {
        self.services
            .push((name.into(), ServiceKind::Udp(settings), target, None));
        self
    }

    /// A reverse TCP service with its own token.
    pub fn tcp_service_with_token(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        token: impl Into<String>,
    ) -> Self {
        self.services.push((
            name.into(),
            ServiceKind::Tcp,
            target,
            Some(Secret::new(token)),
        ));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// Every problem at once.
    pub fn build(mut self) -> Result<Client, ConfigErrors> {
        for (name, kind, target, token) in self.services {
            let token = token
                .or_else(|| self.config.default_token.clone())
                .unwrap_or_default();
            self.config.services.insert(
                name.clone(),
                ClientService {
                    remote_bind: self.remote_binds.get(&name).copied(),
                    proxy_protocol: self.proxy_protocols.get(&name).copied(),
                    weight: self.weights.get(&name).copied().unwrap_or(1),
                    health_check: self.health_checks.get(&name).cloned(),
                    http_claim: None,
                    bandwidth_limit: self.bandwidth_limits.get(&name).copied(),
                    compression: self.compression.get(&name).copied(),
                    name,
                    kind,
                    target,
                    token,
                },
            );
        }
        for (name, kind, bind, target) in self.forwards {
            let token = self.config.default_token.clone().unwrap_or_default();
            self.config.forwards.insert(
                name.clone(),
                ClientForward {
                    bandwidth_limit: self.bandwidth_limits.get(&name).copied(),
                    compression: self.compression.get(&name).copied(),
                    name,
                    kind,
                    bind,
                    target,
                    token,
                },
            );
        }
        Client::from_config(self.config)
    }
}

impl Client {
    /// Starts a builder for a client of the server at `server`.
    pub fn builder(server: HostPort) -> ClientBuilder {
        ClientBuilder {
            config: ClientConfig::new(server, Secret::default()),
            services: Vec::new(),
            remote_binds: HashMap::new(),
            proxy_protocols: HashMap::new(),
            forwards: Vec::new(),
            weights: HashMap::new(),
            health_checks: HashMap::new(),
            bandwidth_limits: HashMap::new(),
            compression: HashMap::new(),
        }
    }

    /// A client from a loaded config.
    ///
    /// # Errors
    /// The config's validation errors.
    pub fn from_config(config: ClientConfig) -> Result<Client, ConfigErrors> {
        config.validate()?;
        let (reloader, reloads) = Reloader::new("client");
        Ok(Client {
            config,
            status: watch::channel(ClientStatus::default()).0,
            reloader,
            reloads,
            source: None,
        })
    }

    /// Hands new configs to the running client (see [`reload`] for what a reload touches).
    pub fn reloader(&self) -> Reloader<ClientConfig> {
        self.reloader.clone()
    }

    /// Reloads from `source` on `SIGHUP`, when its file changes (unless the source says not
    /// to watch it) and on the admin API's `POST /api/v1/reload`.
    pub fn reload_from(mut self, source: ConfigSource<ClientConfig>) -> Self {
        self.source = Some(source);
        self
    }

    /// Watches the connection state.
    pub fn status(&self) -> watch::Receiver<ClientStatus> {
        self.status.subscribe()
    }

    /// Runs until `cancel` fires (then returns `Ok`) or the server refuses the client for
    /// good (then returns the reason). Connection losses are retried forever.
    ///
    /// # Errors
    /// [`ClientError`] for refusals that retrying cannot fix.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), ClientError> {
        self.run_draining(CancellationToken::new(), cancel).await
    }

    /// [`Client::run`] that also drains when `drain` fires: every server is told to send
    /// this client no new visitors, the streams in flight finish (up to the config's
    /// `drain_timeout`), and then the client stops as if `cancel` had fired. `cancel`
    /// still stops it at once, draining or not.
    ///
    /// # Errors
    /// As [`Client::run`].
    pub async fn run_draining(
        self,
        drain: CancellationToken,
        cancel: CancellationToken,
    ) -> Result<(), ClientError> {
        let Client {
            config,
            status,
            reloader,
            reloads,
            source,
        } = self;
        let listeners = forward::bind_forwards(&config).await?;
        let telemetry = Telemetry::new(Side::Client);
        let meters = config
            .services
            .keys()
            .map(|name| (name.clone(), telemetry.metrics.service(name)))
            .collect();
        let admin_listener = match &config.admin {
            Some(admin) => Some(crate::admin::bind(admin.bind).await.map_err(|source| {
                ClientError::AdminBind {
                    addr: admin.bind,
                    source,
                }
            })?),
            None => None,
        };
        let admin_access = config
            .admin
            .as_ref()
            .map(crate::admin::Access::from)
            .unwrap_or_default();
        let limits = Limits::new(bandwidth_limits(&config));
        let shared = Arc::new(Shared {
            limits,
            config: RwLock::new(Arc::new(config)),
            status,
            cancel,
            tasks: TaskTracker::new(),
            sessions: Mutex::new(Vec::new()),
            telemetry,
            meters: RwLock::new(meters),
            forwards: Mutex::new(HashMap::new()),
            restart: watch::channel(0).0,
            health: health::Board::default(),
            quic_clients: Mutex::new(Vec::new()),
            #[cfg(unix)]
            p2p: Mutex::new(HashMap::new()),
            drain: crate::drain::Drain::new(drain),
        });
        #[cfg(unix)]
        {
            let config = shared.config();
            let started = p2p::start_all(&shared, &config).await.inspect_err(|_| {
                shared.cancel.cancel();
            })?;
            *shared.p2p.lock().unwrap_or_else(PoisonError::into_inner) = started;
        }
        let applying = Arc::clone(&shared);
        let reload_source = reloads.start(
            reloader,
            source,
            (&shared.tasks, &shared.cancel, &shared.telemetry),
            move |config| {
                let shared = Arc::clone(&applying);
                async move { reload::apply(&shared, config).await }
            },
        );
        if let Some(listener) = admin_listener {
            let source = Arc::new(admin::ClientAdmin {
                shared: Arc::clone(&shared),
                reloader: reload_source,
            });
            shared.tasks.spawn(crate::admin::serve(
                listener,
                source,
                admin_access,
                shared.cancel.clone(),
            ));
        }
        for (forward, socket) in listeners {
            forward::start(&shared, forward, socket);
        }
        health::start_checks(&shared);
        let draining = Arc::clone(&shared);
        shared.tasks.spawn(async move {
            tokio::select! {
                () = draining.cancel.cancelled() => {}
                () = draining.drain.asked() => {
                    drain::drain(&draining).await;
                    draining.cancel.cancel();
                }
            }
        });
        let config = shared.config();
        let servers: Vec<String> = config.servers().iter().map(|s| s.to_string()).collect();
        let uses_tcp = config
            .transport_list()
            .iter()
            .any(|entry| entry.transport != crate::config::Transport::Quic);
        let tcp_congestion = if uses_tcp {
            config.tcp_congestion.announce("client")
        } else {
            "-".to_owned()
        };
        info!(
            event = "client_started",
            server = %servers.join(","),
            transport = %config.transport,
            services = config.services.len(),
            p2p_services = config.p2p.len(),
            tcp_congestion = %tcp_congestion,
            "warren client starting"
        );
        // One link per server, each with its own session and reconnect backoff: losing one
        // server affects no other.
        let mut links = tokio::task::JoinSet::new();
        for index in 0..servers.len() {
            links.spawn(run_link(Arc::clone(&shared), index));
        }
        let mut result = Ok(());
        while let Some(done) = links.join_next().await {
            if let Ok(Err(error)) = done
                && result.is_ok()
            {
                result = Err(error);
            }
        }
        shared.cancel.cancel();
        shared.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), shared.tasks.wait()).await;
        info!(event = "client_stopped", "warren client stopped");
        result
    }
}

/// Keeps a session with the `index`-th server of the config in force until the client
/// stops (`Ok`) or that server refuses the client for good (the error). A link whose server
/// a reload removed ends quietly.
async fn run_link(shared: Arc<Shared>, index: usize) -> Result<(), ClientError> {
    let config = shared.config();
    let mut backoff = Backoff::new(config.reconnect_initial_delay, config.reconnect_max_delay);
    let mut restart = shared.restart.subscribe();
    // The transport that won last time goes first next time.
    let mut preferred: Option<TransportEntry> = None;
    loop {
        let Some(server) = shared.config().servers().get(index).map(|s| (*s).clone()) else {
            return Ok(());
        };
        let started = tokio::time::Instant::now();
        let mut wait = true;
        let order = race::preferring(&shared.config().transport_list(), preferred);
        let held = match establish_session(
            &shared,
            &server,
            (&order, false),
            &mut backoff,
            &mut restart,
        )
        .await
        {
            Ok(established) => {
                let mut link = Link {
                    shared: &shared,
                    server: &server,
                    backoff: &mut backoff,
                    restart: &mut restart,
                    preferred: &mut preferred,
                };
                link.hold(established).await
            }
            Err(failure) => Err(failure),
        };
        match held {
            Err(Failure::Stopped) => return Ok(()),
            Ok(SessionEnd::Cancelled) if shared.cancel.is_cancelled() => return Ok(()),
            // A reload ended the session to start one with the new config: at once.
            Ok(SessionEnd::Cancelled) => wait = false,
            Ok(end) => {
                // A server that says goodbye after a while (its config changed, it
                // restarts) is retried at once; one that keeps doing so backs off.
                let goodbye = matches!(end, SessionEnd::Goodbye(_));
                wait = !(goodbye && started.elapsed() >= GOODBYE_RETRY_AFTER);
                warn!(event = "session_lost", %server, reason = %end, "session lost");
            }
            Err(Failure::Fatal(error)) => {
                error!(event = "client_refused", %server, %error, "giving up on this server");
                return Err(error);
            }
            Err(Failure::Retry(reason)) => {
                warn!(event = "connect_failed", %server, %reason, "could not establish a session")
            }
        }
        if restart.has_changed().unwrap_or(false) {
            continue;
        }
        shared.telemetry.metrics.reconnecting();
        if !wait {
            continue;
        }
        let config = shared.config();
        backoff.set_bounds(config.reconnect_initial_delay, config.reconnect_max_delay);
        let delay = backoff.next_delay(rand::rng().next_u64());
        info!(
            event = "reconnect_scheduled",
            %server,
            delay_ms = delay.as_millis() as u64,
            "reconnecting in {delay:?}"
        );
        tokio::select! {
            () = shared.cancel.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
            _ = restart.changed() => {}
        }
    }
}

/// A session that lasted this long and ended with the server's goodbye is retried at once.
const GOODBYE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// State shared by the client's tasks across sessions.
struct Shared {
    /// The config in force; a reload swaps it whole.
    config: RwLock<Arc<ClientConfig>>,
    status: watch::Sender<ClientStatus>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// The sessions up right now, one per server at most, in the order they came up.
    sessions: Mutex<Vec<Arc<ClientSession>>>,
    /// Metrics and live connections (read by the admin API).
    telemetry: Arc<Telemetry>,
    /// Each service's counters.
    meters: RwLock<HashMap<String, ServiceMeter>>,
    /// Forward services' local ports, by name.
    forwards: Mutex<HashMap<String, forward::Running>>,
    /// Bumped by a reload that needs new sessions: every link starts one at once.
    restart: watch::Sender<u64>,
    /// Targets' health, for services with a health check.
    health: health::Board,
    /// QUIC endpoints by server, kept across reconnects (their TLS tickets resume).
    quic_clients: Mutex<Vec<CachedQuicClient>>,
    /// P2P services, by name.
    #[cfg(unix)]
    p2p: Mutex<HashMap<String, p2p::Running>>,
    /// Services' bandwidth limits (a reload changes them in place).
    limits: Limits,
    /// The drain (SIGTERM, the admin API): once asked, services are claimed and reported
    /// withdrawn.
    drain: crate::drain::Drain,
}

/// Every reverse, forward and P2P service of the config with its bandwidth limit, if any.
fn bandwidth_limits(config: &ClientConfig) -> impl Iterator<Item = (&str, Option<u64>)> {
    let services = config
        .services
        .values()
        .map(|s| (&s.name, s.bandwidth_limit));
    let forwards = config
        .forwards
        .values()
        .map(|f| (&f.name, f.bandwidth_limit));
    let p2p = config.p2p.values().map(|p| (&p.name, p.bandwidth_limit));
    services
        .chain(forwards)
        .chain(p2p)
        .map(|(name, limit)| (name.as_str(), limit))
}

/// A QUIC endpoint and the settings it was made for.
struct CachedQuicClient {
    server: HostPort,
    ipv6: bool,
    quic: crate::config::quic::QuicConfig,
    psk: Secret,
    client: Arc<quic::QuicClient>,
}

impl Shared {
    /// The QUIC endpoint for `server` under `config`: the one made before if the settings
    /// are the same (its TLS tickets make the handshake a resumption), else a new one.
    fn quic_client(
        &self,
        config: &ClientConfig,
        server: &HostPort,
        ipv6: bool,
    ) -> Result<Arc<quic::QuicClient>, crate::transport::quic::QuicError> {
        let mut cache = self
            .quic_clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = cache.iter().find(|c| {
            c.server == *server && c.ipv6 == ipv6 && c.quic == config.quic && c.psk == config.psk
        }) {
            return Ok(Arc::clone(&cached.client));
        }
        let client = Arc::new(quic::QuicClient::new(config, server, ipv6)?);
        cache.retain(|c| c.server != *server || c.ipv6 != ipv6);
        // Bounded by the servers of the config (at most 16) and two families.
        cache.push(CachedQuicClient {
            server: server.clone(),
            ipv6,
            quic: config.quic.clone(),
            psk: config.psk.clone(),
            client: Arc::clone(&client),
        });
        Ok(client)
    }

    /// The config in force (a snapshot: a reload does not change it under the caller).
    fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// A service's counters.
    fn meter(&self, service: &str) -> Option<ServiceMeter> {
        self.meters
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
            .cloned()
    }

    /// The P2P services running now.
    #[cfg(unix)]
    fn p2p_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, p2p::Running>> {
        self.p2p.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks every link for a new session with the config in force (see [`Link::hold`]): at
    /// once, whether a session is up, being established or awaited after a failure.
    fn restart_session(&self) {
        self.restart.send_modify(|generation| *generation += 1);
    }

    /// The sessions up now.
    /// Whether `service` is offered to the servers: its target passes its check (or has
    /// none) and the client is not draining.
    fn offers(&self, service: &str) -> bool {
        !self.drain.is_draining() && self.health.is_up(service)
    }

    fn sessions_now(&self) -> Vec<Arc<ClientSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets the status from the sessions up now.
    fn refresh_status(&self, added: bool) {
        let sessions = self.sessions_now();
        self.status.send_modify(|s| {
            s.connected = !sessions.is_empty();
            if added {
                s.sessions += 1;
            }
            let mut services: Vec<String> = sessions
                .iter()
                .flat_map(|session| session.service_names())
                .collect();
            services.sort();
            services.dedup();
            s.services = services;
            s.cipher = sessions
                .first()
                .and_then(|session| session.keys.record_cipher());
            s.bound = sessions
                .iter()
                .flat_map(|session| session.bound.clone())
                .collect();
            s.urls = sessions
                .iter()
                .flat_map(|session| session.urls.clone())
                .collect();
            s.servers = sessions
                .iter()
                .map(|session| session.server.to_string())
                .collect();
            s.transports = sessions
                .iter()
                .map(|session| session.transport.to_string())
                .collect();
        });
    }
}

/// How an attempt to hold a session failed.
enum Failure {
    Fatal(ClientError),
    Retry(String),
    /// The client is stopping.
    Stopped,
}

/// One session's state, shared with its data channel tasks.
pub(crate) struct ClientSession {
    keys: Arc<SessionKeys>,
    /// The config the session was established with (how to reach the server).
    config: Arc<ClientConfig>,
    /// The server this session is with, as configured.
    server: HostPort,
    /// The transport it runs on (and its port, when not the server's).
    transport: TransportEntry,
    /// The address the control channel reached (the proxy's, when there is one).
    server_addr: SocketAddr,
    /// The session's streams.
    link: ClientLink,
    /// Services the server accepted (their targets come from the config in force).
    services: HashSet<String>,
    /// Forward services the server accepted.
    forwards: HashSet<String>,
    /// Client-declared services and the addresses the server bound for them.
    bound: BTreeMap<String, SocketAddr>,
    /// Client-declared HTTP services and the URLs the server routes to them.
    urls: BTreeMap<String, Vec<String>>,
    /// The handshake's round trip: forward services prefer the nearest server.
    rtt: Duration,
    /// Messages for the server (health reports); the control loop sends them.
    control: mpsc::Sender<ControlMessage>,
    control_rx: Mutex<Option<mpsc::Receiver<ControlMessage>>>,
    /// Cancelled when the session ends.
    cancel: CancellationToken,
    /// Set when a newer session took this one's place (a reload).
    replaced: AtomicBool,
    /// Set when the server said it drains: forward streams go through other servers.
    server_draining: AtomicBool,
    /// The client's own shutdown.
    shutdown: CancellationToken,
    /// When the server accepted the session (for the admin API).
    since: std::time::SystemTime,
    /// Streams open on the session now, and whether the server still answers.
    vitals: Vitals,
    /// The congestion control its connection runs
    /// ([`crate::session::link::Carrier::congestion`]).
    congestion: Option<String>,
}

/// How long a replaced session still takes streams from the server: it may have opened one
/// for a visitor just before it moved the services to the new session, and that stream
/// must land.
const REPLACED_POOL_GRACE: Duration = Duration::from_secs(2);

impl ClientSession {
    /// The session as the admin API shows it.
    fn info(&self) -> SessionInfo {
        let quic = self.link.quic_path();
        SessionInfo {
            id: short_id(self.keys.session_id()),
            peer: self.server_addr.to_string(),
            transport: self.transport.transport.name(),
            cipher: self.keys.cipher_label(),
            cipher_choice: self.keys.negotiation().into(),
            since: unix_seconds(self.since),
            services: self.service_names(),
            open_streams: self.vitals.open_streams(),
            state: self.vitals.state().into(),
            server: Some(self.server.to_string()),
            rtt_ms: Some(
                self.vitals
                    .rtt_millis()
                    .unwrap_or(self.rtt.as_secs_f64() * 1e3),
            ),
            version: warren_proto::handshake::PROTOCOL_VERSION,
            quic,
            congestion: self.congestion.clone(),
        }
    }

    /// Every service the server accepted, sorted.
    fn service_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .services
            .iter()
            .chain(&self.forwards)
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Stops taking streams from the server: at once when the session ended, a grace
    /// period later when a newer session replaced it.
    fn close_link(self: &Arc<Self>, tasks: &TaskTracker) {
        if !self.replaced.load(Ordering::Acquire) || self.shutdown.is_cancelled() {
            self.link.close();
            return;
        }
        let session = Arc::clone(self);
        tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(REPLACED_POOL_GRACE) => {}
                () = session.shutdown.cancelled() => {}
            }
            session.link.close();
        });
    }
}

/// Establishes a session with `server` and the config in force: handshake, hello,
/// verdicts.
async fn establish_session(
    shared: &Arc<Shared>,
    server: &HostPort,
    (order, background): (&[TransportEntry], bool),
    backoff: &mut Backoff,
    restart: &mut watch::Receiver<u64>,
) -> Result<Established, Failure> {
    // This session takes the newest config: a restart asked for before now is served.
    restart.borrow_and_update();
    let config = shared.config();
    let deadline = config.handshake_timeout;
    let proxy = match &config.proxy {
        Some(setting) => setting
            .resolve(&|name| std::env::var(name).ok())
            .map_err(Failure::Retry)?,
        None => None,
    };
    let mut claims = claims_of(&config);
    for claim in &mut claims {
        claim.ready = shared.offers(claim.name);
    }
    let attempt = |entry: TransportEntry| {
        attempt_transport(shared, &config, server, entry, proxy.as_ref(), &claims)
    };
    let racing = tokio::time::Instant::now();
    let raced = tokio::select! {
        () = shared.cancel.cancelled() => return Err(Failure::Stopped),
        raced = race::race(order, race::STAGGER, attempt, |error| {
            matches!(
                error,
                EstablishError::Refused(_) | EstablishError::HelloRefused { retry: false, .. }
            )
        }) => raced,
    };
    // A background retry of better transports is not a failure to connect: not counted.
    let metrics = (!background).then_some(&shared.telemetry.metrics);
    let (transport, (established, layers, target), failed) = match raced {
        Ok(won) => (won.entry, won.value, won.failed),
        Err(race::Lost::Final(error)) => return Err(failure(metrics, error)),
        Err(race::Lost::All(mut failures)) => {
            if failures.len() == 1 {
                let (_, error) = failures.remove(0);
                return Err(failure(metrics, error));
            }
            let reasons: Vec<String> = failures
                .into_iter()
                .map(|(entry, error)| {
                    let reason = error.to_string();
                    failure(metrics, error);
                    format!("{entry}: {reason}")
                })
                .collect();
            return Err(Failure::Retry(format!(
                "no transport worked ({})",
                reasons.join("; ")
            )));
        }
    };
    if order.len() > 1 {
        let failed: Vec<String> = failed
            .iter()
            .map(|(entry, error)| format!("{entry}: {error}"))
            .collect();
        info!(
            event = "transport_chosen",
            %server,
            transport = %transport,
            order = %order.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(","),
            elapsed_ms = racing.elapsed().as_millis() as u64,
            failed = %failed.join("; "),
            "connected over {transport}"
        );
    }
    let EstablishedSession {
        channel,
        carrier,
        keys,
        server_addr,
        verdicts,
        handshake_time,
        ..
    } = established;
    let names: Vec<&str> = claims.iter().map(|claim| claim.name).collect();
    let mut accepted = HashSet::new();
    let mut forwards = HashSet::new();
    let mut bound = BTreeMap::new();
    let mut urls = BTreeMap::new();
    let mut refused = Vec::new();
    let mut denied = Vec::new();
    for (name, verdict) in names.iter().zip(&verdicts) {
        match verdict {
            Verdict::Accepted { bound: address } => {
                if config.services.contains_key(*name) {
                    accepted.insert(name.to_string());
                } else {
                    forwards.insert(name.to_string());
                }
                if let Some(address) = address {
                    info!(event = "service_bound", %server, service = %name, %address, "the server bound this client-declared service");
                    bound.insert(name.to_string(), *address);
                }
            }
            Verdict::AcceptedHttp { urls: routed } => {
                accepted.insert(name.to_string());
                info!(event = "service_routed", %server, service = %name, urls = %routed.join(" "), "the server routes this client-declared http service");
                urls.insert(name.to_string(), routed.clone());
            }
            Verdict::Refused => refused.push(name.to_string()),
            Verdict::Denied { reason } => {
                error!(event = "service_denied", %server, service = %name, %reason, "the server refused this service: {reason}");
                denied.push(format!("{name}: {reason}"));
            }
        }
    }
    if !refused.is_empty() {
        error!(
            event = "auth_failed",
            %server,
            services = %refused.join(","),
            "the server refused these services: wrong token, or not in the server's config"
        );
    }
    // A client with only P2P services claims nothing: its session is idle, not refused.
    if accepted.is_empty() && forwards.is_empty() && !(refused.is_empty() && denied.is_empty()) {
        shared
            .telemetry
            .metrics
            .handshake_failed(HandshakeFailure::BadToken);
        let mut reasons = refused.clone();
        reasons.extend(denied.iter().cloned());
        let error = ClientError::AllServicesRefused(reasons.join("; "));
        // A denial (port in use, say) may clear up, e.g. when the server drops our previous
        // session after a reconnect; a wrong token never does.
        return if !denied.is_empty() && shared.status.borrow().sessions > 0 {
            Err(Failure::Retry(error.to_string()))
        } else {
            Err(Failure::Fatal(error))
        };
    }
    backoff.reset();

    let (control, control_rx) = mpsc::channel(CONTROL_QUEUE);
    let keys = Arc::new(keys);
    let dialer = Dialer {
        server: target,
        addr: server_addr,
        proxy,
        family: forward::family(&config),
        congestion: config.tcp_congestion.clone(),
        timeout: deadline,
        keys: Arc::clone(&keys),
        layers,
    };
    let session = Arc::new(ClientSession {
        config: Arc::clone(&config),
        server: server.clone(),
        transport,
        server_addr,
        congestion: carrier.congestion(),
        link: ClientLink::new(carrier, dialer, shared.tasks.clone()),
        services: accepted,
        forwards,
        bound,
        urls,
        rtt: handshake_time,
        control,
        control_rx: Mutex::new(Some(control_rx)),
        cancel: shared.cancel.child_token(),
        replaced: AtomicBool::new(false),
        server_draining: AtomicBool::new(false),
        shutdown: shared.cancel.clone(),
        since: std::time::SystemTime::now(),
        vitals: Vitals::default(),
        keys,
    });
    // A target whose health changed while the hello was under way: say so now.
    let mut changed: Vec<(String, bool)> = Vec::new();
    for claim in &claims {
        let up = shared.offers(claim.name);
        if up != claim.ready && session.services.contains(claim.name) {
            changed.push((claim.name.to_owned(), up));
        }
    }
    for (name, up) in changed {
        health::report(&session, vec![name], up);
    }
    Ok(Established { channel, session })
}

/// One transport's attempt at a session with `server`: its own port (the entry's, else the
/// server's), its layers and ciphers. Returns the session with the layers and the address
/// its data channels dial.
async fn attempt_transport(
    shared: &Arc<Shared>,
    config: &ClientConfig,
    server: &HostPort,
    entry: TransportEntry,
    proxy: Option<&crate::config::proxy::ProxyUrl>,
    claims: &[Claim<'_>],
) -> Result<(EstablishedSession, ClientLayers, HostPort), EstablishError> {
    let deadline = config.handshake_timeout;
    let target = HostPort {
        host: server.host.clone(),
        port: entry.port_or(server.port),
    };
    let server_name = forward::describe(&target, proxy);
    let layers = forward::client_layers(config, entry.transport, &target).map_err(|error| {
        EstablishError::Connect {
            server: server_name.clone(),
            source: std::io::Error::other(error),
        }
    })?;
    let established = if entry.transport == Transport::Quic {
        let connect = |source| EstablishError::Connect {
            server: server_name.clone(),
            source,
        };
        let server_addr = quic::resolve(&target, deadline, forward::family(config))
            .await
            .map_err(connect)?;
        let client = shared
            .quic_client(config, &target, server_addr.is_ipv6())
            .map_err(|e| EstablishError::Quic {
                server: server_name.clone(),
                error: e.to_string(),
            })?;
        establish::establish_quic(
            &client,
            &server_name,
            server_addr,
            claims,
            HelloMode::Serve,
            deadline,
        )
        .await?
    } else {
        let ciphers = forward::offered_ciphers(config, entry.transport);
        // Measured before the first handshake, then cached for the process.
        let ciphers = crate::crypto::speed::policy_measured(&ciphers, config.cipher_choice).await;
        establish::establish(
            forward::dial_server(config, entry.transport, &target, proxy, &layers, deadline),
            &server_name,
            &config.psk,
            &ciphers,
            claims,
            HelloMode::Serve,
            deadline,
        )
        .await?
    };
    Ok((established, layers, target))
}

/// Counts a failed attempt in `metrics` (when given) and says whether it is worth retrying.
fn failure(metrics: Option<&crate::metrics::Metrics>, error: EstablishError) -> Failure {
    let count = |reason| {
        if let Some(metrics) = metrics {
            metrics.handshake_failed(reason);
        }
    };
    match error {
        EstablishError::Refused(refusal) => {
            count(HandshakeFailure::Refused);
            Failure::Fatal(ClientError::Refused(refusal))
        }
        EstablishError::HelloRefused {
            reason,
            retry: false,
        } => {
            count(HandshakeFailure::Protocol);
            Failure::Fatal(ClientError::HelloRefused(reason))
        }
        error => {
            let reason = match error {
                EstablishError::Connect { .. } => HandshakeFailure::Connect,
                EstablishError::ClosedDuringHandshake { .. } => HandshakeFailure::BadPsk,
                EstablishError::HandshakeTimeout { .. } | EstablishError::HelloTimeout => {
                    HandshakeFailure::Timeout
                }
                EstablishError::Hello(_) => HandshakeFailure::Protocol,
                EstablishError::HelloRefused { .. } => HandshakeFailure::TooManySessions,
                _ => HandshakeFailure::Io,
            };
            count(reason);
            Failure::Retry(error.to_string())
        }
    }
}

/// A session the server accepted, not yet served.
struct Established {
    channel: Stream,
    session: Arc<ClientSession>,
}

/// Serves `established` until its end: a member of the sessions up for forward listeners
/// and the status, a pool of data channels, and the control channel.
async fn serve_session(shared: Arc<Shared>, established: Established) -> SessionEnd {
    let Established { channel, session } = established;
    let config = Arc::clone(&session.config);
    let names = session.service_names();
    info!(
        event = "session_started",
        session = %short_id(session.keys.session_id()),
        server = %session.server,
        cipher = %session.keys.cipher_label(),
        rtt_ms = session.rtt.as_secs_f64() * 1000.0,
        cipher_choice = %session.keys.describe_choice(),
        services = %summarize(&names),
        "connected"
    );
    // The session serves forward listeners before the status says "connected": whoever
    // watches the status may send at once. A session it replaces (a reload) leaves now.
    {
        let mut sessions = shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|s| s.server != session.server || !s.replaced.load(Ordering::Acquire));
        sessions.push(Arc::clone(&session));
    }
    shared.refresh_status(true);
    shared.telemetry.metrics.session_started();

    let control_rx = session
        .control_rx
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_else(|| mpsc::channel(1).1);
    let streams = Arc::new(reverse::ReverseStreams {
        shared: Arc::clone(&shared),
        session: Arc::clone(&session),
    });
    session.link.serve(&streams);
    // The client pings too (a third of its timeout apart while idle, as the server does by
    // default), so it learns the round trip and a frozen server within seconds.
    let liveness = Liveness {
        idle_interval: config.heartbeat_timeout / 3,
        timeout: config.heartbeat_timeout,
    };
    let end = control::run_control(
        channel,
        liveness,
        &session.vitals,
        control_rx,
        session.cancel.clone(),
        || {
            if shared.cancel.is_cancelled() {
                "shutting down".to_owned()
            } else {
                "the client's config changed; a new session took over".to_owned()
            }
        },
        |state, heartbeat| on_peer_state(&shared, &session, state, heartbeat),
        |message| match message {
            ControlMessage::NeedChannels { count } => session.link.more_streams(&streams, count),
            ControlMessage::Reclaim { reason } => {
                info!(event = "reclaim_requested", server = %session.server, %reason, "the server asks for a new session");
                shared.restart_session();
            }
            ControlMessage::Draining { reason } => {
                info!(event = "server_draining", server = %session.server, %reason, "the server drains: no new forward streams go through it; reconnecting once it is gone");
                session.server_draining.store(true, Ordering::Release);
            }
            other => warn!(
                event = "control_ignored",
                ?other,
                "ignoring unexpected control message from server"
            ),
        },
    )
    .await;
    session.cancel.cancel();
    session.close_link(&shared.tasks);
    shared.telemetry.metrics.session_ended();
    shared
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|s| !Arc::ptr_eq(s, &session));
    shared.refresh_status(false);
    end
}

/// Logs and counts a change in what the heartbeat believes of a session's server.
fn on_peer_state(
    shared: &Shared,
    session: &ClientSession,
    state: PeerState,
    heartbeat: &Heartbeat,
) {
    let id = short_id(session.keys.session_id());
    let open = session.vitals.open_streams();
    let rtt_ms = heartbeat.srtt().map(|rtt| rtt.as_secs_f64() * 1e3);
    match state {
        PeerState::Suspect => {
            shared.telemetry.metrics.session_suspect();
            warn!(event = "session_suspect", session = %id, server = %session.server, open_streams = open, ?rtt_ms, waited_ms = heartbeat.suspect_after().as_millis() as u64, "the server left a heartbeat unanswered; sending forward visitors through other servers");
        }
        PeerState::Dead => {
            shared.telemetry.metrics.session_dead();
            warn!(event = "session_dead", session = %id, server = %session.server, cut = open, ?rtt_ms, waited_ms = heartbeat.dead_after().as_millis() as u64, "the server stopped answering; ending the session and reconnecting");
        }
        PeerState::Alive => {
            info!(event = "session_recovered", session = %id, server = %session.server, ?rtt_ms, "the server answers again");
        }
    }
}

/// One server's link while a session is up: what [`Link::hold`] needs from [`run_link`].
struct Link<'a> {
    shared: &'a Arc<Shared>,
    server: &'a HostPort,
    backoff: &'a mut Backoff,
    restart: &'a mut watch::Receiver<u64>,
    /// The transport of the session up now: the next reconnect tries it first.
    preferred: &'a mut Option<TransportEntry>,
}

/// Why a session is being replaced while it serves.
enum Replace {
    /// A reload needs a session with the new config.
    Reload,
    /// The session runs on a later transport of the list; an earlier one may work again.
    Upgrade,
}

impl Link<'_> {
    /// Holds a session until it ends, returning how. A reload that needs a new session
    /// gets one established while this one still serves, and then takes its place (make
    /// before break: the new session joins the services at the server before the old one
    /// leaves, so no visitor finds none); the old one is closed with a goodbye, and its
    /// open streams keep flowing. A session on a later transport of the list tries the
    /// earlier ones every `transport_retry` and moves the same way when one works. A config
    /// with client-declared services breaks before it makes instead (and does not move): the
    /// server binds their ports per session, so the old session must let them go first.
    async fn hold(&mut self, mut established: Established) -> Result<SessionEnd, Failure> {
        let (shared, server) = (self.shared, self.server);
        loop {
            let session = Arc::clone(&established.session);
            *self.preferred = Some(session.transport);
            let mut serving = shared
                .tasks
                .spawn(serve_session(Arc::clone(shared), established));
            loop {
                let better = better_transports(&shared.config(), session.transport);
                let retry = shared.config().transport_retry;
                let replace = tokio::select! {
                    end = &mut serving => return Ok(end.unwrap_or(SessionEnd::Cancelled)),
                    changed = self.restart.changed() => {
                        if changed.is_err() {
                            continue;
                        }
                        Replace::Reload
                    }
                    () = tokio::time::sleep(retry), if !better.is_empty() => Replace::Upgrade,
                };
                let config = shared.config();
                let order = match replace {
                    Replace::Reload => {
                        info!(
                            event = "session_restarting",
                            %server,
                            "starting a session with the reloaded config"
                        );
                        if declares_ports(&config) || !config.servers().contains(&server) {
                            // The link picks the new config (and its server) up when this
                            // one ends.
                            session.cancel.cancel();
                            let _ = (&mut serving).await;
                            return Ok(SessionEnd::Cancelled);
                        }
                        race::preferring(&config.transport_list(), Some(session.transport))
                    }
                    // The server binds client-declared ports per session: moving would
                    // break before it makes, dropping their visitors.
                    Replace::Upgrade if declares_ports(&config) => continue,
                    Replace::Upgrade => {
                        debug!(event = "transport_retry", %server, current = %session.transport, "trying the transports before this one again");
                        better
                    }
                };
                let background = matches!(replace, Replace::Upgrade);
                let attempt = establish_session(
                    shared,
                    server,
                    (&order, background),
                    self.backoff,
                    self.restart,
                );
                tokio::pin!(attempt);
                let next = tokio::select! {
                    next = &mut attempt => next,
                    end = &mut serving => {
                        // The old session ended first: the new one is all there is.
                        let end = end.unwrap_or(SessionEnd::Cancelled);
                        debug!(event = "session_ended", reason = %end, "the old session ended before the new one was up");
                        attempt.await
                    }
                };
                match (next, replace) {
                    (Ok(next), replace) => {
                        if let Replace::Upgrade = replace {
                            info!(
                                event = "transport_upgraded",
                                %server,
                                from = %session.transport,
                                to = %next.session.transport,
                                "moved to {} (the streams open on {} finish there)",
                                next.session.transport,
                                session.transport
                            );
                        }
                        session.replaced.store(true, Ordering::Release);
                        session.cancel.cancel();
                        established = next;
                        break;
                    }
                    (Err(Failure::Stopped), _) => return Err(Failure::Stopped),
                    // Still no better way through: keep this session, try again later.
                    (Err(Failure::Retry(reason)), Replace::Upgrade) if !serving.is_finished() => {
                        debug!(event = "transport_retry_failed", %server, %reason, "staying on {}", session.transport);
                    }
                    // Either way the old session goes (the new config is in force, or it
                    // ended); a new one that could not be had is retried (or given up on)
                    // like any other.
                    (Err(failure), _) => {
                        session.cancel.cancel();
                        // Its task says goodbye and leaves the sessions list.
                        let _ = serving.await;
                        return Err(failure);
                    }
                }
            }
        }
    }
}

/// The transports of `config` listed before `current`: those a session on `current` moves
/// to when one works again (none when `current` is first, or no longer listed).
fn better_transports(config: &ClientConfig, current: TransportEntry) -> Vec<TransportEntry> {
    let list = config.transport_list();
    match list.iter().position(|e| *e == current) {
        Some(at) => list[..at].to_vec(),
        None => Vec::new(),
    }
}

/// Whether the config asks the server to bind ports of its own for this client.
fn declares_ports(config: &ClientConfig) -> bool {
    config
        .services
        .values()
        .any(|service| service.remote_bind.is_some())
}

/// One probe of a service's health check, as the running client would do it (for `warren
/// doctor`).
///
/// # Errors
/// Why the target fails its check.
pub async fn health_check_once(check: &HealthCheck, target: &HostPort) -> Result<(), String> {
    health::check_once(check, target).await
}

/// What a client claims in its hello: every service (reverse or client-declared), then
/// every forward service, each with its token and weight (all ready: the caller sets
/// readiness from the health checks).
pub fn claims_of(config: &ClientConfig) -> Vec<Claim<'_>> {
    let reverse = config.services.values().map(|service| Claim {
        name: &service.name,
        token: &service.token,
        kind: match (service.remote_bind, service.kind, &service.http_claim) {
            // The config refuses `remote_bind` on an http service.
            (Some(remote_bind), ServiceKind::Tcp | ServiceKind::Http, _) => {
                ClaimKind::Declared { remote_bind }
            }
            (Some(remote_bind), ServiceKind::Udp(_), _) => ClaimKind::DeclaredUdp { remote_bind },
            (None, _, Some(claim)) => ClaimKind::DeclaredHttp {
                subdomain: claim.subdomain.clone(),
                hosts: claim.hosts.clone(),
            },
            (None, _, None) => ClaimKind::Reverse,
        },
        weight: service.weight,
        ready: true,
    });
    let forward = config.forwards.values().map(|forward| {
        let target = forward.target.as_ref().map(HostPort::to_string);
        Claim {
            name: &forward.name,
            token: &forward.token,
            kind: match forward.kind {
                ServiceKind::Tcp | ServiceKind::Http => ClaimKind::Forward { target },
                ServiceKind::Udp(_) => ClaimKind::ForwardUdp { target },
            },
            weight: 1,
            ready: true,
        }
    });
    reverse.chain(forward).collect()
}
