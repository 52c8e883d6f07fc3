//! "Did you mean ...?" for misspelt keys and names, by edit distance (no dependency needed
//! for a few dozen short words).

/// The candidate closest to `word`, if it is close enough to be a plausible typo.
pub(crate) fn did_you_mean<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let normalized = word.to_ascii_lowercase().replace('-', "_");
    candidates
        .iter()
        .map(|&candidate| {
            let distance = if candidate.replace('-', "_") == normalized {
                0
            } else {
                edit_distance(&normalized, &candidate.replace('-', "_"))
            };
            (distance, candidate)
        })
        .filter(|&(distance, candidate)| distance <= (candidate.chars().count() / 3).max(1))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_words_only() {
        let keys = ["heartbeat_interval", "handshake_timeout", "bind", "psk"];
        assert_eq!(
            did_you_mean("heartbeat_intervall", &keys),
            Some("heartbeat_interval")
        );
        assert_eq!(
            did_you_mean("heartbeat-interval", &keys),
            Some("heartbeat_interval")
        );
        assert_eq!(did_you_mean("bnid", &keys), None);
        assert_eq!(did_you_mean("binds", &keys), Some("bind"));
        assert_eq!(did_you_mean("colour", &keys), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
