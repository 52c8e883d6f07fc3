//! Cipher suites for the data record layer and how the two sides agree on one.
//!
//! The client offers its list in preference order inside the first handshake message
//! (encrypted under the PSK), with its own measured seal and open speed for each suite
//! when it asks for the fastest cipher. The server decides ([`choose`]):
//!
//! * both sides `fastest` and the client sent figures: the suite both allow whose slower
//!   end is fastest, `min(client speed, server speed)`, where a side's speed for a suite is
//!   the slower of its seal and open; figures within [`TIE_PERCENT`] of the best count as a
//!   tie, broken by the server's order;
//! * otherwise (either side `ordered`, or a client from before figures existed): the first
//!   suite of the client's offer that the server also allows ([`negotiate`]), as in the
//!   first version of the protocol.
//!
//! The suite only names the algorithm: keys, the record layer and the measuring itself live
//! in the `warren` crate, which owns the crypto libraries and the clock.

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
    /// AEGIS-128X2 (`aegis` crate): AEGIS-128L run as two lanes, faster where the CPU has
    /// VAES with 256-bit vectors. Added after the first protocol version: it travels only
    /// in the handshake's speed extension, never in the v1 cipher list an older peer reads.
    Aegis128X2,
}

impl CipherSuite {
    /// Every encrypting suite, in the order `warren doctor` and the docs list them.
    pub const ENCRYPTING: [CipherSuite; 6] = [
        CipherSuite::Aes256Gcm,
        CipherSuite::Aes128Gcm,
        CipherSuite::ChaCha20Poly1305,
        CipherSuite::Aegis128L,
        CipherSuite::Aegis128X2,
        CipherSuite::Aegis256,
    ];

    /// Every suite, `none` included, by [`wire_id`](Self::wire_id).
    pub const ALL: [CipherSuite; 7] = [
        CipherSuite::Aes256Gcm,
        CipherSuite::Aes128Gcm,
        CipherSuite::ChaCha20Poly1305,
        CipherSuite::Aegis128L,
        CipherSuite::Aegis256,
        CipherSuite::None,
        CipherSuite::Aegis128X2,
    ];

    /// The suite's number on the wire: its postcard enum index, which never changes once
    /// published (new suites are appended).
    pub fn wire_id(self) -> u8 {
        match self {
            CipherSuite::Aes256Gcm => 0,
            CipherSuite::Aes128Gcm => 1,
            CipherSuite::ChaCha20Poly1305 => 2,
            CipherSuite::Aegis128L => 3,
            CipherSuite::Aegis256 => 4,
            CipherSuite::None => 5,
            CipherSuite::Aegis128X2 => 6,
        }
    }

    /// The suite with this [`wire_id`](Self::wire_id); `None` for a number this version
    /// does not know (a newer peer's suite, which the caller skips).
    pub fn from_wire_id(id: u8) -> Option<CipherSuite> {
        CipherSuite::ALL
            .into_iter()
            .find(|suite| suite.wire_id() == id)
    }

    /// Whether peers of the first protocol version can decode this suite. Only these go in
    /// the v1 cipher list of `ClientInit`: an unknown enum index there would make an older
    /// server drop the whole message.
    pub fn is_v1(self) -> bool {
        self.wire_id() <= CipherSuite::None.wire_id()
    }

    /// The name used in config files and logs (`"aes-256-gcm"`).
    pub fn name(self) -> &'static str {
        match self {
            CipherSuite::Aes256Gcm => "aes-256-gcm",
            CipherSuite::Aes128Gcm => "aes-128-gcm",
            CipherSuite::ChaCha20Poly1305 => "chacha20-poly1305",
            CipherSuite::Aegis128L => "aegis-128l",
            CipherSuite::Aegis256 => "aegis-256",
            CipherSuite::None => "none",
            CipherSuite::Aegis128X2 => "aegis-128x2",
        }
    }

    /// Bytes in the AEAD key (the nonce base comes on top; its length is the record
    /// layer's business).
    pub fn key_len(self) -> usize {
        match self {
            CipherSuite::Aes128Gcm | CipherSuite::Aegis128L | CipherSuite::Aegis128X2 => 16,
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

    /// The default list: every encrypting suite. Its order is the preference under
    /// `cipher_choice = "ordered"` (and towards peers that send no figures) and breaks ties
    /// under `"fastest"`: AES-GCM first where the CPU has AES instructions,
    /// ChaCha20-Poly1305 first where it does not (AES in software is ~10x slower). The
    /// suite added after the first protocol version comes last, so an `ordered` default
    /// config chooses exactly as before it existed.
    pub fn default_preference(has_aes_hardware: bool) -> Vec<CipherSuite> {
        if has_aes_hardware {
            vec![
                CipherSuite::Aes128Gcm,
                CipherSuite::Aes256Gcm,
                CipherSuite::Aegis128L,
                CipherSuite::ChaCha20Poly1305,
                CipherSuite::Aegis256,
                CipherSuite::Aegis128X2,
            ]
        } else {
            vec![
                CipherSuite::ChaCha20Poly1305,
                CipherSuite::Aes128Gcm,
                CipherSuite::Aes256Gcm,
                CipherSuite::Aegis128L,
                CipherSuite::Aegis256,
                CipherSuite::Aegis128X2,
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
    "unknown cipher `{name}`; expected one of: aes-256-gcm, aes-128-gcm, chacha20-poly1305, aegis-128l, aegis-128x2, aegis-256, none"
)]
pub struct UnknownCipher {
    /// What was asked for.
    pub name: String,
}

impl FromStr for CipherSuite {
    type Err = UnknownCipher;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        CipherSuite::ALL
            .into_iter()
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

/// Figures within this many percent of the best count as a tie under `fastest`: short
/// start-up measurements vary by a few percent, and a choice that flips between two equally
/// fast suites from one start to the next helps nobody.
pub const TIE_PERCENT: u64 = 5;

/// Whether the `ciphers` list order or the measured speeds decide (config key
/// `cipher_choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum CipherChoice {
    /// The suite both sides allow whose slower end seals and opens fastest.
    #[default]
    Fastest,
    /// The first suite of the client's list that the server allows (the first protocol
    /// version's rule).
    Ordered,
}

impl CipherChoice {
    /// The name used in config files and logs.
    pub fn name(self) -> &'static str {
        match self {
            CipherChoice::Fastest => "fastest",
            CipherChoice::Ordered => "ordered",
        }
    }
}

impl fmt::Display for CipherChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `cipher_choice` value that Warren does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cipher choice `{name}`; expected `fastest` or `ordered`")]
pub struct UnknownChoice {
    /// What was asked for.
    pub name: String,
}

impl FromStr for CipherChoice {
    type Err = UnknownChoice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fastest" => Ok(CipherChoice::Fastest),
            "ordered" => Ok(CipherChoice::Ordered),
            _ => Err(UnknownChoice { name: s.to_owned() }),
        }
    }
}

/// One side's measured speed for one suite on one core, in MB/s (10^6 bytes a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SuiteSpeed {
    /// The suite measured.
    pub suite: CipherSuite,
    /// Sealing speed.
    pub seal_mbps: u32,
    /// Opening speed.
    pub open_mbps: u32,
}

impl SuiteSpeed {
    /// The side's speed for the suite: a side both seals (what it sends) and opens (what it
    /// receives), so the slower of the two bounds it.
    pub fn slower(self) -> u32 {
        self.seal_mbps.min(self.open_mbps)
    }
}

/// One side's cipher settings: what it allows, how it chooses, and its own figures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CipherPolicy {
    /// Allowed suites, most preferred first (the `ciphers` list).
    pub suites: Vec<CipherSuite>,
    /// How the choice is made (`cipher_choice`).
    pub choice: CipherChoice,
    /// This side's measured speeds; empty under [`CipherChoice::Ordered`], which needs none.
    pub speeds: Vec<SuiteSpeed>,
}

impl CipherPolicy {
    /// A policy that follows the list's order and carries no figures.
    pub fn ordered(suites: Vec<CipherSuite>) -> Self {
        CipherPolicy {
            suites,
            choice: CipherChoice::Ordered,
            speeds: Vec::new(),
        }
    }

    /// This side's figure for `suite`, if measured.
    pub fn speed_of(&self, suite: CipherSuite) -> Option<SuiteSpeed> {
        speed_of(&self.speeds, suite)
    }
}

/// The figure for `suite` in `speeds`, if there is one.
pub fn speed_of(speeds: &[SuiteSpeed], suite: CipherSuite) -> Option<SuiteSpeed> {
    speeds.iter().copied().find(|speed| speed.suite == suite)
}

/// The server's decision: the suite and which rule picked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The suite both sides will use.
    pub suite: CipherSuite,
    /// [`CipherChoice::Fastest`] when the figures decided, [`CipherChoice::Ordered`] when
    /// the client's order did.
    pub by: CipherChoice,
}

/// The server's choice for a client that offers `offered` (its preference order) with
/// `client_speeds` (`None`: the client asked for its order to decide, or predates figures),
/// under the server's `policy`. See the module docs for the rules. `None` means the two
/// sides share no suite.
pub fn choose(
    offered: &[CipherSuite],
    client_speeds: Option<&[SuiteSpeed]>,
    policy: &CipherPolicy,
) -> Option<Choice> {
    let (CipherChoice::Fastest, Some(client_speeds)) = (policy.choice, client_speeds) else {
        return negotiate(offered, &policy.suites).map(|suite| Choice {
            suite,
            by: CipherChoice::Ordered,
        });
    };
    // Both ends' speed for each common suite, in the server's order; a suite one side has
    // no figure for scores 0 and so only wins when nothing was measured.
    let scored: Vec<(CipherSuite, u64)> = policy
        .suites
        .iter()
        .copied()
        .filter(|suite| offered.contains(suite))
        .map(|suite| {
            let client = speed_of(client_speeds, suite).map_or(0, SuiteSpeed::slower);
            let server = policy.speed_of(suite).map_or(0, SuiteSpeed::slower);
            (suite, u64::from(client.min(server)))
        })
        .collect();
    let best = scored.iter().map(|&(_, score)| score).max()?;
    scored
        .into_iter()
        .find(|&(_, score)| score * 100 >= best * (100 - TIE_PERCENT))
        .map(|(suite, _)| Choice {
            suite,
            by: CipherChoice::Fastest,
        })
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

    fn speeds(figures: &[(CipherSuite, u32, u32)]) -> Vec<SuiteSpeed> {
        figures
            .iter()
            .map(|&(suite, seal_mbps, open_mbps)| SuiteSpeed {
                suite,
                seal_mbps,
                open_mbps,
            })
            .collect()
    }

    fn fastest(suites: &[CipherSuite], figures: &[(CipherSuite, u32, u32)]) -> CipherPolicy {
        CipherPolicy {
            suites: suites.to_vec(),
            choice: CipherChoice::Fastest,
            speeds: speeds(figures),
        }
    }

    use CipherSuite::{Aegis128L, Aegis128X2, Aegis256, Aes128Gcm, Aes256Gcm, ChaCha20Poly1305};

    #[test]
    fn wire_ids_are_the_postcard_indices_and_never_move() {
        for suite in CipherSuite::ALL {
            let encoded = postcard::to_allocvec(&suite).unwrap();
            assert_eq!(encoded, [suite.wire_id()], "{suite}");
            assert_eq!(CipherSuite::from_wire_id(suite.wire_id()), Some(suite));
        }
        // The published numbers: changing one breaks every older peer.
        assert_eq!(Aes256Gcm.wire_id(), 0);
        assert_eq!(CipherSuite::None.wire_id(), 5);
        assert_eq!(Aegis128X2.wire_id(), 6);
        assert_eq!(CipherSuite::from_wire_id(7), None);
        assert!(Aegis256.is_v1() && !Aegis128X2.is_v1());
    }

    #[test]
    fn choice_names_round_trip() {
        for choice in [CipherChoice::Fastest, CipherChoice::Ordered] {
            assert_eq!(choice.name().parse::<CipherChoice>(), Ok(choice));
        }
        assert!("quickest".parse::<CipherChoice>().is_err());
        assert_eq!(CipherChoice::default(), CipherChoice::Fastest);
    }

    #[test]
    fn fastest_maximizes_the_slower_end() {
        // The server is fast at AES-GCM, the client (no VAES, say) is not: AEGIS wins
        // although the server alone would pick AES.
        let server = fastest(
            &[Aes128Gcm, Aegis128L, ChaCha20Poly1305],
            &[
                (Aes128Gcm, 20_000, 20_000),
                (Aegis128L, 9_000, 9_500),
                (ChaCha20Poly1305, 2_500, 2_500),
            ],
        );
        let client = speeds(&[
            (Aes128Gcm, 2_300, 2_200),
            (Aegis128L, 8_800, 9_100),
            (ChaCha20Poly1305, 2_400, 2_400),
        ]);
        let offered = [Aes128Gcm, Aegis128L, ChaCha20Poly1305];
        assert_eq!(
            choose(&offered, Some(&client), &server),
            Some(Choice {
                suite: Aegis128L,
                by: CipherChoice::Fastest
            })
        );
        // A side's speed is the slower of seal and open.
        let client = speeds(&[
            (Aes128Gcm, 30_000, 3_000),
            (Aegis128L, 8_000, 8_000),
            (ChaCha20Poly1305, 2_400, 2_400),
        ]);
        assert_eq!(
            choose(&offered, Some(&client), &server).map(|c| c.suite),
            Some(Aegis128L)
        );
    }

    #[test]
    fn restricted_lists_are_respected_on_both_sides() {
        let server = fastest(
            &[Aes128Gcm, Aegis128L, ChaCha20Poly1305],
            &[
                (Aes128Gcm, 2_000, 2_000),
                (Aegis128L, 9_000, 9_000),
                (ChaCha20Poly1305, 2_500, 2_500),
            ],
        );
        let client = speeds(&[
            (ChaCha20Poly1305, 2_400, 2_400),
            (Aegis128X2, 90_000, 90_000),
        ]);
        // The client pins chacha20: the faster AEGIS the server allows is not a candidate,
        // and the client's even faster AEGIS-128X2 is not allowed by the server.
        assert_eq!(
            choose(&[ChaCha20Poly1305, Aegis128X2], Some(&client), &server).map(|c| c.suite),
            Some(ChaCha20Poly1305)
        );
        assert_eq!(choose(&[Aegis256], Some(&client), &server), None);
        assert_eq!(choose(&[], Some(&client), &server), None);
    }

    #[test]
    fn near_ties_go_to_the_servers_order() {
        let client = speeds(&[(Aegis128L, 9_000, 9_000), (Aegis128X2, 9_300, 9_300)]);
        // Within TIE_PERCENT: the server's first wins, whatever the client's order.
        let server = fastest(
            &[Aegis128L, Aegis128X2],
            &[(Aegis128L, 9_000, 9_000), (Aegis128X2, 9_400, 9_400)],
        );
        assert_eq!(
            choose(&[Aegis128X2, Aegis128L], Some(&client), &server).map(|c| c.suite),
            Some(Aegis128L)
        );
        let server = fastest(
            &[Aegis128X2, Aegis128L],
            &[(Aegis128L, 9_000, 9_000), (Aegis128X2, 9_400, 9_400)],
        );
        assert_eq!(
            choose(&[Aegis128L, Aegis128X2], Some(&client), &server).map(|c| c.suite),
            Some(Aegis128X2)
        );
        // Exact ties, e.g. nothing measured anywhere: the server's order.
        let server = fastest(&[Aes256Gcm, Aes128Gcm], &[]);
        assert_eq!(
            choose(&[Aes128Gcm, Aes256Gcm], Some(&[]), &server).map(|c| c.suite),
            Some(Aes256Gcm)
        );
        // Beyond the band the faster one wins even when it comes last.
        let server = fastest(
            &[Aegis128L, Aegis128X2],
            &[(Aegis128L, 9_000, 9_000), (Aegis128X2, 18_000, 18_000)],
        );
        let client = speeds(&[(Aegis128L, 9_000, 9_000), (Aegis128X2, 17_000, 17_000)]);
        assert_eq!(
            choose(&[Aegis128L, Aegis128X2], Some(&client), &server).map(|c| c.suite),
            Some(Aegis128X2)
        );
    }

    #[test]
    fn a_client_without_figures_chooses_as_before() {
        let server = fastest(
            &[Aes128Gcm, Aegis128L],
            &[(Aes128Gcm, 2_000, 2_000), (Aegis128L, 9_000, 9_000)],
        );
        let offered = [Aes256Gcm, Aes128Gcm, Aegis128L];
        let choice = choose(&offered, None, &server);
        assert_eq!(
            choice,
            Some(Choice {
                suite: Aes128Gcm,
                by: CipherChoice::Ordered
            })
        );
        assert_eq!(choice.map(|c| c.suite), negotiate(&offered, &server.suites));
    }

    #[test]
    fn ordered_on_either_side_follows_the_clients_order() {
        let figures = [(Aes128Gcm, 2_000, 2_000), (Aegis128L, 9_000, 9_000)];
        let offered = [Aes128Gcm, Aegis128L];
        // The server says ordered: figures are ignored.
        let server = CipherPolicy {
            choice: CipherChoice::Ordered,
            ..fastest(&[Aegis128L, Aes128Gcm], &figures)
        };
        assert_eq!(
            choose(&offered, Some(&speeds(&figures)), &server),
            Some(Choice {
                suite: Aes128Gcm,
                by: CipherChoice::Ordered
            })
        );
        // The client says ordered: it sends no figures (None).
        let server = fastest(&[Aegis128L, Aes128Gcm], &figures);
        assert_eq!(
            choose(&offered, None, &server).map(|c| c.suite),
            Some(Aes128Gcm)
        );
        assert_eq!(
            CipherPolicy::ordered(vec![Aegis128L]).choice,
            CipherChoice::Ordered
        );
    }
}
