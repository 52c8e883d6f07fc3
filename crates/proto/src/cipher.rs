//! Cipher suites for the data record layer and how the two sides agree on one.
//!
//! The client offers its list in preference order inside the first handshake message
//! (encrypted under the PSK); the server answers with the first entry it also allows
//! ([`negotiate`]). The suite only names the algorithm: keys and the record layer itself
//! live in the `warren` crate, which owns the crypto libraries.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An AEAD used to seal data records, or `None` for the plaintext `tcp` transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CipherSuite {
    /// AES-256-GCM (aws-lc-rs).
    Aes256Gcm,
    /// AES-128-GCM (aws-lc-rs).
    Aes128Gcm,
    /// ChaCha20-Poly1305 (aws-lc-rs): the choice where the CPU has no AES instructions.
    ChaCha20Poly1305,
    /// AEGIS-128L (`aegis` crate).
    Aegis128L,
    /// AEGIS-256 (`aegis` crate).
    Aegis256,
    /// No encryption and no integrity: only with `insecure = true` on both sides.
    None,
}

impl CipherSuite {
    /// Every encrypting suite, in the order `warren doctor` and the docs list them.
    pub const ENCRYPTING: [CipherSuite; 5] = [
        CipherSuite::Aes256Gcm,
        CipherSuite::Aes128Gcm,
        CipherSuite::ChaCha20Poly1305,
        CipherSuite::Aegis128L,
        CipherSuite::Aegis256,
    ];

    /// The name used in config files and logs (`"aes-256-gcm"`).
    pub fn name(self) -> &'static str {
        match self {
            CipherSuite::Aes256Gcm => "aes-256-gcm",
            CipherSuite::Aes128Gcm => "aes-128-gcm",
            CipherSuite::ChaCha20Poly1305 => "chacha20-poly1305",
            CipherSuite::Aegis128L => "aegis-128l",
            CipherSuite::Aegis256 => "aegis-256",
            CipherSuite::None => "none",
        }
    }

    /// Bytes in the AEAD key (the nonce base comes on top; its length is the record
    /// layer's business).
    pub fn key_len(self) -> usize {
        match self {
            CipherSuite::Aes128Gcm | CipherSuite::Aegis128L => 16,
            CipherSuite::Aes256Gcm | CipherSuite::ChaCha20Poly1305 | CipherSuite::Aegis256 => 32,
            CipherSuite::None => 0,
        }
    }

    /// Bytes the AEAD appends to every record.
    pub fn tag_len(self) -> usize {
        match self {
            CipherSuite::None => 0,
            _ => 16,
        }
    }

    /// Whether this suite protects the data at all.
    pub fn is_encrypting(self) -> bool {
        self != CipherSuite::None
    }

    /// The default preference list: AES-GCM first where the CPU has AES instructions,
    /// ChaCha20-Poly1305 first where it does not (AES in software is ~10x slower).
    pub fn default_preference(has_aes_hardware: bool) -> Vec<CipherSuite> {
        if has_aes_hardware {
            vec![
                CipherSuite::Aes128Gcm,
                CipherSuite::Aes256Gcm,
                CipherSuite::Aegis128L,
                CipherSuite::ChaCha20Poly1305,
                CipherSuite::Aegis256,
            ]
        } else {
            vec![
                CipherSuite::ChaCha20Poly1305,
                CipherSuite::Aes128Gcm,
                CipherSuite::Aes256Gcm,
                CipherSuite::Aegis128L,
                CipherSuite::Aegis256,
            ]
        }
    }
}

impl fmt::Display for CipherSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cipher name that Warren does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown cipher `{name}`; expected one of: aes-256-gcm, aes-128-gcm, chacha20-poly1305, aegis-128l, aegis-256, none"
)]
pub struct UnknownCipher {
    /// What was asked for.
    pub name: String,
}

impl FromStr for CipherSuite {
    type Err = UnknownCipher;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        [CipherSuite::None]
            .into_iter()
            .chain(CipherSuite::ENCRYPTING)
            .find(|suite| suite.name() == wanted)
            .ok_or(UnknownCipher { name: s.to_owned() })
    }
}

/// The server's choice: the first suite in the client's `offered` list that the server
/// also `allowed`. `None` means the two configs share no cipher.
pub fn negotiate(offered: &[CipherSuite], allowed: &[CipherSuite]) -> Option<CipherSuite> {
    offered
        .iter()
        .copied()
        .find(|suite| allowed.contains(suite))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for suite in CipherSuite::ENCRYPTING
            .into_iter()
            .chain([CipherSuite::None])
        {
            assert_eq!(suite.name().parse::<CipherSuite>(), Ok(suite));
        }
        assert!("rot13".parse::<CipherSuite>().is_err());
    }

    #[test]
    fn negotiation_follows_client_preference() {
        let offered = [CipherSuite::ChaCha20Poly1305, CipherSuite::Aes256Gcm];
        let allowed = [CipherSuite::Aes256Gcm, CipherSuite::ChaCha20Poly1305];
        assert_eq!(
            negotiate(&offered, &allowed),
            Some(CipherSuite::ChaCha20Poly1305)
        );
        assert_eq!(negotiate(&offered, &[CipherSuite::Aegis256]), None);
    }
}
