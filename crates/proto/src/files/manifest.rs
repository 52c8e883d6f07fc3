//! The manifest: the list of entries a sender offers, and its bounded binary codec.
//!
//! The receiver decodes the manifest before it accepts anything, shows its totals, and
//! then writes only entries from it, so the decoder is the gate every name passes: it
//! validates each name ([`SafeName`]), the set rules ([`NameSet`]: no twins, no file above
//! another entry) and every bound before the transfer can start.
//!
//! # Wire format (version 1)
//!
//! Integers are QUIC varints (RFC 9000 §16) in their shortest form; entries are sorted by
//! the bytes of their names, strictly increasing, so a manifest has exactly one encoding
//! (and duplicates cannot hide).
//!
//! ```text
//! manifest: version(u8 = 1)  entry_count(varint)  total_size(varint)  entry*
//! entry:    flags(u8)  name_len(varint)  name(UTF-8)  size(varint)  mtime(varint)
//! flags:    bit 0: 1 = folder, 0 = file;  bit 1: executable (files only);  others zero
//! ```
//!
//! * `entry_count` ≤ [`MAX_ENTRIES`]; the whole manifest ≤ [`MAX_MANIFEST_LEN`] bytes
//!   (the transport checks its length prefix against that before allocating).
//! * `total_size` is the sum of the files' sizes and must match it exactly; the sum never
//!   overflows (it is bounded by the varint range, 2^62 − 1).
//! * a folder's `size` is 0; `mtime` is whole seconds since the Unix epoch (a sender clamps
//!   earlier times to 0).
//! * An entry's file id, used by the data frames, is its index in this order.

use super::name::{EntryKind, NameError, NameSet, NameSetError, SafeName};
use super::wire::{MAX_VARINT, Reader, WireError, put_varint, varint_len};

/// The manifest format this code writes and reads.
pub const MANIFEST_VERSION: u8 = 1;

/// The most entries in one manifest.
pub const MAX_ENTRIES: usize = 1_000_000;

/// The longest encoded manifest, in bytes: a million entries with ~50-byte names fit.
/// Decoding one that large holds the names about four times over (entries, fold keys,
/// folders) for a few hundred MiB at the peak; typical trees are far smaller.
pub const MAX_MANIFEST_LEN: usize = 64 << 20;

/// The largest file size and total size (the varint range).
pub const MAX_SIZE: u64 = MAX_VARINT;

/// Flag bit: the entry is a folder.
const FLAG_DIR: u8 = 0x01;
/// Flag bit: the file is executable.
const FLAG_EXECUTABLE: u8 = 0x02;

/// The fewest bytes one entry takes (flags, a 1-byte length, a 1-byte name, size, mtime):
/// bounds the capacity reserved for a declared count before the entries are read.
const MIN_ENTRY_LEN: usize = 5;

/// Whether a file is executable: the only permission bit that travels (the receiver's
/// umask decides the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Not executable (`0644` before the umask).
    Regular,
    /// Executable (`0755` before the umask).
    Executable,
}

/// One entry the sender offers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Where it goes, relative to the receiver's output folder.
    pub name: SafeName,
    /// File or folder.
    pub kind: EntryKind,
    /// Size in bytes (0 for folders).
    pub size: u64,
    /// Executable bit (always [`Mode::Regular`] for folders).
    pub mode: Mode,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: u64,
}

impl Entry {
    /// A file entry.
    pub fn file(name: SafeName, size: u64, mode: Mode, mtime: u64) -> Entry {
        Entry {
            name,
            kind: EntryKind::File,
            size,
            mode,
            mtime,
        }
    }

    /// A folder entry.
    pub fn dir(name: SafeName, mtime: u64) -> Entry {
        Entry {
            name,
            kind: EntryKind::Dir,
            size: 0,
            mode: Mode::Regular,
            mtime,
        }
    }

    /// The entry's encoding, as it appears in the manifest. The resume sidecar hashes it
    /// to recognise the same entry in a later transfer.
    pub fn identity_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    fn flags(&self) -> u8 {
        let kind = match self.kind {
            EntryKind::File => 0,
            EntryKind::Dir => FLAG_DIR,
        };
        let mode = match self.mode {
            Mode::Regular => 0,
            Mode::Executable => FLAG_EXECUTABLE,
        };
        kind | mode
    }

    fn encoded_len(&self) -> usize {
        let name = self.name.as_str().len();
        1 + varint_len(name as u64)
            + name
            + varint_len(self.size.min(MAX_SIZE))
            + varint_len(self.mtime.min(MAX_VARINT))
    }

    /// Appends the entry. [`Manifest::new`] bounded the size and clamped the mtime; an
    /// entry encoded on its own ([`Entry::identity_bytes`]) is clamped the same way.
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(self.flags());
        let name = self.name.as_str().as_bytes();
        put_varint(out, name.len() as u64);
        out.extend_from_slice(name);
        put_varint(out, self.size.min(MAX_SIZE));
        put_varint(out, self.mtime.min(MAX_VARINT));
    }
}

/// A validated list of entries, sorted by name; an entry's file id is its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    entries: Vec<Entry>,
    total_size: u64,
    file_count: usize,
}

/// Why a manifest was refused (built or decoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The bytes end inside the manifest.
    #[error(
        "file list truncated: the sender's message ended early (a broken connection or a broken sender)"
    )]
    Truncated,
    /// More than [`MAX_MANIFEST_LEN`] bytes.
    #[error(
        "file list of {len} bytes is larger than the {max}-byte limit: send fewer files at once"
    )]
    TooLarge {
        /// Encoded length.
        len: usize,
        /// [`MAX_MANIFEST_LEN`].
        max: usize,
    },
    /// A version this build does not read.
    #[error(
        "file list format version {version} is not supported (this build reads version {supported}): use the same Warren version on both sides"
    )]
    UnsupportedVersion {
        /// The version byte received.
        version: u8,
        /// [`MANIFEST_VERSION`].
        supported: u8,
    },
    /// More than [`MAX_ENTRIES`] entries.
    #[error("file list has {count} entries; the limit is {max}: send fewer files at once")]
    TooManyEntries {
        /// Declared or given count.
        count: u64,
        /// [`MAX_ENTRIES`].
        max: usize,
    },
    /// An integer in a longer form than needed (the encoding must be canonical).
    #[error("file list has a badly encoded number: the sender is broken or hostile")]
    NonCanonical,
    /// An entry's name was refused.
    #[error("file list entry {index}: {source}")]
    Name {
        /// The entry's index.
        index: usize,
        /// What is wrong with the name.
        source: NameError,
    },
    /// Two entries clash.
    #[error("file list: {0}")]
    Set(#[from] NameSetError),
    /// Unknown flag bits, or an executable folder.
    #[error(
        "file list entry {index} has invalid flags {flags:#04x}: the sender is broken or hostile"
    )]
    BadFlags {
        /// The entry's index.
        index: usize,
        /// The flags byte.
        flags: u8,
    },
    /// A folder with a non-zero size.
    #[error(
        "file list entry {index} is a folder with a size of {size} bytes: the sender is broken or hostile"
    )]
    DirWithSize {
        /// The entry's index.
        index: usize,
        /// The declared size.
        size: u64,
    },
    /// A name length of zero or over the name limit.
    #[error(
        "file list entry {index} declares a name of {len} bytes: the sender is broken or hostile"
    )]
    BadNameLength {
        /// The entry's index.
        index: usize,
        /// Declared length.
        len: u64,
    },
    /// Entries out of order (or a repeated name).
    #[error("file list entry {index} is out of order: the sender is broken or hostile")]
    NotSorted {
        /// The entry's index.
        index: usize,
    },
    /// File sizes add up past [`MAX_SIZE`].
    #[error("file sizes add up to more than {max} bytes: the sender is broken or hostile")]
    TotalTooLarge {
        /// [`MAX_SIZE`].
        max: u64,
    },
    /// The declared total differs from the sum of the sizes.
    #[error(
        "file list declares {declared} bytes in total, but its files add up to {actual}: the sender is broken or hostile"
    )]
    TotalMismatch {
        /// `total_size` as sent.
        declared: u64,
        /// The sum of the entries' sizes.
        actual: u64,
    },
    /// Bytes after the last entry.
    #[error(
        "file list has {count} unexpected bytes after its last entry: the sender is broken or hostile"
    )]
    TrailingBytes {
        /// How many.
        count: usize,
    },
}

impl From<WireError> for ManifestError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Truncated => ManifestError::Truncated,
            WireError::NonCanonical => ManifestError::NonCanonical,
        }
    }
}

impl Manifest {
    /// Validates `entries` and sorts them by name.
    ///
    /// # Errors
    ///
    /// [`ManifestError`] if there are too many entries, two clash, a folder has a size, the
    /// sizes overflow or the encoding would exceed [`MAX_MANIFEST_LEN`].
    pub fn new(mut entries: Vec<Entry>) -> Result<Manifest, ManifestError> {
        if entries.len() > MAX_ENTRIES {
            return Err(ManifestError::TooManyEntries {
                count: entries.len() as u64,
                max: MAX_ENTRIES,
            });
        }
        entries.sort_by(|a, b| a.name.as_str().as_bytes().cmp(b.name.as_str().as_bytes()));
        for entry in &mut entries {
            // Clamped here, not at encoding, so a manifest round-trips exactly.
            entry.mtime = entry.mtime.min(MAX_VARINT);
        }
        let mut set = NameSet::new();
        let mut total: u64 = 0;
        let mut file_count = 0;
        let mut len = header_len(entries.len() as u64, 0);
        for (index, entry) in entries.iter().enumerate() {
            match entry.kind {
                EntryKind::Dir if entry.size != 0 => {
                    return Err(ManifestError::DirWithSize {
                        index,
                        size: entry.size,
                    });
                }
                EntryKind::Dir if entry.mode == Mode::Executable => {
                    return Err(ManifestError::BadFlags {
                        index,
                        flags: entry.flags(),
                    });
                }
                EntryKind::Dir => {}
                EntryKind::File => file_count += 1,
            }
            set.insert(&entry.name, entry.kind)?;
            total = total
                .checked_add(entry.size)
                .filter(|&t| t <= MAX_SIZE)
                .ok_or(ManifestError::TotalTooLarge { max: MAX_SIZE })?;
            len += entry.encoded_len();
        }
        len += varint_len(total) - 1;
        if len > MAX_MANIFEST_LEN {
            return Err(ManifestError::TooLarge {
                len,
                max: MAX_MANIFEST_LEN,
            });
        }
        Ok(Manifest {
            entries,
            total_size: total,
            file_count,
        })
    }

    /// The entries, sorted by name; the index is the file id.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry with file id `id`, if any.
    pub fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(usize::try_from(id).ok()?)
    }

    /// Sum of the files' sizes.
    pub fn total_size(&self) -> u64 {
        self.total_size
    }

    /// Number of files (not folders).
    pub fn file_count(&self) -> usize {
        self.file_count
    }

    /// The top-level names (first components), deduplicated, in order: what the receiver
    /// shows before accepting.
    pub fn top_level(&self) -> Vec<&str> {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .filter_map(|entry| entry.name.components().next())
            .filter(|first| seen.insert(*first))
            .collect()
    }

    /// The wire encoding.
    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self.entries.iter().map(Entry::encoded_len).sum();
        let mut out =
            Vec::with_capacity(header_len(self.entries.len() as u64, self.total_size) + body);
        out.push(MANIFEST_VERSION);
        put_varint(&mut out, self.entries.len() as u64);
        put_varint(&mut out, self.total_size);
        for entry in &self.entries {
            entry.encode_into(&mut out);
        }
        out
    }

    /// Decodes and validates a manifest.
    ///
    /// # Errors
    ///
    /// [`ManifestError`] for any malformed, out-of-bounds, out-of-order or unsafe content.
    /// Never panics, and allocates at most in proportion to `bytes.len()`.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(ManifestError::TooLarge {
                len: bytes.len(),
                max: MAX_MANIFEST_LEN,
            });
        }
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if version != MANIFEST_VERSION {
            return Err(ManifestError::UnsupportedVersion {
                version,
                supported: MANIFEST_VERSION,
            });
        }
        let count = r.varint()?;
        if count > MAX_ENTRIES as u64 {
            return Err(ManifestError::TooManyEntries {
                count,
                max: MAX_ENTRIES,
            });
        }
        // Both bounded above: `count` ≤ MAX_ENTRIES, so the casts are lossless.
        let count = count as usize;
        let declared = r.varint()?;
        let mut entries = Vec::with_capacity(count.min(r.remaining() / MIN_ENTRY_LEN));
        let mut set = NameSet::new();
        let mut total: u64 = 0;
        let mut file_count = 0;
        for index in 0..count {
            let entry = decode_entry(&mut r, index)?;
            if let Some(prev) = entries.last().map(|e: &Entry| e.name.as_str().as_bytes())
                && prev >= entry.name.as_str().as_bytes()
            {
                return Err(ManifestError::NotSorted { index });
            }
            set.insert(&entry.name, entry.kind)?;
            if entry.kind == EntryKind::File {
                file_count += 1;
            }
            total = total
                .checked_add(entry.size)
                .filter(|&t| t <= MAX_SIZE)
                .ok_or(ManifestError::TotalTooLarge { max: MAX_SIZE })?;
            entries.push(entry);
        }
        if r.remaining() != 0 {
            return Err(ManifestError::TrailingBytes {
                count: r.remaining(),
            });
        }
        if total != declared {
            return Err(ManifestError::TotalMismatch {
                declared,
                actual: total,
            });
        }
        Ok(Manifest {
            entries,
            total_size: total,
            file_count,
        })
    }
}

fn header_len(count: u64, total: u64) -> usize {
    1 + varint_len(count) + varint_len(total)
}

fn decode_entry(r: &mut Reader<'_>, index: usize) -> Result<Entry, ManifestError> {
    let flags = r.u8()?;
    if flags & !(FLAG_DIR | FLAG_EXECUTABLE) != 0 || flags == FLAG_DIR | FLAG_EXECUTABLE {
        return Err(ManifestError::BadFlags { index, flags });
    }
    let name_len = r.varint()?;
    if name_len == 0 || name_len > super::name::MAX_NAME_LEN as u64 {
        return Err(ManifestError::BadNameLength {
            index,
            len: name_len,
        });
    }
    // Bounded by MAX_NAME_LEN just above.
    let name = r.bytes(name_len as usize)?;
    let name =
        SafeName::from_bytes(name).map_err(|source| ManifestError::Name { index, source })?;
    let size = r.varint()?;
    let mtime = r.varint()?;
    let (kind, mode) = match (flags & FLAG_DIR != 0, flags & FLAG_EXECUTABLE != 0) {
        (true, _) => (EntryKind::Dir, Mode::Regular),
        (false, false) => (EntryKind::File, Mode::Regular),
        (false, true) => (EntryKind::File, Mode::Executable),
    };
    if kind == EntryKind::Dir && size != 0 {
        return Err(ManifestError::DirWithSize { index, size });
    }
    Ok(Entry {
        name,
        kind,
        size,
        mode,
        mtime,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn name(s: &str) -> SafeName {
        SafeName::new(s).expect("valid test name")
    }

    fn sample() -> Manifest {
        Manifest::new(vec![
            Entry::file(name("b/readme.txt"), 1234, Mode::Regular, 1_700_000_000),
            Entry::dir(name("b"), 1_700_000_001),
            Entry::file(name("a.bin"), 5 << 30, Mode::Regular, 0),
            Entry::file(name("b/run.sh"), 0, Mode::Executable, 1),
            Entry::dir(name("b/empty"), 2),
            Entry::file(name("b/日本語.txt"), 63, Mode::Regular, 64),
        ])
        .expect("valid manifest")
    }

    #[test]
    fn round_trip_sorted_with_totals() {
        let m = sample();
        let names: Vec<&str> = m.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "a.bin",
                "b",
                "b/empty",
                "b/readme.txt",
                "b/run.sh",
                "b/日本語.txt"
            ]
        );
        assert_eq!(m.total_size(), (5 << 30) + 1234 + 63);
        assert_eq!(m.file_count(), 4);
        assert_eq!(m.top_level(), ["a.bin", "b"]);
        assert_eq!(m.entry(1).map(|e| e.kind), Some(EntryKind::Dir));
        assert_eq!(m.entry(99), None);
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Ok(m.clone()));
        // Canonical: what decodes re-encodes to the same bytes.
        assert_eq!(Manifest::decode(&bytes).map(|d| d.encode()), Ok(bytes));
        let empty = Manifest::new(Vec::new()).expect("empty is valid");
        assert_eq!(empty.encode(), [MANIFEST_VERSION, 0, 0]);
        assert_eq!(Manifest::decode(&[1, 0, 0]), Ok(empty));
    }

    #[test]
    fn identity_bytes_are_the_entry_encoding() {
        let m = sample();
        let bytes = m.encode();
        let header = header_len(6, m.total_size());
        let first = m.entries()[0].identity_bytes();
        assert_eq!(&bytes[header..header + first.len()], &first[..]);
        let mut other = m.entries()[0].clone();
        other.mtime += 1;
        assert_ne!(other.identity_bytes(), first);
    }

    /// Raw manifest bytes from (flags, name, size, mtime) tuples, unchecked, as a hostile
    /// sender would write them.
    fn raw(entries: &[(u8, &[u8], u64, u64)], total: u64) -> Vec<u8> {
        let mut out = vec![MANIFEST_VERSION];
        put_varint(&mut out, entries.len() as u64);
        put_varint(&mut out, total);
        for (flags, name, size, mtime) in entries {
            out.push(*flags);
            put_varint(&mut out, name.len() as u64);
            out.extend_from_slice(name);
            put_varint(&mut out, *size);
            put_varint(&mut out, *mtime);
        }
        out
    }

    #[test]
    fn hostile_names_are_refused() {
        for bad in [
            &b"../etc/passwd"[..],
            b"/etc/passwd",
            b"a/../../x",
            b"\x1b[2Jclear",
            b"C:\\Windows\\x",
            b"nul.txt",
            b"a\xffb",
            b"evil\xe2\x80\xaetxt.exe",
        ] {
            let bytes = raw(&[(0, bad, 1, 0)], 1);
            assert!(
                matches!(
                    Manifest::decode(&bytes),
                    Err(ManifestError::Name { index: 0, .. })
                ),
                "{bad:?}"
            );
        }
        // The error message never carries a raw control character.
        let msg = Manifest::decode(&raw(&[(0, b"\x1b]0;x\x07", 1, 0)], 1))
            .expect_err("refused")
            .to_string();
        assert!(!msg.chars().any(char::is_control), "{msg:?}");
    }

    #[test]
    fn every_structural_refusal() {
        use ManifestError as E;
        let ok = raw(&[(0, b"a", 1, 0)], 1);
        assert!(Manifest::decode(&ok).is_ok());
        // Truncated anywhere.
        for cut in 0..ok.len() {
            assert_eq!(Manifest::decode(&ok[..cut]), Err(E::Truncated), "cut {cut}");
        }
        let mut trailing = ok.clone();
        trailing.push(0);
        assert_eq!(
            Manifest::decode(&trailing),
            Err(E::TrailingBytes { count: 1 })
        );
        let mut v2 = ok.clone();
        v2[0] = 2;
        assert_eq!(
            Manifest::decode(&v2),
            Err(E::UnsupportedVersion {
                version: 2,
                supported: 1
            })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0, b"a", 1, 0)], 2)),
            Err(E::TotalMismatch {
                declared: 2,
                actual: 1
            })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0x04, b"a", 1, 0)], 1)),
            Err(E::BadFlags {
                index: 0,
                flags: 0x04
            })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0x03, b"a", 0, 0)], 0)),
            Err(E::BadFlags {
                index: 0,
                flags: 0x03
            })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(FLAG_DIR, b"a", 5, 0)], 5)),
            Err(E::DirWithSize { index: 0, size: 5 })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0, b"", 0, 0)], 0)),
            Err(E::BadNameLength { index: 0, len: 0 })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0, b"b", 0, 0), (0, b"a", 0, 0)], 0)),
            Err(E::NotSorted { index: 1 })
        );
        assert_eq!(
            Manifest::decode(&raw(&[(0, b"a", 0, 0), (0, b"a", 0, 0)], 0)),
            Err(E::NotSorted { index: 1 })
        );
        assert!(matches!(
            Manifest::decode(&raw(&[(0, b"A", 0, 0), (0, b"a", 0, 0)], 0)),
            Err(E::Set(NameSetError::Twins { .. }))
        ));
        assert!(matches!(
            Manifest::decode(&raw(&[(0, b"a", 0, 0), (0, b"a/b", 0, 0)], 0)),
            Err(E::Set(NameSetError::FileIsParent { .. }))
        ));
        assert_eq!(
            Manifest::decode(&raw(&[(0, b"a", MAX_SIZE, 0), (0, b"b", 1, 0)], 0)),
            Err(E::TotalTooLarge { max: MAX_SIZE })
        );
        // A non-canonical count (1 in two bytes).
        assert_eq!(Manifest::decode(&[1, 0x40, 0x01, 0]), Err(E::NonCanonical));
        // A huge declared count is refused before any allocation.
        let mut many = vec![1u8];
        put_varint(&mut many, MAX_ENTRIES as u64 + 1);
        many.push(0);
        assert_eq!(
            Manifest::decode(&many),
            Err(E::TooManyEntries {
                count: MAX_ENTRIES as u64 + 1,
                max: MAX_ENTRIES
            })
        );
        // A declared count the bytes cannot hold is just truncated.
        let mut lying = vec![1u8];
        put_varint(&mut lying, MAX_ENTRIES as u64);
        lying.push(0);
        assert_eq!(Manifest::decode(&lying), Err(E::Truncated));
        let huge = vec![0u8; MAX_MANIFEST_LEN + 1];
        assert_eq!(
            Manifest::decode(&huge),
            Err(E::TooLarge {
                len: MAX_MANIFEST_LEN + 1,
                max: MAX_MANIFEST_LEN
            })
        );
    }

    #[test]
    fn building_checks_the_same_rules() {
        assert!(matches!(
            Manifest::new(vec![
                Entry::file(name("x"), 1, Mode::Regular, 0),
                Entry::file(name("X"), 1, Mode::Regular, 0),
            ]),
            Err(ManifestError::Set(NameSetError::Twins { .. }))
        ));
        assert!(matches!(
            Manifest::new(vec![Entry {
                size: 3,
                ..Entry::dir(name("d"), 0)
            }]),
            Err(ManifestError::DirWithSize { index: 0, size: 3 })
        ));
        assert!(matches!(
            Manifest::new(vec![Entry {
                mode: Mode::Executable,
                ..Entry::dir(name("d"), 0)
            }]),
            Err(ManifestError::BadFlags { index: 0, .. })
        ));
        assert_eq!(
            Manifest::new(vec![
                Entry::file(name("a"), MAX_SIZE, Mode::Regular, 0),
                Entry::file(name("b"), 1, Mode::Regular, 0),
            ]),
            Err(ManifestError::TotalTooLarge { max: MAX_SIZE })
        );
    }

    fn arb_component() -> impl Strategy<Value = String> {
        // Letters of both cases, a digit, a dot, an accent and a CJK character: enough to
        // make twins, prefixes and unsortable orders likely.
        proptest::collection::vec(
            prop_oneof![
                Just('a'),
                Just('A'),
                Just('b'),
                Just('c'),
                Just('x'),
                Just('7'),
                Just('.'),
                Just('é'),
                Just('\u{301}'),
                Just('語')
            ],
            1..4,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    fn arb_entry() -> impl Strategy<Value = Option<Entry>> {
        (
            proptest::collection::vec(arb_component(), 1..4),
            any::<bool>(),
            any::<bool>(),
            0u64..1 << 40,
            any::<u64>(),
        )
            .prop_map(|(parts, dir, exec, size, mtime)| {
                let name = SafeName::new(&parts.join("/")).ok()?;
                Some(if dir {
                    Entry::dir(name, mtime)
                } else {
                    let mode = if exec {
                        Mode::Executable
                    } else {
                        Mode::Regular
                    };
                    Entry::file(name, size, mode, mtime)
                })
            })
    }

    proptest! {
        /// Whatever the entries, either building refuses them or the manifest round-trips
        /// byte for byte; and decoding any prefix or one-byte change never panics.
        #[test]
        fn random_manifests_round_trip(
            entries in proptest::collection::vec(arb_entry(), 0..12),
            flip in any::<(usize, u8)>(),
        ) {
            let entries: Vec<Entry> = entries.into_iter().flatten().collect();
            let Ok(m) = Manifest::new(entries) else { return Ok(()) };
            let bytes = m.encode();
            let decoded = Manifest::decode(&bytes);
            prop_assert_eq!(decoded.as_ref(), Ok(&m));
            prop_assert_eq!(decoded.map(|d| d.encode()), Ok(bytes.clone()));
            for cut in 0..bytes.len() {
                prop_assert!(Manifest::decode(&bytes[..cut]).is_err());
            }
            let mut changed = bytes.clone();
            let at = flip.0 % changed.len();
            changed[at] ^= flip.1 | 1;
            if let Ok(other) = Manifest::decode(&changed) {
                // Whatever a changed manifest decodes to is itself valid and canonical.
                prop_assert_eq!(other.encode(), changed);
            }
        }

        /// Arbitrary bytes never panic the decoder, and whatever they decode to is
        /// canonical.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(m) = Manifest::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }
    }
}
