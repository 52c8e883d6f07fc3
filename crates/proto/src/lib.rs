//! warren-proto: the sans-IO core of Warren's wire protocol.
//!
//! No sockets, no tokio, no clock reads: everything here is a pure function or a state
//! machine over bytes, taking `now` (and, except for snow's ephemeral keys, randomness) from
//! the caller, so it can be unit-tested on a virtual clock and fuzzed without a network.
//!
//! * [`balance`]: the set of sessions serving a service and how visitors are spread.
//! * [`cipher`]: cipher suites and how the server chooses one (by measured speed or order).
//! * [`files`]: peer-to-peer file transfer: safe names, the manifest, chunk frames, PAKE
//!   messages.
//! * [`fragment`]: UDP-service datagrams over QUIC datagrams: frame format, splitting and
//!   bounded reassembly.
//! * [`handshake`]: connection preambles, the Noise handshake, data channel hellos.
//! * [`speed_ext`]: the cipher-speed extensions appended to the handshake payloads.
//! * [`message`]: control messages and their size-capped codec.
//! * [`liveness`]: heartbeat and reconnect backoff state machines.
//! * [`proxy_header`]: PROXY protocol v1/v2 headers towards a service's target.
//! * [`sni`]: the server name of a TLS ClientHello, peeked for TLS passthrough.
//! * [`stun`]: STUN Binding messages for address discovery and peer-to-peer checks, and
//!   first-byte demultiplexing of STUN and QUIC on one port.
//!
//! The wire format is described in `docs/protocol.md`.

pub mod balance;
pub mod cipher;
pub mod files;
pub mod fragment;
pub mod handshake;
pub mod liveness;
pub mod message;
pub mod proxy_header;
pub mod sni;
pub mod speed_ext;
pub mod stun;

pub use cipher::{CipherChoice, CipherPolicy, CipherSuite, SuiteSpeed};
