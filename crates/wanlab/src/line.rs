//! The delay line of one direction, as pure logic on a clock given in nanoseconds: random loss,
//! then a token bucket feeding from a bounded drop-tail queue, then a fixed delay (with optional
//! jitter). Keeping it free of I/O and of the real clock is what lets the unit tests below drive
//! it on a virtual clock and check rate, queue and loss accounting exactly.
//!
//! Departure times are computed from the bucket, not from when the thread happened to wake up:
//! a packet that becomes sendable at `t` leaves at `t` and is delivered at `t + delay` even if the
//! thread only looked at it later. A late wake-up therefore costs nothing as long as it is earlier
//! than the delivery deadline, which is what keeps the emulated RTT exact on a busy machine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::Rng;

/// Nanoseconds per second.
const NS: f64 = 1e9;

/// Shape of one direction of the line.
#[derive(Debug, Clone, PartialEq)]
pub struct LineConfig {
    /// Bottleneck rate, bits per second of IP packet bytes.
    pub rate_bps: u64,
    /// Fixed one-way delay, ns.
    pub delay_ns: u64,
    /// Jitter: each packet's delay is `delay ± uniform(jitter)`, ns.
    pub jitter_ns: u64,
    /// Let jitter reorder packets; otherwise a packet is never delivered before its predecessor.
    pub reorder: bool,
    /// Random loss probability in 0..=1, applied before the queue.
    pub loss: f64,
    /// Drop-tail queue limit in bytes (packets waiting for the bucket).
    pub queue_bytes: usize,
    /// Token bucket depth in bytes: how much may leave back to back after an idle period.
    pub burst_bytes: usize,
}

impl LineConfig {
    /// A line with the queue sized to `queue_bdp` bandwidth-delay products, where the delay is
    /// the round trip (2 × one-way): that is the buffer one TCP flow needs to keep the link busy
    /// through a loss-halving, so `1.0` lets a single flow reach the rate.
    pub fn new(rate_bps: u64, delay_ns: u64, loss: f64, queue_bdp: f64) -> LineConfig {
        let bdp = rate_bps as f64 / 8.0 * (2 * delay_ns) as f64 / NS;
        LineConfig {
            rate_bps,
            delay_ns,
            jitter_ns: 0,
            reorder: false,
            loss,
            // A floor of a few full-size packets so a near-zero delay still queues something.
            queue_bytes: ((bdp * queue_bdp) as usize).max(16 * 1500),
            // One full packet: the bucket shapes, the queue buffers.
            burst_bytes: 1500,
        }
    }

    /// Bound on bytes in the delay stage. Packets enter it at most at the rate, so it holds at
    /// most rate × (delay + jitter); twice that plus a margin is never reached by a correct line
    /// and keeps memory bounded if the clock misbehaves.
    pub fn delay_bound_bytes(&self) -> usize {
        let inflight = self.rate_bps as f64 / 8.0 * (self.delay_ns + self.jitter_ns) as f64 / NS;
        (2.0 * inflight) as usize + (1 << 20)
    }
}

/// A token bucket on a nanosecond clock. Tokens are bytes; a packet may leave once the bucket
/// holds `min(size, burst)`, and leaving may take it negative so jumbo packets still pass at
/// the average rate.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    bytes_per_ns: f64,
    burst: f64,
    tokens: f64,
    last: u64,
}

impl TokenBucket {
    /// A full bucket at time `now`.
    pub fn new(rate_bps: u64, burst_bytes: usize, now: u64) -> TokenBucket {
        TokenBucket {
            bytes_per_ns: rate_bps as f64 / 8.0 / NS,
            burst: burst_bytes as f64,
            tokens: burst_bytes as f64,
            last: now,
        }
    }

    fn refill(&mut self, t: u64) {
        if t > self.last {
            self.tokens =
                (self.tokens + (t - self.last) as f64 * self.bytes_per_ns).min(self.burst);
            self.last = t;
        }
    }

    /// Earliest time a packet of `size` bytes may leave (never before the last departure).
    pub fn ready_at(&self, size: usize) -> u64 {
        let need = (size as f64).min(self.burst);
        if self.tokens >= need {
            self.last
        } else {
            self.last + ((need - self.tokens) / self.bytes_per_ns).ceil() as u64
        }
    }

    /// Takes `size` bytes at time `t` (which must be at least `ready_at(size)`).
    pub fn take(&mut self, t: u64, size: usize) {
        self.refill(t);
        self.tokens -= size as f64;
    }
}

/// What the line did with one packet, counted per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets offered to the line.
    pub in_pkts: u64,
    /// Bytes offered.
    pub in_bytes: u64,
    /// Packets handed out for delivery.
    pub fwd_pkts: u64,
    /// Bytes handed out for delivery.
    pub fwd_bytes: u64,
    /// Packets dropped by the random loss.
    pub random_drops: u64,
    /// Packets dropped because the drop-tail queue was full.
    pub queue_drops: u64,
    /// Packets dropped because the delay stage was at its bound (never, on a correct line).
    pub delay_drops: u64,
}

struct Pending {
    deadline: u64,
    seq: u64,
    pkt: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // The sequence number breaks ties so equal deadlines keep arrival order.
        (self.deadline, self.seq).cmp(&(o.deadline, o.seq))
    }
}

/// One direction's line. Feed it with [`Line::arrive`], move time with [`Line::advance`], take
/// packets out with [`Line::pop_due`], and sleep until [`Line::next_event`].
pub struct Line<R: Rng> {
    cfg: LineConfig,
    bucket: TokenBucket,
    /// Waiting packets with their arrival times: a packet cannot leave before it arrived,
    /// however long the bucket has been idle.
    queue: VecDeque<(u64, Vec<u8>)>,
    queue_bytes: usize,
    delayed: BinaryHeap<Reverse<Pending>>,
    delayed_bytes: usize,
    delay_bound: usize,
    last_deadline: u64,
    seq: u64,
    rng: R,
    /// Running totals.
    pub counters: Counters,
}

impl<R: Rng> Line<R> {
    /// A line at time `now`, idle, with a full bucket.
    pub fn new(cfg: LineConfig, rng: R, now: u64) -> Line<R> {
        Line {
            bucket: TokenBucket::new(cfg.rate_bps, cfg.burst_bytes, now),
            delay_bound: cfg.delay_bound_bytes(),
            cfg,
            queue: VecDeque::new(),
            queue_bytes: 0,
            delayed: BinaryHeap::new(),
            delayed_bytes: 0,
            last_deadline: 0,
            seq: 0,
            rng,
            counters: Counters::default(),
        }
    }

    /// Bytes now waiting in the drop-tail queue.
    pub fn queued_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// How long the queued bytes take to leave at the rate: while this is long, a packet that
    /// arrives now leaves at a time set by the bucket, not by its arrival, so the caller may
    /// read its input late by up to that much without changing any departure.
    pub fn backlog_ns(&self) -> u64 {
        (self.queue_bytes as f64 / self.bucket.bytes_per_ns) as u64
    }

    /// A packet arrives at `now`. Returns the buffer back if the packet was dropped, so the
    /// caller can reuse it.
    pub fn arrive(&mut self, now: u64, pkt: Vec<u8>) -> Option<Vec<u8>> {
        // Departures that happened before this arrival free queue space first, or the queue
        // would look fuller than it is whenever the thread was slow to look.
        self.advance(now);
        self.counters.in_pkts += 1;
        self.counters.in_bytes += pkt.len() as u64;
        if self.cfg.loss > 0.0 && self.rng.random::<f64>() < self.cfg.loss {
            self.counters.random_drops += 1;
            return Some(pkt);
        }
        if self.queue_bytes + pkt.len() > self.cfg.queue_bytes {
            self.counters.queue_drops += 1;
            return Some(pkt);
        }
        self.queue_bytes += pkt.len();
        self.queue.push_back((now, pkt));
        self.advance(now);
        None
    }

    /// Moves every packet whose bucket departure time is at or before `now` into the delay
    /// stage, stamped with its departure time (not `now`).
    pub fn advance(&mut self, now: u64) {
        while let Some((arrived, head)) = self.queue.front() {
            let t = self.bucket.ready_at(head.len()).max(*arrived);
            if t > now {
                break;
            }
            let (_, pkt) = self.queue.pop_front().expect("front exists");
            self.queue_bytes -= pkt.len();
            self.bucket.take(t, pkt.len());
            self.schedule(t, pkt);
        }
    }

    fn schedule(&mut self, departed: u64, pkt: Vec<u8>) {
        if self.delayed_bytes + pkt.len() > self.delay_bound {
            self.counters.delay_drops += 1;
            return;
        }
        let mut deadline = departed + self.cfg.delay_ns;
        if self.cfg.jitter_ns > 0 {
            let j = self.cfg.jitter_ns as i64;
            let off = self.rng.random_range(-j..=j);
            deadline = deadline.saturating_add_signed(off).max(departed);
        }
        if !self.cfg.reorder {
            deadline = deadline.max(self.last_deadline);
        }
        self.last_deadline = self.last_deadline.max(deadline);
        self.seq += 1;
        self.delayed_bytes += pkt.len();
        self.delayed.push(Reverse(Pending {
            deadline,
            seq: self.seq,
            pkt,
        }));
    }

    /// The next packet due at or before `now`, with its deadline.
    pub fn pop_due(&mut self, now: u64) -> Option<(Vec<u8>, u64)> {
        self.advance(now);
        if self.delayed.peek()?.0.deadline > now {
            return None;
        }
        let Reverse(p) = self.delayed.pop()?;
        self.delayed_bytes -= p.pkt.len();
        self.counters.fwd_pkts += 1;
        self.counters.fwd_bytes += p.pkt.len() as u64;
        Some((p.pkt, p.deadline))
    }

    /// The earliest time a packet can be due without new input: the delay stage's head, or
    /// the queue head's departure plus the shortest delay. `None` when the line is empty.
    ///
    /// Bucket departures alone need no wake-up (they are computed in virtual time when anyone
    /// looks), and skipping them halves the wake-ups of a saturated line.
    pub fn next_event(&self) -> Option<u64> {
        let min_delay = self.cfg.delay_ns.saturating_sub(self.cfg.jitter_ns);
        let dep = self
            .queue
            .front()
            .map(|(a, p)| self.bucket.ready_at(p.len()).max(*a) + min_delay);
        let due = self.delayed.peek().map(|p| p.0.deadline);
        match (dep, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const MS: u64 = 1_000_000;

    fn line(cfg: LineConfig) -> Line<StdRng> {
        Line::new(cfg, StdRng::seed_from_u64(7), 0)
    }

    /// Drives the line with `n` packets of `size` bytes offered every `gap` ns, and collects
    /// (deadline) of every delivered packet, stepping the virtual clock 100 µs at a time.
    fn drive(l: &mut Line<StdRng>, n: u64, size: usize, gap: u64, until: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut next_arrival = 0;
        let mut sent = 0;
        let mut now = 0;
        while now <= until {
            while sent < n && next_arrival <= now {
                l.arrive(next_arrival, vec![0; size]);
                sent += 1;
                next_arrival += gap;
            }
            while let Some((_, d)) = l.pop_due(now) {
                assert!(d <= now);
                out.push(d);
            }
            now += 100_000;
        }
        out
    }

    #[test]
    fn bucket_paces_at_rate() {
        // 8 Mbit/s = 1 byte/µs: 1000-byte packets leave 1 ms apart once the burst is spent.
        let mut b = TokenBucket::new(8_000_000, 1000, 0);
        assert_eq!(b.ready_at(1000), 0);
        b.take(0, 1000);
        assert_eq!(b.ready_at(1000), MS);
        b.take(MS, 1000);
        assert_eq!(b.ready_at(500), MS + MS / 2);
        // Idle time refills only up to the burst.
        b.take(10 * MS, 1000);
        assert_eq!(b.ready_at(1000), 11 * MS);
    }

    #[test]
    fn bucket_lets_jumbo_through_at_average_rate() {
        let mut b = TokenBucket::new(8_000_000, 1000, 0);
        assert_eq!(b.ready_at(4000), 0);
        b.take(0, 4000);
        // 3000 bytes in debt plus 1000 to refill: 4 ms.
        assert_eq!(b.ready_at(1000), 4 * MS);
    }

    #[test]
    fn delivers_at_departure_plus_delay_and_rate() {
        // 8 Mbit/s, 10 ms: 100 back-to-back 1000-byte packets arrive at t=0.
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        cfg.queue_bytes = 1_000_000;
        let mut l = line(cfg);
        let got = drive(&mut l, 100, 1000, 0, 200 * MS);
        assert_eq!(got.len(), 100);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(*d, 10 * MS + i as u64 * MS, "packet {i}");
        }
        assert_eq!(l.counters.fwd_bytes, 100_000);
        assert_eq!(l.counters.queue_drops, 0);
    }

    #[test]
    fn late_look_does_not_shift_deadlines() {
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        let mut l = line(cfg);
        l.arrive(0, vec![0; 1000]);
        l.arrive(0, vec![0; 1000]);
        // Nobody looks until 5 ms: the second packet still left the bucket at 1 ms.
        assert!(l.pop_due(5 * MS).is_none());
        assert_eq!(l.pop_due(12 * MS).map(|p| p.1), Some(10 * MS));
        assert_eq!(l.pop_due(12 * MS).map(|p| p.1), Some(11 * MS));
        assert_eq!(l.next_event(), None);
    }

    #[test]
    fn queue_is_drop_tail_and_bounded() {
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        cfg.queue_bytes = 5000;
        let mut l = line(cfg);
        // 20 packets at once: 1 leaves on the burst, 5 fit the queue, 14 are tail-dropped.
        for _ in 0..20 {
            l.arrive(0, vec![0; 1000]);
        }
        assert_eq!(l.counters.queue_drops, 14);
        assert_eq!(l.queued_bytes(), 5000);
        // After 2 ms two more have left, so two more fit.
        assert!(l.arrive(2 * MS, vec![0; 1000]).is_none());
        assert!(l.arrive(2 * MS, vec![0; 1000]).is_none());
        assert!(l.arrive(2 * MS, vec![0; 1000]).is_some());
        assert_eq!(l.counters.queue_drops, 15);
        assert_eq!(l.counters.random_drops, 0);
    }

    #[test]
    fn default_queue_is_one_rtt_bdp() {
        let cfg = LineConfig::new(100_000_000, 20 * MS, 0.0, 1.0);
        assert_eq!(cfg.queue_bytes, 500_000);
        assert_eq!(
            LineConfig::new(100_000_000, 20 * MS, 0.0, 0.5).queue_bytes,
            250_000
        );
    }

    #[test]
    fn loss_is_counted_apart_and_near_the_set_rate() {
        // Offered well below the rate so the queue never drops.
        let cfg = LineConfig::new(1_000_000_000, MS, 0.01, 1.0);
        let mut l = line(cfg);
        let n = 200_000;
        let got = drive(&mut l, n, 100, 10_000, 2_100 * MS);
        let c = l.counters;
        assert_eq!(c.in_pkts, n);
        assert_eq!(c.queue_drops, 0);
        assert_eq!(c.random_drops + c.fwd_pkts, n);
        assert_eq!(got.len() as u64, c.fwd_pkts);
        let p = c.random_drops as f64 / n as f64;
        // σ = sqrt(0.01·0.99/2e5) ≈ 0.022 points; the seed is fixed, so this is deterministic.
        assert!((p - 0.01).abs() < 0.001, "loss {p}");
    }

    #[test]
    fn every_packet_is_accounted_for() {
        let mut cfg = LineConfig::new(8_000_000, 5 * MS, 0.1, 1.0);
        cfg.queue_bytes = 20_000;
        let mut l = line(cfg);
        // Offered at twice the rate: both kinds of drop happen.
        let got = drive(&mut l, 2000, 1000, 500_000, 2_000 * MS);
        let c = l.counters;
        assert!(c.queue_drops > 0 && c.random_drops > 0);
        assert_eq!(
            c.fwd_pkts + c.random_drops + c.queue_drops + c.delay_drops,
            c.in_pkts
        );
        assert_eq!(got.len() as u64, c.fwd_pkts);
        // Forwarded at the rate: ~1 packet per ms over the ~1 s of offered load.
        assert!((900..=1100).contains(&c.fwd_pkts), "{c:?}");
    }

    #[test]
    fn jitter_keeps_order_unless_reorder() {
        for reorder in [false, true] {
            let mut cfg = LineConfig::new(1_000_000_000, 10 * MS, 0.0, 1.0);
            cfg.jitter_ns = 2 * MS;
            cfg.reorder = reorder;
            let mut l = line(cfg);
            for i in 0..1000u64 {
                l.arrive(i * 10_000, (i as u32).to_be_bytes().to_vec());
            }
            let mut order = Vec::new();
            let mut last = 0;
            while let Some((p, d)) = l.pop_due(u64::MAX / 2) {
                assert!(d >= last, "deadlines come out sorted");
                last = d;
                order.push(u32::from_be_bytes(p[..4].try_into().unwrap()));
            }
            assert_eq!(order.len(), 1000);
            let sorted = order.windows(2).all(|w| w[0] < w[1]);
            assert_eq!(sorted, !reorder, "reorder={reorder}");
        }
    }

    #[test]
    fn next_event_is_the_earliest_possible_delivery() {
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        let mut l = line(cfg);
        assert_eq!(l.next_event(), None);
        l.arrive(0, vec![0; 1000]);
        l.arrive(0, vec![0; 1000]);
        l.arrive(0, vec![0; 1000]);
        // The first is due at 10 ms, whatever the later ones do.
        assert_eq!(l.next_event(), Some(10 * MS));
        assert!(l.pop_due(10 * MS).is_some());
        // The second left the bucket at 1 ms: due at 11 ms. The third, still queued, leaves
        // at 2 ms and cannot be due before 12 ms.
        assert_eq!(l.next_event(), Some(11 * MS));
        assert!(l.pop_due(11 * MS).is_some());
        assert_eq!(l.next_event(), Some(12 * MS));
    }

    #[test]
    fn idle_bucket_never_sends_before_arrival() {
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        let mut l = line(cfg);
        // A jumbo leaves the bucket 3000 bytes in debt, and nothing refreshes it while idle.
        l.arrive(0, vec![0; 4000]);
        while l.pop_due(20 * MS).is_some() {}
        // The bucket would allow the next at 4 ms; one arriving at 100 ms leaves at 100 ms.
        l.arrive(100 * MS, vec![0; 1000]);
        assert_eq!(l.next_event(), Some(110 * MS));
    }

    #[test]
    fn backlog_is_queue_drain_time() {
        let mut cfg = LineConfig::new(8_000_000, 10 * MS, 0.0, 1.0);
        cfg.burst_bytes = 1000;
        let mut l = line(cfg);
        assert_eq!(l.backlog_ns(), 0);
        for _ in 0..4 {
            l.arrive(0, vec![0; 1000]);
        }
        // One left on the burst; three wait, 1 ms each at 1 byte/µs.
        assert_eq!(l.backlog_ns(), 3 * MS);
    }
}
