//! How the TCP transports (plaintext and Noise) carry a session's streams: one data channel
//! (a TCP connection speaking records) per stream, with channels pre-opened by the client.
//!
//! Everything here is private to the TCP transports; code above [`super::link`] only opens,
//! accepts and recycles streams.
//!
//! * **Reverse streams** (the server opens them): the client keeps a pool of idle data
//!   channels at the server ([`ClientPool::serve`]); opening a stream takes one
//!   ([`ServerPool::open_stream`]), so a visitor never waits for a TCP or crypto handshake,
//!   and stages the `StreamOpen` to leave with the visitor's first bytes. When the pool is
//!   empty the server asks for more (`NeedChannels`) and waits.
//! * **Forward streams** (the client opens them): a fresh connection with the
//!   `KIND_DATA_OPEN` preamble and the `StreamOpen` at once ([`ClientPool::open_stream`]).
//! * **"Idle again"**: a stream that ended cleanly in both directions leaves its channel
//!   idle at both ends. The client says so with an empty `Control` record (sent with the
//!   stream's last staged `End`); the server waits for that word before it hands the
//!   channel to another visitor ([`ServerPool::recycle`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use warren_proto::handshake::{KIND_DATA, KIND_DATA_OPEN};
use warren_proto::message::{self, ControlMessage, StreamOpen};

use super::link::{OpenError, Replenish, StreamHandler};
use super::stream::Stream;
use crate::config::HostPort;
use crate::config::proxy::ProxyUrl;
use crate::crypto::keys::SessionKeys;
use crate::crypto::record::RecordKind;
use crate::transport::congestion::TcpCongestion;
use crate::transport::layers::ClientLayers;
use crate::transport::records::Record;
use crate::transport::tcp::{self, Family};
use crate::transport::{Channel, preamble};

/// Idle data channels the server holds per session; extra ones are closed.
const MAX_IDLE_CHANNELS: usize = 64;

/// Data channels the client keeps open and idle at the server, ready for visitors.
pub const POOL_SIZE: usize = 8;

/// Most data channels a client session has opening or idle at once.
pub const MAX_POOLED: usize = 128;

/// How long the server waits for a client's "idle again" after a clean stream.
const IDLE_NOTICE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long sending a stream's last staged record may take when the channel is not reused.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// The server's half of the pool: idle data channels of one session.
pub struct ServerPool {
    /// The session's control queue (to ask for channels).
    control: mpsc::Sender<ControlMessage>,
    cancel: CancellationToken,
    idle_tx: mpsc::Sender<Channel>,
    /// Visitors queue on this lock, so channels go out first come, first served.
    idle_rx: tokio::sync::Mutex<mpsc::Receiver<Channel>>,
}

impl ServerPool {
    /// An empty pool for the session whose control queue is `control`; it stops taking
    /// channels when `cancel` fires.
    pub fn new(control: mpsc::Sender<ControlMessage>, cancel: CancellationToken) -> Self {
        let (idle_tx, idle_rx) = mpsc::channel(MAX_IDLE_CHANNELS);
        ServerPool {
            control,
            cancel,
            idle_tx,
            idle_rx: tokio::sync::Mutex::new(idle_rx),
        }
    }

    /// Adds an idle data channel (fresh, or done with a stream); closes it if the pool is
    /// full or the session is over.
    pub fn add_idle(&self, channel: Channel) {
        if self.cancel.is_cancelled() {
            return;
        }
        if self.idle_tx.try_send(channel).is_err() {
            debug!(
                event = "pool_full",
                "idle data channel pool full; closing the extra channel"
            );
        }
    }

    /// Takes an idle channel (asking the client for more when there is none) and stages
    /// the `StreamOpen` on it.
    pub async fn open_stream(&self, open: &StreamOpen) -> Result<Stream, OpenError> {
        let mut channel = self.take().await?;
        // Staged: it leaves with the visitor's first bytes if they are already there.
        channel
            .writer
            .stage(RecordKind::Control, &message::encode(open))
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        Ok(Stream::tcp(channel))
    }

    async fn take(&self) -> Result<Channel, OpenError> {
        let mut idle = self.idle_rx.lock().await;
        if let Ok(channel) = idle.try_recv() {
            return Ok(channel);
        }
        // Dropped if the queue is full: the waiters already queued have asked.
        let _ = self
            .control
            .try_send(ControlMessage::NeedChannels { count: 1 });
        tokio::select! {
            channel = idle.recv() => channel.ok_or(OpenError::SessionGone),
            () = self.cancel.cancelled() => Err(OpenError::SessionGone),
        }
    }

    /// After a stream that ended cleanly: waits for the client's "idle again" and puts the
    /// channel back. Reuse spares the client a connect and a channel handshake, but only
    /// the client knows its side ended cleanly too; a channel whose client end failed late
    /// answers `Close` or nothing, and is dropped.
    pub async fn recycle(&self, stream: Stream) {
        let Some(mut channel) = stream.into_tcp() else {
            return;
        };
        let idle = matches!(
            tokio::time::timeout(IDLE_NOTICE_TIMEOUT, channel.reader.read()).await,
            Ok(Ok(Some(Record::Control([]))))
        );
        // The notice came with the read buffer; a pooled channel holds none while it waits.
        channel.reader.shrink();
        if idle {
            self.add_idle(channel);
        }
    }
}

/// How a client reaches the server for a new data channel of its session.
pub struct Dialer {
    /// The server as configured (the proxy's target).
    pub server: HostPort,
    /// Where the control channel connected: data channels go to the same address (the
    /// proxy's, when there is one).
    pub addr: SocketAddr,
    /// The proxy every connection goes through, if any.
    pub proxy: Option<ProxyUrl>,
    /// Which address family to try first (with a proxy).
    pub family: Family,
    /// The congestion control of every data channel.
    pub congestion: TcpCongestion,
    /// Deadline for connect and preamble together.
    pub timeout: Duration,
    /// The session's keys (data channels prove they belong to it).
    pub keys: Arc<SessionKeys>,
    /// The transport's TLS and WebSocket layers.
    pub layers: ClientLayers,
}

impl Dialer {
    /// Connects and runs a data channel preamble of `kind`, within the deadline.
    async fn dial(&self, kind: u8) -> Result<Channel, String> {
        let attempt = async {
            let stream = tcp::dial_server(
                &self.server,
                self.proxy.as_ref(),
                Some(self.addr),
                self.timeout,
                (self.family, &self.congestion),
            )
            .await
            .map_err(|e| e.to_string())?;
            let connected = self.layers.wrap(stream).await.map_err(|e| e.to_string())?;
            let keys = self
                .keys
                .bound_to(connected.binding.as_ref())
                .ok_or("the connection lost its TLS layer")?;
            preamble::client_data_channel_of_kind(connected.wire, &keys, kind)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or_else(|_| Err("data channel handshake timed out".into()))
    }
}

/// The client's half of the pool, and how it opens forward streams.
pub struct ClientPool {
    dialer: Dialer,
    /// Bounds channels opening or idle.
    slots: Arc<Semaphore>,
    tasks: TaskTracker,
    /// Fired when idle channels must close (the session ended).
    closed: CancellationToken,
}

impl ClientPool {
    /// A pool that dials with `dialer` and runs its channels on `tasks`.
    pub fn new(dialer: Dialer, tasks: TaskTracker) -> Arc<Self> {
        Arc::new(ClientPool {
            dialer,
            slots: Arc::new(Semaphore::new(MAX_POOLED)),
            tasks,
            closed: CancellationToken::new(),
        })
    }

    /// Opens a forward stream: a fresh data channel whose first record is the open.
    pub async fn open_stream(&self, open: &StreamOpen) -> Result<Stream, OpenError> {
        let attempt = async {
            let mut channel = self.dialer.dial(KIND_DATA_OPEN).await?;
            channel
                .writer
                .send(RecordKind::Control, &message::encode(open))
                .await
                .map_err(|e| e.to_string())?;
            Ok(Stream::tcp(channel))
        };
        tokio::time::timeout(self.dialer.timeout, attempt)
            .await
            .unwrap_or_else(|_| Err("forward channel handshake timed out".into()))
            .map_err(OpenError::Failed)
    }

    /// Starts serving streams the server opens: `count` more pooled channels, each handing
    /// its streams to `handler`.
    pub fn serve<H: StreamHandler>(self: &Arc<Self>, handler: &Arc<H>, count: usize) {
        for _ in 0..count.min(MAX_POOLED) {
            self.spawn_channel(handler);
        }
    }

    /// Closes every idle channel and opens no more.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Opens one more pooled data channel, if the pool has room.
    fn spawn_channel<H: StreamHandler>(self: &Arc<Self>, handler: &Arc<H>) {
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            debug!(
                event = "pool_full",
                "data channel pool at its limit; not opening another"
            );
            return;
        };
        let pool = Arc::clone(self);
        let handler = Arc::clone(handler);
        self.tasks.spawn(async move {
            let channel = tokio::select! {
                () = pool.closed.cancelled() => return,
                channel = pool.dialer.dial(KIND_DATA) => channel,
            };
            match channel {
                Ok(channel) => pool.run_channel(&handler, channel, slot).await,
                Err(error) => {
                    debug!(event = "channel_open_failed", %error, "could not open a data channel");
                }
            }
        });
    }

    /// Opens more channels while fewer than the pool's target are idle or opening.
    fn top_up<H: StreamHandler>(self: &Arc<Self>, handler: &Arc<H>) {
        if MAX_POOLED - self.slots.available_permits() < POOL_SIZE {
            self.spawn_channel(handler);
        }
    }

    /// One data channel for its whole life: idle in the pool (holding `slot` and no
    /// buffers) until the server sends `StreamOpen`, then serving that stream, then idle
    /// again if the stream ended cleanly and the pool has room.
    async fn run_channel<H: StreamHandler>(
        self: &Arc<Self>,
        handler: &Arc<H>,
        mut channel: Channel,
        slot: OwnedSemaphorePermit,
    ) {
        let mut slot = Some(slot);
        loop {
            let open = tokio::select! {
                () = self.closed.cancelled() => return,
                first = channel.reader.read() => match first {
                    Ok(Some(Record::Control(bytes))) => match message::decode_stream_open(bytes) {
                        Ok(open) => open,
                        Err(error) => {
                            warn!(event = "protocol_error", %error, "bad stream open from server");
                            return;
                        }
                    },
                    // The server closed an extra idle channel, or the channel failed.
                    Ok(_) | Err(_) => return,
                },
            };
            drop(slot.take());
            let replenish = {
                let pool = Arc::clone(self);
                let handler = Arc::clone(handler);
                Replenish::new(move || pool.top_up(&handler))
            };
            let Some(reusable) = handler.serve(open, Stream::tcp(channel), replenish).await else {
                return;
            };
            let Some(reusable) = reusable.into_tcp() else {
                return;
            };
            channel = reusable;
            // Back to the pool only if it has room, and only once the server knows: it
            // hands the channel out again only after this "idle again" notice.
            let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
                // The stream's last `End` may still be staged: the server must see it.
                let _ = tokio::time::timeout(FLUSH_TIMEOUT, channel.writer.flush_staged()).await;
                return;
            };
            if channel.writer.send(RecordKind::Control, &[]).await.is_err() {
                return;
            }
            slot = Some(permit);
        }
    }
}
