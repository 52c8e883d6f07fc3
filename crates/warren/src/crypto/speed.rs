//! How fast this machine seals and opens records with each cipher suite, and the CPU
//! features that decide it.
//!
//! The cipher worth using differs between machines of the same kind: aws-lc's AES-GCM is the
//! fastest where the CPU has AVX-512 and several times slower where it has only AVX2, and
//! without AES instructions ChaCha20-Poly1305 wins. So each side measures instead of
//! guessing, and the server picks with both sides' figures (`warren_proto::cipher::choose`).
//!
//! One function, [`measure`], serves both uses: the start-up figures a side sends in its
//! handshake ([`figures`], [`STARTUP`] budget, cached per suite for the whole process so a
//! reload re-measures only suites it has not seen) and `warren doctor` ([`DOCTOR`] budget,
//! printed with [`cpu_features`]). Both seal and open real records through the record layer
//! ([`Sealer`] / [`Opener`]), in place, on one warm buffer, so the figures include exactly
//! what the data path pays per record.

use std::sync::OnceLock;
use std::time::Duration;

use warren_proto::{CipherChoice, CipherPolicy, CipherSuite, SuiteSpeed};

use crate::crypto::record::{
    DirectionKeys, HEADER_LEN, MAX_PAYLOAD, MAX_RECORD_LEN, Opener, RecordKind, Sealer,
};

/// How long to measure one suite: `rounds` rounds of at least `round` each (seal and open
/// together); each figure is the best round, since a round the other core's work or the
/// scheduler interrupted can only be slower, never faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Rounds per suite.
    pub rounds: u32,
    /// Minimum time per round.
    pub round: Duration,
}

/// At start-up: 3 rounds of 2 ms, ~6 ms per suite and ~40 ms for all six encrypting
/// suites, once per process.
pub const STARTUP: Budget = Budget {
    rounds: 3,
    round: Duration::from_millis(2),
};

/// For `warren doctor`: 5 rounds of 40 ms, ~0.2 s per suite, stable to a few percent.
pub const DOCTOR: Budget = Budget {
    rounds: 5,
    round: Duration::from_millis(40),
};

/// Payload bytes per record measured: the largest record, which the bulk data path sends.
pub const RECORD_PAYLOAD: usize = MAX_PAYLOAD;

/// Upper bound on records per round, so a clock that does not advance cannot make a round
/// endless.
const MAX_RECORDS_PER_ROUND: u32 = 100_000;

/// Measures `suite`'s seal and open speed on this core within `budget`. [`CipherSuite::None`]
/// and suites this build cannot seal measure 0.
pub fn measure(suite: CipherSuite, budget: Budget) -> SuiteSpeed {
    let keys = DirectionKeys::derive(suite, b"warren speed", b"measure");
    let mut sealer = Sealer::new(suite, keys.clone());
    let mut opener = Opener::new(suite, keys);
    let mut buf = Vec::with_capacity(MAX_RECORD_LEN);
    buf.resize(HEADER_LEN + RECORD_PAYLOAD, 0x5a);
    let mut zero = SuiteSpeed {
        suite,
        seal_mbps: 0,
        open_mbps: 0,
    };
    // Warm-up, untimed: faults the buffer's pages in and fills the caches, and proves that
    // this build can seal and open the suite at all.
    if !suite.is_encrypting() || one_record(&mut sealer, &mut opener, &mut buf).is_none() {
        return zero;
    }
    for _ in 0..budget.rounds {
        let Some((seal, open)) = round(&mut sealer, &mut opener, &mut buf, budget.round) else {
            return zero;
        };
        zero.seal_mbps = zero.seal_mbps.max(seal);
        zero.open_mbps = zero.open_mbps.max(open);
    }
    zero
}

/// One round: records until `length` has passed; returns (seal, open) MB/s.
fn round(
    sealer: &mut Sealer,
    opener: &mut Opener,
    buf: &mut Vec<u8>,
    length: Duration,
) -> Option<(u32, u32)> {
    // The real clock on purpose: this measures the CPU, and a test's paused tokio clock
    // would never let a round end.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let (mut sealing, mut opening) = (Duration::ZERO, Duration::ZERO);
    let mut records = 0u64;
    for _ in 0..MAX_RECORDS_PER_ROUND {
        let (seal, open) = one_record(sealer, opener, buf)?;
        sealing += seal;
        opening += open;
        records += 1;
        if started.elapsed() >= length {
            break;
        }
    }
    let bytes = records * RECORD_PAYLOAD as u64;
    Some((mbps(bytes, sealing), mbps(bytes, opening)))
}

/// Seals the payload in `buf` and opens it again, in place; returns how long each took.
/// `buf` holds the same payload again afterwards.
fn one_record(
    sealer: &mut Sealer,
    opener: &mut Opener,
    buf: &mut Vec<u8>,
) -> Option<(Duration, Duration)> {
    #[allow(clippy::disallowed_types)]
    let t0 = std::time::Instant::now();
    sealer.seal(RecordKind::Data, buf).ok()?;
    let t1 = t0.elapsed();
    let (header, body) = buf.split_first_chunk_mut::<HEADER_LEN>()?;
    let n = opener.open(*header, body).ok()?;
    let t2 = t0.elapsed();
    buf.truncate(HEADER_LEN + n);
    Some((t1, t2.saturating_sub(t1)))
}

fn mbps(bytes: u64, time: Duration) -> u32 {
    let per_second = bytes as f64 / time.as_secs_f64().max(1e-9) / 1e6;
    // `as` saturates: an absurd figure becomes u32::MAX, never wraps.
    per_second as u32
}

/// This process's start-up figure for each of `suites` that encrypts, measured on first
/// use with the [`STARTUP`] budget and then kept for the life of the process. The first
/// call for a suite blocks for ~6 ms: call it off the accept path (at start, or from the
/// reload task when the allowed list gained a suite).
pub fn figures(suites: &[CipherSuite]) -> Vec<SuiteSpeed> {
    let mut out: Vec<SuiteSpeed> = Vec::with_capacity(suites.len());
    for &suite in suites {
        if !suite.is_encrypting() || out.iter().any(|speed| speed.suite == suite) {
            continue;
        }
        out.push(*cache_slot(suite).get_or_init(|| measure(suite, STARTUP)));
    }
    out
}

/// The process-wide start-up figure of `suite`, empty until first measured.
fn cache_slot(suite: CipherSuite) -> &'static OnceLock<SuiteSpeed> {
    static CACHE: [OnceLock<SuiteSpeed>; CipherSuite::ALL.len()] =
        [const { OnceLock::new() }; CipherSuite::ALL.len()];
    // Wire ids are 0..ALL.len(), one per suite; the modulo only keeps a future mistake from
    // panicking.
    &CACHE[usize::from(suite.wire_id()) % CACHE.len()]
}

/// Whether every encrypting suite of `suites` already has its start-up figure.
fn all_measured(suites: &[CipherSuite]) -> bool {
    suites
        .iter()
        .all(|&suite| !suite.is_encrypting() || cache_slot(suite).get().is_some())
}

/// Measures, on a blocking thread, whichever of `suites` has no figure yet, so that
/// [`figures`] and [`policy`] return at once afterwards (nothing to do under `ordered`),
/// and chooses the AEAD implementations first ([`crate::crypto::aead::Backend`]), which
/// `tls` and `wss` records need whatever the cipher list. Servers call it before
/// accepting and before applying a reload; clients before their first handshake.
pub async fn prepare(suites: &[CipherSuite], choice: CipherChoice) {
    if !crate::crypto::aead::Backend::all_chosen() {
        let _ = tokio::task::spawn_blocking(crate::crypto::aead::Backend::choose_all).await;
    }
    if choice == CipherChoice::Ordered || all_measured(suites) {
        return;
    }
    let suites = suites.to_vec();
    // A panic on that thread would only mean no figures yet; `figures` measures again.
    let _ = tokio::task::spawn_blocking(move || figures(&suites)).await;
}

/// [`policy`], with the measuring (if any is left) done off the async threads.
pub async fn policy_measured(suites: &[CipherSuite], choice: CipherChoice) -> CipherPolicy {
    prepare(suites, choice).await;
    policy(suites, choice)
}

/// A side's cipher policy: `suites` in preference order, `choice`, and under `fastest` this
/// process's figures for them (measured now if not yet: see [`figures`]).
pub fn policy(suites: &[CipherSuite], choice: CipherChoice) -> CipherPolicy {
    CipherPolicy {
        suites: suites.to_vec(),
        choice,
        speeds: match choice {
            CipherChoice::Fastest => figures(suites),
            CipherChoice::Ordered => Vec::new(),
        },
    }
}

/// `suite 9.1/8.7` (seal/open GB/s) for each figure, comma-separated, for logs and
/// `warren doctor`; `-` for none.
pub fn describe(speeds: &[SuiteSpeed]) -> String {
    if speeds.is_empty() {
        return "-".to_owned();
    }
    speeds
        .iter()
        .map(|speed| {
            format!(
                "{} {:.1}/{:.1}",
                speed.suite,
                f64::from(speed.seal_mbps) / 1000.0,
                f64::from(speed.open_mbps) / 1000.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The CPU features that decide which cipher is fastest here, and whether this CPU has
/// them: AES and carry-less multiply instructions (AES-GCM at all), their 256/512-bit
/// vector forms (VAES, VPCLMULQDQ) and AVX-512 (aws-lc's fastest AES-GCM; AEGIS-128X2's
/// wide lanes), or on ARM the crypto extensions.
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("aes-ni", std::arch::is_x86_feature_detected!("aes")),
            (
                "pclmulqdq",
                std::arch::is_x86_feature_detected!("pclmulqdq"),
            ),
            ("vaes", std::arch::is_x86_feature_detected!("vaes")),
            (
                "vpclmulqdq",
                std::arch::is_x86_feature_detected!("vpclmulqdq"),
            ),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        vec![
            ("aes", std::arch::is_aarch64_feature_detected!("aes")),
            ("pmull", std::arch::is_aarch64_feature_detected!("pmull")),
            ("sha3", std::arch::is_aarch64_feature_detected!("sha3")),
        ]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

/// `aes-ni vaes !avx512f ...`: the features, a `!` marking the missing ones.
pub fn describe_cpu_features() -> String {
    let features = cpu_features();
    if features.is_empty() {
        return "no features known for this architecture".to_owned();
    }
    features
        .iter()
        .map(|&(name, present)| {
            if present {
                name.to_owned()
            } else {
                format!("!{name}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Budget = Budget {
        rounds: 2,
        round: Duration::from_millis(1),
    };

    #[test]
    fn every_encrypting_suite_measures_something() {
        for suite in CipherSuite::ENCRYPTING {
            let speed = measure(suite, QUICK);
            assert_eq!(speed.suite, suite);
            assert!(speed.seal_mbps > 0 && speed.open_mbps > 0, "{speed:?}");
        }
        assert_eq!(measure(CipherSuite::None, QUICK).slower(), 0);
    }

    #[test]
    fn figures_skip_none_and_duplicates_and_are_cached() {
        let suites = [
            CipherSuite::Aegis128L,
            CipherSuite::None,
            CipherSuite::Aegis128L,
            CipherSuite::ChaCha20Poly1305,
        ];
        let first = figures(&suites);
        assert_eq!(
            first.iter().map(|s| s.suite).collect::<Vec<_>>(),
            [CipherSuite::Aegis128L, CipherSuite::ChaCha20Poly1305]
        );
        assert_eq!(figures(&suites), first, "measured once per process");
        assert!(all_measured(&suites));
        assert!(policy(&suites, CipherChoice::Ordered).speeds.is_empty());
        assert_eq!(policy(&suites, CipherChoice::Fastest).speeds, first);
    }

    #[test]
    fn descriptions() {
        let speed = SuiteSpeed {
            suite: CipherSuite::Aegis128L,
            seal_mbps: 9_140,
            open_mbps: 8_700,
        };
        assert_eq!(describe(&[speed]), "aegis-128l 9.1/8.7");
        assert_eq!(describe(&[]), "-");
        let features = describe_cpu_features();
        #[cfg(target_arch = "x86_64")]
        assert!(
            features.contains("aes-ni") && features.contains("avx512f"),
            "{features}"
        );
        assert!(!features.is_empty());
    }
}
