//! A run: datagrams for one destination and of one size that arrived back to back, gathered
//! to leave in one system call (GSO, see [`batch`](super::batch)).
//!
//! Both halves of a UDP service send what comes out of the tunnel this way: the target side
//! per flow (each flow has its own connected socket), the visitor side per visitor address
//! (one socket for all). The receiver still reads the datagrams one by one, with their
//! boundaries, but is woken once per run instead of once per datagram.

use std::net::SocketAddr;

use super::batch::BatchSocket;
use super::{Counter, UdpStats};

/// The most bytes one run gathers: what one UDP send may carry.
const MAX_RUN_BYTES: usize = 65_507;

/// The most datagrams in one run (the kernel's GSO limit; a socket may allow fewer, and
/// [`BatchSocket::send`](super::batch::BatchSocket::send) splits to fit).
const MAX_RUN_DATAGRAMS: usize = 64;

/// Datagrams for one destination `K` and of one size, back to back.
pub(super) struct Run<K> {
    to: Option<K>,
    stride: usize,
    count: usize,
    /// The datagrams, back to back (no buffer while no run is gathered).
    bytes: Vec<u8>,
}

impl<K: Copy + PartialEq> Run<K> {
    /// An empty run.
    pub(super) const fn new() -> Self {
        Run {
            to: None,
            stride: 0,
            count: 0,
            bytes: Vec::new(),
        }
    }

    /// Adds a datagram if it continues this run (same destination, same size, room left);
    /// an empty run takes any datagram, and an empty datagram is a run of its own.
    #[must_use]
    pub(super) fn push(&mut self, to: K, datagram: &[u8]) -> bool {
        if self.count == 0 {
            self.to = Some(to);
            self.stride = datagram.len();
        } else if self.to != Some(to)
            || self.stride == 0
            || datagram.len() != self.stride
            || self.count >= MAX_RUN_DATAGRAMS
            || self.bytes.len() + datagram.len() > MAX_RUN_BYTES
        {
            return false;
        } else if self.count == 1 {
            // A second datagram makes it a batch: room for the largest run at once, so it
            // grows without copying again, while a lone datagram (a DNS query, say) never
            // holds 64 KB.
            self.bytes.reserve_exact(MAX_RUN_BYTES - self.bytes.len());
        }
        self.bytes.extend_from_slice(datagram);
        self.count += 1;
        true
    }

    /// The destination, or `None` while the run is empty.
    pub(super) fn to(&self) -> Option<K> {
        self.to.filter(|_| self.count > 0)
    }

    /// Whether the run holds no datagram.
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sends the run to `to` through `socket` in as few calls as the socket allows, and
    /// counts what went (`up`: towards the target) or the failure.
    ///
    /// # Errors
    ///
    /// The send's error, for the caller's log (already counted).
    pub(super) async fn send<S: std::ops::Deref<Target = tokio::net::UdpSocket>>(
        &self,
        socket: &BatchSocket<S>,
        to: SocketAddr,
        (stats, up): (&UdpStats, bool),
    ) -> std::io::Result<()> {
        let sent = socket.send(&self.bytes, self.stride, to, None).await;
        match &sent {
            Ok(()) => {
                stats.carried_many(Counter::FromTunnel, self.count as u64, self.bytes.len(), up)
            }
            Err(_) => stats.bump(Counter::SendErrors),
        }
        sent
    }

    /// Empties the run and lets its buffer go: a quiet channel holds none.
    pub(super) fn clear(&mut self) {
        self.count = 0;
        self.to = None;
        self.bytes = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_takes_one_destination_and_one_size() {
        let mut run = Run::new();
        assert!(run.is_empty() && run.to().is_none());
        assert!(run.push(7u32, b"abc"));
        assert!(run.push(7, b"def"));
        assert!(!run.push(8, b"ghi"), "another destination starts a new run");
        assert!(!run.push(7, b"ab"), "another size starts a new run");
        assert_eq!(
            (run.to(), run.stride, run.count, &run.bytes[..]),
            (Some(7), 3, 2, &b"abcdef"[..])
        );
        run.clear();
        assert!(run.is_empty() && run.to().is_none() && run.bytes.is_empty());
        assert!(run.push(8, b"ghi"), "a cleared run takes any datagram");
    }

    #[test]
    fn an_empty_datagram_is_a_run_of_its_own() {
        let mut run = Run::new();
        assert!(run.push(1u8, b""));
        assert!(!run.push(1, b""));
        assert_eq!((run.count, run.stride), (1, 0));
    }

    #[test]
    fn a_run_stops_at_the_datagram_and_byte_limits() {
        let mut run = Run::new();
        for _ in 0..MAX_RUN_DATAGRAMS {
            assert!(run.push(1u8, &[0; 10]));
        }
        assert!(
            !run.push(1, &[0; 10]),
            "at most {MAX_RUN_DATAGRAMS} datagrams"
        );

        let mut run = Run::new();
        let big = vec![0; 30_000];
        assert!(run.push(1u8, &big) && run.push(1, &big));
        assert!(!run.push(1, &big), "at most {MAX_RUN_BYTES} bytes");
        assert_eq!(run.bytes.len(), 60_000);
    }

    #[test]
    fn a_lone_datagram_holds_only_its_own_bytes() {
        let mut run = Run::new();
        assert!(run.push(1u8, &[0; 100]));
        assert!(
            run.bytes.capacity() < 1_000,
            "no 64 KB buffer for one datagram"
        );
        assert!(run.push(1, &[0; 100]));
        assert!(
            run.bytes.capacity() >= MAX_RUN_BYTES,
            "a batch gets its room at once"
        );
    }
}
