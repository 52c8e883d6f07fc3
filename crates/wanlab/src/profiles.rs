//! The named WAN profiles (W1..W4): the one place they are defined, so the CLI's `--profile`,
//! the integration test and the bench all mean the same link by the same name.

use std::time::Duration;

/// A WAN link shape: one-way delay, bottleneck rate and random loss, the same both ways.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Short name, e.g. `W2`.
    pub name: &'static str,
    /// One-way delay (the RTT is twice this).
    pub delay: Duration,
    /// Bottleneck rate in bits per second, counted on IP packet bytes.
    pub rate_bps: u64,
    /// Random loss as a fraction (0.01 = 1 %), applied independently per packet per direction.
    pub loss: f64,
}

/// Every named profile.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "W1",
        delay: Duration::from_millis(20),
        rate_bps: 100_000_000,
        loss: 0.0,
    },
    Profile {
        name: "W2",
        delay: Duration::from_millis(20),
        rate_bps: 100_000_000,
        loss: 0.01,
    },
    Profile {
        name: "W3",
        delay: Duration::from_millis(50),
        rate_bps: 50_000_000,
        loss: 0.005,
    },
    Profile {
        name: "W4",
        delay: Duration::from_millis(100),
        rate_bps: 200_000_000,
        loss: 0.001,
    },
];

impl Profile {
    /// Looks a profile up by name, case-insensitively; the error lists the known names.
    pub fn by_name(name: &str) -> Result<Profile, String> {
        PROFILES
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .copied()
            .ok_or_else(|| {
                let names: Vec<_> = PROFILES.iter().map(|p| p.name).collect();
                format!(
                    "unknown profile `{name}`; known profiles: {}",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        assert_eq!(Profile::by_name("w3").unwrap().rate_bps, 50_000_000);
        assert!(
            Profile::by_name("W9")
                .unwrap_err()
                .contains("W1, W2, W3, W4")
        );
    }
}
