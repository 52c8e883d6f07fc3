//! The target-facing half of a UDP service: one datagram channel in, one socket per flow
//! connected to the target.
//!
//! The same code serves both directions of the tunnel: the client's half of a reverse (or
//! client-declared) service, whose channel the server opened with `StreamOpen`, and the
//! server's half of a forward service, whose channel the client opened. In both cases the
//! target comes from the local config, never from the peer.
//!
//! Every datagram carries a flow id: the first datagram of a flow creates a socket
//! connected to the target (so the target's replies come back on that socket and map to
//! that flow), and a reader task per socket sends replies back tagged with the flow id.
//! Flows live in a bounded [`FlowTable`] (LRU eviction, idle expiry refreshed by traffic in
//! either direction). Readers hand replies to the channel writer through a
//! [`DatagramQueue`] (bounded by count and bytes; full means dropped and counted), and hold
//! no buffer while idle.
//!
//! Datagrams of one flow that arrive together (a record read holds many) leave in one
//! system call as a [`Run`] (GSO, see [`batch`](super::batch)); the target still reads
//! them one by one, with their boundaries, but is woken once per run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::net::UdpSocket;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::batch::BatchSocket;
use super::run::Run;
use super::{Counter, FlowTable, Received, UdpStats, recv_connected, sweep_interval};
use crate::config::{HostPort, UdpSettings};
use crate::relay::limit::Bandwidth;
use crate::session::datagram::{DatagramChannel, FlowId};
use crate::session::datagram_queue::{self, DatagramQueue, Refused};
use crate::session::stream::Stream;

/// How long resolving the target's name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A flow's socket towards the target, connected to it.
type FlowSocket = Arc<BatchSocket<Arc<UdpSocket>>>;

/// One flow: its socket towards the target; dropping it stops the reader task.
struct Flow {
    socket: FlowSocket,
    _reader: DropGuard,
}

type Flows = Arc<Mutex<FlowTable<FlowId, Flow>>>;

/// Where one datagram channel's flows go.
pub struct TargetSide<'a> {
    /// The service name (logs).
    pub name: &'a str,
    /// The target, from the local config.
    pub target: &'a HostPort,
    /// Bounds of the flow table.
    pub settings: UdpSettings,
    /// Owner of the per-flow reader tasks.
    pub tasks: &'a TaskTracker,
    /// Cancelled when the session ends; the channel and its flows stop with it.
    pub cancel: CancellationToken,
    /// The service's counters (shared by its channels).
    pub stats: Arc<UdpStats>,
    /// The service's bandwidth limit: datagrams over it are dropped.
    pub limit: Option<Arc<Bandwidth>>,
}

/// Carries one datagram channel until it or the session ends.
pub async fn serve(side: TargetSide<'_>, channel: Stream) {
    // Boxed: the callers' stream handlers also carry every TCP stream, and an async fn's
    // future is as large as its largest arm, so an unboxed channel (its run, its sender)
    // would make each idle TCP connection's task ~1 KB larger (measured: 15.5 -> 16.5 KB
    // per idle connection).
    Box::pin(carry(side, channel)).await;
}

async fn carry(side: TargetSide<'_>, channel: Stream) {
    let TargetSide {
        name,
        target,
        settings,
        tasks,
        cancel,
        stats,
        limit,
    } = side;
    let (mut sender, mut receiver) = DatagramChannel::new(channel).split();
    let target = match resolve(target).await {
        Ok(addr) => addr,
        Err(error) => {
            warn!(event = "target_unreachable", service = %name, %target, %error, "cannot resolve the UDP service's target");
            let _ = sender.close("target unresolvable").await;
            return;
        }
    };
    let cancel = cancel.child_token();
    let flows: Flows = Arc::new(Mutex::new(FlowTable::new(settings)));
    let (queue, mut outgoing) = datagram_queue::bounded();
    debug!(event = "udp_channel_opened", service = %name, %target, "datagram channel opened");

    let up = async {
        match sender.send_queued(&mut outgoing).await {
            Ok(()) => "queue closed".to_owned(),
            Err(error) => format!("send failed: {error}"),
        }
    };
    let down = async {
        let mut sweep = tokio::time::interval(sweep_interval(settings.idle_timeout));
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut reported = stats.snapshot();
        let mut run = Run::new();
        let sending = Sending {
            name,
            target,
            tasks,
            flows: &flows,
            reader: FlowReader {
                queue: &queue,
                stats: &stats,
                limit: limit.as_ref(),
            },
            cancel: &cancel,
        };
        loop {
            let received = if run.is_empty() {
                tokio::select! {
                    _ = sweep.tick() => {
                        let (expired, active) = {
                            let mut table = flows.lock().unwrap_or_else(PoisonError::into_inner);
                            (table.expire(Instant::now()).len(), table.len())
                        };
                        stats.add(Counter::FlowsExpired, expired as u64);
                        let now_stats = stats.snapshot();
                        if now_stats.differs_in_drops(&reported) {
                            info!(event = "udp_stats", service = %name, active, stats = ?now_stats, "UDP service counters changed");
                            reported = now_stats;
                        }
                        continue;
                    }
                    received = receiver.recv_datagram() => received,
                }
            } else {
                // A run grows with what has already arrived, never waiting for more.
                match receiver.recv_datagram().now_or_never() {
                    Some(received) => received,
                    None => {
                        sending.send(&mut run).await;
                        continue;
                    }
                }
            };
            let (flow, bytes) = match received {
                Ok(Some(datagram)) => datagram,
                Ok(None) => {
                    sending.send(&mut run).await;
                    return "closed by the peer".to_owned();
                }
                Err(error) => {
                    sending.send(&mut run).await;
                    return error.to_string();
                }
            };
            if !stats.within(limit.as_ref().map(|l| &l.to_local), bytes.len()) {
                continue;
            }
            if !run.push(flow, bytes) {
                sending.send(&mut run).await;
                let _ = run.push(flow, bytes); // an empty run takes any datagram
            }
        }
    };
    let reason = tokio::select! {
        () = cancel.cancelled() => "session ended".to_owned(),
        reason = up => reason,
        reason = down => reason,
    };
    // Dropping the table's flows stops their reader tasks.
    cancel.cancel();
    debug!(event = "udp_channel_closed", service = %name, %reason, "datagram channel closed");
}

/// What sends a channel's runs: the flows and how to open a new one.
struct Sending<'a> {
    name: &'a str,
    target: SocketAddr,
    tasks: &'a TaskTracker,
    flows: &'a Flows,
    reader: FlowReader<'a>,
    cancel: &'a CancellationToken,
}

impl Sending<'_> {
    /// Sends `run` to the target through its flow's socket (opened on the flow's first
    /// datagram), then empties it.
    async fn send(&self, run: &mut Run<FlowId>) {
        let Some(flow) = run.to() else {
            return;
        };
        let Sending {
            name,
            target,
            tasks,
            flows,
            ref reader,
            cancel,
        } = *self;
        let socket = flows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .touch(&flow, Instant::now())
            .map(|f| Arc::clone(&f.socket));
        let socket = match socket {
            Some(socket) => Ok(socket),
            None => open_flow(tasks, name, flow, target, flows, reader, cancel).await,
        };
        match socket {
            Ok(socket) => {
                if let Err(error) = run.send(&socket, target, (reader.stats, true)).await {
                    debug!(event = "udp_send_failed", service = %name, %target, %error, "could not send a datagram to the target");
                }
            }
            Err(error) => {
                reader.stats.bump(Counter::SendErrors);
                warn!(event = "udp_socket_failed", service = %name, %target, %error, "could not open a socket towards the target");
            }
        }
        run.clear();
    }
}

/// The first address `target` resolves to, within [`RESOLVE_TIMEOUT`].
async fn resolve(target: &HostPort) -> std::io::Result<SocketAddr> {
    let resolving = tokio::net::lookup_host(target.to_string());
    let mut addrs = tokio::time::timeout(RESOLVE_TIMEOUT, resolving)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "resolving timed out"))??;
    addrs
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
}

/// What a flow's reader task hands the target's datagrams to.
struct FlowReader<'a> {
    /// Towards the tunnel.
    queue: &'a DatagramQueue,
    stats: &'a Arc<UdpStats>,
    limit: Option<&'a Arc<Bandwidth>>,
}

/// Creates flow `flow`: a socket connected to `target` and its reader task.
async fn open_flow(
    tasks: &TaskTracker,
    service: &str,
    flow: FlowId,
    target: SocketAddr,
    flows: &Flows,
    reader: &FlowReader<'_>,
    cancel: &CancellationToken,
) -> std::io::Result<FlowSocket> {
    let FlowReader {
        queue,
        stats,
        limit,
    } = *reader;
    // Loopback targets get a loopback socket; anything else the wildcard of its family.
    let local: IpAddr = match target.ip() {
        ip if ip.is_loopback() => ip,
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    socket.connect(target).await?;
    let socket = Arc::new(BatchSocket::new(Arc::new(socket))?);
    let reader_cancel = cancel.child_token();
    let evicted = flows.lock().unwrap_or_else(PoisonError::into_inner).insert(
        flow,
        Flow {
            socket: Arc::clone(&socket),
            _reader: reader_cancel.clone().drop_guard(),
        },
        Instant::now(),
    );
    stats.bump(Counter::FlowsOpened);
    if let Some((evicted, _)) = evicted {
        stats.bump(Counter::FlowsEvicted);
        warn!(
            event = "udp_flow_evicted",
            service,
            flow = evicted,
            evicted_total = stats.snapshot().flows_evicted,
            "UDP flow table full; closed the least recently active flow"
        );
    }
    let reader_socket = Arc::clone(&socket);
    let flows = Arc::clone(flows);
    let queue = queue.clone();
    let stats = Arc::clone(stats);
    let limit = limit.cloned();
    let service = service.to_owned();
    tasks.spawn(async move {
        let mut each = |received: Received<'_>| match received {
            Received::Datagram(bytes) => {
                flows
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .touch(&flow, Instant::now());
                let len = bytes.len();
                if !stats.within(limit.as_ref().map(|l| &l.to_tunnel), len) {
                    return;
                }
                match queue.try_send(flow, bytes.to_vec()) {
                    Ok(()) => stats.carried(Counter::ToTunnel, len, false),
                    Err(Refused::Full) => stats.bump(Counter::DroppedQueueFull),
                    // The channel is gone; the loop below sees it and stops.
                    Err(Refused::Closed) => {}
                }
            }
            Received::Oversized(_) => stats.bump(Counter::DroppedOversized),
        };
        loop {
            let received = tokio::select! {
                () = reader_cancel.cancelled() => return,
                received = recv_connected(&reader_socket, &mut each) => received,
            };
            match received {
                Ok(()) => {}
                // The target's port is closed (ICMP): keep the flow, the target may come back.
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    stats.bump(Counter::SendErrors);
                }
                Err(error) => {
                    debug!(event = "udp_recv_failed", %service, %error, "receive failed on a target socket");
                    return;
                }
            }
            if queue.is_closed() {
                return;
            }
        }
    });
    Ok(socket)
}
