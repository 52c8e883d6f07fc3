//! High-availability settings: how a server spreads a service's visitors over the sessions
//! serving it (`load_balance`), a client's share of them (`weight`), the target health
//! check that withdraws a client while its target is down (`health_check`), and the list
//! of servers a client keeps a session with (`servers`).
//!
//! The file keys are parsed here, once for both sides; the typed values live in the service
//! structs of [`super::typed`].

use std::time::Duration;

use serde::Deserialize;
pub use warren_proto::balance::Strategy;

use super::duration::parse_duration;
use super::error::{ConfigError, Report, join_key};
use super::file::RawDuration;

/// Largest `weight` a client service may ask for.
pub const MAX_WEIGHT: u16 = 1000;

/// Default time between two health checks.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// Default deadline of one health check.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// Default consecutive failures before a target counts as down.
pub const DEFAULT_HEALTH_FAILURES: u32 = 3;

/// Most servers one client keeps sessions with.
pub const MAX_SERVERS: usize = 16;

/// A `health_check = { ... }` inline table, as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHealthCheck {
    /// `"tcp"` (connect) or `"http"` (a GET answered 2xx or 3xx). Required.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Time between checks. Default `"2s"`.
    pub interval: Option<RawDuration>,
    /// Deadline of one check. Default `"1s"`.
    pub timeout: Option<RawDuration>,
    /// Consecutive failures before the target counts as down (and successes before it
    /// counts as up again). Default 3.
    pub failures: Option<i64>,
    /// HTTP only: the path to GET. Default `"/"`.
    pub path: Option<String>,
}

/// What a health check does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthProbe {
    /// Connect to the target (and close).
    Tcp,
    /// `GET path` over HTTP/1.1; 2xx and 3xx pass.
    Http {
        /// The path, starting with `/`.
        path: String,
    },
}

/// A client service's target health check (frp's `healthCheck`): while it fails, the client
/// withdraws the service from its sessions and offers it again when it passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// What one check does.
    pub probe: HealthProbe,
    /// Time between checks.
    pub interval: Duration,
    /// Deadline of one check.
    pub timeout: Duration,
    /// Consecutive failures before down, and consecutive passes before up again.
    pub failures: u32,
}

impl HealthCheck {
    /// A TCP connect check with the default timings.
    pub fn tcp() -> HealthCheck {
        HealthCheck {
            probe: HealthProbe::Tcp,
            interval: DEFAULT_HEALTH_INTERVAL,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            failures: DEFAULT_HEALTH_FAILURES,
        }
    }
}

/// Parses a server service's `load_balance`.
pub(crate) fn load_balance(report: &mut Report, key: &str, text: Option<&str>) -> Strategy {
    let Some(text) = text else {
        return Strategy::default();
    };
    Strategy::from_name(text.trim()).unwrap_or_else(|| {
        report.fail(
            ConfigError::new(
                join_key(key, "load_balance"),
                format!("unknown load_balance {text:?}"),
            )
            .with_hint("write \"least-connections\" (the default), \"round-robin\" or \"random\""),
        );
        Strategy::default()
    })
}

/// Parses a client service's `weight` (1 when unset).
pub(crate) fn weight(report: &mut Report, key: &str, value: Option<i64>) -> u16 {
    let Some(value) = value else {
        return 1;
    };
    match u16::try_from(value) {
        Ok(weight) if (1..=MAX_WEIGHT).contains(&weight) => weight,
        _ => {
            report.fail(
                ConfigError::new(
                    join_key(key, "weight"),
                    format!("weight {value} is out of range"),
                )
                .with_hint(format!(
                    "write a whole number from 1 to {MAX_WEIGHT}: this client's share of the service's visitors relative to other clients'"
                )),
            );
            1
        }
    }
}

/// Parses a client service's `health_check` table.
pub(crate) fn health_check(
    report: &mut Report,
    key: &str,
    file: Option<FileHealthCheck>,
) -> Option<HealthCheck> {
    let file = file?;
    let key = join_key(key, "health_check");
    let probe = match file.kind.as_deref().map(str::trim) {
        Some("tcp") => {
            if file.path.is_some() {
                report.fail(
                    ConfigError::new(
                        join_key(&key, "path"),
                        "`path` is for type = \"http\" checks",
                    )
                    .with_hint("remove it, or write type = \"http\""),
                );
            }
            HealthProbe::Tcp
        }
        Some("http") => {
            let path = file.path.unwrap_or_else(|| "/".to_owned());
            if !path.starts_with('/') || path.chars().any(|c| c.is_control() || c == ' ') {
                report.fail(
                    ConfigError::new(join_key(&key, "path"), format!("invalid path {path:?}"))
                        .with_hint(
                            "write an absolute path without spaces, e.g. path = \"/healthz\"",
                        ),
                );
            }
            HealthProbe::Http { path }
        }
        other => {
            let message = match other {
                Some(text) => format!("unknown health check type {text:?}"),
                None => "a health check needs a type".to_owned(),
            };
            report.fail(
                ConfigError::new(join_key(&key, "type"), message)
                    .with_hint("write type = \"tcp\" (connect) or type = \"http\" (GET path)"),
            );
            HealthProbe::Tcp
        }
    };
    let interval = positive(
        report,
        &key,
        "interval",
        file.interval.as_ref(),
        DEFAULT_HEALTH_INTERVAL,
    );
    let timeout = positive(
        report,
        &key,
        "timeout",
        file.timeout.as_ref(),
        DEFAULT_HEALTH_TIMEOUT,
    );
    let failures = match file.failures {
        None => DEFAULT_HEALTH_FAILURES,
        Some(n) if (1..=100).contains(&n) => n as u32,
        Some(n) => {
            report.fail(
                ConfigError::new(
                    join_key(&key, "failures"),
                    format!("failures {n} is out of range"),
                )
                .with_hint("write a whole number from 1 to 100 (default 3)"),
            );
            DEFAULT_HEALTH_FAILURES
        }
    };
    Some(HealthCheck {
        probe,
        interval,
        timeout,
        failures,
    })
}

/// A duration key that must be more than zero.
fn positive(
    report: &mut Report,
    key: &str,
    field: &str,
    raw: Option<&RawDuration>,
    default: Duration,
) -> Duration {
    let key = join_key(key, field);
    let value = match raw {
        None => return default,
        Some(RawDuration::Text(text)) => {
            parse_duration(text).map_err(|e| (e.to_string(), e.hint()))
        }
        Some(RawDuration::Integer(n)) => Err((
            format!("a bare number ({n}) has no unit"),
            format!("write {field} = \"{n}s\""),
        )),
        Some(RawDuration::Float(n)) => Err((
            format!("a bare number ({n}) has no unit"),
            format!("write {field} = \"2s\""),
        )),
    };
    match value {
        Ok(duration) if !duration.is_zero() => duration,
        Ok(_) => {
            report.fail(
                ConfigError::new(&key, "must be more than zero")
                    .with_hint(format!("write {field} = \"1s\"")),
            );
            default
        }
        Err((message, hint)) => {
            report.fail(ConfigError::new(&key, message).with_hint(hint));
            default
        }
    }
}
