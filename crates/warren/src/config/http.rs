//! `[server.http]` (the shared public HTTP ports) and the keys of `type = "http"` services.
//!
//! ```toml
//! [server.http]
//! bind = "0.0.0.0:80"              # HTTP/1.1 and h2c for every http service
//! tls_bind = "0.0.0.0:443"         # optional: TLS (ALPN h2, http/1.1) and SNI passthrough
//! trusted_proxies = ["10.0.0.0/8"] # peers whose X-Forwarded-For is believed
//!
//! [server.services.app]
//! type = "http"
//! hosts = ["app.example.com", "*.preview.example.com"]
//! paths = ["/"]                    # longest segment-wise prefix wins; default "/"
//! tls = "terminate"                # or "passthrough"; default: plain HTTP only
//! cert = "app.pem"                 # terminate: certificate chain and key (PEM)
//! key = "app.key"
//! host_rewrite = "app.internal"    # Host the backend sees; default: the visitor's
//! strip_prefix = true              # drop the matched path prefix before forwarding
//! backend = "http1"                # or "h2c" (gRPC and other HTTP/2 backends)
//! ```
//!
//! A service is served on the plain port unless it passes TLS through; with a certificate
//! it is also served on the TLS port. Header rules and access control are middleware.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, Report};
use super::middleware::{FileMiddleware, MiddlewareSpec};
use crate::http::route::HostPattern;

/// The `[server.http]` table, as the file says it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttp {
    /// `IP:PORT` of the plain HTTP port (HTTP/1.1 and h2c).
    pub bind: Option<String>,
    /// `IP:PORT` of the TLS port (terminated or passed through by SNI).
    pub tls_bind: Option<String>,
    /// CIDRs of proxies in front of Warren whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Option<Vec<String>>,
    /// Clients may declare `subdomain = "NAME"` services: `NAME.<subdomain_host>`.
    pub subdomain_host: Option<String>,
    /// Host names (exact or `*.suffix`) clients may declare with `hosts = [...]`.
    pub allow_hosts: Option<Vec<String>>,
}

/// The http keys of a `[server.services.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttpService {
    /// Host names (exact, or `*.suffix` for one label).
    pub hosts: Option<Vec<String>>,
    /// Path prefixes, matched segment by segment. Default `["/"]`.
    pub paths: Option<Vec<String>>,
    /// `"terminate"` or `"passthrough"`. Default: plain HTTP only.
    pub tls: Option<String>,
    /// `tls = "terminate"`: the certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// `tls = "terminate"`: the private key (PEM).
    pub key: Option<PathBuf>,
    /// The `Host` the backend sees. Default: the visitor's.
    pub host_rewrite: Option<String>,
    /// Remove the matched path prefix before forwarding. Default `false`.
    pub strip_prefix: Option<bool>,
    /// `"http1"` (default) or `"h2c"`.
    pub backend: Option<String>,
    /// The middleware chain, in order.
    pub middleware: Option<Vec<FileMiddleware>>,
    /// Keep recent requests for the inspector. Default `true`.
    pub capture: Option<bool>,
    /// Keep this many first bytes of each body too (0 to 65536). Default 0.
    pub capture_body_bytes: Option<i64>,
}

impl FileHttpService {
    /// The keys that are set, for "only http services take `hosts`".
    pub fn set_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        let pairs: [(&'static str, bool); 11] = [
            ("capture", self.capture.is_some()),
            ("capture_body_bytes", self.capture_body_bytes.is_some()),
            ("hosts", self.hosts.is_some()),
            ("paths", self.paths.is_some()),
            ("tls", self.tls.is_some()),
            ("cert", self.cert.is_some()),
            ("key", self.key.is_some()),
            ("host_rewrite", self.host_rewrite.is_some()),
            ("strip_prefix", self.strip_prefix.is_some()),
            ("backend", self.backend.is_some()),
            ("middleware", self.middleware.is_some()),
        ];
        for (key, set) in pairs {
            if set {
                keys.push(key);
            }
        }
        keys
    }
}

/// The shared HTTP ports, typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpListen {
    /// The plain port.
    pub bind: Option<SocketAddr>,
    /// The TLS port.
    pub tls_bind: Option<SocketAddr>,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<crate::http::forwarded::Cidr>,
    /// The parent domain of client-declared `subdomain` services.
    pub subdomain_host: Option<String>,
    /// Names clients may declare with `hosts`.
    pub allow_hosts: Vec<HostPattern>,
}

/// Most host names one client-declared http service may ask for.
pub const MAX_CLAIMED_HOSTS: usize = 16;

/// What a client-declared http service asks the server to route to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpClaim {
    /// `NAME.<subdomain_host>`.
    pub subdomain: Option<String>,
    /// Full host names.
    pub hosts: Vec<String>,
}

/// Whether `label` is one DNS label (letters, digits, inner hyphens; at most 63).
pub fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// How an http service treats TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HttpTls {
    /// Plain HTTP only.
    #[default]
    Off,
    /// Warren terminates TLS with this certificate and key (selected by SNI).
    Terminate {
        /// Certificate chain (PEM).
        cert: PathBuf,
        /// Private key (PEM).
        key: PathBuf,
    },
    /// The ClientHello's SNI picks the service; the TLS bytes go to the client untouched.
    Passthrough,
}

/// Which HTTP version Warren speaks to the backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    /// HTTP/1.1 (upgrades such as WebSocket pass through).
    #[default]
    Http1,
    /// HTTP/2 without TLS, prior knowledge (gRPC).
    H2c,
}

/// An http service's routing and shaping, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRoute {
    /// Host patterns.
    pub hosts: Vec<HostPattern>,
    /// Normalized path prefixes; never empty.
    pub paths: Vec<String>,
    /// TLS handling.
    pub tls: HttpTls,
    /// The `Host` the backend sees.
    pub host_rewrite: Option<String>,
    /// Remove the matched prefix before forwarding.
    pub strip_prefix: bool,
    /// The backend's protocol.
    pub backend: Backend,
    /// The middleware chain, in order.
    pub middleware: Vec<MiddlewareSpec>,
    /// Keep recent requests for the inspector.
    pub capture: bool,
    /// First body bytes kept per request (0: none).
    pub capture_body_bytes: usize,
}

/// Converts `[server.http]`.
pub(crate) fn convert_listen(report: &mut Report, file: Option<FileHttp>) -> Option<HttpListen> {
    let file = file?;
    let mut listen = HttpListen::default();
    if let Some(text) = &file.bind {
        listen.bind = super::convert::socket_addr(report, "server.http.bind", text);
    }
    if let Some(text) = &file.tls_bind {
        listen.tls_bind = super::convert::socket_addr(report, "server.http.tls_bind", text);
    }
    if file.bind.is_none() && file.tls_bind.is_none() {
        report.fail(
            ConfigError::new("server.http", "[server.http] needs a port to listen on").with_hint(
                "add bind = \"0.0.0.0:80\" (plain HTTP) and/or tls_bind = \"0.0.0.0:443\"",
            ),
        );
    }
    if let Some(text) = &file.subdomain_host {
        let host = text.trim().trim_end_matches('.').to_ascii_lowercase();
        if host.split('.').count() < 2 || !host.split('.').all(is_dns_label) {
            report.fail(
                ConfigError::new("server.http.subdomain_host", format!("{text:?} is not a domain name"))
                    .with_hint("write the parent domain of client-declared services, e.g. \"tunnel.example.com\" (and point *.tunnel.example.com at this server)"),
            );
        } else {
            listen.subdomain_host = Some(host);
        }
    }
    for (i, text) in file.allow_hosts.iter().flatten().enumerate() {
        match HostPattern::parse(text) {
            Ok(pattern) => listen.allow_hosts.push(pattern),
            Err(error) => report.fail(ConfigError::new(
                format!("server.http.allow_hosts[{i}]"),
                error,
            )),
        }
    }
    if let Some(list) = &file.trusted_proxies {
        listen.trusted_proxies =
            super::middleware::parse_cidrs(report, "server.http.trusted_proxies", list)
                .unwrap_or_default();
    }
    Some(listen)
}

/// Converts the http keys of service `key` (`server.services.NAME`).
pub(crate) fn convert_route(report: &mut Report, key: &str, file: FileHttpService) -> HttpRoute {
    let mut hosts = Vec::new();
    for (i, text) in file.hosts.iter().flatten().enumerate() {
        match HostPattern::parse(text) {
            Ok(pattern) => hosts.push(pattern),
            Err(error) => report.fail(ConfigError::new(format!("{key}.hosts[{i}]"), error)),
        }
    }
    if file.hosts.as_ref().is_none_or(Vec::is_empty) {
        report.fail(
            ConfigError::new(
                format!("{key}.hosts"),
                "an http service needs the host names it answers for",
            )
            .with_hint("add hosts = [\"app.example.com\"] (\"*.example.com\" matches one label)"),
        );
    }
    let mut paths = Vec::new();
    for (i, text) in file.paths.iter().flatten().enumerate() {
        if !text.starts_with('/') {
            report.fail(
                ConfigError::new(
                    format!("{key}.paths[{i}]"),
                    format!("{text:?} is not a path"),
                )
                .with_hint("paths start with \"/\", e.g. \"/api\""),
            );
            continue;
        }
        match crate::http::route::parse_prefix(text) {
            Ok(path) => paths.push(path),
            Err(error) => report.fail(ConfigError::new(
                format!("{key}.paths[{i}]"),
                format!("{text:?}: {error}"),
            )),
        }
    }
    if paths.is_empty() {
        paths.push("/".to_owned());
    }
    let tls = match file.tls.as_deref().map(str::trim) {
        None => HttpTls::Off,
        Some("terminate") => match (file.cert.clone(), file.key.clone()) {
            (Some(cert), Some(key)) => HttpTls::Terminate { cert, key },
            _ => {
                report.fail(
                    ConfigError::new(format!("{key}.tls"), "tls = \"terminate\" needs the certificate and its key")
                        .with_hint("add cert = \"app.pem\" and key = \"app.key\" (`warren cert server --name HOST` makes a development pair)"),
                );
                HttpTls::Off
            }
        },
        Some("passthrough") => HttpTls::Passthrough,
        Some(other) => {
            report.fail(
                ConfigError::new(format!("{key}.tls"), format!("unknown tls mode {other:?}"))
                    .with_hint("write tls = \"terminate\" (Warren holds the certificate) or tls = \"passthrough\" (the backend does)"),
            );
            HttpTls::Off
        }
    };
    if !matches!(tls, HttpTls::Terminate { .. }) && (file.cert.is_some() || file.key.is_some()) {
        report.fail(
            ConfigError::new(
                format!("{key}.cert"),
                "`cert` and `key` are for tls = \"terminate\"",
            )
            .with_hint("add tls = \"terminate\", or remove them"),
        );
    }
    let backend = match file.backend.as_deref().map(str::trim) {
        None | Some("http1") => Backend::Http1,
        Some("h2c") => Backend::H2c,
        Some(other) => {
            report.fail(
                ConfigError::new(format!("{key}.backend"), format!("unknown backend {other:?}"))
                    .with_hint("write backend = \"http1\" (default) or backend = \"h2c\" (HTTP/2 without TLS, e.g. gRPC)"),
            );
            Backend::Http1
        }
    };
    if let Some(host) = &file.host_rewrite
        && (host.is_empty()
            || http::HeaderValue::from_str(host).is_err()
            || host.contains(['/', ' ', '@']))
    {
        report.fail(
            ConfigError::new(
                format!("{key}.host_rewrite"),
                format!("{host:?} is not a host name"),
            )
            .with_hint("write a name with an optional port, e.g. \"app.internal:8080\""),
        );
    }
    let middleware = super::middleware::parse_chain(
        report,
        &format!("{key}.middleware"),
        file.middleware.as_deref().unwrap_or_default(),
    );
    let capture_body_bytes = match file.capture_body_bytes {
        None => 0,
        Some(n) => match usize::try_from(n) {
            Ok(n) if n <= crate::http::capture::MAX_BODY_BYTES => n,
            _ => {
                report.fail(
                    ConfigError::new(
                        format!("{key}.capture_body_bytes"),
                        format!("{n} is out of range"),
                    )
                    .with_hint(format!(
                        "write a number from 0 to {}",
                        crate::http::capture::MAX_BODY_BYTES
                    )),
                );
                0
            }
        },
    };
    HttpRoute {
        capture: file.capture.unwrap_or(true),
        capture_body_bytes,
        hosts,
        paths,
        tls,
        host_rewrite: file.host_rewrite,
        strip_prefix: file.strip_prefix.unwrap_or(false),
        backend,
        middleware,
    }
}

/// Two http services claiming the same host and path prefix (the route table's conflicts),
/// as config errors on the second service's `hosts`.
pub(crate) fn check_routes(config: &super::ServerConfig) -> Vec<ConfigError> {
    use crate::http::route::{RouteSpec, RouteTable};
    let specs: Vec<RouteSpec> = config
        .services
        .values()
        .filter_map(|service| {
            let route = service.http.as_ref()?;
            // Passthrough services are matched on the SNI, not routed by request.
            if route.tls == HttpTls::Passthrough {
                return None;
            }
            Some(RouteSpec {
                service: std::sync::Arc::from(service.name.as_str()),
                hosts: route.hosts.clone(),
                paths: route.paths.clone(),
            })
        })
        .collect();
    let mut errors: Vec<ConfigError> = match RouteTable::build(specs) {
        Ok(_) => Vec::new(),
        Err(conflicts) => conflicts
            .iter()
            .map(|conflict| {
                ConfigError::new(
                    format!("server.services.{}.hosts", conflict.second),
                    conflict.to_string(),
                )
            })
            .collect(),
    };
    // Two passthrough services for one name: the SNI could pick either.
    let mut seen: Vec<(&HostPattern, &str)> = Vec::new();
    for service in config.services.values() {
        let Some(route) = service
            .http
            .as_ref()
            .filter(|r| r.tls == HttpTls::Passthrough)
        else {
            continue;
        };
        for host in &route.hosts {
            if let Some((_, other)) = seen.iter().find(|(h, _)| *h == host) {
                errors.push(
                    ConfigError::new(
                        format!("server.services.{}.hosts", service.name),
                        format!(
                            "{host} is passed through by both `{other}` and `{}`",
                            service.name
                        ),
                    )
                    .with_hint("keep the name in one of them"),
                );
            }
            seen.push((host, &service.name));
        }
    }
    errors
}
