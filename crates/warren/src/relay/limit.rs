//! Bandwidth limits: one token bucket per direction of a service, shared by all of its
//! streams and UDP flows (`bandwidth_limit = "10MB/s"`).
//!
//! Written here rather than taken from `governor`: governor counts in cells with a
//! nanosecond quantum per cell, so a byte rate of a few GB/s cannot be expressed exactly,
//! and it has no "reserve now, wait for the debt" call, which is what a byte pump wants (it
//! has already read the bytes when it learns how many). The bucket is the GCRA form: one
//! atomic "theoretical arrival time", advanced by each chunk's cost; a chunk that pushes it
//! more than the burst ahead of now waits until the burst is free again (TCP), or is
//! refused (UDP: dropped and counted by the caller).
//!
//! [`Limits`] holds a bucket pair for every service of the config, limited or not (an
//! unlimited bucket costs one atomic load per chunk), so a reload changes any service's
//! limit in place: its relays, running or new, TCP or UDP, follow the new rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

/// How long a full bucket lasts at the limit: bytes may come this far ahead of the rate
/// before anything waits. Short enough that a 10 s measurement sees the rate within 1 %,
/// long enough that one record (at most 64 KiB) at a low limit does not wait twice.
const BURST: Duration = Duration::from_millis(50);

/// The smallest burst, in bytes: one full record goes through at once even at a low rate.
const MIN_BURST_BYTES: u64 = 64 * 1024;

/// The rate of a bucket that limits nothing.
const UNLIMITED: u64 = u64::MAX;

/// One direction's bucket.
#[derive(Debug)]
pub struct Pace {
    /// Bytes per second; a reload may change it under running relays.
    rate: AtomicU64,
    /// Where the nanosecond clock below starts.
    origin: Instant,
    /// When (ns after `origin`) everything admitted so far will have gone out at the rate.
    due: AtomicU64,
}

impl Pace {
    /// A bucket of `rate` bytes per second (at least 1; `None`: no limit), full.
    pub fn new(rate: Option<u64>) -> Pace {
        Pace {
            rate: AtomicU64::new(rate.map_or(UNLIMITED, |rate| rate.max(1))),
            origin: Instant::now(),
            due: AtomicU64::new(0),
        }
    }

    /// The limit, bytes per second; `None`: no limit.
    pub fn rate(&self) -> Option<u64> {
        Some(self.rate.load(Ordering::Relaxed)).filter(|&rate| rate != UNLIMITED)
    }

    /// Changes the limit; what is already due stays due.
    pub fn set_rate(&self, rate: Option<u64>) {
        let rate = rate.map_or(UNLIMITED, |rate| rate.max(1));
        self.rate.store(rate, Ordering::Relaxed);
    }

    /// The burst, as time at the rate.
    fn burst_ns(&self, rate: u64) -> u64 {
        let burst_bytes = (rate as u128 * BURST.as_nanos() / 1_000_000_000) as u64;
        cost(burst_bytes.max(MIN_BURST_BYTES), rate)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts `bytes` already read and waits until they fit the rate (TCP: the pump reads
    /// first, then pays; the next read waits for the debt).
    pub async fn spend(&self, bytes: usize) {
        let Some(rate) = self.rate() else {
            return;
        };
        let now = self.now();
        let cost = cost(bytes as u64, rate);
        let due = self
            .due
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |due| {
                Some(due.max(now).saturating_add(cost))
            })
            .map_or(now, |before| before.max(now).saturating_add(cost));
        let free_at = due.saturating_sub(self.burst_ns(rate));
        if free_at > now {
            tokio::time::sleep_until(self.origin + Duration::from_nanos(free_at)).await;
        }
    }

    /// Admits `bytes` if they fit the burst now, and counts them; `false`: over the limit,
    /// nothing counted (UDP: the datagram is dropped).
    pub fn admit(&self, bytes: usize) -> bool {
        let Some(rate) = self.rate() else {
            return true;
        };
        let now = self.now();
        let cost = cost(bytes as u64, rate);
        let burst = self.burst_ns(rate);
        self.due
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |due| {
                let due = due.max(now).saturating_add(cost);
                (due - now <= burst).then_some(due)
            })
            .is_ok()
    }
}

/// Nanoseconds `bytes` take at `rate` bytes per second.
fn cost(bytes: u64, rate: u64) -> u64 {
    let ns = bytes as u128 * 1_000_000_000 / rate.max(1) as u128;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// A service's two buckets: the bytes a relay moves towards the tunnel, and towards its
/// local end (visitor or target). Each direction has the whole limit.
#[derive(Debug)]
pub struct Bandwidth {
    /// From the local end into the tunnel.
    pub to_tunnel: Pace,
    /// From the tunnel to the local end.
    pub to_local: Pace,
}

impl Bandwidth {
    /// `rate` bytes per second each way (`None`: no limit).
    pub fn new(rate: Option<u64>) -> Bandwidth {
        Bandwidth {
            to_tunnel: Pace::new(rate),
            to_local: Pace::new(rate),
        }
    }

    /// The limit of each direction, bytes per second; `None`: no limit.
    pub fn rate(&self) -> Option<u64> {
        self.to_tunnel.rate()
    }

    fn set_rate(&self, rate: Option<u64>) {
        self.to_tunnel.set_rate(rate);
        self.to_local.set_rate(rate);
    }
}

/// Every configured service's buckets, by service name.
#[derive(Debug, Default)]
pub struct Limits(RwLock<HashMap<String, Arc<Bandwidth>>>);

impl Limits {
    /// Buckets for `services` (name, bytes per second or `None` for no limit).
    pub fn new<'a>(services: impl IntoIterator<Item = (&'a str, Option<u64>)>) -> Limits {
        let limits = Limits::default();
        limits.set(services);
        limits
    }

    /// Makes `services` the configured ones. A service that was configured keeps its
    /// buckets at its new rate, so the relays running already follow it; one no longer
    /// configured has its buckets opened wide for the relays that still hold them.
    pub fn set<'a>(&self, services: impl IntoIterator<Item = (&'a str, Option<u64>)>) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = HashMap::new();
        for (name, rate) in services {
            let bucket = match table.remove(name) {
                Some(kept) => {
                    kept.set_rate(rate);
                    kept
                }
                None => Arc::new(Bandwidth::new(rate)),
            };
            next.insert(name.to_owned(), bucket);
        }
        for gone in table.values() {
            gone.set_rate(None);
        }
        *table = next;
    }

    /// The buckets of `service`; `None`: not a service of the config (a client-declared
    /// one on the server), never limited.
    pub fn get(&self, service: &str) -> Option<Arc<Bandwidth>> {
        let table = self.0.read().unwrap_or_else(PoisonError::into_inner);
        table.get(service).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn spending_waits_for_the_rate_after_the_burst() {
        let pace = Pace::new(Some(1_000_000));
        let start = Instant::now();
        // The burst (64 KiB: more than 50 ms at 1 MB/s) goes at once.
        pace.spend(64 * 1024).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Then 2 MB more: 2 s at the rate, less the burst that was still free.
        for _ in 0..200 {
            pace.spend(10_000).await;
        }
        let took = start.elapsed().as_secs_f64();
        assert!((took - 2.0).abs() < 0.01, "took {took} s");
    }

    #[tokio::test(start_paused = true)]
    async fn many_spenders_share_one_rate() {
        let pace = Arc::new(Pace::new(Some(4_000_000)));
        let start = Instant::now();
        let spenders: Vec<_> = (0..8)
            .map(|_| {
                let pace = Arc::clone(&pace);
                tokio::spawn(async move {
                    for _ in 0..100 {
                        pace.spend(16 * 1024).await;
                    }
                })
            })
            .collect();
        for spender in spenders {
            spender.await.unwrap();
        }
        // 8 × 1.6 MB at 4 MB/s, less the first burst's worth.
        let expected = (8.0 * 100.0 * 16384.0 - 200_000.0) / 4e6;
        let took = start.elapsed().as_secs_f64();
        assert!(
            (took - expected).abs() < 0.05,
            "took {took} s, expected {expected}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn admission_refuses_what_is_over_the_burst_and_recovers() {
        let pace = Pace::new(Some(1_000_000));
        let admitted = (0..100).filter(|_| pace.admit(1_000)).count();
        // 64 KiB of burst: 65 datagrams of 1000 bytes, the rest dropped.
        assert_eq!(admitted, 65);
        tokio::time::advance(Duration::from_millis(10)).await;
        // 10 ms at 1 MB/s: 10 more.
        let admitted = (0..100).filter(|_| pace.admit(1_000)).count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn a_reload_changes_the_rate_of_the_buckets_in_use() {
        let limits = Limits::new([("a", Some(1_000)), ("b", Some(2_000)), ("c", None)]);
        let a = limits.get("a").unwrap();
        let b = limits.get("b").unwrap();
        let c = limits.get("c").unwrap();
        assert_eq!(c.rate(), None);
        limits.set([("a", Some(1_000)), ("b", Some(3_000)), ("c", Some(5_000))]);
        assert!(Arc::ptr_eq(&a, &limits.get("a").unwrap()));
        assert!(Arc::ptr_eq(&b, &limits.get("b").unwrap()));
        assert_eq!(b.rate(), Some(3_000));
        // A service that had no limit gets one in place too.
        assert_eq!(c.rate(), Some(5_000));
        limits.set([("b", Some(3_000)), ("c", None)]);
        assert!(limits.get("a").is_none());
        assert_eq!(c.rate(), None);
        // A relay that still holds a's buckets is no longer held back.
        assert_eq!(a.rate(), None);
        assert!(a.to_tunnel.admit(1 << 30));
    }

    #[test]
    fn extreme_rates_do_not_overflow() {
        let fast = Pace::new(Some(u64::MAX - 1));
        assert!(fast.admit(1 << 30));
        assert!(!fast.admit(usize::MAX));
        let slow = Pace::new(Some(0));
        assert_eq!(slow.rate(), Some(1));
        assert!(slow.admit(1));
    }
}
