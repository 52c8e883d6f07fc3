//! From a join code to a pinned QUIC connection with the peer: every step a transfer takes
//! before its first byte, in one place, for `warren send` / `warren receive` (and tests).
//!
//! ```text
//! sender (Offering)                     server                     receiver (join)
//!   allocate a nameplate, show the code ──▶ mailbox ◀─────────────────── claim it
//!   Spake, Confirm, Fingerprint  ◀──────── mailbox ─────────▶ Spake, Confirm, Fingerprint
//!   (meanwhile: bind the UDP socket, ask the reflector for our public address)
//!   PathOffer {candidates, relay_only} ◀── mailbox ──▶ PathOffer; the receiver leaves
//!   connectivity checks  ◀────────────── direct ───────────────▶ connectivity checks
//!   accept QUIC (pinned) ◀──── the punched path, or the server's relay ──── dial QUIC
//! ```
//!
//! The sender listens and the receiver dials, whichever path won: the sender accepts the
//! first connection whose certificate is the peer's (the pin is in the TLS config), so a
//! receiver that went to the relay while the sender found a direct path still gets in once
//! the sender's wait for a direct dial runs out and it joins the relay too.
//!
//! One sender serves several receivers, one after another at the mailbox: each gets its
//! own PAKE, identity, socket and connection ([`Offering::next_receiver`]), so several
//! transfers run at once once connected.
//!
//! Mailbox bodies are the PAKE's messages (`warren_proto::files::pake`, first byte = its
//! version, 1) and one [`PathOffer`] per side: [`PATH_OFFER_TAG`] then JSON.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use warren_proto::message::MailboxEvent;

use super::code::{Code, Nameplate};
use super::mailbox::{Mailbox, MailboxError, MailboxServer};
use super::net::candidates::Candidates;
use super::net::demux::{self, DemuxSocket, StunChannel};
use super::net::key::CheckKey;
use super::net::punch::{Checker, PunchConfig};
use super::net::reflector::{self, DiscoverConfig};
use super::net::relay::{self, JoinConfig, RelayAuth, RelayToken};
use super::net::tcp_leg::PipeSocket;
use super::pake::{CertFingerprint, Outcome, Pake, PakeError, Role};
use super::transfer::identity::{self, Identity, SERVER_NAME};
use super::upgrade::{self, PathWatch};
use crate::crypto::secret::Secret;
use crate::transport::quic::error::QuicError;
use crate::transport::quic::settings::{MAX_GSO_UDP_PAYLOAD, QuicSettings};

/// First byte of a mailbox body holding a [`PathOffer`] (PAKE messages start with their
/// version, 1).
pub const PATH_OFFER_TAG: u8 = b'P';
/// How long each mailbox step may take once both peers are there (no human waits here: the
/// receiver typed the code before it claimed the nameplate).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a sender waits for its receiver: the server's nameplate TTL ends it sooner.
const RECEIVER_WAIT: Duration = Duration::from_secs(24 * 3600);
/// After a punch, how long the sender waits for the receiver's direct dial before it
/// also joins the relay (the receiver's checker may have given up while ours succeeded).
const DIRECT_DIAL_WAIT: Duration = Duration::from_secs(2);
/// The QUIC handshake, on whichever path.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// When the sender's own checks and relay join both failed, how long it still waits for
/// a receiver that found a path to dial.
const FAILED_GRACE: Duration = Duration::from_secs(5);
/// After its punch succeeded, how long a peer keeps answering checks so the other finishes.
const ANSWER_AFTER: Duration = Duration::from_secs(3);

/// What the connection is for. Both sides say it in their [`PathOffer`]; a code used with
/// the other pair of commands fails with which one it belongs to (instead of a protocol
/// error later).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// `warren send` / `warren receive` (what peers before tunnels meant).
    #[default]
    Files,
    /// `warren p2p listen` / `warren p2p connect`.
    Tunnel,
}

impl Purpose {
    /// The command pair, for messages.
    pub fn commands(self) -> &'static str {
        match self {
            Purpose::Files => "`warren send` / `warren receive` (a file transfer)",
            Purpose::Tunnel => "`warren p2p listen` / `warren p2p connect` (a tunnel)",
        }
    }
}

/// How the two peers find each other at the server's mailbox, and the password of their
/// key exchange.
#[derive(Debug, Clone)]
pub enum Meeting {
    /// A join code (`warren send`, `warren p2p listen`): the server gives its number, the
    /// words are the password.
    Code(Code),
    /// A named P2P service in the server's `[server.p2p.services]` (`--service NAME`):
    /// the name finds it, both sides prove its token to the server, and the token is the
    /// password.
    Service {
        /// The service name.
        name: String,
        /// Its token.
        token: Secret,
    },
}

impl Meeting {
    fn pake(&self, role: Role, identity: &Identity) -> Pake {
        match self {
            Meeting::Code(code) => Pake::new(role, code, identity.fingerprint(), rand::random()),
            Meeting::Service { name, token } => Pake::for_service(
                role,
                name,
                token.as_bytes(),
                identity.fingerprint(),
                rand::random(),
            ),
        }
    }
}

/// How to meet the peer.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server: mailbox, reflector and relay.
    pub server: MailboxServer,
    /// What the connection is for.
    pub purpose: Purpose,
    /// Skip the checks and go through the relay (`--relay`): for networks that drop
    /// unsolicited UDP, and for measuring the relayed path.
    pub relay_only: bool,
    /// Pacing and deadline of the checks.
    pub punch: PunchConfig,
    /// The peers' QUIC settings. `None`: [`QuicSettings::loopback`] when the peer socket
    /// is on loopback (bigger packets), else [`QuicSettings::internet`].
    pub quic: Option<QuicSettings>,
    /// The peer socket's address. `None`: loopback when the server is on loopback (both
    /// peers are on this machine), else the unspecified address of the server's family.
    pub bind: Option<SocketAddr>,
    /// This side's long-term identity (`p2p_identity`); `None`: a fresh one per connection.
    pub identity: Option<Arc<Identity>>,
    /// The only peer identity accepted (`peer = "..."`): a peer whose key exchange shows
    /// another is refused before any connection.
    pub pin: Option<CertFingerprint>,
}

impl Options {
    /// The defaults for `server`: checks for ~3 s, then the relay.
    pub fn new(server: MailboxServer) -> Options {
        Options {
            server,
            purpose: Purpose::Files,
            relay_only: false,
            punch: PunchConfig::default(),
            quic: None,
            bind: None,
            identity: None,
            pin: None,
        }
    }

    /// The identity to present: the long-term one, or a fresh one.
    fn identity(&self) -> Result<Arc<Identity>, SessionError> {
        match &self.identity {
            Some(identity) => Ok(Arc::clone(identity)),
            None => Ok(Arc::new(Identity::generate()?)),
        }
    }

    /// Refuses a peer whose identity is not the pinned one.
    fn check_pin(&self, outcome: &Outcome) -> Result<(), SessionError> {
        match self.pin {
            Some(pinned) if !pinned.matches(&outcome.peer_fingerprint) => {
                Err(SessionError::WrongPeer {
                    pinned,
                    found: outcome.peer_fingerprint,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Which path the connection took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Peer to peer, to this address.
    Direct(SocketAddr),
    /// Through the server's relay at this address.
    Relayed(SocketAddr),
}

impl Route {
    /// `direct` or `relayed`, as the progress line says it.
    pub fn word(&self) -> &'static str {
        match self {
            Route::Direct(_) => "direct",
            Route::Relayed(_) => "relayed",
        }
    }
}

/// A pinned QUIC connection to the peer.
#[derive(Debug)]
pub struct Connected {
    /// The connection (the transfer runs over it).
    pub connection: quinn::Connection,
    /// Its endpoint, which drives the socket: keep it as long as the connection.
    pub endpoint: quinn::Endpoint,
    /// The path it took.
    pub route: Route,
    /// The path its packets take now: a tunnel's relayed connection moves to the direct
    /// path when the checks find one ([`super::upgrade`]).
    pub path: PathWatch,
    /// The peer's certificate fingerprint (its short form identifies a receiver).
    pub peer: CertFingerprint,
    /// From the peer joining the mailbox to the key agreed.
    pub agreed_in: Duration,
    /// From the key agreed to the QUIC connection up.
    pub connected_in: Duration,
}

/// Why the peers could not be connected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The mailbox failed or refused.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    /// The key exchange failed: almost always a mistyped code.
    #[error("{0}")]
    Pake(#[from] PakeError),
    /// The other side left the mailbox before the exchange finished.
    #[error("the other side left before the connection was set up: {0}")]
    PeerLeft(&'static str),
    /// The peer's path offer is unreadable.
    #[error(
        "the other side sent an unreadable path offer ({0}): use the same Warren version on both sides"
    )]
    BadOffer(String),
    /// A step took too long.
    #[error("no answer from the other side within {secs} s while {during}")]
    Timeout {
        /// The step.
        during: &'static str,
        /// Its limit.
        secs: u64,
    },
    /// The peer socket could not be opened.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The QUIC configuration could not be built (not expected).
    #[error(transparent)]
    Quic(#[from] QuicError),
    /// Neither a direct path nor the relay worked.
    #[error("could not reach the other side: {0}")]
    NoPath(String),
    /// The peer's identity is not the pinned one.
    #[error(
        "the other end's identity is {} but this side pins {} (`peer`): another machine answered for the service, or the other end's p2p_identity changed; update `peer` only if you trust the new one",
        .found.hex(), .pinned.hex()
    )]
    WrongPeer {
        /// What the config pins.
        pinned: CertFingerprint,
        /// What the peer showed.
        found: CertFingerprint,
    },
    /// The peer used the code with the other pair of commands.
    #[error("the other side used this code with {}, this side with {}: each code belongs to one pair of commands", .theirs.commands(), .ours.commands())]
    WrongPurpose {
        /// Ours.
        ours: Purpose,
        /// The peer's.
        theirs: Purpose,
    },
}

/// The sender's place at the mailbox: one code, any number of receivers in turn.
pub struct Offering {
    mailbox: Mailbox,
    meeting: Meeting,
    udp: Option<SocketAddr>,
    options: Options,
    /// A receiver is at the nameplate (joined, not yet left).
    receiver_present: bool,
}

impl std::fmt::Debug for Offering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offering")
            .field("meeting", &self.meeting)
            .finish_non_exhaustive()
    }
}

impl Offering {
    /// Connects to the server's mailbox and takes a nameplate: the code exists when this
    /// returns (nothing about the files has been read).
    ///
    /// # Errors
    ///
    /// The mailbox could not be reached or refused (no `[server.p2p]`, rate limit).
    pub async fn open(options: Options) -> Result<Offering, SessionError> {
        let mut mailbox = Mailbox::connect(&options.server).await?;
        let (nameplate, udp_port) = mailbox.allocate().await?;
        let nameplate = Nameplate::new(nameplate).ok_or_else(|| {
            MailboxError::Ended(format!(
                "the server gave nameplate {nameplate}, which is not a valid code number"
            ))
        })?;
        let code = Code::generate(nameplate, &mut rand::rng());
        let udp = udp_port.map(|port| mailbox.udp_addr(port));
        Ok(Offering {
            mailbox,
            meeting: Meeting::Code(code),
            udp,
            options,
            receiver_present: false,
        })
    }

    /// Offers the server's named P2P service `name`, proving `token`: peers reach it by
    /// the name for as long as this lives (no code to pass around).
    ///
    /// # Errors
    ///
    /// The mailbox could not be reached or refused (no such service, a wrong token, the
    /// service offered by another client).
    pub async fn open_service(
        options: Options,
        name: &str,
        token: Secret,
    ) -> Result<Offering, SessionError> {
        let mut mailbox = Mailbox::connect(&options.server).await?;
        let (_, udp_port) = mailbox.offer_service(name, &token).await?;
        let udp = udp_port.map(|port| mailbox.udp_addr(port));
        Ok(Offering {
            mailbox,
            meeting: Meeting::Service {
                name: name.to_owned(),
                token,
            },
            udp,
            options,
            receiver_present: false,
        })
    }

    /// The code to give the receiver (`None` for a named service).
    pub fn code(&self) -> Option<&Code> {
        match &self.meeting {
            Meeting::Code(code) => Some(code),
            Meeting::Service { .. } => None,
        }
    }

    /// Waits for the next receiver (as long as the nameplate lives), agrees on keys with
    /// it and connects.
    ///
    /// # Errors
    ///
    /// [`SessionError::Pake`] when someone tried a wrong code (call again: the nameplate
    /// stays until the server burns it), [`SessionError::PeerLeft`] when a receiver left
    /// half way (call again), others when the mailbox is gone.
    ///
    /// Not cancel-safe: dropping the future half way leaves the receiver of the moment
    /// waiting for messages that never come (it times out).
    pub async fn next_receiver(&mut self) -> Result<Connected, SessionError> {
        if self.receiver_present {
            self.wait_for_leaving().await?;
        }
        let identity = self.options.identity()?;
        let mut pake = self.meeting.pake(Role::Sender, &identity);
        // Our first message waits at the server for the receiver.
        flush(&mut self.mailbox, &mut pake).await?;
        let early = self.wait_for_receiver().await?;
        let joined = Instant::now();
        self.receiver_present = true;
        let mut socket = PeerSocket::open(&self.options, self.mailbox.server_addr())?;
        let (reflexive, agreed) = tokio::join!(
            socket.discover(self.udp),
            exchange(&mut self.mailbox, &mut pake, early, Role::Sender)
        );
        let outcome = match agreed {
            Ok(outcome) => outcome,
            Err(error) => {
                if matches!(error, SessionError::PeerLeft(_)) {
                    self.receiver_present = false;
                }
                return Err(error);
            }
        };
        // The refused peer hears nothing more and leaves after its step timeout.
        self.options.check_pin(&outcome)?;
        let agreed_in = joined.elapsed();
        let blocked = udp_blocked(self.udp, reflexive);
        let ours = PathOffer {
            purpose: self.options.purpose,
            candidates: Candidates::gather(socket.local, reflexive),
            relay_only: self.options.relay_only || blocked,
        };
        let theirs = swap_offers(&mut self.mailbox, &ours).await?;
        let started = Instant::now();
        if let (true, Some(relay)) = (blocked, self.udp) {
            socket = PeerSocket::over_tcp(&self.options, relay).await?;
        }
        // The mailbox keeps answering the server's heartbeats meanwhile (the accept may
        // take seconds), and holds what the next receiver says.
        let agreed = Agreed {
            identity: &identity,
            outcome: &outcome,
            ours: &ours,
            theirs: &theirs,
            relay: self.udp,
            options: &self.options,
        };
        let accepting = socket.accept(&agreed);
        let (connection, route, path) = tokio::select! {
            accepted = accepting => accepted?,
            () = self.mailbox.keep_alive() => unreachable!("keep_alive never returns"),
        };
        Ok(Connected {
            connection,
            endpoint: socket.endpoint,
            route,
            path,
            peer: outcome.peer_fingerprint,
            agreed_in,
            connected_in: started.elapsed(),
        })
    }

    /// Leaves the mailbox (the nameplate is freed).
    pub async fn close(self) {
        self.mailbox.close().await;
    }

    /// Waits for a receiver to join; returns a message that came with it, if any.
    async fn wait_for_receiver(&mut self) -> Result<Option<Vec<u8>>, SessionError> {
        loop {
            match self.mailbox.next(RECEIVER_WAIT).await? {
                MailboxEvent::PeerJoined => return Ok(None),
                MailboxEvent::Message { body } => return Ok(Some(body)),
                // A receiver that left before we saw it join: wait for the next one.
                _ => {}
            }
        }
    }

    /// Waits for the last receiver to leave the nameplate (it does once it has our path
    /// offer, or when its exchange failed), so our next first message goes to the next.
    async fn wait_for_leaving(&mut self) -> Result<(), SessionError> {
        let until = Instant::now() + STEP_TIMEOUT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let during = "waiting for the last receiver to leave the code";
            if let MailboxEvent::PeerLeft = step_event(&mut self.mailbox, left, during).await? {
                break;
            }
        }
        self.receiver_present = false;
        Ok(())
    }
}

/// The receiver's side: claims the code's nameplate, agrees on keys with the sender and
/// connects.
///
/// # Errors
///
/// [`SessionError::Pake`] for a wrong code (the server is told, and burns the nameplate
/// after a few), the mailbox's refusal (no such code), no path to the sender.
pub async fn join(code: &Code, options: &Options) -> Result<Connected, SessionError> {
    join_meeting(&Meeting::Code(code.clone()), options).await
}

/// [`join`] for any [`Meeting`]: a code, or a named P2P service.
///
/// # Errors
///
/// As [`join`]; for a service, the server's refusal (no such service, a wrong token,
/// nobody offers it now).
pub async fn join_meeting(meeting: &Meeting, options: &Options) -> Result<Connected, SessionError> {
    let mut mailbox = Mailbox::connect(&options.server).await?;
    let udp_port = claim_in_turn(&mut mailbox, meeting).await?;
    let joined = Instant::now();
    let udp = udp_port.map(|port| mailbox.udp_addr(port));
    let identity = options.identity()?;
    let mut pake = meeting.pake(Role::Receiver, &identity);
    let mut socket = PeerSocket::open(options, mailbox.server_addr())?;
    let (reflexive, agreed) = tokio::join!(
        socket.discover(udp),
        exchange(&mut mailbox, &mut pake, None, Role::Receiver)
    );
    let outcome = match agreed {
        Ok(outcome) => outcome,
        Err(error) => {
            let failed = matches!(error, SessionError::Pake(_));
            let _ = mailbox.release(failed).await;
            mailbox.close().await;
            return Err(error);
        }
    };
    if let Err(error) = options.check_pin(&outcome) {
        let _ = mailbox.release(false).await;
        mailbox.close().await;
        return Err(error);
    }
    let agreed_in = joined.elapsed();
    let blocked = udp_blocked(udp, reflexive);
    let ours = PathOffer {
        purpose: options.purpose,
        candidates: Candidates::gather(socket.local, reflexive),
        relay_only: options.relay_only || blocked,
    };
    let theirs = swap_offers(&mut mailbox, &ours).await;
    // Done with the mailbox either way: the nameplate is free for the next receiver.
    let _ = mailbox.release(false).await;
    mailbox.close().await;
    let theirs = theirs?;
    let started = Instant::now();
    if let (true, Some(relay)) = (blocked, udp) {
        socket = PeerSocket::over_tcp(options, relay).await?;
    }
    let (connection, route, path) = socket
        .dial(&Agreed {
            identity: &identity,
            outcome: &outcome,
            ours: &ours,
            theirs: &theirs,
            relay: udp,
            options,
        })
        .await?;
    Ok(Connected {
        connection,
        endpoint: socket.endpoint,
        route,
        path,
        peer: outcome.peer_fingerprint,
        agreed_in,
        connected_in: started.elapsed(),
    })
}

/// Claims the meeting's nameplate, waiting while other receivers of the same sender take
/// their turn (each holds it for the key exchange only, well under a second).
async fn claim_in_turn(
    mailbox: &mut Mailbox,
    meeting: &Meeting,
) -> Result<Option<u16>, SessionError> {
    let until = Instant::now() + 2 * STEP_TIMEOUT;
    let mut pause = Duration::from_millis(50);
    loop {
        let claimed = match meeting {
            Meeting::Code(code) => mailbox.claim(code.nameplate().get()).await,
            Meeting::Service { name, token } => mailbox.visit_service(name, token).await,
        };
        match claimed {
            Err(MailboxError::Busy) if Instant::now() + pause < until => {
                // Jitter, so receivers that queued together do not collide again.
                let jitter = Duration::from_millis(rand::random_range(0..50));
                tokio::time::sleep(pause + jitter).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(MailboxError::Busy) => {
                return Err(SessionError::Timeout {
                    during: "waiting for other receivers of this code to connect",
                    secs: (2 * STEP_TIMEOUT).as_secs(),
                });
            }
            other => return Ok(other?),
        }
    }
}

/// Whether this side's UDP looks blocked: the server has a UDP port and it never answered
/// the discovery. Such a side relays over its session with the server
/// ([`super::net::tcp_leg`]) and asks the other side to skip the checks.
fn udp_blocked(udp: Option<SocketAddr>, reflexive: Option<SocketAddr>) -> bool {
    let blocked = udp.is_some() && reflexive.is_none();
    if blocked {
        tracing::info!(
            event = "p2p_udp_blocked",
            "the server's UDP port did not answer: relaying this transfer over the TCP session"
        );
    }
    blocked
}

/// What a peer tells the other about reaching it, after the key is agreed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathOffer {
    /// What it wants the connection for (absent from peers that only sent files).
    #[serde(default)]
    pub purpose: Purpose,
    /// Its addresses.
    pub candidates: Candidates,
    /// It wants the relay without checks.
    pub relay_only: bool,
}

impl PathOffer {
    fn encode(&self) -> Vec<u8> {
        let mut body = vec![PATH_OFFER_TAG];
        // Invariant: a struct of addresses and a bool always serialises.
        body.extend(serde_json::to_vec(self).unwrap_or_default());
        body
    }

    fn decode(body: &[u8]) -> Result<PathOffer, SessionError> {
        match body.split_first() {
            Some((&PATH_OFFER_TAG, json)) => {
                serde_json::from_slice(json).map_err(|e| SessionError::BadOffer(e.to_string()))
            }
            _ => Err(SessionError::BadOffer(
                "expected a path offer, got another message".into(),
            )),
        }
    }
}

/// The next mailbox event of a step that may take [`STEP_TIMEOUT`]; running out of time
/// is the step's [`SessionError::Timeout`], naming `during`.
async fn step_event(
    mailbox: &mut Mailbox,
    wait: Duration,
    during: &'static str,
) -> Result<MailboxEvent, SessionError> {
    match mailbox.next(wait).await {
        Err(MailboxError::Timeout(_)) => Err(SessionError::Timeout {
            during,
            secs: STEP_TIMEOUT.as_secs(),
        }),
        other => Ok(other?),
    }
}

/// Sends everything the PAKE has to send.
async fn flush(mailbox: &mut Mailbox, pake: &mut Pake) -> Result<(), SessionError> {
    while let Some(message) = pake.poll_transmit() {
        mailbox.send(message).await?;
    }
    Ok(())
}

/// Runs the PAKE to its end over the mailbox. `early` is a message already received.
async fn exchange(
    mailbox: &mut Mailbox,
    pake: &mut Pake,
    mut early: Option<Vec<u8>>,
    role: Role,
) -> Result<Outcome, SessionError> {
    loop {
        flush(mailbox, pake).await?;
        if let Some(outcome) = pake.outcome() {
            return Ok(outcome.clone());
        }
        let body = match early.take() {
            Some(body) => body,
            None => match step_event(mailbox, STEP_TIMEOUT, "agreeing on a key").await? {
                MailboxEvent::Message { body } => body,
                MailboxEvent::PeerLeft => {
                    return Err(SessionError::PeerLeft(match role {
                        Role::Sender => "the receiver left during the key exchange",
                        Role::Receiver => "the sender left during the key exchange",
                    }));
                }
                _ => continue,
            },
        };
        if let Err(error) = pake.handle_message(&body) {
            // Whatever the machine still has (nothing, after a failure) goes out, so the
            // peer fails at the same step instead of waiting.
            let _ = flush(mailbox, pake).await;
            return Err(error.into());
        }
    }
}

/// Sends our path offer and reads the peer's.
/// A peer that wants the connection for something else is refused here.
async fn swap_offers(mailbox: &mut Mailbox, ours: &PathOffer) -> Result<PathOffer, SessionError> {
    mailbox.send(ours.encode()).await?;
    loop {
        match step_event(mailbox, STEP_TIMEOUT, "exchanging addresses").await? {
            MailboxEvent::Message { body } => {
                let theirs = PathOffer::decode(&body)?;
                if theirs.purpose != ours.purpose {
                    return Err(SessionError::WrongPurpose {
                        ours: ours.purpose,
                        theirs: theirs.purpose,
                    });
                }
                return Ok(theirs);
            }
            MailboxEvent::PeerLeft => {
                return Err(SessionError::PeerLeft(
                    "it left before telling where it can be reached",
                ));
            }
            _ => {}
        }
    }
}

/// What both peers agreed before connecting: the keys, each side's path offer, the relay.
#[derive(Clone, Copy)]
struct Agreed<'a> {
    identity: &'a Identity,
    outcome: &'a Outcome,
    ours: &'a PathOffer,
    theirs: &'a PathOffer,
    /// The server's relay, when it runs one.
    relay: Option<SocketAddr>,
    options: &'a Options,
}

impl Agreed<'_> {
    /// Whether either side asked to skip the checks (`--relay`, or UDP blocked).
    fn skip_checks(&self) -> bool {
        self.ours.relay_only || self.theirs.relay_only
    }

    /// Our leg at the relay at `addr`: the token from the PAKE, the tag from the PSK.
    fn relay_leg(&self, addr: SocketAddr) -> upgrade::RelayLeg {
        upgrade::RelayLeg {
            addr,
            token: RelayToken::from_key(&self.outcome.relay_key),
            auth: RelayAuth::from_psk(&self.options.server.psk),
        }
    }

    /// The relay, for a tunnel that starts there and moves to a direct path later.
    fn relay_first(&self) -> Option<SocketAddr> {
        match (self.options.purpose, self.skip_checks()) {
            (Purpose::Tunnel, false) => self.relay,
            _ => None,
        }
    }
}

/// One peer's UDP socket: the quinn endpoint that drives it and the STUN side of it.
struct PeerSocket {
    endpoint: quinn::Endpoint,
    /// The socket under the endpoint (a relayed tunnel moves to the direct path there).
    socket: Arc<DemuxSocket>,
    /// The settings it was made with (the connection's transport settings too).
    quic: QuicSettings,
    channel: Option<StunChannel>,
    local: SocketAddr,
}

impl PeerSocket {
    fn open(options: &Options, server: SocketAddr) -> Result<PeerSocket, SessionError> {
        let bind = options
            .bind
            .unwrap_or_else(|| SocketAddr::new(default_bind_ip(server.ip()), 0));
        let quic = options.quic.clone().unwrap_or_else(|| {
            let preset = if bind.ip().is_loopback() {
                QuicSettings::loopback()
            } else {
                QuicSettings::internet()
            };
            let settings = match options.purpose {
                // One data stream per transfer: an 8 MiB window covers 1 Gbit/s at 60 ms
                // of round trip and bounds what waits in memory while the receiver's disk
                // syncs (16 MiB measured a ~100 MiB receiver).
                Purpose::Files => QuicSettings {
                    stream_receive_window: 8 * 1024 * 1024,
                    connection_receive_window: 16 * 1024 * 1024,
                    ..preset
                },
                Purpose::Tunnel => preset,
            };
            if bind.ip().is_loopback() {
                // Both peers on this machine: the largest packets loopback carries, GSO off
                // (what `max_packet = 65527` gives a server tunnel, ~20 % faster there; a
                // 1 GiB send ~6 % less CPU than 6500-byte GSO batches). A relayed path
                // goes back to GSO batches (`path_settings`).
                QuicSettings {
                    max_udp_payload: u16::MAX - 8,
                    segmentation_offload: false,
                    ..settings
                }
            } else {
                settings
            }
        });
        let (std_socket, _) = crate::transport::quic::endpoint::bind_socket(bind, &quic)?;
        let (socket, channel) = DemuxSocket::wrap(std_socket)?;
        let local = socket.local_addr()?;
        PeerSocket::drive(socket, channel, quic, local)
    }

    /// The quinn endpoint over `socket` (whose STUN side is `channel`), with `quic`'s
    /// settings.
    fn drive(
        socket: Arc<DemuxSocket>,
        channel: StunChannel,
        quic: QuicSettings,
        local: SocketAddr,
    ) -> Result<PeerSocket, SessionError> {
        let config = quic.endpoint_config().map_err(QuicError::from)?;
        let endpoint = demux::endpoint_with(Arc::clone(&socket), None, config)?;
        Ok(PeerSocket {
            endpoint,
            socket,
            quic,
            channel: Some(channel),
            local,
        })
    }

    /// A socket whose datagrams ride a new session with the server to its relay at `relay`
    /// (UDP is blocked here): the relay join and QUIC run on it as on UDP.
    async fn over_tcp(options: &Options, relay: SocketAddr) -> Result<PeerSocket, SessionError> {
        let session = options
            .server
            .relay_leg_session()
            .await
            .map_err(MailboxError::from)?;
        let local = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        let pipe = PipeSocket::new(session.channel, relay, local);
        let (socket, channel) = DemuxSocket::over(pipe);
        // Internet settings: the path is a TCP connection of unknown reach, and packets no
        // bigger than the smallest QUIC allows are the cheapest to carry in records.
        let quic = options.quic.clone().unwrap_or_else(QuicSettings::internet);
        PeerSocket::drive(socket, channel, quic, local)
    }

    /// Our address as the server's reflector sees it; `None` when there is no reflector
    /// or it does not answer (host candidates and the relay still work).
    async fn discover(&mut self, udp: Option<SocketAddr>) -> Option<SocketAddr> {
        let (udp, channel) = (udp?, self.channel.as_mut()?);
        match reflector::discover(channel, udp, &DiscoverConfig::default()).await {
            Ok(seen) => Some(seen),
            Err(error) => {
                tracing::debug!(event = "p2p_discover_failed", %error, "no public address");
                None
            }
        }
    }

    /// The receiver's side: checks, then dials the peer directly or through the relay.
    async fn dial(
        &mut self,
        agreed: &Agreed<'_>,
    ) -> Result<(quinn::Connection, Route, PathWatch), SessionError> {
        if let Some(relay) = agreed.relay_first() {
            return self.dial_relay_first(agreed, relay).await;
        }
        let Agreed {
            identity,
            outcome,
            ours,
            theirs,
            relay,
            options,
        } = *agreed;
        let client = identity::client_config(identity, outcome, &self.quic)?;
        let mut channel = self.take_channel()?;
        let mut punch_note = String::from("the checks were skipped (--relay)");
        if !agreed.skip_checks() {
            let mut checker = Checker::new(
                channel,
                CheckKey::new(*outcome.check_key.expose()),
                options.punch.clone(),
            );
            match checker.punch(&ours.candidates, &theirs.candidates).await {
                Ok(punched) => {
                    // Keep answering for a moment so the sender's checker finishes too.
                    tokio::spawn(async move {
                        let _ = checker.answer_for(ANSWER_AFTER).await;
                    });
                    let connection = handshake(self.endpoint.connect_with(
                        client,
                        punched.remote,
                        SERVER_NAME,
                    ))
                    .await
                    .map_err(SessionError::NoPath)?;
                    let route = Route::Direct(punched.remote);
                    return Ok((connection, route, PathWatch::fixed(route)));
                }
                Err(error) => {
                    punch_note = error.to_string();
                    channel = checker.into_inner();
                }
            }
        }
        let relay = relay.ok_or_else(|| no_relay(&punch_note))?;
        let client = identity::client_config(identity, outcome, &self.path_settings(true))?;
        agreed
            .relay_leg(relay)
            .join(&mut channel, &JoinConfig::default())
            .await
            .map_err(|e| SessionError::NoPath(format!("{punch_note}; the relay: {e}")))?;
        let connection = handshake(self.endpoint.connect_with(client, relay, SERVER_NAME))
            .await
            .map_err(|e| SessionError::NoPath(format!("{punch_note}; through the relay: {e}")))?;
        let route = Route::Relayed(relay);
        Ok((connection, route, PathWatch::fixed(route)))
    }

    /// The sender's side: checks, then accepts the receiver's dial, direct or relayed.
    async fn accept(
        &mut self,
        agreed: &Agreed<'_>,
    ) -> Result<(quinn::Connection, Route, PathWatch), SessionError> {
        if let Some(relay) = agreed.relay_first() {
            return self.accept_relay_first(agreed, relay).await;
        }
        let Agreed {
            identity,
            outcome,
            ours,
            theirs,
            relay,
            options,
        } = *agreed;
        // Listening before the checks: a receiver that finishes first dials at once.
        let relayed = self.listen_for(identity, outcome)?;
        let channel = self.take_channel()?;
        let leg = relay.map(|addr| agreed.relay_leg(addr));
        let skip_checks = agreed.skip_checks();
        let endpoint = self.endpoint.clone();
        // Everything but the accepting: checks, answering, the relay when needed. It ends
        // only when all of that failed (with why); otherwise the accept ends it.
        let side = async {
            let mut channel = channel;
            let mut note = String::from("the checks were skipped (--relay)");
            if !skip_checks {
                let mut checker = Checker::new(
                    channel,
                    CheckKey::new(*outcome.check_key.expose()),
                    options.punch.clone(),
                );
                match checker.punch(&ours.candidates, &theirs.candidates).await {
                    Ok(_) => {
                        let _ = checker.answer_for(DIRECT_DIAL_WAIT).await;
                        note = "the receiver did not dial the direct path".into();
                    }
                    Err(error) => note = error.to_string(),
                }
                channel = checker.into_inner();
            }
            let Some(leg) = leg else {
                return format!("{note}; the server has no relay");
            };
            match leg.join(&mut channel, &JoinConfig::default()).await {
                Ok(()) => std::future::pending().await,
                Err(error) => format!("{note}; the relay: {error}"),
            }
        };
        let deadline = options.punch.deadline + DIRECT_DIAL_WAIT + 2 * HANDSHAKE_TIMEOUT;
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(deadline, accept_peer(&endpoint, relay, &relayed)) => {
                accepted.map_err(|_| format!(
                    "the receiver never connected in {deadline:?} (the relay paired us)"
                ))
            }
            note = side => {
                // No path from here: a receiver that found one is dialling by now.
                tokio::time::timeout(FAILED_GRACE, accept_peer(&endpoint, relay, &relayed))
                    .await
                    .map_err(|_| note)
            }
        };
        match accepted {
            Ok(Some(connection)) => {
                let remote = connection.remote_address();
                let route = if Some(remote) == relay {
                    Route::Relayed(remote)
                } else {
                    Route::Direct(remote)
                };
                Ok((connection, route, PathWatch::fixed(route)))
            }
            Ok(None) => Err(SessionError::NoPath("the local endpoint closed".into())),
            Err(note) => Err(SessionError::NoPath(note)),
        }
    }

    /// A tunnel's dial: joins the relay, checks for [`upgrade::DIRECT_FIRST`], then
    /// connects directly if the checks succeeded, else through the relay, moving to the
    /// direct path later if the checks (which go on) succeed.
    async fn dial_relay_first(
        &mut self,
        agreed: &Agreed<'_>,
        relay: SocketAddr,
    ) -> Result<(quinn::Connection, Route, PathWatch), SessionError> {
        let Agreed {
            identity, outcome, ..
        } = *agreed;
        let (joined, mut punching) = self.join_then_check(agreed, relay).await?;
        let early = match joined {
            Ok(()) => tokio::time::timeout(upgrade::DIRECT_FIRST, &mut punching)
                .await
                .ok(),
            // No relay: the checks are the only way.
            Err(_) => Some((&mut punching).await),
        };
        let punching = match early {
            Some(Ok((checker, Ok(punched)))) => {
                let remote = punched.remote;
                let client = identity::client_config(identity, outcome, &self.quic)?;
                let connection = handshake(self.endpoint.connect_with(client, remote, SERVER_NAME))
                    .await
                    .map_err(SessionError::NoPath)?;
                let path = self.keep_path(
                    agreed,
                    &connection,
                    remote,
                    joined.is_ok().then_some(relay),
                    upgrade::punched(checker, punched),
                );
                return Ok((connection, Route::Direct(remote), path));
            }
            Some(Ok((checker, Err(error)))) => match &joined {
                Ok(()) => tokio::spawn(async move { (checker, Err(error)) }),
                Err(relay_error) => {
                    return Err(SessionError::NoPath(format!(
                        "{error}; the relay: {relay_error}"
                    )));
                }
            },
            Some(Err(panicked)) => {
                return Err(SessionError::NoPath(format!(
                    "the checks failed: {panicked}"
                )));
            }
            None => punching,
        };
        let client = identity::client_config(identity, outcome, &self.path_settings(true))?;
        let connection = handshake(self.endpoint.connect_with(client, relay, SERVER_NAME))
            .await
            .map_err(|e| SessionError::NoPath(format!("through the relay: {e}")))?;
        let path = self.keep_path(agreed, &connection, relay, Some(relay), punching);
        Ok((connection, Route::Relayed(relay), path))
    }

    /// A tunnel's accept: joins the relay, starts the checks, accepts the first dial
    /// (direct or relayed); a relayed connection moves to the direct path later if the
    /// checks (which go on) succeed.
    async fn accept_relay_first(
        &mut self,
        agreed: &Agreed<'_>,
        relay: SocketAddr,
    ) -> Result<(quinn::Connection, Route, PathWatch), SessionError> {
        let Agreed {
            identity,
            outcome,
            options,
            ..
        } = *agreed;
        let relayed = self.listen_for(identity, outcome)?;
        let (joined, mut punching) = self.join_then_check(agreed, relay).await?;
        let deadline = options.punch.deadline + upgrade::DIRECT_FIRST + 2 * HANDSHAKE_TIMEOUT;
        let endpoint = self.endpoint.clone();
        let accepting = tokio::time::timeout(
            deadline,
            accept_peer(&endpoint, joined.is_ok().then_some(relay), &relayed),
        );
        let accepted = match &joined {
            Ok(()) => accepting.await.map_err(|_| {
                format!("the other side never connected in {deadline:?} (the relay paired us)")
            }),
            // No relay: a dial can only come after the checks succeed.
            Err(relay_error) => {
                tokio::pin!(accepting);
                tokio::select! {
                    accepted = &mut accepting => accepted.map_err(|_| format!("the other side never connected in {deadline:?}")),
                    checked = &mut punching => match checked {
                        Ok((_, Ok(_))) => accepting.await.map_err(|_| "the other side did not dial the direct path".to_owned()),
                        Ok((_, Err(error))) => Err(format!("{error}; the relay: {relay_error}")),
                        Err(panicked) => Err(format!("the checks failed: {panicked}")),
                    },
                }
            }
        };
        let connection = match accepted {
            Ok(Some(connection)) => connection,
            Ok(None) => return Err(SessionError::NoPath("the local endpoint closed".into())),
            Err(note) => return Err(SessionError::NoPath(note)),
        };
        let remote = connection.remote_address();
        let relay = joined.is_ok().then_some(relay);
        let route = if Some(remote) == relay {
            Route::Relayed(remote)
        } else {
            Route::Direct(remote)
        };
        let path = self.keep_path(agreed, &connection, remote, relay, punching);
        Ok((connection, route, path))
    }

    /// Keeps a tunnel's `connection`, made with `anchor` as the peer's address, on the
    /// best path (see [`upgrade`]); `relay` is the relay we joined, if we did.
    fn keep_path(
        &self,
        agreed: &Agreed<'_>,
        connection: &quinn::Connection,
        anchor: SocketAddr,
        relay: Option<SocketAddr>,
        punching: upgrade::Punching,
    ) -> PathWatch {
        let keep = upgrade::Keep {
            connection: connection.clone(),
            socket: Arc::clone(&self.socket),
            anchor,
            relay: relay.map(|addr| agreed.relay_leg(addr)),
            candidates: (
                agreed.ours.candidates.clone(),
                agreed.theirs.candidates.clone(),
            ),
        };
        upgrade::keep_path(keep, punching)
    }

    /// Accepts the peer from now on (its dial pinned to `outcome`'s key); returns the server
    /// settings for a dial that comes through the relay (smaller packets, see
    /// [`PeerSocket::path_settings`]).
    fn listen_for(
        &self,
        identity: &Identity,
        outcome: &Outcome,
    ) -> Result<Arc<quinn::ServerConfig>, SessionError> {
        self.endpoint
            .set_server_config(Some(identity::server_config(
                identity, outcome, &self.quic,
            )?));
        Ok(Arc::new(identity::server_config(
            identity,
            outcome,
            &self.path_settings(true),
        )?))
    }

    /// Joins the relay (first, so the relayed path is ready as early as possible), then
    /// starts the checks on their own task; the join's failure is returned, not fatal.
    async fn join_then_check(
        &mut self,
        agreed: &Agreed<'_>,
        relay: SocketAddr,
    ) -> Result<(Result<(), relay::RelayError>, upgrade::Punching), SessionError> {
        let Agreed {
            outcome,
            ours,
            theirs,
            options,
            ..
        } = *agreed;
        let mut channel = self.take_channel()?;
        let joined = agreed
            .relay_leg(relay)
            .join(&mut channel, &JoinConfig::default())
            .await;
        let checker = Checker::new(
            channel,
            CheckKey::new(*outcome.check_key.expose()),
            options.punch.clone(),
        );
        let punching =
            upgrade::start_punching(checker, ours.candidates.clone(), theirs.candidates.clone());
        Ok((joined, punching))
    }

    /// The settings of a connection on the direct path or through the relay. The relay
    /// forwards GSO batches whole (`relay::udp::batch`), so a relayed connection keeps GSO-sized
    /// packets: loopback's single 64 KiB packets measured 1.3-4x slower relayed (when the
    /// relay still forwarded one datagram per call), and 1.2x faster direct.
    fn path_settings(&self, relayed: bool) -> QuicSettings {
        if relayed && self.quic.max_udp_payload > MAX_GSO_UDP_PAYLOAD {
            QuicSettings {
                max_udp_payload: MAX_GSO_UDP_PAYLOAD,
                segmentation_offload: true,
                ..self.quic.clone()
            }
        } else {
            self.quic.clone()
        }
    }

    fn take_channel(&mut self) -> Result<StunChannel, SessionError> {
        self.channel
            .take()
            .ok_or_else(|| SessionError::NoPath("the peer socket was already used".into()))
    }
}

/// The first incoming connection whose handshake succeeds (the TLS config admits only the
/// peer); `None` when the endpoint closed. One from the relay at `relay` gets `relayed`'s
/// settings.
async fn accept_peer(
    endpoint: &quinn::Endpoint,
    relay: Option<SocketAddr>,
    relayed: &Arc<quinn::ServerConfig>,
) -> Option<quinn::Connection> {
    while let Some(incoming) = endpoint.accept().await {
        let connecting = if Some(incoming.remote_address()) == relay {
            incoming.accept_with(Arc::clone(relayed))
        } else {
            incoming.accept()
        };
        let Ok(connecting) = connecting else { continue };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await {
            Ok(Ok(connection)) => return Some(connection),
            Ok(Err(error)) => {
                tracing::debug!(event = "p2p_handshake_refused", %error, "a dial that was not the peer's");
            }
            Err(_) => {}
        }
    }
    None
}

/// Finishes a dial within [`HANDSHAKE_TIMEOUT`].
async fn handshake(
    connecting: Result<quinn::Connecting, quinn::ConnectError>,
) -> Result<quinn::Connection, String> {
    let connecting = connecting.map_err(|e| format!("cannot dial: {e}"))?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(format!("the QUIC handshake failed: {error}")),
        Err(_) => Err(format!(
            "the QUIC handshake did not finish within {HANDSHAKE_TIMEOUT:?}"
        )),
    }
}

fn no_relay(punch_note: &str) -> SessionError {
    SessionError::NoPath(format!(
        "{punch_note}; and the server offers no relay (its [server.p2p] has no UDP port)"
    ))
}

/// Both peers on this machine talk over loopback; elsewhere the socket listens on every
/// address of the server's family.
fn default_bind_ip(server: IpAddr) -> IpAddr {
    match server {
        ip if ip.is_loopback() => ip,
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_offer_round_trips_and_other_bodies_are_refused() {
        let offer = PathOffer {
            purpose: Purpose::Tunnel,
            candidates: Candidates::gather("127.0.0.1:4000".parse().unwrap(), None),
            relay_only: true,
        };
        let back = PathOffer::decode(&offer.encode()).unwrap();
        assert_eq!(back.candidates, offer.candidates);
        assert!(back.relay_only);
        assert_eq!(back.purpose, Purpose::Tunnel);
        // An offer from a peer that only knew file transfers.
        let old = PathOffer::decode(br#"P{"candidates":{"list":[]},"relay_only":false}"#);
        assert_eq!(old.unwrap().purpose, Purpose::Files);
        assert!(PathOffer::decode(&[1, 1, 0]).is_err());
        assert!(PathOffer::decode(b"P{not json").is_err());
        assert!(PathOffer::decode(&[]).is_err());
    }

    #[test]
    fn peers_on_a_loopback_server_bind_loopback() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(default_bind_ip(ip("127.0.0.1")), ip("127.0.0.1"));
        assert_eq!(default_bind_ip(ip("::1")), ip("::1"));
        assert!(default_bind_ip(ip("203.0.113.1")).is_unspecified());
        assert!(default_bind_ip(ip("2001:db8::1")).is_ipv6());
    }
}
