//! Control messages and their codec.
//!
//! Every message after the handshake travels inside one sealed record of kind `Control`
//! (see `docs/protocol.md`), serialized with postcard. The record layer already bounds a
//! record to 64 KiB; [`decode`] additionally refuses anything over [`MAX_CONTROL_LEN`] before
//! looking at it, so a peer cannot make us build large values.
//!
//! Message flow on a control channel:
//!
//! ```text
//! client                                   server
//!   HelloPart { mode, claims, more }   ->   (v2: as many parts as the claims need)
//!                                       <-  HelloReplyPart { verdicts, more }
//!                                       <-  Refuse { reason, retry }  (instead, then close)
//!   Hello { services + token proofs }  ->   (v1: one message)
//!                                       <-  HelloReply { one verdict per service }
//!                                       <-  Ping { seq }      (every heartbeat_interval)
//!   Pong { seq }                       ->
//!                                       <-  NeedChannels { count }  (pool ran dry)
//!                                       <-  Reclaim { reason }  (claim again: config changed)
//!   Health { services, ready }        ->   (v2: targets failed or recovered)
//!                                       <-  Draining { reason }  (no new streams here)
//!   Goodbye { reason }                <->   (orderly shutdown, either side)
//! ```
//!
//! A message kind this version does not know (a later version's) decodes as
//! [`DecodeError::UnknownKind`], which the session skips: new kinds never end an old peer's
//! session. (Releases before `Draining` end the session on one instead, and reconnect.)
//!
//! A v2 hello travels in parts ([`hello_parts`]) so that a client with thousands of
//! services never meets the size cap; the server collects them ([`HelloAssembler`]) and
//! judges them all at once, so the hello stays one atomic decision. The reply comes back
//! the same way ([`reply_parts`], [`ReplyAssembler`]).
//!
//! On a data channel the opener's first record is an [`StreamOpen`], then data records.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Largest encoded control message we accept. Hellos with a few hundred services fit easily.
pub const MAX_CONTROL_LEN: usize = 16 * 1024;

/// Most claims (or verdicts, or names) in one control message.
pub const MAX_SERVICES_PER_SESSION: usize = 256;

/// Most claims one v2 hello may make across all its parts: bounds the server's work and
/// memory per hello (a claim costs the server ~200 bytes while the hello is judged).
pub const MAX_CLAIMS_PER_HELLO: usize = 16_384;

/// What a message part may hold in encoded claims, verdicts or names: the size cap less
/// room for the message's own framing.
const PART_BUDGET: usize = MAX_CONTROL_LEN - 256;

/// Longest service name, in bytes.
pub const MAX_SERVICE_NAME_LEN: usize = 64;

/// Length of a token proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;

/// Longest `HOST:PORT` a forward claim may name as its target.
pub const MAX_TARGET_LEN: usize = 300;
/// Most host names in a [`ClaimKind::DeclaredHttp`] claim or URLs in a
/// [`Verdict::AcceptedHttp`].
pub const MAX_HTTP_NAMES: usize = 16;
/// Longest host name (or URL) in them.
pub const MAX_HTTP_NAME_LEN: usize = 300;

/// Longest refusal reason in a [`Verdict::Denied`].
pub const MAX_REASON_LEN: usize = 1024;

/// A client's claim to serve one service, proving it knows the service token without
/// sending it: `proof = HMAC-SHA256(token, "warren token proof" || handshake hash || name)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaim {
    /// The service name, as in both configs.
    pub name: String,
    /// The token proof, bound to this handshake so it cannot be replayed elsewhere.
    pub proof: [u8; PROOF_LEN],
    /// Which way the service's streams go, as the client's config sees it.
    pub kind: ClaimKind,
}

/// What a client claims a service as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimKind {
    /// A service in the server's config that the server binds (visitors come to the server).
    Reverse,
    /// A forward service: the client binds, the server dials a target its config names.
    /// With `target`, the server picks its forward service whose target is exactly this
    /// `HOST:PORT` (the token proof is then checked against that service's token); without,
    /// it looks the service up by name.
    Forward {
        /// The target the client asks for, if it selects by target.
        target: Option<String>,
    },
    /// A service the server's config does not list (frp/bore style): the server binds
    /// `remote_bind` (port 0: any free port) if its `allow_ports` / `allow_bind_addrs` allow
    /// it; the proof is checked against the server's `default_token`.
    Declared {
        /// Where the client wants visitors to connect at the server.
        remote_bind: SocketAddr,
    },
    /// As [`ClaimKind::Forward`], for a UDP forward service: the client binds a UDP port and
    /// the server sends each flow's datagrams to the target. A separate variant (rather than
    /// a field) so the encodings of the TCP claims stay what they were.
    ForwardUdp {
        /// The target the client asks for, if it selects by target.
        target: Option<String>,
    },
    /// As [`ClaimKind::Declared`], for a UDP service: the server binds a UDP socket.
    DeclaredUdp {
        /// Where the client wants visitors to send datagrams at the server.
        remote_bind: SocketAddr,
    },
    /// An HTTP service the server's config does not list (ngrok style): the server routes
    /// requests for `subdomain` under its `subdomain_host`, and for `hosts` its
    /// `allow_hosts` permit, on its HTTP ports; the proof is checked against its
    /// `default_token`. Appended last so the earlier variants keep their encodings.
    DeclaredHttp {
        /// One DNS label: the service is `SUBDOMAIN.<subdomain_host>`.
        subdomain: Option<String>,
        /// Full host names.
        hosts: Vec<String>,
    },
}

/// What a v2 hello asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloMode {
    /// Serve the accepted services: a client.
    Serve,
    /// Judge every claim and answer, but serve nothing and take nothing over: `warren
    /// doctor` and `warren ping` prove tokens without changing what the server serves.
    Probe,
}

/// A claim in a v2 hello: the v1 claim plus how the client wants to be balanced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloClaim {
    /// Name, token proof and direction, as in v1.
    pub claim: ServiceClaim,
    /// This client's relative share of the service's visitors (1 when unset).
    pub weight: u16,
    /// `false` when the client's health check already finds the target down: the server
    /// registers the session but picks it only after a [`ControlMessage::Health`] says so.
    pub ready: bool,
}

/// Which transport protocol a claimed service carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Streams.
    Tcp,
    /// Datagrams.
    Udp,
}

impl ClaimKind {
    /// The protocol the claim says the service carries; `None` for a reverse claim, whose
    /// protocol is whatever the server's config says.
    pub fn protocol(&self) -> Option<Protocol> {
        match self {
            ClaimKind::Reverse => None,
            ClaimKind::Forward { .. }
            | ClaimKind::Declared { .. }
            | ClaimKind::DeclaredHttp { .. } => Some(Protocol::Tcp),
            ClaimKind::ForwardUdp { .. } | ClaimKind::DeclaredUdp { .. } => Some(Protocol::Udp),
        }
    }
}

/// The server's answer for one claimed service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The service is now served by this session.
    Accepted {
        /// For a declared service, the address the server bound (the real port when the
        /// client asked for port 0).
        bound: Option<SocketAddr>,
    },
    /// Unknown service or wrong token: deliberately the same answer for both.
    Refused,
    /// The token was right but the server cannot serve the claim; the reason says why
    /// (port outside `allow_ports`, port in use, wrong direction).
    Denied {
        /// For the client's log.
        reason: String,
    },
    /// A declared HTTP service is routed: visitors reach it at these URLs. Only ever sent
    /// for a [`ClaimKind::DeclaredHttp`] claim, which older clients never make.
    AcceptedHttp {
        /// `http://NAME[:PORT]/` (and `https://…` when the server terminates TLS for it).
        urls: Vec<String>,
    },
}

/// Messages on the control channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ControlMessage {
    /// Client → server, first message: the services this client serves.
    Hello {
        /// One claim per service.
        services: Vec<ServiceClaim>,
    },
    /// Server → client: one verdict per claim, in the same order.
    HelloReply {
        /// Verdicts, index-aligned with the hello's claims.
        verdicts: Vec<Verdict>,
    },
    /// Liveness probe; the peer answers with `Pong` carrying the same `seq`.
    Ping {
        /// Echoed in the pong.
        seq: u64,
    },
    /// Answer to `Ping`.
    Pong {
        /// The ping's `seq`.
        seq: u64,
    },
    /// Server → client: open this many more data channels, the pool ran dry.
    NeedChannels {
        /// How many channels to add.
        count: u16,
    },
    /// Orderly end of the session.
    Goodbye {
        /// Why, for the peer's log.
        reason: String,
    },
    /// Server → client: what this session was granted changed (the server's config was
    /// reloaded); establish a new session, claiming again, and then end this one. A server
    /// ends the session itself if the client does not within its grace period.
    ///
    /// Added after the first release, at the end of the enum: older peers' variants keep
    /// their postcard indices, and an older client that cannot decode it ends the session
    /// and reconnects, which comes to the same.
    Reclaim {
        /// Why, for the client's log.
        reason: String,
    },
    /// Client → server (protocol v2): one part of the hello. Parts follow each other with
    /// `more = true` until the last; every part carries the same `mode`.
    HelloPart {
        /// Serve or only probe.
        mode: HelloMode,
        /// Some of the claims, in order.
        claims: Vec<HelloClaim>,
        /// Whether more parts follow.
        more: bool,
    },
    /// Server → client (protocol v2): one part of the reply, verdicts in claim order.
    HelloReplyPart {
        /// Some of the verdicts, in order.
        verdicts: Vec<Verdict>,
        /// Whether more parts follow.
        more: bool,
    },
    /// Server → client (protocol v2), instead of a reply: the server will not serve this
    /// client and closes; the reason names the problem and its fix.
    Refuse {
        /// For the client's log.
        reason: String,
        /// Whether trying again later may work (the server is full), or only a change of
        /// config or version will (too large, protocol violation).
        retry: bool,
    },
    /// Client → server (protocol v2): the targets of these services stopped (`ready =
    /// false`) or started (`true`) passing their health check; the server stops or resumes
    /// picking this session for their visitors.
    Health {
        /// Service names the client claimed.
        services: Vec<String>,
        /// The new state.
        ready: bool,
    },
    /// Client → server: an operation on the peer-to-peer mailbox (the rendezvous of
    /// `warren send` / `warren receive`; the server must have `[server.p2p]`).
    Mailbox {
        /// What to do.
        op: MailboxOp,
    },
    /// Server → client: what happened at the client's nameplate.
    MailboxEvent {
        /// What happened.
        event: MailboxEvent,
    },
    /// Either way: one datagram of a peer-to-peer transfer relayed over this session
    /// instead of UDP (a peer whose UDP is blocked). The server's relay treats the session
    /// as one leg; the bytes are the QUIC packets and relay binds the UDP leg would carry.
    P2pDatagram {
        /// The datagram, at most [`MAX_P2P_DATAGRAM`] bytes.
        bytes: Vec<u8>,
    },
    /// Server → client: this server is draining for a restart. It takes no new visitors
    /// and no new sessions; the streams in flight finish, then it ends the session. The
    /// client opens no new forward streams through it and reconnects once it is gone (to
    /// its successor).
    Draining {
        /// Why, for the client's log.
        reason: String,
    },
}

/// How many kinds of [`ControlMessage`] this version knows: the postcard index of the
/// first kind it does not.
const CONTROL_KINDS: u32 = 15;

/// Most bytes of one [`ControlMessage::P2pDatagram`] (the largest UDP payload).
pub const MAX_P2P_DATAGRAM: usize = 65_527;

/// Most bytes of one mailbox message body (PAKE messages and candidates are far smaller).
pub const MAX_MAILBOX_BODY: usize = 4096;

/// A client's operation on the mailbox. A session holds at most one nameplate at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MailboxOp {
    /// Take a fresh nameplate (the sender's side).
    Allocate,
    /// Join the nameplate another client allocated (the receiver's side).
    Claim {
        /// The number from the code.
        nameplate: u32,
    },
    /// Pass a message to the other side (queued, bounded, until it joins).
    Send {
        /// Opaque to the server (PAKE messages, sealed candidates).
        body: Vec<u8>,
    },
    /// Leave the nameplate. `failed`: the exchange failed (a wrong code); after a few
    /// failures the server burns the nameplate so guessing stops.
    Release {
        /// Whether the PAKE failed.
        failed: bool,
    },
    /// Offer the named P2P service `service` (`[server.p2p.services]`): the server keeps a
    /// nameplate for it while this session lives, which visitors reach by the name
    /// ([`MailboxOp::VisitService`]) and never by its number. Answered like
    /// [`MailboxOp::Allocate`].
    OfferService {
        /// The service name, as in the server's config.
        service: String,
        /// The service token's proof, bound to this session's handshake.
        proof: [u8; PROOF_LEN],
    },
    /// Join the nameplate of the named P2P service `service` (its visitor's side).
    /// Answered like [`MailboxOp::Claim`].
    VisitService {
        /// The service name.
        service: String,
        /// The service token's proof, bound to this session's handshake.
        proof: [u8; PROOF_LEN],
    },
    /// Ask for the server's P2P UDP ports (no nameplate taken): `warren doctor`'s NAT-type
    /// probe. Answered with [`MailboxEvent::Info`].
    Info,
}

/// What the server tells a mailbox client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MailboxEvent {
    /// The nameplate this session allocated.
    Allocated {
        /// Its number.
        nameplate: u32,
        /// The server's UDP port for P2P (address reflector and relay), on the host the
        /// client reached the server at; `None` when the server runs neither.
        udp_port: Option<u16>,
    },
    /// This session joined the nameplate.
    Claimed {
        /// As in [`MailboxEvent::Allocated`].
        udp_port: Option<u16>,
    },
    /// The other side joined.
    PeerJoined,
    /// A message from the other side.
    Message {
        /// As the other side sent it.
        body: Vec<u8>,
    },
    /// The other side left (or its session ended).
    PeerLeft,
    /// The operation was refused; the reason names the problem and the fix.
    Refused {
        /// For the user.
        reason: String,
    },
    /// Too many failed exchanges: the nameplate is gone; start again with a new code.
    Burned,
    /// Another receiver is at the nameplate now (the sender serves receivers one at a
    /// time at the mailbox): try again in a moment. Not counted against the rate limit.
    Busy,
    /// The answer to [`MailboxOp::Info`].
    Info {
        /// As in [`MailboxEvent::Allocated`].
        udp_port: Option<u16>,
        /// The reflector's second port (same host): a request to it with
        /// WARREN-CHANGE-PORT is answered from `udp_port`.
        udp_alt_port: Option<u16>,
    },
}

/// First record on a data channel: which service this stream belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOpen {
    /// The service name.
    pub service: String,
    /// The visitor's address (source of the connection to the bound port), for the PROXY
    /// protocol header towards the target. `None` when unknown (UDP channels).
    pub visitor: Option<SocketAddr>,
    /// The address the visitor connected to (the bound port), the header's destination.
    pub local: Option<SocketAddr>,
}

impl StreamOpen {
    /// A stream open for `service` with no addresses.
    pub fn new(service: impl Into<String>) -> Self {
        StreamOpen {
            service: service.into(),
            visitor: None,
            local: None,
        }
    }
}

/// Why bytes could not be decoded as a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The encoded message is larger than the protocol allows.
    #[error("control message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Length seen.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The bytes are not a valid message (corrupt, or a peer speaking another version).
    #[error("malformed control message: {0}")]
    Malformed(postcard::Error),
    /// A field is out of the protocol's bounds.
    #[error("control message field `{field}` out of bounds: {len} > {max}")]
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Length seen.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A control message of a kind this version does not know, from a later version: a
    /// session skips it (its sender does not rely on an answer); in a hello it is a
    /// protocol violation.
    #[error("control message of unknown kind {0} (from a later version?)")]
    UnknownKind(u32),
}

/// Encodes a message.
///
/// Encoding a value of our own types into a `Vec` cannot fail except by exhausting
/// memory, which aborts anyway; the `Result` is mapped for postcard's sake.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Invariant: postcard's `to_allocvec` only fails for types it cannot represent
    // (e.g. maps with unknown length), which none of our message types contain.
    postcard::to_allocvec(message).expect("control messages always serialize")
}

/// Decodes a control-channel message, checking the size cap first.
///
/// # Errors
/// [`DecodeError::TooLarge`] before reading anything when `bytes` exceeds
/// [`MAX_CONTROL_LEN`]; [`DecodeError::Malformed`] for bytes that are not a message;
/// [`DecodeError::FieldTooLong`] for too many services or too long names.
pub fn decode_control(bytes: &[u8]) -> Result<ControlMessage, DecodeError> {
    let message: ControlMessage = match decode(bytes) {
        Ok(message) => message,
        // The kind is the leading varint: a later version's kind is told apart from
        // garbage (the size cap was checked first and stays the answer).
        Err(DecodeError::Malformed(error)) => {
            return Err(match postcard::take_from_bytes::<u32>(bytes) {
                Ok((kind, _)) if kind >= CONTROL_KINDS => DecodeError::UnknownKind(kind),
                _ => DecodeError::Malformed(error),
            });
        }
        Err(error) => return Err(error),
    };
    if let ControlMessage::Hello { services } = &message {
        check_len("services", services.len(), MAX_SERVICES_PER_SESSION)?;
        for claim in services {
            check_claim(claim)?;
        }
    }
    if let ControlMessage::HelloReply { verdicts } = &message {
        check_verdicts(verdicts)?;
    }
    match &message {
        ControlMessage::HelloPart { claims, .. } => {
            check_len("services", claims.len(), MAX_SERVICES_PER_SESSION)?;
            for claim in claims {
                check_claim(&claim.claim)?;
            }
        }
        ControlMessage::HelloReplyPart { verdicts, .. } => check_verdicts(verdicts)?,
        ControlMessage::Goodbye { reason }
        | ControlMessage::Reclaim { reason }
        | ControlMessage::Draining { reason }
        | ControlMessage::Refuse { reason, .. } => {
            check_len("reason", reason.len(), MAX_REASON_LEN)?
        }
        ControlMessage::Health { services, .. } => {
            check_len("services", services.len(), MAX_SERVICES_PER_SESSION)?;
            for name in services {
                check_len("service name", name.len(), MAX_SERVICE_NAME_LEN)?;
            }
        }
        ControlMessage::Mailbox {
            op: MailboxOp::Send { body },
        }
        | ControlMessage::MailboxEvent {
            event: MailboxEvent::Message { body },
        } => check_len("mailbox body", body.len(), MAX_MAILBOX_BODY)?,
        ControlMessage::MailboxEvent {
            event: MailboxEvent::Refused { reason },
        } => check_len("reason", reason.len(), MAX_REASON_LEN)?,
        ControlMessage::P2pDatagram { bytes } => {
            check_len("p2p datagram", bytes.len(), MAX_P2P_DATAGRAM)?
        }
        _ => {}
    }
    Ok(message)
}

/// Decodes the first record of a data channel.
///
/// # Errors
/// As [`decode_control`].
pub fn decode_stream_open(bytes: &[u8]) -> Result<StreamOpen, DecodeError> {
    let open: StreamOpen = decode(bytes)?;
    check_len("service name", open.service.len(), MAX_SERVICE_NAME_LEN)?;
    Ok(open)
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    if bytes.len() > MAX_CONTROL_LEN {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_CONTROL_LEN,
        });
    }
    postcard::from_bytes(bytes).map_err(DecodeError::Malformed)
}

fn check_claim(claim: &ServiceClaim) -> Result<(), DecodeError> {
    check_len("service name", claim.name.len(), MAX_SERVICE_NAME_LEN)?;
    if let ClaimKind::DeclaredHttp { subdomain, hosts } = &claim.kind {
        check_len("subdomain", subdomain.as_ref().map_or(0, String::len), 63)?;
        check_len("hosts", hosts.len(), MAX_HTTP_NAMES)?;
        for host in hosts {
            check_len("host", host.len(), MAX_HTTP_NAME_LEN)?;
        }
    }
    if let ClaimKind::Forward {
        target: Some(target),
    }
    | ClaimKind::ForwardUdp {
        target: Some(target),
    } = &claim.kind
    {
        check_len("target", target.len(), MAX_TARGET_LEN)?;
    }
    Ok(())
}

fn check_verdicts(verdicts: &[Verdict]) -> Result<(), DecodeError> {
    check_len("verdicts", verdicts.len(), MAX_SERVICES_PER_SESSION)?;
    for verdict in verdicts {
        if let Verdict::Denied { reason } = verdict {
            check_len("reason", reason.len(), MAX_REASON_LEN)?;
        }
        if let Verdict::AcceptedHttp { urls } = verdict {
            check_len("urls", urls.len(), MAX_HTTP_NAMES)?;
            for url in urls {
                check_len("url", url.len(), MAX_HTTP_NAME_LEN)?;
            }
        }
    }
    Ok(())
}

/// Splits `items` into runs that each encode within the part budget and the per-message
/// count, keeping order; always at least one (possibly empty) run.
fn split_parts<T: Serialize>(items: Vec<T>) -> Vec<Vec<T>> {
    let mut parts = vec![Vec::new()];
    let mut used = 0;
    for item in items {
        let size = encode(&item).len();
        let last = parts.last_mut().expect("never empty");
        if !last.is_empty() && (used + size > PART_BUDGET || last.len() >= MAX_SERVICES_PER_SESSION)
        {
            parts.push(Vec::new());
            used = 0;
        }
        used += size;
        parts.last_mut().expect("never empty").push(item);
    }
    parts
}

/// A v2 hello as the control messages that carry it, each under [`MAX_CONTROL_LEN`].
pub fn hello_parts(mode: HelloMode, claims: Vec<HelloClaim>) -> Vec<ControlMessage> {
    let parts = split_parts(claims);
    let count = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, claims)| ControlMessage::HelloPart {
            mode,
            claims,
            more: i + 1 < count,
        })
        .collect()
}

/// A v2 hello reply as the control messages that carry it.
pub fn reply_parts(verdicts: Vec<Verdict>) -> Vec<ControlMessage> {
    let parts = split_parts(verdicts);
    let count = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, verdicts)| ControlMessage::HelloReplyPart {
            verdicts,
            more: i + 1 < count,
        })
        .collect()
}

/// A health change as the control messages that carry it.
pub fn health_parts(services: Vec<String>, ready: bool) -> Vec<ControlMessage> {
    split_parts(services)
        .into_iter()
        .filter(|part| !part.is_empty())
        .map(|services| ControlMessage::Health { services, ready })
        .collect()
}

/// Why a multi-part hello or reply was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    /// More claims than [`MAX_CLAIMS_PER_HELLO`].
    #[error(
        "the hello claims more than {max} services; split them over several clients (or raise the limit in a newer Warren)"
    )]
    TooManyClaims {
        /// The limit.
        max: usize,
    },
    /// A part's mode differs from the first part's.
    #[error("the hello's parts disagree about their mode")]
    ModeChanged,
    /// The reply has more or fewer verdicts than the hello had claims.
    #[error("the reply has {got} verdicts for {expected} claims")]
    VerdictCount {
        /// Verdicts received so far.
        got: usize,
        /// Claims sent.
        expected: usize,
    },
}

/// Collects the parts of a v2 hello, within [`MAX_CLAIMS_PER_HELLO`].
#[derive(Debug, Default)]
pub struct HelloAssembler {
    mode: Option<HelloMode>,
    claims: Vec<HelloClaim>,
}

impl HelloAssembler {
    /// Takes one part; returns the whole hello once the last part is in.
    ///
    /// # Errors
    /// [`AssembleError`] for too many claims or parts that disagree about the mode.
    pub fn push(
        &mut self,
        mode: HelloMode,
        claims: Vec<HelloClaim>,
        more: bool,
    ) -> Result<Option<(HelloMode, Vec<HelloClaim>)>, AssembleError> {
        if *self.mode.get_or_insert(mode) != mode {
            return Err(AssembleError::ModeChanged);
        }
        if self.claims.len() + claims.len() > MAX_CLAIMS_PER_HELLO {
            return Err(AssembleError::TooManyClaims {
                max: MAX_CLAIMS_PER_HELLO,
            });
        }
        self.claims.extend(claims);
        if more {
            return Ok(None);
        }
        Ok(Some((mode, std::mem::take(&mut self.claims))))
    }
}

/// Collects the parts of a v2 hello reply, expecting one verdict per claim sent.
#[derive(Debug)]
pub struct ReplyAssembler {
    expected: usize,
    verdicts: Vec<Verdict>,
}

impl ReplyAssembler {
    /// Expects `expected` verdicts.
    pub fn new(expected: usize) -> Self {
        ReplyAssembler {
            expected,
            verdicts: Vec::new(),
        }
    }

    /// Takes one part; returns every verdict once the last part is in.
    ///
    /// # Errors
    /// [`AssembleError::VerdictCount`] when the parts hold more or fewer verdicts than
    /// expected.
    pub fn push(
        &mut self,
        verdicts: Vec<Verdict>,
        more: bool,
    ) -> Result<Option<Vec<Verdict>>, AssembleError> {
        let got = self.verdicts.len() + verdicts.len();
        if got > self.expected || (!more && got != self.expected) {
            return Err(AssembleError::VerdictCount {
                got,
                expected: self.expected,
            });
        }
        self.verdicts.extend(verdicts);
        Ok((!more).then(|| std::mem::take(&mut self.verdicts)))
    }
}

fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), DecodeError> {
    if len > max {
        Err(DecodeError::FieldTooLong { field, len, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_message() -> impl Strategy<Value = ControlMessage> {
        let kind = prop_oneof![
            Just(ClaimKind::Reverse),
            proptest::option::of("[a-z0-9.:-]{1,40}")
                .prop_map(|target| ClaimKind::Forward { target }),
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| ClaimKind::Declared {
                remote_bind: SocketAddr::from((ip, port))
            }),
            proptest::option::of("[a-z0-9.:-]{1,40}")
                .prop_map(|target| ClaimKind::ForwardUdp { target }),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| ClaimKind::DeclaredUdp {
                remote_bind: SocketAddr::from((ip, port))
            }),
        ];
        let claim = ("[a-z0-9-]{1,64}", any::<[u8; 32]>(), kind)
            .prop_map(|(name, proof, kind)| ServiceClaim { name, proof, kind });
        let verdict = prop_oneof![
            Just(Verdict::Accepted { bound: None }),
            any::<u16>().prop_map(|port| Verdict::Accepted {
                bound: Some(SocketAddr::from(([127, 0, 0, 1], port)))
            }),
            Just(Verdict::Refused),
            ".{0,100}".prop_map(|reason| Verdict::Denied { reason }),
        ];
        prop_oneof![
            prop::collection::vec(claim.clone(), 0..20)
                .prop_map(|services| ControlMessage::Hello { services }),
            prop::collection::vec(verdict.clone(), 0..20)
                .prop_map(|verdicts| ControlMessage::HelloReply { verdicts }),
            any::<u64>().prop_map(|seq| ControlMessage::Ping { seq }),
            any::<u64>().prop_map(|seq| ControlMessage::Pong { seq }),
            any::<u16>().prop_map(|count| ControlMessage::NeedChannels { count }),
            ".{0,100}".prop_map(|reason| ControlMessage::Goodbye { reason }),
            ".{0,100}".prop_map(|reason| ControlMessage::Reclaim { reason }),
            ".{0,100}".prop_map(|reason| ControlMessage::Draining { reason }),
            (
                prop::collection::vec((claim, any::<u16>(), any::<bool>()), 0..20),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(claims, probe, more)| ControlMessage::HelloPart {
                    mode: if probe {
                        HelloMode::Probe
                    } else {
                        HelloMode::Serve
                    },
                    claims: claims
                        .into_iter()
                        .map(|(claim, weight, ready)| HelloClaim {
                            claim,
                            weight,
                            ready
                        })
                        .collect(),
                    more,
                }),
            (prop::collection::vec(verdict, 0..20), any::<bool>())
                .prop_map(|(verdicts, more)| ControlMessage::HelloReplyPart { verdicts, more }),
            (".{0,100}", any::<bool>())
                .prop_map(|(reason, retry)| ControlMessage::Refuse { reason, retry }),
            (
                prop::collection::vec("[a-z0-9-]{1,64}", 0..20),
                any::<bool>()
            )
                .prop_map(|(services, ready)| ControlMessage::Health { services, ready }),
            prop_oneof![
                Just(MailboxOp::Allocate),
                any::<u32>().prop_map(|nameplate| MailboxOp::Claim { nameplate }),
                prop::collection::vec(any::<u8>(), 0..200)
                    .prop_map(|body| MailboxOp::Send { body }),
                any::<bool>().prop_map(|failed| MailboxOp::Release { failed }),
                ("[a-z]{1,12}", any::<[u8; PROOF_LEN]>())
                    .prop_map(|(service, proof)| MailboxOp::OfferService { service, proof }),
                ("[a-z]{1,12}", any::<[u8; PROOF_LEN]>())
                    .prop_map(|(service, proof)| MailboxOp::VisitService { service, proof }),
            ]
            .prop_map(|op| ControlMessage::Mailbox { op }),
            prop_oneof![
                (any::<u32>(), any::<Option<u16>>()).prop_map(|(nameplate, udp_port)| {
                    MailboxEvent::Allocated {
                        nameplate,
                        udp_port,
                    }
                }),
                any::<Option<u16>>().prop_map(|udp_port| MailboxEvent::Claimed { udp_port }),
                Just(MailboxEvent::PeerJoined),
                prop::collection::vec(any::<u8>(), 0..200)
                    .prop_map(|body| MailboxEvent::Message { body }),
                Just(MailboxEvent::PeerLeft),
                ".{0,100}".prop_map(|reason| MailboxEvent::Refused { reason }),
                Just(MailboxEvent::Burned),
                Just(MailboxEvent::Busy),
            ]
            .prop_map(|event| ControlMessage::MailboxEvent { event }),
            prop::collection::vec(any::<u8>(), 0..300)
                .prop_map(|bytes| ControlMessage::P2pDatagram { bytes }),
        ]
    }

    proptest! {
        #[test]
        fn control_round_trip(message in arb_message()) {
            prop_assert_eq!(decode_control(&encode(&message)), Ok(message));
        }

        #[test]
        fn stream_open_round_trip(service in "[a-z0-9_.-]{1,64}", port in any::<u16>()) {
            let open = StreamOpen {
                service,
                visitor: Some(SocketAddr::from(([127, 0, 0, 2], port))),
                local: Some("[::1]:8080".parse().expect("addr")),
            };
            prop_assert_eq!(decode_stream_open(&encode(&open)), Ok(open));
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_control(&bytes);
            let _ = decode_stream_open(&bytes);
        }
    }

    #[test]
    fn claim_kind_indices_are_stable() {
        // docs/protocol.md lists these indices; the UDP variants were appended so the
        // encodings of the older claims did not change.
        let addr = SocketAddr::from(([127, 0, 0, 1], 1));
        let index = |kind: ClaimKind| encode(&kind)[0];
        assert_eq!(index(ClaimKind::Reverse), 0);
        assert_eq!(index(ClaimKind::Forward { target: None }), 1);
        assert_eq!(index(ClaimKind::Declared { remote_bind: addr }), 2);
        assert_eq!(index(ClaimKind::ForwardUdp { target: None }), 3);
        assert_eq!(index(ClaimKind::DeclaredUdp { remote_bind: addr }), 4);
        assert_eq!(
            index(ClaimKind::DeclaredHttp {
                subdomain: None,
                hosts: Vec::new()
            }),
            5
        );
        assert_eq!(
            ClaimKind::DeclaredUdp { remote_bind: addr }.protocol(),
            Some(Protocol::Udp)
        );
        assert_eq!(ClaimKind::Reverse.protocol(), None);
    }

    #[test]
    fn oversized_is_refused_before_parsing() {
        let big = vec![0u8; MAX_CONTROL_LEN + 1];
        assert!(matches!(
            decode_control(&big),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    fn hello_claim(i: usize, name_len: usize) -> HelloClaim {
        let mut name = format!("svc{i}-");
        name.extend(std::iter::repeat_n(
            'x',
            name_len.saturating_sub(name.len()),
        ));
        HelloClaim {
            claim: ServiceClaim {
                name,
                proof: [7; PROOF_LEN],
                kind: ClaimKind::Forward {
                    target: Some("a-rather-long-target-name.example.com:65535".into()),
                },
            },
            weight: 1,
            ready: true,
        }
    }

    #[test]
    fn ten_thousand_claims_travel_in_parts_under_the_cap() {
        let claims: Vec<HelloClaim> = (0..10_000)
            .map(|i| hello_claim(i, MAX_SERVICE_NAME_LEN))
            .collect();
        let parts = hello_parts(HelloMode::Serve, claims.clone());
        assert!(parts.len() > 40, "{} parts", parts.len());
        let mut assembler = HelloAssembler::default();
        let mut whole = None;
        for (i, part) in parts.iter().enumerate() {
            let bytes = encode(part);
            assert!(
                bytes.len() <= MAX_CONTROL_LEN,
                "part {i}: {} bytes",
                bytes.len()
            );
            let Ok(ControlMessage::HelloPart { mode, claims, more }) = decode_control(&bytes)
            else {
                panic!("part {i} did not decode");
            };
            assert_eq!(more, i + 1 < parts.len());
            whole = assembler.push(mode, claims, more).expect("within bounds");
        }
        assert_eq!(whole, Some((HelloMode::Serve, claims)));
    }

    #[test]
    fn an_empty_hello_is_one_part() {
        let parts = hello_parts(HelloMode::Probe, Vec::new());
        assert_eq!(
            parts,
            vec![ControlMessage::HelloPart {
                mode: HelloMode::Probe,
                claims: Vec::new(),
                more: false
            }]
        );
        assert_eq!(health_parts(Vec::new(), true), Vec::new());
    }

    #[test]
    fn replies_travel_in_parts_and_must_match_the_claims() {
        let verdicts: Vec<Verdict> = (0..3000)
            .map(|i| Verdict::Denied {
                reason: format!("{i}: {}", "r".repeat(200)),
            })
            .collect();
        let parts = reply_parts(verdicts.clone());
        assert!(parts.len() > 10);
        let mut assembler = ReplyAssembler::new(3000);
        let mut whole = None;
        for part in parts {
            let bytes = encode(&part);
            assert!(bytes.len() <= MAX_CONTROL_LEN);
            let Ok(ControlMessage::HelloReplyPart { verdicts, more }) = decode_control(&bytes)
            else {
                panic!("bad part");
            };
            whole = assembler.push(verdicts, more).expect("counts match");
        }
        assert_eq!(whole, Some(verdicts));
        let mut short = ReplyAssembler::new(2);
        assert_eq!(
            short.push(vec![Verdict::Refused], false),
            Err(AssembleError::VerdictCount {
                got: 1,
                expected: 2
            })
        );
        let mut long = ReplyAssembler::new(1);
        assert!(long.push(vec![Verdict::Refused; 2], true).is_err());
    }

    #[test]
    fn the_assembler_bounds_the_whole_hello() {
        let mut assembler = HelloAssembler::default();
        let part: Vec<HelloClaim> = (0..MAX_SERVICES_PER_SESSION)
            .map(|i| hello_claim(i, 4))
            .collect();
        let mut result = Ok(None);
        for _ in 0..=(MAX_CLAIMS_PER_HELLO / MAX_SERVICES_PER_SESSION) {
            result = assembler.push(HelloMode::Serve, part.clone(), true);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(
            result,
            Err(AssembleError::TooManyClaims {
                max: MAX_CLAIMS_PER_HELLO
            })
        );
        let mut assembler = HelloAssembler::default();
        assert_eq!(assembler.push(HelloMode::Serve, Vec::new(), true), Ok(None));
        assert_eq!(
            assembler.push(HelloMode::Probe, Vec::new(), false),
            Err(AssembleError::ModeChanged)
        );
    }

    #[test]
    fn new_variants_keep_the_old_indices() {
        // Appended at the end: a v1 peer's messages keep their encodings.
        let index = |message: ControlMessage| encode(&message)[0];
        assert_eq!(index(ControlMessage::Ping { seq: 0 }), 2);
        assert_eq!(
            index(ControlMessage::Reclaim {
                reason: String::new()
            }),
            6
        );
        assert_eq!(
            index(ControlMessage::Health {
                services: Vec::new(),
                ready: true
            }),
            10
        );
        assert_eq!(
            index(ControlMessage::Mailbox {
                op: MailboxOp::Allocate
            }),
            11
        );
        assert_eq!(
            index(ControlMessage::Draining {
                reason: String::new()
            }),
            14
        );
        assert_eq!(
            u32::from(index(ControlMessage::Draining {
                reason: String::new()
            })) + 1,
            CONTROL_KINDS
        );
    }

    #[test]
    fn a_later_versions_kind_is_unknown_not_malformed() {
        // Kind 15 with a string body, as a later version might send.
        let mut bytes = encode(&ControlMessage::Draining { reason: "x".into() });
        bytes[0] = 15;
        assert_eq!(decode_control(&bytes), Err(DecodeError::UnknownKind(15)));
        // A multi-byte varint kind too.
        assert_eq!(
            decode_control(&[0x80, 0x01, 0]),
            Err(DecodeError::UnknownKind(128))
        );
        // Over the size cap is that, whatever the kind.
        let mut big = vec![0x63u8; MAX_CONTROL_LEN + 1];
        big[0] = 99;
        assert!(matches!(
            decode_control(&big),
            Err(DecodeError::TooLarge { .. })
        ));
        // A known kind with a corrupt body is still malformed.
        assert!(matches!(
            decode_control(&[14, 5, b'a']),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn mailbox_bodies_are_bounded() {
        let body = vec![0u8; MAX_MAILBOX_BODY + 1];
        let bytes = encode(&ControlMessage::Mailbox {
            op: MailboxOp::Send { body },
        });
        assert!(matches!(
            decode_control(&bytes),
            Err(DecodeError::FieldTooLong {
                field: "mailbox body",
                ..
            })
        ));
    }

    #[test]
    fn too_many_services_refused() {
        let services = (0..=MAX_SERVICES_PER_SESSION)
            .map(|i| ServiceClaim {
                name: format!("s{i}"),
                proof: [0; 32],
                kind: ClaimKind::Reverse,
            })
            .collect();
        let bytes = encode(&ControlMessage::Hello { services });
        assert!(matches!(
            decode_control(&bytes),
            Err(DecodeError::FieldTooLong {
                field: "services",
                ..
            }) | Err(DecodeError::TooLarge { .. })
        ));
    }
}
