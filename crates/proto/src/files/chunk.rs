//! Chunks: how a file is cut for transfer, hashing and resume, and the header of the data
//! frame that carries one chunk.
//!
//! A file is cut into [`CHUNK_SIZE`] chunks (the last one shorter); chunk `i` covers bytes
//! `[i·CHUNK_SIZE, min((i+1)·CHUNK_SIZE, size))`. Each chunk travels as one data frame,
//! carrying the BLAKE3 hash of its bytes as the sender read them, which the receiver
//! checks while it writes (a mismatch means the chunk is asked for again) and keeps in its
//! resume sidecar.
//!
//! # Data frame (on a data stream, frames back to back)
//!
//! ```text
//! frame: file_id(varint)  offset(varint)  len(varint)  blake3(32 bytes)  bytes(len)
//! ```
//!
//! Integers are QUIC varints in their shortest form. `offset` is a multiple of
//! [`CHUNK_SIZE`] and `len` is exactly that chunk's length for the file's size in the
//! manifest ([`ChunkHeader::check`]), so a frame names one whole chunk and a peer cannot
//! make the receiver write outside a file's declared size. An empty file has no frames.

use super::wire::{MAX_VARINT, Reader, WireError, put_varint, varint_len};

/// Bytes per chunk: 1 MiB.
pub const CHUNK_SIZE: u64 = 1 << 20;

/// The BLAKE3 hash of one chunk.
pub type ChunkHash = [u8; 32];

/// The longest frame header: three 8-byte varints and the hash.
pub const MAX_HEADER_LEN: usize = 3 * 8 + 32;

/// Number of chunks of a file of `size` bytes (0 for an empty file).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_SIZE)
}

/// Length of chunk `index` of a file of `size` bytes, or `None` past the end.
pub fn chunk_len(size: u64, index: u64) -> Option<u64> {
    let start = index.checked_mul(CHUNK_SIZE)?;
    (start < size).then(|| (size - start).min(CHUNK_SIZE))
}

/// The header of a data frame; its `len` payload bytes follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Index of the file in the manifest.
    pub file_id: u32,
    /// Where the chunk starts in the file (a multiple of [`CHUNK_SIZE`]).
    pub offset: u64,
    /// Payload length (1..=[`CHUNK_SIZE`]).
    pub len: u32,
    /// BLAKE3 of the payload.
    pub hash: ChunkHash,
}

/// What [`ChunkHeader::decode`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// A header and how many bytes it took.
    Header(ChunkHeader, usize),
    /// The buffer ends inside the header: read more (at most [`MAX_HEADER_LEN`] in all).
    NeedMore,
}

/// A data frame header that is malformed or does not fit the manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// An integer in a longer form than needed.
    #[error("data frame has a badly encoded number: the sender is broken or hostile")]
    NonCanonical,
    /// A file id that does not fit 32 bits.
    #[error(
        "data frame names file {file_id}, which does not exist: the sender is broken or hostile"
    )]
    BadFileId {
        /// The id received.
        file_id: u64,
    },
    /// A payload length of zero or over [`CHUNK_SIZE`].
    #[error(
        "data frame of {len} bytes is empty or longer than a {max}-byte chunk: the sender is broken or hostile"
    )]
    BadLength {
        /// The length received.
        len: u64,
        /// [`CHUNK_SIZE`].
        max: u64,
    },
    /// An offset that is not the start of a chunk.
    #[error(
        "data frame at offset {offset} is not at a chunk boundary: the sender is broken or hostile"
    )]
    Unaligned {
        /// The offset received.
        offset: u64,
    },
    /// The frame does not match the file's chunking in the manifest.
    #[error(
        "data frame for file {file_id} at offset {offset} with {len} bytes does not match the file's size of {size} bytes: the sender is broken or hostile"
    )]
    OutsideFile {
        /// The file.
        file_id: u32,
        /// The offset received.
        offset: u64,
        /// The length received.
        len: u32,
        /// The file's size in the manifest.
        size: u64,
    },
}

impl From<WireError> for ChunkError {
    fn from(_: WireError) -> Self {
        // `Truncated` never gets here: `decode` reports it as `NeedMore`.
        ChunkError::NonCanonical
    }
}

impl ChunkHeader {
    /// Chunk index in the file.
    pub fn index(&self) -> u64 {
        self.offset / CHUNK_SIZE
    }

    /// Appends the header (not the payload).
    ///
    /// # Panics
    ///
    /// If `offset` exceeds the varint range (2^62 − 1): a sender only frames files from
    /// its own manifest, whose sizes are bounded (an internal error).
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert!(self.offset <= MAX_VARINT, "offset out of range");
        put_varint(out, u64::from(self.file_id));
        put_varint(out, self.offset);
        put_varint(out, u64::from(self.len));
        out.extend_from_slice(&self.hash);
    }

    /// Encoded length of this header.
    pub fn encoded_len(&self) -> usize {
        varint_len(u64::from(self.file_id))
            + varint_len(self.offset.min(MAX_VARINT))
            + varint_len(u64::from(self.len))
            + 32
    }

    /// Reads a header from the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`ChunkError`] if the header is malformed, whatever follows; a header that is only
    /// cut short is [`Decoded::NeedMore`], never an error.
    pub fn decode(buf: &[u8]) -> Result<Decoded, ChunkError> {
        let mut r = Reader::new(buf);
        let fields = (|| Ok::<_, WireError>((r.varint()?, r.varint()?, r.varint()?, r.array()?)))();
        let (file_id, offset, len, hash) = match fields {
            Ok(fields) => fields,
            Err(WireError::Truncated) => return Ok(Decoded::NeedMore),
            Err(e) => return Err(e.into()),
        };
        let file_id = u32::try_from(file_id).map_err(|_| ChunkError::BadFileId { file_id })?;
        if len == 0 || len > CHUNK_SIZE {
            return Err(ChunkError::BadLength {
                len,
                max: CHUNK_SIZE,
            });
        }
        if !offset.is_multiple_of(CHUNK_SIZE) {
            return Err(ChunkError::Unaligned { offset });
        }
        let header = ChunkHeader {
            file_id,
            offset,
            // At most CHUNK_SIZE, checked above.
            len: len as u32,
            hash,
        };
        Ok(Decoded::Header(header, buf.len() - r.remaining()))
    }

    /// Checks the header against the size the manifest gives its file: it must be exactly
    /// one of the file's chunks.
    ///
    /// # Errors
    ///
    /// [`ChunkError::OutsideFile`] otherwise.
    pub fn check(&self, size: u64) -> Result<(), ChunkError> {
        if chunk_len(size, self.index()) == Some(u64::from(self.len))
            && self.offset.is_multiple_of(CHUNK_SIZE)
        {
            Ok(())
        } else {
            Err(ChunkError::OutsideFile {
                file_id: self.file_id,
                offset: self.offset,
                len: self.len,
                size,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_math() {
        assert_eq!(chunk_count(0), 0);
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(CHUNK_SIZE), 1);
        assert_eq!(chunk_count(CHUNK_SIZE + 1), 2);
        assert_eq!(chunk_len(0, 0), None);
        assert_eq!(chunk_len(10, 0), Some(10));
        assert_eq!(chunk_len(CHUNK_SIZE + 10, 0), Some(CHUNK_SIZE));
        assert_eq!(chunk_len(CHUNK_SIZE + 10, 1), Some(10));
        assert_eq!(chunk_len(CHUNK_SIZE + 10, 2), None);
        assert_eq!(chunk_len(u64::MAX, u64::MAX), None);
    }

    #[test]
    fn header_round_trip_and_need_more() {
        let header = ChunkHeader {
            file_id: 70_000,
            offset: 3 * CHUNK_SIZE,
            len: 12,
            hash: [7; 32],
        };
        let mut out = Vec::new();
        header.encode(&mut out);
        assert_eq!(out.len(), header.encoded_len());
        out.extend_from_slice(b"payload-here");
        assert_eq!(
            ChunkHeader::decode(&out),
            Ok(Decoded::Header(header, header.encoded_len()))
        );
        for cut in 0..header.encoded_len() {
            assert_eq!(ChunkHeader::decode(&out[..cut]), Ok(Decoded::NeedMore));
        }
        assert_eq!(header.index(), 3);
        assert_eq!(header.check(3 * CHUNK_SIZE + 12), Ok(()));
        assert!(header.check(3 * CHUNK_SIZE + 13).is_err());
        assert!(header.check(3 * CHUNK_SIZE + 11).is_err());
        assert!(header.check(3 * CHUNK_SIZE).is_err());
    }

    fn raw(file_id: u64, offset: u64, len: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, file_id);
        put_varint(&mut out, offset);
        put_varint(&mut out, len);
        out.extend_from_slice(&[0; 32]);
        out
    }

    #[test]
    fn malformed_headers_are_refused() {
        assert_eq!(
            ChunkHeader::decode(&raw(1 << 32, 0, 1)),
            Err(ChunkError::BadFileId { file_id: 1 << 32 })
        );
        assert_eq!(
            ChunkHeader::decode(&raw(0, 0, 0)),
            Err(ChunkError::BadLength {
                len: 0,
                max: CHUNK_SIZE
            })
        );
        assert_eq!(
            ChunkHeader::decode(&raw(0, 0, CHUNK_SIZE + 1)),
            Err(ChunkError::BadLength {
                len: CHUNK_SIZE + 1,
                max: CHUNK_SIZE
            })
        );
        assert_eq!(
            ChunkHeader::decode(&raw(0, 5, 1)),
            Err(ChunkError::Unaligned { offset: 5 })
        );
        assert_eq!(
            ChunkHeader::decode(&[0x40, 0x01]),
            Err(ChunkError::NonCanonical)
        );
        // A whole chunk in a one-chunk file is fine; a frame past the end is not.
        let Ok(Decoded::Header(h, _)) = ChunkHeader::decode(&raw(0, CHUNK_SIZE, CHUNK_SIZE)) else {
            panic!("valid header")
        };
        assert!(h.check(CHUNK_SIZE).is_err());
        assert_eq!(h.check(2 * CHUNK_SIZE), Ok(()));
    }
}
