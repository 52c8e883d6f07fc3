//! The relay over TCP: for a peer whose UDP is blocked entirely, one leg of a relayed
//! transfer rides its authenticated session with the server (the usual TCP or Noise
//! connection) as [`ControlMessage::P2pDatagram`]s instead of UDP datagrams.
//!
//! Both ends pretend the session is a UDP path, so nothing above them changes:
//! * on the server, [`TcpLegs`] gives each such session a made-up address in the
//!   discard-only prefix `100::/64` (RFC 6666: never routed, so a datagram sent there by
//!   mistake goes nowhere) and the relay loop treats it as any other leg: the same signed
//!   binds, pairing, caps and forwarding. What the relay sends to such an address goes
//!   down the session instead of the UDP socket;
//! * on the peer, [`PipeSocket`] is a `quinn::AsyncUdpSocket` whose datagrams go up and
//!   come down the session, all from and to the relay's UDP address, so the relay join
//!   and QUIC run on it unchanged (wrapped in the usual [`super::demux::DemuxSocket`]).
//!
//! Datagram semantics are kept on purpose: a full queue drops (QUIC's loss recovery and
//! congestion control see loss, as on UDP) instead of blocking the session, which also
//! carries heartbeats.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warren_proto::handshake::SessionId;
use warren_proto::message::{ControlMessage, MAX_P2P_DATAGRAM};

use crate::session::stream::Stream;
use crate::session::{self as control};

/// Sessions that may be relay legs at once.
pub const MAX_TCP_LEGS: usize = 1024;
/// Datagrams from all TCP legs waiting for the relay loop.
pub const INBOUND_QUEUE: usize = 1024;
/// Datagrams waiting in each direction of a [`PipeSocket`].
const PIPE_QUEUE: usize = 512;

/// The server's side: which sessions are relay legs, under which made-up address.
pub struct TcpLegs {
    table: Mutex<Table>,
    inbound: mpsc::Sender<(SocketAddr, Vec<u8>)>,
    next: AtomicU64,
}

#[derive(Default)]
struct Table {
    by_addr: HashMap<SocketAddr, mpsc::Sender<ControlMessage>>,
    by_session: HashMap<SessionId, SocketAddr>,
}

impl fmt::Debug for TcpLegs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpLegs").finish_non_exhaustive()
    }
}

impl TcpLegs {
    /// The registry and the receiving end of its inbound queue (the relay loop's).
    pub fn new() -> (Arc<TcpLegs>, mpsc::Receiver<(SocketAddr, Vec<u8>)>) {
        let (inbound, rx) = mpsc::channel(INBOUND_QUEUE);
        let legs = TcpLegs {
            table: Mutex::new(Table::default()),
            inbound,
            next: AtomicU64::new(1),
        };
        (Arc::new(legs), rx)
    }

    /// A datagram a session sent up: queued for the relay loop under the session's
    /// address (given on its first datagram). Dropped when the queue or the table is full.
    pub fn from_session(
        &self,
        session: SessionId,
        to_session: &mpsc::Sender<ControlMessage>,
        bytes: Vec<u8>,
    ) {
        let addr = {
            let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            match table.by_session.get(&session) {
                Some(addr) => *addr,
                None if table.by_session.len() >= MAX_TCP_LEGS => return,
                None => {
                    let n = self.next.fetch_add(1, Ordering::Relaxed);
                    let addr = leg_addr(n);
                    table.by_session.insert(session, addr);
                    table.by_addr.insert(addr, to_session.clone());
                    addr
                }
            }
        };
        let _ = self.inbound.try_send((addr, bytes));
    }

    /// Sends `datagram` down the session behind `to` if `to` is a TCP leg; `false` when it
    /// is not (the caller sends it by UDP). A full session queue drops it.
    pub fn send_to(&self, to: SocketAddr, datagram: &[u8]) -> bool {
        if !is_leg_addr(to) {
            return false;
        }
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = table.by_addr.get(&to) {
            let _ = session.try_send(ControlMessage::P2pDatagram {
                bytes: datagram.to_vec(),
            });
        }
        true
    }

    /// The session ended: its leg is gone (the relay forgets the pair when it idles).
    pub fn session_ended(&self, session: &SessionId) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(addr) = table.by_session.remove(session) {
            table.by_addr.remove(&addr);
        }
    }
}

/// The made-up address of the `n`th TCP leg: `[100::n]:port`.
fn leg_addr(n: u64) -> SocketAddr {
    let [a, b, c, d] = [
        (n >> 48) as u16,
        (n >> 32) as u16,
        (n >> 16) as u16,
        n as u16,
    ];
    SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0x100, 0, 0, 0, a, b, c, d)), 1)
}

fn is_leg_addr(addr: SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V6(ip) => ip.segments()[..4] == [0x100, 0, 0, 0],
        IpAddr::V4(_) => false,
    }
}

/// The peer's side: a UDP-like socket over its session with the server. Every datagram
/// goes to the relay and every datagram comes from it, whatever the address says.
pub struct PipeSocket {
    up: mpsc::Sender<Vec<u8>>,
    down: Mutex<mpsc::Receiver<Vec<u8>>>,
    relay: SocketAddr,
    local: SocketAddr,
    /// Ends the pump when the socket is dropped.
    _stop: tokio_util::sync::DropGuard,
}

impl fmt::Debug for PipeSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipeSocket")
            .field("relay", &self.relay)
            .finish_non_exhaustive()
    }
}

impl PipeSocket {
    /// Turns an established probe session into a pipe to the relay at `relay` (the
    /// address QUIC and the relay join will use; datagrams "come from" it). `local` is
    /// what the socket reports as its own address.
    pub fn new(channel: Stream, relay: SocketAddr, local: SocketAddr) -> Arc<PipeSocket> {
        let (up, up_rx) = mpsc::channel(PIPE_QUEUE);
        let (down_tx, down) = mpsc::channel(PIPE_QUEUE);
        let stop = CancellationToken::new();
        tokio::spawn(pump(channel, up_rx, down_tx, stop.clone()));
        Arc::new(PipeSocket {
            up,
            down: Mutex::new(down),
            relay,
            local,
            _stop: stop.drop_guard(),
        })
    }
}

/// Moves datagrams between the socket's queues and the session until either ends.
async fn pump(
    mut channel: Stream,
    mut up: mpsc::Receiver<Vec<u8>>,
    down: mpsc::Sender<Vec<u8>>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            datagram = up.recv() => {
                let Some(bytes) = datagram else { break };
                if control::send_control(&mut channel, &ControlMessage::P2pDatagram { bytes })
                    .await
                    .is_err()
                {
                    return;
                }
            }
            message = control::recv_control(&mut channel) => match message {
                Ok(ControlMessage::P2pDatagram { bytes }) => {
                    let _ = down.try_send(bytes);
                }
                Ok(ControlMessage::Ping { seq }) => {
                    if control::send_control(&mut channel, &ControlMessage::Pong { seq })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(ControlMessage::Goodbye { .. }) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
    crate::client::establish::goodbye(channel, "the relayed transfer is over").await;
}

/// quinn polls this before sending again after a `WouldBlock`; [`PipeSocket::try_send`]
/// never says that (a full queue drops, as UDP does), so it is always writable.
#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for PipeSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        // One datagram per transmit: `max_transmit_segments` is 1, so quinn never batches.
        if transmit.contents.len() > MAX_P2P_DATAGRAM {
            return Ok(());
        }
        match self.up.try_send(transmit.contents.to_vec()) {
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the session carrying the relayed transfer ended",
            )),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        let mut count = 0;
        while count < bufs.len().min(meta.len()) {
            let datagram = if count == 0 {
                match down.poll_recv(cx) {
                    Poll::Ready(Some(d)) => d,
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            "the session carrying the relayed transfer ended",
                        )));
                    }
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                match down.try_recv() {
                    Ok(d) => d,
                    Err(_) => break,
                }
            };
            let len = datagram.len().min(bufs[count].len());
            bufs[count][..len].copy_from_slice(&datagram[..len]);
            meta[count] = RecvMeta {
                addr: self.relay,
                len,
                stride: len,
                ecn: None,
                dst_ip: None,
            };
            count += 1;
        }
        Poll::Ready(Ok(count))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leg_addresses_are_in_the_discard_prefix_and_told_apart() {
        let a = leg_addr(1);
        let b = leg_addr(u64::MAX);
        assert!(is_leg_addr(a) && is_leg_addr(b));
        assert_ne!(a, b);
        assert!(!is_leg_addr("127.0.0.1:1".parse().unwrap()));
        assert!(!is_leg_addr("[2001:db8::1]:1".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_sessions_datagrams_reach_the_relay_under_one_address_and_answers_go_back() {
        let (legs, mut inbound) = TcpLegs::new();
        let (to_session, mut session_rx) = mpsc::channel(8);
        let session: SessionId = [7; 16];
        legs.from_session(session, &to_session, vec![1]);
        legs.from_session(session, &to_session, vec![2]);
        let (a, first) = inbound.recv().await.unwrap();
        let (b, second) = inbound.recv().await.unwrap();
        assert_eq!((a, first, second), (b, vec![1], vec![2]));
        assert!(legs.send_to(a, &[9]));
        assert_eq!(
            session_rx.recv().await.unwrap(),
            ControlMessage::P2pDatagram { bytes: vec![9] }
        );
        assert!(!legs.send_to("127.0.0.1:5".parse().unwrap(), &[9]), "UDP's");
        legs.session_ended(&session);
        assert!(legs.send_to(a, &[9]), "still ours, but nobody there");
        assert!(session_rx.try_recv().is_err());
    }
}
