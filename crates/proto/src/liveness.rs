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
    /// Send a ping now.
    SendPing,
    /// Nothing heard for the whole timeout: the peer or the path is gone.
    PeerDead,
}

/// Tracks one control channel's liveness.
///
/// Call-order contract: [`Heartbeat::on_received`] for every message from the peer;
/// at or after [`Heartbeat::poll_timeout`], call [`Heartbeat::handle_timeout`] and act on
/// what it returns, repeatedly until it returns `None`.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    ping_interval: Option<Duration>,
    timeout: Duration,
    last_received: Instant,
    next_ping: Option<Instant>,
}

impl Heartbeat {
    /// `ping_interval`: how often this side pings (`None`: it only answers);
    /// `timeout`: silence after which the peer is declared dead.
    pub fn new(now: Instant, ping_interval: Option<Duration>, timeout: Duration) -> Self {
        Heartbeat {
            ping_interval,
            timeout,
            last_received: now,
            next_ping: ping_interval.map(|i| now + i),
        }
    }

    /// Records traffic from the peer.
    pub fn on_received(&mut self, now: Instant) {
        self.last_received = self.last_received.max(now);
    }

    /// The next instant at which [`Heartbeat::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Instant {
        let dead_at = self.last_received + self.timeout;
        match self.next_ping {
            Some(ping) => ping.min(dead_at),
            None => dead_at,
        }
    }

    /// Advances the clock to `now` and says what to do, if anything.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<HeartbeatAction> {
        if now >= self.last_received + self.timeout {
            return Some(HeartbeatAction::PeerDead);
        }
        match (self.next_ping, self.ping_interval) {
            (Some(at), Some(interval)) if now >= at => {
                self.next_ping = Some(now + interval);
                Some(HeartbeatAction::SendPing)
            }
            _ => None,
        }
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

    #[test]
    fn pings_at_interval_and_dies_after_timeout() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, Some(Duration::from_secs(10)), Duration::from_secs(30));
        assert_eq!(hb.poll_timeout(), t0 + Duration::from_secs(10));
        assert_eq!(hb.handle_timeout(t0 + Duration::from_secs(5)), None);
        assert_eq!(
            hb.handle_timeout(t0 + Duration::from_secs(10)),
            Some(HeartbeatAction::SendPing)
        );
        hb.on_received(t0 + Duration::from_secs(11));
        assert_eq!(
            hb.handle_timeout(t0 + Duration::from_secs(40)),
            Some(HeartbeatAction::SendPing)
        );
        assert_eq!(
            hb.handle_timeout(t0 + Duration::from_secs(41)),
            Some(HeartbeatAction::PeerDead)
        );
    }

    #[test]
    fn listener_only_side_never_pings() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(t0, None, Duration::from_secs(30));
        assert_eq!(hb.poll_timeout(), t0 + Duration::from_secs(30));
        assert_eq!(hb.handle_timeout(t0 + Duration::from_secs(29)), None);
        assert_eq!(
            hb.handle_timeout(t0 + Duration::from_secs(30)),
            Some(HeartbeatAction::PeerDead)
        );
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
