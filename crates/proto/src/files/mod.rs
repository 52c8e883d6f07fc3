//! Wire formats of peer-to-peer file transfer (`warren send` / `warren receive`), without
//! any IO: what a sender may name, what it offers, how chunks are framed, and the PAKE
//! messages that turn a join code into keys. The file system, crypto and transport parts
//! live in `warren::p2p`.
//!
//! * [`name`]: [`SafeName`], a relative path that is safe to create, made only by its
//!   checker; [`NameSet`], the rules over a whole set of names; terminal-safe display.
//! * [`manifest`]: [`Manifest`], the entries a sender offers, and its bounded codec.
//! * [`chunk`]: 1 MiB chunks and the data frame header that carries one.
//! * [`pake`]: [`PakeMessage`], the SPAKE2, confirmation and fingerprint messages.
//! * [`control`]: [`ControlMessage`], the control stream of a transfer (hello, manifest,
//!   accept, file done, resend, done, cancel).
//!
//! Every decoder here is bounded (counts, lengths, sums) and never panics on any input;
//! `fuzz/` has targets for the name checker, the manifest decoder and the control-message
//! decoder. The formats are
//! described in `docs/protocol.md` ("Peer-to-peer file transfer").

pub mod chunk;
pub mod control;
pub mod manifest;
pub mod name;
pub mod pake;
mod wire;

pub use chunk::{CHUNK_SIZE, ChunkHash, ChunkHeader};
pub use control::{CancelReason, ControlError, ControlMessage, Need};
pub use manifest::{Entry, Manifest, ManifestError, Mode};
pub use name::{EntryKind, NameError, NameSet, NameSetError, SafeName, escape_for_terminal};
pub use pake::{PakeMessage, PakeMessageError};
pub use wire::MAX_VARINT;
