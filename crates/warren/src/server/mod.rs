//! The public side: `warren server`.
//!
//! One listener on the server port takes both control and data channels (told apart by
//! their preamble). Each connection is authenticated in its own task under one deadline
//! ([`ServerConfig::handshake_timeout`]), never in the accept loop, so a silent peer delays
//! nobody. Service ports are bound at start and stay bound: a visitor arriving while no
//! client serves the service is reset at once, and the service works again the moment its
//! client reconnects.
//!
//! Main types: [`Server`] (validated config, built with [`Server::builder`]),
//! [`BoundServer`] (sockets bound, ready to [`BoundServer::run`]).

pub mod pending;
mod session;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngCore;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};
use warren_proto::handshake::{self as proto_handshake, DataHello, HandshakeError, SessionId};
use warren_proto::message::{ControlMessage, StreamOpen, Verdict};
use warren_proto::{CipherSuite, message};

use crate::Side;
use crate::config::{ConfigErrors, ServerConfig, ServerService, Transport};
use crate::crypto::keys::{self, SessionKeys};
use crate::crypto::record::RecordKind;
use crate::crypto::secret::Secret;
use crate::relay;
use crate::session::{self as control, Liveness, SessionEnd, short_id};
use crate::transport::preamble::{self, Incoming, PreambleError};
use crate::transport::{Channel, tcp};
use pending::{PendingGuard, PendingLimiter};
use session::ServerSession;

/// Live sessions at once.
const MAX_SESSIONS: usize = 1024;
/// Visitor streams open at once on one service (so per session serving it). Past this, new
/// visitors are reset at once: established streams are never dropped for newcomers.
const MAX_STREAMS_PER_SERVICE: usize = 4096;
/// How long a visitor may wait for a data channel before it is reset.
const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept()` (e.g. EMFILE) before trying again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Server runtime errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A port could not be bound.
    #[error(
        "cannot bind {what} on {addr}: {source}; is another process using it? (choose another port or stop that process)"
    )]
    Bind {
        /// Which listener.
        what: String,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A validated server, ready to bind.
#[derive(Debug, Clone)]
pub struct Server {
    config: ServerConfig,
}

/// Builds a [`Server`] in code; the CLI uses [`Server::from_config`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let server = warren::Server::builder()
///     .bind("0.0.0.0:7000".parse()?)
///     .psk("a-long-random-pre-shared-key")
///     .default_token("a-long-random-service-token")
///     .tcp_service("web", "0.0.0.0:8080".parse()?)
///     .build()?;
/// let bound = server.bind().await?;
/// bound.run().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    config: ServerConfig,
    services: Vec<(String, SocketAddr, Option<Secret>)>,
}

impl ServerBuilder {
    /// The server port (control and data channels). Default `0.0.0.0:7000`.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.config.bind = addr;
        self
    }

    /// The pre-shared key (required, at least 16 characters).
    pub fn psk(mut self, psk: impl Into<String>) -> Self {
        self.config.psk = Secret::new(psk);
        self
    }

    /// Token for services without their own.
    pub fn default_token(mut self, token: impl Into<String>) -> Self {
        self.config.default_token = Some(Secret::new(token));
        self
    }

    /// `noise` (default) or plaintext `tcp` (needs [`ServerBuilder::insecure`]).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.config.transport = transport;
        self
    }

    /// Allowed ciphers, in preference order.
    pub fn ciphers(mut self, ciphers: Vec<CipherSuite>) -> Self {
        self.config.ciphers = ciphers;
        self
    }

    /// Allows weak secrets and the plaintext transport.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.config.insecure = insecure;
        self
    }

    /// How often the server pings each client.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// Deadline for handshake, hello and auth of a new connection.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.config.handshake_timeout = timeout;
        self
    }

    /// A reverse TCP service using the default token.
    pub fn tcp_service(mut self, name: impl Into<String>, bind: SocketAddr) -> Self {
        self.services.push((name.into(), bind, None));
        self
    }

    /// A reverse TCP service with its own token.
    pub fn tcp_service_with_token(
        mut self,
        name: impl Into<String>,
        bind: SocketAddr,
        token: impl Into<String>,
    ) -> Self {
        self.services
            .push((name.into(), bind, Some(Secret::new(token))));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// Every problem at once, as the config file loader reports them.
    pub fn build(mut self) -> Result<Server, ConfigErrors> {
        for (name, bind, token) in self.services {
            let token = token
                .or_else(|| self.config.default_token.clone())
                .unwrap_or_default();
            self.config.services.insert(
                name.clone(),
                ServerService {
                    name,
                    kind: crate::config::ServiceKind::Tcp,
                    bind,
                    token,
                },
            );
        }
        Server::from_config(self.config)
    }
}

impl Server {
    /// Starts a builder with defaults.
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            config: ServerConfig::new(SocketAddr::from(([0, 0, 0, 0], 7000)), Secret::default()),
            services: Vec::new(),
        }
    }

    /// A server from a loaded config.
    ///
    /// # Errors
    /// The config's validation errors.
    pub fn from_config(config: ServerConfig) -> Result<Server, ConfigErrors> {
        config.validate()?;
        Ok(Server { config })
    }

    /// Binds the server port and every service port.
    ///
    /// # Errors
    /// [`ServerError::Bind`] naming the port that could not be bound.
    pub async fn bind(self) -> Result<BoundServer, ServerError> {
        let listener = bind_listener("the server port", self.config.bind).await?;
        let mut services = HashMap::new();
        let mut listeners = Vec::new();
        for service in self.config.services.values() {
            let service_listener =
                bind_listener(&format!("service `{}`", service.name), service.bind).await?;
            let slot = Arc::new(ServiceSlot {
                name: service.name.clone(),
                token: service.token.clone(),
                session: Mutex::new(None),
            });
            services.insert(service.name.clone(), Arc::clone(&slot));
            listeners.push((slot, service_listener));
        }
        let ciphers = match self.config.transport {
            Transport::Tcp => vec![CipherSuite::None],
            _ => self.config.ciphers.clone(),
        };
        let shared = Arc::new(Shared {
            noise_psk: keys::noise_psk(&self.config.psk),
            ciphers,
            config: self.config,
            sessions: Mutex::new(HashMap::new()),
            services,
            pending: PendingLimiter::new(
                pending::MAX_PENDING_HANDSHAKES,
                pending::MAX_PENDING_PER_IP,
            ),
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        Ok(BoundServer {
            shared,
            listener,
            service_listeners: listeners,
        })
    }
}

async fn bind_listener(what: &str, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            what: what.to_owned(),
            addr,
            source,
        })
}

/// A server with its sockets bound.
pub struct BoundServer {
    shared: Arc<Shared>,
    listener: TcpListener,
    service_listeners: Vec<(Arc<ServiceSlot>, TcpListener)>,
}

impl BoundServer {
    /// The server port's actual address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        // Invariant: a bound listener always has a local address.
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// A service port's actual address.
    pub fn service_addr(&self, name: &str) -> Option<SocketAddr> {
        self.service_listeners
            .iter()
            .find(|(slot, _)| slot.name == name)
            .and_then(|(_, listener)| listener.local_addr().ok())
    }

    /// A token that stops the server when cancelled (graceful: sessions get a goodbye).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Serves until the shutdown token is cancelled, then closes everything and returns.
    pub async fn run(self) {
        let BoundServer {
            shared,
            listener,
            service_listeners,
        } = self;
        info!(
            event = "server_started",
            bind = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            transport = %shared.config.transport,
            services = shared.services.len(),
            "warren server listening"
        );
        for (slot, service_listener) in service_listeners {
            let shared = Arc::clone(&shared);
            shared
                .tasks
                .clone()
                .spawn(serve_visitors(shared, slot, service_listener));
        }
        accept_loop(&shared, listener).await;
        shared.tasks.close();
        if tokio::time::timeout(Duration::from_secs(5), shared.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                event = "shutdown_slow",
                "some connections did not close within 5s"
            );
        }
        info!(event = "server_stopped", "warren server stopped");
    }
}

/// State every connection task of one server shares.
struct Shared {
    config: ServerConfig,
    noise_psk: [u8; 32],
    /// Ciphers this server allows, already adjusted for the transport.
    ciphers: Vec<CipherSuite>,
    sessions: Mutex<HashMap<SessionId, Arc<ServerSession>>>,
    services: HashMap<String, Arc<ServiceSlot>>,
    /// Unauthenticated connections; full means the oldest is dropped (see [`pending`]).
    pending: Arc<PendingLimiter>,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl Shared {
    fn session(&self, id: &SessionId) -> Option<Arc<ServerSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// One configured service and the session currently serving it.
struct ServiceSlot {
    name: String,
    token: Secret,
    /// The newest session that claimed the service; a reconnecting client replaces it.
    session: Mutex<Option<Arc<ServerSession>>>,
}

impl ServiceSlot {
    fn current(&self) -> Option<Arc<ServerSession>> {
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let (permit, evicted) = shared.pending.admit(peer.ip());
                if evicted > 0 {
                    debug!(event = "pending_full", %peer, "too many unauthenticated connections; closed the oldest");
                }
                tcp::tune(&stream);
                shared
                    .tasks
                    .spawn(handle_connection(Arc::clone(shared), stream, peer, permit));
            }
            Err(error) => {
                // EMFILE and friends: keep the listener, wait for descriptors to free up.
                warn!(event = "accept_failed", %error, "accept failed on the server port; retrying");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// What a connection turned out to be once authenticated.
enum Authenticated {
    Control {
        session: Arc<ServerSession>,
        channel: Box<Channel>,
    },
    Data,
}

async fn handle_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    permit: PendingGuard,
) {
    let deadline = shared.config.handshake_timeout;
    // The connection moves into the deadline: on expiry it is dropped, i.e. closed.
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(deadline, authenticate(&shared, stream, peer)) => outcome,
        () = shared.cancel.cancelled() => return,
        () = permit.evicted().cancelled() => {
            debug!(event = "pending_evicted", %peer, "closed a pending connection to make room for a newer one");
            return;
        }
    };
    drop(permit);
    let authenticated = match outcome {
        Err(_) => {
            debug!(event = "handshake_timeout", %peer, "no complete handshake within {deadline:?}; closing");
            return;
        }
        Ok(Err(reason)) => {
            reason.log(peer);
            return;
        }
        Ok(Ok(authenticated)) => authenticated,
    };
    match authenticated {
        Authenticated::Data => {}
        Authenticated::Control { session, channel } => {
            run_session(&shared, session, *channel).await
        }
    }
}

/// Why a connection was dropped before authentication completed.
enum Rejected {
    /// Wrong PSK or garbage: closed in silence.
    Silent(&'static str),
    Io(PreambleError),
    Refused(warren_proto::handshake::Refusal),
    Tokens(Vec<String>),
    TooManySessions,
    Protocol(String),
}

impl Rejected {
    fn log(&self, peer: SocketAddr) {
        match self {
            Rejected::Silent(why) => {
                debug!(event = "handshake_rejected", %peer, reason = why, "closed in silence")
            }
            Rejected::Io(error) => {
                debug!(event = "handshake_failed", %peer, %error, "handshake did not complete")
            }
            Rejected::Refused(refusal) => {
                warn!(event = "session_refused", %peer, reason = %refusal, "refused a client")
            }
            Rejected::Tokens(services) => warn!(
                event = "auth_failed",
                %peer,
                services = %services.join(","),
                "refused a client: wrong token or unknown service"
            ),
            Rejected::TooManySessions => {
                warn!(event = "session_refused", %peer, "too many sessions; refused a client")
            }
            Rejected::Protocol(what) => {
                warn!(event = "protocol_error", %peer, what = %what, "protocol violation during hello")
            }
        }
    }
}

impl From<PreambleError> for Rejected {
    fn from(error: PreambleError) -> Self {
        match error {
            PreambleError::Handshake(HandshakeError::Unauthenticated) => {
                Rejected::Silent("authentication failed (wrong PSK?)")
            }
            PreambleError::Handshake(HandshakeError::Malformed) => {
                Rejected::Silent("malformed preamble")
            }
            other => Rejected::Io(other),
        }
    }
}

async fn authenticate(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    peer: SocketAddr,
) -> Result<Authenticated, Rejected> {
    match preamble::server_read_preamble(&mut stream).await? {
        Incoming::Data(hello) => accept_data_channel(shared, stream, &hello).await,
        Incoming::Control(message1) => {
            accept_control_channel(shared, stream, peer, &message1).await
        }
    }
}

async fn accept_data_channel(
    shared: &Arc<Shared>,
    stream: TcpStream,
    hello: &DataHello,
) -> Result<Authenticated, Rejected> {
    let Some(session) = shared.session(&hello.session_id) else {
        return Err(Rejected::Silent("data channel for an unknown session"));
    };
    if !session
        .keys
        .verify_data_hello(&hello.client_nonce, &hello.mac)
    {
        return Err(Rejected::Silent("data channel MAC did not verify"));
    }
    let channel = preamble::server_accept_data_channel(stream, &session.keys, hello).await?;
    session.add_idle_channel(channel);
    Ok(Authenticated::Data)
}

async fn accept_control_channel(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    peer: SocketAddr,
    message1: &[u8],
) -> Result<Authenticated, Rejected> {
    let mut session_id = [0u8; proto_handshake::SESSION_ID_LEN];
    rand::rng().fill_bytes(&mut session_id);
    let outcome =
        proto_handshake::server_handshake(&shared.noise_psk, message1, &shared.ciphers, session_id)
            .map_err(|e| Rejected::from(PreambleError::Handshake(e)))?;
    use tokio::io::AsyncWriteExt;
    stream
        .write_all(&outcome.reply)
        .await
        .map_err(|e| Rejected::Io(e.into()))?;
    let established = outcome.result.map_err(Rejected::Refused)?;
    let keys = SessionKeys::new(&established);
    let (sealer, opener) = keys.control_channel(Side::Server);
    let mut channel = Channel::new(stream, sealer, opener);

    let claims = match control::recv_control(&mut channel).await {
        Ok(ControlMessage::Hello { services }) => services,
        Ok(other) => return Err(Rejected::Protocol(format!("expected hello, got {other:?}"))),
        Err(SessionEnd::Protocol(what)) => return Err(Rejected::Protocol(what)),
        Err(end) => return Err(Rejected::Protocol(end.to_string())),
    };
    let verdicts: Vec<Verdict> = claims
        .iter()
        .map(|claim| {
            let accepted = shared.services.get(&claim.name).is_some_and(|slot| {
                keys::verify_token_proof(
                    &slot.token,
                    keys.handshake_hash(),
                    &claim.name,
                    &claim.proof,
                )
            });
            if accepted {
                Verdict::Accepted
            } else {
                Verdict::Refused
            }
        })
        .collect();
    let reply = ControlMessage::HelloReply {
        verdicts: verdicts.clone(),
    };
    control::send_control(&mut channel, &reply)
        .await
        .map_err(|e| Rejected::Protocol(e.to_string()))?;
    let refused: Vec<String> = claims
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| **v == Verdict::Refused)
        .map(|(c, _)| c.name.clone())
        .collect();
    let accepted: Vec<String> = claims
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| **v == Verdict::Accepted)
        .map(|(c, _)| c.name.clone())
        .collect();
    if !refused.is_empty() {
        Rejected::Tokens(refused).log(peer);
    }
    if accepted.is_empty() {
        return Err(Rejected::Tokens(Vec::new()));
    }
    let session = Arc::new(ServerSession::new(
        keys,
        peer,
        accepted,
        shared.cancel.child_token(),
    ));
    {
        let mut sessions = shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sessions.len() >= MAX_SESSIONS {
            return Err(Rejected::TooManySessions);
        }
        sessions.insert(session_id, Arc::clone(&session));
    }
    Ok(Authenticated::Control {
        session,
        channel: Box::new(channel),
    })
}

async fn run_session(shared: &Arc<Shared>, session: Arc<ServerSession>, channel: Channel) {
    for name in &session.services {
        if let Some(slot) = shared.services.get(name) {
            *slot.session.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(Arc::clone(&session));
        }
    }
    info!(
        event = "session_started",
        session = %short_id(&session.id()),
        peer = %session.peer,
        cipher = %session.keys.cipher(),
        services = %session.services.join(","),
        "client connected"
    );
    let interval = shared.config.heartbeat_interval;
    let liveness = Liveness {
        ping_interval: Some(interval),
        timeout: interval.saturating_mul(3),
    };
    let outgoing = session.take_control_receiver();
    let end = control::run_control(
        channel,
        liveness,
        outgoing,
        session.cancel.clone(),
        |message| {
            debug!(
                event = "control_ignored",
                ?message,
                "ignoring unexpected control message from client"
            );
        },
    )
    .await;
    session.cancel.cancel();
    shared
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&session.id());
    for name in &session.services {
        if let Some(slot) = shared.services.get(name) {
            let mut current = slot.session.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, &session)) {
                *current = None;
            }
        }
    }
    match end {
        SessionEnd::Cancelled => {
            debug!(event = "session_ended", session = %short_id(&session.id()), "session closed for shutdown")
        }
        other => {
            info!(event = "session_ended", session = %short_id(&session.id()), peer = %session.peer, reason = %other, "client disconnected")
        }
    }
}

async fn serve_visitors(shared: Arc<Shared>, slot: Arc<ServiceSlot>, listener: TcpListener) {
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS_PER_SERVICE));
    loop {
        let accepted = tokio::select! {
            () = shared.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((visitor, peer)) => {
                let Ok(permit) = Arc::clone(&streams).try_acquire_owned() else {
                    debug!(event = "visitor_rejected", service = %slot.name, %peer, "too many streams on this service; resetting the visitor");
                    tcp::reset(visitor);
                    continue;
                };
                tcp::tune(&visitor);
                let slot = Arc::clone(&slot);
                let cancel = shared.cancel.clone();
                shared.tasks.spawn(async move {
                    serve_visitor(slot, visitor, peer, cancel).await;
                    drop(permit);
                });
            }
            Err(error) => {
                warn!(event = "accept_failed", service = %slot.name, %error, "accept failed on a service port; retrying");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

async fn serve_visitor(
    slot: Arc<ServiceSlot>,
    visitor: TcpStream,
    peer: SocketAddr,
    cancel: CancellationToken,
) {
    let Some(session) = slot.current() else {
        debug!(event = "visitor_rejected", service = %slot.name, %peer, "no client serves this service; closing visitor");
        tcp::reset(visitor);
        return;
    };
    let opened = tokio::select! {
        () = cancel.cancelled() => return,
        opened = tokio::time::timeout(STREAM_OPEN_TIMEOUT, open_stream(&session, &slot.name)) => opened,
    };
    let channel = match opened {
        Ok(Ok(channel)) => channel,
        Ok(Err(error)) => {
            warn!(event = "stream_open_failed", service = %slot.name, %peer, %error, "could not open a stream to the client");
            tcp::reset(visitor);
            return;
        }
        Err(_) => {
            warn!(event = "stream_open_failed", service = %slot.name, %peer, "no data channel from the client within {STREAM_OPEN_TIMEOUT:?}");
            tcp::reset(visitor);
            return;
        }
    };
    debug!(event = "stream_opened", service = %slot.name, %peer, "visitor connected");
    match relay::pump(visitor, channel, &cancel).await {
        Ok(moved) => {
            debug!(event = "stream_closed", service = %slot.name, %peer, up = moved.to_tunnel, down = moved.to_local, "visitor done")
        }
        Err(error) => {
            debug!(event = "stream_aborted", service = %slot.name, %peer, %error, "visitor connection aborted")
        }
    }
}

async fn open_stream(
    session: &ServerSession,
    service: &str,
) -> Result<Channel, crate::transport::records::RecordIoError> {
    let mut channel = session
        .take_channel()
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let open = message::encode(&StreamOpen {
        service: service.to_owned(),
    });
    channel.writer.send(RecordKind::Control, &open).await?;
    Ok(channel)
}
