//! `[server.quic]` and `[client.quic]`: how the QUIC transport (`transport = "quic"`)
//! authenticates and shapes its packets.
//!
//! ```toml
//! [server]
//! transport = "quic"            # the server listens on UDP at `bind`
//! [server.quic]
//! auth = "psk"                  # default: self-signed certificate + PSK proof
//! cert = "/var/lib/warren/quic.pem"   # psk: made on first start (default: state dir)
//! max_packet = 1452             # largest UDP payload QUIC sends; default 1452
//! congestion = "model"          # Warren's own (default); or quinn's "cubic", "bbr"
//!
//! [client.quic]
//! server_cert_sha256 = "…"      # psk: optional pin of the server's certificate
//! # auth = "mtls", cert = "client.pem", key = "client.key", ca = "ca.pem"
//! ```
//!
//! In `mtls` mode `warren cert ca | server | client` makes the files: the server presents
//! `cert`/`key` and verifies client certificates against `ca`; the client presents its
//! `cert`/`key` and verifies the server against `ca` (and `server_name`, default the
//! server's host).

use std::path::PathBuf;

use serde::Deserialize;

use super::error::{ConfigError, Report};
use crate::transport::quic::settings::{
    Congestion, INTERNET_UDP_PAYLOAD, MAX_GSO_UDP_PAYLOAD, MIN_UDP_PAYLOAD, QuicSettings,
};

/// The most a QUIC packet's UDP payload may be (quinn's and UDP's limit over IPv4).
pub const MAX_PACKET: u16 = 65_527;

/// A `[server.quic]` or `[client.quic]` table, as the file says it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuic {
    /// `"psk"` (default) or `"mtls"`.
    pub auth: Option<String>,
    /// Server, psk: the self-signed certificate file (made if missing). mtls: this side's
    /// certificate chain (PEM).
    pub cert: Option<String>,
    /// mtls: this side's private key (PEM).
    pub key: Option<String>,
    /// mtls: the CA that signs the other side's certificate (PEM).
    pub ca: Option<String>,
    /// Client, psk: the SHA-256 of the server's certificate (hex), to pin it.
    pub server_cert_sha256: Option<String>,
    /// Client, mtls: the name the server's certificate must hold. Default: the server's
    /// host.
    pub server_name: Option<String>,
    /// Largest UDP payload QUIC sends, 1200..=65527. Default 1452 (the internet's).
    pub max_packet: Option<i64>,
    /// `"model"` (Warren's, the default), `"cubic"` or `"bbr"` (quinn's).
    pub congestion: Option<String>,
}

/// How a QUIC connection is authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuicAuth {
    /// A self-signed server certificate and the PSK proven over the TLS exporter.
    Psk {
        /// Server: the certificate file (`None`: the state directory's `quic.pem`).
        cert: Option<PathBuf>,
        /// Client: the server certificate's SHA-256, if pinned.
        pin: Option<[u8; 32]>,
    },
    /// Certificates both ways, signed by one CA.
    Mtls {
        /// This side's certificate chain.
        cert: PathBuf,
        /// This side's key.
        key: PathBuf,
        /// The CA of the other side.
        ca: PathBuf,
        /// Client: the name the server's certificate must hold (default: its host).
        server_name: Option<String>,
    },
}

/// The QUIC transport's settings of one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicConfig {
    /// How connections authenticate.
    pub auth: QuicAuth,
    /// Largest UDP payload sent.
    pub max_packet: u16,
    /// The congestion controller.
    pub congestion: Congestion,
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            auth: QuicAuth::Psk {
                cert: None,
                pin: None,
            },
            max_packet: INTERNET_UDP_PAYLOAD,
            congestion: Congestion::Model,
        }
    }
}

impl QuicConfig {
    /// The quinn settings: the internet preset with this packet size. Packets above 1452
    /// bytes (loopback, jumbo frames) get the loopback preset's larger socket buffers;
    /// above 6500 bytes GSO is turned off, since ten such packets overflow one batch.
    pub fn settings(&self) -> QuicSettings {
        let base = if self.max_packet > INTERNET_UDP_PAYLOAD {
            QuicSettings::loopback()
        } else {
            QuicSettings::internet()
        };
        QuicSettings {
            max_udp_payload: self.max_packet,
            segmentation_offload: self.max_packet <= MAX_GSO_UDP_PAYLOAD,
            congestion: self.congestion,
            ..base
        }
    }

    /// The psk mode's certificate file on a server: the configured one, else `quic.pem`
    /// in Warren's state directory (`$STATE_DIRECTORY`, `$XDG_STATE_HOME/warren` or
    /// `~/.local/state/warren`).
    ///
    /// # Errors
    /// No configured path and no state directory to default to.
    pub fn server_cert_path(cert: Option<&PathBuf>) -> Result<PathBuf, String> {
        if let Some(path) = cert {
            return Ok(path.clone());
        }
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let dir = var("STATE_DIRECTORY")
            .map(PathBuf::from)
            .or_else(|| var("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("warren")))
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".local/state/warren")))
            .ok_or_else(|| {
                "no place for the QUIC certificate: set cert = \"/path/quic.pem\" in [server.quic] (or HOME / STATE_DIRECTORY)".to_owned()
            })?;
        Ok(dir.join("quic.pem"))
    }
}

/// Which side a `quic` table belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Server,
    Client,
}

impl Side {
    fn table(self) -> &'static str {
        match self {
            Side::Server => "server.quic",
            Side::Client => "client.quic",
        }
    }
}

/// The typed settings of a `quic` table; every problem goes to `report`.
pub(crate) fn convert(report: &mut Report, side: Side, file: Option<FileQuic>) -> QuicConfig {
    let Some(file) = file else {
        return QuicConfig::default();
    };
    let table = side.table();
    let key = |name: &str| format!("{table}.{name}");
    let mut config = QuicConfig::default();
    if let Some(packet) = file.max_packet {
        match u16::try_from(packet) {
            Ok(packet) if (MIN_UDP_PAYLOAD..=MAX_PACKET).contains(&packet) => {
                config.max_packet = packet;
            }
            _ => report.fail(
                ConfigError::new(
                    key("max_packet"),
                    format!("{packet} is not a QUIC packet size"),
                )
                .with_hint(format!(
                    "write {MIN_UDP_PAYLOAD}..={MAX_PACKET}: 1452 for the internet (the default), more only where every hop carries it (loopback, jumbo frames)"
                )),
            ),
        }
    }
    if let Some(name) = &file.congestion {
        match name.trim().to_ascii_lowercase().as_str() {
            "cubic" => config.congestion = Congestion::Cubic,
            "bbr" => config.congestion = Congestion::BbrExperimental,
            "model" => config.congestion = Congestion::Model,
            _ => report.fail(
                ConfigError::new(
                    key("congestion"),
                    format!("unknown congestion controller `{name}`"),
                )
                .with_hint(
                    "write \"model\" (Warren's own), \"cubic\" or \"bbr\" (quinn's, experimental)",
                ),
            ),
        }
    }
    let path = |text: &Option<String>| text.as_ref().map(PathBuf::from);
    let mtls = match file.auth.as_deref().map(str::trim) {
        None | Some("psk") => false,
        Some("mtls") => true,
        Some(other) => {
            report.fail(
                ConfigError::new(key("auth"), format!("unknown QUIC auth mode `{other}`"))
                    .with_hint("write \"psk\" (the default) or \"mtls\""),
            );
            false
        }
    };
    if mtls {
        let mut need = |name: &str, value: &Option<String>, what: &str| -> PathBuf {
            path(value).unwrap_or_else(|| {
                report.fail(
                    ConfigError::new(key(name), format!("auth = \"mtls\" needs {what}"))
                        .with_hint("`warren cert ca`, then `warren cert server` / `warren cert client` make the files"),
                );
                PathBuf::new()
            })
        };
        let cert = need("cert", &file.cert, "this side's certificate (PEM)");
        let key_path = need("key", &file.key, "this side's private key (PEM)");
        let ca = need("ca", &file.ca, "the CA that signs the other side (PEM)");
        if file.server_cert_sha256.is_some() {
            report.fail(
                ConfigError::new(
                    key("server_cert_sha256"),
                    "a pin is for auth = \"psk\"; mtls verifies the server against `ca`",
                )
                .with_hint("remove server_cert_sha256, or use auth = \"psk\""),
            );
        }
        if side == Side::Server && file.server_name.is_some() {
            report.fail(
                ConfigError::new(key("server_name"), "server_name is a client setting")
                    .with_hint("remove it from [server.quic]"),
            );
        }
        config.auth = QuicAuth::Mtls {
            cert,
            key: key_path,
            ca,
            server_name: file.server_name.clone(),
        };
        return config;
    }
    for (name, value) in [
        ("key", &file.key),
        ("ca", &file.ca),
        ("server_name", &file.server_name),
    ] {
        if value.is_some() {
            report.fail(
                ConfigError::new(key(name), format!("{name} is for auth = \"mtls\""))
                    .with_hint(format!("remove {name}, or set auth = \"mtls\"")),
            );
        }
    }
    let pin = match (&file.server_cert_sha256, side) {
        (Some(_), Side::Server) => {
            report.fail(
                ConfigError::new(
                    key("server_cert_sha256"),
                    "server_cert_sha256 is a client setting",
                )
                .with_hint(
                    "put it in [client.quic]; the server logs its certificate's SHA-256 at start",
                ),
            );
            None
        }
        (Some(text), Side::Client) => match crate::transport::quic::certs::parse_sha256_pin(text) {
            Ok(pin) => Some(pin),
            Err(problem) => {
                report.fail(
                    ConfigError::new(key("server_cert_sha256"), problem)
                        .with_hint("copy the SHA-256 the server logs at start (64 hex digits)"),
                );
                None
            }
        },
        (None, _) => None,
    };
    if side == Side::Client && file.cert.is_some() {
        report.fail(
            ConfigError::new(key("cert"), "a client's cert is for auth = \"mtls\"")
                .with_hint("remove cert, or set auth = \"mtls\" with cert, key and ca"),
        );
    }
    config.auth = QuicAuth::Psk {
        cert: if side == Side::Server {
            path(&file.cert)
        } else {
            None
        },
        pin,
    };
    config
}
