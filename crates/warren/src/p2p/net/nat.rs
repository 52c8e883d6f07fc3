//! What kind of NAT this machine is behind, as the server's two reflector ports see it
//! (`warren doctor`; what frp's `nat discover` tells).
//!
//! * **Mapping**: one socket asks both reflector ports. The same public address from both
//!   is an endpoint-independent mapping (a "cone": the checks can reach it from anywhere
//!   it was opened towards); two addresses are endpoint-dependent ("symmetric": each
//!   destination gets its own port, which a peer cannot predict). An answer equal to the
//!   socket's own address means no NAT at all.
//! * **Filtering**: a fresh socket asks the second port to answer from the first
//!   (WARREN-CHANGE-PORT). If the answer gets in, the NAT lets in packets from a port it
//!   never sent to (endpoint-independent or address-dependent filtering); if not, only
//!   from exactly where it sent (port-dependent). Telling "any address" from "the same
//!   address" needs a server with two IP addresses, which Warren does not assume.
//!
//! From these, [`NatReport::outlook`] says which peers a direct path works with (the
//! rules of `../shared/P2P.md`, checked by the NAT lab): two symmetric NATs, or a
//! symmetric one and a port-restricted one, need the relay; everything else punches.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use warren_proto::stun::{self, Class, Message};

use super::reflector::{self, DiscoverConfig, DiscoverError};

/// How long the filtering probe waits for the answer that may not get in.
const FILTER_WAIT: Duration = Duration::from_millis(1500);

/// How the NAT maps this machine's UDP sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// No NAT: the reflector sees the socket's own address.
    None,
    /// The same public address towards every destination (a cone).
    EndpointIndependent,
    /// A new public port per destination (symmetric).
    EndpointDependent,
    /// Behind a NAT of a kind not measured: the server has no second reflector port.
    Unknown,
}

/// Which incoming packets the NAT lets through to a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtering {
    /// Packets from a port the socket never sent to got in.
    Open,
    /// Only packets from exactly where the socket sent.
    PortRestricted,
    /// Not measured: the server has no second reflector port.
    Unknown,
}

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatReport {
    /// The socket's public address, as the reflector saw it.
    pub public: SocketAddr,
    /// The mapping behaviour.
    pub mapping: Mapping,
    /// The filtering behaviour.
    pub filtering: Filtering,
}

impl NatReport {
    /// Whether a direct path is likely with peers behind each kind of NAT, in words.
    pub fn outlook(&self) -> &'static str {
        match (self.mapping, self.filtering) {
            (Mapping::None, _) | (Mapping::EndpointIndependent, Filtering::Open) => {
                "direct paths work with peers behind any NAT"
            }
            (Mapping::EndpointIndependent, Filtering::PortRestricted) => {
                "direct paths work with peers behind cone NATs; peers behind symmetric NATs go through the relay"
            }
            (Mapping::EndpointIndependent, Filtering::Unknown) => {
                "direct paths work with peers behind cone NATs (filtering not measured: the server has no second reflector port)"
            }
            (Mapping::Unknown, _) => {
                "direct paths depend on the NAT's kind, which the server cannot measure (it has no second reflector port: a server older than this client)"
            }
            (Mapping::EndpointDependent, _) => {
                "direct paths work only with peers that are public or whose NAT filters by address alone; the others go through the relay"
            }
        }
    }

    /// Whether most peers get a direct path.
    pub fn punches_well(&self) -> bool {
        self.mapping != Mapping::EndpointDependent
    }
}

impl fmt::Display for NatReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mapping = match self.mapping {
            Mapping::None => "no NAT (public address)",
            Mapping::EndpointIndependent => "endpoint-independent mapping (cone NAT)",
            Mapping::EndpointDependent => "endpoint-dependent mapping (symmetric NAT)",
            Mapping::Unknown => "behind a NAT (mapping not measured)",
        };
        let filtering = match self.filtering {
            Filtering::Open => "lets in other ports",
            Filtering::PortRestricted => "port-restricted filtering",
            Filtering::Unknown => "filtering not measured",
        };
        write!(f, "{mapping}, {filtering}, public address {}", self.public)
    }
}

/// Probes the NAT through the reflector at `main` and, when the server has one, its
/// second port `alt`, from sockets bound on `bind` (port 0).
///
/// # Errors
///
/// The first reflector did not answer (UDP blocked, no `[server.p2p]`), or a socket failed.
pub async fn probe(
    main: SocketAddr,
    alt: Option<SocketAddr>,
    bind: IpAddr,
) -> Result<NatReport, DiscoverError> {
    let io_error = |source| DiscoverError::Io {
        reflector: main,
        source,
    };
    let config = DiscoverConfig::default();
    let mut socket = UdpSocket::bind(SocketAddr::new(bind, 0))
        .await
        .map_err(io_error)?;
    let public = reflector::discover(&mut socket, main, &config).await?;
    let local = own_address(&socket, main).map_err(io_error)?;
    let Some(alt) = alt else {
        // One reflector cannot tell a cone from a symmetric NAT.
        return Ok(NatReport {
            public,
            mapping: if public == local {
                Mapping::None
            } else {
                Mapping::Unknown
            },
            filtering: Filtering::Unknown,
        });
    };
    let seen_by_alt = reflector::discover(&mut socket, alt, &config).await?;
    let mapping = if public == local {
        Mapping::None
    } else if public == seen_by_alt {
        Mapping::EndpointIndependent
    } else {
        Mapping::EndpointDependent
    };
    // A fresh socket, which has never sent to `main`: does `main`'s answer get in?
    let fresh = UdpSocket::bind(SocketAddr::new(bind, 0))
        .await
        .map_err(io_error)?;
    let filtering = if answered_from(&fresh, alt, main).await.map_err(io_error)? {
        Filtering::Open
    } else {
        Filtering::PortRestricted
    };
    Ok(NatReport {
        public,
        mapping,
        filtering,
    })
}

/// This socket's address as the route towards `to` sees it (its IP when bound to the
/// unspecified address).
fn own_address(socket: &UdpSocket, to: SocketAddr) -> io::Result<SocketAddr> {
    let port = socket.local_addr()?.port();
    let probe = std::net::UdpSocket::bind(SocketAddr::new(socket.local_addr()?.ip(), 0))?;
    probe.connect(to)?;
    Ok(SocketAddr::new(probe.local_addr()?.ip(), port))
}

/// Asks `ask` (with WARREN-CHANGE-PORT) to answer from `answer_from`; whether the answer
/// arrives within [`FILTER_WAIT`] (asking three times, in case one is lost).
async fn answered_from(
    socket: &UdpSocket,
    ask: SocketAddr,
    answer_from: SocketAddr,
) -> io::Result<bool> {
    let transaction: stun::TransactionId = rand::random();
    let mut request = Vec::with_capacity(stun::HEADER_LEN + 8);
    Message::request(transaction)
        .with_change_port()
        .encode(&mut request);
    let deadline = Instant::now() + FILTER_WAIT;
    let mut buf = vec![0u8; stun::MAX_MESSAGE_LEN + 1];
    for attempt in 1..=3u32 {
        socket.send_to(&request, ask).await?;
        let resend = (Instant::now() + FILTER_WAIT / 3).min(deadline);
        loop {
            let (len, from) = tokio::select! {
                r = socket.recv_from(&mut buf) => match r {
                    Ok(r) => r,
                    Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset) => continue,
                    Err(e) => return Err(e),
                },
                () = tokio::time::sleep_until(resend) => break,
            };
            let answer = stun::decode(&buf[..len]).ok().map(|d| d.message);
            if from == answer_from
                && answer.is_some_and(|m| m.class == Class::Success && m.transaction == transaction)
            {
                return Ok(true);
            }
        }
        if attempt == 3 || Instant::now() >= deadline {
            break;
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::p2p::net::reflector::ReflectorConfig;

    #[tokio::test]
    async fn on_loopback_there_is_no_nat_and_other_ports_get_in() {
        let main = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let alt = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (main_addr, alt_addr) = (main.local_addr().unwrap(), alt.local_addr().unwrap());
        let cancel = CancellationToken::new();
        let serving_main = {
            let (main, cancel) = (Arc::clone(&main), cancel.clone());
            tokio::spawn(async move {
                reflector::serve(&main, ReflectorConfig::default(), cancel).await
            })
        };
        let serving_alt = {
            let (main, cancel) = (Arc::clone(&main), cancel.clone());
            tokio::spawn(async move {
                reflector::serve_alt(&alt, &main, ReflectorConfig::default(), cancel).await
            })
        };
        let report = probe(main_addr, Some(alt_addr), "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(report.mapping, Mapping::None);
        assert_eq!(report.filtering, Filtering::Open);
        assert!(report.punches_well());
        assert!(report.to_string().contains("no NAT"), "{report}");
        // Without the second port: mapping only.
        let report = probe(main_addr, None, "127.0.0.1".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(report.filtering, Filtering::Unknown);
        cancel.cancel();
        serving_main.await.unwrap().unwrap();
        serving_alt.await.unwrap().unwrap();
    }
}
