//! Stub until the middleware work lands.

use std::net::IpAddr;

/// A CIDR (stub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr(String);

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Cidr(s.to_owned()))
    }
}

/// The visitor's address (stub: the peer's).
pub fn client_ip(peer: IpAddr, _headers: &http::HeaderMap, _trusted: &[Cidr]) -> IpAddr {
    peer
}
