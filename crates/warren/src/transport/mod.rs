//! Transports: how bytes get between a client and a server.
//!
//! Today both transports (`noise` and plaintext `tcp`) are TCP based and share one code path:
//! a control connection starts with the Noise handshake (which authenticates the PSK in
//! either case), then every connection carries Warren's record layer, sealed with the
//! negotiated cipher — `none` for the plaintext transport. A *channel* ([`Channel`]) is one
//! such connection after its preamble. QUIC will add a second implementation below
//! [`crate::session`] without changing the code above it.
//!
//! * [`tcp`]: socket set-up, connect with deadline, reset.
//! * [`congestion`]: the TCP congestion control of the tunnel's own sockets.
//! * [`records`]: the record layer over a byte stream.
//! * [`preamble`]: the first frames of a connection, both sides.

pub mod buffers;
pub mod compress;
pub mod congestion;
pub mod layers;
pub mod preamble;
pub mod proxy;
pub mod quic;
pub mod records;
pub mod tcp;
pub mod tls;
pub mod wire;
pub mod ws;

use crate::crypto::record::{Opener, Sealer};
use records::{RecordReader, RecordWriter};
use wire::{Wire, WireReader, WireWriter};

/// The transport a config asks for.
pub use crate::config::Transport;

/// One established connection speaking records, split into its two directions.
pub struct Channel {
    /// Records from the peer.
    pub reader: RecordReader<WireReader>,
    /// Records to the peer.
    pub writer: RecordWriter<WireWriter>,
}

impl Channel {
    /// Wraps a connection whose preamble is done.
    pub fn new(wire: Wire, sealer: Sealer, opener: Opener) -> Self {
        let (read, write) = wire.into_split();
        Channel {
            reader: RecordReader::new(read, opener),
            writer: RecordWriter::new(write, sealer),
        }
    }
}
