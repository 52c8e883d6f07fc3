//! The public side: `warren server`.
//!
//! One listener on the server port takes both control and data channels (told apart by
//! their preamble). Each connection is authenticated in its own task under one deadline
//! ([`ServerConfig::handshake_timeout`]), never in the accept loop, so a silent peer delays
//! nobody. Service ports are bound at start and stay bound: a visitor arriving while no
//! client serves the service is reset at once, and the service works again the moment its
//! client reconnects. UDP services bind one socket each and carry every visitor's datagrams
//! over one datagram channel per session ([`udp`]). With `[server.p2p]`, one more UDP socket
//! serves peer-to-peer transfers: the address reflector and the relay of last resort, in
//! one task ([`crate::p2p::net::relay::serve_udp_with`]); the [`mailbox`] tells clients its
//! port.
//!
//! A running server takes a new config through its [`Reloader`] (`SIGHUP`, a file change or
//! the admin API, see [`crate::reload`]); [`reload`] says what a reload touches.
//!
//! Main types: [`Server`] (validated config, built with [`Server::builder`]),
//! [`BoundServer`] (sockets bound, ready to [`BoundServer::run`]).

mod admin;
mod backend;
mod drain;
mod forward;
mod hello;
mod http;
pub mod mailbox;
pub mod pending;
mod quic;
mod reload;
mod serving;
mod session;
mod udp;
mod web;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rand::RngCore;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};
use warren_proto::balance::Strategy;
use warren_proto::handshake::{self as proto_handshake, DataHello, HandshakeError, SessionId};
use warren_proto::liveness::{Heartbeat, PeerState};
use warren_proto::message::{ControlMessage, HelloClaim, StreamOpen};
use warren_proto::{CipherPolicy, CipherSuite, message};

use crate::Side;
use crate::config::proxy::PortRange;
use crate::config::{
    ConfigErrors, HostPort, ProxyProtocol, ServerConfig, ServerForward, ServerService, ServiceKind,
    Transport, UdpSettings,
};
use crate::crypto::keys::{self, SessionKeys};
use crate::crypto::secret::Secret;
use crate::metrics::{HandshakeFailure, LocalEnd, Telemetry};
use crate::relay;
use crate::relay::limit::{Bandwidth, Limits};
use crate::relay::opening::{Opened, Opening};
use crate::relay::udp::UdpEnd;
use crate::relay::udp::{UdpStats, UdpStatsSnapshot};
use crate::reload::{ConfigSource, Reloader, Requests};
use crate::session::link::{Carrier, OpenError};
use crate::session::stream::Stream;
use crate::session::{self as control, Liveness, SessionEnd, short_id, summarize};
use crate::transport::compress::Codec;
use crate::transport::layers::{Accepted, ServerLayers};
use crate::transport::preamble::{self, Incoming, PreambleError};
use crate::transport::wire::Wire;
use crate::transport::{Channel, tcp};
use pending::{PendingGuard, PendingLimiter};
use serving::ServiceSlot;
use session::ServerSession;

/// Live sessions at once.
const MAX_SESSIONS: usize = 1024;
/// Visitor streams open at once on one service (so per session serving it). Past this, new
/// visitors are reset at once: established streams are never dropped for newcomers.
const MAX_STREAMS_PER_SERVICE: usize = 4096;
/// How long a visitor may wait for a data channel before it is reset.
const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept()` (e.g. EMFILE) before trying again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Server runtime errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A port could not be bound.
    #[error(
        "cannot bind {what} on {addr}: {source}; is another process using it? (choose another port or stop that process)"
    )]
    Bind {
        /// Which listener.
        what: String,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS certificate of `tls` / `wss` could not be loaded or made.
    #[error("cannot set up TLS for the server port: {0}")]
    Certificate(String),
}

/// A validated server, ready to bind.
#[derive(Debug, Clone)]
pub struct Server {
    config: ServerConfig,
}

/// Builds a [`Server`] in code; the CLI uses [`Server::from_config`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let server = warren::Server::builder()
///     .bind("0.0.0.0:7000".parse()?)
///     .psk("a-long-random-pre-shared-key")
///     .default_token("a-long-random-service-token")
///     .tcp_service("web", "0.0.0.0:8080".parse()?)
///     .build()?;
/// let bound = server.bind().await?;
/// bound.run().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    config: ServerConfig,
    services: Vec<(String, ServiceKind, SocketAddr, Option<Secret>)>,
    forwards: Vec<(String, ServiceKind, HostPort)>,
    /// PROXY protocol versions of forward services, by name.
    forward_proxy: HashMap<String, ProxyProtocol>,
    /// Balancing strategies of reverse services, by name.
    load_balance: HashMap<String, Strategy>,
    /// Bandwidth limits (bytes per second each way), by service name.
    bandwidth_limits: HashMap<String, u64>,
    /// How services compress what this side sends, by name.
    compression: HashMap<String, Codec>,
}

impl ServerBuilder {
    crate::builder::common_setters!();

    /// The certificate of `tls` / `wss` (default: self-signed, in the state directory).
    pub fn tls(mut self, tls: crate::config::web::ServerTlsConfig) -> Self {
        self.config.tls = tls;
        self
    }

    /// The server port (control and data channels). Default `0.0.0.0:7000`.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.config.bind = addr;
        self
    }

    /// How often the server pings each client.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// A reverse TCP service using the default token.
    pub fn tcp_service(mut self, name: impl Into<String>, bind: SocketAddr) -> Self {
        self.services
            .push((name.into(), ServiceKind::Tcp, bind, None));
        self
    }

    /// A forward TCP service using the default token: clients bind a port on their side,
    /// the server dials `target` for each connection.
    pub fn forward_service(mut self, name: impl Into<String>, target: HostPort) -> Self {
        self.forwards.push((name.into(), ServiceKind::Tcp, target));
        self
    }

    /// A forward UDP service using the default token: clients bind a UDP port on their
    /// side, the server sends each flow's datagrams to `target`.
    pub fn udp_forward_service(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        settings: UdpSettings,
    ) -> Self {
        self.forwards
            .push((name.into(), ServiceKind::Udp(settings), target));
        self
    }

    /// Writes a PROXY protocol header with the visitor's address to the target of forward
    /// service `name` (added before or after).
    pub fn forward_proxy_protocol(
        mut self,
        name: impl Into<String>,
        version: ProxyProtocol,
    ) -> Self {
        self.forward_proxy.insert(name.into(), version);
        self
    }

    /// How visitors of reverse service `name` are spread over the clients serving it
    /// (default least-connections).
    pub fn load_balance(mut self, name: impl Into<String>, strategy: Strategy) -> Self {
        self.load_balance.insert(name.into(), strategy);
        self
    }

    /// Lets clients declare their own services on ports in `ports` (see
    /// [`ServerConfig::allow_ports`]).
    pub fn allow_ports(mut self, ports: PortRange) -> Self {
        self.config.allow_ports = Some(ports);
        self
    }

    /// IPs declared services may bind on (default: the server's bind IP).
    pub fn allow_bind_addrs(mut self, addrs: Vec<std::net::IpAddr>) -> Self {
        self.config.allow_bind_addrs = addrs;
        self
    }

    /// A reverse UDP service using the default token and default settings.
    pub fn udp_service(self, name: impl Into<String>, bind: SocketAddr) -> Self {
        self.udp_service_with(name, bind, UdpSettings::DEFAULT)
    }

    /// A reverse UDP service with its own idle timeout and session bound.
    pub fn udp_service_with(
        mut self,
        name: impl Into<String>,
        bind: SocketAddr,
        settings: UdpSettings,
    ) -> Self {
        self.services
            .push((name.into(), ServiceKind::Udp(settings), bind, None));
        self
    }

    /// A reverse TCP service with its own token.
    pub fn tcp_service_with_token(
        mut self,
        name: impl Into<String>,
        bind: SocketAddr,
        token: impl Into<String>,
    ) -> Self {
        self.services.push((
            name.into(),
            ServiceKind::Tcp,
            bind,
            Some(Secret::new(token)),
        ));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// Every problem at once, as the config file loader reports them.
    pub fn build(mut self) -> Result<Server, ConfigErrors> {
        for (name, kind, bind, token) in self.services {
            let token = token
                .or_else(|| self.config.default_token.clone())
                .unwrap_or_default();
            self.config.services.insert(
                name.clone(),
                ServerService {
                    http: None,
                    load_balance: self.load_balance.get(&name).copied().unwrap_or_default(),
                    bandwidth_limit: self.bandwidth_limits.get(&name).copied(),
                    compression: self.compression.get(&name).copied(),
                    name,
                    kind,
                    bind,
                    token,
                },
            );
        }
        for (name, kind, target) in self.forwards {
            let token = self.config.default_token.clone().unwrap_or_default();
            self.config.forwards.insert(
                name.clone(),
                ServerForward {
                    proxy_protocol: self.forward_proxy.get(&name).copied(),
                    bandwidth_limit: self.bandwidth_limits.get(&name).copied(),
                    compression: self.compression.get(&name).copied(),
                    name,
                    kind,
                    target,
                    token,
                },
            );
        }
        Server::from_config(self.config)
    }
}

impl Server {
    /// Starts a builder with defaults.
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            config: ServerConfig::new(SocketAddr::from(([0, 0, 0, 0], 7000)), Secret::default()),
            services: Vec::new(),
            forwards: Vec::new(),
            forward_proxy: HashMap::new(),
            load_balance: HashMap::new(),
            bandwidth_limits: HashMap::new(),
            compression: HashMap::new(),
        }
    }

    /// A server from a loaded config.
    ///
    /// # Errors
    /// The config's validation errors.
    pub fn from_config(config: ServerConfig) -> Result<Server, ConfigErrors> {
        config.validate()?;
        Ok(Server { config })
    }

    /// Binds the server port and every service port (TCP listeners, UDP sockets).
    ///
    /// # Errors
    /// [`ServerError::Bind`] naming the port that could not be bound.
    pub async fn bind(self) -> Result<BoundServer, ServerError> {
        // This machine's cipher figures (tens of ms, once), before the port listens: a
        // server that accepts connections has finished starting.
        crate::crypto::speed::prepare(&self.config.ciphers, self.config.cipher_choice).await;
        // The certificate too (made on a first start).
        let layers = web::layers(&self.config)?;
        let listener = Listeners::bind(&self.config).await?;
        let admin_listener = match &self.config.admin {
            Some(admin) => Some(bind_listener("the admin API", admin.bind).await?),
            None => None,
        };
        let http_ports = match &self.config.http {
            Some(listen) => Some(http::HttpPorts::bind(listen).await?),
            None => None,
        };
        // The P2P UDP port (reflector and relay). A reload that adds or removes
        // `[server.p2p]` or moves `udp_bind` does not bind or close it: that waits for a
        // restart (the reload's summary says so); the relay's limits and key do follow.
        let p2p_udp = match &self.config.p2p {
            Some(p2p) => Some(
                crate::relay::udp::bind_service_socket(p2p.udp_bind).map_err(|source| {
                    ServerError::Bind {
                        what: "the P2P UDP port (server.p2p.udp_bind)".to_owned(),
                        addr: p2p.udp_bind,
                        source,
                    }
                })?,
            ),
            None => None,
        };
        let udp_port = p2p_udp
            .as_ref()
            .and_then(|socket| socket.local_addr().ok())
            .map(|addr| addr.port());
        // The reflector's second port on the same address (any free one), for
        // `warren doctor`'s NAT-type probe; without it the probe says less.
        let p2p_alt = match (&self.config.p2p, udp_port) {
            (Some(p2p), Some(_)) => {
                let any_port = SocketAddr::new(p2p.udp_bind.ip(), 0);
                crate::relay::udp::bind_service_socket(any_port)
                    .inspect_err(|error| warn!(event = "p2p_reflector_alt_failed", %error, "cannot bind the reflector's second port; NAT-type probes will not tell filtering"))
                    .ok()
            }
            _ => None,
        };
        let udp_alt_port = p2p_alt
            .as_ref()
            .and_then(|socket| socket.local_addr().ok())
            .map(|addr| addr.port());
        let (p2p_settings, p2p_updates) = match &self.config.p2p {
            Some(p2p) => {
                let (tx, rx) = tokio::sync::watch::channel(relay_settings(p2p, &self.config.psk));
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let (tcp_legs, tcp_leg_inbound) = crate::p2p::net::tcp_leg::TcpLegs::new();
        let telemetry = Telemetry::new(Side::Server);
        let captures = crate::http::capture::Captures::new(Arc::clone(&telemetry));
        let cancel = CancellationToken::new();
        let mut services = HashMap::new();
        for service in self.config.services.values() {
            let socket = ServiceSocket::bind(service).await?;
            let binding = Binding::new(service, socket, &telemetry, &cancel);
            services.insert(service.name.clone(), binding);
        }
        let limits = Limits::new(bandwidth_limits(&self.config));
        let taking_visitors = cancel.child_token();
        let shared = Arc::new(Shared {
            limits,
            layers,
            drain: crate::drain::Drain::new(CancellationToken::new()),
            taking_visitors,
            live: RwLock::new(Arc::new(Live::new(self.config))),
            sessions: Mutex::new(HashMap::new()),
            services: RwLock::new(services),
            pending: PendingLimiter::new(
                pending::MAX_PENDING_HANDSHAKES,
                pending::MAX_PENDING_PER_IP,
            ),
            cancel,
            tasks: TaskTracker::new(),
            telemetry,
            quic: RwLock::new(None),
            http: RwLock::new(Arc::new(http::Front::empty())),
            declared_http: Mutex::new(HashMap::new()),
            captures,
            mailbox: mailbox::Mailbox::new(udp_port, udp_alt_port),
            tcp_legs,
            p2p_settings,
        });
        http::rebuild_front(&shared);
        let (reloader, reloads) = Reloader::new("server");
        Ok(BoundServer {
            shared,
            listener,
            admin_listener,
            http_ports,
            p2p_udp: p2p_udp.map(Arc::new).zip(p2p_updates),
            p2p_alt,
            tcp_leg_inbound,
            reloader,
            reloads,
            source: None,
        })
    }
}

/// The relay's limits and key under `p2p` and `psk`.
fn relay_settings(
    p2p: &crate::config::p2p::P2pConfig,
    psk: &Secret,
) -> crate::p2p::net::relay::RelaySettings {
    crate::p2p::net::relay::RelaySettings {
        config: crate::p2p::net::relay::RelayConfig::from_p2p(p2p),
        auth: crate::p2p::net::relay::RelayAuth::from_psk(psk),
    }
}

async fn bind_listener(what: &str, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            what: what.to_owned(),
            addr,
            source,
        })
}

/// The server's ports: one TCP listener per port its TCP-family transports use (each
/// takes all of them, told apart by the first bytes), and QUIC's UDP endpoint.
struct Listeners {
    /// `bind`'s port first when a TCP-family transport uses it.
    tcp: Vec<TcpListener>,
    quic: Option<Arc<quic::QuicListener>>,
    /// The first transport's address: what [`BoundServer::local_addr`] reports.
    primary: SocketAddr,
}

impl Listeners {
    /// Binds every port `config`'s transports use. With port 0, QUIC on `bind`'s port takes
    /// the UDP side of the port TCP was given, so one number serves both as it would when
    /// configured.
    async fn bind(config: &ServerConfig) -> Result<Listeners, ServerError> {
        let mut tcp = Vec::new();
        for addr in config.tcp_binds() {
            let what = if addr == config.bind {
                "the server port"
            } else {
                "a transport's port (server.transports)"
            };
            let listener = bind_listener(what, addr).await?;
            // Connections accepted from it inherit the choice (`tcp_ca_openreq_child`).
            config
                .tcp_congestion
                .apply(socket2::SockRef::from(&listener));
            tcp.push(listener);
        }
        let tcp_bind_port = tcp
            .first()
            .and_then(|listener| listener.local_addr().ok())
            .filter(|addr| addr.ip() == config.bind.ip())
            .map(|addr| addr.port());
        let quic = match config.quic_bind() {
            Some(mut addr) => {
                if addr == config.bind
                    && addr.port() == 0
                    && let Some(port) = tcp_bind_port
                {
                    addr.set_port(port);
                }
                Some(Arc::new(quic::QuicListener::bind(config, addr)?))
            }
            None => None,
        };
        let primary = match (config.transport, &quic, tcp.first()) {
            (Transport::Quic, Some(quic), _) => quic.local_addr(),
            (_, _, Some(listener)) => listener.local_addr(),
            (_, Some(quic), None) => quic.local_addr(),
            (_, None, None) => Ok(config.bind),
        }
        .unwrap_or(config.bind);
        Ok(Listeners { tcp, quic, primary })
    }

    /// Where `transport` listens, if it is one of the server's.
    fn addr_of(&self, config: &ServerConfig, transport: Transport) -> Option<SocketAddr> {
        let entry = config
            .transport_list()
            .into_iter()
            .find(|e| e.transport == transport)?;
        if transport == Transport::Quic {
            return self.quic.as_ref()?.local_addr().ok();
        }
        let wanted = entry.port_or(config.bind.port());
        let index = config
            .tcp_binds()
            .iter()
            .position(|addr| addr.port() == wanted)?;
        self.tcp.get(index)?.local_addr().ok()
    }
}

/// A server with its sockets bound.
pub struct BoundServer {
    shared: Arc<Shared>,
    listener: Listeners,
    admin_listener: Option<TcpListener>,
    http_ports: Option<http::HttpPorts>,
    /// The P2P UDP port (`[server.p2p]`) and where its relay settings come from.
    p2p_udp: Option<(
        Arc<UdpSocket>,
        tokio::sync::watch::Receiver<crate::p2p::net::relay::RelaySettings>,
    )>,
    /// The reflector's second port (NAT-type probes), with `p2p_udp`.
    p2p_alt: Option<UdpSocket>,
    /// Datagrams of relay legs over TCP sessions, for the P2P UDP port's loop.
    tcp_leg_inbound: tokio::sync::mpsc::Receiver<(SocketAddr, Vec<u8>)>,
    reloader: Reloader<ServerConfig>,
    reloads: Requests<ServerConfig>,
    /// The config file, when the server reloads from one.
    source: Option<ConfigSource<ServerConfig>>,
}

impl BoundServer {
    /// The server port's actual address (useful with port 0): its first transport's.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.primary
    }

    /// Where `transport` listens (useful with port 0), if it is one of the server's.
    pub fn transport_addr(&self, transport: Transport) -> Option<SocketAddr> {
        let live = self.shared.live();
        self.listener.addr_of(&live.config, transport)
    }

    /// A service port's actual address (TCP or UDP); it follows reloads.
    pub fn service_addr(&self, name: &str) -> Option<SocketAddr> {
        self.shared
            .binding(name)
            .and_then(|binding| binding.socket.local_addr().ok())
    }

    /// The HTTP ports' actual addresses (plain, TLS), when `[server.http]` is configured.
    pub fn http_addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        let addr =
            |listener: &Option<TcpListener>| listener.as_ref().and_then(|l| l.local_addr().ok());
        match &self.http_ports {
            Some(ports) => (addr(&ports.plain), addr(&ports.tls)),
            None => (None, None),
        }
    }

    /// The P2P UDP port's actual address (address reflector and relay), when
    /// `[server.p2p]` is configured.
    pub fn p2p_udp_addr(&self) -> Option<SocketAddr> {
        self.p2p_udp
            .as_ref()
            .and_then(|(socket, _)| socket.local_addr().ok())
    }

    /// The admin API's actual address, when `[admin]` is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The server's metrics and live connections.
    pub fn telemetry(&self) -> Arc<Telemetry> {
        Arc::clone(&self.shared.telemetry)
    }

    /// A handle to read a UDP service's counters while the server runs.
    pub fn udp_stats(&self, name: &str) -> Option<UdpStatsHandle> {
        self.shared
            .binding(name)
            .filter(|binding| matches!(binding.socket, ServiceSocket::Udp(_)))
            .map(|_| {
                UdpStatsHandle(
                    self.shared
                        .telemetry
                        .metrics
                        .udp_stats(name, UdpEnd::Visitors),
                )
            })
    }

    /// A token that stops the server when cancelled (graceful: sessions get a goodbye).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// A token that drains the server when cancelled: the service ports close, clients are
    /// told, the streams in flight finish (up to `drain_timeout`), then the server stops as
    /// if [`BoundServer::shutdown_token`] had fired. See `server::drain`.
    pub fn drain_token(&self) -> CancellationToken {
        self.shared.drain.token()
    }

    /// Hands new configs to the running server (see [`reload`] for what a reload touches).
    pub fn reloader(&self) -> Reloader<ServerConfig> {
        self.reloader.clone()
    }

    /// Reloads from `source` on `SIGHUP`, when its file changes (unless the source says not
    /// to watch it) and on the admin API's `POST /api/v1/reload`.
    pub fn reload_from(mut self, source: ConfigSource<ServerConfig>) -> Self {
        self.source = Some(source);
        self
    }

    /// Serves until the shutdown token is cancelled, then closes everything and returns.
    pub async fn run(self) {
        let BoundServer {
            shared,
            listener,
            admin_listener,
            http_ports,
            p2p_udp,
            p2p_alt,
            tcp_leg_inbound,
            reloader,
            reloads,
            source,
        } = self;
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
        let live = shared.live();
        if let Some(admin_listener) = admin_listener {
            let access = live
                .config
                .admin
                .as_ref()
                .map(crate::admin::Access::from)
                .unwrap_or_default();
            let source = Arc::new(admin::ServerAdmin {
                shared: Arc::clone(&shared),
                reloader: reload_source,
            });
            shared.tasks.spawn(crate::admin::serve(
                admin_listener,
                source,
                access,
                shared.cancel.clone(),
            ));
        }
        let bindings: Vec<Binding> = shared
            .services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let tcp_congestion = if listener.tcp.is_empty() {
            "-".to_owned()
        } else {
            live.config.tcp_congestion.announce("server")
        };
        info!(
            event = "server_started",
            bind = %listener.primary,
            transports = %live.config.transport_list().iter().map(|e| e.to_string()).collect::<Vec<_>>().join(","),
            services = bindings.len(),
            tcp_congestion = %tcp_congestion,
            "warren server listening"
        );
        for binding in bindings {
            spawn_service(&shared, binding);
        }
        if let Some((socket, settings)) = p2p_udp {
            info!(
                event = "p2p_udp_listening",
                udp = %socket.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                relay = settings.borrow().config.enabled,
                "P2P address reflector and relay listening"
            );
            if let Some(alt) = p2p_alt {
                let (main, cancel) = (Arc::clone(&socket), shared.cancel.clone());
                shared.tasks.spawn(async move {
                    let config = crate::p2p::net::reflector::ReflectorConfig::default();
                    let _ =
                        crate::p2p::net::reflector::serve_alt(&alt, &main, config, cancel).await;
                });
            }
            let meter = shared.telemetry.metrics.p2p_relay();
            let cancel = shared.cancel.clone();
            let tcp_legs = (Arc::clone(&shared.tcp_legs), tcp_leg_inbound);
            shared.tasks.spawn(async move {
                let served = crate::p2p::net::relay::serve_udp_with(
                    &socket,
                    crate::p2p::net::reflector::ReflectorConfig::default(),
                    settings,
                    meter,
                    tcp_legs,
                    cancel,
                )
                .await;
                if let Err(error) = served {
                    warn!(
                        event = "p2p_udp_failed",
                        error = %error,
                        "the P2P UDP port stopped; peer-to-peer transfers lose address discovery and the relay until a restart"
                    );
                }
            });
        }
        if let Some(ports) = http_ports {
            http::log_ports(&ports);
            shared
                .tasks
                .spawn(http::watch_certificates(Arc::clone(&shared)));
            for (listener, tls) in [(ports.plain, false), (ports.tls, true)] {
                if let Some(listener) = listener {
                    shared
                        .tasks
                        .spawn(http::accept_loop(Arc::clone(&shared), listener, tls));
                }
            }
        }
        let mut accepting = tokio::task::JoinSet::new();
        if let Some(listener) = listener.quic {
            *shared.quic.write().unwrap_or_else(PoisonError::into_inner) =
                Some(Arc::clone(&listener));
            let shared = Arc::clone(&shared);
            accepting.spawn(async move { quic::accept_loop(&shared, listener).await });
        }
        for listener in listener.tcp {
            let shared = Arc::clone(&shared);
            accepting.spawn(async move { accept_loop(&shared, listener).await });
        }
        // Each loop ends when the server stops.
        while accepting.join_next().await.is_some() {}
        shared.tasks.close();
        if tokio::time::timeout(Duration::from_secs(5), shared.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                event = "shutdown_slow",
                "some connections did not close within 5s"
            );
        }
        // QUIC: the sessions' goodbyes are out; close what is left of the connections.
        let quic = shared
            .quic
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(listener) = quic {
            quic::close(&listener).await;
        }
        info!(event = "server_stopped", "warren server stopped");
    }
}

/// Starts serving one service of the config on its socket, until its slot is stopped.
fn spawn_service(shared: &Arc<Shared>, binding: Binding) {
    let Binding {
        slot,
        socket,
        service,
    } = binding;
    match (socket, service.kind) {
        (ServiceSocket::Tcp(listener), _) => {
            shared
                .tasks
                .spawn(serve_visitors(Arc::clone(shared), slot, listener, None));
        }
        // Requests reach it through the HTTP front (rebuilt with the services).
        (ServiceSocket::Http, _) => {}
        // Drained: nothing takes visitors any more.
        (ServiceSocket::Closed, _) => {}
        (ServiceSocket::Udp(socket), kind) => {
            let settings = match kind {
                ServiceKind::Udp(settings) => settings,
                ServiceKind::Tcp | ServiceKind::Http => UdpSettings::DEFAULT,
            };
            let until = slot.stop.clone();
            let stats = shared
                .telemetry
                .metrics
                .udp_stats(&slot.name, UdpEnd::Visitors);
            let service = udp::UdpService {
                slot,
                socket,
                settings,
                stats,
            };
            shared
                .tasks
                .spawn(udp::serve_udp(Arc::clone(shared), service, until));
        }
    }
}

/// Reads the counters of one UDP service (see [`BoundServer::udp_stats`]).
#[derive(Debug, Clone)]
pub struct UdpStatsHandle(Arc<UdpStats>);

impl UdpStatsHandle {
    /// The counters now.
    pub fn snapshot(&self) -> UdpStatsSnapshot {
        self.0.snapshot()
    }
}

/// State every connection task of one server shares.
struct Shared {
    /// The config in force and what is derived from it; a reload swaps it whole.
    live: RwLock<Arc<Live>>,
    sessions: Mutex<HashMap<SessionId, Arc<ServerSession>>>,
    /// The config's services with their sockets, by name; a reload changes them.
    services: RwLock<HashMap<String, Binding>>,
    /// Unauthenticated connections; full means the oldest is dropped (see [`pending`]).
    pending: Arc<PendingLimiter>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// Metrics and live connections (read by the admin API).
    telemetry: Arc<Telemetry>,
    /// The QUIC listener, while the server runs on QUIC (a reload updates its PSK).
    quic: RwLock<Option<Arc<quic::QuicListener>>>,
    /// What routes requests on the HTTP ports; a reload swaps it whole.
    http: RwLock<Arc<http::Front>>,
    /// Client-declared http services, by name.
    declared_http: Mutex<HashMap<String, http::DeclaredHttp>>,
    /// Recent HTTP requests, for the inspector.
    captures: Arc<crate::http::capture::Captures>,
    /// Where the two clients of a peer-to-peer join code meet (`[server.p2p]`).
    mailbox: mailbox::Mailbox,
    /// Sessions that carry a relay leg for a peer whose UDP is blocked.
    tcp_legs: Arc<crate::p2p::net::tcp_leg::TcpLegs>,
    /// The P2P UDP task's relay limits and key, when it runs (a reload sends new ones).
    p2p_settings: Option<tokio::sync::watch::Sender<crate::p2p::net::relay::RelaySettings>>,
    /// Services' bandwidth limits (a reload changes them in place).
    limits: Limits,
    /// TLS and WebSocket on the server port (set at start; a reload does not change them).
    layers: ServerLayers,
    /// The drain (SIGTERM, the admin API, [`BoundServer::drain_token`]).
    drain: crate::drain::Drain,
    /// Cancelled when the service and HTTP ports stop taking visitors: a drain, or the
    /// server's shutdown (it is the shutdown token's child).
    taking_visitors: CancellationToken,
}

/// What a service's relays do to its bytes besides carrying them.
#[derive(Default)]
struct Shaping {
    limit: Option<Arc<Bandwidth>>,
    codec: Option<Codec>,
}

/// Every reverse and forward service of the config with its bandwidth limit, if any.
fn bandwidth_limits(config: &ServerConfig) -> impl Iterator<Item = (&str, Option<u64>)> {
    let services = config
        .services
        .values()
        .map(|s| (&s.name, s.bandwidth_limit));
    let forwards = config
        .forwards
        .values()
        .map(|f| (&f.name, f.bandwidth_limit));
    services
        .chain(forwards)
        .map(|(name, limit)| (name.as_str(), limit))
}

impl Shared {
    fn session(&self, id: &SessionId) -> Option<Arc<ServerSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The live sessions now.
    fn sessions_now(&self) -> Vec<Arc<ServerSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// The config in force (a snapshot: a reload does not change it under the caller).
    fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn binding(&self, name: &str) -> Option<Binding> {
        self.services
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The slot of a service of the config.
    fn slot(&self, name: &str) -> Option<Arc<ServiceSlot>> {
        self.binding(name).map(|binding| binding.slot)
    }
}

/// A server config and what handshakes derive from it.
struct Live {
    config: ServerConfig,
    noise_psk: [u8; 32],
    /// Ciphers this server allows, already adjusted for the transport, with
    /// `cipher_choice` and this machine's figures.
    ciphers: CipherPolicy,
    /// What it allows on `tls`, where TLS encrypts: `none`.
    tls_ciphers: CipherPolicy,
}

impl Live {
    /// Takes the cipher figures from the process's cache: call
    /// [`crate::crypto::speed::prepare`] first, or this measures on the calling thread.
    fn new(config: ServerConfig) -> Live {
        // `tcp` offers only `none`; a server that also takes encrypted transports allows
        // it beside its ciphers (a `noise` client never offers it unless told to).
        let list = config.transport_list();
        let ciphers = if list.iter().all(|e| e.transport == Transport::Tcp) {
            vec![CipherSuite::None]
        } else if list.iter().any(|e| e.transport == Transport::Tcp) {
            let mut ciphers = config.ciphers.clone();
            if !ciphers.contains(&CipherSuite::None) {
                ciphers.push(CipherSuite::None);
            }
            ciphers
        } else {
            config.ciphers.clone()
        };
        Live {
            noise_psk: keys::noise_psk(&config.psk),
            ciphers: crate::crypto::speed::policy(&ciphers, config.cipher_choice),
            tls_ciphers: crate::crypto::speed::policy(&[CipherSuite::None], config.cipher_choice),
            config,
        }
    }
}

/// A service of the config, bound: its settings, its slot and its socket.
#[derive(Clone)]
struct Binding {
    service: ServerService,
    slot: Arc<ServiceSlot>,
    socket: ServiceSocket,
}

impl Binding {
    /// A fresh slot (no session yet) for `service` on `socket`; stopping it never stops
    /// anything beyond it, and the server's shutdown stops it.
    fn new(
        service: &ServerService,
        socket: ServiceSocket,
        telemetry: &Telemetry,
        server_cancel: &CancellationToken,
    ) -> Binding {
        Binding {
            slot: Arc::new(ServiceSlot::new(
                service.name.clone(),
                service.kind,
                service.token.clone(),
                telemetry.metrics.service(&service.name),
                server_cancel.child_token(),
                service.load_balance,
            )),
            service: service.clone(),
            socket,
        }
    }
}

/// A service's bound socket, shared so that a reload can hand it to the service's new slot.
#[derive(Clone)]
enum ServiceSocket {
    Tcp(Arc<TcpListener>),
    Udp(Arc<UdpSocket>),
    /// An http service has no socket of its own: the `[server.http]` ports route to it.
    Http,
    /// A TCP service whose listener a drain closed.
    Closed,
}

impl ServiceSocket {
    /// Binds the socket `service` needs.
    async fn bind(service: &ServerService) -> Result<ServiceSocket, ServerError> {
        let what = format!("service `{}`", service.name);
        match service.kind {
            ServiceKind::Tcp => Ok(ServiceSocket::Tcp(Arc::new(
                bind_listener(&what, service.bind).await?,
            ))),
            ServiceKind::Udp(_) => relay::udp::bind_service_socket(service.bind)
                .map(|socket| ServiceSocket::Udp(Arc::new(socket)))
                .map_err(|source| ServerError::Bind {
                    what: format!("{what} (UDP)"),
                    addr: service.bind,
                    source,
                }),
            ServiceKind::Http => Ok(ServiceSocket::Http),
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            ServiceSocket::Tcp(listener) => listener.local_addr(),
            ServiceSocket::Udp(socket) => socket.local_addr(),
            ServiceSocket::Http => Err(std::io::Error::other(
                "an http service is served on the shared HTTP ports",
            )),
            ServiceSocket::Closed => Err(std::io::Error::other(
                "the server is draining: its service ports are closed",
            )),
        }
    }
}

async fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let (permit, evicted) = shared.pending.admit(peer.ip());
                if evicted > 0 {
                    debug!(event = "pending_full", %peer, "too many unauthenticated connections; closed the oldest");
                }
                tcp::tune(&stream);
                shared
                    .tasks
                    .spawn(handle_connection(Arc::clone(shared), stream, peer, permit));
            }
            Err(error) => {
                // EMFILE and friends: keep the listener, wait for descriptors to free up.
                warn!(event = "accept_failed", %error, "accept failed on the server port; retrying");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// What a connection turned out to be once authenticated.
enum Authenticated {
    Control {
        session: Arc<ServerSession>,
        channel: Box<Stream>,
    },
    Data,
    /// A forward stream: dial the service's target and relay.
    Forward {
        session: Arc<ServerSession>,
        channel: Box<Stream>,
        open: StreamOpen,
        forward: Box<ServerForward>,
    },
}

async fn handle_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    permit: PendingGuard,
) {
    let deadline = shared.live().config.handshake_timeout;
    // The connection moves into the deadline: on expiry it is dropped, i.e. closed.
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(deadline, authenticate(&shared, stream, peer)) => outcome,
        () = shared.cancel.cancelled() => return,
        () = permit.evicted().cancelled() => {
            debug!(event = "pending_evicted", %peer, "closed a pending connection to make room for a newer one");
            return;
        }
    };
    drop(permit);
    let authenticated = match outcome {
        Err(_) => {
            shared
                .telemetry
                .metrics
                .handshake_failed(HandshakeFailure::Timeout);
            debug!(event = "handshake_timeout", %peer, "no complete handshake within {deadline:?}; closing");
            return;
        }
        Ok(Err(reason)) => {
            if let Some(failure) = reason.failure() {
                shared.telemetry.metrics.handshake_failed(failure);
            }
            reason.log(peer);
            return;
        }
        Ok(Ok(authenticated)) => authenticated,
    };
    match authenticated {
        Authenticated::Data => {}
        Authenticated::Control { session, channel } => {
            run_session(&shared, session, *channel).await
        }
        Authenticated::Forward {
            session,
            channel,
            open,
            forward: config,
        } => forward::serve_forward(&shared, session, *channel, open, *config).await,
    }
}

/// Why a connection was dropped before authentication completed.
enum Rejected {
    /// Wrong PSK or garbage: closed in silence.
    Silent(&'static str),
    Io(PreambleError),
    Refused(warren_proto::handshake::Refusal),
    Tokens(Vec<String>),
    TooManySessions,
    /// The server drains: it takes no new session.
    Draining,
    Protocol(String),
    /// A v1 client's hello over v1's one-message caps (the client must upgrade).
    HelloTooLarge(String),
}

impl Rejected {
    /// What an authenticated peer is told before the connection closes, and whether
    /// retrying may help; `None` where the verdicts already said it (or nothing is owed).
    fn tell(&self) -> Option<(String, bool)> {
        match self {
            Rejected::HelloTooLarge(what) => Some((
                format!(
                    "the server refused the hello: {what}; a client of Warren protocol v1 sends every claim in one message of at most {} bytes and {} services: upgrade the client (protocol v2 sends its hello in parts, with no practical limit)",
                    message::MAX_CONTROL_LEN,
                    message::MAX_SERVICES_PER_SESSION,
                ),
                false,
            )),
            Rejected::Protocol(what) => Some((
                format!(
                    "the server refused the hello: protocol violation: {what}; are both sides the same Warren version?"
                ),
                false,
            )),
            Rejected::TooManySessions => Some((
                format!(
                    "the server already holds its maximum of {MAX_SESSIONS} sessions; retrying later"
                ),
                true,
            )),
            Rejected::Draining => Some((
                "the server is draining for a restart (SIGTERM or POST /api/v1/drain) and takes no new sessions; retrying until it, or its successor, is back".to_owned(),
                true,
            )),
            _ => None,
        }
    }

    /// The metrics label; `None` for what is not a failure (a probe session).
    fn failure(&self) -> Option<HandshakeFailure> {
        Some(match self {
            Rejected::Silent(why) if why.contains("PSK") => HandshakeFailure::BadPsk,
            Rejected::Silent(_) => HandshakeFailure::Malformed,
            Rejected::Io(_) => HandshakeFailure::Io,
            Rejected::Refused(_) => HandshakeFailure::Refused,
            Rejected::Tokens(_) => HandshakeFailure::BadToken,
            Rejected::TooManySessions => HandshakeFailure::TooManySessions,
            Rejected::Draining => HandshakeFailure::Refused,
            Rejected::Protocol(_) | Rejected::HelloTooLarge(_) => HandshakeFailure::Protocol,
        })
    }

    fn log(&self, peer: SocketAddr) {
        match self {
            Rejected::Silent(why) => {
                debug!(event = "handshake_rejected", %peer, reason = why, "closed in silence")
            }
            Rejected::Io(error) => {
                debug!(event = "handshake_failed", %peer, %error, "handshake did not complete")
            }
            Rejected::Refused(refusal) => {
                warn!(event = "session_refused", %peer, reason = %refusal, "refused a client")
            }
            Rejected::Tokens(services) => warn!(
                event = "auth_failed",
                %peer,
                services = %services.join(","),
                "refused a client: wrong token or unknown service"
            ),
            Rejected::TooManySessions => {
                warn!(event = "session_refused", %peer, "too many sessions; refused a client")
            }
            Rejected::Draining => {
                info!(event = "session_refused", %peer, "draining; refused a new session")
            }
            Rejected::Protocol(what) => {
                warn!(event = "protocol_error", %peer, what = %what, "protocol violation during hello")
            }
            Rejected::HelloTooLarge(what) => {
                warn!(event = "protocol_error", %peer, what = %what, "a protocol v1 client's hello is over v1's limits; told it to upgrade")
            }
        }
    }
}

impl From<PreambleError> for Rejected {
    fn from(error: PreambleError) -> Self {
        match error {
            PreambleError::Handshake(HandshakeError::Unauthenticated) => {
                Rejected::Silent("authentication failed (wrong PSK?)")
            }
            PreambleError::Handshake(HandshakeError::Malformed) => {
                Rejected::Silent("malformed preamble")
            }
            other => Rejected::Io(other),
        }
    }
}

async fn authenticate(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Result<Authenticated, Rejected> {
    let connected = match shared.layers.accept(stream, peer).await {
        Ok(Accepted::Warren(connected)) => connected,
        // Ordinary HTTP, answered: nothing more to do, as for a pooled data channel.
        Ok(Accepted::Answered) => return Ok(Authenticated::Data),
        Err(error) => return Err(Rejected::Io(PreambleError::Io(error))),
    };
    let binding = connected.binding;
    let congestion = connected.congestion;
    let mut stream = connected.wire;
    match preamble::server_read_preamble(&mut stream).await? {
        Incoming::Data(hello) => accept_data_channel(shared, stream, &hello, binding).await,
        Incoming::DataOpen(hello) => {
            forward::accept_open_channel(shared, stream, &hello, binding).await
        }
        Incoming::Control(message1) => {
            let carrier = Carrier::Tcp { congestion };
            accept_control_channel(shared, stream, (peer, carrier), &message1, binding).await
        }
    }
}

async fn accept_data_channel(
    shared: &Arc<Shared>,
    stream: Wire,
    hello: &DataHello,
    binding: Option<[u8; 32]>,
) -> Result<Authenticated, Rejected> {
    let (session, channel) = accept_channel_of_session(shared, stream, hello, binding).await?;
    if let Some(pool) = session.link.tcp_pool() {
        pool.add_idle(channel);
    }
    Ok(Authenticated::Data)
}

/// Checks a data channel's hello against the session it names — known, on a TCP transport
/// (only those have data channels), on this connection's own TLS if the session is bound
/// to its TLS, the MAC right — and answers it. Both kinds of data channel come through here.
async fn accept_channel_of_session(
    shared: &Arc<Shared>,
    stream: Wire,
    hello: &DataHello,
    binding: Option<[u8; 32]>,
) -> Result<(Arc<ServerSession>, Channel), Rejected> {
    let Some(session) = shared.session(&hello.session_id) else {
        return Err(Rejected::Silent("data channel for an unknown session"));
    };
    if session.link.tcp_pool().is_none() {
        return Err(Rejected::Silent(
            "data channel for a session on another transport",
        ));
    }
    let Some(keys) = session.keys.bound_to(binding.as_ref()) else {
        return Err(Rejected::Silent(
            "data channel without TLS for a TLS session",
        ));
    };
    if !keys.verify_data_hello(&hello.client_nonce, &hello.mac) {
        return Err(Rejected::Silent("data channel MAC did not verify"));
    }
    let channel = preamble::server_accept_data_channel(stream, &keys, hello).await?;
    Ok((session, channel))
}

async fn accept_control_channel(
    shared: &Arc<Shared>,
    mut stream: Wire,
    (peer, carrier): (SocketAddr, Carrier),
    message1: &[u8],
    binding: Option<[u8; 32]>,
) -> Result<Authenticated, Rejected> {
    let mut session_id = [0u8; proto_handshake::SESSION_ID_LEN];
    rand::rng().fill_bytes(&mut session_id);
    let live = shared.live();
    // On `tls` the handshake is bound to the TLS session, which already encrypts: the
    // records inside need no cipher of their own. On `wss` the client proves its side of
    // the TLS session; if it matches ours, nothing ended the TLS in between and the same
    // holds (see `warren_proto::speed_ext`).
    let websocket = stream.websocket();
    let tls = binding.filter(|_| websocket.is_none());
    let psk = keys::bound_noise_psk(&live.noise_psk, tls.as_ref());
    let ciphers = match tls {
        Some(_) => &live.tls_ciphers,
        None => &live.ciphers,
    };
    let proof_matches =
        |proof: &[u8; 32]| binding.is_some_and(|b| keys::verify_tls_proof(&psk, &b, proof));
    let outcome =
        proto_handshake::server_handshake_bound(&psk, message1, ciphers, session_id, proof_matches)
            .map_err(|e| Rejected::from(PreambleError::Handshake(e)))?;
    use tokio::io::AsyncWriteExt;
    async {
        stream.write_all(&outcome.reply).await?;
        stream.flush().await
    }
    .await
    .map_err(|e| Rejected::Io(e.into()))?;
    let established = outcome.result.map_err(Rejected::Refused)?;
    let version = established.version;
    let keys = SessionKeys::new(&established)
        .on_tls(tls.is_some())
        .on_websocket(websocket);
    let (sealer, opener) = keys.control_channel(Side::Server);
    let mut channel = Stream::tcp(Channel::new(stream, sealer, opener));
    // From here on the peer has proven the PSK: a refusal says why before it closes.
    match serve_hello(shared, &live, &mut channel, (keys, carrier), peer, version).await {
        Ok(session) => Ok(Authenticated::Control {
            session,
            channel: Box::new(channel),
        }),
        Err(rejected) => {
            if let Some((reason, retry)) = rejected.tell() {
                hello::refuse(&mut channel, version, &reason, retry).await;
            }
            Err(rejected)
        }
    }
}

/// Receives a hello, judges its claims and, unless it only probes, registers the session
/// for what it was granted; answers with the verdicts.
async fn serve_hello(
    shared: &Arc<Shared>,
    live: &Live,
    channel: &mut Stream,
    (keys, carrier): (SessionKeys, Carrier),
    peer: SocketAddr,
    version: u16,
) -> Result<Arc<ServerSession>, Rejected> {
    let hello = hello::receive(channel, version).await?;
    if shared.drain.is_draining() {
        return Err(Rejected::Draining);
    }
    let judgement = forward::judge(shared, &keys, &hello.claims, peer, hello.probe()).await;
    if !judgement.refused.is_empty() {
        Rejected::Tokens(judgement.refused.clone()).log(peer);
    }
    // A hello with no claims, or one that only probes, is a probe session (`warren ping`,
    // `warren doctor`): it serves nothing and takes nothing over, but answers pings. Claims
    // that were all refused end the session.
    if judgement.accepted().is_empty() && !hello.claims.is_empty() && !hello.probe() {
        let _ = hello::reply(channel, version, judgement.verdicts).await;
        return Err(Rejected::Tokens(Vec::new()));
    }
    let mut session = ServerSession::new(
        keys,
        peer,
        shared.cancel.child_token(),
        carrier,
        shared.tasks.clone(),
    );
    session.version = version;
    session.probe = hello.probe();
    if !hello.probe() {
        // Reverse and declared services: what visitors of a bound port reach. Forward
        // services are kept apart, so a client's forward name never takes over a reverse
        // service's slot.
        session.services = judgement.reverse.clone();
        session
            .services
            .extend(judgement.declared.iter().map(|(name, _)| name.clone()));
        session
            .services
            .extend(judgement.declared_http.iter().map(|(name, _)| name.clone()));
        session.forwards = judgement.forwards.clone();
        let accepted: HashSet<String> = judgement.accepted().into_iter().collect();
        session.unserved = hello
            .claims
            .iter()
            .map(|claim| claim.claim.name.clone())
            .filter(|name| !accepted.contains(name))
            .collect();
    }
    let session = Arc::new(session);
    // Serve the services before saying so: a visitor arriving the moment the client hears
    // "accepted" must find the session, not a closed door.
    register(shared, &session, &hello.claims)?;
    // A reload that changed the handshake while this one ran closed the sessions it found;
    // this one was not among them yet.
    if reload::handshake_changed(&live.config, &shared.live().config) {
        session.close(reload::RECONNECT_REASON);
    }
    forward::serve_declared(shared, &session, judgement.declared);
    http::serve_declared(shared, &session, judgement.declared_http);
    if let Err(e) = hello::reply(channel, version, judgement.verdicts).await {
        unregister(shared, &session);
        return Err(Rejected::Protocol(e.to_string()));
    }
    Ok(session)
}

/// Makes `session` findable by its data channels, and joins it to the sets serving the
/// services it was granted, with the weight and readiness its claims asked for.
fn register(
    shared: &Arc<Shared>,
    session: &Arc<ServerSession>,
    claims: &[HelloClaim],
) -> Result<(), Rejected> {
    {
        let mut sessions = shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sessions.len() >= MAX_SESSIONS {
            return Err(Rejected::TooManySessions);
        }
        sessions.insert(session.id(), Arc::clone(session));
    }
    if session.services.is_empty() {
        return Ok(());
    }
    let offers: HashMap<&str, &HelloClaim> = claims
        .iter()
        .map(|claim| (claim.claim.name.as_str(), claim))
        .collect();
    for name in &session.services {
        let (weight, ready) = offers
            .get(name.as_str())
            .map_or((1, true), |claim| (u32::from(claim.weight), claim.ready));
        if let Some(slot) = shared.slot(name) {
            slot.join(session, weight, ready);
        }
    }
    Ok(())
}

/// Undoes [`register`]: the session leaves every set it joined, at once.
fn unregister(shared: &Arc<Shared>, session: &Arc<ServerSession>) {
    session.cancel.cancel();
    session.link.close();
    shared.mailbox.session_ended(&session.id());
    shared.tcp_legs.session_ended(&session.id());
    shared
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&session.id());
    for name in &session.services {
        if let Some(slot) = shared.slot(name) {
            slot.leave(&session.id());
        }
    }
}

/// A client's health report: its sessions' membership of these services turns ready or
/// withdrawn.
fn apply_health(shared: &Shared, session: &ServerSession, services: &[String], ready: bool) {
    // `set_ready` changes nothing for a slot the session is not a member of, so a name the
    // session was not granted needs no search of its (possibly 10,000) services.
    for name in services {
        if let Some(slot) = shared.slot(name)
            && slot.set_ready(&session.id(), ready)
        {
            let session_id = short_id(&session.id());
            if ready {
                info!(event = "service_offered", service = %name, session = %session_id, peer = %session.peer, "the client reports this service's target healthy again");
            } else {
                info!(event = "service_withdrawn", service = %name, session = %session_id, peer = %session.peer, "the client reports this service's target unhealthy; not picking it");
            }
        }
    }
}

async fn run_session(shared: &Arc<Shared>, session: Arc<ServerSession>, channel: Stream) {
    shared.telemetry.metrics.session_started();
    if session.probe {
        debug!(event = "probe_started", session = %short_id(&session.id()), peer = %session.peer, "a diagnostic session (doctor or ping) connected; it serves nothing");
    } else {
        info!(
            event = "session_started",
            session = %short_id(&session.id()),
            peer = %session.peer,
            version = session.version,
            cipher = %session.keys.cipher_label(),
            cipher_choice = %session.keys.describe_choice(),
            services = %summarize(&session.services),
            "client connected"
        );
    }
    let interval = shared.live().config.heartbeat_interval;
    let liveness = Liveness {
        idle_interval: interval,
        timeout: interval.saturating_mul(3),
    };
    let outgoing = session.take_control_receiver();
    let control_queue = session.control_sender();
    // Streams the client opens (forward services), where the transport carries them here.
    session.link.serve(&Arc::new(forward::ForwardStreams {
        shared: Arc::clone(shared),
        session: Arc::clone(&session),
    }));
    let end = control::run_control(
        channel,
        liveness,
        &session.vitals,
        outgoing,
        session.cancel.clone(),
        || session.goodbye_reason(),
        |state, heartbeat| on_peer_state(shared, &session, state, heartbeat),
        |message| match message {
            ControlMessage::Health { services, ready } => {
                apply_health(shared, &session, &services, ready)
            }
            ControlMessage::Mailbox { op } => shared.mailbox.handle(
                shared.live().config.p2p.as_ref(),
                &mailbox::Caller {
                    session: session.id(),
                    ip: session.peer.ip(),
                    to: &control_queue,
                    handshake_hash: session.keys.handshake_hash(),
                },
                op,
            ),
            // Only a probe session of a server with [server.p2p] can be a relay leg.
            ControlMessage::P2pDatagram { bytes }
                if session.probe && shared.live().config.p2p.is_some() =>
            {
                shared
                    .tcp_legs
                    .from_session(session.id(), &control_queue, bytes)
            }
            message => debug!(
                event = "control_ignored",
                ?message,
                "ignoring unexpected control message from client"
            ),
        },
    )
    .await;
    unregister(shared, &session);
    shared.telemetry.metrics.session_ended();
    match end {
        SessionEnd::Cancelled => {
            debug!(event = "session_ended", session = %short_id(&session.id()), "session closed for shutdown")
        }
        other => {
            info!(event = "session_ended", session = %short_id(&session.id()), peer = %session.peer, reason = %other, "client disconnected")
        }
    }
}

/// Logs and counts a change in what the heartbeat believes of a session's client.
fn on_peer_state(
    shared: &Shared,
    session: &ServerSession,
    state: PeerState,
    heartbeat: &Heartbeat,
) {
    let id = short_id(&session.id());
    let open = session.vitals.open_streams();
    let rtt_ms = heartbeat.srtt().map(|rtt| rtt.as_secs_f64() * 1e3);
    match state {
        PeerState::Suspect => {
            shared.telemetry.metrics.session_suspect();
            warn!(event = "session_suspect", session = %id, peer = %session.peer, open_streams = open, ?rtt_ms, waited_ms = heartbeat.suspect_after().as_millis() as u64, "the client left a heartbeat unanswered; giving it no new visitors, and moving those still waiting for their first answer to other sessions");
        }
        PeerState::Dead => {
            shared.telemetry.metrics.session_dead();
            warn!(event = "session_dead", session = %id, peer = %session.peer, moved = session.vitals.moved_streams(), cut = open, ?rtt_ms, waited_ms = heartbeat.dead_after().as_millis() as u64, "the client stopped answering; ending its session and resetting its visitors");
        }
        PeerState::Alive => {
            info!(event = "session_recovered", session = %id, peer = %session.peer, ?rtt_ms, "the client answers again; giving it visitors again");
        }
    }
}

/// Accepts visitors of one service until its slot stops (or `until`, for a declared
/// service: its session's token).
async fn serve_visitors(
    shared: Arc<Shared>,
    slot: Arc<ServiceSlot>,
    listener: Arc<TcpListener>,
    until: Option<CancellationToken>,
) {
    let until = until.unwrap_or_else(|| slot.stop.clone());
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS_PER_SERVICE));
    loop {
        let accepted = tokio::select! {
            () = until.cancelled() => return,
            // A drain: visitors the kernel already took are served, then the listener
            // closes with this loop (the drain dropped the binding's handle on it first).
            () = shared.taking_visitors.cancelled() => {
                while let Some(visitor) = queued_visitor(&listener) {
                    take_visitor(&shared, &slot, &streams, visitor);
                }
                return;
            }
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(visitor) => take_visitor(&shared, &slot, &streams, visitor),
            Err(error) => {
                warn!(event = "accept_failed", service = %slot.name, %error, "accept failed on a service port; retrying");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// A connection the kernel completed and queued on `listener`, taken without waiting
/// (`accept` on the non-blocking socket itself: tokio's own would wait for the reactor to
/// report what the kernel already holds).
fn queued_visitor(listener: &TcpListener) -> Option<(TcpStream, SocketAddr)> {
    let (socket, peer) = socket2::SockRef::from(listener).accept().ok()?;
    let peer = peer.as_socket()?;
    socket.set_nonblocking(true).ok()?;
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket)).ok()?;
    Some((stream, peer))
}

/// Serves one accepted visitor of `slot` in a task of its own, or resets it when the
/// service has `streams` open already.
fn take_visitor(
    shared: &Arc<Shared>,
    slot: &Arc<ServiceSlot>,
    streams: &Arc<tokio::sync::Semaphore>,
    (visitor, peer): (TcpStream, SocketAddr),
) {
    let Ok(permit) = Arc::clone(streams).try_acquire_owned() else {
        debug!(event = "visitor_rejected", service = %slot.name, %peer, "too many streams on this service; resetting the visitor");
        tcp::reset(visitor);
        return;
    };
    tcp::tune_peer(&visitor, peer);
    let slot = Arc::clone(slot);
    let cancel = slot.stop.clone();
    let telemetry = Arc::clone(&shared.telemetry);
    let shaping = Shaping {
        limit: shared.limits.get(&slot.name),
        codec: (shared.live().config.services.get(&slot.name))
            .and_then(|service| service.compression),
    };
    shared.tasks.spawn(async move {
        serve_visitor(slot, (visitor, peer), cancel, telemetry, shaping).await;
        drop(permit);
    });
}

async fn serve_visitor(
    slot: Arc<ServiceSlot>,
    (mut visitor, peer): (TcpStream, SocketAddr),
    cancel: CancellationToken,
    telemetry: Arc<Telemetry>,
    shaping: Shaping,
) {
    let started = tokio::time::Instant::now();
    let local = visitor.local_addr().ok();
    // Retry before reset: a session that fails the visitor before any byte went back hands
    // it on to the next one, replaying what the visitor sent.
    // The opening phase runs boxed: its state (select!, replay copy) is needed only until
    // the first answer, and must not size the future every visitor task holds for the
    // whole connection.
    let mut opening = Opening::default();
    let opened = Box::pin(open_for_visitor(
        &slot,
        &mut visitor,
        &mut opening,
        (peer, local),
        &cancel,
        &telemetry,
    ))
    .await;
    let (lease, mut channel, start) = match opened {
        Ok(opened) => opened,
        Err(reset) => {
            if reset {
                tcp::reset(visitor);
            }
            return;
        }
    };
    // What a replay would have needed is not needed any more.
    drop(opening);
    slot.meter.connected_in(started.elapsed());
    debug!(event = "stream_opened", service = %slot.name, %peer, session = %short_id(&lease.session.id()), "visitor connected");
    let (meter, _listed) = telemetry.open(&slot.meter, &slot.name, peer, LocalEnd::Visitor);
    let meter = meter.paced(shaping.limit).compressing(shaping.codec);
    meter.to_tunnel(start.moved.to_tunnel);
    meter.to_local(start.moved.to_local);
    // A session that stopped answering for good cuts its streams: the pump is dropped, and
    // a visitor it holds is reset (its linger is zero until the stream ends cleanly).
    let pumped = tokio::select! {
        pumped = relay::pump_from(visitor, &mut channel, &cancel, Some(&meter), start) => pumped,
        () = lease.session.vitals.died() => {
            slot.meter.error();
            debug!(event = "stream_cut", service = %slot.name, %peer, session = %short_id(&lease.session.id()), "the session stopped answering; visitor reset");
            return;
        }
    };
    match pumped {
        Ok(moved) => {
            debug!(event = "stream_closed", service = %slot.name, %peer, up = moved.to_tunnel, down = moved.to_local, "visitor done");
            // The transport may carry another stream on it. Boxed: this step's state is
            // needed only now, and must not size the future every visitor holds for the
            // whole connection.
            Box::pin(lease.session.link.recycle(channel)).await;
        }
        Err(error) => {
            if !matches!(error, relay::RelayError::Cancelled) {
                slot.meter.error();
            }
            debug!(event = "stream_aborted", service = %slot.name, %peer, %error, "visitor connection aborted")
        }
    }
}

/// Picks a session for a visitor and opens its stream there, handing the visitor on to the
/// next session while one fails it before any byte went back (retry before reset). `Err`
/// says whether the visitor must be reset (`false`: we are shutting down).
async fn open_for_visitor(
    slot: &Arc<ServiceSlot>,
    visitor: &mut TcpStream,
    opening: &mut Opening,
    (peer, local): (SocketAddr, Option<SocketAddr>),
    cancel: &CancellationToken,
    telemetry: &Telemetry,
) -> Result<(serving::Lease, Stream, relay::StreamStart), bool> {
    let mut tried: Vec<SessionId> = Vec::new();
    loop {
        let Some(lease) = slot.pick(&tried) else {
            slot.meter.error();
            if tried.is_empty() {
                debug!(event = "visitor_rejected", service = %slot.name, %peer, "no client serves this service; closing visitor");
            } else {
                warn!(event = "visitor_rejected", service = %slot.name, %peer, sessions = tried.len(), "every session serving this service failed the visitor; resetting it");
            }
            return Err(true);
        };
        if !tried.is_empty() {
            slot.retried();
        }
        tried.push(lease.session.id());
        // A session that was answering when picked and stops before the first answer hands
        // the visitor on; one picked while already suspect (no other was left) is given
        // until it is declared dead.
        let vitals = &lease.session.vitals;
        let picked_suspect = vitals.is_suspect();
        let abandon = || async move {
            if picked_suspect {
                vitals.died().await;
            } else {
                vitals.stopped_answering().await;
            }
        };
        let moved = || {
            telemetry.metrics.stream_moved();
            vitals.stream_moved();
            debug!(event = "stream_moved", service = %slot.name, %peer, session = %short_id(&lease.session.id()), "the session stopped answering before the first answer; moving the visitor to another session");
        };
        let opened = tokio::select! {
            () = cancel.cancelled() => return Err(false),
            () = abandon() => {
                moved();
                continue;
            }
            opened = tokio::time::timeout(
                STREAM_OPEN_TIMEOUT,
                open_stream(&lease.session, &slot.name, Some(peer), local),
            ) => opened,
        };
        let mut channel = match opened {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => {
                debug!(event = "stream_open_failed", service = %slot.name, %peer, session = %short_id(&lease.session.id()), %error, "could not open a stream to the client; trying another session");
                continue;
            }
            Err(_) => {
                warn!(event = "stream_open_failed", service = %slot.name, %peer, session = %short_id(&lease.session.id()), "no data channel from the client within {STREAM_OPEN_TIMEOUT:?}; trying another session");
                continue;
            }
        };
        match opening.open(visitor, &mut channel, cancel, abandon()).await {
            Opened::Answered(start) => return Ok((lease, channel, start)),
            Opened::Refused(_) if opening.replayable() && vitals.is_suspect() => moved(),
            Opened::Refused(reason) if opening.replayable() => {
                debug!(event = "stream_refused", service = %slot.name, %peer, session = %short_id(&lease.session.id()), %reason, "the client could not serve the stream; trying another session");
            }
            Opened::Refused(reason) => {
                slot.meter.error();
                debug!(event = "stream_aborted", service = %slot.name, %peer, %reason, "stream refused after more than a replay keeps; resetting the visitor");
                return Err(true);
            }
            Opened::Aborted(error) => {
                if !matches!(error, relay::RelayError::Cancelled) {
                    slot.meter.error();
                }
                debug!(event = "stream_aborted", service = %slot.name, %peer, %error, "visitor connection aborted");
                return Err(true);
            }
        }
    }
}

/// Opens a stream for a visitor of `service` on `session`.
async fn open_stream(
    session: &ServerSession,
    service: &str,
    visitor: Option<SocketAddr>,
    local: Option<SocketAddr>,
) -> Result<Stream, OpenError> {
    let open = StreamOpen {
        service: service.to_owned(),
        visitor,
        local,
    };
    session.link.open_stream(&open).await
}
