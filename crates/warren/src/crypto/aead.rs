//! One AES-GCM or ChaCha20-Poly1305 key, sealed and opened by whichever of the two
//! implementations in the build is faster on this machine.
//!
//! aws-lc-rs is Warren's crypto library, and rustls and quinn use nothing else. But the
//! record layers (Warren's own records and the TLS records of `tls` / `wss`) only need a
//! standard AEAD, and here one implementation does not win everywhere: aws-lc 0.47 has an
//! AVX-512 AES-GCM (the fastest on a CPU with AVX-512) but no VAES-AVX2 one, while ring
//! 0.17.14 — already in the build for snow — has the VAES-AVX2 AES-GCM and no AVX-512 one.
//! On a Zen 3-class CPU with VAES and AVX2 but no AVX-512, ring seals 16 KiB records about
//! twice as fast (measured 5.2 vs 2.5 GB/s, both under the same load). Both compute the same
//! bytes (the unit tests check them against each other), so each process measures both once
//! ([`Backend::of`]) and keeps the faster; the peer never knows. With `OPENSSL_ia32cap` set
//! (hiding CPU features from aws-lc, to see how a machine without them would do) it keeps
//! aws-lc: ring cannot be told to hide them, and would answer for the unmasked machine.

use std::sync::OnceLock;
use std::time::Duration;

/// The AEADs the record layers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// AES-128-GCM.
    Aes128Gcm,
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305.
    ChaCha20Poly1305,
}

/// Bytes of nonce every algorithm here takes.
pub const NONCE_LEN: usize = 12;
/// Bytes of tag every algorithm here appends.
pub const TAG_LEN: usize = 16;

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 3] = [
        Algorithm::Aes128Gcm,
        Algorithm::Aes256Gcm,
        Algorithm::ChaCha20Poly1305,
    ];

    /// The algorithm of a Warren record suite, if it is one of these.
    pub fn of_suite(suite: warren_proto::CipherSuite) -> Option<Algorithm> {
        use warren_proto::CipherSuite;
        match suite {
            CipherSuite::Aes128Gcm => Some(Algorithm::Aes128Gcm),
            CipherSuite::Aes256Gcm => Some(Algorithm::Aes256Gcm),
            CipherSuite::ChaCha20Poly1305 => Some(Algorithm::ChaCha20Poly1305),
            _ => None,
        }
    }

    /// Bytes of key.
    pub fn key_len(self) -> usize {
        match self {
            Algorithm::Aes128Gcm => 16,
            Algorithm::Aes256Gcm | Algorithm::ChaCha20Poly1305 => 32,
        }
    }

    fn aws_lc(self) -> &'static aws_lc_rs::aead::Algorithm {
        match self {
            Algorithm::Aes128Gcm => &aws_lc_rs::aead::AES_128_GCM,
            Algorithm::Aes256Gcm => &aws_lc_rs::aead::AES_256_GCM,
            Algorithm::ChaCha20Poly1305 => &aws_lc_rs::aead::CHACHA20_POLY1305,
        }
    }

    fn ring(self) -> &'static ring::aead::Algorithm {
        match self {
            Algorithm::Aes128Gcm => &ring::aead::AES_128_GCM,
            Algorithm::Aes256Gcm => &ring::aead::AES_256_GCM,
            Algorithm::ChaCha20Poly1305 => &ring::aead::CHACHA20_POLY1305,
        }
    }

    fn index(self) -> usize {
        match self {
            Algorithm::Aes128Gcm => 0,
            Algorithm::Aes256Gcm => 1,
            Algorithm::ChaCha20Poly1305 => 2,
        }
    }
}

/// An implementation of the algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// aws-lc-rs.
    AwsLc,
    /// ring.
    Ring,
}

impl Backend {
    /// The faster implementation of `algorithm` on this machine, measured on first use and
    /// kept for the process (a few milliseconds per algorithm, once); aws-lc when
    /// `OPENSSL_ia32cap` masks CPU features (see the module docs).
    pub fn of(algorithm: Algorithm) -> Backend {
        *chosen(algorithm).get_or_init(|| {
            if std::env::var_os("OPENSSL_ia32cap").is_some() {
                Backend::AwsLc
            } else {
                faster(algorithm)
            }
        })
    }

    /// The implementation chosen for `algorithm`, if the measurement is done (never waits
    /// for it nor measures).
    pub fn chosen(algorithm: Algorithm) -> Option<Backend> {
        chosen(algorithm).get().copied()
    }

    /// Whether every algorithm's implementation is chosen already, so that no key made
    /// from now on measures on the calling thread.
    pub fn all_chosen() -> bool {
        Algorithm::ALL
            .iter()
            .all(|&algorithm| chosen(algorithm).get().is_some())
    }

    /// Chooses for every algorithm now (~12 ms each, once): call it on a blocking thread
    /// at start-up, before the first connection needs a key.
    pub fn choose_all() {
        for algorithm in Algorithm::ALL {
            Backend::of(algorithm);
        }
    }

    /// Its name, for diagnostics.
    pub fn name(self) -> &'static str {
        match self {
            Backend::AwsLc => "aws-lc",
            Backend::Ring => "ring",
        }
    }
}

/// The process's choice for `algorithm`, empty until first needed.
fn chosen(algorithm: Algorithm) -> &'static OnceLock<Backend> {
    static CHOSEN: [OnceLock<Backend>; 3] = [const { OnceLock::new() }; 3];
    &CHOSEN[algorithm.index()]
}

/// The sealing or opening failed: a wrong tag (or a key of the wrong length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("AEAD operation failed")]
pub struct AeadError;

/// One direction's key.
pub enum Key {
    /// aws-lc precomputes the key schedule once per key (on the heap).
    AwsLc(aws_lc_rs::aead::LessSafeKey),
    /// ring's key holds its schedule inline (544 bytes): boxed, so that every channel's
    /// sealer and opener stay small whichever implementation won.
    Ring(Box<ring::aead::LessSafeKey>),
}

impl Key {
    /// `key` for `algorithm`, on this machine's faster implementation.
    ///
    /// # Errors
    /// [`AeadError`] when `key` is not [`Algorithm::key_len`] bytes.
    pub fn new(algorithm: Algorithm, key: &[u8]) -> Result<Key, AeadError> {
        Key::with_backend(Backend::of(algorithm), algorithm, key)
    }

    /// `key` for `algorithm` on `backend`.
    ///
    /// # Errors
    /// As [`Key::new`].
    pub fn with_backend(
        backend: Backend,
        algorithm: Algorithm,
        key: &[u8],
    ) -> Result<Key, AeadError> {
        Ok(match backend {
            Backend::AwsLc => Key::AwsLc(aws_lc_rs::aead::LessSafeKey::new(
                aws_lc_rs::aead::UnboundKey::new(algorithm.aws_lc(), key).map_err(|_| AeadError)?,
            )),
            Backend::Ring => Key::Ring(Box::new(ring::aead::LessSafeKey::new(
                ring::aead::UnboundKey::new(algorithm.ring(), key).map_err(|_| AeadError)?,
            ))),
        })
    }

    /// Encrypts `in_out` in place and returns the tag. `nonce` must never repeat under
    /// this key: the callers derive it from a record counter.
    ///
    /// # Errors
    /// [`AeadError`] only for inputs over the algorithm's limits.
    pub fn seal_in_place_separate_tag(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; TAG_LEN], AeadError> {
        let mut tag = [0u8; TAG_LEN];
        match self {
            Key::AwsLc(key) => {
                let nonce = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce);
                let sealed = key
                    .seal_in_place_separate_tag(nonce, aws_lc_rs::aead::Aad::from(aad), in_out)
                    .map_err(|_| AeadError)?;
                tag.copy_from_slice(sealed.as_ref());
            }
            Key::Ring(key) => {
                let nonce = ring::aead::Nonce::assume_unique_for_key(nonce);
                let sealed = key
                    .seal_in_place_separate_tag(nonce, ring::aead::Aad::from(aad), in_out)
                    .map_err(|_| AeadError)?;
                tag.copy_from_slice(sealed.as_ref());
            }
        }
        Ok(tag)
    }

    /// Decrypts `in_out` (ciphertext then tag) in place; returns the plaintext's length.
    ///
    /// # Errors
    /// [`AeadError`] when the tag does not verify (or `in_out` is shorter than a tag).
    pub fn open_in_place(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<usize, AeadError> {
        match self {
            Key::AwsLc(key) => key
                .open_in_place(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                    aws_lc_rs::aead::Aad::from(aad),
                    in_out,
                )
                .map(|plain| plain.len())
                .map_err(|_| AeadError),
            Key::Ring(key) => key
                .open_in_place(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::from(aad),
                    in_out,
                )
                .map(|plain| plain.len())
                .map_err(|_| AeadError),
        }
    }
}

/// How long each implementation seals per round, and the rounds: the best round counts, so
/// a moment of contention does not decide.
const ROUND: Duration = Duration::from_millis(2);
const ROUNDS: usize = 3;
/// The record size measured: Warren's and TLS's records are this size or larger pieces.
const MEASURED_RECORD: usize = 16 * 1024;

/// The implementation that seals `algorithm` faster here, alternating the two so that
/// both see the same machine.
fn faster(algorithm: Algorithm) -> Backend {
    let key = [0x5au8; 32];
    let key = &key[..algorithm.key_len()];
    let mut buf = vec![0u8; MEASURED_RECORD];
    let mut best = [0u64; 2];
    for _ in 0..ROUNDS {
        for (slot, backend) in [Backend::AwsLc, Backend::Ring].into_iter().enumerate() {
            let Ok(key) = Key::with_backend(backend, algorithm, key) else {
                return Backend::AwsLc;
            };
            best[slot] = best[slot].max(bytes_sealed_in(&key, &mut buf, ROUND));
        }
    }
    // aws-lc unless ring is clearly faster (5 %): one library when they are level.
    if best[1] * 100 > best[0] * 105 {
        Backend::Ring
    } else {
        Backend::AwsLc
    }
}

/// Bytes `key` seals in `budget`.
fn bytes_sealed_in(key: &Key, buf: &mut [u8], budget: Duration) -> u64 {
    // The real clock on purpose: this measures the CPU, and a test's paused tokio clock
    // would never let a round end.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let mut sealed = 0u64;
    let mut counter = 0u64;
    while started.elapsed() < budget {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[4..].copy_from_slice(&counter.to_be_bytes());
        counter += 1;
        if key.seal_in_place_separate_tag(nonce, &[], buf).is_err() {
            return 0;
        }
        sealed += buf.len() as u64;
    }
    sealed
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Algorithm; 3] = Algorithm::ALL;

    /// The two implementations are interchangeable: each opens what the other sealed, and
    /// both produce the same bytes and tag.
    #[test]
    fn both_backends_agree_byte_for_byte() {
        for algorithm in ALL {
            let secret: Vec<u8> = (0..algorithm.key_len() as u8).collect();
            let aws = Key::with_backend(Backend::AwsLc, algorithm, &secret).unwrap();
            let ring = Key::with_backend(Backend::Ring, algorithm, &secret).unwrap();
            for len in [0usize, 1, 15, 16, 17, 1000, 16 * 1024 + 3] {
                let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
                let nonce = [len as u8; NONCE_LEN];
                let aad = b"header";
                let mut a = plain.clone();
                let tag_a = aws.seal_in_place_separate_tag(nonce, aad, &mut a).unwrap();
                let mut b = plain.clone();
                let tag_b = ring.seal_in_place_separate_tag(nonce, aad, &mut b).unwrap();
                assert_eq!((&a, tag_a), (&b, tag_b), "{algorithm:?} {len}");
                for (opener, sealed) in [(&ring, &a), (&aws, &b)] {
                    let mut in_out = sealed.clone();
                    in_out.extend_from_slice(&tag_a);
                    let n = opener.open_in_place(nonce, aad, &mut in_out).unwrap();
                    assert_eq!(&in_out[..n], &plain[..]);
                }
            }
        }
    }

    #[test]
    fn a_wrong_tag_or_key_length_is_an_error_on_both() {
        for backend in [Backend::AwsLc, Backend::Ring] {
            assert!(Key::with_backend(backend, Algorithm::Aes128Gcm, &[0; 32]).is_err());
            let key = Key::with_backend(backend, Algorithm::Aes128Gcm, &[0; 16]).unwrap();
            let mut in_out = b"not sealed at all, tag is bogus".to_vec();
            assert_eq!(
                key.open_in_place([0; NONCE_LEN], &[], &mut in_out),
                Err(AeadError)
            );
            assert_eq!(
                key.open_in_place([0; NONCE_LEN], &[], &mut [0u8; 3]),
                Err(AeadError)
            );
        }
    }

    #[test]
    fn the_choice_is_made_once_and_kept() {
        Backend::choose_all();
        assert!(Backend::all_chosen());
        for algorithm in ALL {
            assert_eq!(Backend::of(algorithm), Backend::of(algorithm));
        }
    }
}
