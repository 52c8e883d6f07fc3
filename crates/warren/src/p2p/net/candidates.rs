//! Candidates: the addresses at which a peer's one UDP socket may be reached, exchanged
//! through the mailbox before the checks start.
//!
//! A peer offers its local (host) addresses, without link-local ones (they name a link,
//! not a host, and need a scope the other side cannot know) and without loopback unless the
//! socket itself is on loopback, and its server-reflexive address (what the server's
//! reflector saw). The relay is the caller's fallback, not a candidate the checker tries.
//! Peer-reflexive addresses are learnt during the checks and never exchanged.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// At most this many candidates are offered or taken from a peer: the checker sends to
/// each of them every ~25 ms, so the list bounds the check traffic.
pub const MAX_CANDIDATES: usize = 8;

/// Where an address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CandidateKind {
    /// An address of one of the peer's interfaces.
    Host,
    /// The peer's address as the server's reflector saw it (its NAT's mapping).
    ServerReflexive,
}

/// One address to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Where it came from.
    pub kind: CandidateKind,
    /// The address.
    pub addr: SocketAddr,
}

/// A peer's candidates, in the order it prefers them (host first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidates {
    /// The candidates (at most [`MAX_CANDIDATES`] are used).
    pub list: Vec<Candidate>,
}

impl Candidates {
    /// The candidates of a socket bound to `local`: its host addresses (every usable
    /// interface address if `local` is unspecified) and the server-reflexive address.
    pub fn gather(local: SocketAddr, reflexive: Option<SocketAddr>) -> Self {
        let mut list = Vec::new();
        let mut push = |kind, addr: SocketAddr| {
            if list.len() < MAX_CANDIDATES && !list.iter().any(|c: &Candidate| c.addr == addr) {
                list.push(Candidate { kind, addr });
            }
        };
        if local.ip().is_unspecified() {
            for ip in interface_addresses() {
                if ip.is_ipv4() == local.is_ipv4() && usable(ip, false) {
                    push(CandidateKind::Host, SocketAddr::new(ip, local.port()));
                }
            }
        } else if usable(local.ip(), true) {
            push(CandidateKind::Host, local);
        }
        // A loopback reflexive address (the server is on this machine: `--lan`'s own
        // mailbox) says nothing the host addresses do not, and names another host to a
        // peer elsewhere.
        let reflexive =
            reflexive.filter(|addr| local.ip().is_loopback() || !addr.ip().is_loopback());
        if let Some(addr) = reflexive {
            push(CandidateKind::ServerReflexive, addr);
        }
        Self { list }
    }

    /// The addresses to check, bounded and without duplicates or unusable addresses
    /// (a peer's list is untrusted input).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = Vec::new();
        for c in &self.list {
            if out.len() == MAX_CANDIDATES {
                break;
            }
            if !out.contains(&c.addr) && c.addr.port() != 0 && usable(c.addr.ip(), true) {
                out.push(c.addr);
            }
        }
        out
    }
}

/// Whether a peer could reach `ip`: never unspecified, multicast or link-local; loopback
/// only when allowed (the socket itself is on loopback, as in tests).
fn usable(ip: IpAddr, allow_loopback: bool) -> bool {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !ip.is_unspecified()
        && !ip.is_multicast()
        && !link_local
        && (allow_loopback || !ip.is_loopback())
}

/// The addresses of this host's interfaces that are up (empty if they cannot be listed).
#[cfg(target_os = "linux")]
fn interface_addresses() -> Vec<IpAddr> {
    use nix::net::if_::InterfaceFlags;
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter(|a| a.flags.contains(InterfaceFlags::IFF_UP))
        .filter_map(|a| {
            let addr = a.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// Elsewhere, only the bound address is offered.
#[cfg(not(target_os = "linux"))]
fn interface_addresses() -> Vec<IpAddr> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_keeps_loopback_only_for_a_loopback_socket() {
        let c = Candidates::gather("127.0.0.1:5000".parse().unwrap(), None);
        assert_eq!(c.addrs(), ["127.0.0.1:5000".parse::<SocketAddr>().unwrap()]);
        let c = Candidates::gather("0.0.0.0:5000".parse().unwrap(), None);
        assert!(
            c.addrs()
                .iter()
                .all(|a| !a.ip().is_loopback() && a.port() == 5000)
        );
    }

    #[test]
    fn a_loopback_reflexive_address_is_kept_only_for_a_loopback_socket() {
        let reflexive: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        let c = Candidates::gather("0.0.0.0:5000".parse().unwrap(), Some(reflexive));
        assert!(!c.list.iter().any(|c| c.addr == reflexive), "{c:?}");
        let c = Candidates::gather("127.0.0.1:5000".parse().unwrap(), Some(reflexive));
        assert!(c.list.iter().any(|c| c.addr == reflexive), "{c:?}");
        let public: SocketAddr = "203.0.113.7:6000".parse().unwrap();
        let c = Candidates::gather("0.0.0.0:5000".parse().unwrap(), Some(public));
        assert!(c.list.iter().any(|c| c.addr == public), "{c:?}");
    }

    #[test]
    fn untrusted_lists_are_bounded_and_filtered() {
        let mut list: Vec<Candidate> = (0..50)
            .map(|i| Candidate {
                kind: CandidateKind::Host,
                addr: SocketAddr::from(([192, 0, 2, 1], 1000 + i)),
            })
            .collect();
        list.insert(
            0,
            Candidate {
                kind: CandidateKind::Host,
                addr: "169.254.1.1:9".parse().unwrap(),
            },
        );
        list.insert(
            0,
            Candidate {
                kind: CandidateKind::Host,
                addr: "0.0.0.0:9".parse().unwrap(),
            },
        );
        let addrs = Candidates { list }.addrs();
        assert_eq!(addrs.len(), MAX_CANDIDATES);
        assert_eq!(addrs[0], "192.0.2.1:1000".parse::<SocketAddr>().unwrap());
    }
}
