//! QUIC: Warren's second transport, on quinn with rustls (aws-lc-rs).
//!
//! What QUIC gives Warren over the TCP transports: one UDP port for everything; streams
//! that do not block each other on loss (no head-of-line blocking between visitors); UDP
//! services carried as real QUIC datagrams ([`warren_proto::fragment`] splits the large
//! ones); connection migration when a client's address changes; TLS 1.3 session resumption
//! for fast reconnects; and the ground the peer-to-peer work stands on. Streams are native
//! QUIC streams: there is no second AEAD inside QUIC.
//!
//! # Setting up
//!
//! ```text
//! server: certs::load_or_create_self_signed(path)  ->  ServerTls::psk(cert, key, psk)
//!         server_endpoint(bind, &tls, &settings)   ->  QuicEndpoint
//!         loop { endpoint.accept() -> admit() -> spawn accept(admitted, &tls, deadline) }
//! client: ClientTls::psk(psk, pin)                 (keep it: it holds resumption tickets)
//!         client_endpoint("0.0.0.0:0", &settings)  ->  QuicEndpoint
//!         connect(&endpoint, server, name, &tls, deadline)
//! both:   Authenticated { connection, control: (send, recv) }
//! ```
//!
//! # Authentication
//!
//! * `psk` (default): a self-signed server certificate, generated and persisted on first
//!   start ([`certs::load_or_create_self_signed`]); after the handshake each side proves the
//!   PSK with an HMAC over the TLS exporter, so the proof is bound to this connection and
//!   useless to a relay in the middle ([`auth`] has the message flow). Clients may pin the
//!   server certificate's SHA-256 (`server_cert_sha256`).
//! * `mtls`: `warren cert ca | server | client` ([`certs`]) makes a CA and certificates; the
//!   server verifies client certificates against the CA, the client verifies the server's
//!   against the CA and its name ([`tls`]).
//!
//! Both modes resume TLS sessions with tickets and never accept 0-RTT (the first message
//! would be replayable).
//!
//! # Tuning
//!
//! [`settings`]: flow-control windows, packet size and PMTUD, GSO, socket buffers,
//! congestion control, keep-alive, datagram buffers and handshake limits, with the
//! [`QuicSettings::internet`] and [`QuicSettings::loopback`] presets and the measurements
//! behind them. [`endpoint`] has the UDP socket and the server's handshake gate against
//! floods.
//!
//! # Modules
//!
//! * [`settings`]: [`QuicSettings`] and its presets.
//! * [`tls`]: [`ServerTls`], [`ClientTls`], ALPN `warren/1`.
//! * [`certs`]: the self-signed certificate and the development CA.
//! * [`congestion`]: Warren's controller, `model` (BBR's idea, sized for quinn's pacer).
//! * [`auth`]: [`connect`], [`accept`], [`Authenticated`]: handshake, PSK proofs, control stream.
//! * [`endpoint`]: [`QuicEndpoint`], [`server_endpoint`], [`client_endpoint`], the handshake gate.
//! * [`error`] holds [`QuicError`].

pub mod auth;
pub mod certs;
pub mod congestion;
pub mod endpoint;
pub mod error;
pub(crate) mod packet_key;
pub mod settings;
pub mod tls;

pub use auth::{Authenticated, CLOSE_REFUSED, accept, client_error, connect};
pub use endpoint::{
    Admitted, GateStats, HandshakeGate, QuicEndpoint, SocketInfo, client_endpoint, server_endpoint,
};
pub use error::QuicError;
pub use settings::{Congestion, HandshakeLimits, QuicSettings, SettingsError};
pub use tls::{ALPN, ClientAuth, ClientTls, ServerAuth, ServerTls};
