//! The check key: the secret both peers derive from the join code (PAKE), and the
//! integrity tag it puts on every connectivity check and answer, so a stranger who sees or
//! guesses the candidates still cannot make a peer pick its address.
//!
//! The tag is STUN's MESSAGE-INTEGRITY-SHA256 (HMAC-SHA256 over the message up to the tag,
//! RFC 8489 §14.6), keyed directly with the 32-byte check key; it is verified in constant
//! time.

use std::fmt;

use aws_lc_rs::hmac;
use warren_proto::stun::IntegrityTag;

/// The 32-byte secret keying the checks' integrity tags. `Debug` does not show it.
#[derive(Clone)]
pub struct CheckKey(hmac::Key);

impl CheckKey {
    /// Wraps key material both peers derived (the caller passes the PAKE's check key).
    pub fn new(secret: [u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, &secret))
    }

    /// The tag over `bytes`.
    pub fn sign(&self, bytes: &[u8]) -> [u8; 32] {
        let tag = hmac::sign(&self.0, bytes);
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Whether `tag` (found in `packet`) was made with this key; constant time.
    pub fn verify(&self, packet: &[u8], tag: &IntegrityTag) -> bool {
        hmac::verify(&self.0, &tag.signed_input(packet), &tag.tag).is_ok()
    }
}

impl fmt::Debug for CheckKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CheckKey(***)")
    }
}

#[cfg(test)]
mod tests {
    use warren_proto::stun::{Message, decode};

    use super::*;

    #[test]
    fn signed_checks_verify_only_under_their_key() {
        let key = CheckKey::new([7; 32]);
        let mut packet = Vec::new();
        Message::request([1; 12])
            .with_agent([2; 8])
            .encode_signed(&mut packet, |b| key.sign(b));
        let tag = decode(&packet).unwrap().integrity.unwrap();
        assert!(key.verify(&packet, &tag));
        assert!(!CheckKey::new([8; 32]).verify(&packet, &tag));
        assert_eq!(format!("{key:?}"), "CheckKey(***)");
    }
}
