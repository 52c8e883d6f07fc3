//! What a session's control loop knows of its peer, shared with whoever hands the session
//! work: the heartbeat's round trip, the streams open, and whether the peer answers
//! ([`PeerState`]: alive, suspect, dead).
//!
//! The control loop ([`super::run_control`]) owns the judgement (the sans-IO
//! [`warren_proto::liveness::Heartbeat`]) and publishes it here; a balancer skips a suspect
//! session at once, and a visitor still waiting for its first answer on one is moved to
//! another ([`Vitals::stopped_answering`]). Streams counted here make the heartbeat ping
//! faster while there is work a frozen peer would strand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
pub use warren_proto::liveness::PeerState;

/// One session's liveness, shared between its control loop and its streams.
#[derive(Debug)]
pub struct Vitals {
    /// The last heartbeat round trip in microseconds; 0 until the first pong.
    rtt_micros: AtomicU64,
    /// Streams open on the session now.
    open: AtomicU64,
    /// Streams moved to another session because this one stopped answering.
    moved: AtomicU64,
    /// Woken when the session goes from no stream to one (the control loop pings then if
    /// it has not heard from the peer lately).
    busy: Notify,
    state: watch::Sender<PeerState>,
}

impl Default for Vitals {
    fn default() -> Self {
        Vitals {
            rtt_micros: AtomicU64::new(0),
            open: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            busy: Notify::new(),
            state: watch::Sender::new(PeerState::Alive),
        }
    }
}

impl Vitals {
    /// Counts a stream opened on the session.
    pub fn stream_opened(&self) {
        if self.open.fetch_add(1, Ordering::Relaxed) == 0 {
            self.busy.notify_one();
        }
    }

    /// Counts a stream of the session that ended.
    pub fn stream_closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a stream on the session while `f` runs (however it ends, dropped too).
    pub async fn counting<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        struct Open<'a>(&'a Vitals);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.stream_closed();
            }
        }
        self.stream_opened();
        let _open = Open(self);
        f.await
    }

    /// Streams open on the session now.
    pub fn open_streams(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Counts a stream moved to another session because this one stopped answering.
    pub fn stream_moved(&self) {
        self.moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Streams moved off this session so far.
    pub fn moved_streams(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// What the heartbeat believes of the peer now.
    pub fn state(&self) -> PeerState {
        *self.state.borrow()
    }

    /// Whether the session should take no new stream: its peer stopped answering.
    pub fn is_suspect(&self) -> bool {
        self.state() != PeerState::Alive
    }

    /// Resolves once the peer is suspect or dead (at once if it already is).
    pub async fn stopped_answering(&self) {
        let mut state = self.state.subscribe();
        // The sender lives as long as `self`: `wait_for` ends only by its predicate.
        let _ = state.wait_for(|state| *state != PeerState::Alive).await;
    }

    /// Resolves once the peer is declared dead (at once if it already is).
    pub async fn died(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|state| *state == PeerState::Dead).await;
    }

    /// The last heartbeat round trip in milliseconds, once one was measured.
    pub fn rtt_millis(&self) -> Option<f64> {
        match self.rtt_micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(micros as f64 / 1000.0),
        }
    }

    pub(super) fn record_rtt(&self, rtt: Duration) {
        let micros = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1);
        self.rtt_micros.store(micros, Ordering::Relaxed);
    }

    /// Publishes a new judgement; says whether it changed.
    pub(super) fn set_state(&self, state: PeerState) -> bool {
        self.state.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        })
    }

    /// Resolves when the session goes from no stream to one.
    pub(super) async fn turned_busy(&self) {
        self.busy.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_learns_when_the_peer_stops_answering() {
        let vitals = std::sync::Arc::new(Vitals::default());
        let waiter = tokio::spawn({
            let vitals = std::sync::Arc::clone(&vitals);
            async move { vitals.stopped_answering().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(!vitals.set_state(PeerState::Alive), "no change");
        assert!(vitals.set_state(PeerState::Suspect));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert!(vitals.is_suspect());
        // Already suspect: at once.
        vitals.stopped_answering().await;
        assert!(vitals.set_state(PeerState::Alive));
        assert!(!vitals.is_suspect());
    }

    #[tokio::test]
    async fn the_first_stream_wakes_the_control_loop_and_later_ones_do_not() {
        let vitals = Vitals::default();
        vitals.stream_opened();
        tokio::time::timeout(Duration::from_secs(5), vitals.turned_busy())
            .await
            .expect("woken by the first stream");
        vitals.stream_opened();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), vitals.turned_busy())
                .await
                .is_err()
        );
        assert_eq!(vitals.open_streams(), 2);
        vitals.stream_closed();
        vitals.stream_closed();
        assert_eq!(vitals.open_streams(), 0);
    }
}
