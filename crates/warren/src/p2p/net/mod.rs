//! Peer-to-peer connectivity: the layer under file transfer and P2P tunnels.
//!
//! One UDP socket per peer carries both the connectivity checks (STUN Binding messages,
//! `warren_proto::stun`) and the QUIC connection that follows, so the NAT mapping the checks
//! open is the one QUIC uses. The flow, for each side:
//!
//! 1. [`demux::DemuxSocket::bind`] a socket and make a quinn endpoint on it
//!    ([`demux::endpoint`]); the endpoint's driver reads the socket and hands STUN to a
//!    [`demux::StunChannel`].
//! 2. [`reflector::discover`] the socket's server-reflexive address from the Warren server's
//!    [`reflector`].
//! 3. [`candidates::Candidates::gather`] and exchange them through the mailbox.
//! 4. [`punch::Checker::punch`] with the PAKE-derived [`key::CheckKey`]: checks both ways,
//!    peer-reflexive answers, the first working pair wins or the deadline sends the caller
//!    to the relay.
//! 5. QUIC on the chosen address, over the same endpoint; or, when no direct pair works,
//!    [`relay::join`] the server's relay and QUIC to the relay's address.
//!
//! Modules:
//! * [`candidates`]: the addresses a peer can be reached at, serialisable for the mailbox.
//! * [`demux`]: the shared socket (a `quinn::AsyncUdpSocket` splitting STUN from QUIC).
//! * [`key`]: the check key and the integrity tag of a check.
//! * [`nat`]: the NAT-type probe (`warren doctor`): mapping and filtering.
//! * [`punch`]: the connectivity checker.
//! * [`reflector`]: the server's STUN Binding responder and the client's discovery call.
//! * [`relay`]: the relay of last resort (the server forwards QUIC between two legs) and the
//!   client's call to join it; its serve loop also runs the reflector, on one UDP port, and
//!   reads and writes it in GRO/GSO batches ([`crate::relay::udp::batch`], shared with UDP
//!   services).
//! * [`tcp_leg`]: a relay leg over the peer's session with the server, for blocked UDP.
//!
//! The wire format and the rules are in `docs/protocol.md`, "P2P connectivity".

use std::future::Future;
use std::io;
use std::net::SocketAddr;

pub mod candidates;
pub mod demux;
pub mod key;
pub mod nat;
pub mod punch;
pub mod reflector;
pub mod relay;
pub mod tcp_leg;

/// Sending and receiving STUN messages: what the checker and the discovery call need from
/// a socket. Implemented by the shared [`demux::StunChannel`] and by a plain
/// `tokio::net::UdpSocket` (the reflector's socket, tests).
pub trait StunIo: Send {
    /// Sends one datagram without waiting: a full socket buffer drops it (checks are
    /// repeated, so a lost one costs nothing but a later success).
    ///
    /// # Errors
    ///
    /// The socket's error other than "would block".
    fn send_to(&self, packet: &[u8], to: SocketAddr) -> io::Result<()>;

    /// Waits until the socket can take a datagram. Call it before a request that is only
    /// repeated after a long wait: a socket made a moment ago counts as writable only once
    /// the runtime's reactor has seen it so, and until then [`StunIo::send_to`] drops
    /// without trying. (Measured: a receiver's first address-discovery request was lost
    /// that way in about two runs of three while the sender walked a big tree, and the
    /// retransmit came 100 ms later.)
    ///
    /// # Errors
    ///
    /// The socket's error.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;

    /// The next STUN datagram and its source. Cancel-safe: dropping the future loses
    /// nothing.
    ///
    /// # Errors
    ///
    /// The socket's error, or `BrokenPipe` when the shared socket is gone.
    fn recv_from(&mut self) -> impl Future<Output = io::Result<(Vec<u8>, SocketAddr)>> + Send;
}

impl StunIo for tokio::net::UdpSocket {
    fn send_to(&self, packet: &[u8], to: SocketAddr) -> io::Result<()> {
        match self.try_send_to(packet, to) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        tokio::net::UdpSocket::writable(self).await
    }

    async fn recv_from(&mut self) -> io::Result<(Vec<u8>, SocketAddr)> {
        // One byte more than any accepted message, so an oversized one is seen as such.
        let mut buf = vec![0u8; warren_proto::stun::MAX_MESSAGE_LEN + 1];
        let (len, from) = tokio::net::UdpSocket::recv_from(self, &mut buf).await?;
        buf.truncate(len);
        Ok((buf, from))
    }
}
