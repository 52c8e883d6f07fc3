//! UDP services over QUIC: a datagram channel is a QUIC stream (opened with its
//! `StreamOpen`, closed by finishing or resetting it) whose datagrams travel as real QUIC
//! datagrams, tagged with the stream's id and the visitor's flow
//! ([`warren_proto::fragment`] has the frame format, and splits what does not fit).
//!
//! One [`Datagrams`] per connection reads every QUIC datagram (one task, started with the
//! first channel), puts fragmented ones back together, and hands each to its channel's
//! bounded queue without ever waiting: a full queue drops the datagram (counted), as a
//! busy UDP socket would. The queue is the one between a service socket's reader and its
//! channel ([`datagram_queue`]: 8,192 datagrams or 8 MiB), so a
//! writer towards the target that falls behind for a moment (its thread waiting for a
//! core) loses nothing: with 1,024 places, a 1 Gbit/s iperf3 stream through `warren-quic`
//! lost 0–4 % here (median 0.9 % of 13 runs), with this queue nothing in 8 runs
//! (bench/RESULTS.md, session 26).
//!
//! A received datagram is a slice of the buffer quinn read its whole GRO batch into (up to
//! 64 KiB), and keeps all of it alive while it waits. So only the first [`SHARED_MAX`]
//! waiting datagrams of a channel are slices; one that finds more waiting is copied into a
//! buffer of its own. A full queue then holds at most 16 MiB of quinn's buffers and 8 MiB
//! of copies (a queue of 1,024 slices could hold 64 MiB of buffers), and a writer that
//! keeps up never pays for a copy.
//!
//! Datagrams that arrive for a channel the session has not registered yet (its
//! `StreamOpen` and its first datagram raced, and the datagram won) wait a short while in
//! a small bounded table instead of being lost.
//!
//! Sending waits for room in quinn's datagram send buffer (`send_datagram_wait`), so a
//! sender faster than the path is slowed down where the relay counts its drops, instead of
//! quinn silently dropping the oldest datagrams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;
use warren_proto::fragment::{FlowKey, Fragmenter, Reassembler, ReassemblyLimits};

use super::datagram::{DatagramError, FlowId, MAX_DATAGRAM_LEN};
use super::datagram_queue::{self, DatagramQueue, QueuedDatagrams};

/// Datagrams of one channel that may wait as slices of quinn's receive buffers (at most
/// 64 KiB each); those that arrive when more are waiting are copied out.
const SHARED_MAX: usize = 256;

/// Channels whose datagrams may wait for their registration at once.
const EARLY_CHANNELS: usize = 32;

/// Datagrams that may wait for one unregistered channel.
const EARLY_PER_CHANNEL: usize = 64;

/// How long early datagrams wait for their channel.
const EARLY_MAX_AGE: Duration = Duration::from_secs(2);

/// One received datagram: its flow and bytes.
pub type Received = (FlowId, Bytes);

/// The datagram side of one QUIC connection, shared by its channels.
pub struct Datagrams {
    connection: quinn::Connection,
    routes: Mutex<Routes>,
    fragmenter: Mutex<Fragmenter>,
    tasks: TaskTracker,
    /// Stops the reader task.
    closed: CancellationToken,
}

#[derive(Default)]
struct Routes {
    /// Registered channels.
    channels: HashMap<u32, DatagramQueue<Bytes>>,
    /// Datagrams of channels not registered yet, with when the first arrived.
    early: HashMap<u32, (Instant, Vec<Received>)>,
    /// Whether the reader task runs.
    reading: bool,
    /// Datagrams dropped: a full channel queue, or no channel within the wait.
    dropped: u64,
}

impl Datagrams {
    /// The datagram side of `connection`; its reader runs on `tasks` until `closed`.
    pub fn new(connection: quinn::Connection, tasks: TaskTracker) -> Arc<Self> {
        Arc::new(Datagrams {
            connection,
            routes: Mutex::new(Routes::default()),
            fragmenter: Mutex::new(Fragmenter::new(rand::random())),
            tasks,
            closed: CancellationToken::new(),
        })
    }

    /// Stops reading datagrams (the connection goes away).
    pub fn close(&self) {
        self.closed.cancel();
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts receiving the datagrams of `channel`, with any that arrived before.
    pub fn register(self: &Arc<Self>, channel: u32) -> QueuedDatagrams<Bytes> {
        let (tx, rx) = datagram_queue::bounded();
        let start = {
            let mut routes = self.routes();
            if let Some((_, early)) = routes.early.remove(&channel) {
                for (flow, payload) in early {
                    let _ = tx.try_send(flow, payload);
                }
            }
            routes.channels.insert(channel, tx);
            !std::mem::replace(&mut routes.reading, true)
        };
        if start {
            let this = Arc::clone(self);
            self.tasks.spawn(async move { this.read_loop().await });
        }
        rx
    }

    /// Stops routing datagrams to `channel`.
    pub fn unregister(&self, channel: u32) {
        self.routes().channels.remove(&channel);
    }

    /// Sends one visitor datagram of `flow` on `channel`, split if it does not fit in one
    /// QUIC datagram.
    ///
    /// # Errors
    /// [`DatagramError::TooLarge`] above the UDP maximum (nothing sent);
    /// [`DatagramError::Quic`] when the connection is gone or takes no datagrams.
    pub async fn send(
        &self,
        channel: u32,
        flow: FlowId,
        bytes: &[u8],
    ) -> Result<(), DatagramError> {
        if bytes.len() > MAX_DATAGRAM_LEN {
            return Err(DatagramError::TooLarge { len: bytes.len() });
        }
        let key = FlowKey { channel, flow };
        // The lock only numbers the packet; the frames are made one by one as they go.
        let frames = self
            .fragmenter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .split(key, bytes, self.connection.max_datagram_size())
            .map_err(|e| DatagramError::Quic(e.to_string()))?;
        for frame in frames {
            match self.connection.send_datagram_wait(Bytes::from(frame)).await {
                Ok(()) => {}
                // The path's datagram size shrank under us: this one is lost, as UDP
                // would lose it; the next split uses the new size.
                Err(quinn::SendDatagramError::TooLarge) => {
                    self.routes().dropped += 1;
                    return Ok(());
                }
                Err(error) => return Err(DatagramError::Quic(error.to_string())),
            }
        }
        Ok(())
    }

    /// Reads every datagram of the connection and routes it, until the connection ends.
    async fn read_loop(self: Arc<Self>) {
        let mut reassembler = Reassembler::new(ReassemblyLimits::default());
        loop {
            let wake = reassembler.poll_timeout().map(Instant::from_std);
            let received = tokio::select! {
                () = self.closed.cancelled() => return,
                () = sleep_until(wake) => {
                    reassembler.handle_timeout(Instant::now().into_std());
                    continue;
                }
                received = self.connection.read_datagram() => received,
            };
            let bytes = match received {
                Ok(bytes) => bytes,
                Err(error) => {
                    debug!(event = "quic_datagrams_ended", %error, "the connection's datagrams ended");
                    return;
                }
            };
            let Some(delivery) = reassembler.handle_datagram(Instant::now().into_std(), &bytes)
            else {
                continue;
            };
            let payload = match delivery.payload {
                std::borrow::Cow::Borrowed(slice) => bytes.slice_ref(slice),
                std::borrow::Cow::Owned(vec) => Bytes::from(vec),
            };
            self.route(delivery.key, payload);
        }
    }

    /// Hands one datagram to its channel, or keeps it a while for a channel still opening.
    fn route(&self, key: FlowKey, payload: Bytes) {
        let mut routes = self.routes();
        if let Some(tx) = routes.channels.get(&key.channel) {
            let (len, shared) = (payload.len(), tx.waiting() < SHARED_MAX);
            let make = move || {
                if shared {
                    payload
                } else {
                    Bytes::copy_from_slice(&payload)
                }
            };
            if tx.try_send_with(key.flow, len, make).is_err() {
                routes.dropped += 1;
            }
            return;
        }
        let datagram = (key.flow, payload);
        let now = Instant::now();
        let before = routes.early.len();
        routes
            .early
            .retain(|_, (since, _)| now.duration_since(*since) < EARLY_MAX_AGE);
        let expired = before - routes.early.len();
        routes.dropped += expired as u64;
        if !routes.early.contains_key(&key.channel) && routes.early.len() >= EARLY_CHANNELS {
            routes.dropped += 1;
            return;
        }
        let (_, waiting) = routes
            .early
            .entry(key.channel)
            .or_insert_with(|| (now, Vec::new()));
        if waiting.len() < EARLY_PER_CHANNEL {
            waiting.push(datagram);
        } else {
            routes.dropped += 1;
        }
    }

    /// Datagrams dropped so far (full queues, no channel, a shrunken path).
    pub fn dropped(&self) -> u64 {
        self.routes().dropped
    }
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
