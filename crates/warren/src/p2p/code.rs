//! The join code: `<nameplate>-<word>-<word>-<word>`, e.g. `7-guide-ahead-prism`.
//!
//! The nameplate is a short decimal number the server's mailbox hands out; it only tells
//! the mailbox which two peers to connect, and the server sees it. The three words, from a
//! 1296-word list (`words`), are the PAKE password: 1296^3 ≈ 2^31 possibilities, which is
//! plenty because SPAKE2 allows only online guessing, one guess per attempt, and a wrong
//! guess fails the real peer's exchange too (the nameplate is burned after a few).
//!
//! Parsing is forgiving about what people do when they copy a code (letter case, extra
//! spaces, `-` or spaces between the parts, leading zeros) and strict about the rest: a
//! word that is not in the list is an error (with the one word a typo away, if there is
//! exactly one, offered in the message), never silently corrected or completed, because a
//! guessed word is a wasted attempt.
//!
//! The code is a secret: [`Code`]'s `Debug` masks the words, and it has no `Display`; call
//! [`Code::reveal`] where it must be shown.

use std::fmt;

use warren_proto::files::escape_for_terminal;

use super::words::{WORD_COUNT, index_of, suggestion, word};

/// How many words a code has.
pub const WORDS_PER_CODE: usize = 3;

/// The most digits a nameplate may have.
pub const MAX_NAMEPLATE_DIGITS: usize = 9;

/// The mailbox slot two peers meet in: a short decimal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nameplate(u32);

impl Nameplate {
    /// The largest nameplate ([`MAX_NAMEPLATE_DIGITS`] nines).
    pub const MAX: u32 = 999_999_999;

    /// A nameplate, if `value` ≤ [`Nameplate::MAX`].
    pub fn new(value: u32) -> Option<Nameplate> {
        (value <= Nameplate::MAX).then_some(Nameplate(value))
    }

    /// Its number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Nameplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A join code: a nameplate and three words.
#[derive(Clone, PartialEq, Eq)]
pub struct Code {
    nameplate: Nameplate,
    words: [u16; WORDS_PER_CODE],
}

/// Why a typed code was not understood. Messages quote what was typed (escaped), so the
/// user can see the problem; they never contain the other words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodeError {
    /// Nothing but spaces and dashes.
    #[error("no code given: type the code the sender sees, like `7-guide-ahead-prism`")]
    Empty,
    /// The first part is not a number.
    #[error(
        "a code starts with the sender's number, like `7-guide-ahead-prism`, but this one starts with `{found}`: check the code"
    )]
    MissingNameplate {
        /// The first part, escaped.
        found: String,
    },
    /// A number over [`MAX_NAMEPLATE_DIGITS`] digits.
    #[error(
        "the number at the start of the code has {digits} digits; codes have at most {max}: check the code"
    )]
    NameplateTooLong {
        /// Digits typed.
        digits: usize,
        /// [`MAX_NAMEPLATE_DIGITS`].
        max: usize,
    },
    /// Not exactly [`WORDS_PER_CODE`] words.
    #[error(
        "a code has a number and {expected} words, but this one has {found} words: check the code"
    )]
    WordCount {
        /// Words typed.
        found: usize,
        /// [`WORDS_PER_CODE`].
        expected: usize,
    },
    /// A word that is not in the list.
    #[error("word {position} of the code, `{typed}`, is not one of Warren's code words{}: check the code", suggested.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownWord {
        /// 1-based position among the words.
        position: usize,
        /// The word as typed, escaped.
        typed: String,
        /// The one list word a typo away, if exactly one.
        suggested: Option<&'static str>,
    },
}

impl Code {
    /// A fresh code for `nameplate`, with words drawn uniformly from the list.
    pub fn generate<R: rand::CryptoRng + ?Sized>(nameplate: Nameplate, rng: &mut R) -> Code {
        use rand::Rng;
        // WORD_COUNT (1296) fits a u16.
        let mut draw = || rng.random_range(0..WORD_COUNT as u16);
        Code {
            nameplate,
            words: [draw(), draw(), draw()],
        }
    }

    /// Parses a typed code (see the module docs for what is forgiven).
    ///
    /// # Errors
    ///
    /// [`CodeError`] saying which part is wrong.
    pub fn parse(typed: &str) -> Result<Code, CodeError> {
        let mut parts = typed
            .split(|c: char| c == '-' || c.is_whitespace())
            .filter(|p| !p.is_empty());
        let first = parts.next().ok_or(CodeError::Empty)?;
        if !first.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CodeError::MissingNameplate {
                found: escape_for_terminal(&first.chars().take(40).collect::<String>()),
            });
        }
        let digits = first.trim_start_matches('0');
        if digits.len() > MAX_NAMEPLATE_DIGITS {
            return Err(CodeError::NameplateTooLong {
                digits: digits.len(),
                max: MAX_NAMEPLATE_DIGITS,
            });
        }
        // At most nine ASCII digits: fits a u32 and Nameplate::MAX.
        let nameplate = Nameplate(digits.parse().unwrap_or(0));
        let typed_words: Vec<&str> = parts.collect();
        if typed_words.len() != WORDS_PER_CODE {
            return Err(CodeError::WordCount {
                found: typed_words.len(),
                expected: WORDS_PER_CODE,
            });
        }
        let mut words = [0u16; WORDS_PER_CODE];
        for (position, (slot, typed)) in words.iter_mut().zip(&typed_words).enumerate() {
            let lower = typed.to_lowercase();
            *slot = index_of(&lower).ok_or_else(|| CodeError::UnknownWord {
                position: position + 1,
                typed: escape_for_terminal(&typed.chars().take(40).collect::<String>()),
                suggested: suggestion(&lower),
            })?;
        }
        Ok(Code { nameplate, words })
    }

    /// The nameplate (not secret: the server sees it).
    pub fn nameplate(&self) -> Nameplate {
        self.nameplate
    }

    /// The whole code as text, `7-guide-ahead-prism`, to show to the sender. Keep it off
    /// command lines and out of logs.
    pub fn reveal(&self) -> String {
        format!("{}-{}", self.nameplate, self.password())
    }

    /// The PAKE password: the words in their canonical spelling, joined by `-`.
    pub(crate) fn password(&self) -> String {
        self.words
            .iter()
            .map(|&i| word(i).unwrap_or("?"))
            .collect::<Vec<_>>()
            .join("-")
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Code({}-****)", self.nameplate)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn code(typed: &str) -> Code {
        Code::parse(typed).unwrap_or_else(|e| panic!("{typed:?}: {e}"))
    }

    #[test]
    fn generated_codes_round_trip_and_stay_secret() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0, 7, 12_345, Nameplate::MAX] {
            let c = Code::generate(Nameplate::new(n).expect("in range"), &mut rng);
            assert_eq!(Code::parse(&c.reveal()), Ok(c.clone()));
            let debug = format!("{c:?}");
            assert_eq!(debug, format!("Code({n}-****)"));
            assert!(!debug.contains(&c.password()));
        }
        assert_eq!(Nameplate::new(Nameplate::MAX + 1), None);
    }

    #[test]
    fn parsing_forgives_case_spaces_and_separators() {
        let canonical = code("7-acid-acorn-acre");
        for typed in [
            "7-acid-acorn-acre",
            "  7-acid-acorn-acre\n",
            "7 acid acorn acre",
            "7-ACID-Acorn-aCRE",
            "7 - acid -acorn\tacre",
            "007-acid-acorn-acre",
            "7--acid--acorn--acre",
        ] {
            assert_eq!(code(typed), canonical, "{typed:?}");
        }
        assert_eq!(canonical.reveal(), "7-acid-acorn-acre");
        assert_eq!(canonical.nameplate().get(), 7);
        assert_eq!(code("0-zoom-zoom-zoom").reveal(), "0-zoom-zoom-zoom");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert_eq!(Code::parse(""), Err(CodeError::Empty));
        assert_eq!(Code::parse(" - "), Err(CodeError::Empty));
        assert_eq!(
            Code::parse("acid-acorn-acre"),
            Err(CodeError::MissingNameplate {
                found: "acid".into()
            })
        );
        assert_eq!(
            Code::parse("7x-acid-acorn-acre"),
            Err(CodeError::MissingNameplate { found: "7x".into() })
        );
        assert_eq!(
            Code::parse("1234567890-acid-acorn-acre"),
            Err(CodeError::NameplateTooLong {
                digits: 10,
                max: MAX_NAMEPLATE_DIGITS
            })
        );
        assert_eq!(
            Code::parse("7-acid-acorn"),
            Err(CodeError::WordCount {
                found: 2,
                expected: 3
            })
        );
        assert_eq!(
            Code::parse("7-acid-acorn-acre-acid"),
            Err(CodeError::WordCount {
                found: 4,
                expected: 3
            })
        );
        let err = Code::parse("7-acid-zebrq-acre").expect_err("typo");
        assert_eq!(
            err,
            CodeError::UnknownWord {
                position: 2,
                typed: "zebrq".into(),
                suggested: Some("zebra")
            }
        );
        assert_eq!(
            err.to_string(),
            "word 2 of the code, `zebrq`, is not one of Warren's code words (did you mean `zebra`?): check the code"
        );
        // A unique prefix is not completed.
        assert!(matches!(
            Code::parse("7-acid-zebr-acre"),
            Err(CodeError::UnknownWord { position: 2, .. })
        ));
        // Control characters typed (or pasted) are shown escaped.
        let err = Code::parse("7-acid-\u{1b}[31m-acre").expect_err("junk");
        assert!(!err.to_string().chars().any(char::is_control), "{err}");
    }
}
