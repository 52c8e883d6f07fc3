//! The cap on connections that have not authenticated yet, which drops the *oldest*.
//!
//! A public server port is reached by anyone. Each connection costs a socket and a task
//! until it authenticates or its deadline ([`ServerConfig::handshake_timeout`]) ends it. A
//! cap that refuses the *newest* connection when full lets whoever fills it (with silent
//! connections, one per slot) lock real clients out for as long as they like. This cap
//! evicts the *oldest* pending connection instead: a stranger holding the cap only pushes
//! out its own stale connections, and a real client, which authenticates within a round
//! trip or two, is always among the newest.
//!
//! Two limits apply, each evicting its own oldest: [`MAX_PENDING_HANDSHAKES`] across all
//! peers and [`MAX_PENDING_PER_IP`] per source address, so one noisy address mostly evicts
//! its own connections and not those of other peers. An IPv6 source counts by its /64
//! prefix (one subscriber usually holds a whole /64), an IPv4-mapped one as its IPv4.
//!
//! Main types: [`PendingLimiter`] (the table, shared by the accept loop) and
//! [`PendingGuard`] (one admitted connection: dropping it, on authentication or failure,
//! frees the slot; its [`PendingGuard::evicted`] token fires when the limiter drops it).
//! Admission and removal are `O(log n)` under one short mutex, never held across an await.
//!
//! [`ServerConfig::handshake_timeout`]: crate::config::ServerConfig::handshake_timeout

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// Unauthenticated connections held at once, across all peers. When full, the oldest is
/// closed to admit the newest. Each costs a socket and a small task (a few KiB).
pub const MAX_PENDING_HANDSHAKES: usize = 4096;

/// Unauthenticated connections held at once from one source IP address. When full, that
/// address's oldest is closed. High enough for a client behind a NAT opening its data
/// channel pool while others share its address.
pub const MAX_PENDING_PER_IP: usize = 256;

/// Bounded table of pending connections, oldest first.
#[derive(Debug)]
pub struct PendingLimiter {
    max_total: usize,
    max_per_ip: usize,
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// Admission order (ids only grow): the first entry is the oldest.
    order: BTreeMap<u64, Entry>,
    /// Ids per source address, oldest first; an address with none is removed.
    per_ip: HashMap<IpAddr, BTreeSet<u64>>,
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    evicted: CancellationToken,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.order.remove(&id)?;
        if let Some(ids) = self.per_ip.get_mut(&entry.ip) {
            ids.remove(&id);
            if ids.is_empty() {
                self.per_ip.remove(&entry.ip);
            }
        }
        Some(entry)
    }

    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.remove(id) {
            entry.evicted.cancel();
        }
    }
}

/// One admitted pending connection. Drop it once the connection authenticated or failed.
#[derive(Debug)]
pub struct PendingGuard {
    limiter: Arc<PendingLimiter>,
    id: u64,
    evicted: CancellationToken,
}

impl PendingGuard {
    /// Fires when the limiter evicted this connection to make room for a newer one: the
    /// connection's task should then close it.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.limiter.lock().remove(self.id);
    }
}

impl PendingLimiter {
    /// A limiter holding at most `max_total` connections, `max_per_ip` per address (each
    /// raised to at least 1).
    pub fn new(max_total: usize, max_per_ip: usize) -> Arc<Self> {
        Arc::new(PendingLimiter {
            max_total: max_total.max(1),
            max_per_ip: max_per_ip.max(1),
            inner: Mutex::new(Table::default()),
        })
    }

    /// Admits a new connection from `ip`, evicting the oldest pending connection of the
    /// same address when that address is at its cap, then the oldest overall when the
    /// table is full. Returns the guard and how many connections were evicted (0 or 1).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> (PendingGuard, usize) {
        let ip = source_key(ip);
        let mut table = self.lock();
        let mut evicted = 0;
        let oldest_of_ip = table
            .per_ip
            .get(&ip)
            .filter(|ids| ids.len() >= self.max_per_ip)
            .and_then(|ids| ids.first().copied());
        if let Some(id) = oldest_of_ip {
            table.evict(id);
            evicted += 1;
        }
        if table.order.len() >= self.max_total
            && let Some((&id, _)) = table.order.first_key_value()
        {
            table.evict(id);
            evicted += 1;
        }
        let id = table.next_id;
        table.next_id += 1;
        let token = CancellationToken::new();
        table.order.insert(
            id,
            Entry {
                ip,
                evicted: token.clone(),
            },
        );
        table.per_ip.entry(ip).or_default().insert(id);
        drop(table);
        let guard = PendingGuard {
            limiter: Arc::clone(self),
            id,
            evicted: token,
        };
        (guard, evicted)
    }

    /// Connections pending now.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether no connection is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Distinct source addresses with pending connections (bounded by the table size).
    pub fn addresses(&self) -> usize {
        self.lock().per_ip.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The per-address key of a source: IPv4 as is (IPv4-mapped IPv6 too), IPv6 by its /64.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn full_table_evicts_the_oldest_not_the_newest() {
        let limiter = PendingLimiter::new(3, 10);
        let (a, _) = limiter.admit(ip(1));
        let (b, _) = limiter.admit(ip(2));
        let (c, _) = limiter.admit(ip(3));
        assert_eq!(limiter.len(), 3);
        let (d, evicted) = limiter.admit(ip(4));
        assert_eq!(evicted, 1);
        assert!(a.evicted().is_cancelled(), "the oldest goes");
        assert!(!b.evicted().is_cancelled() && !c.evicted().is_cancelled());
        assert!(!d.evicted().is_cancelled(), "the newest stays");
        assert_eq!(limiter.len(), 3);
        drop(a); // an evicted guard's drop is a no-op
        assert_eq!(limiter.len(), 3);
        let (e, _) = limiter.admit(ip(5));
        assert!(b.evicted().is_cancelled());
        drop((c, d, e));
        assert!(limiter.is_empty());
        assert_eq!(limiter.addresses(), 0);
    }

    #[test]
    fn per_ip_cap_evicts_that_address_first() {
        let limiter = PendingLimiter::new(100, 2);
        let (other, _) = limiter.admit(ip(9));
        let (a1, _) = limiter.admit(ip(1));
        let (a2, _) = limiter.admit(ip(1));
        let (a3, evicted) = limiter.admit(ip(1));
        assert_eq!(evicted, 1);
        assert!(a1.evicted().is_cancelled());
        assert!(
            !other.evicted().is_cancelled(),
            "another address is untouched"
        );
        assert!(!a2.evicted().is_cancelled() && !a3.evicted().is_cancelled());
        assert_eq!(limiter.len(), 3);
        assert_eq!(limiter.addresses(), 2);
    }

    #[test]
    fn ipv6_sources_count_by_their_64_prefix() {
        let limiter = PendingLimiter::new(100, 2);
        let v6 = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
        let (a, _) = limiter.admit(v6(1));
        let (_b, _) = limiter.admit(v6(2));
        let (_c, evicted) = limiter.admit(v6(3));
        assert_eq!(evicted, 1, "three addresses of one /64 share its cap");
        assert!(a.evicted().is_cancelled());
        let (other, evicted) = limiter.admit(IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1]));
        assert_eq!(evicted, 0);
        assert!(!other.evicted().is_cancelled());
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        assert_eq!(source_key(mapped), ip(1));
        assert_eq!(limiter.addresses(), 2);
    }

    #[test]
    fn finished_connections_free_their_slot() {
        let limiter = PendingLimiter::new(2, 2);
        for _ in 0..10_000 {
            let (guard, evicted) = limiter.admit(ip(1));
            assert_eq!(evicted, 0);
            drop(guard);
        }
        assert!(limiter.is_empty());
    }

    #[test]
    fn a_flood_never_grows_the_table_past_its_caps() {
        let limiter = PendingLimiter::new(64, 8);
        let mut guards = Vec::new();
        for n in 0..5_000u32 {
            let (guard, _) = limiter.admit(IpAddr::from((n % 200).to_be_bytes()));
            guards.push(guard);
            assert!(limiter.len() <= 64);
        }
        // The newest 64 survive.
        let live: Vec<usize> = guards
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.evicted().is_cancelled())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(live, (5_000 - 64..5_000).collect::<Vec<_>>());
    }
}
