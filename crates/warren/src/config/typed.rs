//! The typed config: what the server and client run with.
//!
//! This is the second config layer. Values have their real types (`SocketAddr`,
//! `Duration`, [`CipherSuite`], [`Secret`]) and defaults are filled in, so nothing is
//! `Option` that must be `Some` at runtime. The structs are built either from a file (see
//! [`super::load`]) or in code by builders, starting from [`ServerConfig::new`] /
//! [`ClientConfig::new`]. Both paths run the same semantic rules through `validate()`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use warren_proto::{CipherChoice, CipherSuite};

use super::duration::format_duration;
use super::error::{ConfigError, ConfigErrors, Report, join_index, join_key};
use super::proxy::{PortRange, ProxySetting};
use crate::crypto::secret::Secret;
use crate::transport::congestion::TcpCongestion;
pub use warren_proto::proxy_header::Version as ProxyProtocol;

/// Shortest PSK or token accepted without `insecure = true`.
pub const MIN_SECRET_LEN: usize = 16;
/// Prefix of the placeholder secrets in the example configs; refused without `insecure`.
pub const PLACEHOLDER_PREFIX: &str = "CHANGE-ME";
/// Longest service name.
pub const MAX_SERVICE_NAME_LEN: usize = 64;
/// Default `[server] heartbeat_interval`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Default `[client] heartbeat_timeout`.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a draining client or server gives its streams in flight.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `handshake_timeout` on both sides.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `[client] reconnect_initial_delay`.
pub const DEFAULT_RECONNECT_INITIAL_DELAY: Duration = Duration::from_secs(1);
/// Default `[client] transport_retry`.
pub const DEFAULT_TRANSPORT_RETRY: Duration = Duration::from_secs(30);
/// Default `[client] reconnect_max_delay`.
pub const DEFAULT_RECONNECT_MAX_DELAY: Duration = Duration::from_secs(30);

/// How a client and server talk on the control port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    /// TCP with a Noise handshake and the AEAD record layer (the default).
    #[default]
    Noise,
    /// Plain TCP, no encryption: only with `insecure = true`.
    Tcp,
    /// QUIC over UDP (TLS 1.3): `[server.quic]` / `[client.quic]` say how it authenticates.
    Quic,
    /// TLS 1.3 on TCP, looking like HTTPS; the PSK is proven inside, bound to the TLS
    /// session, and the records inside are not encrypted twice.
    Tls,
    /// WebSocket binary frames on TCP, with Noise records inside.
    Ws,
    /// WebSocket on TLS (through CDNs and reverse proxies), with Noise records inside.
    Wss,
}

impl Transport {
    /// Every transport, in the order the docs list them.
    pub const ALL: [Transport; 6] = [
        Transport::Noise,
        Transport::Quic,
        Transport::Tls,
        Transport::Wss,
        Transport::Ws,
        Transport::Tcp,
    ];

    /// The name used in config files (`"noise"`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Noise => "noise",
            Transport::Tcp => "tcp",
            Transport::Quic => "quic",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
        }
    }

    /// Whether its connections run in TLS on TCP (`tls`, `wss`).
    pub fn uses_tls(self) -> bool {
        matches!(self, Transport::Tls | Transport::Wss)
    }

    /// Whether its connections run in WebSocket frames (`ws`, `wss`).
    pub fn uses_websocket(self) -> bool {
        matches!(self, Transport::Ws | Transport::Wss)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of the values a setting accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`; expected one of: {}", expected.join(", "))]
pub struct UnknownName {
    /// What kind of name it was (`"transport"`).
    pub what: &'static str,
    /// What was written.
    pub name: String,
    /// The accepted names.
    pub expected: Vec<&'static str>,
}

impl FromStr for Transport {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownName {
                what: "transport",
                name: s.to_owned(),
                expected: Transport::ALL.iter().map(|t| t.name()).collect(),
            })
    }
}

/// One transport of a `transports` list: `"wss"` (on the server's port) or `"wss:443"`
/// (on a port of its own, e.g. where a firewall lets only 443 through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportEntry {
    /// The transport.
    pub transport: Transport,
    /// Its port; `None`: the server address's (client) or `bind`'s (server).
    pub port: Option<u16>,
}

/// The most transports one list may name: one of each.
pub const MAX_TRANSPORTS: usize = Transport::ALL.len();

impl TransportEntry {
    /// `transport` on the configured port.
    pub fn new(transport: Transport) -> TransportEntry {
        TransportEntry {
            transport,
            port: None,
        }
    }

    /// Its port, or `default`'s.
    pub fn port_or(&self, default: u16) -> u16 {
        self.port.unwrap_or(default)
    }
}

impl fmt::Display for TransportEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.transport),
            None => write!(f, "{}", self.transport),
        }
    }
}

/// Why a `transports` entry does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportEntryError {
    /// The name is not a transport.
    #[error(transparent)]
    Name(#[from] UnknownName),
    /// What follows the colon is not a port number.
    #[error("`{0}` is not a port number (1-65535)")]
    Port(String),
}

impl FromStr for TransportEntry {
    type Err = TransportEntryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, port) = match s.trim().split_once(':') {
            Some((name, port)) => {
                let port = port
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| TransportEntryError::Port(port.to_owned()))?;
                (name, Some(port))
            }
            None => (s.trim(), None),
        };
        Ok(TransportEntry {
            transport: name.parse()?,
            port,
        })
    }
}

/// Default `udp_idle_timeout` of a UDP service.
pub const DEFAULT_UDP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `udp_max_sessions` of a UDP service.
pub const DEFAULT_UDP_MAX_SESSIONS: usize = 4096;
/// Largest `udp_max_sessions` accepted: keeps a service's memory bounded even when a
/// config asks for "unlimited".
pub const MAX_UDP_MAX_SESSIONS: usize = 1 << 20;

/// Settings of a UDP service: how its per-visitor sessions (flows) are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpSettings {
    /// A flow with no datagram in either direction for this long is dropped.
    pub idle_timeout: Duration,
    /// Most flows at once; when full, the least recently active flow is evicted.
    pub max_sessions: usize,
}

impl UdpSettings {
    /// The defaults: 60 s idle timeout, 4096 sessions.
    pub const DEFAULT: UdpSettings = UdpSettings {
        idle_timeout: DEFAULT_UDP_IDLE_TIMEOUT,
        max_sessions: DEFAULT_UDP_MAX_SESSIONS,
    };
}

impl Default for UdpSettings {
    fn default() -> Self {
        UdpSettings::DEFAULT
    }
}

/// What a service forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ServiceKind {
    /// TCP connections (the default).
    #[default]
    Tcp,
    /// UDP datagrams, one flow per visitor address.
    Udp(UdpSettings),
    /// HTTP requests routed by host and path on the server's shared HTTP ports; through
    /// the tunnel they are TCP streams (the client dials its target as for `tcp`).
    Http,
}

impl ServiceKind {
    /// Whether both carry the same protocol (TCP or UDP), whatever their UDP settings.
    pub fn same_protocol(self, other: ServiceKind) -> bool {
        std::mem::discriminant(&self) == std::mem::discriminant(&other)
    }

    /// Every supported kind (UDP with its default settings).
    pub const ALL: [ServiceKind; 3] = [
        ServiceKind::Tcp,
        ServiceKind::Udp(UdpSettings::DEFAULT),
        ServiceKind::Http,
    ];
    /// Kinds that are planned but refused for now with "not supported yet".
    pub const PLANNED: [&'static str; 0] = [];

    /// Whether the tunnel carries this kind as streams (TCP and HTTP) rather than
    /// datagrams.
    pub fn is_stream(self) -> bool {
        !matches!(self, ServiceKind::Udp(_))
    }

    /// The name used in config files (`"tcp"`, `"udp"`).
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Tcp => "tcp",
            ServiceKind::Udp(_) => "udp",
            ServiceKind::Http => "http",
        }
    }

    /// Whether two services of these kinds would fight over one port number: only when
    /// they use the same protocol.
    fn shares_protocol(self, other: ServiceKind) -> bool {
        matches!(
            (self, other),
            (ServiceKind::Tcp, ServiceKind::Tcp) | (ServiceKind::Udp(_), ServiceKind::Udp(_))
        )
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ServiceKind {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ServiceKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownName {
                what: "service type",
                name: s.to_owned(),
                expected: ServiceKind::ALL.iter().map(|k| k.name()).collect(),
            })
    }
}

/// A host (DNS name, IPv4 or IPv6 address) and a non-zero port, resolved when dialled so a
/// name can follow DNS changes across reconnects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// The host without brackets: `example.com`, `192.0.2.1` or `2001:db8::1`.
    pub host: String,
    /// The port, never 0.
    pub port: u16,
}

/// Why a `HOST:PORT` string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostPortError {
    /// No `:PORT` at the end.
    #[error("missing port")]
    MissingPort,
    /// The port is not a number from 1 to 65535.
    #[error("invalid port `{0}`")]
    BadPort(String),
    /// Port 0 cannot be dialled.
    #[error("port 0 is not a port you can connect to")]
    ZeroPort,
    /// Nothing before the `:`.
    #[error("missing host")]
    EmptyHost,
    /// An IPv6 address without brackets (ambiguous with the port).
    #[error("IPv6 addresses need brackets")]
    UnbracketedIpv6,
    /// Characters that cannot be in a host name, or a bracketed non-IPv6.
    #[error("invalid host `{0}`")]
    BadHost(String),
    /// Looks like a URL (`http://...`).
    #[error("a URL is not a HOST:PORT")]
    Url,
}

impl FromStr for HostPort {
    type Err = HostPortError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.contains("://") {
            return Err(HostPortError::Url);
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| HostPortError::BadHost(s.to_owned()))?;
            if inside.parse::<Ipv6Addr>().is_err() {
                return Err(HostPortError::BadHost(inside.to_owned()));
            }
            let port = after.strip_prefix(':').ok_or(HostPortError::MissingPort)?;
            (inside, port)
        } else {
            let (host, port) = s.rsplit_once(':').ok_or(HostPortError::MissingPort)?;
            if host.contains(':') {
                return Err(HostPortError::UnbracketedIpv6);
            }
            if host.is_empty() {
                return Err(HostPortError::EmptyHost);
            }
            let valid = host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !valid || host.starts_with('.') || host.contains("..") {
                return Err(HostPortError::BadHost(host.to_owned()));
            }
            (host, port)
        };
        if port.is_empty() {
            return Err(HostPortError::MissingPort);
        }
        let port: u16 = port
            .parse()
            .map_err(|_| HostPortError::BadPort(port.to_owned()))?;
        if port == 0 {
            return Err(HostPortError::ZeroPort);
        }
        Ok(HostPort {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl From<SocketAddr> for HostPort {
    fn from(addr: SocketAddr) -> Self {
        HostPort {
            host: addr.ip().to_string(),
            port: addr.port(),
        }
    }
}

/// Everything the server runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where clients connect.
    pub bind: SocketAddr,
    /// Pre-shared key mixed into every handshake.
    pub psk: Secret,
    /// Token of services that set none; already copied into each [`ServerService`].
    pub default_token: Option<Secret>,
    /// Control-port transport: the only one, or the first of `transports`.
    pub transport: Transport,
    /// Every transport the server listens on (`transports = [...]`), each on `bind`'s port
    /// (TCP or UDP) or its own; empty: `transport` alone. See [`ServerConfig::transports`].
    pub transports: Vec<TransportEntry>,
    /// Allowed ciphers in preference order; never empty.
    pub ciphers: Vec<CipherSuite>,
    /// Whether measured speed or the clients' order picks the cipher.
    pub cipher_choice: CipherChoice,
    /// How often to send heartbeats.
    pub heartbeat_interval: Duration,
    /// On SIGTERM (or [`crate::BoundServer::drain_token`]), how long streams in flight may
    /// take to finish after the service ports closed.
    pub drain_timeout: Duration,
    /// On SIGTERM, how long the service ports keep taking visitors after `/readyz` said
    /// the server drains (a load balancer checking it stops sending them first).
    pub drain_grace: Duration,
    /// The TCP congestion control of the connections clients make to the TCP-family
    /// transports' ports (set on the listeners; accepted connections inherit it).
    pub tcp_congestion: TcpCongestion,
    /// One deadline for handshake, hello and auth.
    pub handshake_timeout: Duration,
    /// Allows weak secrets, plaintext transport and the `none` cipher.
    pub insecure: bool,
    /// Services by name.
    pub services: BTreeMap<String, ServerService>,
    /// Forward services by name: the server dials their target for the client.
    pub forwards: BTreeMap<String, ServerForward>,
    /// Ports clients may bind with client-declared services; `None`: no declared services.
    pub allow_ports: Option<PortRange>,
    /// Addresses clients may bind declared services on. Empty: the server's own bind IP.
    /// A client asking for an unspecified address (`0.0.0.0`, `::`) gets the first one.
    pub allow_bind_addrs: Vec<IpAddr>,
    /// The QUIC transport's settings (used with `transport = "quic"`).
    pub quic: super::quic::QuicConfig,
    /// The certificate of `tls` and `wss`.
    pub tls: super::web::ServerTlsConfig,
    /// WebSocket settings of `ws` and `wss`.
    pub ws: super::web::WsConfig,
    /// The shared HTTP ports of `type = "http"` services; `None`: no http services.
    pub http: Option<super::http::HttpListen>,
    /// The peer-to-peer mailbox; `None` (the default) refuses mailbox requests.
    pub p2p: Option<super::p2p::P2pConfig>,
    /// The admin API and `/metrics`; `None` (the default) serves neither.
    pub admin: Option<AdminConfig>,
}

/// A forward service on the server: a client binds a port on its side, and the server dials
/// `target` for each connection. The server only ever dials targets named here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerForward {
    /// The service name (same as its key in [`ServerConfig::forwards`]).
    pub name: String,
    /// What it forwards.
    pub kind: ServiceKind,
    /// What the server dials for each stream (or sends each UDP flow's datagrams to).
    pub target: HostPort,
    /// Token the client must prove.
    pub token: Secret,
    /// TCP only: write a PROXY protocol header (the visitor's address at the client's
    /// `bind`) to the target before the stream's bytes.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The most bytes per second each way, shared by all of its connections (UDP over it
    /// is dropped); `None`: no limit.
    pub bandwidth_limit: Option<u64>,
    /// TCP: how this side compresses what it sends into the tunnel; `None`: as it is.
    pub compression: Option<crate::transport::compress::Codec>,
}

/// The `[admin]` section: where the admin API and `/metrics` listen, and their token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where the admin HTTP server listens.
    pub bind: SocketAddr,
    /// Bearer token every request must carry; `None` allows anyone who can connect,
    /// which is refused unless `bind` is a loopback address.
    pub token: Option<Secret>,
    /// Host names the dashboard answers to besides IP addresses and `localhost` (lower
    /// case); a request naming any other host is refused, so a DNS-rebinding page cannot
    /// reach the API through a visitor's browser.
    pub hosts: Vec<String>,
}

impl AdminConfig {
    /// The broken rules: a non-loopback bind needs a token; a token must be strong.
    pub(crate) fn check(&self, insecure: bool) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        match &self.token {
            None if !self.bind.ip().is_loopback() => errors.push(
                ConfigError::new(
                    "admin.bind",
                    format!(
                        "the admin API on {} (not loopback) needs a token",
                        self.bind
                    ),
                )
                .with_hint(
                    "add token = \"${WARREN_ADMIN_TOKEN}\" to [admin], or bind it to 127.0.0.1",
                ),
            ),
            Some(token) if !insecure => errors.extend(check_secret("admin.token", token)),
            _ => {}
        }
        for (i, host) in self.hosts.iter().enumerate() {
            let plain = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if !plain {
                errors.push(
                    ConfigError::new(
                        format!("admin.hosts[{i}]"),
                        format!("`{host}` is not a host name"),
                    )
                    .with_hint("list bare DNS names without port or scheme, e.g. hosts = [\"warren.example.com\"]"),
                );
            }
        }
        errors
    }
}

/// A service the server exposes to visitors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerService {
    /// The service name (same as its key in [`ServerConfig::services`]).
    pub name: String,
    /// What it forwards.
    pub kind: ServiceKind,
    /// Where visitors connect.
    pub bind: SocketAddr,
    /// Token the client must prove (the service's own or the default one).
    pub token: Secret,
    /// How visitors are spread over the sessions serving the service.
    pub load_balance: super::ha::Strategy,
    /// An http service's routes and middleware (`kind` is [`ServiceKind::Http`]).
    pub http: Option<Box<super::http::HttpRoute>>,
    /// The most bytes per second each way, shared by all of its connections (UDP over it
    /// is dropped); `None`: no limit.
    pub bandwidth_limit: Option<u64>,
    /// TCP: how this side compresses what it sends into the tunnel; `None`: as it is.
    pub compression: Option<crate::transport::compress::Codec>,
}

/// Everything the client runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The server to dial (the first of [`ClientConfig::servers`]).
    pub server: HostPort,
    /// More servers: the client keeps a session with each at once (`servers = [...]`).
    pub more_servers: Vec<HostPort>,
    /// Pre-shared key mixed into every handshake.
    pub psk: Secret,
    /// Token of services that set none; already copied into each [`ClientService`].
    pub default_token: Option<Secret>,
    /// Control-port transport: the only one, or the first of `transports`.
    pub transport: Transport,
    /// The transports to try, in order (`transports = [...]`), raced happy-eyeballs style;
    /// empty: `transport` alone. See [`ClientConfig::transports`].
    pub transports: Vec<TransportEntry>,
    /// How often a client on a later transport of its list tries the earlier ones again,
    /// moving to one that works without dropping visitors.
    pub transport_retry: Duration,
    /// Offered ciphers in preference order; never empty.
    pub ciphers: Vec<CipherSuite>,
    /// Whether measured speed (when the server agrees) or this list's order picks the
    /// cipher.
    pub cipher_choice: CipherChoice,
    /// Reconnect when the server has been silent this long.
    pub heartbeat_timeout: Duration,
    /// On SIGTERM (or [`crate::Client::run_draining`]'s drain), how long streams in flight
    /// may take to finish after the servers were told to send no new visitors.
    pub drain_timeout: Duration,
    /// First wait before reconnecting.
    pub reconnect_initial_delay: Duration,
    /// Longest wait between reconnects (at least `reconnect_initial_delay`).
    pub reconnect_max_delay: Duration,
    /// One deadline for handshake, hello and auth.
    pub handshake_timeout: Duration,
    /// Allows weak secrets, plaintext transport and the `none` cipher.
    pub insecure: bool,
    /// Services by name.
    pub services: BTreeMap<String, ClientService>,
    /// Forward services by name.
    pub forwards: BTreeMap<String, ClientForward>,
    /// Peer-to-peer services (`p2p = true`) by name: met through the server's mailbox,
    /// carried directly between the two clients (or through the server's relay).
    pub p2p: BTreeMap<String, ClientP2p>,
    /// The file of this client's long-term P2P identity; `None`: a fresh one per
    /// connection.
    pub p2p_identity: Option<std::path::PathBuf>,
    /// Reach the server through this proxy (control and data channels).
    pub proxy: Option<ProxySetting>,
    /// When a host name resolves to both, try IPv6 addresses first (default: IPv4 first).
    pub prefer_ipv6: bool,
    /// The TCP congestion control of every connection to a server (control and data
    /// channels, or the proxy's connection).
    pub tcp_congestion: TcpCongestion,
    /// The QUIC transport's settings (used with `transport = "quic"`).
    pub quic: super::quic::QuicConfig,
    /// How `tls` and `wss` check the server.
    pub tls: super::web::ClientTlsConfig,
    /// WebSocket settings of `ws` and `wss`.
    pub ws: super::web::WsConfig,
    /// The admin API and `/metrics`; `None` (the default) serves neither.
    pub admin: Option<AdminConfig>,
}

/// A service the client serves from a local target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientService {
    /// The service name (same as its key in [`ClientConfig::services`]).
    pub name: String,
    /// What it forwards.
    pub kind: ServiceKind,
    /// The local service to connect to for each visitor.
    pub target: HostPort,
    /// Token proving the client may serve this service.
    pub token: Secret,
    /// A client-declared service: ask the server to bind this address (port 0: any free
    /// port in its `allow_ports`). `None`: the service is in the server's config.
    pub remote_bind: Option<SocketAddr>,
    /// Write a PROXY protocol header to the target before the visitor's bytes.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// This client's share of the service's visitors when several clients serve it.
    pub weight: u16,
    /// The target's health check: while it fails, the service is withdrawn.
    pub health_check: Option<super::ha::HealthCheck>,
    /// A client-declared http service: the names it asks the server to route to it.
    pub http_claim: Option<super::http::HttpClaim>,
    /// The most bytes per second each way, shared by all of its connections (UDP over it
    /// is dropped); `None`: no limit.
    pub bandwidth_limit: Option<u64>,
    /// TCP: how this side compresses what it sends into the tunnel; `None`: as it is.
    pub compression: Option<crate::transport::compress::Codec>,
}

/// A forward service on the client: it listens on `bind` and carries each connection to the
/// server, which dials the target its own config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientForward {
    /// The service name (same as its key in [`ClientConfig::forwards`]).
    pub name: String,
    /// What it forwards.
    pub kind: ServiceKind,
    /// Where local connections (or datagrams) come in.
    pub bind: SocketAddr,
    /// Select the server's forward service by its target instead of by name (the server
    /// still only dials targets its config names).
    pub target: Option<HostPort>,
    /// Token proving the client may use the service.
    pub token: Secret,
    /// The most bytes per second each way, shared by all of its connections (UDP over it
    /// is dropped); `None`: no limit.
    pub bandwidth_limit: Option<u64>,
    /// TCP: how this side compresses what it sends into the tunnel; `None`: as it is.
    pub compression: Option<crate::transport::compress::Codec>,
}

/// A peer-to-peer service (`p2p = true`): both ends are clients of the same server, which
/// introduces them by the service's name (a `[server.p2p.services.NAME]` of its config)
/// once each proves the token; the bytes then go between the two clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientP2p {
    /// The service name (same as its key in [`ClientConfig::p2p`]).
    pub name: String,
    /// TCP or UDP (with the flow table's bounds).
    pub kind: ServiceKind,
    /// Which end this client is.
    pub end: P2pEnd,
    /// The service's token: the password of the two ends' key exchange, and their proof
    /// to the server (never sent as is).
    pub token: Secret,
    /// The other end's identity (SHA-256 of its key), when pinned: any other is refused.
    pub peer: Option<[u8; 32]>,
    /// The most bytes per second each way, shared by all of its connections (UDP over it
    /// is dropped); `None`: no limit.
    pub bandwidth_limit: Option<u64>,
}

/// The two ends of a P2P service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum P2pEnd {
    /// The end that has the service (`target`): it offers the name and serves every
    /// visitor that comes.
    Exit {
        /// The local service, dialed for each connection (each UDP flow).
        target: HostPort,
    },
    /// The visitor's end (`bind`): a local port whose connections reach the exit.
    Entrance {
        /// Where local connections (or datagrams) come in.
        bind: SocketAddr,
    },
}

/// Whether this CPU has AES instructions, which decides the default cipher order.
pub fn has_aes_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

impl ServerConfig {
    /// A server on `bind` with `psk`, no services and every other setting at its default.
    /// Call [`ServerConfig::validate`] after changing fields.
    pub fn new(bind: SocketAddr, psk: Secret) -> Self {
        ServerConfig {
            bind,
            psk,
            default_token: None,
            transport: Transport::default(),
            transports: Vec::new(),
            ciphers: CipherSuite::default_preference(has_aes_hardware()),
            cipher_choice: CipherChoice::default(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            drain_grace: Duration::ZERO,
            tcp_congestion: TcpCongestion::default(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            insecure: false,
            services: BTreeMap::new(),
            forwards: BTreeMap::new(),
            allow_ports: None,
            allow_bind_addrs: Vec::new(),
            quic: super::quic::QuicConfig::default(),
            tls: super::web::ServerTlsConfig::default(),
            ws: super::web::WsConfig::default(),
            http: None,
            p2p: None,
            admin: None,
        }
    }

    /// Addresses declared services may bind: `allow_bind_addrs`, or the server's bind IP.
    pub fn declared_bind_addrs(&self) -> Vec<IpAddr> {
        if self.allow_bind_addrs.is_empty() {
            vec![self.bind.ip()]
        } else {
            self.allow_bind_addrs.clone()
        }
    }

    /// Checks the rules a file and a builder must both obey: secret strength, transport
    /// and cipher rules, non-zero durations, service names and unique service ports.
    /// Errors carry key paths such as `server.services.web.bind`, but no line numbers.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Invalid`] listing every broken rule.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut report = Report::default();
        report.extend_checked(self.check());
        report.into_result(None)
    }

    /// The broken rules, unsorted.
    pub(crate) fn check(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Some(admin) = &self.admin {
            errors.extend(admin.check(self.insecure));
        }
        let side = "server";
        check_common(&mut errors, side, self.common());
        check_nonzero(
            &mut errors,
            side,
            "heartbeat_interval",
            self.heartbeat_interval,
        );
        // (port, protocol, service key) of every bind seen so far, to find two listeners on
        // one port. The server port counts as both TCP and UDP: QUIC will use its UDP side.
        let mut binds: Vec<(SocketAddr, Option<ServiceKind>, String)> =
            vec![(self.bind, None, "server.bind".to_owned())];
        // Transports on ports of their own.
        for addr in self.tcp_binds().into_iter().chain(self.quic_bind()) {
            if addr != self.bind {
                binds.push((addr, None, "server.transports".to_owned()));
            }
        }
        if let Some(p2p) = &self.p2p {
            // The reflector and relay's UDP port: the server port's UDP side is free with
            // a TCP transport (the default puts it there), QUIC's with `transport = "quic"`.
            // UDP services are checked against it below.
            let key = "server.p2p.udp_bind";
            let udp = ServiceKind::Udp(UdpSettings::DEFAULT);
            if let Some(quic) = self.quic_bind()
                && p2p.udp_bind.port() != 0
                && binds_conflict(quic, p2p.udp_bind)
            {
                errors.push(
                    ConfigError::new(key, format!("{} is already used by server.bind", p2p.udp_bind))
                        .with_hint("give the reflector and relay a UDP port of their own, or leave udp_bind out with a TCP transport"),
                );
            }
            binds.push((p2p.udp_bind, Some(udp), key.to_owned()));
        }
        if let Some(http) = &self.http {
            for (addr, key) in [
                (http.bind, "server.http.bind"),
                (http.tls_bind, "server.http.tls_bind"),
            ] {
                if let Some(addr) = addr {
                    let conflict = binds
                        .iter()
                        .find(|(other, _, _)| addr.port() != 0 && binds_conflict(*other, addr));
                    if let Some((_, _, other)) = conflict {
                        errors.push(
                            ConfigError::new(key, format!("{addr} is already used by {other}"))
                                .with_hint("give the HTTP ports their own port numbers"),
                        );
                    }
                    binds.push((addr, Some(ServiceKind::Tcp), key.to_owned()));
                }
            }
        }
        for (name, service) in &self.services {
            let key = service_key(side, name);
            check_service(&mut errors, side, name, &service.name, &service.token, self);
            check_udp(&mut errors, &key, service.kind);
            if service.kind == ServiceKind::Http {
                // Served on the shared HTTP ports, checked above.
                continue;
            }
            let bind_key = join_key(&key, "bind");
            // Port 0 asks the OS for a free port, so it never conflicts; a UDP and a TCP
            // service may share a port number.
            let conflict = binds.iter().find(|(addr, kind, _)| {
                service.bind.port() != 0
                    && kind.is_none_or(|kind| kind.shares_protocol(service.kind))
                    && binds_conflict(*addr, service.bind)
            });
            if let Some((_, _, other)) = conflict {
                errors.push(
                    ConfigError::new(
                        &bind_key,
                        format!("{} is already used by {other}", service.bind),
                    )
                    .with_hint("give every service its own port"),
                );
            }
            binds.push((service.bind, Some(service.kind), bind_key));
        }
        errors.extend(super::http::check_routes(self));
        for (name, forward) in &self.forwards {
            let key = service_key(side, name);
            check_service(&mut errors, side, name, &forward.name, &forward.token, self);
            check_udp(&mut errors, &key, forward.kind);
            check_proxy_protocol(&mut errors, &key, forward.kind, forward.proxy_protocol);
        }
        if !self.allow_bind_addrs.is_empty() && self.allow_ports.is_none() {
            errors.push(
                ConfigError::new(
                    "server.allow_bind_addrs",
                    "allow_bind_addrs has no effect without allow_ports",
                )
                .with_hint("add allow_ports = \"20000-29999\" to let clients declare services"),
            );
        }
        if self.allow_ports.is_some() && !self.insecure && self.default_token.is_none() {
            errors.push(
                ConfigError::new(
                    "server.allow_ports",
                    "client-declared services are authenticated by default_token, and it is not set",
                )
                .with_hint("add default_token = \"${WARREN_TOKEN}\" to [server]"),
            );
        }
        errors
    }
}

impl ClientConfig {
    /// Every server the client keeps a session with: `server`, then `more_servers`.
    pub fn servers(&self) -> Vec<&HostPort> {
        std::iter::once(&self.server)
            .chain(&self.more_servers)
            .collect()
    }

    /// A client of `server` with `psk`, no services and every other setting at its
    /// default. Call [`ClientConfig::validate`] after changing fields.
    pub fn new(server: HostPort, psk: Secret) -> Self {
        ClientConfig {
            server,
            more_servers: Vec::new(),
            psk,
            default_token: None,
            transport: Transport::default(),
            transports: Vec::new(),
            transport_retry: DEFAULT_TRANSPORT_RETRY,
            ciphers: CipherSuite::default_preference(has_aes_hardware()),
            cipher_choice: CipherChoice::default(),
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            reconnect_initial_delay: DEFAULT_RECONNECT_INITIAL_DELAY,
            reconnect_max_delay: DEFAULT_RECONNECT_MAX_DELAY,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            insecure: false,
            services: BTreeMap::new(),
            admin: None,
            forwards: BTreeMap::new(),
            p2p: BTreeMap::new(),
            p2p_identity: None,
            proxy: None,
            prefer_ipv6: false,
            tcp_congestion: TcpCongestion::default(),
            quic: super::quic::QuicConfig::default(),
            tls: super::web::ClientTlsConfig::default(),
            ws: super::web::WsConfig::default(),
        }
    }

    /// Checks the rules a file and a builder must both obey: secret strength, transport
    /// and cipher rules, non-zero durations, reconnect delays in order, service names and
    /// targets. Errors carry key paths but no line numbers.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Invalid`] listing every broken rule.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut report = Report::default();
        report.extend_checked(self.check());
        report.into_result(None)
    }

    /// The broken rules, unsorted.
    pub(crate) fn check(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Some(admin) = &self.admin {
            errors.extend(admin.check(self.insecure));
        }
        let side = "client";
        check_common(&mut errors, side, self.common());
        if self.server.port == 0 {
            errors.push(port_zero("client.server"));
        }
        for (i, server) in self.more_servers.iter().enumerate() {
            if server.port == 0 {
                errors.push(port_zero(&format!("client.servers[{}]", i + 1)));
            }
        }
        let servers = self.servers();
        if servers.len() > super::ha::MAX_SERVERS {
            errors.push(
                ConfigError::new(
                    "client.servers",
                    format!(
                        "{} servers listed; at most {} are supported",
                        servers.len(),
                        super::ha::MAX_SERVERS
                    ),
                )
                .with_hint("put the servers behind an L4 load balancer and list fewer here"),
            );
        }
        if let Some(twice) = servers
            .iter()
            .enumerate()
            .find(|(i, server)| servers[..*i].contains(server))
        {
            errors.push(
                ConfigError::new("client.servers", format!("{} is listed twice", twice.1))
                    .with_hint("list every server once"),
            );
        }
        check_nonzero(
            &mut errors,
            side,
            "heartbeat_timeout",
            self.heartbeat_timeout,
        );
        check_nonzero(&mut errors, side, "transport_retry", self.transport_retry);
        check_nonzero(
            &mut errors,
            side,
            "reconnect_initial_delay",
            self.reconnect_initial_delay,
        );
        check_nonzero(
            &mut errors,
            side,
            "reconnect_max_delay",
            self.reconnect_max_delay,
        );
        if self.reconnect_max_delay < self.reconnect_initial_delay {
            errors.push(
                ConfigError::new(
                    "client.reconnect_max_delay",
                    format!(
                        "reconnect_max_delay ({}) is shorter than reconnect_initial_delay ({})",
                        format_duration(self.reconnect_max_delay),
                        format_duration(self.reconnect_initial_delay)
                    ),
                )
                .with_hint("raise reconnect_max_delay or lower reconnect_initial_delay"),
            );
        }
        for (name, service) in &self.services {
            check_service(&mut errors, side, name, &service.name, &service.token, self);
            check_udp(&mut errors, &service_key(side, name), service.kind);
            if service.target.port == 0 {
                errors.push(port_zero(&join_key(&service_key(side, name), "target")));
            }
            let key = service_key(side, name);
            check_proxy_protocol(&mut errors, &key, service.kind, service.proxy_protocol);
        }
        // A UDP and a TCP forward service may share a port number.
        let mut binds: Vec<(SocketAddr, ServiceKind, String)> = Vec::new();
        for (name, forward) in &self.forwards {
            let key = service_key(side, name);
            check_service(&mut errors, side, name, &forward.name, &forward.token, self);
            check_udp(&mut errors, &key, forward.kind);
            let bind_key = join_key(&key, "bind");
            if let Some((_, _, other)) = binds.iter().find(|(addr, kind, _)| {
                forward.bind.port() != 0
                    && kind.shares_protocol(forward.kind)
                    && binds_conflict(*addr, forward.bind)
            }) {
                errors.push(
                    ConfigError::new(
                        &bind_key,
                        format!("{} is already used by {other}", forward.bind),
                    )
                    .with_hint("give every forward service its own port"),
                );
            }
            binds.push((forward.bind, forward.kind, bind_key));
        }
        for (name, p2p) in &self.p2p {
            let key = service_key(side, name);
            check_service(&mut errors, side, name, &p2p.name, &p2p.token, self);
            check_udp(&mut errors, &key, p2p.kind);
            match &p2p.end {
                P2pEnd::Exit { target } if target.port == 0 => {
                    errors.push(port_zero(&join_key(&key, "target")));
                }
                P2pEnd::Exit { .. } => {}
                P2pEnd::Entrance { bind } => {
                    let bind_key = join_key(&key, "bind");
                    if let Some((_, _, other)) = binds.iter().find(|(addr, kind, _)| {
                        bind.port() != 0
                            && kind.shares_protocol(p2p.kind)
                            && binds_conflict(*addr, *bind)
                    }) {
                        errors.push(
                            ConfigError::new(
                                &bind_key,
                                format!("{bind} is already used by {other}"),
                            )
                            .with_hint("give every forward and P2P service its own port"),
                        );
                    }
                    binds.push((*bind, p2p.kind, bind_key));
                }
            }
            if self.services.contains_key(name) || self.forwards.contains_key(name) {
                errors.push(
                    ConfigError::new(&key, format!("two services are named `{name}`"))
                        .with_hint("give every service its own name"),
                );
            }
        }
        errors
    }
}

/// Refuses `proxy_protocol` on a UDP service, reverse or forward alike: a PROXY header
/// starts a TCP stream, and a per-datagram v2 header would break every UDP target that
/// does not expect one (DNS, QUIC, WireGuard), so Warren does not send one.
fn check_proxy_protocol(
    errors: &mut Vec<ConfigError>,
    key: &str,
    kind: ServiceKind,
    proxy_protocol: Option<ProxyProtocol>,
) {
    if proxy_protocol.is_some() && kind != ServiceKind::Tcp {
        errors.push(
            ConfigError::new(
                join_key(key, "proxy_protocol"),
                format!(
                    "proxy_protocol works on TCP services only; this one is {kind} (a PROXY header starts a TCP stream, and UDP datagrams carry none)"
                ),
            )
            .with_hint("remove proxy_protocol from this service, or use type = \"tcp\""),
        );
    }
}

/// The bounds of a UDP service: a non-zero idle timeout, 1 to [`MAX_UDP_MAX_SESSIONS`]
/// sessions.
fn check_udp(errors: &mut Vec<ConfigError>, key: &str, kind: ServiceKind) {
    let ServiceKind::Udp(udp) = kind else {
        return;
    };
    check_nonzero(errors, key, "udp_idle_timeout", udp.idle_timeout);
    if !(1..=MAX_UDP_MAX_SESSIONS).contains(&udp.max_sessions) {
        errors.push(
            ConfigError::new(
                join_key(key, "udp_max_sessions"),
                format!(
                    "udp_max_sessions must be from 1 to {MAX_UDP_MAX_SESSIONS}, not {}",
                    udp.max_sessions
                ),
            )
            .with_hint(format!(
                "remove it for the default ({DEFAULT_UDP_MAX_SESSIONS}), or write a number in that range"
            )),
        );
    }
}

/// Whether two listeners would fight over a port: same port, and the same address or a
/// wildcard on either side (`0.0.0.0`/`[::]` take the port on every address).
fn binds_conflict(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `server.services.NAME`
pub(crate) fn service_key(side: &str, name: &str) -> String {
    join_key(&join_key(side, "services"), name)
}

fn port_zero(key: &str) -> ConfigError {
    ConfigError::new(key, "port 0 is not a port you can connect to")
        .with_hint("write the real port, e.g. \"127.0.0.1:3000\"")
}

/// The settings both sides share, borrowed: for [`check_common`], and for a reload to tell
/// what changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Common<'a> {
    pub(crate) psk: &'a Secret,
    pub(crate) default_token: Option<&'a Secret>,
    pub(crate) transport: Transport,
    pub(crate) transports: &'a [TransportEntry],
    pub(crate) ciphers: &'a [CipherSuite],
    pub(crate) handshake_timeout: Duration,
    pub(crate) insecure: bool,
    pub(crate) quic: &'a super::quic::QuicConfig,
}

impl Common<'_> {
    /// Whether a session authenticated under `self` is authenticated the same way under
    /// `other`: same PSK, transport, ciphers and `insecure`.
    pub(crate) fn same_handshake(&self, other: &Common<'_>) -> bool {
        self.psk == other.psk
            && self.transport == other.transport
            && self.transports == other.transports
            && self.ciphers == other.ciphers
            && self.insecure == other.insecure
            && (!self.uses_quic() || self.quic == other.quic)
    }

    /// Whether QUIC is one of the transports.
    fn uses_quic(&self) -> bool {
        self.uses_transport(Transport::Quic)
    }

    /// `transports` when the config lists them, else `transport` alone on the default port.
    fn transport_list(&self) -> Vec<TransportEntry> {
        if self.transports.is_empty() {
            vec![TransportEntry::new(self.transport)]
        } else {
            self.transports.to_vec()
        }
    }

    /// Whether `transport` is one of the transports.
    fn uses_transport(&self, transport: Transport) -> bool {
        self.transport_list()
            .iter()
            .any(|e| e.transport == transport)
    }
}

/// Borrows the settings both sides share.
macro_rules! common_of {
    ($config:expr) => {
        Common {
            psk: &$config.psk,
            default_token: $config.default_token.as_ref(),
            transport: $config.transport,
            transports: &$config.transports,
            ciphers: &$config.ciphers,
            handshake_timeout: $config.handshake_timeout,
            insecure: $config.insecure,
            quic: &$config.quic,
        }
    };
}

impl ServerConfig {
    /// The settings both sides share.
    pub(crate) fn common(&self) -> Common<'_> {
        common_of!(self)
    }

    /// Every transport it listens on, in the config's order.
    pub fn transport_list(&self) -> Vec<TransportEntry> {
        self.common().transport_list()
    }

    /// Whether it listens on `transport`.
    pub fn uses_transport(&self, transport: Transport) -> bool {
        self.common().uses_transport(transport)
    }

    /// Where QUIC listens (UDP), if it is one of the transports.
    pub fn quic_bind(&self) -> Option<SocketAddr> {
        self.transport_list()
            .iter()
            .find(|e| e.transport == Transport::Quic)
            .map(|e| SocketAddr::new(self.bind.ip(), e.port_or(self.bind.port())))
    }

    /// The TCP ports the TCP-family transports listen on, `bind`'s first, each once.
    pub fn tcp_binds(&self) -> Vec<SocketAddr> {
        let mut binds: Vec<SocketAddr> = Vec::new();
        for entry in self.transport_list() {
            let addr = SocketAddr::new(self.bind.ip(), entry.port_or(self.bind.port()));
            if entry.transport != Transport::Quic && !binds.contains(&addr) {
                binds.push(addr);
            }
        }
        binds
    }
}

impl ClientConfig {
    /// The settings both sides share.
    pub(crate) fn common(&self) -> Common<'_> {
        common_of!(self)
    }

    /// The transports to try, in the config's order.
    pub fn transport_list(&self) -> Vec<TransportEntry> {
        self.common().transport_list()
    }

    /// Whether `transport` is one it may use.
    pub fn uses_transport(&self, transport: Transport) -> bool {
        self.common().uses_transport(transport)
    }
}

/// Access to what [`check_service`] needs from either side's config.
trait Side {
    fn default_token(&self) -> Option<&Secret>;
    fn insecure(&self) -> bool;
}

impl Side for ServerConfig {
    fn default_token(&self) -> Option<&Secret> {
        self.default_token.as_ref()
    }
    fn insecure(&self) -> bool {
        self.insecure
    }
}

impl Side for ClientConfig {
    fn default_token(&self) -> Option<&Secret> {
        self.default_token.as_ref()
    }
    fn insecure(&self) -> bool {
        self.insecure
    }
}

fn check_common(errors: &mut Vec<ConfigError>, side: &str, c: Common<'_>) {
    if let Some(first) = c.transports.first()
        && first.transport != c.transport
    {
        errors.push(
            ConfigError::new(
                join_key(side, "transport"),
                format!(
                    "transport is \"{}\" but transports starts with \"{}\"",
                    c.transport, first.transport
                ),
            )
            .with_hint("set one of them: transports = [...] alone says the order"),
        );
    }
    for (i, entry) in c.transports.iter().enumerate() {
        if c.transports[..i]
            .iter()
            .any(|e| e.transport == entry.transport)
        {
            errors.push(
                ConfigError::new(
                    join_key(side, "transports"),
                    format!("\"{}\" is listed twice", entry.transport),
                )
                .with_hint("name each transport once, in the order to try them"),
            );
        }
    }
    if !c.insecure {
        if c.psk.is_empty() {
            errors.push(
                ConfigError::new(join_key(side, "psk"), "missing pre-shared key (psk)").with_hint(
                    "add psk = \"${WARREN_PSK}\" and set WARREN_PSK to the same random value on server and client, e.g. from `openssl rand -base64 32`",
                ),
            );
        } else if let Some(error) = check_secret(&join_key(side, "psk"), c.psk) {
            errors.push(error);
        }
        if let Some(error) = c
            .default_token
            .and_then(|token| check_secret(&join_key(side, "default_token"), token))
        {
            errors.push(error);
        }
        if c.uses_transport(Transport::Tcp) {
            errors.push(
                ConfigError::new(
                    join_key(side, "transport"),
                    "transport \"tcp\" sends everything in plaintext",
                )
                .with_hint(
                    "use transport = \"noise\" (the default), or set insecure = true if the network is already private",
                ),
            );
        }
    }
    let ciphers_key = join_key(side, "ciphers");
    if c.ciphers.is_empty() {
        errors.push(
            ConfigError::new(&ciphers_key, "the cipher list is empty").with_hint(
                "remove the key to use the defaults, or list at least one of: aes-256-gcm, aes-128-gcm, chacha20-poly1305, aegis-128l, aegis-256",
            ),
        );
    }
    if !c.insecure {
        for (i, suite) in c.ciphers.iter().enumerate() {
            if !suite.is_encrypting() {
                errors.push(
                    ConfigError::new(
                        join_index(&ciphers_key, i),
                        "cipher \"none\" sends data unencrypted",
                    )
                    .with_hint(
                        "remove \"none\", or set insecure = true if the network is already private",
                    ),
                );
            }
        }
    }
    check_nonzero(errors, side, "handshake_timeout", c.handshake_timeout);
}

fn check_service(
    errors: &mut Vec<ConfigError>,
    side: &str,
    key_name: &str,
    name: &str,
    token: &Secret,
    config: &dyn Side,
) {
    let key = service_key(side, key_name);
    if key_name != name {
        errors.push(
            ConfigError::new(
                &key,
                format!("service is filed under `{key_name}` but named `{name}`"),
            )
            .with_hint("use the same name for the map key and the service's name field"),
        );
    }
    if let Some(problem) = service_name_problem(key_name) {
        errors.push(ConfigError::new(&key, problem).with_hint(
            "use 1 to 64 characters from A-Z, a-z, 0-9, '_', '.' and '-', e.g. [server.services.web]",
        ));
    }
    // A token equal to the default one was checked as default_token already.
    let is_default = config
        .default_token()
        .is_some_and(|default| default == token);
    let checked = !config.insecure() && !is_default;
    if let Some(error) = checked
        .then(|| check_secret(&join_key(&key, "token"), token))
        .flatten()
    {
        errors.push(error);
    }
}

/// Why `name` is not a valid service name, if it is not.
pub(crate) fn service_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("empty service name".to_owned())
    } else if name.chars().count() > MAX_SERVICE_NAME_LEN {
        Some(format!(
            "service name is longer than {MAX_SERVICE_NAME_LEN} characters"
        ))
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        Some(format!(
            "service name {name:?} contains characters other than A-Z, a-z, 0-9, '_', '.' and '-'"
        ))
    } else {
        None
    }
}

/// Strength rules for a PSK or token; the message never includes the value.
fn check_secret(key: &str, secret: &Secret) -> Option<ConfigError> {
    let name = key.rsplit('.').next().unwrap_or(key);
    let value = secret.expose();
    let is_placeholder = value
        .get(..PLACEHOLDER_PREFIX.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(PLACEHOLDER_PREFIX));
    if is_placeholder {
        Some(
            ConfigError::new(
                key,
                format!("{name} still holds the CHANGE-ME placeholder from the example config"),
            )
                .with_hint(format!(
                    "replace it with a random value (`warren keygen` prints one), or reference an environment variable: \"${{{}}}\"",
                    if name == "psk" { "WARREN_PSK" } else { "WARREN_TOKEN" }
                )),
        )
    } else if secret.len() < MIN_SECRET_LEN {
        Some(
            ConfigError::new(
                key,
                format!("{name} is shorter than {MIN_SECRET_LEN} characters"),
            )
            .with_hint(
                "use a random value of at least 16 characters, e.g. from `openssl rand -base64 32`",
            ),
        )
    } else {
        None
    }
}

fn check_nonzero(errors: &mut Vec<ConfigError>, side: &str, field: &str, value: Duration) {
    if value.is_zero() {
        errors.push(
            ConfigError::new(
                join_key(side, field),
                format!("{field} must be longer than zero"),
            )
            .with_hint(
                "write a positive duration such as \"10s\", or remove the key to use the default",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strong() -> Secret {
        Secret::new("0123456789abcdef-strong")
    }

    #[test]
    fn host_port_parsing() {
        let hp: HostPort = "[::1]:7000".parse().expect("ipv6");
        assert_eq!(
            hp,
            HostPort {
                host: "::1".into(),
                port: 7000
            }
        );
        assert_eq!(hp.to_string(), "[::1]:7000");
        assert_eq!(
            "a.b:1".parse::<HostPort>().expect("name").to_string(),
            "a.b:1"
        );
        assert_eq!("1.2.3.4:5".parse::<HostPort>().expect("v4").host, "1.2.3.4");
        assert_eq!("a.b".parse::<HostPort>(), Err(HostPortError::MissingPort));
        assert_eq!("a.b:".parse::<HostPort>(), Err(HostPortError::MissingPort));
        assert_eq!("a.b:0".parse::<HostPort>(), Err(HostPortError::ZeroPort));
        assert_eq!(
            "a.b:70000".parse::<HostPort>(),
            Err(HostPortError::BadPort("70000".into()))
        );
        assert_eq!(
            "::1:7000".parse::<HostPort>(),
            Err(HostPortError::UnbracketedIpv6)
        );
        assert_eq!(":7000".parse::<HostPort>(), Err(HostPortError::EmptyHost));
        assert_eq!("[::1]".parse::<HostPort>(), Err(HostPortError::MissingPort));
        assert!(matches!(
            "[nope]:1".parse::<HostPort>(),
            Err(HostPortError::BadHost(_))
        ));
        assert!(matches!(
            "a b:1".parse::<HostPort>(),
            Err(HostPortError::BadHost(_))
        ));
        assert_eq!("http://a:1".parse::<HostPort>(), Err(HostPortError::Url));
        let from: HostPort = "[2001:db8::1]:443"
            .parse::<SocketAddr>()
            .expect("addr")
            .into();
        assert_eq!(from.to_string(), "[2001:db8::1]:443");
    }

    #[test]
    fn new_configs_are_valid_and_use_defaults() {
        let server = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), strong());
        assert_eq!(server.validate().ok(), Some(()));
        assert_eq!(server.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(
            server.ciphers,
            CipherSuite::default_preference(has_aes_hardware())
        );
        let client = ClientConfig::new("example.com:7000".parse().expect("hp"), strong());
        assert_eq!(client.validate().ok(), Some(()));
        assert_eq!(client.reconnect_max_delay, Duration::from_secs(30));
    }

    #[test]
    fn validate_catches_builder_mistakes() {
        let mut server =
            ServerConfig::new("0.0.0.0:7000".parse().expect("addr"), Secret::new("short"));
        server.ciphers.clear();
        server.transport = Transport::Tcp;
        server.heartbeat_interval = Duration::ZERO;
        for (name, port) in [("a", 8080), ("b", 8080), ("bad name", 7000)] {
            server.services.insert(
                name.to_owned(),
                ServerService {
                    http: None,
                    name: name.to_owned(),
                    kind: ServiceKind::Tcp,
                    bind: SocketAddr::from(([127, 0, 0, 1], port)),
                    token: strong(),
                    load_balance: Default::default(),
                    bandwidth_limit: None,
                    compression: None,
                },
            );
        }
        let errors = server.validate().expect_err("invalid");
        let keys: Vec<&str> = errors.errors().iter().map(|e| e.key.as_str()).collect();
        for key in [
            "server.psk",
            "server.ciphers",
            "server.transport",
            "server.heartbeat_interval",
            "server.services.b.bind",
            "server.services.\"bad name\"",
            "server.services.\"bad name\".bind",
        ] {
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
        server.insecure = true;
        server.ciphers = vec![CipherSuite::None];
        let errors = server.validate().expect_err("still invalid");
        assert!(
            errors
                .errors()
                .iter()
                .all(|e| e.key != "server.psk" && e.key != "server.transport")
        );

        let mut client = ClientConfig::new("a:1".parse().expect("hp"), strong());
        client.reconnect_initial_delay = Duration::from_secs(60);
        client.ciphers = vec![CipherSuite::Aes128Gcm, CipherSuite::None];
        let errors = client.validate().expect_err("invalid");
        let keys: Vec<&str> = errors.errors().iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["client.ciphers[1]", "client.reconnect_max_delay"]);
    }

    #[test]
    fn udp_services_share_ports_with_tcp_and_check_their_bounds() {
        let mut server = ServerConfig::new("127.0.0.1:7000".parse().expect("addr"), strong());
        let services = [
            ("tcp", ServiceKind::Tcp, 8080),
            ("udp", ServiceKind::Udp(UdpSettings::DEFAULT), 8080),
            (
                "udp2",
                ServiceKind::Udp(UdpSettings {
                    idle_timeout: Duration::ZERO,
                    max_sessions: 0,
                }),
                8080,
            ),
            ("quic", ServiceKind::Udp(UdpSettings::DEFAULT), 7000),
        ];
        for (name, kind, port) in services {
            server.services.insert(
                name.to_owned(),
                ServerService {
                    http: None,
                    name: name.to_owned(),
                    kind,
                    bind: SocketAddr::from(([127, 0, 0, 1], port)),
                    token: strong(),
                    load_balance: Default::default(),
                    bandwidth_limit: None,
                    compression: None,
                },
            );
        }
        let errors = server.validate().expect_err("invalid");
        let keys: Vec<&str> = errors.errors().iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "server.services.quic.bind",
                "server.services.udp2.udp_idle_timeout",
                "server.services.udp2.udp_max_sessions",
                "server.services.udp2.bind",
            ],
            "tcp and udp may share 8080; two udp services may not; the server port is reserved"
        );
        assert_eq!("udp".parse(), Ok(ServiceKind::Udp(UdpSettings::DEFAULT)));
        assert_eq!(ServiceKind::Udp(UdpSettings::DEFAULT).to_string(), "udp");
    }

    #[test]
    fn parses_enum_names() {
        assert_eq!("noise".parse(), Ok(Transport::Noise));
        assert_eq!("TCP".parse(), Ok(Transport::Tcp));
        assert_eq!("quic".parse(), Ok(Transport::Quic));
        assert_eq!("tcp".parse(), Ok(ServiceKind::Tcp));
        assert_eq!(Transport::Tcp.to_string(), "tcp");
    }

    /// Issue 5: UDP forward and declared services are accepted; `proxy_protocol` is
    /// refused on every UDP service (reverse or forward) with a message naming the fix, and
    /// on a reverse service of the server, where it belongs on the client.
    #[test]
    fn issue5_udp_forward_and_declared_accepted_proxy_protocol_tcp_only() {
        let psk =
            "psk = \"a-long-enough-psk-0123\"\ndefault_token = \"a-long-enough-token-0123\"\n";
        let server = format!(
            "[server]\nbind = \"127.0.0.1:7000\"\n{psk}allow_ports = \"20000-20010\"\n\
             [server.services.dns]\ntype = \"udp\"\ntarget = \"127.0.0.1:53\"\nudp_max_sessions = 10\n\
             [server.services.web]\ntarget = \"127.0.0.1:80\"\nproxy_protocol = \"v2\"\n"
        );
        let config = ServerConfig::from_toml_str(&server, "server.toml").expect("valid");
        assert_eq!(config.forwards["dns"].kind.name(), "udp");
        assert_eq!(
            config.forwards["web"].proxy_protocol,
            Some(ProxyProtocol::V2)
        );
        let client = format!(
            "[client]\nserver = \"127.0.0.1:7000\"\n{psk}\
             [client.services.dns]\ntype = \"udp\"\nbind = \"127.0.0.1:5353\"\n\
             [client.services.dns-tcp]\nbind = \"127.0.0.1:5353\"\n\
             [client.services.game]\ntype = \"udp\"\ntarget = \"127.0.0.1:27015\"\nremote_bind = \"0.0.0.0:0\"\n"
        );
        ClientConfig::from_toml_str(&client, "client.toml")
            .expect("UDP forward, TCP forward on the same port number, declared UDP");

        let bad_server = format!(
            "[server]\nbind = \"127.0.0.1:7000\"\n{psk}\
             [server.services.dns]\ntype = \"udp\"\ntarget = \"127.0.0.1:53\"\nproxy_protocol = \"v2\"\n\
             [server.services.web]\nbind = \"127.0.0.1:8080\"\nproxy_protocol = \"v1\"\n"
        );
        let errors = ServerConfig::from_toml_str(&bad_server, "server.toml").expect_err("invalid");
        let found = |key: &str, text: &str| {
            errors
                .errors()
                .iter()
                .any(|e| e.key == key && e.message.contains(text))
        };
        assert!(
            found("server.services.dns.proxy_protocol", "TCP services only"),
            "{errors}"
        );
        assert!(
            found("server.services.web.proxy_protocol", "forward services"),
            "{errors}"
        );
        let bad_client = format!(
            "[client]\nserver = \"127.0.0.1:7000\"\n{psk}\
             [client.services.dns]\ntype = \"udp\"\ntarget = \"127.0.0.1:53\"\nproxy_protocol = \"v1\"\n"
        );
        let errors = ClientConfig::from_toml_str(&bad_client, "client.toml").expect_err("invalid");
        let error = &errors.errors()[0];
        assert_eq!(error.key, "client.services.dns.proxy_protocol");
        assert!(
            error.message.contains("this one is udp"),
            "{}",
            error.message
        );
        assert!(
            error
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("remove proxy_protocol")),
            "{error:?}"
        );
    }
}
