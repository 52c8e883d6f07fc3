//! The route decision of an HTTP request: which host and path it is routed on
//! ([`route_key`], [`RouteKey`]) and which service serves them ([`RouteTable`]).
//!
//! Pure functions, no IO. The server computes the [`RouteKey`] **once** per request and
//! everything after (the middleware chain, the rewrite, the log, the inspector) reads that
//! value, never the raw headers: frp's CVE-2026-40910 came from routing on one header and
//! authenticating on another. So the host of a request is defined in exactly one place,
//! and every way two headers could name two different hosts is refused with a 400 instead
//! of resolved by a rule some other component might not share.
//!
//! # The host of a request
//!
//! | request | host |
//! |---|---|
//! | HTTP/2 (or 3) with `:authority` | `:authority` (hyper puts it in `uri().authority()`) |
//! | HTTP/2 without `:authority` | the `Host` header |
//! | HTTP/1.x, absolute-form target (`GET http://h/p`) | the target's authority |
//! | HTTP/1.x, origin-form target (`GET /p`) | the `Host` header |
//!
//! Refused, with [`RouteKeyError`] (all 400): two or more `Host` headers; no host at all
//! (and, as RFC 9112 §3.2 requires, an HTTP/1.1 request without `Host` even when its target
//! is absolute); a host that is not `name[:port]` or `[ipv6][:port]`; user information
//! (`user@host`); a target authority and a `Host` header naming different hosts (compared
//! after normalization, with the scheme's default port filled in, so `a.com` and
//! `A.COM.:80` agree for `http`); a scheme other than `http`/`https`; an authority-form
//! (`CONNECT`) target, since this is not a forward proxy; a path [`normalize_path`] refuses.
//! Other headers (`X-Forwarded-Host`, `Forwarded`) never choose the route.
//!
//! Hosts are normalized: names by [`warren_proto::sni::normalize_host_name`] (the same
//! rules as TLS SNI: ASCII letters, digits, `-`, `.`; lowercase; no trailing dot); IPv4
//! addresses are names made of digits; IPv6 addresses are kept **in brackets**, in their
//! canonical text (`[::1]`), so a host never contains a `:` outside brackets and
//! `format!("{host}:{port}")` is always well-formed. The port is kept apart, as written.
//!
//! # Paths
//!
//! [`normalize_path`] applies RFC 3986 §6.2.2 normalization and refuses what servers read
//! differently (see its documentation). Duplicate slashes are **merged** (`//a` is `/a`),
//! as nginx does with `merge_slashes on`; the asterisk-form target of `OPTIONS *` is
//! **refused**, since nothing behind a shared port can answer for the whole server.
//!
//! # Route table
//!
//! A service lists host patterns ([`HostPattern`]: an exact name or `*.suffix`) and path
//! prefixes. [`RouteTable::lookup`] picks the host first, an exact name before a wildcard,
//! and then the longest matching prefix by segments among that host's routes. A host
//! named exactly never falls back to a wildcard that also covers it: the host's own routes
//! decide, as nginx picks a `server` before a `location`. Prefixes match whole segments:
//! `/api` matches `/api` and `/api/x`, never `/apiary`.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;
use std::sync::Arc;

use http::{Request, StatusCode, Version, header::HOST};
use warren_proto::sni::{HostNameError, normalize_host_name};

/// The most characters of a visitor's value an error message quotes.
const MAX_QUOTED: usize = 100;

// ---------------------------------------------------------------------------------------
// Host patterns
// ---------------------------------------------------------------------------------------

/// Which hosts a service answers for, as the config writes them.
///
/// An exact name (`app.example.com`, or an address: `192.0.2.7`, `[2001:db8::7]`), or a
/// one-label wildcard `*.preview.example.com`, which matches `a.preview.example.com` but
/// neither `a.b.preview.example.com` nor `preview.example.com`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// This host only (normalized like a [`RouteKey`] host).
    Exact(String),
    /// Any host of one more label in front of this suffix (the suffix, without `*.`).
    Wildcard(String),
}

impl HostPattern {
    /// Parses a host pattern from the config, normalizing it like a request's host
    /// (lowercase, no trailing dot, IPv6 in brackets).
    ///
    /// # Errors
    ///
    /// A sentence naming the problem and the fix, for the config error report.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        if let Some(suffix) = text.strip_prefix("*.") {
            if suffix.contains('*') {
                return Err(format!(
                    "the host pattern `{text}` has more than one `*`; a wildcard covers exactly one label, as in `*.example.com`"
                ));
            }
            return normalize_host_name(suffix.as_bytes())
                .map(HostPattern::Wildcard)
                .map_err(|problem| {
                    format!(
                        "the host pattern `{text}` is not `*.` followed by a host name: {problem}"
                    )
                });
        }
        if text.contains('*') {
            return Err(format!(
                "the host pattern `{text}` has a `*` that is not a whole first label; write `*.example.com` to match one label in front of example.com"
            ));
        }
        // A bare IPv6 address is accepted and put in brackets, the form requests use.
        if let Ok(address) = text.parse::<Ipv6Addr>() {
            return Ok(HostPattern::Exact(format!("[{address}]")));
        }
        match parse_authority(text.as_bytes()) {
            Ok((host, None)) => Ok(HostPattern::Exact(host)),
            Ok((_, Some(_))) => Err(format!(
                "the host pattern `{text}` has a port; write the host alone, since the port is the listener's"
            )),
            Err(AuthorityError::Userinfo) => Err(format!(
                "the host pattern `{text}` has a `@`; write the host name alone"
            )),
            Err(AuthorityError::Invalid(problem)) => {
                Err(format!("the host pattern `{text}` is not valid: {problem}"))
            }
        }
    }

    /// Whether `host` (normalized, as in [`RouteKey::host`]) is one this pattern covers.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => name == host,
            HostPattern::Wildcard(suffix) => {
                wildcard_suffix(host).is_some_and(|host_suffix| host_suffix == suffix)
            }
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Wildcard(suffix) => write!(f, "*.{suffix}"),
        }
    }
}

impl FromStr for HostPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HostPattern::parse(text)
    }
}

/// The part of `host` a wildcard would have to name: everything after a non-empty first
/// label. `None` for a single label.
fn wildcard_suffix(host: &str) -> Option<&str> {
    match host.split_once('.') {
        Some((first, suffix)) if !first.is_empty() && !suffix.is_empty() => Some(suffix),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// The route key
// ---------------------------------------------------------------------------------------

/// The host and path a request is routed on: computed once by [`route_key`], then read by
/// every later step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteKey {
    /// Lowercase, without port or trailing dot; an IPv6 address in brackets, canonical
    /// (`[::1]`). See the module documentation for which header it comes from.
    pub host: String,
    /// The port written after the host, if any (no default filled in).
    pub port: Option<u16>,
    /// The path, normalized by [`normalize_path`]; always starts with `/`.
    pub path: String,
    /// The query, as received (without `?`); not part of the route decision.
    pub query: Option<String>,
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        f.write_str(&self.path)?;
        if let Some(query) = &self.query {
            write!(f, "?{query}")?;
        }
        Ok(())
    }
}

/// Why a request has no route key: it is malformed or ambiguous, and is answered with
/// [`RouteKeyError::status`] before any service sees it. Each message is meant for the
/// visitor; quoted values are escaped and shortened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteKeyError {
    /// More than one `Host` header.
    #[error("the request has {count} Host headers; send exactly one")]
    MultipleHosts {
        /// How many.
        count: usize,
    },
    /// No `Host` header and no authority in the target.
    #[error(
        "the request does not name a host; send a Host header naming the site (HTTP/1.1 requires one)"
    )]
    MissingHost,
    /// The host is not `name[:port]` or `[ipv6][:port]`.
    #[error("the host `{value}` is not valid: {problem}")]
    InvalidHost {
        /// The value received (escaped, shortened).
        value: String,
        /// What is wrong with it.
        problem: HostProblem,
    },
    /// The authority carries user information (`user@host`). Not quoted: it may be a
    /// password.
    #[error(
        "the request's host includes user information (`user@host`); remove the user name and password from the URL"
    )]
    Userinfo,
    /// The target's authority (absolute-form or `:authority`) and the `Host` header name
    /// different hosts.
    #[error(
        "the request target names host `{target}` but the Host header names `{header}`; send the same host in both"
    )]
    HostMismatch {
        /// The target's host and port.
        target: String,
        /// The header's host and port.
        header: String,
    },
    /// An absolute-form target with a scheme other than `http` or `https`.
    #[error(
        "the request target uses the scheme `{scheme}`; only http and https URLs are served here"
    )]
    UnsupportedScheme {
        /// The scheme (escaped, shortened).
        scheme: String,
    },
    /// An authority-form target (`CONNECT host:port`).
    #[error(
        "the request is a CONNECT to a host and port; this port serves web sites and is not a forward proxy, so request a path instead"
    )]
    AuthorityForm,
    /// The path is refused by [`normalize_path`].
    #[error(transparent)]
    Path(#[from] PathError),
}

impl RouteKeyError {
    /// The status to answer with: 400 Bad Request, since every case is a malformed or
    /// ambiguous request that retrying unchanged cannot fix.
    pub fn status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

/// What is wrong with a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostProblem {
    /// The name is not a valid host name.
    #[error(transparent)]
    Name(#[from] HostNameError),
    /// The port is not a number from 0 to 65535.
    #[error("the port must be a number from 0 to 65535 after a single `:`")]
    Port,
    /// The text in brackets is not an IPv6 address (zone ids are not accepted either).
    #[error("the text in brackets is not an IPv6 address")]
    Ipv6,
    /// An IPv6 address without brackets.
    #[error("an IPv6 address must be written in brackets, as in `[2001:db8::1]:8080`")]
    UnbracketedIpv6,
}

/// Computes the route key of a request: its **one** host (see the module documentation
/// for which header that is), the explicit port, the normalized path and the query.
///
/// # Errors
///
/// [`RouteKeyError`] for every malformed or ambiguous request; answer it with
/// [`RouteKeyError::status`] and the error's message.
pub fn route_key<B>(request: &Request<B>) -> Result<RouteKey, RouteKeyError> {
    let uri = request.uri();

    let mut host_headers = request.headers().get_all(HOST).iter();
    let host_header = host_headers.next();
    let more = host_headers.count();
    if more > 0 {
        return Err(RouteKeyError::MultipleHosts { count: more + 1 });
    }

    let scheme = uri.scheme_str();
    if let Some(scheme) = scheme
        && !scheme.eq_ignore_ascii_case("http")
        && !scheme.eq_ignore_ascii_case("https")
    {
        return Err(RouteKeyError::UnsupportedScheme {
            scheme: quoted(scheme.as_bytes()),
        });
    }
    // An authority without a scheme is only ever the authority-form of CONNECT (HTTP/1.1
    // `CONNECT h:p`, or HTTP/2 CONNECT without `:scheme` and `:path`).
    if scheme.is_none() && uri.authority().is_some() {
        return Err(RouteKeyError::AuthorityForm);
    }

    // With authority-form refused, an authority in the URI is HTTP/2's `:authority` or
    // the host of an HTTP/1.x absolute-form target: either way the target's host.
    let target = uri.authority();
    let header = host_header
        .map(|value| parse_authority(value.as_bytes()).map_err(|e| e.into_route(value.as_bytes())))
        .transpose()?;

    let (host, port) = match (target, header) {
        (Some(authority), header) => {
            let raw = authority.as_str().as_bytes();
            let (host, port) = parse_authority(raw).map_err(|e| e.into_route(raw))?;
            match header {
                Some((header_host, header_port)) => {
                    let default = scheme.and_then(default_port);
                    if header_host != host || header_port.or(default) != port.or(default) {
                        return Err(RouteKeyError::HostMismatch {
                            target: host_and_port(&host, port),
                            header: host_and_port(&header_host, header_port),
                        });
                    }
                }
                // RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request without
                // Host, whatever its target.
                None if request.version() == Version::HTTP_11 => {
                    return Err(RouteKeyError::MissingHost);
                }
                None => {}
            }
            (host, port)
        }
        (None, Some(header)) => header,
        (None, None) => return Err(RouteKeyError::MissingHost),
    };

    Ok(RouteKey {
        host,
        port,
        path: normalize_path(uri.path())?,
        query: uri.query().map(str::to_owned),
    })
}

/// The port a scheme implies.
fn default_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") {
        Some(443)
    } else {
        None
    }
}

fn host_and_port(host: &str, port: Option<u16>) -> String {
    match port {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// Why an authority did not parse.
enum AuthorityError {
    Userinfo,
    Invalid(HostProblem),
}

impl AuthorityError {
    fn into_route(self, raw: &[u8]) -> RouteKeyError {
        match self {
            AuthorityError::Userinfo => RouteKeyError::Userinfo,
            AuthorityError::Invalid(problem) => RouteKeyError::InvalidHost {
                value: quoted(raw),
                problem,
            },
        }
    }
}

/// Parses `host[:port]` or `[ipv6][:port]` (a `Host` header or a URI authority) into the
/// normalized host and the port.
fn parse_authority(raw: &[u8]) -> Result<(String, Option<u16>), AuthorityError> {
    if raw.contains(&b'@') {
        return Err(AuthorityError::Userinfo);
    }
    let invalid = AuthorityError::Invalid;
    let (host, port) = if let Some(rest) = raw.strip_prefix(b"[") {
        let close = rest
            .iter()
            .position(|&byte| byte == b']')
            .ok_or(invalid(HostProblem::Ipv6))?;
        let (inside, after) = rest.split_at(close);
        let address = std::str::from_utf8(inside)
            .ok()
            .and_then(|text| text.parse::<Ipv6Addr>().ok())
            .ok_or(invalid(HostProblem::Ipv6))?;
        // `after` starts with the `]` found above.
        let port = match after.get(1..).unwrap_or_default() {
            [] => None,
            [b':', digits @ ..] => Some(parse_port(digits).ok_or(invalid(HostProblem::Port))?),
            _ => return Err(invalid(HostProblem::Port)),
        };
        (format!("[{address}]"), port)
    } else {
        let (name, port) = match raw.iter().position(|&byte| byte == b':') {
            None => (raw, None),
            Some(colon) => {
                let (name, rest) = raw.split_at(colon);
                let digits = rest.get(1..).unwrap_or_default();
                if digits.contains(&b':') {
                    return Err(invalid(HostProblem::UnbracketedIpv6));
                }
                let port = parse_port(digits).ok_or(invalid(HostProblem::Port))?;
                (name, Some(port))
            }
        };
        let name = normalize_host_name(name).map_err(|problem| invalid(problem.into()))?;
        (name, port)
    };
    Ok((host, port))
}

/// A port: one to five digits, at most 65535.
fn parse_port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u16, |port, &digit| {
        port.checked_mul(10)?.checked_add(u16::from(digit - b'0'))
    })
}

/// A visitor's bytes, safe to put in a message: printable ASCII kept, the rest escaped,
/// at most [`MAX_QUOTED`] characters.
fn quoted(raw: &[u8]) -> String {
    let mut out = String::new();
    for &byte in raw.iter().take(MAX_QUOTED) {
        if byte.is_ascii_graphic() || byte == b' ' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    if raw.len() > MAX_QUOTED {
        out.push('…');
    }
    out
}

// ---------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------

/// Why a path is refused. Each is a 400: the path is malformed, or servers are known to
/// read it differently, so routing on it could send a visitor past a prefix's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path does not start with `/`.
    #[error("the request path does not start with `/`; request a path such as `/index.html`")]
    NotAbsolute,
    /// The asterisk-form target of `OPTIONS *`.
    #[error(
        "the request target `*` (OPTIONS for the whole server) is not served here; send OPTIONS for a path such as `/`"
    )]
    Asterisk,
    /// A `%` not followed by two hex digits.
    #[error(
        "the request path has a `%` at byte {at} that is not followed by two hex digits; write a literal `%` as `%25`"
    )]
    InvalidPercentEncoding {
        /// Where the `%` is.
        at: usize,
    },
    /// `%2F`: servers disagree on whether it separates segments.
    #[error(
        "the request path contains an encoded slash (`%2F`), which servers read differently; use a literal `/` or encode it differently"
    )]
    EncodedSlash,
    /// `%5C`: some servers read it as a separator.
    #[error(
        "the request path contains an encoded backslash (`%5C`), which some servers read as a slash; remove it"
    )]
    EncodedBackslash,
    /// An encoded control byte (`%00` to `%1F`, `%7F`).
    #[error(
        "the request path contains the encoded control byte %{byte:02X}; remove it from the path"
    )]
    EncodedControl {
        /// The decoded byte.
        byte: u8,
    },
    /// A raw `\`, which some servers read as `/`.
    #[error("the request path contains a backslash, which some servers read as a slash; use `/`")]
    Backslash,
    /// A raw byte no path may contain: a control byte, a space, a non-ASCII byte, `?` or
    /// `#` (the caller passes the path without its query).
    #[error(
        "the request path contains the byte {byte:#04x} at {at}; percent-encode it (a space is `%20`)"
    )]
    InvalidByte {
        /// The byte.
        byte: u8,
        /// Where.
        at: usize,
    },
    /// A `..` segment that would climb above `/`.
    #[error("the request path climbs above the root with `..`; remove the extra `..`")]
    AboveRoot,
    /// A segment `.;…` or `..;…`, which Tomcat-like servers read as `.` or `..`.
    #[error(
        "the request path has a segment starting with `.;` or `..;`, which some servers read as a dot segment; remove it"
    )]
    DotSegmentWithParameters,
}

/// Normalizes a request path (RFC 3986 §6.2.2) so that equivalent paths route alike and
/// what the backend receives is what was routed on.
///
/// * Percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded (`%41` is
///   `A`, and `%2e%2e` is `..` **before** dot segments are removed, so it cannot hide one);
///   the remaining encodings get uppercase hex (`%c3` becomes `%C3`).
/// * Dot segments are removed (`/a/./b/../c` is `/a/c`); a `..` above the root is refused,
///   not clamped, since only a crafted request does that.
/// * Duplicate slashes are merged (`//a///b` is `/a/b`), as nginx's `merge_slashes`; a
///   trailing slash is kept (`/a/` is not `/a`).
/// * The empty path is `/`.
///
/// The output is idempotent (normalizing it again changes nothing) and never contains a
/// `.` or `..` segment, an empty segment before the last, or `%2F`.
///
/// # Errors
///
/// [`PathError`]: `*` (asterisk-form is refused); a path not starting with `/`; an encoded
/// slash, backslash or control byte; a raw backslash, control byte, space, `?`, `#` or
/// non-ASCII byte; an invalid percent-encoding; `..` above the root; a segment `.;…` or
/// `..;…`.
pub fn normalize_path(raw: &str) -> Result<String, PathError> {
    if raw.is_empty() {
        return Ok("/".to_owned());
    }
    if raw == "*" {
        return Err(PathError::Asterisk);
    }
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }

    // Pass 1: decode the unreserved, uppercase the rest, refuse what servers disagree on.
    // The output is ASCII and gains no `/`, so pass 2 sees the same segments a backend will.
    let mut decoded = String::with_capacity(raw.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'%' => {
                let value = bytes
                    .get(at + 1..at + 3)
                    .and_then(hex_pair)
                    .ok_or(PathError::InvalidPercentEncoding { at })?;
                match value {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::EncodedBackslash),
                    0x00..=0x1f | 0x7f => return Err(PathError::EncodedControl { byte: value }),
                    _ if is_unreserved(value) => decoded.push(char::from(value)),
                    _ => {
                        const HEX: &[u8; 16] = b"0123456789ABCDEF";
                        decoded.push('%');
                        decoded.push(char::from(HEX[usize::from(value >> 4)]));
                        decoded.push(char::from(HEX[usize::from(value & 0x0f)]));
                    }
                }
                at += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            b'?' | b'#' | 0x00..=0x20 | 0x7f..=0xff => {
                return Err(PathError::InvalidByte { byte, at });
            }
            _ => {
                decoded.push(char::from(byte));
                at += 1;
            }
        }
    }

    // Pass 2: segments (RFC 3986 §5.2.4, but refusing to climb above the root).
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    // `decoded` starts with the `/` checked above.
    let mut parts = decoded[1..].split('/').peekable();
    while let Some(segment) = parts.next() {
        let last = parts.peek().is_none();
        match segment {
            "" | "." => trailing_slash = last,
            ".." => {
                segments.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = last;
            }
            _ if segment.starts_with(".;") || segment.starts_with("..;") => {
                return Err(PathError::DotSegmentWithParameters);
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut path = String::with_capacity(decoded.len());
    for segment in &segments {
        path.push('/');
        path.push_str(segment);
    }
    if segments.is_empty() || trailing_slash {
        path.push('/');
    }
    Ok(path)
}

/// The byte two hex digits encode.
fn hex_pair(digits: &[u8]) -> Option<u8> {
    let [high, low] = digits else {
        return None;
    };
    let digit = |byte: u8| {
        char::from(byte)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    Some(digit(*high)? << 4 | digit(*low)?)
}

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Validates a path prefix from the config: normalized like a request path, without a
/// trailing slash (`/api/` and `/api` are the same prefix; `/` stays `/`).
///
/// # Errors
///
/// A sentence naming the problem and the fix, for the config error report.
pub fn parse_prefix(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("a path prefix is empty; write `/` to match every path".to_owned());
    }
    normalize_path(text)
        .map(|path| canonical_prefix(&path).to_owned())
        .map_err(|problem| format!("the path prefix `{text}` is not valid: {problem}"))
}

/// A prefix without its trailing slashes, except the root.
fn canonical_prefix(prefix: &str) -> &str {
    match prefix.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// Whether `path` is under `prefix`, segment by segment: `/api` matches `/api`, `/api/`
/// and `/api/x`, never `/apiary`; `/` matches everything. A trailing slash on the prefix
/// is ignored. Both are expected normalized ([`normalize_path`], [`parse_prefix`]).
pub fn path_matches(prefix: &str, path: &str) -> bool {
    // A prefix that is not a path (`""`, `api`) matches nothing, rather than everything.
    if !prefix.starts_with('/') {
        return false;
    }
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// `path` without `prefix`, always starting with `/`: `/api/x` minus `/api` is `/x`, and
/// `/api` minus `/api` is `/`. A path the prefix does not match is returned unchanged.
pub fn strip_prefix(prefix: &str, path: &str) -> String {
    if !path_matches(prefix, path) {
        return path.to_owned();
    }
    match path.strip_prefix(prefix.trim_end_matches('/')) {
        Some("") => "/".to_owned(),
        Some(rest) if rest.starts_with('/') => rest.to_owned(),
        _ => path.to_owned(),
    }
}

/// How many segments a prefix has (`/` has none, `/api/v1` two): the longest wins.
fn segment_count(prefix: &str) -> usize {
    prefix
        .split('/')
        .filter(|segment| !segment.is_empty())
        .count()
}

// ---------------------------------------------------------------------------------------
// The route table
// ---------------------------------------------------------------------------------------

/// One service's routes, as the config lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// The service's name.
    pub service: Arc<str>,
    /// The hosts it answers for.
    pub hosts: Vec<HostPattern>,
    /// Its path prefixes, from [`parse_prefix`]; empty means `["/"]`.
    pub paths: Vec<String>,
}

/// The routes of every HTTP service: built once per config load and swapped whole on
/// reload, so a request sees either the old table or the new one.
///
/// Per host, a list of routes sorted by prefix segments, longest first; exact hosts and
/// wildcard suffixes in two maps. A lookup is one or two hash lookups and a short scan,
/// with no allocation.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    /// Routes of exactly named hosts.
    exact: HashMap<String, Vec<Route>>,
    /// Routes of `*.suffix` patterns, by suffix.
    wildcard: HashMap<String, Vec<Route>>,
    /// How many (host pattern, prefix) routes there are.
    len: usize,
}

/// One (host pattern, prefix) of one service.
#[derive(Debug, Clone)]
struct Route {
    /// Canonical: normalized, no trailing slash except `/`.
    prefix: String,
    segments: usize,
    service: Arc<str>,
}

/// Two services claim the same host pattern and path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConflict {
    /// The host pattern both list.
    pub host: HostPattern,
    /// The prefix both list (canonical).
    pub path: String,
    /// The service listed first.
    pub first: Arc<str>,
    /// The other.
    pub second: Arc<str>,
}

impl fmt::Display for RouteConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host {} path {} is claimed by both `{}` and `{}`; keep it in one of them, or give the other another host or path",
            self.host, self.path, self.first, self.second
        )
    }
}

impl std::error::Error for RouteConflict {}

/// The route a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteMatch<'a> {
    /// The service serving it.
    pub service: &'a Arc<str>,
    /// The prefix that matched (canonical: `/` or without a trailing slash), for
    /// [`strip_prefix`].
    pub prefix: &'a str,
}

impl RouteTable {
    /// Builds the table. A service listing the same route twice is fine; two services
    /// listing the same (host pattern, prefix) are a conflict, and every conflict is
    /// reported at once. Prefixes are made canonical like [`parse_prefix`]; one that is
    /// not a valid path (which [`parse_prefix`] would have refused) is kept as written and
    /// never matches a normalized path.
    ///
    /// # Errors
    ///
    /// Every [`RouteConflict`].
    pub fn build(specs: Vec<RouteSpec>) -> Result<RouteTable, Vec<RouteConflict>> {
        let mut table = RouteTable::default();
        let mut conflicts = Vec::new();
        for spec in specs {
            let prefixes: Vec<String> = if spec.paths.is_empty() {
                vec!["/".to_owned()]
            } else {
                spec.paths
                    .iter()
                    .map(|path| parse_prefix(path).unwrap_or_else(|_| path.clone()))
                    .collect()
            };
            for host in &spec.hosts {
                let routes = match host {
                    HostPattern::Exact(name) => table.exact.entry(name.clone()),
                    HostPattern::Wildcard(suffix) => table.wildcard.entry(suffix.clone()),
                }
                .or_default();
                for prefix in &prefixes {
                    if let Some(existing) = routes.iter().find(|route| route.prefix == *prefix) {
                        if existing.service != spec.service {
                            conflicts.push(RouteConflict {
                                host: host.clone(),
                                path: prefix.clone(),
                                first: existing.service.clone(),
                                second: spec.service.clone(),
                            });
                        }
                        continue;
                    }
                    routes.push(Route {
                        prefix: prefix.clone(),
                        segments: segment_count(prefix),
                        service: spec.service.clone(),
                    });
                    table.len += 1;
                }
            }
        }
        if !conflicts.is_empty() {
            return Err(conflicts);
        }
        for routes in table.exact.values_mut().chain(table.wildcard.values_mut()) {
            // Two prefixes with as many segments cannot both match one path unless equal,
            // so the order among them does not matter.
            routes.sort_by_key(|route| std::cmp::Reverse(route.segments));
        }
        Ok(table)
    }

    /// The route of a request to `host` (normalized, as in [`RouteKey::host`]) and `path`
    /// (normalized): an exact host before a wildcard, then the longest matching prefix.
    /// `None` when no service serves the host, or none of its routes covers the path
    /// ([`RouteTable::serves_host`] tells which).
    pub fn lookup(&self, host: &str, path: &str) -> Option<RouteMatch<'_>> {
        self.host_routes(host)?
            .iter()
            .find(|route| path_matches(&route.prefix, path))
            .map(|route| RouteMatch {
                service: &route.service,
                prefix: &route.prefix,
            })
    }

    /// Whether any service serves `host` at all (so a 404 can say "no route for this path
    /// on this host" rather than "no service for this host").
    pub fn serves_host(&self, host: &str) -> bool {
        self.host_routes(host).is_some()
    }

    /// The services with a route on `host` (the routes [`RouteTable::lookup`] would choose
    /// among), each once, in no particular order.
    pub fn services_for_host(&self, host: &str) -> Vec<&Arc<str>> {
        let mut services: Vec<&Arc<str>> = Vec::new();
        for route in self.host_routes(host).unwrap_or_default() {
            if !services.contains(&&route.service) {
                services.push(&route.service);
            }
        }
        services
    }

    /// Whether the table has no route.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many (host pattern, prefix) routes the table has.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The routes `host` chooses among: its exact entry, else its wildcard's.
    fn host_routes(&self, host: &str) -> Option<&[Route]> {
        if let Some(routes) = self.exact.get(host) {
            return Some(routes);
        }
        self.wildcard.get(wildcard_suffix(host)?).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use proptest::prelude::*;

    use super::*;

    fn get(uri: &str, hosts: &[&str]) -> Request<()> {
        request(Version::HTTP_11, Method::GET, uri, hosts)
    }

    fn h2(uri: &str, hosts: &[&str]) -> Request<()> {
        request(Version::HTTP_2, Method::GET, uri, hosts)
    }

    fn request(version: Version, method: Method, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut builder = Request::builder().version(version).method(method).uri(uri);
        for host in hosts {
            builder = builder.header(HOST, *host);
        }
        builder.body(()).expect("a valid test request")
    }

    fn key(host: &str, port: Option<u16>, path: &str, query: Option<&str>) -> RouteKey {
        RouteKey {
            host: host.into(),
            port,
            path: path.into(),
            query: query.map(Into::into),
        }
    }

    #[test]
    fn route_keys() {
        let cases: Vec<(Request<()>, RouteKey)> = vec![
            (
                get("/", &["app.example.com"]),
                key("app.example.com", None, "/", None),
            ),
            (
                get("/a/./b/../c?x=1&y", &["App.Example.COM.:8080"]),
                key("app.example.com", Some(8080), "/a/c", Some("x=1&y")),
            ),
            (
                get("/a?b", &["app.example.com"]),
                key("app.example.com", None, "/a", Some("b")),
            ),
            (
                get("http://app.example.com/x", &["app.example.com"]),
                key("app.example.com", None, "/x", None),
            ),
            // Absolute-form without a path is `/`; same host with the default port written.
            (
                get("http://app.example.com", &["app.example.com:80"]),
                key("app.example.com", None, "/", None),
            ),
            (
                get("https://APP.example.com:443/x", &["app.example.com"]),
                key("app.example.com", Some(443), "/x", None),
            ),
            (
                h2("https://app.example.com/h2", &[]),
                key("app.example.com", None, "/h2", None),
            ),
            (
                h2("https://app.example.com:8443/h2", &["APP.example.com:8443"]),
                key("app.example.com", Some(8443), "/h2", None),
            ),
            // HTTP/2 without :authority falls back to Host.
            (
                h2("/h2", &["app.example.com"]),
                key("app.example.com", None, "/h2", None),
            ),
            (
                get("/", &["[::1]:8080"]),
                key("[::1]", Some(8080), "/", None),
            ),
            (get("/", &["[0:0::0:1]"]), key("[::1]", None, "/", None)),
            (
                get("http://[2001:DB8::7]:81/", &["[2001:db8::7]:81"]),
                key("[2001:db8::7]", Some(81), "/", None),
            ),
            (
                get("/", &["192.0.2.7:8080"]),
                key("192.0.2.7", Some(8080), "/", None),
            ),
            (get("/", &["localhost"]), key("localhost", None, "/", None)),
            // HTTP/1.0 needs no Host with an absolute target.
            (
                request(
                    Version::HTTP_10,
                    Method::GET,
                    "http://old.example.com/",
                    &[],
                ),
                key("old.example.com", None, "/", None),
            ),
            (
                request(Version::HTTP_10, Method::GET, "/", &["old.example.com"]),
                key("old.example.com", None, "/", None),
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(
                route_key(&request).as_ref(),
                Ok(&expected),
                "{:?} {} {:?}",
                request.version(),
                request.uri(),
                request.headers()
            );
        }
    }

    #[test]
    fn malformed_requests_are_refused() {
        use RouteKeyError::*;
        let invalid = |value: &str, problem: HostProblem| InvalidHost {
            value: value.into(),
            problem,
        };
        let cases: Vec<(Request<()>, RouteKeyError)> = vec![
            (get("/", &[]), MissingHost),
            (get("http://app.example.com/", &[]), MissingHost),
            (
                get("/", &["a.example.com", "a.example.com"]),
                MultipleHosts { count: 2 },
            ),
            (
                get("/", &["a.example.com", "b.example.com", "c.example.com"]),
                MultipleHosts { count: 3 },
            ),
            (
                get("/", &[""]),
                invalid("", HostProblem::Name(HostNameError::Empty)),
            ),
            (
                get("/", &[":80"]),
                invalid(":80", HostProblem::Name(HostNameError::Empty)),
            ),
            (
                get("/", &["a.example.com:"]),
                invalid("a.example.com:", HostProblem::Port),
            ),
            (
                get("/", &["a.example.com:65536"]),
                invalid("a.example.com:65536", HostProblem::Port),
            ),
            (
                get("/", &["a.example.com:+80"]),
                invalid("a.example.com:+80", HostProblem::Port),
            ),
            (
                get("/", &["::1"]),
                invalid("::1", HostProblem::UnbracketedIpv6),
            ),
            (get("/", &["[::1"]), invalid("[::1", HostProblem::Ipv6)),
            (get("/", &["[::1]x"]), invalid("[::1]x", HostProblem::Port)),
            (
                get("/", &["[fe80::1%25eth0]"]),
                invalid("[fe80::1%25eth0]", HostProblem::Ipv6),
            ),
            (
                get("/", &["a.example.com, b.example.com"]),
                invalid(
                    "a.example.com, b.example.com",
                    HostProblem::Name(HostNameError::InvalidByte { byte: b',' }),
                ),
            ),
            (get("/", &["user@app.example.com"]), Userinfo),
            (
                get("http://user:pw@app.example.com/", &["app.example.com"]),
                Userinfo,
            ),
            (
                get("ftp://app.example.com/", &["app.example.com"]),
                UnsupportedScheme {
                    scheme: "ftp".into(),
                },
            ),
            (
                request(
                    Version::HTTP_11,
                    Method::CONNECT,
                    "app.example.com:443",
                    &["app.example.com:443"],
                ),
                AuthorityForm,
            ),
            (
                request(Version::HTTP_11, Method::OPTIONS, "*", &["app.example.com"]),
                Path(PathError::Asterisk),
            ),
            (
                get("/a%2Fb", &["app.example.com"]),
                Path(PathError::EncodedSlash),
            ),
        ];
        for (request, expected) in cases {
            let error = route_key(&request).expect_err(&format!("{request:?}"));
            assert_eq!(error, expected, "{request:?}");
            assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn quoted_values_are_escaped_and_short() {
        let value = http::HeaderValue::from_bytes(b"a\xffb").expect("opaque bytes");
        let request = Request::builder()
            .uri("/")
            .header(HOST, value)
            .body(())
            .expect("request");
        let error = route_key(&request).expect_err("invalid");
        assert_eq!(
            error.to_string(),
            "the host `a\\xffb` is not valid: the host name contains the byte 0xff; only ASCII \
             letters, digits, `-` and `.` are allowed"
        );
        let long = "a".repeat(300);
        let error = route_key(&get("/", &[&long])).expect_err("too long");
        let RouteKeyError::InvalidHost { value, .. } = error else {
            panic!("{error:?}");
        };
        assert_eq!(value.chars().count(), MAX_QUOTED + 1);
    }

    #[test]
    fn paths() {
        use PathError::*;
        let cases: &[(&str, Result<&str, PathError>)] = &[
            ("", Ok("/")),
            ("/", Ok("/")),
            ("//", Ok("/")),
            ("/a", Ok("/a")),
            ("/a/", Ok("/a/")),
            ("//a", Ok("/a")),
            ("/a//b///c", Ok("/a/b/c")),
            ("/a//", Ok("/a/")),
            ("/a/./b", Ok("/a/b")),
            ("/a/./b/../c", Ok("/a/c")),
            ("/a/.", Ok("/a/")),
            ("/a/..", Ok("/")),
            ("/a/b/..", Ok("/a/")),
            ("/.", Ok("/")),
            ("/./a", Ok("/a")),
            ("/api/../admin", Ok("/admin")),
            ("/a/b/../../c", Ok("/c")),
            ("/...", Ok("/...")),
            ("/..a/.b/a..", Ok("/..a/.b/a..")),
            ("/%41%7a%2D%2e%5f%7E", Ok("/Az-._~")),
            ("/%2e/a", Ok("/a")),
            ("/a/%2e%2E/b", Ok("/b")),
            ("/a/.%2e/b", Ok("/b")),
            ("/%c3%a9t%c3%A9", Ok("/%C3%A9t%C3%A9")),
            ("/a%20b", Ok("/a%20b")),
            ("/a%3fb%23c%25", Ok("/a%3Fb%23c%25")),
            ("/%252F", Ok("/%252F")),
            ("/a;b=c/d:e@f!$&'()*+,=", Ok("/a;b=c/d:e@f!$&'()*+,=")),
            (
                "/.well-known/acme-challenge/x",
                Ok("/.well-known/acme-challenge/x"),
            ),
            ("*", Err(Asterisk)),
            ("a", Err(NotAbsolute)),
            ("a/b", Err(NotAbsolute)),
            ("/..", Err(AboveRoot)),
            ("/../x", Err(AboveRoot)),
            ("/%2e%2e/x", Err(AboveRoot)),
            ("/a/../../x", Err(AboveRoot)),
            ("/a/%2E%2E/%2e%2e/x", Err(AboveRoot)),
            ("/a%2Fb", Err(EncodedSlash)),
            ("/a%2fb", Err(EncodedSlash)),
            ("/a%5Cb", Err(EncodedBackslash)),
            ("/a%5cb", Err(EncodedBackslash)),
            ("/a%00", Err(EncodedControl { byte: 0 })),
            ("/a%0D%0Ab", Err(EncodedControl { byte: 0x0d })),
            ("/a%7f", Err(EncodedControl { byte: 0x7f })),
            ("/a\\b", Err(Backslash)),
            ("/a%", Err(InvalidPercentEncoding { at: 2 })),
            ("/a%4", Err(InvalidPercentEncoding { at: 2 })),
            ("/a%zz", Err(InvalidPercentEncoding { at: 2 })),
            ("/a%+1", Err(InvalidPercentEncoding { at: 2 })),
            ("/a?b", Err(InvalidByte { byte: b'?', at: 2 })),
            ("/a#b", Err(InvalidByte { byte: b'#', at: 2 })),
            ("/a b", Err(InvalidByte { byte: b' ', at: 2 })),
            ("/a\tb", Err(InvalidByte { byte: b'\t', at: 2 })),
            ("/a\0", Err(InvalidByte { byte: 0, at: 2 })),
            ("/é", Err(InvalidByte { byte: 0xc3, at: 1 })),
            ("/api/..;/admin", Err(DotSegmentWithParameters)),
            ("/api/.;x/admin", Err(DotSegmentWithParameters)),
            ("/api/%2e%2e;/admin", Err(DotSegmentWithParameters)),
        ];
        for (raw, expected) in cases {
            assert_eq!(
                normalize_path(raw).as_deref(),
                expected.as_ref().map(|path| *path),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn segment_matching() {
        let cases = [
            ("/", "/", true),
            ("/", "/anything/at/all", true),
            ("/api", "/api", true),
            ("/api", "/api/", true),
            ("/api", "/api/x", true),
            ("/api", "/apiary", false),
            ("/api", "/ap", false),
            ("/api", "/", false),
            ("/api/", "/api", true),
            ("/api/", "/api/x", true),
            ("/api/v1", "/api/v1/users", true),
            ("/api/v1", "/api/v10", false),
            ("/api/v1", "/api", false),
            ("", "/", false),
            ("", "/x", false),
            ("api", "/api", false),
            ("api", "api", false),
        ];
        for (prefix, path, expected) in cases {
            assert_eq!(path_matches(prefix, path), expected, "{prefix} {path}");
        }
        let strips = [
            ("/api", "/api/x", "/x"),
            ("/api", "/api", "/"),
            ("/api", "/api/", "/"),
            ("/api/", "/api/x/y", "/x/y"),
            ("/", "/x", "/x"),
            ("/", "/", "/"),
            ("/api", "/apiary", "/apiary"),
            ("", "/x", "/x"),
            ("x", "x/y", "x/y"),
        ];
        for (prefix, path, expected) in strips {
            assert_eq!(strip_prefix(prefix, path), expected, "{prefix} {path}");
        }
    }

    #[test]
    fn prefixes() {
        assert_eq!(parse_prefix("/").as_deref(), Ok("/"));
        assert_eq!(parse_prefix("/api/").as_deref(), Ok("/api"));
        assert_eq!(parse_prefix("//api//v1//").as_deref(), Ok("/api/v1"));
        assert_eq!(parse_prefix("/%61pi").as_deref(), Ok("/api"));
        assert!(parse_prefix("").is_err());
        assert!(parse_prefix("api").is_err());
        let error = parse_prefix("/a/../..").expect_err("above the root");
        assert!(
            error.starts_with("the path prefix `/a/../..` is not valid"),
            "{error}"
        );
    }

    #[test]
    fn host_patterns() {
        let pattern = |text: &str| HostPattern::parse(text).expect(text);
        assert_eq!(
            pattern("App.Example.com."),
            HostPattern::Exact("app.example.com".into())
        );
        assert_eq!(
            pattern("*.Preview.example.com"),
            HostPattern::Wildcard("preview.example.com".into())
        );
        assert_eq!(pattern("::1"), HostPattern::Exact("[::1]".into()));
        assert_eq!(pattern("[::1]"), HostPattern::Exact("[::1]".into()));
        assert_eq!(pattern("192.0.2.7"), HostPattern::Exact("192.0.2.7".into()));
        assert_eq!(
            pattern("*.preview.example.com").to_string(),
            "*.preview.example.com"
        );
        assert_eq!(pattern("app.example.com").to_string(), "app.example.com");
        assert_eq!(
            "*.localhost".parse(),
            Ok(HostPattern::Wildcard("localhost".into()))
        );

        for bad in [
            "",
            "*",
            "*.",
            "**.example.com",
            "*.*.example.com",
            "a.*.example.com",
            "*app.example.com",
            "app.example.com:8080",
            "user@app.example.com",
            "app_1.example.com",
            "a..b",
            "[::1]:80",
            "[nope]",
        ] {
            let error = HostPattern::parse(bad).expect_err(bad);
            assert!(error.contains(&format!("`{bad}`")), "{error}");
        }

        let wildcard = pattern("*.preview.example.com");
        assert!(wildcard.matches("a.preview.example.com"));
        assert!(wildcard.matches("pr-42.preview.example.com"));
        assert!(!wildcard.matches("a.b.preview.example.com"));
        assert!(!wildcard.matches("preview.example.com"));
        assert!(!wildcard.matches(".preview.example.com"));
        assert!(!wildcard.matches("apreview.example.com"));
        let exact = pattern("app.example.com");
        assert!(exact.matches("app.example.com"));
        assert!(!exact.matches("a.app.example.com"));
    }

    fn spec(service: &str, hosts: &[&str], paths: &[&str]) -> RouteSpec {
        RouteSpec {
            service: service.into(),
            hosts: hosts
                .iter()
                .map(|host| HostPattern::parse(host).expect("pattern"))
                .collect(),
            paths: paths.iter().map(|path| (*path).to_owned()).collect(),
        }
    }

    fn routed<'a>(table: &'a RouteTable, host: &str, path: &str) -> Option<(&'a str, &'a str)> {
        table
            .lookup(host, path)
            .map(|found| (&**found.service, found.prefix))
    }

    #[test]
    fn lookup_precedence() {
        let table = RouteTable::build(vec![
            spec("web", &["app.example.com"], &[]),
            spec("api", &["app.example.com"], &["/api/"]),
            spec("api-v2", &["app.example.com"], &["/api/v2"]),
            spec("preview", &["*.example.com"], &["/"]),
            spec("preview-api", &["*.example.com"], &["/api"]),
            spec(
                "docs",
                &["docs.example.com", "*.docs.example.com"],
                &["/guide", "/ref"],
            ),
        ])
        .expect("no conflict");
        assert_eq!(table.len(), 9);
        assert!(!table.is_empty());
        let cases = [
            ("app.example.com", "/", Some(("web", "/"))),
            ("app.example.com", "/apiary", Some(("web", "/"))),
            ("app.example.com", "/api", Some(("api", "/api"))),
            ("app.example.com", "/api/v1/x", Some(("api", "/api"))),
            ("app.example.com", "/api/v2", Some(("api-v2", "/api/v2"))),
            ("app.example.com", "/api/v2/x", Some(("api-v2", "/api/v2"))),
            ("app.example.com", "/api/v20", Some(("api", "/api"))),
            // The wildcard covers other names, and never an exactly named host.
            ("pr-1.example.com", "/", Some(("preview", "/"))),
            ("pr-1.example.com", "/api/x", Some(("preview-api", "/api"))),
            ("example.com", "/", None),
            ("a.pr-1.example.com", "/", None),
            ("docs.example.com", "/guide/x", Some(("docs", "/guide"))),
            ("docs.example.com", "/", None),
            ("v1.docs.example.com", "/ref", Some(("docs", "/ref"))),
            ("v1.docs.example.com", "/other", None),
            ("unknown.test", "/", None),
        ];
        for (host, path, expected) in cases {
            assert_eq!(routed(&table, host, path), expected, "{host} {path}");
        }
        assert!(table.serves_host("docs.example.com"));
        assert!(table.serves_host("x.example.com"));
        assert!(!table.serves_host("unknown.test"));
        let mut services: Vec<&str> = table
            .services_for_host("app.example.com")
            .into_iter()
            .map(|service| &**service)
            .collect();
        services.sort_unstable();
        assert_eq!(services, ["api", "api-v2", "web"]);
        assert!(table.services_for_host("unknown.test").is_empty());

        // A prefix parse_prefix would refuse is kept, and never matches.
        let odd = RouteTable::build(vec![spec("odd", &["odd.test"], &["", "api", "/a/../.."])])
            .expect("no conflict");
        assert_eq!(odd.len(), 3);
        for path in ["/", "/api", "/a"] {
            assert_eq!(odd.lookup("odd.test", path), None, "{path}");
        }
        assert!(odd.serves_host("odd.test"));

        let empty = RouteTable::build(Vec::new()).expect("empty");
        assert!(empty.is_empty());
        assert_eq!(empty.lookup("app.example.com", "/"), None);
    }

    #[test]
    fn conflicts_are_all_reported() {
        let conflicts = RouteTable::build(vec![
            spec("a", &["app.example.com", "*.example.com"], &["/api", "/"]),
            spec("a", &["app.example.com"], &["/api/"]),
            spec("b", &["APP.example.com."], &["/api/"]),
            spec("c", &["*.example.com"], &[]),
            spec("d", &["other.example.com"], &["/api"]),
        ])
        .expect_err("conflicts");
        let messages: Vec<String> = conflicts.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "host app.example.com path /api is claimed by both `a` and `b`; keep it in one \
                 of them, or give the other another host or path",
                "host *.example.com path / is claimed by both `a` and `c`; keep it in one of \
                 them, or give the other another host or path",
            ]
        );
    }

    /// CVE-2026-40910 class: every way a request can name two hosts, or hide a path, gets
    /// a documented answer, and never a route to a service the one host does not name.
    #[test]
    fn cve_2026_40910_class_requests() {
        #[derive(Debug, PartialEq)]
        enum Answer {
            Service(&'static str),
            NoRoute,
            Refused(RouteKeyError),
        }
        use Answer::*;
        use RouteKeyError::*;

        let table = RouteTable::build(vec![
            spec("app", &["app.example.com"], &["/"]),
            spec("admin", &["admin.example.com"], &["/"]),
            spec("app-admin", &["app.example.com"], &["/admin"]),
            spec("preview", &["*.preview.example.com"], &[]),
        ])
        .expect("table");
        let answer = |request: &Request<()>| match route_key(request) {
            Err(error) => Refused(error),
            Ok(key) => match table.lookup(&key.host, &key.path) {
                Some(found) => Service(match &**found.service {
                    "app" => "app",
                    "admin" => "admin",
                    "app-admin" => "app-admin",
                    "preview" => "preview",
                    other => panic!("unknown service {other}"),
                }),
                None => NoRoute,
            },
        };
        let mismatch = |target: &str, header: &str| {
            Refused(HostMismatch {
                target: target.into(),
                header: header.into(),
            })
        };
        let with_header = |mut request: Request<()>, name: &'static str, value: &'static str| {
            request
                .headers_mut()
                .append(name, http::HeaderValue::from_static(value));
            request
        };

        let cases: Vec<(&str, Request<()>, Answer)> = vec![
            ("plain", get("/", &["app.example.com"]), Service("app")),
            (
                "absolute-form names admin, Host names app",
                get("http://admin.example.com/", &["app.example.com"]),
                mismatch("admin.example.com", "app.example.com"),
            ),
            (
                "absolute-form and Host agree after normalization",
                get("http://ADMIN.example.com./", &["admin.example.com:80"]),
                Service("admin"),
            ),
            (
                "same host, other port",
                get("http://app.example.com/", &["app.example.com:8080"]),
                mismatch("app.example.com", "app.example.com:8080"),
            ),
            (
                "https default port is 443, not 80",
                get("https://app.example.com/", &["app.example.com:80"]),
                mismatch("app.example.com", "app.example.com:80"),
            ),
            (
                "h2 :authority names admin, Host names app",
                h2("https://admin.example.com/", &["app.example.com"]),
                mismatch("admin.example.com", "app.example.com"),
            ),
            (
                "h2 :authority names app, Host names admin",
                h2("https://app.example.com/", &["admin.example.com"]),
                mismatch("app.example.com", "admin.example.com"),
            ),
            (
                "h2 :authority alone",
                h2("https://admin.example.com/", &[]),
                Service("admin"),
            ),
            (
                "h2 :authority and the same Host with its default port",
                h2("https://admin.example.com/", &["admin.example.com:443"]),
                Service("admin"),
            ),
            (
                "two Host headers",
                get("/", &["app.example.com", "admin.example.com"]),
                Refused(MultipleHosts { count: 2 }),
            ),
            (
                "two Host headers, h2",
                h2("/", &["app.example.com", "admin.example.com"]),
                Refused(MultipleHosts { count: 2 }),
            ),
            (
                "two Host headers with an absolute-form target",
                get(
                    "http://app.example.com/",
                    &["app.example.com", "admin.example.com"],
                ),
                Refused(MultipleHosts { count: 2 }),
            ),
            (
                "a list in one Host header",
                get("/", &["app.example.com,admin.example.com"]),
                Refused(InvalidHost {
                    value: "app.example.com,admin.example.com".into(),
                    problem: HostProblem::Name(HostNameError::InvalidByte { byte: b',' }),
                }),
            ),
            (
                "userinfo that looks like a host",
                get("/", &["admin.example.com@app.example.com"]),
                Refused(Userinfo),
            ),
            (
                "userinfo in an absolute-form target",
                get(
                    "http://admin.example.com@app.example.com/",
                    &["app.example.com"],
                ),
                Refused(Userinfo),
            ),
            (
                "X-Forwarded-Host never routes",
                with_header(
                    get("/", &["app.example.com"]),
                    "x-forwarded-host",
                    "admin.example.com",
                ),
                Service("app"),
            ),
            (
                "Forwarded never routes",
                with_header(
                    get("/", &["app.example.com"]),
                    "forwarded",
                    "host=admin.example.com",
                ),
                Service("app"),
            ),
            ("no host", get("/", &[]), Refused(MissingHost)),
            (
                "HTTP/1.1 absolute-form without Host",
                get("http://admin.example.com/", &[]),
                Refused(MissingHost),
            ),
            ("unknown host", get("/", &["evil.example.com"]), NoRoute),
            (
                "the wildcard's own suffix",
                get("/", &["preview.example.com"]),
                NoRoute,
            ),
            (
                "two labels under a one-label wildcard",
                get("/", &["a.b.preview.example.com"]),
                NoRoute,
            ),
            (
                "one label under the wildcard",
                get("/", &["pr-7.preview.example.com"]),
                Service("preview"),
            ),
            (
                "dot segments are resolved before the prefix match",
                get("/x/../admin/users", &["app.example.com"]),
                Service("app-admin"),
            ),
            (
                "and cannot leave a prefix: /admin/.. is /",
                get("/admin/../public", &["app.example.com"]),
                Service("app"),
            ),
            (
                "encoded dots are dots",
                get("/x/%2e%2e/admin", &["app.example.com"]),
                Service("app-admin"),
            ),
            (
                "encoded unreserved letters are letters",
                get("/%61dmin", &["app.example.com"]),
                Service("app-admin"),
            ),
            (
                "prefixes match whole segments",
                get("/administrator", &["app.example.com"]),
                Service("app"),
            ),
            (
                "duplicate slashes are merged",
                get("//admin", &["app.example.com"]),
                Service("app-admin"),
            ),
            (
                "an encoded slash is refused",
                get("/public%2F..%2Fadmin", &["app.example.com"]),
                Refused(Path(PathError::EncodedSlash)),
            ),
            (
                "Tomcat's ..; is refused",
                get("/public/..;/admin", &["app.example.com"]),
                Refused(Path(PathError::DotSegmentWithParameters)),
            ),
            (
                "climbing above the root is refused",
                get("/../admin", &["app.example.com"]),
                Refused(Path(PathError::AboveRoot)),
            ),
            (
                "CONNECT to another host",
                request(
                    Version::HTTP_11,
                    Method::CONNECT,
                    "admin.example.com:443",
                    &["app.example.com"],
                ),
                Refused(AuthorityForm),
            ),
        ];
        for (name, request, expected) in cases {
            assert_eq!(answer(&request), expected, "{name}");
        }
    }

    /// What hyper's HTTP/1 and HTTP/2 servers hand over, which the rules above assume:
    /// an absolute-form target's authority and HTTP/2's `:authority` arrive in
    /// `uri().authority()`, next to the Host header.
    mod through_hyper {
        use bytes::Bytes;
        use http_body_util::{BodyExt, Empty};
        use hyper::body::Incoming;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        use super::*;

        async fn answer(request: Request<Incoming>) -> Result<http::Response<String>, String> {
            let key = route_key(&request);
            // An error status, so even a CONNECT's answer carries the body.
            let status = key
                .as_ref()
                .map_or_else(RouteKeyError::status, |_| StatusCode::OK);
            let mut response = http::Response::new(format!("{key:?}"));
            *response.status_mut() = status;
            Ok(response)
        }

        /// The route key an HTTP/1 server computes for these raw request bytes.
        async fn http1(raw: &str) -> String {
            let (mut client, server) = tokio::io::duplex(4096);
            let serve = tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(server), hyper::service::service_fn(answer)),
            );
            client.write_all(raw.as_bytes()).await.expect("write");
            let mut response = Vec::new();
            client.read_to_end(&mut response).await.expect("read");
            serve.await.expect("join").expect("serve");
            let response = String::from_utf8(response).expect("text");
            let (_, body) = response.split_once("\r\n\r\n").expect("a response");
            body.to_owned()
        }

        /// The route key an HTTP/2 server computes for a request sent by hyper's client.
        async fn http2(uri: &str, hosts: &[&str]) -> String {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let serve = tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(server), hyper::service::service_fn(answer)),
            );
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                    .await
                    .expect("handshake");
            let drive = tokio::spawn(connection);
            let mut request = Request::builder().uri(uri);
            for host in hosts {
                request = request.header(HOST, *host);
            }
            let request = request.body(Empty::<Bytes>::new()).expect("request");
            let response = sender.send_request(request).await.expect("response");
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            drop(sender);
            drive.await.expect("join").expect("client");
            serve.await.expect("join").expect("serve");
            String::from_utf8(body.to_vec()).expect("text")
        }

        fn ok(host: &str, port: Option<u16>, path: &str) -> String {
            format!("{:?}", Ok::<_, RouteKeyError>(key(host, port, path, None)))
        }

        fn refused(error: RouteKeyError) -> String {
            format!("{:?}", Err::<RouteKey, _>(error))
        }

        #[tokio::test]
        async fn hyper_http1() {
            let close = "Connection: close\r\n\r\n";
            assert_eq!(
                http1(&format!(
                    "GET /a/../b HTTP/1.1\r\nHost: App.example.com:8080\r\n{close}"
                ))
                .await,
                ok("app.example.com", Some(8080), "/b")
            );
            assert_eq!(
                http1(&format!(
                    "GET http://admin.example.com/ HTTP/1.1\r\nHost: app.example.com\r\n{close}"
                ))
                .await,
                refused(RouteKeyError::HostMismatch {
                    target: "admin.example.com".into(),
                    header: "app.example.com".into()
                })
            );
            assert_eq!(
                http1(&format!(
                    "GET http://app.example.com/x HTTP/1.1\r\nHost: app.example.com\r\n{close}"
                ))
                .await,
                ok("app.example.com", None, "/x")
            );
            assert_eq!(
                http1(&format!(
                    "GET / HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\n{close}"
                ))
                .await,
                refused(RouteKeyError::MultipleHosts { count: 2 })
            );
            assert_eq!(
                http1(&format!(
                    "OPTIONS * HTTP/1.1\r\nHost: a.example.com\r\n{close}"
                ))
                .await,
                refused(RouteKeyError::Path(PathError::Asterisk))
            );
            assert_eq!(
                http1(&format!(
                    "CONNECT a.example.com:443 HTTP/1.1\r\nHost: a.example.com:443\r\n{close}"
                ))
                .await,
                refused(RouteKeyError::AuthorityForm)
            );
        }

        #[tokio::test]
        async fn hyper_http2() {
            assert_eq!(
                http2("http://App.example.com:8080/a/./b", &[]).await,
                ok("app.example.com", Some(8080), "/a/b")
            );
            assert_eq!(
                http2("http://admin.example.com/", &["app.example.com"]).await,
                refused(RouteKeyError::HostMismatch {
                    target: "admin.example.com".into(),
                    header: "app.example.com".into()
                })
            );
            assert_eq!(
                http2("https://app.example.com/", &["app.example.com:443"]).await,
                ok("app.example.com", None, "/")
            );
        }
    }

    proptest! {
        #[test]
        fn normalized_paths_are_stable(raw in "/[/.a%2eEfF45;\\\\?]{0,24}") {
            check_path(&raw);
        }

        #[test]
        fn arbitrary_paths_never_panic(raw in "\\PC{0,40}") {
            check_path(&raw);
            check_path(&format!("/{raw}"));
        }

        #[test]
        fn arbitrary_hosts_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok((host, port)) = parse_authority(&raw) {
                // The host part is normalized: parsing it again gives it back.
                let again = parse_authority(host_and_port(&host, port).as_bytes()).ok();
                prop_assert_eq!(again, Some((host, port)));
            }
        }
    }

    /// The invariants of [`normalize_path`] the fuzz target checks too.
    fn check_path(raw: &str) {
        let Ok(path) = normalize_path(raw) else {
            return;
        };
        assert!(path.starts_with('/'), "{raw:?} -> {path:?}");
        for bad in ["/../", "/./", "//", "%2F", "%2f", "%5C", "\\"] {
            assert!(!path.contains(bad), "{raw:?} -> {path:?}");
        }
        assert!(
            !path.ends_with("/..") && !path.ends_with("/."),
            "{raw:?} -> {path:?}"
        );
        assert_eq!(normalize_path(&path).as_ref(), Ok(&path), "{raw:?}");
    }
}
