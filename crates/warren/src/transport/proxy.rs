//! Dialing the server through a proxy: SOCKS5 (tokio-socks) or HTTP CONNECT.
//!
//! [`connect`] opens a TCP connection to the proxy, asks it for a tunnel to the target and
//! returns the stream once the proxy said yes; everything after that (the Noise handshake,
//! records) travels inside the tunnel unchanged. The target is passed to the proxy as a
//! name, so the proxy resolves it (what `socks5h://` means to curl).
//!
//! Errors say which of the three parties failed: the proxy cannot be reached, the proxy
//! refused our credentials, or the proxy could not reach the target.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::HostPort;
use crate::config::proxy::{ProxyScheme, ProxyUrl};
use crate::transport::tcp::{self, Family};

/// Largest HTTP CONNECT response header we read before giving up.
const MAX_CONNECT_RESPONSE: usize = 8 * 1024;

/// Why the tunnel through the proxy could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// No TCP connection to the proxy itself.
    #[error("cannot reach proxy {proxy}: {source}")]
    Unreachable {
        /// The proxy's address.
        proxy: HostPort,
        /// Why.
        source: io::Error,
    },
    /// The proxy wants different credentials.
    #[error("proxy {proxy} refused authentication (check the user and password in `proxy`)")]
    AuthFailed {
        /// The proxy's address.
        proxy: HostPort,
    },
    /// The proxy answered but would not open the tunnel.
    #[error("proxy {proxy} could not open a tunnel to {target}: {reason}")]
    Refused {
        /// The proxy's address.
        proxy: HostPort,
        /// What we asked for.
        target: HostPort,
        /// The proxy's reason.
        reason: String,
    },
    /// The proxy took longer than the deadline.
    #[error("proxy {proxy} did not answer within {deadline:?}")]
    Timeout {
        /// The proxy's address.
        proxy: HostPort,
        /// The deadline.
        deadline: Duration,
    },
}

impl From<ProxyError> for io::Error {
    fn from(error: ProxyError) -> Self {
        let kind = match &error {
            ProxyError::Unreachable { source, .. } => source.kind(),
            ProxyError::AuthFailed { .. } => io::ErrorKind::PermissionDenied,
            ProxyError::Refused { .. } => io::ErrorKind::ConnectionRefused,
            ProxyError::Timeout { .. } => io::ErrorKind::TimedOut,
        };
        io::Error::new(kind, error.to_string())
    }
}

/// Opens a tunnel to `target` through `proxy`, within `deadline`.
///
/// # Errors
/// [`ProxyError`], saying whether the proxy, its credentials or the target failed.
pub async fn connect(
    proxy: &ProxyUrl,
    target: &HostPort,
    deadline: Duration,
    family: Family,
) -> Result<TcpStream, ProxyError> {
    let attempt = async {
        let stream = tcp::connect_preferring(&proxy.addr, deadline, family)
            .await
            .map_err(|source| ProxyError::Unreachable {
                proxy: proxy.addr.clone(),
                source: strip_context(source),
            })?;
        match proxy.scheme {
            ProxyScheme::Socks5 => socks5(stream, proxy, target).await,
            ProxyScheme::HttpConnect => http_connect(stream, proxy, target).await,
        }
    };
    tokio::time::timeout(deadline, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(ProxyError::Timeout {
                proxy: proxy.addr.clone(),
                deadline,
            })
        })
}

/// `tcp::connect` says "cannot connect to X (addr): reason"; the proxy error names the
/// proxy itself, so keep only the OS reason.
fn strip_context(error: io::Error) -> io::Error {
    let kind = error.kind();
    let text = error.to_string();
    let reason = text.rsplit(": ").next().unwrap_or(&text).to_owned();
    io::Error::new(kind, reason)
}

async fn socks5(
    stream: TcpStream,
    proxy: &ProxyUrl,
    target: &HostPort,
) -> Result<TcpStream, ProxyError> {
    use tokio_socks::Error as SocksError;
    use tokio_socks::tcp::Socks5Stream;

    let destination = (target.host.as_str(), target.port);
    let result = match (&proxy.user, &proxy.password) {
        (Some(user), password) => {
            let password = password.as_ref().map(|p| p.expose()).unwrap_or("");
            Socks5Stream::connect_with_password_and_socket(stream, destination, user, password)
                .await
        }
        (None, _) => Socks5Stream::connect_with_socket(stream, destination).await,
    };
    match result {
        Ok(tunnel) => {
            let stream = tunnel.into_inner();
            tcp::tune(&stream);
            Ok(stream)
        }
        Err(
            SocksError::PasswordAuthFailure(_)
            | SocksError::NoAcceptableAuthMethods
            | SocksError::InvalidAuthValues(_),
        ) => Err(ProxyError::AuthFailed {
            proxy: proxy.addr.clone(),
        }),
        Err(error) => Err(ProxyError::Refused {
            proxy: proxy.addr.clone(),
            target: target.clone(),
            reason: error.to_string(),
        }),
    }
}

async fn http_connect(
    mut stream: TcpStream,
    proxy: &ProxyUrl,
    target: &HostPort,
) -> Result<TcpStream, ProxyError> {
    let refused = |reason: String| ProxyError::Refused {
        proxy: proxy.addr.clone(),
        target: target.clone(),
        reason,
    };
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(user) = &proxy.user {
        let password = proxy.password.as_ref().map(|p| p.expose()).unwrap_or("");
        request.push_str("Proxy-Authorization: Basic ");
        request.push_str(&base64(format!("{user}:{password}").as_bytes()));
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| refused(e.to_string()))?;
    // Read byte by byte up to the blank line: nothing after it may be consumed, since it
    // belongs to the tunnel.
    let mut header = Vec::with_capacity(256);
    while !header.ends_with(b"\r\n\r\n") {
        if header.len() >= MAX_CONNECT_RESPONSE {
            return Err(refused(format!(
                "response header longer than {MAX_CONNECT_RESPONSE} bytes"
            )));
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(0) => return Err(refused("closed the connection without an answer".into())),
            Ok(_) => header.push(byte[0]),
            Err(e) => return Err(refused(e.to_string())),
        }
    }
    let text = String::from_utf8_lossy(&header);
    let status_line = text.lines().next().unwrap_or_default().trim().to_owned();
    let code = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(200..=299) => {
            tcp::tune(&stream);
            Ok(stream)
        }
        // 407 is the standard answer; tinyproxy answers 401.
        Some(401 | 407) => Err(ProxyError::AuthFailed {
            proxy: proxy.addr.clone(),
        }),
        _ => Err(refused(format!("answered `{status_line}`"))),
    }
}

/// Standard base64 with padding (for `Proxy-Authorization: Basic`).
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }
}
