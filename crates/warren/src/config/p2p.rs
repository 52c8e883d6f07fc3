//! `[server.p2p]`: the server's part in peer-to-peer transfers — the mailbox where two
//! clients holding one join code meet (see [`crate::server::mailbox`]).
//!
//! ```toml
//! [server.p2p]
//! nameplate_ttl = "10m"      # how long an allocated code waits for its receiver
//! max_nameplates = 2048      # codes open at once (4-digit codes up to 2500)
//! rate_per_minute = 30       # allocations and claims per client IP per minute
//! ```
//!
//! The section's presence turns the mailbox on; without it a client's mailbox request is
//! refused with a message naming the section.

use std::time::Duration;

use serde::Deserialize;

use super::convert::duration;
use super::error::{ConfigError, Report};
use super::file::RawDuration;

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
}

/// The mailbox's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pConfig {
    /// How long an allocated nameplate waits for a receiver.
    pub nameplate_ttl: Duration,
    /// Nameplates open at once.
    pub max_nameplates: u32,
    /// Allocations plus claims per client IP per minute.
    pub rate_per_minute: u32,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            nameplate_ttl: Duration::from_secs(600),
            max_nameplates: 2048,
            rate_per_minute: 30,
        }
    }
}

/// Converts `[server.p2p]`.
pub(crate) fn convert(report: &mut Report, file: Option<FileP2p>) -> Option<P2pConfig> {
    let file = file?;
    let default = P2pConfig::default();
    let config = P2pConfig {
        nameplate_ttl: duration(
            report,
            "server.p2p.nameplate_ttl",
            file.nameplate_ttl.as_ref(),
            default.nameplate_ttl,
        ),
        max_nameplates: file.max_nameplates.unwrap_or(default.max_nameplates),
        rate_per_minute: file.rate_per_minute.unwrap_or(default.rate_per_minute),
    };
    if config.nameplate_ttl < Duration::from_secs(10) {
        report.fail(
            ConfigError::new("server.p2p.nameplate_ttl", "shorter than 10 s")
                .with_hint("give a receiver time to type the code, e.g. nameplate_ttl = \"10m\""),
        );
    }
    for (key, value) in [
        ("server.p2p.max_nameplates", config.max_nameplates),
        ("server.p2p.rate_per_minute", config.rate_per_minute),
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
