//! `[server.tls]`, `[client.tls]`, `[server.ws]` and `[client.ws]`: the settings of the
//! transports that look like web traffic (`tls`, `ws`, `wss`).
//!
//! ```toml
//! [server]
//! bind = "0.0.0.0:443"
//! transport = "wss"        # the port also takes noise, tls and ws (sniffed)
//! [server.tls]
//! cert = "/etc/warren/fullchain.pem"   # with key: these files; alone: a self-signed
//! key = "/etc/warren/privkey.pem"      # certificate made there (default: the state dir's tls.pem)
//! [server.ws]
//! path = "/warren"         # default
//! decoy = true             # other HTTP requests get a plain page (default)
//! ping_interval = "30s"     # ping a connection whose stream is quiet this long (default)
//!
//! [client]
//! transport = "wss"
//! [client.tls]
//! server_name = "cdn.example.com"      # SNI; default: the server's host
//! # server_cert_sha256 = "…"           # pin the server's certificate
//! # ca = "/etc/ssl/certs/ca-certificates.crt"   # or verify against CAs (a CDN's edge)
//! [client.ws]
//! path = "/warren"
//! host = "cdn.example.com"             # Host header; default: the server's host
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, Report};

/// The WebSocket path both sides use unless told otherwise.
pub const DEFAULT_WS_PATH: &str = "/warren";

/// A `[server.tls]` or `[client.tls]` table, as the file says it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    /// Server: the certificate chain (PEM).
    pub cert: Option<String>,
    /// Server: its private key (PEM).
    pub key: Option<String>,
    /// Client: the name sent as SNI (and checked with `ca`).
    pub server_name: Option<String>,
    /// Client: the SHA-256 of the server's certificate (hex), to pin it.
    pub server_cert_sha256: Option<String>,
    /// Client: CA certificates (PEM) the server's chain must verify against.
    pub ca: Option<String>,
}

/// A `[server.ws]` or `[client.ws]` table, as the file says it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWs {
    /// The path of the upgrade request. Default `/warren`.
    pub path: Option<String>,
    /// Client: the `Host` header. Default: the server's host.
    pub host: Option<String>,
    /// Server: answer other HTTP requests with a plain page (`false`: 404). Default `true`.
    pub decoy: Option<bool>,
    /// How long a connection carrying a stream may stay silent before this side pings.
    /// Default `"30s"`.
    pub ping_interval: Option<super::file::RawDuration>,
}

/// A server's TLS certificate for `tls` and `wss`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTlsConfig {
    /// Certificate chain and key files; `None`: a self-signed certificate (made on first
    /// start) kept in `self_signed`.
    pub files: Option<(PathBuf, PathBuf)>,
    /// Where the self-signed certificate and its key live; `None`: the state directory's
    /// `tls.pem`.
    pub self_signed: Option<PathBuf>,
    /// Whether the config has a `[server.tls]` table: the server then takes `tls` and
    /// `wss` even when its own transport is another.
    pub configured: bool,
}

/// How a client checks the server's TLS certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsConfig {
    /// SNI; `None`: the server's host.
    pub server_name: Option<String>,
    /// The server certificate's SHA-256, if pinned.
    pub pin: Option<[u8; 32]>,
    /// CA certificates to verify the server against (instead of the PSK alone).
    pub ca: Option<PathBuf>,
}

/// WebSocket settings of one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsConfig {
    /// The upgrade request's path.
    pub path: String,
    /// Client: the `Host` header; `None`: the server's host.
    pub host: Option<String>,
    /// Server: answer other HTTP requests with a plain page.
    pub decoy: bool,
    /// How long a connection carrying a stream may stay silent before this side pings
    /// (under the idle timeouts of CDNs and reverse proxies in the path).
    pub ping_interval: std::time::Duration,
    /// Whether the config has the table: a server then takes `ws` and `wss` even when its
    /// own transport is another.
    pub configured: bool,
}

impl Default for WsConfig {
    fn default() -> Self {
        WsConfig {
            path: DEFAULT_WS_PATH.to_owned(),
            host: None,
            decoy: true,
            ping_interval: crate::transport::ws::PING_INTERVAL,
            configured: false,
        }
    }
}

/// Reads `[server.tls]`.
pub(crate) fn server_tls(report: &mut Report, file: Option<FileTls>) -> ServerTlsConfig {
    let Some(file) = file else {
        return ServerTlsConfig::default();
    };
    for (key, set) in [
        ("server_name", file.server_name.is_some()),
        ("server_cert_sha256", file.server_cert_sha256.is_some()),
        ("ca", file.ca.is_some()),
    ] {
        if set {
            report.fail(
                ConfigError::new(
                    format!("server.tls.{key}"),
                    format!("{key} is a client setting"),
                )
                .with_hint("move it to [client.tls], or remove it"),
            );
        }
    }
    let (files, self_signed) = match (file.cert, file.key) {
        (Some(cert), Some(key)) => (Some((PathBuf::from(cert), PathBuf::from(key))), None),
        (cert, None) => (None, cert.map(PathBuf::from)),
        (None, Some(_)) => {
            report.fail(
                ConfigError::new("server.tls.cert", "[server.tls] has key but no cert")
                    .with_hint("give both cert and key, or cert alone for a self-signed certificate kept in that file"),
            );
            (None, None)
        }
    };
    ServerTlsConfig {
        files,
        self_signed,
        configured: true,
    }
}

/// Reads `[client.tls]`; `transport` says whether it is used.
pub(crate) fn client_tls(
    report: &mut Report,
    uses_tls: bool,
    file: Option<FileTls>,
) -> ClientTlsConfig {
    let Some(file) = file else {
        return ClientTlsConfig::default();
    };
    if !uses_tls {
        report.fail(
            ConfigError::new(
                "client.tls",
                "[client.tls] is set but no transport is \"tls\" or \"wss\"",
            )
            .with_hint("add \"tls\" or \"wss\" to the transports, or remove the table"),
        );
    }
    for (key, set) in [("cert", file.cert.is_some()), ("key", file.key.is_some())] {
        if set {
            report.fail(
                ConfigError::new(
                    format!("client.tls.{key}"),
                    format!("{key} is a server setting"),
                )
                .with_hint("clients present no certificate on tls/wss: remove it"),
            );
        }
    }
    let pin = file.server_cert_sha256.as_deref().and_then(|text| {
        match crate::transport::quic::certs::parse_sha256_pin(text) {
            Ok(pin) => Some(pin),
            Err(error) => {
                report.fail(
                    ConfigError::new("client.tls.server_cert_sha256", error)
                        .with_hint("copy the SHA-256 the server logs at start (64 hex digits)"),
                );
                None
            }
        }
    });
    if pin.is_some() && file.ca.is_some() {
        report.fail(
            ConfigError::new(
                "client.tls.ca",
                "server_cert_sha256 and ca both say how to check the server",
            )
            .with_hint("keep one: the pin for a self-signed server, ca for a CA-signed one"),
        );
    }
    ClientTlsConfig {
        server_name: file.server_name,
        pin,
        ca: file.ca.map(PathBuf::from),
    }
}

/// Reads `[server.ws]` or `[client.ws]`.
pub(crate) fn ws(report: &mut Report, side: &str, file: Option<FileWs>) -> WsConfig {
    let Some(file) = file else {
        return WsConfig::default();
    };
    let mut config = WsConfig {
        configured: true,
        ..WsConfig::default()
    };
    config.ping_interval = super::convert::duration(
        report,
        &format!("{side}.ws.ping_interval"),
        file.ping_interval.as_ref(),
        crate::transport::ws::PING_INTERVAL,
    );
    if config.ping_interval.is_zero() {
        report.fail(
            ConfigError::new(format!("{side}.ws.ping_interval"), "must be more than 0")
                .with_hint("write a duration such as \"30s\""),
        );
    }
    if let Some(path) = file.path {
        if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            report.fail(
                ConfigError::new(
                    format!("{side}.ws.path"),
                    format!("{path:?} is not a URL path"),
                )
                .with_hint("write a path that starts with / and has no spaces, like \"/warren\""),
            );
        } else {
            config.path = path;
        }
    }
    match (side, file.host, file.decoy) {
        ("server", Some(_), _) => report.fail(
            ConfigError::new("server.ws.host", "host is a client setting")
                .with_hint("the server answers any Host; remove it"),
        ),
        ("client", _, Some(_)) => report.fail(
            ConfigError::new("client.ws.decoy", "decoy is a server setting")
                .with_hint("remove it from [client.ws]"),
        ),
        (_, host, decoy) => {
            if let Some(host) = host {
                if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == 0x7f) {
                    report.fail(
                        ConfigError::new("client.ws.host", format!("{host:?} is not a host name"))
                            .with_hint("write a name like \"cdn.example.com\""),
                    );
                } else {
                    config.host = Some(host);
                }
            }
            config.decoy = decoy.unwrap_or(true);
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_interval_is_a_positive_duration() {
        assert_eq!(
            WsConfig::default().ping_interval,
            crate::transport::ws::PING_INTERVAL
        );
        let file = |text: &str| -> FileWs {
            toml::from_str(&format!("ping_interval = \"{text}\"")).unwrap()
        };
        let mut report = Report::default();
        let config = ws(&mut report, "client", Some(file("500ms")));
        assert_eq!(config.ping_interval, std::time::Duration::from_millis(500));
        assert!(report.into_result(None).is_ok());
        let mut report = Report::default();
        ws(&mut report, "server", Some(file("0s")));
        let errors = report.into_result(None).unwrap_err();
        assert!(
            errors.to_string().contains("server.ws.ping_interval"),
            "{errors}"
        );
    }

    #[test]
    fn a_ws_table_alone_makes_the_server_take_websocket() {
        let mut report = Report::default();
        assert!(!WsConfig::default().configured);
        let config = ws(&mut report, "server", Some(FileWs::default()));
        assert!(config.configured);
        assert_eq!(config.path, DEFAULT_WS_PATH);
        assert!(config.decoy);
    }
}
