//! The side behind NAT: `warren client`.
//!
//! The client dials the server, authenticates (PSK through the Noise handshake, then one
//! token proof per service), and keeps a small pool of pre-opened data channels at the
//! server. When a visitor arrives there, the server sends `StreamOpen` on one of them; the
//! client dials the service's target and relays. A lost session is re-established with
//! exponential backoff and jitter; a refusal that retrying cannot fix (every token wrong, no
//! common cipher) ends the client with an error instead.
//!
//! Main types: [`Client`] (validated config, built with [`Client::builder`]),
//! [`ClientStatus`] (watch the connection from outside).

mod admin;
pub mod establish;
mod pool;
mod udp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngCore;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};
use warren_proto::CipherSuite;
use warren_proto::handshake::Refusal;
use warren_proto::liveness::Backoff;
use warren_proto::message::{ControlMessage, Verdict};

use crate::Side;
use crate::admin::SessionInfo;
use crate::config::{
    ClientConfig, ClientService, ConfigErrors, HostPort, ServiceKind, Transport, UdpSettings,
};
use crate::crypto::keys::SessionKeys;
use crate::crypto::secret::Secret;
use crate::metrics::{HandshakeFailure, ServiceMeter, Telemetry, unix_seconds};
use crate::session::{self as control, CONTROL_QUEUE, Liveness, SessionEnd, short_id};
use establish::{EstablishError, EstablishedSession};

/// Data channels kept open and idle at the server, ready for visitors.
pub(crate) const POOL_SIZE: usize = 8;
/// Most data channels being opened or idle at once (requests beyond wait).
pub(crate) const MAX_POOLED: usize = 128;

/// Errors that end the client (everything else is retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server refused the session for a reason retrying cannot fix.
    #[error("the server refused this client: {0}")]
    Refused(Refusal),
    /// Every service was refused: wrong tokens, or services the server does not have.
    #[error(
        "the server refused every service ({0}): wrong token, or the service is not in the server's config; check `token` / `default_token` on both sides"
    )]
    AllServicesRefused(String),
    /// The admin API's port could not be bound.
    #[error(
        "cannot bind the admin API on {addr}: {source}; is another process using it? (change [admin] bind)"
    )]
    AdminBind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Connection state, observable through [`Client::status`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStatus {
    /// Whether a session is up right now.
    pub connected: bool,
    /// Sessions established so far (reconnects included).
    pub sessions: u64,
    /// Services the server accepted in the current session.
    pub services: Vec<String>,
    /// The negotiated cipher of the current session.
    pub cipher: Option<CipherSuite>,
}

/// A validated client, ready to run.
pub struct Client {
    config: ClientConfig,
    status: watch::Sender<ClientStatus>,
}

/// Builds a [`Client`] in code; the CLI uses [`Client::from_config`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = warren::Client::builder("tunnel.example.com:7000".parse()?)
///     .psk("a-long-random-pre-shared-key")
///     .default_token("a-long-random-service-token")
///     .tcp_service("web", "127.0.0.1:3000".parse()?)
///     .build()?;
/// client.run(tokio_util::sync::CancellationToken::new()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    config: ClientConfig,
    services: Vec<(String, ServiceKind, HostPort, Option<Secret>)>,
}

impl ClientBuilder {
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

    /// `noise` (default) or plaintext `tcp` (needs [`ClientBuilder::insecure`]).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.config.transport = transport;
        self
    }

    /// Ciphers to offer, most preferred first.
    pub fn ciphers(mut self, ciphers: Vec<CipherSuite>) -> Self {
        self.config.ciphers = ciphers;
        self
    }

    /// Allows weak secrets and the plaintext transport.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.config.insecure = insecure;
        self
    }

    /// Silence from the server after which the session is declared dead.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.config.heartbeat_timeout = timeout;
        self
    }

    /// Reconnect backoff bounds.
    pub fn reconnect_delays(mut self, initial: Duration, max: Duration) -> Self {
        self.config.reconnect_initial_delay = initial;
        self.config.reconnect_max_delay = max;
        self
    }

    /// Serves the admin API and `/metrics` on `bind`, requiring `token` as a bearer token
    /// when given (a non-loopback `bind` needs one).
    pub fn admin(mut self, bind: SocketAddr, token: Option<&str>) -> Self {
        self.config.admin = Some(crate::config::AdminConfig {
            bind,
            token: token.map(Secret::new),
        });
        self
    }

    /// A reverse TCP service: visitors of the server's `name` port reach `target`.
    pub fn tcp_service(mut self, name: impl Into<String>, target: HostPort) -> Self {
        self.services
            .push((name.into(), ServiceKind::Tcp, target, None));
        self
    }

    /// A reverse UDP service with default settings: datagrams to the server's `name` port
    /// reach `target`, one socket per visitor.
    pub fn udp_service(self, name: impl Into<String>, target: HostPort) -> Self {
        self.udp_service_with(name, target, UdpSettings::DEFAULT)
    }

    /// A reverse UDP service with its own idle timeout and flow bound.
    pub fn udp_service_with(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        settings: UdpSettings,
    ) -> Self {
        self.services
            .push((name.into(), ServiceKind::Udp(settings), target, None));
        self
    }

    /// A reverse TCP service with its own token.
    pub fn tcp_service_with_token(
        mut self,
        name: impl Into<String>,
        target: HostPort,
        token: impl Into<String>,
    ) -> Self {
        self.services.push((
            name.into(),
            ServiceKind::Tcp,
            target,
            Some(Secret::new(token)),
        ));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// Every problem at once.
    pub fn build(mut self) -> Result<Client, ConfigErrors> {
        for (name, kind, target, token) in self.services {
            let token = token
                .or_else(|| self.config.default_token.clone())
                .unwrap_or_default();
            self.config.services.insert(
                name.clone(),
                ClientService {
                    name,
                    kind,
                    target,
                    token,
                },
            );
        }
        Client::from_config(self.config)
    }
}

impl Client {
    /// Starts a builder for a client of the server at `server`.
    pub fn builder(server: HostPort) -> ClientBuilder {
        ClientBuilder {
            config: ClientConfig::new(server, Secret::default()),
            services: Vec::new(),
        }
    }

    /// A client from a loaded config.
    ///
    /// # Errors
    /// The config's validation errors.
    pub fn from_config(config: ClientConfig) -> Result<Client, ConfigErrors> {
        config.validate()?;
        Ok(Client {
            config,
            status: watch::channel(ClientStatus::default()).0,
        })
    }

    /// Watches the connection state.
    pub fn status(&self) -> watch::Receiver<ClientStatus> {
        self.status.subscribe()
    }

    /// Runs until `cancel` fires (then returns `Ok`) or the server refuses the client for
    /// good (then returns the reason). Connection losses are retried forever.
    ///
    /// # Errors
    /// [`ClientError`] for refusals that retrying cannot fix.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), ClientError> {
        let ciphers = match self.config.transport {
            Transport::Tcp => vec![CipherSuite::None],
            _ => self.config.ciphers.clone(),
        };
        let telemetry = Telemetry::new(Side::Client);
        let meters = self
            .config
            .services
            .keys()
            .map(|name| (name.clone(), telemetry.metrics.service(name)))
            .collect();
        let admin_listener = match &self.config.admin {
            Some(admin) => Some(crate::admin::bind(admin.bind).await.map_err(|source| {
                ClientError::AdminBind {
                    addr: admin.bind,
                    source,
                }
            })?),
            None => None,
        };
        let shared = Arc::new(Shared {
            ciphers,
            config: self.config,
            status: self.status,
            cancel,
            tasks: TaskTracker::new(),
            telemetry,
            meters,
            current: Mutex::new(None),
        });
        if let Some(listener) = admin_listener {
            let token = shared.config.admin.as_ref().and_then(|a| a.token.clone());
            let source = Arc::new(admin::ClientAdmin(Arc::clone(&shared)));
            shared.tasks.spawn(crate::admin::serve(
                listener,
                source,
                token,
                shared.cancel.clone(),
            ));
        }
        let mut backoff = Backoff::new(
            shared.config.reconnect_initial_delay,
            shared.config.reconnect_max_delay,
        );
        info!(
            event = "client_started",
            server = %shared.config.server,
            transport = %shared.config.transport,
            services = shared.config.services.len(),
            "warren client starting"
        );
        let result = loop {
            match run_session(&shared, &mut backoff).await {
                Ok(SessionEnd::Cancelled) => break Ok(()),
                Ok(end) => warn!(event = "session_lost", reason = %end, "session lost"),
                Err(Failure::Fatal(error)) => {
                    error!(event = "client_refused", %error, "giving up");
                    break Err(error);
                }
                Err(Failure::Retry(reason)) => {
                    warn!(event = "connect_failed", %reason, "could not establish a session")
                }
            }
            shared.telemetry.metrics.reconnecting();
            shared.status.send_modify(|s| {
                s.connected = false;
                s.services.clear();
                s.cipher = None;
            });
            let delay = backoff.next_delay(rand::rng().next_u64());
            info!(
                event = "reconnect_scheduled",
                delay_ms = delay.as_millis() as u64,
                "reconnecting in {delay:?}"
            );
            tokio::select! {
                () = shared.cancel.cancelled() => break Ok(()),
                () = tokio::time::sleep(delay) => {}
            }
        };
        shared.cancel.cancel();
        shared.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), shared.tasks.wait()).await;
        info!(event = "client_stopped", "warren client stopped");
        result
    }
}

/// State shared by the client's tasks across sessions.
struct Shared {
    config: ClientConfig,
    ciphers: Vec<CipherSuite>,
    status: watch::Sender<ClientStatus>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// Metrics and live connections (read by the admin API).
    telemetry: Arc<Telemetry>,
    /// Each service's counters.
    meters: HashMap<String, ServiceMeter>,
    /// The current session, for the admin API (written at session start and end only).
    current: Mutex<Option<SessionInfo>>,
}

/// How an attempt to hold a session failed.
enum Failure {
    Fatal(ClientError),
    Retry(String),
}

/// One session's state, shared with its data channel tasks.
pub(crate) struct ClientSession {
    keys: SessionKeys,
    /// Where data channels connect: the address the control channel reached.
    server_addr: SocketAddr,
    services: HashMap<String, ClientService>,
    /// Cancelled when the session ends: idle pooled channels close.
    cancel: CancellationToken,
    /// Bounds channels opening or idle.
    pool_slots: Arc<Semaphore>,
    handshake_timeout: Duration,
}

async fn run_session(shared: &Arc<Shared>, backoff: &mut Backoff) -> Result<SessionEnd, Failure> {
    let config = &shared.config;
    let deadline = config.handshake_timeout;
    let names: Vec<&String> = config.services.keys().collect();
    let claims: Vec<(&str, &Secret)> = names
        .iter()
        .map(|name| (name.as_str(), &config.services[*name].token))
        .collect();
    let attempt = establish::establish(
        &config.server,
        &config.psk,
        &shared.ciphers,
        &claims,
        deadline,
    );
    let established = tokio::select! {
        () = shared.cancel.cancelled() => return Ok(SessionEnd::Cancelled),
        result = attempt => result,
    };
    let established = match established {
        Ok(established) => established,
        Err(EstablishError::Refused(refusal)) => {
            shared
                .telemetry
                .metrics
                .handshake_failed(HandshakeFailure::Refused);
            return Err(Failure::Fatal(ClientError::Refused(refusal)));
        }
        Err(error) => {
            let reason = match error {
                EstablishError::Connect { .. } => HandshakeFailure::Connect,
                EstablishError::ClosedDuringHandshake { .. } => HandshakeFailure::BadPsk,
                EstablishError::HandshakeTimeout { .. } | EstablishError::HelloTimeout => {
                    HandshakeFailure::Timeout
                }
                EstablishError::Hello(_) => HandshakeFailure::Protocol,
                _ => HandshakeFailure::Io,
            };
            shared.telemetry.metrics.handshake_failed(reason);
            return Err(Failure::Retry(error.to_string()));
        }
    };
    let EstablishedSession {
        channel,
        keys,
        server_addr,
        verdicts,
        ..
    } = established;
    let mut accepted = HashMap::new();
    let mut refused = Vec::new();
    for (name, verdict) in names.iter().zip(&verdicts) {
        match verdict {
            Verdict::Accepted => {
                accepted.insert((*name).clone(), config.services[*name].clone());
            }
            Verdict::Refused => refused.push((*name).clone()),
        }
    }
    if !refused.is_empty() {
        error!(
            event = "auth_failed",
            services = %refused.join(","),
            "the server refused these services: wrong token, or not in the server's config"
        );
    }
    if accepted.is_empty() {
        shared
            .telemetry
            .metrics
            .handshake_failed(HandshakeFailure::BadToken);
        return Err(Failure::Fatal(ClientError::AllServicesRefused(
            refused.join(", "),
        )));
    }
    backoff.reset();

    let session = Arc::new(ClientSession {
        server_addr,
        services: accepted,
        cancel: shared.cancel.child_token(),
        pool_slots: Arc::new(Semaphore::new(MAX_POOLED)),
        handshake_timeout: deadline,
        keys,
    });
    let service_names: Vec<String> = session.services.keys().cloned().collect();
    info!(
        event = "session_started",
        session = %short_id(session.keys.session_id()),
        server = %config.server,
        cipher = %session.keys.cipher(),
        services = %service_names.join(","),
        "connected"
    );
    shared.telemetry.metrics.session_started();
    *shared
        .current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(SessionInfo {
        id: short_id(session.keys.session_id()),
        peer: server_addr.to_string(),
        cipher: session.keys.cipher().to_string(),
        since: unix_seconds(std::time::SystemTime::now()),
        services: session.services.keys().cloned().collect(),
    });
    shared.status.send_modify(|s| {
        s.connected = true;
        s.sessions += 1;
        s.services = service_names;
        s.cipher = Some(session.keys.cipher());
    });

    let (_control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE);
    for _ in 0..POOL_SIZE {
        pool::spawn_channel(shared, &session);
    }
    let liveness = Liveness {
        ping_interval: None,
        timeout: config.heartbeat_timeout,
    };
    let end = control::run_control(
        channel,
        liveness,
        control_rx,
        session.cancel.clone(),
        |message| match message {
            ControlMessage::NeedChannels { count } => {
                for _ in 0..count.min(MAX_POOLED as u16) {
                    pool::spawn_channel(shared, &session);
                }
            }
            other => warn!(
                event = "control_ignored",
                ?other,
                "ignoring unexpected control message from server"
            ),
        },
    )
    .await;
    session.cancel.cancel();
    shared.telemetry.metrics.session_ended();
    *shared
        .current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    Ok(end)
}
