//! Writing received files strictly beneath the output folder, never through a symbolic link.
//!
//! Names arrive as [`SafeName`]s, which cannot hold `..`, absolute paths or empty
//! components, so a name alone cannot leave the folder. What a name cannot prevent is the
//! file system itself: a symbolic link already in the output folder (planted by another
//! local user, or left by an earlier transfer of a hostile tree) would carry a write
//! elsewhere. So every path is walked one component at a time from a handle on the output
//! folder, each step opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and
//! `O_NOFOLLOW`: a link anywhere on the path is refused, never followed, and the kernel
//! itself refuses to leave the folder even if a bad name somehow got through. Where
//! `openat2` is missing (Linux before 5.6, other Unixes, or a seccomp filter that hides
//! it), each component is opened with plain `openat(O_NOFOLLOW)` instead, which is the
//! same walk cap-std does in that case: still no link followed, and components cannot be
//! `..` by construction.
//!
//! Each file is written under a temporary name beside its final one (`.NAME.warren-part`,
//! with its resume sidecar `.NAME.warren-resume`) and renamed into place only when complete
//! and verified ([`PartFile::finish`]), with `RENAME_NOREPLACE` unless the user asked to
//! overwrite, so an existing file is never replaced silently, even by a race. Names ending
//! in those suffixes are refused, so an entry can never collide with another's temporary
//! file.
//!
//! The output folder itself is the user's choice and is opened normally (following links).
//!
//! Unix only: Windows needs its own writer (and must refuse the characters Windows forbids
//! in names, which the wire allows).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode as RawMode, OFlags, RenameFlags};
use rustix::io::Errno;
use warren_proto::files::{Entry, EntryKind, Mode, SafeName};

/// Suffix of a file being received.
pub const PART_SUFFIX: &str = ".warren-part";

/// Suffix of a partial file's resume sidecar.
pub const SIDECAR_SUFFIX: &str = ".warren-resume";

/// Longest file name most file systems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// Whether an existing file at a name may be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Never replace an existing file (the default).
    Refuse,
    /// Replace an existing regular file (`--overwrite`). Folders and links are still
    /// refused.
    Replace,
}

/// Whether a finished file is flushed to disk before it is renamed into place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fdatasync` before the rename, so a file under its final name is complete even
    /// after a power cut (the default).
    Data,
    /// Leave flushing to the kernel: faster for many small files, and a crash can leave a
    /// final name with missing data.
    Skip,
}

/// Why a file or folder could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The output folder cannot be opened.
    #[error("cannot open the output folder {}: {source}: check that it exists and that you can write to it", path.display())]
    OpenOutput {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A symbolic link is on the path.
    #[error(
        "`{at}` is a symbolic link, and Warren never follows links in the output folder (needed for `{name}`): remove the link or choose another output folder"
    )]
    Symlink {
        /// The entry being written.
        name: String,
        /// The path of the link, relative to the output folder.
        at: String,
    },
    /// Something that is not a folder is where a folder is needed.
    #[error(
        "`{at}` is not a folder, but `{name}` needs it to be one: move it away or choose another output folder"
    )]
    NotADirectory {
        /// The entry being written.
        name: String,
        /// The path in the way.
        at: String,
    },
    /// The file exists and overwriting was not asked for.
    #[error(
        "`{name}` already exists in the output folder: pass --overwrite to replace it, or choose another output folder"
    )]
    Exists {
        /// The entry.
        name: String,
    },
    /// Something other than a regular file is at the name (or at its temporary name).
    #[error(
        "`{at}` exists and is not a regular file, so it cannot be replaced: move it away or choose another output folder"
    )]
    NotAFile {
        /// The path in the way.
        at: String,
    },
    /// A temporary file has other hard links, so writing it would change another file.
    #[error("`{at}` has other hard links; Warren will not write through it: delete it and retry")]
    HardLinked {
        /// The temporary file.
        at: String,
    },
    /// An entry named like one of Warren's temporary files.
    #[error(
        "`{name}` ends in `{PART_SUFFIX}` or `{SIDECAR_SUFFIX}`, names Warren keeps for partial files: rename the file on the sending side"
    )]
    ReservedName {
        /// The entry.
        name: String,
    },
    /// An IO error from the file system.
    #[error("cannot {op} `{name}` in the output folder: {source}")]
    Io {
        /// What was being done ("create the folder", "write", ...).
        op: &'static str,
        /// The entry.
        name: String,
        /// The error.
        source: io::Error,
    },
}

impl WriteError {
    fn io(op: &'static str, name: &SafeName, source: impl Into<io::Error>) -> WriteError {
        WriteError::Io {
            op,
            name: name.escaped(),
            source: source.into(),
        }
    }
}

/// How a received tree is written: [`Overwrite`] and [`SyncPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Whether existing files may be replaced.
    pub overwrite: Overwrite,
    /// Whether finished files are flushed before they are renamed into place.
    pub sync: SyncPolicy,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            overwrite: Overwrite::Refuse,
            sync: SyncPolicy::Data,
        }
    }
}

/// A handle on the output folder; every file and folder is created beneath it.
#[derive(Debug)]
pub struct OutputDir {
    root: Arc<OwnedFd>,
    options: WriteOptions,
    /// How each component is opened; probed once when the folder is opened.
    walk: Walk,
    /// The folder of the last name looked up or opened, or `None` if a folder on its way
    /// was missing when it was looked up, so a tree of many files in one folder is not
    /// walked again for each (manifests list files grouped by folder): 10,000 files in
    /// 100 folders cost 100 walks, not 10,000, when planning and when writing.
    last_parent: Option<(String, Option<Arc<OwnedFd>>)>,
}

/// A file being received: open under its temporary name in its folder.
#[derive(Debug)]
pub struct PartFile {
    name: SafeName,
    dir: Arc<OwnedFd>,
    part_name: String,
    sidecar_name: String,
    file: File,
    mode: Mode,
    options: WriteOptions,
    walk: Walk,
}

/// How one path component is opened without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6 and later).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Openat2,
    /// `openat` with `O_NOFOLLOW`: where `openat2` is missing or filtered out.
    NoFollow,
}

impl Walk {
    /// `Openat2` if the kernel takes it here (it may be missing, or hidden by a seccomp
    /// filter that answers ENOSYS or EPERM), else `NoFollow`.
    fn probe(root: BorrowedFd<'_>) -> Walk {
        #[cfg(target_os = "linux")]
        {
            use rustix::fs::ResolveFlags;
            if rfs::openat2(
                root,
                ".",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                RawMode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
            )
            .is_ok()
            {
                return Walk::Openat2;
            }
        }
        let _ = root;
        Walk::NoFollow
    }
}

/// Whether an entry's name is free in the output folder ([`OutputDir::preflight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Nothing there yet (or only folders on the way).
    Free,
    /// A regular file is there and will be replaced ([`Overwrite::Replace`]).
    Replaces,
    /// The folder already exists (for a folder entry; nothing to do).
    DirExists,
    /// A regular file with the entry's size and modification time is there: a past run
    /// of the same transfer finished it (it set that time), so a rerun skips it instead
    /// of refusing. Nothing is written over it either way.
    Same,
}

impl OutputDir {
    /// Opens the output folder.
    ///
    /// # Errors
    ///
    /// [`WriteError::OpenOutput`] if it does not exist or is not a folder.
    pub fn open(path: &Path, options: WriteOptions) -> Result<OutputDir, WriteError> {
        OutputDir::open_walking(path, options, None)
    }

    /// [`OutputDir::open`], with the walk forced (tests run every check both ways).
    fn open_walking(
        path: &Path,
        options: WriteOptions,
        walk: Option<Walk>,
    ) -> Result<OutputDir, WriteError> {
        let root = rfs::open(
            path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            RawMode::empty(),
        )
        .map_err(|e| WriteError::OpenOutput {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let walk = walk.unwrap_or_else(|| Walk::probe(root.as_fd()));
        Ok(OutputDir {
            root: Arc::new(root),
            options,
            walk,
            last_parent: None,
        })
    }

    /// The options this folder was opened with.
    pub fn options(&self) -> WriteOptions {
        self.options
    }

    /// Checks, without creating anything, that `entry` can be written: no link or file in
    /// the way, and no existing file unless overwriting. Run over the whole manifest
    /// before accepting, so the user hears about a clash before any byte is sent; the
    /// writes check again (the folder can change meanwhile).
    ///
    /// # Errors
    ///
    /// The [`WriteError`] the write would meet.
    pub fn preflight(&mut self, entry: &Entry) -> Result<Target, WriteError> {
        check_reserved(&entry.name)?;
        let Some(dir) = self.find_parent(&entry.name)? else {
            return Ok(Target::Free);
        };
        let file_name = entry.name.file_name();
        match rfs::statat(dir.as_fd(), file_name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(Target::Free),
            Err(e) => Err(WriteError::io("look up", &entry.name, e)),
            Ok(stat) => {
                let kind = FileType::from_raw_mode(stat.st_mode);
                match (entry.kind, kind) {
                    (_, FileType::Symlink) => Err(WriteError::Symlink {
                        name: entry.name.escaped(),
                        at: entry.name.escaped(),
                    }),
                    (EntryKind::Dir, FileType::Directory) => Ok(Target::DirExists),
                    (EntryKind::Dir, _) => Err(WriteError::NotADirectory {
                        name: entry.name.escaped(),
                        at: entry.name.escaped(),
                    }),
                    (EntryKind::File, FileType::RegularFile)
                        if u64::try_from(stat.st_size).ok() == Some(entry.size)
                            && i64::try_from(entry.mtime).ok() == Some(stat.st_mtime) =>
                    {
                        Ok(Target::Same)
                    }
                    (EntryKind::File, FileType::RegularFile) => match self.options.overwrite {
                        Overwrite::Refuse => Err(WriteError::Exists {
                            name: entry.name.escaped(),
                        }),
                        Overwrite::Replace => Ok(Target::Replaces),
                    },
                    (EntryKind::File, _) => Err(WriteError::NotAFile {
                        at: entry.name.escaped(),
                    }),
                }
            }
        }
    }

    /// Whether a temporary file of `name` is there (a past run began it), without creating
    /// anything: a receiver prepares resume state only for these, so a fresh transfer of
    /// many files creates no file before its data arrives.
    ///
    /// # Errors
    ///
    /// [`WriteError`] if something that is not a folder is on the path (as
    /// [`OutputDir::preflight`]).
    pub fn has_partial(&mut self, name: &SafeName) -> Result<bool, WriteError> {
        let Some(dir) = self.find_parent(name)? else {
            return Ok(false);
        };
        let part = temp_name(name.file_name(), PART_SUFFIX);
        match rfs::statat(dir.as_fd(), part.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(WriteError::io("look up", name, e)),
        }
    }

    /// Creates the folder `name` and any missing folders above it.
    ///
    /// # Errors
    ///
    /// [`WriteError::Symlink`] or [`WriteError::NotADirectory`] if something is in the
    /// way; [`WriteError::Io`] for other failures.
    pub fn create_dir(&mut self, name: &SafeName) -> Result<(), WriteError> {
        check_reserved(name)?;
        let parent = self.parent_of(name)?;
        let component = name.file_name();
        make_dir(self.walk, parent.as_fd(), component, name, name.as_str())?;
        // A folder found missing may be there now.
        if matches!(self.last_parent, Some((_, None))) {
            self.last_parent = None;
        }
        Ok(())
    }

    /// Opens `name` for receiving: creates the folders above it, checks that the final
    /// name is free (or replaceable), and opens or creates its temporary file without
    /// truncating it (a resume decides what of it to keep).
    ///
    /// # Errors
    ///
    /// [`WriteError`] if anything is in the way, the temporary file is not a plain file of
    /// ours, or the file system fails.
    pub fn open_part(&mut self, name: &SafeName, mode: Mode) -> Result<PartFile, WriteError> {
        check_reserved(name)?;
        let dir = self.parent_of(name)?;
        let file_name = name.file_name();
        match rfs::statat(dir.as_fd(), file_name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => {}
            Err(e) => return Err(WriteError::io("look up", name, e)),
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::Symlink => {
                    return Err(WriteError::Symlink {
                        name: name.escaped(),
                        at: name.escaped(),
                    });
                }
                FileType::RegularFile if self.options.overwrite == Overwrite::Replace => {}
                FileType::RegularFile => {
                    return Err(WriteError::Exists {
                        name: name.escaped(),
                    });
                }
                _ => return Err(WriteError::NotAFile { at: name.escaped() }),
            },
        }
        let part_name = temp_name(file_name, PART_SUFFIX);
        let sidecar_name = temp_name(file_name, SIDECAR_SUFFIX);
        let file = open_private_file(self.walk, dir.as_fd(), &part_name, name, file_mode(mode))?;
        Ok(PartFile {
            name: name.clone(),
            dir,
            part_name,
            sidecar_name,
            file,
            mode,
            options: self.options,
            walk: self.walk,
        })
    }

    /// The folder that holds `name`, created as needed, walked without following links.
    fn parent_of(&mut self, name: &SafeName) -> Result<Arc<OwnedFd>, WriteError> {
        let parent_path = name.ancestors().last().unwrap_or("");
        if let Some((path, Some(fd))) = &self.last_parent
            && path == parent_path
        {
            return Ok(Arc::clone(fd));
        }
        let mut dir = Arc::clone(&self.root);
        let mut at = String::new();
        for component in parent_components(name) {
            push_component(&mut at, component);
            dir = Arc::new(make_dir(self.walk, dir.as_fd(), component, name, &at)?);
        }
        self.last_parent = Some((parent_path.to_owned(), Some(Arc::clone(&dir))));
        Ok(dir)
    }

    /// The folder that holds `name` if every folder on the way is there (`None` if one is
    /// missing), walked without following links and creating nothing.
    fn find_parent(&mut self, name: &SafeName) -> Result<Option<Arc<OwnedFd>>, WriteError> {
        let parent_path = name.ancestors().last().unwrap_or("");
        if let Some((path, found)) = &self.last_parent
            && path == parent_path
        {
            return Ok(found.clone());
        }
        let mut dir = Arc::clone(&self.root);
        let mut at = String::new();
        let mut found = true;
        for component in parent_components(name) {
            push_component(&mut at, component);
            match open_dir(self.walk, dir.as_fd(), component) {
                Ok(fd) => dir = Arc::new(fd),
                Err(Errno::NOENT) => {
                    found = false;
                    break;
                }
                Err(e) => return Err(classify(e, dir.as_fd(), component, name, &at)),
            }
        }
        let found = found.then_some(dir);
        self.last_parent = Some((parent_path.to_owned(), found.clone()));
        Ok(found)
    }
}

impl PartFile {
    /// The entry being received.
    pub fn name(&self) -> &SafeName {
        &self.name
    }

    /// The temporary file, for positioned reads and writes
    /// (`std::os::unix::fs::FileExt`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Opens (or creates) the resume sidecar beside the temporary file, with the same
    /// checks (no link, a plain file with one link).
    ///
    /// # Errors
    ///
    /// [`WriteError`] as for [`OutputDir::open_part`].
    pub fn open_sidecar(&self) -> Result<File, WriteError> {
        open_private_file(
            self.walk,
            self.dir.as_fd(),
            &self.sidecar_name,
            &self.name,
            0o600,
        )
    }

    /// Starts the disk writing `len` bytes at `offset` without waiting, when finished files
    /// are flushed ([`SyncPolicy::Data`]): the flush in [`PartFile::finish`] then finds most
    /// of a large file already written instead of writing all of it at the end (a 1 GiB
    /// file's flush took ~0.29 s here). Best effort: an error only means the flush does
    /// the work.
    pub fn start_writeback(&self, offset: u64, len: u64) {
        if self.options.sync != SyncPolicy::Data {
            return;
        }
        // `POSIX_FADV_DONTNEED` starts the writeback of the range's dirty pages
        // (WB_SYNC_NONE) and drops only pages already clean, so what was just written stays
        // cached. `sync_file_range(SYNC_FILE_RANGE_WRITE)` says this more directly, but has
        // no safe wrapper here (rustix lacks it and unsafe code is denied).
        let _ = rfs::fadvise(
            &self.file,
            offset,
            std::num::NonZeroU64::new(len),
            rfs::Advice::DontNeed,
        );
    }

    /// Completes the file: sets its modification time and executable bit, flushes it
    /// (per [`SyncPolicy`]), renames it to its final name (refusing to replace an existing
    /// file unless [`Overwrite::Replace`]) and removes the sidecar.
    ///
    /// # Errors
    ///
    /// [`WriteError::Exists`] if a file appeared at the final name meanwhile;
    /// [`WriteError::Io`] for file-system failures. The temporary file is left in place,
    /// so a retry can resume.
    pub fn finish(self, mtime: u64) -> Result<(), WriteError> {
        let name = &self.name;
        let modified = SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_secs(mtime))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.file
            .set_modified(modified)
            .map_err(|e| WriteError::io("set the time of", name, e))?;
        if self.mode == Mode::Executable {
            let stat = rfs::fstat(&self.file).map_err(|e| WriteError::io("stat", name, e))?;
            let perms = stat.st_mode & 0o777;
            // `chmod +x` for whoever may read it: the umask already chose the read bits.
            let exec = perms | ((perms & 0o444) >> 2);
            rfs::fchmod(&self.file, RawMode::from_raw_mode(exec))
                .map_err(|e| WriteError::io("make executable", name, e))?;
        }
        if self.options.sync == SyncPolicy::Data {
            self.file
                .sync_data()
                .map_err(|e| WriteError::io("flush", name, e))?;
        }
        let dir = self.dir.as_fd();
        let file_name = name.file_name();
        match self.options.overwrite {
            Overwrite::Replace => rfs::renameat(dir, &self.part_name, dir, file_name)
                .map_err(|e| rename_error(e, name))?,
            Overwrite::Refuse => {
                match rfs::renameat_with(
                    dir,
                    &self.part_name,
                    dir,
                    file_name,
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => {}
                    // File systems without RENAME_NOREPLACE: a hard link is just as atomic
                    // about an existing name (EEXIST), then the temporary name goes.
                    Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                        rfs::linkat(dir, &self.part_name, dir, file_name, AtFlags::empty())
                            .map_err(|e| rename_error(e, name))?;
                        rfs::unlinkat(dir, &self.part_name, AtFlags::empty())
                            .map_err(|e| WriteError::io("remove the temporary file of", name, e))?;
                    }
                    Err(e) => return Err(rename_error(e, name)),
                }
            }
        }
        match rfs::unlinkat(dir, &self.sidecar_name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(WriteError::io("remove the resume sidecar of", name, e)),
        }
    }

    /// Deletes the temporary file and its sidecar (a transfer the user cancelled for
    /// good, or one that cannot be resumed).
    ///
    /// # Errors
    ///
    /// [`WriteError::Io`] if either exists and cannot be removed.
    pub fn discard(self) -> Result<(), WriteError> {
        for temp in [&self.part_name, &self.sidecar_name] {
            match rfs::unlinkat(self.dir.as_fd(), temp.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => {
                    return Err(WriteError::io(
                        "remove the temporary file of",
                        &self.name,
                        e,
                    ));
                }
            }
        }
        Ok(())
    }
}

fn rename_error(e: Errno, name: &SafeName) -> WriteError {
    match e {
        Errno::EXIST => WriteError::Exists {
            name: name.escaped(),
        },
        Errno::ISDIR | Errno::NOTEMPTY => WriteError::NotAFile { at: name.escaped() },
        e => WriteError::io("rename into place", name, e),
    }
}

fn check_reserved(name: &SafeName) -> Result<(), WriteError> {
    let file_name = name.file_name();
    if file_name.ends_with(PART_SUFFIX) || file_name.ends_with(SIDECAR_SUFFIX) {
        return Err(WriteError::ReservedName {
            name: name.escaped(),
        });
    }
    Ok(())
}

/// The folders above `name`, outermost first.
fn parent_components(name: &SafeName) -> impl Iterator<Item = &str> {
    let depth = name.depth();
    name.components().take(depth - 1)
}

fn push_component(at: &mut String, component: &str) {
    if !at.is_empty() {
        at.push('/');
    }
    at.push_str(component);
}

/// `.NAME.SUFFIX`, or `.BLAKE3-PREFIX.SUFFIX` when that would be longer than a file
/// name may be. Deterministic, so a later run finds the same temporary file.
fn temp_name(file_name: &str, suffix: &str) -> String {
    let plain = format!(".{file_name}{suffix}");
    if plain.len() <= NAME_MAX {
        return plain;
    }
    let hash = blake3::hash(file_name.as_bytes());
    format!(".{}{suffix}", &hash.to_hex()[..32])
}

fn file_mode(mode: Mode) -> u32 {
    match mode {
        Mode::Regular => 0o644,
        Mode::Executable => 0o755,
    }
}

/// Opens one component beneath `dir` without following a link: `openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or `openat` with `O_NOFOLLOW` where the kernel
/// has no `openat2`. `O_NOFOLLOW | O_CLOEXEC` are always added.
fn open_beneath(
    walk: Walk,
    dir: BorrowedFd<'_>,
    component: &str,
    flags: OFlags,
    mode: u32,
) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = RawMode::from_raw_mode(mode);
    match walk {
        #[cfg(target_os = "linux")]
        Walk::Openat2 => rfs::openat2(
            dir,
            component,
            flags,
            mode,
            rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
        ),
        #[cfg(not(target_os = "linux"))]
        Walk::Openat2 => rfs::openat(dir, component, flags, mode),
        Walk::NoFollow => rfs::openat(dir, component, flags, mode),
    }
}

fn open_dir(walk: Walk, dir: BorrowedFd<'_>, component: &str) -> Result<OwnedFd, Errno> {
    open_beneath(walk, dir, component, OFlags::DIRECTORY | OFlags::RDONLY, 0)
}

/// Opens the folder `component` beneath `dir`, creating it if missing.
fn make_dir(
    walk: Walk,
    dir: BorrowedFd<'_>,
    component: &str,
    name: &SafeName,
    at: &str,
) -> Result<OwnedFd, WriteError> {
    match open_dir(walk, dir, component) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(classify(e, dir, component, name, at)),
    }
    match rfs::mkdirat(dir, component, RawMode::from_raw_mode(0o755)) {
        // EEXIST: created meanwhile, or a dangling link; opening tells which.
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(WriteError::io("create the folder", name, e)),
    }
    open_dir(walk, dir, component).map_err(|e| classify(e, dir, component, name, at))
}

/// Turns a failed open of a folder into an error that says what is in the way.
fn classify(
    e: Errno,
    dir: BorrowedFd<'_>,
    component: &str,
    name: &SafeName,
    at: &str,
) -> WriteError {
    let at = warren_proto::files::escape_for_terminal(at);
    match e {
        // ELOOP from O_NOFOLLOW or RESOLVE_NO_SYMLINKS; EXDEV from RESOLVE_BENEATH (which
        // a checked name never triggers).
        Errno::LOOP | Errno::XDEV => WriteError::Symlink {
            name: name.escaped(),
            at,
        },
        Errno::NOTDIR => match rfs::statat(dir, component, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink => {
                WriteError::Symlink {
                    name: name.escaped(),
                    at,
                }
            }
            _ => WriteError::NotADirectory {
                name: name.escaped(),
                at,
            },
        },
        e => WriteError::io("open the folder of", name, e),
    }
}

/// Opens or creates a temporary file of ours: read-write, no link followed, and then
/// checked to be a regular file with a single link (a planted hard link to someone else's
/// file must not be written through).
fn open_private_file(
    walk: Walk,
    dir: BorrowedFd<'_>,
    file_name: &str,
    name: &SafeName,
    mode: u32,
) -> Result<File, WriteError> {
    let at = || {
        let parent = name
            .ancestors()
            .last()
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        warren_proto::files::escape_for_terminal(&format!("{parent}{file_name}"))
    };
    let fd = open_beneath(walk, dir, file_name, OFlags::RDWR | OFlags::CREATE, mode).map_err(
        |e| match e {
            Errno::LOOP | Errno::XDEV => WriteError::Symlink {
                name: name.escaped(),
                at: at(),
            },
            Errno::ISDIR => WriteError::NotAFile { at: at() },
            e => WriteError::io("create the temporary file of", name, e),
        },
    )?;
    let stat =
        rfs::fstat(&fd).map_err(|e| WriteError::io("stat the temporary file of", name, e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(WriteError::NotAFile { at: at() });
    }
    if stat.st_nlink != 1 {
        return Err(WriteError::HardLinked { at: at() });
    }
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{FileExt, PermissionsExt, symlink};

    use super::*;

    fn name(s: &str) -> SafeName {
        SafeName::new(s).expect("valid test name")
    }

    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tmp.path().join("out");
        fs::create_dir(&out).expect("out dir");
        (tmp, out)
    }

    fn write_file(out: &mut OutputDir, n: &str, data: &[u8], mode: Mode) -> Result<(), WriteError> {
        let part = out.open_part(&name(n), mode)?;
        part.file().write_all_at(data, 0).expect("write");
        part.finish(1_600_000_000)
    }

    #[test]
    fn writes_a_tree_beneath_the_output_folder() {
        let (_tmp, out) = scratch();
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        dir.create_dir(&name("empty/nested")).expect("dir");
        write_file(&mut dir, "a/b/c.txt", b"hello", Mode::Regular).expect("file");
        write_file(&mut dir, "a/b/d.txt", b"world", Mode::Regular).expect("same folder");
        write_file(&mut dir, "run.sh", b"#!/bin/sh\n", Mode::Executable).expect("exec");
        assert_eq!(fs::read(out.join("a/b/c.txt")).expect("read"), b"hello");
        assert_eq!(fs::read(out.join("a/b/d.txt")).expect("read"), b"world");
        assert!(out.join("empty/nested").is_dir());
        let meta = fs::metadata(out.join("run.sh")).expect("meta");
        assert_ne!(meta.permissions().mode() & 0o100, 0, "executable");
        assert_eq!(
            fs::metadata(out.join("a/b/c.txt"))
                .expect("meta")
                .permissions()
                .mode()
                & 0o111,
            0
        );
        let mtime = meta.modified().expect("mtime");
        assert_eq!(
            mtime,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000)
        );
        // No temporary file is left behind.
        let leftovers: Vec<_> = fs::read_dir(out.join("a/b"))
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(leftovers.len(), 2, "{leftovers:?}");
    }

    #[test]
    fn a_planted_symlink_pointing_outside_is_refused_not_followed() {
        planted_symlinks(Walk::Openat2);
        planted_symlinks(Walk::NoFollow);
    }

    /// The same refusals whether the kernel has `openat2` or the `O_NOFOLLOW` walk is used.
    fn planted_symlinks(walk: Walk) {
        let (tmp, out) = scratch();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("outside");
        // A link as a folder on the path, and a link at the final name.
        symlink(&outside, out.join("docs")).expect("symlink");
        symlink(outside.join("victim"), out.join("victim")).expect("symlink");
        fs::write(outside.join("victim"), b"precious").expect("victim");
        symlink(outside.join("victim"), out.join(".x.warren-part")).expect("symlink");

        // And one deeper down, inside a real folder.
        fs::create_dir(out.join("real")).expect("real");
        symlink(&outside, out.join("real/deeper")).expect("symlink");

        let mut dir =
            OutputDir::open_walking(&out, WriteOptions::default(), Some(walk)).expect("open");
        let err =
            write_file(&mut dir, "docs/evil.txt", b"pwned", Mode::Regular).expect_err("refused");
        assert!(
            matches!(err, WriteError::Symlink { ref at, .. } if at == "docs"),
            "{err}"
        );
        let err = write_file(&mut dir, "real/deeper/x/evil.txt", b"pwned", Mode::Regular)
            .expect_err("refused");
        assert!(
            matches!(err, WriteError::Symlink { ref at, .. } if at == "real/deeper"),
            "{err}"
        );
        let err = dir.create_dir(&name("docs/sub")).expect_err("refused");
        assert!(matches!(err, WriteError::Symlink { .. }), "{err}");
        let err = dir
            .preflight(&Entry::file(name("docs/evil.txt"), 1, Mode::Regular, 0))
            .expect_err("refused");
        assert!(matches!(err, WriteError::Symlink { .. }), "{err}");

        // Even with --overwrite, a link at the final name is not replaced or followed.
        let mut replace = OutputDir::open_walking(
            &out,
            WriteOptions {
                overwrite: Overwrite::Replace,
                ..WriteOptions::default()
            },
            Some(walk),
        )
        .expect("open");
        let err = write_file(&mut replace, "victim", b"pwned", Mode::Regular).expect_err("refused");
        assert!(matches!(err, WriteError::Symlink { .. }), "{err}");
        // A link planted at the temporary name.
        let err = write_file(&mut replace, "x", b"pwned", Mode::Regular).expect_err("refused");
        assert!(matches!(err, WriteError::Symlink { .. }), "{err}");

        assert_eq!(fs::read(outside.join("victim")).expect("read"), b"precious");
        assert_eq!(
            fs::read_dir(&outside).expect("ls").count(),
            1,
            "nothing written outside"
        );
        assert!(
            out.join("docs").is_symlink(),
            "the link itself is left alone"
        );
    }

    #[test]
    fn a_planted_hard_link_is_not_written_through() {
        let (tmp, out) = scratch();
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"precious").expect("victim");
        fs::hard_link(&victim, out.join(".x.warren-part")).expect("hard link");
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let err = dir
            .open_part(&name("x"), Mode::Regular)
            .expect_err("refused");
        assert!(matches!(err, WriteError::HardLinked { .. }), "{err}");
        assert_eq!(fs::read(&victim).expect("read"), b"precious");
    }

    /// `..` cannot reach the writer: there is no way to make a `SafeName` that holds it
    /// (the type has no other constructor), and if one somehow got through, the kernel's
    /// RESOLVE_BENEATH refuses to leave the folder anyway.
    #[test]
    fn dot_dot_cannot_reach_the_writer() {
        for evil in ["..", "../x", "a/../../x", "/etc/x", "a/./b", "a//b"] {
            assert!(SafeName::new(evil).is_err(), "{evil}");
        }
        // The layer beneath: the walk itself refuses `..` as a component.
        let (_tmp, out) = scratch();
        let root =
            rfs::open(&out, OFlags::DIRECTORY | OFlags::RDONLY, RawMode::empty()).expect("open");
        #[cfg(target_os = "linux")]
        {
            assert_eq!(
                Walk::probe(root.as_fd()),
                Walk::Openat2,
                "this kernel has openat2"
            );
            assert_eq!(
                open_dir(Walk::Openat2, root.as_fd(), "..").map(drop),
                Err(Errno::XDEV)
            );
        }
        #[cfg(not(target_os = "linux"))]
        let _ = root;
    }

    #[test]
    fn existing_files_are_kept_unless_overwriting() {
        let (_tmp, out) = scratch();
        fs::write(out.join("keep.txt"), b"old").expect("old");
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let entry = Entry::file(name("keep.txt"), 3, Mode::Regular, 0);
        assert!(matches!(
            dir.preflight(&entry),
            Err(WriteError::Exists { .. })
        ));
        let err = write_file(&mut dir, "keep.txt", b"new", Mode::Regular).expect_err("refused");
        assert!(matches!(err, WriteError::Exists { .. }), "{err}");
        assert!(err.to_string().contains("--overwrite"), "{err}");
        assert_eq!(fs::read(out.join("keep.txt")).expect("read"), b"old");

        // A file that appears at the final name while receiving is not replaced either.
        let part = dir
            .open_part(&name("race.txt"), Mode::Regular)
            .expect("open");
        part.file().write_all_at(b"new", 0).expect("write");
        fs::write(out.join("race.txt"), b"theirs").expect("race");
        assert!(matches!(part.finish(0), Err(WriteError::Exists { .. })));
        assert_eq!(fs::read(out.join("race.txt")).expect("read"), b"theirs");

        let mut dir = OutputDir::open(
            &out,
            WriteOptions {
                overwrite: Overwrite::Replace,
                sync: SyncPolicy::Skip,
            },
        )
        .expect("open");
        assert_eq!(dir.preflight(&entry).expect("ok"), Target::Replaces);
        write_file(&mut dir, "keep.txt", b"new", Mode::Regular).expect("replaced");
        assert_eq!(fs::read(out.join("keep.txt")).expect("read"), b"new");
    }

    #[test]
    fn a_file_a_past_run_finished_is_recognised() {
        let (_tmp, out) = scratch();
        fs::write(out.join("done.txt"), b"abc").expect("file");
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        fs::File::options()
            .write(true)
            .open(out.join("done.txt"))
            .and_then(|f| f.set_modified(when))
            .expect("mtime");
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let same = Entry::file(name("done.txt"), 3, Mode::Regular, 1_700_000_000);
        assert_eq!(dir.preflight(&same).expect("ok"), Target::Same);
        assert!(!dir.has_partial(&name("done.txt")).expect("ok"));
        assert!(!dir.has_partial(&name("no/such/folder.txt")).expect("ok"));
        fs::write(out.join(".half.txt.warren-part"), b"ab").expect("part");
        assert!(dir.has_partial(&name("half.txt")).expect("ok"));
        for other in [
            Entry::file(name("done.txt"), 4, Mode::Regular, 1_700_000_000),
            Entry::file(name("done.txt"), 3, Mode::Regular, 1_700_000_001),
        ] {
            assert!(matches!(
                dir.preflight(&other),
                Err(WriteError::Exists { .. })
            ));
        }
    }

    #[test]
    fn a_folder_found_missing_is_looked_up_again_once_created() {
        let (_tmp, out) = scratch();
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let entry = Entry::file(name("new/a.txt"), 3, Mode::Regular, 0);
        assert_eq!(dir.preflight(&entry).expect("free"), Target::Free);
        assert!(!dir.has_partial(&entry.name).expect("ok"));
        dir.create_dir(&name("new")).expect("dir");
        fs::write(out.join("new").join(temp_name("a.txt", PART_SUFFIX)), b"ab").expect("part");
        assert!(dir.has_partial(&entry.name).expect("ok"));
        fs::write(out.join("new/a.txt"), b"old").expect("old");
        assert!(matches!(
            dir.preflight(&entry),
            Err(WriteError::Exists { .. })
        ));
        // A deeper missing folder, created by the write of a file beneath it.
        let deep = Entry::file(name("x/y/b.txt"), 1, Mode::Regular, 0);
        assert_eq!(dir.preflight(&deep).expect("free"), Target::Free);
        write_file(&mut dir, "x/y/b.txt", b"b", Mode::Regular).expect("write");
        assert!(matches!(
            dir.preflight(&deep),
            Err(WriteError::Exists { .. })
        ));
    }

    #[test]
    fn things_in_the_way_are_named() {
        let (_tmp, out) = scratch();
        fs::write(out.join("file"), b"x").expect("file");
        fs::create_dir(out.join("folder")).expect("folder");
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let err = write_file(&mut dir, "file/x", b"", Mode::Regular).expect_err("refused");
        assert!(
            matches!(err, WriteError::NotADirectory { ref at, .. } if at == "file"),
            "{err}"
        );
        let err = write_file(&mut dir, "folder", b"", Mode::Regular).expect_err("refused");
        assert!(matches!(err, WriteError::NotAFile { .. }), "{err}");
        assert_eq!(
            dir.preflight(&Entry::dir(name("folder"), 0)).expect("ok"),
            Target::DirExists
        );
        assert_eq!(
            dir.preflight(&Entry::file(name("new/deep/x"), 0, Mode::Regular, 0))
                .expect("ok"),
            Target::Free
        );
        let err = dir.create_dir(&name("file")).expect_err("refused");
        assert!(matches!(err, WriteError::NotADirectory { .. }), "{err}");
        let err = write_file(&mut dir, "a.warren-part", b"", Mode::Regular).expect_err("refused");
        assert!(matches!(err, WriteError::ReservedName { .. }), "{err}");
        assert!(matches!(
            OutputDir::open(&out.join("missing"), WriteOptions::default()),
            Err(WriteError::OpenOutput { .. })
        ));
    }

    #[test]
    fn temporary_names_fit_and_discard_cleans_up() {
        assert_eq!(temp_name("a.txt", PART_SUFFIX), ".a.txt.warren-part");
        let long = "x".repeat(250);
        let t = temp_name(&long, SIDECAR_SUFFIX);
        assert!(t.len() <= NAME_MAX && t.ends_with(SIDECAR_SUFFIX), "{t}");
        assert_eq!(t, temp_name(&long, SIDECAR_SUFFIX), "deterministic");

        let (_tmp, out) = scratch();
        let mut dir = OutputDir::open(&out, WriteOptions::default()).expect("open");
        let part = dir
            .open_part(&name(&long), Mode::Regular)
            .expect("long name");
        part.open_sidecar().expect("sidecar");
        assert_eq!(fs::read_dir(&out).expect("ls").count(), 2);
        part.discard().expect("discard");
        assert_eq!(fs::read_dir(&out).expect("ls").count(), 0);
    }
}
