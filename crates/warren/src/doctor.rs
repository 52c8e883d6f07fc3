//! `warren doctor`: diagnose a setup in one command.
//!
//! Checks, in order: the config parses and validates; secret strength (PSK and every
//! service's and forward's token); clock sanity; for a server, that every port it binds is
//! free and every forward target accepts connections; for a client, that the server's name
//! resolves (IPv4 / IPv6), that a configured proxy reaches the server, a full handshake and
//! hello with the server (through the proxy, cipher chosen, each service's verdict), that
//! every TCP target accepts connections (with connect time) and every forward port is free;
//! with `[server.p2p]` on the server, the NAT this client is behind (mapping and filtering,
//! from the server's two reflector ports) and, for each P2P service's visitors' end, a short
//! visit to the other end (there or not, direct or relayed);
//! then this machine's CPU features and its AEAD seal and open speed for each cipher
//! (the same measuring as the start-up figures of `cipher_choice = "fastest"`, for longer).
//! Every check is one [`Check`] with a status and, for a failure, a fix.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;
use warren_proto::CipherSuite;
use warren_proto::message::{HelloMode, Verdict};

use crate::client::establish::{self, EstablishError};
use crate::config::HostPort;
use crate::config::proxy::ProxyUrl;
use crate::config::{ClientConfig, Config, MIN_SECRET_LEN, ServerConfig, ServiceKind, Transport};
use crate::crypto::secret::Secret;
use crate::crypto::speed;
use crate::transport;
use crate::transport::congestion::{self, TcpCongestion};
use crate::transport::proxy::ProxyError;
use crate::transport::tcp::{self, Family};

/// No machine running this build can honestly be before this (2026-11-01 UTC).
const EARLIEST_PLAUSIBLE_UNIX: u64 = 1_793_491_200;
/// Deadline of each network check.
const NETWORK_DEADLINE: Duration = Duration::from_secs(3);
/// Deadline of the P2P checks (the mailbox, a visit to a P2P service: a relayed one takes
/// seconds of checks before the relay on older peers).
const P2P_DEADLINE: Duration = Duration::from_secs(20);
/// How long a relayed visit may take to move to the direct path.
const P2P_MOVE_WAIT: Duration = Duration::from_secs(4);

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but should be improved.
    Warn,
    /// Broken: the setup will not work until fixed.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The status.
    pub status: Status,
    /// What was checked, e.g. `handshake` or `target web`.
    pub check: String,
    /// What was found.
    pub message: String,
    /// How to fix it (for warnings and failures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every check of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// `server`, `client`, or `unknown` when the file did not load.
    pub side: String,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    fn push(&mut self, status: Status, check: impl Into<String>, message: impl Into<String>) {
        self.checks.push(Check {
            status,
            check: check.into(),
            message: message.into(),
            fix: None,
        });
    }

    fn push_fix(
        &mut self,
        status: Status,
        check: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.checks.push(Check {
            status,
            check: check.into(),
            message: message.into(),
            fix: Some(fix.into()),
        });
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// `[OK]` / `[WARN]` / `[FAIL]` lines, each failure followed by its fix.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for check in &self.checks {
            let tag = match check.status {
                Status::Ok => "[OK]  ",
                Status::Warn => "[WARN]",
                Status::Fail => "[FAIL]",
            };
            out.push_str(&format!("{tag} {}: {}\n", check.check, check.message));
            if let Some(fix) = &check.fix {
                out.push_str(&format!("       fix: {fix}\n"));
            }
        }
        let (fails, warns) = self.checks.iter().fold((0, 0), |(f, w), c| match c.status {
            Status::Fail => (f + 1, w),
            Status::Warn => (f, w + 1),
            Status::Ok => (f, w),
        });
        out.push_str(&format!(
            "{} checks: {fails} failed, {warns} warnings\n",
            self.checks.len()
        ));
        out
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        let value = serde_json::json!({
            "side": self.side,
            "ok": !self.failed(),
            "checks": self.checks,
        });
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }
}

/// Runs every check on the config at `path`.
pub async fn diagnose(path: &Path) -> Report {
    let mut report = Report {
        side: "unknown".into(),
        ..Report::default()
    };
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            report.push_fix(
                Status::Fail,
                "config",
                format!("{} does not load:\n{errors}", path.display()),
                "fix the errors listed (each names its key and line), then run `warren check` or `warren doctor` again",
            );
            return report;
        }
    };
    match config {
        Config::Server(server) => {
            report.side = "server".into();
            report.push(
                Status::Ok,
                "config",
                format!(
                    "{}: valid server config ({} services)",
                    path.display(),
                    server.services.len()
                ),
            );
            diagnose_server(&mut report, &server).await;
        }
        Config::Client(client) => {
            report.side = "client".into();
            report.push(
                Status::Ok,
                "config",
                format!(
                    "{}: valid client config ({} services)",
                    path.display(),
                    client.services.len()
                ),
            );
            diagnose_client(&mut report, &client).await;
        }
    }
    aead_speed(&mut report).await;
    report
}

async fn diagnose_server(report: &mut Report, config: &ServerConfig) {
    secrets(
        report,
        config.insecure,
        config.uses_transport(Transport::Tcp),
        &config.psk,
        config
            .services
            .values()
            .map(|s| (s.name.as_str(), &s.token))
            .chain(
                config
                    .forwards
                    .values()
                    .map(|f| (f.name.as_str(), &f.token)),
            ),
    );
    clock(report).await;
    for addr in config.tcp_binds() {
        port_free(report, "server port", addr, false).await;
    }
    if let Some(addr) = config.quic_bind() {
        port_free(report, "server port", addr, true).await;
    }
    for service in config.services.values() {
        let what = format!("service {} port", service.name);
        service_port_free(report, &what, service.kind, service.bind).await;
    }
    // The server dials forward targets, so they must be reachable from here.
    for forward in config.forwards.values() {
        let fix = format!(
            "start the service on {} or correct `target` in [server.forwards.{}]",
            forward.target, forward.name
        );
        target(report, &forward.name, forward.kind, &forward.target, &fix).await;
    }
    if let Some(admin) = &config.admin {
        port_free(report, "admin port", admin.bind, false).await;
    }
}

async fn diagnose_client(report: &mut Report, config: &ClientConfig) {
    secrets(
        report,
        config.insecure,
        config.uses_transport(Transport::Tcp),
        &config.psk,
        config
            .services
            .values()
            .map(|s| (s.name.as_str(), &s.token))
            .chain(
                config
                    .forwards
                    .values()
                    .map(|f| (f.name.as_str(), &f.token)),
            )
            .chain(config.p2p.values().map(|p| (p.name.as_str(), &p.token))),
    );
    clock(report).await;
    for server in config.servers() {
        resolve(report, "server address", &server.to_string()).await;
    }
    let proxy = match proxy(report, config).await {
        ProxyCheck::Direct => None,
        ProxyCheck::Through(url) => Some(url),
        // The handshake would fail for the same reason; the proxy line already says why.
        ProxyCheck::Broken => return finish_client(report, config).await,
    };
    for server in config.servers() {
        handshake(report, config, server, proxy.as_ref()).await;
    }
    #[cfg(unix)]
    if proxy.is_none() {
        p2p(report, config).await;
    }
    finish_client(report, config).await;
}

/// The NAT this machine is behind, from the first server's two reflector ports (when the
/// server runs `[server.p2p]`), and for each P2P service's visitors' end whether the
/// other end is there and a direct path to it works (a short visit, closed at once).
#[cfg(unix)]
async fn p2p(report: &mut Report, config: &ClientConfig) {
    use crate::p2p::mailbox::Mailbox;
    use crate::p2p::net::nat;

    let options = crate::client::p2p::options(config, &config.server);
    let asked = async {
        let mut mailbox = Mailbox::connect(&options.server).await?;
        let info = mailbox.info().await;
        let ports = info.map(|(udp, alt)| {
            (
                udp.map(|port| mailbox.udp_addr(port)),
                alt.map(|port| mailbox.udp_addr(port)),
            )
        });
        mailbox.close().await;
        ports
    };
    let ports = match tokio::time::timeout(P2P_DEADLINE, asked).await {
        Ok(Ok(ports)) => ports,
        Ok(Err(error)) if config.p2p.is_empty() => {
            tracing::debug!(%error, "no P2P mailbox on the server; nothing to check");
            return;
        }
        Ok(Err(error)) => {
            return report.push_fix(
                Status::Fail,
                "p2p mailbox",
                format!("the server's P2P mailbox did not answer: {error}"),
                "the server needs a [server.p2p] section (and each P2P service in [server.p2p.services]) for p2p = true services",
            );
        }
        Err(_) => {
            return report.push_fix(
                Status::Fail,
                "p2p mailbox",
                format!("the server's P2P mailbox did not answer in {} s", P2P_DEADLINE.as_secs()),
                "check that the server runs and that this client's PSK is right (the handshake line says more)",
            );
        }
    };
    match ports {
        (Some(main), alt) => {
            let bind = match main {
                SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
            };
            match nat::probe(main, alt, bind).await {
                Ok(nat) if nat.punches_well() => {
                    report.push(Status::Ok, "nat", format!("{nat}: {}", nat.outlook()));
                }
                Ok(nat) => report.push_fix(
                    Status::Warn,
                    "nat",
                    format!("{nat}: {}", nat.outlook()),
                    "P2P still works through the server's relay; for direct paths use a network whose NAT keeps one port per socket (endpoint-independent mapping)",
                ),
                Err(error) => report.push_fix(
                    Status::Warn,
                    "nat",
                    format!("no answer from the server's address reflector: {error}"),
                    format!("allow UDP to {main}: without it P2P goes through the relay over TCP, slower"),
                ),
            }
        }
        (None, _) => report.push_fix(
            Status::Warn,
            "nat",
            "the server runs a P2P mailbox but no UDP port: peers get no address discovery and no relay",
            "set udp_bind in the server's [server.p2p]",
        ),
    }
    for service in config.p2p.values() {
        if let crate::config::P2pEnd::Entrance { .. } = service.end {
            // Through the first server, as the nat line.
            match crate::client::p2p::service_options(config, service) {
                Ok(options) => p2p_visit(report, service, &options[0]).await,
                Err(error) => report.push_fix(
                    Status::Fail,
                    "p2p identity",
                    error,
                    "fix p2p_identity in [client], or remove it for a fresh identity per connection",
                ),
            }
        }
    }
}

/// Visits P2P service `service` once: the other end is there, and the route it took.
#[cfg(unix)]
async fn p2p_visit(
    report: &mut Report,
    service: &crate::config::ClientP2p,
    options: &crate::p2p::session::Options,
) {
    use crate::p2p::session::{self, Meeting, Route};

    let what = format!("p2p {}", service.name);
    let meeting = Meeting::Service {
        name: service.name.clone(),
        token: service.token.clone(),
    };
    let joined = tokio::time::timeout(P2P_DEADLINE, session::join_meeting(&meeting, options)).await;
    let mut connected = match joined {
        Ok(Ok(connected)) => connected,
        Ok(Err(error)) => {
            return report.push_fix(
                Status::Fail,
                what,
                format!("cannot reach the other end: {error}"),
                format!("start the client whose [client.services.{}] has the target and p2p = true, with the same token", service.name),
            );
        }
        Err(_) => {
            return report.push_fix(
                Status::Fail,
                what,
                format!("no connection to the other end in {} s", P2P_DEADLINE.as_secs()),
                "check that the other end's client runs, and that UDP or the server's relay gets through",
            );
        }
    };
    // A relayed start moves to the direct path within the first round of checks, if any.
    let mut route = connected.path.route();
    if matches!(route, Route::Relayed(_))
        && let Ok(Some(moved)) = tokio::time::timeout(P2P_MOVE_WAIT, connected.path.changed()).await
    {
        route = moved;
    }
    let rtt = ms(connected.connection.rtt());
    connected
        .connection
        .close(0u32.into(), b"warren doctor visited");
    let _ = tokio::time::timeout(Duration::from_secs(1), connected.endpoint.wait_idle()).await;
    match route {
        Route::Direct(addr) => report.push(
            Status::Ok,
            what,
            format!("the other end answers; direct path to {addr}, RTT {rtt}"),
        ),
        Route::Relayed(addr) => report.push_fix(
            Status::Warn,
            what,
            format!("the other end answers, through the server's relay only ({addr}), RTT {rtt}"),
            "the NATs on the way allow no direct path (see the nat line); the relay carries the service",
        ),
    }
}

/// The client's checks that need no server: local targets, forward ports, admin port.
async fn finish_client(report: &mut Report, config: &ClientConfig) {
    for service in config.services.values() {
        let fix = format!(
            "start the local service on {} or correct `target` in [client.services.{}]",
            service.target, service.name
        );
        target(report, &service.name, service.kind, &service.target, &fix).await;
        if let Some(check) = &service.health_check {
            let what = format!("health {}", service.name);
            match crate::client::health_check_once(check, &service.target).await {
                Ok(()) => report.push(Status::Ok, what, "the target passes its health check"),
                Err(error) => report.push_fix(
                    Status::Fail,
                    what,
                    format!("the target fails its health check: {error}"),
                    "while it fails, the servers send this client none of the service's visitors; fix the target or its health_check",
                ),
            }
        }
    }
    for service in config.p2p.values() {
        if let crate::config::P2pEnd::Exit { target: to } = &service.end {
            let fix = format!(
                "start the local service on {to} or correct `target` in [client.services.{}]",
                service.name
            );
            target(report, &service.name, service.kind, to, &fix).await;
        }
    }
    for forward in config.forwards.values() {
        let what = format!("forward {} port", forward.name);
        service_port_free(report, &what, forward.kind, forward.bind).await;
    }
    if let Some(admin) = &config.admin {
        port_free(report, "admin port", admin.bind, false).await;
    }
}

/// [`port_free`] for a service's own port, bound as TCP or UDP by its kind.
async fn service_port_free(report: &mut Report, what: &str, kind: ServiceKind, bind: SocketAddr) {
    port_free(report, what, bind, matches!(kind, ServiceKind::Udp(_))).await;
}

/// A TCP target must accept a connection (timed); a UDP target can only be resolved.
async fn target(report: &mut Report, name: &str, kind: ServiceKind, target: &HostPort, fix: &str) {
    let check = format!("target {name}");
    if matches!(kind, ServiceKind::Udp(_)) {
        resolve(report, &check, &target.to_string()).await;
        return;
    }
    let started = Instant::now();
    match tcp::connect(target, NETWORK_DEADLINE).await {
        Ok(_) => report.push(
            Status::Ok,
            check,
            format!(
                "{target} accepts connections (connect {})",
                ms(started.elapsed())
            ),
        ),
        Err(error) => report.push_fix(
            Status::Fail,
            check,
            format!("{target} is unreachable: {error}"),
            fix,
        ),
    }
}

/// The address family order the client itself would use.
fn family(config: &ClientConfig) -> Family {
    if config.prefer_ipv6 {
        Family::PreferIpv6
    } else {
        Family::Any
    }
}

/// What the proxy check found.
enum ProxyCheck {
    /// No proxy configured (or `env` with no variable set): dial the server directly.
    Direct,
    /// The proxy works and reached the server.
    Through(ProxyUrl),
    /// The proxy is misconfigured, unreachable or refused.
    Broken,
}

/// With a `proxy`, opens a tunnel through it to the server and reports how long it took.
async fn proxy(report: &mut Report, config: &ClientConfig) -> ProxyCheck {
    let Some(setting) = &config.proxy else {
        return ProxyCheck::Direct;
    };
    let url = match setting.resolve(&|name| std::env::var(name).ok()) {
        Ok(Some(url)) => url,
        Ok(None) => {
            report.push_fix(
                Status::Warn,
                "proxy",
                "proxy = \"env\" but none of ALL_PROXY, HTTPS_PROXY (or lower case) is set: dialing directly",
                "set ALL_PROXY (e.g. socks5://host:1080) or remove `proxy`",
            );
            return ProxyCheck::Direct;
        }
        Err(error) => {
            report.push_fix(
                Status::Fail,
                "proxy",
                error,
                "set the variable to a socks5:// or http:// URL",
            );
            return ProxyCheck::Broken;
        }
    };
    let started = Instant::now();
    match transport::proxy::connect(&url, &config.server, NETWORK_DEADLINE, family(config)).await {
        Ok(_) => {
            report.push(
                Status::Ok,
                "proxy",
                format!(
                    "{url} reached {} (tunnel open in {})",
                    config.server,
                    ms(started.elapsed())
                ),
            );
            ProxyCheck::Through(url)
        }
        Err(error) => {
            let fix = match &error {
                ProxyError::Unreachable { .. } | ProxyError::Timeout { .. } => {
                    "is the proxy running? check the host and port in `proxy`"
                }
                ProxyError::AuthFailed { .. } => {
                    "correct the user name and password in `proxy` (percent-encode special characters)"
                }
                ProxyError::Refused { .. } => {
                    "the proxy would not reach the server: check its ACL (e.g. allowed CONNECT ports) and `server`"
                }
            };
            report.push_fix(Status::Fail, "proxy", error.to_string(), fix);
            ProxyCheck::Broken
        }
    }
}

fn secrets<'a>(
    report: &mut Report,
    insecure: bool,
    plaintext: bool,
    psk: &Secret,
    tokens: impl Iterator<Item = (&'a str, &'a Secret)>,
) {
    if insecure {
        report.push_fix(
            Status::Warn,
            "secrets",
            "insecure = true: weak secrets and plaintext are allowed",
            "remove `insecure = true` outside of tests",
        );
    }
    if plaintext {
        report.push_fix(
            Status::Warn,
            "transport",
            "transport = \"tcp\" carries traffic in plaintext",
            "use transport = \"noise\" (the default)",
        );
    }
    secret_strength(report, "psk", psk, insecure);
    for (name, token) in tokens {
        secret_strength(report, &format!("token of {name}"), token, insecure);
    }
}

fn secret_strength(report: &mut Report, what: &str, secret: &Secret, insecure: bool) {
    let len = secret.len();
    let distinct = {
        let mut bytes: Vec<u8> = secret.as_bytes().to_vec();
        bytes.sort_unstable();
        bytes.dedup();
        bytes.len()
    };
    if len < MIN_SECRET_LEN {
        // `insecure = true` allows short secrets on purpose (tests): a warning, not a failure.
        report.push_fix(
            if insecure { Status::Warn } else { Status::Fail },
            format!("secret {what}"),
            format!("{len} characters, fewer than {MIN_SECRET_LEN}"),
            "use `warren keygen` for a strong random value",
        );
    } else if len < 24 || distinct < 10 {
        report.push_fix(
            Status::Warn,
            format!("secret {what}"),
            format!("{len} characters, {distinct} distinct: guessable"),
            "use `warren keygen` for a strong random value (32+ random characters)",
        );
    } else {
        report.push(
            Status::Ok,
            format!("secret {what}"),
            format!("{len} characters"),
        );
    }
}

async fn clock(report: &mut Report) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now < EARLIEST_PLAUSIBLE_UNIX {
        report.push_fix(
            Status::Fail,
            "clock",
            "the system clock is before this build was made",
            "set the clock (e.g. enable NTP: `timedatectl set-ntp true`)",
        );
        return;
    }
    let wall = SystemTime::now();
    let mono = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mono_elapsed = mono.elapsed().as_secs_f64();
    let wall_elapsed = wall.elapsed().map_or(-1.0, |d| d.as_secs_f64());
    let drift = (wall_elapsed - mono_elapsed).abs();
    if drift > 0.05 {
        report.push_fix(
            Status::Warn,
            "clock",
            format!(
                "wall clock and monotonic clock disagree by {:.0} ms over 100 ms",
                drift * 1000.0
            ),
            "the clock is being stepped: check NTP (`timedatectl status`)",
        );
    } else {
        report.push(Status::Ok, "clock", "system time is plausible and steady");
    }
}

async fn port_free(report: &mut Report, what: &str, addr: SocketAddr, udp: bool) {
    let bound = if udp {
        tokio::net::UdpSocket::bind(addr).await.map(drop)
    } else {
        tokio::net::TcpListener::bind(addr).await.map(drop)
    };
    let proto = if udp { "udp" } else { "tcp" };
    match bound {
        Ok(()) => report.push(
            Status::Ok,
            what,
            format!("{addr} ({proto}) is free"),
        ),
        Err(error) => report.push_fix(
            Status::Fail,
            what,
            format!("cannot bind {addr} ({proto}): {error}"),
            format!(
                "the port is taken (if by a running warren, stop it first); find the owner with `ss -lpn 'sport = :{}'` or choose another port",
                addr.port()
            ),
        ),
    }
}

async fn resolve(report: &mut Report, what: &str, host_port: &str) {
    match tokio::time::timeout(NETWORK_DEADLINE, tokio::net::lookup_host(host_port)).await {
        Ok(Ok(addrs)) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            let v4 = addrs.iter().filter(|a| a.is_ipv4()).count();
            let v6 = addrs.len() - v4;
            if addrs.is_empty() {
                report.push_fix(
                    Status::Fail,
                    what,
                    format!("{host_port} resolves to no address"),
                    "check the host name and DNS",
                );
            } else {
                let list: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
                report.push(
                    Status::Ok,
                    what,
                    format!(
                        "{host_port} resolves to {} ({v4} IPv4, {v6} IPv6)",
                        list.join(", ")
                    ),
                );
            }
        }
        Ok(Err(error)) => report.push_fix(
            Status::Fail,
            what,
            format!("{host_port} does not resolve: {error}"),
            "check the host name, /etc/resolv.conf and DNS",
        ),
        Err(_) => report.push_fix(
            Status::Fail,
            what,
            format!("resolving {host_port} took over {NETWORK_DEADLINE:?}"),
            "check DNS (/etc/resolv.conf)",
        ),
    }
}

/// A TCP session, or a QUIC one with a line of facts about its path: RTT, the largest
/// datagram the path carries now, GSO.
type Probed = (establish::EstablishedSession, Option<String>);

/// The QUIC handshake and a probe hello with `target`.
async fn quic_hello(
    config: &ClientConfig,
    target: &HostPort,
    claims: &[establish::Claim<'_>],
    deadline: std::time::Duration,
) -> Result<Probed, EstablishError> {
    let (session, client) = establish::establish_quic_once(
        &config.quic,
        &config.psk,
        target,
        family(config),
        (claims, HelloMode::Probe),
        deadline,
    )
    .await?;
    let facts = match &session.carrier {
        crate::session::link::Carrier::Quic(connection) => {
            let socket = client.endpoint().socket;
            let gso = config.quic.settings().segmentation_offload && socket.gso_segments > 1;
            Some(format!(
                "QUIC path: rtt {}, largest datagram now {} bytes (max_packet {}), GSO {}, socket buffers {} / {} KiB",
                ms(connection.rtt()),
                connection
                    .max_datagram_size()
                    .map_or_else(|| "none".to_owned(), |n| n.to_string()),
                config.quic.max_packet,
                if gso { "on" } else { "off" },
                socket.send_buffer / 1024,
                socket.recv_buffer / 1024,
            ))
        }
        crate::session::link::Carrier::Tcp { .. } => None,
    };
    Ok((session, facts))
}

/// Handshake and hello with one server, on every transport of the config when it lists
/// several (a table: works with its handshake time, or fails with the reason, and which one
/// the client will use). The hello only probes: the server judges every claim and answers,
/// but serves nothing through this session and takes nothing from a client that is
/// running, so doctor is safe on a live setup.
async fn handshake(
    report: &mut Report,
    config: &ClientConfig,
    server: &HostPort,
    proxy: Option<&ProxyUrl>,
) {
    let claims = crate::client::claims_of(config);
    let list = config.transport_list();
    let mut chosen = None;
    let mut failures = Vec::new();
    for entry in &list {
        let target = HostPort {
            host: server.host.clone(),
            port: entry.port_or(server.port),
        };
        let probed = probe_transport(config, entry.transport, &target, proxy, &claims).await;
        if list.len() == 1 {
            match probed {
                Ok((session, facts)) => chosen = Some((session, facts, target, *entry)),
                Err(error) => failures.push((error, target)),
            }
            break;
        }
        match probed {
            Ok((session, facts)) => {
                report.push(
                    Status::Ok,
                    format!("transport {:<5}", entry.transport.name()),
                    format!(
                        "{target}: works, connect {}, handshake {}",
                        ms(session.connect_time),
                        ms(session.handshake_time)
                    ),
                );
                if chosen.is_none() {
                    chosen = Some((session, facts, target, *entry));
                } else {
                    establish::goodbye(session.channel, "warren doctor done").await;
                }
            }
            Err(error) => {
                report.push_fix(
                    Status::Warn,
                    format!("transport {:<5}", entry.transport.name()),
                    format!("{target}: fails: {error}"),
                    handshake_fix(&error, &target),
                );
                failures.push((error, target));
            }
        }
    }
    let Some((session, facts, target, entry)) = chosen else {
        // Only the last failure gets the fix line under "handshake"; the table has the rest.
        if let Some((error, target)) = failures.pop() {
            let message = if list.len() == 1 {
                format!("with {target}: {error}")
            } else {
                format!("no transport works with {server}")
            };
            report.push_fix(
                Status::Fail,
                "handshake",
                message,
                handshake_fix(&error, &target),
            );
        }
        return;
    };
    if list.len() > 1 {
        report.push(
            Status::Ok,
            "transport",
            format!(
                "the client will use {entry} (the first that works, in the order of `transports`{})",
                if list.first() != Some(&entry) {
                    format!(
                        "; it tries the ones before it again every {}",
                        crate::config::duration::format_duration(config.transport_retry)
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    report_session(report, config, &target, proxy, session, facts, &claims).await;
}

/// One handshake and probe hello with `target` on `transport`.
async fn probe_transport(
    config: &ClientConfig,
    transport: Transport,
    target: &HostPort,
    proxy: Option<&ProxyUrl>,
    claims: &[establish::Claim<'_>],
) -> Result<Probed, EstablishError> {
    let deadline = config.handshake_timeout.min(NETWORK_DEADLINE);
    if transport == Transport::Quic {
        return quic_hello(config, target, claims, deadline).await;
    }
    let ciphers = crate::client::offered_ciphers(config, transport);
    let ciphers = speed::policy_measured(&ciphers, config.cipher_choice).await;
    let dial = async {
        let layers = crate::client::client_layers(config, transport, target)
            .map_err(std::io::Error::other)?;
        crate::client::dial_server(config, transport, target, proxy, &layers, deadline).await
    };
    let server = match proxy {
        Some(url) => format!("{target} via {url}"),
        None => target.to_string(),
    };
    establish::establish(
        dial,
        &server,
        &config.psk,
        &ciphers,
        claims,
        HelloMode::Probe,
        deadline,
    )
    .await
    .map(|session| (session, None))
}

/// How to fix a failed handshake with `target`.
fn handshake_fix(error: &EstablishError, target: &HostPort) -> String {
    match error {
        EstablishError::Connect { .. } => format!(
            "is the server running and listening on {target}? check `server` in [client], firewalls, and the server's `bind` and `transports`"
        ),
        // A draining server (a rolling restart) or a full one: it says when.
        EstablishError::HelloRefused { retry: true, .. } => {
            "the server says a later try may work: wait for it (a draining server's successor starts, a full server frees a session) or use another server".to_owned()
        }
        EstablishError::HelloRefused { .. } => {
            "see the server's reason; upgrading the older side usually fixes it".to_owned()
        }
        EstablishError::ClosedDuringHandshake { .. } | EstablishError::HandshakeTimeout { .. } => {
            "wrong PSK: set the same `psk` (e.g. the same WARREN_PSK) on server and client; also check that the server listens on this transport".to_owned()
        }
        EstablishError::Refused(_) => {
            "no common cipher: make the `ciphers` lists of server and client overlap".to_owned()
        }
        _ => "check that both sides run the same Warren version".to_owned(),
    }
}

/// The congestion control this end of the session runs, and on a TCP transport whether
/// `tcp_congestion` got what it asked for (the server's end is in its admin API,
/// `/api/v1/sessions`).
fn congestion_line(
    report: &mut Report,
    config: &ClientConfig,
    carrier: &crate::session::link::Carrier,
) {
    let running = carrier
        .congestion()
        .unwrap_or_else(|| "the system's (this platform cannot say which)".to_owned());
    if let crate::session::link::Carrier::Quic(_) = carrier {
        let line = format!("{running} (quinn's controller, [client.quic] congestion)");
        return report.push(Status::Ok, "congestion", line);
    }
    let setting = &config.tcp_congestion;
    let mut line =
        format!("{running} on this end's TCP connections (tcp_congestion = \"{setting}\")");
    if *setting == TcpCongestion::Auto && running != congestion::PREFERRED {
        line.push_str(&format!(
            "; the kernel offers no {0}, which carries many times more on lossy paths: \
             `modprobe tcp_{0}`",
            congestion::PREFERRED
        ));
    }
    match setting.check().refused {
        Some(why) => report.push_fix(Status::Warn, "congestion", line, why),
        None => report.push(Status::Ok, "congestion", line),
    }
}

/// The report's lines for a session that came up: the handshake, the cipher or QUIC path,
/// and the server's verdict on every service; then a goodbye.
async fn report_session(
    report: &mut Report,
    config: &ClientConfig,
    target: &HostPort,
    proxy: Option<&ProxyUrl>,
    session: establish::EstablishedSession,
    quic_facts: Option<String>,
    claims: &[establish::Claim<'_>],
) {
    report.push(
        Status::Ok,
        "handshake",
        format!(
            // Through a proxy the socket's peer is the proxy, so name the route instead.
            "{}: cipher {}, connect {}, handshake {}, hello {}",
            match proxy {
                Some(url) => format!("{target} via {url}"),
                None => format!("{target} ({})", session.server_addr),
            },
            session.keys.cipher_label(),
            ms(session.connect_time),
            ms(session.handshake_time),
            ms(session.hello_time)
        ),
    );
    match quic_facts {
        Some(facts) => report.push(Status::Ok, "quic", facts),
        None => report.push(
            Status::Ok,
            "cipher choice",
            format!(
                "{} chosen by {} (seal/open GB/s at start-up)",
                session.keys.cipher(),
                session.keys.describe_choice()
            ),
        ),
    }
    congestion_line(report, config, &session.carrier);
    let several = config.servers().len() > 1;
    for (claim, verdict) in claims.iter().zip(&session.verdicts) {
        let name = if several {
            format!("{} at {target}", claim.name)
        } else {
            claim.name.to_owned()
        };
        match verdict {
            Verdict::Accepted { bound: None } => report.push(
                Status::Ok,
                format!("service {name}"),
                "accepted by the server",
            ),
            Verdict::Accepted { bound: Some(address) } => report.push(
                Status::Ok,
                format!("service {name}"),
                format!("accepted by the server, which bound it on {address}"),
            ),
            Verdict::AcceptedHttp { urls } => report.push(
                Status::Ok,
                format!("service {name}"),
                format!("accepted by the server, which would route {}", urls.join(" ")),
            ),
            Verdict::Denied { reason } => report.push_fix(
                Status::Fail,
                format!("service {name}"),
                format!("denied by the server: {reason}"),
                "see the reason: a declared port outside allow_ports or in use, or a forward/reverse mismatch between the configs",
            ),
            Verdict::Refused => report.push_fix(
                Status::Fail,
                format!("service {name}"),
                "refused by the server: wrong token, or the server has no such service",
                format!(
                    "use the same token for `{name}` on both sides and make sure the server's config has [server.services.{name}]"
                ),
            ),
        }
    }
    establish::goodbye(session.channel, "warren doctor done").await;
}

/// The CPU features that decide the fastest cipher, then every encrypting cipher's seal and
/// open speed on one core, measured as at start-up but longer ([`speed::DOCTOR`]), on a
/// blocking thread.
async fn aead_speed(report: &mut Report) {
    let masked = std::env::var_os("OPENSSL_ia32cap").map_or(String::new(), |_| {
        " (OPENSSL_ia32cap is set: aws-lc may use fewer of them)".to_owned()
    });
    report.push(
        Status::Ok,
        "cpu features",
        format!("{}{masked}", speed::describe_cpu_features()),
    );
    let measured = tokio::task::spawn_blocking(|| {
        CipherSuite::ENCRYPTING.map(|suite| speed::measure(suite, speed::DOCTOR))
    })
    .await;
    let Ok(mut speeds) = measured else {
        report.push(Status::Warn, "aead speed", "the measuring thread failed");
        return;
    };
    speeds.sort_by_key(|speed| std::cmp::Reverse(speed.slower()));
    report.push(
        Status::Ok,
        "aead speed",
        format!(
            "seal/open GB/s, {} KiB records, one core, fastest first: {}",
            speed::RECORD_PAYLOAD / 1024,
            speed::describe(&speeds)
        ),
    );
    use crate::crypto::aead::{Algorithm, Backend};
    let implementations: Vec<String> = CipherSuite::ENCRYPTING
        .iter()
        .filter_map(|&suite| {
            let algorithm = Algorithm::of_suite(suite)?;
            Some(format!("{suite} {}", Backend::of(algorithm).name()))
        })
        .collect();
    let implementations = implementations.join(", ");
    report.push(
        Status::Ok,
        "aead implementation",
        format!("the faster here (also for tls/wss records): {implementations}"),
    );
}

/// A duration in milliseconds with two decimals.
pub fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}
