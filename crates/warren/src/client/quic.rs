//! The client's QUIC endpoint: one UDP socket and one TLS config per server link, kept
//! across reconnects so TLS session tickets make the next handshake a resumption.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::quic::{QuicAuth, QuicConfig};
use crate::config::{ClientConfig, HostPort};
use crate::transport::quic::{
    self, Authenticated, ClientTls, QuicEndpoint, QuicError, certs, client_endpoint,
};

/// Sends one empty datagram to `addr` from a fresh socket, so that what this machine says
/// about UDP to it comes back at once: a firewall rule that drops it here (`EPERM`), no
/// route (`ENETUNREACH`). quinn logs such send errors and waits for its handshake timeout,
/// which would make a client whose network refuses UDP wait that long before falling back
/// to a TCP transport. The server's QUIC endpoint ignores an empty datagram.
///
/// # Errors
/// The refusal, with a message naming the cause.
pub async fn probe_udp(addr: SocketAddr) -> std::io::Result<()> {
    let any: SocketAddr = if addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let explain = |error: std::io::Error| {
        // EPERM (and EACCES): what `sendmsg` says when a netfilter rule drops it here.
        let why = if error.kind() == std::io::ErrorKind::PermissionDenied {
            "a firewall on this machine refuses UDP to it"
        } else {
            "UDP to it cannot be sent"
        };
        std::io::Error::new(error.kind(), format!("{why} ({addr}): {error}"))
    };
    let socket = tokio::net::UdpSocket::bind(any).await.map_err(explain)?;
    socket.connect(addr).await.map_err(explain)?;
    socket.send(&[]).await.map_err(explain)?;
    Ok(())
}

/// A QUIC endpoint and what it needs to connect to one server.
pub struct QuicClient {
    endpoint: QuicEndpoint,
    tls: ClientTls,
    /// SNI, and in `mtls` mode the name the server's certificate must hold.
    server_name: String,
}

impl std::fmt::Debug for QuicClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicClient")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl QuicClient {
    /// An endpoint for `server`, as `config` says (auth mode, packet size), bound to an
    /// ephemeral port of `family`'s address family.
    ///
    /// # Errors
    /// Certificate files that cannot be read, or a socket that cannot be bound.
    pub fn new(config: &ClientConfig, server: &HostPort, ipv6: bool) -> Result<Self, QuicError> {
        Self::with(&config.quic, &config.psk, server, ipv6)
    }

    /// As [`QuicClient::new`], from the QUIC settings and the PSK alone.
    ///
    /// # Errors
    /// As [`QuicClient::new`].
    pub fn with(
        quic: &QuicConfig,
        psk: &crate::crypto::secret::Secret,
        server: &HostPort,
        ipv6: bool,
    ) -> Result<Self, QuicError> {
        let (tls, server_name) = match &quic.auth {
            QuicAuth::Psk { pin, .. } => (ClientTls::psk(psk.clone(), *pin)?, server.host.clone()),
            QuicAuth::Mtls {
                cert,
                key,
                ca,
                server_name,
            } => {
                let tls = ClientTls::mtls(
                    certs::load_certs(ca)?,
                    certs::load_certs(cert)?,
                    certs::load_key(key)?,
                )?;
                (
                    tls,
                    server_name.clone().unwrap_or_else(|| server.host.clone()),
                )
            }
        };
        let bind = if ipv6 {
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
        };
        let endpoint = client_endpoint(bind, &quic.settings())?;
        Ok(QuicClient {
            endpoint,
            tls,
            server_name,
        })
    }

    /// Connects and authenticates within `deadline`.
    ///
    /// # Errors
    /// [`QuicError`], saying what failed and what to do.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        deadline: Duration,
    ) -> Result<Authenticated, QuicError> {
        quic::connect(&self.endpoint, addr, &self.server_name, &self.tls, deadline).await
    }

    /// The endpoint (to rebind it, or read its socket's facts).
    pub fn endpoint(&self) -> &QuicEndpoint {
        &self.endpoint
    }
}

/// Resolves `server` to the one address QUIC will use, trying `family` first.
///
/// # Errors
/// Resolution failures and no address within `deadline`, naming the server.
pub async fn resolve(
    server: &HostPort,
    deadline: Duration,
    family: crate::transport::tcp::Family,
) -> std::io::Result<SocketAddr> {
    let addrs = tokio::time::timeout(deadline, crate::transport::tcp::resolve(server, family))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("resolving {server} timed out after {deadline:?}"),
            )
        })??;
    addrs.first().copied().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{server} resolved to no address"),
        )
    })
}
