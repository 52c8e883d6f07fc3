//! The client's side of the server's mailbox (`[server.p2p]`): a probe session (no services
//! claimed) over which a sender allocates a nameplate, a receiver claims it, and both pass
//! the PAKE's messages. The server's side is [`crate::server::mailbox`].
//!
//! The session answers the server's heartbeat pings while it waits for an event, so a
//! sender can wait for its receiver as long as the nameplate lives.

use std::net::SocketAddr;
use std::time::Duration;

use warren_proto::message::{ControlMessage, MAX_MAILBOX_BODY, MailboxEvent, MailboxOp};

use crate::client::establish::{self, EstablishError};
use crate::config::HostPort;
use crate::crypto::keys;
use crate::crypto::secret::Secret;
use crate::session::stream::Stream;
use crate::session::{self as control};

/// Where the mailbox is and how to reach it.
#[derive(Debug, Clone)]
pub struct MailboxServer {
    /// The Warren server.
    pub server: HostPort,
    /// Its PSK.
    pub psk: Secret,
    /// `Some` when the server runs `transport = "quic"`.
    pub quic: Option<crate::config::quic::QuicConfig>,
    /// Deadline of each step of connecting, and of each answer.
    pub deadline: Duration,
}

impl MailboxServer {
    /// A probe session for the mailbox (handshake with its PSK, no services claimed).
    ///
    /// Its messages are a few hundred bytes, so the cipher's speed does not matter: the
    /// client offers AEGIS first, then the default order, and sends no figures (`ordered`),
    /// which spares the ~40 ms of measuring every suite before the first message (the code
    /// could not be shown before it: `warren send` printed its code after 80 ms, ~36 of them
    /// measuring, ~30 seeding aws-lc's generator from CPU jitter; see `.cargo/config.toml`).
    ///
    /// # Errors
    /// [`EstablishError`] naming the step that failed.
    pub async fn mailbox_session(&self) -> Result<establish::EstablishedSession, EstablishError> {
        use warren_proto::CipherSuite;
        // AEGIS first: its keys need no choice between aws-lc and ring (~12 ms of measuring
        // per AEAD); the rest of the list still reaches a server that allows only those.
        let mut ciphers = vec![CipherSuite::Aegis128L, CipherSuite::Aegis128X2];
        for suite in CipherSuite::default_preference(crate::config::has_aes_hardware()) {
            if !ciphers.contains(&suite) {
                ciphers.push(suite);
            }
        }
        self.probe_session(&ciphers, warren_proto::CipherChoice::Ordered)
            .await
    }

    /// A probe session that carries a relayed transfer's packets over TCP (UDP is blocked):
    /// bulk data, so the cipher is chosen by both ends' measured speeds.
    ///
    /// # Errors
    /// [`EstablishError`] naming the step that failed.
    pub async fn relay_leg_session(&self) -> Result<establish::EstablishedSession, EstablishError> {
        let ciphers =
            warren_proto::CipherSuite::default_preference(crate::config::has_aes_hardware());
        self.probe_session(&ciphers, warren_proto::CipherChoice::Fastest)
            .await
    }

    async fn probe_session(
        &self,
        ciphers: &[warren_proto::CipherSuite],
        choice: warren_proto::CipherChoice,
    ) -> Result<establish::EstablishedSession, EstablishError> {
        establish::probe_session(
            &self.server,
            &self.psk,
            (ciphers, choice),
            self.quic.as_ref(),
            self.deadline,
        )
        .await
    }
}

/// Why the mailbox could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MailboxError {
    /// The session could not be established.
    #[error(transparent)]
    Connect(#[from] EstablishError),
    /// The server refused the operation (the reason says why and what to do).
    #[error("the server's mailbox refused: {0}")]
    Refused(String),
    /// The nameplate was burned after failed exchanges.
    #[error(
        "the code was used with wrong words too many times and is gone: start again with a new code"
    )]
    Burned,
    /// Another receiver is at the nameplate now: claim again in a moment.
    #[error("another receiver is using this code right now; try again when it has connected")]
    Busy,
    /// The session ended.
    #[error("the connection to the server's mailbox ended: {0}")]
    Ended(String),
    /// No answer in time.
    #[error("the server's mailbox did not answer within {0:?}")]
    Timeout(Duration),
    /// A message too large for the mailbox.
    #[error("a mailbox message of {0} bytes is over the {MAX_MAILBOX_BODY}-byte limit")]
    TooLarge(usize),
}

/// Events [`Mailbox::keep_alive`] holds for later [`Mailbox::next`] calls, at most.
const MAX_HELD: usize = 64;

/// A session with the server's mailbox.
pub struct Mailbox {
    channel: Stream,
    /// What [`Mailbox::keep_alive`] read, in order, for [`Mailbox::next`].
    held: std::collections::VecDeque<Result<MailboxEvent, MailboxError>>,
    deadline: Duration,
    /// The address the session reached (the server's name resolved).
    server_addr: SocketAddr,
    /// The session's handshake hash: service token proofs are bound to it.
    handshake_hash: [u8; 32],
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

impl Mailbox {
    /// Connects to the server (handshake with its PSK, a probe session).
    ///
    /// # Errors
    /// [`MailboxError::Connect`], naming the step that failed.
    pub async fn connect(target: &MailboxServer) -> Result<Mailbox, MailboxError> {
        let session = target.mailbox_session().await?;
        Ok(Mailbox {
            channel: session.channel,
            held: std::collections::VecDeque::new(),
            deadline: target.deadline,
            server_addr: session.server_addr,
            handshake_hash: *session.keys.handshake_hash(),
        })
    }

    /// The address this session reached the server at.
    pub fn server_addr(&self) -> SocketAddr {
        self.server_addr
    }

    /// Where the server's P2P UDP port (reflector and relay) is: the `udp_port` that
    /// [`Mailbox::allocate`] or [`Mailbox::claim`] returned, on the IP this session reached
    /// (so a name that resolves to several addresses gives the one that works).
    pub fn udp_addr(&self, udp_port: u16) -> SocketAddr {
        SocketAddr::new(self.server_addr.ip(), udp_port)
    }

    /// Takes a fresh nameplate (the sender's side). Also returns the server's UDP port for
    /// P2P (address reflector and relay), on the host this session reached the server at;
    /// `None` when the server runs neither.
    ///
    /// # Errors
    /// Refused (no `[server.p2p]`, the table is full, too many requests), or the session
    /// failed.
    pub async fn allocate(&mut self) -> Result<(u32, Option<u16>), MailboxError> {
        self.allocating(MailboxOp::Allocate).await
    }

    /// Joins `nameplate` (the receiver's side); messages the sender already sent follow as
    /// [`MailboxEvent::Message`]s. Returns the server's UDP port for P2P, as
    /// [`Mailbox::allocate`] does.
    ///
    /// # Errors
    /// Refused (no such nameplate, another receiver holds it), or the session failed.
    pub async fn claim(&mut self, nameplate: u32) -> Result<Option<u16>, MailboxError> {
        self.claiming(MailboxOp::Claim { nameplate }).await
    }

    /// Offers the named P2P service `service`, proving `token` (the listening side):
    /// answered as [`Mailbox::allocate`], with the nameplate it stands for.
    ///
    /// # Errors
    /// Refused (no such service, wrong token, offered by another client), or the session
    /// failed.
    pub async fn offer_service(
        &mut self,
        service: &str,
        token: &Secret,
    ) -> Result<(u32, Option<u16>), MailboxError> {
        let proof = keys::token_proof(token, &self.handshake_hash, service);
        let service = service.to_owned();
        self.allocating(MailboxOp::OfferService { service, proof })
            .await
    }

    /// Joins the named P2P service `service`, proving `token` (the visiting side):
    /// answered as [`Mailbox::claim`].
    ///
    /// # Errors
    /// Refused (no such service, wrong token, nobody offers it), [`MailboxError::Busy`]
    /// (another visitor is connecting), or the session failed.
    pub async fn visit_service(
        &mut self,
        service: &str,
        token: &Secret,
    ) -> Result<Option<u16>, MailboxError> {
        let proof = keys::token_proof(token, &self.handshake_hash, service);
        let service = service.to_owned();
        self.claiming(MailboxOp::VisitService { service, proof })
            .await
    }

    /// Sends `op` (an allocation) and reads its `Allocated`.
    async fn allocating(&mut self, op: MailboxOp) -> Result<(u32, Option<u16>), MailboxError> {
        self.op(op).await?;
        match self.next(self.deadline).await? {
            MailboxEvent::Allocated {
                nameplate,
                udp_port,
            } => Ok((nameplate, udp_port)),
            other => Err(unexpected(other)),
        }
    }

    /// Sends `op` (a claim) and reads its `Claimed`.
    async fn claiming(&mut self, op: MailboxOp) -> Result<Option<u16>, MailboxError> {
        self.op(op).await?;
        match self.next(self.deadline).await? {
            MailboxEvent::Claimed { udp_port } => Ok(udp_port),
            other => Err(unexpected(other)),
        }
    }

    /// The server's P2P UDP ports: the reflector and relay's, and the reflector's second
    /// port (NAT-type probes); `None` for what the server does not run. Takes no nameplate.
    ///
    /// # Errors
    /// Refused (no `[server.p2p]`, or a server older than this op), or the session failed.
    pub async fn info(&mut self) -> Result<(Option<u16>, Option<u16>), MailboxError> {
        self.op(MailboxOp::Info).await?;
        match self.next(self.deadline).await? {
            MailboxEvent::Info {
                udp_port,
                udp_alt_port,
            } => Ok((udp_port, udp_alt_port)),
            other => Err(unexpected(other)),
        }
    }

    /// Sends `body` to the other side.
    ///
    /// # Errors
    /// Too large, or the session failed.
    pub async fn send(&mut self, body: Vec<u8>) -> Result<(), MailboxError> {
        if body.len() > MAX_MAILBOX_BODY {
            return Err(MailboxError::TooLarge(body.len()));
        }
        self.op(MailboxOp::Send { body }).await
    }

    /// Leaves the nameplate; `failed` when the exchange failed (counts towards burning it).
    ///
    /// # Errors
    /// The session failed.
    pub async fn release(&mut self, failed: bool) -> Result<(), MailboxError> {
        self.op(MailboxOp::Release { failed }).await
    }

    /// The next event, within `wait` (answering the server's pings meanwhile). A refusal
    /// or a burn is an error.
    ///
    /// # Errors
    /// [`MailboxError::Refused`], [`MailboxError::Burned`], the session ended, or nothing
    /// within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Result<MailboxEvent, MailboxError> {
        match self.held.pop_front() {
            Some(held) => held,
            None => self.receive(wait).await,
        }
    }

    /// Keeps the session alive while the caller is busy elsewhere (a sender connecting
    /// to its receiver): answers the server's pings and holds the events that arrive (the
    /// next receiver joining, its first message) for [`Mailbox::next`]. Never returns;
    /// race it against the other work. Cancel-safe. After an error, or [`MAX_HELD`]
    /// events, it stops reading (the error is held too).
    pub async fn keep_alive(&mut self) {
        loop {
            if self.held.len() >= MAX_HELD || self.held.back().is_some_and(Result::is_err) {
                return std::future::pending().await;
            }
            match self.receive(Duration::from_secs(3600)).await {
                Err(MailboxError::Timeout(_)) => {}
                event => self.held.push_back(event),
            }
        }
    }

    async fn receive(&mut self, wait: Duration) -> Result<MailboxEvent, MailboxError> {
        let channel = &mut self.channel;
        let receive = async {
            loop {
                match control::recv_control(channel).await {
                    Ok(ControlMessage::MailboxEvent { event }) => return Ok(event),
                    Ok(ControlMessage::Ping { seq }) => {
                        control::send_control(channel, &ControlMessage::Pong { seq })
                            .await
                            .map_err(|e| MailboxError::Ended(e.to_string()))?;
                    }
                    Ok(ControlMessage::Goodbye { reason }) => {
                        return Err(MailboxError::Ended(reason));
                    }
                    Ok(_) => {}
                    Err(end) => return Err(MailboxError::Ended(end.to_string())),
                }
            }
        };
        match tokio::time::timeout(wait, receive).await {
            Ok(Ok(MailboxEvent::Refused { reason })) => Err(MailboxError::Refused(reason)),
            Ok(Ok(MailboxEvent::Burned)) => Err(MailboxError::Burned),
            Ok(Ok(MailboxEvent::Busy)) => Err(MailboxError::Busy),
            Ok(result) => result,
            Err(_) => Err(MailboxError::Timeout(wait)),
        }
    }

    /// Says goodbye and closes the session.
    pub async fn close(self) {
        establish::goodbye(self.channel, "done with the mailbox").await;
    }

    async fn op(&mut self, op: MailboxOp) -> Result<(), MailboxError> {
        let message = ControlMessage::Mailbox { op };
        match tokio::time::timeout(
            self.deadline,
            control::send_control(&mut self.channel, &message),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(MailboxError::Ended(error.to_string())),
            Err(_) => Err(MailboxError::Timeout(self.deadline)),
        }
    }
}

fn unexpected(event: MailboxEvent) -> MailboxError {
    MailboxError::Ended(format!("unexpected answer from the mailbox: {event:?}"))
}
