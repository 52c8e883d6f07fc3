//! Parsing of the lab's human-readable quantities: rates (`100mbit`), durations (`20ms`),
//! percentages (`1%`) and byte sizes. Errors name the bad input and what would be accepted,
//! because these strings come straight from a command line or a bench script.

use std::time::Duration;

/// Rate units accepted, in bits per second. `tc` spells bits `bit` and bytes `bps`; both are
/// accepted with the same meaning as in `tc`, so a rate copied from a netem recipe means the same.
const RATE_UNITS: &[(&str, f64)] = &[
    ("gbit", 1e9),
    ("mbit", 1e6),
    ("kbit", 1e3),
    ("bit", 1.0),
    ("gbps", 8e9),
    ("mbps", 8e6),
    ("kbps", 8e3),
    ("bps", 8.0),
];

/// Parses a rate such as `100mbit`, `1.5gbit` or `12500kbps` (bytes, as in `tc`) into bits/s.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("/s").unwrap_or(&t);
    for (unit, mult) in RATE_UNITS {
        if let Some(num) = t.strip_suffix(unit) {
            let v: f64 = num.trim().parse().map_err(|_| {
                format!("rate `{s}`: `{num}` is not a number; write e.g. `100mbit`")
            })?;
            let bps = v * mult;
            if !bps.is_finite() || bps < 1000.0 {
                return Err(format!(
                    "rate `{s}` is too low; the lab needs at least 1kbit (e.g. `100mbit`)"
                ));
            }
            if bps > 100e9 {
                return Err(format!(
                    "rate `{s}` is above 100gbit; a userspace line cannot emulate that"
                ));
            }
            return Ok(bps as u64);
        }
    }
    Err(format!(
        "rate `{s}` has no known unit; use one of gbit, mbit, kbit, bit (bits/s) or gbps, mbps, kbps, bps (bytes/s, as tc), e.g. `100mbit`"
    ))
}

/// Parses a duration such as `20ms`, `1.5s`, `250us` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    // Longest suffixes first so `ms` is not read as `s`.
    let units: &[(&str, f64)] = &[
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ];
    for (unit, mult) in units {
        if let Some(num) = t.strip_suffix(unit) {
            let v: f64 = num.trim().parse().map_err(|_| {
                format!("duration `{s}`: `{num}` is not a number; write e.g. `20ms`")
            })?;
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "duration `{s}` must be zero or positive, e.g. `20ms`"
                ));
            }
            let secs = v * mult;
            if secs > 3600.0 {
                return Err(format!("duration `{s}` is over an hour; write e.g. `20ms`"));
            }
            return Ok(Duration::from_secs_f64(secs));
        }
    }
    Err(format!(
        "duration `{s}` has no known unit; use ns, us, ms or s, e.g. `20ms`"
    ))
}

/// Parses a loss probability written as a percentage: `1%`, `0.5%`, or a bare `1` (percent).
/// Returns a fraction in 0..=1.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t.strip_suffix('%').unwrap_or(t).trim();
    let v: f64 = num
        .parse()
        .map_err(|_| format!("loss `{s}` is not a percentage; write e.g. `1%` or `0.5%`"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("loss `{s}` must be between 0% and 100%"));
    }
    if v > 100.0 {
        return Err(format!(
            "loss `{s}` is over 100%; a loss is a percentage of packets, e.g. `1%`"
        ));
    }
    Ok(v / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1.5Gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("12500kbps").unwrap(), 100_000_000);
        assert_eq!(parse_rate("50mbit/s").unwrap(), 50_000_000);
        assert!(parse_rate("100").unwrap_err().contains("no known unit"));
        assert!(parse_rate("100furlong").unwrap_err().contains("mbit"));
        assert!(parse_rate("xmbit").unwrap_err().contains("not a number"));
        assert!(parse_rate("1bit").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("-1ms").is_err());
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("1%").unwrap(), 0.01);
        assert_eq!(parse_percent("0.5").unwrap(), 0.005);
        assert_eq!(parse_percent("100%").unwrap(), 1.0);
        assert!(parse_percent("101%").unwrap_err().contains("over 100%"));
        assert!(parse_percent("-1%").is_err());
        assert!(parse_percent("lots").is_err());
    }
}
