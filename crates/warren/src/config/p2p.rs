//! `[server.p2p]`: the server's part in peer-to-peer transfers — the mailbox where two
//! clients holding one join code meet (see [`crate::server::mailbox`]), and one UDP port
//! that answers address-discovery requests and relays the transfers whose peers cannot
//! reach each other directly (see [`crate::p2p::net::relay`]).
//!
//! ```toml
//! [server.p2p]
//! nameplate_ttl = "10m"      # how long an allocated code waits for its receiver
//! max_nameplates = 2048      # codes open at once (4-digit codes up to 2500)
//! rate_per_minute = 30       # allocations and claims per client IP per minute
//! udp_bind = "0.0.0.0:7000"  # reflector + relay; default: the server's bind (TCP transports)
//! relay = true               # relay transfers that cannot go direct
//! relay_max_bytes = "16GiB"  # per transfer, both directions
//! relay_rate = "1GiB"        # bytes per second per transfer ("1GiB/s" works too)
//! relay_max_pairs = 256      # transfers relayed at once
//! relay_idle = "60s"         # a relayed transfer silent this long is forgotten
//!
//! [server.p2p.services.ssh]   # a named P2P service (`warren p2p listen --service ssh`)
//! token = "${SSH_TOKEN}"      # both peers prove it; default: the server's default_token
//! ```
//!
//! The section's presence turns the mailbox and the UDP port on; without it a client's
//! mailbox request is refused with a message naming the section.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::convert::{duration, socket_addr};
use super::error::{ConfigError, Report};
use super::file::RawDuration;
use super::middleware::{FileSize, parse_size};
use crate::crypto::secret::Secret;

/// Default per-transfer relay cap: 16 GiB (both directions together, QUIC overhead
/// included). A relayed transfer is one the NATs forced through the server, and real ones
/// (disk images, a folder of videos) run to gigabytes, so the cap should not cut them;
/// it only stops one pair from using the server as a pipe without end. An operator who
/// pays for traffic sets it lower.
pub const DEFAULT_RELAY_MAX_BYTES: u64 = 16 << 30;
/// Default per-transfer relay rate: 1 GiB/s. Far above any link a relayed transfer
/// crosses in practice, so by default the rate never slows a transfer (nor a loopback
/// benchmark, which runs at a few hundred MiB/s here); an operator sharing a small uplink
/// sets it to a fraction of that uplink.
pub const DEFAULT_RELAY_RATE: u64 = 1 << 30;
/// Default number of transfers relayed at once.
pub const DEFAULT_RELAY_MAX_PAIRS: u32 = 256;
/// Default idle time after which a relayed transfer is forgotten.
pub const DEFAULT_RELAY_IDLE: Duration = Duration::from_secs(60);
/// Most relayed transfers at once that may be configured (each costs ~200 bytes; the
/// bound keeps the tables small).
pub const MAX_RELAY_PAIRS: u32 = 65_536;

/// The `[server.p2p]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileP2p {
    /// How long an allocated nameplate waits for a receiver. Default `"10m"`.
    pub nameplate_ttl: Option<RawDuration>,
    /// Nameplates open at once. Default 2048.
    pub max_nameplates: Option<u32>,
    /// Allocations plus claims per client IP per minute. Default 30.
    pub rate_per_minute: Option<u32>,
    /// The UDP socket of the address reflector and the relay. Default: the server's
    /// `bind` (same IP and port) with a TCP transport; required with `transport = "quic"`.
    pub udp_bind: Option<String>,
    /// Whether to relay transfers whose peers cannot reach each other. Default true.
    pub relay: Option<bool>,
    /// Bytes one relayed transfer may move, both directions together. Default `"16GiB"`.
    pub relay_max_bytes: Option<FileSize>,
    /// Bytes per second one relayed transfer may move. Default `"1GiB"` (per second).
    pub relay_rate: Option<FileSize>,
    /// Transfers relayed at once. Default 256.
    pub relay_max_pairs: Option<u32>,
    /// A relayed transfer with no datagram for this long is forgotten. Default `"60s"`.
    pub relay_idle: Option<RawDuration>,
    /// Named P2P services: peers that prove the token meet by the name.
    pub services: Option<BTreeMap<String, FileP2pService>>,
}

/// A `[server.p2p.services.NAME]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileP2pService {
    /// The token both peers prove. Default: the server's `default_token`.
    pub token: Option<String>,
}

/// The settings of the mailbox, the reflector and the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pConfig {
    /// How long an allocated nameplate waits for a receiver.
    pub nameplate_ttl: Duration,
    /// Nameplates open at once.
    pub max_nameplates: u32,
    /// Allocations plus claims per client IP per minute.
    pub rate_per_minute: u32,
    /// The UDP socket of the reflector and the relay (port 0 only when built in code:
    /// tests).
    pub udp_bind: SocketAddr,
    /// Whether the relay runs (the reflector always does).
    pub relay: bool,
    /// Bytes one relayed transfer may move, both directions together.
    pub relay_max_bytes: u64,
    /// Bytes per second one relayed transfer may move.
    pub relay_rate: u64,
    /// Transfers relayed at once.
    pub relay_max_pairs: u32,
    /// A relayed transfer with no datagram for this long is forgotten.
    pub relay_idle: Duration,
    /// Named P2P services and their tokens: a client offers or visits one by its name
    /// after proving the token (`warren p2p listen --service NAME`), and the token is
    /// the peers' PAKE password.
    pub services: BTreeMap<String, Secret>,
}

impl Default for P2pConfig {
    /// The defaults for a server bound on `0.0.0.0:7000` (the usual server port).
    fn default() -> Self {
        P2pConfig {
            nameplate_ttl: Duration::from_secs(600),
            max_nameplates: 2048,
            rate_per_minute: 30,
            udp_bind: SocketAddr::from(([0, 0, 0, 0], 7000)),
            relay: true,
            relay_max_bytes: DEFAULT_RELAY_MAX_BYTES,
            relay_rate: DEFAULT_RELAY_RATE,
            relay_max_pairs: DEFAULT_RELAY_MAX_PAIRS,
            relay_idle: DEFAULT_RELAY_IDLE,
            services: BTreeMap::new(),
        }
    }
}

/// The named P2P services with their tokens.
fn services(
    report: &mut Report,
    file: BTreeMap<String, FileP2pService>,
    default_token: Option<&Secret>,
) -> BTreeMap<String, Secret> {
    let mut services = BTreeMap::new();
    for (name, service) in file {
        let key = format!("server.p2p.services.{name}");
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            report.fail(
                ConfigError::new(&key, "not a usable service name").with_hint(
                    "use 1 to 64 letters, digits, `-` or `_`, e.g. [server.p2p.services.ssh]",
                ),
            );
            continue;
        }
        let token = match (service.token, default_token) {
            (Some(token), _) => Secret::new(token),
            (None, Some(default)) => default.clone(),
            (None, None) => {
                report.fail(
                    ConfigError::new(format!("{key}.token"), "no token, and [server] has no default_token")
                        .with_hint(format!(
                            "add token = \"${{WARREN_TOKEN}}\" to [{key}]: both peers of the service prove it"
                        )),
                );
                continue;
            }
        };
        services.insert(name, token);
    }
    services
}

/// Converts `[server.p2p]`; `bind` is the server's (the UDP port's default) and
/// `quic_on_bind` whether QUIC already holds its UDP side.
pub(crate) fn convert(
    report: &mut Report,
    file: Option<FileP2p>,
    bind: SocketAddr,
    quic_on_bind: bool,
    default_token: Option<&Secret>,
) -> Option<P2pConfig> {
    let file = file?;
    let default = P2pConfig::default();
    let udp_bind = match (&file.udp_bind, quic_on_bind) {
        (Some(text), _) => socket_addr(report, "server.p2p.udp_bind", text).unwrap_or(bind),
        (None, true) => {
            report.fail(
                ConfigError::new(
                    "server.p2p.udp_bind",
                    "missing `udp_bind`: with transport = \"quic\" the server port's UDP side is QUIC's",
                )
                .with_hint(format!(
                    "give the reflector and relay their own UDP port, e.g. udp_bind = \"{}\"",
                    SocketAddr::new(bind.ip(), bind.port().wrapping_add(1).max(1))
                )),
            );
            bind
        }
        (None, false) => bind,
    };
    let config = P2pConfig {
        nameplate_ttl: duration(
            report,
            "server.p2p.nameplate_ttl",
            file.nameplate_ttl.as_ref(),
            default.nameplate_ttl,
        ),
        max_nameplates: file.max_nameplates.unwrap_or(default.max_nameplates),
        rate_per_minute: file.rate_per_minute.unwrap_or(default.rate_per_minute),
        udp_bind,
        relay: file.relay.unwrap_or(default.relay),
        relay_max_bytes: size(
            report,
            "server.p2p.relay_max_bytes",
            file.relay_max_bytes.as_ref(),
            default.relay_max_bytes,
        ),
        relay_rate: size(
            report,
            "server.p2p.relay_rate",
            file.relay_rate.as_ref(),
            default.relay_rate,
        ),
        relay_max_pairs: file.relay_max_pairs.unwrap_or(default.relay_max_pairs),
        relay_idle: duration(
            report,
            "server.p2p.relay_idle",
            file.relay_idle.as_ref(),
            default.relay_idle,
        ),
        services: services(report, file.services.unwrap_or_default(), default_token),
    };
    if config.nameplate_ttl < Duration::from_secs(10) {
        report.fail(
            ConfigError::new("server.p2p.nameplate_ttl", "shorter than 10 s")
                .with_hint("give a receiver time to type the code, e.g. nameplate_ttl = \"10m\""),
        );
    }
    if config.relay_idle < Duration::from_secs(1) && !report.is_poisoned("server.p2p.relay_idle") {
        report.fail(
            ConfigError::new("server.p2p.relay_idle", "shorter than 1 s").with_hint(
                "QUIC keeps a transfer busy, but give it a few seconds: relay_idle = \"60s\"",
            ),
        );
    }
    if config.relay_max_pairs > MAX_RELAY_PAIRS {
        report.fail(
            ConfigError::new(
                "server.p2p.relay_max_pairs",
                format!("more than {MAX_RELAY_PAIRS}"),
            )
            .with_hint("remove the key for its default (256)"),
        );
    }
    for (key, value, least) in [
        (
            "server.p2p.relay_max_bytes",
            config.relay_max_bytes,
            1 << 20,
        ),
        ("server.p2p.relay_rate", config.relay_rate, 1 << 10),
    ] {
        if value < least && !report.is_poisoned(key) {
            report.fail(
                ConfigError::new(key, format!("{value} bytes is below the least, {least}"))
                    .with_hint("remove the key for its default, or set relay = false to turn the relay off"),
            );
        }
    }
    for (key, value) in [
        ("server.p2p.max_nameplates", config.max_nameplates),
        ("server.p2p.rate_per_minute", config.rate_per_minute),
        ("server.p2p.relay_max_pairs", config.relay_max_pairs),
    ] {
        if value == 0 {
            report.fail(
                ConfigError::new(key, "must be at least 1")
                    .with_hint("remove the key for its default"),
            );
        }
    }
    Some(config)
}

/// A size in bytes (`1048576`, `"16GiB"`), or a rate in bytes per second (`"1GiB"`,
/// `"1GiB/s"`): the value of `key`, or `default` after reporting why it is not one.
fn size(report: &mut Report, key: &str, raw: Option<&FileSize>, default: u64) -> u64 {
    let hint = "write a number of bytes or a size with a unit, e.g. \"16GiB\" (B, KB, MB, GB, KiB, MiB, GiB)";
    let parsed = match raw {
        None => return default,
        Some(FileSize::Bytes(bytes)) => u64::try_from(*bytes).ok(),
        Some(FileSize::Text(text)) => {
            let text = text.trim();
            parse_size(text.strip_suffix("/s").unwrap_or(text))
        }
    };
    match parsed {
        Some(bytes) => bytes,
        None => {
            let shown = match raw {
                Some(FileSize::Bytes(bytes)) => bytes.to_string(),
                Some(FileSize::Text(text)) => format!("{text:?}"),
                None => String::new(),
            };
            report.fail(ConfigError::new(key, format!("{shown} is not a size")).with_hint(hint));
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn server(extra: &str) -> Result<ServerConfig, String> {
        let text = format!(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"a-long-enough-pre-shared-key-0123\"\n{extra}"
        );
        ServerConfig::from_toml_str(&text, "server.toml").map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_follow_the_server_port() {
        let config = server("[server.p2p]\n").unwrap();
        let p2p = config.p2p.unwrap();
        assert_eq!(p2p.udp_bind, "0.0.0.0:7000".parse().unwrap());
        assert!(p2p.relay);
        assert_eq!(p2p.relay_max_bytes, 16 << 30);
        assert_eq!(p2p.relay_rate, 1 << 30);
        assert_eq!(p2p.relay_max_pairs, 256);
        assert_eq!(p2p.relay_idle, Duration::from_secs(60));
    }

    #[test]
    fn relay_keys_parse_sizes_rates_and_durations() {
        let config = server(
            "[server.p2p]\nudp_bind = \"127.0.0.1:7400\"\nrelay = false\nrelay_max_bytes = \"2GiB\"\nrelay_rate = \"10MiB/s\"\nrelay_max_pairs = 8\nrelay_idle = \"2m\"\n",
        )
        .unwrap();
        let p2p = config.p2p.unwrap();
        assert_eq!(p2p.udp_bind, "127.0.0.1:7400".parse().unwrap());
        assert!(!p2p.relay);
        assert_eq!(p2p.relay_max_bytes, 2 << 30);
        assert_eq!(p2p.relay_rate, 10 << 20);
        assert_eq!(p2p.relay_max_pairs, 8);
        assert_eq!(p2p.relay_idle, Duration::from_secs(120));
        let bytes = server("[server.p2p]\nrelay_max_bytes = 5000000\n").unwrap();
        assert_eq!(bytes.p2p.unwrap().relay_max_bytes, 5_000_000);
    }

    #[test]
    fn bad_relay_values_are_reported_together() {
        let error = server(
            "[server.p2p]\nudp_bind = \"example.com:1\"\nrelay_max_bytes = \"lots\"\nrelay_rate = 10\nrelay_max_pairs = 0\nrelay_idle = 5\n",
        )
        .unwrap_err();
        for key in [
            "udp_bind",
            "relay_max_bytes",
            "relay_rate",
            "relay_max_pairs",
            "relay_idle",
        ] {
            assert!(error.contains(key), "{key} in {error}");
        }
    }

    #[test]
    fn quic_needs_its_own_udp_port() {
        let quic = "transport = \"quic\"\n[server.quic]\ncert = \"/nonexistent/quic.pem\"\n";
        let error = server(&format!("{quic}[server.p2p]\n")).unwrap_err();
        assert!(error.contains("udp_bind"), "{error}");
        assert!(error.contains("7001"), "a hint with a port: {error}");
        let error = server(&format!(
            "{quic}[server.p2p]\nudp_bind = \"0.0.0.0:7000\"\n"
        ))
        .unwrap_err();
        assert!(error.contains("already used by server.bind"), "{error}");
        let fine = server(&format!(
            "{quic}[server.p2p]\nudp_bind = \"0.0.0.0:7001\"\n"
        ));
        assert!(fine.is_ok(), "{fine:?}");
    }

    #[test]
    fn a_udp_service_on_the_relay_port_is_refused() {
        let error = server(
            "[server.p2p]\nudp_bind = \"0.0.0.0:7400\"\n[server.services.dns]\ntype = \"udp\"\nbind = \"0.0.0.0:7400\"\ntoken = \"a-long-enough-token-0123456789\"\n",
        )
        .unwrap_err();
        assert!(error.contains("server.p2p.udp_bind"), "{error}");
    }
}
