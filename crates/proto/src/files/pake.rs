//! The messages two peers exchange to turn a join code into keys: SPAKE2, key
//! confirmation, and the sealed certificate fingerprints. The state machine that produces
//! and checks them lives in `warren::p2p::pake` (it needs the crypto library); this is only
//! their wire form, so it can be fuzzed on its own.
//!
//! # Wire format
//!
//! The server's mailbox carries each message as one opaque blob; every message has a fixed
//! length per type, so there is nothing to bound beyond that.
//!
//! ```text
//! message:     version(u8 = 1)  type(u8)  body
//! type 0x01 Spake:        33 bytes  the SPAKE2 message (`S` || Ed25519 point)
//! type 0x02 Confirm:      32 bytes  HMAC-SHA256 key-confirmation tag
//! type 0x03 Fingerprint:  48 bytes  AES-256-GCM(SHA-256 of the certificate's SPKI) + tag
//! ```

/// The message format this code writes and reads.
pub const PAKE_VERSION: u8 = 1;

/// Length of a SPAKE2 (Ed25519 group) message: a side byte and a compressed point.
pub const SPAKE_LEN: usize = 33;

/// Length of a key-confirmation tag (HMAC-SHA256).
pub const CONFIRM_LEN: usize = 32;

/// Length of a certificate fingerprint (SHA-256).
pub const FINGERPRINT_LEN: usize = 32;

/// Length of a sealed fingerprint: the fingerprint and a 16-byte AEAD tag.
pub const SEALED_FINGERPRINT_LEN: usize = FINGERPRINT_LEN + 16;

const TYPE_SPAKE: u8 = 0x01;
const TYPE_CONFIRM: u8 = 0x02;
const TYPE_FINGERPRINT: u8 = 0x03;

/// One PAKE message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PakeMessage {
    /// The SPAKE2 message; both sides send one first.
    Spake([u8; SPAKE_LEN]),
    /// Proof of the shared key, sent once the peer's SPAKE2 message is in.
    Confirm([u8; CONFIRM_LEN]),
    /// The sender's certificate fingerprint, sealed; sent only after the peer's
    /// confirmation checked out.
    Fingerprint([u8; SEALED_FINGERPRINT_LEN]),
}

/// A PAKE message that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PakeMessageError {
    /// A version this build does not read.
    #[error(
        "key exchange message version {version} is not supported (this build speaks {supported}): use the same Warren version on both sides"
    )]
    UnsupportedVersion {
        /// The version received.
        version: u8,
        /// [`PAKE_VERSION`].
        supported: u8,
    },
    /// An unknown type byte.
    #[error("unknown key exchange message type {kind:#04x}: the peer is broken or hostile")]
    UnknownType {
        /// The type byte.
        kind: u8,
    },
    /// The body's length does not match the type.
    #[error(
        "key exchange message of type {kind:#04x} has {len} bytes; expected {expected}: the peer is broken or hostile"
    )]
    BadLength {
        /// The type byte (0 if the message is shorter than its header).
        kind: u8,
        /// The body's length.
        len: usize,
        /// What the type requires.
        expected: usize,
    },
}

impl PakeMessage {
    /// The wire encoding.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, body): (u8, &[u8]) = match self {
            PakeMessage::Spake(b) => (TYPE_SPAKE, b),
            PakeMessage::Confirm(b) => (TYPE_CONFIRM, b),
            PakeMessage::Fingerprint(b) => (TYPE_FINGERPRINT, b),
        };
        let mut out = Vec::with_capacity(2 + body.len());
        out.push(PAKE_VERSION);
        out.push(kind);
        out.extend_from_slice(body);
        out
    }

    /// Reads one message (the whole blob).
    ///
    /// # Errors
    ///
    /// [`PakeMessageError`] for a wrong version, type or length.
    pub fn decode(bytes: &[u8]) -> Result<PakeMessage, PakeMessageError> {
        let [version, kind, body @ ..] = bytes else {
            return Err(PakeMessageError::BadLength {
                kind: bytes.get(1).copied().unwrap_or(0),
                len: bytes.len(),
                expected: 2,
            });
        };
        if *version != PAKE_VERSION {
            return Err(PakeMessageError::UnsupportedVersion {
                version: *version,
                supported: PAKE_VERSION,
            });
        }
        let bad_length = |expected| PakeMessageError::BadLength {
            kind: *kind,
            len: body.len(),
            expected,
        };
        match *kind {
            TYPE_SPAKE => body
                .try_into()
                .map(PakeMessage::Spake)
                .map_err(|_| bad_length(SPAKE_LEN)),
            TYPE_CONFIRM => body
                .try_into()
                .map(PakeMessage::Confirm)
                .map_err(|_| bad_length(CONFIRM_LEN)),
            TYPE_FINGERPRINT => body
                .try_into()
                .map(PakeMessage::Fingerprint)
                .map_err(|_| bad_length(SEALED_FINGERPRINT_LEN)),
            kind => Err(PakeMessageError::UnknownType { kind }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for m in [
            PakeMessage::Spake([1; SPAKE_LEN]),
            PakeMessage::Confirm([2; CONFIRM_LEN]),
            PakeMessage::Fingerprint([3; SEALED_FINGERPRINT_LEN]),
        ] {
            let bytes = m.encode();
            assert_eq!(PakeMessage::decode(&bytes), Ok(m));
            assert!(PakeMessage::decode(&bytes[..bytes.len() - 1]).is_err());
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(PakeMessage::decode(&longer).is_err());
        }
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            PakeMessage::decode(&[]),
            Err(PakeMessageError::BadLength { len: 0, .. })
        ));
        assert!(matches!(
            PakeMessage::decode(&[1]),
            Err(PakeMessageError::BadLength { len: 1, .. })
        ));
        assert_eq!(
            PakeMessage::decode(&[2, 1]),
            Err(PakeMessageError::UnsupportedVersion {
                version: 2,
                supported: 1
            })
        );
        assert_eq!(
            PakeMessage::decode(&[1, 9]),
            Err(PakeMessageError::UnknownType { kind: 9 })
        );
        assert_eq!(
            PakeMessage::decode(&[1, 2, 0]),
            Err(PakeMessageError::BadLength {
                kind: 2,
                len: 1,
                expected: 32
            })
        );
    }
}
