//! Peer to peer: file transfer (`warren send` / `warren receive`) and tunnels (`warren p2p
//! listen` / `warren p2p connect`): the file system, the crypto, the server's mailbox,
//! connectivity, and what runs over the one QUIC connection between the peers.
//! The wire formats live in `warren_proto::files` and `warren_proto::stun`.
//!
//! * [`code`]: the join code `<nameplate>-<word>-<word>-<word>`: making and parsing it.
//! * [`pake`]: SPAKE2 over the code, key confirmation, the sealed certificate-fingerprint
//!   exchange and the derived keys, as a sans-IO state machine.
//! * [`chunks`]: BLAKE3 per 1 MiB chunk, computed as bytes go by.
//! * [`resume`]: the sidecar of a partial file, and what of it can be trusted on resume.
//! * [`mailbox`]: the client's side of the server's mailbox, where the two peers meet.
//! * [`lan`]: `--lan`: the sender's own mailbox, advertised and found with mDNS.
//! * [`net`]: connectivity: the shared UDP socket, address discovery, hole punching.
//! * [`write`](mod@write): creating files and folders strictly beneath the output folder, without
//!   following links; temporary names, renamed into place when complete.
//! * [`session`]: from a join code to a pinned QUIC connection with the peer: mailbox,
//!   PAKE, checks or relay.
//! * [`transfer`]: the file protocol over one QUIC connection: pinned identities, the
//!   sender and the receiver, progress events.
//! * [`tunnel`]: a TCP or UDP service over one QUIC connection: the listening side's exit
//!   and the connecting side's entrance.
//! * [`upgrade`]: a tunnel's relayed connection moving to the direct path underneath.
//! * [`listen`]: keeping an exit offered (a code or a named service) and serving its peers.

pub mod chunks;
pub mod code;
pub mod lan;
#[cfg(unix)]
pub mod listen;
pub mod mailbox;
pub mod net;
pub mod pake;
#[cfg(unix)]
pub mod resume;
#[cfg(unix)]
pub mod session;
#[cfg(unix)]
pub mod transfer;
#[cfg(unix)]
pub mod tunnel;
#[cfg(unix)]
pub mod upgrade;
mod words;
#[cfg(unix)]
pub mod write;
