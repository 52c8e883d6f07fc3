//! BLAKE3 per 1 MiB chunk, computed as bytes go by: the sender hashes what it reads, the
//! receiver what it writes, and nobody makes a pass over the files first (a pre-pass is
//! what makes croc slow to show its code).
//!
//! * [`ChunkHasher`]: feed a file's bytes in any pieces; it yields each chunk's hash as the
//!   chunk completes (the sender, and a receiver writing a stream).
//! * [`FrameCheck`]: checks one received data frame against the hash it carries.
//! * [`hash_chunk_at`]: re-hashes one chunk from disk (resume).

use std::collections::VecDeque;

use warren_proto::files::ChunkHash;
use warren_proto::files::chunk::{CHUNK_SIZE, ChunkHeader, chunk_len};

/// Hashes a file's bytes chunk by chunk as they are fed in, in any piece sizes.
#[derive(Debug, Clone)]
pub struct ChunkHasher {
    hasher: blake3::Hasher,
    /// Bytes of the current chunk fed so far (< CHUNK_SIZE).
    filled: u64,
    /// Index of the chunk being hashed.
    index: u64,
    /// Finished chunks not yet taken by [`ChunkHasher::poll_chunk`].
    completed: VecDeque<(u64, ChunkHash)>,
}

impl Default for ChunkHasher {
    fn default() -> Self {
        ChunkHasher::starting_at(0)
    }
}

impl ChunkHasher {
    /// A hasher for a file read from its start.
    pub fn new() -> ChunkHasher {
        ChunkHasher::default()
    }

    /// A hasher for a file read from the start of chunk `index` (a resumed transfer).
    pub fn starting_at(index: u64) -> ChunkHasher {
        ChunkHasher {
            hasher: blake3::Hasher::new(),
            filled: 0,
            index,
            completed: VecDeque::new(),
        }
    }

    /// Feeds the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = CHUNK_SIZE - self.filled;
            // `room` ≤ CHUNK_SIZE, so it fits a usize on every platform Warren builds for.
            let take = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let (now, rest) = data.split_at(take);
            self.hasher.update(now);
            self.filled += take as u64;
            data = rest;
            if self.filled == CHUNK_SIZE {
                self.completed
                    .push_back((self.index, *self.hasher.finalize().as_bytes()));
                self.hasher.reset();
                self.filled = 0;
                self.index += 1;
            }
        }
    }

    /// The next finished chunk: its index and hash.
    pub fn poll_chunk(&mut self) -> Option<(u64, ChunkHash)> {
        self.completed.pop_front()
    }

    /// Ends the file: the hash of the last, short chunk, if the file did not end on a
    /// chunk boundary. Finished chunks not yet polled are dropped: poll them first.
    pub fn finish(self) -> Option<(u64, ChunkHash)> {
        (self.filled > 0).then(|| (self.index, *self.hasher.finalize().as_bytes()))
    }
}

/// A received chunk whose bytes do not hash to what its frame said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "chunk {index} of file {file_id} arrived damaged (its hash does not match): it will be asked for again"
)]
pub struct ChunkMismatch {
    /// The file.
    pub file_id: u32,
    /// The chunk.
    pub index: u64,
}

/// Checks one data frame's payload, fed as it is written, against the frame's hash.
#[derive(Debug, Clone)]
pub struct FrameCheck {
    header: ChunkHeader,
    hasher: blake3::Hasher,
}

impl FrameCheck {
    /// Starts checking the payload of `header`'s frame.
    pub fn new(header: ChunkHeader) -> FrameCheck {
        FrameCheck {
            header,
            hasher: blake3::Hasher::new(),
        }
    }

    /// Feeds payload bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    /// The payload is complete: its hash, if it is the one the frame carried.
    ///
    /// # Errors
    ///
    /// [`ChunkMismatch`] if it is not (the chunk is then requested again).
    pub fn finish(self) -> Result<ChunkHash, ChunkMismatch> {
        let actual = self.hasher.finalize();
        // `blake3::Hash` compares in constant time (not that a chunk hash is a secret).
        if actual == blake3::Hash::from_bytes(self.header.hash) {
            Ok(*actual.as_bytes())
        } else {
            Err(ChunkMismatch {
                file_id: self.header.file_id,
                index: self.header.index(),
            })
        }
    }
}

/// Re-hashes chunk `index` of a file of `size` bytes from disk; `None` if the chunk is past
/// the end of `size`, or the file on disk is too short to hold it.
///
/// # Errors
///
/// Read errors.
#[cfg(unix)]
pub fn hash_chunk_at(
    file: &std::fs::File,
    size: u64,
    index: u64,
) -> std::io::Result<Option<ChunkHash>> {
    use std::os::unix::fs::FileExt;

    let Some(len) = chunk_len(size, index) else {
        return Ok(None);
    };
    let mut offset = index * CHUNK_SIZE;
    let end = offset + len;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 256 << 10];
    while offset < end {
        let want = usize::try_from(end - offset)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let got = match file.read_at(&mut buf[..want], offset) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..got]);
        offset += got as u64;
    }
    Ok(Some(*hasher.finalize().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic test pattern.
    pub(crate) fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn reference(data: &[u8]) -> Vec<(u64, ChunkHash)> {
        data.chunks(CHUNK_SIZE as usize)
            .enumerate()
            .map(|(i, c)| (i as u64, *blake3::hash(c).as_bytes()))
            .collect()
    }

    fn streamed(data: &[u8], piece: usize) -> Vec<(u64, ChunkHash)> {
        let mut hasher = ChunkHasher::new();
        let mut out = Vec::new();
        for p in data.chunks(piece) {
            hasher.update(p);
            while let Some(c) = hasher.poll_chunk() {
                out.push(c);
            }
        }
        out.extend(hasher.finish());
        out
    }

    #[test]
    fn streaming_matches_whole_chunks_for_any_piece_size() {
        let mb = CHUNK_SIZE as usize;
        for len in [0, 1, mb - 1, mb, mb + 1, 3 * mb + 12_345] {
            let data = pattern(len);
            let expected = reference(&data);
            for piece in [1 << 10, 64 << 10, 1_000_003, 4 << 20] {
                if len > mb && piece == 1 << 10 {
                    continue; // slow in debug builds, and covered by the other sizes
                }
                assert_eq!(streamed(&data, piece), expected, "len {len} piece {piece}");
            }
        }
    }

    #[test]
    fn resumed_hasher_numbers_from_its_start() {
        let data = pattern(CHUNK_SIZE as usize + 10);
        let mut hasher = ChunkHasher::starting_at(5);
        hasher.update(&data);
        assert_eq!(
            hasher.poll_chunk(),
            Some((5, *blake3::hash(&data[..CHUNK_SIZE as usize]).as_bytes()))
        );
        assert_eq!(
            hasher.finish(),
            Some((6, *blake3::hash(&data[CHUNK_SIZE as usize..]).as_bytes()))
        );
    }

    #[test]
    fn frame_check_finds_a_damaged_chunk() {
        let data = pattern(1000);
        let header = ChunkHeader {
            file_id: 3,
            offset: 2 * CHUNK_SIZE,
            len: 1000,
            hash: *blake3::hash(&data).as_bytes(),
        };
        let mut check = FrameCheck::new(header);
        check.update(&data[..500]);
        check.update(&data[500..]);
        assert_eq!(check.finish(), Ok(header.hash));

        let mut damaged = data.clone();
        damaged[999] ^= 1;
        let mut check = FrameCheck::new(header);
        check.update(&damaged);
        assert_eq!(
            check.finish(),
            Err(ChunkMismatch {
                file_id: 3,
                index: 2
            })
        );
    }

    #[cfg(unix)]
    #[test]
    fn chunks_rehash_from_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let data = pattern(2 * CHUNK_SIZE as usize + 77);
        std::fs::write(&path, &data).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        let size = data.len() as u64;
        let expected = reference(&data);
        for (index, hash) in &expected {
            assert_eq!(
                hash_chunk_at(&file, size, *index).expect("read"),
                Some(*hash)
            );
        }
        assert_eq!(hash_chunk_at(&file, size, 3).expect("read"), None);
        // The manifest says the file is longer than what is on disk.
        assert_eq!(
            hash_chunk_at(&file, size + CHUNK_SIZE, 3).expect("read"),
            None
        );
    }
}
