//! The 1296-word list of join codes: the EFF short word list #1.
//!
//! Source: Electronic Frontier Foundation, "EFF's New Wordlists for Random Passphrases"
//! (Joseph Bonneau, 2016), <https://www.eff.org/files/2016/09/08/eff_short_wordlist_1.txt>,
//! taken from the `diceware_wordlists` 1.2.3 crate, which ships that file verbatim.
//! Licence: EFF publishes its site's content, these lists included, under the Creative
//! Commons Attribution 3.0 United States licence (CC BY 3.0 US,
//! <https://creativecommons.org/licenses/by/3.0/us/>); this notice is the attribution.
//!
//! Changes: the dice numbers are dropped (one word per line, in the original order) and
//! the one word with a hyphen, `yo-yo`, is replaced by `yikes` (not otherwise in the list,
//! and in the same alphabetical place), because `-` separates the words of a code. The
//! list stays sorted, so lookups are a binary search.
//!
//! Why this list: 1296 = 6^4 words of 3 to 5 letters, chosen by the EFF to be easy to
//! spell and remember; three words give 1296^3 ≈ 2^31 codes per nameplate.

use std::sync::LazyLock;

/// How many words the list holds.
pub const WORD_COUNT: usize = 1296;

static WORDS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| include_str!("eff_short_wordlist_1.txt").lines().collect());

/// Word number `index`, if `index` < [`WORD_COUNT`].
pub fn word(index: u16) -> Option<&'static str> {
    WORDS.get(usize::from(index)).copied()
}

/// The number of `word` (lowercase), if it is in the list.
pub fn index_of(word: &str) -> Option<u16> {
    WORDS
        .binary_search(&word)
        .ok()
        .and_then(|i| u16::try_from(i).ok())
}

/// The one word in the list one typo away from `typed` (a letter changed, added, removed,
/// or two neighbours swapped), if exactly one is: offered in an error message, never used
/// in place of what was typed.
pub fn suggestion(typed: &str) -> Option<&'static str> {
    let mut found = WORDS.iter().filter(|w| one_typo_apart(typed, w));
    match (found.next(), found.next()) {
        (Some(word), None) => Some(word),
        _ => None,
    }
}

fn one_typo_apart(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a == b {
        return false;
    }
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let (ra, rb) = (&a[prefix..], &b[prefix..]);
    match ra.len().abs_diff(rb.len()) {
        0 => {
            ra[1..] == rb[1..]
                || (ra.len() >= 2 && ra[0] == rb[1] && ra[1] == rb[0] && ra[2..] == rb[2..])
        }
        1 if ra.len() > rb.len() => ra[1..] == *rb,
        1 => *ra == rb[1..],
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_whole_sorted_unique_and_plain() {
        assert_eq!(WORDS.len(), WORD_COUNT);
        assert!(WORDS.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        for w in WORDS.iter() {
            assert!((3..=5).contains(&w.len()), "{w}");
            assert!(w.bytes().all(|b| b.is_ascii_lowercase()), "{w}");
        }
        assert_eq!(word(0), Some("acid"));
        assert_eq!(word(1295), Some("zoom"));
        assert_eq!(word(1296), None);
        assert_eq!(index_of("zoom"), Some(1295));
        assert_eq!(index_of("yikes"), word(1285).and_then(index_of));
        assert_eq!(index_of("yo-yo"), None);
        assert_eq!(index_of("Acid"), None, "lookups take lowercase");
    }

    #[test]
    fn typos_are_suggested_only_when_unambiguous() {
        assert!(one_typo_apart("acid", "acd"));
        assert!(one_typo_apart("acid", "aciid"));
        assert!(one_typo_apart("acid", "caid"));
        assert!(one_typo_apart("acid", "acix"));
        assert!(!one_typo_apart("acid", "acid"));
        assert!(!one_typo_apart("acid", "xcix"));
        assert_eq!(suggestion("zebrq"), Some("zebra"));
        assert_eq!(suggestion("qqqqq"), None);
        // `cxt` is one letter from both `cot` and `cut`: no suggestion.
        assert_eq!(suggestion("cxt"), None);
    }
}
