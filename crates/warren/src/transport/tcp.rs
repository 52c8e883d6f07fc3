//! TCP sockets the way every Warren connection wants them: resolved with a deadline,
//! `TCP_NODELAY` on (records are already large; Nagle only adds latency to small ones), and a
//! way to end a connection with a reset instead of a clean FIN.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpStream, lookup_host};

use crate::config::HostPort;
use crate::config::proxy::ProxyUrl;
use crate::transport::congestion::TcpCongestion;

/// Which address family to try first when a name resolves to both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// The resolver's order.
    #[default]
    Any,
    /// IPv4 addresses first.
    PreferIpv4,
    /// IPv6 addresses first (`prefer_ipv6 = true`).
    PreferIpv6,
}

/// Resolves `target` and connects to the first address that answers, within `deadline`.
///
/// # Errors
/// Resolution failures, refused connections, and [`io::ErrorKind::TimedOut`] on expiry;
/// the message names the target.
pub async fn connect(target: &HostPort, deadline: Duration) -> io::Result<TcpStream> {
    connect_preferring(target, deadline, Family::Any).await
}

/// As [`connect`], trying the addresses of `family` first.
///
/// # Errors
/// As [`connect`].
pub async fn connect_preferring(
    target: &HostPort,
    deadline: Duration,
    family: Family,
) -> io::Result<TcpStream> {
    let attempt = async {
        let addrs = resolve(target, family).await?;
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("{target} resolved to no address"),
        );
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    tune_peer(&stream, addr);
                    return Ok(stream);
                }
                Err(e) => {
                    last = io::Error::new(
                        e.kind(),
                        format!("cannot connect to {target} ({addr}): {e}"),
                    )
                }
            }
        }
        Err(last)
    };
    tokio::time::timeout(deadline, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {target} timed out after {deadline:?}"),
            ))
        })
}

/// Opens a TCP connection to a Warren server: the one place a client does. Through `proxy`
/// when there is one; else to `resolved` (where an earlier connection of the session went,
/// so every connection of a session reaches the same server behind a name), else to
/// `server` resolved now, trying `family` first. The connection runs `congestion` (the
/// one to the proxy, when there is one: that is the one crossing the internet).
///
/// # Errors
/// Connect, proxy and deadline failures, naming the server or the proxy.
pub async fn dial_server(
    server: &HostPort,
    proxy: Option<&ProxyUrl>,
    resolved: Option<SocketAddr>,
    deadline: Duration,
    (family, congestion): (Family, &TcpCongestion),
) -> io::Result<TcpStream> {
    let stream = connect_server(server, proxy, resolved, deadline, family).await?;
    // Set once connected: the kernel starts the new controller from scratch then, which
    // for a connection that has sent nothing yet is where it would have started anyway.
    congestion.apply(socket2::SockRef::from(&stream));
    Ok(stream)
}

async fn connect_server(
    server: &HostPort,
    proxy: Option<&ProxyUrl>,
    resolved: Option<SocketAddr>,
    deadline: Duration,
    family: Family,
) -> io::Result<TcpStream> {
    match (proxy, resolved) {
        (Some(proxy), _) => Ok(super::proxy::connect(proxy, server, deadline, family).await?),
        (None, Some(addr)) => {
            let stream = tokio::time::timeout(deadline, TcpStream::connect(addr))
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connecting to {addr} timed out"),
                    ))
                })?;
            tune(&stream);
            Ok(stream)
        }
        (None, None) => connect_preferring(server, deadline, family).await,
    }
}

/// Resolves `target` (no deadline: callers add one), the addresses of `family` first.
///
/// # Errors
/// Resolution failures, naming the target.
pub async fn resolve(target: &HostPort, family: Family) -> io::Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve {target}: {e}")))?
        .collect();
    match family {
        Family::Any => {}
        // Stable sorts: the resolver's order is kept within each family.
        Family::PreferIpv4 => addrs.sort_by_key(|a| a.is_ipv6()),
        Family::PreferIpv6 => addrs.sort_by_key(|a| a.is_ipv4()),
    }
    Ok(addrs)
}

/// TCP keepalive: a connection whose peer vanished without a FIN or RST (a cut cable, a
/// NAT that forgot us) is detected after about `IDLE + RETRIES * INTERVAL` of silence
/// instead of hanging forever.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;

/// Applies Warren's socket options to a fresh connection.
pub fn tune(stream: &TcpStream) {
    // Failures here only cost latency or dead-peer detection; never worth failing the
    // connection over.
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// [`tune`] for a connection whose peer is known: a loopback peer gets no keepalive (four
/// `setsockopt` calls fewer per connection), because it cannot vanish without the kernel
/// closing its end; the local target of a tunnel is often one.
pub fn tune_peer(stream: &TcpStream, peer: SocketAddr) {
    if peer.ip().is_loopback() {
        let _ = stream.set_nodelay(true);
    } else {
        tune(stream);
    }
}

/// Closes `stream` with a TCP reset, so the peer sees an error and not a clean end of data:
/// used when the other half of a relayed connection died.
pub fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}
