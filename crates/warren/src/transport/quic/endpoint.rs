//! QUIC endpoints: the UDP socket (buffers, GSO/GRO), quinn's endpoint, and the server's
//! handshake gate.
//!
//! [`server_endpoint`] and [`client_endpoint`] build a [`QuicEndpoint`]. On a server, every
//! [`quinn::Incoming`] goes through [`QuicEndpoint::admit`] before
//! [`super::auth::accept`]:
//!
//! ```text
//! while let Some(incoming) = endpoint.accept().await {      // never blocks on a handshake
//!     let Some(admitted) = endpoint.admit(incoming) else { continue };
//!     tasks.spawn(async move { quic::accept(admitted, &tls, deadline).await });
//! }
//! ```
//!
//! Hardening against floods, in layers:
//! 1. What is not QUIC (garbage, unknown versions, Initials that do not decrypt) is dropped
//!    by quinn before any state exists; unknown versions get a small Version Negotiation.
//! 2. quinn holds at most `max_incoming` undecided attempts, with bounded buffers
//!    ([`HandshakeLimits`]).
//! 3. [`HandshakeGate`]: above `retry_above` handshakes in progress, an unvalidated address
//!    gets a stateless Retry (a spoofed source never comes back; a real client pays one
//!    round trip); above `max_pending` attempts are ignored.
//! 4. [`super::auth::accept`] bounds each handshake by its deadline, so a permit is always
//!    returned.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use socket2::{Domain, Protocol, Socket, Type};

use super::error::QuicError;
use super::settings::{HandshakeLimits, QuicSettings};
use super::tls::ServerTls;

/// What the UDP socket ended up with: the kernel may grant less than asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketInfo {
    /// The bound address (the port the OS chose for port 0).
    pub local_addr: SocketAddr,
    /// `SO_SNDBUF` as the kernel reports it (Linux: twice the usable size).
    pub send_buffer: usize,
    /// `SO_RCVBUF` as the kernel reports it.
    pub recv_buffer: usize,
    /// Whether the buffers were forced past the system maximum (`SO_*BUFFORCE`, root only).
    pub buffers_forced: bool,
    /// Packets per GSO send the socket supports (1: no GSO). quinn uses at most 10, and only
    /// with `segmentation_offload` on.
    pub gso_segments: usize,
    /// Packets per GRO receive the socket supports (1: no GRO).
    pub gro_segments: usize,
}

/// A quinn endpoint with what Warren keeps beside it: the socket's facts, the transport
/// config every connection uses, the settings (to rebind) and, on a server, the gate.
#[derive(Debug, Clone)]
pub struct QuicEndpoint {
    /// The quinn endpoint. `accept()` yields incoming connections on a server; closing it
    /// closes every connection.
    pub endpoint: quinn::Endpoint,
    /// The UDP socket's facts at bind time.
    pub socket: SocketInfo,
    transport: Arc<quinn::TransportConfig>,
    settings: QuicSettings,
    gate: HandshakeGate,
}

impl QuicEndpoint {
    /// Decides what to do with a new connection attempt (see the module doc): `Some` to go
    /// on with [`super::auth::accept`], `None` if it was answered with a Retry or ignored.
    pub fn admit(&self, incoming: quinn::Incoming) -> Option<Admitted> {
        self.gate.admit(incoming)
    }

    /// The gate's counters.
    pub fn gate_stats(&self) -> GateStats {
        self.gate.stats()
    }

    /// The transport config outgoing connections use.
    pub fn transport_config(&self) -> Arc<quinn::TransportConfig> {
        self.transport.clone()
    }

    /// The settings this endpoint was built with.
    pub fn settings(&self) -> &QuicSettings {
        &self.settings
    }

    /// Installs a new server TLS config (hot reload of the PSK or certificates); connections
    /// already up keep theirs.
    ///
    /// # Errors
    ///
    /// [`QuicError::Settings`] if the settings are invalid (not expected: they built this
    /// endpoint).
    pub fn set_server_tls(&self, tls: &ServerTls) -> Result<(), QuicError> {
        self.endpoint
            .set_server_config(Some(tls.quinn_server_config(&self.settings)?));
        Ok(())
    }

    /// Moves the endpoint to a new UDP socket bound at `addr` (same buffer settings). Open
    /// connections migrate: the peer sees packets from the new address and carries on.
    ///
    /// # Errors
    ///
    /// [`QuicError::Bind`] if the new socket cannot be bound.
    pub fn rebind(&self, addr: SocketAddr) -> Result<SocketInfo, QuicError> {
        let (socket, info) = bind_socket(addr, &self.settings)?;
        self.endpoint
            .rebind(socket)
            .map_err(|source| QuicError::Bind { addr, source })?;
        Ok(info)
    }
}

/// A server endpoint at `bind` (UDP) presenting `tls`.
///
/// # Errors
///
/// [`QuicError::Settings`] for invalid settings; [`QuicError::Bind`] if the socket cannot
/// be bound.
pub fn server_endpoint(
    bind: SocketAddr,
    tls: &ServerTls,
    settings: &QuicSettings,
) -> Result<QuicEndpoint, QuicError> {
    let server_config = tls.quinn_server_config(settings)?;
    build(bind, Some(server_config), settings)
}

/// A client endpoint at `bind` (usually `0.0.0.0:0` or `[::]:0`, matching the server's
/// address family). One endpoint can hold connections to several servers.
///
/// # Errors
///
/// [`QuicError::Settings`] for invalid settings; [`QuicError::Bind`] if the socket cannot
/// be bound.
pub fn client_endpoint(
    bind: SocketAddr,
    settings: &QuicSettings,
) -> Result<QuicEndpoint, QuicError> {
    build(bind, None, settings)
}

fn build(
    bind: SocketAddr,
    server_config: Option<quinn::ServerConfig>,
    settings: &QuicSettings,
) -> Result<QuicEndpoint, QuicError> {
    let transport = Arc::new(settings.transport_config()?);
    let endpoint_config = settings.endpoint_config()?;
    let (socket, info) = bind_socket(bind, settings)?;
    let endpoint = quinn::Endpoint::new(
        endpoint_config,
        server_config,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|source| QuicError::Bind { addr: bind, source })?;
    tracing::debug!(
        event = "quic_endpoint",
        local = %info.local_addr,
        send_buffer = info.send_buffer,
        recv_buffer = info.recv_buffer,
        forced = info.buffers_forced,
        gso = info.gso_segments,
        gro = info.gro_segments,
        "QUIC endpoint bound"
    );
    Ok(QuicEndpoint {
        endpoint,
        socket: info,
        transport,
        settings: settings.clone(),
        gate: HandshakeGate::new(settings.handshake.clone()),
    })
}

/// A UDP socket with the settings' buffers, bound and non-blocking, and what it got.
pub(crate) fn bind_socket(
    addr: SocketAddr,
    settings: &QuicSettings,
) -> Result<(std::net::UdpSocket, SocketInfo), QuicError> {
    let bind_error = |source: io::Error| QuicError::Bind { addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(bind_error)?;
    let buffers_forced = set_buffers(
        &socket,
        settings.socket_send_buffer,
        settings.socket_recv_buffer,
    );
    socket.bind(&addr.into()).map_err(bind_error)?;
    socket.set_nonblocking(true).map_err(bind_error)?;
    let socket: std::net::UdpSocket = socket.into();
    let local_addr = socket.local_addr().map_err(bind_error)?;
    let (send_buffer, recv_buffer) = {
        let socket = socket2::SockRef::from(&socket);
        (
            socket.send_buffer_size().unwrap_or(0),
            socket.recv_buffer_size().unwrap_or(0),
        )
    };
    // quinn sets the same options again when it wraps the socket; asking here only reads
    // what the kernel offers, for diagnostics.
    let (gso_segments, gro_segments) = match quinn::udp::UdpSocketState::new((&socket).into()) {
        Ok(state) => (state.max_gso_segments(), state.gro_segments()),
        Err(_) => (1, 1),
    };
    Ok((
        socket,
        SocketInfo {
            local_addr,
            send_buffer,
            recv_buffer,
            buffers_forced,
            gso_segments,
            gro_segments,
        },
    ))
}

/// Sets the socket buffers: forced past `net.core.{w,r}mem_max` when the process may
/// (root / CAP_NET_ADMIN), else as far as the system maximum allows. Failures are quiet:
/// a smaller buffer costs throughput, not correctness. Returns whether both were forced.
fn set_buffers(socket: &Socket, send: usize, recv: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::socket::{setsockopt, sockopt};
        let send_forced = setsockopt(socket, sockopt::SndBufForce, &send).is_ok();
        let recv_forced = setsockopt(socket, sockopt::RcvBufForce, &recv).is_ok();
        if !send_forced {
            let _ = socket.set_send_buffer_size(send);
        }
        if !recv_forced {
            let _ = socket.set_recv_buffer_size(recv);
        }
        send_forced && recv_forced
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = socket.set_send_buffer_size(send);
        let _ = socket.set_recv_buffer_size(recv);
        false
    }
}

/// Counts handshakes in progress and decides, per connection attempt, between going on,
/// a stateless Retry, and silence. Clones share the count.
#[derive(Debug, Clone)]
pub struct HandshakeGate {
    limits: HandshakeLimits,
    counters: Arc<GateCounters>,
}

#[derive(Debug, Default)]
struct GateCounters {
    pending: AtomicUsize,
    admitted: AtomicU64,
    retried: AtomicU64,
    ignored: AtomicU64,
}

/// A snapshot of a [`HandshakeGate`]'s counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateStats {
    /// Handshakes in progress now.
    pub pending: usize,
    /// Attempts let through since start.
    pub admitted: u64,
    /// Attempts answered with a Retry since start.
    pub retried: u64,
    /// Attempts ignored (over `max_pending`) since start.
    pub ignored: u64,
}

impl HandshakeGate {
    /// A gate with these limits.
    pub fn new(limits: HandshakeLimits) -> Self {
        HandshakeGate {
            limits,
            counters: Arc::default(),
        }
    }

    /// See [`QuicEndpoint::admit`].
    pub fn admit(&self, incoming: quinn::Incoming) -> Option<Admitted> {
        let counters = &self.counters;
        // Load-then-add is racy by a few under concurrent callers; the bound is a budget, not
        // an invariant, and the accept loop is one task anyway.
        let pending = counters.pending.load(Ordering::Relaxed);
        if pending >= self.limits.max_pending {
            counters.ignored.fetch_add(1, Ordering::Relaxed);
            incoming.ignore();
            return None;
        }
        if pending >= self.limits.retry_above
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            counters.retried.fetch_add(1, Ordering::Relaxed);
            // `may_retry` was checked, so this only fails if quinn changes its mind; then the
            // attempt is dropped in silence.
            if let Err(error) = incoming.retry() {
                error.into_incoming().ignore();
            }
            return None;
        }
        counters.pending.fetch_add(1, Ordering::Relaxed);
        counters.admitted.fetch_add(1, Ordering::Relaxed);
        Some(Admitted {
            incoming,
            _permit: Permit(counters.clone()),
        })
    }

    /// The counters now.
    pub fn stats(&self) -> GateStats {
        let c = &self.counters;
        GateStats {
            pending: c.pending.load(Ordering::Relaxed),
            admitted: c.admitted.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            ignored: c.ignored.load(Ordering::Relaxed),
        }
    }
}

/// A connection attempt the gate let through; it counts as pending until dropped (that is,
/// until [`super::auth::accept`] returns).
#[derive(Debug)]
pub struct Admitted {
    pub(crate) incoming: quinn::Incoming,
    pub(super) _permit: Permit,
}

impl Admitted {
    /// The address the attempt came from.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }
}

/// Gives a pending slot back when dropped.
#[derive(Debug)]
pub(super) struct Permit(Arc<GateCounters>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}
