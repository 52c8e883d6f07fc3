//! One UDP socket shared by the connectivity checks and QUIC.
//!
//! [`DemuxSocket`] is a `quinn::AsyncUdpSocket` around one UDP socket. quinn's endpoint
//! driver reads it as usual; each datagram is sorted on its first byte (RFC 7983, RFC 9443):
//! QUIC (64–255: the fixed bit is set, since [`endpoint`] turns greasing it off) goes to quinn, STUN (0–3) to a bounded queue read through
//! [`StunChannel`], anything else is dropped and counted. The checker sends its STUN
//! messages on the same socket, so the NAT mapping the checks open is the one QUIC uses.
//!
//! Reading happens only while a quinn endpoint made on the socket is alive (its driver is
//! the reader): make the endpoint first ([`endpoint`]), then check, then connect.
//!
//! **Moving a connection between paths** ([`DemuxSocket::anchor`],
//! [`DemuxSocket::send_via`]): a tunnel's QUIC connection keeps talking to the address it
//! was made with (its *anchor*: the server's relay, or the peer's address when the checks
//! won first), and this socket carries its packets on whichever path works now
//! underneath: outgoing packets for the anchor go to the current path, incoming QUIC
//! packets from anywhere are handed to quinn as if the anchor had sent them. QUIC is
//! encrypted and authenticated end to end, so the path under it may change (relayed to
//! direct, direct back to the relay when the direct path dies, a peer whose NAT gave it
//! a new port) without quinn knowing, and no stream notices (what iroh's magic socket does
//! with its relays). Each peer socket carries one connection, so every QUIC packet it
//! receives belongs to that connection; a forged one fails its AEAD check in quinn like
//! any other.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll, ready};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime, UdpPoller};
use tokio::sync::mpsc;
use warren_proto::stun::{Demux, classify};

use super::StunIo;

/// STUN datagrams waiting for the checker. Checks arrive at most every ~25 ms per peer
/// candidate; 256 covers seconds of them, and a full queue drops (the peer repeats).
pub const STUN_QUEUE: usize = 256;

/// Counters of what the socket sorted.
#[derive(Debug, Default)]
pub struct DemuxStats {
    /// STUN datagrams queued for the checker.
    pub stun: AtomicU64,
    /// STUN datagrams dropped because the queue was full or closed.
    pub stun_dropped: AtomicU64,
    /// Datagrams that were neither STUN nor QUIC, dropped.
    pub other_dropped: AtomicU64,
}

/// A UDP socket whose STUN datagrams go to a [`StunChannel`] and whose QUIC datagrams go
/// to quinn.
pub struct DemuxSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    stun: mpsc::Sender<(Vec<u8>, SocketAddr)>,
    stats: Arc<DemuxStats>,
    detour: Detour,
}

/// A connection's packets on whichever path works now (see the module's doc).
#[derive(Debug, Default)]
struct Detour {
    /// Set once [`DemuxSocket::anchor`] was called: the hot path reads only this for a
    /// connection that is not anchored (a transfer's).
    armed: AtomicBool,
    paths: RwLock<Paths>,
}

/// The address quinn talks to and the one its packets go to now.
#[derive(Debug, Default, Clone, Copy)]
struct Paths {
    anchor: Option<SocketAddr>,
    path: Option<SocketAddr>,
}

impl Detour {
    fn paths(&self) -> Option<Paths> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        Some(*self.paths.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn update(&self, change: impl FnOnce(&mut Paths)) {
        change(&mut self.paths.write().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The checker's end of a [`DemuxSocket`]: STUN datagrams in, STUN datagrams out.
pub struct StunChannel {
    socket: Arc<DemuxSocket>,
    rx: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
}

impl DemuxSocket {
    /// Binds a UDP socket on `addr` (port 0 for any) and wraps it.
    ///
    /// # Errors
    ///
    /// The address cannot be bound (in use, or not an address of this host).
    pub fn bind(addr: SocketAddr) -> io::Result<(Arc<Self>, StunChannel)> {
        let socket = std::net::UdpSocket::bind(addr)?;
        Self::wrap(socket)
    }

    /// Wraps a bound UDP socket.
    ///
    /// # Errors
    ///
    /// quinn cannot set the socket up (options refused by the system).
    pub fn wrap(socket: std::net::UdpSocket) -> io::Result<(Arc<Self>, StunChannel)> {
        Ok(Self::over(quinn::TokioRuntime.wrap_udp_socket(socket)?))
    }

    /// Wraps any quinn socket: a relay leg over TCP ([`super::tcp_leg::PipeSocket`]), a
    /// scripted one in tests.
    pub fn over(inner: Arc<dyn AsyncUdpSocket>) -> (Arc<Self>, StunChannel) {
        let (tx, rx) = mpsc::channel(STUN_QUEUE);
        let socket = Arc::new(Self {
            inner,
            stun: tx,
            stats: Arc::default(),
            detour: Detour::default(),
        });
        let channel = StunChannel {
            socket: socket.clone(),
            rx,
        };
        (socket, channel)
    }

    /// The socket's connection talks to `anchor` from now on, and its packets go there
    /// until [`DemuxSocket::send_via`] names another path: QUIC packets from any address
    /// are handed to quinn as the anchor's (the peer may move first).
    pub fn anchor(&self, anchor: SocketAddr) {
        self.detour.update(|paths| {
            *paths = Paths {
                anchor: Some(anchor),
                path: Some(anchor),
            }
        });
        self.detour.armed.store(true, Ordering::Release);
    }

    /// Sends the anchored connection's packets to `path` from now on (the peer's direct
    /// address, or the relay's).
    pub fn send_via(&self, path: SocketAddr) {
        self.detour.update(|paths| paths.path = Some(path));
    }

    /// Where the anchored connection's packets go now.
    pub fn path(&self) -> Option<SocketAddr> {
        self.detour.paths().and_then(|paths| paths.path)
    }

    /// What the socket sorted so far.
    pub fn stats(&self) -> &DemuxStats {
        &self.stats
    }

    /// The bound address.
    ///
    /// # Errors
    ///
    /// The system's error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Sends one STUN datagram without waiting (a full buffer drops it).
    ///
    /// # Errors
    ///
    /// The socket's error other than "would block".
    pub fn send_stun(&self, packet: &[u8], to: SocketAddr) -> io::Result<()> {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents: packet,
            segment_size: None,
            src_ip: None,
        };
        match self.inner.try_send(&transmit) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// Waits until the socket can take a datagram (see [`StunIo::writable`]).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn writable(&self) -> io::Result<()> {
        let mut poller = Arc::clone(&self.inner).create_io_poller();
        std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)).await
    }

    /// Queues a STUN datagram for the checker, or counts it dropped.
    fn forward_stun(&self, datagram: &[u8], from: SocketAddr) {
        match self.stun.try_send((datagram.to_vec(), from)) {
            Ok(()) => self.stats.stun.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.stun_dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

impl fmt::Debug for DemuxSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemuxSocket")
            .field("local", &self.inner.local_addr().ok())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for DemuxSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        if let Some(Paths {
            anchor: Some(anchor),
            path: Some(path),
        }) = self.detour.paths()
            && transmit.destination == anchor
            && path != anchor
        {
            return self.inner.try_send(&Transmit {
                destination: path,
                ecn: transmit.ecn,
                contents: transmit.contents,
                segment_size: transmit.segment_size,
                src_ip: transmit.src_ip,
            });
        }
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // Until quinn gets at least one QUIC datagram or the socket has nothing more: a
        // batch of only STUN must not look like "0 datagrams" to quinn.
        loop {
            let count = match ready!(self.inner.poll_recv(cx, bufs, meta)) {
                Ok(count) => count,
                // ICMP errors from checks to dead candidates may surface here; they must
                // not end quinn's endpoint (quinn itself skips only ECONNRESET).
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            };
            let anchor = self.detour.paths().and_then(|paths| paths.anchor);
            let mut kept = 0;
            for i in 0..count {
                let m = meta[i];
                let Some(datagram) = bufs[i].get(..m.len) else {
                    continue;
                };
                match classify(datagram) {
                    Demux::Quic => {
                        if let Some(anchor) = anchor {
                            // The peer's packets on whichever path, for the anchored
                            // connection.
                            meta[i].addr = anchor;
                        }
                        let m = meta[i];
                        if kept != i {
                            // Compact: move this datagram down to the next free slot.
                            let (head, tail) = bufs.split_at_mut(i);
                            let Some(dst) = head[kept].get_mut(..m.len) else {
                                self.stats.other_dropped.fetch_add(1, Ordering::Relaxed);
                                continue;
                            };
                            dst.copy_from_slice(&tail[0][..m.len]);
                            meta[kept] = m;
                        }
                        kept += 1;
                    }
                    Demux::Stun => {
                        // With GRO one slot may hold several datagrams of one size from
                        // one source, `stride` bytes apart.
                        for segment in datagram.chunks(m.stride.max(1)) {
                            if classify(segment) == Demux::Stun {
                                self.forward_stun(segment, m.addr);
                            } else {
                                self.stats.other_dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Demux::Other => {
                        self.stats.other_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if kept > 0 {
                return Poll::Ready(Ok(kept));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

impl StunChannel {
    /// The shared socket.
    pub fn socket(&self) -> &Arc<DemuxSocket> {
        &self.socket
    }
}

impl StunIo for StunChannel {
    fn send_to(&self, packet: &[u8], to: SocketAddr) -> io::Result<()> {
        self.socket.send_stun(packet, to)
    }

    async fn writable(&self) -> io::Result<()> {
        self.socket.writable().await
    }

    async fn recv_from(&mut self) -> io::Result<(Vec<u8>, SocketAddr)> {
        self.rx.recv().await.ok_or_else(|| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the shared UDP socket is closed")
        })
    }
}

/// A quinn endpoint on the shared socket (a server too if `server` is given), with
/// quinn's default endpoint settings except that the QUIC bit is never greased (RFC 9287
/// §3.1: a cleared fixed bit could make a QUIC packet look like STUN). Its driver is what
/// reads the socket.
///
/// # Errors
///
/// quinn refuses the socket.
pub fn endpoint(
    socket: Arc<DemuxSocket>,
    server: Option<quinn::ServerConfig>,
) -> io::Result<quinn::Endpoint> {
    endpoint_with(socket, server, quinn::EndpointConfig::default())
}

/// As [`endpoint`], with the caller's endpoint settings (the largest UDP payload, from
/// `QuicSettings::endpoint_config`); the QUIC bit is never greased whatever `config` says.
///
/// # Errors
///
/// quinn refuses the socket.
pub fn endpoint_with(
    socket: Arc<DemuxSocket>,
    server: Option<quinn::ServerConfig>,
    mut config: quinn::EndpointConfig,
) -> io::Result<quinn::Endpoint> {
    config.grease_quic_bit(false);
    quinn::Endpoint::new_with_abstract_socket(config, server, socket, Arc::new(quinn::TokioRuntime))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::task::Waker;
    use std::time::Duration;

    use super::*;

    /// A quinn socket that returns one scripted batch of datagrams (from 192.0.2.7:9),
    /// then nothing, and records where it was asked to send.
    #[derive(Debug, Default)]
    struct Scripted(Mutex<Vec<Vec<u8>>>, Mutex<Vec<SocketAddr>>);

    impl AsyncUdpSocket for Scripted {
        fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
            unimplemented!("not used by the test")
        }
        fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
            self.1.lock().unwrap().push(transmit.destination);
            Ok(())
        }
        fn poll_recv(
            &self,
            _: &mut Context,
            bufs: &mut [IoSliceMut<'_>],
            meta: &mut [RecvMeta],
        ) -> Poll<io::Result<usize>> {
            let batch = std::mem::take(&mut *self.0.lock().unwrap());
            if batch.is_empty() {
                return Poll::Pending;
            }
            for (i, d) in batch.iter().enumerate() {
                bufs[i][..d.len()].copy_from_slice(d);
                meta[i] = RecvMeta {
                    addr: "192.0.2.7:9".parse().unwrap(),
                    len: d.len(),
                    stride: d.len(),
                    ..RecvMeta::default()
                };
            }
            Poll::Ready(Ok(batch.len()))
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok("127.0.0.1:1".parse().unwrap())
        }
    }

    #[tokio::test]
    async fn a_mixed_batch_is_sorted_and_quic_compacted() {
        let mut stun = Vec::new();
        warren_proto::stun::Message::request([1; 12]).encode(&mut stun);
        let batch = vec![
            stun.clone(),
            vec![0xc3, 1, 1],
            vec![20, 2],
            stun.clone(),
            vec![0x41, 3, 3, 3],
        ];
        let (socket, mut channel) =
            DemuxSocket::over(Arc::new(Scripted(Mutex::new(batch), Mutex::default())));
        let mut storage = vec![[0u8; 64]; 5];
        let mut bufs: Vec<IoSliceMut> = storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let mut meta = vec![RecvMeta::default(); 5];
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Ok(count)) = socket.poll_recv(&mut cx, &mut bufs, &mut meta) else {
            panic!("the QUIC datagrams are delivered");
        };
        assert_eq!(count, 2);
        assert_eq!(&bufs[0][..meta[0].len], &[0xc3, 1, 1]);
        assert_eq!(&bufs[1][..meta[1].len], &[0x41, 3, 3, 3]);
        assert_eq!(socket.stats().stun.load(Ordering::Relaxed), 2);
        assert_eq!(socket.stats().other_dropped.load(Ordering::Relaxed), 1);
        let (got, from) = channel.recv_from().await.unwrap();
        assert_eq!((got, from.port()), (stun, 9));
        // A batch of only STUN or junk is not "0 datagrams" to quinn: it waits for more.
        assert!(socket.poll_recv(&mut cx, &mut bufs, &mut meta).is_pending());
    }

    #[test]
    fn an_anchored_connection_moves_between_paths_underneath() {
        let (relay, direct, moved) = (
            "203.0.113.1:7000".parse::<SocketAddr>().unwrap(),
            "192.0.2.7:9".parse::<SocketAddr>().unwrap(),
            "192.0.2.7:10".parse::<SocketAddr>().unwrap(),
        );
        let inner = Arc::new(Scripted(Mutex::new(vec![vec![0xc3, 1]]), Mutex::default()));
        let (socket, _channel) = DemuxSocket::over(inner.clone());
        let send = |to| {
            socket
                .try_send(&Transmit {
                    destination: to,
                    ecn: None,
                    contents: &[0x41],
                    segment_size: None,
                    src_ip: None,
                })
                .unwrap()
        };
        // Not anchored: nothing changes.
        send(relay);
        assert_eq!(socket.path(), None);
        socket.anchor(relay);
        send(relay);
        socket.send_via(direct);
        send(relay);
        // Another destination (a check's, say) is left alone.
        send("198.51.100.2:1".parse().unwrap());
        // The peer's NAT gave it a new port, then the direct path died: back to the relay.
        socket.send_via(moved);
        send(relay);
        socket.send_via(relay);
        send(relay);
        assert_eq!(
            *inner.1.lock().unwrap(),
            [
                relay,
                relay,
                direct,
                "198.51.100.2:1".parse().unwrap(),
                moved,
                relay
            ]
        );
        assert_eq!(socket.path(), Some(relay));
        // The peer's packet from its direct address reaches quinn as the anchor's.
        let mut storage = [0u8; 64];
        let mut bufs = [IoSliceMut::new(&mut storage)];
        let mut meta = [RecvMeta::default()];
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Ok(1)) = socket.poll_recv(&mut cx, &mut bufs, &mut meta) else {
            panic!("the QUIC datagram is delivered");
        };
        assert_eq!(meta[0].addr, relay);
    }

    /// A socket made a moment ago: tokio has not seen it writable yet, and `send_to` alone
    /// would drop the datagram (it does here, on the test's one-thread runtime, without
    /// the wait). Address discovery waits first, so its first request leaves at once.
    #[tokio::test]
    async fn the_first_request_of_a_new_socket_leaves_once_writable() {
        let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (_socket, channel) = DemuxSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        channel.writable().await.unwrap();
        channel
            .send_to(b"\x00\x01first", peer.local_addr().unwrap())
            .unwrap();
        let mut buf = [0u8; 64];
        let (len, _) = tokio::time::timeout(Duration::from_secs(5), peer.recv_from(&mut buf))
            .await
            .expect("the first datagram arrives")
            .unwrap();
        assert_eq!(&buf[..len], b"\x00\x01first");
    }
}
