//! The server's half of a UDP service.
//!
//! One socket per service, bound at start. Each visitor address gets a flow id in a
//! bounded [`FlowTable`] (LRU eviction when full, idle expiry with traffic in either
//! direction refreshing it). Datagrams of every flow travel over **one** datagram channel
//! per session: the first visitor datagram after a session starts takes a data channel
//! from the session's pool (like a TCP visitor, with `StreamOpen { service }`), and a
//! channel that dies is replaced at the next datagram. UDP never shares a channel with a
//! TCP stream, so a slow TCP transfer never delays a datagram.
//!
//! Tasks: the service loop (this module's [`serve_udp`]) reads the socket, keeps the table
//! and hands datagrams to the current channel through a bounded queue (`try_send`: a full
//! queue drops and counts, the socket reader never blocks); each channel runs in its own
//! task that writes the queue out and sends what comes back to the visitor the flow id
//! names.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use super::session::ServerSession;
use super::{STREAM_OPEN_TIMEOUT, ServiceSlot, Shared, open_stream};
use crate::config::UdpSettings;
use crate::relay::udp::{Counter, FlowTable, RECV_BUF_LEN, UdpStats, sweep_interval};
use crate::session::datagram::{DatagramChannel, FlowId, MAX_DATAGRAM_LEN};

/// Datagrams waiting for the channel writer, per service; past this they are dropped.
const TUNNEL_QUEUE: usize = 512;
/// Pause after a failed `recv_from` so a persistent socket error cannot spin.
const RECV_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// A UDP service, bound and ready to serve.
pub(super) struct UdpService {
    pub(super) slot: Arc<ServiceSlot>,
    pub(super) socket: UdpSocket,
    pub(super) settings: UdpSettings,
    pub(super) stats: Arc<UdpStats>,
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
struct Link {
    session: Arc<ServerSession>,
    queue: mpsc::Sender<(FlowId, Vec<u8>)>,
}

/// Serves one UDP service until the server shuts down.
pub(super) async fn serve_udp(shared: Arc<Shared>, service: UdpService) {
    let UdpService {
        slot,
        socket,
        settings,
        stats,
    } = service;
    let socket = Arc::new(socket);
    let flows = Arc::new(Mutex::new(Flows {
        table: FlowTable::new(settings),
        by_addr: HashMap::new(),
        next_id: 0,
    }));
    let mut link: Option<Link> = None;
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let mut sweep = tokio::time::interval(sweep_interval(settings.idle_timeout));
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut reported = stats.snapshot();
    loop {
        let (len, peer) = tokio::select! {
            () = shared.cancel.cancelled() => return,
            _ = sweep.tick() => {
                let now = Instant::now();
                let (expired, active) = {
                    let mut flows = flows.lock().unwrap_or_else(PoisonError::into_inner);
                    (flows.expire(now), flows.table.len())
                };
                stats.add(Counter::FlowsExpired, expired as u64);
                if expired > 0 {
                    debug!(event = "udp_flows_expired", service = %slot.name, expired, active, "idle UDP sessions dropped");
                }
                let now_stats = stats.snapshot();
                if now_stats.differs_in_drops(&reported) {
                    info!(event = "udp_stats", service = %slot.name, active, stats = ?now_stats, "UDP service counters changed");
                    reported = now_stats;
                }
                continue;
            }
            received = socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(error) => {
                    debug!(event = "udp_recv_failed", service = %slot.name, %error, "receive failed on a UDP service socket");
                    tokio::time::sleep(RECV_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        if len > MAX_DATAGRAM_LEN {
            stats.bump(Counter::DroppedOversized);
            debug!(event = "udp_dropped", service = %slot.name, %peer, len, reason = "oversized", "datagram larger than 65,507 bytes dropped");
            continue;
        }
        let Some(session) = slot.current() else {
            stats.bump(Counter::DroppedNoClient);
            debug!(event = "udp_dropped", service = %slot.name, %peer, reason = "no_client", "no client serves this service; datagram dropped");
            continue;
        };
        let (flow, opened) = flows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flow_for(peer, Instant::now());
        if opened.is_some() {
            stats.bump(Counter::FlowsOpened);
            debug!(event = "udp_flow_opened", service = %slot.name, %peer, flow, "new UDP session");
        }
        if let Some(evicted) = opened.flatten() {
            stats.bump(Counter::FlowsEvicted);
            let total = stats.snapshot().flows_evicted;
            warn!(
                event = "udp_flow_evicted",
                service = %slot.name,
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
            link = Some(open_link(&shared, &slot, session, &socket, &flows, &stats));
        }
        let Some(link) = &link else { continue };
        match link.queue.try_send((flow, buf[..len].to_vec())) {
            Ok(()) => stats.bump(Counter::ToTunnel),
            Err(_) => stats.bump(Counter::DroppedQueueFull),
        }
    }
}

/// Starts a task that takes a data channel of `session` for this service and carries
/// datagrams both ways until the channel, the session or the queue ends.
fn open_link(
    shared: &Arc<Shared>,
    slot: &Arc<ServiceSlot>,
    session: Arc<ServerSession>,
    socket: &Arc<UdpSocket>,
    flows: &Arc<Mutex<Flows>>,
    stats: &Arc<UdpStats>,
) -> Link {
    let (queue, mut outgoing) = mpsc::channel::<(FlowId, Vec<u8>)>(TUNNEL_QUEUE);
    let slot = Arc::clone(slot);
    let socket = Arc::clone(socket);
    let flows = Arc::clone(flows);
    let stats = Arc::clone(stats);
    let task_session = Arc::clone(&session);
    shared.tasks.spawn(async move {
        let session = task_session;
        let cancel = session.cancel.clone();
        let opened = tokio::select! {
            () = cancel.cancelled() => return,
            opened = tokio::time::timeout(STREAM_OPEN_TIMEOUT, open_stream(&session, &slot.name, None, None)) => opened,
        };
        let channel = match opened {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => {
                warn!(event = "stream_open_failed", service = %slot.name, %error, "could not open a datagram channel to the client");
                return;
            }
            Err(_) => {
                warn!(event = "stream_open_failed", service = %slot.name, "no data channel from the client within {STREAM_OPEN_TIMEOUT:?}");
                return;
            }
        };
        debug!(event = "udp_channel_opened", service = %slot.name, peer = %session.peer, "datagram channel opened");
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
                    Ok(None) => return "closed by the client".to_owned(),
                    Err(error) => return error.to_string(),
                };
                let visitor = flows
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .visitor(flow, Instant::now());
                let Some(visitor) = visitor else {
                    stats.bump(Counter::DroppedUnknownFlow);
                    continue;
                };
                match socket.send_to(bytes, visitor).await {
                    Ok(_) => stats.bump(Counter::FromTunnel),
                    Err(error) => {
                        stats.bump(Counter::SendErrors);
                        debug!(event = "udp_send_failed", service = %slot.name, peer = %visitor, %error, "could not send a datagram to a visitor");
                    }
                }
            }
        };
        let reason = tokio::select! {
            () = cancel.cancelled() => "session ended".to_owned(),
            reason = up => reason,
            reason = down => reason,
        };
        debug!(event = "udp_channel_closed", service = %slot.name, %reason, "datagram channel closed");
    });
    Link { session, queue }
}
