//! Happy eyeballs for transports: tries a client's `transports` in order, starting the next
//! one when the previous has not authenticated within a stagger (or has failed), and keeps
//! the first that does.
//!
//! Like RFC 8305 for addresses: the preferred transport gets a head start, a network that
//! silently drops it costs only the stagger, and one that refuses it at once (a reset, a
//! firewall's `EPERM`, no route) costs nothing, because a failure starts the next attempt
//! immediately. The attempts still running when one wins are dropped, which cancels them
//! (their connections close).

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::config::TransportEntry;

/// How long an attempt has to authenticate before the next transport starts too.
pub(crate) const STAGGER: Duration = Duration::from_secs(1);

/// How a race ended without a winner.
#[derive(Debug)]
pub(crate) enum Lost<E> {
    /// An attempt failed in a way no other transport would change (the server refused
    /// the client): the race stopped there.
    Final(E),
    /// Every transport failed; why, in the order they failed.
    All(Vec<(TransportEntry, E)>),
}

/// A race's winner, and the attempts that failed before it won.
#[derive(Debug)]
pub(crate) struct Won<T, E> {
    pub(crate) entry: TransportEntry,
    pub(crate) value: T,
    pub(crate) failed: Vec<(TransportEntry, E)>,
}

/// Races `start(entry)` over `entries` in order, `stagger` apart, and returns the first
/// success with its entry. A failure starts the next entry at once; a failure `is_final`
/// says is final ends the race.
pub(crate) async fn race<T, E, Fut>(
    entries: &[TransportEntry],
    stagger: Duration,
    mut start: impl FnMut(TransportEntry) -> Fut,
    is_final: impl Fn(&E) -> bool,
) -> Result<Won<T, E>, Lost<E>>
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut waiting: VecDeque<TransportEntry> = entries.iter().copied().collect();
    let mut running = FuturesUnordered::new();
    let mut failures = Vec::new();
    let mut launch = |entry: TransportEntry| {
        let attempt = start(entry);
        async move { (entry, attempt.await) }
    };
    let mut next_start = tokio::time::Instant::now();
    loop {
        if running.is_empty() || tokio::time::Instant::now() >= next_start {
            match waiting.pop_front() {
                Some(entry) => {
                    running.push(launch(entry));
                    next_start = tokio::time::Instant::now() + stagger;
                }
                None if running.is_empty() => return Err(Lost::All(failures)),
                None => next_start = far_future(),
            }
        }
        tokio::select! {
            Some((entry, result)) = running.next() => match result {
                Ok(value) => return Ok(Won { entry, value, failed: failures }),
                Err(error) if is_final(&error) => return Err(Lost::Final(error)),
                Err(error) => {
                    failures.push((entry, error));
                    // The network said no: no reason to keep the next one waiting.
                    next_start = tokio::time::Instant::now();
                }
            },
            () = tokio::time::sleep_until(next_start) => {}
        }
    }
}

/// A deadline that never comes in practice (a year).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// `entries` with `first` moved to the front (the transport that won last time), the rest
/// in their order.
pub(crate) fn preferring(
    entries: &[TransportEntry],
    first: Option<TransportEntry>,
) -> Vec<TransportEntry> {
    let mut order: Vec<TransportEntry> = entries.to_vec();
    if let Some(first) = first
        && let Some(at) = order.iter().position(|e| *e == first)
    {
        let entry = order.remove(at);
        order.insert(0, entry);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Transport;

    fn entries(list: &[Transport]) -> Vec<TransportEntry> {
        list.iter().copied().map(TransportEntry::new).collect()
    }

    /// An attempt that answers after `after` with `outcome`.
    async fn attempt(
        after: Duration,
        outcome: Result<(), &'static str>,
    ) -> Result<(), &'static str> {
        tokio::time::sleep(after).await;
        outcome
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_first_transport_costs_one_stagger() {
        let list = entries(&[Transport::Quic, Transport::Noise, Transport::Wss]);
        let started = tokio::time::Instant::now();
        let won = race(
            &list,
            STAGGER,
            |entry| match entry.transport {
                // Dropped packets: nothing for ten seconds.
                Transport::Quic => attempt(Duration::from_secs(10), Err("timeout")),
                _ => attempt(Duration::from_millis(20), Ok(())),
            },
            |_| false,
        )
        .await
        .unwrap();
        assert_eq!(won.entry.transport, Transport::Noise);
        assert_eq!(started.elapsed(), STAGGER + Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_starts_the_next_transport_at_once() {
        let list = entries(&[Transport::Quic, Transport::Noise]);
        let started = tokio::time::Instant::now();
        let won = race(
            &list,
            STAGGER,
            |entry| match entry.transport {
                Transport::Quic => attempt(Duration::from_millis(1), Err("EPERM")),
                _ => attempt(Duration::from_millis(20), Ok(())),
            },
            |_| false,
        )
        .await
        .unwrap();
        assert_eq!(won.entry.transport, Transport::Noise);
        assert_eq!(started.elapsed(), Duration::from_millis(21));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_to_authenticate_wins_even_when_started_later() {
        let list = entries(&[Transport::Quic, Transport::Noise]);
        let won = race(
            &list,
            STAGGER,
            |entry| match entry.transport {
                // Slow but working: noise, started a second later, is up first.
                Transport::Quic => attempt(Duration::from_millis(1500), Ok(())),
                _ => attempt(Duration::from_millis(100), Ok(())),
            },
            |_| false,
        )
        .await
        .unwrap();
        assert_eq!(won.entry.transport, Transport::Noise);
    }

    #[tokio::test(start_paused = true)]
    async fn every_failure_is_reported_in_order() {
        let list = entries(&[Transport::Quic, Transport::Noise]);
        let lost = race(
            &list,
            STAGGER,
            |entry| match entry.transport {
                Transport::Quic => attempt(Duration::from_secs(3), Err("quic timed out")),
                _ => attempt(Duration::from_millis(5), Err("noise refused")),
            },
            |_| false,
        )
        .await
        .unwrap_err();
        let Lost::All(failures) = lost else {
            panic!("expected every transport to fail")
        };
        let reasons: Vec<&str> = failures.iter().map(|(_, e)| *e).collect();
        assert_eq!(reasons, ["noise refused", "quic timed out"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_failure_stops_the_race() {
        let list = entries(&[Transport::Noise, Transport::Wss]);
        let lost = race(
            &list,
            STAGGER,
            |_| attempt(Duration::from_millis(5), Err("refused by the server")),
            |e| e.contains("server"),
        )
        .await
        .unwrap_err();
        assert!(matches!(lost, Lost::Final("refused by the server")));
    }

    #[test]
    fn the_last_winner_goes_first() {
        let list = entries(&[Transport::Quic, Transport::Noise, Transport::Wss]);
        let order = preferring(&list, Some(TransportEntry::new(Transport::Wss)));
        let names: Vec<Transport> = order.iter().map(|e| e.transport).collect();
        assert_eq!(names, [Transport::Wss, Transport::Quic, Transport::Noise]);
        assert_eq!(preferring(&list, None), list);
    }
}
