//! Settings for reaching the server through a proxy, and for the ports clients may declare.
//!
//! * [`ProxySetting`]: `proxy = "socks5://user:pass@host:1080"`, `"http://user:pass@host:3128"`
//!   (HTTP CONNECT) or `"env"` (read `ALL_PROXY` / `HTTPS_PROXY` when connecting).
//! * [`PortRange`]: `allow_ports = "20000-29999"` on a server.
//!
//! The connecting itself lives in `transport::proxy`.

use std::fmt;
use std::str::FromStr;

use super::typed::{HostPort, HostPortError};
use crate::crypto::secret::Secret;

/// Which proxy protocol a [`ProxyUrl`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyScheme {
    /// SOCKS5 (`socks5://`, `socks5h://`); names are resolved by the proxy.
    Socks5,
    /// HTTP CONNECT (`http://`).
    HttpConnect,
}

impl ProxyScheme {
    /// The URL scheme.
    pub fn name(self) -> &'static str {
        match self {
            ProxyScheme::Socks5 => "socks5",
            ProxyScheme::HttpConnect => "http",
        }
    }
}

/// A proxy to dial the server through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    /// The protocol.
    pub scheme: ProxyScheme,
    /// Where the proxy listens.
    pub addr: HostPort,
    /// User name, if the proxy wants one.
    pub user: Option<String>,
    /// Password (masked in `Debug` and `Display`).
    pub password: Option<Secret>,
}

/// `proxy = …` on a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxySetting {
    /// Always this proxy.
    Url(ProxyUrl),
    /// `"env"`: `ALL_PROXY`, then `HTTPS_PROXY` (either case), read when connecting; no
    /// proxy when neither is set.
    Env,
}

/// Why a proxy URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyUrlError {
    /// Not `socks5://`, `socks5h://` or `http://`.
    #[error("unsupported proxy scheme `{0}`; use socks5://, socks5h:// or http://")]
    Scheme(String),
    /// No `scheme://`.
    #[error("missing scheme; write socks5://HOST:PORT or http://HOST:PORT")]
    NoScheme,
    /// The host part is not a `HOST:PORT`.
    #[error("invalid proxy address: {0}")]
    Addr(HostPortError),
    /// A path or query after the address.
    #[error("a proxy URL has no path")]
    Path,
    /// A `%` escape that is not two hex digits or not UTF-8.
    #[error("invalid percent-escape in the user or password")]
    Escape,
}

impl FromStr for ProxyUrl {
    type Err = ProxyUrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (scheme, rest) = s.split_once("://").ok_or(ProxyUrlError::NoScheme)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "socks5" | "socks5h" => ProxyScheme::Socks5,
            "http" => ProxyScheme::HttpConnect,
            other => return Err(ProxyUrlError::Scheme(other.to_owned())),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') {
            return Err(ProxyUrlError::Path);
        }
        let (userinfo, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        let addr = host.parse::<HostPort>().map_err(ProxyUrlError::Addr)?;
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => match info.split_once(':') {
                Some((user, password)) => (
                    Some(percent_decode(user)?),
                    Some(Secret::new(percent_decode(password)?)),
                ),
                None => (Some(percent_decode(info)?), None),
            },
        };
        Ok(ProxyUrl {
            scheme,
            addr,
            user,
            password,
        })
    }
}

impl fmt::Display for ProxyUrl {
    /// The URL with the password masked: safe for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme.name())?;
        if let Some(user) = &self.user {
            write!(f, "{user}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        write!(f, "{}", self.addr)
    }
}

impl FromStr for ProxySetting {
    type Err = ProxyUrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("env") {
            Ok(ProxySetting::Env)
        } else {
            s.parse().map(ProxySetting::Url)
        }
    }
}

impl fmt::Display for ProxySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxySetting::Url(url) => url.fmt(f),
            ProxySetting::Env => f.write_str("env"),
        }
    }
}

impl ProxySetting {
    /// The proxy to use now: the URL, or for [`ProxySetting::Env`] the first of
    /// `ALL_PROXY`, `all_proxy`, `HTTPS_PROXY`, `https_proxy` that is set and not empty.
    ///
    /// # Errors
    /// A variable that is set but is not a proxy URL, naming the variable.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<ProxyUrl>, String> {
        match self {
            ProxySetting::Url(url) => Ok(Some(url.clone())),
            ProxySetting::Env => {
                for name in ["ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"] {
                    if let Some(value) = env(name).filter(|v| !v.trim().is_empty()) {
                        return value
                            .parse()
                            .map(Some)
                            .map_err(|e| format!("{name} is not a proxy URL: {e}"));
                    }
                }
                Ok(None)
            }
        }
    }
}

fn percent_decode(text: &str) -> Result<String, ProxyUrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or(ProxyUrlError::Escape)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ProxyUrlError::Escape)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ProxyUrlError::Escape)
}

/// An inclusive range of ports, `"20000-29999"` or a single `"20000"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port allowed.
    pub start: u16,
    /// Last port allowed (at least `start`).
    pub end: u16,
}

impl PortRange {
    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        (self.start..=self.end).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let port = |p: &str| -> Result<u16, String> {
            match p.trim().parse::<u16>() {
                Ok(0) | Err(_) => Err(format!("`{}` is not a port from 1 to 65535", p.trim())),
                Ok(port) => Ok(port),
            }
        };
        let (start, end) = match s.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(s)?, port(s)?),
        };
        if end < start {
            return Err(format!("the range {start}-{end} is backwards"));
        }
        Ok(PortRange { start, end })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls() {
        let url: ProxyUrl = "socks5://al%40ice:p%3Ass@127.0.0.1:1080"
            .parse()
            .expect("url");
        assert_eq!(url.scheme, ProxyScheme::Socks5);
        assert_eq!(url.user.as_deref(), Some("al@ice"));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("p:ss"));
        assert_eq!(url.to_string(), "socks5://al@ice:***@127.0.0.1:1080");
        assert!(!format!("{url:?}").contains("p:ss"));
        let http: ProxyUrl = "http://[::1]:3128/".parse().expect("url");
        assert_eq!(http.scheme, ProxyScheme::HttpConnect);
        assert_eq!(http.addr.host, "::1");
        assert!(matches!(
            "ftp://a:1".parse::<ProxyUrl>(),
            Err(ProxyUrlError::Scheme(_))
        ));
        assert_eq!("a:1".parse::<ProxyUrl>(), Err(ProxyUrlError::NoScheme));
        assert_eq!("http://a:1/x".parse::<ProxyUrl>(), Err(ProxyUrlError::Path));
        assert_eq!("ENV".parse(), Ok(ProxySetting::Env));
        let env = |name: &str| (name == "https_proxy").then(|| "http://p:8080".to_owned());
        let resolved = ProxySetting::Env.resolve(&env).expect("ok").expect("some");
        assert_eq!(resolved.addr.port, 8080);
        assert_eq!(ProxySetting::Env.resolve(&|_| None), Ok(None));
    }

    #[test]
    fn port_ranges() {
        let range: PortRange = "20000-29999".parse().expect("range");
        assert!(range.contains(20000) && range.contains(29999) && !range.contains(30000));
        assert_eq!("8080".parse::<PortRange>().map(|r| r.end), Ok(8080));
        assert!("2-1".parse::<PortRange>().is_err());
        assert!("0-10".parse::<PortRange>().is_err());
        assert!("x".parse::<PortRange>().is_err());
    }
}
