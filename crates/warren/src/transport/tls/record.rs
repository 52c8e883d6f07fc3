//! TLS 1.3 records after the handshake (RFC 8446 §5.2, §4.6.3), sealed and opened in the
//! caller's buffer: the `tls` and `wss` transports' data path.
//!
//! rustls does the handshake; then [`super`] takes the two application traffic secrets
//! (through rustls's key log hook) and these types protect every record. Why by hand: the
//! records are Warren's fast path, and rustls's buffered API copies each record's plaintext
//! twice more than needed (into a fresh `Vec` per record, then into the caller's buffer),
//! which on this project's machines cost a third of the receiver's CPU (see the module doc
//! of [`super`]). The AEAD is aws-lc's, as in rustls, or ring's where that measures faster
//! ([`crate::crypto::aead`]).
//!
//! What the peer sees is ordinary TLS 1.3: `application_data` records of at most 2^14
//! bytes of content, `close_notify` at the end, `KeyUpdate` before a key nears its limit
//! (and in answer to one asking for it). Received `NewSessionTicket` messages (nginx and
//! CDNs in front of a `wss` server send them) are read and ignored: Warren never resumes.
//!
//! Nothing here does IO.

use aws_lc_rs::hkdf;

use crate::crypto::aead::{self, Algorithm};

/// Bytes of a record header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;

/// The most content one record carries (2^14, RFC 8446 §5.1).
pub const MAX_CONTENT: usize = 1 << 14;

/// The longest record body a peer may send: content, type byte, padding and tag within
/// 2^14 + 256 (RFC 8446 §5.2).
pub const MAX_BODY: usize = MAX_CONTENT + 256;

/// What [`Sealer::seal`] adds to the content: the header, the inner content type and the tag.
pub const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

const TAG_LEN: usize = aead::TAG_LEN;
const NONCE_LEN: usize = aead::NONCE_LEN;

/// Records sealed under one key before a `KeyUpdate`: 2^23, below AES-GCM's limit of
/// 2^24.5 full records (RFC 8446 §5.5), as rustls uses.
const RECORDS_PER_KEY: u64 = 1 << 23;

const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const LEGACY_VERSION: [u8; 2] = [0x03, 0x03];

const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
const ALERT_CLOSE_NOTIFY: u8 = 0;

/// The negotiated TLS 1.3 suite: its AEAD and the hash of its key schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    /// `TLS_AES_128_GCM_SHA256`.
    Aes128Gcm,
    /// `TLS_AES_256_GCM_SHA384`.
    Aes256Gcm,
    /// `TLS_CHACHA20_POLY1305_SHA256`.
    ChaCha20Poly1305,
}

impl Suite {
    /// The suite rustls negotiated, if it is one of TLS 1.3's three.
    pub fn from_rustls(suite: rustls::CipherSuite) -> Option<Suite> {
        match suite {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => Some(Suite::Aes128Gcm),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => Some(Suite::Aes256Gcm),
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => Some(Suite::ChaCha20Poly1305),
            _ => None,
        }
    }

    /// Its AEAD.
    pub(crate) fn aead(self) -> Algorithm {
        match self {
            Suite::Aes128Gcm => Algorithm::Aes128Gcm,
            Suite::Aes256Gcm => Algorithm::Aes256Gcm,
            Suite::ChaCha20Poly1305 => Algorithm::ChaCha20Poly1305,
        }
    }

    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Suite::Aes256Gcm => hkdf::HKDF_SHA384,
            Suite::Aes128Gcm | Suite::ChaCha20Poly1305 => hkdf::HKDF_SHA256,
        }
    }

    /// Length of a traffic secret: the hash's output.
    fn secret_len(self) -> usize {
        match self {
            Suite::Aes256Gcm => 48,
            Suite::Aes128Gcm | Suite::ChaCha20Poly1305 => 32,
        }
    }
}

/// Why a record could not be sealed or opened. Every one ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A traffic secret of the wrong length for the suite (an internal error).
    #[error("a TLS traffic secret of {len} bytes for {suite:?} (internal error)")]
    Secret {
        /// The suite.
        suite: Suite,
        /// The secret's length.
        len: usize,
    },
    /// The header is not a TLS 1.3 application-data record of an allowed length.
    #[error(
        "not a TLS 1.3 record (type {kind}, version {version:02x?}, length {len}): the peer does not speak TLS 1.3 here"
    )]
    BadHeader {
        /// Outer content type.
        kind: u8,
        /// Legacy version bytes.
        version: [u8; 2],
        /// Declared body length.
        len: usize,
    },
    /// Authentication failed: altered, reordered or replayed, or other keys.
    #[error("a TLS record failed authentication (altered in transit, or sealed with other keys)")]
    Decrypt,
    /// The record decrypted to nothing but padding: no content type.
    #[error("a TLS record has no content type")]
    NoContentType,
    /// The peer ended the connection with an alert other than `close_notify`.
    #[error("the peer sent TLS alert {description} (RFC 8446 §6)")]
    Alert {
        /// The alert's description code.
        description: u8,
    },
    /// A handshake message this layer does not take after the handshake.
    #[error(
        "an unexpected TLS handshake message (type {kind}) after the handshake; only tickets and key updates are allowed"
    )]
    UnexpectedHandshake {
        /// The message type.
        kind: u8,
    },
    /// A post-handshake message split across records, or malformed.
    #[error("a malformed TLS post-handshake message")]
    BadHandshake,
    /// An inner content type other than data, alert or handshake.
    #[error("a TLS record of unexpected content type {kind}")]
    UnexpectedContent {
        /// The inner content type.
        kind: u8,
    },
    /// aws-lc refused to seal (not expected).
    #[error("sealing a TLS record failed (internal error)")]
    Seal,
}

/// The key, IV and record number of one direction, and the secret the next key comes from.
struct TrafficKeys {
    suite: Suite,
    key: aead::Key,
    iv: [u8; NONCE_LEN],
    /// The current traffic secret (the hash's length, at most 48 bytes).
    secret: [u8; 48],
    /// The next record's number under this key.
    seq: u64,
}

impl TrafficKeys {
    /// Keys from `application_traffic_secret_N` (RFC 8446 §7.3), starting at record 0.
    fn new(suite: Suite, secret: &[u8]) -> Result<TrafficKeys, RecordError> {
        if secret.len() != suite.secret_len() {
            return Err(RecordError::Secret {
                suite,
                len: secret.len(),
            });
        }
        let prk = hkdf::Prk::new_less_safe(suite.hkdf(), secret);
        let alg = suite.aead();
        let mut key = [0u8; 32];
        let key = &mut key[..alg.key_len()];
        expand_label(&prk, b"key", key)?;
        let mut iv = [0u8; NONCE_LEN];
        expand_label(&prk, b"iv", &mut iv)?;
        let key = aead::Key::new(alg, key).map_err(|_| RecordError::Seal)?;
        let mut stored = [0u8; 48];
        stored[..secret.len()].copy_from_slice(secret);
        Ok(TrafficKeys {
            suite,
            key,
            iv,
            secret: stored,
            seq: 0,
        })
    }

    /// `application_traffic_secret_N+1` and its keys (RFC 8446 §7.2).
    fn update(&mut self) -> Result<(), RecordError> {
        let len = self.suite.secret_len();
        let prk = hkdf::Prk::new_less_safe(self.suite.hkdf(), &self.secret[..len]);
        let mut next = [0u8; 48];
        expand_label(&prk, b"traffic upd", &mut next[..len])?;
        *self = TrafficKeys::new(self.suite, &next[..len])?;
        Ok(())
    }

    /// `IV XOR seq`, the record number big-endian in the last 8 bytes.
    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut nonce = self.iv;
        for (byte, count) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *byte ^= count;
        }
        nonce
    }
}

/// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446 §7.1).
fn expand_label(prk: &hkdf::Prk, label: &[u8], out: &mut [u8]) -> Result<(), RecordError> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    // `out` is 12 to 48 bytes and the label short: both fit their length bytes.
    let length = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| RecordError::Seal)
}

fn header(len: usize) -> [u8; HEADER_LEN] {
    // `len <= MAX_BODY < 2^16`.
    let len = (len as u16).to_be_bytes();
    [
        CONTENT_APPLICATION_DATA,
        LEGACY_VERSION[0],
        LEGACY_VERSION[1],
        len[0],
        len[1],
    ]
}

/// Seals the records one side sends.
pub struct Sealer {
    keys: TrafficKeys,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("suite", &self.keys.suite)
            .field("seq", &self.keys.seq)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer from this side's `application_traffic_secret_0`.
    ///
    /// # Errors
    /// A secret of the wrong length for `suite`.
    pub fn new(suite: Suite, secret: &[u8]) -> Result<Sealer, RecordError> {
        Ok(Sealer {
            keys: TrafficKeys::new(suite, secret)?,
        })
    }

    /// Seals the content `buf[start + HEADER_LEN..]` (at most [`MAX_CONTENT`] bytes) as one
    /// application-data record in place: on entry `buf[start..start + HEADER_LEN]` is room
    /// for the header; on return `buf[start..]` is the record. Sends a `KeyUpdate` first
    /// (in front of the record, moving it) when the key has sealed its share.
    ///
    /// # Errors
    /// [`RecordError::Seal`] if the AEAD refuses (not expected).
    pub fn seal(&mut self, buf: &mut Vec<u8>, start: usize) -> Result<(), RecordError> {
        debug_assert!(buf.len() - start - HEADER_LEN <= MAX_CONTENT);
        if self.keys.seq >= RECORDS_PER_KEY {
            // Rare (once per 2^23 records): shifting this record's content is cheap then.
            let content = buf.split_off(start + HEADER_LEN);
            buf.truncate(start);
            self.key_update(buf, false)?;
            let start = buf.len();
            buf.extend_from_slice(&[0; HEADER_LEN]);
            buf.extend_from_slice(&content);
            return self.seal_inner(buf, start, CONTENT_APPLICATION_DATA);
        }
        self.seal_inner(buf, start, CONTENT_APPLICATION_DATA)
    }

    /// Appends a `KeyUpdate` record (asking the peer to update too if `request`) and moves
    /// to the next key.
    ///
    /// # Errors
    /// [`RecordError::Seal`] if the AEAD refuses (not expected).
    pub fn key_update(&mut self, buf: &mut Vec<u8>, request: bool) -> Result<(), RecordError> {
        let start = buf.len();
        buf.extend_from_slice(&[0; HEADER_LEN]);
        buf.extend_from_slice(&[HANDSHAKE_KEY_UPDATE, 0, 0, 1, u8::from(request)]);
        self.seal_inner(buf, start, CONTENT_HANDSHAKE)?;
        self.keys.update()
    }

    /// Appends a `close_notify` alert record.
    ///
    /// # Errors
    /// [`RecordError::Seal`] if the AEAD refuses (not expected).
    pub fn close_notify(&mut self, buf: &mut Vec<u8>) -> Result<(), RecordError> {
        let start = buf.len();
        buf.extend_from_slice(&[0; HEADER_LEN]);
        // Level 1 (warning), description 0 (close_notify).
        buf.extend_from_slice(&[1, ALERT_CLOSE_NOTIFY]);
        self.seal_inner(buf, start, CONTENT_ALERT)
    }

    fn seal_inner(&mut self, buf: &mut Vec<u8>, start: usize, kind: u8) -> Result<(), RecordError> {
        buf.push(kind);
        let header = header(buf.len() - start - HEADER_LEN + TAG_LEN);
        let nonce = self.keys.nonce();
        // The record number is spent even on failure: never reuse a nonce.
        self.keys.seq += 1;
        let tag = self
            .keys
            .key
            .seal_in_place_separate_tag(nonce, &header, &mut buf[start + HEADER_LEN..])
            .map_err(|_| RecordError::Seal)?;
        buf.extend_from_slice(&tag);
        buf[start..start + HEADER_LEN].copy_from_slice(&header);
        Ok(())
    }
}

/// What one opened record was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Application data: the content is `body[..len]`.
    Data(usize),
    /// The peer's `close_notify`: nothing more comes.
    Closed,
    /// A message for this layer alone (a ticket, a key update); nothing to hand out.
    Nothing,
}

/// Opens the records one side receives.
pub struct Opener {
    keys: TrafficKeys,
    /// The peer asked for a `KeyUpdate` back; the writer owes one.
    update_requested: bool,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("suite", &self.keys.suite)
            .field("seq", &self.keys.seq)
            .finish_non_exhaustive()
    }
}

impl Opener {
    /// An opener from the peer's `application_traffic_secret_0`.
    ///
    /// # Errors
    /// A secret of the wrong length for `suite`.
    pub fn new(suite: Suite, secret: &[u8]) -> Result<Opener, RecordError> {
        Ok(Opener {
            keys: TrafficKeys::new(suite, secret)?,
            update_requested: false,
        })
    }

    /// Checks a header and returns the body length to read next (at most [`MAX_BODY`]).
    ///
    /// # Errors
    /// [`RecordError::BadHeader`] for anything but an application-data record (every
    /// record after the handshake looks like one) of a length TLS 1.3 allows.
    pub fn parse_header(header: [u8; HEADER_LEN]) -> Result<usize, RecordError> {
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let version = [header[1], header[2]];
        if header[0] != CONTENT_APPLICATION_DATA
            || version != LEGACY_VERSION
            || !(TAG_LEN + 1..=MAX_BODY).contains(&len)
        {
            return Err(RecordError::BadHeader {
                kind: header[0],
                version,
                len,
            });
        }
        Ok(len)
    }

    /// Whether the peer asked for a `KeyUpdate` in return since the last call.
    pub fn take_update_request(&mut self) -> bool {
        std::mem::take(&mut self.update_requested)
    }

    /// Authenticates and decrypts one record in place (`body` as long as
    /// [`parse_header`](Self::parse_header) said) and says what it was.
    ///
    /// # Errors
    /// Authentication failures, alerts other than `close_notify`, and post-handshake
    /// messages other than tickets and key updates.
    pub fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> Result<Opened, RecordError> {
        let nonce = self.keys.nonce();
        let plain_len = self
            .keys
            .key
            .open_in_place(nonce, &header, body)
            .map_err(|_| RecordError::Decrypt)?;
        let plain = &body[..plain_len];
        self.keys.seq += 1;
        // The content type is the last non-zero byte; zeros after it are padding.
        let Some(end) = plain.iter().rposition(|&b| b != 0) else {
            return Err(RecordError::NoContentType);
        };
        let kind = plain[end];
        let content = &plain[..end];
        match kind {
            CONTENT_APPLICATION_DATA => Ok(Opened::Data(end)),
            CONTENT_ALERT => match content {
                [_, ALERT_CLOSE_NOTIFY] => Ok(Opened::Closed),
                [_, description] => Err(RecordError::Alert {
                    description: *description,
                }),
                _ => Err(RecordError::BadHandshake),
            },
            CONTENT_HANDSHAKE => {
                self.handshake_messages(content)?;
                Ok(Opened::Nothing)
            }
            kind => Err(RecordError::UnexpectedContent { kind }),
        }
    }

    /// Reads whole post-handshake messages: tickets are dropped, a key update moves to the
    /// next key (after this record: the record carrying it was sealed with the old one).
    fn handshake_messages(&mut self, mut content: &[u8]) -> Result<(), RecordError> {
        if content.is_empty() {
            return Err(RecordError::BadHandshake);
        }
        while !content.is_empty() {
            let [kind, a, b, c, rest @ ..] = content else {
                return Err(RecordError::BadHandshake);
            };
            let len = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
            if rest.len() < len {
                // Split across records: tickets and key updates never need that.
                return Err(RecordError::BadHandshake);
            }
            let (body, after) = rest.split_at(len);
            match (*kind, body) {
                (HANDSHAKE_NEW_SESSION_TICKET, _) => {}
                (HANDSHAKE_KEY_UPDATE, [request @ (0 | 1)]) => {
                    if !after.is_empty() {
                        // RFC 8446 §5.1: a key change must fall on a record boundary.
                        return Err(RecordError::BadHandshake);
                    }
                    self.keys.update()?;
                    self.update_requested |= *request == 1;
                }
                (HANDSHAKE_KEY_UPDATE, _) => return Err(RecordError::BadHandshake),
                (kind, _) => return Err(RecordError::UnexpectedHandshake { kind }),
            }
            content = after;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUITES: [Suite; 3] = [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::ChaCha20Poly1305];

    fn pair(suite: Suite) -> (Sealer, Opener) {
        let secret = vec![7u8; suite.secret_len()];
        (
            Sealer::new(suite, &secret).unwrap(),
            Opener::new(suite, &secret).unwrap(),
        )
    }

    fn seal_data(sealer: &mut Sealer, content: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; HEADER_LEN];
        buf.extend_from_slice(content);
        sealer.seal(&mut buf, 0).unwrap();
        buf
    }

    /// Opens every record in `wire`; returns the data and whether a close came.
    fn open_all(opener: &mut Opener, mut wire: &mut [u8]) -> Result<(Vec<u8>, bool), RecordError> {
        let mut data = Vec::new();
        let mut closed = false;
        while !wire.is_empty() {
            let (header, rest) = wire.split_first_chunk_mut::<HEADER_LEN>().unwrap();
            let len = Opener::parse_header(*header)?;
            let (body, rest) = rest.split_at_mut(len);
            match opener.open(*header, body)? {
                Opened::Data(n) => data.extend_from_slice(&body[..n]),
                Opened::Closed => closed = true,
                Opened::Nothing => {}
            }
            wire = rest;
        }
        Ok((data, closed))
    }

    #[test]
    fn records_round_trip_in_every_suite() {
        for suite in SUITES {
            let (mut sealer, mut opener) = pair(suite);
            let mut wire = Vec::new();
            for len in [0, 1, 100, MAX_CONTENT] {
                let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut record = seal_data(&mut sealer, &content);
                assert_eq!(record.len(), len + OVERHEAD);
                wire.append(&mut record);
            }
            sealer.close_notify(&mut wire).unwrap();
            let (data, closed) = open_all(&mut opener, &mut wire).unwrap();
            assert_eq!(data.len(), 1 + 100 + MAX_CONTENT);
            assert!(closed, "{suite:?}");
        }
    }

    #[test]
    fn a_changed_byte_or_a_replay_fails() {
        let (mut sealer, mut opener) = pair(Suite::Aes128Gcm);
        let mut record = seal_data(&mut sealer, b"hello");
        let mut copy = record.clone();
        copy[HEADER_LEN + 2] ^= 1;
        assert_eq!(
            open_all(&mut pair(Suite::Aes128Gcm).1, &mut copy),
            Err(RecordError::Decrypt)
        );
        let mut replay = record.clone();
        open_all(&mut opener, &mut record).unwrap();
        assert_eq!(
            open_all(&mut opener, &mut replay),
            Err(RecordError::Decrypt)
        );
    }

    #[test]
    fn headers_that_are_not_application_data_are_refused() {
        assert!(Opener::parse_header([23, 3, 3, 0, 17]).is_ok());
        for header in [
            [22, 3, 3, 0, 40],
            [23, 3, 1, 0, 40],
            [23, 3, 3, 0, 16],
            [23, 3, 3, 0x41, 0x01],
        ] {
            assert!(Opener::parse_header(header).is_err(), "{header:?}");
        }
    }

    #[test]
    fn key_updates_move_both_sides_and_a_request_is_reported() {
        for suite in SUITES {
            let (mut sealer, mut opener) = pair(suite);
            let mut wire = seal_data(&mut sealer, b"before");
            sealer.key_update(&mut wire, true).unwrap();
            wire.append(&mut seal_data(&mut sealer, b"after"));
            let (data, _) = open_all(&mut opener, &mut wire).unwrap();
            assert_eq!(data, b"beforeafter");
            assert!(opener.take_update_request());
            assert!(!opener.take_update_request());
        }
    }

    #[test]
    fn a_key_is_updated_before_its_limit() {
        let (mut sealer, mut opener) = pair(Suite::Aes128Gcm);
        sealer.keys.seq = RECORDS_PER_KEY - 1;
        opener.keys.seq = RECORDS_PER_KEY - 1;
        let mut wire = seal_data(&mut sealer, b"last under the first key");
        let mut next = seal_data(&mut sealer, b"first under the next");
        assert_eq!(sealer.keys.seq, 1, "the update record went first");
        wire.append(&mut next);
        let (data, _) = open_all(&mut opener, &mut wire).unwrap();
        assert_eq!(data, b"last under the first keyfirst under the next");
        assert!(!opener.take_update_request());
    }

    #[test]
    fn tickets_are_ignored_and_other_messages_refused() {
        let (mut sealer, mut opener) = pair(Suite::Aes128Gcm);
        let mut wire = Vec::new();
        wire.extend_from_slice(&[0; HEADER_LEN]);
        wire.extend_from_slice(&[HANDSHAKE_NEW_SESSION_TICKET, 0, 0, 3, 1, 2, 3]);
        sealer.seal_inner(&mut wire, 0, CONTENT_HANDSHAKE).unwrap();
        assert_eq!(open_all(&mut opener, &mut wire), Ok((Vec::new(), false)));

        let mut finished = vec![0; HEADER_LEN];
        finished.extend_from_slice(&[20, 0, 0, 1, 0]);
        sealer
            .seal_inner(&mut finished, 0, CONTENT_HANDSHAKE)
            .unwrap();
        assert_eq!(
            open_all(&mut opener, &mut finished),
            Err(RecordError::UnexpectedHandshake { kind: 20 })
        );
    }

    #[test]
    fn an_alert_other_than_close_notify_is_an_error() {
        let (mut sealer, mut opener) = pair(Suite::ChaCha20Poly1305);
        let mut wire = vec![0; HEADER_LEN];
        wire.extend_from_slice(&[2, 40]);
        sealer.seal_inner(&mut wire, 0, CONTENT_ALERT).unwrap();
        assert_eq!(
            open_all(&mut opener, &mut wire),
            Err(RecordError::Alert { description: 40 })
        );
    }

    #[test]
    fn padding_is_stripped_and_all_padding_refused() {
        let (mut sealer, mut opener) = pair(Suite::Aes128Gcm);
        // Content "hi", type 23, three zeros of padding.
        let mut wire = vec![0; HEADER_LEN];
        wire.extend_from_slice(b"hi");
        wire.push(CONTENT_APPLICATION_DATA);
        wire.extend_from_slice(&[0, 0]);
        sealer.seal_inner(&mut wire, 0, 0).unwrap();
        assert_eq!(open_all(&mut opener, &mut wire).unwrap().0, b"hi");

        let mut empty = vec![0; HEADER_LEN + 3];
        sealer.seal_inner(&mut empty, 0, 0).unwrap();
        assert_eq!(
            open_all(&mut opener, &mut empty),
            Err(RecordError::NoContentType)
        );
    }

    #[test]
    fn a_secret_of_the_wrong_length_is_refused() {
        assert!(matches!(
            Sealer::new(Suite::Aes256Gcm, &[0; 32]),
            Err(RecordError::Secret { .. })
        ));
    }
}
