//! File names that are safe to create beneath an output folder, by construction.
//!
//! A sender names each file of a transfer with a relative, `/`-separated UTF-8 path. The
//! receiver must never let such a name leave its output folder, clobber something outside
//! it, or confuse the person reading it on a terminal: croc and magic-wormhole both shipped
//! path-traversal bugs because names were checked late, in one place out of several. Here
//! the only way to hold a [`SafeName`] is to pass [`SafeName::new`], so every function that
//! takes one (the manifest, the writer) is safe by its signature.
//!
//! What [`SafeName::new`] refuses, and why:
//! * absolute paths (`/etc/passwd`), Windows drive letters (`C:x`, `C:\x`) and UNC or
//!   device prefixes (`\\server\share`, `//?/`): they name places outside the folder;
//! * backslashes: a path separator on Windows, so `a\..\..\x` would be traversal there;
//! * empty, `.` and `..` components: traversal, or ambiguity (`a//b`, `a/./b`);
//! * control characters (C0, DEL, C1) and bidirectional-text controls: they rewrite the
//!   terminal (ANSI escapes) or disguise a name (`exe.txt` shown for `txt.exe`);
//! * Windows device names (`CON`, `PRN`, `AUX`, `NUL`, `COM0`–`COM9`, `LPT0`–`LPT9`, the
//!   superscript-digit forms, `CONIN$`, `CONOUT$`), with or without an extension, any
//!   case: opening them on Windows talks to a device, not a file;
//! * a component ending in `.` or space: Windows silently strips them, so `a.` and `a`
//!   would be the same file there;
//! * components over [`MAX_COMPONENT_LEN`] bytes, paths over [`MAX_NAME_LEN`] bytes and
//!   trees deeper than [`MAX_DEPTH`]: bounds on what a peer can make the receiver create.
//!
//! A set of names is checked as a whole by [`NameSet`]: no two names that are the same file
//! on a case-insensitive or normalization-insensitive file system (macOS, Windows), since
//! the second would overwrite the first there, and no file that is also the parent folder of
//! another entry. Twins are found by folding each name to a key: Unicode NFC
//! (`unicode-normalization`), then `str::to_lowercase`, then NFC again. `to_lowercase` is
//! full lowercase mapping, not Unicode case folding proper (`ß` stays `ß` where folding
//! gives `ss`, and NTFS uses its own upcase table): close enough to catch the twins file
//! systems actually merge, and it errs only towards accepting a pair that one exotic file
//! system would merge, never towards refusing a pair that is really distinct.
//!
//! Colons and the other characters Windows forbids (`<>:"|?*`) are legal on the wire: they
//! are fine on Unix, and a Windows writer must refuse them when it creates the file.
//!
//! Names are shown to people through [`escape_for_terminal`], which escapes every control
//! character, so even an unchecked name in an error message cannot drive the terminal.

use std::collections::{HashMap, HashSet};
use std::fmt;

use unicode_normalization::UnicodeNormalization;

/// The longest name, in bytes (Linux's `PATH_MAX`).
pub const MAX_NAME_LEN: usize = 4096;

/// The longest component, in bytes (`NAME_MAX` on Linux and most file systems).
pub const MAX_COMPONENT_LEN: usize = 255;

/// The most components in one name: deeper trees are refused so a peer cannot make the
/// receiver create (and later walk) absurdly deep folders.
pub const MAX_DEPTH: usize = 128;

/// Why a name was refused. Each message says what is wrong; offending text is shown
/// escaped ([`escape_for_terminal`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is not UTF-8 (only on the wire: `&str` is always UTF-8).
    #[error("file name is not valid UTF-8: rename the file with a UTF-8 name")]
    NotUtf8,
    /// The empty string.
    #[error("empty file name: every entry needs a name")]
    Empty,
    /// Longer than [`MAX_NAME_LEN`].
    #[error(
        "file name of {len} bytes is longer than the {max}-byte limit: move the file higher up the tree or shorten its folders' names"
    )]
    TooLong {
        /// The name's length in bytes.
        len: usize,
        /// [`MAX_NAME_LEN`].
        max: usize,
    },
    /// More than [`MAX_DEPTH`] components.
    #[error(
        "file name `{name}` is {depth} folders deep; the limit is {max}: send a shallower tree"
    )]
    TooDeep {
        /// The name, escaped and shortened.
        name: String,
        /// Its number of components.
        depth: usize,
        /// [`MAX_DEPTH`].
        max: usize,
    },
    /// Starts with `/`.
    #[error(
        "file name `{name}` is an absolute path: names must be relative to the folder being sent"
    )]
    Absolute {
        /// The name, escaped and shortened.
        name: String,
    },
    /// Starts with a Windows drive letter (`C:`).
    #[error(
        "file name `{name}` starts with a drive letter: names must be relative to the folder being sent"
    )]
    DriveLetter {
        /// The name, escaped and shortened.
        name: String,
    },
    /// Contains `\`.
    #[error(
        "file name `{name}` contains a backslash, a path separator on Windows: rename the file"
    )]
    Backslash {
        /// The name, escaped and shortened.
        name: String,
    },
    /// `a//b` or a trailing `/`.
    #[error("file name `{name}` has an empty component (`//` or a trailing `/`)")]
    EmptyComponent {
        /// The name, escaped and shortened.
        name: String,
    },
    /// A `.` or `..` component.
    #[error(
        "file name `{name}` has a `.` or `..` component, which could point outside the output folder: the sender is broken or hostile"
    )]
    DotComponent {
        /// The name, escaped and shortened.
        name: String,
    },
    /// A C0, DEL or C1 control character.
    #[error("file name `{name}` contains the control character U+{code:04X}: rename the file")]
    ControlCharacter {
        /// The name, escaped and shortened.
        name: String,
        /// The character's code point.
        code: u32,
    },
    /// A bidirectional-text control (which can make a name display as another).
    #[error(
        "file name `{name}` contains the bidirectional-text control U+{code:04X}, which can disguise a name: rename the file"
    )]
    BidiControl {
        /// The name, escaped and shortened.
        name: String,
        /// The character's code point.
        code: u32,
    },
    /// A Windows device name such as `CON` or `nul.txt`.
    #[error(
        "file name `{name}` has the component `{component}`, a device name on Windows: rename the file"
    )]
    DeviceName {
        /// The name, escaped and shortened.
        name: String,
        /// The offending component, escaped.
        component: String,
    },
    /// A component ending in `.` or a space.
    #[error(
        "file name `{name}` has the component `{component}` ending in a dot or space, which Windows strips: rename the file"
    )]
    TrailingDotOrSpace {
        /// The name, escaped and shortened.
        name: String,
        /// The offending component, escaped.
        component: String,
    },
    /// A component longer than [`MAX_COMPONENT_LEN`].
    #[error("file name `{name}` has a component of {len} bytes; the limit is {max}: shorten it")]
    ComponentTooLong {
        /// The name, escaped and shortened.
        name: String,
        /// The component's length in bytes.
        len: usize,
        /// [`MAX_COMPONENT_LEN`].
        max: usize,
    },
}

/// Why a set of names cannot live in one folder together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameSetError {
    /// The same name twice.
    #[error("the name `{name}` appears twice: each file may be sent once")]
    Duplicate {
        /// The name, escaped.
        name: String,
    },
    /// Two names that one case- or normalization-insensitive file system treats as one.
    #[error(
        "`{first}` and `{second}` differ only in letter case or Unicode normalization, so one would overwrite the other on macOS or Windows: rename one of them"
    )]
    Twins {
        /// The name seen first, escaped.
        first: String,
        /// The name seen second, escaped.
        second: String,
    },
    /// A file whose name is also a folder on the path of another entry.
    #[error(
        "`{file}` is a file, but `{entry}` needs it to be a folder: the sender is broken or hostile"
    )]
    FileIsParent {
        /// The file, escaped.
        file: String,
        /// The entry beneath it, escaped.
        entry: String,
    },
}

/// A validated relative path: `/`-separated components, each a plain name that is safe to
/// create on Linux, macOS and Windows. The only constructor is [`SafeName::new`] (and the
/// wire decoder built on it), so holding one is the proof that it was checked.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SafeName(String);

impl SafeName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    ///
    /// A [`NameError`] naming the first rule the name breaks (see the module docs).
    pub fn new(name: &str) -> Result<SafeName, NameError> {
        check_name(name)?;
        Ok(SafeName(name.to_owned()))
    }

    /// Checks wire bytes: UTF-8 first, then [`SafeName::new`].
    ///
    /// # Errors
    ///
    /// [`NameError::NotUtf8`], or what [`SafeName::new`] refuses.
    pub fn from_bytes(bytes: &[u8]) -> Result<SafeName, NameError> {
        let name = std::str::from_utf8(bytes).map_err(|_| NameError::NotUtf8)?;
        SafeName::new(name)
    }

    /// The name as text (`/`-separated).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its components, outermost first. Never empty; none is empty, `.` or `..`.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &str> + '_ {
        self.0.split('/')
    }

    /// The last component (the file's own name).
    pub fn file_name(&self) -> &str {
        // `rsplit` always yields at least one item.
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The names of the folders above this entry, outermost first (`a`, `a/b` for
    /// `a/b/c`).
    pub fn ancestors(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.match_indices('/').map(move |(at, _)| &self.0[..at])
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.0.split('/').count()
    }

    /// The key under which twins collide: NFC, lowercase, NFC (see the module docs).
    pub fn fold_key(&self) -> String {
        fold(&self.0)
    }

    /// The name for a terminal: control characters escaped (a checked name has none, but
    /// this keeps display code uniform with unchecked names).
    pub fn escaped(&self) -> String {
        escape_for_terminal(&self.0)
    }
}

impl fmt::Debug for SafeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SafeName({:?})", self.0)
    }
}

impl fmt::Display for SafeName {
    /// Shown escaped, so it is always safe to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_for_terminal(&self.0))
    }
}

impl AsRef<str> for SafeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Case and Unicode-normalization key of a name.
fn fold(name: &str) -> String {
    let nfc: String = name.nfc().collect();
    nfc.to_lowercase().nfc().collect()
}

/// The most characters of an offending name quoted in an error.
const QUOTE_CHARS: usize = 120;

/// An offending name for an error message: escaped and cut to [`QUOTE_CHARS`].
fn quote(name: &str) -> String {
    let mut cut: String = name.chars().take(QUOTE_CHARS).collect();
    if cut.len() < name.len() {
        cut.push('…');
    }
    escape_for_terminal(&cut)
}

fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    // Characters first: an error about a control character is the most useful one, and
    // the later checks may then quote the name freely.
    for ch in name.chars() {
        if is_control(ch) {
            return Err(NameError::ControlCharacter {
                name: quote(name),
                code: u32::from(ch),
            });
        }
        if is_bidi_control(ch) {
            return Err(NameError::BidiControl {
                name: quote(name),
                code: u32::from(ch),
            });
        }
    }
    if name.contains('\\') {
        return Err(NameError::Backslash { name: quote(name) });
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute { name: quote(name) });
    }
    if has_drive_letter(name) {
        return Err(NameError::DriveLetter { name: quote(name) });
    }
    let depth = name.split('/').count();
    if depth > MAX_DEPTH {
        return Err(NameError::TooDeep {
            name: quote(name),
            depth,
            max: MAX_DEPTH,
        });
    }
    for component in name.split('/') {
        check_component(name, component)?;
    }
    Ok(())
}

fn check_component(name: &str, component: &str) -> Result<(), NameError> {
    match component {
        "" => return Err(NameError::EmptyComponent { name: quote(name) }),
        "." | ".." => return Err(NameError::DotComponent { name: quote(name) }),
        _ => {}
    }
    if component.len() > MAX_COMPONENT_LEN {
        return Err(NameError::ComponentTooLong {
            name: quote(name),
            len: component.len(),
            max: MAX_COMPONENT_LEN,
        });
    }
    if component.ends_with('.') || component.ends_with(' ') {
        return Err(NameError::TrailingDotOrSpace {
            name: quote(name),
            component: quote(component),
        });
    }
    if is_device_name(component) {
        return Err(NameError::DeviceName {
            name: quote(name),
            component: quote(component),
        });
    }
    Ok(())
}

/// C0 controls, DEL and C1 controls.
fn is_control(ch: char) -> bool {
    matches!(ch, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Characters that change the direction text is shown in: the embeddings and overrides
/// (U+202A–U+202E), the isolates (U+2066–U+2069) and the marks (U+200E, U+200F,
/// U+061C). Unicode TR #36 lists them as the spoofing risk in file names.
fn is_bidi_control(ch: char) -> bool {
    matches!(
        ch,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}'
    )
}

/// `C:` at the very start: a drive-relative or absolute Windows path.
fn has_drive_letter(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Whether Windows treats `component` as a device: the part before the first dot, with
/// trailing spaces removed (Windows ignores them there too), is a reserved name in any case.
fn is_device_name(component: &str) -> bool {
    let stem = component.split('.').next().unwrap_or(component);
    let stem = stem.trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => {
            let Some(rest) = upper
                .strip_prefix("COM")
                .or_else(|| upper.strip_prefix("LPT"))
            else {
                return false;
            };
            let mut chars = rest.chars();
            matches!(
                (chars.next(), chars.next()),
                (Some('0'..='9' | '\u{b9}' | '\u{b2}' | '\u{b3}'), None)
            )
        }
    }
}

/// `name` with every control character and bidi control escaped, and `\` doubled, so the
/// result is plain printable text that shows what the bytes were: `\t`, `\n`, `\r`, `\e`
/// (ESC) for the common ones, `\u{…}` for the rest.
pub fn escape_for_terminal(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            c if is_control(c) || is_bidi_control(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
}

/// Checks a set of names as they are added: no duplicates, no case or normalization twins,
/// no file that is also a folder above another entry. Add every entry (files and folders)
/// with its kind; order does not matter.
#[derive(Debug, Default)]
pub struct NameSet {
    /// Fold key → the name seen with it (for error messages) and what it is.
    keys: HashMap<String, (SafeName, EntryKind)>,
    /// Fold keys of every folder above some entry (explicit or implied).
    parents: HashSet<String>,
}

/// What an entry is: a file or a folder (symbolic links are not sent in v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A regular file: nothing may live beneath it.
    File,
    /// A folder.
    Dir,
}

impl NameSet {
    /// An empty set.
    pub fn new() -> NameSet {
        NameSet::default()
    }

    /// Adds one entry.
    ///
    /// # Errors
    ///
    /// [`NameSetError`] if the entry clashes with one added before; the set is unchanged.
    pub fn insert(&mut self, name: &SafeName, kind: EntryKind) -> Result<(), NameSetError> {
        let key = name.fold_key();
        if let Some((first, _)) = self.keys.get(&key) {
            return Err(if first == name {
                NameSetError::Duplicate {
                    name: name.escaped(),
                }
            } else {
                NameSetError::Twins {
                    first: first.escaped(),
                    second: name.escaped(),
                }
            });
        }
        // A file beneath an earlier file?
        let ancestor_keys: Vec<String> = name.ancestors().map(fold).collect();
        for ancestor in &ancestor_keys {
            if let Some((file, EntryKind::File)) = self.keys.get(ancestor) {
                return Err(NameSetError::FileIsParent {
                    file: file.escaped(),
                    entry: name.escaped(),
                });
            }
        }
        // A file above an earlier entry?
        if kind == EntryKind::File && self.parents.contains(&key) {
            let entry = self
                .keys
                .iter()
                .find(|(k, _)| k.starts_with(&key) && k.as_bytes().get(key.len()) == Some(&b'/'))
                .map_or_else(|| quote(&key), |(_, (n, _))| n.escaped());
            return Err(NameSetError::FileIsParent {
                file: name.escaped(),
                entry,
            });
        }
        self.parents.extend(ancestor_keys);
        self.keys.insert(key, (name.clone(), kind));
        Ok(())
    }

    /// How many names were added.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no name was added.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(name: &str) {
        let safe = SafeName::new(name).unwrap_or_else(|e| panic!("{name:?} refused: {e}"));
        assert_eq!(safe.as_str(), name);
    }

    fn refused(name: &str) -> NameError {
        match SafeName::new(name) {
            Ok(_) => panic!("{name:?} accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn plain_names_pass() {
        for name in [
            "a",
            "a/b/c.txt",
            "photos/2024/IMG_0001.JPG",
            ".hidden",
            "..dots-inside..x",
            "a.b.c",
            "résumé.pdf",
            "日本語/ファイル",
            "emoji 🦀.rs",
            "with space/inside name",
            "12:30 notes.txt",
            "console",
            "CONSOLE.txt",
            "COM10",
            "LPT",
            "comx",
            "nul-ish",
        ] {
            ok(name);
        }
    }

    #[test]
    fn traversal_and_absolute_are_refused() {
        assert!(matches!(refused(""), NameError::Empty));
        assert!(matches!(refused("/etc/passwd"), NameError::Absolute { .. }));
        assert!(matches!(
            refused("//server/share"),
            NameError::Absolute { .. }
        ));
        assert!(matches!(refused(".."), NameError::DotComponent { .. }));
        assert!(matches!(refused("../x"), NameError::DotComponent { .. }));
        assert!(matches!(
            refused("a/../../x"),
            NameError::DotComponent { .. }
        ));
        assert!(matches!(refused("a/.."), NameError::DotComponent { .. }));
        assert!(matches!(refused("./a"), NameError::DotComponent { .. }));
        assert!(matches!(refused("a/./b"), NameError::DotComponent { .. }));
        assert!(matches!(refused("a//b"), NameError::EmptyComponent { .. }));
        assert!(matches!(refused("a/"), NameError::EmptyComponent { .. }));
        assert!(matches!(refused("C:x"), NameError::DriveLetter { .. }));
        assert!(matches!(
            refused("c:/windows"),
            NameError::DriveLetter { .. }
        ));
        assert!(matches!(refused("C:\\x"), NameError::Backslash { .. }));
        assert!(matches!(
            refused("\\\\server\\share"),
            NameError::Backslash { .. }
        ));
        assert!(matches!(
            refused("a\\..\\..\\x"),
            NameError::Backslash { .. }
        ));
        assert!(matches!(refused("//?/C:/x"), NameError::Absolute { .. }));
    }

    #[test]
    fn control_and_bidi_characters_are_refused() {
        for (name, code) in [
            ("a\u{0}b", 0),
            ("a\nb", 0x0a),
            ("\u{1b}[31mred", 0x1b),
            ("del\u{7f}", 0x7f),
            ("c1\u{85}", 0x85),
            ("c1\u{9b}31m", 0x9b),
        ] {
            assert_eq!(
                refused(name),
                NameError::ControlCharacter {
                    name: escape_for_terminal(name),
                    code
                }
            );
        }
        for (name, code) in [
            ("evil\u{202e}txt.exe", 0x202e),
            ("x\u{2066}y", 0x2066),
            ("x\u{200f}", 0x200f),
            ("x\u{61c}", 0x61c),
        ] {
            assert!(
                matches!(refused(name), NameError::BidiControl { code: c, .. } if c == code),
                "{name:?}"
            );
        }
    }

    #[test]
    fn device_names_are_refused_in_any_case_and_with_extensions() {
        for name in [
            "CON",
            "con",
            "Con.txt",
            "dir/nul",
            "NUL.tar.gz",
            "aux",
            "prn.x",
            "COM1",
            "com9.log",
            "COM0",
            "lpt1",
            "LPT9.txt",
            "COM\u{b9}",
            "lpt\u{b2}.x",
            "conin$",
            "CONOUT$.txt",
            "nul .txt",
            "a/b/CON/c",
        ] {
            assert!(
                matches!(refused(name), NameError::DeviceName { .. }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn trailing_dots_and_spaces_are_refused() {
        for name in ["a.", "a ", "dir./x", "dir /x", "x/y..."] {
            assert!(
                matches!(refused(name), NameError::TrailingDotOrSpace { .. }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn lengths_and_depth_are_bounded() {
        let long = "x".repeat(MAX_COMPONENT_LEN);
        ok(&long);
        assert_eq!(
            refused(&format!("{long}y")),
            NameError::ComponentTooLong {
                name: quote(&format!("{long}y")),
                len: MAX_COMPONENT_LEN + 1,
                max: MAX_COMPONENT_LEN
            }
        );
        // Multi-byte characters count in bytes.
        let wide = "é".repeat(128); // 256 bytes
        assert!(matches!(
            refused(&wide),
            NameError::ComponentTooLong { len: 256, .. }
        ));

        let deep = vec!["d"; MAX_DEPTH].join("/");
        ok(&deep);
        assert!(matches!(
            refused(&format!("{deep}/d")),
            NameError::TooDeep { depth, .. } if depth == MAX_DEPTH + 1
        ));

        let path = vec!["x".repeat(200); 20].join("/"); // 4019 bytes
        ok(&path);
        let too_long = vec!["x".repeat(200); 21].join("/");
        assert_eq!(
            refused(&too_long),
            NameError::TooLong {
                len: too_long.len(),
                max: MAX_NAME_LEN
            }
        );
    }

    #[test]
    fn wire_bytes_must_be_utf8() {
        assert_eq!(
            SafeName::from_bytes(b"ok/x").map(|n| n.0),
            Ok("ok/x".into())
        );
        assert_eq!(SafeName::from_bytes(b"bad\xff"), Err(NameError::NotUtf8));
        assert_eq!(SafeName::from_bytes(b"\xc0\xaf"), Err(NameError::NotUtf8)); // overlong '/'
    }

    #[test]
    fn accessors() {
        let name = SafeName::new("a/b/c.txt").expect("valid");
        assert_eq!(name.components().collect::<Vec<_>>(), ["a", "b", "c.txt"]);
        assert_eq!(name.file_name(), "c.txt");
        assert_eq!(name.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(name.depth(), 3);
        let single = SafeName::new("x").expect("valid");
        assert_eq!(single.ancestors().count(), 0);
        assert_eq!(single.file_name(), "x");
    }

    #[test]
    fn escaping_makes_names_printable() {
        assert_eq!(escape_for_terminal("plain name"), "plain name");
        assert_eq!(
            escape_for_terminal("\u{1b}[2J\r\n\t\u{0}\u{9b}\u{202e}\\"),
            "\\e[2J\\r\\n\\t\\u{0}\\u{9b}\\u{202e}\\\\"
        );
        // Errors quote escaped names: no raw control character reaches the message.
        let message = refused("\u{1b}]0;pwned\u{7}").to_string();
        assert!(!message.chars().any(is_control), "{message:?}");
        let message = NameError::DeviceName {
            name: quote(&"n".repeat(500)),
            component: "x".into(),
        }
        .to_string();
        assert!(message.len() < 400, "long names are cut in messages");
    }

    fn set(entries: &[(&str, EntryKind)]) -> Result<NameSet, NameSetError> {
        let mut set = NameSet::new();
        for (name, kind) in entries {
            set.insert(&SafeName::new(name).expect("valid"), *kind)?;
        }
        Ok(set)
    }

    use EntryKind::{Dir, File};

    #[test]
    fn distinct_names_form_a_set() {
        let s = set(&[
            ("a", Dir),
            ("a/b", File),
            ("a/c", Dir),
            ("a/c/d", File),
            ("a-b", File),
            ("ab", File),
            ("straße", File),
            ("strasse", File), // to_lowercase does not fold ß: accepted (see module docs)
        ])
        .expect("distinct");
        assert_eq!(s.len(), 8);
    }

    #[test]
    fn duplicates_and_twins_are_refused() {
        assert!(matches!(
            set(&[("a/x", File), ("a/x", File)]),
            Err(NameSetError::Duplicate { .. })
        ));
        assert!(matches!(
            set(&[("README", File), ("readme", File)]),
            Err(NameSetError::Twins { .. })
        ));
        assert!(matches!(
            set(&[("Dir/x", File), ("dir/X", File)]),
            Err(NameSetError::Twins { .. })
        ));
        // NFC "é" (U+00E9) and NFD "e" + U+0301.
        assert!(matches!(
            set(&[("caf\u{e9}", File), ("cafe\u{301}", File)]),
            Err(NameSetError::Twins { .. })
        ));
        // Both at once: NFD uppercase against NFC lowercase.
        assert!(matches!(
            set(&[("CAFE\u{301}", File), ("caf\u{e9}", File)]),
            Err(NameSetError::Twins { .. })
        ));
        // Kelvin sign K (U+212A) lowercases to ASCII k.
        assert!(matches!(
            set(&[("\u{212a}", File), ("k", File)]),
            Err(NameSetError::Twins { .. })
        ));
        assert!(matches!(
            set(&[("x", Dir), ("X", File)]),
            Err(NameSetError::Twins { .. })
        ));
    }

    #[test]
    fn a_file_cannot_be_a_folder_of_another_entry() {
        // Either order.
        assert!(matches!(
            set(&[("a", File), ("a/b", File)]),
            Err(NameSetError::FileIsParent { .. })
        ));
        assert!(matches!(
            set(&[("a/b/c", File), ("a/b", File)]),
            Err(NameSetError::FileIsParent { .. })
        ));
        assert!(matches!(
            set(&[("a/b/c", Dir), ("a", File)]),
            Err(NameSetError::FileIsParent { .. })
        ));
        // Through a case twin of the folder.
        assert!(matches!(
            set(&[("A", File), ("a/b", File)]),
            Err(NameSetError::FileIsParent { .. })
        ));
        let err = set(&[("a/b/c", File), ("a/b", File)]).expect_err("clash");
        assert_eq!(
            err.to_string(),
            "`a/b` is a file, but `a/b/c` needs it to be a folder: the sender is broken or hostile"
        );
        // A folder above another entry is fine.
        set(&[("a", Dir), ("a/b", Dir), ("a/b/c", File)]).expect("folders");
    }
}
