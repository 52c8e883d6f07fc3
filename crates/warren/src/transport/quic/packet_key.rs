//! QUIC packet protection on the faster AEAD implementation of this machine.
//!
//! rustls derives QUIC's packet keys and quinn seals and opens every packet with them;
//! with aws-lc-rs as the provider that is aws-lc's AES-GCM, which on a CPU with VAES and
//! AVX2 but no AVX-512 runs its older AES-NI code at about half the speed of ring's
//! (see [`crate::crypto::aead`], which measures both once per process). The profile of a
//! 1 GiB `warren send` put aws-lc's AES-GCM at 10–13 % of each side's CPU.
//!
//! So the provider's TLS 1.3 suites keep everything of aws-lc's (handshake, key schedule,
//! header protection, TLS records) except the packet AEAD, which becomes
//! [`crate::crypto::aead::Key`]: the same AES-GCM or ChaCha20-Poly1305 (byte for byte, as
//! that module's tests check), on whichever library is faster here. Nothing on the wire
//! changes. A key made before the measurement is done (it runs on a thread of its own
//! when the first configuration is built) stays on aws-lc rather than wait for it.

use std::sync::{LazyLock, Once};

use rustls::crypto::cipher::{AeadKey, Iv, Nonce};
use rustls::quic::{self, HeaderProtectionKey, Tag};
use rustls::{SupportedCipherSuite, Tls13CipherSuite};

use crate::crypto::aead::{self, Backend, NONCE_LEN, TAG_LEN};
use crate::transport::tls::record::Suite;

/// The TLS 1.3 suite `aws_lc` with its QUIC packet AEAD on [`aead::Key`]; suites that are
/// not one of aws-lc's three TLS 1.3 suites are returned as they are.
pub(crate) fn with_fast_packets(aws_lc: SupportedCipherSuite) -> SupportedCipherSuite {
    start_choosing();
    match FAST_SUITES
        .iter()
        .find(|fast| fast.common.suite == aws_lc.suite())
    {
        Some(fast) => SupportedCipherSuite::Tls13(fast),
        None => aws_lc,
    }
}

/// aws-lc's three TLS 1.3 suites, each with [`PacketAlgorithm`] as its QUIC algorithm.
static FAST_SUITES: LazyLock<Vec<Tls13CipherSuite>> = LazyLock::new(|| {
    use rustls::crypto::aws_lc_rs::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    [
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
    ]
    .into_iter()
    .filter_map(|suite| suite.tls13().and_then(wrap))
    .collect()
});

/// `inner` with [`PacketAlgorithm`] as its QUIC algorithm, if it has one and its AEAD is
/// one of [`aead::Algorithm`]'s.
fn wrap(inner: &'static Tls13CipherSuite) -> Option<Tls13CipherSuite> {
    let algorithm = Suite::from_rustls(inner.common.suite)?.aead();
    // Made once per suite for the life of the process (rustls wants `&'static`).
    let packets: &'static PacketAlgorithm = Box::leak(Box::new(PacketAlgorithm {
        inner: inner.quic?,
        algorithm,
    }));
    Some(Tls13CipherSuite {
        common: rustls::crypto::CipherSuiteCommon {
            suite: inner.common.suite,
            hash_provider: inner.common.hash_provider,
            confidentiality_limit: inner.common.confidentiality_limit,
        },
        hkdf_provider: inner.hkdf_provider,
        aead_alg: inner.aead_alg,
        quic: Some(packets),
    })
}

/// Chooses the AEAD implementations on a thread of its own, once per process, so that no
/// handshake waits for the measurement (~12 ms per algorithm).
fn start_choosing() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        if !Backend::all_chosen() {
            // If the thread cannot start, keys stay on aws-lc (see `Backend::chosen`).
            let _ = std::thread::Builder::new()
                .name("warren-aead-choice".into())
                .spawn(Backend::choose_all);
        }
    });
}

/// A QUIC algorithm whose packet keys are [`aead::Key`]s; header protection and the key
/// length stay aws-lc's.
struct PacketAlgorithm {
    inner: &'static dyn quic::Algorithm,
    algorithm: aead::Algorithm,
}

impl quic::Algorithm for PacketAlgorithm {
    fn packet_key(&self, key: AeadKey, iv: Iv) -> Box<dyn quic::PacketKey> {
        let backend = Backend::chosen(self.algorithm).unwrap_or(Backend::AwsLc);
        match aead::Key::with_backend(backend, self.algorithm, key.as_ref()) {
            Ok(sealer) => Box::new(PacketKey {
                key: sealer,
                iv,
                limits: Limits::of(self.algorithm),
            }),
            // Not expected (rustls hands over keys of `aead_key_len`): aws-lc's own.
            Err(_) => self.inner.packet_key(key, iv),
        }
    }

    fn header_protection_key(&self, key: AeadKey) -> Box<dyn HeaderProtectionKey> {
        self.inner.header_protection_key(key)
    }

    fn aead_key_len(&self) -> usize {
        self.inner.aead_key_len()
    }
}

/// RFC 9001 §6.6 and appendix B: packets one key may seal, and forged packets it may see.
#[derive(Clone, Copy)]
struct Limits {
    confidentiality: u64,
    integrity: u64,
}

impl Limits {
    fn of(algorithm: aead::Algorithm) -> Limits {
        match algorithm {
            aead::Algorithm::Aes128Gcm | aead::Algorithm::Aes256Gcm => Limits {
                confidentiality: 1 << 23,
                integrity: 1 << 52,
            },
            aead::Algorithm::ChaCha20Poly1305 => Limits {
                confidentiality: u64::MAX,
                integrity: 1 << 36,
            },
        }
    }
}

/// One direction's packet key.
struct PacketKey {
    key: aead::Key,
    iv: Iv,
    limits: Limits,
}

impl PacketKey {
    /// RFC 9001 §5.3: the IV XOR the packet number, big-endian, right-aligned.
    fn nonce(&self, packet_number: u64) -> [u8; NONCE_LEN] {
        Nonce::new(&self.iv, packet_number).0
    }
}

impl quic::PacketKey for PacketKey {
    fn encrypt_in_place(
        &self,
        packet_number: u64,
        header: &[u8],
        payload: &mut [u8],
    ) -> Result<Tag, rustls::Error> {
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(packet_number), header, payload)
            .map_err(|_| rustls::Error::EncryptError)?;
        Ok(Tag::from(&tag[..]))
    }

    fn decrypt_in_place<'a>(
        &self,
        packet_number: u64,
        header: &[u8],
        payload: &'a mut [u8],
    ) -> Result<&'a [u8], rustls::Error> {
        let len = self
            .key
            .open_in_place(self.nonce(packet_number), header, payload)
            .map_err(|_| rustls::Error::DecryptError)?;
        Ok(&payload[..len])
    }

    fn tag_len(&self) -> usize {
        TAG_LEN
    }

    fn confidentiality_limit(&self) -> u64 {
        self.limits.confidentiality
    }

    fn integrity_limit(&self) -> u64 {
        self.limits.integrity
    }
}

#[cfg(test)]
#[allow(irrefutable_let_patterns)]
mod tests {
    use super::*;

    /// Packet keys for one 32-byte-key suite from the same secret: aws-lc's own, then
    /// ours on each implementation. (Outside rustls an `AeadKey` can only be made at 32
    /// bytes, so AES-128-GCM is compared through the AEAD module's own tests and every QUIC
    /// handshake of the integration tests, which negotiate it.)
    fn keys(aws_lc: SupportedCipherSuite) -> Vec<Box<dyn quic::PacketKey>> {
        let SupportedCipherSuite::Tls13(inner) = aws_lc else {
            unreachable!()
        };
        let SupportedCipherSuite::Tls13(fast) = with_fast_packets(aws_lc) else {
            unreachable!()
        };
        let key = || {
            let mut bytes = [0u8; 32];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = i as u8 * 3 + 1;
            }
            AeadKey::from(bytes)
        };
        let iv = || Iv::from([7u8; NONCE_LEN]);
        let algorithm = Suite::from_rustls(inner.common.suite).unwrap().aead();
        let ours = |backend| -> Box<dyn quic::PacketKey> {
            Box::new(PacketKey {
                key: aead::Key::with_backend(backend, algorithm, key().as_ref()).unwrap(),
                iv: iv(),
                limits: Limits::of(algorithm),
            })
        };
        vec![
            inner.quic.unwrap().packet_key(key(), iv()),
            fast.quic.unwrap().packet_key(key(), iv()),
            ours(Backend::AwsLc),
            ours(Backend::Ring),
        ]
    }

    #[test]
    fn packets_match_aws_lc_byte_for_byte_and_open_each_other() {
        use rustls::crypto::aws_lc_rs::cipher_suite::{
            TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
        };
        for suite in [TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256] {
            let keys = keys(suite);
            let header = b"\x40\x01\x02\x03";
            for (pn, len) in [
                (0u64, 0usize),
                (1, 1),
                (2, 1200),
                (1 << 40, 1452),
                (77, 9000),
            ] {
                let plain: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
                let sealed: Vec<Vec<u8>> = keys
                    .iter()
                    .map(|key| {
                        let mut buf = plain.clone();
                        let tag = key.encrypt_in_place(pn, header, &mut buf).unwrap();
                        buf.extend_from_slice(tag.as_ref());
                        buf
                    })
                    .collect();
                assert!(
                    sealed.iter().all(|s| s == &sealed[0]),
                    "{suite:?} pn {pn} len {len}"
                );
                for key in &keys {
                    let mut buf = sealed[0].clone();
                    assert_eq!(
                        key.decrypt_in_place(pn, header, &mut buf).unwrap(),
                        &plain[..]
                    );
                    let mut forged = sealed[0].clone();
                    forged[0] ^= 1;
                    assert!(key.decrypt_in_place(pn, header, &mut forged).is_err());
                    let mut wrong_pn = sealed[0].clone();
                    assert!(key.decrypt_in_place(pn + 1, header, &mut wrong_pn).is_err());
                }
            }
        }
    }

    #[test]
    fn suites_keep_aws_lc_for_everything_but_packets() {
        use rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let (SupportedCipherSuite::Tls13(inner), SupportedCipherSuite::Tls13(fast)) = (
            TLS13_AES_128_GCM_SHA256,
            with_fast_packets(TLS13_AES_128_GCM_SHA256),
        ) else {
            unreachable!()
        };
        assert_eq!(fast.common.suite, inner.common.suite);
        assert_eq!(
            fast.quic.unwrap().aead_key_len(),
            inner.quic.unwrap().aead_key_len()
        );
        assert!(std::ptr::eq(fast.aead_alg, inner.aead_alg));
        // The same suite asked for twice is one static.
        let SupportedCipherSuite::Tls13(again) = with_fast_packets(TLS13_AES_128_GCM_SHA256) else {
            unreachable!()
        };
        assert!(std::ptr::eq(fast, again));
    }
}
