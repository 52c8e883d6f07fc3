//! The client's half of forward services, and how it dials the server.
//!
//! A forward service listens on the client's `bind` from the moment the client starts (so a
//! busy port is reported at once and the port stays the same across reconnects). For each
//! local connection the client opens a stream to the server with `StreamOpen { service }`
//! and relays; the server dials the target its config names. While no session is up, local
//! connections are reset at once.
//!
//! A UDP forward service binds a UDP socket instead; each source address is a flow, and
//! the flows' datagrams travel over one datagram channel per session, opened at the
//! first datagram (the visitor-facing machinery of a reverse UDP service on the server,
//! [`crate::relay::udp::visitors`], with channels from here). While no session is up,
//! datagrams are dropped and counted.
//!
//! [`dial_server`] is the one place that opens a TCP connection to the server: directly
//! (IPv6 first with `prefer_ipv6`) or through the configured proxy, then wrapped in the
//! transport's TLS or WebSocket layers.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use warren_proto::message::StreamOpen;

use super::{ClientError, ClientSession, Shared};
use crate::config::proxy::ProxyUrl;
use crate::config::{ClientConfig, ClientForward, HostPort, ServiceKind, Transport, UdpSettings};
use crate::metrics::Meter;
use crate::relay;
use crate::relay::udp::UdpEnd;
use crate::relay::udp::visitors::{self, ChannelSource, VisitorSide};
use crate::session::stream::Stream;
use crate::transport::layers::{ClientLayers, Connected};
use crate::transport::tcp::{self, Family};
use crate::transport::tls::TlsClient;

/// Pause after a failed `accept()` before trying again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The address family order the config asks for.
pub(super) fn family(config: &ClientConfig) -> Family {
    if config.prefer_ipv6 {
        Family::PreferIpv6
    } else {
        Family::Any
    }
}

/// Opens a connection to `server` the way `config` says (see [`tcp::dial_server`]) and
/// wraps it in the transport's `layers` (TLS, WebSocket), all within `deadline`.
///
/// # Errors
/// Connection, proxy and TLS or WebSocket failures, with a message naming what failed.
pub(crate) async fn dial_server(
    config: &ClientConfig,
    transport: Transport,
    server: &HostPort,
    proxy: Option<&ProxyUrl>,
    layers: &ClientLayers,
    deadline: Duration,
) -> io::Result<Connected> {
    let attempt = async {
        let how = (family(config), &config.tcp_congestion);
        let stream = tcp::dial_server(server, proxy, None, deadline, how).await?;
        layers.wrap(stream).await
    };
    tokio::time::timeout(deadline, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the {transport} handshake with {server} timed out after {deadline:?}"),
            ))
        })
}

/// The layers every connection of a session to `server` on `transport` gets.
///
/// # Errors
/// An unreadable CA file, naming it.
pub(crate) fn client_layers(
    config: &ClientConfig,
    transport: Transport,
    server: &HostPort,
) -> Result<ClientLayers, String> {
    if !transport.uses_tls() && !transport.uses_websocket() {
        return Ok(ClientLayers::plain());
    }
    let ca = match &config.tls.ca {
        Some(path) => Some(
            crate::transport::quic::certs::load_certs(path)
                .map_err(|e| format!("client.tls.ca: {e}"))?,
        ),
        None => None,
    };
    let tls = TlsClient::new(config.tls.pin, ca).map_err(|e| format!("client.tls: {e}"))?;
    let server_name = config
        .tls
        .server_name
        .clone()
        .unwrap_or_else(|| server.host.clone());
    let host = config.ws.host.clone().unwrap_or_else(|| server.to_string());
    Ok(
        ClientLayers::new(transport, tls, server_name, (host, config.ws.path.clone()))
            .ping_every(config.ws.ping_interval),
    )
}

/// The ciphers a client offers on `transport`: none where the transport already encrypts
/// end to end (`tls`) or is plaintext by choice (`tcp`).
pub(crate) fn offered_ciphers(
    config: &ClientConfig,
    transport: Transport,
) -> Vec<warren_proto::CipherSuite> {
    match transport {
        Transport::Tcp | Transport::Tls => vec![warren_proto::CipherSuite::None],
        _ => config.ciphers.clone(),
    }
}

/// A forward service's local port, shared so that a reload can hand it to the service's
/// new settings.
#[derive(Clone)]
pub(super) enum ForwardSocket {
    Tcp(Arc<TcpListener>),
    Udp(Arc<UdpSocket>),
}

impl ForwardSocket {
    /// The address it listens on.
    pub(super) fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            ForwardSocket::Tcp(listener) => listener.local_addr(),
            ForwardSocket::Udp(socket) => socket.local_addr(),
        }
    }
}

/// A forward service being served.
#[derive(Clone)]
pub(super) struct Running {
    pub(super) forward: ClientForward,
    pub(super) socket: ForwardSocket,
    /// Stops the listener and the service's streams (client shutdown, or a reload that
    /// removes or changes the service).
    pub(super) stop: CancellationToken,
}

/// Binds one forward service's local port.
///
/// # Errors
/// [`ClientError::Bind`] naming the service.
pub(super) async fn bind_forward(forward: &ClientForward) -> Result<ForwardSocket, ClientError> {
    let bound = match forward.kind {
        // `http` forward services are refused by the config.
        ServiceKind::Tcp | ServiceKind::Http => TcpListener::bind(forward.bind)
            .await
            .map(|listener| ForwardSocket::Tcp(Arc::new(listener))),
        ServiceKind::Udp(_) => relay::udp::bind_service_socket(forward.bind)
            .map(|socket| ForwardSocket::Udp(Arc::new(socket))),
    };
    bound.map_err(|source| ClientError::Bind {
        service: forward.name.clone(),
        addr: forward.bind,
        source,
    })
}

/// Binds every forward service's local port.
///
/// # Errors
/// [`ClientError::Bind`] naming the service whose port could not be bound.
pub(super) async fn bind_forwards(
    config: &ClientConfig,
) -> Result<Vec<(ClientForward, ForwardSocket)>, ClientError> {
    let mut listeners = Vec::new();
    for forward in config.forwards.values() {
        listeners.push((forward.clone(), bind_forward(forward).await?));
    }
    Ok(listeners)
}

/// Serves `forward` on `socket` until the client stops or a reload stops it; returns the
/// service it replaced under the same name, if any (the caller stops that one).
pub(super) fn start(
    shared: &Arc<Shared>,
    forward: ClientForward,
    socket: ForwardSocket,
) -> Option<Running> {
    let name = forward.name.clone();
    let stop = shared.cancel.child_token();
    if let Ok(addr) = socket.local_addr() {
        info!(event = "forward_listening", service = %name, %addr, "forward service listening");
        shared.status.send_modify(|s| {
            s.forwards.insert(name.clone(), addr);
        });
    }
    let running = Running {
        forward: forward.clone(),
        socket: socket.clone(),
        stop: stop.clone(),
    };
    let replaced = shared
        .forwards
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.clone(), running);
    let shared_for_task = Arc::clone(shared);
    match (socket, forward.kind) {
        (ForwardSocket::Tcp(listener), _) => {
            shared
                .tasks
                .spawn(serve_tcp(shared_for_task, name, listener, stop));
        }
        (ForwardSocket::Udp(socket), kind) => {
            let settings = match kind {
                ServiceKind::Udp(settings) => settings,
                ServiceKind::Tcp | ServiceKind::Http => UdpSettings::DEFAULT,
            };
            let tasks = shared.tasks.clone();
            let side = VisitorSide {
                name: name.clone(),
                socket,
                settings,
                stats: shared.telemetry.metrics.udp_stats(&name, UdpEnd::Visitors),
                limit: shared.limits.get(&name),
                source: Arc::new(ForwardSource {
                    shared: shared_for_task,
                    name,
                }),
            };
            shared.tasks.spawn(visitors::serve(side, tasks, stop));
        }
    }
    replaced
}

/// Datagram channels of a UDP forward service: new streams to the server on the
/// session up right now, if it serves the service.
struct ForwardSource {
    shared: Arc<Shared>,
    name: String,
}

impl ChannelSource for ForwardSource {
    type Session = ClientSession;

    fn pick(&self) -> Option<Arc<ClientSession>> {
        current_session(&self.shared, &self.name)
    }

    fn session_cancel(&self, session: &ClientSession) -> CancellationToken {
        session.cancel.clone()
    }

    fn is_live(&self, session: &ClientSession) -> bool {
        // A flow stays on its server's session until it ends or a reload replaces it.
        !session.cancel.is_cancelled()
    }

    async fn open(&self, session: Arc<ClientSession>) -> Result<Stream, String> {
        // No visitor address: one channel carries every flow.
        open_stream(&session, &self.name, None, None).await
    }
}

/// The session a forward stream of `name` goes through: among the sessions up whose
/// server accepted the service, the one with the shortest handshake round trip (the newest
/// of a server's sessions, when a reload made a second one), preferring a server that
/// answers its heartbeats to a suspect or draining one.
fn current_session(shared: &Shared, name: &str) -> Option<Arc<ClientSession>> {
    let sessions = shared
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut best: Option<&Arc<ClientSession>> = None;
    for session in sessions.iter().rev() {
        if !session.forwards.contains(name) || session.cancel.is_cancelled() {
            continue;
        }
        let rank = |s: &ClientSession| {
            let avoid = s.vitals.is_suspect() || s.server_draining.load(Ordering::Acquire);
            (avoid, s.rtt)
        };
        if best.is_none_or(|b| rank(session) < rank(b)) {
            best = Some(session);
        }
    }
    best.cloned()
}

/// Accepts local connections of one TCP forward service until `stop` fires.
async fn serve_tcp(
    shared: Arc<Shared>,
    name: String,
    listener: Arc<TcpListener>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((local, peer)) => {
                tcp::tune(&local);
                let session = current_session(&shared, &name);
                let Some(session) = session else {
                    debug!(event = "visitor_rejected", service = %name, %peer, "no session serves this forward service; closing");
                    tcp::reset(local);
                    continue;
                };
                let name = name.clone();
                let stop = stop.clone();
                let codec = shared
                    .config()
                    .forwards
                    .get(&name)
                    .and_then(|forward| forward.compression);
                let shaping = Meter::shaping(shared.limits.get(&name), codec);
                shared.tasks.spawn(async move {
                    let local = (local, peer, shaping);
                    session
                        .vitals
                        .counting(serve_local(&session, local, name, &stop))
                        .await;
                });
            }
            Err(error) => {
                warn!(event = "accept_failed", service = %name, %error, "accept failed on a forward port; retrying");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

async fn serve_local(
    session: &Arc<ClientSession>,
    (local, peer, shaping): (TcpStream, SocketAddr, Option<Meter>),
    service: String,
    stop: &CancellationToken,
) {
    let opened = tokio::select! {
        () = session.cancel.cancelled() => { tcp::reset(local); return; }
        opened = open_stream(session, &service, Some(peer), local.local_addr().ok()) => opened,
    };
    let mut channel = match opened {
        Ok(channel) => channel,
        Err(error) => {
            warn!(event = "stream_open_failed", %service, %peer, %error, "could not open a forward stream to the server");
            tcp::reset(local);
            return;
        }
    };
    debug!(event = "forward_opened", %service, %peer, "local connection forwarded");
    match relay::pump_metered(local, &mut channel, stop, shaping.as_ref()).await {
        Ok(moved) => {
            debug!(event = "stream_closed", %service, up = moved.to_tunnel, down = moved.to_local, "forward stream done")
        }
        Err(error) => debug!(event = "stream_aborted", %service, %error, "forward stream aborted"),
    }
}

/// Opens a forward stream for `service` on `session`.
async fn open_stream(
    session: &ClientSession,
    service: &str,
    visitor: Option<SocketAddr>,
    local: Option<SocketAddr>,
) -> Result<Stream, String> {
    let open = StreamOpen {
        service: service.to_owned(),
        visitor,
        local,
    };
    session
        .link
        .open_stream(&open)
        .await
        .map_err(|e| e.to_string())
}

/// The server as a `HostPort`, for messages.
pub(super) fn describe(server: &HostPort, proxy: Option<&ProxyUrl>) -> String {
    match proxy {
        Some(proxy) => format!("{server} via {proxy}"),
        None => server.to_string(),
    }
}
