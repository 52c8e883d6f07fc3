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
//! idle expiry with traffic in either direction refreshing it). The first visitor datagram
//! after a session starts opens a channel; a channel that dies is replaced at the next
//! datagram. UDP never shares a channel with a TCP stream, so a slow TCP transfer never
//! delays a datagram.
//!
//! Tasks: the service loop ([`serve`]) reads the socket, keeps the table and hands
//! datagrams to the current channel through a bounded queue (`try_send`: a full queue drops
//! and counts, the socket reader never blocks); each channel runs in its own task that
//! writes the queue out and sends what comes back to the visitor the flow id names.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{Counter, FlowTable, RECV_BUF_LEN, TUNNEL_QUEUE, UdpStats, sweep_interval};
use crate::config::UdpSettings;
use crate::session::datagram::{DatagramChannel, FlowId, MAX_DATAGRAM_LEN};
use crate::transport::Channel;

/// Pause after a failed `recv_from` so a persistent socket error cannot spin.
const RECV_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Where a visitor-facing UDP service gets the channel that carries its datagrams.
pub trait ChannelSource: Send + Sync + 'static {
    /// The session a channel belongs to: a datagram for a newer session opens a new
    /// channel (this is how UDP comes back after a reconnect).
    type Session: Send + Sync + 'static;

    /// The session serving the service right now; `None` drops the datagram (counted as
    /// `dropped_no_client`).
    fn current(&self) -> Option<Arc<Self::Session>>;

    /// Cancelled when `session` ends; the channel's task stops with it.
    fn session_cancel(&self, session: &Self::Session) -> CancellationToken;

    /// Opens a datagram channel on `session` with its `StreamOpen` sent. Must give up on
    /// its own within a bounded time.
    fn open(
        &self,
        session: Arc<Self::Session>,
    ) -> impl Future<Output = Result<Channel, String>> + Send;
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
    /// Where channels come from.
    pub source: Arc<S>,
}

/// The visitors of one service: flow id -> visitor address, and the reverse index.
struct Flows {
    table: FlowTable<FlowId, SocketAddr>,
    by_addr: HashMap<SocketAddr, FlowId>,
    next_id: FlowId,
}

impl Flows {
    /// The flow of `peer`, refreshed, or a new one (then `Some`, with the visitor it
    /// evicted, if any).
    fn flow_for(&mut self, peer: SocketAddr, now: Instant) -> (FlowId, Option<Option<SocketAddr>>) {
        if let Some(&id) = self.by_addr.get(&peer) {
            self.table.touch(&id, now);
            return (id, None);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let evicted = self.table.insert(id, peer, now).map(|(_, addr)| {
            self.by_addr.remove(&addr);
            addr
        });
        self.by_addr.insert(peer, id);
        (id, Some(evicted))
    }

    /// The visitor of `flow`, refreshed.
    fn visitor(&mut self, flow: FlowId, now: Instant) -> Option<SocketAddr> {
        self.table.touch(&flow, now).copied()
    }

    fn expire(&mut self, now: Instant) -> usize {
        let expired = self.table.expire(now);
        for (_, addr) in &expired {
            self.by_addr.remove(addr);
        }
        expired.len()
    }
}

/// The channel currently carrying this service's datagrams, and the session it belongs to.
struct Link<T> {
    session: Arc<T>,
    queue: mpsc::Sender<(FlowId, Vec<u8>)>,
}

/// What every channel task of one service shares with the service loop.
struct Service<S> {
    name: String,
    socket: Arc<UdpSocket>,
    flows: Mutex<Flows>,
    stats: Arc<UdpStats>,
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
        source,
    } = side;
    let service = Arc::new(Service {
        name,
        socket,
        flows: Mutex::new(Flows {
            table: FlowTable::new(settings),
            by_addr: HashMap::new(),
            next_id: 0,
        }),
        stats,
        source,
    });
    let name = &service.name;
    let stats = &service.stats;
    let mut link: Option<Link<S::Session>> = None;
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let mut sweep = tokio::time::interval(sweep_interval(settings.idle_timeout));
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut reported = stats.snapshot();
    loop {
        let (len, peer) = tokio::select! {
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
            received = service.socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(error) => {
                    debug!(event = "udp_recv_failed", service = %name, %error, "receive failed on a UDP service socket");
                    tokio::time::sleep(RECV_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        if len > MAX_DATAGRAM_LEN {
            stats.bump(Counter::DroppedOversized);
            debug!(event = "udp_dropped", service = %name, %peer, len, reason = "oversized", "datagram larger than 65,507 bytes dropped");
            continue;
        }
        let Some(session) = service.source.current() else {
            stats.bump(Counter::DroppedNoClient);
            debug!(event = "udp_dropped", service = %name, %peer, reason = "no_session", "no session serves this service; datagram dropped");
            continue;
        };
        let (flow, opened) = service
            .flows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flow_for(peer, Instant::now());
        if opened.is_some() {
            stats.bump(Counter::FlowsOpened);
            debug!(event = "udp_flow_opened", service = %name, %peer, flow, "new UDP session");
        }
        if let Some(evicted) = opened.flatten() {
            stats.bump(Counter::FlowsEvicted);
            let total = stats.snapshot().flows_evicted;
            warn!(
                event = "udp_flow_evicted",
                service = %name,
                peer = %evicted,
                evicted_total = total,
                max_sessions = settings.max_sessions,
                "UDP session table full; evicted the least recently active visitor"
            );
        }
        let current = link
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.session, &session) && !l.queue.is_closed());
        if !current {
            link = Some(open_link(&service, &tasks, session));
        }
        let Some(link) = &link else { continue };
        match link.queue.try_send((flow, buf[..len].to_vec())) {
            Ok(()) => stats.bump(Counter::ToTunnel),
            Err(_) => stats.bump(Counter::DroppedQueueFull),
        }
    }
}

/// Starts a task that opens a datagram channel on `session` and carries datagrams both
/// ways until the channel, the session or the queue ends.
fn open_link<S: ChannelSource>(
    service: &Arc<Service<S>>,
    tasks: &TaskTracker,
    session: Arc<S::Session>,
) -> Link<S::Session> {
    let (queue, mut outgoing) = mpsc::channel::<(FlowId, Vec<u8>)>(TUNNEL_QUEUE);
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
            while let Some((flow, bytes)) = outgoing.recv().await {
                if let Err(error) = sender.send_datagram(flow, &bytes).await {
                    return format!("send failed: {error}");
                }
            }
            "replaced by a newer channel".to_owned()
        };
        let down = async {
            loop {
                let (flow, bytes) = match receiver.recv_datagram().await {
                    Ok(Some(datagram)) => datagram,
                    Ok(None) => return "closed by the peer".to_owned(),
                    Err(error) => return error.to_string(),
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
                match service.socket.send_to(bytes, visitor).await {
                    Ok(_) => service.stats.bump(Counter::FromTunnel),
                    Err(error) => {
                        service.stats.bump(Counter::SendErrors);
                        debug!(event = "udp_send_failed", service = %name, peer = %visitor, %error, "could not send a datagram to a visitor");
                    }
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
