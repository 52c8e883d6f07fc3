//! Graceful drain, as both sides do it for a rolling restart: what asks for one (SIGTERM,
//! the admin API's `POST /api/v1/drain`, the library's drain token), what the admin API
//! shows of it, and the wait for the streams in flight. What a drain stops differs by
//! side (a client withdraws its services, a server closes its service ports): see
//! `client::drain` and `server::drain`.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// One side's drain: asked for once, never undone (the process stops at its end).
#[derive(Debug)]
pub struct Drain {
    asked: CancellationToken,
    /// When the drain began, once it did.
    since: OnceLock<Instant>,
}

impl Drain {
    /// A drain that begins when `asked` fires (or [`Drain::ask`] is called).
    pub fn new(asked: CancellationToken) -> Drain {
        Drain {
            asked,
            since: OnceLock::new(),
        }
    }

    /// The token that asks for the drain when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.asked.clone()
    }

    /// Asks for the drain (again: no effect).
    pub fn ask(&self) {
        self.asked.cancel();
    }

    /// Resolves once the drain was asked for.
    pub async fn asked(&self) {
        self.asked.cancelled().await;
    }

    /// Records that the drain began now; the side calls it when it starts draining.
    pub fn began(&self) {
        let _ = self.since.set(Instant::now());
    }

    /// Whether the side is draining (it was asked to, whether or not it started yet).
    pub fn is_draining(&self) -> bool {
        self.asked.is_cancelled()
    }

    /// How long the drain has been going, once it began.
    pub fn elapsed(&self) -> Option<Duration> {
        self.since.get().map(Instant::elapsed)
    }
}

/// How long a drain waits at least before it trusts a count of zero: a stream its peer
/// opened just before it heard of the drain still arrives, within a round trip.
pub const SETTLE: Duration = Duration::from_millis(500);

/// How often the drain looks at the streams still open.
const POLL: Duration = Duration::from_millis(50);

/// How a drain's wait for its streams ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// No stream was open any more (after at least [`SETTLE`]).
    Finished,
    /// `timeout` passed with this many still open.
    TimedOut(u64),
    /// The side was stopped outright first.
    Stopped,
}

/// Waits until `open()` says no stream is open (and [`SETTLE`] passed), `timeout` passed,
/// or `stop` fires; logs `drain_finished` or `drain_timeout` for `side`.
pub async fn wait_for_streams(
    side: &str,
    open: impl Fn() -> u64,
    timeout: Duration,
    stop: &CancellationToken,
) -> Drained {
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        let now_open = open();
        if now_open == 0 && started.elapsed() >= SETTLE.min(timeout) {
            info!(
                event = "drain_finished",
                side,
                waited_ms = started.elapsed().as_millis() as u64,
                "drained: no stream is open; stopping"
            );
            return Drained::Finished;
        }
        if Instant::now() >= deadline {
            warn!(
                event = "drain_timeout",
                side,
                open_streams = now_open,
                timeout_ms = timeout.as_millis() as u64,
                "drain_timeout passed with streams still open; stopping and cutting them"
            );
            return Drained::TimedOut(now_open);
        }
        tokio::select! {
            () = stop.cancelled() => return Drained::Stopped,
            () = tokio::time::sleep(POLL.min(deadline - Instant::now())) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_the_last_stream_ends_but_not_before_it_settles() {
        let open = Arc::new(AtomicU64::new(2));
        let stop = CancellationToken::new();
        let closing = Arc::clone(&open);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            closing.store(0, Ordering::Relaxed);
        });
        let started = Instant::now();
        let drained = wait_for_streams(
            "test",
            || open.load(Ordering::Relaxed),
            Duration::from_secs(30),
            &stop,
        )
        .await;
        assert_eq!(drained, Drained::Finished);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(3) && waited < Duration::from_millis(3100));
        // Nothing open at all still waits out the settling time.
        let started = Instant::now();
        let drained = wait_for_streams("test", || 0, Duration::from_secs(30), &stop).await;
        assert_eq!(drained, Drained::Finished);
        assert!(started.elapsed() >= SETTLE);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_gives_up_at_the_timeout_or_when_stopped() {
        let stop = CancellationToken::new();
        let started = Instant::now();
        let drained = wait_for_streams("test", || 3, Duration::from_secs(2), &stop).await;
        assert_eq!(drained, Drained::TimedOut(3));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        let stopping = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopping.cancel();
        });
        let drained = wait_for_streams("test", || 3, Duration::from_secs(30), &stop).await;
        assert_eq!(drained, Drained::Stopped);
    }

    #[test]
    fn a_drain_is_asked_once_and_stays() {
        let drain = Drain::new(CancellationToken::new());
        assert!(!drain.is_draining());
        assert_eq!(drain.elapsed(), None);
        drain.ask();
        drain.ask();
        assert!(drain.is_draining());
        drain.began();
        assert!(drain.elapsed().is_some());
    }
}
