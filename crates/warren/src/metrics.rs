//! Telemetry: Prometheus metrics and the table of live connections, one [`Telemetry`] per
//! server or client.
//!
//! The data path never takes a lock here. Byte counters are prometheus-client `Counter`s,
//! which are `Arc<AtomicU64>` inside: a relayed connection holds a [`Meter`] with clones of
//! its service's counters and its own, and adds to them per record (one atomic add per
//! record of up to 64 KiB), so a scrape sees bytes while they flow, not when a connection
//! closes. The live-connection table ([`Telemetry::connections`]) is touched twice per
//! connection (open and close).
//!
//! A service's latency histogram is made at its first connection, not with the service: a
//! histogram costs ~700 bytes and 19 lines per scrape, which for 10,000 idle services was
//! a fifth of the server's memory and most of a 17 MB scrape.
//!
//! Metric names (all prefixed `warren_`):
//!
//! | name | type | labels |
//! |---|---|---|
//! | `warren_build_info` | gauge (1) | `version`, `side` |
//! | `warren_service_bytes_total` | counter | `service`, `direction` (`in`: visitor to target, `out`: back) |
//! | `warren_service_connections_active` | gauge | `service` |
//! | `warren_service_connections_total` | counter | `service` |
//! | `warren_service_errors_total` | counter | `service` |
//! | `warren_connect_duration_seconds` | histogram | `service` (from the service's first connection) |
//! | `warren_handshake_failures_total` | counter | `reason` |
//! | `warren_sessions_active` | gauge | |
//! | `warren_sessions_total` | counter | |
//! | `warren_sessions_suspect_total` | counter | (a peer left a heartbeat unanswered past its suspect deadline) |
//! | `warren_sessions_dead_total` | counter | (a peer left a heartbeat unanswered past its dead deadline; its session ended) |
//! | `warren_streams_moved_total` | counter | (server: visitors moved off a session that stopped answering before their first answer) |
//! | `warren_reconnects_total` | counter | |
//! | `warren_config_reloads_total` | counter | `result` (`applied`, `refused`) |
//! | `warren_udp_sessions_active` | gauge | `service` |
//! | `warren_udp_datagrams_total` | counter | `service`, `direction` (`in`: visitors to target, `out`: back) |
//! | `warren_udp_dropped_total` | counter | `service`, `reason` (`oversized`, `queue_full`, `no_client`, `unknown_flow`, `over_limit`, `send_error`) |
//! | `warren_service_retries_total` | counter | `service` (server: visitors handed on to another session) |
//! | `warren_service_sessions` | gauge | `service`, `state` (`ready`, `withdrawn`; server: sessions serving it) |
//! | `warren_session_streams` | gauge | `session`, `peer` (open streams per session; client: `peer` is the server) |
//! | `warren_session_rtt_seconds` | gauge | `session`, `peer` (the heartbeats' smoothed round trip; until the first pong, the client's handshake) |
//! | `warren_session_quic_cwnd_bytes` | gauge | `session`, `peer` (QUIC sessions: congestion window) |
//! | `warren_session_quic_lost_packets` | gauge | `session`, `peer` (QUIC sessions: packets declared lost since the session began) |
//! | `warren_session_quic_mtu_bytes` | gauge | `session`, `peer` (QUIC sessions: the UDP payload size PMTUD settled on) |
//! | `warren_session_quic_datagrams_dropped` | gauge | `session`, `peer` (QUIC sessions: UDP-service datagrams dropped on receipt) |
//! | `warren_health_checks_total` | counter | `service`, `state` (client: health-check transitions to `up` / `down`) |
//! | `warren_p2p_relay_bytes_total` | counter | (server: bytes the P2P relay forwarded, both directions) |
//! | `warren_p2p_relay_datagrams_total` | counter | (server: datagrams the P2P relay forwarded) |
//! | `warren_p2p_relay_pairs_total` | counter | (server: transfers the P2P relay paired) |
//! | `warren_p2p_relay_pairs_active` | gauge | (server: transfers the P2P relay carries now) |
//! | `warren_p2p_peer_rtt_seconds` | gauge | `service`, `peer`, `route` (client, P2P services: each connected peer's path, `direct` or `relayed`, and its round trip) |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::Side;
use crate::relay::limit::Bandwidth;
use crate::relay::udp::{UdpEnd, UdpStats};
use crate::transport::compress::Codec;

/// Most live connections listed by the admin API; past this, connections still work and
/// count in the metrics but are not listed one by one.
pub const MAX_LISTED_CONNECTIONS: usize = 16_384;

/// Labels of per-service metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

/// Labels of per-service, per-direction metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    service: String,
    direction: &'static str,
}

/// Labels of `warren_udp_dropped`: the service and why its datagrams were dropped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabel {
    service: String,
    reason: &'static str,
}

/// Labels of handshake failures.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Labels of config reloads.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Labels of per-service, per-state metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    service: String,
    state: &'static str,
}

/// Labels of a P2P service's peers.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct P2pPeerLabel {
    service: String,
    peer: String,
    route: &'static str,
}

/// One connected peer of a P2P service ([`Metrics::set_p2p`]).
#[derive(Debug, Clone)]
pub struct P2pGauges {
    /// The service.
    pub service: String,
    /// The peer's short fingerprint.
    pub peer: String,
    /// `direct` or `relayed`.
    pub route: &'static str,
    /// The path's round trip now.
    pub rtt_seconds: f64,
}

/// Labels of per-session metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SessionLabel {
    session: String,
    peer: String,
}

/// One session's gauges ([`Metrics::set_sessions`]).
#[derive(Debug, Clone)]
pub struct SessionGauges {
    /// Short session id.
    pub session: String,
    /// The peer's address.
    pub peer: String,
    /// Streams open on it now.
    pub open_streams: u64,
    /// Its round trip, when measured.
    pub rtt_seconds: Option<f64>,
    /// QUIC sessions: the path's figures.
    pub quic: Option<QuicGauges>,
}

/// A QUIC session's path figures.
#[derive(Debug, Clone, Copy)]
pub struct QuicGauges {
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Packets declared lost so far.
    pub lost_packets: u64,
    /// UDP payload size, bytes.
    pub mtu: u16,
    /// UDP-service datagrams dropped on receipt (full channel queues, no channel).
    pub datagrams_dropped: u64,
}

/// Labels of `warren_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
    side: &'static str,
}

type HistogramFamily = Family<ServiceLabel, Histogram, fn() -> Histogram>;

/// Why a handshake (or session establishment) failed, as the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// Wrong PSK (or not a Warren peer): closed in silence.
    BadPsk,
    /// Garbage preamble.
    Malformed,
    /// No complete handshake within the deadline.
    Timeout,
    /// The socket failed mid-handshake.
    Io,
    /// Refused by the handshake (e.g. no common cipher).
    Refused,
    /// Every service claim was refused (wrong tokens).
    BadToken,
    /// Too many sessions at once.
    TooManySessions,
    /// The peer broke the protocol during hello.
    Protocol,
    /// Client: the server could not be reached.
    Connect,
}

impl HandshakeFailure {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::BadPsk => "bad_psk",
            HandshakeFailure::Malformed => "malformed",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Io => "io",
            HandshakeFailure::Refused => "refused",
            HandshakeFailure::BadToken => "bad_token",
            HandshakeFailure::TooManySessions => "too_many_sessions",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Connect => "connect",
        }
    }
}

/// Every metric of one server or client, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    bytes: Family<DirectionLabel, Counter>,
    active: Family<ServiceLabel, Gauge>,
    total: Family<ServiceLabel, Counter>,
    errors: Family<ServiceLabel, Counter>,
    connect_latency: HistogramFamily,
    handshake_failures: Family<ReasonLabel, Counter>,
    sessions_active: Gauge,
    sessions_total: Counter,
    sessions_suspect: Counter,
    sessions_dead: Counter,
    streams_moved: Counter,
    reconnects: Counter,
    config_reloads: Family<ResultLabel, Counter>,
    udp_active: Family<ServiceLabel, Gauge>,
    udp_datagrams: Family<DirectionLabel, Counter>,
    udp_dropped: Family<DropLabel, Counter>,
    /// Every UDP service's counters and which half of it this process runs; copied into
    /// the `udp_*` families when metrics are encoded (the data path adds to plain atomics).
    udp_services: Mutex<HashMap<String, (UdpEnd, Arc<UdpStats>)>>,
    retries: Family<ServiceLabel, Counter>,
    serving_sessions: Family<StateLabel, Gauge>,
    session_streams: Family<SessionLabel, Gauge>,
    session_rtt: Family<SessionLabel, Gauge<f64, AtomicU64>>,
    quic_cwnd: Family<SessionLabel, Gauge>,
    quic_lost: Family<SessionLabel, Gauge>,
    quic_mtu: Family<SessionLabel, Gauge>,
    quic_datagrams_dropped: Family<SessionLabel, Gauge>,
    health_checks: Family<StateLabel, Counter>,
    http_requests: Family<StatusLabel, Counter>,
    http_duration: HistogramFamily,
    http_captures_dropped: Counter,
    p2p_relay: P2pRelayMeter,
    p2p_peers: Family<P2pPeerLabel, Gauge<f64, AtomicU64>>,
    /// Requests of every service by status class (1xx..5xx): the dashboard's totals, read
    /// without walking the labelled family.
    http_class_totals: [Counter; 5],
}

/// The P2P relay's counters (cheap to clone: shared handles). One atomic add per
/// forwarded datagram and counter.
#[derive(Debug, Clone, Default)]
pub struct P2pRelayMeter {
    /// Bytes forwarded, both directions.
    pub bytes: Counter,
    /// Datagrams forwarded.
    pub datagrams: Counter,
    /// Pairs made.
    pub pairs: Counter,
    /// Pairs open now.
    pub active: Gauge,
}

/// One http service's request counters (cheap to clone: shared handles).
#[derive(Debug, Clone)]
pub struct HttpMeter {
    classes: [Counter; 5],
    totals: [Counter; 5],
    duration: Histogram,
}

impl HttpMeter {
    /// Counts one request answered with `status` after `elapsed` (to the response head).
    pub fn request(&self, status: u16, elapsed: Duration) {
        let class = usize::from((status / 100).clamp(1, 5)) - 1;
        self.classes[class].inc();
        self.totals[class].inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// Labels of `warren_http_requests`: the service and the status class (`2xx` .. `5xx`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    service: String,
    class: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl Metrics {
    /// A fresh registry for one side.
    pub fn new(side: Side) -> Metrics {
        let mut registry = Registry::with_prefix("warren");
        let build = Family::<BuildLabel, Gauge>::default();
        build
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                side: side_name(side),
            })
            .set(1);
        registry.register("build_info", "Warren version and side", build);
        let metrics = Metrics {
            bytes: Family::default(),
            active: Family::default(),
            total: Family::default(),
            errors: Family::default(),
            connect_latency: HistogramFamily::new_with_constructor(latency_histogram),
            handshake_failures: Family::default(),
            sessions_active: Gauge::default(),
            sessions_total: Counter::default(),
            sessions_suspect: Counter::default(),
            sessions_dead: Counter::default(),
            streams_moved: Counter::default(),
            reconnects: Counter::default(),
            config_reloads: Family::default(),
            udp_active: Family::default(),
            udp_datagrams: Family::default(),
            udp_dropped: Family::default(),
            udp_services: Mutex::default(),
            retries: Family::default(),
            serving_sessions: Family::default(),
            session_streams: Family::default(),
            session_rtt: Family::default(),
            quic_cwnd: Family::default(),
            quic_lost: Family::default(),
            quic_mtu: Family::default(),
            quic_datagrams_dropped: Family::default(),
            health_checks: Family::default(),
            http_requests: Family::default(),
            http_duration: HistogramFamily::new_with_constructor(latency_histogram),
            http_captures_dropped: Counter::default(),
            p2p_relay: P2pRelayMeter::default(),
            p2p_peers: Family::default(),
            http_class_totals: Default::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "Server: HTTP requests answered per service, by status class (Warren's own pages included)",
            metrics.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Server: time from a request's arrival to its response head, per service",
            metrics.http_duration.clone(),
        );
        registry.register(
            "http_captures_dropped",
            "Server: request captures dropped because the inspector's queue was full (traffic is never delayed for them)",
            metrics.http_captures_dropped.clone(),
        );
        registry.register(
            "service_retries",
            "Server: visitors a failed session handed on to another session before any byte went back",
            metrics.retries.clone(),
        );
        registry.register(
            "service_sessions",
            "Server: sessions serving each service (withdrawn: the client's health check fails)",
            metrics.serving_sessions.clone(),
        );
        registry.register(
            "session_streams",
            "Open streams per session",
            metrics.session_streams.clone(),
        );
        registry.register(
            "session_rtt_seconds",
            "Round trip per session (server: last heartbeat; client: handshake)",
            metrics.session_rtt.clone(),
        );
        registry.register(
            "session_quic_cwnd_bytes",
            "QUIC sessions: congestion window",
            metrics.quic_cwnd.clone(),
        );
        registry.register(
            "session_quic_lost_packets",
            "QUIC sessions: packets declared lost since the session began",
            metrics.quic_lost.clone(),
        );
        registry.register(
            "session_quic_mtu_bytes",
            "QUIC sessions: UDP payload size found by path MTU discovery",
            metrics.quic_mtu.clone(),
        );
        registry.register(
            "session_quic_datagrams_dropped",
            "QUIC sessions: UDP-service datagrams dropped on receipt since the session began (full channel queues, no channel)",
            metrics.quic_datagrams_dropped.clone(),
        );
        registry.register(
            "p2p_peer_rtt_seconds",
            "Client, P2P services: each connected peer, its route (direct, relayed) and round trip",
            metrics.p2p_peers.clone(),
        );
        registry.register(
            "health_checks",
            "Client: target health-check transitions (up, down)",
            metrics.health_checks.clone(),
        );
        registry.register(
            "service_bytes",
            "Bytes relayed per service, counted as they flow (in: visitor to target, out: back)",
            metrics.bytes.clone(),
        );
        registry.register(
            "service_connections_active",
            "Connections being relayed now",
            metrics.active.clone(),
        );
        registry.register(
            "service_connections",
            "Connections relayed since start",
            metrics.total.clone(),
        );
        registry.register(
            "service_errors",
            "Connections that failed (target unreachable, no client, cut channel)",
            metrics.errors.clone(),
        );
        registry.register(
            "connect_duration_seconds",
            "Time to connect a visitor's stream (server: open the stream; client: dial the target)",
            metrics.connect_latency.clone(),
        );
        registry.register(
            "handshake_failures",
            "Failed handshakes and session establishments by reason",
            metrics.handshake_failures.clone(),
        );
        registry.register(
            "sessions_active",
            "Sessions up now",
            metrics.sessions_active.clone(),
        );
        registry.register(
            "sessions",
            "Sessions established since start",
            metrics.sessions_total.clone(),
        );
        registry.register(
            "sessions_suspect",
            "Times a peer left a heartbeat unanswered past its suspect deadline (given no new streams)",
            metrics.sessions_suspect.clone(),
        );
        registry.register(
            "sessions_dead",
            "Sessions ended because the peer left a heartbeat unanswered past its dead deadline",
            metrics.sessions_dead.clone(),
        );
        registry.register(
            "streams_moved",
            "Server: visitors moved to another session because theirs stopped answering before their first answer",
            metrics.streams_moved.clone(),
        );
        registry.register(
            "reconnects",
            "Client: reconnect attempts after a lost or failed session",
            metrics.reconnects.clone(),
        );
        registry.register(
            "config_reloads",
            "Config reloads (SIGHUP, file change, admin API) by result",
            metrics.config_reloads.clone(),
        );
        registry.register(
            "p2p_relay_bytes",
            "Server: bytes the P2P relay of last resort forwarded, both directions",
            metrics.p2p_relay.bytes.clone(),
        );
        registry.register(
            "p2p_relay_datagrams",
            "Server: datagrams the P2P relay of last resort forwarded",
            metrics.p2p_relay.datagrams.clone(),
        );
        registry.register(
            "p2p_relay_pairs",
            "Server: transfers the P2P relay of last resort paired",
            metrics.p2p_relay.pairs.clone(),
        );
        registry.register(
            "p2p_relay_pairs_active",
            "Server: transfers the P2P relay of last resort carries now",
            metrics.p2p_relay.active.clone(),
        );
        registry.register(
            "udp_sessions_active",
            "UDP visitor sessions (flows) open now",
            metrics.udp_active.clone(),
        );
        registry.register(
            "udp_datagrams",
            "UDP datagrams relayed (in: from visitors towards the target, out: back)",
            metrics.udp_datagrams.clone(),
        );
        registry.register(
            "udp_dropped",
            "UDP datagrams dropped, by reason (oversized, queue_full, no_client, unknown_flow, over_limit, send_error)",
            metrics.udp_dropped.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The HTTP counters of one service, looked up once (a request then counts without
    /// building labels).
    pub fn http_meter(&self, service: &str) -> HttpMeter {
        let class = |class| {
            self.http_requests
                .get_or_create(&StatusLabel {
                    service: service.to_owned(),
                    class,
                })
                .clone()
        };
        HttpMeter {
            classes: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
            totals: self.http_class_totals.clone(),
            duration: self
                .http_duration
                .get_or_create(&ServiceLabel {
                    service: service.to_owned(),
                })
                .clone(),
        }
    }

    /// HTTP requests answered so far by every service, by status class (`[1xx, .., 5xx]`).
    pub fn http_totals(&self) -> [u64; 5] {
        self.http_class_totals.each_ref().map(Counter::get)
    }

    /// The P2P relay's counters (shared handles: the relay adds to them as it forwards).
    pub fn p2p_relay(&self) -> P2pRelayMeter {
        self.p2p_relay.clone()
    }

    /// Counts a request capture the inspector's queue had no room for.
    pub fn http_capture_dropped(&self) {
        self.http_captures_dropped.inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.copy_udp_counters();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The counters of `service`, creating them (at zero) if needed.
    pub fn service(&self, service: &str) -> ServiceMeter {
        let label = ServiceLabel {
            service: service.to_owned(),
        };
        let direction = |direction| DirectionLabel {
            service: service.to_owned(),
            direction,
        };
        ServiceMeter {
            connect_latency: Arc::new(LazyHistogram {
                family: self.connect_latency.clone(),
                label: label.clone(),
                histogram: OnceLock::new(),
            }),
            retries: self.retries.get_or_create_owned(&label),
            bytes_in: self.bytes.get_or_create_owned(&direction("in")),
            bytes_out: self.bytes.get_or_create_owned(&direction("out")),
            active: self.active.get_or_create_owned(&label),
            total: self.total.get_or_create_owned(&label),
            errors: self.errors.get_or_create_owned(&label),
        }
    }

    /// Counts one failed handshake.
    pub fn handshake_failed(&self, reason: HandshakeFailure) {
        self.handshake_failures
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .inc();
    }

    /// Failed handshakes so far for `reason`.
    pub fn handshake_failures(&self, reason: HandshakeFailure) -> u64 {
        self.handshake_failures
            .get(&ReasonLabel {
                reason: reason.label(),
            })
            .map_or(0, |c| c.get())
    }

    /// A session came up.
    pub fn session_started(&self) {
        self.sessions_active.inc();
        self.sessions_total.inc();
    }

    /// A session's peer turned suspect.
    pub fn session_suspect(&self) {
        self.sessions_suspect.inc();
    }

    /// A session's peer was declared dead.
    pub fn session_dead(&self) {
        self.sessions_dead.inc();
    }

    /// A visitor was moved off a session that stopped answering.
    pub fn stream_moved(&self) {
        self.streams_moved.inc();
    }

    /// A session ended.
    pub fn session_ended(&self) {
        self.sessions_active.dec();
    }

    /// The client schedules a reconnect.
    pub fn reconnecting(&self) {
        self.reconnects.inc();
    }

    /// A reload was applied or refused.
    pub fn config_reloaded(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.config_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Sets how many sessions serve `service`, ready and withdrawn (before a scrape).
    pub fn set_serving(&self, service: &str, ready: usize, withdrawn: usize) {
        for (state, value) in [("ready", ready), ("withdrawn", withdrawn)] {
            self.serving_sessions
                .get_or_create(&StateLabel {
                    service: service.to_owned(),
                    state,
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// Replaces the per-session stream gauges (before a scrape): `(session, peer, open)`.
    pub fn set_sessions(&self, sessions: impl IntoIterator<Item = SessionGauges>) {
        let families = [
            &self.session_streams,
            &self.quic_cwnd,
            &self.quic_lost,
            &self.quic_mtu,
            &self.quic_datagrams_dropped,
        ];
        for family in families {
            family.clear();
        }
        self.session_rtt.clear();
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for gauges in sessions {
            let label = SessionLabel {
                session: gauges.session,
                peer: gauges.peer,
            };
            self.session_streams
                .get_or_create(&label)
                .set(int(gauges.open_streams));
            if let Some(rtt) = gauges.rtt_seconds {
                self.session_rtt.get_or_create(&label).set(rtt);
            }
            if let Some(quic) = gauges.quic {
                self.quic_cwnd.get_or_create(&label).set(int(quic.cwnd));
                self.quic_lost
                    .get_or_create(&label)
                    .set(int(quic.lost_packets));
                self.quic_mtu
                    .get_or_create(&label)
                    .set(int(quic.mtu.into()));
                self.quic_datagrams_dropped
                    .get_or_create(&label)
                    .set(int(quic.datagrams_dropped));
            }
        }
    }

    /// Replaces the P2P peer gauges (before a scrape).
    pub fn set_p2p(&self, peers: impl IntoIterator<Item = P2pGauges>) {
        self.p2p_peers.clear();
        for peer in peers {
            self.p2p_peers
                .get_or_create(&P2pPeerLabel {
                    service: peer.service,
                    peer: peer.peer,
                    route: peer.route,
                })
                .set(peer.rtt_seconds);
        }
    }

    /// Counts a health-check transition of `service` to up or down.
    pub fn health_changed(&self, service: &str, up: bool) {
        self.health_checks
            .get_or_create(&StateLabel {
                service: service.to_owned(),
                state: if up { "up" } else { "down" },
            })
            .inc();
    }

    /// The counters of UDP service `service`, of which this process runs `end`: made at
    /// the first call (with the service's byte counters) and shared by every later one, so
    /// all of a service's channels and flows add to one set, which `/metrics` shows.
    pub fn udp_stats(&self, service: &str, end: UdpEnd) -> Arc<UdpStats> {
        let mut services = self
            .udp_services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (_, stats) = services.entry(service.to_owned()).or_insert_with(|| {
            let meter = self.service(service);
            (
                end,
                Arc::new(UdpStats::with_bytes(meter.bytes_in, meter.bytes_out)),
            )
        });
        Arc::clone(stats)
    }

    /// Copies every UDP service's counters into the `udp_*` families (before a scrape).
    fn copy_udp_counters(&self) {
        let services: Vec<_> = self
            .udp_services
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, (end, stats))| (name.clone(), *end, stats.snapshot()))
            .collect();
        for (service, end, stats) in services {
            self.udp_active
                .get_or_create(&ServiceLabel {
                    service: service.clone(),
                })
                .set(i64::try_from(stats.active_flows()).unwrap_or(i64::MAX));
            let (towards_target, back) = stats.datagrams_in_out(end);
            for (direction, value) in [("in", towards_target), ("out", back)] {
                let counter = self.udp_datagrams.get_or_create_owned(&DirectionLabel {
                    service: service.clone(),
                    direction,
                });
                raise_to(&counter, value);
            }
            for (reason, value) in stats.drops() {
                let counter = self.udp_dropped.get_or_create_owned(&DropLabel {
                    service: service.clone(),
                    reason,
                });
                raise_to(&counter, value);
            }
        }
    }
}

/// Raises a counter to `value` (counters only go up; the stats they copy only grow).
fn raise_to(counter: &Counter, value: u64) {
    let now = counter.get();
    if value > now {
        counter.inc_by(value - now);
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Server => "server",
        Side::Client => "client",
    }
}

/// Handles on one service's counters (clones share the same atomics).
#[derive(Debug, Clone)]
pub struct ServiceMeter {
    retries: Counter,
    pub(crate) bytes_in: Counter,
    pub(crate) bytes_out: Counter,
    pub(crate) active: Gauge,
    pub(crate) total: Counter,
    pub(crate) errors: Counter,
    connect_latency: Arc<LazyHistogram>,
}

/// A service's latency histogram, joined to its family at the first observation.
struct LazyHistogram {
    family: HistogramFamily,
    label: ServiceLabel,
    histogram: OnceLock<Histogram>,
}

impl std::fmt::Debug for LazyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyHistogram")
            .field("service", &self.label.service)
            .finish_non_exhaustive()
    }
}

impl ServiceMeter {
    /// Records how long connecting a stream took.
    pub fn connected_in(&self, elapsed: Duration) {
        let latency = &self.connect_latency;
        latency
            .histogram
            .get_or_init(|| latency.family.get_or_create_owned(&latency.label))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a failed connection.
    pub fn error(&self) {
        self.errors.inc();
    }

    /// Counts a visitor handed on to another session after the first one failed it.
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// Visitors handed on to another session since start.
    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// Bytes visitor → target so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.get()
    }

    /// Bytes target → visitor so far.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.get()
    }

    /// Connections being relayed now.
    pub fn active(&self) -> i64 {
        self.active.get()
    }

    /// Connections relayed since start.
    pub fn total(&self) -> u64 {
        self.total.get()
    }

    /// Failed connections since start.
    pub fn errors(&self) -> u64 {
        self.errors.get()
    }
}

/// Which way the local end of a relay faces, to map "to tunnel / to local" onto "in / out".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalEnd {
    /// The local socket is the visitor (the server in reverse mode): to-tunnel is `in`.
    Visitor,
    /// The local socket is the target (the client in reverse mode): to-tunnel is `out`.
    Target,
}

/// What a relay adds its bytes to: the service's counters and the connection's own, and
/// the service's bandwidth limit, which the relay waits on as it counts.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    to_tunnel: [Counter; 2],
    to_local: [Counter; 2],
    pace: Option<Arc<Bandwidth>>,
    codec: Option<Codec>,
}

impl Meter {
    /// A meter that counts nothing and only holds a relay to `limit` and compresses with
    /// `codec`, for services without metrics (forward and P2P services); `None` when there
    /// is neither.
    pub fn shaping(limit: Option<Arc<Bandwidth>>, codec: Option<Codec>) -> Option<Meter> {
        (limit.is_some() || codec.is_some())
            .then(|| Meter::default().paced(limit).compressing(codec))
    }

    /// This meter, also holding the relay to `limit` (`None`: no limit).
    pub fn paced(mut self, limit: Option<Arc<Bandwidth>>) -> Meter {
        self.pace = limit;
        self
    }

    /// The bandwidth limit a relay counting on this meter keeps to.
    pub fn limit(&self) -> Option<&Bandwidth> {
        self.pace.as_deref()
    }

    /// This meter, also telling the relay to compress what it sends into the tunnel with
    /// `codec` (`None`: as it is).
    pub fn compressing(mut self, codec: Option<Codec>) -> Meter {
        self.codec = codec;
        self
    }

    /// How a relay counting on this meter compresses what it sends into the tunnel.
    pub fn codec(&self) -> Option<Codec> {
        self.codec
    }

    /// Adds `n` bytes moved from the local socket into the tunnel.
    #[inline]
    pub fn to_tunnel(&self, n: u64) {
        for counter in &self.to_tunnel {
            counter.inc_by(n);
        }
    }

    /// Adds `n` bytes moved from the tunnel to the local socket.
    #[inline]
    pub fn to_local(&self, n: u64) {
        for counter in &self.to_local {
            counter.inc_by(n);
        }
    }
}

/// One live connection, as the admin API lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionInfo {
    /// Process-unique id.
    pub id: u64,
    /// The service.
    pub service: String,
    /// The visitor's address (server), or the target's (client).
    pub peer: String,
    /// Seconds since the Unix epoch when it opened.
    pub since: u64,
    /// Bytes visitor → target so far.
    pub bytes_in: u64,
    /// Bytes target → visitor so far.
    pub bytes_out: u64,
}

struct LiveConnection {
    service: String,
    peer: SocketAddr,
    since: SystemTime,
    bytes_in: Counter,
    bytes_out: Counter,
}

/// The live connections of one side (bounded), plus the metrics.
pub struct Telemetry {
    /// Every metric.
    pub metrics: Metrics,
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, LiveConnection>>,
    started: SystemTime,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Fresh telemetry for one side.
    pub fn new(side: Side) -> Arc<Telemetry> {
        Arc::new(Telemetry {
            metrics: Metrics::new(side),
            next_id: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            started: SystemTime::now(),
        })
    }

    /// When this side started.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// Registers a connection of `service` with `peer` and returns the meter its relay
    /// adds to; the connection is listed until the guard drops.
    pub fn open(
        self: &Arc<Self>,
        service: &ServiceMeter,
        name: &str,
        peer: SocketAddr,
        local: LocalEnd,
    ) -> (Meter, ConnectionGuard) {
        let bytes_in = Counter::default();
        let bytes_out = Counter::default();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            if live.len() < MAX_LISTED_CONNECTIONS {
                live.insert(
                    id,
                    LiveConnection {
                        service: name.to_owned(),
                        peer,
                        since: SystemTime::now(),
                        bytes_in: bytes_in.clone(),
                        bytes_out: bytes_out.clone(),
                    },
                );
            }
        }
        service.active.inc();
        service.total.inc();
        let inbound = [service.bytes_in.clone(), bytes_in];
        let outbound = [service.bytes_out.clone(), bytes_out];
        let meter = match local {
            LocalEnd::Visitor => Meter {
                to_tunnel: inbound,
                to_local: outbound,
                pace: None,
                codec: None,
            },
            LocalEnd::Target => Meter {
                to_tunnel: outbound,
                to_local: inbound,
                pace: None,
                codec: None,
            },
        };
        let guard = ConnectionGuard {
            telemetry: Arc::clone(self),
            active: service.active.clone(),
            id,
        };
        (meter, guard)
    }

    /// The live connections, oldest first.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<ConnectionInfo> = live
            .iter()
            .map(|(id, c)| ConnectionInfo {
                id: *id,
                service: c.service.clone(),
                peer: c.peer.to_string(),
                since: unix_seconds(c.since),
                bytes_in: c.bytes_in.get(),
                bytes_out: c.bytes_out.get(),
            })
            .collect();
        drop(live);
        list.sort_by_key(|c| c.id);
        list
    }
}

/// Removes its connection from the live table (and the active gauge) when dropped.
pub struct ConnectionGuard {
    telemetry: Arc<Telemetry>,
    active: Gauge,
    id: u64,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.active.dec();
        self.telemetry
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Seconds since the Unix epoch (0 for times before it).
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_millis_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_count_per_service_and_per_connection() {
        let telemetry = Telemetry::new(Side::Server);
        let web = telemetry.metrics.service("web");
        let (meter, guard) = telemetry.open(
            &web,
            "web",
            "127.0.0.1:1".parse().unwrap(),
            LocalEnd::Visitor,
        );
        meter.to_tunnel(10);
        meter.to_local(3);
        assert_eq!((web.bytes_in(), web.bytes_out(), web.active()), (10, 3, 1));
        let listed = telemetry.connections();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].bytes_in, listed[0].bytes_out), (10, 3));
        let text = telemetry.metrics.encode();
        assert!(text.contains("warren_service_bytes_total{service=\"web\",direction=\"in\"} 10"));
        assert!(text.contains("warren_build_info{version="));
        drop(guard);
        assert_eq!(web.active(), 0);
        assert!(telemetry.connections().is_empty());
    }

    #[test]
    fn target_side_maps_directions() {
        let telemetry = Telemetry::new(Side::Client);
        let web = telemetry.metrics.service("web");
        let (meter, _guard) = telemetry.open(
            &web,
            "web",
            "127.0.0.1:1".parse().unwrap(),
            LocalEnd::Target,
        );
        meter.to_local(7);
        meter.to_tunnel(2);
        assert_eq!((web.bytes_in(), web.bytes_out()), (7, 2));
    }
}
