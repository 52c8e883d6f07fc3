//! Peer-to-peer tunnels (`warren p2p listen` / `warren p2p connect`): a TCP or UDP service
//! on one machine reached from another through the pinned QUIC connection
//! [`super::session`] sets up from a join code, so the server carries no byte unless its
//! relay is the only path.
//!
//! ```text
//! visitor ─▶ entrance (connect side) ══ QUIC, direct or relayed ══▶ exit (listen side) ─▶ target
//! ```
//!
//! The connection is a session link like a server's QUIC session ([`QuicLink`]), so the
//! bytes move through the same code as every other Warren tunnel: the entrance opens one
//! stream per TCP connection (its `StreamOpen` names [`SERVICE`]) and one datagram channel
//! for all of a UDP service's flows; the exit dials its target for each and pumps
//! ([`crate::relay`], [`crate::relay::udp`]). First, on a unidirectional stream, the exit
//! says what kind of service it is ([`Hello`]), so the entrance binds the right kind of
//! socket; the target's address never leaves the exit.
//!
//! The entrance's socket outlives connections: while no connection is attached, TCP
//! visitors are reset at once and datagrams are dropped (counted), and a new connection
//! (the command joins the same code again) takes over where the last one stopped.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use warren_proto::message::StreamOpen;

use super::mailbox::MailboxError;
use super::session::{self, Connected, Meeting, Options, Route, SessionError};
use crate::config::{HostPort, UdpSettings};
use crate::metrics::{Meter, ServiceMeter};
use crate::relay::limit::Bandwidth;
use crate::relay::udp::targets::{self, TargetSide};
use crate::relay::udp::visitors::{self, ChannelSource, VisitorSide};
use crate::relay::udp::{UdpStats, bind_service_socket};
use crate::relay::{self, Transferred};
use crate::session::link::{OpenError, Replenish, StreamHandler};
use crate::session::quic::QuicLink;
use crate::session::stream::Stream;
use crate::transport::tcp::{self, Family};

/// The service name every tunnel stream opens with (a tunnel carries one service).
pub const SERVICE: &str = "p2p";
/// Version of the [`Hello`].
const HELLO_VERSION: u8 = 1;
/// Longest [`Hello`] accepted.
const HELLO_MAX: usize = 1024;
/// How long the entrance waits for the exit's [`Hello`] once connected.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a stream for a TCP visitor may take.
const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long dialing the exit's target may take.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a side waits for its streams to stop after the connection ended.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed `accept()` before trying again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// First pause before the entrance joins again after losing the connection; it doubles
/// up to [`REJOIN_MAX_PAUSE`].
const REJOIN_FIRST_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause between two tries to join again.
const REJOIN_MAX_PAUSE: Duration = Duration::from_secs(30);

/// What a tunnel carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// TCP connections, one QUIC stream each.
    Tcp,
    /// UDP datagrams, as QUIC datagrams.
    Udp,
}

impl Kind {
    /// `tcp` or `udp`.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Tcp => "tcp",
            Kind::Udp => "udp",
        }
    }
}

/// The exit's first words on a new connection.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    version: u8,
    kind: Kind,
}

/// Why a tunnel side stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// The exit never said what it serves.
    #[error(
        "the other side did not say what it serves within {} s: is it `warren p2p listen` of the same Warren version?",
        HELLO_TIMEOUT.as_secs()
    )]
    NoHello,
    /// The exit's hello was unreadable.
    #[error(
        "the other side's hello is unreadable ({0}): use the same Warren version on both sides"
    )]
    BadHello(String),
    /// The connection failed before the tunnel started.
    #[error("the connection to the other side failed: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The local socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
}

/// What one side of a tunnel moved (TCP: bytes of finished and running streams). The
/// counters are the service's own metrics in a client ([`TunnelStats::metered`]), or
/// free-standing ones for a command. A UDP tunnel's payload bytes count in `bytes_up` and
/// `bytes_down` too (its [`UdpStats`] shares them).
#[derive(Debug)]
pub struct TunnelStats {
    /// TCP connections carried (or UDP datagram channels opened).
    pub streams: Counter,
    /// Streams that ended with an error (target unreachable, reset, cut).
    pub failed: Counter,
    /// Streams open now.
    pub active: Gauge,
    /// Bytes from visitors towards the target.
    pub bytes_up: Counter,
    /// Bytes from the target back to visitors.
    pub bytes_down: Counter,
    /// The UDP flows' counters (UDP tunnels).
    pub udp: Arc<UdpStats>,
    /// The service's bandwidth limit, which its relays keep to (UDP over it is dropped).
    pub limit: Option<Arc<Bandwidth>>,
}

/// One open stream in [`TunnelStats::active`] until dropped.
struct Open<'a>(&'a Gauge);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for TunnelStats {
    fn default() -> Self {
        TunnelStats::sharing(
            Counter::default(),
            Counter::default(),
            Gauge::default(),
            Counter::default(),
            Counter::default(),
        )
    }
}

impl TunnelStats {
    /// Stats that add to `meter`, a service's metrics: streams are its connections, up
    /// is `in` (visitor to target) and down is `out`.
    pub fn metered(meter: &ServiceMeter) -> TunnelStats {
        TunnelStats::sharing(
            meter.total.clone(),
            meter.errors.clone(),
            meter.active.clone(),
            meter.bytes_in.clone(),
            meter.bytes_out.clone(),
        )
    }

    fn sharing(
        streams: Counter,
        failed: Counter,
        active: Gauge,
        bytes_up: Counter,
        bytes_down: Counter,
    ) -> TunnelStats {
        let udp = Arc::new(UdpStats::with_bytes(bytes_up.clone(), bytes_down.clone()));
        TunnelStats {
            streams,
            failed,
            active,
            bytes_up,
            bytes_down,
            udp,
            limit: None,
        }
    }

    /// These stats, for a tunnel held to `limit`.
    pub fn limited(mut self, limit: Option<Arc<Bandwidth>>) -> TunnelStats {
        self.limit = limit;
        self
    }

    /// What a TCP stream's pump paces itself by (counting is done by [`Self::count`]).
    fn pacer(&self) -> Option<Meter> {
        Meter::shaping(self.limit.clone(), None)
    }

    /// Counts a stream that starts now; it is active until the guard drops.
    fn open(&self) -> Open<'_> {
        self.streams.inc();
        self.active.inc();
        Open(&self.active)
    }

    fn count(&self, moved: Result<Transferred, relay::RelayError>, up_is_to_tunnel: bool) {
        match moved {
            Ok(moved) => {
                let (up, down) = if up_is_to_tunnel {
                    (moved.to_tunnel, moved.to_local)
                } else {
                    (moved.to_local, moved.to_tunnel)
                };
                self.bytes_up.inc_by(up);
                self.bytes_down.inc_by(down);
            }
            Err(error) => {
                debug!(event = "stream_aborted", service = SERVICE, %error, "tunnel stream aborted");
                self.failed.inc();
            }
        }
    }
}

/// The listening side's service: where its streams go.
#[derive(Debug, Clone)]
pub struct Exit {
    /// TCP or UDP.
    pub kind: Kind,
    /// The service, dialed for each TCP connection (each UDP flow).
    pub target: HostPort,
    /// Bounds of a UDP service's flow table.
    pub udp: UdpSettings,
}

impl Exit {
    /// Serves one connected peer until the connection ends or `cancel` fires; returns
    /// why it ended.
    ///
    /// # Errors
    ///
    /// [`TunnelError::Connection`] if the hello could not be sent.
    pub async fn serve(
        &self,
        connection: &quinn::Connection,
        stats: &Arc<TunnelStats>,
        cancel: &CancellationToken,
    ) -> Result<String, TunnelError> {
        send_hello(connection, self.kind).await?;
        let tasks = TaskTracker::new();
        let cancel = cancel.child_token();
        let link = QuicLink::new(connection.clone(), tasks.clone());
        link.serve(&Arc::new(ExitStreams {
            exit: self.clone(),
            stats: Arc::clone(stats),
            tasks: tasks.clone(),
            cancel: cancel.clone(),
        }));
        let reason = tokio::select! {
            closed = connection.closed() => closed.to_string(),
            () = cancel.cancelled() => {
                connection.close(0u32.into(), b"the tunnel was stopped");
                "stopped".to_owned()
            }
        };
        link.close();
        cancel.cancel();
        drain(tasks).await;
        Ok(reason)
    }
}

/// The exit's half of each stream the entrance opens.
struct ExitStreams {
    exit: Exit,
    stats: Arc<TunnelStats>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl StreamHandler for ExitStreams {
    async fn serve(&self, open: StreamOpen, mut stream: Stream, _: Replenish) -> Option<Stream> {
        if open.service != SERVICE {
            let _ = stream.writer.reset("unknown service").await;
            return None;
        }
        let _open = self.stats.open();
        match self.exit.kind {
            Kind::Udp => {
                let side = TargetSide {
                    name: SERVICE,
                    target: &self.exit.target,
                    settings: self.exit.udp,
                    tasks: &self.tasks,
                    cancel: self.cancel.clone(),
                    stats: Arc::clone(&self.stats.udp),
                    limit: self.stats.limit.clone(),
                };
                targets::serve(side, stream).await;
            }
            Kind::Tcp => {
                let target = &self.exit.target;
                let connected =
                    tcp::connect_preferring(target, TARGET_CONNECT_TIMEOUT, Family::Any).await;
                let target = match connected {
                    Ok(stream) => stream,
                    Err(error) => {
                        warn!(event = "target_unreachable", service = SERVICE, %target, %error, "cannot reach the tunnel's target");
                        self.stats.failed.inc();
                        let _ = stream
                            .writer
                            .reset(&format!("target unreachable: {error}"))
                            .await;
                        return None;
                    }
                };
                let pacer = self.stats.pacer();
                let moved =
                    relay::pump_metered(target, &mut stream, &self.cancel, pacer.as_ref()).await;
                // The target is the local end here: what goes into the tunnel goes back to
                // visitors.
                self.stats.count(moved, false);
            }
        }
        None
    }
}

/// The connecting side: a local port that visitors reach the exit's service through.
pub struct Entrance {
    kind: Kind,
    local: SocketAddr,
    current: Arc<Current>,
    stats: Arc<TunnelStats>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

/// The connection visitors go through now, if any.
#[derive(Default)]
struct Current(Mutex<Option<Arc<Attached>>>);

impl Current {
    fn get(&self) -> Option<Arc<Attached>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|a| !a.cancel.is_cancelled())
    }

    fn set(&self, attached: Option<Arc<Attached>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = attached;
    }
}

/// One connection to the exit.
struct Attached {
    link: QuicLink,
    /// Cancelled when the connection ends: its streams and channel stop.
    cancel: CancellationToken,
}

impl Entrance {
    /// Binds `bind` for a `kind` tunnel and starts taking visitors (reset or dropped until
    /// a connection is attached); what they move adds to `stats`.
    ///
    /// # Errors
    ///
    /// [`TunnelError::Bind`] when the address cannot be bound.
    pub async fn bind(
        kind: Kind,
        bind: SocketAddr,
        udp: UdpSettings,
        stats: Arc<TunnelStats>,
    ) -> Result<Entrance, TunnelError> {
        let bind_error = |source| TunnelError::Bind { addr: bind, source };
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let current = Arc::new(Current::default());
        let local = match kind {
            Kind::Tcp => {
                let listener = TcpListener::bind(bind).await.map_err(bind_error)?;
                let local = listener.local_addr().map_err(bind_error)?;
                tasks.spawn(accept_visitors(
                    listener,
                    Arc::clone(&current),
                    Arc::clone(&stats),
                    tasks.clone(),
                    stop.clone(),
                ));
                local
            }
            Kind::Udp => {
                let socket = bind_service_socket(bind).map_err(bind_error)?;
                let local = socket.local_addr().map_err(bind_error)?;
                let side = VisitorSide {
                    name: SERVICE.to_owned(),
                    socket: Arc::new(socket),
                    settings: udp,
                    stats: Arc::clone(&stats.udp),
                    limit: stats.limit.clone(),
                    source: Arc::new(EntranceChannels {
                        current: Arc::clone(&current),
                        stats: Arc::clone(&stats),
                    }),
                };
                tasks.spawn(visitors::serve(side, tasks.clone(), stop.clone()));
                local
            }
        };
        Ok(Entrance {
            kind,
            local,
            current,
            stats,
            tasks,
            stop,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What it moved so far.
    pub fn stats(&self) -> &Arc<TunnelStats> {
        &self.stats
    }

    /// Reads the exit's hello on a new connection: the kind of service it serves.
    ///
    /// # Errors
    ///
    /// [`TunnelError::NoHello`] / [`TunnelError::BadHello`], or the connection's end.
    pub async fn hello(connection: &quinn::Connection) -> Result<Kind, TunnelError> {
        let read = async {
            let mut recv = connection.accept_uni().await?;
            recv.read_to_end(HELLO_MAX)
                .await
                .map_err(|e| TunnelError::BadHello(e.to_string()))
        };
        let bytes = tokio::time::timeout(HELLO_TIMEOUT, read)
            .await
            .map_err(|_| TunnelError::NoHello)??;
        let hello: Hello =
            serde_json::from_slice(&bytes).map_err(|e| TunnelError::BadHello(e.to_string()))?;
        if hello.version != HELLO_VERSION {
            return Err(TunnelError::BadHello(format!(
                "version {}, this side speaks {HELLO_VERSION}",
                hello.version
            )));
        }
        Ok(hello.kind)
    }

    /// The kind of tunnel it was bound for.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Carries visitors over `connection` until it ends or [`Entrance::close`]; returns
    /// why it ended.
    pub async fn attach(&self, connection: &quinn::Connection) -> String {
        let attached = Arc::new(Attached {
            link: QuicLink::new(connection.clone(), self.tasks.clone()),
            cancel: self.stop.child_token(),
        });
        self.current.set(Some(Arc::clone(&attached)));
        let reason = tokio::select! {
            closed = connection.closed() => closed.to_string(),
            () = self.stop.cancelled() => "stopped".to_owned(),
        };
        self.current.set(None);
        attached.cancel.cancel();
        attached.link.close();
        reason
    }

    /// Carries visitors over `first` (when given; else it joins `meeting` at once), and
    /// whenever the connection drops joins `meeting` again (with pauses growing from 0.5
    /// to 30 s, at each server of `options` in turn) and carries them over the new one, until `stop` fires (`Ok`) or the
    /// meeting is gone for good (`Err`, why). `report` hears each step.
    ///
    /// # Errors
    ///
    /// The meeting no longer leads to the same service: the listener stopped (its
    /// nameplate was freed, or taken by another code), the key exchange failed (a wrong
    /// token), or it now serves the other kind.
    pub async fn keep_joined(
        &self,
        first: Option<Connected>,
        meeting: &Meeting,
        options: &[Options],
        stop: &CancellationToken,
        report: &Reporter,
    ) -> Result<(), String> {
        let mut now = match first {
            Some(first) => first,
            None => match self
                .rejoin(meeting, options, stop, report, Duration::ZERO)
                .await?
            {
                Some(connected) => connected,
                None => return Ok(()),
            },
        };
        loop {
            let reason = tokio::select! {
                reason = self.attach(&now.connection) => reason,
                () = report_moves(&now, report) => unreachable!("report_moves never returns"),
                () = stop.cancelled() => {
                    now.connection.close(0u32.into(), b"stopped");
                    return Ok(());
                }
            };
            report(Event::Disconnected {
                peer: &now,
                reason: &reason,
            });
            match self
                .rejoin(meeting, options, stop, report, REJOIN_FIRST_PAUSE)
                .await?
            {
                Some(again) => now = again,
                None => return Ok(()),
            }
        }
    }

    /// Joins `meeting` (again), first after `pause`, then after pauses doubling from
    /// [`REJOIN_FIRST_PAUSE`], trying each of `options` (one per server) in turn from the
    /// first; `Ok(None)` when stopped.
    async fn rejoin(
        &self,
        meeting: &Meeting,
        servers: &[Options],
        stop: &CancellationToken,
        report: &Reporter,
        mut pause: Duration,
    ) -> Result<Option<Connected>, String> {
        let Some(mut options) = servers.first() else {
            return Err("no server to meet the other side at".to_owned());
        };
        let mut turn = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(None),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).clamp(REJOIN_FIRST_PAUSE, REJOIN_MAX_PAUSE);
            let joined = tokio::select! {
                () = stop.cancelled() => return Ok(None),
                joined = session::join_meeting(meeting, options) => joined,
            };
            let failure = match joined {
                Err(error) if gone_for_good(meeting, &error) => return Err(error.to_string()),
                Err(error) => error.to_string(),
                Ok(connected) => match Entrance::hello(&connected.connection).await {
                    Ok(kind) if kind == self.kind => {
                        report(Event::Connected(&connected));
                        return Ok(Some(connected));
                    }
                    Ok(other) => {
                        connected.connection.close(0u32.into(), b"wrong kind");
                        return Err(format!(
                            "the other side serves {} and this side listens for {}: make both ends the same type",
                            other.word(),
                            self.kind.word()
                        ));
                    }
                    Err(error) => error.to_string(),
                },
            };
            report(Event::Retrying {
                error: &failure,
                pause,
            });
            turn += 1;
            options = &servers[turn % servers.len()];
        }
    }

    /// Stops taking visitors and ends every stream.
    pub async fn close(self) {
        self.stop.cancel();
        drain(self.tasks).await;
    }
}

/// What a tunnel side reports as it goes ([`Entrance::keep_joined`],
/// [`super::listen::keep_offered`]).
#[derive(Debug)]
pub enum Event<'a> {
    /// The exit offers its service under this code, or by its name (no code).
    Offered(Option<&'a super::code::Code>),
    /// A peer connected.
    Connected(&'a Connected),
    /// The connection to this peer moved to another path (from the relay to the direct
    /// path), its streams untouched.
    Moved {
        /// The connection.
        peer: &'a Connected,
        /// Its route now.
        route: Route,
    },
    /// The connection to this peer ended, for this reason.
    Disconnected {
        /// The connection that ended.
        peer: &'a Connected,
        /// Why.
        reason: &'a str,
    },
    /// Joining (or offering) failed; the next try comes after `pause`.
    Retrying {
        /// Why it failed.
        error: &'a str,
        /// Until the next try.
        pause: Duration,
    },
    /// Something the user should hear of: a peer refused, the mailbox lost.
    Notice(&'a str),
}

/// Hears a tunnel side's [`Event`]s (from several tasks at once).
pub type Reporter = Arc<dyn Fn(Event<'_>) + Send + Sync>;

/// Reports each move of `connected` to another path; never returns (select it beside
/// what ends with the connection).
pub(crate) async fn report_moves(connected: &Connected, report: &Reporter) {
    let mut path = connected.path.clone();
    while let Some(route) = path.changed().await {
        report(Event::Moved {
            peer: connected,
            route,
        });
    }
    std::future::pending().await
}

/// Errors after which joining the same meeting again cannot work. A code's refusal is
/// final (its listener stopped, so the number is gone or someone else's); a named
/// service's is not (its listener may be restarting), so only a failed key exchange or
/// the wrong pair of commands ends the wait.
fn gone_for_good(meeting: &Meeting, error: &SessionError) -> bool {
    match error {
        SessionError::Pake(_)
        | SessionError::WrongPurpose { .. }
        | SessionError::WrongPeer { .. } => true,
        SessionError::Mailbox(MailboxError::Refused(_) | MailboxError::Burned) => {
            matches!(meeting, Meeting::Code(_))
        }
        _ => false,
    }
}

/// Accepts TCP visitors and sends each through the attached connection.
async fn accept_visitors(
    listener: TcpListener,
    current: Arc<Current>,
    stats: Arc<TunnelStats>,
    tasks: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let (visitor, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(event = "accept_failed", service = SERVICE, %error, "accept failed on the tunnel's port; retrying");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        tcp::tune(&visitor);
        let Some(attached) = current.get() else {
            debug!(event = "visitor_rejected", service = SERVICE, %peer, "not connected to the other side right now; closing");
            tcp::reset(visitor);
            continue;
        };
        let stats = Arc::clone(&stats);
        tasks.spawn(async move {
            carry_visitor(&attached, visitor, peer, &stats).await;
        });
    }
}

/// One TCP visitor, over one stream.
async fn carry_visitor(
    attached: &Attached,
    visitor: TcpStream,
    peer: SocketAddr,
    stats: &TunnelStats,
) {
    let open = StreamOpen {
        service: SERVICE.to_owned(),
        visitor: Some(peer),
        local: visitor.local_addr().ok(),
    };
    // Opening waits while the peer's stream limit (4096) is reached: bounded, so visitors
    // beyond it are reset instead of piling up.
    let opening = tokio::time::timeout(STREAM_OPEN_TIMEOUT, attached.link.open_stream(&open));
    let opened = tokio::select! {
        () = attached.cancel.cancelled() => { tcp::reset(visitor); return; }
        opened = opening => opened.unwrap_or_else(|_| Err(OpenError::Failed(format!(
            "no stream free within {} s", STREAM_OPEN_TIMEOUT.as_secs()
        )))),
    };
    let mut stream = match opened {
        Ok(stream) => stream,
        Err(error) => {
            warn!(event = "stream_open_failed", service = SERVICE, %peer, %error, "could not open a tunnel stream");
            stats.failed.inc();
            tcp::reset(visitor);
            return;
        }
    };
    let _open = stats.open();
    let pacer = stats.pacer();
    let moved = relay::pump_metered(visitor, &mut stream, &attached.cancel, pacer.as_ref()).await;
    stats.count(moved, true);
}

/// Datagram channels of a UDP entrance: one per attached connection.
struct EntranceChannels {
    current: Arc<Current>,
    stats: Arc<TunnelStats>,
}

impl ChannelSource for EntranceChannels {
    type Session = Attached;

    fn pick(&self) -> Option<Arc<Attached>> {
        self.current.get()
    }

    fn session_cancel(&self, session: &Attached) -> CancellationToken {
        session.cancel.clone()
    }

    fn is_live(&self, session: &Attached) -> bool {
        !session.cancel.is_cancelled()
    }

    async fn open(&self, session: Arc<Attached>) -> Result<Stream, String> {
        let stream = session
            .link
            .open_stream(&StreamOpen::new(SERVICE))
            .await
            .map_err(|e| e.to_string())?;
        self.stats.streams.inc();
        Ok(stream)
    }
}

async fn send_hello(connection: &quinn::Connection, kind: Kind) -> Result<(), TunnelError> {
    let hello = Hello {
        version: HELLO_VERSION,
        kind,
    };
    // Invariant: a struct of a number and an enum always serialises.
    let bytes = serde_json::to_vec(&hello).unwrap_or_default();
    let mut send = connection.open_uni().await?;
    // A failed write means the connection is going; `closed()` reports it next.
    let _ = send.write_all(&bytes).await;
    let _ = send.finish();
    Ok(())
}

/// Waits (bounded) for a side's tasks to stop after their cancellation.
async fn drain(tasks: TaskTracker) {
    tasks.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tasks.wait())
        .await
        .is_err()
    {
        debug!(
            event = "tunnel_drain_timeout",
            "tunnel tasks still running after the connection ended"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hello_is_small_json_with_a_version() {
        let bytes = serde_json::to_vec(&Hello {
            version: HELLO_VERSION,
            kind: Kind::Udp,
        })
        .unwrap();
        assert_eq!(bytes, br#"{"version":1,"kind":"udp"}"#);
        assert!(bytes.len() < HELLO_MAX);
    }
}
