//! The cipher-speed extensions of the handshake payloads, appended after the first
//! protocol version's encodings so that older peers never notice them.
//!
//! `ClientInit` (Noise message 1) and `ServerInit::Accept` (message 2) are postcard
//! structs, and postcard's `from_bytes` ignores bytes after the value it decoded. So a
//! newer side encodes the v1 value exactly as before and appends its extension:
//!
//! ```text
//! message 1 payload: ClientInit (v1) || ClientExt        (ClientExt only from newer clients)
//!                       [|| 'T' || tls_proof[32]]          (`wss` clients, see below)
//! message 2 payload: ServerInit (v1) || AcceptExt        (only after an Accept, and only to
//!                                                          a client that sent a ClientExt)
//! ```
//!
//! The TLS proof ([`ClientExt::tls_proof`]) is sent by a client whose WebSocket runs inside
//! TLS (`wss`): a MAC of its TLS session's exporter under the PSK. A server that computes
//! the same MAC from its own side of the TLS session knows nothing between them ended the
//! TLS (a CDN or reverse proxy that terminates TLS makes two sessions with two exporters),
//! so the records inside need no cipher of their own, as on `tls`. Older servers ignore it.
//!
//! A newer decoder reads the v1 value with `postcard::take_from_bytes` and, if bytes remain,
//! the extension; a malformed extension is a malformed message. Bytes after the extension
//! are ignored, which leaves room for the next extension by the same rule.
//!
//! Suites travel here as their [`CipherSuite::wire_id`] bytes, not as the enum, so a suite
//! this version does not know (a newer peer's) is skipped instead of failing the message.
//! That is also how suites added after v1 (`aegis-128x2`) are offered: only in
//! [`ClientExt::offer`], never in the v1 list an older server decodes.
//!
//! Every list holds at most [`MAX_EXT_ENTRIES`] entries, checked while decoding, before
//! anything is allocated for it.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::cipher::{CipherChoice, CipherSuite, SuiteSpeed};

/// Most entries in any list of an extension (offer or speeds): more than there are suites.
pub const MAX_EXT_ENTRIES: usize = 16;

/// What a newer client appends to `ClientInit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientExt {
    /// `fastest`: choose by [`ClientExt::speeds`]; `ordered`: by the order of
    /// [`ClientExt::offer`].
    pub choice: CipherChoice,
    /// Every suite the client allows, most preferred first, including suites an older
    /// server would not know. Takes the place of `ClientInit::ciphers` for a newer server.
    pub offer: Vec<CipherSuite>,
    /// The client's measured speeds (empty under `ordered`).
    pub speeds: Vec<SuiteSpeed>,
    /// On `wss`: the MAC of the client's TLS exporter (see the module docs).
    pub tls_proof: Option<[u8; 32]>,
}

/// The tag before [`ClientExt::tls_proof`]'s 32 bytes.
const TLS_PROOF_TAG: u8 = b'T';

/// What a newer server appends to `ServerInit::Accept`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptExt {
    /// The rule that picked the cipher.
    pub decided_by: CipherChoice,
    /// The server's measured speeds (empty when it measured nothing).
    pub speeds: Vec<SuiteSpeed>,
}

/// One speed on the wire: the suite by number, MB/s for seal and open.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct WireSpeed {
    suite: u8,
    seal_mbps: u32,
    open_mbps: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct ClientExtWire {
    choice: CipherChoice,
    #[serde(deserialize_with = "bounded")]
    offer: Vec<u8>,
    #[serde(deserialize_with = "bounded")]
    speeds: Vec<WireSpeed>,
}

#[derive(Debug, Serialize, Deserialize)]
struct AcceptExtWire {
    decided_by: CipherChoice,
    #[serde(deserialize_with = "bounded")]
    speeds: Vec<WireSpeed>,
}

/// The extension could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed cipher-speed extension")]
pub struct MalformedExt;

fn to_wire(speeds: &[SuiteSpeed]) -> Vec<WireSpeed> {
    speeds
        .iter()
        .take(MAX_EXT_ENTRIES)
        .map(|speed| WireSpeed {
            suite: speed.suite.wire_id(),
            seal_mbps: speed.seal_mbps,
            open_mbps: speed.open_mbps,
        })
        .collect()
}

fn from_wire(speeds: Vec<WireSpeed>) -> Vec<SuiteSpeed> {
    speeds
        .into_iter()
        .filter_map(|speed| {
            Some(SuiteSpeed {
                suite: CipherSuite::from_wire_id(speed.suite)?,
                seal_mbps: speed.seal_mbps,
                open_mbps: speed.open_mbps,
            })
        })
        .collect()
}

impl ClientExt {
    /// The extension's bytes (at most [`MAX_EXT_ENTRIES`] of each list are sent).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = crate::message::encode(&ClientExtWire {
            choice: self.choice,
            offer: self
                .offer
                .iter()
                .take(MAX_EXT_ENTRIES)
                .map(|suite| suite.wire_id())
                .collect(),
            speeds: to_wire(&self.speeds),
        });
        if let Some(proof) = &self.tls_proof {
            bytes.push(TLS_PROOF_TAG);
            bytes.extend_from_slice(proof);
        }
        bytes
    }

    /// Decodes the bytes after `ClientInit`; unknown suites are dropped, and so are bytes
    /// after the extension that are not a TLS proof (a later extension).
    ///
    /// # Errors
    /// [`MalformedExt`] for bytes that are not an extension or a list over
    /// [`MAX_EXT_ENTRIES`].
    pub fn decode(bytes: &[u8]) -> Result<Self, MalformedExt> {
        let (wire, later) =
            postcard::take_from_bytes::<ClientExtWire>(bytes).map_err(|_| MalformedExt)?;
        let tls_proof = match later.split_first() {
            Some((&TLS_PROOF_TAG, rest)) => rest.get(..32).and_then(|p| p.try_into().ok()),
            _ => None,
        };
        Ok(ClientExt {
            tls_proof,
            choice: wire.choice,
            offer: wire
                .offer
                .into_iter()
                .filter_map(CipherSuite::from_wire_id)
                .collect(),
            speeds: from_wire(wire.speeds),
        })
    }
}

impl AcceptExt {
    /// The extension's bytes (at most [`MAX_EXT_ENTRIES`] speeds are sent).
    pub fn encode(&self) -> Vec<u8> {
        crate::message::encode(&AcceptExtWire {
            decided_by: self.decided_by,
            speeds: to_wire(&self.speeds),
        })
    }

    /// Decodes the bytes after `ServerInit::Accept`; unknown suites are dropped.
    ///
    /// # Errors
    /// As [`ClientExt::decode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, MalformedExt> {
        let (wire, _later_extensions) =
            postcard::take_from_bytes::<AcceptExtWire>(bytes).map_err(|_| MalformedExt)?;
        Ok(AcceptExt {
            decided_by: wire.decided_by,
            speeds: from_wire(wire.speeds),
        })
    }
}

/// Deserializes a sequence of at most [`MAX_EXT_ENTRIES`] elements, refusing a longer one
/// from its declared length, before allocating.
fn bounded<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "at most {MAX_EXT_ENTRIES} entries")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            if let Some(len) = seq.size_hint().filter(|&len| len > MAX_EXT_ENTRIES) {
                return Err(de::Error::invalid_length(len, &self));
            }
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() == MAX_EXT_ENTRIES {
                    return Err(de::Error::invalid_length(out.len() + 1, &self));
                }
                out.push(item);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_seq(Bounded(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn speed(suite: CipherSuite, seal_mbps: u32, open_mbps: u32) -> SuiteSpeed {
        SuiteSpeed {
            suite,
            seal_mbps,
            open_mbps,
        }
    }

    #[test]
    fn round_trips() {
        let ext = ClientExt {
            choice: CipherChoice::Fastest,
            offer: vec![CipherSuite::Aegis128X2, CipherSuite::Aes128Gcm],
            speeds: vec![
                speed(CipherSuite::Aegis128X2, 20_000, 19_000),
                speed(CipherSuite::Aes128Gcm, u32::MAX, 0),
            ],
            tls_proof: None,
        };
        assert_eq!(ClientExt::decode(&ext.encode()), Ok(ext.clone()));
        let proven = ClientExt {
            tls_proof: Some([7; 32]),
            ..ext.clone()
        };
        assert_eq!(ClientExt::decode(&proven.encode()), Ok(proven.clone()));
        // A cut proof is no proof.
        let encoded = proven.encode();
        assert_eq!(
            ClientExt::decode(&encoded[..encoded.len() - 1]),
            Ok(ext.clone())
        );
        let accept = AcceptExt {
            decided_by: CipherChoice::Ordered,
            speeds: vec![speed(CipherSuite::ChaCha20Poly1305, 2_500, 2_400)],
        };
        assert_eq!(AcceptExt::decode(&accept.encode()), Ok(accept));
        // A later extension after this one is ignored, as this one is by older peers.
        let mut longer = ext.encode();
        longer.extend_from_slice(&[0xff, 0x00, 0x42]);
        assert_eq!(ClientExt::decode(&longer), Ok(ext));
    }

    #[test]
    fn unknown_suites_are_skipped() {
        let wire = ClientExtWire {
            choice: CipherChoice::Fastest,
            offer: vec![99, 3],
            speeds: vec![
                WireSpeed {
                    suite: 200,
                    seal_mbps: 1,
                    open_mbps: 1,
                },
                WireSpeed {
                    suite: 3,
                    seal_mbps: 9,
                    open_mbps: 8,
                },
            ],
        };
        let ext = ClientExt::decode(&crate::message::encode(&wire)).unwrap();
        assert_eq!(ext.offer, [CipherSuite::Aegis128L]);
        assert_eq!(ext.speeds, [speed(CipherSuite::Aegis128L, 9, 8)]);
    }

    #[test]
    fn long_lists_and_garbage_are_malformed() {
        let wire = ClientExtWire {
            choice: CipherChoice::Fastest,
            offer: vec![1; MAX_EXT_ENTRIES + 1],
            speeds: vec![],
        };
        assert_eq!(
            ClientExt::decode(&crate::message::encode(&wire)),
            Err(MalformedExt)
        );
        // A declared length of 2^32 - 1 is refused before anything is allocated.
        assert_eq!(
            ClientExt::decode(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Err(MalformedExt)
        );
        let at_max = AcceptExtWire {
            decided_by: CipherChoice::Fastest,
            speeds: vec![
                WireSpeed {
                    suite: 0,
                    seal_mbps: 1,
                    open_mbps: 1
                };
                MAX_EXT_ENTRIES
            ],
        };
        assert_eq!(
            AcceptExt::decode(&crate::message::encode(&at_max))
                .unwrap()
                .speeds
                .len(),
            MAX_EXT_ENTRIES
        );
        for bad in [&[][..], &[7], &[0, 3, 1, 2], &[1, 1, 0, 1]] {
            assert_eq!(ClientExt::decode(bad), Err(MalformedExt), "{bad:?}");
        }
        // Encoding never sends more than the bound, so a peer never refuses ours.
        let many = ClientExt {
            choice: CipherChoice::Fastest,
            offer: vec![CipherSuite::Aes128Gcm; 40],
            speeds: vec![speed(CipherSuite::Aes128Gcm, 1, 1); 40],
            tls_proof: None,
        };
        let decoded = ClientExt::decode(&many.encode()).unwrap();
        assert_eq!(decoded.offer.len(), MAX_EXT_ENTRIES);
        assert_eq!(decoded.speeds.len(), MAX_EXT_ENTRIES);
    }
}
