//! Warren's AEAD record layer: the synchronous core that frames, seals and opens every data
//! record on the TCP-based transports.
//!
//! This is the fast path, and the reason Warren is hand-written here instead of wrapping a
//! generic framing or Noise transport: each record is sealed and opened *in place* in a
//! buffer the caller reuses, with up to 64 KiB per record, an implicit counter nonce, no
//! allocation and no copy beyond appending the tag. AES-GCM and ChaCha20-Poly1305 come from
//! aws-lc-rs or ring, whichever is faster here ([`crate::crypto::aead`]), AEGIS-128L,
//! AEGIS-128X2 and AEGIS-256 from the `aegis` crate's C backend.
//! Nothing here does IO; the transport reads and writes the bytes.
//!
//! # Wire format
//!
//! ```text
//! +--------+----------------+--------------------------+-----------------+
//! | kind   | len (u24, BE)  | ciphertext               | tag             |
//! | 1 byte | 3 bytes        | payload_len bytes        | tag_len bytes   |
//! +--------+----------------+--------------------------+-----------------+
//!  \______ header (HEADER_LEN = 4) _______/
//! ```
//!
//! - `kind` is a [`RecordKind`]: `0` data, `1` end of stream (half-close, empty payload),
//!   `2` control message, `3` orderly close of the whole channel (payload: an optional
//!   reason), `4` one datagram (payload: a 4-byte flow id and the datagram, see
//!   [`crate::session::datagram`]). Other values are rejected.
//! - `len` is the length of everything after the header: `payload_len + tag_len`, with
//!   `payload_len <= MAX_PAYLOAD` (65536). The reader checks it with
//!   [`Opener::parse_header`] *before* it allocates or reads the body: a `len` below
//!   `tag_len`, above `MAX_PAYLOAD + tag_len`, or a non-empty end-of-stream record is an
//!   error. `tag_len` is 16 for every encrypting suite and 0 for [`CipherSuite::None`].
//! - The four header bytes are the AEAD's associated data, so a changed kind or length
//!   fails authentication even where it still parses.
//!
//! # Keys and nonces
//!
//! Each direction has its own [`DirectionKeys`]: an AEAD key and a nonce base (IV) derived
//! with HKDF-SHA256 from the handshake's shared secret and a per-direction label
//! ([`DirectionKeys::derive`]). The IV is as long as the cipher's nonce: 12 bytes for
//! AES-GCM and ChaCha20-Poly1305, 16 for AEGIS-128L and AEGIS-128X2, 32 for AEGIS-256. Record number `n`
//! (counted from 0 by both sides, never sent) is sealed with the nonce `IV XOR n`, `n`
//! written big-endian into the nonce's last 8 bytes (as in TLS 1.3).
//!
//! # Rekeying
//!
//! After [`REKEY_AFTER`] (2^24) records under one key, both sides replace key and IV with
//! `HKDF-SHA256(ikm = current key, salt = "", info = "warren rekey")` split into
//! `key || iv`, reset `n` to 0 and carry on; nothing is exchanged. 2^24 records of 64 KiB
//! is 1 TiB per key, which keeps AES-GCM's confidentiality and integrity advantage below
//! about 2^-57 (draft-irtf-cfrg-aead-limits). `n` never exceeds `REKEY_AFTER`, so a nonce
//! is never reused under a key.
//!
//! # Call-order contract
//!
//! A [`Sealer`] and an [`Opener`] are a pair only if built from the same suite and the
//! same `DirectionKeys`, and the opener sees every record the sealer produced, in order.
//! The reader calls [`Opener::parse_header`] on the 4 header bytes, reads exactly the body
//! length it returns, then calls [`Opener::open`]; only after `open` succeeds are the kind
//! and payload authentic. Any error from `open` means the stream is broken (altered,
//! reordered, replayed, or the wrong keys): close the channel, do not retry.
//!
//! [`CipherSuite::None`] uses the same framing with no tag and no protection at all, so the
//! plaintext `tcp` transport keeps end-of-stream and close records.

use std::fmt;

use aegis::aegis128l::Aegis128L;
use aegis::aegis128x2::Aegis128X2;
use aegis::aegis256::Aegis256;
use warren_proto::CipherSuite;

use crate::crypto::aead::{self, Algorithm};
use crate::crypto::kdf;

/// Bytes of the record header: the kind and the 24-bit body length.
pub const HEADER_LEN: usize = 4;

/// The largest payload one record carries (64 KiB).
pub const MAX_PAYLOAD: usize = 65536;

/// The longest tag any suite appends.
pub const MAX_TAG_LEN: usize = 16;

/// The largest record on the wire: header, payload and tag. A buffer with this capacity
/// never reallocates in [`Sealer::seal`].
pub const MAX_RECORD_LEN: usize = HEADER_LEN + MAX_PAYLOAD + MAX_TAG_LEN;

/// Records sealed under one key before both sides rekey (2^24; see the module docs).
pub const REKEY_AFTER: u64 = 1 << 24;

/// HKDF info prefix for [`DirectionKeys::derive`]; the suite name and the caller's label
/// follow, separated by NUL bytes.
const DOMAIN_SEP_DIRECTION: &[u8] = b"warren record v1";

/// HKDF info for deriving the next key and IV from the current key.
const DOMAIN_SEP_REKEY: &[u8] = b"warren rekey";

/// Longest key of any suite.
const MAX_KEY_LEN: usize = 32;

/// Longest nonce (and so IV) of any suite: AEGIS-256's.
const MAX_IV_LEN: usize = 32;

/// The record's kind, sent in clear in the header and authenticated as associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum RecordKind {
    /// Stream data.
    Data = 0,
    /// End of stream in this direction (half-close, FIN). The payload is empty.
    End = 1,
    /// A control message for the channel.
    Control = 2,
    /// Orderly close of the whole channel; the payload may carry a reason.
    Close = 3,
    /// One whole datagram of a UDP flow: `flow_id: u32 BE || datagram`.
    Datagram = 4,
    /// Stream data, compressed: `codec: u8 || compressed bytes`, inflating to at most
    /// [`MAX_PAYLOAD`] bytes (see [`crate::transport::compress`]).
    Compressed = 5,
}

impl TryFrom<u8> for RecordKind {
    type Error = RecordError;

    /// # Errors
    ///
    /// [`RecordError::UnknownKind`] for any byte other than 0 to 5.
    fn try_from(byte: u8) -> Result<Self, Self::Error> {
        match byte {
            0 => Ok(RecordKind::Data),
            1 => Ok(RecordKind::End),
            2 => Ok(RecordKind::Control),
            3 => Ok(RecordKind::Close),
            4 => Ok(RecordKind::Datagram),
            5 => Ok(RecordKind::Compressed),
            other => Err(RecordError::UnknownKind(other)),
        }
    }
}

impl From<RecordKind> for u8 {
    fn from(kind: RecordKind) -> u8 {
        kind as u8
    }
}

/// What went wrong with a record. Every variant except [`RecordError::TooLarge`],
/// [`RecordError::NoHeaderRoom`] and [`RecordError::Seal`] (local bugs) is the peer's
/// doing or damage in transit; none is worth retrying on the same channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The payload handed to [`Sealer::seal`] is longer than [`MAX_PAYLOAD`]: split it.
    #[error("record payload of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Payload bytes given.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// The buffer handed to [`Sealer::seal`] is shorter than [`HEADER_LEN`], so it has no
    /// room reserved for the header.
    #[error("buffer of {len} bytes has no room for the {HEADER_LEN}-byte record header")]
    NoHeaderRoom {
        /// Buffer length given.
        len: usize,
    },
    /// A header declares a body length outside `min..=max` (`tag_len` to
    /// `MAX_PAYLOAD + tag_len`): the peer is broken, hostile, or not speaking this protocol.
    #[error("record header declares a {len}-byte body; it must be {min} to {max} bytes")]
    BadHeader {
        /// The declared body length (ciphertext and tag).
        len: usize,
        /// The shortest valid body: the tag alone.
        min: usize,
        /// The longest valid body: [`MAX_PAYLOAD`] plus the tag.
        max: usize,
    },
    /// An end-of-stream record with a payload (on seal) or a body longer than the tag (on
    /// parse).
    #[error("end-of-stream record carries {len} payload bytes; it must be empty")]
    NonEmptyEnd {
        /// The payload length given or declared.
        len: usize,
    },
    /// A header names a record kind this version does not know.
    #[error("unknown record kind {0}; the peer speaks a different protocol version")]
    UnknownKind(u8),
    /// The body handed to [`Opener::open`] is not the length its header declares: the
    /// reader read the wrong number of bytes.
    #[error("record body is {actual} bytes but its header declares {expected}")]
    BodyLength {
        /// Length from the header.
        expected: usize,
        /// Length given.
        actual: usize,
    },
    /// The tag did not verify.
    #[error("record failed authentication: the data was altered in transit or the keys differ")]
    Decrypt,
    /// The AEAD refused to seal a record of valid size, or the suite is not implemented by
    /// this build (internal error, not expected).
    #[error("the AEAD refused to seal a record (internal error)")]
    Seal,
}

/// The key and nonce base (IV) for one direction of one channel.
///
/// Built by [`DirectionKeys::derive`] and consumed by [`Sealer::new`] or [`Opener::new`];
/// the sender's sealer and the receiver's opener must get equal `DirectionKeys`, and the two
/// directions must use different labels. `Debug` does not show the key material.
#[derive(Clone)]
pub struct DirectionKeys {
    /// The suite the keys were derived for; it sets the key and IV lengths.
    suite: CipherSuite,
    /// AEAD key; only the first `suite.key_len()` bytes are used.
    key: [u8; MAX_KEY_LEN],
    /// Nonce base; only the first `iv_len(suite)` bytes are used.
    iv: [u8; MAX_IV_LEN],
}

impl DirectionKeys {
    /// Derives one direction's key and IV from a shared secret:
    /// `HKDF-SHA256(ikm = secret, salt = "", info = "warren record v1" 0x00 suite-name 0x00
    /// label)`, split into `key || iv` (`suite.key_len()` and nonce-length bytes). Binding
    /// the suite name means two suites never share keys.
    ///
    /// Use a distinct `label` per direction (e.g. `b"client to server"`).
    pub fn derive(suite: CipherSuite, secret: &[u8], label: &[u8]) -> Self {
        let info: [&[u8]; 5] = [
            DOMAIN_SEP_DIRECTION,
            b"\0",
            suite.name().as_bytes(),
            b"\0",
            label,
        ];
        Self::from_hkdf(suite, secret, &info)
    }

    /// Fills key and IV from HKDF of `ikm` with `info`.
    fn from_hkdf(suite: CipherSuite, ikm: &[u8], info: &[&[u8]]) -> Self {
        let (key_len, iv_len) = (key_len(suite), iv_len(suite));
        let mut okm = [0u8; MAX_KEY_LEN + MAX_IV_LEN];
        let out = &mut okm[..key_len + iv_len];
        // Invariant: `out` is at most 64 bytes, far below HKDF-SHA256's 8160-byte limit, and
        // aws-lc's HKDF fails on nothing else; no length here comes from the network.
        kdf::hkdf_expand(ikm, b"", info, out).expect("HKDF output of at most 64 bytes is in range");
        let mut keys = DirectionKeys {
            suite,
            key: [0; MAX_KEY_LEN],
            iv: [0; MAX_IV_LEN],
        };
        keys.key[..key_len].copy_from_slice(&okm[..key_len]);
        keys.iv[..iv_len].copy_from_slice(&okm[key_len..key_len + iv_len]);
        keys
    }

    /// The suite these keys were derived for.
    pub fn suite(&self) -> CipherSuite {
        self.suite
    }
}

impl fmt::Debug for DirectionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectionKeys")
            .field("suite", &self.suite)
            .field("key", &"****")
            .field("iv", &"****")
            .finish()
    }
}

/// AEAD key length of a suite (the `aegis` and aws-lc key sizes).
fn key_len(suite: CipherSuite) -> usize {
    suite.key_len().min(MAX_KEY_LEN)
}

/// Nonce (and IV) length of a suite.
fn iv_len(suite: CipherSuite) -> usize {
    match suite {
        CipherSuite::Aegis128L | CipherSuite::Aegis128X2 => 16,
        CipherSuite::Aegis256 => 32,
        CipherSuite::None => 0,
        // AES-GCM, ChaCha20-Poly1305 and any suite added later through `aead`.
        _ => aead::NONCE_LEN,
    }
}

/// The keyed primitive of one direction.
enum Cipher {
    /// AES-GCM or ChaCha20-Poly1305; the key schedule is computed once per key.
    Aead(aead::Key),
    /// AEGIS-128L key; the AEGIS state is initialised from key and nonce per record anyway,
    /// so nothing is gained by keeping more than the key.
    Aegis128L([u8; 16]),
    /// AEGIS-128X2 key.
    Aegis128X2([u8; 16]),
    /// AEGIS-256 key.
    Aegis256([u8; 32]),
    /// [`CipherSuite::None`]: framing only.
    Plain,
    /// A suite a newer `warren-proto` names but this file does not implement: fails closed,
    /// sealing and opening nothing.
    Unsupported,
}

impl Cipher {
    fn new(suite: CipherSuite, key: &[u8; MAX_KEY_LEN]) -> Self {
        if let Some(algorithm) = Algorithm::of_suite(suite) {
            // Invariant: the key length (16 or 32) is within `key`.
            let key = aead::Key::new(algorithm, &key[..algorithm.key_len()])
                .expect("key length matches the algorithm");
            return Cipher::Aead(key);
        }
        match suite {
            CipherSuite::Aegis128L => Cipher::Aegis128L(key16(key)),
            CipherSuite::Aegis128X2 => Cipher::Aegis128X2(key16(key)),
            CipherSuite::Aegis256 => Cipher::Aegis256(*key),
            CipherSuite::None => Cipher::Plain,
            // `CipherSuite` is `#[non_exhaustive]`: a suite added to warren-proto before this
            // file learns it must fail closed, never fall back to plaintext.
            _ => Cipher::Unsupported,
        }
    }
}

/// The first 16 bytes of a key buffer: the key of a 128-bit suite.
fn key16(key: &[u8; MAX_KEY_LEN]) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&key[..16]);
    k
}

/// Key, IV and record counter of one direction; shared by [`Sealer`] and [`Opener`].
struct Direction {
    suite: CipherSuite,
    cipher: Cipher,
    /// The current key and IV, kept for rekeying (aws-lc does not give the key back).
    keys: DirectionKeys,
    /// Records processed under the current key: the next record's number `n`. Always below
    /// `rekey_after`.
    counter: u64,
    /// Records per key: [`REKEY_AFTER`], lower only in tests.
    rekey_after: u64,
    /// Rekeys so far.
    epoch: u64,
}

impl Direction {
    fn new(suite: CipherSuite, keys: DirectionKeys) -> Self {
        debug_assert_eq!(keys.suite, suite, "DirectionKeys derived for another suite");
        Direction {
            suite,
            cipher: Cipher::new(suite, &keys.key),
            keys,
            counter: 0,
            rekey_after: REKEY_AFTER,
            epoch: 0,
        }
    }

    fn set_rekey_after(&mut self, records: u64) {
        self.rekey_after = records.clamp(1, REKEY_AFTER);
    }

    /// `IV XOR n` for the current record, `n` big-endian in the last 8 bytes.
    #[inline]
    fn nonce<const N: usize>(&self) -> [u8; N] {
        const { assert!(N >= 8 && N <= MAX_IV_LEN) };
        let mut nonce = [0u8; N];
        nonce.copy_from_slice(&self.keys.iv[..N]);
        for (byte, count) in nonce[N - 8..].iter_mut().zip(self.counter.to_be_bytes()) {
            *byte ^= count;
        }
        nonce
    }

    /// Counts one record; derives the next key once this key has sealed `rekey_after`.
    #[inline]
    fn advance(&mut self) {
        self.counter += 1;
        if self.counter >= self.rekey_after {
            self.rekey();
        }
    }

    #[cold]
    fn rekey(&mut self) {
        if self.suite.is_encrypting() {
            let current = self.keys.key;
            self.keys = DirectionKeys::from_hkdf(
                self.suite,
                &current[..key_len(self.suite)],
                &[DOMAIN_SEP_REKEY],
            );
            self.cipher = Cipher::new(self.suite, &self.keys.key);
        }
        self.counter = 0;
        self.epoch = self.epoch.wrapping_add(1);
    }

    fn tag_len(&self) -> usize {
        match self.cipher {
            Cipher::Plain => 0,
            _ => self.suite.tag_len(),
        }
    }
}

impl fmt::Debug for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direction")
            .field("suite", &self.suite)
            .field("counter", &self.counter)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// Builds the header of a record whose body (ciphertext and tag) is `body_len` bytes.
#[inline]
fn encode_header(kind: RecordKind, body_len: usize) -> [u8; HEADER_LEN] {
    // `body_len <= MAX_PAYLOAD + MAX_TAG_LEN < 2^24`, checked by the caller.
    let len = (body_len as u32).to_be_bytes();
    [kind as u8, len[1], len[2], len[3]]
}

/// Seals the records of one direction. Owns that direction's key and counter.
///
/// `Debug` shows the suite and counters, never the key.
#[derive(Debug)]
pub struct Sealer {
    dir: Direction,
}

impl Sealer {
    /// A sealer for `suite` starting at record 0. `keys` must come from
    /// [`DirectionKeys::derive`] with the same `suite` (debug builds assert it).
    ///
    /// # Panics
    ///
    /// In debug builds only, if `keys` were derived for another suite.
    pub fn new(suite: CipherSuite, keys: DirectionKeys) -> Self {
        Sealer {
            dir: Direction::new(suite, keys),
        }
    }

    /// Lowers the number of records per key below [`REKEY_AFTER`] (clamped to
    /// `1..=REKEY_AFTER`), so tests can cross rekeys quickly. Both sides must use the same
    /// value. Production code has no reason to call this.
    #[must_use]
    pub fn with_rekey_after(mut self, records: u64) -> Self {
        self.dir.set_rekey_after(records);
        self
    }

    /// The suite this sealer uses.
    pub fn suite(&self) -> CipherSuite {
        self.dir.suite
    }

    /// Bytes [`seal`](Self::seal) appends: 16, or 0 for [`CipherSuite::None`].
    pub fn tag_len(&self) -> usize {
        self.dir.tag_len()
    }

    /// Seals one record in place. On entry `buf` is `[HEADER_LEN bytes of room][payload]`;
    /// on success it is the whole record, `header || ciphertext || tag`, ready to write.
    /// Nothing is allocated if `buf` has capacity for [`tag_len`](Self::tag_len) more bytes
    /// (a buffer of [`MAX_RECORD_LEN`] capacity always does).
    ///
    /// # Errors
    ///
    /// - [`RecordError::NoHeaderRoom`] if `buf` is shorter than [`HEADER_LEN`];
    /// - [`RecordError::TooLarge`] if the payload exceeds [`MAX_PAYLOAD`];
    /// - [`RecordError::NonEmptyEnd`] if `kind` is [`RecordKind::End`] with a payload;
    /// - [`RecordError::Seal`] if the AEAD refuses (not expected; the record number is then
    ///   spent and `buf` is unspecified).
    ///
    /// On the first three `buf` is untouched and no record number is used.
    pub fn seal(&mut self, kind: RecordKind, buf: &mut Vec<u8>) -> Result<(), RecordError> {
        self.seal_at(kind, buf, 0)
    }

    /// [`Sealer::seal`] of a record that starts at `start` in `buf`, after records already
    /// sealed there: several small records are sealed back to back in one buffer, to go
    /// out in one write, without a buffer and a copy each.
    ///
    /// # Errors
    ///
    /// As [`Sealer::seal`], counting from `start`.
    pub fn seal_at(
        &mut self,
        kind: RecordKind,
        buf: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), RecordError> {
        let Some(payload_len) = buf.len().checked_sub(start.saturating_add(HEADER_LEN)) else {
            return Err(RecordError::NoHeaderRoom {
                len: buf.len().saturating_sub(start),
            });
        };
        if payload_len > MAX_PAYLOAD {
            return Err(RecordError::TooLarge {
                len: payload_len,
                max: MAX_PAYLOAD,
            });
        }
        if kind == RecordKind::End && payload_len != 0 {
            return Err(RecordError::NonEmptyEnd { len: payload_len });
        }
        let header = encode_header(kind, payload_len + self.tag_len());
        let payload = &mut buf[start + HEADER_LEN..];
        let sealed = match &self.dir.cipher {
            Cipher::Aead(key) => {
                let nonce = self.dir.nonce::<{ aead::NONCE_LEN }>();
                match key.seal_in_place_separate_tag(nonce, &header, payload) {
                    Ok(tag) => {
                        buf.extend_from_slice(&tag);
                        Ok(())
                    }
                    Err(_) => Err(RecordError::Seal),
                }
            }
            Cipher::Aegis128L(key) => {
                let tag =
                    Aegis128L::<16>::new(key, &self.dir.nonce()).encrypt_in_place(payload, &header);
                buf.extend_from_slice(&tag);
                Ok(())
            }
            Cipher::Aegis128X2(key) => {
                let tag = Aegis128X2::<16>::new(key, &self.dir.nonce())
                    .encrypt_in_place(payload, &header);
                buf.extend_from_slice(&tag);
                Ok(())
            }
            Cipher::Aegis256(key) => {
                let tag =
                    Aegis256::<16>::new(key, &self.dir.nonce()).encrypt_in_place(payload, &header);
                buf.extend_from_slice(&tag);
                Ok(())
            }
            Cipher::Plain => Ok(()),
            Cipher::Unsupported => Err(RecordError::Seal),
        };
        // Spend the record number even on `Seal`: a nonce aws-lc may have touched is never
        // used again.
        self.dir.advance();
        sealed?;
        buf[start..start + HEADER_LEN].copy_from_slice(&header);
        Ok(())
    }
}

/// Opens the records of one direction. Owns that direction's key and counter.
///
/// `Debug` shows the suite and counters, never the key.
#[derive(Debug)]
pub struct Opener {
    dir: Direction,
}

impl Opener {
    /// An opener for `suite` expecting record 0 next. `keys` must equal the peer sealer's
    /// (debug builds assert they were derived for `suite`).
    ///
    /// # Panics
    ///
    /// In debug builds only, if `keys` were derived for another suite.
    pub fn new(suite: CipherSuite, keys: DirectionKeys) -> Self {
        Opener {
            dir: Direction::new(suite, keys),
        }
    }

    /// Lowers the number of records per key, like [`Sealer::with_rekey_after`]; the peer's
    /// sealer must use the same value.
    #[must_use]
    pub fn with_rekey_after(mut self, records: u64) -> Self {
        self.dir.set_rekey_after(records);
        self
    }

    /// The suite this opener uses.
    pub fn suite(&self) -> CipherSuite {
        self.dir.suite
    }

    /// Bytes of tag at the end of every body: 16, or 0 for [`CipherSuite::None`].
    pub fn tag_len(&self) -> usize {
        self.dir.tag_len()
    }

    /// Parses and checks a header: returns the kind and the body length (ciphertext and
    /// tag) to read next. Call it before reading or allocating the body; the length it
    /// returns is at most `MAX_PAYLOAD + MAX_TAG_LEN`. The kind is not authentic until
    /// [`open`](Self::open) succeeds.
    ///
    /// # Errors
    ///
    /// - [`RecordError::UnknownKind`] for a kind byte this version does not know;
    /// - [`RecordError::BadHeader`] if the length is below the tag length or above
    ///   `MAX_PAYLOAD + tag_len`;
    /// - [`RecordError::NonEmptyEnd`] for an end-of-stream record with a payload.
    #[inline]
    pub fn parse_header(
        &self,
        header: [u8; HEADER_LEN],
    ) -> Result<(RecordKind, usize), RecordError> {
        let kind = RecordKind::try_from(header[0])?;
        let len = u32::from_be_bytes([0, header[1], header[2], header[3]]) as usize;
        let tag_len = self.tag_len();
        let max = MAX_PAYLOAD + tag_len;
        if len < tag_len || len > max {
            return Err(RecordError::BadHeader {
                len,
                min: tag_len,
                max,
            });
        }
        if kind == RecordKind::End && len != tag_len {
            return Err(RecordError::NonEmptyEnd { len: len - tag_len });
        }
        Ok((kind, len))
    }

    /// Authenticates `header` and `body` (ciphertext and tag) as the next record and
    /// decrypts the body in place; returns the payload length, so the payload is
    /// `&body[..len]`. The record counter advances only on success.
    ///
    /// # Errors
    ///
    /// - the errors of [`parse_header`](Self::parse_header);
    /// - [`RecordError::BodyLength`] if `body` is not the length the header declares;
    /// - [`RecordError::Decrypt`] if authentication fails: the record was altered,
    ///   reordered, replayed or sealed with other keys. `body` is then garbage (AEGIS
    ///   zeroes it) and the channel must be closed.
    pub fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> Result<usize, RecordError> {
        let (_, len) = self.parse_header(header)?;
        if body.len() != len {
            return Err(RecordError::BodyLength {
                expected: len,
                actual: body.len(),
            });
        }
        let payload_len = match &self.dir.cipher {
            Cipher::Aead(key) => {
                let nonce = self.dir.nonce::<{ aead::NONCE_LEN }>();
                key.open_in_place(nonce, &header, body)
                    .map_err(|_| RecordError::Decrypt)?
            }
            Cipher::Aegis128L(key) => {
                let (ciphertext, tag) = body
                    .split_last_chunk_mut::<16>()
                    .ok_or(RecordError::Decrypt)?;
                Aegis128L::<16>::new(key, &self.dir.nonce())
                    .decrypt_in_place(ciphertext, tag, &header)
                    .map_err(|_| RecordError::Decrypt)?;
                ciphertext.len()
            }
            Cipher::Aegis128X2(key) => {
                let (ciphertext, tag) = body
                    .split_last_chunk_mut::<16>()
                    .ok_or(RecordError::Decrypt)?;
                Aegis128X2::<16>::new(key, &self.dir.nonce())
                    .decrypt_in_place(ciphertext, tag, &header)
                    .map_err(|_| RecordError::Decrypt)?;
                ciphertext.len()
            }
            Cipher::Aegis256(key) => {
                let (ciphertext, tag) = body
                    .split_last_chunk_mut::<16>()
                    .ok_or(RecordError::Decrypt)?;
                Aegis256::<16>::new(key, &self.dir.nonce())
                    .decrypt_in_place(ciphertext, tag, &header)
                    .map_err(|_| RecordError::Decrypt)?;
                ciphertext.len()
            }
            Cipher::Plain => body.len(),
            Cipher::Unsupported => return Err(RecordError::Decrypt),
        };
        self.dir.advance();
        Ok(payload_len)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, RngCore, SeedableRng, rngs::StdRng};

    use super::*;

    const ALL: [CipherSuite; 7] = CipherSuite::ALL;

    fn pair(suite: CipherSuite) -> (Sealer, Opener) {
        let keys = DirectionKeys::derive(suite, b"shared secret", b"client to server");
        (Sealer::new(suite, keys.clone()), Opener::new(suite, keys))
    }

    fn record(payload: &[u8]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(MAX_RECORD_LEN);
        buf.extend_from_slice(&[0; HEADER_LEN]);
        buf.extend_from_slice(payload);
        buf
    }

    fn split(rec: &mut [u8]) -> ([u8; HEADER_LEN], &mut [u8]) {
        let (header, body) = rec
            .split_first_chunk_mut::<HEADER_LEN>()
            .expect("record has a header");
        (*header, body)
    }

    /// Reads a record the way a transport does: header, checked length, body, open.
    fn read(opener: &mut Opener, rec: &mut [u8]) -> Result<(RecordKind, Vec<u8>), RecordError> {
        let (header, body) = split(rec);
        let (kind, len) = opener.parse_header(header)?;
        assert_eq!(len, body.len());
        let n = opener.open(header, body)?;
        Ok((kind, body[..n].to_vec()))
    }

    fn payload(rng: &mut StdRng, len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        rng.fill_bytes(&mut p);
        p
    }

    #[test]
    fn round_trip_every_suite_and_size() {
        let mut rng = StdRng::seed_from_u64(1);
        for suite in ALL {
            let (mut sealer, mut opener) = pair(suite);
            assert_eq!(sealer.tag_len(), suite.tag_len());
            assert_eq!(opener.suite(), suite);
            for len in [0, 1, 15, 16, 17, 16 * 1024, MAX_PAYLOAD - 1, MAX_PAYLOAD] {
                for kind in [
                    RecordKind::Data,
                    RecordKind::Control,
                    RecordKind::Close,
                    RecordKind::Datagram,
                ] {
                    let plain = payload(&mut rng, len);
                    let mut rec = record(&plain);
                    let cap = rec.capacity();
                    sealer.seal(kind, &mut rec).expect("valid record");
                    assert_eq!(rec.capacity(), cap, "seal must not reallocate");
                    assert_eq!(rec.len(), HEADER_LEN + len + suite.tag_len());
                    if suite.is_encrypting() && len >= 16 {
                        assert_ne!(
                            &rec[HEADER_LEN..HEADER_LEN + len],
                            &plain[..],
                            "{suite}: not encrypted"
                        );
                    }
                    assert_eq!(
                        read(&mut opener, &mut rec),
                        Ok((kind, plain)),
                        "{suite} len {len}"
                    );
                }
            }
            let mut end = record(&[]);
            sealer.seal(RecordKind::End, &mut end).expect("empty end");
            assert_eq!(read(&mut opener, &mut end), Ok((RecordKind::End, vec![])));
        }
    }

    #[test]
    fn header_layout() {
        let (mut sealer, _) = pair(CipherSuite::Aes128Gcm);
        let mut rec = record(&[7; 300]);
        sealer.seal(RecordKind::Control, &mut rec).expect("valid");
        assert_eq!(&rec[..4], &[2, 0, 0x01, 0x3c], "kind 2, len 300 + 16");
        let (mut sealer, _) = pair(CipherSuite::None);
        let mut rec = record(&[7; MAX_PAYLOAD]);
        sealer.seal(RecordKind::Data, &mut rec).expect("valid");
        assert_eq!(&rec[..4], &[0, 0x01, 0, 0], "kind 0, len 65536");
        assert_eq!(&rec[4..], &[7; MAX_PAYLOAD][..], "none is plaintext");
    }

    #[test]
    fn any_flipped_bit_fails() {
        let mut rng = StdRng::seed_from_u64(2);
        for suite in CipherSuite::ENCRYPTING {
            for len in [0, 1, 100] {
                let plain = payload(&mut rng, len);
                let (mut sealer, _) = pair(suite);
                let mut sealed = record(&plain);
                sealer.seal(RecordKind::Data, &mut sealed).expect("valid");
                for bit in 0..sealed.len() * 8 {
                    let (_, mut opener) = pair(suite);
                    let mut rec = sealed.clone();
                    rec[bit / 8] ^= 1 << (bit % 8);
                    let (header, body) = split(&mut rec);
                    let result = opener.open(header, body);
                    match result {
                        Err(RecordError::Decrypt) => {}
                        Err(RecordError::UnknownKind(_) | RecordError::BadHeader { .. })
                            if bit < 32 => {}
                        // A len flip that still parses leaves the body the wrong length.
                        Err(RecordError::BodyLength { .. } | RecordError::NonEmptyEnd { .. })
                            if bit < 32 => {}
                        other => panic!("{suite}: flipping bit {bit} gave {other:?}"),
                    }
                    assert_eq!(opener.dir.counter, 0, "a failed open must not advance");
                }
                // And the untouched record still opens.
                let (_, mut opener) = pair(suite);
                assert_eq!(
                    read(&mut opener, &mut sealed.clone()),
                    Ok((RecordKind::Data, plain))
                );
            }
        }
    }

    #[test]
    fn kind_is_authenticated() {
        for suite in CipherSuite::ENCRYPTING {
            let (mut sealer, mut opener) = pair(suite);
            let mut rec = record(b"bye");
            sealer.seal(RecordKind::Close, &mut rec).expect("valid");
            rec[0] = RecordKind::Data as u8;
            assert_eq!(
                read(&mut opener, &mut rec),
                Err(RecordError::Decrypt),
                "{suite}"
            );
        }
    }

    #[test]
    fn reordered_and_replayed_records_fail() {
        for suite in CipherSuite::ENCRYPTING {
            let (mut sealer, mut opener) = pair(suite);
            let recs: Vec<Vec<u8>> = (0..3u8)
                .map(|i| {
                    let mut rec = record(&[i; 64]);
                    sealer.seal(RecordKind::Data, &mut rec).expect("valid");
                    rec
                })
                .collect();
            // Reordered: record 1 arrives first.
            assert_eq!(
                read(&mut opener, &mut recs[1].clone()),
                Err(RecordError::Decrypt),
                "{suite}"
            );
            assert_eq!(
                read(&mut opener, &mut recs[0].clone()),
                Ok((RecordKind::Data, vec![0; 64]))
            );
            // Replayed: record 0 again.
            assert_eq!(
                read(&mut opener, &mut recs[0].clone()),
                Err(RecordError::Decrypt),
                "{suite}"
            );
            assert_eq!(
                read(&mut opener, &mut recs[1].clone()),
                Ok((RecordKind::Data, vec![1; 64]))
            );
            assert_eq!(
                read(&mut opener, &mut recs[2].clone()),
                Ok((RecordKind::Data, vec![2; 64]))
            );
        }
    }

    #[test]
    fn different_keys_fail() {
        for suite in CipherSuite::ENCRYPTING {
            let (mut sealer, _) = pair(suite);
            let mut rec = record(b"hello");
            sealer.seal(RecordKind::Data, &mut rec).expect("valid");
            let others = [
                DirectionKeys::derive(suite, b"shared secret", b"server to client"),
                DirectionKeys::derive(suite, b"other secret", b"client to server"),
            ];
            for keys in others {
                let mut opener = Opener::new(suite, keys);
                assert_eq!(
                    read(&mut opener, &mut rec.clone()),
                    Err(RecordError::Decrypt),
                    "{suite}"
                );
            }
        }
    }

    #[test]
    fn suites_derive_different_keys() {
        let a = DirectionKeys::derive(CipherSuite::Aes256Gcm, b"s", b"l");
        let c = DirectionKeys::derive(CipherSuite::ChaCha20Poly1305, b"s", b"l");
        assert_ne!(a.key, c.key);
        let shown = format!("{a:?}");
        assert!(shown.contains("****") && !shown.contains('['), "{shown}");
    }

    #[test]
    fn bad_lengths_rejected_before_reading() {
        for suite in ALL {
            let (_, opener) = pair(suite);
            let tag = suite.tag_len();
            let max = MAX_PAYLOAD + tag;
            let with_len = |kind: u8, len: usize| {
                let b = (len as u32).to_be_bytes();
                [kind, b[1], b[2], b[3]]
            };
            assert_eq!(
                opener.parse_header(with_len(0, max)),
                Ok((RecordKind::Data, max))
            );
            assert_eq!(
                opener.parse_header(with_len(0, tag)),
                Ok((RecordKind::Data, tag))
            );
            for len in [max + 1, (1 << 24) - 1] {
                assert_eq!(
                    opener.parse_header(with_len(0, len)),
                    Err(RecordError::BadHeader { len, min: tag, max }),
                    "{suite}"
                );
            }
            if tag > 0 {
                for len in [0, tag - 1] {
                    assert_eq!(
                        opener.parse_header(with_len(0, len)),
                        Err(RecordError::BadHeader { len, min: tag, max }),
                        "{suite}"
                    );
                }
            }
            assert_eq!(
                opener.parse_header(with_len(4, tag)),
                Ok((RecordKind::Datagram, tag))
            );
            assert_eq!(
                opener.parse_header(with_len(5, tag)),
                Ok((RecordKind::Compressed, tag))
            );
            assert_eq!(
                opener.parse_header(with_len(6, tag)),
                Err(RecordError::UnknownKind(6))
            );
            assert_eq!(
                opener.parse_header(with_len(255, tag)),
                Err(RecordError::UnknownKind(255))
            );
            assert_eq!(
                opener.parse_header(with_len(1, tag + 1)),
                Err(RecordError::NonEmptyEnd { len: 1 })
            );
            assert_eq!(
                opener.parse_header(with_len(1, tag)),
                Ok((RecordKind::End, tag))
            );
        }
    }

    #[test]
    fn open_checks_body_length() {
        let (mut sealer, mut opener) = pair(CipherSuite::Aes128Gcm);
        let mut rec = record(b"abc");
        sealer.seal(RecordKind::Data, &mut rec).expect("valid");
        let (header, body) = split(&mut rec);
        assert_eq!(
            opener.open(header, &mut body[1..]),
            Err(RecordError::BodyLength {
                expected: 19,
                actual: 18
            })
        );
        assert_eq!(opener.open(header, body), Ok(3));
    }

    #[test]
    fn records_sealed_back_to_back_are_the_records_sealed_alone() {
        for suite in ALL {
            let (mut sealer, mut opener) = pair(suite);
            let (mut alone, _) = pair(suite);
            let payloads: [&[u8]; 3] = [b"first", b"", b"the third one"];
            let mut buf = Vec::new();
            let mut expected = Vec::new();
            for payload in payloads {
                let start = buf.len();
                buf.resize(start + HEADER_LEN, 0);
                buf.extend_from_slice(payload);
                sealer
                    .seal_at(RecordKind::Datagram, &mut buf, start)
                    .expect("valid");
                let mut rec = record(payload);
                alone.seal(RecordKind::Datagram, &mut rec).expect("valid");
                expected.extend_from_slice(&rec);
            }
            assert_eq!(buf, expected, "{suite:?}");
            let mut rest = &mut buf[..];
            for payload in payloads {
                let len = HEADER_LEN + payload.len() + opener.tag_len();
                let (rec, tail) = rest.split_at_mut(len);
                assert_eq!(
                    read(&mut opener, rec),
                    Ok((RecordKind::Datagram, payload.to_vec())),
                    "{suite:?}"
                );
                rest = tail;
            }
            let before = buf.clone();
            let start = buf.len();
            buf.extend_from_slice(&[0; HEADER_LEN - 1]);
            assert_eq!(
                sealer.seal_at(RecordKind::Data, &mut buf, start),
                Err(RecordError::NoHeaderRoom {
                    len: HEADER_LEN - 1
                })
            );
            assert_eq!(
                buf[..start],
                before[..],
                "{suite:?}: earlier records untouched"
            );
        }
    }

    #[test]
    fn seal_rejects_bad_buffers() {
        for suite in ALL {
            let (mut sealer, mut opener) = pair(suite);
            let mut big = vec![9u8; HEADER_LEN + MAX_PAYLOAD + 1];
            assert_eq!(
                sealer.seal(RecordKind::Data, &mut big),
                Err(RecordError::TooLarge {
                    len: MAX_PAYLOAD + 1,
                    max: MAX_PAYLOAD
                })
            );
            assert!(big.iter().all(|&b| b == 9), "untouched on error");
            let mut short = vec![0u8; HEADER_LEN - 1];
            assert_eq!(
                sealer.seal(RecordKind::Data, &mut short),
                Err(RecordError::NoHeaderRoom { len: 3 })
            );
            let mut end = record(b"x");
            assert_eq!(
                sealer.seal(RecordKind::End, &mut end),
                Err(RecordError::NonEmptyEnd { len: 1 })
            );
            // No record number was spent: the next record still opens.
            let mut rec = record(b"ok");
            sealer.seal(RecordKind::Data, &mut rec).expect("valid");
            assert_eq!(
                read(&mut opener, &mut rec),
                Ok((RecordKind::Data, b"ok".to_vec()))
            );
        }
    }

    #[test]
    fn rekey_keeps_pair_in_sync() {
        const EVERY: u64 = 5;
        for suite in CipherSuite::ENCRYPTING {
            let keys = DirectionKeys::derive(suite, b"shared secret", b"c2s");
            let mut sealer = Sealer::new(suite, keys.clone()).with_rekey_after(EVERY);
            let mut opener = Opener::new(suite, keys).with_rekey_after(EVERY);
            let mut first_of_epoch = Vec::new();
            for i in 0..EVERY * 4 + 2 {
                let plain = i.to_be_bytes();
                let mut rec = record(&plain);
                sealer.seal(RecordKind::Data, &mut rec).expect("valid");
                if i % EVERY == 0 {
                    first_of_epoch.push(rec.clone());
                }
                assert_eq!(
                    read(&mut opener, &mut rec),
                    Ok((RecordKind::Data, plain.to_vec())),
                    "{suite} #{i}"
                );
                assert_eq!(sealer.dir.counter, opener.dir.counter);
                assert_eq!(sealer.dir.epoch, (i + 1) / EVERY);
            }
            assert_eq!(opener.dir.epoch, 4);
            // An opener that never rekeys cannot read past the first epoch.
            let keys = DirectionKeys::derive(suite, b"shared secret", b"c2s");
            let mut stale = Opener::new(suite, keys);
            let mut rec = first_of_epoch[1].clone();
            assert_eq!(
                read(&mut stale, &mut rec),
                Err(RecordError::Decrypt),
                "{suite}"
            );
        }
    }

    #[test]
    fn same_plaintext_record_zero_differs_after_rekey() {
        for suite in CipherSuite::ENCRYPTING {
            let keys = DirectionKeys::derive(suite, b"s", b"c2s");
            let mut sealer = Sealer::new(suite, keys).with_rekey_after(1);
            let mut a = record(&[0; 32]);
            let mut b = record(&[0; 32]);
            sealer.seal(RecordKind::Data, &mut a).expect("valid");
            assert_eq!(sealer.dir.counter, 0, "rekeyed after one record");
            sealer.seal(RecordKind::Data, &mut b).expect("valid");
            assert_eq!(a[..HEADER_LEN], b[..HEADER_LEN]);
            assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..], "{suite}");
        }
    }

    #[test]
    fn rekey_threshold_is_clamped() {
        let (sealer, _) = pair(CipherSuite::Aes128Gcm);
        assert_eq!(sealer.dir.rekey_after, REKEY_AFTER);
        let sealer = sealer.with_rekey_after(0);
        assert_eq!(sealer.dir.rekey_after, 1);
        let sealer = sealer.with_rekey_after(u64::MAX);
        assert_eq!(sealer.dir.rekey_after, REKEY_AFTER);
    }

    #[test]
    fn nonce_is_iv_xor_counter() {
        let keys = DirectionKeys::derive(CipherSuite::Aegis256, b"s", b"l");
        let mut dir = Direction::new(CipherSuite::Aegis256, keys.clone());
        dir.counter = 0x0102_0304_0506_0708;
        let nonce: [u8; 32] = dir.nonce();
        assert_eq!(nonce[..24], keys.iv[..24]);
        for i in 0..8 {
            assert_eq!(nonce[24 + i], keys.iv[24 + i] ^ (i as u8 + 1));
        }
        let twelve: [u8; 12] = dir.nonce();
        assert_eq!(twelve[..4], keys.iv[..4]);
        assert_eq!(twelve[11], keys.iv[11] ^ 8);
    }

    #[test]
    fn none_round_trip_and_no_protection() {
        let (mut sealer, mut opener) = pair(CipherSuite::None);
        assert_eq!(sealer.tag_len(), 0);
        let mut rec = record(b"plain");
        sealer.seal(RecordKind::Data, &mut rec).expect("valid");
        assert_eq!(&rec[..], &[0, 0, 0, 5, b'p', b'l', b'a', b'i', b'n']);
        rec[4] = b'P';
        assert_eq!(
            read(&mut opener, &mut rec),
            Ok((RecordKind::Data, b"Plain".to_vec()))
        );
        let mut close = record(b"shutting down");
        sealer.seal(RecordKind::Close, &mut close).expect("valid");
        assert_eq!(
            read(&mut opener, &mut close),
            Ok((RecordKind::Close, b"shutting down".to_vec()))
        );
        assert_eq!(opener.parse_header([1, 0, 0, 0]), Ok((RecordKind::End, 0)));
    }

    #[test]
    fn random_headers_never_panic() {
        let mut rng = StdRng::seed_from_u64(3);
        for suite in ALL {
            let (_, mut opener) = pair(suite);
            let mut body = payload(&mut rng, MAX_RECORD_LEN);
            for i in 0..20_000 {
                let mut header: [u8; HEADER_LEN] = rng.random();
                if i % 2 == 0 {
                    // Half near the valid range, where the interesting edges are.
                    header[0] %= 6;
                    header[1] %= 2;
                }
                match opener.parse_header(header) {
                    Ok((_, len)) => {
                        assert!(len <= MAX_PAYLOAD + MAX_TAG_LEN);
                        assert!(len >= suite.tag_len());
                        // Garbage bodies must not open (except for `None`).
                        let opened = opener.open(header, &mut body[..len]);
                        if suite.is_encrypting() {
                            assert_eq!(opened, Err(RecordError::Decrypt));
                        } else {
                            assert_eq!(opened, Ok(len));
                        }
                    }
                    Err(e) => assert!(matches!(
                        e,
                        RecordError::BadHeader { .. }
                            | RecordError::UnknownKind(_)
                            | RecordError::NonEmptyEnd { .. }
                    )),
                }
                // Wrong body lengths are errors, not panics.
                let short = rng.random_range(0..64usize);
                let _ = opener.open(header, &mut body[..short]);
            }
        }
    }
}
