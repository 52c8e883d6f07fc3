//! The key exchange behind a join code: SPAKE2, key confirmation, then each side's
//! certificate fingerprint sealed under the agreed key, as a sans-IO state machine.
//!
//! The server's mailbox relays these messages and sees them all; what it (or anyone else
//! without the code) can do is guess the code once per exchange, and a wrong guess fails
//! the exchange on both sides. What comes out is what the QUIC connection between the
//! peers is then pinned to: the peer's certificate fingerprint (SHA-256 of its
//! SubjectPublicKeyInfo), so neither the server nor a relay can sit in the middle.
//!
//! # Message flow (both sides run the same machine; only their [`Role`] differs)
//!
//! ```text
//! sender                                              receiver
//!   Spake(S || X)            ───────────────────▶
//!                            ◀───────────────────    Spake(S || Y)
//!   (K = SPAKE2 key, both sides)
//!   Confirm(HMAC(k_confirm_sender, transcript))  ───▶
//!                            ◀───  Confirm(HMAC(k_confirm_receiver, transcript))
//!   (each checks the other's tag in constant time; a wrong code stops here, on both
//!    sides, before anything else is sent)
//!   Fingerprint(AEAD(k_seal_sender, fp_sender))  ───▶
//!                            ◀───  Fingerprint(AEAD(k_seal_receiver, fp_receiver))
//!   done: peer fingerprint + relay key
//! ```
//!
//! Each side sends its Spake message at once and its Confirm as soon as the peer's Spake
//! is in; it sends its Fingerprint only after the peer's Confirm checked out. Messages
//! from one side arrive in order (the mailbox keeps order per direction).
//!
//! # Key schedule
//!
//! * SPAKE2 (`spake2` 0.4, Ed25519 group, symmetric mode) with password = the code's
//!   words (`acid-acorn-acre`) and identity = `warren-files/1 nameplate=<n>`, so a run is
//!   bound to its nameplate and protocol. Its output is K (32 bytes).
//! * transcript = `warren-files/1` || nameplate (u32 BE) || sender's Spake message ||
//!   receiver's Spake message (roles, not arrival order, fix the order).
//! * A named P2P service ([`Pake::for_service`]) runs the same exchange with password =
//!   the service's token, identity = `warren-p2p-service/1 service=<name>`, and
//!   `service=<name>` in the transcript where a code has its nameplate.
//! * k_x = HKDF-SHA256(ikm = K, salt = SHA-256(transcript), info = `warren-files/1 ` || x)
//!   for x in `confirm sender`, `confirm receiver`, `seal sender`, `seal receiver`,
//!   `relay`; 32 bytes each.
//! * Confirm tag of role r = HMAC-SHA256(k_confirm_r, transcript). Per-role keys mean a
//!   tag reflected back to its sender does not verify; a Spake message reflected back is
//!   refused outright.
//! * Fingerprint of role r = AES-256-GCM(k_seal_r, nonce = 0, aad = `warren-files/1
//!   fingerprint ` || r, SHA-256(SPKI)). Each key seals exactly one message, so the fixed
//!   nonce is never reused.
//! * The relay key is for the transport: it lets the two legs of a relayed transfer find
//!   each other at the relay without telling the relay the code.
//!
//! # Call order
//!
//! [`Pake::new`], then loop: send everything [`Pake::poll_transmit`] gives, feed each
//! message received to [`Pake::handle_message`], until [`Pake::outcome`] is `Some` or a
//! call returns an error (after which the machine stays failed). No clock: the caller
//! times the exchange out.

use std::collections::VecDeque;
use std::fmt;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::digest;
use spake2::{Ed25519Group, Identity, Password, Spake2};
use subtle::ConstantTimeEq;
use warren_proto::files::PakeMessage;
use warren_proto::files::pake::{
    FINGERPRINT_LEN, PakeMessageError, SEALED_FINGERPRINT_LEN, SPAKE_LEN,
};

use super::code::Code;
use crate::crypto::kdf::{KdfError, hkdf_expand, hmac_sha256, verify_hmac_sha256};

/// Protocol label; also the ALPN of the file protocol.
pub const LABEL: &[u8] = b"warren-files/1";

/// Which end of the transfer a machine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `warren send`.
    Sender,
    /// `warren receive`.
    Receiver,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Sender => b"sender",
            Role::Receiver => b"receiver",
        }
    }

    fn peer(self) -> Role {
        match self {
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        }
    }
}

/// SHA-256 of a certificate's SubjectPublicKeyInfo: what QUIC pins the peer to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertFingerprint([u8; FINGERPRINT_LEN]);

impl CertFingerprint {
    /// The fingerprint of a DER-encoded SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> CertFingerprint {
        let d = digest::digest(&digest::SHA256, spki_der);
        let mut out = [0u8; FINGERPRINT_LEN];
        out.copy_from_slice(d.as_ref());
        CertFingerprint(out)
    }

    /// Wraps raw fingerprint bytes.
    pub fn from_bytes(bytes: [u8; FINGERPRINT_LEN]) -> CertFingerprint {
        CertFingerprint(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; FINGERPRINT_LEN] {
        &self.0
    }

    /// Whether `other` is the same fingerprint, compared in constant time.
    pub fn matches(&self, other: &CertFingerprint) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// All 32 bytes as lowercase hex: the form `peer = "..."` pins.
    pub fn hex(&self) -> String {
        crate::crypto::hex(&self.0)
    }

    /// Reads the [`CertFingerprint::hex`] form (colons allowed).
    ///
    /// # Errors
    ///
    /// What form is expected.
    pub fn parse(text: &str) -> Result<CertFingerprint, String> {
        crate::transport::quic::certs::parse_sha256_pin(text)
            .map(CertFingerprint)
            .map_err(|_| format!("{text:?} is not a P2P identity: give its 64 hex digits, as `warren p2p identity` prints them"))
    }

    /// A short form for people to compare (`--confirm`): the first 8 bytes as hex in
    /// groups of four, `1a2b-3c4d-5e6f-7a8b`.
    pub fn short(&self) -> String {
        self.0[..8]
            .chunks(2)
            .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
            .collect::<Vec<_>>()
            .join("-")
    }
}

impl fmt::Debug for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertFingerprint({})", self.short())
    }
}

/// A 32-byte derived key (the relay's, the checks'), with a masked `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct DerivedKey([u8; 32]);

impl DerivedKey {
    /// The key bytes.
    pub fn expose(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DerivedKey(****)")
    }
}

/// What a successful exchange yields.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The peer's certificate fingerprint: pin the QUIC handshake to it.
    pub peer_fingerprint: CertFingerprint,
    /// Key for the relay of last resort.
    pub relay_key: DerivedKey,
    /// Key of the connectivity checks (`p2p::net::CheckKey::new(check_key.expose())`):
    /// a stranger cannot make either side pick its address.
    pub check_key: DerivedKey,
}

impl Outcome {
    /// Checks the certificate the peer presented in the QUIC handshake (its DER
    /// SubjectPublicKeyInfo) against the fingerprint it sent under the PAKE key.
    ///
    /// # Errors
    ///
    /// [`PakeError::CertificateMismatch`] if they differ.
    pub fn verify_peer_spki(&self, spki_der: &[u8]) -> Result<(), PakeError> {
        if self
            .peer_fingerprint
            .matches(&CertFingerprint::of_spki(spki_der))
        {
            Ok(())
        } else {
            Err(PakeError::CertificateMismatch)
        }
    }
}

/// Why the exchange failed. Every failure is final: start again with a new code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PakeError {
    /// A message that cannot be read.
    #[error(
        "the other side sent a malformed key-exchange message ({0}): start again with a new code"
    )]
    Message(#[from] PakeMessageError),
    /// A message out of turn.
    #[error(
        "the other side sent a {got} message while this side was waiting for {expected}: the peer is broken or someone is tampering; start again with a new code"
    )]
    Unexpected {
        /// What arrived.
        got: &'static str,
        /// What was awaited.
        expected: &'static str,
    },
    /// Our own Spake message came back.
    #[error(
        "this side's key-exchange message came back to it: someone is tampering with the exchange; start again with a new code"
    )]
    Reflected,
    /// SPAKE2 refused the peer's message.
    #[error("the other side's key-exchange message is invalid ({0}): start again with a new code")]
    Spake(String),
    /// Key confirmation failed: the codes differ (or a message was changed).
    #[error(
        "the code does not match the other side's: one of you mistyped it, or someone tried to guess it. Nothing was sent; start again with a new code"
    )]
    WrongCode,
    /// The sealed fingerprint did not open.
    #[error(
        "the other side's certificate fingerprint failed its integrity check: someone is tampering with the exchange; start again with a new code"
    )]
    Tampered,
    /// The QUIC peer's certificate is not the one exchanged.
    #[error(
        "the peer's certificate is not the one agreed in the key exchange: someone is in the middle; start again with a new code"
    )]
    CertificateMismatch,
    /// The machine failed earlier.
    #[error("the key exchange already failed: start again with a new code")]
    AlreadyFailed,
    /// A message after the exchange finished.
    #[error(
        "the other side sent a key-exchange message after the exchange finished: the peer is broken or someone is tampering"
    )]
    AlreadyDone,
    /// Key derivation failed (not expected).
    #[error("key derivation failed: {0}")]
    Kdf(#[from] KdfError),
}

/// The keys derived from the SPAKE2 output.
struct Keys {
    transcript: Vec<u8>,
    confirm_sender: [u8; 32],
    confirm_receiver: [u8; 32],
    seal_sender: [u8; 32],
    seal_receiver: [u8; 32],
    relay: [u8; 32],
    check: [u8; 32],
}

impl Keys {
    fn confirm(&self, role: Role) -> &[u8; 32] {
        match role {
            Role::Sender => &self.confirm_sender,
            Role::Receiver => &self.confirm_receiver,
        }
    }

    fn seal(&self, role: Role) -> &[u8; 32] {
        match role {
            Role::Sender => &self.seal_sender,
            Role::Receiver => &self.seal_receiver,
        }
    }
}

enum State {
    AwaitSpake {
        spake: Spake2<Ed25519Group>,
        mine: [u8; SPAKE_LEN],
    },
    AwaitConfirm(Box<Keys>),
    AwaitFingerprint(Box<Keys>),
    Done,
    Failed,
}

impl State {
    fn expected(&self) -> &'static str {
        match self {
            State::AwaitSpake { .. } => "Spake",
            State::AwaitConfirm(_) => "Confirm",
            State::AwaitFingerprint(_) => "Fingerprint",
            State::Done | State::Failed => "nothing",
        }
    }
}

/// One side of the key exchange (see the module docs for the flow and call order).
pub struct Pake {
    role: Role,
    /// What binds the transcript to this meeting: the nameplate's four bytes (a code), or
    /// `service=NAME` (a named P2P service).
    context: Vec<u8>,
    fingerprint: CertFingerprint,
    state: State,
    outbox: VecDeque<Vec<u8>>,
    outcome: Option<Outcome>,
}

impl fmt::Debug for Pake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pake")
            .field("role", &self.role)
            .field("context", &String::from_utf8_lossy(&self.context))
            .field("state", &self.state.expected())
            .finish_non_exhaustive()
    }
}

impl Pake {
    /// Starts the exchange for `code`, offering `fingerprint` (this side's QUIC
    /// certificate). `seed` must be 32 fresh random bytes: SPAKE2's secret scalar is drawn
    /// from it. Queues the first message.
    pub fn new(role: Role, code: &Code, fingerprint: CertFingerprint, seed: [u8; 32]) -> Pake {
        let nameplate = code.nameplate();
        Pake::start(
            role,
            &format!("warren-files/1 nameplate={nameplate}"),
            nameplate.get().to_be_bytes().to_vec(),
            code.password().as_bytes(),
            fingerprint,
            seed,
        )
    }

    /// Starts the exchange for the named P2P service `service`, whose token both sides
    /// hold (the password: never sent, and a side without it fails the confirmation).
    pub fn for_service(
        role: Role,
        service: &str,
        token: &[u8],
        fingerprint: CertFingerprint,
        seed: [u8; 32],
    ) -> Pake {
        Pake::start(
            role,
            &format!("warren-p2p-service/1 service={service}"),
            format!("service={service}").into_bytes(),
            token,
            fingerprint,
            seed,
        )
    }

    fn start(
        role: Role,
        identity: &str,
        context: Vec<u8>,
        password: &[u8],
        fingerprint: CertFingerprint,
        seed: [u8; 32],
    ) -> Pake {
        let (spake, msg) = Spake2::<Ed25519Group>::start_symmetric_with_rng(
            &Password::new(password),
            &Identity::new(identity.as_bytes()),
            SeedRng::new(seed),
        );
        let mut mine = [0u8; SPAKE_LEN];
        // spake2's Ed25519 messages are always a side byte and a 32-byte point.
        mine.copy_from_slice(&msg[..SPAKE_LEN.min(msg.len())]);
        let mut outbox = VecDeque::new();
        outbox.push_back(PakeMessage::Spake(mine).encode());
        Pake {
            role,
            context,
            fingerprint,
            state: State::AwaitSpake { spake, mine },
            outbox,
            outcome: None,
        }
    }

    /// The next message to send to the peer.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.outbox.pop_front()
    }

    /// The result, once the exchange succeeded.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Handles one message from the peer.
    ///
    /// # Errors
    ///
    /// [`PakeError`]; the machine is then failed for good: it queues nothing more, and
    /// every later call returns [`PakeError::AlreadyFailed`]. Keep draining
    /// [`Pake::poll_transmit`] after an error: this side's Confirm may still be queued, and
    /// the peer needs it to fail cleanly too.
    pub fn handle_message(&mut self, bytes: &[u8]) -> Result<(), PakeError> {
        if matches!(self.state, State::Failed) {
            return Err(PakeError::AlreadyFailed);
        }
        // On error `step` leaves the state `Failed`. What it had queued before stays queued:
        // at most this side's Confirm, which the peer needs to see the failure too (and
        // which tells a guesser nothing it can test offline: SPAKE2 allows one guess per
        // run).
        self.step(bytes)
    }

    fn step(&mut self, bytes: &[u8]) -> Result<(), PakeError> {
        let message = PakeMessage::decode(bytes)?;
        let state = std::mem::replace(&mut self.state, State::Failed);
        self.state = match (state, message) {
            (State::AwaitSpake { spake, mine }, PakeMessage::Spake(theirs)) => {
                if theirs == mine {
                    return Err(PakeError::Reflected);
                }
                let key = spake
                    .finish(&theirs)
                    .map_err(|e| PakeError::Spake(e.to_string()))?;
                let (sender_msg, receiver_msg) = match self.role {
                    Role::Sender => (&mine, &theirs),
                    Role::Receiver => (&theirs, &mine),
                };
                let keys = derive_keys(&key, &self.context, sender_msg, receiver_msg)?;
                let tag = hmac_sha256(keys.confirm(self.role), &[&keys.transcript]);
                self.outbox.push_back(PakeMessage::Confirm(tag).encode());
                State::AwaitConfirm(Box::new(keys))
            }
            (State::AwaitConfirm(keys), PakeMessage::Confirm(tag)) => {
                let peer_key = keys.confirm(self.role.peer());
                if !verify_hmac_sha256(peer_key, &[&keys.transcript], &tag) {
                    return Err(PakeError::WrongCode);
                }
                let sealed = seal_fingerprint(keys.seal(self.role), self.role, &self.fingerprint);
                self.outbox
                    .push_back(PakeMessage::Fingerprint(sealed).encode());
                State::AwaitFingerprint(keys)
            }
            (State::AwaitFingerprint(keys), PakeMessage::Fingerprint(sealed)) => {
                let peer = self.role.peer();
                let peer_fingerprint = open_fingerprint(keys.seal(peer), peer, &sealed)?;
                self.outcome = Some(Outcome {
                    peer_fingerprint,
                    relay_key: DerivedKey(keys.relay),
                    check_key: DerivedKey(keys.check),
                });
                State::Done
            }
            (State::Done, _) => return Err(PakeError::AlreadyDone),
            (state, message) => {
                return Err(PakeError::Unexpected {
                    got: match message {
                        PakeMessage::Spake(_) => "Spake",
                        PakeMessage::Confirm(_) => "Confirm",
                        PakeMessage::Fingerprint(_) => "Fingerprint",
                    },
                    expected: state.expected(),
                });
            }
        };
        Ok(())
    }
}

fn derive_keys(
    key: &[u8],
    context: &[u8],
    sender_msg: &[u8; SPAKE_LEN],
    receiver_msg: &[u8; SPAKE_LEN],
) -> Result<Keys, KdfError> {
    let mut transcript = Vec::with_capacity(LABEL.len() + context.len() + 2 * SPAKE_LEN);
    transcript.extend_from_slice(LABEL);
    transcript.extend_from_slice(context);
    transcript.extend_from_slice(sender_msg);
    transcript.extend_from_slice(receiver_msg);
    let salt = digest::digest(&digest::SHA256, &transcript);
    let derive = |label: &[u8]| -> Result<[u8; 32], KdfError> {
        let mut out = [0u8; 32];
        hkdf_expand(key, salt.as_ref(), &[LABEL, b" ", label], &mut out)?;
        Ok(out)
    };
    Ok(Keys {
        confirm_sender: derive(b"confirm sender")?,
        confirm_receiver: derive(b"confirm receiver")?,
        seal_sender: derive(b"seal sender")?,
        seal_receiver: derive(b"seal receiver")?,
        relay: derive(b"relay")?,
        check: derive(b"check")?,
        transcript,
    })
}

fn fingerprint_aad(role: Role) -> Vec<u8> {
    [LABEL, b" fingerprint ", role.label()].concat()
}

fn aead_key(key: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is what AES-256-GCM takes, so this cannot fail.
    let unbound = UnboundKey::new(&aead::AES_256_GCM, key).expect("32-byte AES-256-GCM key");
    LessSafeKey::new(unbound)
}

fn seal_fingerprint(
    key: &[u8; 32],
    role: Role,
    fp: &CertFingerprint,
) -> [u8; SEALED_FINGERPRINT_LEN] {
    let mut out = [0u8; SEALED_FINGERPRINT_LEN];
    let (body, tag_out) = out.split_at_mut(FINGERPRINT_LEN);
    body.copy_from_slice(fp.as_bytes());
    // Sealing 32 bytes under a valid key cannot fail; each key seals one message, so the
    // all-zero nonce is used once.
    let tag = aead_key(key)
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key([0; aead::NONCE_LEN]),
            Aad::from(fingerprint_aad(role)),
            body,
        )
        .expect("AES-GCM seals a 32-byte message");
    tag_out.copy_from_slice(tag.as_ref());
    out
}

fn open_fingerprint(
    key: &[u8; 32],
    role: Role,
    sealed: &[u8; SEALED_FINGERPRINT_LEN],
) -> Result<CertFingerprint, PakeError> {
    let mut buf = *sealed;
    let plain = aead_key(key)
        .open_in_place(
            Nonce::assume_unique_for_key([0; aead::NONCE_LEN]),
            Aad::from(fingerprint_aad(role)),
            &mut buf,
        )
        .map_err(|_| PakeError::Tampered)?;
    let bytes: [u8; FINGERPRINT_LEN] = plain.try_into().map_err(|_| PakeError::Tampered)?;
    Ok(CertFingerprint(bytes))
}

/// The RNG spake2 draws its secret scalar from: BLAKE3's extendable output keyed by the
/// caller's 32-byte seed (a CSPRNG as long as the seed is random and used once).
struct SeedRng(blake3::OutputReader);

impl SeedRng {
    fn new(seed: [u8; 32]) -> SeedRng {
        let mut hasher = blake3::Hasher::new_derive_key("warren-files/1 pake rng");
        hasher.update(&seed);
        SeedRng(hasher.finalize_xof())
    }
}

impl rand_core::RngCore for SeedRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.0.fill(&mut b);
        u32::from_le_bytes(b)
    }

    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.0.fill(&mut b);
        u64::from_le_bytes(b)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill(dest);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.0.fill(dest);
        Ok(())
    }
}

impl rand_core::CryptoRng for SeedRng {}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(byte: u8) -> CertFingerprint {
        CertFingerprint::of_spki(&[byte; 91])
    }

    fn pair(sender_code: &str, receiver_code: &str) -> (Pake, Pake) {
        let s = Code::parse(sender_code).expect("code");
        let r = Code::parse(receiver_code).expect("code");
        (
            Pake::new(Role::Sender, &s, fp(1), [11; 32]),
            Pake::new(Role::Receiver, &r, fp(2), [22; 32]),
        )
    }

    /// Delivers messages both ways until neither side has anything to send, passing each
    /// through `tamper` (which sees the sending role, the message's index from that side,
    /// and the bytes). Returns each side's first error.
    fn run(
        a: &mut Pake,
        b: &mut Pake,
        mut tamper: impl FnMut(Role, usize, &mut Vec<u8>),
    ) -> (Option<PakeError>, Option<PakeError>) {
        let (mut err_a, mut err_b) = (None, None);
        let (mut sent_a, mut sent_b) = (0, 0);
        loop {
            let mut moved = false;
            while let Some(mut m) = a.poll_transmit() {
                tamper(a.role, sent_a, &mut m);
                sent_a += 1;
                moved = true;
                if let Err(e) = b.handle_message(&m) {
                    err_b.get_or_insert(e);
                }
            }
            while let Some(mut m) = b.poll_transmit() {
                tamper(b.role, sent_b, &mut m);
                sent_b += 1;
                moved = true;
                if let Err(e) = a.handle_message(&m) {
                    err_a.get_or_insert(e);
                }
            }
            if !moved {
                return (err_a, err_b);
            }
        }
    }

    #[test]
    fn same_code_agrees_and_exchanges_fingerprints() {
        let (mut s, mut r) = pair("7-acid-acorn-acre", "7 ACID acorn acre");
        assert_eq!(run(&mut s, &mut r, |_, _, _| {}), (None, None));
        let so = s.outcome().expect("sender done").clone();
        let ro = r.outcome().expect("receiver done").clone();
        assert_eq!(so.peer_fingerprint, fp(2));
        assert_eq!(ro.peer_fingerprint, fp(1));
        assert_eq!(so.relay_key, ro.relay_key);
        assert_eq!(so.check_key, ro.check_key);
        assert_ne!(so.check_key, so.relay_key, "each use has its own key");
        so.verify_peer_spki(&[2; 91])
            .expect("receiver's certificate");
        ro.verify_peer_spki(&[1; 91]).expect("sender's certificate");
        assert!(s.poll_transmit().is_none());
        assert_eq!(
            s.handle_message(&PakeMessage::Confirm([0; 32]).encode()),
            Err(PakeError::AlreadyDone)
        );
        assert_eq!(format!("{:?}", so.relay_key), "DerivedKey(****)");
    }

    #[test]
    fn a_wrong_word_fails_confirmation_on_both_sides() {
        let (mut s, mut r) = pair("7-acid-acorn-acre", "7-acid-acorn-zoom");
        let (es, er) = run(&mut s, &mut r, |_, _, _| {});
        assert_eq!(es, Some(PakeError::WrongCode));
        assert_eq!(er, Some(PakeError::WrongCode));
        assert!(s.outcome().is_none() && r.outcome().is_none());
        assert!(
            es.map(|e| e.to_string())
                .unwrap_or_default()
                .contains("mistyped")
        );
        // After failing, nothing more is accepted.
        assert_eq!(s.handle_message(&[1, 1]), Err(PakeError::AlreadyFailed));
    }

    #[test]
    fn a_different_nameplate_fails_too() {
        let (mut s, mut r) = pair("7-acid-acorn-acre", "8-acid-acorn-acre");
        let (es, er) = run(&mut s, &mut r, |_, _, _| {});
        assert_eq!(
            (es, er),
            (Some(PakeError::WrongCode), Some(PakeError::WrongCode))
        );
    }

    /// A fingerprint is only ever sent after the peer's confirmation checked out.
    #[test]
    fn nothing_is_sent_before_confirmation() {
        let (mut s, mut r) = pair("7-acid-acorn-acre", "7-acid-acorn-zoom");
        let mut fingerprints_sent = 0;
        run(&mut s, &mut r, |_, _, m| {
            if matches!(PakeMessage::decode(m), Ok(PakeMessage::Fingerprint(_))) {
                fingerprints_sent += 1;
            }
        });
        assert_eq!(fingerprints_sent, 0);
    }

    #[test]
    fn a_tampered_message_fails() {
        // Flip one bit in each message of each side in turn.
        for role in [Role::Sender, Role::Receiver] {
            for index in 0..3 {
                let (mut s, mut r) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
                let (es, er) = run(&mut s, &mut r, |from, i, m| {
                    if from == role && i == index {
                        let last = m.len() - 1;
                        m[last] ^= 0x01;
                    }
                });
                let errors = [es, er];
                assert!(
                    errors.iter().any(|e| matches!(
                        e,
                        Some(PakeError::WrongCode | PakeError::Tampered | PakeError::Spake(_))
                    )),
                    "{role:?} message {index}: {errors:?}"
                );
                assert!(
                    s.outcome().is_none() || r.outcome().is_none(),
                    "{role:?} message {index}: both succeeded"
                );
            }
        }
    }

    #[test]
    fn a_swapped_or_reflected_fingerprint_is_refused() {
        // The sender's sealed fingerprint reflected back to it in place of the receiver's.
        let (mut s, mut r) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        let s_spake = s.poll_transmit().expect("spake");
        let r_spake = r.poll_transmit().expect("spake");
        s.handle_message(&r_spake).expect("spake");
        r.handle_message(&s_spake).expect("spake");
        let s_confirm = s.poll_transmit().expect("confirm");
        let r_confirm = r.poll_transmit().expect("confirm");
        s.handle_message(&r_confirm).expect("confirm");
        r.handle_message(&s_confirm).expect("confirm");
        let s_fp = s.poll_transmit().expect("fingerprint");
        assert_eq!(s.handle_message(&s_fp), Err(PakeError::Tampered));

        // A fingerprint sealed in another session (same code, other randomness).
        let (mut s2, mut r2) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        let mut from_other_session = None;
        run(&mut s2, &mut r2, |from, i, m| {
            if from == Role::Receiver && i == 2 {
                from_other_session = Some(m.clone());
            }
        });
        let (mut s3, mut r3) = (
            Pake::new(
                Role::Sender,
                &Code::parse("7-acid-acorn-acre").expect("code"),
                fp(1),
                [33; 32],
            ),
            Pake::new(
                Role::Receiver,
                &Code::parse("7-acid-acorn-acre").expect("code"),
                fp(2),
                [44; 32],
            ),
        );
        let other = from_other_session.expect("captured");
        let (es, _) = run(&mut s3, &mut r3, |from, i, m| {
            if from == Role::Receiver && i == 2 {
                *m = other.clone();
            }
        });
        assert_eq!(es, Some(PakeError::Tampered));

        // After a good exchange, a QUIC peer with another certificate is refused.
        let (mut s, mut r) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        run(&mut s, &mut r, |_, _, _| {});
        let outcome = s.outcome().expect("done");
        assert_eq!(
            outcome.verify_peer_spki(&[9; 91]),
            Err(PakeError::CertificateMismatch)
        );
    }

    #[test]
    fn reflection_and_out_of_order_messages_are_refused() {
        let (mut s, _) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        let mine = s.poll_transmit().expect("spake");
        assert_eq!(s.handle_message(&mine), Err(PakeError::Reflected));

        let (mut s, _) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        assert_eq!(
            s.handle_message(&PakeMessage::Confirm([0; 32]).encode()),
            Err(PakeError::Unexpected {
                got: "Confirm",
                expected: "Spake"
            })
        );
        let (mut s, _) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        assert!(matches!(
            s.handle_message(b"\x01\x01short"),
            Err(PakeError::Message(_))
        ));
        // About half of all 32-byte strings are not points on the curve: those are refused
        // by SPAKE2, the others fail confirmation later; none panics.
        let mut refused = 0;
        for byte in 0..12u8 {
            let (mut s, _) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
            let mut bad = [byte; SPAKE_LEN];
            bad[0] = b'S';
            match s.handle_message(&PakeMessage::Spake(bad).encode()) {
                Err(PakeError::Spake(_)) => refused += 1,
                Ok(()) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(refused > 0);
        let (mut s, _) = pair("7-acid-acorn-acre", "7-acid-acorn-acre");
        let mut wrong_side = [1u8; SPAKE_LEN];
        wrong_side[0] = b'A';
        assert!(matches!(
            s.handle_message(&PakeMessage::Spake(wrong_side).encode()),
            Err(PakeError::Spake(_))
        ));
    }

    #[test]
    fn same_seed_same_messages() {
        let code = Code::parse("7-acid-acorn-acre").expect("code");
        let mut a = Pake::new(Role::Sender, &code, fp(1), [5; 32]);
        let mut b = Pake::new(Role::Sender, &code, fp(1), [5; 32]);
        let mut c = Pake::new(Role::Sender, &code, fp(1), [6; 32]);
        let (ma, mb, mc) = (a.poll_transmit(), b.poll_transmit(), c.poll_transmit());
        assert_eq!(ma, mb);
        assert_ne!(ma, mc);
        assert_eq!(fp(3).short().len(), 19);
    }

    /// Runs two machines to the end, passing messages both ways; each side's result.
    fn run_pair(mut a: Pake, mut b: Pake) -> (Result<(), PakeError>, Result<(), PakeError>) {
        let (mut ra, mut rb) = (Ok(()), Ok(()));
        for _ in 0..10 {
            while let Some(m) = a.poll_transmit() {
                if rb.is_ok() {
                    rb = b.handle_message(&m);
                }
            }
            while let Some(m) = b.poll_transmit() {
                if ra.is_ok() {
                    ra = a.handle_message(&m);
                }
            }
        }
        (ra, rb)
    }

    #[test]
    fn a_service_exchange_agrees_on_the_token_and_fails_on_another_token_or_name() {
        let start = |role, service: &str, token: &[u8], n: u8| {
            Pake::for_service(role, service, token, fp(n), [n; 32])
        };
        let mut a = start(Role::Sender, "ssh", b"token-one-0123456789", 1);
        let mut b = start(Role::Receiver, "ssh", b"token-one-0123456789", 2);
        let mut done = false;
        for _ in 0..10 {
            while let Some(m) = a.poll_transmit() {
                b.handle_message(&m).unwrap();
            }
            while let Some(m) = b.poll_transmit() {
                a.handle_message(&m).unwrap();
            }
            if let (Some(x), Some(y)) = (a.outcome(), b.outcome()) {
                assert_eq!(x.peer_fingerprint, fp(2));
                assert_eq!(y.peer_fingerprint, fp(1));
                done = true;
                break;
            }
        }
        assert!(done);
        let (x, y) = run_pair(
            start(Role::Sender, "ssh", b"token-one-0123456789", 1),
            start(Role::Receiver, "ssh", b"token-two-0123456789", 2),
        );
        assert!(x.is_err() || y.is_err(), "another token must fail");
        let (x, y) = run_pair(
            start(Role::Sender, "ssh", b"token-one-0123456789", 1),
            start(Role::Receiver, "web", b"token-one-0123456789", 2),
        );
        assert!(x.is_err() || y.is_err(), "another service must fail");
    }
}
