//! STUN Binding messages (RFC 8489), only what Warren's peer-to-peer connectivity needs.
//!
//! Three users: the server's address reflector (a Binding request in, a success response with
//! XOR-MAPPED-ADDRESS out), the peers' connectivity checks (the same messages, signed with
//! MESSAGE-INTEGRITY-SHA256 under a key both peers derived from the join code, plus a
//! WARREN-AGENT attribute so a peer can tell its own checks from the other's), and the
//! server's relay of last resort (a Binding request carrying WARREN-RELAY, signed under a
//! key derived from the server's PSK; the answer carries WARREN-RELAY-STATE).
//!
//! Written by hand rather than taken from a crate: Warren needs one method, a few attributes
//! and an integrity tag keyed by its own PAKE-derived key (not STUN's short- or long-term
//! credential model with USERNAME/REALM), and this crate stays free of crypto and IO: the
//! caller computes the HMAC over [`IntegrityTag::signed_input`]. The generic crates
//! (`stun-types`, `stun_codec` + `bytecodec`, `stun-rs`) bring attribute registries and
//! credential machinery for a ~250-line job.
//!
//! * [`Message`]: a Binding request or response (with [`RelayState`] on a relay's answer); [`Message::encode`] /
//!   [`Message::encode_signed`] write it; [`decode`] reads one with hard bounds and never
//!   panics.
//! * [`classify`]: RFC 7983 / RFC 9443 first-byte demultiplexing of STUN and QUIC sharing one
//!   UDP port (0–3 STUN, 64–255 QUIC with the fixed bit set).
//!
//! Format (all big-endian): a 20-byte header `[type u16][length u16][magic cookie
//! 0x2112A442][transaction id 12 bytes]`, then attributes `[type u16][length u16][value,
//! padded to 4]`. The header's length counts the attribute bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use thiserror::Error;

/// The fixed value in every STUN header since RFC 5389.
pub const MAGIC_COOKIE: u32 = 0x2112_A442;
/// STUN header length.
pub const HEADER_LEN: usize = 20;
/// The largest message we accept: far above what Binding messages need (~100 bytes), small
/// enough that decoding costs nothing (RFC 8489 suggests 548 bytes for unknown paths).
pub const MAX_MESSAGE_LEN: usize = 548;
/// At most this many attributes are read from one message.
pub const MAX_ATTRIBUTES: usize = 16;

/// Message type of a Binding request.
const BINDING_REQUEST: u16 = 0x0001;
/// Message type of a Binding success response.
const BINDING_SUCCESS: u16 = 0x0101;
/// Message type of a Binding error response.
const BINDING_ERROR: u16 = 0x0111;

/// XOR-MAPPED-ADDRESS (RFC 8489 §14.2).
const ATTR_XOR_MAPPED_ADDRESS: u16 = 0x0020;
/// MESSAGE-INTEGRITY-SHA256 (RFC 8489 §14.6): HMAC-SHA256 over the message before it.
const ATTR_MESSAGE_INTEGRITY_SHA256: u16 = 0x001C;
/// FINGERPRINT (RFC 8489 §14.7): accepted and ignored.
const ATTR_FINGERPRINT: u16 = 0x8028;
/// WARREN-AGENT: 8 random bytes naming the agent that sent a check, in the
/// comprehension-optional range so other STUN software ignores it.
const ATTR_WARREN_AGENT: u16 = 0xC057;
/// WARREN-RELAY: the 32-byte relay token a leg presents to the relay (comprehension-optional).
const ATTR_WARREN_RELAY: u16 = 0xC058;
/// WARREN-RELAY-STATE: the relay's answer about a leg, one byte (then padding).
const ATTR_WARREN_RELAY_STATE: u16 = 0xC059;
/// WARREN-CHANGE-PORT: a request to be answered from the server's other reflector port
/// (RFC 5780's CHANGE-REQUEST with only its "change port" flag), for the NAT-type probe.
const ATTR_WARREN_CHANGE_PORT: u16 = 0xC05A;

/// Length of a relay token.
pub const RELAY_TOKEN_LEN: usize = 32;

/// Length of the integrity tag (full HMAC-SHA256; truncated tags are refused).
pub const INTEGRITY_LEN: usize = 32;
/// Length of a transaction id.
pub const TRANSACTION_ID_LEN: usize = 12;

/// A STUN transaction id: 96 random bits chosen by the requester.
pub type TransactionId = [u8; TRANSACTION_ID_LEN];

/// Who a datagram on a shared UDP port is for (RFC 7983 §7, RFC 9443 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demux {
    /// First byte 0–3: STUN.
    Stun,
    /// First byte 64–255: QUIC with its fixed bit set (short header 64–127, long header
    /// 192–255). RFC 9443 gives 128–191 to RTP/RTCP, which Warren never carries, so QUIC
    /// takes it too; the endpoint must not grease the fixed bit (RFC 9287), or QUIC could
    /// start with 0–63 and be taken for STUN.
    Quic,
    /// Anything else (ZRTP, DTLS, garbage): nobody here wants it.
    Other,
}

/// Classifies a datagram by its first byte; empty datagrams are [`Demux::Other`].
pub fn classify(datagram: &[u8]) -> Demux {
    match datagram.first() {
        Some(0..=3) => Demux::Stun,
        Some(64..=255) => Demux::Quic,
        _ => Demux::Other,
    }
}

/// The kind of a Binding message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A Binding request.
    Request,
    /// A Binding success response.
    Success,
    /// A Binding error response (decoded so it can be ignored knowingly; never sent).
    Error,
}

/// Where a leg stands at the relay (WARREN-RELAY-STATE in the relay's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayState {
    /// Registered; the other leg has not come yet.
    Waiting,
    /// Both legs are there: QUIC to the relay reaches the peer.
    Paired,
    /// The relay carries as many pairs as it may; try later.
    Full,
}

impl RelayState {
    fn to_byte(self) -> u8 {
        match self {
            RelayState::Waiting => 0,
            RelayState::Paired => 1,
            RelayState::Full => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(RelayState::Waiting),
            1 => Some(RelayState::Paired),
            2 => Some(RelayState::Full),
            _ => None,
        }
    }
}

/// A Binding message: what Warren sends and reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Request or response.
    pub class: Class,
    /// Chosen by the requester, echoed by the responder.
    pub transaction: TransactionId,
    /// XOR-MAPPED-ADDRESS: in a response, where the request came from.
    pub mapped: Option<SocketAddr>,
    /// WARREN-AGENT: the sending agent's id, on connectivity checks.
    pub agent: Option<[u8; 8]>,
    /// WARREN-RELAY: on a relay bind, the token both legs of one transfer present.
    pub relay: Option<[u8; RELAY_TOKEN_LEN]>,
    /// WARREN-RELAY-STATE: on the relay's answer, where the leg stands.
    pub relay_state: Option<RelayState>,
    /// WARREN-CHANGE-PORT: on a request to the reflector's other port, answer from the
    /// main one (tells whether the NAT lets in a port it never sent to).
    pub change_port: bool,
}

/// A MESSAGE-INTEGRITY-SHA256 found by [`decode`]: the tag and how much of the packet it
/// covers. The caller checks it (in constant time) with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityTag {
    /// The tag as received.
    pub tag: [u8; INTEGRITY_LEN],
    /// Offset of the integrity attribute: the tag covers the bytes before it.
    offset: usize,
}

impl IntegrityTag {
    /// The bytes the tag was computed over: the packet up to the integrity attribute, with
    /// the header's length rewritten to end just after the attribute (RFC 8489 §14.6).
    pub fn signed_input(&self, packet: &[u8]) -> Vec<u8> {
        let mut input = packet[..self.offset].to_vec();
        let len = (self.offset - HEADER_LEN + 4 + INTEGRITY_LEN) as u16;
        input[2..4].copy_from_slice(&len.to_be_bytes());
        input
    }
}

/// What [`decode`] found in a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The message.
    pub message: Message,
    /// Its integrity tag, if it carried one.
    pub integrity: Option<IntegrityTag>,
}

/// Why a datagram is not a Binding message Warren reads. Every variant means "ignore it".
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum StunError {
    /// Fewer bytes than a header.
    #[error("STUN message too short: {len} bytes, a header alone is {HEADER_LEN}")]
    TooShort {
        /// Bytes received.
        len: usize,
    },
    /// Over [`MAX_MESSAGE_LEN`].
    #[error("STUN message too long: {len} bytes, at most {max} are accepted")]
    TooLong {
        /// Bytes received.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Wrong leading bits or magic cookie: not STUN (or pre-RFC 5389 STUN).
    #[error("not a STUN message (leading bits or magic cookie wrong)")]
    NotStun,
    /// The header's length disagrees with the datagram, or is not a multiple of 4.
    #[error("STUN length field says {declared} bytes of attributes, the datagram has {actual}")]
    BadLength {
        /// From the header.
        declared: usize,
        /// After the header.
        actual: usize,
    },
    /// A method or class Warren does not handle (only Binding is).
    #[error("STUN message type {kind:#06x} is not a Binding request or response")]
    UnsupportedType {
        /// The message type.
        kind: u16,
    },
    /// An attribute runs past the end or has a value of the wrong shape.
    #[error("STUN attribute {kind:#06x} is malformed")]
    BadAttribute {
        /// The attribute type.
        kind: u16,
    },
    /// More than [`MAX_ATTRIBUTES`] attributes.
    #[error("STUN message has more than {MAX_ATTRIBUTES} attributes")]
    TooManyAttributes,
}

impl Message {
    /// A Binding request.
    pub fn request(transaction: TransactionId) -> Self {
        Self {
            class: Class::Request,
            transaction,
            mapped: None,
            agent: None,
            relay: None,
            relay_state: None,
            change_port: false,
        }
    }

    /// A Binding success response to `transaction`, telling the requester its address.
    pub fn success(transaction: TransactionId, mapped: SocketAddr) -> Self {
        Self {
            class: Class::Success,
            transaction,
            mapped: Some(mapped),
            agent: None,
            relay: None,
            relay_state: None,
            change_port: false,
        }
    }

    /// Sets WARREN-CHANGE-PORT (a NAT-type probe).
    pub fn with_change_port(mut self) -> Self {
        self.change_port = true;
        self
    }

    /// Sets WARREN-AGENT.
    pub fn with_agent(mut self, agent: [u8; 8]) -> Self {
        self.agent = Some(agent);
        self
    }

    /// Sets WARREN-RELAY (a relay bind).
    pub fn with_relay(mut self, token: [u8; RELAY_TOKEN_LEN]) -> Self {
        self.relay = Some(token);
        self
    }

    /// Sets WARREN-RELAY-STATE (the relay's answer).
    pub fn with_relay_state(mut self, state: RelayState) -> Self {
        self.relay_state = Some(state);
        self
    }

    /// Writes the message without integrity into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        self.write_header(out);
        self.write_attributes(out);
        set_length(out);
    }

    /// Writes the message followed by MESSAGE-INTEGRITY-SHA256, whose tag `mac` computes
    /// (HMAC-SHA256 under the check key) over the bytes it is given.
    pub fn encode_signed(&self, out: &mut Vec<u8>, mac: impl FnOnce(&[u8]) -> [u8; 32]) {
        self.encode(out);
        // The length covers the integrity attribute before the tag is computed.
        let len = (out.len() - HEADER_LEN + 4 + INTEGRITY_LEN) as u16;
        out[2..4].copy_from_slice(&len.to_be_bytes());
        let tag = mac(out);
        out.extend_from_slice(&ATTR_MESSAGE_INTEGRITY_SHA256.to_be_bytes());
        out.extend_from_slice(&(INTEGRITY_LEN as u16).to_be_bytes());
        out.extend_from_slice(&tag);
    }

    fn write_header(&self, out: &mut Vec<u8>) {
        let kind = match self.class {
            Class::Request => BINDING_REQUEST,
            Class::Success => BINDING_SUCCESS,
            Class::Error => BINDING_ERROR,
        };
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&MAGIC_COOKIE.to_be_bytes());
        out.extend_from_slice(&self.transaction);
    }

    fn write_attributes(&self, out: &mut Vec<u8>) {
        if let Some(addr) = self.mapped {
            let value = xor_address(addr, &self.transaction);
            out.extend_from_slice(&ATTR_XOR_MAPPED_ADDRESS.to_be_bytes());
            out.extend_from_slice(&(value.len() as u16).to_be_bytes());
            out.extend_from_slice(&value);
        }
        if let Some(agent) = self.agent {
            out.extend_from_slice(&ATTR_WARREN_AGENT.to_be_bytes());
            out.extend_from_slice(&8u16.to_be_bytes());
            out.extend_from_slice(&agent);
        }
        if let Some(token) = self.relay {
            out.extend_from_slice(&ATTR_WARREN_RELAY.to_be_bytes());
            out.extend_from_slice(&(RELAY_TOKEN_LEN as u16).to_be_bytes());
            out.extend_from_slice(&token);
        }
        if let Some(state) = self.relay_state {
            // One byte of value, padded to four (RFC 8489 §14).
            out.extend_from_slice(&ATTR_WARREN_RELAY_STATE.to_be_bytes());
            out.extend_from_slice(&1u16.to_be_bytes());
            out.extend_from_slice(&[state.to_byte(), 0, 0, 0]);
        }
        if self.change_port {
            // RFC 5780's CHANGE-REQUEST layout: the "change port" flag (0x2).
            out.extend_from_slice(&ATTR_WARREN_CHANGE_PORT.to_be_bytes());
            out.extend_from_slice(&4u16.to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 2]);
        }
    }
}

/// Rewrites the header's length to the attribute bytes present.
fn set_length(out: &mut [u8]) {
    let len = (out.len() - HEADER_LEN) as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
}

/// The value of an XOR-MAPPED-ADDRESS for `addr` (also its own inverse, see
/// [`unxor_address`]).
fn xor_address(addr: SocketAddr, transaction: &TransactionId) -> Vec<u8> {
    let cookie = MAGIC_COOKIE.to_be_bytes();
    let port = addr.port() ^ (MAGIC_COOKIE >> 16) as u16;
    let mut value = vec![0u8];
    match addr.ip() {
        IpAddr::V4(ip) => {
            value.push(0x01);
            value.extend_from_slice(&port.to_be_bytes());
            value.extend(ip.octets().iter().zip(cookie).map(|(a, b)| a ^ b));
        }
        IpAddr::V6(ip) => {
            value.push(0x02);
            value.extend_from_slice(&port.to_be_bytes());
            let pad = cookie.iter().chain(transaction.iter());
            value.extend(ip.octets().iter().zip(pad).map(|(a, b)| a ^ b));
        }
    }
    value
}

/// Reads an XOR-MAPPED-ADDRESS value; `None` if its shape is wrong.
fn unxor_address(value: &[u8], transaction: &TransactionId) -> Option<SocketAddr> {
    let cookie = MAGIC_COOKIE.to_be_bytes();
    let (&[_, family, p0, p1], rest) = value.split_first_chunk::<4>()?;
    let port = u16::from_be_bytes([p0, p1]) ^ (MAGIC_COOKIE >> 16) as u16;
    let ip = match (family, rest.len()) {
        (0x01, 4) => {
            let mut octets = [0u8; 4];
            for (i, o) in octets.iter_mut().enumerate() {
                *o = rest[i] ^ cookie[i];
            }
            IpAddr::V4(Ipv4Addr::from(octets))
        }
        (0x02, 16) => {
            let mut octets = [0u8; 16];
            let pad = cookie.iter().chain(transaction.iter());
            for ((o, r), p) in octets.iter_mut().zip(rest).zip(pad) {
                *o = r ^ p;
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Decodes one Binding message. Bounded: at most [`MAX_MESSAGE_LEN`] bytes and
/// [`MAX_ATTRIBUTES`] attributes are looked at; never panics.
///
/// Unknown attributes are skipped (Warren answers nothing but Binding, so there is nothing
/// to refuse them for); attributes after MESSAGE-INTEGRITY-SHA256 are ignored as RFC 8489
/// §14.6 says, which also keeps anything after the tag out of what it is trusted for.
///
/// # Errors
///
/// [`StunError`] when the datagram is not a well-formed Binding message.
pub fn decode(packet: &[u8]) -> Result<Decoded, StunError> {
    if packet.len() < HEADER_LEN {
        return Err(StunError::TooShort { len: packet.len() });
    }
    if packet.len() > MAX_MESSAGE_LEN {
        return Err(StunError::TooLong {
            len: packet.len(),
            max: MAX_MESSAGE_LEN,
        });
    }
    let kind = u16::from_be_bytes([packet[0], packet[1]]);
    let declared = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    let cookie = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    if kind & 0xC000 != 0 || cookie != MAGIC_COOKIE {
        return Err(StunError::NotStun);
    }
    let actual = packet.len() - HEADER_LEN;
    if declared != actual || declared % 4 != 0 {
        return Err(StunError::BadLength { declared, actual });
    }
    let class = match kind {
        BINDING_REQUEST => Class::Request,
        BINDING_SUCCESS => Class::Success,
        BINDING_ERROR => Class::Error,
        _ => return Err(StunError::UnsupportedType { kind }),
    };
    let mut transaction = [0u8; TRANSACTION_ID_LEN];
    transaction.copy_from_slice(&packet[8..HEADER_LEN]);

    let mut message = Message {
        class,
        transaction,
        mapped: None,
        agent: None,
        relay: None,
        relay_state: None,
        change_port: false,
    };
    let mut integrity = None;
    let mut at = HEADER_LEN;
    let mut count = 0;
    while at < packet.len() {
        count += 1;
        if count > MAX_ATTRIBUTES {
            return Err(StunError::TooManyAttributes);
        }
        let header = packet
            .get(at..at + 4)
            .ok_or(StunError::BadAttribute { kind: 0 })?;
        let attr = u16::from_be_bytes([header[0], header[1]]);
        let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let bad = StunError::BadAttribute { kind: attr };
        let value = packet.get(at + 4..at + 4 + len).ok_or(bad.clone())?;
        match attr {
            ATTR_XOR_MAPPED_ADDRESS => {
                message.mapped = Some(unxor_address(value, &transaction).ok_or(bad)?);
            }
            ATTR_WARREN_AGENT => {
                message.agent = Some(value.try_into().map_err(|_| bad)?);
            }
            ATTR_WARREN_RELAY => {
                message.relay = Some(value.try_into().map_err(|_| bad)?);
            }
            ATTR_WARREN_RELAY_STATE => {
                let state = match value {
                    [byte] => RelayState::from_byte(*byte),
                    _ => None,
                };
                message.relay_state = Some(state.ok_or(bad)?);
            }
            ATTR_WARREN_CHANGE_PORT => {
                message.change_port = match value {
                    [0, 0, 0, flags] => flags & 2 != 0,
                    _ => return Err(bad),
                };
            }
            ATTR_MESSAGE_INTEGRITY_SHA256 => {
                let tag = value.try_into().map_err(|_| bad)?;
                integrity = Some(IntegrityTag { tag, offset: at });
                // Anything after the tag is not covered by it: stop reading.
                break;
            }
            ATTR_FINGERPRINT => {}
            _ => {}
        }
        // Values are padded to a multiple of 4; the padding may run to the end exactly.
        at += 4 + len.div_ceil(4) * 4;
        if at > packet.len() {
            return Err(StunError::BadAttribute { kind: attr });
        }
    }
    Ok(Decoded { message, integrity })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TX: TransactionId = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

    fn fake_mac(bytes: &[u8]) -> [u8; 32] {
        // Not a MAC: enough to check what the codec feeds it.
        let mut tag = [0u8; 32];
        for (i, b) in bytes.iter().enumerate() {
            tag[i % 32] ^= b.wrapping_add(i as u8);
        }
        tag
    }

    #[test]
    fn request_round_trips() {
        let mut out = Vec::new();
        let msg = Message::request(TX);
        msg.encode(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(classify(&out), Demux::Stun);
        let decoded = decode(&out).unwrap();
        assert_eq!(decoded.message, msg);
        assert_eq!(decoded.integrity, None);
    }

    #[test]
    fn success_round_trips_v4_and_v6() {
        for addr in [
            "203.0.113.7:40123".parse().unwrap(),
            "[2001:db8::1]:5".parse::<SocketAddr>().unwrap(),
        ] {
            let mut out = Vec::new();
            let msg = Message::success(TX, addr).with_agent([9; 8]);
            msg.encode(&mut out);
            assert_eq!(decode(&out).unwrap().message, msg);
        }
    }

    #[test]
    fn known_rfc5769_vector_ipv4_response() {
        // RFC 5769 §2.2 sample response, XOR-MAPPED-ADDRESS 192.0.2.1:32853.
        let tx = [
            0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86, 0xfa, 0x87, 0xdf, 0xae,
        ];
        let value = xor_address("192.0.2.1:32853".parse().unwrap(), &tx);
        assert_eq!(value, [0x00, 0x01, 0xa1, 0x47, 0xe1, 0x12, 0xa6, 0x43]);
    }

    #[test]
    fn signed_message_verifies_and_tampering_shows() {
        let mut out = Vec::new();
        let msg = Message::request(TX).with_agent([7; 8]);
        msg.encode_signed(&mut out, fake_mac);
        let decoded = decode(&out).unwrap();
        assert_eq!(decoded.message, msg);
        let tag = decoded.integrity.unwrap();
        assert_eq!(fake_mac(&tag.signed_input(&out)), tag.tag);

        // Flip a bit in the agent: still decodes, the tag no longer matches.
        let mut bad = out.clone();
        bad[HEADER_LEN + 4] ^= 1;
        let tag = decode(&bad).unwrap().integrity.unwrap();
        assert_ne!(fake_mac(&tag.signed_input(&bad)), tag.tag);
    }

    #[test]
    fn relay_bind_and_answer_round_trip_signed() {
        let mut out = Vec::new();
        let bind = Message::request(TX).with_relay([5; RELAY_TOKEN_LEN]);
        bind.encode_signed(&mut out, fake_mac);
        assert_eq!(classify(&out), Demux::Stun);
        let decoded = decode(&out).unwrap();
        assert_eq!(decoded.message, bind);
        let tag = decoded.integrity.unwrap();
        assert_eq!(fake_mac(&tag.signed_input(&out)), tag.tag);
        for state in [RelayState::Waiting, RelayState::Paired, RelayState::Full] {
            let answer =
                Message::success(TX, "192.0.2.9:4000".parse().unwrap()).with_relay_state(state);
            answer.encode_signed(&mut out, fake_mac);
            assert_eq!(decode(&out).unwrap().message, answer);
        }
        // An unknown state, or a token of the wrong length, is malformed.
        let mut bad = Vec::new();
        Message::request(TX)
            .with_relay_state(RelayState::Full)
            .encode(&mut bad);
        bad[HEADER_LEN + 4] = 9;
        assert!(matches!(decode(&bad), Err(StunError::BadAttribute { .. })));
        let mut short = Vec::new();
        Message::request(TX).encode(&mut short);
        short.extend_from_slice(&ATTR_WARREN_RELAY.to_be_bytes());
        short.extend_from_slice(&4u16.to_be_bytes());
        short.extend_from_slice(&[1, 2, 3, 4]);
        set_length(&mut short);
        assert!(matches!(
            decode(&short),
            Err(StunError::BadAttribute { .. })
        ));
    }

    #[test]
    fn change_port_round_trips_and_a_bad_value_is_refused() {
        let mut out = Vec::new();
        Message::request(TX).with_change_port().encode(&mut out);
        let decoded = decode(&out).unwrap().message;
        assert!(decoded.change_port);
        Message::request(TX).encode(&mut out);
        assert!(!decode(&out).unwrap().message.change_port);
        // A value that is not four bytes of flags.
        Message::request(TX).with_change_port().encode(&mut out);
        let last = out.len() - 4;
        out[last] = 9;
        assert!(matches!(decode(&out), Err(StunError::BadAttribute { .. })));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(matches!(decode(&[0; 3]), Err(StunError::TooShort { .. })));
        assert!(matches!(
            decode(&[0; MAX_MESSAGE_LEN + 1]),
            Err(StunError::TooLong { .. })
        ));
        let mut out = Vec::new();
        Message::request(TX).encode(&mut out);
        let mut no_cookie = out.clone();
        no_cookie[4] = 0;
        assert_eq!(decode(&no_cookie), Err(StunError::NotStun));
        let mut long = out.clone();
        long.extend_from_slice(&[0, 0x20, 0, 40]);
        assert!(matches!(decode(&long), Err(StunError::BadLength { .. })));
        set_length(&mut long);
        assert!(matches!(decode(&long), Err(StunError::BadAttribute { .. })));
        let mut other = out.clone();
        other[1] = 0x03; // Allocate (TURN)
        assert!(matches!(
            decode(&other),
            Err(StunError::UnsupportedType { .. })
        ));
    }

    #[test]
    fn demux_ranges() {
        assert_eq!(classify(&[]), Demux::Other);
        assert_eq!(classify(&[3]), Demux::Stun);
        assert_eq!(classify(&[4]), Demux::Other);
        assert_eq!(classify(&[64]), Demux::Quic);
        assert_eq!(classify(&[191]), Demux::Quic);
        assert_eq!(classify(&[0xc3]), Demux::Quic); // a long-header Initial
        assert_eq!(classify(&[63]), Demux::Other);
    }
}
