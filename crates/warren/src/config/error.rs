//! Config errors: one [`ConfigError`] per problem, gathered into [`ConfigErrors`] so a user
//! fixes a file in one pass instead of one error per run.
//!
//! Also holds the crate-internal [`Report`], the collector the loader and the converters
//! write into, and the helpers that turn byte offsets into `line:column` and walk key paths
//! (`server.services.web.bind`) up to their parents.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// One problem in a config: where it is, what is wrong and how to fix it.
///
/// Messages never contain the value of a secret (PSK or token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The key path, e.g. `server.services.web.bind` or `client.ciphers[1]`; empty for
    /// problems that belong to no key (TOML syntax errors, an empty file).
    pub key: String,
    /// 1-based line in the file, when the config came from a file.
    pub line: Option<usize>,
    /// 1-based column (in characters) in the file, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: Option<String>,
}

impl ConfigError {
    /// An error about `key` with no position yet; the loader fills in the position.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            line: None,
            column: None,
            message: message.into(),
            hint: None,
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, "{line}:{column}: ")?,
            (Some(line), None) => write!(f, "{line}: ")?,
            _ => {}
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Everything wrong with a config, reported at once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrors {
    /// The config file could not be read at all.
    Read {
        /// The file we tried to read.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The config was read but is invalid; `errors` is never empty.
    Invalid {
        /// The file name (or another label) to print before each error; `None` for configs
        /// built in code.
        source_name: Option<String>,
        /// Every problem found, sorted by position.
        errors: Vec<ConfigError>,
    },
}

impl ConfigErrors {
    /// The individual problems (empty for [`ConfigErrors::Read`]).
    pub fn errors(&self) -> &[ConfigError] {
        match self {
            ConfigErrors::Read { .. } => &[],
            ConfigErrors::Invalid { errors, .. } => errors,
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigErrors::Read { path, source } => {
                let hint = match source.kind() {
                    io::ErrorKind::NotFound => {
                        "check the path, or start from examples/server.toml or examples/client.toml"
                    }
                    io::ErrorKind::PermissionDenied => {
                        "make the file readable by the user that runs warren (and keep it unreadable for others: it holds secrets)"
                    }
                    io::ErrorKind::InvalidData => "save the file as UTF-8",
                    io::ErrorKind::FileTooLarge => {
                        "a config is a few KiB: check that the path names the config file"
                    }
                    _ => "check that the path names a readable file",
                };
                write!(
                    f,
                    "cannot read config file {}: {source}\n  hint: {hint}",
                    path.display()
                )
            }
            ConfigErrors::Invalid {
                source_name,
                errors,
            } => {
                for (i, error) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    if let Some(name) = source_name {
                        write!(f, "{name}:")?;
                        if error.line.is_none() {
                            f.write_str(" ")?;
                        }
                    }
                    write!(f, "{error}")?;
                }
                Ok(())
            }
        }
    }
}

/// Collects errors while a config is converted, and remembers which keys already failed
/// ("poisoned"), so a key that could not be parsed is not reported a second time as
/// missing or as breaking a rule that depends on it.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) errors: Vec<ConfigError>,
    poisoned: BTreeSet<String>,
}

impl Report {
    /// Records an error.
    pub(crate) fn push(&mut self, error: ConfigError) {
        self.errors.push(error);
    }

    /// Records an error and poisons its key.
    pub(crate) fn fail(&mut self, error: ConfigError) {
        self.poison(&error.key.clone());
        self.errors.push(error);
    }

    /// Marks `key` (and everything under it) as already reported.
    pub(crate) fn poison(&mut self, key: &str) {
        self.poisoned.insert(key.to_owned());
    }

    /// Whether `key` or one of its ancestors is poisoned.
    pub(crate) fn is_poisoned(&self, key: &str) -> bool {
        let mut current = Some(key);
        while let Some(path) = current {
            if self.poisoned.contains(path) {
                return true;
            }
            current = parent_path(path);
        }
        false
    }

    /// Adds the errors of a semantic check, dropping those about poisoned keys: their
    /// real problem has been reported already, and the value checked was a placeholder.
    pub(crate) fn extend_checked(&mut self, errors: Vec<ConfigError>) {
        for error in errors {
            if !self.is_poisoned(&error.key) {
                self.errors.push(error);
            }
        }
    }

    /// The errors as [`ConfigErrors`], sorted by position (errors without one last).
    pub(crate) fn into_result(self, source_name: Option<String>) -> Result<(), ConfigErrors> {
        if self.errors.is_empty() {
            return Ok(());
        }
        let mut errors = self.errors;
        errors.sort_by_key(|e| (e.line.unwrap_or(usize::MAX), e.column.unwrap_or(0)));
        errors.dedup();
        Err(ConfigErrors::Invalid {
            source_name,
            errors,
        })
    }
}

/// `parent.key`, quoting `key` when it is not a bare TOML key, so paths stay unambiguous.
pub(crate) fn join_key(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_owned()
    } else {
        format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
    };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

/// `parent[index]`, for array elements.
pub(crate) fn join_index(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// The path one level up (`a.b[2]` -> `a.b` -> `a`), or `None` at the top.
pub(crate) fn parent_path(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    // Find the last separator outside quotes; quoted keys may contain `.` and `[`.
    let mut last_separator = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in path.char_indices() {
        if in_quotes {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_quotes = false,
                _ => {}
            }
        } else {
            match c {
                '"' => in_quotes = true,
                '.' | '[' => last_separator = i,
                _ => {}
            }
        }
    }
    Some(&path[..last_separator])
}

/// Turns byte offsets into 1-based `(line, column)`; columns count characters.
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { text, line_starts }
    }

    /// The position of byte `offset` (clamped to the text, rounded down to a char boundary).
    pub(crate) fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let line_start = self
            .line_starts
            .get(line.wrapping_sub(1))
            .copied()
            .unwrap_or(0);
        let column = self.text[line_start..offset].chars().count() + 1;
        (line.max(1), column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_respect_quotes() {
        assert_eq!(
            parent_path("server.services.web.bind"),
            Some("server.services.web")
        );
        assert_eq!(parent_path("client.ciphers[1]"), Some("client.ciphers"));
        assert_eq!(
            parent_path("server.services.\"a.b\".bind"),
            Some("server.services.\"a.b\"")
        );
        assert_eq!(
            parent_path("server.services.\"a.b\""),
            Some("server.services")
        );
        assert_eq!(parent_path("server"), Some(""));
        assert_eq!(parent_path(""), None);
        assert_eq!(
            join_key("server.services", "a.b"),
            "server.services.\"a.b\""
        );
        assert_eq!(join_key("", "server"), "server");
    }

    #[test]
    fn line_and_column() {
        let index = LineIndex::new("ab\ncdé\nf");
        assert_eq!(index.position(0), (1, 1));
        assert_eq!(index.position(3), (2, 1));
        assert_eq!(index.position(7), (2, 4)); // after the two-byte é
        assert_eq!(index.position(8), (3, 1));
        assert_eq!(index.position(1000), (3, 2));
        assert_eq!(index.position(6), (2, 3)); // inside é: rounded down
    }

    #[test]
    fn display_format() {
        let mut error = ConfigError::new("server.services.web.bind", "invalid socket address")
            .with_hint("write it as IP:PORT");
        error.line = Some(12);
        error.column = Some(8);
        let errors = ConfigErrors::Invalid {
            source_name: Some("warren.toml".into()),
            errors: vec![error, ConfigError::new("", "no section")],
        };
        assert_eq!(
            errors.to_string(),
            "warren.toml:12:8: server.services.web.bind: invalid socket address\n  hint: write it as IP:PORT\nwarren.toml: no section"
        );
    }
}
