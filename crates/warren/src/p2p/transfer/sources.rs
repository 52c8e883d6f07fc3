//! What the sender offers: the given files and folders walked into a [`Manifest`], with
//! the local path of each file. Only names, sizes, modes and times are read (one `lstat`
//! per entry), never file contents: the code can be shown at once, and chunks are hashed
//! later, while they are sent.
//!
//! Folders keep their tree under their own name (`send photos` offers `photos/…`).
//! Symbolic links and special files (sockets, pipes, devices) are not sent in v1: they are
//! skipped and listed in [`Sources::skipped`] for the CLI to warn about. `--exclude` globs
//! ([`globset`] syntax) are matched against each entry's name as sent (`photos/raw/a.cr2`)
//! and against its last component (`a.cr2`), so `*.tmp` and `photos/raw/**` both work; an
//! excluded folder is not walked.
//!
//! A name that cannot be sent safely ([`SafeName`]'s rules: control characters, `\`,
//! device names, …) stops the walk with an error naming the file and suggesting
//! `--exclude`. The walk is blocking file-system work: run it off the async runtime
//! (`spawn_blocking`) for big trees.

use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::{Glob, GlobSet, GlobSetBuilder};
use warren_proto::files::manifest::MAX_ENTRIES;
use warren_proto::files::{
    Entry, Manifest, ManifestError, Mode, NameError, SafeName, escape_for_terminal,
};

/// Why a path was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A symbolic link (not sent in v1).
    Symlink,
    /// A socket, pipe or device.
    Special,
}

/// A path left out of the manifest, for the CLI to warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The local path.
    pub path: PathBuf,
    /// Why.
    pub reason: SkipReason,
}

/// Why the files to send cannot be offered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A path cannot be read.
    #[error("cannot read {}: {source}: check that it exists and that you may read it", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A name the receiver could not create safely.
    #[error(
        "cannot send {}: {source}; or leave it out with --exclude '{exclude}'",
        escape_for_terminal(&path.to_string_lossy())
    )]
    UnsafeName {
        /// The path.
        path: PathBuf,
        /// What is wrong with its name.
        source: NameError,
        /// A glob that would leave it out.
        exclude: String,
    },
    /// An `--exclude` pattern that is not a valid glob.
    #[error("--exclude '{glob}' is not a valid glob: {source}")]
    BadGlob {
        /// The pattern.
        glob: String,
        /// Why.
        source: globset::Error,
    },
    /// More entries than one transfer carries.
    #[error(
        "more than {max} files and folders: send the tree in parts, or leave some out with --exclude"
    )]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// The entries cannot go into one folder together (two top-level names alike, …).
    #[error(
        "the files to send cannot be offered together: {0}; send them separately or leave one out with --exclude"
    )]
    Manifest(#[from] ManifestError),
    /// Nothing left to send.
    #[error("nothing to send: every path given was excluded or skipped")]
    Empty,
}

/// The walked files: the manifest, each file's local path, and what was skipped.
#[derive(Debug, Clone)]
pub struct Sources {
    manifest: Manifest,
    /// By file id: the local path of a file entry, `None` for a folder.
    paths: Vec<Option<PathBuf>>,
    skipped: Vec<Skipped>,
}

impl Sources {
    /// Walks `paths` (files and folders) into a manifest, leaving out what matches
    /// `excludes`.
    ///
    /// # Errors
    ///
    /// [`SourceError`] naming the path and the fix.
    pub fn walk(paths: &[PathBuf], excludes: &[String]) -> Result<Sources, SourceError> {
        let excludes = build_globs(excludes)?;
        let mut walk = Walk {
            excludes,
            found: Vec::new(),
            skipped: Vec::new(),
        };
        for path in paths {
            let name = top_level_name(path)?;
            walk.visit(path.clone(), name)?;
        }
        if walk.found.is_empty() {
            return Err(SourceError::Empty);
        }
        let mut by_name: std::collections::HashMap<String, PathBuf> = walk
            .found
            .iter()
            .filter_map(|(entry, path)| {
                path.as_ref()
                    .map(|p| (entry.name.as_str().to_owned(), p.clone()))
            })
            .collect();
        let manifest = Manifest::new(walk.found.into_iter().map(|(entry, _)| entry).collect())?;
        let paths = manifest
            .entries()
            .iter()
            .map(|entry| by_name.remove(entry.name.as_str()))
            .collect();
        Ok(Sources {
            manifest,
            paths,
            skipped: walk.skipped,
        })
    }

    /// The manifest to offer.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The local path of file `file_id` (`None` for a folder or an unknown id).
    pub fn path(&self, file_id: u32) -> Option<&Path> {
        self.paths.get(usize::try_from(file_id).ok()?)?.as_deref()
    }

    /// What was left out (links, special files), for the CLI to warn about.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }
}

struct Walk {
    excludes: GlobSet,
    /// Entries with the local path of files.
    found: Vec<(Entry, Option<PathBuf>)>,
    skipped: Vec<Skipped>,
}

impl Walk {
    /// Adds `path` under `name`, and a folder's contents beneath it (depth-first, with an
    /// explicit stack: a deep tree cannot overflow ours).
    fn visit(&mut self, path: PathBuf, name: String) -> Result<(), SourceError> {
        let mut stack = vec![(path, name)];
        while let Some((path, name)) = stack.pop() {
            if self.excluded(&name) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).map_err(|source| SourceError::Read {
                path: path.clone(),
                source,
            })?;
            let kind = meta.file_type();
            if kind.is_symlink() || !(kind.is_dir() || kind.is_file()) {
                let reason = if kind.is_symlink() {
                    SkipReason::Symlink
                } else {
                    SkipReason::Special
                };
                self.skipped.push(Skipped { path, reason });
                continue;
            }
            if self.found.len() >= MAX_ENTRIES {
                return Err(SourceError::TooMany { max: MAX_ENTRIES });
            }
            let safe = SafeName::new(&name).map_err(|source| unsafe_name(&path, &name, source))?;
            let mtime = mtime(&meta);
            if kind.is_file() {
                let entry = Entry::file(safe, meta.len(), mode(&meta), mtime);
                self.found.push((entry, Some(path)));
                continue;
            }
            self.found.push((Entry::dir(safe, mtime), None));
            let read = |source| SourceError::Read {
                path: path.clone(),
                source,
            };
            for child in std::fs::read_dir(&path).map_err(read)? {
                let child = child.map_err(read)?;
                let child_name = child.file_name();
                let Some(child_name) = child_name.to_str() else {
                    return Err(unsafe_name(
                        &child.path(),
                        &child_name.to_string_lossy(),
                        NameError::NotUtf8,
                    ));
                };
                stack.push((child.path(), format!("{name}/{child_name}")));
            }
        }
        Ok(())
    }

    fn excluded(&self, name: &str) -> bool {
        let last = name.rsplit('/').next().unwrap_or(name);
        self.excludes.is_match(name) || self.excludes.is_match(last)
    }
}

fn build_globs(excludes: &[String]) -> Result<GlobSet, SourceError> {
    let mut builder = GlobSetBuilder::new();
    for glob in excludes {
        let parsed = Glob::new(glob).map_err(|source| SourceError::BadGlob {
            glob: glob.clone(),
            source,
        })?;
        builder.add(parsed);
    }
    builder.build().map_err(|source| SourceError::BadGlob {
        glob: excludes.join(" "),
        source,
    })
}

/// The name a path given on the command line is sent under: its last component (`.` and
/// `..` resolve to the folder's real name).
fn top_level_name(path: &Path) -> Result<String, SourceError> {
    let named = match path.file_name() {
        Some(name) => name.to_owned(),
        None => {
            let real = std::fs::canonicalize(path).map_err(|source| SourceError::Read {
                path: path.to_owned(),
                source,
            })?;
            real.file_name()
                .map(|n| n.to_owned())
                .ok_or_else(|| unsafe_name(path, "/", NameError::Empty))?
        }
    };
    named
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| unsafe_name(path, &named.to_string_lossy(), NameError::NotUtf8))
}

fn unsafe_name(path: &Path, name: &str, source: NameError) -> SourceError {
    let last = name.rsplit('/').next().unwrap_or(name);
    // A glob matching the name: metacharacters in brackets, and characters a terminal
    // would act on (controls, bidi overrides) as `?`, so the hint is safe to print and
    // still works when typed.
    let exclude = last
        .chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
                "?".to_owned()
            } else if "*?[]{}\\!".contains(c) {
                format!("[{c}]")
            } else {
                c.to_string()
            }
        })
        .collect();
    SourceError::UnsafeName {
        path: path.to_owned(),
        source,
        exclude,
    }
}

fn mtime(meta: &Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

#[cfg(unix)]
fn mode(meta: &Metadata) -> Mode {
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o111 != 0 {
        Mode::Executable
    } else {
        Mode::Regular
    }
}

#[cfg(not(unix))]
fn mode(_meta: &Metadata) -> Mode {
    Mode::Regular
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sources: &Sources) -> Vec<&str> {
        sources
            .manifest()
            .entries()
            .iter()
            .map(|e| e.name.as_str())
            .collect()
    }

    #[test]
    fn walks_a_tree_skips_links_and_honours_excludes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("tree");
        std::fs::create_dir_all(root.join("sub/deeper")).expect("dirs");
        std::fs::write(root.join("a.txt"), b"abc").expect("write");
        std::fs::write(root.join("skip.tmp"), b"x").expect("write");
        std::fs::write(root.join("sub/deeper/b.bin"), b"").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).expect("symlink");
        let sources = Sources::walk(std::slice::from_ref(&root), &["*.tmp".into()]).expect("walks");
        assert_eq!(
            names(&sources),
            [
                "tree",
                "tree/a.txt",
                "tree/sub",
                "tree/sub/deeper",
                "tree/sub/deeper/b.bin"
            ]
        );
        assert_eq!(sources.skipped().len(), 1);
        assert_eq!(sources.skipped()[0].reason, SkipReason::Symlink);
        assert_eq!(sources.manifest().total_size(), 3);
        assert_eq!(sources.path(1), Some(root.join("a.txt").as_path()));
        assert_eq!(sources.path(0), None);
        let excluded = Sources::walk(
            std::slice::from_ref(&root),
            &["tree/sub/**".into(), "tree/sub".into()],
        )
        .expect("walks");
        assert_eq!(names(&excluded), ["tree", "tree/a.txt", "tree/skip.tmp"]);
        assert!(matches!(
            Sources::walk(&[root], &["tree".into()]),
            Err(SourceError::Empty)
        ));
    }

    #[test]
    fn an_unsafe_name_is_named_with_an_exclude_hint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("t");
        std::fs::create_dir(&root).expect("dir");
        std::fs::write(root.join("bad\u{1b}[31m"), b"x").expect("write");
        let err = Sources::walk(&[root], &[]).expect_err("refused");
        let SourceError::UnsafeName { exclude, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(exclude, "bad?[[]31m");
        assert!(!err.to_string().contains('\u{1b}'));
        assert!(err.to_string().contains("--exclude"));
    }
}
