//! Connection preambles and the Noise handshake, as pure functions over bytes.
//!
//! Every TCP connection to a Warren server starts with one *preamble frame*:
//! `[len: u16 BE][kind: u8][body]`, `len` counting `kind` and `body` and capped at
//! [`MAX_PREAMBLE_LEN`] before anything is allocated.
//!
//! * kind [`KIND_CONTROL`]: `body` is the first message of
//!   `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`. The PSK is mixed in before the first message,
//!   so its payload ([`ClientInit`]: protocol version and cipher offer) is already
//!   authenticated: a peer without the PSK fails to decrypt it, costs the server no
//!   Diffie-Hellman, and gets no answer at all. The server answers with one frame
//!   `[len: u16][Noise message 2]` whose payload is a [`ServerInit`]. Newer peers append
//!   their cipher figures after both payloads ([`crate::speed_ext`]), which older peers
//!   ignore; the server then chooses with [`cipher::choose`]. NN is enough: the PSK
//!   authenticates both sides and the `ee` DH gives forward secrecy; static keys would add a
//!   DH per side and nothing to verify them against.
//! * kind [`KIND_DATA`]: `body` is a [`DataHello`]. A data channel names its session and
//!   proves with a MAC keyed from the session secret that it belongs there; the server answers
//!   `[len: u16][DataAccept]` only if the MAC checks, else closes in silence. No DH: channels
//!   are cheap enough to open one per visitor.
//! * kind [`KIND_DATA_OPEN`]: the same [`DataHello`], for a channel that carries a stream
//!   the *client* opens (forward services): it never goes to the server's idle pool; the
//!   client's first record on it is a `StreamOpen`.
//!
//! The MACs and key derivations themselves live in the `warren` crate (which owns the crypto
//! libraries); this module only fixes the layouts and drives snow, which is itself sans-IO.
//! snow draws the ephemeral key from the OS RNG, the one place this crate does not take
//! randomness from its caller.

use serde::{Deserialize, Serialize};

use crate::cipher::{self, CipherChoice, CipherPolicy, CipherSuite, SuiteSpeed};
use crate::speed_ext::{AcceptExt, ClientExt, MAX_EXT_ENTRIES};

/// Noise protocol name of the control-channel handshake.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";

/// Wire protocol version carried in [`ClientInit`]: what this build speaks as a client.
///
/// v2 sends the hello in parts (`HelloPart`), can probe without claiming, carries balancing
/// weights and health, and gets a `Refuse` with the reason instead of a silent close.
pub const PROTOCOL_VERSION: u16 = 2;

/// Oldest client version a server still accepts (v1 clients keep working against a v2
/// server; a v2 client gets a clear version refusal from a v1 server).
pub const MIN_PROTOCOL_VERSION: u16 = 1;

/// Largest preamble or handshake reply frame body accepted (bytes after the length prefix).
pub const MAX_PREAMBLE_LEN: usize = 1024;

/// Preamble kind: a control channel (Noise handshake follows).
pub const KIND_CONTROL: u8 = 0x57; // 'W'
/// Preamble kind: a data channel of an existing session, for the server's idle pool.
pub const KIND_DATA: u8 = 0x44; // 'D'
/// Preamble kind: a data channel that opens a stream at once (a forward service): the
/// client's first record on it is a `StreamOpen`, and the server dials the service's target.
pub const KIND_DATA_OPEN: u8 = 0x4F; // 'O'

/// Bytes in a session id.
pub const SESSION_ID_LEN: usize = 16;
/// Bytes in a data channel nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes in a data channel MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;

/// Identifies a session to its data channels. Random, chosen by the server.
pub type SessionId = [u8; SESSION_ID_LEN];

/// Payload of Noise message 1: what the client speaks. A newer client appends a
/// [`ClientExt`] after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInit {
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u16,
    /// Cipher suites for the record layer, most preferred first; only suites of the first
    /// protocol version ([`CipherSuite::is_v1`]), which every server can decode.
    pub ciphers: Vec<CipherSuite>,
}

/// Payload of Noise message 2: the server's decision. A newer server appends an
/// [`AcceptExt`] after `Accept` for a client that sent a [`ClientExt`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerInit {
    /// Proceed with this cipher; data channels name this session id.
    Accept {
        /// The suite the server picked from the client's offer.
        cipher: CipherSuite,
        /// The new session's id.
        session_id: SessionId,
    },
    /// The PSK matched but the two configs cannot work together.
    Refuse(Refusal),
}

/// Why an authenticated client was turned away during the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Client and server speak different protocol versions.
    #[error("protocol version mismatch: server speaks v{server}; upgrade the older side")]
    Version {
        /// What the server speaks.
        server: u16,
    },
    /// No cipher the client offers is allowed by the server.
    #[error(
        "no common cipher: the server allows [{}]; add one of them to the client's `ciphers` (or make both `transport` settings equal)",
        names(.server_allows)
    )]
    NoCommonCipher {
        /// The server's list.
        server_allows: Vec<CipherSuite>,
    },
}

fn names(suites: &[CipherSuite]) -> String {
    suites
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a finished handshake hands to the record layer.
#[derive(Clone, PartialEq, Eq)]
pub struct Established {
    /// The protocol version both sides speak on this session (the client's).
    pub version: u16,
    /// The negotiated record cipher.
    pub cipher: CipherSuite,
    /// The session id the server assigned.
    pub session_id: SessionId,
    /// Noise handshake hash: binds token proofs to this very handshake.
    pub handshake_hash: [u8; 32],
    /// Noise `Split()` output: (initiator→responder, responder→initiator) keys. Secret.
    pub split: ([u8; 32], [u8; 32]),
    /// How the cipher was chosen and both sides' figures, for logs and diagnostics.
    pub negotiation: Negotiation,
    /// The server found the client's TLS proof to match its own TLS session: the TLS
    /// under the session is end to end and the cipher is `none` (see
    /// [`crate::speed_ext`]). Data channels then prove their own TLS session too.
    pub tls_bound: bool,
}

/// How the cipher of a session was chosen, as both sides know it after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiation {
    /// The rule that decided: [`CipherChoice::Ordered`] also for a peer that predates
    /// figures.
    pub decided_by: CipherChoice,
    /// The client's figures (empty when it sent none).
    pub client_speeds: Vec<SuiteSpeed>,
    /// The server's figures (empty when it measured none, or on a client whose server
    /// predates figures).
    pub server_speeds: Vec<SuiteSpeed>,
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Established")
            .field("cipher", &self.cipher)
            .field("negotiation", &self.negotiation)
            .field("tls_bound", &self.tls_bound)
            .field("split", &"****")
            .finish_non_exhaustive()
    }
}

/// Handshake failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Decryption failed: wrong PSK, or garbage. The server answers nothing.
    #[error("handshake failed authentication: the PSKs differ (or this is not a Warren peer)")]
    Unauthenticated,
    /// The frame or payload is not well formed.
    #[error("malformed handshake message")]
    Malformed,
    /// The server refused an authenticated client.
    #[error("server refused the session: {0}")]
    Refused(Refusal),
    /// snow rejected its own parameters or state: a bug, not a peer's doing.
    #[error("internal handshake error: {0}")]
    Internal(String),
}

/// A parsed preamble frame body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preamble<'a> {
    /// Noise message 1 of a new control channel.
    Control(&'a [u8]),
    /// A data channel hello (a channel for the idle pool).
    Data(DataHello),
    /// A data channel hello for a channel that opens a stream towards the server.
    DataOpen(DataHello),
}

/// Checks a 2-byte frame length prefix before the body is read.
///
/// # Errors
/// [`HandshakeError::Malformed`] for a zero length or one over [`MAX_PREAMBLE_LEN`].
pub fn frame_len(prefix: [u8; 2]) -> Result<usize, HandshakeError> {
    let len = usize::from(u16::from_be_bytes(prefix));
    if len == 0 || len > MAX_PREAMBLE_LEN {
        return Err(HandshakeError::Malformed);
    }
    Ok(len)
}

/// Prefixes `body` with its u16 length.
fn frame(body: &[u8]) -> Vec<u8> {
    // Invariant: callers pass bodies bounded by MAX_PREAMBLE_LEN (< u16::MAX).
    let len = u16::try_from(body.len()).expect("frame bodies are small");
    let mut out = Vec::with_capacity(2 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Parses a preamble body (the bytes after the length prefix).
///
/// # Errors
/// [`HandshakeError::Malformed`] for an unknown kind or a data hello of the wrong size.
pub fn parse_preamble(body: &[u8]) -> Result<Preamble<'_>, HandshakeError> {
    match body.split_first() {
        Some((&KIND_CONTROL, rest)) => Ok(Preamble::Control(rest)),
        Some((&KIND_DATA, rest)) => DataHello::from_bytes(rest).map(Preamble::Data),
        Some((&KIND_DATA_OPEN, rest)) => DataHello::from_bytes(rest).map(Preamble::DataOpen),
        _ => Err(HandshakeError::Malformed),
    }
}

fn noise_builder(psk: &[u8; 32]) -> Result<snow::Builder<'_>, HandshakeError> {
    let params = NOISE_PARAMS
        .parse()
        .map_err(|e| HandshakeError::Internal(format!("{e:?}")))?;
    snow::Builder::new(params)
        .psk(0, psk)
        .map_err(|e| HandshakeError::Internal(e.to_string()))
}

fn established(
    state: &mut snow::HandshakeState,
    version: u16,
    cipher: CipherSuite,
    session_id: SessionId,
    negotiation: Negotiation,
    tls_bound: bool,
) -> Result<Established, HandshakeError> {
    if !state.is_handshake_finished() {
        return Err(HandshakeError::Internal("handshake not finished".into()));
    }
    let mut handshake_hash = [0u8; 32];
    handshake_hash.copy_from_slice(state.get_handshake_hash());
    Ok(Established {
        version,
        cipher,
        session_id,
        handshake_hash,
        split: state.dangerously_get_raw_split(),
        negotiation,
        tls_bound,
    })
}

/// The client's half of the control-channel handshake.
pub struct ClientHandshake {
    state: snow::HandshakeState,
    /// The protocol version sent.
    version: u16,
    /// Every suite offered: the server must pick one of them.
    offered: Vec<CipherSuite>,
    /// The figures sent, for [`Negotiation::client_speeds`].
    speeds: Vec<SuiteSpeed>,
    /// A TLS proof was sent: the server may answer `none` (and so says the TLS is end
    /// to end).
    proved: bool,
}

impl ClientHandshake {
    /// Starts a handshake offering `policy`'s suites (and, under `fastest`, its figures);
    /// returns the state and the complete preamble frame to send. Suites an older server
    /// would not know go only in the extension (see [`crate::speed_ext`]).
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start_with(
        psk: &[u8; 32],
        policy: &CipherPolicy,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        Self::start_proving(psk, policy, None)
    }

    /// [`ClientHandshake::start_with`], adding a `wss` client's TLS proof (see
    /// [`crate::speed_ext`]) when there is one. A server that verifies it answers `none`,
    /// which this client then takes though it did not offer it; one that does not chooses
    /// from the offer as usual.
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start_proving(
        psk: &[u8; 32],
        policy: &CipherPolicy,
        tls_proof: Option<[u8; 32]>,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        // `none` is never offered beside a proof: only the proof may make it the choice,
        // so a `none` answer always means the server verified it.
        let offered: Vec<CipherSuite> = policy
            .suites
            .iter()
            .copied()
            .filter(|&suite| tls_proof.is_none() || suite != CipherSuite::None)
            .take(MAX_EXT_ENTRIES)
            .collect();
        let speeds: Vec<SuiteSpeed> = match policy.choice {
            CipherChoice::Fastest => policy
                .speeds
                .iter()
                .copied()
                .take(MAX_EXT_ENTRIES)
                .collect(),
            CipherChoice::Ordered => Vec::new(),
        };
        let mut init = crate::message::encode(&ClientInit {
            version: PROTOCOL_VERSION,
            ciphers: offered.iter().copied().filter(|s| s.is_v1()).collect(),
        });
        init.extend_from_slice(
            &ClientExt {
                choice: policy.choice,
                offer: offered.clone(),
                speeds: speeds.clone(),
                tls_proof,
            }
            .encode(),
        );
        let (mut handshake, frame) = Self::begin(psk, &init, PROTOCOL_VERSION, offered, speeds)?;
        handshake.proved = tls_proof.is_some();
        Ok((handshake, frame))
    }

    /// Starts a handshake the way clients of the first protocol version did: version 1,
    /// `ciphers` in preference order and no extension, so the server follows that order
    /// and expects a v1 `Hello`. Kept for tests and tools that play an older client;
    /// `ciphers` must be v1 suites for an older server to decode them.
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start(
        psk: &[u8; 32],
        ciphers: &[CipherSuite],
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        Self::start_version(psk, ciphers, 1)
    }

    /// [`ClientHandshake::start`] claiming protocol `version` (tests of other versions).
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start_version(
        psk: &[u8; 32],
        ciphers: &[CipherSuite],
        version: u16,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        let init = crate::message::encode(&ClientInit {
            version,
            ciphers: ciphers.to_vec(),
        });
        Self::begin(psk, &init, version, ciphers.to_vec(), Vec::new())
    }

    fn begin(
        psk: &[u8; 32],
        init: &[u8],
        version: u16,
        offered: Vec<CipherSuite>,
        speeds: Vec<SuiteSpeed>,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        let mut state = noise_builder(psk)?
            .build_initiator()
            .map_err(|e| HandshakeError::Internal(e.to_string()))?;
        let mut body = vec![0u8; MAX_PREAMBLE_LEN];
        body[0] = KIND_CONTROL;
        let n = state
            .write_message(init, &mut body[1..])
            .map_err(|e| HandshakeError::Internal(e.to_string()))?;
        body.truncate(1 + n);
        let handshake = ClientHandshake {
            state,
            version,
            offered,
            speeds,
            proved: false,
        };
        Ok((handshake, frame(&body)))
    }

    /// Handles the server's reply frame body (after its length prefix).
    ///
    /// # Errors
    /// [`HandshakeError::Unauthenticated`] when the reply does not decrypt (the server has a
    /// different PSK — in practice servers stay silent instead), [`HandshakeError::Refused`]
    /// when the server declined, [`HandshakeError::Malformed`] otherwise (including a
    /// cipher that was not offered and a malformed extension).
    pub fn handle_reply(mut self, reply: &[u8]) -> Result<Established, HandshakeError> {
        let mut payload = vec![0u8; MAX_PREAMBLE_LEN];
        let n = self
            .state
            .read_message(reply, &mut payload)
            .map_err(|_| HandshakeError::Unauthenticated)?;
        let (init, rest): (ServerInit, &[u8]) =
            postcard::take_from_bytes(&payload[..n]).map_err(|_| HandshakeError::Malformed)?;
        match init {
            ServerInit::Accept { cipher, session_id } => {
                let tls_bound = self.proved && cipher == CipherSuite::None;
                if !self.offered.contains(&cipher) && !tls_bound {
                    return Err(HandshakeError::Malformed);
                }
                // An older server sends no extension: it followed our order.
                let ext = match rest {
                    [] => None,
                    bytes => Some(AcceptExt::decode(bytes).map_err(|_| HandshakeError::Malformed)?),
                };
                let negotiation = Negotiation {
                    decided_by: ext.as_ref().map_or(CipherChoice::Ordered, |e| e.decided_by),
                    client_speeds: self.speeds,
                    server_speeds: ext.map(|e| e.speeds).unwrap_or_default(),
                };
                established(
                    &mut self.state,
                    self.version,
                    cipher,
                    session_id,
                    negotiation,
                    tls_bound,
                )
            }
            ServerInit::Refuse(refusal) => Err(HandshakeError::Refused(refusal)),
        }
    }
}

/// Outcome of the server's half of the handshake for an authenticated client.
#[derive(Debug)]
pub struct ServerHandshakeOutcome {
    /// The reply frame to send (length prefix included), accept or refuse.
    pub reply: Vec<u8>,
    /// The established session, or why the client was refused.
    pub result: Result<Established, Refusal>,
}

/// The server's half: reads Noise message 1 and answers.
///
/// `policy` is the server's cipher list, `cipher_choice` and figures ([`cipher::choose`]
/// decides); `session_id` the id to assign if accepted.
///
/// # Errors
/// [`HandshakeError::Unauthenticated`] for a wrong PSK or garbage (send nothing back),
/// [`HandshakeError::Malformed`] for an authenticated but undecodable payload (a malformed
/// extension included).
pub fn server_handshake(
    psk: &[u8; 32],
    message1: &[u8],
    policy: &CipherPolicy,
    session_id: SessionId,
) -> Result<ServerHandshakeOutcome, HandshakeError> {
    server_handshake_bound(psk, message1, policy, session_id, |_| false)
}

/// [`server_handshake`] on a connection inside TLS (`wss`): `proof_matches` checks a
/// client's TLS proof against this side's TLS session. When it does, the TLS is end to end
/// and the answer is `none` whatever the policy, as on `tls` ([`Established::tls_bound`]).
///
/// # Errors
/// As [`server_handshake`].
pub fn server_handshake_bound(
    psk: &[u8; 32],
    message1: &[u8],
    policy: &CipherPolicy,
    session_id: SessionId,
    proof_matches: impl FnOnce(&[u8; 32]) -> bool,
) -> Result<ServerHandshakeOutcome, HandshakeError> {
    let mut state = noise_builder(psk)?
        .build_responder()
        .map_err(|e| HandshakeError::Internal(e.to_string()))?;
    let mut payload = vec![0u8; MAX_PREAMBLE_LEN];
    let n = state
        .read_message(message1, &mut payload)
        .map_err(|_| HandshakeError::Unauthenticated)?;
    let (init, rest): (ClientInit, &[u8]) =
        postcard::take_from_bytes(&payload[..n]).map_err(|_| HandshakeError::Malformed)?;
    if init.ciphers.len() > 16 {
        return Err(HandshakeError::Malformed);
    }
    // A client of the first version sends no extension and gets exactly the v1 answer.
    let ext = match rest {
        [] => None,
        bytes => Some(ClientExt::decode(bytes).map_err(|_| HandshakeError::Malformed)?),
    };
    let (offered, client_speeds) = match &ext {
        Some(ext) => (
            &ext.offer[..],
            (ext.choice == CipherChoice::Fastest).then_some(&ext.speeds[..]),
        ),
        None => (&init.ciphers[..], None),
    };
    let tls_bound = ext
        .as_ref()
        .and_then(|ext| ext.tls_proof.as_ref())
        .is_some_and(proof_matches);
    let decision = if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&init.version) {
        Err(Refusal::Version {
            server: PROTOCOL_VERSION,
        })
    } else if tls_bound {
        Ok(cipher::Choice {
            suite: CipherSuite::None,
            by: policy.choice,
        })
    } else {
        cipher::choose(offered, client_speeds, policy).ok_or_else(|| Refusal::NoCommonCipher {
            // An older client could not decode a suite it does not know, and would see a
            // malformed reply instead of this refusal.
            server_allows: policy
                .suites
                .iter()
                .copied()
                .filter(|suite| ext.is_some() || suite.is_v1())
                .collect(),
        })
    };
    let server_speeds: Vec<SuiteSpeed> = policy
        .speeds
        .iter()
        .copied()
        .take(MAX_EXT_ENTRIES)
        .collect();
    let mut server_init = crate::message::encode(&match &decision {
        Ok(choice) => ServerInit::Accept {
            cipher: choice.suite,
            session_id,
        },
        Err(refusal) => ServerInit::Refuse(refusal.clone()),
    });
    if let (Ok(choice), Some(_)) = (&decision, &ext) {
        server_init.extend_from_slice(
            &AcceptExt {
                decided_by: choice.by,
                speeds: server_speeds.clone(),
            }
            .encode(),
        );
    }
    let mut body = vec![0u8; MAX_PREAMBLE_LEN];
    let n = state
        .write_message(&server_init, &mut body)
        .map_err(|e| HandshakeError::Internal(e.to_string()))?;
    let reply = frame(&body[..n]);
    let result = match decision {
        Ok(choice) => {
            let negotiation = Negotiation {
                decided_by: choice.by,
                client_speeds: client_speeds
                    .map(<[SuiteSpeed]>::to_vec)
                    .unwrap_or_default(),
                server_speeds,
            };
            Ok(established(
                &mut state,
                init.version,
                choice.suite,
                session_id,
                negotiation,
                tls_bound,
            )?)
        }
        Err(refusal) => Err(refusal),
    };
    Ok(ServerHandshakeOutcome { reply, result })
}

/// A data channel's opening: `session_id || client_nonce || mac`, where
/// `mac = HMAC-SHA256(channel auth key, "warren data hello" || session_id || client_nonce)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataHello {
    /// The session this channel joins.
    pub session_id: SessionId,
    /// Fresh random bytes from the client.
    pub client_nonce: [u8; NONCE_LEN],
    /// Proof of membership.
    pub mac: [u8; MAC_LEN],
}

impl DataHello {
    /// Encoded size (without kind and length prefix).
    pub const LEN: usize = SESSION_ID_LEN + NONCE_LEN + MAC_LEN;

    /// The complete preamble frame for this hello (kind [`KIND_DATA`]).
    pub fn to_frame(&self) -> Vec<u8> {
        self.to_frame_of_kind(KIND_DATA)
    }

    /// The complete preamble frame for this hello with preamble kind `kind`
    /// ([`KIND_DATA`] or [`KIND_DATA_OPEN`]).
    pub fn to_frame_of_kind(&self, kind: u8) -> Vec<u8> {
        let mut body = Vec::with_capacity(1 + Self::LEN);
        body.push(kind);
        body.extend_from_slice(&self.session_id);
        body.extend_from_slice(&self.client_nonce);
        body.extend_from_slice(&self.mac);
        frame(&body)
    }

    /// Parses the bytes after the kind byte.
    ///
    /// # Errors
    /// [`HandshakeError::Malformed`] unless exactly [`DataHello::LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, HandshakeError> {
        if bytes.len() != Self::LEN {
            return Err(HandshakeError::Malformed);
        }
        let (session_id, rest) = bytes.split_at(SESSION_ID_LEN);
        let (client_nonce, mac) = rest.split_at(NONCE_LEN);
        Ok(DataHello {
            session_id: session_id
                .try_into()
                .map_err(|_| HandshakeError::Malformed)?,
            client_nonce: client_nonce
                .try_into()
                .map_err(|_| HandshakeError::Malformed)?,
            mac: mac.try_into().map_err(|_| HandshakeError::Malformed)?,
        })
    }
}

/// The server's answer to a valid [`DataHello`]: `server_nonce || mac`, where
/// `mac = HMAC(channel auth key, "warren data accept" || session_id || client_nonce || server_nonce)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataAccept {
    /// Fresh random bytes from the server.
    pub server_nonce: [u8; NONCE_LEN],
    /// Proof that the server knows the session.
    pub mac: [u8; MAC_LEN],
}

impl DataAccept {
    /// Encoded size (without length prefix).
    pub const LEN: usize = NONCE_LEN + MAC_LEN;

    /// The complete frame for this accept.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(Self::LEN);
        body.extend_from_slice(&self.server_nonce);
        body.extend_from_slice(&self.mac);
        frame(&body)
    }

    /// Parses a frame body.
    ///
    /// # Errors
    /// [`HandshakeError::Malformed`] unless exactly [`DataAccept::LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, HandshakeError> {
        if bytes.len() != Self::LEN {
            return Err(HandshakeError::Malformed);
        }
        let (nonce, mac) = bytes.split_at(NONCE_LEN);
        Ok(DataAccept {
            server_nonce: nonce.try_into().map_err(|_| HandshakeError::Malformed)?,
            mac: mac.try_into().map_err(|_| HandshakeError::Malformed)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSK: [u8; 32] = [7; 32];
    const SID: SessionId = [9; 16];

    fn ordered(suites: &[CipherSuite]) -> CipherPolicy {
        CipherPolicy::ordered(suites.to_vec())
    }

    fn speed(suite: CipherSuite, mbps: u32) -> SuiteSpeed {
        SuiteSpeed {
            suite,
            seal_mbps: mbps,
            open_mbps: mbps,
        }
    }

    /// The payload of message 1 as a server sees it after decryption.
    fn decrypt_message1(m1: &[u8]) -> Vec<u8> {
        let mut responder = noise_builder(&PSK).unwrap().build_responder().unwrap();
        let mut payload = vec![0u8; MAX_PREAMBLE_LEN];
        let n = responder.read_message(m1, &mut payload).unwrap();
        payload.truncate(n);
        payload
    }

    /// Message 1 carrying `payload` as is, for payloads our own encoder would never make.
    fn message1_with(payload: &[u8]) -> Vec<u8> {
        let mut initiator = noise_builder(&PSK).unwrap().build_initiator().unwrap();
        let mut m1 = vec![0u8; MAX_PREAMBLE_LEN];
        let n = initiator.write_message(payload, &mut m1).unwrap();
        m1.truncate(n);
        m1
    }

    fn control(preamble: &[u8]) -> &[u8] {
        let Preamble::Control(m1) = parse_preamble(body_of(preamble)).unwrap() else {
            panic!("expected control preamble")
        };
        m1
    }

    fn body_of(frame: &[u8]) -> &[u8] {
        let len = frame_len([frame[0], frame[1]]).unwrap();
        assert_eq!(frame.len(), 2 + len);
        &frame[2..]
    }

    #[test]
    fn full_handshake_agrees_on_keys() {
        let offer = [CipherSuite::ChaCha20Poly1305, CipherSuite::Aes256Gcm];
        let (client, preamble) = ClientHandshake::start(&PSK, &offer).unwrap();
        let Preamble::Control(m1) = parse_preamble(body_of(&preamble)).unwrap() else {
            panic!("expected control preamble")
        };
        let out = server_handshake(
            &PSK,
            m1,
            &ordered(&[CipherSuite::Aes256Gcm, CipherSuite::ChaCha20Poly1305]),
            SID,
        )
        .unwrap();
        let server = out.result.unwrap();
        let client = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!(client, server);
        assert_eq!(client.cipher, CipherSuite::ChaCha20Poly1305);
        assert_eq!(client.session_id, SID);
        assert_ne!(client.split.0, client.split.1);
    }

    #[test]
    fn wrong_psk_is_unauthenticated_on_the_first_message() {
        let (_, preamble) = ClientHandshake::start(&[1; 32], &[CipherSuite::Aes128Gcm]).unwrap();
        let Preamble::Control(m1) = parse_preamble(body_of(&preamble)).unwrap() else {
            panic!()
        };
        let err = server_handshake(&PSK, m1, &ordered(&[CipherSuite::Aes128Gcm]), SID).unwrap_err();
        assert_eq!(err, HandshakeError::Unauthenticated);
    }

    #[test]
    fn no_common_cipher_is_refused_with_the_servers_list() {
        let (client, preamble) = ClientHandshake::start(&PSK, &[CipherSuite::None]).unwrap();
        let Preamble::Control(m1) = parse_preamble(body_of(&preamble)).unwrap() else {
            panic!()
        };
        let out = server_handshake(&PSK, m1, &ordered(&[CipherSuite::Aes128Gcm]), SID).unwrap();
        assert!(matches!(out.result, Err(Refusal::NoCommonCipher { .. })));
        let err = client.handle_reply(body_of(&out.reply)).unwrap_err();
        assert!(err.to_string().contains("aes-128-gcm"), "{err}");
    }

    #[test]
    fn every_flipped_byte_of_message_one_is_rejected() {
        let (_, preamble) = ClientHandshake::start(&PSK, &[CipherSuite::Aes128Gcm]).unwrap();
        let Preamble::Control(m1) = parse_preamble(body_of(&preamble)).unwrap() else {
            panic!()
        };
        for i in 0..m1.len() {
            let mut bad = m1.to_vec();
            bad[i] ^= 0x01;
            assert!(
                server_handshake(&PSK, &bad, &ordered(&[CipherSuite::Aes128Gcm]), SID).is_err()
            );
        }
        for cut in 0..m1.len() {
            assert!(
                server_handshake(&PSK, &m1[..cut], &ordered(&[CipherSuite::Aes128Gcm]), SID)
                    .is_err()
            );
        }
    }

    #[test]
    fn frame_length_bounds() {
        assert!(frame_len([0, 0]).is_err());
        assert!(frame_len([0xff, 0xff]).is_err());
        assert_eq!(frame_len([0, 5]), Ok(5));
    }

    #[test]
    fn data_hello_round_trip() {
        let hello = DataHello {
            session_id: SID,
            client_nonce: [1; 32],
            mac: [2; 32],
        };
        let frame = hello.to_frame();
        assert_eq!(
            parse_preamble(body_of(&frame)).unwrap(),
            Preamble::Data(hello.clone())
        );
        assert!(parse_preamble(&[KIND_DATA, 1, 2]).is_err());
        let open = hello.to_frame_of_kind(KIND_DATA_OPEN);
        assert_eq!(
            parse_preamble(body_of(&open)),
            Ok(Preamble::DataOpen(hello))
        );
        assert!(parse_preamble(&[0x00]).is_err());
        assert!(parse_preamble(&[]).is_err());
        let accept = DataAccept {
            server_nonce: [3; 32],
            mac: [4; 32],
        };
        assert_eq!(
            DataAccept::from_bytes(body_of(&accept.to_frame())).unwrap(),
            accept
        );
    }

    #[test]
    fn a_matching_tls_proof_makes_none_the_choice_and_both_sides_know_it() {
        use CipherSuite::{Aegis128L, Aes128Gcm};
        let policy = ordered(&[Aes128Gcm, Aegis128L]);
        let proof = [5u8; 32];
        // The server's TLS session gives the same proof: end to end, `none`.
        let (client, preamble) =
            ClientHandshake::start_proving(&PSK, &policy, Some(proof)).unwrap();
        let out = server_handshake_bound(&PSK, control(&preamble), &policy, SID, |p| *p == proof)
            .unwrap();
        let server = out.result.unwrap();
        let client = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!(
            (server.cipher, client.cipher),
            (CipherSuite::None, CipherSuite::None)
        );
        assert!(server.tls_bound && client.tls_bound);
        assert_eq!(server.split, client.split);

        // Something ended the TLS in between (a CDN): the proof does not match, the
        // offer decides and nobody is bound.
        let (client, preamble) =
            ClientHandshake::start_proving(&PSK, &policy, Some(proof)).unwrap();
        let out =
            server_handshake_bound(&PSK, control(&preamble), &policy, SID, |_| false).unwrap();
        let server = out.result.unwrap();
        let client = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!((server.cipher, client.cipher), (Aes128Gcm, Aes128Gcm));
        assert!(!server.tls_bound && !client.tls_bound);

        // A server that allows `none` for `tcp` clients still never picks it from the
        // offer of a client that proves: only the proof can make it the choice.
        let lenient = ordered(&[CipherSuite::None, Aes128Gcm]);
        let offers_none = ordered(&[CipherSuite::None, Aes128Gcm]);
        let (client, preamble) =
            ClientHandshake::start_proving(&PSK, &offers_none, Some(proof)).unwrap();
        let out = server_handshake(&PSK, control(&preamble), &lenient, SID).unwrap();
        assert_eq!(out.result.unwrap().cipher, Aes128Gcm);
        assert_eq!(
            client.handle_reply(body_of(&out.reply)).unwrap().cipher,
            Aes128Gcm
        );

        // No proof, nothing to match, whatever the server's side would say.
        let (client, preamble) = ClientHandshake::start_with(&PSK, &policy).unwrap();
        let out = server_handshake_bound(&PSK, control(&preamble), &policy, SID, |_| true).unwrap();
        assert!(!out.result.unwrap().tls_bound);
        assert!(!client.handle_reply(body_of(&out.reply)).unwrap().tls_bound);
    }

    #[test]
    fn fastest_on_both_sides_chooses_by_figures_and_both_know_them() {
        use CipherSuite::{Aegis128L, Aegis128X2, Aes128Gcm};
        let client_policy = CipherPolicy {
            suites: vec![Aes128Gcm, Aegis128L, Aegis128X2],
            choice: CipherChoice::Fastest,
            speeds: vec![
                speed(Aes128Gcm, 2_000),
                speed(Aegis128L, 9_000),
                speed(Aegis128X2, 12_000),
            ],
        };
        let server_policy = CipherPolicy {
            suites: vec![Aes128Gcm, Aegis128X2, Aegis128L],
            choice: CipherChoice::Fastest,
            speeds: vec![
                speed(Aes128Gcm, 20_000),
                speed(Aegis128L, 9_500),
                speed(Aegis128X2, 11_000),
            ],
        };
        let (client, preamble) = ClientHandshake::start_with(&PSK, &client_policy).unwrap();
        let out = server_handshake(&PSK, control(&preamble), &server_policy, SID).unwrap();
        let server = out.result.unwrap();
        let client = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!(client, server);
        assert_eq!(server.cipher, Aegis128X2);
        assert_eq!(
            server.negotiation,
            Negotiation {
                decided_by: CipherChoice::Fastest,
                client_speeds: client_policy.speeds.clone(),
                server_speeds: server_policy.speeds.clone(),
            }
        );
        // The client asks for its order: figures are neither sent nor used.
        let client_policy = CipherPolicy {
            choice: CipherChoice::Ordered,
            ..client_policy
        };
        let (client, preamble) = ClientHandshake::start_with(&PSK, &client_policy).unwrap();
        let out = server_handshake(&PSK, control(&preamble), &server_policy, SID).unwrap();
        let client = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!(client.cipher, Aes128Gcm);
        assert_eq!(client.negotiation.decided_by, CipherChoice::Ordered);
        assert!(client.negotiation.client_speeds.is_empty());
        assert_eq!(client.negotiation.server_speeds, server_policy.speeds);
    }

    #[test]
    fn an_old_client_init_still_decodes_and_gets_the_v1_answer() {
        // Exactly what a client of the first version sends: the v1 struct, nothing after.
        let old = crate::message::encode(&ClientInit {
            version: 1,
            ciphers: vec![CipherSuite::ChaCha20Poly1305, CipherSuite::Aes128Gcm],
        });
        let (_, legacy) = ClientHandshake::start(
            &PSK,
            &[CipherSuite::ChaCha20Poly1305, CipherSuite::Aes128Gcm],
        )
        .unwrap();
        assert_eq!(decrypt_message1(control(&legacy)), old);
        let server_policy = CipherPolicy {
            suites: vec![
                CipherSuite::Aegis128L,
                CipherSuite::Aes128Gcm,
                CipherSuite::ChaCha20Poly1305,
            ],
            choice: CipherChoice::Fastest,
            speeds: vec![
                speed(CipherSuite::Aes128Gcm, 9_000),
                speed(CipherSuite::ChaCha20Poly1305, 2_000),
            ],
        };
        let out = server_handshake(&PSK, &message1_with(&old), &server_policy, SID).unwrap();
        let server = out.result.unwrap();
        // The client's order decides, as before figures existed.
        assert_eq!(server.cipher, CipherSuite::ChaCha20Poly1305);
        assert_eq!(server.negotiation.decided_by, CipherChoice::Ordered);
        // The reply is byte for byte the v1 one: no extension for an old client.
        let mut initiator = noise_builder(&PSK).unwrap().build_initiator().unwrap();
        let mut m1 = vec![0u8; MAX_PREAMBLE_LEN];
        let n = initiator.write_message(&old, &mut m1).unwrap();
        let out = server_handshake(&PSK, &m1[..n], &server_policy, SID).unwrap();
        let mut reply = vec![0u8; MAX_PREAMBLE_LEN];
        let n = initiator
            .read_message(body_of(&out.reply), &mut reply)
            .unwrap();
        assert_eq!(
            reply[..n],
            crate::message::encode(&ServerInit::Accept {
                cipher: CipherSuite::ChaCha20Poly1305,
                session_id: SID
            })[..]
        );
        // A refusal lists only suites an old client can decode.
        let only_new = CipherPolicy::ordered(vec![CipherSuite::Aegis128X2, CipherSuite::Aegis256]);
        let out = server_handshake(&PSK, &message1_with(&old), &only_new, SID).unwrap();
        assert_eq!(
            out.result.unwrap_err(),
            Refusal::NoCommonCipher {
                server_allows: vec![CipherSuite::Aegis256]
            }
        );
    }

    #[test]
    fn a_new_client_init_decodes_on_an_old_style_decoder() {
        let policy = CipherPolicy {
            suites: vec![
                CipherSuite::Aegis128X2,
                CipherSuite::Aegis128L,
                CipherSuite::Aes128Gcm,
            ],
            choice: CipherChoice::Fastest,
            speeds: vec![
                speed(CipherSuite::Aegis128X2, 12_000),
                speed(CipherSuite::Aegis128L, 9_000),
            ],
        };
        let (_, preamble) = ClientHandshake::start_with(&PSK, &policy).unwrap();
        let payload = decrypt_message1(control(&preamble));
        // What a server of the first version does: `from_bytes`, which ignores the rest.
        let seen: ClientInit = postcard::from_bytes(&payload).unwrap();
        let v1 = ClientInit {
            version: PROTOCOL_VERSION,
            // The suite v1 does not know is not in the list it decodes.
            ciphers: vec![CipherSuite::Aegis128L, CipherSuite::Aes128Gcm],
        };
        assert_eq!(seen, v1);
        // The prefix is the v1 encoding, unchanged; the extension follows it.
        let prefix = crate::message::encode(&v1);
        assert_eq!(payload[..prefix.len()], prefix[..]);
        let ext = ClientExt::decode(&payload[prefix.len()..]).unwrap();
        assert_eq!(ext.offer, policy.suites);
        // An old server answers with the v1 accept and no extension: the client takes it
        // as an ordered choice without server figures.
        let (client, preamble) = ClientHandshake::start_with(&PSK, &policy).unwrap();
        let mut responder = noise_builder(&PSK).unwrap().build_responder().unwrap();
        let mut scratch = vec![0u8; MAX_PREAMBLE_LEN];
        responder
            .read_message(control(&preamble), &mut scratch)
            .unwrap();
        let accept = crate::message::encode(&ServerInit::Accept {
            cipher: CipherSuite::Aegis128L,
            session_id: SID,
        });
        let n = responder.write_message(&accept, &mut scratch).unwrap();
        let established = client.handle_reply(&scratch[..n]).unwrap();
        assert_eq!(established.cipher, CipherSuite::Aegis128L);
        assert_eq!(established.negotiation.decided_by, CipherChoice::Ordered);
        assert!(established.negotiation.server_speeds.is_empty());
    }

    #[test]
    fn a_malformed_extension_is_malformed() {
        let mut payload = crate::message::encode(&ClientInit {
            version: PROTOCOL_VERSION,
            ciphers: vec![CipherSuite::Aes128Gcm],
        });
        payload.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        let policy = ordered(&[CipherSuite::Aes128Gcm]);
        assert_eq!(
            server_handshake(&PSK, &message1_with(&payload), &policy, SID).unwrap_err(),
            HandshakeError::Malformed
        );
        payload.truncate(payload.len() - 6);
        payload.push(9); // not a cipher choice
        assert_eq!(
            server_handshake(&PSK, &message1_with(&payload), &policy, SID).unwrap_err(),
            HandshakeError::Malformed
        );
    }

    #[test]
    fn the_client_refuses_a_cipher_it_did_not_offer() {
        let (client, preamble) = ClientHandshake::start(&PSK, &[CipherSuite::Aes128Gcm]).unwrap();
        let mut responder = noise_builder(&PSK).unwrap().build_responder().unwrap();
        let mut scratch = vec![0u8; MAX_PREAMBLE_LEN];
        responder
            .read_message(control(&preamble), &mut scratch)
            .unwrap();
        let accept = crate::message::encode(&ServerInit::Accept {
            cipher: CipherSuite::None,
            session_id: SID,
        });
        let n = responder.write_message(&accept, &mut scratch).unwrap();
        assert_eq!(
            client.handle_reply(&scratch[..n]).unwrap_err(),
            HandshakeError::Malformed
        );
    }

    #[test]
    fn the_largest_offer_and_answer_fit_the_preamble_bound() {
        let every: Vec<CipherSuite> = CipherSuite::ALL.iter().copied().cycle().take(40).collect();
        let worst = |suites: &[CipherSuite]| CipherPolicy {
            suites: suites.to_vec(),
            choice: CipherChoice::Fastest,
            speeds: suites
                .iter()
                .map(|&suite| SuiteSpeed {
                    suite,
                    seal_mbps: u32::MAX,
                    open_mbps: u32::MAX,
                })
                .collect(),
        };
        let (client, preamble) = ClientHandshake::start_with(&PSK, &worst(&every)).unwrap();
        assert!(preamble.len() <= 2 + MAX_PREAMBLE_LEN);
        let out = server_handshake(&PSK, control(&preamble), &worst(&every), SID).unwrap();
        assert!(out.reply.len() <= 2 + MAX_PREAMBLE_LEN);
        assert!(frame_len([out.reply[0], out.reply[1]]).is_ok());
        let established = client.handle_reply(body_of(&out.reply)).unwrap();
        assert_eq!(established.negotiation.server_speeds.len(), MAX_EXT_ENTRIES);
    }
}
