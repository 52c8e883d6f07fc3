//! UDP session tables and counters, shared by the server and the client halves of a UDP
//! service.
//!
//! A *flow* is one visitor's UDP session: on the server, a visitor address and its flow
//! id; on the client, a flow id and the socket connected to the target for it. Both sides
//! keep their flows in a [`FlowTable`]:
//! * bounded: at most `udp_max_sessions` flows; a new flow on a full table evicts the least
//!   recently active one (never an unbounded table, never a refused newcomer);
//! * idle expiry: a flow with no datagram in *either* direction for `udp_idle_timeout` is
//!   dropped, so a one-way flow lives as long as it keeps sending.
//!
//! [`UdpStats`] counts what was dropped and why; the owners log a summary when it changes.
//!
//! The two halves of a service live in [`visitors`] (the bound socket visitors send to)
//! and [`targets`] (one socket per flow towards the target). A reverse service runs
//! `visitors` on the server and `targets` on the client; a forward service the other way
//! round.

pub mod batch;
mod run;
pub mod targets;
pub mod visitors;

use std::collections::HashMap;
use std::hash::Hash;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use crate::config::UdpSettings;
use crate::relay::limit::Pace;
use crate::session::datagram::MAX_DATAGRAM_LEN;

/// Receive buffer: larger than any UDP payload (65,535 − 8), so the kernel never truncates
/// silently; anything longer than [`MAX_DATAGRAM_LEN`] is dropped and counted.
pub const RECV_BUF_LEN: usize = 65_536;

/// Socket buffer asked of the kernel for service sockets (it may grant less).
const SERVICE_SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// A bounded table of flows with LRU eviction and idle expiry. Not synchronized: the
/// owner wraps it in a mutex if several tasks touch it (never held across an await).
#[derive(Debug)]
pub struct FlowTable<K, V> {
    entries: HashMap<K, Entry<V>>,
    settings: UdpSettings,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    last_active: Instant,
}

impl<K: Hash + Eq + Clone, V> FlowTable<K, V> {
    /// An empty table bounded by `settings`.
    pub fn new(settings: UdpSettings) -> Self {
        FlowTable {
            entries: HashMap::new(),
            settings,
        }
    }

    /// Marks `key` active at `now` and returns its value, if the flow exists.
    pub fn touch(&mut self, key: &K, now: Instant) -> Option<&V> {
        let entry = self.entries.get_mut(key)?;
        entry.last_active = now;
        Some(&entry.value)
    }

    /// As [`FlowTable::touch`], for changing the value.
    pub fn touch_mut(&mut self, key: &K, now: Instant) -> Option<&mut V> {
        let entry = self.entries.get_mut(key)?;
        entry.last_active = now;
        Some(&mut entry.value)
    }

    /// Adds a flow active at `now`. If the table was full, the least recently active flow
    /// is removed first and returned.
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> Option<(K, V)> {
        let mut evicted = None;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.settings.max_sessions {
            // O(n) on a full table only; n is bounded by udp_max_sessions.
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.last_active)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                evicted = self
                    .entries
                    .remove(&oldest)
                    .map(|entry| (oldest, entry.value));
            }
        }
        self.entries.insert(
            key,
            Entry {
                value,
                last_active: now,
            },
        );
        evicted
    }

    /// Removes a flow.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|entry| entry.value)
    }

    /// Removes and returns every flow idle for at least the idle timeout at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<(K, V)> {
        let idle = self.settings.idle_timeout;
        let expired: Vec<K> = self
            .entries
            .iter()
            .filter(|(_, entry)| now.saturating_duration_since(entry.last_active) >= idle)
            .map(|(key, _)| key.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|key| self.entries.remove(&key).map(|entry| (key, entry.value)))
            .collect()
    }

    /// Flows in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How often to look for idle flows: a quarter of the timeout, between 10 ms and 1 s, so a
/// flow lives at most 25 % (or 1 s) past its timeout.
pub fn sweep_interval(idle_timeout: Duration) -> Duration {
    (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Counters of one side of one UDP service.
#[derive(Debug, Default)]
pub struct UdpStats {
    flows_opened: AtomicU64,
    flows_evicted: AtomicU64,
    flows_expired: AtomicU64,
    to_tunnel: AtomicU64,
    from_tunnel: AtomicU64,
    dropped_oversized: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_no_client: AtomicU64,
    dropped_unknown_flow: AtomicU64,
    dropped_over_limit: AtomicU64,
    send_errors: AtomicU64,
    /// Payload bytes from visitors towards the target, and back: the service's own byte
    /// counters when it has them ([`UdpStats::with_bytes`]).
    bytes_up: prometheus_client::metrics::counter::Counter,
    bytes_down: prometheus_client::metrics::counter::Counter,
}

/// A copy of [`UdpStats`] at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdpStatsSnapshot {
    /// Flows created.
    pub flows_opened: u64,
    /// Flows evicted because the table was full (least recently active first).
    pub flows_evicted: u64,
    /// Flows dropped after `udp_idle_timeout` without traffic.
    pub flows_expired: u64,
    /// Datagrams handed to the tunnel.
    pub to_tunnel: u64,
    /// Datagrams received from the tunnel and sent on.
    pub from_tunnel: u64,
    /// Datagrams longer than 65,507 bytes, dropped.
    pub dropped_oversized: u64,
    /// Datagrams dropped because the queue towards the tunnel was full.
    pub dropped_queue_full: u64,
    /// Datagrams dropped because no client served the service (server only).
    pub dropped_no_client: u64,
    /// Datagrams from the tunnel for a flow that no longer exists.
    pub dropped_unknown_flow: u64,
    /// Datagrams over the service's `bandwidth_limit`, dropped.
    pub dropped_over_limit: u64,
    /// Datagrams the local socket failed to send.
    pub send_errors: u64,
}

/// Which counter to bump.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub enum Counter {
    FlowsOpened,
    FlowsEvicted,
    FlowsExpired,
    ToTunnel,
    FromTunnel,
    DroppedOversized,
    DroppedQueueFull,
    DroppedNoClient,
    DroppedUnknownFlow,
    DroppedOverLimit,
    SendErrors,
}

impl UdpStats {
    /// Stats whose payload bytes add to `up` (visitors towards the target) and `down`.
    pub fn with_bytes(
        up: prometheus_client::metrics::counter::Counter,
        down: prometheus_client::metrics::counter::Counter,
    ) -> UdpStats {
        UdpStats {
            bytes_up: up,
            bytes_down: down,
            ..UdpStats::default()
        }
    }

    /// Counts one datagram of `len` payload bytes under `counter` (`ToTunnel` or
    /// `FromTunnel`), `up` when it went from a visitor towards the target.
    pub fn carried(&self, counter: Counter, len: usize, up: bool) {
        self.carried_many(counter, 1, len, up);
    }

    /// Like [`UdpStats::carried`], for `datagrams` datagrams of `len` bytes in all.
    pub fn carried_many(&self, counter: Counter, datagrams: u64, len: usize, up: bool) {
        self.add(counter, datagrams);
        let bytes = if up { &self.bytes_up } else { &self.bytes_down };
        bytes.inc_by(len as u64);
    }

    /// Whether a datagram of `len` bytes fits the bandwidth limit `pace` (always, without
    /// one); a datagram that does not is counted as dropped.
    pub fn within(&self, pace: Option<&Pace>, len: usize) -> bool {
        let fits = pace.is_none_or(|pace| pace.admit(len));
        if !fits {
            self.bump(Counter::DroppedOverLimit);
        }
        fits
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: Counter, n: u64) {
        let cell = match counter {
            Counter::FlowsOpened => &self.flows_opened,
            Counter::FlowsEvicted => &self.flows_evicted,
            Counter::FlowsExpired => &self.flows_expired,
            Counter::ToTunnel => &self.to_tunnel,
            Counter::FromTunnel => &self.from_tunnel,
            Counter::DroppedOversized => &self.dropped_oversized,
            Counter::DroppedQueueFull => &self.dropped_queue_full,
            Counter::DroppedNoClient => &self.dropped_no_client,
            Counter::DroppedUnknownFlow => &self.dropped_unknown_flow,
            Counter::DroppedOverLimit => &self.dropped_over_limit,
            Counter::SendErrors => &self.send_errors,
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one to `counter`.
    pub fn bump(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> UdpStatsSnapshot {
        let get = |cell: &AtomicU64| cell.load(Ordering::Relaxed);
        UdpStatsSnapshot {
            flows_opened: get(&self.flows_opened),
            flows_evicted: get(&self.flows_evicted),
            flows_expired: get(&self.flows_expired),
            to_tunnel: get(&self.to_tunnel),
            from_tunnel: get(&self.from_tunnel),
            dropped_oversized: get(&self.dropped_oversized),
            dropped_queue_full: get(&self.dropped_queue_full),
            dropped_no_client: get(&self.dropped_no_client),
            dropped_unknown_flow: get(&self.dropped_unknown_flow),
            dropped_over_limit: get(&self.dropped_over_limit),
            send_errors: get(&self.send_errors),
        }
    }
}

/// Which half of a UDP service a process runs ([`visitors`] or [`targets`]): it decides
/// which of its counters is traffic from visitors towards the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpEnd {
    /// The socket visitors send to (a reverse service's server, a forward service's client).
    Visitors,
    /// The sockets towards the target (a reverse service's client, a forward service's
    /// server).
    Targets,
}

impl UdpStatsSnapshot {
    /// Flows open now.
    pub fn active_flows(&self) -> u64 {
        self.flows_opened
            .saturating_sub(self.flows_evicted + self.flows_expired)
    }

    /// Datagrams carried from visitors towards the target and back, as `(in, out)`, when
    /// this process runs `end` of the service.
    pub fn datagrams_in_out(&self, end: UdpEnd) -> (u64, u64) {
        match end {
            UdpEnd::Visitors => (self.to_tunnel, self.from_tunnel),
            UdpEnd::Targets => (self.from_tunnel, self.to_tunnel),
        }
    }

    /// Datagrams dropped, by reason (the metrics' `reason` label).
    pub fn drops(&self) -> [(&'static str, u64); 6] {
        [
            ("oversized", self.dropped_oversized),
            ("queue_full", self.dropped_queue_full),
            ("no_client", self.dropped_no_client),
            ("unknown_flow", self.dropped_unknown_flow),
            ("over_limit", self.dropped_over_limit),
            ("send_error", self.send_errors),
        ]
    }

    /// Whether anything other than the traffic counters changed since `earlier` (worth a
    /// log line).
    pub fn differs_in_drops(&self, earlier: &UdpStatsSnapshot) -> bool {
        let quiet = |s: &UdpStatsSnapshot| UdpStatsSnapshot {
            to_tunnel: 0,
            from_tunnel: 0,
            flows_opened: 0,
            ..*s
        };
        quiet(self) != quiet(earlier)
    }
}

/// Binds a service's UDP socket, asking for large kernel buffers so bursts are not lost.
///
/// # Errors
/// The bind error.
pub fn bind_service_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // Best effort: the kernel caps these at its maximum.
    let _ = socket.set_recv_buffer_size(SERVICE_SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SERVICE_SOCKET_BUFFER);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

/// One datagram read from a flow's socket.
pub enum Received<'a> {
    /// A whole datagram (borrowing the receive buffer).
    Datagram(&'a [u8]),
    /// A datagram longer than [`MAX_DATAGRAM_LEN`] (dropped): its length.
    Oversized(usize),
}

std::thread_local! {
    /// One receive buffer per worker thread, so thousands of idle flow sockets hold no
    /// buffer each. Only borrowed inside a synchronous `try_recv`. Large enough for a whole
    /// GRO batch ([`batch::RECV_BUF_LEN`]).
    static RECV_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; batch::RECV_BUF_LEN]);
}

/// Hands each datagram of one read (`bytes`, described by `batch`) to `each` in order: a
/// GRO batch split at its stride, an empty datagram as one, an oversized one as such.
pub fn split(batch: &batch::Batch, bytes: &[u8], mut each: impl FnMut(Received<'_>)) {
    if bytes.is_empty() {
        // An empty datagram is a datagram too.
        each(Received::Datagram(&[]));
    } else if batch.stride > MAX_DATAGRAM_LEN {
        each(Received::Oversized(bytes.len()));
    } else {
        for datagram in bytes.chunks(batch.stride) {
            each(Received::Datagram(datagram));
        }
    }
}

/// Waits for what a flow's socket has to read, one datagram or a batch the target sent in
/// one call (the socket asks for GRO), and hands each datagram to `each` in order, without
/// holding a buffer while idle.
///
/// Cancel safe: it waits for readiness, then receives synchronously.
///
/// # Errors
/// Socket errors (e.g. `ConnectionRefused` after the target answered with ICMP).
pub async fn recv_connected<S: std::ops::Deref<Target = UdpSocket>>(
    socket: &batch::BatchSocket<S>,
    mut each: impl FnMut(Received<'_>),
) -> io::Result<()> {
    loop {
        socket.socket().readable().await?;
        let received = RECV_BUF.with_borrow_mut(|buf| {
            socket
                .try_recv(buf)
                .map(|batch| split(&batch, &buf[..batch.len], &mut each))
        });
        match received {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize, idle_ms: u64) -> FlowTable<u32, &'static str> {
        FlowTable::new(UdpSettings {
            idle_timeout: Duration::from_millis(idle_ms),
            max_sessions: max,
        })
    }

    #[test]
    fn full_table_evicts_the_least_recently_active() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut flows = table(3, 1000);
        assert_eq!(flows.insert(1, "a", at(0)), None);
        assert_eq!(flows.insert(2, "b", at(1)), None);
        assert_eq!(flows.insert(3, "c", at(2)), None);
        // 1 is the oldest by creation, but traffic refreshed it.
        assert_eq!(flows.touch(&1, at(3)), Some(&"a"));
        assert_eq!(flows.insert(4, "d", at(4)), Some((2, "b")));
        assert_eq!(flows.insert(5, "e", at(5)), Some((3, "c")));
        assert_eq!(flows.len(), 3);
        assert_eq!(flows.touch(&2, at(6)), None);
        // Re-inserting an existing key never evicts.
        assert_eq!(flows.insert(5, "e2", at(7)), None);
        assert_eq!(flows.len(), 3);
    }

    #[test]
    fn idle_flows_expire_and_active_ones_stay() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut flows = table(10, 500);
        flows.insert(1, "quiet", at(0));
        flows.insert(2, "busy", at(0));
        for ms in (100..=900).step_by(100) {
            flows.touch(&2, at(ms));
            let expired = flows.expire(at(ms));
            if ms < 500 {
                assert!(expired.is_empty());
            } else if ms == 500 {
                assert_eq!(expired, [(1, "quiet")]);
            } else {
                assert!(expired.is_empty(), "the busy flow stays at {ms} ms");
            }
        }
        assert_eq!(flows.expire(at(1400)), [(2, "busy")]);
        assert!(flows.is_empty());
    }

    #[test]
    fn sweep_interval_is_bounded() {
        assert_eq!(
            sweep_interval(Duration::from_millis(500)),
            Duration::from_millis(125)
        );
        assert_eq!(
            sweep_interval(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        assert_eq!(
            sweep_interval(Duration::from_millis(1)),
            Duration::from_millis(10)
        );
    }
}
