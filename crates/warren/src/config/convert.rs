//! File model -> typed config (`TryFrom`), reporting every bad value at once.
//!
//! Each field is converted on its own. A field that fails is reported, replaced by a
//! harmless placeholder and its key poisoned, so conversion carries on, the semantic
//! rules (`check()`) still run on everything else, and no rule fires again on the
//! placeholder. Positions are added later by the loader from the key paths.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use warren_proto::cipher::UnknownChoice;
use warren_proto::{CipherChoice, CipherSuite};

use super::Config;
use super::duration::{format_duration, parse_duration};
use super::error::{ConfigError, ConfigErrors, Report, join_index, join_key};
use super::file::{
    FileAdmin, FileClient, FileClientService, FileConfig, FileServer, FileServerService,
    RawDuration,
};
use super::ha;
use super::proxy::{PortRange, ProxySetting};
use super::quic::{self, FileQuic, QuicConfig, Side as QuicSide};
use super::suggest::did_you_mean;
use super::typed::{
    AdminConfig, ClientConfig, ClientForward, ClientP2p, ClientService, DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_RECONNECT_INITIAL_DELAY, DEFAULT_RECONNECT_MAX_DELAY, DEFAULT_TRANSPORT_RETRY,
    DEFAULT_UDP_IDLE_TIMEOUT, DEFAULT_UDP_MAX_SESSIONS, HostPort, HostPortError, MAX_TRANSPORTS,
    P2pEnd, ProxyProtocol, ServerConfig, ServerForward, ServerService, ServiceKind, Transport,
    TransportEntry, TransportEntryError, UdpSettings, has_aes_hardware, service_key,
};
use super::web;
use crate::crypto::secret::Secret;
use crate::transport::compress::Codec;
use crate::transport::congestion::TcpCongestion;

impl TryFrom<FileConfig> for Config {
    type Error = ConfigErrors;

    fn try_from(file: FileConfig) -> Result<Self, Self::Error> {
        let mut report = Report::default();
        let config = convert_config(file, &mut report);
        report.into_result(None)?;
        config.ok_or_else(unreachable_empty)
    }
}

impl TryFrom<FileServer> for ServerConfig {
    type Error = ConfigErrors;

    fn try_from(file: FileServer) -> Result<Self, Self::Error> {
        let mut report = Report::default();
        let config = convert_server(file, &mut report);
        report.into_result(None).map(|()| config)
    }
}

impl TryFrom<FileClient> for ClientConfig {
    type Error = ConfigErrors;

    fn try_from(file: FileClient) -> Result<Self, Self::Error> {
        let mut report = Report::default();
        let config = convert_client(file, &mut report);
        report.into_result(None).map(|()| config)
    }
}

/// `convert_config` returns `None` only after reporting why; this keeps that promise
/// from turning into a panic if it is ever broken.
fn unreachable_empty() -> ConfigErrors {
    ConfigErrors::Invalid {
        source_name: None,
        errors: vec![ConfigError::new("", "the config is invalid")],
    }
}

/// Converts a whole file; `None` (with errors in `report`) unless it has exactly one side.
pub(crate) fn convert_config(file: FileConfig, report: &mut Report) -> Option<Config> {
    let admin = file.admin.and_then(|admin| convert_admin(admin, report));
    match (file.server, file.client) {
        (Some(server), None) => {
            let mut server = convert_server(server, report);
            if let Some(admin) = admin {
                report.extend_checked(admin.check(server.insecure));
                server.admin = Some(admin);
            }
            Some(Config::Server(server))
        }
        (None, Some(client)) => {
            let mut client = convert_client(client, report);
            if let Some(admin) = admin {
                report.extend_checked(admin.check(client.insecure));
                client.admin = Some(admin);
            }
            Some(Config::Client(client))
        }
        (Some(server), Some(client)) => {
            report.push(
                ConfigError::new("client", "the file has both a [server] and a [client] section")
                    .with_hint("one warren process is either a server or a client: put each section in its own file"),
            );
            // Still convert both, so their own mistakes show up in the same run.
            convert_server(server, report);
            convert_client(client, report);
            None
        }
        (None, None) => {
            if !report.is_poisoned("server") && !report.is_poisoned("client") {
                report.push(
                    ConfigError::new("", "the file has neither a [server] nor a [client] section")
                        .with_hint("start from examples/server.toml or examples/client.toml"),
                );
            }
            None
        }
    }
}

/// Converts `[admin]` (its rules are checked with the side's `insecure`).
fn convert_admin(file: FileAdmin, report: &mut Report) -> Option<AdminConfig> {
    let bind = match &file.bind {
        Some(text) => socket_addr(report, "admin.bind", text)?,
        None => {
            missing(
                report,
                "admin.bind",
                "where the admin API listens, e.g. bind = \"127.0.0.1:7001\"",
            );
            return None;
        }
    };
    Some(AdminConfig {
        bind,
        token: file.token.map(Secret::new),
        hosts: file
            .hosts
            .unwrap_or_default()
            .into_iter()
            .map(|host| host.trim().to_ascii_lowercase())
            .collect(),
    })
}

/// Converts `[server]`, then checks the semantic rules on the result.
pub(crate) fn convert_server(file: FileServer, report: &mut Report) -> ServerConfig {
    let side = "server";
    // A broken `insecure` must not add "too short" or "plaintext" errors on top.
    let insecure = file.insecure.unwrap_or(false) || report.is_poisoned("server.insecure");
    let bind = match &file.bind {
        Some(text) => socket_addr(report, "server.bind", text),
        None => {
            missing(
                report,
                "server.bind",
                "the address clients connect to, e.g. bind = \"0.0.0.0:7000\"",
            );
            None
        }
    }
    .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let psk = Secret::new(file.psk.unwrap_or_default());
    let default_token = file.default_token.map(Secret::new);
    let mut config = ServerConfig::new(bind, psk);
    (config.transport, config.transports) =
        transports(report, side, file.transport.as_deref(), file.transports);
    let uses_quic = config.uses_transport(Transport::Quic);
    config.quic = quic_table(report, side, uses_quic, file.quic, QuicSide::Server);
    config.tls = web::server_tls(report, file.tls);
    config.ws = web::ws(report, side, file.ws);
    config.ciphers = ciphers(report, side, file.ciphers.as_deref());
    config.cipher_choice = cipher_choice(report, side, file.cipher_choice.as_deref());
    config.heartbeat_interval = duration(
        report,
        "server.heartbeat_interval",
        file.heartbeat_interval.as_ref(),
        DEFAULT_HEARTBEAT_INTERVAL,
    );
    config.drain_timeout = duration(
        report,
        "server.drain_timeout",
        file.drain_timeout.as_ref(),
        DEFAULT_DRAIN_TIMEOUT,
    );
    config.drain_grace = duration(
        report,
        "server.drain_grace",
        file.drain_grace.as_ref(),
        std::time::Duration::ZERO,
    );
    config.tcp_congestion = tcp_congestion(report, side, file.tcp_congestion.as_deref());
    config.handshake_timeout = duration(
        report,
        "server.handshake_timeout",
        file.handshake_timeout.as_ref(),
        DEFAULT_HANDSHAKE_TIMEOUT,
    );
    config.insecure = insecure;
    if let Some(text) = &file.allow_ports {
        match text.parse::<PortRange>() {
            Ok(range) => config.allow_ports = Some(range),
            Err(error) => report.fail(
                ConfigError::new(
                    "server.allow_ports",
                    format!("invalid allow_ports: {error}"),
                )
                .with_hint("write a range such as \"20000-29999\""),
            ),
        }
    }
    for (i, text) in file.allow_bind_addrs.iter().flatten().enumerate() {
        match text.trim().parse::<IpAddr>() {
            Ok(ip) => config.allow_bind_addrs.push(ip),
            Err(_) => report.fail(
                ConfigError::new(
                    join_index("server.allow_bind_addrs", i),
                    format!("{text:?} is not an IP address"),
                )
                .with_hint("write IPs without ports: \"0.0.0.0\", \"127.0.0.1\", \"::\""),
            ),
        }
    }
    config.http = super::http::convert_listen(report, file.http);
    config.p2p = super::p2p::convert(
        report,
        file.p2p,
        config.bind,
        config.quic_bind() == Some(config.bind),
        default_token.as_ref(),
    );
    let (services, forwards) = server_services(
        report,
        file.services,
        default_token.as_ref(),
        config.http.as_ref(),
    );
    config.services = services;
    config.forwards = forwards;
    config.default_token = default_token;
    if uses_quic {
        let compressed = config.services.values().map(|s| (&s.name, s.compression));
        let forwards = config.forwards.values().map(|f| (&f.name, f.compression));
        compression_needs_records(report, side, compressed.chain(forwards));
    }
    report.extend_checked(config.check());
    config
}

type ServerServices = (
    BTreeMap<String, ServerService>,
    BTreeMap<String, ServerForward>,
);

fn server_services(
    report: &mut Report,
    services: BTreeMap<String, FileServerService>,
    default_token: Option<&Secret>,
    http: Option<&super::http::HttpListen>,
) -> ServerServices {
    let mut out = BTreeMap::new();
    let mut forwards = BTreeMap::new();
    for (name, mut service) in services {
        let key = service_key("server", &name);
        let kind = service_kind(report, &key, service.kind.as_deref());
        let kind = udp_settings(
            report,
            &key,
            kind,
            service.udp_idle_timeout.as_ref(),
            service.udp_max_sessions,
        );
        let http_keys = service.take_http();
        if kind == ServiceKind::Http {
            if let Some(service) =
                http_service(report, &key, &name, service, http_keys, default_token, http)
            {
                out.insert(name, service);
            }
            continue;
        }
        if let Some(first) = http_keys.set_keys().first()
            && !report.is_poisoned(&join_key(&key, "type"))
        {
            report.fail(
                ConfigError::new(
                    join_key(&key, first),
                    format!("`{first}` only applies to http services, and this one is {kind}"),
                )
                .with_hint("add type = \"http\", or remove it"),
            );
        }
        let bind_key = join_key(&key, "bind");
        let proxy_protocol = proxy_protocol(report, &key, service.proxy_protocol.as_deref());
        let bandwidth_limit = bandwidth_limit(report, &key, service.bandwidth_limit.as_deref());
        let compression = compression(report, &key, kind, service.compression.as_deref());
        let load_balance = ha::load_balance(report, &key, service.load_balance.as_deref());
        if let (None, Some(text)) = (&service.bind, &service.target) {
            if service.load_balance.is_some() {
                report.fail(
                    ConfigError::new(join_key(&key, "load_balance"), "`load_balance` spreads the visitors of a reverse service (with `bind`) over its clients; a forward service has none to spread")
                        .with_hint("remove it"),
                );
            }
            let target = host_port(report, &join_key(&key, "target"), text);
            let token = token(report, "server", &name, service.token, default_token);
            let target = target.unwrap_or_else(|| HostPort {
                host: "placeholder.invalid".to_owned(),
                port: 1,
            });
            forwards.insert(
                name.clone(),
                ServerForward {
                    name,
                    kind,
                    target,
                    token,
                    proxy_protocol,
                    bandwidth_limit,
                    compression,
                },
            );
            continue;
        }
        if service.proxy_protocol.is_some() {
            report.fail(
                ConfigError::new(
                    join_key(&key, "proxy_protocol"),
                    "`proxy_protocol` on the server is for forward services (with `target`); for a reverse service the client writes the header",
                )
                .with_hint("remove it here and set proxy_protocol on the client's service instead"),
            );
        }
        if service.bind.is_some() && service.target.is_some() {
            report.fail(
                ConfigError::new(&key, "a service has `bind` (reverse: the server listens) or `target` (forward: the server dials), not both")
                    .with_hint("keep `bind` to expose a client's service here; keep `target` to let clients reach that address through the server"),
            );
        }
        let bind = match &service.bind {
            Some(text) => socket_addr(report, &bind_key, text),
            None => {
                missing(
                    report,
                    &bind_key,
                    "where visitors connect, e.g. bind = \"0.0.0.0:8080\" (or target = \"10.0.0.5:80\" for a forward service)",
                );
                None
            }
        };
        let token = token(report, "server", &name, service.token, default_token);
        // Port 0 as placeholder: the duplicate-port rule skips port 0.
        let bind = bind.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        out.insert(
            name.clone(),
            ServerService {
                name,
                kind,
                bind,
                token,
                load_balance,
                http: None,
                bandwidth_limit,
                compression,
            },
        );
    }
    (out, forwards)
}

/// A `p2p = true` service's end: the exit with `target`, the entrance with `bind`; the
/// keys of server tunnels are refused with the reason.
fn p2p_end(
    report: &mut Report,
    key: &str,
    kind: ServiceKind,
    service: &FileClientService,
) -> Option<P2pEnd> {
    if kind == ServiceKind::Http {
        report.fail(
            ConfigError::new(
                join_key(key, "type"),
                "a P2P service carries tcp or udp, not http",
            )
            .with_hint("write type = \"tcp\" (HTTP goes through it as TCP), or remove p2p"),
        );
        return None;
    }
    let why = "P2P services go between two clients, not through the server's ports";
    for (set, field) in [
        (service.remote_bind.is_some(), "remote_bind"),
        (service.proxy_protocol.is_some(), "proxy_protocol"),
        (service.weight.is_some(), "weight"),
        (service.health_check.is_some(), "health_check"),
        (service.subdomain.is_some(), "subdomain"),
        (service.hosts.is_some(), "hosts"),
    ] {
        if set {
            report.fail(
                ConfigError::new(
                    join_key(key, field),
                    format!("`{field}` does not apply to a P2P service: {why}"),
                )
                .with_hint("remove it, or remove p2p = true"),
            );
        }
    }
    match (&service.target, &service.bind) {
        (Some(_), Some(_)) => {
            report.fail(
                ConfigError::new(key.to_owned(), "a P2P service has `target` (this client has the service) or `bind` (this client is the visitors' end), not both")
                    .with_hint("keep target on the side that has the service and bind on the other side's config"),
            );
            None
        }
        (Some(text), None) => {
            host_port(report, &join_key(key, "target"), text).map(|target| P2pEnd::Exit { target })
        }
        (None, Some(text)) => {
            socket_addr(report, &join_key(key, "bind"), text).map(|bind| P2pEnd::Entrance { bind })
        }
        (None, None) => {
            missing(
                report,
                &join_key(key, "target"),
                "the local service, e.g. target = \"127.0.0.1:22\" (or, on the visitors' side, bind = \"127.0.0.1:6000\")",
            );
            None
        }
    }
}

/// An http service: routed on `[server.http]`'s ports, so it has no `bind` or `target`.
fn http_service(
    report: &mut Report,
    key: &str,
    name: &str,
    service: FileServerService,
    http_keys: super::http::FileHttpService,
    default_token: Option<&Secret>,
    http: Option<&super::http::HttpListen>,
) -> Option<ServerService> {
    for (set, leaf) in [
        (service.bind.is_some(), "bind"),
        (service.target.is_some(), "target"),
        (service.proxy_protocol.is_some(), "proxy_protocol"),
    ] {
        if set {
            report.fail(
                ConfigError::new(join_key(key, leaf), format!("an http service takes no `{leaf}`: visitors reach it on [server.http]'s ports by host name"))
                    .with_hint("remove it; set the ports in [server.http] and the names in `hosts`"),
            );
        }
    }
    if service.compression.is_some() {
        report.fail(
            ConfigError::new(join_key(key, "compression"), "`compression` on the server applies to tcp services; an http service's responses are sent as its backend makes them")
                .with_hint("set compression on the client's service (it compresses what the target sends back), or remove it"),
        );
    }
    if service.bandwidth_limit.is_some() {
        report.fail(
            ConfigError::new(join_key(key, "bandwidth_limit"), "`bandwidth_limit` on the server applies to tcp and udp services; an http service's requests are limited by its middleware")
                .with_hint("set bandwidth_limit on the client's service (it limits the bytes to and from the target), or use a rate_limit middleware here"),
        );
    }
    let Some(listen) = http else {
        report.fail(
            ConfigError::new(key, "an http service needs the server's shared HTTP port").with_hint(
                "add [server.http] with bind = \"0.0.0.0:80\" (and/or tls_bind = \"0.0.0.0:443\")",
            ),
        );
        return None;
    };
    let route = super::http::convert_route(report, key, http_keys);
    let load_balance = ha::load_balance(report, key, service.load_balance.as_deref());
    let token = token(report, "server", name, service.token, default_token);
    let bind = listen
        .bind
        .or(listen.tls_bind)
        .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    Some(ServerService {
        name: name.to_owned(),
        kind: ServiceKind::Http,
        bind,
        token,
        load_balance,
        http: Some(Box::new(route)),
        bandwidth_limit: None,
        compression: None,
    })
}

/// Converts `[client]`, then checks the semantic rules on the result.
pub(crate) fn convert_client(file: FileClient, report: &mut Report) -> ClientConfig {
    let side = "client";
    let insecure = file.insecure.unwrap_or(false) || report.is_poisoned("client.insecure");
    let placeholder = || HostPort {
        host: "placeholder.invalid".to_owned(),
        port: 1,
    };
    let (server, more_servers) = match (&file.server, &file.servers) {
        (Some(text), None) => (host_port(report, "client.server", text), Vec::new()),
        (None, Some(list)) if !list.is_empty() => {
            let mut parsed = list.iter().enumerate().map(|(i, text)| {
                host_port(report, &join_index("client.servers", i), text)
                    .unwrap_or_else(placeholder)
            });
            let first = parsed.next();
            (first, parsed.collect())
        }
        (Some(_), Some(_)) => {
            report.fail(
                ConfigError::new("client.servers", "both `server` and `servers` are set")
                    .with_hint("list every server in `servers` and remove `server`"),
            );
            (None, Vec::new())
        }
        (None, _) => {
            missing(
                report,
                "client.server",
                "the server's address, e.g. server = \"example.com:7000\" (or servers = [\"a.example.com:7000\", \"b.example.com:7000\"])",
            );
            (None, Vec::new())
        }
    };
    let server = server.unwrap_or_else(placeholder);
    let psk = Secret::new(file.psk.unwrap_or_default());
    let default_token = file.default_token.map(Secret::new);
    let mut config = ClientConfig::new(server, psk);
    config.more_servers = more_servers;
    (config.transport, config.transports) =
        transports(report, side, file.transport.as_deref(), file.transports);
    let list = config.transport_list();
    let uses_quic = config.uses_transport(Transport::Quic);
    config.quic = quic_table(report, side, uses_quic, file.quic, QuicSide::Client);
    let uses_tls = list.iter().any(|e| e.transport.uses_tls());
    config.tls = web::client_tls(report, uses_tls, file.tls);
    if file.ws.is_some() && !list.iter().any(|e| e.transport.uses_websocket()) {
        report.fail(
            ConfigError::new(
                "client.ws",
                "[client.ws] is set but no transport is \"ws\" or \"wss\"",
            )
            .with_hint("add \"ws\" or \"wss\" to the transports, or remove the table"),
        );
    }
    config.transport_retry = duration(
        report,
        "client.transport_retry",
        file.transport_retry.as_ref(),
        DEFAULT_TRANSPORT_RETRY,
    );
    config.ws = web::ws(report, side, file.ws);
    config.ciphers = ciphers(report, side, file.ciphers.as_deref());
    config.cipher_choice = cipher_choice(report, side, file.cipher_choice.as_deref());
    config.heartbeat_timeout = duration(
        report,
        "client.heartbeat_timeout",
        file.heartbeat_timeout.as_ref(),
        DEFAULT_HEARTBEAT_TIMEOUT,
    );
    config.drain_timeout = duration(
        report,
        "client.drain_timeout",
        file.drain_timeout.as_ref(),
        DEFAULT_DRAIN_TIMEOUT,
    );
    config.reconnect_initial_delay = duration(
        report,
        "client.reconnect_initial_delay",
        file.reconnect_initial_delay.as_ref(),
        DEFAULT_RECONNECT_INITIAL_DELAY,
    );
    if report.is_poisoned("client.reconnect_initial_delay") {
        // Its placeholder says nothing about whether the max delay is long enough.
        report.poison("client.reconnect_max_delay");
    }
    config.reconnect_max_delay = duration(
        report,
        "client.reconnect_max_delay",
        file.reconnect_max_delay.as_ref(),
        DEFAULT_RECONNECT_MAX_DELAY,
    );
    config.handshake_timeout = duration(
        report,
        "client.handshake_timeout",
        file.handshake_timeout.as_ref(),
        DEFAULT_HANDSHAKE_TIMEOUT,
    );
    config.insecure = insecure;
    config.prefer_ipv6 = file.prefer_ipv6.unwrap_or(false);
    config.tcp_congestion = tcp_congestion(report, side, file.tcp_congestion.as_deref());
    config.p2p_identity = file.p2p_identity.map(std::path::PathBuf::from);
    if let Some(text) = &file.proxy {
        match text.parse::<ProxySetting>() {
            Ok(proxy) => config.proxy = Some(proxy),
            Err(error) => report.fail(
                ConfigError::new("client.proxy", format!("invalid proxy: {error}")).with_hint(
                    "write \"socks5://user:pass@HOST:1080\", \"http://HOST:3128\" or \"env\"",
                ),
            ),
        }
    }
    if config.proxy.is_some() && uses_quic {
        report.fail(
            ConfigError::new(
                "client.proxy",
                "a proxy carries TCP; transport \"quic\" runs over UDP",
            )
            .with_hint("use transport = \"noise\" (or \"wss\") through the proxy, or remove proxy"),
        );
    }
    let (services, forwards, p2p) = client_services(report, file.services, default_token.as_ref());
    config.services = services;
    config.forwards = forwards;
    config.p2p = p2p;
    config.default_token = default_token;
    if uses_quic {
        let compressed = config.services.values().map(|s| (&s.name, s.compression));
        let forwards = config.forwards.values().map(|f| (&f.name, f.compression));
        compression_needs_records(report, side, compressed.chain(forwards));
    }
    report.extend_checked(config.check());
    config
}

type ClientServices = (
    BTreeMap<String, ClientService>,
    BTreeMap<String, ClientForward>,
    BTreeMap<String, ClientP2p>,
);

fn client_services(
    report: &mut Report,
    services: BTreeMap<String, FileClientService>,
    default_token: Option<&Secret>,
) -> ClientServices {
    let mut out = BTreeMap::new();
    let mut forwards = BTreeMap::new();
    let mut p2p = BTreeMap::new();
    for (name, service) in services {
        let key = service_key("client", &name);
        let kind = service_kind(report, &key, service.kind.as_deref());
        let kind = udp_settings(
            report,
            &key,
            kind,
            service.udp_idle_timeout.as_ref(),
            service.udp_max_sessions,
        );
        let bandwidth_limit = bandwidth_limit(report, &key, service.bandwidth_limit.as_deref());
        let compression = compression(report, &key, kind, service.compression.as_deref());
        if service.p2p == Some(true) {
            if compression.is_some() {
                report.fail(
                    ConfigError::new(join_key(&key, "compression"), "P2P services go over QUIC, which sends stream bytes as they are; compression is not supported there yet")
                        .with_hint("remove compression"),
                );
            }
            let token = token(
                report,
                "client",
                &name,
                service.token.clone(),
                default_token,
            );
            let peer = service.peer.as_deref().and_then(|text| {
                crate::transport::quic::certs::parse_sha256_pin(text)
                    .map_err(|_| {
                        report.fail(
                            ConfigError::new(join_key(&key, "peer"), format!("{text:?} is not a P2P identity"))
                                .with_hint("give the other end's 64 hex digits, as `warren p2p identity FILE` prints them on its machine"),
                        );
                    })
                    .ok()
            });
            if let Some(end) = p2p_end(report, &key, kind, &service) {
                p2p.insert(
                    name.clone(),
                    ClientP2p {
                        name,
                        kind,
                        end,
                        token,
                        peer,
                        bandwidth_limit,
                    },
                );
            }
            continue;
        }
        if service.peer.is_some() {
            report.fail(
                ConfigError::new(
                    join_key(&key, "peer"),
                    "`peer` pins the other end of a P2P service; this one is not",
                )
                .with_hint("add p2p = true, or remove peer"),
            );
        }
        let proxy_protocol = proxy_protocol(report, &key, service.proxy_protocol.as_deref());
        if kind == ServiceKind::Http {
            for (set, field, why) in [
                (
                    service.bind.is_some(),
                    "bind",
                    "visitors of an http service come through the server's HTTP port",
                ),
                (
                    service.remote_bind.is_some(),
                    "remote_bind",
                    "client-declared http services are not supported yet",
                ),
            ] {
                if set {
                    report.fail(
                        ConfigError::new(join_key(&key, field), format!("an http service takes no `{field}`: {why}"))
                            .with_hint("remove it; list the service with type = \"http\" and its hosts in the server's config"),
                    );
                }
            }
        }
        if let Some(text) = &service.bind {
            let bind = socket_addr(report, &join_key(&key, "bind"), text)
                .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
            let target = service
                .target
                .as_deref()
                .and_then(|text| host_port(report, &join_key(&key, "target"), text));
            for (set, field) in [
                (service.remote_bind.is_some(), "remote_bind"),
                (service.proxy_protocol.is_some(), "proxy_protocol"),
                (service.weight.is_some(), "weight"),
                (service.health_check.is_some(), "health_check"),
            ] {
                if set {
                    report.fail(
                        ConfigError::new(join_key(&key, field), format!("`{field}` is for reverse services; this one has `bind`, so it is a forward service"))
                            .with_hint("remove it, or remove `bind` to make a reverse service"),
                    );
                }
            }
            let token = token(report, "client", &name, service.token, default_token);
            forwards.insert(
                name.clone(),
                ClientForward {
                    name,
                    kind,
                    bind,
                    target,
                    token,
                    bandwidth_limit,
                    compression,
                },
            );
            continue;
        }
        let remote_bind = service.remote_bind.as_deref().and_then(|text| {
            match text.trim().parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    report.fail(
                        ConfigError::new(
                            join_key(&key, "remote_bind"),
                            format!("invalid remote_bind {text:?}: not an IP:PORT"),
                        )
                        .with_hint(
                            "write \"0.0.0.0:0\" for any allowed port, or \"0.0.0.0:20001\"",
                        ),
                    );
                    None
                }
            }
        });
        let target_key = join_key(&key, "target");
        let target = match &service.target {
            Some(text) => host_port(report, &target_key, text),
            None => {
                missing(
                    report,
                    &target_key,
                    "the local service to forward to, e.g. target = \"127.0.0.1:3000\" (or bind = \"127.0.0.1:5000\" for a forward service)",
                );
                None
            }
        }
        .unwrap_or_else(|| HostPort {
            host: "placeholder.invalid".to_owned(),
            port: 1,
        });
        let token = token(report, "client", &name, service.token, default_token);
        let weight = ha::weight(report, &key, service.weight);
        let health_check = ha::health_check(report, &key, service.health_check);
        let http_claim = http_claim(report, &key, kind, service.subdomain, service.hosts);
        out.insert(
            name.clone(),
            ClientService {
                name,
                kind,
                target,
                token,
                remote_bind,
                proxy_protocol,
                weight,
                health_check,
                http_claim,
                bandwidth_limit,
                compression,
            },
        );
    }
    (out, forwards, p2p)
}

/// A client http service's `subdomain` / `hosts`: a declared http service.
fn http_claim(
    report: &mut Report,
    key: &str,
    kind: ServiceKind,
    subdomain: Option<String>,
    hosts: Option<Vec<String>>,
) -> Option<super::http::HttpClaim> {
    if subdomain.is_none() && hosts.is_none() {
        return None;
    }
    if kind != ServiceKind::Http {
        let leaf = if subdomain.is_some() {
            "subdomain"
        } else {
            "hosts"
        };
        report.fail(
            ConfigError::new(
                join_key(key, leaf),
                format!("`{leaf}` only applies to http services, and this one is {kind}"),
            )
            .with_hint("add type = \"http\", or remove it"),
        );
        return None;
    }
    let subdomain = subdomain.map(|s| s.trim().to_ascii_lowercase());
    if let Some(label) = &subdomain
        && !super::http::is_dns_label(label)
    {
        report.fail(
            ConfigError::new(
                join_key(key, "subdomain"),
                format!("{label:?} is not one DNS label"),
            )
            .with_hint("letters, digits and inner hyphens, at most 63: e.g. subdomain = \"app\""),
        );
    }
    let mut names = Vec::new();
    for (i, text) in hosts.iter().flatten().enumerate() {
        match crate::http::route::HostPattern::parse(text) {
            Ok(crate::http::route::HostPattern::Exact(name)) => names.push(name),
            Ok(_) => report.fail(
                ConfigError::new(
                    format!("{key}.hosts[{i}]"),
                    "a client declares exact host names, not wildcards",
                )
                .with_hint("list each name, e.g. hosts = [\"app.example.com\"]"),
            ),
            Err(error) => report.fail(ConfigError::new(format!("{key}.hosts[{i}]"), error)),
        }
    }
    if names.len() > super::http::MAX_CLAIMED_HOSTS {
        report.fail(
            ConfigError::new(
                join_key(key, "hosts"),
                format!(
                    "{} names; a service may declare at most {}",
                    names.len(),
                    super::http::MAX_CLAIMED_HOSTS
                ),
            )
            .with_hint("split them over several services"),
        );
    }
    Some(super::http::HttpClaim {
        subdomain,
        hosts: names,
    })
}

/// Parses a service's `bandwidth_limit` (`"10MB/s"`, `"512KiB"`): bytes per second.
fn bandwidth_limit(report: &mut Report, key: &str, text: Option<&str>) -> Option<u64> {
    let text = text?;
    let trimmed = text.trim();
    // "Mbps" is refused (parse_size reads "Mb" as megabytes, and "bps" suggests bits).
    let amount = trimmed.strip_suffix("/s").unwrap_or(trimmed);
    match super::middleware::parse_size(amount) {
        Some(0) => {
            report.fail(
                ConfigError::new(
                    join_key(key, "bandwidth_limit"),
                    "a zero bandwidth limit would stop every byte",
                )
                .with_hint(
                    "remove bandwidth_limit for no limit, or give a rate such as \"10MB/s\"",
                ),
            );
            None
        }
        Some(rate) => Some(rate),
        None => {
            report.fail(
                ConfigError::new(
                    join_key(key, "bandwidth_limit"),
                    format!("{text:?} is not a rate in bytes per second"),
                )
                .with_hint("write a size per second, such as \"10MB/s\" or \"512KiB/s\" (KB = 1000 bytes, KiB = 1024; bits are not accepted)"),
            );
            None
        }
    }
}

/// Parses a service's `compression` (`"lz4"`, `"zstd"`); only tcp services (and http
/// ones, whose streams are TCP) compress.
fn compression(
    report: &mut Report,
    key: &str,
    kind: ServiceKind,
    text: Option<&str>,
) -> Option<Codec> {
    let text = text?;
    if let ServiceKind::Udp(_) = kind {
        report.fail(
            ConfigError::new(
                join_key(key, "compression"),
                "`compression` applies to tcp services; datagrams are sent as they are",
            )
            .with_hint("remove it (most UDP payloads, such as media or DNS, do not compress)"),
        );
        return None;
    }
    let wanted = text.trim().to_ascii_lowercase();
    match Codec::ALL.into_iter().find(|codec| codec.name() == wanted) {
        Some(codec) => Some(codec),
        None => {
            report.fail(
                ConfigError::new(
                    join_key(key, "compression"),
                    format!("unknown compression {text:?}"),
                )
                .with_hint("write \"lz4\" (fast) or \"zstd\" (smaller), or remove it"),
            );
            None
        }
    }
}

/// Refuses `compression` on a QUIC side: its streams carry bytes, not records.
fn compression_needs_records<'a>(
    report: &mut Report,
    side: &str,
    services: impl Iterator<Item = (&'a String, Option<Codec>)>,
) {
    for (name, codec) in services {
        if codec.is_some() {
            report.fail(
                ConfigError::new(join_key(&service_key(side, name), "compression"), "compression works on the TCP transports (noise, tls, wss, ws, tcp); QUIC streams are sent as they are")
                    .with_hint("remove compression, or use transport = \"noise\""),
            );
        }
    }
}

/// Parses a service's `proxy_protocol` (`"v1"`, `"v2"`).
fn proxy_protocol(report: &mut Report, key: &str, text: Option<&str>) -> Option<ProxyProtocol> {
    let text = text?;
    match text.trim().to_ascii_lowercase().as_str() {
        "v1" | "1" => Some(ProxyProtocol::V1),
        "v2" | "2" => Some(ProxyProtocol::V2),
        _ => {
            report.fail(
                ConfigError::new(
                    join_key(key, "proxy_protocol"),
                    format!("unknown proxy_protocol {text:?}"),
                )
                .with_hint("write \"v1\" or \"v2\", or remove the key"),
            );
            None
        }
    }
}

/// Reports a required key that is absent (unless it failed earlier and was removed).
fn missing(report: &mut Report, key: &str, what: &str) {
    if !report.is_poisoned(key) {
        let leaf = key.rsplit('.').next().unwrap_or(key);
        report.fail(
            ConfigError::new(key, format!("missing `{leaf}`")).with_hint(format!("add {what}")),
        );
    }
}

/// The service's own token, else the default one, else an error at the service.
fn token(
    report: &mut Report,
    side: &str,
    name: &str,
    own: Option<String>,
    default_token: Option<&Secret>,
) -> Secret {
    let key = join_key(&service_key(side, name), "token");
    match (own, default_token) {
        (Some(token), _) => Secret::new(token),
        (None, Some(default)) => default.clone(),
        (None, None) => {
            let default_key = join_key(side, "default_token");
            if !report.is_poisoned(&key) && !report.is_poisoned(&default_key) {
                report.fail(
                    ConfigError::new(&key, format!("service `{name}` has no token and [{side}] has no default_token"))
                        .with_hint(format!(
                            "add token = \"${{WARREN_TOKEN}}\" to [{side}.services.{name}], or set default_token in [{side}]"
                        )),
                );
            }
            report.poison(&key);
            Secret::default()
        }
    }
}

pub(super) fn socket_addr(report: &mut Report, key: &str, text: &str) -> Option<SocketAddr> {
    match text.trim().parse::<SocketAddr>() {
        Ok(addr) if addr.port() == 0 => {
            report.fail(
                ConfigError::new(
                    key,
                    format!("port 0 in {text:?} would listen on a random port"),
                )
                .with_hint(format!(
                    "write the port to listen on, e.g. \"{}:8080\"",
                    show_ip(addr.ip())
                )),
            );
            None
        }
        Ok(addr) => Some(addr),
        Err(_) => {
            let (reason, hint) = match text.trim().parse::<HostPort>() {
                Ok(host_port) => (
                    "the host must be an IP address".to_owned(),
                    format!(
                        "listen on an IP: \"0.0.0.0:{port}\" for every interface, \"127.0.0.1:{port}\" for this machine only",
                        port = host_port.port
                    ),
                ),
                Err(HostPortError::MissingPort) if text.trim().parse::<IpAddr>().is_ok() => (
                    "missing port".to_owned(),
                    format!(
                        "add a port: \"{}:8080\"",
                        show_ip(
                            text.trim()
                                .parse::<IpAddr>()
                                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
                        )
                    ),
                ),
                Err(HostPortError::UnbracketedIpv6) => (
                    "IPv6 addresses need brackets".to_owned(),
                    "write it as \"[::]:8080\" or \"[2001:db8::1]:8080\"".to_owned(),
                ),
                Err(error) => (
                    error.to_string(),
                    "write it as IP:PORT, e.g. \"0.0.0.0:8080\" or \"[::]:8080\"".to_owned(),
                ),
            };
            report.fail(
                ConfigError::new(key, format!("invalid socket address {text:?}: {reason}"))
                    .with_hint(hint),
            );
            None
        }
    }
}

/// An IP as it appears before `:PORT` (IPv6 in brackets).
fn show_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn host_port(report: &mut Report, key: &str, text: &str) -> Option<HostPort> {
    match text.parse::<HostPort>() {
        Ok(host_port) => Some(host_port),
        Err(error) => {
            let hint = match &error {
                HostPortError::MissingPort => format!("add the port: \"{}:7000\"", text.trim()),
                HostPortError::UnbracketedIpv6 => "put IPv6 addresses in brackets: \"[2001:db8::1]:7000\"".to_owned(),
                HostPortError::Url => "drop the scheme and path: \"example.com:443\"".to_owned(),
                _ => "write it as HOST:PORT, e.g. \"example.com:7000\", \"192.0.2.1:7000\" or \"[2001:db8::1]:7000\"".to_owned(),
            };
            report.fail(
                ConfigError::new(key, format!("invalid address {text:?}: {error}")).with_hint(hint),
            );
            None
        }
    }
}

pub(super) fn duration(
    report: &mut Report,
    key: &str,
    raw: Option<&RawDuration>,
    default: Duration,
) -> Duration {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let (message, hint) = match raw {
        None => return default,
        Some(RawDuration::Text(text)) => match parse_duration(text) {
            Ok(duration) => return duration,
            Err(error) => (error.to_string(), error.hint()),
        },
        Some(RawDuration::Integer(number)) => (
            format!("a bare number ({number}) has no unit"),
            format!("write {leaf} = \"{number}s\" (or \"{number}ms\", \"{number}m\")"),
        ),
        Some(RawDuration::Float(number)) => (
            format!("a bare number ({number}) has no unit"),
            format!(
                "write a string with a unit, e.g. {leaf} = \"{}\"",
                format_duration(default)
            ),
        ),
    };
    report.fail(ConfigError::new(key, message).with_hint(hint));
    default
}

/// The `quic` table of a side; set while the transport is not QUIC it is a mistake worth
/// naming.
fn quic_table(
    report: &mut Report,
    side: &str,
    uses_quic: bool,
    file: Option<FileQuic>,
    which: QuicSide,
) -> QuicConfig {
    if file.is_some() && !uses_quic {
        report.fail(
            ConfigError::new(
                join_key(side, "quic"),
                format!("[{side}.quic] is set but no transport is \"quic\""),
            )
            .with_hint("set transport = \"quic\" (or add it to transports), or remove the table"),
        );
    }
    quic::convert(report, which, file)
}

/// `transport = "…"` or `transports = [...]` (not both): the first transport and the list
/// (empty for `transport`).
fn transports(
    report: &mut Report,
    side: &str,
    one: Option<&str>,
    list: Option<Vec<String>>,
) -> (Transport, Vec<TransportEntry>) {
    let Some(list) = list else {
        return (transport(report, side, one), Vec::new());
    };
    let key = join_key(side, "transports");
    if one.is_some() {
        report.fail(
            ConfigError::new(&key, "both transport and transports are set").with_hint(
                "keep transports = [...] (its first entry is tried first) and remove transport",
            ),
        );
    }
    if list.is_empty() || list.len() > MAX_TRANSPORTS {
        report.fail(
            ConfigError::new(&key, format!("{} transports listed", list.len())).with_hint(
                "list one to six transports, e.g. transports = [\"quic\", \"noise\", \"wss:443\"]",
            ),
        );
        return (Transport::default(), Vec::new());
    }
    let mut entries = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        match text.parse::<TransportEntry>() {
            Ok(entry) => entries.push(entry),
            Err(error) => {
                let hint = match &error {
                    TransportEntryError::Port(_) => {
                        "write NAME or NAME:PORT, e.g. \"wss:443\"".to_owned()
                    }
                    TransportEntryError::Name(unknown) => transport_hint(&unknown.name),
                };
                report
                    .fail(ConfigError::new(join_index(&key, i), error.to_string()).with_hint(hint));
            }
        }
    }
    match entries.first() {
        Some(first) => (first.transport, entries),
        None => (Transport::default(), Vec::new()),
    }
}

/// What to write instead of the transport `name`.
fn transport_hint(name: &str) -> String {
    let names: Vec<&str> = Transport::ALL.iter().map(|t| t.name()).collect();
    match did_you_mean(name, &names) {
        Some(close) => format!("did you mean \"{close}\"?"),
        None => "write \"noise\" (encrypted TCP, the default), \"quic\" (UDP, TLS 1.3), \"tls\" (TLS 1.3 on TCP), \"wss\" or \"ws\" (WebSocket, through CDNs and proxies) or \"tcp\" (plaintext, needs insecure = true)".to_owned(),
    }
}

fn transport(report: &mut Report, side: &str, name: Option<&str>) -> Transport {
    let Some(name) = name else {
        return Transport::default();
    };
    match name.parse::<Transport>() {
        Ok(transport) => transport,
        Err(error) => {
            report.fail(
                ConfigError::new(join_key(side, "transport"), error.to_string())
                    .with_hint(transport_hint(name)),
            );
            Transport::default()
        }
    }
}

fn service_kind(report: &mut Report, service: &str, name: Option<&str>) -> ServiceKind {
    let Some(name) = name else {
        return ServiceKind::default();
    };
    let key = join_key(service, "type");
    match name.parse::<ServiceKind>() {
        Ok(kind) => kind,
        Err(error) => {
            let lower = name.trim().to_ascii_lowercase();
            if ServiceKind::PLANNED.contains(&lower.as_str()) {
                report.fail(
                    ConfigError::new(
                        &key,
                        format!("service type \"{lower}\" is not supported yet"),
                    )
                    .with_hint("type = \"tcp\" and type = \"udp\" work in this version"),
                );
            } else {
                let names: Vec<&str> = ServiceKind::ALL.iter().map(|k| k.name()).collect();
                let hint = match did_you_mean(name, &names) {
                    Some(close) => format!("did you mean \"{close}\"?"),
                    None => "write type = \"tcp\" or type = \"udp\"".to_owned(),
                };
                report.fail(ConfigError::new(&key, error.to_string()).with_hint(hint));
            }
            ServiceKind::default()
        }
    }
}

/// Fills a UDP service's settings from its `udp_*` keys; on any other kind those keys are
/// an error (unless the kind itself was already reported).
fn udp_settings(
    report: &mut Report,
    service: &str,
    kind: ServiceKind,
    idle_timeout: Option<&RawDuration>,
    max_sessions: Option<i64>,
) -> ServiceKind {
    let idle_key = join_key(service, "udp_idle_timeout");
    let max_key = join_key(service, "udp_max_sessions");
    let ServiceKind::Udp(_) = kind else {
        let type_key = join_key(service, "type");
        if !report.is_poisoned(&type_key) {
            for (key, set) in [
                (&idle_key, idle_timeout.is_some()),
                (&max_key, max_sessions.is_some()),
            ] {
                if set {
                    let leaf = key.rsplit('.').next().unwrap_or(key);
                    report.fail(
                        ConfigError::new(
                            key,
                            format!(
                                "`{leaf}` only applies to udp services, and this one is {kind}"
                            ),
                        )
                        .with_hint("remove it, or set type = \"udp\" if this service carries UDP"),
                    );
                }
            }
        }
        return kind;
    };
    let idle_timeout = duration(report, &idle_key, idle_timeout, DEFAULT_UDP_IDLE_TIMEOUT);
    let max_sessions = match max_sessions {
        None => DEFAULT_UDP_MAX_SESSIONS,
        // Too large is left to the semantic check, which names the range.
        Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            report.fail(
                ConfigError::new(&max_key, format!("udp_max_sessions must be at least 1, not {n}"))
                    .with_hint(format!("remove it for the default ({DEFAULT_UDP_MAX_SESSIONS}), or write a positive number")),
            );
            DEFAULT_UDP_MAX_SESSIONS
        }
    };
    ServiceKind::Udp(UdpSettings {
        idle_timeout,
        max_sessions,
    })
}

fn tcp_congestion(report: &mut Report, side: &str, name: Option<&str>) -> TcpCongestion {
    let Some(name) = name else {
        return TcpCongestion::default();
    };
    TcpCongestion::parse(name).unwrap_or_else(|error| {
        report.push(ConfigError::new(join_key(side, "tcp_congestion"), error));
        TcpCongestion::default()
    })
}

fn cipher_choice(report: &mut Report, side: &str, name: Option<&str>) -> CipherChoice {
    let Some(name) = name else {
        return CipherChoice::default();
    };
    name.parse().unwrap_or_else(|error: UnknownChoice| {
        report.push(
            ConfigError::new(join_key(side, "cipher_choice"), error.to_string()).with_hint(
                "write \"fastest\" (pick by measured speed) or \"ordered\" (the client's `ciphers` order decides)",
            ),
        );
        CipherChoice::default()
    })
}

fn ciphers(report: &mut Report, side: &str, names: Option<&[String]>) -> Vec<CipherSuite> {
    let key = join_key(side, "ciphers");
    let Some(names) = names else {
        return CipherSuite::default_preference(has_aes_hardware());
    };
    let all: Vec<&str> = CipherSuite::ALL.map(CipherSuite::name).to_vec();
    let mut suites = Vec::with_capacity(names.len());
    let mut failed = false;
    for (i, name) in names.iter().enumerate() {
        match name.parse::<CipherSuite>() {
            Ok(suite) => suites.push(suite),
            Err(error) => {
                failed = true;
                let hint = match did_you_mean(name, &all) {
                    Some(close) => format!("did you mean \"{close}\"?"),
                    None => "remove it, or remove the whole key to use the defaults".to_owned(),
                };
                report
                    .push(ConfigError::new(join_index(&key, i), error.to_string()).with_hint(hint));
            }
        }
    }
    if failed {
        // Rules about the list as a whole would judge a list the user did not write.
        report.poison(&key);
        return CipherSuite::default_preference(has_aes_hardware());
    }
    suites
}
