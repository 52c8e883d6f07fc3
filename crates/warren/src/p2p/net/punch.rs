//! The connectivity checker: finds a direct UDP path between two peers through their NATs.
//!
//! Both peers run it at the same time on the socket QUIC will use, each with the other's
//! [`Candidates`] and the same [`CheckKey`]:
//!
//! * every [`PunchConfig::interval`] (~25 ms) a signed Binding request goes to every peer
//!   candidate at once, each with a fresh transaction id. Sending both ways at once is what
//!   opens port-restricted NATs (simultaneous open);
//! * every authenticated request is answered **to the address it came from**, with that
//!   address in XOR-MAPPED-ADDRESS; an unknown source becomes a peer-reflexive candidate and
//!   is checked too. A symmetric NAT gives each destination its own port, so the address the
//!   server saw is useless to the peer, but the one the check came from works (P2P.md);
//! * a request or answer without a valid tag under the check key, or carrying our own agent
//!   id (a check of ours that came back), is ignored in silence, so a stranger cannot make
//!   us pick its address or use us to reflect traffic;
//! * done when an authenticated answer came back from an address we checked (our path out
//!   and back works) and the peer's checks reach us (its path works): that address is the
//!   QUIC peer. No direct pair by [`PunchConfig::deadline`] (~3 s) is
//!   [`PunchError::NoDirectPath`]: the caller goes to the relay.
//!
//! After success, [`Checker::answer_for`] keeps answering the peer's checks for a while, so
//! a peer whose last answer was lost still finishes.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;
use warren_proto::stun::{self, Class, Message, TransactionId};

use super::StunIo;
use super::candidates::{Candidates, MAX_CANDIDATES};
use super::key::CheckKey;

/// Peer-reflexive addresses learnt on top of the peer's candidates, at most.
const MAX_PEER_REFLEXIVE: usize = 8;
/// Outstanding transactions remembered (older ones are forgotten: their answers are late).
const MAX_PENDING: usize = 512;

/// Pacing and deadline of the checks.
#[derive(Debug, Clone)]
pub struct PunchConfig {
    /// Between two rounds of checks (P2P.md: 20–50 ms).
    pub interval: Duration,
    /// Give up after this long.
    pub deadline: Duration,
}

impl Default for PunchConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(25),
            deadline: Duration::from_secs(3),
        }
    }
}

/// A direct path found.
#[derive(Debug, Clone)]
pub struct Punched {
    /// The peer's address to talk QUIC to.
    pub remote: SocketAddr,
    /// Our address as the peer sees it (from its answer).
    pub seen_as: Option<SocketAddr>,
    /// Round trip of the winning check.
    pub rtt: Duration,
    /// From the start of the checks to success.
    pub elapsed: Duration,
}

/// Why no direct path was found.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PunchError {
    /// The deadline passed.
    #[error(
        "no direct path to the peer in {waited:?}: {sent} checks to {candidates} candidates, \
         {answers} answered, {checks_in} checks received from the peer; \
         use the relay (the NATs on the way do not allow a direct path)"
    )]
    NoDirectPath {
        /// How long we tried.
        waited: Duration,
        /// Checks sent.
        sent: u64,
        /// Candidates checked (the peer's plus peer-reflexive ones).
        candidates: usize,
        /// Authenticated answers received.
        answers: u64,
        /// Authenticated checks received.
        checks_in: u64,
    },
    /// The peer offered no candidate we can use.
    #[error("the peer sent no usable candidate address; use the relay")]
    NoCandidates,
    /// The socket failed.
    #[error("the connectivity-check socket failed: {0}")]
    Io(#[from] io::Error),
}

/// Counters of one checker.
#[derive(Debug, Default, Clone)]
pub struct CheckStats {
    /// Checks sent.
    pub sent: u64,
    /// Authenticated answers received.
    pub answers: u64,
    /// Authenticated checks received (and answered).
    pub checks_in: u64,
    /// STUN datagrams ignored (bad tag, no tag, our own, unknown transaction).
    pub ignored: u64,
    /// Datagrams the socket refused to send (e.g. no route to a candidate).
    pub send_errors: u64,
}

/// A connectivity checker over one socket.
#[derive(Debug)]
pub struct Checker<S> {
    io: S,
    key: CheckKey,
    /// Names our checks, so one that loops back to us is not taken for the peer's.
    agent: [u8; 8],
    config: PunchConfig,
    stats: CheckStats,
}

/// A check we sent and wait an answer for.
#[derive(Debug)]
struct Pending {
    transaction: TransactionId,
    to: SocketAddr,
    at: Instant,
}

impl<S: StunIo> Checker<S> {
    /// A checker on `io` keyed by `key`.
    pub fn new(io: S, key: CheckKey, config: PunchConfig) -> Self {
        Self {
            io,
            key,
            agent: rand::random(),
            config,
            stats: CheckStats::default(),
        }
    }

    /// What the checker counted so far.
    pub fn stats(&self) -> &CheckStats {
        &self.stats
    }

    /// The socket back.
    pub fn into_inner(self) -> S {
        self.io
    }

    /// The socket, for a moment (a relay bind between two watches).
    pub fn io_mut(&mut self) -> &mut S {
        &mut self.io
    }

    /// Checks `theirs` (minus any of `ours`) until a pair works both ways or the deadline.
    ///
    /// # Errors
    ///
    /// [`PunchError::NoDirectPath`] at the deadline, [`PunchError::NoCandidates`] if the
    /// peer offered nothing usable, [`PunchError::Io`] if the socket fails.
    pub async fn punch(
        &mut self,
        ours: &Candidates,
        theirs: &Candidates,
    ) -> Result<Punched, PunchError> {
        let own: Vec<SocketAddr> = ours.list.iter().map(|c| c.addr).collect();
        let mut remotes: Vec<SocketAddr> = theirs
            .addrs()
            .into_iter()
            .filter(|a| !own.contains(a))
            .collect();
        if remotes.is_empty() {
            return Err(PunchError::NoCandidates);
        }
        let offered = remotes.len();
        let start = Instant::now();
        let deadline = start + self.config.deadline;
        let mut pending: VecDeque<Pending> = VecDeque::with_capacity(MAX_PENDING);
        let mut next_round = start;
        let mut valid: Option<(SocketAddr, Option<SocketAddr>, Duration)> = None;
        let mut heard_peer = false;
        let mut packet = Vec::with_capacity(96);

        loop {
            if let (Some((remote, seen_as, rtt)), true) = (valid, heard_peer) {
                return Ok(Punched {
                    remote,
                    seen_as,
                    rtt,
                    elapsed: start.elapsed(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(PunchError::NoDirectPath {
                    waited: now - start,
                    sent: self.stats.sent,
                    candidates: remotes.len(),
                    answers: self.stats.answers,
                    checks_in: self.stats.checks_in,
                });
            }
            if now >= next_round {
                for &to in &remotes {
                    self.send_check(to, now, &mut pending, &mut packet);
                }
                next_round = now + self.config.interval;
            }
            let (datagram, from) = tokio::select! {
                r = self.io.recv_from() => r?,
                () = tokio::time::sleep_until(next_round.min(deadline)) => continue,
            };
            match self.handle(&datagram, from, &mut packet) {
                Input::Check => {
                    heard_peer = true;
                    // Peer-reflexive: a check from an address we did not know is the
                    // peer's NAT mapping towards us; check it at once (triggered check).
                    if !remotes.contains(&from) && remotes.len() < offered + MAX_PEER_REFLEXIVE {
                        remotes.push(from);
                        self.send_check(from, Instant::now(), &mut pending, &mut packet);
                    }
                }
                Input::Answer {
                    transaction,
                    seen_as,
                } => {
                    let found = pending
                        .iter()
                        .find(|p| p.transaction == transaction && p.to == from);
                    if let Some(p) = found {
                        if valid.is_none() {
                            valid = Some((from, seen_as, p.at.elapsed()));
                        }
                    } else {
                        self.stats.ignored += 1;
                    }
                }
                Input::Ignored => {}
            }
        }
    }

    /// Keeps answering the peer's authenticated checks for `duration` (after success, so the
    /// peer finishes too), with a check of ours back for each. Returns early only if the
    /// socket fails.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn answer_for(&mut self, duration: Duration) -> io::Result<()> {
        let until = Instant::now() + duration;
        let mut packet = Vec::with_capacity(96);
        // Our triggered checks' transactions; their answers need no matching.
        let mut pending = VecDeque::new();
        loop {
            let (datagram, from) = tokio::select! {
                r = self.io.recv_from() => r?,
                () = tokio::time::sleep_until(until) => return Ok(()),
            };
            if let Input::Check = self.handle(&datagram, from, &mut packet) {
                // A triggered check back: a peer that is still checking (or checks again
                // later) hears us, which its checks need as well as our answers.
                self.send_check(from, Instant::now(), &mut pending, &mut packet);
            }
        }
    }

    /// Watches the direct path to `remote` for `consent.stretch` (RFC 7675's consent
    /// freshness): a check every `consent.every`, the peer's checks answered, each from an
    /// address other than `remote` with a check back. `last_answer` is when `remote` last
    /// answered, kept across calls.
    ///
    /// [`Watched::Moved`] when `remote` has been silent for two checks while the peer
    /// answers from another address (its NAT gave it a new port: a *rebinding*);
    /// [`Watched::Lost`] when nothing answered for `consent.lost_after`.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn watch(
        &mut self,
        remote: SocketAddr,
        consent: &Consent,
        last_answer: &mut Instant,
    ) -> io::Result<Watched> {
        let until = Instant::now() + consent.stretch;
        let mut packet = Vec::with_capacity(96);
        let mut pending = VecDeque::new();
        let mut next_check = Instant::now();
        loop {
            let now = Instant::now();
            if now.saturating_duration_since(*last_answer) >= consent.lost_after {
                return Ok(Watched::Lost);
            }
            if now >= until {
                return Ok(Watched::Alive);
            }
            if now >= next_check {
                self.send_check(remote, now, &mut pending, &mut packet);
                next_check = now + consent.every;
            }
            let (datagram, from) = tokio::select! {
                r = self.io.recv_from() => r?,
                () = tokio::time::sleep_until(next_check.min(until)) => continue,
            };
            match self.handle(&datagram, from, &mut packet) {
                Input::Check if from != remote => {
                    self.send_check(from, Instant::now(), &mut pending, &mut packet);
                }
                Input::Answer { transaction, .. } => {
                    if !pending
                        .iter()
                        .any(|p| p.transaction == transaction && p.to == from)
                    {
                        self.stats.ignored += 1;
                    } else if from == remote {
                        *last_answer = Instant::now();
                    } else if last_answer.elapsed() >= 2 * consent.every {
                        *last_answer = Instant::now();
                        return Ok(Watched::Moved(from));
                    }
                }
                Input::Check | Input::Ignored => {}
            }
        }
    }

    fn send_check(
        &mut self,
        to: SocketAddr,
        now: Instant,
        pending: &mut VecDeque<Pending>,
        packet: &mut Vec<u8>,
    ) {
        let transaction: TransactionId = rand::random();
        Message::request(transaction)
            .with_agent(self.agent)
            .encode_signed(packet, |b| self.key.sign(b));
        if pending.len() == MAX_PENDING {
            pending.pop_front();
        }
        pending.push_back(Pending {
            transaction,
            to,
            at: now,
        });
        self.stats.sent += 1;
        self.send(packet, to);
    }

    /// Sends, counting failures instead of stopping: one candidate being unreachable
    /// (no route to a peer's private address, say) must not end the checks to the others.
    fn send(&mut self, packet: &[u8], to: SocketAddr) {
        if let Err(e) = self.io.send_to(packet, to) {
            self.stats.send_errors += 1;
            tracing::debug!(event = "p2p_check_send_failed", %to, error = %e, "check not sent");
        }
    }

    /// Authenticates one datagram; answers it if it is the peer's check.
    fn handle(&mut self, datagram: &[u8], from: SocketAddr, packet: &mut Vec<u8>) -> Input {
        let decoded = match stun::decode(datagram) {
            Ok(d) => d,
            Err(_) => {
                self.stats.ignored += 1;
                return Input::Ignored;
            }
        };
        let authentic = decoded
            .integrity
            .as_ref()
            .is_some_and(|tag| self.key.verify(datagram, tag));
        let message = decoded.message;
        if !authentic {
            self.stats.ignored += 1;
            return Input::Ignored;
        }
        match message.class {
            Class::Request if message.agent.is_some_and(|a| a != self.agent) => {
                self.stats.checks_in += 1;
                Message::success(message.transaction, from)
                    .with_agent(self.agent)
                    .encode_signed(packet, |b| self.key.sign(b));
                self.send(packet, from);
                Input::Check
            }
            Class::Success if message.agent.is_some_and(|a| a != self.agent) => {
                self.stats.answers += 1;
                Input::Answer {
                    transaction: message.transaction,
                    seen_as: message.mapped,
                }
            }
            _ => {
                self.stats.ignored += 1;
                Input::Ignored
            }
        }
    }
}

/// The pace of [`Checker::watch`].
#[derive(Debug, Clone)]
pub struct Consent {
    /// Between two checks of the path.
    pub every: Duration,
    /// No answer for this long: the path is lost.
    pub lost_after: Duration,
    /// One call's length (the caller does other work between calls).
    pub stretch: Duration,
}

/// What [`Checker::watch`] saw of a direct path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// The path answered within the stretch.
    Alive,
    /// The path stopped answering and the peer answers at this address instead.
    Moved(SocketAddr),
    /// Nothing answered for [`Consent::lost_after`].
    Lost,
}

/// What an authenticated datagram was.
enum Input {
    /// The peer's check (answered).
    Check,
    /// An answer to one of our checks.
    Answer {
        transaction: TransactionId,
        seen_as: Option<SocketAddr>,
    },
    /// Nothing for us.
    Ignored,
}

/// Checks are bounded by the candidate lists; this keeps the compiler honest about it.
const _: () = assert!(MAX_CANDIDATES + MAX_PEER_REFLEXIVE <= 64);
