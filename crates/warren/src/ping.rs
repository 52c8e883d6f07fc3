//! `warren ping`: connect, handshake and round-trip times to a server over N probes.
//!
//! Each probe is a fresh TCP connect and Noise handshake (or, with `transport = "quic"`, a
//! QUIC handshake with the PSK proof), a hello with no service claims (a *probe session*,
//! which the server accepts and which serves nothing; see docs/protocol.md), one
//! `Ping`/`Pong` round trip on the control channel, and a goodbye. Each probe reports what
//! encrypts the session, how it was chosen, and both sides' speed figures.

use std::time::Duration;

use serde::Serialize;
use warren_proto::{CipherChoice, CipherSuite};

use crate::client::establish::{self, EstablishError};
use crate::config::HostPort;
use crate::crypto::secret::Secret;
use crate::doctor::ms;

/// The times of one successful probe.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// TCP connect (0 on QUIC, whose handshake is the connect).
    pub connect: Duration,
    /// Noise handshake after connect, or the QUIC handshake with the PSK proof.
    pub handshake: Duration,
    /// One ping round trip on the established session.
    pub rtt: Duration,
    /// What encrypts the session: the negotiated record cipher, or `tls1.3-quic`.
    pub cipher: String,
    /// How it was chosen and both sides' figures (`SessionKeys::describe_choice`).
    pub choice: String,
}

/// Where and how to ping.
#[derive(Debug, Clone)]
pub struct PingTarget {
    /// The server.
    pub server: HostPort,
    /// Its PSK.
    pub psk: Secret,
    /// Ciphers to offer.
    pub ciphers: Vec<CipherSuite>,
    /// Whether to send figures and let the server pick the fastest.
    pub cipher_choice: CipherChoice,
    /// Deadline of each step.
    pub deadline: Duration,
    /// `Some` to probe over QUIC, with these settings.
    pub quic: Option<crate::config::quic::QuicConfig>,
}

/// Runs one probe.
///
/// # Errors
/// The step that failed.
pub async fn probe(target: &PingTarget, seq: u64) -> Result<Probe, EstablishError> {
    let mut session = establish::probe_session(
        &target.server,
        &target.psk,
        (&target.ciphers, target.cipher_choice),
        target.quic.as_ref(),
        target.deadline,
    )
    .await?;
    let rtt = establish::ping(&mut session.channel, seq, target.deadline).await?;
    let probe = Probe {
        connect: session.connect_time,
        handshake: session.handshake_time,
        rtt,
        cipher: session.keys.cipher_label(),
        choice: session.keys.describe_choice(),
    };
    establish::goodbye(session.channel, "warren ping done").await;
    Ok(probe)
}

/// Min, median and max of some durations (`None` when empty).
pub fn stats(mut values: Vec<Duration>) -> Option<(Duration, Duration, Duration)> {
    values.sort_unstable();
    let min = *values.first()?;
    let max = *values.last()?;
    let mid = values.len() / 2;
    let median = if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2
    } else {
        values[mid]
    };
    Some((min, median, max))
}

/// The summary lines for successful probes.
pub fn summary(probes: &[Probe], sent: usize) -> String {
    let mut out = format!(
        "--- {} probes, {} ok, {} failed ---\n",
        sent,
        probes.len(),
        sent - probes.len()
    );
    type Pick = fn(&Probe) -> Duration;
    let rows: [(&str, Pick); 3] = [
        ("connect", |p| p.connect),
        ("handshake", |p| p.handshake),
        ("rtt", |p| p.rtt),
    ];
    if let Some(first) = probes.first() {
        out.push_str(&format!(
            "cipher    {} chosen by {} (seal/open GB/s)\n",
            first.cipher, first.choice
        ));
    }
    for (name, pick) in rows {
        if let Some((min, median, max)) = stats(probes.iter().map(pick).collect()) {
            out.push_str(&format!(
                "{name:<9} min {} / median {} / max {}\n",
                ms(min),
                ms(median),
                ms(max)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_odd_and_even_counts() {
        let d = Duration::from_millis;
        assert_eq!(stats(vec![d(3), d(1), d(2)]), Some((d(1), d(2), d(3))));
        assert_eq!(
            stats(vec![d(4), d(1), d(2), d(3)]),
            Some((d(1), Duration::from_micros(2500), d(4)))
        );
        assert_eq!(stats(vec![]), None);
    }
}
