//! Resuming a partial file: the sidecar that records what was written, and what of it can
//! be trusted when the same transfer runs again.
//!
//! Beside each temporary file (`.NAME.warren-part`) the receiver keeps a sidecar
//! (`.NAME.warren-resume`): the identity of the manifest entry it belongs to, then one
//! record per chunk written, appended after the chunk's data was written (so a kill
//! between the two loses the record, never claims data that was not written). On resume
//! ([`prepare`]):
//!
//! 1. the sidecar's identity (name, size, mtime, and a BLAKE3 hash of the whole manifest
//!    entry) must match the new manifest entry, or the file starts over: a different file
//!    with the same name must not be stitched onto old bytes;
//! 2. claimed chunks are re-hashed from disk before they are trusted: always the last one
//!    written (a crash can lose data the kernel had not flushed, and that is where it
//!    shows), and with [`ResumeCheck::Everything`] all of them, which also finds damage
//!    anywhere in the file (a flipped bit, a disk error, someone editing the partial file);
//! 3. chunks that do not match are dropped and will be asked for again; the sidecar is
//!    rewritten with only what was trusted.
//!
//! The sidecar is local, but it is still read as untrusted input: bounded, never panics,
//! and anything unreadable means "start over", not an error.
//!
//! # Sidecar format (version 1)
//!
//! ```text
//! header:  magic "WRNRESUM"  version(u8 = 1)  name_len(u16 BE)  name  size(u64 BE)
//!          mtime(u64 BE)  entry_hash(32)
//! record:  chunk_index(u64 BE)  blake3_of_chunk(32)      (appended; a later record for
//!                                                         the same chunk replaces it)
//! ```
//!
//! `entry_hash` is BLAKE3 in key-derivation mode (context `warren-files/1 resume entry`)
//! of the entry's manifest encoding ([`Entry::identity_bytes`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use warren_proto::files::chunk::chunk_count;
use warren_proto::files::{ChunkHash, Entry};

use super::chunks::hash_chunk_at;
use super::write::{PartFile, WriteError};

const MAGIC: &[u8; 8] = b"WRNRESUM";
const VERSION: u8 = 1;
const RECORD_LEN: u64 = 8 + 32;
const ENTRY_HASH_CONTEXT: &str = "warren-files/1 resume entry";

/// How much of what a sidecar claims is re-hashed from disk before it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeCheck {
    /// Only the last chunk written: cheap, and catches what a crash loses.
    Tail,
    /// Every claimed chunk: reads the whole partial file once, and catches damage anywhere.
    Everything,
}

/// Why a partial file starts over instead of resuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOver {
    /// No sidecar (a first run, or a temporary file without one: its bytes are unknown).
    NoSidecar,
    /// The sidecar is damaged, from another version, or absurdly large.
    Unreadable,
    /// The sidecar belongs to another manifest entry (the file changed on the sender, or
    /// it is another file with the same name).
    DifferentEntry,
}

/// Resuming failed on a file-system error (not on what the files contain, which only ever
/// leads to starting over).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The sidecar could not be opened.
    #[error(transparent)]
    Open(#[from] WriteError),
    /// Reading or writing the partial file or its sidecar failed.
    #[error("cannot {op} the partial file of `{name}`: {source}: check the output folder's disk")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The entry, escaped.
        name: String,
        /// The error.
        source: io::Error,
    },
}

/// The sidecar of one partial file, open for appending records.
#[derive(Debug)]
pub struct Sidecar {
    file: File,
    /// Where the next record goes.
    end: u64,
}

impl Sidecar {
    /// Records that chunk `index`, with hash `hash`, is on disk. Call it after the chunk's
    /// data was written.
    ///
    /// # Errors
    ///
    /// Write errors.
    pub fn record(&mut self, index: u64, hash: &ChunkHash) -> io::Result<()> {
        let mut rec = [0u8; RECORD_LEN as usize];
        rec[..8].copy_from_slice(&index.to_be_bytes());
        rec[8..].copy_from_slice(hash);
        self.file.write_all_at(&rec, self.end)?;
        self.end += RECORD_LEN;
        Ok(())
    }
}

/// What a partial file holds that can be trusted, and the sidecar to keep recording in.
#[derive(Debug)]
pub struct Resume {
    /// The sidecar, rewritten with only the trusted chunks.
    pub sidecar: Sidecar,
    /// Trusted chunks: index → hash.
    pub have: BTreeMap<u64, ChunkHash>,
    /// Bytes in the trusted chunks.
    pub have_bytes: u64,
    /// Claimed chunks that did not match the disk and will be asked for again.
    pub damaged: Vec<u64>,
    /// Set when nothing was resumed, and why.
    pub started_over: Option<StartOver>,
}

impl Resume {
    /// The chunks still to receive, as half-open index ranges, in order.
    pub fn missing(&self, size: u64) -> Vec<std::ops::Range<u64>> {
        let mut out = Vec::new();
        let mut next = 0;
        for &index in self.have.keys() {
            if index > next {
                out.push(next..index);
            }
            next = index + 1;
        }
        let count = chunk_count(size);
        if next < count {
            out.push(next..count);
        }
        out
    }
}

/// The identity hash of a manifest entry, as kept in its sidecar.
pub fn entry_hash(entry: &Entry) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(ENTRY_HASH_CONTEXT);
    hasher.update(&entry.identity_bytes());
    *hasher.finalize().as_bytes()
}

/// Opens `part`'s sidecar and works out what of the partial file to keep for `entry` (see
/// the module docs); on a mismatch, empties the partial file and starts a new sidecar.
///
/// # Errors
///
/// [`ResumeError`] on file-system errors only.
pub fn prepare(part: &PartFile, entry: &Entry, check: ResumeCheck) -> Result<Resume, ResumeError> {
    let io_err = |op: &'static str| {
        let name = part.name().escaped();
        move |source: io::Error| ResumeError::Io { op, name, source }
    };
    let file = part.open_sidecar()?;
    let header = header_bytes(entry);
    let loaded = read_sidecar(&file, &header, entry.size).map_err(io_err("read the sidecar of"))?;
    let (claims, last, started_over) = match loaded {
        Ok((claims, last)) => (claims, last, None),
        Err(reason) => (BTreeMap::new(), None, Some(reason)),
    };

    let data = part.file();
    let mut have = BTreeMap::new();
    let mut damaged = Vec::new();
    for (&index, hash) in &claims {
        let trusted = match check {
            ResumeCheck::Everything => false,
            ResumeCheck::Tail => Some(index) != last,
        };
        let good = trusted
            || hash_chunk_at(data, entry.size, index).map_err(io_err("re-hash"))? == Some(*hash);
        if good {
            have.insert(index, *hash);
        } else {
            damaged.push(index);
        }
    }
    if started_over.is_some() {
        data.set_len(0).map_err(io_err("empty"))?;
    }

    // Rewrite the sidecar with the trusted records only: a damaged claim must not survive
    // into the next resume, and the file is compacted.
    let mut bytes = header;
    for (index, hash) in &have {
        bytes.extend_from_slice(&index.to_be_bytes());
        bytes.extend_from_slice(hash);
    }
    file.set_len(0).map_err(io_err("rewrite the sidecar of"))?;
    file.write_all_at(&bytes, 0)
        .map_err(io_err("rewrite the sidecar of"))?;
    file.sync_data().map_err(io_err("flush the sidecar of"))?;
    let have_bytes = have
        .keys()
        .filter_map(|&i| warren_proto::files::chunk::chunk_len(entry.size, i))
        .sum();
    Ok(Resume {
        sidecar: Sidecar {
            file,
            end: bytes.len() as u64,
        },
        have,
        have_bytes,
        damaged,
        started_over,
    })
}

/// Starts `part` afresh for `entry`: empties the partial file and writes a sidecar with
/// no records. For a file no past run began ([`prepare`] is for those), so nothing is
/// re-hashed and nothing is flushed: a crash before the sidecar reaches the disk only
/// means starting over, as for a missing sidecar.
///
/// # Errors
///
/// [`ResumeError`] on file-system errors.
pub fn start(part: &PartFile, entry: &Entry) -> Result<Sidecar, ResumeError> {
    let io_err = |op: &'static str| {
        let name = part.name().escaped();
        move |source: io::Error| ResumeError::Io { op, name, source }
    };
    let file = part.open_sidecar()?;
    part.file().set_len(0).map_err(io_err("empty"))?;
    let header = header_bytes(entry);
    file.set_len(0).map_err(io_err("write the sidecar of"))?;
    file.write_all_at(&header, 0)
        .map_err(io_err("write the sidecar of"))?;
    Ok(Sidecar {
        file,
        end: header.len() as u64,
    })
}

fn header_bytes(entry: &Entry) -> Vec<u8> {
    let name = entry.name.as_str().as_bytes();
    let mut out = Vec::with_capacity(8 + 1 + 2 + name.len() + 8 + 8 + 32);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    // A SafeName is at most 4096 bytes.
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(&entry.size.to_be_bytes());
    out.extend_from_slice(&entry.mtime.to_be_bytes());
    out.extend_from_slice(&entry_hash(entry));
    out
}

/// The claims of a sidecar whose header is exactly `header`: index → hash (the last
/// record per index wins) and the index of the last record. `Ok(Err(reason))` when the
/// sidecar cannot be used.
#[allow(clippy::type_complexity)]
fn read_sidecar(
    file: &File,
    header: &[u8],
    size: u64,
) -> io::Result<Result<(BTreeMap<u64, ChunkHash>, Option<u64>), StartOver>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Err(StartOver::NoSidecar));
    }
    let count = chunk_count(size);
    // Each chunk is recorded about once; allow re-sent chunks, refuse the absurd.
    let max_len = (header.len() as u64)
        .saturating_add(RECORD_LEN.saturating_mul(count.saturating_mul(2) + 64));
    if len > max_len || len < header.len() as u64 {
        return Ok(Err(StartOver::Unreadable));
    }
    // Bounded just above by the entry's chunk count; a file that large is being received
    // into a buffer of 40 bytes per MiB of it.
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)?;
    let (found, records) = bytes.split_at(header.len());
    if found[..MAGIC.len() + 1] != header[..MAGIC.len() + 1] {
        return Ok(Err(StartOver::Unreadable));
    }
    if found != header {
        return Ok(Err(StartOver::DifferentEntry));
    }
    let mut claims = BTreeMap::new();
    let mut last = None;
    // A torn last record (a kill mid-append) is ignored.
    for rec in records.chunks_exact(RECORD_LEN as usize) {
        let (index, hash) = rec.split_at(8);
        let index = u64::from_be_bytes(index.try_into().unwrap_or_default());
        let Ok(hash) = <ChunkHash>::try_from(hash) else {
            continue;
        };
        if index < count {
            claims.insert(index, hash);
            last = Some(index);
        }
    }
    Ok(Ok((claims, last)))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use warren_proto::files::chunk::CHUNK_SIZE;
    use warren_proto::files::{Mode, SafeName};

    use super::super::chunks::ChunkHasher;
    use super::super::write::{OutputDir, WriteOptions};
    use super::*;

    const MB: usize = CHUNK_SIZE as usize;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 4093) as u8).collect()
    }

    fn entry(size: usize) -> Entry {
        Entry::file(
            SafeName::new("dir/big.bin").expect("valid"),
            size as u64,
            Mode::Regular,
            1_700_000_000,
        )
    }

    /// Receives `data[..upto]` the way a receiver does: write, hash as it goes, record
    /// each finished chunk after its data; then "dies" (drops everything, no finish).
    fn receive_until(out: &Path, entry: &Entry, data: &[u8], upto: usize) {
        let mut dir = OutputDir::open(out, WriteOptions::default()).expect("open");
        let part = dir.open_part(&entry.name, entry.mode).expect("part");
        let mut resume = prepare(&part, entry, ResumeCheck::Tail).expect("prepare");
        let mut hasher = ChunkHasher::new();
        let mut at = 0;
        for piece in data[..upto].chunks(300_000) {
            part.file().write_all_at(piece, at as u64).expect("write");
            at += piece.len();
            hasher.update(piece);
            while let Some((index, hash)) = hasher.poll_chunk() {
                resume.sidecar.record(index, &hash).expect("record");
            }
        }
        if upto == data.len()
            && let Some((index, hash)) = hasher.finish()
        {
            resume.sidecar.record(index, &hash).expect("record");
        }
    }

    fn resume_again(out: &Path, entry: &Entry, check: ResumeCheck) -> Resume {
        let mut dir = OutputDir::open(out, WriteOptions::default()).expect("open");
        let part = dir.open_part(&entry.name, entry.mode).expect("part");
        prepare(&part, entry, check).expect("prepare")
    }

    fn part_path(out: &Path) -> std::path::PathBuf {
        out.join("dir/.big.bin.warren-part")
    }

    #[test]
    fn a_kill_half_way_resumes_from_about_half() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = 10 * MB + 1234;
        let data = pattern(size);
        let e = entry(size);
        // Killed a little past half way: in the middle of chunk 5.
        receive_until(tmp.path(), &e, &data, 5 * MB + MB / 3);

        let resume = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(resume.started_over, None);
        assert_eq!(
            resume.have.keys().copied().collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        let fraction = resume.have_bytes as f64 / size as f64;
        assert!((0.45..=0.55).contains(&fraction), "claims {fraction}");
        assert_eq!(
            resume.missing(e.size),
            vec![std::ops::Range { start: 5, end: 11 }]
        );
        assert!(resume.damaged.is_empty());

        // Everything re-hashed agrees.
        let all = resume_again(tmp.path(), &e, ResumeCheck::Everything);
        assert_eq!(all.have, resume.have);
    }

    #[test]
    fn one_corrupted_byte_is_found() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = 6 * MB;
        let data = pattern(size);
        let e = entry(size);
        receive_until(tmp.path(), &e, &data, 4 * MB);
        let path = part_path(tmp.path());

        // One byte in the middle of chunk 1: only a full check finds it.
        let mut bytes = fs::read(&path).expect("read");
        bytes[MB + 4321] ^= 0x20;
        fs::write(&path, &bytes).expect("corrupt");
        let tail = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert!(
            tail.damaged.is_empty(),
            "the tail check only reads the last chunk"
        );
        let all = resume_again(tmp.path(), &e, ResumeCheck::Everything);
        assert_eq!(all.damaged, [1]);
        assert_eq!(all.have.keys().copied().collect::<Vec<_>>(), [0, 2, 3]);
        assert_eq!(all.missing(e.size), [1..2, 4..6]);
        // The damaged claim is gone from the sidecar: the next (cheap) resume agrees.
        let again = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(again.have, all.have);

        // One byte in the last chunk written: the cheap check finds it.
        let mut bytes = fs::read(&path).expect("read");
        bytes[3 * MB + 7] ^= 0x01;
        fs::write(&path, &bytes).expect("corrupt");
        let tail = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(tail.damaged, [3]);
    }

    #[test]
    fn data_lost_in_a_crash_is_not_trusted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = 3 * MB;
        let data = pattern(size);
        let e = entry(size);
        receive_until(tmp.path(), &e, &data, 2 * MB);
        // The sidecar reached the disk, but the last chunk's data did not.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(part_path(tmp.path()))
            .expect("open");
        file.set_len(MB as u64 + 10).expect("truncate");
        let resume = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(resume.have.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(resume.damaged, [1]);
    }

    #[test]
    fn a_different_entry_starts_over() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = 2 * MB;
        let data = pattern(size);
        let e = entry(size);
        receive_until(tmp.path(), &e, &data, MB + 5);

        for changed in [
            Entry {
                mtime: e.mtime + 1,
                ..e.clone()
            },
            Entry {
                size: e.size + 1,
                ..e.clone()
            },
            Entry {
                mode: Mode::Executable,
                ..e.clone()
            },
        ] {
            receive_until(tmp.path(), &e, &data, MB + 5);
            let resume = resume_again(tmp.path(), &changed, ResumeCheck::Tail);
            assert_eq!(resume.started_over, Some(StartOver::DifferentEntry));
            assert!(resume.have.is_empty());
            assert_eq!(fs::metadata(part_path(tmp.path())).expect("meta").len(), 0);
        }
    }

    #[test]
    fn damaged_or_missing_sidecars_start_over() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = 2 * MB;
        let data = pattern(size);
        let e = entry(size);
        let sidecar = tmp.path().join("dir/.big.bin.warren-resume");

        // A partial file without a sidecar: its bytes are unknown.
        fs::create_dir_all(tmp.path().join("dir")).expect("dir");
        fs::write(part_path(tmp.path()), &data[..MB]).expect("orphan");
        let resume = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(resume.started_over, Some(StartOver::NoSidecar));

        for garbage in [
            &b"WRNRESUM\x02"[..],
            b"not a sidecar at all, just some bytes",
            b"x",
        ] {
            receive_until(tmp.path(), &e, &data, MB);
            fs::write(&sidecar, garbage).expect("garbage");
            let resume = resume_again(tmp.path(), &e, ResumeCheck::Tail);
            assert_eq!(
                resume.started_over,
                Some(StartOver::Unreadable),
                "{garbage:?}"
            );
        }

        // A torn last record and records for chunks past the end are ignored.
        receive_until(tmp.path(), &e, &data, MB);
        let mut bytes = fs::read(&sidecar).expect("read");
        bytes.extend_from_slice(&99u64.to_be_bytes());
        bytes.extend_from_slice(&[0; 32]);
        bytes.extend_from_slice(&[1, 2, 3]);
        fs::write(&sidecar, &bytes).expect("append");
        let resume = resume_again(tmp.path(), &e, ResumeCheck::Everything);
        assert_eq!(resume.started_over, None);
        assert_eq!(resume.have.keys().copied().collect::<Vec<_>>(), [0]);

        // An absurdly large sidecar is not read.
        let mut huge = fs::read(&sidecar).expect("read");
        huge.resize(huge.len() + 100 * RECORD_LEN as usize, 0);
        fs::write(&sidecar, &huge).expect("grow");
        let resume = resume_again(tmp.path(), &e, ResumeCheck::Tail);
        assert_eq!(resume.started_over, Some(StartOver::Unreadable));
    }

    #[test]
    fn a_complete_resume_finishes_the_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let size = MB + 99;
        let data = pattern(size);
        let e = entry(size);
        receive_until(tmp.path(), &e, &data, size);
        let mut dir = OutputDir::open(tmp.path(), WriteOptions::default()).expect("open");
        let part = dir.open_part(&e.name, e.mode).expect("part");
        let resume = prepare(&part, &e, ResumeCheck::Everything).expect("prepare");
        assert!(resume.missing(e.size).is_empty());
        assert_eq!(resume.have_bytes, size as u64);
        drop(resume);
        part.finish(e.mtime).expect("finish");
        assert_eq!(
            fs::read(tmp.path().join("dir/big.bin")).expect("read"),
            data
        );
        let left: Vec<_> = fs::read_dir(tmp.path().join("dir")).expect("ls").collect();
        assert_eq!(left.len(), 1, "sidecar and part file are gone");
    }
}
