//! The visitor-facing half of a UDP service: one bound socket, one flow per visitor
//! address, every flow's datagrams over **one** datagram channel per session.
//!
//! The same code serves both directions of the tunnel: the server's half of a reverse
//! service (and of a client-declared one), where the channel is a pooled data channel of
//! the client's session, and the client's half of a forward service, where the channel is
//! a new `KIND_DATA_OPEN` connection to the server. What differs is only where a channel
//! comes from, which a [`ChannelSource`] says.
//!
//! Each visitor address gets a flow id in a bounded [`FlowTable`] (LRU eviction when full,
//! idle expiry with traffic in either direction refreshing it). A new flow is given to a
//! session the source picks, and stays on it while that session lives (a service served by
//! several sessions spreads its flows, and a flow whose session ended moves to another at
//! its next datagram). The first datagram for a session opens its channel; a channel that
//! dies is replaced at the next datagram. UDP never shares a channel with a TCP stream, so a
//! slow TCP transfer never delays a datagram.
//!
//! Tasks: the service loop ([`serve`]) reads the socket (up to [`RECV_BATCH`] datagrams per
//! call; with GRO on, a visitor's GSO batch arrives whole and is split by its stride), keeps
//! the table and hands datagrams to the current channel through a [`DatagramQueue`] (a full
//! queue drops and counts, the socket reader never blocks); each channel runs in its own
//! task that writes the queue out and sends what comes back to the visitor the flow id
//! names (a visitor's datagrams that came out of the tunnel together leave in one call, a
//! [`Run`]).

use std::collections::HashMap;
use std::future::Future;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::net::UdpSocket;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::batch::{Batch, BatchSocket};
use super::run::Run;
use super::{Counter, FlowTable, RECV_BUF_LEN, Received, UdpStats, split, sweep_interval};
use crate::config::UdpSettings;
use crate::relay::limit::Bandwidth;
use crate::session::datagram::{DatagramChannel, FlowId};
use crate::session::datagram_queue::{self, DatagramQueue};
use crate::session::stream::Stream;

/// Pause after a failed `recv_from` so a persistent socket error cannot spin.
const RECV_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Where a visitor-facing UDP service gets the channel that carries its datagrams.
pub trait ChannelSource: Send + Sync + 'static {
    /// The session a channel belongs to: a datagram for a newer session opens a new
    /// channel (this is how UDP comes back after a reconnect).
    type Session: Send + Sync + 'static;

    /// The session for a new flow (or one whose session ended); `None` drops the datagram
    /// (counted as `dropped_no_client`).
    fn pick(&self) -> Option<Arc<Self::Session>>;

    /// Cancelled when `session` ends; the channel's task stops with it.
    fn session_cancel(&self, session: &Self::Session) -> CancellationToken;

    /// Whether `session` still serves the service (a flow on it stays there).
    fn is_live(&self, session: &Self::Session) -> bool;

    /// Opens a datagram channel on `session` with its `StreamOpen` sent. Must give up on
    /// its own within a bounded time.
    fn open(
        &self,
        session: Arc<Self::Session>,
    ) -> impl Future<Output = Result<Stream, String>> + Send;
}

/// A bound UDP service socket and what it needs to serve.
pub struct VisitorSide<S> {
    /// The service name (logs).
    pub name: String,
    /// The socket visitors send to.
    pub socket: Arc<UdpSocket>,
    /// Bounds of the flow table.
    pub settings: UdpSettings,
    /// Counters, shared with whoever reports them.
    pub stats: Arc<UdpStats>,
    /// The service's bandwidth limit: datagrams over it are dropped.
    pub limit: Option<Arc<Bandwidth>>,
    /// Where channels come from.
    pub source: Arc<S>,
}

/// One visitor's flow: where its replies go and the session carrying it.
struct Flow<T> {
    visitor: SocketAddr,
    session: Arc<T>,
}

/// The visitors of one service: flow id -> visitor and session, and the reverse index.
struct Flows<T> {
    table: FlowTable<FlowId, Flow<T>>,
    by_addr: HashMap<SocketAddr, FlowId>,
    next_id: FlowId,
}

impl<T> Flows<T> {
    /// The flow of `peer`, refreshed, and its session, if it has a flow.
    fn existing(&mut self, peer: SocketAddr, now: Instant) -> Option<(FlowId, &Arc<T>)> {
        let id = *self.by_addr.get(&peer)?;
        self.table.touch(&id, now).map(|flow| (id, &flow.session))
    }

    /// Moves flow `id` to `session`.
    fn move_to(&mut self, id: FlowId, session: Arc<T>, now: Instant) {
        if let Some(flow) = self.table.touch_mut(&id, now) {
            flow.session = session;
        }
    }

    /// A new flow for `peer` on `session`, with the visitor it evicted, if any.
    fn insert(
        &mut self,
        peer: SocketAddr,
        session: Arc<T>,
        now: Instant,
    ) -> (FlowId, Option<SocketAddr>) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let flow = Flow {
            visitor: peer,
            session,
        };
        let evicted = self.table.insert(id, flow, now).map(|(_, flow)| {
            self.by_addr.remove(&flow.visitor);
            flow.visitor
        });
        self.by_addr.insert(peer, id);
        (id, evicted)
    }

    /// The visitor of `flow`, refreshed.
    fn visitor(&mut self, flow: FlowId, now: Instant) -> Option<SocketAddr> {
        self.table.touch(&flow, now).map(|flow| flow.visitor)
    }

    fn expire(&mut self, now: Instant) -> usize {
        let expired = self.table.expire(now);
        for (_, flow) in &expired {
            self.by_addr.remove(&flow.visitor);
        }
        expired.len()
    }
}

/// Most channels one service keeps open at once (one per session carrying its flows).
const MAX_LINKS: usize = 64;

/// The channel currently carrying this service's datagrams, and the session it belongs to.
struct Link<T> {
    session: Arc<T>,
    queue: DatagramQueue,
}

/// What every channel task of one service shares with the service loop.
struct Service<S: ChannelSource> {
    name: String,
    socket: BatchSocket<Arc<UdpSocket>>,
    /// The flow table's bound (logs).
    max_sessions: usize,
    flows: Mutex<Flows<S::Session>>,
    stats: Arc<UdpStats>,
    limit: Option<Arc<Bandwidth>>,
    source: Arc<S>,
}

/// Serves one UDP service until `until` is cancelled (the server or client stops, or the
/// session that declared the service ends). Channel tasks are spawned on `tasks`.
pub async fn serve<S: ChannelSource>(
    side: VisitorSide<S>,
    tasks: TaskTracker,
    until: CancellationToken,
) {
    let VisitorSide {
        name,
        socket,
        settings,
        stats,
        limit,
        source,
    } = side;
    let socket = match BatchSocket::new(socket) {
        Ok(socket) => socket,
        Err(error) => {
            warn!(event = "udp_socket_failed", service = %name, %error, "cannot set up the UDP service socket; the service is not served");
            return;
        }
    };
    let service = Arc::new(Service {
        name,
        socket,
        max_sessions: settings.max_sessions,
        flows: Mutex::new(Flows {
            table: FlowTable::new(settings),
            by_addr: HashMap::new(),
            next_id: 0,
        }),
        stats,
        limit,
        source,
    });
    let name = &service.name;
    let stats = &service.stats;
    let socket = &service.socket;
    let mut links: Vec<Link<S::Session>> = Vec::new();
    let mut sweep = tokio::time::interval(sweep_interval(settings.idle_timeout));
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut reported = stats.snapshot();
    loop {
        tokio::select! {
            () = until.cancelled() => return,
            _ = sweep.tick() => {
                let now = Instant::now();
                let (expired, active) = {
                    let mut flows = service.flows.lock().unwrap_or_else(PoisonError::into_inner);
                    (flows.expire(now), flows.table.len())
                };
                stats.add(Counter::FlowsExpired, expired as u64);
                if expired > 0 {
                    debug!(event = "udp_flows_expired", service = %name, expired, active, "idle UDP sessions dropped");
                }
                let now_stats = stats.snapshot();
                if now_stats.differs_in_drops(&reported) {
                    info!(event = "udp_stats", service = %name, active, stats = ?now_stats, "UDP service counters changed");
                    reported = now_stats;
                }
                continue;
            }
            ready = socket.socket().readable() => if let Err(error) = ready {
                debug!(event = "udp_recv_failed", service = %name, %error, "receive failed on a UDP service socket");
                tokio::time::sleep(RECV_ERROR_BACKOFF).await;
                continue;
            },
        }
        // What is waiting, several datagrams per call; each is handled before the next read.
        let received = RECV_BUFS.with_borrow_mut(|bufs| {
            let mut slices: Vec<IoSliceMut<'_>> =
                bufs.chunks_mut(RECV_BUF_LEN).map(IoSliceMut::new).collect();
            let mut batches = [Batch::EMPTY; RECV_BATCH];
            let read = socket.try_recv_many(&mut slices, &mut batches)?;
            // One clock reading per read: what arrived together refreshes its flows alike.
            let now = Instant::now();
            for (slot, batch) in bufs.chunks(RECV_BUF_LEN).zip(&batches[..read]) {
                split(batch, &slot[..batch.len], |received| match received {
                    Received::Datagram(datagram) => {
                        forward(&service, &tasks, &mut links, (batch.from, now), datagram);
                    }
                    Received::Oversized(len) => {
                        stats.bump(Counter::DroppedOversized);
                        debug!(event = "udp_dropped", service = %name, peer = %batch.from, len, reason = "oversized", "datagram larger than 65,507 bytes dropped");
                    }
                });
            }
            Ok::<_, std::io::Error>(())
        });
        match received {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => {
                debug!(event = "udp_recv_failed", service = %name, %error, "receive failed on a UDP service socket");
                tokio::time::sleep(RECV_ERROR_BACKOFF).await;
            }
            Ok(()) => {}
        }
    }
}

/// Datagrams (or GRO batches) one read of a service socket may return.
const RECV_BATCH: usize = 16;

std::thread_local! {
    /// One set of receive buffers per worker thread, so thousands of service sockets hold
    /// none each. Only borrowed inside a synchronous read and its handling.
    static RECV_BUFS: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; RECV_BATCH * RECV_BUF_LEN]);
}

/// Hands one datagram `peer` sent (read at `now`) to the channel of its flow's session,
/// opening the flow (and the channel) on its first datagram; drops and counts what cannot
/// go.
fn forward<S: ChannelSource>(
    service: &Arc<Service<S>>,
    tasks: &TaskTracker,
    links: &mut Vec<Link<S::Session>>,
    (peer, now): (SocketAddr, Instant),
    datagram: &[u8],
) {
    let name = &service.name;
    let stats = &service.stats;
    let len = datagram.len();
    let found = {
        let mut flows = service.flows.lock().unwrap_or_else(PoisonError::into_inner);
        flows.existing(peer, now).map(|(id, session)| {
            (
                id,
                service.source.is_live(session).then(|| Arc::clone(session)),
            )
        })
    };
    let (flow, session) = match found {
        Some((id, Some(session))) => (id, session),
        Some((id, None)) => {
            // Its session ended: the flow moves to another one.
            let Some(session) = service.source.pick() else {
                stats.bump(Counter::DroppedNoClient);
                debug!(event = "udp_dropped", service = %name, %peer, reason = "no_session", "no session serves this service; datagram dropped");
                return;
            };
            service
                .flows
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .move_to(id, Arc::clone(&session), now);
            (id, session)
        }
        None => {
            let Some(session) = service.source.pick() else {
                stats.bump(Counter::DroppedNoClient);
                debug!(event = "udp_dropped", service = %name, %peer, reason = "no_session", "no session serves this service; datagram dropped");
                return;
            };
            let (id, evicted) = service
                .flows
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(peer, Arc::clone(&session), now);
            stats.bump(Counter::FlowsOpened);
            debug!(event = "udp_flow_opened", service = %name, %peer, flow = id, "new UDP session");
            if let Some(evicted) = evicted {
                stats.bump(Counter::FlowsEvicted);
                let total = stats.snapshot().flows_evicted;
                warn!(
                    event = "udp_flow_evicted",
                    service = %name,
                    peer = %evicted,
                    evicted_total = total,
                    max_sessions = service.max_sessions,
                    "UDP session table full; evicted the least recently active visitor"
                );
            }
            (id, session)
        }
    };
    let index = match links
        .iter()
        .position(|l| Arc::ptr_eq(&l.session, &session) && !l.queue.is_closed())
    {
        Some(index) => index,
        None => {
            links.retain(|l| !l.queue.is_closed() && service.source.is_live(&l.session));
            if links.len() >= MAX_LINKS {
                links.remove(0);
            }
            links.push(open_link(service, tasks, session));
            links.len() - 1
        }
    };
    if !stats.within(service.limit.as_ref().map(|l| &l.to_tunnel), len) {
        return;
    }
    let link = &links[index];
    match link.queue.try_send(flow, datagram.to_vec()) {
        Ok(()) => stats.carried(Counter::ToTunnel, len, true),
        // A closed queue is replaced at the next datagram.
        Err(_) => stats.bump(Counter::DroppedQueueFull),
    }
}

/// Starts a task that opens a datagram channel on `session` and carries datagrams both
/// ways until the channel, the session or the queue ends.
fn open_link<S: ChannelSource>(
    service: &Arc<Service<S>>,
    tasks: &TaskTracker,
    session: Arc<S::Session>,
) -> Link<S::Session> {
    let (queue, mut outgoing) = datagram_queue::bounded();
    let service = Arc::clone(service);
    let task_session = Arc::clone(&session);
    tasks.spawn(async move {
        let name = &service.name;
        let cancel = service.source.session_cancel(&task_session);
        let opened = tokio::select! {
            () = cancel.cancelled() => return,
            opened = service.source.open(task_session) => opened,
        };
        let channel = match opened {
            Ok(channel) => channel,
            Err(error) => {
                warn!(event = "stream_open_failed", service = %name, %error, "could not open a datagram channel");
                return;
            }
        };
        debug!(event = "udp_channel_opened", service = %name, "datagram channel opened");
        let (mut sender, mut receiver) = DatagramChannel::new(channel).split();
        let up = async {
            match sender.send_queued(&mut outgoing).await {
                Ok(()) => "replaced by a newer channel".to_owned(),
                Err(error) => format!("send failed: {error}"),
            }
        };
        let down = async {
            let mut run = Run::new();
            loop {
                let received = if run.is_empty() {
                    receiver.recv_datagram().await
                } else {
                    // A run grows with what has already arrived, never waiting for more.
                    match receiver.recv_datagram().now_or_never() {
                        Some(received) => received,
                        None => {
                            send_run(&service, &mut run).await;
                            continue;
                        }
                    }
                };
                let (flow, bytes) = match received {
                    Ok(Some(datagram)) => datagram,
                    Ok(None) => {
                        send_run(&service, &mut run).await;
                        return "closed by the peer".to_owned();
                    }
                    Err(error) => {
                        send_run(&service, &mut run).await;
                        return error.to_string();
                    }
                };
                let visitor = service
                    .flows
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .visitor(flow, Instant::now());
                let Some(visitor) = visitor else {
                    service.stats.bump(Counter::DroppedUnknownFlow);
                    continue;
                };
                let to_local = service.limit.as_ref().map(|l| &l.to_local);
                if !service.stats.within(to_local, bytes.len()) {
                    continue;
                }
                if !run.push(visitor, bytes) {
                    send_run(&service, &mut run).await;
                    let _ = run.push(visitor, bytes); // an empty run takes any datagram
                }
            }
        };
        let reason = tokio::select! {
            () = cancel.cancelled() => "session ended".to_owned(),
            reason = up => reason,
            reason = down => reason,
        };
        debug!(event = "udp_channel_closed", service = %name, %reason, "datagram channel closed");
    });
    Link { session, queue }
}

/// Sends `run` to its visitor in one call (GSO), then empties it.
async fn send_run<S: ChannelSource>(service: &Service<S>, run: &mut Run<SocketAddr>) {
    let Some(visitor) = run.to() else {
        return;
    };
    if let Err(error) = run
        .send(&service.socket, visitor, (&service.stats, false))
        .await
    {
        debug!(event = "udp_send_failed", service = %service.name, peer = %visitor, %error, "could not send a datagram to a visitor");
    }
    run.clear();
}
