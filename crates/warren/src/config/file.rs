//! The file model: exactly what a Warren TOML file may contain, as serde sees it.
//!
//! This is the first of the two config layers. Every struct denies unknown fields, every
//! field is optional here (defaults and "required" are decided in the typed layer, which
//! can then say *which* key is missing and how to fill it), and values stay close to the
//! text (`String` addresses, [`RawDuration`]) so the typed layer can explain what is wrong
//! with them. [`super::Config`] is built from this with `TryFrom`.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A whole config file: exactly one of `[server]` or `[client]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[server]`: run the public side.
    pub server: Option<FileServer>,
    /// `[client]`: run the side behind NAT.
    pub client: Option<FileClient>,
    /// `[admin]`: the admin API and `/metrics`, for either side. Default: off.
    pub admin: Option<FileAdmin>,
}

/// The `[admin]` section: the admin HTTP API (JSON) and Prometheus `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdmin {
    /// `IP:PORT` to serve the admin API on, e.g. `"127.0.0.1:7001"`. Required.
    pub bind: Option<String>,
    /// Bearer token every request must carry. Required when `bind` is not loopback.
    pub token: Option<String>,
    /// Host names (besides IP addresses and `localhost`) the dashboard may be reached by,
    /// e.g. `["warren.example.com"]`; any other `Host` header is refused (DNS rebinding).
    pub hosts: Option<Vec<String>>,
}

/// The `[server]` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    /// `IP:PORT` to listen on for clients. Required.
    pub bind: Option<String>,
    /// Pre-shared key, at least 16 characters. Required unless `insecure = true`.
    pub psk: Option<String>,
    /// Token for services that set none. Optional.
    pub default_token: Option<String>,
    /// `"noise"` (default), `"quic"`, `"tls"`, `"wss"`, `"ws"` or `"tcp"` (plaintext, needs `insecure = true`).
    pub transport: Option<String>,
    /// Every transport to listen on, e.g. `["quic", "noise", "wss:443"]`: each on `bind`'s
    /// port (QUIC on its UDP side) or on the port after the colon. Instead of `transport`.
    pub transports: Option<Vec<String>>,
    /// Allowed ciphers. Default: every encrypting cipher, AES-GCM first on CPUs with AES
    /// instructions, ChaCha20-Poly1305 first elsewhere (the order breaks ties under
    /// `cipher_choice = "fastest"`).
    pub ciphers: Option<Vec<String>>,
    /// `"fastest"` (default: the allowed cipher both sides seal and open fastest, measured
    /// at start) or `"ordered"` (the client's `ciphers` order decides, as before figures).
    pub cipher_choice: Option<String>,
    /// How often the server sends a heartbeat. Default `"10s"`.
    pub heartbeat_interval: Option<RawDuration>,
    /// On SIGTERM, how long streams in flight may take to finish after the service ports
    /// closed. Default `"30s"`.
    pub drain_timeout: Option<RawDuration>,
    /// On SIGTERM, how long the service ports keep taking visitors after `/readyz` turned
    /// 503, for a load balancer's health check to notice. Default `"0s"`.
    pub drain_grace: Option<RawDuration>,
    /// TCP congestion control of clients' connections to the TCP-family transports:
    /// `"auto"` (default: BBR where the kernel has it, else the system default),
    /// `"system"`, or a kernel name (`"cubic"`, `"bbr"`).
    pub tcp_congestion: Option<String>,
    /// One deadline for handshake, hello and auth. Default `"10s"`.
    pub handshake_timeout: Option<RawDuration>,
    /// Allows weak or placeholder secrets, `transport = "tcp"` and the `none` cipher.
    /// Default `false`.
    pub insecure: Option<bool>,
    /// Ports clients may bind with client-declared services, `"20000-29999"`. Default:
    /// none (client-declared services are refused).
    pub allow_ports: Option<String>,
    /// IPs clients may bind declared services on. Default: the IP of `bind`.
    pub allow_bind_addrs: Option<Vec<String>>,
    /// `[server.quic]`: the QUIC transport's settings.
    pub quic: Option<super::quic::FileQuic>,
    /// `[server.tls]`: the certificate of `tls` and `wss`.
    pub tls: Option<super::web::FileTls>,
    /// `[server.ws]`: WebSocket path and decoy page.
    pub ws: Option<super::web::FileWs>,
    /// `[server.http]`: the shared HTTP ports of `type = "http"` services.
    pub http: Option<super::http::FileHttp>,
    /// `[server.p2p]`: the mailbox of peer-to-peer transfers. Default: off.
    pub p2p: Option<super::p2p::FileP2p>,
    /// `[server.services.NAME]` tables. Default: none.
    #[serde(default)]
    pub services: BTreeMap<String, FileServerService>,
}

/// A `[server.services.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServerService {
    /// Service type: `"tcp"` (default), `"udp"` or `"http"` (routed by host on
    /// `[server.http]`'s ports).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `IP:PORT` where visitors connect: a reverse service. Exactly one of `bind` and
    /// `target` (an http service has neither: it is served on `[server.http]`).
    pub bind: Option<String>,
    /// `HOST:PORT` the server dials for each stream: a forward service (the client binds).
    pub target: Option<String>,
    /// Token the client must prove. Default: `[server].default_token`.
    pub token: Option<String>,
    /// Forward TCP services only: `"v1"` or `"v2"`, send a PROXY protocol header with the
    /// visitor's address (at the client's `bind`) to the target. Default: none.
    pub proxy_protocol: Option<String>,
    /// UDP only: drop a visitor's session after this long without a datagram in either
    /// direction. Default `"60s"`.
    pub udp_idle_timeout: Option<RawDuration>,
    /// UDP only: most visitor sessions at once; the least recently active is evicted when
    /// full. Default 4096.
    pub udp_max_sessions: Option<i64>,
    /// The most bytes per second each way, shared by all of the service's connections
    /// (`"10MB/s"`; KB = 1000 bytes, KiB = 1024); UDP over it is dropped. Default: none.
    pub bandwidth_limit: Option<String>,
    /// TCP services: compress what this side sends into the tunnel, `"lz4"` or `"zstd"`.
    /// Default: none.
    pub compression: Option<String>,
    /// Reverse services: how visitors are spread over the clients serving the service,
    /// `"least-connections"` (default), `"round-robin"` or `"random"`.
    pub load_balance: Option<String>,
    /// HTTP only: host names (exact, or `*.suffix` for one label). Required.
    pub hosts: Option<Vec<String>>,
    /// HTTP only: path prefixes, matched segment by segment. Default `["/"]`.
    pub paths: Option<Vec<String>>,
    /// HTTP only: `"terminate"` or `"passthrough"`. Default: plain HTTP only.
    pub tls: Option<String>,
    /// HTTP only, `tls = "terminate"`: the certificate chain (PEM).
    pub cert: Option<std::path::PathBuf>,
    /// HTTP only, `tls = "terminate"`: the private key (PEM).
    pub key: Option<std::path::PathBuf>,
    /// HTTP only: the `Host` the backend sees. Default: the visitor's.
    pub host_rewrite: Option<String>,
    /// HTTP only: remove the matched path prefix before forwarding. Default `false`.
    pub strip_prefix: Option<bool>,
    /// HTTP only: `"http1"` (default) or `"h2c"`.
    pub backend: Option<String>,
    /// HTTP only: the middleware chain (`[[server.services.NAME.middleware]]`), in order.
    pub middleware: Option<Vec<super::middleware::FileMiddleware>>,
    /// HTTP only: keep recent requests for the inspector. Default `true`.
    pub capture: Option<bool>,
    /// HTTP only: keep this many first bytes of each body too (0 to 65536). Default 0.
    pub capture_body_bytes: Option<i64>,
}

impl FileServerService {
    /// Moves the http keys out (they are checked by [`super::http`]).
    pub fn take_http(&mut self) -> super::http::FileHttpService {
        super::http::FileHttpService {
            hosts: self.hosts.take(),
            paths: self.paths.take(),
            tls: self.tls.take(),
            cert: self.cert.take(),
            key: self.key.take(),
            host_rewrite: self.host_rewrite.take(),
            strip_prefix: self.strip_prefix.take(),
            backend: self.backend.take(),
            middleware: self.middleware.take(),
            capture: self.capture.take(),
            capture_body_bytes: self.capture_body_bytes.take(),
        }
    }
}

/// The `[client]` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClient {
    /// `HOST:PORT` of the server (host: name, IPv4 or `[IPv6]`). Required, unless
    /// `servers` lists them.
    pub server: Option<String>,
    /// Several servers: the client keeps a session with every one at once (high
    /// availability). Instead of `server`.
    pub servers: Option<Vec<String>>,
    /// Pre-shared key, at least 16 characters. Required unless `insecure = true`.
    pub psk: Option<String>,
    /// Token for services that set none. Optional.
    pub default_token: Option<String>,
    /// `"noise"` (default), `"quic"`, `"tls"`, `"wss"`, `"ws"` or `"tcp"` (plaintext, needs `insecure = true`).
    pub transport: Option<String>,
    /// The transports to try, in order, e.g. `["quic", "noise", "wss:443"]` (a port after
    /// the colon replaces the server address's). Instead of `transport`.
    pub transports: Option<Vec<String>>,
    /// How often a client on a later transport of its list tries the earlier ones again.
    /// Default `"30s"`.
    pub transport_retry: Option<RawDuration>,
    /// Offered ciphers, in preference order. Default as for the server.
    pub ciphers: Option<Vec<String>>,
    /// `"fastest"` (default) or `"ordered"`, as for the server.
    pub cipher_choice: Option<String>,
    /// Reconnect when the server has been silent this long. Default `"30s"`.
    pub heartbeat_timeout: Option<RawDuration>,
    /// On SIGTERM, how long streams in flight may take to finish after the servers were
    /// told to send no new visitors. Default `"30s"`.
    pub drain_timeout: Option<RawDuration>,
    /// First wait before reconnecting. Default `"1s"`.
    pub reconnect_initial_delay: Option<RawDuration>,
    /// Longest wait between reconnects; at least the initial delay. Default `"30s"`.
    pub reconnect_max_delay: Option<RawDuration>,
    /// One deadline for handshake, hello and auth. Default `"10s"`.
    pub handshake_timeout: Option<RawDuration>,
    /// As for the server. Default `false`.
    pub insecure: Option<bool>,
    /// Reach the server through a proxy: `"socks5://user:pass@host:1080"`,
    /// `"http://user:pass@host:3128"` (HTTP CONNECT) or `"env"` (`ALL_PROXY` /
    /// `HTTPS_PROXY`). Default: direct.
    pub proxy: Option<String>,
    /// Try IPv6 addresses first when a name resolves to both. Default `false`.
    pub prefer_ipv6: Option<bool>,
    /// TCP congestion control of the connections to the server, as for the server.
    /// Default `"auto"`.
    pub tcp_congestion: Option<String>,
    /// P2P services: this client's long-term identity, an Ed25519 key kept in this file
    /// (created on first start). Default: a fresh identity per connection.
    pub p2p_identity: Option<String>,
    /// `[client.quic]`: the QUIC transport's settings.
    pub quic: Option<super::quic::FileQuic>,
    /// `[client.tls]`: how `tls` and `wss` check the server.
    pub tls: Option<super::web::FileTls>,
    /// `[client.ws]`: WebSocket path and Host.
    pub ws: Option<super::web::FileWs>,
    /// `[client.services.NAME]` tables. Default: none.
    #[serde(default)]
    pub services: BTreeMap<String, FileClientService>,
}

/// A `[client.services.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientService {
    /// Service type: `"tcp"` (default), `"udp"` or `"http"` (the server routes requests
    /// to it by host; here it is dialled like `tcp`).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `HOST:PORT` of the local service to forward to (a reverse service). With `bind`:
    /// selects the server's forward service by its target.
    pub target: Option<String>,
    /// `IP:PORT` to listen on locally: a forward service (the server dials its target).
    pub bind: Option<String>,
    /// `IP:PORT` for the server to bind: a client-declared service (port 0: any allowed
    /// port). Default: the service is in the server's config.
    pub remote_bind: Option<String>,
    /// `"v1"` or `"v2"`: send a PROXY protocol header to the target. Default: none.
    pub proxy_protocol: Option<String>,
    /// Token proving the client may serve this service. Default: `[client].default_token`.
    pub token: Option<String>,
    /// UDP only: close a flow's target socket after this long without a datagram in
    /// either direction. Default `"60s"`.
    pub udp_idle_timeout: Option<RawDuration>,
    /// UDP only: most flows (target sockets) at once; the least recently active is closed
    /// when full. Default 4096.
    pub udp_max_sessions: Option<i64>,
    /// The most bytes per second each way, shared by all of the service's connections
    /// (`"10MB/s"`; KB = 1000 bytes, KiB = 1024); UDP over it is dropped. Default: none.
    pub bandwidth_limit: Option<String>,
    /// TCP services: compress what this side sends into the tunnel, `"lz4"` or `"zstd"`.
    /// Default: none.
    pub compression: Option<String>,
    /// Reverse services: this client's share of the service's visitors when several clients
    /// serve it (1 to 1000). Default 1.
    pub weight: Option<i64>,
    /// Reverse services: check the target; while it fails, the server sends this client
    /// no visitors of the service. Default: no check.
    pub health_check: Option<super::ha::FileHealthCheck>,
    /// HTTP only, a client-declared service: route `NAME.<the server's subdomain_host>`
    /// to it.
    pub subdomain: Option<String>,
    /// HTTP only, a client-declared service: route these host names (the server's
    /// `allow_hosts` must allow them) to it.
    pub hosts: Option<Vec<String>>,
    /// `true`: a peer-to-peer service, met through the server's `[server.p2p.services]`
    /// of the same name. With `target`, this client has the service; with `bind`, it is
    /// the visitors' end. Default `false`.
    pub p2p: Option<bool>,
    /// P2P only: the other end's identity (`warren p2p identity` prints it; its client sets
    /// `p2p_identity`): any other end is refused. Default: any end that proves the token.
    pub peer: Option<String>,
}

/// A duration as written: a string such as `"10s"`, or a bare number, which is kept only
/// so the typed layer can answer "write \"10s\"" instead of a serde type error.
#[derive(Debug, Clone, PartialEq)]
pub enum RawDuration {
    /// A string, parsed by [`super::duration::parse_duration`].
    Text(String),
    /// A bare integer (refused with a hint).
    Integer(i64),
    /// A bare float (refused with a hint).
    Float(f64),
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RawDurationVisitor;

        impl Visitor<'_> for RawDurationVisitor {
            type Value = RawDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"10s\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration::Text(v.to_owned()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                Ok(RawDuration::Integer(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Ok(RawDuration::Integer(i64::try_from(v).unwrap_or(i64::MAX)))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawDuration, E> {
                Ok(RawDuration::Float(v))
            }
        }

        deserializer.deserialize_any(RawDurationVisitor)
    }
}

/// The keys serde accepts for a struct, read from its derived `Deserialize` impl, so the
/// unknown-key check and the did-you-mean hints can never drift from the structs above.
pub(crate) fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut capture = FieldCapture(&[]);
    // The capture deserializer always fails after recording the field list.
    let _ = T::deserialize(&mut capture);
    capture.0
}

struct FieldCapture(&'static [&'static str]);

#[derive(Debug)]
struct CaptureDone;

impl fmt::Display for CaptureDone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field names captured")
    }
}

impl std::error::Error for CaptureDone {}

impl de::Error for CaptureDone {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        CaptureDone
    }
}

impl<'de> Deserializer<'de> for &mut FieldCapture {
    type Error = CaptureDone;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, CaptureDone> {
        Err(CaptureDone)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, CaptureDone> {
        self.0 = fields;
        Err(CaptureDone)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_follow_the_structs() {
        assert_eq!(field_names::<FileConfig>(), ["server", "client", "admin"]);
        assert!(field_names::<FileServer>().contains(&"heartbeat_interval"));
        assert!(field_names::<FileServer>().contains(&"services"));
        assert_eq!(
            field_names::<FileServerService>(),
            [
                "type",
                "bind",
                "target",
                "token",
                "proxy_protocol",
                "udp_idle_timeout",
                "udp_max_sessions",
                "bandwidth_limit",
                "compression",
                "load_balance",
                "hosts",
                "paths",
                "tls",
                "cert",
                "key",
                "host_rewrite",
                "strip_prefix",
                "backend",
                "middleware",
                "capture",
                "capture_body_bytes"
            ]
        );
        assert_eq!(
            field_names::<super::super::p2p::FileP2p>(),
            [
                "nameplate_ttl",
                "max_nameplates",
                "rate_per_minute",
                "udp_bind",
                "relay",
                "relay_max_bytes",
                "relay_rate",
                "relay_max_pairs",
                "relay_idle",
                "services"
            ]
        );
        assert_eq!(
            field_names::<FileClientService>(),
            [
                "type",
                "target",
                "bind",
                "remote_bind",
                "proxy_protocol",
                "token",
                "udp_idle_timeout",
                "udp_max_sessions",
                "bandwidth_limit",
                "compression",
                "weight",
                "health_check",
                "subdomain",
                "hosts",
                "p2p",
                "peer"
            ]
        );
    }

    #[test]
    fn whole_file_deserializes_with_plain_serde() {
        let file: FileConfig = toml::from_str(
            "[client]\nserver = \"a:1\"\nheartbeat_timeout = 30\n[client.services.web]\ntarget = \"b:2\"\n",
        )
        .expect("valid file model");
        let client = file.client.expect("client section");
        assert_eq!(client.heartbeat_timeout, Some(RawDuration::Integer(30)));
        assert_eq!(client.services["web"].target.as_deref(), Some("b:2"));
        assert!(toml::from_str::<FileConfig>("[client]\nbogus = 1\n").is_err());
    }
}
