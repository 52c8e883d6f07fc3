//! Control messages of the file protocol (ALPN `warren-files/1`): what the two peers say
//! to each other on the control stream, around the data frames of [`super::chunk`].
//!
//! # Flow
//!
//! ```text
//! sender                                         receiver
//!   Hello{min, max}, Manifest        ──────────▶
//!                                    ◀──────────  Hello{min, max}, Accept{need} | Cancel
//!   (data stream: frames back to back)
//!                                    ◀──────────  FileDone{id} per file, Resend{id, chunk}
//!   (resent frames on the same data stream)
//!                                    ◀──────────  Done
//!   (sender ends its streams; the receiver closes the connection)
//! ```
//!
//! Either side may send Cancel{reason, detail} at any time and then closes the connection.
//!
//! # Framing
//!
//! ```text
//! message:  type(u8)  len(varint)  body(len bytes)
//! Hello     0x01  min_version(u8) max_version(u8)
//! Manifest  0x02  the manifest's encoding (super::manifest)
//! Accept    0x03  count(varint) { file_id(varint) ranges(varint) { start(varint) end(varint) }* }*
//! FileDone  0x04  file_id(varint)
//! Resend    0x05  file_id(varint) chunk_index(varint)
//! Done      0x06  (empty)
//! Cancel    0x07  reason(u8) detail(UTF-8, ≤ MAX_DETAIL_LEN bytes)
//! Text      0x08  UTF-8, ≤ MAX_TEXT_LEN bytes
//! ```
//!
//! A text transfer (`warren send --text`) sends Text in place of the Manifest; the
//! receiver shows it and answers Done (no Accept, no data stream).
//!
//! Integers are QUIC varints in their shortest form. Each type has its own body bound
//! ([`max_body_len`]), checked against the length prefix before anything is allocated.
//! In Accept, `file_id`s strictly increase and each file's chunk ranges (half-open,
//! non-empty) strictly increase without touching; the receiver lists only the files it
//! needs data for, with the chunks it still misses (its resume state), so a file not listed
//! gets no frames. Whether the ids and ranges fit the manifest is checked by the sender,
//! which has it.

use std::ops::Range;

use super::manifest::{MAX_ENTRIES, MAX_MANIFEST_LEN, Manifest, ManifestError};
use super::wire::{MAX_VARINT, Reader, WireError, put_varint};

/// The file-protocol version this code speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// The longest Cancel detail, in bytes.
pub const MAX_DETAIL_LEN: usize = 1024;
/// The longest text of a text transfer, in bytes.
pub const MAX_TEXT_LEN: usize = 64 * 1024;

/// The longest Accept body: a million files with a few ranges each.
pub const MAX_ACCEPT_LEN: usize = 32 << 20;

/// Body bound of the small messages.
const MAX_SMALL_LEN: usize = 64;

const TYPE_HELLO: u8 = 0x01;
const TYPE_MANIFEST: u8 = 0x02;
const TYPE_ACCEPT: u8 = 0x03;
const TYPE_FILE_DONE: u8 = 0x04;
const TYPE_RESEND: u8 = 0x05;
const TYPE_DONE: u8 = 0x06;
const TYPE_CANCEL: u8 = 0x07;
const TYPE_TEXT: u8 = 0x08;

/// Why a peer stops the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The receiver's user said no.
    Declined,
    /// The receiver refused the manifest (an unsafe name, a clash in the output folder).
    Refused,
    /// A local file could not be read (sender) or written (receiver).
    LocalError,
    /// The same chunk arrived damaged too many times.
    TooManyBadChunks,
    /// The peer broke the protocol.
    Protocol,
    /// The user stopped the transfer.
    Interrupted,
    /// A reason this version does not know (kept so a newer peer's reason is shown).
    Other(u8),
}

impl CancelReason {
    fn code(self) -> u8 {
        match self {
            CancelReason::Declined => 1,
            CancelReason::Refused => 2,
            CancelReason::LocalError => 3,
            CancelReason::TooManyBadChunks => 4,
            CancelReason::Protocol => 5,
            CancelReason::Interrupted => 6,
            CancelReason::Other(code) => code,
        }
    }

    fn from_code(code: u8) -> CancelReason {
        match code {
            1 => CancelReason::Declined,
            2 => CancelReason::Refused,
            3 => CancelReason::LocalError,
            4 => CancelReason::TooManyBadChunks,
            5 => CancelReason::Protocol,
            6 => CancelReason::Interrupted,
            other => CancelReason::Other(other),
        }
    }
}

impl std::fmt::Display for CancelReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CancelReason::Declined => f.write_str("declined"),
            CancelReason::Refused => f.write_str("refused the file list"),
            CancelReason::LocalError => f.write_str("a local file error"),
            CancelReason::TooManyBadChunks => f.write_str("too many damaged chunks"),
            CancelReason::Protocol => f.write_str("a protocol error"),
            CancelReason::Interrupted => f.write_str("interrupted"),
            CancelReason::Other(code) => write!(f, "reason {code}"),
        }
    }
}

/// The chunks one file still needs (an Accept item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The file's id (its index in the manifest).
    pub file_id: u32,
    /// Chunk-index ranges, half-open, increasing, non-empty and not touching.
    pub chunks: Vec<Range<u64>>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlMessage {
    /// The versions a peer speaks.
    Hello {
        /// Lowest version.
        min: u8,
        /// Highest version.
        max: u8,
    },
    /// The sender's offer.
    Manifest(Manifest),
    /// The receiver accepts, listing what it still needs.
    Accept(Vec<Need>),
    /// The receiver has a file complete, verified and under its final name.
    FileDone {
        /// The file.
        file_id: u32,
    },
    /// The receiver got a damaged chunk and asks for it again.
    Resend {
        /// The file.
        file_id: u32,
        /// The chunk index.
        index: u64,
    },
    /// The receiver has everything.
    Done,
    /// The peer stops the transfer.
    Cancel {
        /// Why.
        reason: CancelReason,
        /// Details for people (untrusted: escape before showing).
        detail: String,
    },
    /// The sender's text, instead of a manifest (untrusted: escape before showing).
    Text(String),
}

/// What [`ControlMessage::decode`] found at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A message and how many bytes it took.
    Message(ControlMessage, usize),
    /// The buffer ends inside the message: read more.
    NeedMore,
}

/// A control message that is malformed or out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// An unknown message type.
    #[error(
        "unknown control message type {kind:#04x}: the peer runs an incompatible Warren, update both sides"
    )]
    UnknownType {
        /// The type byte.
        kind: u8,
    },
    /// A body longer than its type allows.
    #[error(
        "control message of type {kind:#04x} is {len} bytes, over its limit of {max}: the peer is broken or hostile"
    )]
    TooLong {
        /// The type byte.
        kind: u8,
        /// The declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The body is malformed (truncated inside, badly encoded, trailing bytes, bad order).
    #[error(
        "malformed control message of type {kind:#04x} ({what}): the peer is broken or hostile"
    )]
    Malformed {
        /// The type byte.
        kind: u8,
        /// What is wrong.
        what: &'static str,
    },
    /// The manifest inside is refused.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The largest body a message of type `kind` may have.
///
/// # Errors
///
/// [`ControlError::UnknownType`] for a type this version does not know.
pub fn max_body_len(kind: u8) -> Result<usize, ControlError> {
    match kind {
        TYPE_MANIFEST => Ok(MAX_MANIFEST_LEN),
        TYPE_ACCEPT => Ok(MAX_ACCEPT_LEN),
        TYPE_CANCEL => Ok(1 + MAX_DETAIL_LEN),
        TYPE_TEXT => Ok(MAX_TEXT_LEN),
        TYPE_HELLO | TYPE_FILE_DONE | TYPE_RESEND | TYPE_DONE => Ok(MAX_SMALL_LEN),
        kind => Err(ControlError::UnknownType { kind }),
    }
}

impl ControlMessage {
    fn kind(&self) -> u8 {
        match self {
            ControlMessage::Hello { .. } => TYPE_HELLO,
            ControlMessage::Manifest(_) => TYPE_MANIFEST,
            ControlMessage::Accept(_) => TYPE_ACCEPT,
            ControlMessage::FileDone { .. } => TYPE_FILE_DONE,
            ControlMessage::Resend { .. } => TYPE_RESEND,
            ControlMessage::Done => TYPE_DONE,
            ControlMessage::Cancel { .. } => TYPE_CANCEL,
            ControlMessage::Text(_) => TYPE_TEXT,
        }
    }

    /// Appends the framed message.
    ///
    /// A Cancel detail is cut to [`MAX_DETAIL_LEN`] bytes and a Text to [`MAX_TEXT_LEN`]
    /// (at a character boundary).
    ///
    /// # Panics
    ///
    /// If a chunk index in Accept or Resend exceeds the varint range: they come from a
    /// manifest, whose sizes are bounded (an internal error).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        match self {
            ControlMessage::Hello { min, max } => body.extend_from_slice(&[*min, *max]),
            ControlMessage::Manifest(manifest) => body = manifest.encode(),
            ControlMessage::Accept(needs) => {
                put_varint(&mut body, needs.len() as u64);
                for need in needs {
                    put_varint(&mut body, u64::from(need.file_id));
                    put_varint(&mut body, need.chunks.len() as u64);
                    for range in &need.chunks {
                        put_varint(&mut body, range.start);
                        put_varint(&mut body, range.end);
                    }
                }
            }
            ControlMessage::FileDone { file_id } => put_varint(&mut body, u64::from(*file_id)),
            ControlMessage::Resend { file_id, index } => {
                put_varint(&mut body, u64::from(*file_id));
                put_varint(&mut body, *index);
            }
            ControlMessage::Done => {}
            ControlMessage::Cancel { reason, detail } => {
                body.push(reason.code());
                let mut cut = detail.len().min(MAX_DETAIL_LEN);
                while !detail.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.extend_from_slice(&detail.as_bytes()[..cut]);
            }
            ControlMessage::Text(text) => {
                let mut cut = text.len().min(MAX_TEXT_LEN);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.extend_from_slice(&text.as_bytes()[..cut]);
            }
        }
        out.push(self.kind());
        put_varint(out, body.len() as u64);
        out.extend_from_slice(&body);
    }

    /// Reads one framed message from the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`ControlError`] if the message is malformed or over its bound (checked from the
    /// length prefix, before the body is needed). Never panics.
    pub fn decode(buf: &[u8]) -> Result<Decoded, ControlError> {
        let mut r = Reader::new(buf);
        let Ok(kind) = r.u8() else {
            return Ok(Decoded::NeedMore);
        };
        let max = max_body_len(kind)?;
        let len = match r.varint() {
            Ok(len) => len,
            Err(WireError::Truncated) => return Ok(Decoded::NeedMore),
            Err(WireError::NonCanonical) => {
                return Err(ControlError::Malformed {
                    kind,
                    what: "badly encoded length",
                });
            }
        };
        if len > max as u64 {
            return Err(ControlError::TooLong { kind, len, max });
        }
        // `len` ≤ max, a usize.
        let Ok(body) = r.bytes(len as usize) else {
            return Ok(Decoded::NeedMore);
        };
        let message = ControlMessage::decode_body(kind, body)?;
        Ok(Decoded::Message(message, buf.len() - r.remaining()))
    }

    /// Decodes the body of a message of type `kind` whose frame header was read already
    /// (a stream reader checks the length against [`max_body_len`] first).
    ///
    /// # Errors
    ///
    /// [`ControlError`] if the body is malformed or over its bound.
    pub fn decode_body(kind: u8, body: &[u8]) -> Result<ControlMessage, ControlError> {
        let max = max_body_len(kind)?;
        if body.len() > max {
            return Err(ControlError::TooLong {
                kind,
                len: body.len() as u64,
                max,
            });
        }
        let malformed = |what| ControlError::Malformed { kind, what };
        let wire = |e: WireError| match e {
            WireError::Truncated => malformed("truncated"),
            WireError::NonCanonical => malformed("badly encoded number"),
        };
        let mut r = Reader::new(body);
        let message = match kind {
            TYPE_HELLO => {
                let (min, max) = (r.u8().map_err(wire)?, r.u8().map_err(wire)?);
                if min == 0 || min > max {
                    return Err(malformed("bad version range"));
                }
                ControlMessage::Hello { min, max }
            }
            TYPE_MANIFEST => return Ok(ControlMessage::Manifest(Manifest::decode(body)?)),
            TYPE_ACCEPT => ControlMessage::Accept(decode_accept(&mut r).map_err(|e| match e {
                AcceptError::Wire(e) => wire(e),
                AcceptError::Bad(what) => malformed(what),
            })?),
            TYPE_FILE_DONE => ControlMessage::FileDone {
                file_id: file_id(&mut r).map_err(|e| match e {
                    AcceptError::Wire(e) => wire(e),
                    AcceptError::Bad(what) => malformed(what),
                })?,
            },
            TYPE_RESEND => {
                let file_id = file_id(&mut r).map_err(|e| match e {
                    AcceptError::Wire(e) => wire(e),
                    AcceptError::Bad(what) => malformed(what),
                })?;
                let index = r.varint().map_err(wire)?;
                ControlMessage::Resend { file_id, index }
            }
            TYPE_DONE => ControlMessage::Done,
            TYPE_CANCEL => {
                let reason = CancelReason::from_code(r.u8().map_err(wire)?);
                let rest = r.bytes(r.remaining()).map_err(wire)?;
                let detail = std::str::from_utf8(rest)
                    .map_err(|_| malformed("detail is not UTF-8"))?
                    .to_owned();
                ControlMessage::Cancel { reason, detail }
            }
            TYPE_TEXT => {
                let rest = r.bytes(r.remaining()).map_err(wire)?;
                let text = std::str::from_utf8(rest)
                    .map_err(|_| malformed("text is not UTF-8"))?
                    .to_owned();
                ControlMessage::Text(text)
            }
            kind => return Err(ControlError::UnknownType { kind }),
        };
        if r.remaining() != 0 {
            return Err(malformed("trailing bytes"));
        }
        Ok(message)
    }
}

enum AcceptError {
    Wire(WireError),
    Bad(&'static str),
}

impl From<WireError> for AcceptError {
    fn from(e: WireError) -> Self {
        AcceptError::Wire(e)
    }
}

fn file_id(r: &mut Reader<'_>) -> Result<u32, AcceptError> {
    u32::try_from(r.varint()?).map_err(|_| AcceptError::Bad("file id over 32 bits"))
}

fn decode_accept(r: &mut Reader<'_>) -> Result<Vec<Need>, AcceptError> {
    let count = r.varint()?;
    if count > MAX_ENTRIES as u64 {
        return Err(AcceptError::Bad("more files than a manifest holds"));
    }
    // Each item takes at least two bytes: reserve no more than the body can hold.
    let mut needs = Vec::with_capacity((count as usize).min(r.remaining() / 2));
    let mut last_id: Option<u32> = None;
    for _ in 0..count {
        let file_id = file_id(r)?;
        if last_id.is_some_and(|last| last >= file_id) {
            return Err(AcceptError::Bad("file ids out of order"));
        }
        last_id = Some(file_id);
        let ranges = r.varint()?;
        if ranges == 0 {
            return Err(AcceptError::Bad("a file with no chunk range"));
        }
        // Each range takes at least two bytes.
        let mut chunks = Vec::with_capacity((ranges.min(r.remaining() as u64 / 2)) as usize);
        let mut floor = 0u64;
        for i in 0..ranges {
            let (start, end) = (r.varint()?, r.varint()?);
            if start >= end || end > MAX_VARINT || (i > 0 && start <= floor) {
                return Err(AcceptError::Bad(
                    "chunk ranges empty, out of order or touching",
                ));
            }
            floor = end;
            chunks.push(start..end);
        }
        needs.push(Need { file_id, chunks });
    }
    Ok(needs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{Entry, Mode, SafeName};

    fn round_trip(message: ControlMessage) {
        let mut out = Vec::new();
        message.encode(&mut out);
        assert_eq!(
            ControlMessage::decode(&out),
            Ok(Decoded::Message(message.clone(), out.len()))
        );
        for cut in 0..out.len() {
            assert_eq!(ControlMessage::decode(&out[..cut]), Ok(Decoded::NeedMore));
        }
    }

    #[test]
    fn every_message_round_trips() {
        let manifest = Manifest::new(vec![Entry::file(
            SafeName::new("a.txt").expect("name"),
            3,
            Mode::Regular,
            7,
        )])
        .expect("manifest");
        round_trip(ControlMessage::Hello { min: 1, max: 1 });
        round_trip(ControlMessage::Manifest(manifest));
        round_trip(ControlMessage::Accept(vec![]));
        round_trip(ControlMessage::Accept(vec![
            Need {
                file_id: 0,
                chunks: std::iter::once(0..1).collect(),
            },
            Need {
                file_id: 70_000,
                chunks: vec![0..2, 5..1 << 40],
            },
        ]));
        round_trip(ControlMessage::FileDone { file_id: 9 });
        round_trip(ControlMessage::Resend {
            file_id: 9,
            index: 1 << 33,
        });
        round_trip(ControlMessage::Done);
        round_trip(ControlMessage::Cancel {
            reason: CancelReason::Other(200),
            detail: "nope \u{1b}[31m".into(),
        });
        round_trip(ControlMessage::Text("hello \u{1b}[31m wörld".into()));
        round_trip(ControlMessage::Text(String::new()));
    }

    #[test]
    fn text_is_cut_at_a_character_and_must_be_utf8() {
        let mut out = Vec::new();
        ControlMessage::Text("é".repeat(MAX_TEXT_LEN)).encode(&mut out);
        let Ok(Decoded::Message(ControlMessage::Text(text), _)) = ControlMessage::decode(&out)
        else {
            panic!("decodes")
        };
        assert_eq!(text.len(), MAX_TEXT_LEN);
        assert!(ControlMessage::decode(&frame(TYPE_TEXT, &[0xff])).is_err());
    }

    #[test]
    fn cancel_detail_is_cut_at_a_character() {
        let mut out = Vec::new();
        ControlMessage::Cancel {
            reason: CancelReason::Declined,
            detail: "é".repeat(MAX_DETAIL_LEN),
        }
        .encode(&mut out);
        let Ok(Decoded::Message(ControlMessage::Cancel { detail, .. }, _)) =
            ControlMessage::decode(&out)
        else {
            panic!("decodes")
        };
        assert_eq!(detail.len(), MAX_DETAIL_LEN);
    }

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        put_varint(&mut out, body.len() as u64);
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn bad_messages_are_refused() {
        let bad = |kind, body: &[u8]| ControlMessage::decode(&frame(kind, body)).is_err();
        assert!(bad(0x00, b""));
        assert!(bad(0x7f, b""));
        assert!(bad(TYPE_HELLO, &[0, 1]));
        assert!(bad(TYPE_HELLO, &[2, 1]));
        assert!(bad(TYPE_HELLO, &[1, 1, 0]));
        assert!(bad(TYPE_DONE, &[0]));
        assert!(bad(TYPE_CANCEL, &[1, 0xff]));
        assert!(bad(TYPE_FILE_DONE, &[0xc0, 0, 0, 1, 0, 0, 0, 0]));
        // Accept: out-of-order ids, empty, touching or reversed ranges, no ranges.
        assert!(bad(TYPE_ACCEPT, &[2, 1, 1, 0, 1, 0, 1, 0, 1]));
        assert!(bad(TYPE_ACCEPT, &[1, 0, 1, 3, 3]));
        assert!(bad(TYPE_ACCEPT, &[1, 0, 2, 0, 2, 2, 3]));
        assert!(bad(TYPE_ACCEPT, &[1, 0, 1, 4, 3]));
        assert!(bad(TYPE_ACCEPT, &[1, 0, 0]));
        assert!(bad(TYPE_ACCEPT, &[1, 0, 1, 0]));
        // An oversized length is refused from the prefix alone.
        let mut huge = vec![TYPE_DONE];
        put_varint(&mut huge, 1 << 30);
        assert!(matches!(
            ControlMessage::decode(&huge),
            Err(ControlError::TooLong { .. })
        ));
        let mut manifest = vec![TYPE_MANIFEST];
        put_varint(&mut manifest, MAX_MANIFEST_LEN as u64 + 1);
        assert!(ControlMessage::decode(&manifest).is_err());
        // A non-canonical length.
        assert!(ControlMessage::decode(&[TYPE_DONE, 0x40, 0x00]).is_err());
    }
}
