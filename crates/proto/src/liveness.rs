//! Heartbeats and reconnect backoff as clock-free state machines.
//!
//! The driver (in the `warren` crate) owns the timers: it feeds [`Heartbeat`] every received
//! message and wakes at [`Heartbeat::poll_timeout`]; it asks [`Backoff`] how long to wait
//! before the next reconnect, passing the randomness in. Both are tested here on a virtual
//! clock.

use std::time::{Duration, Instant};

/// What the heartbeat wants done now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatAction {
    /// Send `Ping { seq }` now.
    SendPing {
        /// The ping's number; its `Pong` carries it back ([`Heartbeat::on_pong`]).
        seq: u64,
    },
    /// The peer has not answered within the dead deadline: the peer or the path is gone.
    PeerDead,
}

/// What the heartbeat believes of the peer now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// It answered recently enough.
    Alive,
    /// A ping has waited past the suspect deadline with nothing heard since: give it no
    /// new work, but do not give up on it yet (anything heard makes it alive again).
    Suspect,
    /// A ping has waited past the dead deadline: the session is over.
    Dead,
}

impl From<PeerState> for &'static str {
    fn from(state: PeerState) -> &'static str {
        match state {
            PeerState::Alive => "alive",
            PeerState::Suspect => "suspect",
            PeerState::Dead => "dead",
        }
    }
}

/// How a side pings and when it gives up; see [`Heartbeat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// How often to ping while no stream is open.
    pub idle_interval: Duration,
    /// How often to ping while streams are open (their visitors are what a frozen peer
    /// would strand).
    pub busy_interval: Duration,
    /// The suspect deadline is never shorter than this.
    pub min_suspect: Duration,
    /// The dead deadline is never shorter than this.
    pub min_dead: Duration,
    /// The dead deadline is never longer than this (the configured heartbeat timeout).
    pub max_dead: Duration,
}

impl HeartbeatConfig {
    /// The defaults for a side whose idle ping interval is `idle_interval` and which gives up
    /// after `max_dead` at the latest.
    ///
    /// Why these figures: a ping and its pong over TCP (or a QUIC stream) arrive late only
    /// when a segment is lost, by one retransmission timeout each time (at least 200 ms on
    /// Linux, doubling on each loss). With [`SUSPECT_RTOS`] and [`DEAD_RTOS`] timeouts of
    /// patience past one round trip, a session turns suspect only when one message is lost
    /// three times in a row and dead only when five; at 300 ms RTT and 2 % loss a busy
    /// session (a ping a second) was never suspect in ten simulated hours
    /// (`no_flap_at_300_ms_and_2_percent_loss`). On a LAN the floors rule: suspect 1 s
    /// and dead 6 s after an unanswered ping.
    pub fn new(idle_interval: Duration, max_dead: Duration) -> Self {
        HeartbeatConfig {
            idle_interval,
            busy_interval: BUSY_INTERVAL,
            min_suspect: MIN_SUSPECT,
            min_dead: MIN_DEAD,
            max_dead,
        }
    }
}

/// The ping interval while streams are open.
pub const BUSY_INTERVAL: Duration = Duration::from_secs(1);
/// The floor of the suspect deadline.
pub const MIN_SUSPECT: Duration = Duration::from_secs(1);
/// The floor of the dead deadline.
pub const MIN_DEAD: Duration = Duration::from_secs(6);
/// The suspect deadline past one round trip, in retransmission timeouts: one message lost
/// twice in a row costs 1 + 2 of them (each retry waits twice as long as the one before).
pub const SUSPECT_RTOS: u32 = 3;
/// The dead deadline past one round trip, in retransmission timeouts: four losses in a row
/// cost 1 + 2 + 4 + 8.
pub const DEAD_RTOS: u32 = 15;
/// The retransmission timeout assumed before the first round trip was measured (RFC 6298's
/// initial RTO).
const INITIAL_RTO: Duration = Duration::from_secs(1);
/// No retransmission timeout is shorter than Linux's TCP floor.
const MIN_RTO: Duration = Duration::from_millis(200);
/// Pings remembered for their round trip; older answers give no sample.
const REMEMBERED_PINGS: usize = 8;

/// Tracks one control channel's liveness: pings at a rate that follows the session's use,
/// measures their round trips, and judges the peer [`PeerState::Suspect`] or
/// [`PeerState::Dead`] by how long its answer has been outstanding, against deadlines
/// that grow with the measured round trip (so a long or lossy path is given the time a
/// retransmission needs, and a short one is judged within a second or two).
///
/// The clock that matters starts when a ping leaves and nothing has been heard since: an
/// idle session pings seldom and its peer may be quiet, so silence alone proves nothing.
/// Any message from the peer counts as an answer.
///
/// Call-order contract: [`Heartbeat::on_received`] for every message from the peer (and
/// [`Heartbeat::on_pong`] for a pong); [`Heartbeat::set_busy`] when streams open or all
/// close; at or after [`Heartbeat::poll_timeout`], call [`Heartbeat::handle_timeout`] and
/// act on what it returns, repeatedly until it returns `None`; read
/// [`Heartbeat::state`] after each of these.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    config: HeartbeatConfig,
    busy: bool,
    last_received: Instant,
    /// When the first ping that nothing answered yet was sent.
    unanswered_since: Option<Instant>,
    last_ping: Option<Instant>,
    next_ping: Instant,
    seq: u64,
    /// (seq, sent) of the latest pings, for their round trips.
    pings: [(u64, Instant); REMEMBERED_PINGS],
    /// Smoothed round trip and its variation (RFC 6298), once measured.
    srtt: Option<(Duration, Duration)>,
    /// [`Heartbeat::handle_timeout`] saw the suspect deadline pass (the next wake is the
    /// dead one).
    suspected: bool,
    /// When [`Heartbeat::handle_timeout`] declared the peer dead (for good).
    dead_at: Option<Instant>,
}

impl Heartbeat {
    /// A heartbeat for a session that starts at `now`; its first ping goes at once, to
    /// measure the round trip before it matters.
    pub fn new(now: Instant, config: HeartbeatConfig) -> Self {
        Heartbeat {
            config,
            busy: false,
            last_received: now,
            unanswered_since: None,
            last_ping: None,
            next_ping: now,
            seq: 0,
            pings: [(0, now); REMEMBERED_PINGS],
            srtt: None,
            suspected: false,
            dead_at: None,
        }
    }

    /// Records a message from the peer: whatever was outstanding is answered.
    pub fn on_received(&mut self, now: Instant) {
        self.last_received = self.last_received.max(now);
        self.unanswered_since = None;
        self.suspected = false;
    }

    /// Records the pong of ping `seq` (after [`Heartbeat::on_received`]).
    pub fn on_pong(&mut self, now: Instant, seq: u64) {
        let Some(&(_, sent)) = self.pings.iter().find(|(s, _)| *s == seq && seq != 0) else {
            return;
        };
        let sample = now.saturating_duration_since(sent);
        self.srtt = Some(match self.srtt {
            None => (sample, sample / 2),
            Some((srtt, rttvar)) => {
                let delta = srtt.abs_diff(sample);
                (srtt * 7 / 8 + sample / 8, rttvar * 3 / 4 + delta / 4)
            }
        });
    }

    /// Streams are open (`true`) or none is. A session that turns busy after a quiet spell
    /// pings at once: its peer may have stopped answering while nothing needed it.
    pub fn set_busy(&mut self, now: Instant, busy: bool) {
        if busy && !self.busy {
            let quiet_since = self
                .last_received
                .max(self.last_ping.unwrap_or(self.last_received));
            let due = (quiet_since + self.config.busy_interval).max(now);
            if self.unanswered_since.is_none() {
                self.next_ping = self.next_ping.min(due);
            }
        }
        self.busy = busy;
    }

    /// The smoothed round trip, once a pong measured one.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt.map(|(srtt, _)| srtt)
    }

    /// The retransmission timeout of the path as Linux's TCP computes it:
    /// `srtt + max(4 × rttvar, 200 ms)`.
    fn rto(&self) -> Duration {
        match self.srtt {
            None => INITIAL_RTO,
            Some((srtt, rttvar)) => srtt + (rttvar * 4).max(MIN_RTO),
        }
    }

    /// How long an answer may be outstanding before the peer is suspect.
    pub fn suspect_after(&self) -> Duration {
        (self.srtt().unwrap_or_default() + self.rto() * SUSPECT_RTOS)
            .max(self.config.min_suspect)
            .min(self.dead_after())
    }

    /// How long an answer may be outstanding before the peer is dead.
    pub fn dead_after(&self) -> Duration {
        (self.srtt().unwrap_or_default() + self.rto() * DEAD_RTOS)
            .max(self.config.min_dead)
            .min(self.config.max_dead)
    }

    /// What the peer is believed to be at `now`.
    pub fn state(&self, now: Instant) -> PeerState {
        if self.dead_at.is_some() {
            return PeerState::Dead;
        }
        match self.unanswered_since {
            Some(since) if now >= since + self.dead_after() => PeerState::Dead,
            Some(since) if now >= since + self.suspect_after() => PeerState::Suspect,
            _ => PeerState::Alive,
        }
    }

    fn interval(&self) -> Duration {
        if self.busy {
            self.config.busy_interval
        } else {
            self.config.idle_interval
        }
    }

    /// The next instant at which [`Heartbeat::handle_timeout`] has something to do, or at
    /// which [`Heartbeat::state`] changes.
    pub fn poll_timeout(&self) -> Instant {
        if let Some(dead_at) = self.dead_at {
            return dead_at;
        }
        match self.unanswered_since {
            Some(since) if self.suspected => self.next_ping.min(since + self.dead_after()),
            Some(since) => self.next_ping.min(since + self.suspect_after()),
            None => self.next_ping,
        }
    }

    /// Advances the clock to `now` and says what to do, if anything.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<HeartbeatAction> {
        match self.state(now) {
            PeerState::Dead => {
                self.dead_at.get_or_insert(now);
                return Some(HeartbeatAction::PeerDead);
            }
            PeerState::Suspect => self.suspected = true,
            PeerState::Alive => {}
        }
        if now < self.next_ping {
            return None;
        }
        self.seq += 1;
        self.pings[(self.seq as usize) % REMEMBERED_PINGS] = (self.seq, now);
        self.last_ping = Some(now);
        self.unanswered_since.get_or_insert(now);
        self.next_ping = now + self.interval();
        Some(HeartbeatAction::SendPing { seq: self.seq })
    }
}

/// Exponential reconnect backoff with jitter.
///
/// The n-th delay (from 0) lies in `[cap/2, cap]` with `cap = min(max, initial * 2^n)`:
/// it grows fast enough not to hammer a down server and the jitter spreads a fleet of
/// clients that lost the same server at the same time.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `initial` and never exceeding `max` (raised to `initial` if lower).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// The delay before the next attempt; `random` is any uniformly random `u64`.
    pub fn next_delay(&mut self, random: u64) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        let cap = self.initial.saturating_mul(factor).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = cap / 2;
        let spread = (cap - half).as_nanos() as u64;
        let jitter = if spread == 0 {
            0
        } else {
            random % (spread + 1)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Starts over after a connection that worked.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// New bounds (a reloaded config), keeping the count of failed attempts.
    pub fn set_bounds(&mut self, initial: Duration, max: Duration) {
        self.initial = initial;
        self.max = max.max(initial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(idle: u64, max_dead: u64) -> HeartbeatConfig {
        HeartbeatConfig::new(Duration::from_secs(idle), Duration::from_secs(max_dead))
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Runs the heartbeat against a peer that answers each ping after `rtt(seq)` (or never,
    /// `None`), until `end`; returns every state change with its time.
    fn simulate(
        hb: &mut Heartbeat,
        t0: Instant,
        end: Duration,
        mut rtt: impl FnMut(u64) -> Option<Duration>,
    ) -> Vec<(Duration, PeerState)> {
        let mut pongs: Vec<(Instant, u64)> = Vec::new();
        let mut changes = Vec::new();
        let mut last = PeerState::Alive;
        let mut now = t0;
        while now < t0 + end {
            let next_pong = pongs.iter().map(|(at, _)| *at).min();
            now = hb.poll_timeout().min(next_pong.unwrap_or(t0 + end));
            while let Some(i) = pongs.iter().position(|(at, _)| *at == now) {
                let (_, seq) = pongs.remove(i);
                hb.on_received(now);
                hb.on_pong(now, seq);
            }
            while let Some(action) = hb.handle_timeout(now) {
                match action {
                    HeartbeatAction::SendPing { seq } => {
                        if let Some(rtt) = rtt(seq) {
                            // One byte stream: a pong never overtakes an earlier one.
                            let after = pongs.iter().map(|(at, _)| *at).max();
                            pongs.push(((now + rtt).max(after.unwrap_or(now)), seq));
                        }
                    }
                    HeartbeatAction::PeerDead => break,
                }
                if hb.state(now) == PeerState::Dead {
                    break;
                }
            }
            let state = hb.state(now);
            if state != last {
                changes.push((now - t0, state));
                last = state;
            }
            if state == PeerState::Dead {
                break;
            }
        }
        changes
    }

    #[test]
    fn pings_at_once_then_at_the_idle_interval() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        assert_eq!(hb.poll_timeout(), t0);
        assert_eq!(
            hb.handle_timeout(t0),
            Some(HeartbeatAction::SendPing { seq: 1 })
        );
        assert_eq!(hb.handle_timeout(t0), None);
        hb.on_received(t0 + secs(0.05));
        hb.on_pong(t0 + secs(0.05), 1);
        assert_eq!(hb.srtt(), Some(secs(0.05)));
        assert_eq!(hb.poll_timeout(), t0 + secs(10.0));
        assert_eq!(
            hb.handle_timeout(t0 + secs(10.0)),
            Some(HeartbeatAction::SendPing { seq: 2 })
        );
    }

    #[test]
    fn a_silent_peer_turns_suspect_then_dead_and_an_answer_revives_a_suspect_one() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        hb.handle_timeout(t0);
        hb.on_received(t0 + secs(0.001));
        hb.on_pong(t0 + secs(0.001), 1);
        // A LAN: the floors rule.
        assert_eq!(hb.suspect_after(), MIN_SUSPECT);
        assert_eq!(hb.dead_after(), MIN_DEAD);
        let ping = t0 + secs(10.0);
        assert!(matches!(
            hb.handle_timeout(ping),
            Some(HeartbeatAction::SendPing { .. })
        ));
        assert_eq!(hb.state(ping + secs(0.999)), PeerState::Alive);
        assert_eq!(hb.poll_timeout(), ping + MIN_SUSPECT);
        assert_eq!(hb.state(ping + MIN_SUSPECT), PeerState::Suspect);
        // An answer, however late, revives it.
        hb.on_received(ping + secs(2.0));
        assert_eq!(hb.state(ping + secs(2.0)), PeerState::Alive);
        // Then silence for good.
        let ping = t0 + secs(20.0);
        assert!(hb.handle_timeout(ping).is_some());
        assert_eq!(hb.state(ping + MIN_SUSPECT), PeerState::Suspect);
        assert_eq!(hb.poll_timeout(), ping + MIN_SUSPECT);
        assert_eq!(hb.handle_timeout(ping + MIN_SUSPECT), None);
        assert_eq!(hb.poll_timeout(), ping + MIN_DEAD);
        assert_eq!(
            hb.handle_timeout(ping + MIN_DEAD),
            Some(HeartbeatAction::PeerDead)
        );
        assert_eq!(hb.state(ping + MIN_DEAD), PeerState::Dead);
        // Dead stays dead.
        hb.on_received(ping + secs(7.0));
        assert_eq!(hb.state(ping + secs(7.0)), PeerState::Dead);
    }

    #[test]
    fn a_session_that_turns_busy_after_a_quiet_spell_pings_at_once() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        hb.handle_timeout(t0);
        hb.on_received(t0);
        hb.on_pong(t0, 1);
        // Idle: the next ping is 10 s away. A stream opens at 5 s.
        let opened = t0 + secs(5.0);
        hb.set_busy(opened, true);
        assert_eq!(hb.poll_timeout(), opened);
        assert!(hb.handle_timeout(opened).is_some());
        // While busy, every second.
        hb.on_received(opened);
        assert_eq!(hb.poll_timeout(), opened + BUSY_INTERVAL);
        // Busy again soon after a ping: no extra ping.
        hb.set_busy(opened, false);
        hb.set_busy(opened + secs(0.2), true);
        assert_eq!(hb.poll_timeout(), opened + BUSY_INTERVAL);
    }

    #[test]
    fn a_frozen_busy_peer_is_suspect_within_two_seconds_and_dead_within_eight() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        hb.set_busy(t0, true);
        let frozen_at = 60.0;
        let changes = simulate(&mut hb, t0, secs(120.0), |seq| {
            // Pings every second from t0: ping `seq` leaves at seq - 1 s.
            (((seq - 1) as f64) < frozen_at).then_some(secs(0.0004))
        });
        assert_eq!(changes.len(), 2, "{changes:?}");
        let (suspect, dead) = (changes[0], changes[1]);
        assert_eq!(suspect.1, PeerState::Suspect);
        assert_eq!(dead.1, PeerState::Dead);
        let since_freeze = |d: Duration| d.as_secs_f64() - frozen_at;
        assert!(since_freeze(suspect.0) <= 2.0, "{changes:?}");
        assert!(
            since_freeze(dead.0) <= 1.0 + MIN_DEAD.as_secs_f64(),
            "{changes:?}"
        );
    }

    #[test]
    fn deadlines_grow_with_the_round_trip() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        let mut now = t0;
        for seq in 1..=20 {
            hb.handle_timeout(now);
            now += secs(0.3);
            hb.on_received(now);
            hb.on_pong(now, seq);
            now = hb.poll_timeout();
        }
        let srtt = hb.srtt().expect("measured");
        assert!(srtt.abs_diff(secs(0.3)) < secs(0.01), "{srtt:?}");
        assert!(hb.suspect_after() >= secs(0.9), "{:?}", hb.suspect_after());
        assert!(hb.dead_after() >= secs(3.6), "{:?}", hb.dead_after());
        // Never past the configured timeout.
        let capped = Heartbeat::new(t0, config(1, 3));
        assert_eq!(capped.dead_after(), secs(3.0));
        assert!(capped.suspect_after() <= secs(3.0));
    }

    /// A pong that must be sent again `k` times after losses arrives `k` retransmission
    /// timeouts late (each doubling, TCP's way).
    fn lossy_rtt(rtt: Duration, loss: f64, random: &mut impl FnMut() -> f64) -> Duration {
        let mut delay = rtt;
        let mut rto = rtt + MIN_RTO;
        // A ping and its pong: two messages, each lost independently.
        for _ in 0..2 {
            while random() < loss {
                delay += rto;
                rto *= 2;
            }
        }
        delay
    }

    #[test]
    fn no_flap_at_300_ms_and_2_percent_loss() {
        // 10 hours of a busy session (36,000 pings) with a seeded generator.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        hb.set_busy(t0, true);
        let changes = simulate(&mut hb, t0, secs(36_000.0), |_| {
            Some(lossy_rtt(secs(0.3), 0.02, &mut random))
        });
        // Neither dead nor, for a moment, suspect.
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn old_and_unknown_pongs_give_no_sample() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, config(10, 30));
        hb.on_pong(t0, 0);
        hb.on_pong(t0, 7);
        assert_eq!(hb.srtt(), None);
        for n in 0..(REMEMBERED_PINGS as u64 + 2) {
            hb.handle_timeout(t0 + secs(10.0 * n as f64));
            hb.on_received(t0 + secs(10.0 * n as f64));
        }
        hb.on_pong(t0 + secs(200.0), 1);
        assert_eq!(hb.srtt(), None, "ping 1 is forgotten");
    }

    proptest! {
        #[test]
        fn backoff_stays_within_bounds(
            initial_ms in 1u64..5_000,
            max_ms in 1u64..120_000,
            randoms in prop::collection::vec(any::<u64>(), 1..80),
        ) {
            let initial = Duration::from_millis(initial_ms);
            let max = Duration::from_millis(max_ms).max(initial);
            let mut backoff = Backoff::new(initial, max);
            let mut previous_cap = Duration::ZERO;
            for (n, r) in randoms.into_iter().enumerate() {
                let delay = backoff.next_delay(r);
                let cap = initial.saturating_mul(1u32.checked_shl(n.min(31) as u32).unwrap_or(u32::MAX)).min(max);
                prop_assert!(delay <= cap, "delay {delay:?} > cap {cap:?}");
                prop_assert!(delay >= cap / 2, "delay {delay:?} < half cap {cap:?}");
                prop_assert!(cap >= previous_cap);
                previous_cap = cap;
            }
        }
    }

    #[test]
    fn backoff_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        for _ in 0..10 {
            b.next_delay(u64::MAX);
        }
        let late = b.next_delay(u64::MAX);
        assert!(late >= Duration::from_secs(15) && late <= Duration::from_secs(30));
        b.reset();
        assert!(b.next_delay(u64::MAX) <= Duration::from_secs(1));
    }
}
