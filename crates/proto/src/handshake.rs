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
//!   `[len: u16][Noise message 2]` whose payload is a [`ServerInit`]. NN is enough: the PSK
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

use crate::cipher::{self, CipherSuite};

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

/// Payload of Noise message 1: what the client speaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInit {
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u16,
    /// Cipher suites for the record layer, most preferred first.
    pub ciphers: Vec<CipherSuite>,
}

/// Payload of Noise message 2: the server's decision.
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
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Established")
            .field("cipher", &self.cipher)
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
    })
}

/// The client's half of the control-channel handshake.
pub struct ClientHandshake {
    state: snow::HandshakeState,
    version: u16,
}

impl ClientHandshake {
    /// Starts a handshake; returns the state and the complete preamble frame to send.
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start(
        psk: &[u8; 32],
        ciphers: &[CipherSuite],
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        Self::start_version(psk, ciphers, PROTOCOL_VERSION)
    }

    /// [`ClientHandshake::start`] speaking protocol `version` (tests of older peers).
    ///
    /// # Errors
    /// Only [`HandshakeError::Internal`].
    pub fn start_version(
        psk: &[u8; 32],
        ciphers: &[CipherSuite],
        version: u16,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        let mut state = noise_builder(psk)?
            .build_initiator()
            .map_err(|e| HandshakeError::Internal(e.to_string()))?;
        let init = crate::message::encode(&ClientInit {
            version,
            ciphers: ciphers.to_vec(),
        });
        let mut body = vec![0u8; MAX_PREAMBLE_LEN];
        body[0] = KIND_CONTROL;
        let n = state
            .write_message(&init, &mut body[1..])
            .map_err(|e| HandshakeError::Internal(e.to_string()))?;
        body.truncate(1 + n);
        Ok((ClientHandshake { state, version }, frame(&body)))
    }

    /// Handles the server's reply frame body (after its length prefix).
    ///
    /// # Errors
    /// [`HandshakeError::Unauthenticated`] when the reply does not decrypt (the server has a
    /// different PSK — in practice servers stay silent instead), [`HandshakeError::Refused`]
    /// when the server declined, [`HandshakeError::Malformed`] otherwise.
    pub fn handle_reply(mut self, reply: &[u8]) -> Result<Established, HandshakeError> {
        let mut payload = vec![0u8; MAX_PREAMBLE_LEN];
        let n = self
            .state
            .read_message(reply, &mut payload)
            .map_err(|_| HandshakeError::Unauthenticated)?;
        let init: ServerInit =
            postcard::from_bytes(&payload[..n]).map_err(|_| HandshakeError::Malformed)?;
        match init {
            ServerInit::Accept { cipher, session_id } => {
                established(&mut self.state, self.version, cipher, session_id)
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
/// `allowed` is the server's cipher list; `session_id` the id to assign if accepted.
///
/// # Errors
/// [`HandshakeError::Unauthenticated`] for a wrong PSK or garbage (send nothing back),
/// [`HandshakeError::Malformed`] for an authenticated but undecodable payload.
pub fn server_handshake(
    psk: &[u8; 32],
    message1: &[u8],
    allowed: &[CipherSuite],
    session_id: SessionId,
) -> Result<ServerHandshakeOutcome, HandshakeError> {
    let mut state = noise_builder(psk)?
        .build_responder()
        .map_err(|e| HandshakeError::Internal(e.to_string()))?;
    let mut payload = vec![0u8; MAX_PREAMBLE_LEN];
    let n = state
        .read_message(message1, &mut payload)
        .map_err(|_| HandshakeError::Unauthenticated)?;
    let init: ClientInit =
        postcard::from_bytes(&payload[..n]).map_err(|_| HandshakeError::Malformed)?;
    if init.ciphers.len() > 16 {
        return Err(HandshakeError::Malformed);
    }
    let decision = if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&init.version) {
        Err(Refusal::Version {
            server: PROTOCOL_VERSION,
        })
    } else {
        cipher::negotiate(&init.ciphers, allowed).ok_or_else(|| Refusal::NoCommonCipher {
            server_allows: allowed.to_vec(),
        })
    };
    let server_init = match &decision {
        Ok(cipher) => ServerInit::Accept {
            cipher: *cipher,
            session_id,
        },
        Err(refusal) => ServerInit::Refuse(refusal.clone()),
    };
    let mut body = vec![0u8; MAX_PREAMBLE_LEN];
    let n = state
        .write_message(&crate::message::encode(&server_init), &mut body)
        .map_err(|e| HandshakeError::Internal(e.to_string()))?;
    let reply = frame(&body[..n]);
    let result = match decision {
        Ok(cipher) => Ok(established(&mut state, init.version, cipher, session_id)?),
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
            &[CipherSuite::Aes256Gcm, CipherSuite::ChaCha20Poly1305],
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
        let err = server_handshake(&PSK, m1, &[CipherSuite::Aes128Gcm], SID).unwrap_err();
        assert_eq!(err, HandshakeError::Unauthenticated);
    }

    #[test]
    fn no_common_cipher_is_refused_with_the_servers_list() {
        let (client, preamble) = ClientHandshake::start(&PSK, &[CipherSuite::None]).unwrap();
        let Preamble::Control(m1) = parse_preamble(body_of(&preamble)).unwrap() else {
            panic!()
        };
        let out = server_handshake(&PSK, m1, &[CipherSuite::Aes128Gcm], SID).unwrap();
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
            assert!(server_handshake(&PSK, &bad, &[CipherSuite::Aes128Gcm], SID).is_err());
        }
        for cut in 0..m1.len() {
            assert!(server_handshake(&PSK, &m1[..cut], &[CipherSuite::Aes128Gcm], SID).is_err());
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
}
