//! Cryptography: Warren's AEAD record layer, the session key schedule, and secrets.
//!
//! * [`record`]: the record format and in-place seal/open (hand-written: it is the fast path).
//! * [`aead`]: AES-GCM and ChaCha20-Poly1305 keys on whichever implementation (aws-lc or
//!   ring) measures faster here.
//! * [`kdf`]: HKDF-SHA256 and HMAC-SHA256 (aws-lc-rs).
//! * [`keys`]: what one handshake derives: control, data channel and token-proof keys.
//! * [`secret`]: masked, constant-time-compared secrets from the config.
//! * [`speed`]: this machine's measured seal/open speed per cipher, and its CPU features.

pub mod aead;
pub mod kdf;
pub mod keys;
pub mod record;
pub mod secret;
pub mod speed;

pub use secret::Secret;

/// Lower-case hex, the form fingerprints, PSKs and tokens are shown and written in.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
