//! The session key schedule: everything derived from one finished Noise handshake.
//!
//! ```text
//! session secret = HKDF(ikm = split.0 || split.1, salt = handshake hash, "warren session v1")
//! control keys   = HKDF(session secret, "warren control c2s" / "... s2c")
//! channel auth   = HKDF(session secret, "warren channel auth")
//! channel keys   = HKDF(session secret, salt = client nonce || server nonce, "warren channel c2s" / "... s2c")
//! token proof    = HMAC(token, "warren token proof" || handshake hash || service name)
//! ```
//!
//! Data channels thus need no Diffie-Hellman of their own, yet each has fresh keys (both
//! sides contribute a nonce) and cannot be opened by anyone who did not finish the
//! handshake.
//!
//! A QUIC session has no Noise handshake and no data channels ([`SessionKeys::for_quic`]):
//! TLS 1.3 encrypts everything, and the binding that token proofs use, like the session
//! id, comes from the TLS exporter, so a proof is good for that one connection only.
//!
//! ```text
//! binding    = TLS exporter("EXPORTER-warren-session", 32 bytes)
//! session id = first 16 bytes of HKDF(binding, "warren quic session id")
//! ```
//!
//! Inside TLS (`tls`, and `wss` when the TLS proof matched: [`SessionKeys::is_on_tls`])
//! the records use `none`, and every data channel's MACs are bound to its own TLS session
//! ([`SessionKeys::bound_to`]), so no channel of such a session crosses a hop that ended
//! the TLS.

use warren_proto::CipherSuite;
use warren_proto::handshake::{Established, MAC_LEN, NONCE_LEN, Negotiation, SessionId};

use crate::Side;
use crate::crypto::kdf;
use crate::crypto::record::{DirectionKeys, Opener, Sealer};
use crate::crypto::secret::Secret;

const SESSION_LABEL: &[u8] = b"warren session v1";
const CONTROL_C2S: &[u8] = b"warren control c2s";
const CONTROL_S2C: &[u8] = b"warren control s2c";
const CHANNEL_AUTH: &[u8] = b"warren channel auth";
const CHANNEL_C2S: &[u8] = b"warren channel c2s";
const CHANNEL_S2C: &[u8] = b"warren channel s2c";
const DATA_HELLO: &[u8] = b"warren data hello";
const DATA_ACCEPT: &[u8] = b"warren data accept";
const TOKEN_PROOF: &[u8] = b"warren token proof";
const NOISE_PSK: &[u8] = b"warren noise psk v1";
const RELAY_AUTH: &[u8] = b"warren relay auth v1";
const TLS_BINDING: &[u8] = b"warren tls binding v1";
const TLS_PROOF: &[u8] = b"warren tls proof v1";

/// HKDF-SHA256 into 32 bytes.
fn derive32(ikm: &[u8], salt: &[u8], info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // Invariant: 32 bytes is far below HKDF-SHA256's 8160-byte output limit, and aws-lc
    // does not fail otherwise.
    kdf::hkdf_expand(ikm, salt, &[info], &mut out).expect("32-byte HKDF output");
    out
}

/// A `wss` client's TLS proof ([`warren_proto::speed_ext`]): a MAC of its TLS session's
/// exporter under the Noise PSK. The server computes the same from its side of the TLS
/// session; the two match only if nothing in between terminated the TLS.
pub fn tls_proof(noise_psk: &[u8; 32], exporter: &[u8; 32]) -> [u8; 32] {
    kdf::hmac_sha256(noise_psk, &[TLS_PROOF, exporter])
}

/// Checks a [`tls_proof`] against this side's `exporter` in constant time.
pub fn verify_tls_proof(noise_psk: &[u8; 32], exporter: &[u8; 32], proof: &[u8; 32]) -> bool {
    kdf::verify_hmac_sha256(noise_psk, &[TLS_PROOF, exporter], proof)
}

/// Turns the configured PSK (any length) into the 32 bytes Noise wants.
pub fn noise_psk(psk: &Secret) -> [u8; 32] {
    derive32(psk.as_bytes(), b"", NOISE_PSK)
}

/// The Noise PSK of a connection whose TLS session is end to end (the `tls` transport):
/// mixed with the TLS exporter, so the Noise handshake only completes between the two
/// ends of *that* TLS session, and a relay that terminates TLS cannot pass it on.
/// `None` (every other transport) keeps `noise_psk`.
pub fn bound_noise_psk(noise_psk: &[u8; 32], binding: Option<&[u8; 32]>) -> [u8; 32] {
    match binding {
        Some(binding) => derive32(noise_psk, binding, TLS_BINDING),
        None => *noise_psk,
    }
}

/// The key of the P2P relay's bind tags (`p2p::net::relay::RelayAuth`): proves a leg
/// holds the server's PSK without the PSK itself keying anything on the wire.
pub fn relay_auth_key(psk: &Secret) -> [u8; 32] {
    derive32(psk.as_bytes(), b"", RELAY_AUTH)
}

/// Proves knowledge of a service token without revealing it, bound to one handshake.
pub fn token_proof(token: &Secret, handshake_hash: &[u8; 32], service: &str) -> [u8; 32] {
    kdf::hmac_sha256(
        token.as_bytes(),
        &[TOKEN_PROOF, handshake_hash, service.as_bytes()],
    )
}

/// Checks a token proof in constant time.
pub fn verify_token_proof(
    token: &Secret,
    handshake_hash: &[u8; 32],
    service: &str,
    proof: &[u8],
) -> bool {
    kdf::verify_hmac_sha256(
        token.as_bytes(),
        &[TOKEN_PROOF, handshake_hash, service.as_bytes()],
        proof,
    )
}

/// Secrets of one session, held by both sides for as long as the session lives.
#[derive(Clone)]
pub struct SessionKeys {
    /// The record cipher of a TCP transport's channels; unused on QUIC.
    cipher: CipherSuite,
    /// A QUIC session: TLS 1.3 encrypts, there are no data channels.
    quic: bool,
    /// A session on an end-to-end TLS session (`tls`, or `wss` with a matching TLS
    /// proof): TLS 1.3 encrypts, the records inside use `none`.
    tls: bool,
    /// `ws` or `wss` when the session rides WebSocket frames (for the admin API).
    websocket: Option<&'static str>,
    /// How the cipher was chosen and both sides' figures: shown, never used for keys.
    negotiation: Negotiation,
    session_id: SessionId,
    handshake_hash: [u8; 32],
    secret: [u8; 32],
    channel_auth: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKeys")
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

impl SessionKeys {
    /// Derives the session secrets from a finished handshake.
    pub fn new(established: &Established) -> Self {
        let mut ikm = [0u8; 64];
        ikm[..32].copy_from_slice(&established.split.0);
        ikm[32..].copy_from_slice(&established.split.1);
        let secret = derive32(&ikm, &established.handshake_hash, SESSION_LABEL);
        let channel_auth = derive32(&secret, b"", CHANNEL_AUTH);
        SessionKeys {
            cipher: established.cipher,
            quic: false,
            tls: established.tls_bound,
            websocket: None,
            negotiation: established.negotiation.clone(),
            session_id: established.session_id,
            handshake_hash: established.handshake_hash,
            secret,
            channel_auth,
        }
    }

    /// The keys of a QUIC session, from the TLS exporter's `binding` (both sides compute
    /// the same): token proofs bind to it, and the session id comes from it.
    pub fn for_quic(binding: [u8; 32]) -> Self {
        let id = derive32(&binding, b"", b"warren quic session id");
        let mut session_id = SessionId::default();
        let len = session_id.len();
        session_id.copy_from_slice(&id[..len]);
        SessionKeys {
            cipher: CipherSuite::None,
            quic: true,
            tls: false,
            websocket: None,
            negotiation: Negotiation {
                decided_by: warren_proto::CipherChoice::Ordered,
                client_speeds: Vec::new(),
                server_speeds: Vec::new(),
            },
            session_id,
            handshake_hash: binding,
            secret: derive32(&binding, b"", SESSION_LABEL),
            channel_auth: [0u8; 32],
        }
    }

    /// The negotiated record cipher of a TCP transport's channels (`none` on QUIC, where
    /// TLS encrypts: see [`SessionKeys::record_cipher`]).
    pub fn cipher(&self) -> CipherSuite {
        self.cipher
    }

    /// The record cipher, for sessions that have one (`None` on QUIC).
    pub fn record_cipher(&self) -> Option<CipherSuite> {
        (!self.quic).then_some(self.cipher)
    }

    /// What encrypts the session, for logs and the admin API: the record cipher, or
    /// `tls1.3-quic`.
    pub fn cipher_label(&self) -> String {
        if self.quic {
            "tls1.3-quic".to_owned()
        } else if self.tls && self.cipher == CipherSuite::None {
            "tls1.3".to_owned()
        } else {
            self.cipher.to_string()
        }
    }

    /// Whether the session is bound to its TLS session (`tls`, or `wss` with a matching
    /// TLS proof).
    pub fn is_on_tls(&self) -> bool {
        self.tls
    }

    /// How the cipher was chosen, with both sides' figures.
    pub fn negotiation(&self) -> &Negotiation {
        &self.negotiation
    }

    /// One line for logs and diagnostics: the rule that chose the cipher and both sides'
    /// seal/open figures in GB/s, e.g. `fastest; client aegis-128l 9.1/8.7; server ...`.
    pub fn describe_choice(&self) -> String {
        if self.quic {
            return "QUIC: TLS 1.3 with the PSK proof or client certificates".to_owned();
        }
        let n = &self.negotiation;
        format!(
            "{}; client {}; server {}",
            n.decided_by,
            crate::crypto::speed::describe(&n.client_speeds),
            crate::crypto::speed::describe(&n.server_speeds)
        )
    }

    /// The session id.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The handshake hash, to bind token proofs.
    pub fn handshake_hash(&self) -> &[u8; 32] {
        &self.handshake_hash
    }

    /// Record keys of the control channel, as (sealer for what `side` sends, opener for what it receives).
    pub fn control_channel(&self, side: Side) -> (Sealer, Opener) {
        self.record_pair(side, b"", CONTROL_C2S, CONTROL_S2C)
    }

    /// Marks the session as one of the `tls` transport (bound to its TLS session), for
    /// [`SessionKeys::cipher_label`] and [`SessionKeys::bound_to`]. A `wss` session
    /// whose TLS proof matched is marked by its handshake already.
    pub fn on_tls(mut self, bound: bool) -> Self {
        self.tls |= bound;
        self
    }

    /// Marks the session as carried in WebSocket frames: `ws`, `wss`, or `None`.
    pub fn on_websocket(mut self, label: Option<&'static str>) -> Self {
        self.websocket = label;
        self
    }

    /// `ws` or `wss` for a session in WebSocket frames.
    pub fn websocket(&self) -> Option<&'static str> {
        self.websocket
    }

    /// The keys a data channel on a connection with TLS exporter `binding` proves itself
    /// with. A session bound to its TLS ([`SessionKeys::is_on_tls`]) binds each channel's
    /// MACs to that channel's own TLS session, as the control channel's handshake is, and
    /// has no keys for a channel without TLS (`None`: its records would be plaintext on
    /// the wire). Other sessions keep these keys.
    pub fn bound_to(
        &self,
        binding: Option<&[u8; 32]>,
    ) -> Option<std::borrow::Cow<'_, SessionKeys>> {
        match (self.tls, binding) {
            (false, _) => Some(std::borrow::Cow::Borrowed(self)),
            (true, None) => None,
            (true, Some(binding)) => {
                let mut keys = self.clone();
                keys.channel_auth = derive32(&self.channel_auth, binding, TLS_BINDING);
                Some(std::borrow::Cow::Owned(keys))
            }
        }
    }

    /// MAC a client puts in its data channel hello.
    pub fn data_hello_mac(&self, client_nonce: &[u8; NONCE_LEN]) -> [u8; MAC_LEN] {
        kdf::hmac_sha256(
            &self.channel_auth,
            &[DATA_HELLO, &self.session_id, client_nonce],
        )
    }

    /// Checks a data channel hello's MAC in constant time.
    pub fn verify_data_hello(&self, client_nonce: &[u8; NONCE_LEN], mac: &[u8]) -> bool {
        kdf::verify_hmac_sha256(
            &self.channel_auth,
            &[DATA_HELLO, &self.session_id, client_nonce],
            mac,
        )
    }

    /// MAC the server puts in its data channel accept.
    pub fn data_accept_mac(
        &self,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> [u8; MAC_LEN] {
        kdf::hmac_sha256(
            &self.channel_auth,
            &[DATA_ACCEPT, &self.session_id, client_nonce, server_nonce],
        )
    }

    /// Checks a data channel accept's MAC in constant time.
    pub fn verify_data_accept(
        &self,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
        mac: &[u8],
    ) -> bool {
        kdf::verify_hmac_sha256(
            &self.channel_auth,
            &[DATA_ACCEPT, &self.session_id, client_nonce, server_nonce],
            mac,
        )
    }

    /// Record keys of one data channel.
    pub fn data_channel(
        &self,
        side: Side,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> (Sealer, Opener) {
        let mut salt = [0u8; 2 * NONCE_LEN];
        salt[..NONCE_LEN].copy_from_slice(client_nonce);
        salt[NONCE_LEN..].copy_from_slice(server_nonce);
        self.record_pair(side, &salt, CHANNEL_C2S, CHANNEL_S2C)
    }

    fn record_pair(&self, side: Side, salt: &[u8], c2s: &[u8], s2c: &[u8]) -> (Sealer, Opener) {
        let channel_secret = derive32(&self.secret, salt, b"warren channel secret");
        let (send_label, recv_label) = match side {
            Side::Client => (c2s, s2c),
            Side::Server => (s2c, c2s),
        };
        let send = DirectionKeys::derive(self.cipher, &channel_secret, send_label);
        let recv = DirectionKeys::derive(self.cipher, &channel_secret, recv_label);
        (
            Sealer::new(self.cipher, send),
            Opener::new(self.cipher, recv),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(tls_bound: bool) -> SessionKeys {
        SessionKeys::new(&Established {
            version: 2,
            cipher: CipherSuite::None,
            session_id: [1; 16],
            handshake_hash: [2; 32],
            split: ([3; 32], [4; 32]),
            negotiation: Negotiation {
                decided_by: warren_proto::CipherChoice::Ordered,
                client_speeds: Vec::new(),
                server_speeds: Vec::new(),
            },
            tls_bound,
        })
    }

    #[test]
    fn tls_proofs_match_only_for_the_same_exporter_and_psk() {
        let proof = tls_proof(&[7; 32], &[9; 32]);
        assert!(verify_tls_proof(&[7; 32], &[9; 32], &proof));
        assert!(
            !verify_tls_proof(&[7; 32], &[8; 32], &proof),
            "another TLS session"
        );
        assert!(!verify_tls_proof(&[6; 32], &[9; 32], &proof), "another PSK");
    }

    /// A session bound to its TLS binds each data channel to the channel's own TLS session
    /// and has no keys for a channel without TLS; an unbound one ignores TLS altogether.
    #[test]
    fn data_channels_of_a_bound_session_prove_their_own_tls() {
        let nonce = [5; NONCE_LEN];
        let unbound = keys(false);
        assert!(!unbound.is_on_tls());
        let mac = unbound.data_hello_mac(&nonce);
        for binding in [None, Some(&[9; 32])] {
            let keys = unbound
                .bound_to(binding)
                .expect("unbound sessions take any channel");
            assert!(keys.verify_data_hello(&nonce, &mac));
        }

        let bound = keys(true);
        assert!(bound.is_on_tls());
        assert_eq!(bound.cipher_label(), "tls1.3");
        assert!(bound.bound_to(None).is_none(), "a channel without TLS");
        let here = bound.bound_to(Some(&[9; 32])).unwrap();
        let there = bound.bound_to(Some(&[8; 32])).unwrap();
        let mac = here.data_hello_mac(&nonce);
        assert!(here.verify_data_hello(&nonce, &mac));
        assert!(
            !there.verify_data_hello(&nonce, &mac),
            "a TLS session ended on the way"
        );
        assert!(!bound.verify_data_hello(&nonce, &mac));
    }
}
