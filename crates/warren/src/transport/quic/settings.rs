//! QUIC tuning: flow-control windows, packet size, GSO, socket buffers, congestion control,
//! keep-alive, datagram buffers and handshake limits, with two presets.
//!
//! quinn's defaults suit roughly 100 Mbit/s at 100 ms of RTT; everything here was chosen
//! from what `shared/QUINN-CEILING.md` measured on the project's 2-core machine (one
//! connection, one stream, two processes on loopback):
//!
//! | lever | effect measured there |
//! |---|---|
//! | 16 MiB stream / 64 MiB connection windows | 3.1 → ~4.5 Gbit/s at 1452-byte packets |
//! | GSO (segmentation offload) | ~3× at 1452 bytes (1.3 → 3.9 Gbit/s) |
//! | 6500-byte packets with GSO | 6.7–8.4 Gbit/s |
//! | MTU upper bound above ~6.5 KB *with* GSO | batches exceed 64 KB, are dropped, PMTUD falls to 1200 |
//! | `initial_mtu` ≥ 14,720 with Cubic's default initial window | the handshake never starts |
//! | bigger socket buffers | no gain at 1452, +24–64 % with big packets, no more drops |
//! | BBR | no better than Cubic; quinn marks it experimental |
//! | an ACK every 10 packets, not every 2 (ACK frequency) | through the tunnel (bench/RESULTS.md, session 25): connect + first byte −7 to −16 %, throughput unchanged |
//!
//! * [`QuicSettings::internet`] (the default): packets start at 1200 bytes and PMTUD may
//!   grow them to 1452 (what a 1500-byte Ethernet path carries for IPv6 + UDP + QUIC), never
//!   more. Safe on any path.
//! * [`QuicSettings::loopback`]: PMTUD may grow packets to 6500 bytes, the largest size
//!   whose GSO batches (quinn sends up to 10 packets per `sendmsg`) stay under Linux's
//!   65,507-byte UDP limit. For loopback, LANs with jumbo frames and same-host transfers.
//!
//! Throughput of the two presets, measured by `crates/warren/examples/quic_presets.rs`
//! (Warren's endpoints and auth, one connection, one stream, no tunnel, loopback, release,
//! 2 cores; medians of 5, noisy: that file has the ranges and a second session):
//!
//! | preset | zero-copy writes | copying, as a tunnel | CPU s/GB |
//! |---|---|---|---|
//! | internet (1452-byte packets) | 2.6 Gbit/s | 2.0 Gbit/s | 3.8–3.9 |
//! | loopback (6500-byte packets) | 8.8 Gbit/s | 9.2 Gbit/s | 1.6–1.7 |
//!
//! [`QuicSettings::transport_config`] and [`QuicSettings::endpoint_config`] turn the
//! settings into quinn's configs; [`super::endpoint`] applies the socket buffers and the
//! [`HandshakeLimits`].

use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{BbrConfig, CubicConfig};
use quinn::{
    AckFrequencyConfig, EndpointConfig, IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt,
};

/// The minimum UDP payload every QUIC path must carry (RFC 9000 §14).
pub const MIN_UDP_PAYLOAD: u16 = 1200;

/// The largest UDP payload that fits a 1500-byte Ethernet MTU over IPv6 (1500 − 40 − 8):
/// quinn's default PMTUD ceiling, and the internet preset's.
pub const INTERNET_UDP_PAYLOAD: u16 = 1452;

/// The largest packet whose GSO batch fits one UDP send: quinn 0.11 batches up to
/// [`GSO_BATCH_PACKETS`] packets, and Linux refuses a send above 65,507 payload bytes
/// (quinn-udp then drops the whole batch silently, and PMTUD calls it a black hole).
pub const MAX_GSO_UDP_PAYLOAD: u16 = 6500;

/// How many packets quinn 0.11 puts into one GSO batch (`MAX_TRANSMIT_SEGMENTS`).
pub const GSO_BATCH_PACKETS: u32 = 10;

/// The largest UDP payload Linux sends in one datagram over IPv4.
const MAX_UDP_SEND: u32 = 65_507;

/// The largest UDP payload quinn's `EndpointConfig` accepts.
const MAX_QUINN_UDP_PAYLOAD: u16 = 65_527;

/// Cubic and NewReno start with 14,720 bytes in flight; with packets that large or larger
/// quinn never sends its first Initial (QUINN-CEILING.md pitfall 2).
const DEFAULT_INITIAL_WINDOW: u64 = 14_720;

/// The congestion controller of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Congestion {
    /// quinn's Cubic (RFC 9438): halves its window on every loss, so at 1 % random loss
    /// over 40 ms it carries ~3 Mbit/s.
    Cubic,
    /// quinn's BBR. Marked experimental by quinn: fast at 1 % loss, but paced by quinn at
    /// 2.5 × the bottleneck rate, so half its packets die in the bottleneck queue
    /// ([`super::congestion`] has the measurements).
    BbrExperimental,
    /// Warren's delivery-rate model ([`super::congestion::Model`]): BBR's idea sized for
    /// quinn's pacer; ignores random loss, keeps the bottleneck queue short. The default.
    #[default]
    Model,
}

/// Bounds on handshakes in flight at a server, so a flood of Initial packets costs bounded
/// memory and CPU and never starves real clients (see [`super::endpoint::HandshakeGate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// quinn's `ServerConfig::max_incoming`: connection attempts quinn holds before the
    /// application decides on them. Beyond it quinn refuses new ones itself. Default 4096.
    pub max_incoming: usize,
    /// quinn's `ServerConfig::incoming_buffer_size`: bytes buffered for one undecided attempt
    /// (its 0-RTT and coalesced packets). Default 64 KiB (quinn: 10 MB).
    pub incoming_buffer_size: u64,
    /// quinn's `ServerConfig::incoming_buffer_size_total`: the same, summed over all
    /// attempts. Default 16 MiB (quinn: 100 MB).
    pub incoming_buffer_size_total: u64,
    /// Handshakes in progress above which a client whose address is not yet validated is
    /// sent a stateless Retry instead of a handshake: a spoofed source cannot answer it, so
    /// it costs the server one small packet and no state. Default 64.
    pub retry_above: usize,
    /// Handshakes in progress above which new attempts are ignored (no answer at all).
    /// Default 1024.
    pub max_pending: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            max_incoming: 4096,
            incoming_buffer_size: 64 * 1024,
            incoming_buffer_size_total: 16 * 1024 * 1024,
            retry_above: 64,
            max_pending: 1024,
        }
    }
}

/// Everything tunable about Warren's QUIC connections and UDP socket. Both ends build their
/// quinn configs from one of these; start from [`QuicSettings::internet`] or
/// [`QuicSettings::loopback`] and change fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicSettings {
    /// Bytes one stream may have in flight towards us (its flow-control window). 16 MiB:
    /// enough for ~1.3 Gbit/s per stream at 100 ms of RTT; quinn's default (1.25 MB) caps
    /// such a path near 100 Mbit/s.
    pub stream_receive_window: u64,
    /// Bytes all streams of a connection together may have in flight towards us. 64 MiB.
    pub connection_receive_window: u64,
    /// Bytes we keep unacknowledged towards the peer, over all streams. 64 MiB.
    pub send_window: u64,
    /// UDP payload of the first packets, before PMTUD. At least [`MIN_UDP_PAYLOAD`]; a value
    /// the path cannot carry makes the handshake fail, so keep it small unless the path is
    /// known.
    pub initial_mtu: u16,
    /// The largest UDP payload we send (PMTUD's upper bound) and accept (announced to the
    /// peer as `max_udp_payload_size`, which caps the peer's packets too).
    pub max_udp_payload: u16,
    /// Whether PMTUD probes for packets larger than `initial_mtu`, up to `max_udp_payload`.
    pub mtu_discovery: bool,
    /// GSO: hand the kernel up to 10 packets per `sendmsg`. About 3× the throughput at 1452
    /// bytes. Requires `max_udp_payload` ≤ [`MAX_GSO_UDP_PAYLOAD`] (checked by
    /// [`QuicSettings::validate`]). GRO on receive is always used where the kernel has it.
    pub segmentation_offload: bool,
    /// `SO_SNDBUF` requested for the UDP socket, in bytes (Linux doubles it for bookkeeping).
    /// Forced past `net.core.wmem_max` with `SO_SNDBUFFORCE` when running as root.
    pub socket_send_buffer: usize,
    /// `SO_RCVBUF` requested for the UDP socket (see `socket_send_buffer`): a burst larger
    /// than this is dropped by the kernel before quinn sees it.
    pub socket_recv_buffer: usize,
    /// The congestion controller.
    pub congestion: Congestion,
    /// PING interval that keeps NAT bindings and the idle timer alive. `None` sends none.
    /// Default 10 s, as the TCP transports' heartbeat.
    pub keep_alive_interval: Option<Duration>,
    /// A connection that hears nothing for this long is dead (both ends use the smaller of
    /// the two values). Default 30 s, as the TCP transports' heartbeat timeout.
    pub idle_timeout: Duration,
    /// Bytes of received QUIC datagrams buffered until the session reads them; beyond it
    /// the oldest are dropped (a UDP service loses packets rather than blocking). 4 MiB.
    pub datagram_receive_buffer: usize,
    /// Bytes of QUIC datagrams waiting for congestion window; beyond it the oldest are
    /// dropped. 2 MiB.
    pub datagram_send_buffer: usize,
    /// Bidirectional streams the peer may have open at once: one per visitor connection, plus
    /// the control stream. 4096.
    pub max_concurrent_bidi_streams: u32,
    /// Unidirectional streams the peer may have open at once. 64.
    pub max_concurrent_uni_streams: u32,
    /// Ack-eliciting packets the peer may receive before it must send an ACK (QUIC's ACK
    /// frequency extension, which both ends of a Warren connection speak; without it the
    /// RFC 9000 rule is an ACK every second packet). 9: an ACK every ten packets, or after
    /// the peer's `max_ack_delay` (25 ms), whichever comes first; a packet out of order
    /// is still acknowledged at once, so loss is seen as early as before. Every ACK is a
    /// packet the other end must wake up for: at one per two packets the ACKs of a short
    /// request sat on its critical path (connect + first byte 7–16 % slower, measured).
    pub ack_eliciting_threshold: u32,
    /// Server side: bounds on handshakes in flight.
    pub handshake: HandshakeLimits,
}

impl Default for QuicSettings {
    fn default() -> Self {
        QuicSettings::internet()
    }
}

/// A [`QuicSettings`] value quinn cannot use, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// A packet size outside what QUIC and UDP allow.
    #[error(
        "QUIC packet size {field} = {value} is out of range; use {min}..={max} bytes of UDP payload"
    )]
    PacketSize {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u16,
        /// The smallest allowed.
        min: u16,
        /// The largest allowed.
        max: u16,
    },
    /// GSO batches of this packet size exceed one UDP send and would be dropped.
    #[error(
        "QUIC max_udp_payload = {value} with segmentation offload (GSO) on: {batch} packets per batch make sends over 65,507 bytes, which the kernel refuses; use max_udp_payload <= {max} or turn GSO off"
    )]
    GsoBatchTooLarge {
        /// `max_udp_payload`.
        value: u16,
        /// Packets per GSO batch.
        batch: u32,
        /// [`MAX_GSO_UDP_PAYLOAD`].
        max: u16,
    },
    /// A window or buffer quinn cannot express (QUIC varints stop at 2^62).
    #[error("QUIC {field} = {value} is too large; use at most 2^62 - 1 bytes")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// An idle timeout of zero or beyond QUIC's range.
    #[error(
        "QUIC idle_timeout = {value:?} is out of range; use a duration from 1 ms to a few minutes"
    )]
    IdleTimeout {
        /// The value.
        value: Duration,
    },
    /// Keep-alives no more frequent than the idle timeout cannot keep the connection alive.
    #[error(
        "QUIC keep_alive_interval = {keep_alive:?} is not shorter than idle_timeout = {idle:?}: the connection would time out between pings; make the interval at most a third of the timeout"
    )]
    KeepAliveTooSlow {
        /// The interval.
        keep_alive: Duration,
        /// The idle timeout.
        idle: Duration,
    },
}

impl QuicSettings {
    /// Settings for real networks: 16 MiB / 64 MiB windows, packets from 1200 up to 1452
    /// bytes by PMTUD, GSO on, 4 MiB socket buffers, Warren's `model` congestion control, 10 s keep-alive, 30 s idle
    /// timeout, an ACK every ten packets.
    pub fn internet() -> Self {
        QuicSettings {
            stream_receive_window: 16 * 1024 * 1024,
            connection_receive_window: 64 * 1024 * 1024,
            send_window: 64 * 1024 * 1024,
            initial_mtu: MIN_UDP_PAYLOAD,
            max_udp_payload: INTERNET_UDP_PAYLOAD,
            mtu_discovery: true,
            segmentation_offload: true,
            socket_send_buffer: 4 * 1024 * 1024,
            socket_recv_buffer: 4 * 1024 * 1024,
            congestion: Congestion::Model,
            keep_alive_interval: Some(Duration::from_secs(10)),
            idle_timeout: Duration::from_secs(30),
            datagram_receive_buffer: 4 * 1024 * 1024,
            datagram_send_buffer: 2 * 1024 * 1024,
            max_concurrent_bidi_streams: 4096,
            max_concurrent_uni_streams: 64,
            ack_eliciting_threshold: 9,
            handshake: HandshakeLimits::default(),
        }
    }

    /// Settings for loopback and jumbo-frame links: as [`QuicSettings::internet`], but PMTUD
    /// may grow packets to [`MAX_GSO_UDP_PAYLOAD`] (6500 bytes, GSO stays on) and the socket
    /// buffers are 8 MiB. The first packets are still 1200 bytes, so the handshake works on
    /// any path and PMTUD finds what the path really carries.
    ///
    /// Larger packets need GSO off to avoid over-sized batches: `max_udp_payload = 65527`
    /// with `segmentation_offload = false` measured ~10 Gbit/s against ~8.4 for this preset,
    /// but it is slower than this preset as soon as the path's MTU is smaller.
    pub fn loopback() -> Self {
        QuicSettings {
            max_udp_payload: MAX_GSO_UDP_PAYLOAD,
            socket_send_buffer: 8 * 1024 * 1024,
            socket_recv_buffer: 8 * 1024 * 1024,
            ..QuicSettings::internet()
        }
    }

    /// Checks the settings against QUIC's and quinn's limits.
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`SettingsError`] saying what to change.
    pub fn validate(&self) -> Result<(), SettingsError> {
        for (field, value) in [
            ("initial_mtu", self.initial_mtu),
            ("max_udp_payload", self.max_udp_payload),
        ] {
            if !(MIN_UDP_PAYLOAD..=MAX_QUINN_UDP_PAYLOAD).contains(&value) {
                return Err(SettingsError::PacketSize {
                    field,
                    value,
                    min: MIN_UDP_PAYLOAD,
                    max: MAX_QUINN_UDP_PAYLOAD,
                });
            }
        }
        if self.initial_mtu > self.max_udp_payload {
            return Err(SettingsError::PacketSize {
                field: "initial_mtu",
                value: self.initial_mtu,
                min: MIN_UDP_PAYLOAD,
                max: self.max_udp_payload,
            });
        }
        if self.segmentation_offload
            && u32::from(self.max_udp_payload) * GSO_BATCH_PACKETS > MAX_UDP_SEND
        {
            return Err(SettingsError::GsoBatchTooLarge {
                value: self.max_udp_payload,
                batch: GSO_BATCH_PACKETS,
                max: MAX_GSO_UDP_PAYLOAD,
            });
        }
        for (field, value) in [
            ("stream_receive_window", self.stream_receive_window),
            ("connection_receive_window", self.connection_receive_window),
        ] {
            if VarInt::from_u64(value).is_err() {
                return Err(SettingsError::TooLarge { field, value });
            }
        }
        if self.idle_timeout.is_zero() || IdleTimeout::try_from(self.idle_timeout).is_err() {
            return Err(SettingsError::IdleTimeout {
                value: self.idle_timeout,
            });
        }
        if let Some(keep_alive) = self.keep_alive_interval
            && keep_alive >= self.idle_timeout
        {
            return Err(SettingsError::KeepAliveTooSlow {
                keep_alive,
                idle: self.idle_timeout,
            });
        }
        Ok(())
    }

    /// quinn's per-connection transport config for these settings (the same on both ends).
    ///
    /// # Errors
    ///
    /// What [`QuicSettings::validate`] finds.
    pub fn transport_config(&self) -> Result<TransportConfig, SettingsError> {
        self.validate()?;
        let mut config = TransportConfig::default();
        // Invariant for the `VarInt` conversions below: `validate` checked the windows, and
        // u32 stream counts always fit.
        config
            .stream_receive_window(varint(self.stream_receive_window))
            .receive_window(varint(self.connection_receive_window))
            .send_window(self.send_window)
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_concurrent_bidi_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(self.max_concurrent_uni_streams))
            .initial_mtu(self.initial_mtu)
            .min_mtu(MIN_UDP_PAYLOAD)
            .enable_segmentation_offload(self.segmentation_offload)
            .keep_alive_interval(self.keep_alive_interval)
            .max_idle_timeout(IdleTimeout::try_from(self.idle_timeout).ok())
            .datagram_receive_buffer_size(Some(self.datagram_receive_buffer))
            .datagram_send_buffer_size(self.datagram_send_buffer);
        let mut acks = AckFrequencyConfig::default();
        acks.ack_eliciting_threshold(VarInt::from_u32(self.ack_eliciting_threshold));
        config.ack_frequency_config(Some(acks));
        if self.mtu_discovery && self.max_udp_payload > self.initial_mtu {
            let mut mtud = MtuDiscoveryConfig::default();
            mtud.upper_bound(self.max_udp_payload);
            config.mtu_discovery_config(Some(mtud));
        } else {
            config.mtu_discovery_config(None);
        }
        // Ten packets of the largest size we may send, but never below the RFC default: with
        // big packets the default window deadlocks the first flight (pitfall 2 above), and
        // on loopback a bigger first flight costs nothing.
        let initial_window =
            DEFAULT_INITIAL_WINDOW.max(10 * u64::from(self.initial_mtu.max(self.max_udp_payload)));
        match self.congestion {
            Congestion::Cubic => {
                let mut cubic = CubicConfig::default();
                cubic.initial_window(initial_window);
                config.congestion_controller_factory(Arc::new(cubic));
            }
            Congestion::BbrExperimental => {
                let mut bbr = BbrConfig::default();
                bbr.initial_window(initial_window);
                config.congestion_controller_factory(Arc::new(bbr));
            }
            Congestion::Model => {
                config.congestion_controller_factory(Arc::new(super::congestion::ModelConfig {
                    initial_window,
                }));
            }
        }
        Ok(config)
    }

    /// quinn's endpoint config: the largest UDP payload we accept (announced to peers).
    ///
    /// # Errors
    ///
    /// What [`QuicSettings::validate`] finds.
    pub fn endpoint_config(&self) -> Result<EndpointConfig, SettingsError> {
        self.validate()?;
        let mut config = EndpointConfig::default();
        config
            .max_udp_payload_size(self.max_udp_payload)
            .map_err(|_| SettingsError::PacketSize {
                field: "max_udp_payload",
                value: self.max_udp_payload,
                min: MIN_UDP_PAYLOAD,
                max: MAX_QUINN_UDP_PAYLOAD,
            })?;
        Ok(config)
    }
}

/// A validated value as a QUIC varint.
fn varint(value: u64) -> VarInt {
    // Invariant: only called on values `validate` accepted; the fallback is unreachable but
    // keeps this panic-free.
    VarInt::from_u64(value).unwrap_or(VarInt::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_differ_in_packet_size() {
        let internet = QuicSettings::internet();
        let loopback = QuicSettings::loopback();
        internet.validate().expect("internet preset is valid");
        loopback.validate().expect("loopback preset is valid");
        assert_eq!(internet.max_udp_payload, 1452);
        assert_eq!(loopback.max_udp_payload, 6500);
        assert!(internet.transport_config().is_ok());
        assert!(loopback.endpoint_config().is_ok());
        assert_eq!(QuicSettings::default(), internet);
    }

    #[test]
    fn gso_with_huge_packets_is_refused() {
        let mut settings = QuicSettings::loopback();
        settings.max_udp_payload = 16_384;
        assert!(matches!(
            settings.validate(),
            Err(SettingsError::GsoBatchTooLarge { .. })
        ));
        settings.segmentation_offload = false;
        settings.validate().expect("GSO off allows big packets");
        settings.max_udp_payload = 65_527;
        settings.validate().expect("the largest quinn accepts");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let mut settings = QuicSettings::internet();
        settings.initial_mtu = 1000;
        assert!(matches!(
            settings.validate(),
            Err(SettingsError::PacketSize { .. })
        ));
        settings = QuicSettings::internet();
        settings.initial_mtu = 1452 + 1;
        assert!(settings.validate().is_err(), "initial above max");
        settings = QuicSettings::internet();
        settings.stream_receive_window = u64::MAX;
        assert!(matches!(
            settings.validate(),
            Err(SettingsError::TooLarge { .. })
        ));
        settings = QuicSettings::internet();
        settings.idle_timeout = Duration::ZERO;
        assert!(settings.validate().is_err());
        settings = QuicSettings::internet();
        settings.keep_alive_interval = Some(Duration::from_secs(60));
        assert!(matches!(
            settings.validate(),
            Err(SettingsError::KeepAliveTooSlow { .. })
        ));
        settings.keep_alive_interval = None;
        settings.validate().expect("no keep-alive is fine");
    }
}
