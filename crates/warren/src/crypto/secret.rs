//! Secrets (PSKs, tokens) that never show up in logs, `Debug` output or comparisons that
//! leak timing.

use std::fmt;

use subtle::ConstantTimeEq;

/// A secret string from the config: masked in `Debug`/`Display`, compared in constant time.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Call sites are few and greppable: key derivation and proofs.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret as bytes, for key derivation.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Length in characters, for strength checks.
    pub fn len(&self) -> usize {
        self.0.chars().count()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(****)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl Eq for Secret {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_are_masked() {
        let s = Secret::new("hunter2-hunter2-hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        assert_eq!(s, Secret::new("hunter2-hunter2-hunter2"));
        assert_ne!(s, Secret::new("hunter2"));
    }
}
