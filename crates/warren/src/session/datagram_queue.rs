//! The queue between a UDP socket's reader and the writer of a datagram channel, bounded by
//! datagrams *and* by bytes.
//!
//! A reader never waits for the writer (a slow channel must not stall the socket, which
//! serves other flows too): what finds the queue full is dropped and counted. So the queue
//! must hold what a reader reads in one turn of the runtime (batch after batch until its
//! task's budget runs out, ~2,000 datagrams), or it drops datagrams the process has already
//! paid to read while the kernel's socket buffer stands empty. With 512 places, a UDP
//! service whose receiver kept up lost ~35 % of an iperf3 run at its own queue; with this
//! one, 5–10 % (bench/RESULTS.md, session 24). The queue takes over the socket buffer's
//! job, so it holds what the kernel grants a service socket (8 MiB of a 4 MiB request);
//! bounding by count alone would let 64 KB datagrams hold half a gigabyte. tokio's channel
//! allocates its slots as they fill, so an idle queue costs nothing.
//!
//! The same queue carries what a QUIC connection receives to each datagram channel's
//! writer (`T` = [`bytes::Bytes`], see [`super::quic_datagram`]); there the reader is
//! quinn's datagram stream and the writer the channel's sockets (towards the target, or
//! back to the visitors).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::datagram::FlowId;

/// Most datagrams one queue holds.
pub const MAX_QUEUED_DATAGRAMS: usize = 8192;

/// Most datagram bytes one queue holds (~6,000 datagrams of 1,400 bytes).
pub const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// A new queue bounded by [`MAX_QUEUED_DATAGRAMS`] and [`MAX_QUEUED_BYTES`].
pub fn bounded<T: AsRef<[u8]>>() -> (DatagramQueue<T>, QueuedDatagrams<T>) {
    with_bounds(MAX_QUEUED_DATAGRAMS, MAX_QUEUED_BYTES)
}

fn with_bounds<T: AsRef<[u8]>>(
    datagrams: usize,
    bytes: usize,
) -> (DatagramQueue<T>, QueuedDatagrams<T>) {
    let (tx, rx) = mpsc::channel(datagrams);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        DatagramQueue {
            tx,
            queued: Arc::clone(&queued),
            max_bytes: bytes,
        },
        QueuedDatagrams { rx, queued },
    )
}

/// Why a datagram was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue holds its most datagrams or bytes: the datagram is dropped.
    Full,
    /// The writer is gone.
    Closed,
}

/// The reader's end: queues without waiting. Cheap to clone (several readers may feed one
/// channel).
#[derive(Debug)]
pub struct DatagramQueue<T = Vec<u8>> {
    tx: mpsc::Sender<(FlowId, T)>,
    /// Bytes queued and not yet taken, shared with the writer's end.
    queued: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl<T> Clone for DatagramQueue<T> {
    fn clone(&self) -> Self {
        DatagramQueue {
            tx: self.tx.clone(),
            queued: Arc::clone(&self.queued),
            max_bytes: self.max_bytes,
        }
    }
}

impl<T: AsRef<[u8]>> DatagramQueue<T> {
    /// Queues `datagram` of `flow`, or says why not; never waits.
    ///
    /// # Errors
    /// [`Refused::Full`] past either bound, [`Refused::Closed`] once the writer is gone.
    pub fn try_send(&self, flow: FlowId, datagram: T) -> Result<(), Refused> {
        let len = datagram.as_ref().len();
        self.try_send_with(flow, len, || datagram)
    }

    /// Like [`DatagramQueue::try_send`], for a datagram of `len` bytes that `make` makes
    /// only once the queue has a place for it: a datagram that is dropped costs nothing to
    /// make (QUIC's receive side copies some of them, [`super::quic_datagram`]).
    ///
    /// # Errors
    /// As [`DatagramQueue::try_send`].
    pub fn try_send_with(
        &self,
        flow: FlowId,
        len: usize,
        make: impl FnOnce() -> T,
    ) -> Result<(), Refused> {
        // Claim the bytes first: concurrent readers can never together pass the bound.
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > self.max_bytes {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return Err(if self.tx.is_closed() {
                Refused::Closed
            } else {
                Refused::Full
            });
        }
        match self.tx.try_reserve() {
            Ok(place) => {
                let datagram = make();
                debug_assert_eq!(datagram.as_ref().len(), len, "the bytes claimed");
                place.send((flow, datagram));
                Ok(())
            }
            Err(error) => {
                self.queued.fetch_sub(len, Ordering::Relaxed);
                Err(match error {
                    mpsc::error::TrySendError::Full(()) => Refused::Full,
                    mpsc::error::TrySendError::Closed(()) => Refused::Closed,
                })
            }
        }
    }

    /// Whether the writer's end is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Datagrams waiting now.
    pub fn waiting(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// The writer's end.
#[derive(Debug)]
pub struct QueuedDatagrams<T = Vec<u8>> {
    rx: mpsc::Receiver<(FlowId, T)>,
    queued: Arc<AtomicUsize>,
}

impl<T: AsRef<[u8]>> QueuedDatagrams<T> {
    /// The next datagram, waiting for one; `None` once every reader's end is gone.
    ///
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<(FlowId, T)> {
        let taken = self.rx.recv().await;
        self.release(taken)
    }

    /// The next datagram if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<(FlowId, T)> {
        let taken = self.rx.try_recv().ok();
        self.release(taken)
    }

    fn release(&self, taken: Option<(FlowId, T)>) -> Option<(FlowId, T)> {
        if let Some((_, datagram)) = &taken {
            self.queued
                .fetch_sub(datagram.as_ref().len(), Ordering::Relaxed);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_bound_refuses_what_would_pass_it_and_frees_what_is_taken() {
        let (queue, mut queued) = with_bounds(100, 3000);
        assert_eq!(queue.try_send(1, vec![1; 1400]), Ok(()));
        assert_eq!(queue.try_send(2, vec![2; 1400]), Ok(()));
        assert_eq!(queue.try_send(3, vec![3; 1400]), Err(Refused::Full));
        // A smaller one still fits, exactly up to the bound.
        assert_eq!(queue.try_send(4, vec![4; 200]), Ok(()));
        assert_eq!(queue.try_send(5, vec![5; 1]), Err(Refused::Full));
        assert_eq!(queued.try_recv(), Some((1, vec![1; 1400])));
        assert_eq!(queue.try_send(6, vec![6; 1400]), Ok(()));
        let order: Vec<FlowId> = std::iter::from_fn(|| queued.try_recv())
            .map(|(flow, _)| flow)
            .collect();
        assert_eq!(order, [2, 4, 6]);
        assert_eq!(queued.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_datagram_the_queue_refuses_is_never_made() {
        let (queue, mut queued) = with_bounds(2, 3000);
        let made = std::cell::Cell::new(0);
        let make = |byte: u8| {
            made.set(made.get() + 1);
            vec![byte; 1400]
        };
        assert_eq!(queue.try_send_with(1, 1400, || make(1)), Ok(()));
        assert_eq!(queue.try_send_with(2, 1400, || make(2)), Ok(()));
        // Past the count bound, and past the byte bound: refused before it is made.
        assert_eq!(queue.try_send_with(3, 100, || make(3)), Err(Refused::Full));
        assert_eq!(queued.try_recv(), Some((1, vec![1; 1400])));
        assert_eq!(queue.try_send_with(4, 1601, || make(4)), Err(Refused::Full));
        assert_eq!(made.get(), 2);
        assert_eq!(queued.try_recv(), Some((2, vec![2; 1400])));
        assert_eq!(queued.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_count_bound_holds_for_empty_datagrams() {
        let (queue, mut queued) = with_bounds(2, 1 << 20);
        assert_eq!(queue.try_send(1, Vec::new()), Ok(()));
        assert_eq!(queue.try_send(2, Vec::new()), Ok(()));
        assert_eq!(queue.try_send(3, Vec::new()), Err(Refused::Full));
        assert_eq!(queued.try_recv(), Some((1, Vec::new())));
        assert_eq!(queue.try_send(3, Vec::new()), Ok(()));
    }

    #[tokio::test]
    async fn a_closed_writer_is_told_apart_from_a_full_queue() {
        let (queue, queued) = with_bounds(1, 10);
        assert_eq!(queue.try_send(1, vec![0; 10]), Ok(()));
        assert_eq!(queue.try_send(2, vec![0; 1]), Err(Refused::Full));
        drop(queued);
        assert!(queue.is_closed());
        assert_eq!(queue.try_send(3, vec![0; 1]), Err(Refused::Closed));
        assert_eq!(queue.try_send(4, vec![0; 100]), Err(Refused::Closed));
    }

    #[tokio::test]
    async fn recv_ends_when_every_reader_is_gone() {
        let (queue, mut queued) = with_bounds(4, 100);
        let second = queue.clone();
        assert_eq!(second.try_send(7, vec![7; 3]), Ok(()));
        drop(queue);
        drop(second);
        assert_eq!(queued.recv().await, Some((7, vec![7; 3])));
        assert_eq!(queued.recv().await, None);
    }
}
