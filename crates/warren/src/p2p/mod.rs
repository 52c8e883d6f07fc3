//! Peer-to-peer file transfer (`warren send` / `warren receive`): the parts that touch the
//! file system and the crypto, without any networking yet. The wire formats live in
//! `warren_proto::files`.
//!
//! * [`code`]: the join code `<nameplate>-<word>-<word>-<word>`: making and parsing it.
//! * [`pake`]: SPAKE2 over the code, key confirmation, the sealed certificate-fingerprint
//!   exchange and the derived keys, as a sans-IO state machine.
//! * [`chunks`]: BLAKE3 per 1 MiB chunk, computed as bytes go by.
//! * [`resume`]: the sidecar of a partial file, and what of it can be trusted on resume.
//! * [`net`]: connectivity: the shared UDP socket, address discovery, hole punching.
//! * [`write`](mod@write): creating files and folders strictly beneath the output folder, without
//!   following links; temporary names, renamed into place when complete.

pub mod chunks;
pub mod code;
pub mod net;
pub mod pake;
#[cfg(unix)]
pub mod resume;
mod words;
#[cfg(unix)]
pub mod write;
