//! Warren's QUIC congestion controller, `"model"`: BBR's idea (send at the bottleneck rate
//! a delivery-rate model measures; treat a lost packet as a lost packet, not as a sign of
//! congestion), sized for how quinn paces.
//!
//! Why not quinn's own controllers (issue 44, measured in `crates/wanlab`, 40 ms RTT,
//! 100 Mbit/s): its Cubic halves on every random loss and carries 2.5-3.3 Mbit/s at 1 %
//! loss; its BBR is fast there (86-87) but 44-56 % of its own packets die in the bottleneck
//! queue, on every path, loss-free ones included. The cause is quinn's design, not BBR's:
//! quinn's [`Controller`] has no pacing rate, its pacer sends at 1.25 × window / smoothed
//! RTT, so a BBR window of 2 BDP (BBR's `cwnd_gain`, meant as a cap while pacing holds the
//! rate) is paced at 2.5 × the bottleneck rate and fills any queue. This controller lets
//! the window be the rate: window = gain × bottleneck bandwidth × minimum RTT with a
//! steady gain of 1.5, so what is in flight stands at most half the path's RTT in the
//! bottleneck queue (a drop-tail queue of at least 0.5 BDP never overflows). Why 1.5 and
//! not 1.25: traced on W1, with 1.25 the window was full (in flight = window) while rounds
//! took only 2 ms over the minimum RTT, ~11 ms of the window sitting in acknowledgements
//! not yet seen (ACKs every 10 packets, batched receive), and the link ran at ~90 %; W2 P1
//! gave 62 Mbit/s at 1.25 and 86 at 1.5, both with 0.6-0.8 % queue drops.
//!
//! The model:
//! * **Rounds**: a round ends when a packet sent after it began is acknowledged (one RTT).
//! * **Bandwidth**: each round's delivery rate (bytes acknowledged in the round / its
//!   duration); the estimate is the largest of the last [`BW_ROUNDS`] rounds. App-limited
//!   rounds may raise it, never lower it.
//! * **Minimum RTT**: the smallest ack time of any packet (now − sent) over the last 10 s,
//!   kept in two 5 s buckets so a longer route is adopted within 10 s.
//! * **Phases**: *startup* doubles the window each round (window grows by every
//!   acknowledged byte) until the bandwidth grows less than 25 % in three rounds, or a round
//!   loses more than [`LOSS_THRESHOLD`]; *drain* holds 0.75 BDP until what is in flight
//!   fits one BDP; *probe* cycles its gain over eight rounds, 1.5 (is there more
//!   bandwidth?), 0.75 (empty the queue: the true minimum RTT shows), then 1.5 six times.
//! * **Loss**: random loss is ignored. A round that loses more than [`LOSS_THRESHOLD`] of
//!   its packets (or sees ECN marks) is congestion: the bandwidth estimate restarts from
//!   that round's delivery rate less 15 %, so a flow sharing the link with others yields.
//!   Persistent congestion (everything lost for a while) starts over from startup.
//! * A floor of [`MIN_WINDOW_PACKETS`] packets and of 2 ms at the estimated bandwidth:
//!   on loopback and LANs the RTT (tens of µs) is below the scheduling noise of
//!   a busy host, and a window of 1.5 × such an RTT would stall the sender.
//!
//! Written here rather than taken from a crate because it must fit quinn's window-only
//! interface; quinn's own BBR is the one alternative and is what this replaces.

// quinn's `Controller` interface takes std's `Instant`: the controller lives on quinn's clock.
#![allow(clippy::disallowed_types)]

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, CubicConfig};
use quinn_proto::RttEstimator;

/// Rounds the bandwidth estimate remembers (BBR's 10).
pub const BW_ROUNDS: usize = 10;
/// Share of a round's packets lost above which the round counts as congestion. BBRv2 uses
/// 2 %; random loss of a few percent (Wi-Fi, mobile) must not count, so 5 %.
pub const LOSS_THRESHOLD: f64 = 0.05;
/// The smallest window, in packets.
pub const MIN_WINDOW_PACKETS: u64 = 4;
/// The window never holds less than this long at the estimated bandwidth (module doc).
const RTT_SLACK: Duration = Duration::from_millis(2);
/// Probe cycle gains, one per round.
const PROBE_GAINS: [f64; 8] = [1.5, 0.75, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5];
/// Startup ends when three rounds in a row grow the bandwidth less than this factor.
const STARTUP_GROWTH: f64 = 1.25;
/// How far a congested round cuts the bandwidth estimate.
const CONGESTION_BACKOFF: f64 = 0.85;
/// Half of the minimum-RTT window.
const MIN_RTT_BUCKET: Duration = Duration::from_secs(5);

/// Makes [`Combined`] controllers (the model beside quinn's Cubic); `initial_window` in bytes.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Bytes in flight before the first acknowledgement.
    pub initial_window: u64,
}

impl ControllerFactory for ModelConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mut cubic = CubicConfig::default();
        cubic.initial_window(self.initial_window);
        Box::new(Combined {
            model: Model::new(self.initial_window, current_mtu, now),
            cubic: Arc::new(cubic).build(now, current_mtu),
        })
    }
}

/// What `congestion = "model"` runs: [`Model`] and quinn's Cubic side by side, fed the same
/// events, the window the larger of the two. Why: the model's window is its rate, so where
/// the RTT is set by a busy host's scheduling rather than by the path (loopback, LANs: tens
/// of µs that become milliseconds under load) it measures less than the link carries and
/// shrinks (quinn's 1452-byte QUIC on loopback, P4: 3.7 → 0.4 Gbit/s with the model alone).
/// Cubic's loss-based window covers those paths as before; on lossy ones, where random loss
/// keeps Cubic's window small, the model's is the larger and sets the pace. Never slower
/// than Cubic; on a loss-free WAN path it queues as much as Cubic does.
pub struct Combined {
    model: Model,
    cubic: Box<dyn Controller>,
}

impl Controller for Combined {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.model.on_sent(now, bytes, last_packet_number);
        self.cubic.on_sent(now, bytes, last_packet_number);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.model.on_ack(now, sent, bytes, app_limited, rtt);
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        self.model.on_end_acks(now, in_flight, app_limited, largest);
        self.cubic.on_end_acks(now, in_flight, app_limited, largest);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        persistent: bool,
        lost_bytes: u64,
    ) {
        self.model
            .on_congestion_event(now, sent, persistent, lost_bytes);
        self.cubic
            .on_congestion_event(now, sent, persistent, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.model.on_mtu_update(new_mtu);
        self.cubic.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.model.window().max(self.cubic.window())
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = self.model.metrics();
        m.congestion_window = self.window();
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Combined {
            model: self.model.clone(),
            cubic: self.cubic.clone_box(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.model.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Startup,
    Drain,
    Probe { cycle: usize },
}

/// The controller; see the module doc.
#[derive(Debug, Clone)]
pub struct Model {
    mtu: u64,
    initial_window: u64,
    phase: Phase,
    window: u64,
    /// Startup's growing window (slow start).
    startup_window: u64,
    /// Delivery rate of each of the last rounds, bytes/s; index `round % BW_ROUNDS`.
    bw_samples: [f64; BW_ROUNDS],
    round: u64,
    round_start: Instant,
    round_acked: u64,
    round_lost: u64,
    round_ecn: bool,
    round_app_limited: bool,
    /// Startup: the bandwidth to beat and how many rounds have not beaten it.
    full_bw: f64,
    full_bw_rounds: u32,
    drain_rounds: u32,
    /// Minimum RTT: the current and the previous bucket's minimum, and when this one began.
    rtt_now: Option<Duration>,
    rtt_prev: Option<Duration>,
    rtt_bucket_start: Instant,
    in_flight: u64,
}

impl Model {
    /// A controller starting with `initial_window` bytes and packets of `mtu` bytes.
    pub fn new(initial_window: u64, mtu: u16, now: Instant) -> Model {
        let mtu = u64::from(mtu);
        let initial_window = initial_window.max(MIN_WINDOW_PACKETS * mtu);
        Model {
            mtu,
            initial_window,
            phase: Phase::Startup,
            window: initial_window,
            startup_window: initial_window,
            bw_samples: [0.0; BW_ROUNDS],
            round: 0,
            round_start: now,
            round_acked: 0,
            round_lost: 0,
            round_ecn: false,
            round_app_limited: false,
            full_bw: 0.0,
            full_bw_rounds: 0,
            drain_rounds: 0,
            rtt_now: None,
            rtt_prev: None,
            rtt_bucket_start: now,
            in_flight: 0,
        }
    }

    /// The bottleneck bandwidth estimate, bytes/s.
    pub fn bandwidth(&self) -> f64 {
        self.bw_samples.iter().copied().fold(0.0, f64::max)
    }

    /// The minimum RTT of the last 5-10 s, if any packet was acknowledged.
    pub fn min_rtt(&self) -> Option<Duration> {
        match (self.rtt_now, self.rtt_prev) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn record_rtt(&mut self, now: Instant, sample: Duration) {
        if now.saturating_duration_since(self.rtt_bucket_start) >= MIN_RTT_BUCKET {
            self.rtt_prev = self.rtt_now.take();
            self.rtt_bucket_start = now;
        }
        self.rtt_now = Some(self.rtt_now.map_or(sample, |m| m.min(sample)));
    }

    fn bdp(&self) -> Option<f64> {
        let bw = self.bandwidth();
        let rtt = self.min_rtt()?;
        (bw > 0.0).then_some(bw * rtt.as_secs_f64())
    }

    fn gain(&self) -> f64 {
        match self.phase {
            Phase::Startup => 2.885, // 2 / ln 2, BBR's startup gain
            Phase::Drain => 0.75,
            Phase::Probe { cycle } => PROBE_GAINS[cycle],
        }
    }

    fn update_window(&mut self) {
        let floor = MIN_WINDOW_PACKETS * self.mtu;
        let model = match self.bdp() {
            Some(bdp) => {
                let floor = self.bandwidth() * RTT_SLACK.as_secs_f64();
                (self.gain() * bdp).max(floor) as u64
            }
            _ => self.initial_window,
        };
        self.window = match (self.phase, self.bdp()) {
            // Before the first round's sample, slow start; after it, 2.885 × what was
            // measured, which doubles the window each round while the bandwidth grows and
            // stops growing it when the bandwidth does (slow start alone would add a BDP a
            // round until startup ends, and overfill the queue by that much).
            (Phase::Startup, None) => self.startup_window,
            (Phase::Startup, Some(_)) => model.max(self.initial_window),
            _ => model,
        }
        .max(floor);
    }

    /// An acknowledgement of `bytes` sent at `sent` (quinn's `on_ack` without its RTT
    /// estimator, which the model does not need and tests cannot build).
    fn acked(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        self.in_flight = self.in_flight.saturating_sub(bytes);
        self.record_rtt(now, now.saturating_duration_since(sent));
        self.round_acked += bytes;
        self.round_app_limited |= app_limited;
        if self.phase == Phase::Startup {
            self.startup_window = self.startup_window.saturating_add(bytes);
        }
        if sent >= self.round_start {
            self.end_round(now);
        } else if self.phase == Phase::Startup {
            // Elsewhere the window moves only when a round ends.
            self.update_window();
        }
    }

    /// A round ended at `now`: take its delivery rate and move the phase on.
    fn end_round(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.round_start)
            .as_secs_f64();
        let sample = if elapsed > 0.0 {
            self.round_acked as f64 / elapsed
        } else {
            0.0
        };
        let total = self.round_acked + self.round_lost;
        let lossy = self.round_ecn
            || (total > 0
                && self.round_lost >= 3 * self.mtu
                && self.round_lost as f64 / total as f64 > LOSS_THRESHOLD);
        let slot = (self.round % BW_ROUNDS as u64) as usize;
        self.round += 1;
        if lossy && self.phase != Phase::Startup {
            // Congestion: forget the old peaks; start again below what this round delivered.
            self.bw_samples = [0.0; BW_ROUNDS];
            self.bw_samples[slot] = sample * CONGESTION_BACKOFF;
        } else if !self.round_app_limited || sample > self.bandwidth() {
            self.bw_samples[slot] = sample;
        } else {
            // App-limited and lower: keep the slot's old value out of the way of this round.
            let keep = self.bandwidth();
            self.bw_samples[slot] = keep;
        }
        match self.phase {
            Phase::Startup => {
                let bw = self.bandwidth();
                if bw >= self.full_bw * STARTUP_GROWTH {
                    self.full_bw = bw;
                    self.full_bw_rounds = 0;
                } else if !self.round_app_limited {
                    self.full_bw_rounds += 1;
                }
                if self.full_bw_rounds >= 3 || lossy {
                    self.phase = Phase::Drain;
                }
            }
            Phase::Drain => {
                self.drain_rounds += 1;
                // Three rounds at 0.75 BDP empty any queue startup left; in_flight is
                // quinn's count as of the last batch of acknowledgements.
                if self.drain_rounds >= 3
                    || self.bdp().is_none_or(|bdp| (self.in_flight as f64) <= bdp)
                {
                    self.phase = Phase::Probe { cycle: 2 };
                }
            }
            Phase::Probe { cycle } => {
                self.phase = Phase::Probe {
                    cycle: (cycle + 1) % PROBE_GAINS.len(),
                };
            }
        }
        self.round_start = now;
        self.round_acked = 0;
        self.round_lost = 0;
        self.round_ecn = false;
        self.round_app_limited = false;
        self.update_window();
    }
}

impl Controller for Model {
    fn on_sent(&mut self, _now: Instant, bytes: u64, _last_packet_number: u64) {
        self.in_flight = self.in_flight.saturating_add(bytes);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        _rtt: &RttEstimator,
    ) {
        self.acked(now, sent, bytes, app_limited);
    }

    fn on_end_acks(
        &mut self,
        _now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        // quinn's own count is the truth (on_sent/on_ack miss lost packets).
        self.in_flight = in_flight;
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        _sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.in_flight = self.in_flight.saturating_sub(lost_bytes);
        if lost_bytes == 0 {
            self.round_ecn = true;
        }
        self.round_lost += lost_bytes;
        if is_persistent_congestion {
            *self = Model {
                rtt_now: self.rtt_now,
                rtt_prev: self.rtt_prev,
                rtt_bucket_start: self.rtt_bucket_start,
                in_flight: self.in_flight,
                ..Model::new(MIN_WINDOW_PACKETS * self.mtu, self.mtu as u16, now)
            };
            self.initial_window = MIN_WINDOW_PACKETS * self.mtu;
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = u64::from(new_mtu);
        self.update_window();
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = ControllerMetrics::default();
        m.congestion_window = self.window;
        m.pacing_rate = Some((self.bandwidth() * 8.0) as u64);
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1452;

    /// A path of `rate` bytes/s and `rtt`, driven for `rounds` rounds with the window
    /// always full: each round sends min(window, rate × rtt) bytes spread over one RTT, each
    /// packet acknowledged one RTT after it left, `loss` of them lost.
    fn drive(
        m: &mut Model,
        at: Instant,
        rate: f64,
        rtt: Duration,
        rounds: u32,
        loss: f64,
    ) -> Instant {
        let model = m;
        let pkt = u64::from(MTU);
        let mut start = at;
        for _ in 0..rounds {
            model.on_sent(start, model.window(), 0);
            let deliverable = (rate * rtt.as_secs_f64()) as u64;
            let packets = (model.window().min(deliverable) / pkt).max(1);
            let lost_every = if loss > 0.0 {
                (1.0 / loss) as u64
            } else {
                u64::MAX
            };
            let step = rtt / packets as u32;
            let mut lost = 0;
            for i in 0..packets {
                let sent = start + step * i as u32;
                if (i + 1) % lost_every == 0 {
                    lost += pkt;
                    continue;
                }
                model.acked(sent + rtt, sent, pkt, false);
            }
            if lost > 0 {
                model.on_congestion_event(start + rtt * 2, start, false, lost);
            }
            model.on_end_acks(start + rtt * 2, 0, false, None);
            start += rtt;
        }
        start
    }

    #[test]
    fn converges_to_the_path_and_keeps_the_queue_small() {
        let rate = 100e6 / 8.0;
        let rtt = Duration::from_millis(40);
        let mut m = Model::new(14_720, MTU, Instant::now());
        drive(&mut m, Instant::now(), rate, rtt, 60, 0.0);
        assert!(matches!(m.phase, Phase::Probe { .. }), "{:?}", m.phase);
        let bdp = rate * rtt.as_secs_f64();
        let bw = m.bandwidth();
        assert!(
            bw > 0.9 * rate && bw < 1.1 * rate,
            "bandwidth {bw} for {rate}"
        );
        // Never more than 1.5 BDP in flight.
        assert!(
            (m.window() as f64) < 1.6 * bdp,
            "window {} for bdp {bdp}",
            m.window()
        );
    }

    #[test]
    fn one_percent_random_loss_does_not_shrink_it() {
        let rate = 100e6 / 8.0;
        let rtt = Duration::from_millis(40);
        let mut m = Model::new(14_720, MTU, Instant::now());
        drive(&mut m, Instant::now(), rate, rtt, 80, 0.01);
        let bw = m.bandwidth();
        assert!(bw > 0.85 * rate, "bandwidth {bw} at 1 % loss for {rate}");
    }

    #[test]
    fn heavy_loss_is_congestion() {
        let rate = 100e6 / 8.0;
        let rtt = Duration::from_millis(40);
        let mut m = Model::new(14_720, MTU, Instant::now());
        let at = drive(&mut m, Instant::now(), rate, rtt, 60, 0.0);
        let before = m.bandwidth();
        drive(&mut m, at, rate, rtt, 3, 0.2);
        assert!(
            m.bandwidth() < 0.9 * before,
            "{} then {}",
            before,
            m.bandwidth()
        );
    }

    #[test]
    fn persistent_congestion_starts_over_small() {
        let mut m = Model::new(14_720, MTU, Instant::now());
        drive(
            &mut m,
            Instant::now(),
            12.5e6,
            Duration::from_millis(40),
            30,
            0.0,
        );
        m.on_congestion_event(Instant::now(), Instant::now(), true, 10_000);
        assert_eq!(m.phase, Phase::Startup);
        assert!(m.window() <= 4 * u64::from(MTU) * 2, "{}", m.window());
        assert!(m.min_rtt().is_some(), "the path's RTT is kept");
    }

    #[test]
    fn a_lan_rtt_keeps_a_usable_window() {
        // 1 Gbit/s at 100 µs: 12.5 KB BDP; the 2 ms floor keeps ~250 KB in flight.
        let rate = 1e9 / 8.0;
        let mut m = Model::new(14_720, MTU, Instant::now());
        drive(
            &mut m,
            Instant::now(),
            rate,
            Duration::from_micros(100),
            200,
            0.0,
        );
        assert!(
            m.window() as f64 > 0.9 * rate * 0.002,
            "window {}",
            m.window()
        );
    }
}
