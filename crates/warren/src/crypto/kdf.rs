//! Key derivation and message authentication for Warren: HKDF-SHA256 and HMAC-SHA256 over
//! aws-lc-rs.
//!
//! Everything that turns a handshake secret into keys goes through here: the record layer
//! ([`crate::crypto::record`]) derives each direction's key and nonce base with
//! [`hkdf_expand`] and rekeys with it; data channels prove they belong to a session with
//! [`hmac_sha256`] / [`verify_hmac_sha256`].
//!
//! These are thin, hand-written wrappers rather than a generic KDF crate because they sit
//! beside the record layer, Warren's fast path: they take `info` as a list of slices (so
//! callers never concatenate labels into a fresh `Vec`), they never panic on input from the
//! network, and they keep to the one crypto library (aws-lc-rs) the rest of the binary
//! already links.
//!
//! # Panics
//!
//! Nothing here panics. [`hkdf_expand`] reports an output longer than HKDF allows
//! ([`MAX_HKDF_OUTPUT`]) as an error; the HMAC functions accept keys, messages and tags of
//! any length.

use aws_lc_rs::{hkdf, hmac};

/// The most output HKDF-SHA256 can produce: 255 blocks of 32 bytes (RFC 5869 §2.3).
pub const MAX_HKDF_OUTPUT: usize = 255 * 32;

/// Why [`hkdf_expand`] produced no key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KdfError {
    /// More output was asked for than HKDF-SHA256 can produce. A bug in the caller: the
    /// lengths Warren asks for are fixed by the cipher suite, never by the network.
    #[error(
        "HKDF-SHA256 output of {len} bytes requested; the maximum is {max} bytes (internal error)"
    )]
    OutputTooLong {
        /// Bytes requested.
        len: usize,
        /// [`MAX_HKDF_OUTPUT`].
        max: usize,
    },
    /// aws-lc refused the derivation for a reason it does not name. Not expected with
    /// SHA-256 and an output within bounds; treat it as an internal error.
    #[error("HKDF-SHA256 failed inside aws-lc (internal error)")]
    Backend,
}

/// An output length for `aws_lc_rs::hkdf::Prk::expand`, which wants a [`hkdf::KeyType`].
struct OutputLen(usize);

impl hkdf::KeyType for OutputLen {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-SHA256 extract-then-expand (RFC 5869): fills `out` with key material derived from
/// the input keying material `ikm`, the `salt` (may be empty) and the context `info`, whose
/// slices are concatenated in order (so `[b"a", b"bc"]` and `[b"ab", b"c"]` are the same
/// info: give labels fixed lengths or a separator where that matters).
///
/// `out.len()` may be anything from 0 to [`MAX_HKDF_OUTPUT`]; the output for a shorter
/// `out` is a prefix of the output for a longer one.
///
/// # Errors
///
/// [`KdfError::OutputTooLong`] if `out` is longer than [`MAX_HKDF_OUTPUT`];
/// [`KdfError::Backend`] if aws-lc fails (not expected). On error `out` is left zeroed.
pub fn hkdf_expand(
    ikm: &[u8],
    salt: &[u8],
    info: &[&[u8]],
    out: &mut [u8],
) -> Result<(), KdfError> {
    if out.len() > MAX_HKDF_OUTPUT {
        out.fill(0);
        return Err(KdfError::OutputTooLong {
            len: out.len(),
            max: MAX_HKDF_OUTPUT,
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let result = prk
        .expand(info, OutputLen(out.len()))
        .and_then(|okm| okm.fill(out));
    result.map_err(|_| {
        out.fill(0);
        KdfError::Backend
    })
}

/// HMAC-SHA256 of the concatenation of `parts` under `key` (any length).
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&key);
    for part in parts {
        ctx.update(part);
    }
    let mut tag = [0u8; 32];
    tag.copy_from_slice(ctx.sign().as_ref());
    tag
}

/// Whether `tag` is the HMAC-SHA256 of the concatenation of `parts` under `key`, compared
/// in constant time (`aws_lc_rs::hmac::verify`). A `tag` of the wrong length is simply
/// `false`.
pub fn verify_hmac_sha256(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    match parts {
        [] => hmac::verify(&key, &[], tag).is_ok(),
        [one] => hmac::verify(&key, one, tag).is_ok(),
        // `hmac::verify` takes one message; joining costs an allocation, which is fine off
        // the data path (handshakes and channel proofs).
        many => hmac::verify(&key, &many.concat(), tag).is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("test vector is hex"))
            .collect()
    }

    /// RFC 5869 appendix A.1.
    #[test]
    fn hkdf_rfc5869_case_1() {
        let ikm = [0x0b; 22];
        let salt = hex("000102030405060708090a0b0c");
        let info = hex("f0f1f2f3f4f5f6f7f8f9");
        let mut okm = [0u8; 42];
        hkdf_expand(&ikm, &salt, &[&info[..4], &info[4..]], &mut okm)
            .expect("42 bytes is in range");
        assert_eq!(
            okm.to_vec(),
            hex(
                "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
            )
        );
    }

    #[test]
    fn hkdf_output_bounds() {
        let mut max = vec![0u8; MAX_HKDF_OUTPUT];
        assert_eq!(hkdf_expand(b"k", b"", &[b"i"], &mut max), Ok(()));
        let mut short = [0u8; 40];
        hkdf_expand(b"k", b"", &[b"i"], &mut short).expect("in range");
        assert_eq!(&max[..40], &short[..], "shorter output is a prefix");

        let mut too_long = vec![1u8; MAX_HKDF_OUTPUT + 1];
        assert_eq!(
            hkdf_expand(b"k", b"", &[b"i"], &mut too_long),
            Err(KdfError::OutputTooLong {
                len: MAX_HKDF_OUTPUT + 1,
                max: MAX_HKDF_OUTPUT
            })
        );
        assert!(too_long.iter().all(|&b| b == 0));
        assert_eq!(hkdf_expand(b"k", b"", &[], &mut []), Ok(()));
    }

    /// RFC 4231 test case 2.
    #[test]
    fn hmac_rfc4231_case_2() {
        let expected = hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        let tag = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(tag.to_vec(), expected);
        assert!(verify_hmac_sha256(
            b"Jefe",
            &[b"what do ya want for nothing?"],
            &tag
        ));
        assert!(verify_hmac_sha256(
            b"Jefe",
            &[b"what do ya ", b"want ", b"for nothing?"],
            &tag
        ));
        assert!(!verify_hmac_sha256(
            b"Jefe",
            &[b"what do ya want for nothing!"],
            &tag
        ));
        assert!(!verify_hmac_sha256(
            b"jefe",
            &[b"what do ya want for nothing?"],
            &tag
        ));
        assert!(!verify_hmac_sha256(
            b"Jefe",
            &[b"what do ya want for nothing?"],
            &tag[..31]
        ));
        assert!(!verify_hmac_sha256(
            b"Jefe",
            &[b"what do ya want for nothing?"],
            &[]
        ));
        let empty = hmac_sha256(b"k", &[]);
        assert!(verify_hmac_sha256(b"k", &[], &empty));
        assert!(verify_hmac_sha256(b"k", &[b""], &empty));
    }
}
