//! PROXY protocol headers (HAProxy's spec, versions 1 and 2), written towards a service's
//! target so it sees the visitor's real address instead of the tunnel's.
//!
//! Spec: <https://www.haproxy.org/download/2.8/doc/proxy-protocol.txt>. Only what a sender
//! needs: [`encode`] builds the header for one TCP connection. A v1 header is one text line
//! (`PROXY TCP4 src dst sport dport\r\n`, at most 107 bytes); a v2 header is the 12-byte
//! signature, version/command, family/protocol, a length and the addresses. When the two
//! addresses are of different families the IPv4 one is written as an IPv4-mapped IPv6
//! address; when the visitor is unknown the header says so (`PROXY UNKNOWN` / `LOCAL`).

use std::net::{IpAddr, SocketAddr};

/// The v2 signature every v2 header starts with.
pub const V2_SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// PROXY protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// The text header.
    V1,
    /// The binary header.
    V2,
}

/// The header for a connection from `source` (the visitor) to `destination` (the address it
/// connected to). `None` for either gives the "unknown" / `LOCAL` header.
pub fn encode(version: Version, addresses: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let addresses = addresses.map(|(src, dst)| same_family(src, dst));
    match version {
        Version::V1 => v1(addresses),
        Version::V2 => v2(addresses),
    }
}

fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => (src, dst),
        _ => (to_v6(src), to_v6(dst)),
    }
}

fn to_v6(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), addr.port()),
        IpAddr::V6(_) => addr,
    }
}

fn v1(addresses: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    match addresses {
        None => b"PROXY UNKNOWN\r\n".to_vec(),
        Some((src, dst)) => {
            let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {family} {} {} {} {}\r\n",
                src.ip(),
                dst.ip(),
                src.port(),
                dst.port()
            )
            .into_bytes()
        }
    }
}

fn v2(addresses: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    match addresses {
        None => {
            // Version 2, command LOCAL; family UNSPEC; no addresses.
            out.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        }
        Some((src, dst)) => {
            // Version 2, command PROXY.
            out.push(0x21);
            let mut body = Vec::with_capacity(36);
            match (src.ip(), dst.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out.push(0x11); // AF_INET, STREAM
                    body.extend_from_slice(&s.octets());
                    body.extend_from_slice(&d.octets());
                }
                (s, d) => {
                    out.push(0x21); // AF_INET6, STREAM
                    body.extend_from_slice(&v6_octets(s));
                    body.extend_from_slice(&v6_octets(d));
                }
            }
            body.extend_from_slice(&src.port().to_be_bytes());
            body.extend_from_slice(&dst.port().to_be_bytes());
            // Invariant: at most 36 bytes of addresses.
            let len = u16::try_from(body.len()).expect("address block is small");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&body);
        }
    }
    out
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V6(v6) => v6.octets(),
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn v1_lines() {
        assert_eq!(
            encode(
                Version::V1,
                Some((addr("127.0.0.2:40000"), addr("127.0.0.1:8080")))
            ),
            b"PROXY TCP4 127.0.0.2 127.0.0.1 40000 8080\r\n"
        );
        assert_eq!(
            encode(
                Version::V1,
                Some((addr("[::1]:5"), addr("[2001:db8::1]:6")))
            ),
            b"PROXY TCP6 ::1 2001:db8::1 5 6\r\n"
        );
        assert_eq!(
            encode(Version::V1, Some((addr("10.0.0.1:5"), addr("[::1]:6")))),
            b"PROXY TCP6 ::ffff:10.0.0.1 ::1 5 6\r\n"
        );
        assert_eq!(encode(Version::V1, None), b"PROXY UNKNOWN\r\n");
    }

    #[test]
    fn v2_binary() {
        let header = encode(
            Version::V2,
            Some((addr("127.0.0.2:40000"), addr("127.0.0.1:8080"))),
        );
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend_from_slice(&[0x21, 0x11, 0, 12, 127, 0, 0, 2, 127, 0, 0, 1]);
        expected.extend_from_slice(&40000u16.to_be_bytes());
        expected.extend_from_slice(&8080u16.to_be_bytes());
        assert_eq!(header, expected);
        let v6 = encode(Version::V2, Some((addr("[::1]:1"), addr("[::1]:2"))));
        assert_eq!(&v6[12..16], &[0x21, 0x21, 0, 36]);
        assert_eq!(v6.len(), 16 + 36);
        assert_eq!(&encode(Version::V2, None)[12..], &[0x20, 0, 0, 0]);
    }
}
