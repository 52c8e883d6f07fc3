//! Durations in config files: quoted strings with a unit (`"250ms"`, `"10s"`, `"5m"`,
//! `"1h"`, `"1m30s"`). A bare number is refused because its unit would be a guess.

use std::fmt;
use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration")]
    Empty,
    /// A number without a unit, e.g. `"10"`.
    #[error("duration {0:?} has no unit")]
    MissingUnit(String),
    /// A unit we do not know, e.g. `"10sec"`.
    #[error("unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit {
        /// The whole duration as written.
        text: String,
        /// The unit that was not understood.
        unit: String,
    },
    /// Not of the form `<number><unit>...`.
    #[error("invalid duration {0:?}")]
    Malformed(String),
    /// Too large to represent.
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

impl DurationError {
    /// How to fix it, for the config error's hint.
    pub fn hint(&self) -> String {
        match self {
            DurationError::MissingUnit(number) => format!("add a unit: \"{number}s\""),
            _ => "write a number followed by ms, s, m or h, e.g. \"250ms\", \"10s\", \"5m\" or \"1m30s\"".to_owned(),
        }
    }
}

/// Parses `"250ms"`, `"10s"`, `"5m"`, `"1h"` and sums like `"1h30m"`.
///
/// # Errors
///
/// [`DurationError`] when the text is empty, lacks a unit, has an unknown unit or
/// overflows.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(DurationError::Empty);
    }
    if trimmed.chars().all(|c| c.is_ascii_digit()) {
        return Err(DurationError::MissingUnit(trimmed.to_owned()));
    }
    let mut total = Duration::ZERO;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(DurationError::Malformed(text.to_owned()));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let number: u64 = number
            .parse()
            .map_err(|_| DurationError::Overflow(text.to_owned()))?;
        let millis_per_unit: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err(DurationError::MissingUnit(text.to_owned())),
            other => {
                return Err(DurationError::UnknownUnit {
                    text: text.to_owned(),
                    unit: other.to_owned(),
                });
            }
        };
        let millis = number
            .checked_mul(millis_per_unit)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        total = total
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        rest = after;
    }
    Ok(total)
}

/// Formats a duration the way a config file writes it (`"1m30s"`, `"250ms"`), for messages.
pub fn format_duration(duration: Duration) -> String {
    struct Show(Duration);
    impl fmt::Display for Show {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let mut millis = self.0.as_millis();
            if millis == 0 {
                return f.write_str("0s");
            }
            for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
                if millis >= size {
                    write!(f, "{}{unit}", millis / size)?;
                    millis %= size;
                }
            }
            Ok(())
        }
    }
    Show(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(
            parse_duration("10"),
            Err(DurationError::MissingUnit("10".into()))
        );
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert!(matches!(
            parse_duration("10sec"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("s"),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_duration("1.5s"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
        assert!(matches!(
            parse_duration("18446744073709551615h"),
            Err(DurationError::Overflow(_))
        ));
        assert_eq!(
            DurationError::MissingUnit("10".into()).hint(),
            "add a unit: \"10s\""
        );
    }

    #[test]
    fn formats_like_the_file() {
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
