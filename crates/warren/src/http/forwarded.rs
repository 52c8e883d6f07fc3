//! Who the visitor is when Warren sits behind other proxies: [`Cidr`] address ranges and
//! [`client_ip`], the rightmost-untrusted walk of `X-Forwarded-For`.
//!
//! `X-Forwarded-For` is written by every proxy on the way, each appending the address it
//! received the request from. Only the entries added by proxies we trust are worth
//! anything: anything to their left was written by the visitor, who can write whatever
//! they like. So the walk starts at the TCP peer and moves left only while the current hop
//! is a trusted proxy; the first untrusted address is the visitor. A peer that is not a
//! trusted proxy is the visitor itself, and its `X-Forwarded-For` is ignored entirely
//! (a spoofed header from the internet changes nothing).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;
use http::header::HeaderName;

/// The header [`client_ip`] reads.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The most `X-Forwarded-For` entries [`client_ip`] walks through. Real chains are a
/// handful of hops long; a longer one is cut so a crafted header costs little.
pub const MAX_FORWARDED_HOPS: usize = 32;

/// A range of IP addresses: `10.0.0.0/8`, `2001:db8::/32`, or one address (`192.0.2.7`
/// is `192.0.2.7/32`).
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.7`, what a dual-stack socket reports for
/// an IPv4 peer) match IPv4 ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The first address of the range (no host bits set).
    network: IpAddr,
    /// The prefix length: up to 32 for IPv4, 128 for IPv6.
    prefix: u8,
}

/// Why a CIDR string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// The address part is not an IP address.
    #[error("{0:?} is not an IP address or a CIDR range")]
    Malformed(String),
    /// The prefix is not a number within the address family's size.
    #[error("prefix /{prefix} is out of range for {family} (0..={max})")]
    BadPrefix {
        /// The prefix as written.
        prefix: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// 32 or 128.
        max: u8,
    },
    /// Bits are set after the prefix (`10.0.0.1/8`): probably a typo for one address or
    /// for the network; refused rather than guessed.
    #[error("{written} has bits set after the /{prefix} prefix")]
    HostBitsSet {
        /// The range as written.
        written: String,
        /// The prefix length.
        prefix: u8,
        /// The network the prefix describes (`10.0.0.0/8`).
        network: String,
    },
}

impl CidrError {
    /// How to fix it, for a config error's hint.
    pub fn hint(&self) -> String {
        match self {
            CidrError::HostBitsSet { network, written, .. } => format!(
                "write {network} for the whole range, or {} for one address",
                written.split('/').next().unwrap_or(written)
            ),
            _ => "write an address (\"192.0.2.7\", \"2001:db8::1\") or a range (\"10.0.0.0/8\", \"2001:db8::/32\")".to_owned(),
        }
    }
}

impl Cidr {
    /// The range of `network/prefix`.
    ///
    /// # Errors
    /// [`CidrError::BadPrefix`] for a prefix longer than the address, and
    /// [`CidrError::HostBitsSet`] when `network` has bits set after the prefix.
    pub fn try_new(network: IpAddr, prefix: u8) -> Result<Cidr, CidrError> {
        let max = max_prefix(network);
        if prefix > max {
            return Err(CidrError::BadPrefix {
                prefix: prefix.to_string(),
                family: family(network),
                max,
            });
        }
        let masked = mask(network, prefix);
        if masked != network {
            return Err(CidrError::HostBitsSet {
                written: format!("{network}/{prefix}"),
                prefix,
                network: format!("{masked}/{prefix}"),
            });
        }
        Ok(Cidr { network, prefix })
    }

    /// The range holding only `address`.
    pub fn host(address: IpAddr) -> Cidr {
        let address = address.to_canonical();
        Cidr {
            network: address,
            prefix: max_prefix(address),
        }
    }

    /// The first address of the range.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `address` is in the range (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        match (self.network, address) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(address, self.prefix) == self.network
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let text = text.trim();
        let malformed = || CidrError::Malformed(text.to_owned());
        let Some((address, prefix)) = text.split_once('/') else {
            let address: IpAddr = text.parse().map_err(|_| malformed())?;
            return Ok(Cidr::host(address));
        };
        let mut address: IpAddr = address.parse().map_err(|_| malformed())?;
        let bad_prefix = || CidrError::BadPrefix {
            prefix: prefix.to_owned(),
            family: family(address),
            max: max_prefix(address),
        };
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
            return Err(bad_prefix());
        }
        let mut prefix: u8 = prefix.parse().map_err(|_| bad_prefix())?;
        // `::ffff:10.0.0.0/104` is an IPv4 range written as IPv6; addresses are compared
        // in their IPv4 form, so the range must be too.
        if let IpAddr::V6(v6) = address
            && let Some(v4) = v6.to_ipv4_mapped()
            && prefix >= 96
        {
            address = IpAddr::V4(v4);
            prefix -= 96;
        }
        Cidr::try_new(address, prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn family(address: IpAddr) -> &'static str {
    match address {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

fn max_prefix(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `address` with every bit after the first `prefix` cleared.
fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & kept))
        }
    }
}

/// Whether any range of `ranges` holds `address`.
pub fn any_contains(ranges: &[Cidr], address: IpAddr) -> bool {
    ranges.iter().any(|range| range.contains(address))
}

/// The visitor's address: the TCP `peer`, or, when the peer is one of the `trusted`
/// proxies, the rightmost address of `X-Forwarded-For` that is not a trusted proxy.
///
/// Several `X-Forwarded-For` headers count as one list, in order. The walk goes right to
/// left, moving past an entry only while the hop that wrote it is trusted; it stops at an
/// entry that is not an address (`unknown`, garbage, a header that is not ASCII), and the
/// answer is then the last trusted hop, since nothing further left can be believed. When
/// every entry is a trusted proxy, the leftmost one is the answer. At most
/// [`MAX_FORWARDED_HOPS`] entries are read. Entries may carry a port (`192.0.2.7:4711`,
/// `[2001:db8::1]:4711`); IPv4-mapped IPv6 addresses come back as IPv4.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let peer = peer.to_canonical();
    if !any_contains(trusted, peer) {
        return peer;
    }
    // Entries right to left: the last header's last entry first. A header that is not
    // visible ASCII becomes one entry that does not parse, which ends the walk there.
    let entries = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .rev()
        .flat_map(|value| match value.to_str() {
            Ok(text) => entries_right_to_left(text),
            Err(_) => vec![""],
        })
        .take(MAX_FORWARDED_HOPS);
    let mut client = peer;
    for entry in entries {
        if !any_contains(trusted, client) {
            break;
        }
        match parse_entry(entry) {
            Some(address) => client = address,
            None => break,
        }
    }
    client
}

/// The comma-separated entries of one header value, right to left (empty entries, as in
/// `a,,b`, are skipped: some proxies write them).
fn entries_right_to_left(text: &str) -> Vec<&str> {
    text.rsplit(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .take(MAX_FORWARDED_HOPS)
        .collect()
}

/// One `X-Forwarded-For` entry: an address, with or without a port.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim().trim_matches('"');
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(address.to_canonical());
    }
    if let Ok(socket) = entry.parse::<SocketAddr>() {
        return Some(socket.ip().to_canonical());
    }
    // `[2001:db8::1]` without a port.
    let bracketed = entry.strip_prefix('[')?.strip_suffix(']')?;
    bracketed
        .parse::<Ipv6Addr>()
        .ok()
        .map(|v6| IpAddr::V6(v6).to_canonical())
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("valid CIDR")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("valid IP")
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                &X_FORWARDED_FOR,
                HeaderValue::from_str(value).expect("ascii"),
            );
        }
        headers
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr(" 192.0.2.7 ").to_string(), "192.0.2.7/32");
        assert_eq!(cidr("2001:db8::/32").to_string(), "2001:db8::/32");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        assert_eq!(cidr("0.0.0.0/0").prefix(), 0);
        assert_eq!(cidr("::/0").prefix(), 0);
        assert!(matches!(
            "10.0.0.1/8".parse::<Cidr>(),
            Err(CidrError::HostBitsSet { ref network, .. }) if network == "10.0.0.0/8"
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::BadPrefix { max: 32, .. })
        ));
        assert!(matches!(
            "2001:db8::/129".parse::<Cidr>(),
            Err(CidrError::BadPrefix { max: 128, .. })
        ));
        for bad in [
            "",
            "10.0.0",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "host/8",
            "1.2.3.4/0008",
            "10.0.0.0/99999999999",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} was accepted");
        }
        let hint = "10.0.0.1/8".parse::<Cidr>().expect_err("host bits").hint();
        assert!(
            hint.contains("10.0.0.0/8") && hint.contains("10.0.0.1"),
            "{hint}"
        );
    }

    #[test]
    fn cidr_contains() {
        let private = cidr("10.0.0.0/8");
        assert!(private.contains(ip("10.1.2.3")));
        assert!(!private.contains(ip("11.0.0.0")));
        assert!(
            private.contains(ip("::ffff:10.9.9.9")),
            "mapped IPv4 matches"
        );
        assert!(!private.contains(ip("2001:db8::1")));
        let doc = cidr("2001:db8::/32");
        assert!(doc.contains(ip("2001:db8:ffff::1")));
        assert!(!doc.contains(ip("2001:db9::1")));
        assert!(!doc.contains(ip("10.0.0.1")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!cidr("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        assert!(cidr("192.0.2.7").contains(ip("192.0.2.7")));
        assert_eq!(cidr("::ffff:10.0.0.0/104"), cidr("10.0.0.0/8"));
        assert!(cidr("::ffff:10.0.0.0/104").contains(ip("::ffff:10.1.1.1")));
        assert!(!cidr("192.0.2.7").contains(ip("192.0.2.8")));
    }

    #[test]
    fn untrusted_peer_ignores_forwarded_for() {
        let trusted = [cidr("10.0.0.0/8")];
        let spoofed = xff(&["1.1.1.1"]);
        assert_eq!(
            client_ip(ip("203.0.113.5"), &spoofed, &trusted),
            ip("203.0.113.5")
        );
        // And with no trusted proxies at all, the header never matters.
        assert_eq!(client_ip(ip("10.0.0.1"), &spoofed, &[]), ip("10.0.0.1"));
    }

    #[test]
    fn trusted_peer_gives_rightmost_untrusted() {
        let trusted = [cidr("10.0.0.0/8"), cidr("2001:db8::/32")];
        // The visitor wrote "6.6.6.6" themselves; the trusted LB appended their real address.
        let headers = xff(&["6.6.6.6, 198.51.100.4, 10.0.0.3"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("198.51.100.4")
        );
        // Several headers are one list, in order.
        let headers = xff(&["6.6.6.6", "198.51.100.4", "10.0.0.3"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("198.51.100.4")
        );
        // Ports and brackets.
        let headers = xff(&["[2001:db8::9]:443, 198.51.100.4:5555"]);
        assert_eq!(
            client_ip(ip("2001:db8::1"), &headers, &trusted),
            ip("198.51.100.4")
        );
        let headers = xff(&["[2001:db9::9]"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &headers, &trusted),
            ip("2001:db9::9")
        );
        // A mapped peer counts as IPv4.
        let headers = xff(&["198.51.100.4"]);
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.2"), &headers, &trusted),
            ip("198.51.100.4")
        );
        // All trusted: the leftmost.
        let headers = xff(&["10.0.0.9, 10.0.0.8"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("10.0.0.9")
        );
        // No header: the peer.
        assert_eq!(
            client_ip(ip("10.0.0.2"), &HeaderMap::new(), &trusted),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn malformed_entry_stops_at_last_trusted_hop() {
        let trusted = [cidr("10.0.0.0/8")];
        let headers = xff(&["198.51.100.4, unknown, 10.0.0.3"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("10.0.0.3")
        );
        let headers = xff(&["198.51.100.4, garbage"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("10.0.0.2")
        );
        let mut headers = xff(&["198.51.100.4"]);
        headers.append(
            &X_FORWARDED_FOR,
            HeaderValue::from_bytes(b"\xff\xfe").expect("opaque bytes are a valid value"),
        );
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("10.0.0.2")
        );
        // An untrusted hop ends the walk before a malformed entry further left matters.
        let headers = xff(&["nonsense, 198.51.100.4"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &headers, &trusted),
            ip("198.51.100.4")
        );
    }

    #[test]
    fn long_chains_are_cut() {
        let trusted = [cidr("10.0.0.0/8")];
        let mut list: Vec<String> = vec!["198.51.100.4".to_owned()];
        list.extend((0..100).map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1)));
        let headers = xff(&[&list.join(",")]);
        let found = client_ip(ip("10.0.0.2"), &headers, &trusted);
        assert!(
            trusted[0].contains(found),
            "stopped inside the trusted chain: {found}"
        );
    }
}
