//! The relay of last resort: the server forwards opaque QUIC datagrams between the two
//! peers of one transfer when no direct path exists (a symmetric NAT facing a
//! port-restricted or symmetric one, P2P.md), on the same UDP port as the address
//! reflector.
//!
//! The flow, for each peer (a *leg*), on the socket QUIC will use:
//!
//! 1. [`join`]: send a **relay bind** to the server's UDP port — a STUN Binding request
//!    (first byte 0–3, so the peer's demux socket hands the answers to its STUN channel and
//!    the server tells it from QUIC) carrying WARREN-RELAY (the 32-byte [`RelayToken`],
//!    derived from the PAKE's relay key, so the relay never sees the code) and
//!    MESSAGE-INTEGRITY-SHA256 under [`RelayAuth`] (derived from the server's PSK: only
//!    clients of this server use its relay). The server answers a signed Binding success
//!    with XOR-MAPPED-ADDRESS and WARREN-RELAY-STATE (`waiting`, `paired`, `full`); the leg
//!    re-sends until `paired`.
//! 2. QUIC to the server's UDP port: every QUIC datagram (first byte 64–255) from one leg
//!    goes to the other, unchanged. The QUIC handshake is pinned end to end (the PAKE
//!    exchanged the certificates' fingerprints), so the relay sees only opaque packets.
//!
//! The server's side is [`Relay`], sans-IO ([`Relay::handle_input`],
//! [`Relay::poll_transmit`], [`Relay::handle_timeout`]), driven with the reflector by
//! [`serve_udp`] / [`serve_udp_with`] on one socket in one task. Its rules:
//!
//! * binds without a valid tag are dropped in silence (no answer, nothing learnt); a plain
//!   Binding request (no WARREN-RELAY) is the reflector's;
//! * the first two distinct source addresses presenting one token are paired; a third is
//!   refused (dropped), and an address that is a leg of one pair cannot join another;
//! * per pair: a byte cap over both directions (then the pair is closed and its datagrams
//!   dropped until it expires), a token-bucket rate (over it, datagrams are dropped: QUIC's
//!   congestion control backs off), and idle expiry;
//! * at most [`RelayConfig::max_pairs`] pairs and [`RelayConfig::max_waiting`] unpaired
//!   legs, which expire after [`RelayConfig::waiting_ttl`];
//! * forwarding allocates nothing: one receive buffer, the datagrams are sent on as
//!   received, a batch of them (GRO on receive, GSO on send,
//!   [`crate::relay::udp::batch`]) in one call each way; every datagram of a batch is
//!   still counted and checked on its own.
//!
//! The wire format is in `docs/protocol.md`, "Relay of last resort".

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren_proto::stun::{self, Class, Demux, Message, RELAY_TOKEN_LEN, RelayState};

use super::StunIo;
use super::key::CheckKey;
use super::reflector::{Reflector, ReflectorConfig};
use super::tcp_leg::TcpLegs;
use crate::config::p2p::P2pConfig;
use crate::crypto::secret::Secret;
use crate::metrics::P2pRelayMeter;
use crate::relay::udp::batch::{Batch, BatchSocket, RECV_BUF_LEN};

/// Domain of the token's derivation from the PAKE's relay key.
const TOKEN_CONTEXT: &str = "warren relay token v1";
/// Answers queued for [`Relay::poll_transmit`]; one input makes at most two, and the
/// driver drains them after each input.
const MAX_TRANSMITS: usize = 64;
/// Batches read without waiting after one that woke the task, before the loop looks at
/// its timers and cancellation again.
const BATCH: usize = 64;
/// How often expired legs and pairs are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Longest pause between two binds of [`join`]: the relay tells a waiting leg at once
/// when its peer comes, so re-sending is only for loss and keeping the place.
const MAX_RESEND: Duration = Duration::from_secs(1);
/// How long a leg must have been silent before a bind with its pair's token from a new
/// port of its address takes its place (see [`Relay::move_leg`]).
const LEG_MOVE_SILENCE: Duration = Duration::from_secs(1);

/// What both legs present; derived from the PAKE's relay key, so the relay never sees the
/// code. Not a secret from the relay (it travels in the clear), but only the two peers
/// can compute it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RelayToken([u8; RELAY_TOKEN_LEN]);

impl RelayToken {
    /// The token of the transfer whose PAKE gave `relay_key` (both peers get the same).
    pub fn from_key(relay_key: &crate::p2p::pake::DerivedKey) -> RelayToken {
        RelayToken(blake3::derive_key(TOKEN_CONTEXT, relay_key.expose()))
    }

    /// A token from raw bytes (tests, tools).
    pub fn from_bytes(bytes: [u8; RELAY_TOKEN_LEN]) -> RelayToken {
        RelayToken(bytes)
    }

    /// The bytes on the wire.
    pub fn as_bytes(&self) -> &[u8; RELAY_TOKEN_LEN] {
        &self.0
    }
}

impl fmt::Debug for RelayToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell two apart in a log, not the whole value.
        write!(
            f,
            "RelayToken({:02x}{:02x}{:02x}{:02x}…)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// Proves to the relay that the leg holds the server's PSK (authenticated like everything
/// else on the server): the key of the binds' and answers' MESSAGE-INTEGRITY-SHA256, an
/// HKDF output of the PSK (`crypto::keys::relay_auth_key`). `Debug` does not show it.
#[derive(Clone)]
pub struct RelayAuth(CheckKey);

impl RelayAuth {
    /// The relay key of a server with `psk`.
    pub fn from_psk(psk: &Secret) -> RelayAuth {
        RelayAuth(CheckKey::new(crate::crypto::keys::relay_auth_key(psk)))
    }
}

impl fmt::Debug for RelayAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RelayAuth(***)")
    }
}

/// Limits of the relay (from `[server.p2p]`, see [`RelayConfig::from_p2p`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    /// Whether binds are answered at all (`relay = false`: they are dropped).
    pub enabled: bool,
    /// Pairs at once.
    pub max_pairs: usize,
    /// Unpaired legs at once.
    pub max_waiting: usize,
    /// Bytes one pair may forward, both directions together.
    pub max_bytes: u64,
    /// Bytes per second one pair may forward (token bucket).
    pub rate: u64,
    /// A pair with nothing forwarded for this long is forgotten.
    pub idle: Duration,
    /// An unpaired leg that has not re-sent its bind for this long is forgotten.
    pub waiting_ttl: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self::from_p2p(&P2pConfig::default())
    }
}

impl RelayConfig {
    /// The relay's limits in `config`.
    pub fn from_p2p(config: &P2pConfig) -> RelayConfig {
        let max_pairs = usize::try_from(config.relay_max_pairs).unwrap_or(usize::MAX);
        RelayConfig {
            enabled: config.relay,
            max_pairs,
            // Each pair starts as one waiting leg; twice the pairs (at least 64) leaves room
            // for legs whose peer is slow or never comes, until they expire.
            max_waiting: max_pairs.saturating_mul(2).max(64),
            max_bytes: config.relay_max_bytes,
            rate: config.relay_rate,
            idle: config.relay_idle,
            // A peer joins the relay right after its punch fails (~3 s), and the two
            // fail within a second or two of each other; 30 s is plenty.
            waiting_ttl: Duration::from_secs(30),
        }
    }

    /// Bytes a pair may send at once: a quarter second at the rate, at least 256 KiB, so
    /// QUIC's bursts pass and the average is what is held to the rate.
    fn burst(&self) -> f64 {
        (self.rate as f64 / 4.0).max(256.0 * 1024.0)
    }
}

/// What the driver does with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send the datagram, unchanged, to this address (the other leg).
    Forward(SocketAddr),
    /// A Binding request that is not a relay bind (or not STUN the relay reads): the
    /// reflector's.
    Reflect,
    /// Handled (an answer may wait in [`Relay::poll_transmit`]) or dropped.
    Done,
}

/// Counters of one relay.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayStats {
    /// Datagrams forwarded.
    pub forwarded_datagrams: u64,
    /// Bytes forwarded.
    pub forwarded_bytes: u64,
    /// Pairs made.
    pub pairs_made: u64,
    /// Binds dropped for a missing or wrong tag.
    pub bad_tags: u64,
    /// Binds refused: a third address, a leg of another pair, a closed pair, full tables,
    /// or the relay turned off.
    pub refused_binds: u64,
    /// QUIC datagrams from an address that is no open pair's leg.
    pub unpaired: u64,
    /// Datagrams dropped over a pair's rate.
    pub over_rate: u64,
    /// Datagrams dropped because their pair reached its byte cap.
    pub over_cap: u64,
    /// Pairs closed at the byte cap.
    pub pairs_capped: u64,
    /// Pairs forgotten after being idle.
    pub pairs_expired: u64,
    /// Unpaired legs forgotten.
    pub legs_expired: u64,
    /// Legs that came back from a new address and were moved there.
    pub legs_moved: u64,
}

/// A leg waiting for its peer.
#[derive(Debug)]
struct Waiting {
    leg: SocketAddr,
    /// The transaction of its latest bind: the `paired` answer goes to it when the peer
    /// comes.
    transaction: stun::TransactionId,
    seen: Instant,
}

/// Two legs and their budget.
#[derive(Debug)]
struct Pair {
    legs: [SocketAddr; 2],
    /// Bytes forwarded so far, both directions.
    bytes: u64,
    /// Token bucket of the rate, in bytes.
    tokens: f64,
    refilled: Instant,
    /// The last datagram from a leg, or re-sent bind (idle expiry).
    active: Instant,
    /// The last datagram or bind from each leg (which leg moved, see [`Relay::bind`]).
    seen: [Instant; 2],
    /// Reached the byte cap: everything is dropped until it expires.
    closed: bool,
}

/// The relay's state: waiting legs, pairs, and the answers to send. See the module doc for
/// the rules.
///
/// Call order: [`Relay::handle_input`] for each datagram, then drain
/// [`Relay::poll_transmit`]; [`Relay::handle_timeout`] now and then (every second is fine)
/// to expire legs and pairs.
pub struct Relay {
    config: RelayConfig,
    auth: RelayAuth,
    waiting: HashMap<[u8; RELAY_TOKEN_LEN], Waiting>,
    pairs: HashMap<[u8; RELAY_TOKEN_LEN], Pair>,
    /// Each open pair's two legs, to their token.
    legs: HashMap<SocketAddr, [u8; RELAY_TOKEN_LEN]>,
    transmits: VecDeque<(Vec<u8>, SocketAddr)>,
    stats: RelayStats,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("waiting", &self.waiting.len())
            .field("pairs", &self.pairs.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay with these limits, checking binds with `auth`.
    pub fn new(config: RelayConfig, auth: RelayAuth) -> Self {
        Self {
            waiting: HashMap::new(),
            pairs: HashMap::new(),
            legs: HashMap::new(),
            transmits: VecDeque::new(),
            stats: RelayStats::default(),
            config,
            auth,
        }
    }

    /// New limits and key (a reload): open pairs keep their counts and are held to the new
    /// limits from now on; binds are checked with the new key.
    pub fn update(&mut self, config: RelayConfig, auth: RelayAuth) {
        self.config = config;
        self.auth = auth;
    }

    /// What the relay counted so far.
    pub fn stats(&self) -> RelayStats {
        self.stats
    }

    /// Open pairs now (closed ones that have not expired included).
    pub fn pairs(&self) -> usize {
        self.pairs.len()
    }

    /// Legs waiting for their peer now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Takes one datagram from `from`: forward it, hand it to the reflector, or keep it
    /// (a relay bind, answered through [`Relay::poll_transmit`]) or drop it.
    pub fn handle_input(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Verdict {
        match stun::classify(datagram) {
            Demux::Quic => self.forward(now, from, datagram.len()),
            Demux::Stun => self.bind(now, from, datagram),
            Demux::Other => Verdict::Reflect,
        }
    }

    /// The next answer to send.
    pub fn poll_transmit(&mut self) -> Option<(Vec<u8>, SocketAddr)> {
        self.transmits.pop_front()
    }

    /// Forgets unpaired legs past [`RelayConfig::waiting_ttl`] and pairs idle past
    /// [`RelayConfig::idle`].
    pub fn handle_timeout(&mut self, now: Instant) {
        let ttl = self.config.waiting_ttl;
        let before = self.waiting.len();
        self.waiting
            .retain(|_, w| now.saturating_duration_since(w.seen) <= ttl);
        self.stats.legs_expired += (before - self.waiting.len()) as u64;
        let idle = self.config.idle;
        let legs = &mut self.legs;
        let stats = &mut self.stats;
        self.pairs.retain(|_, pair| {
            let keep = now.saturating_duration_since(pair.active) <= idle;
            if !keep {
                for leg in pair.legs {
                    legs.remove(&leg);
                }
                stats.pairs_expired += 1;
                tracing::debug!(
                    event = "p2p_relay_pair_ended",
                    legs = ?pair.legs,
                    bytes = pair.bytes,
                    capped = pair.closed,
                    "a relayed transfer went idle and was forgotten"
                );
            }
            keep
        });
    }

    /// A QUIC datagram: to the other leg if its pair is open and within its limits.
    fn forward(&mut self, now: Instant, from: SocketAddr, len: usize) -> Verdict {
        let Some(pair) = self
            .legs
            .get(&from)
            .and_then(|token| self.pairs.get_mut(token))
        else {
            self.stats.unpaired += 1;
            return Verdict::Done;
        };
        if pair.closed {
            self.stats.over_cap += 1;
            return Verdict::Done;
        }
        let len = len as u64;
        if pair.bytes.saturating_add(len) > self.config.max_bytes {
            pair.closed = true;
            self.stats.pairs_capped += 1;
            self.stats.over_cap += 1;
            tracing::info!(
                event = "p2p_relay_capped",
                legs = ?pair.legs,
                bytes = pair.bytes,
                max = self.config.max_bytes,
                "a relayed transfer reached relay_max_bytes; its datagrams are dropped from now on"
            );
            return Verdict::Done;
        }
        pair.active = now;
        pair.seen[usize::from(from == pair.legs[1])] = now;
        let burst = self.config.burst();
        let elapsed = now.saturating_duration_since(pair.refilled).as_secs_f64();
        pair.tokens = (pair.tokens + elapsed * self.config.rate as f64).min(burst);
        pair.refilled = now;
        if pair.tokens < len as f64 {
            self.stats.over_rate += 1;
            return Verdict::Done;
        }
        pair.tokens -= len as f64;
        pair.bytes += len;
        self.stats.forwarded_datagrams += 1;
        self.stats.forwarded_bytes += len;
        let [a, b] = pair.legs;
        Verdict::Forward(if from == a { b } else { a })
    }

    /// A STUN datagram: a relay bind is checked and answered; anything else is the
    /// reflector's.
    fn bind(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Verdict {
        let Ok(decoded) = stun::decode(datagram) else {
            return Verdict::Reflect;
        };
        let request = decoded.message;
        let Some(token) = request.relay else {
            return Verdict::Reflect;
        };
        let authentic = decoded
            .integrity
            .as_ref()
            .is_some_and(|tag| self.auth.0.verify(datagram, tag));
        if !authentic || request.class != Class::Request {
            self.stats.bad_tags += 1;
            return Verdict::Done;
        }
        if !self.config.enabled {
            self.refuse(from, "the relay is turned off (relay = false)");
            return Verdict::Done;
        }
        let transaction = request.transaction;
        // A leg of an open pair: the same token is a re-sent bind (its answer was lost),
        // another token is refused (one address forwards to one peer).
        if let Some(own) = self.legs.get(&from) {
            match self.pairs.get(own) {
                Some(pair) if *own == token && !pair.closed => {
                    // Also a peer keeping its pair while its packets go direct.
                    if let Some(pair) = self.pairs.get_mut(own) {
                        pair.active = now;
                        pair.seen[usize::from(from == pair.legs[1])] = now;
                    }
                    self.answer(transaction, from, RelayState::Paired);
                }
                _ => self.refuse(from, "a leg of another pair, or of a capped one"),
            }
            return Verdict::Done;
        }
        if self.pairs.contains_key(&token) {
            match self.move_leg(now, token, from) {
                Some(()) => self.answer(transaction, from, RelayState::Paired),
                None => self.refuse(from, "a third address for a pair"),
            }
            return Verdict::Done;
        }
        let ttl = self.config.waiting_ttl;
        match self.waiting.get_mut(&token) {
            Some(w) if w.leg == from => {
                w.transaction = transaction;
                w.seen = now;
                self.answer(transaction, from, RelayState::Waiting);
            }
            // (A waiting address that has since become a leg of another pair is stale:
            // the new address takes its place below, so no address is in two pairs.)
            Some(w)
                if now.saturating_duration_since(w.seen) <= ttl
                    && !self.legs.contains_key(&w.leg) =>
            {
                if self.pairs.len() >= self.config.max_pairs {
                    self.handle_timeout(now);
                }
                if self.pairs.len() >= self.config.max_pairs {
                    self.stats.refused_binds += 1;
                    self.answer(transaction, from, RelayState::Full);
                    return Verdict::Done;
                }
                let first = self.waiting.remove(&token).map(|w| (w.leg, w.transaction));
                let Some((leg, first_transaction)) = first else {
                    return Verdict::Done;
                };
                self.pair(now, token, [leg, from]);
                self.answer(first_transaction, leg, RelayState::Paired);
                self.answer(transaction, from, RelayState::Paired);
            }
            _ => {
                // New, or its first leg expired: this address waits (in place of the
                // expired one).
                if !self.waiting.contains_key(&token)
                    && self.waiting.len() >= self.config.max_waiting
                {
                    self.handle_timeout(now);
                    if self.waiting.len() >= self.config.max_waiting {
                        self.stats.refused_binds += 1;
                        self.answer(transaction, from, RelayState::Full);
                        return Verdict::Done;
                    }
                }
                self.waiting.insert(
                    token,
                    Waiting {
                        leg: from,
                        transaction,
                        seen: now,
                    },
                );
                self.answer(transaction, from, RelayState::Waiting);
            }
        }
        Verdict::Done
    }

    /// A leg of `token`'s pair binds again from `from`: its NAT gave it a new port (a
    /// *rebinding*), or it moved. Only the peers hold the token (and the PSK's tag), so
    /// the question is only which leg it is: the one at `from`'s IP address (a rebinding
    /// keeps the public address), the quieter of the two when both are, and only if that
    /// leg has been silent for [`LEG_MOVE_SILENCE`] (a leg still talking did not move).
    fn move_leg(
        &mut self,
        now: Instant,
        token: [u8; RELAY_TOKEN_LEN],
        from: SocketAddr,
    ) -> Option<()> {
        let pair = self.pairs.get_mut(&token).filter(|pair| !pair.closed)?;
        let leg = (0..2)
            .filter(|&i| pair.legs[i].ip() == from.ip())
            .min_by_key(|&i| pair.seen[i])?;
        if now.saturating_duration_since(pair.seen[leg]) < LEG_MOVE_SILENCE {
            return None;
        }
        let old = std::mem::replace(&mut pair.legs[leg], from);
        pair.seen[leg] = now;
        pair.active = now;
        self.legs.remove(&old);
        self.legs.insert(from, token);
        self.stats.legs_moved += 1;
        tracing::info!(
            event = "p2p_relay_leg_moved",
            from = %old,
            to = %from,
            "a relayed peer came back from a new port; its pair follows"
        );
        Some(())
    }

    fn pair(&mut self, now: Instant, token: [u8; RELAY_TOKEN_LEN], legs: [SocketAddr; 2]) {
        for leg in legs {
            self.legs.insert(leg, token);
        }
        self.pairs.insert(
            token,
            Pair {
                legs,
                bytes: 0,
                tokens: self.config.burst(),
                refilled: now,
                active: now,
                seen: [now; 2],
                closed: false,
            },
        );
        self.stats.pairs_made += 1;
        tracing::info!(
            event = "p2p_relay_paired",
            legs = ?legs,
            pairs = self.pairs.len(),
            "relaying a transfer between two peers"
        );
    }

    fn refuse(&mut self, from: SocketAddr, reason: &'static str) {
        self.stats.refused_binds += 1;
        tracing::debug!(event = "p2p_relay_refused", peer = %from, reason, "relay bind dropped");
    }

    /// Queues a signed answer to `to` for `transaction`.
    fn answer(&mut self, transaction: stun::TransactionId, to: SocketAddr, state: RelayState) {
        if self.transmits.len() >= MAX_TRANSMITS {
            return;
        }
        let mut out = Vec::with_capacity(96);
        Message::success(transaction, to)
            .with_relay_state(state)
            .encode_signed(&mut out, |b| self.auth.0.sign(b));
        self.transmits.push_back((out, to));
    }
}

/// What the UDP task runs with; a reload sends a new one through [`serve_udp_with`]'s
/// watch channel.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// The relay's limits.
    pub config: RelayConfig,
    /// The key binds are checked with (from the server's PSK).
    pub auth: RelayAuth,
}

/// Runs the address reflector and the relay on `socket` until `cancel` fires.
///
/// # Errors
///
/// The socket fails to receive.
pub async fn serve_udp(
    socket: &UdpSocket,
    reflector: ReflectorConfig,
    relay: RelayConfig,
    auth: RelayAuth,
    cancel: CancellationToken,
) -> io::Result<()> {
    let (_keep, settings) = watch::channel(RelaySettings {
        config: relay,
        auth,
    });
    let (legs, inbound) = TcpLegs::new();
    serve_udp_with(
        socket,
        reflector,
        settings,
        P2pRelayMeter::default(),
        (legs, inbound),
        cancel,
    )
    .await
}

/// Runs the address reflector and the relay on `socket` until `cancel` fires, taking new
/// limits and key from `settings` as they come, and counting into `meter`.
///
/// # Errors
///
/// The socket fails to receive (sending errors are ignored: peers re-send binds, QUIC
/// retransmits).
pub async fn serve_udp_with(
    socket: &UdpSocket,
    reflector: ReflectorConfig,
    mut settings: watch::Receiver<RelaySettings>,
    meter: P2pRelayMeter,
    tcp: (Arc<TcpLegs>, mpsc::Receiver<(SocketAddr, Vec<u8>)>),
    cancel: CancellationToken,
) -> io::Result<()> {
    let (legs, mut inbound) = tcp;
    let batches = BatchSocket::new(socket)?;
    let mut reflector = Reflector::new(reflector);
    let initial = settings.borrow_and_update().clone();
    let mut relay = Relay::new(initial.config, initial.auth);
    let mut buf = vec![0u8; RECV_BUF_LEN];
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    let mut reported = RelayStats::default();
    let mut forwarder = Forwarder {
        socket: &batches,
        legs: &legs,
        relay: &mut relay,
        reflector: &mut reflector,
    };
    loop {
        let first = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(()),
            changed = settings.changed(), if watching => {
                match changed {
                    Ok(()) => {
                        let new = settings.borrow_and_update().clone();
                        forwarder.relay.update(new.config, new.auth);
                    }
                    // The sender is gone (the server is stopping): keep the settings.
                    Err(_) => watching = false,
                }
                continue;
            }
            _ = sweep.tick() => {
                forwarder.relay.handle_timeout(Instant::now());
                report(forwarder.relay, &meter, &mut reported);
                continue;
            }
            Some((from, datagram)) = inbound.recv() => {
                let batch = Batch { len: datagram.len(), stride: datagram.len(), from, ecn: None };
                forwarder.handle(&datagram, batch).await;
                report(forwarder.relay, &meter, &mut reported);
                continue;
            }
            r = batches.recv(&mut buf) => r,
        };
        let mut received = Some(first);
        let mut batch = 0;
        while let Some(result) = received.take() {
            match result {
                Ok(got) => forwarder.handle(&buf[..got.len], got).await,
                // ICMP errors from earlier sends surface here on some systems: not ours to
                // stop for.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => return Err(e),
            }
            batch += 1;
            if batch < BATCH {
                match batches.try_recv(&mut buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => received = Some(other),
                }
            }
        }
        report(forwarder.relay, &meter, &mut reported);
    }
}

/// What the serve loop drives: the socket, the TCP legs, the relay and the reflector.
struct Forwarder<'a> {
    socket: &'a BatchSocket<&'a UdpSocket>,
    legs: &'a TcpLegs,
    relay: &'a mut Relay,
    reflector: &'a mut Reflector,
}

impl Forwarder<'_> {
    /// One batch of datagrams from one sender through the relay (and the reflector),
    /// sending what comes out. Each datagram gets its own verdict; consecutive ones
    /// forwarded to the same leg go on as one batch.
    async fn handle(&mut self, data: &[u8], batch: Batch) {
        let now = Instant::now();
        let stride = batch.stride.max(1);
        // The run being collected: its destination and its byte range in `data`.
        let mut run: Option<(SocketAddr, std::ops::Range<usize>)> = None;
        for (i, datagram) in data.chunks(stride).enumerate() {
            let here = i * stride..i * stride + datagram.len();
            let verdict = self.relay.handle_input(now, batch.from, datagram);
            if let (Verdict::Forward(to), Some((leg, range))) = (verdict, &mut run)
                && *leg == to
            {
                range.end = here.end;
                continue;
            }
            if let Some((leg, range)) = run.take() {
                self.forward(&data[range], stride, leg, batch).await;
            }
            match verdict {
                Verdict::Forward(to) => run = Some((to, here)),
                Verdict::Reflect => {
                    if let Some(answer) = self.reflector.handle(now, batch.from, datagram) {
                        self.answer(&answer, batch.from);
                    }
                }
                Verdict::Done => {}
            }
            while let Some((answer, to)) = self.relay.poll_transmit() {
                self.answer(&answer, to);
            }
        }
        if let Some((leg, range)) = run {
            self.forward(&data[range], stride, leg, batch).await;
        }
    }

    /// Sends datagrams on to the other leg: down its session if it is a TCP leg, else by
    /// UDP, waiting while the socket's send buffer is full (backpressure on the one loop,
    /// which QUIC sees as delay).
    async fn forward(&self, datagrams: &[u8], stride: usize, to: SocketAddr, batch: Batch) {
        let mut chunks = datagrams.chunks(stride);
        if let Some(first) = chunks.next()
            && self.legs.send_to(to, first)
        {
            for datagram in chunks {
                self.legs.send_to(to, datagram);
            }
            return;
        }
        // A failed call dropped its datagrams; QUIC above retransmits them.
        let _ = self.socket.send(datagrams, stride, to, batch.ecn).await;
    }

    /// An answer (a bind's, the reflector's), sent without waiting: a full buffer drops it
    /// and the peer asks again.
    fn answer(&self, answer: &[u8], to: SocketAddr) {
        if !self.legs.send_to(to, answer) {
            let _ = self.socket.socket().try_send_to(answer, to);
        }
    }
}

/// Adds what the relay counted since the last report to the metrics.
fn report(relay: &Relay, meter: &P2pRelayMeter, reported: &mut RelayStats) {
    let now = relay.stats();
    meter
        .bytes
        .inc_by(now.forwarded_bytes - reported.forwarded_bytes);
    meter
        .datagrams
        .inc_by(now.forwarded_datagrams - reported.forwarded_datagrams);
    meter.pairs.inc_by(now.pairs_made - reported.pairs_made);
    meter
        .active
        .set(i64::try_from(relay.pairs()).unwrap_or(i64::MAX));
    *reported = now;
}

/// How [`join`] re-sends.
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// First wait for an answer; doubled after each bind, up to a second.
    pub first_wait: Duration,
    /// Give up after this long in total (waiting for the peer included).
    pub timeout: Duration,
}

impl Default for JoinConfig {
    fn default() -> Self {
        // Binds at 0, 50, 150, 350, 750, 1550 ms, then every second: a lost bind costs little,
        // and the peer, whose punch failed at about the same time, comes within seconds.
        Self {
            first_wait: Duration::from_millis(50),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why [`join`] did not get a pair.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RelayError {
    /// No authenticated answer at all.
    #[error(
        "the relay at {relay} did not answer in {waited:?} ({tries} binds); check that the server \
         enables [server.p2p] with relay = true, that this client uses the server's PSK, and \
         that UDP to it is not blocked"
    )]
    NoAnswer {
        /// Who was asked.
        relay: SocketAddr,
        /// How long.
        waited: Duration,
        /// Binds sent.
        tries: u32,
    },
    /// The relay holds our place, but the peer did not come.
    #[error(
        "the relay at {relay} waited {waited:?} for the peer, which did not come; \
         check that the other side is still running, then try again"
    )]
    PeerAbsent {
        /// Who was asked.
        relay: SocketAddr,
        /// How long.
        waited: Duration,
    },
    /// The relay carries as many transfers as it may.
    #[error(
        "the relay at {relay} carries as many transfers as it may (relay_max_pairs); try again in a few minutes"
    )]
    Full {
        /// Who was asked.
        relay: SocketAddr,
    },
    /// The socket failed.
    #[error("cannot reach the relay at {relay}: {source}")]
    Io {
        /// Who was asked.
        relay: SocketAddr,
        /// The socket's error.
        source: io::Error,
    },
}

/// Registers this socket as one leg of `token` at the relay, re-sending until the relay
/// says both legs are there; then QUIC to `relay` reaches the peer. STUN datagrams that
/// are not the relay's signed answer to this bind are discarded.
///
/// # Errors
///
/// [`RelayError`]: no answer (wrong PSK, no relay, UDP blocked), no peer within
/// `config.timeout`, a full relay, or the socket failed.
pub async fn join<S: StunIo>(
    io: &mut S,
    relay: SocketAddr,
    token: &RelayToken,
    auth: &RelayAuth,
    config: &JoinConfig,
) -> Result<(), RelayError> {
    let transaction: stun::TransactionId = rand::random();
    let mut bind = Vec::with_capacity(96);
    // One transaction for every re-send: the relay answers `paired` to the latest one it
    // saw, and any of them is ours.
    Message::request(transaction)
        .with_relay(token.0)
        .encode_signed(&mut bind, |b| auth.0.sign(b));
    let io_error = |source| RelayError::Io { relay, source };
    let start = Instant::now();
    let deadline = start + config.timeout;
    let mut wait = config.first_wait;
    let mut tries = 0u32;
    let mut waiting = false;
    loop {
        // Bounded by the deadline: a socket that stays full is the retransmit's problem.
        let _ = tokio::time::timeout_at(deadline, io.writable()).await;
        io.send_to(&bind, relay).map_err(io_error)?;
        tries += 1;
        let resend = (Instant::now() + wait).min(deadline);
        wait = wait.saturating_mul(2).min(MAX_RESEND);
        loop {
            let (packet, from) = tokio::select! {
                r = io.recv_from() => r.map_err(io_error)?,
                () = tokio::time::sleep_until(resend) => break,
            };
            if from != relay {
                continue;
            }
            let Ok(decoded) = stun::decode(&packet) else {
                continue;
            };
            let authentic = decoded
                .integrity
                .as_ref()
                .is_some_and(|tag| auth.0.verify(&packet, tag));
            let m = decoded.message;
            if !authentic || m.class != Class::Success || m.transaction != transaction {
                continue;
            }
            match m.relay_state {
                Some(RelayState::Paired) => return Ok(()),
                Some(RelayState::Waiting) => waiting = true,
                Some(RelayState::Full) => return Err(RelayError::Full { relay }),
                None => {}
            }
        }
        if Instant::now() >= deadline {
            let waited = start.elapsed();
            return Err(if waiting {
                RelayError::PeerAbsent { relay, waited }
            } else {
                RelayError::NoAnswer {
                    relay,
                    waited,
                    tries,
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: [u8; 32] = [7; 32];

    fn auth() -> RelayAuth {
        RelayAuth::from_psk(&Secret::new("relay-test-psk-0123456789"))
    }

    fn config() -> RelayConfig {
        RelayConfig {
            enabled: true,
            max_pairs: 2,
            max_waiting: 3,
            max_bytes: 10_000,
            rate: 1 << 30,
            idle: Duration::from_secs(60),
            waiting_ttl: Duration::from_secs(30),
        }
    }

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, n], 4000 + u16::from(n)))
    }

    fn bind_with(token: [u8; 32], auth: &RelayAuth, tx: u8) -> Vec<u8> {
        let mut out = Vec::new();
        Message::request([tx; 12])
            .with_relay(token)
            .encode_signed(&mut out, |b| auth.0.sign(b));
        out
    }

    fn bind(token: [u8; 32]) -> Vec<u8> {
        bind_with(token, &auth(), 1)
    }

    /// The states answered, in order, with their destinations.
    fn answers(relay: &mut Relay) -> Vec<(RelayState, SocketAddr)> {
        let mut out = Vec::new();
        while let Some((packet, to)) = relay.poll_transmit() {
            let decoded = stun::decode(&packet).unwrap();
            assert!(
                auth()
                    .0
                    .verify(&packet, decoded.integrity.as_ref().unwrap())
            );
            assert_eq!(
                decoded.message.mapped,
                Some(to),
                "the answer tells the leg its address"
            );
            out.push((decoded.message.relay_state.unwrap(), to));
        }
        out
    }

    fn quic(len: usize) -> Vec<u8> {
        let mut d = vec![0x55; len];
        d[0] = 0x40;
        d
    }

    fn paired(relay: &mut Relay, now: Instant, token: [u8; 32], a: SocketAddr, b: SocketAddr) {
        assert_eq!(relay.handle_input(now, a, &bind(token)), Verdict::Done);
        assert_eq!(relay.handle_input(now, b, &bind(token)), Verdict::Done);
        let got = answers(relay);
        assert!(got.contains(&(RelayState::Paired, a)), "{got:?}");
        assert!(got.contains(&(RelayState::Paired, b)), "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn two_legs_pair_and_quic_goes_across_both_ways() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        let (a, b) = (addr(1), addr(2));
        assert_eq!(
            relay.handle_input(now, a, &quic(100)),
            Verdict::Done,
            "not paired yet"
        );
        relay.handle_input(now, a, &bind(TOKEN));
        assert_eq!(answers(&mut relay), [(RelayState::Waiting, a)]);
        // A re-sent bind keeps the place.
        relay.handle_input(now, a, &bind(TOKEN));
        assert_eq!(answers(&mut relay), [(RelayState::Waiting, a)]);
        relay.handle_input(now, b, &bind(TOKEN));
        // The waiting leg hears at once, not at its next re-send.
        assert_eq!(
            answers(&mut relay),
            [(RelayState::Paired, a), (RelayState::Paired, b)]
        );
        assert_eq!(relay.handle_input(now, a, &quic(100)), Verdict::Forward(b));
        assert_eq!(relay.handle_input(now, b, &quic(200)), Verdict::Forward(a));
        // A late re-send of a paired leg is answered again.
        relay.handle_input(now, a, &bind(TOKEN));
        assert_eq!(answers(&mut relay), [(RelayState::Paired, a)]);
        // A plain Binding request is the reflector's; junk too.
        let mut plain = Vec::new();
        Message::request([9; 12]).encode(&mut plain);
        assert_eq!(relay.handle_input(now, a, &plain), Verdict::Reflect);
        assert_eq!(relay.handle_input(now, a, &[0x20, 1]), Verdict::Reflect);
        let stats = relay.stats();
        assert_eq!((stats.forwarded_datagrams, stats.forwarded_bytes), (2, 300));
        assert_eq!((stats.pairs_made, stats.unpaired), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leg_back_from_a_new_port_takes_its_place_once_silent_and_binds_keep_a_pair() {
        let mut relay = Relay::new(config(), auth());
        let start = Instant::now();
        let (a, b) = (addr(1), addr(2));
        paired(&mut relay, start, TOKEN, a, b);
        // a's NAT gives it a new port; while a still talks, the bind is a third address.
        let rebound = SocketAddr::new(a.ip(), 50_000);
        relay.handle_input(start, a, &quic(10));
        relay.handle_input(start, rebound, &bind(TOKEN));
        assert!(answers(&mut relay).is_empty());
        // Silent for a while (its packets went direct): the new port takes its place.
        let later = start + 2 * LEG_MOVE_SILENCE;
        relay.handle_input(later, rebound, &bind(TOKEN));
        assert_eq!(answers(&mut relay), [(RelayState::Paired, rebound)]);
        assert_eq!(
            relay.handle_input(later, b, &quic(10)),
            Verdict::Forward(rebound)
        );
        assert_eq!(
            relay.handle_input(later, rebound, &quic(10)),
            Verdict::Forward(b)
        );
        assert_eq!(
            relay.handle_input(later, a, &quic(10)),
            Verdict::Done,
            "the old port is no leg"
        );
        assert_eq!(relay.stats().legs_moved, 1);
        // Another address is still refused, however quiet the legs are.
        relay.handle_input(later + LEG_MOVE_SILENCE * 3, addr(3), &bind(TOKEN));
        assert!(answers(&mut relay).is_empty());
        // Binds alone (both peers direct) keep the pair past its idle time.
        let mut now = later;
        for _ in 0..4 {
            now += Duration::from_secs(40);
            relay.handle_input(now, b, &bind(TOKEN));
            relay.handle_timeout(now);
            assert_eq!(answers(&mut relay), [(RelayState::Paired, b)]);
        }
        assert_eq!(relay.pairs(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_third_leg_is_refused_and_a_leg_cannot_join_two_pairs() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        paired(&mut relay, now, TOKEN, addr(1), addr(2));
        relay.handle_input(now, addr(3), &bind(TOKEN));
        assert!(answers(&mut relay).is_empty());
        assert_eq!(relay.handle_input(now, addr(3), &quic(10)), Verdict::Done);
        relay.handle_input(now, addr(1), &bind([8; 32]));
        assert!(answers(&mut relay).is_empty());
        assert_eq!(relay.waiting(), 0);
        assert_eq!(relay.stats().refused_binds, 2);
        // The pair still works.
        assert_eq!(
            relay.handle_input(now, addr(2), &quic(10)),
            Verdict::Forward(addr(1))
        );
        // An address waiting under two tokens pairs under the first to find its peer;
        // the other token's peer then waits instead of joining it to a second pair.
        relay.handle_input(now, addr(5), &bind([3; 32]));
        relay.handle_input(now, addr(5), &bind([4; 32]));
        paired(&mut relay, now, [3; 32], addr(5), addr(6));
        relay.handle_input(now, addr(7), &bind([4; 32]));
        assert_eq!(answers(&mut relay), [(RelayState::Waiting, addr(7))]);
        assert_eq!(
            relay.handle_input(now, addr(5), &quic(10)),
            Verdict::Forward(addr(6))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn binds_without_a_valid_tag_are_dropped_in_silence() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        let stranger = RelayAuth::from_psk(&Secret::new("another-servers-psk-0123"));
        relay.handle_input(now, addr(1), &bind_with(TOKEN, &stranger, 1));
        let mut unsigned = Vec::new();
        Message::request([1; 12])
            .with_relay(TOKEN)
            .encode(&mut unsigned);
        relay.handle_input(now, addr(2), &unsigned);
        let mut tampered = bind(TOKEN);
        tampered[30] ^= 1; // inside the token
        relay.handle_input(now, addr(3), &tampered);
        assert!(answers(&mut relay).is_empty());
        assert_eq!(relay.waiting(), 0);
        assert_eq!(relay.stats().bad_tags, 3);
        // Turned off, even a good bind gets nothing.
        relay.update(
            RelayConfig {
                enabled: false,
                ..config()
            },
            auth(),
        );
        relay.handle_input(now, addr(1), &bind(TOKEN));
        assert!(answers(&mut relay).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_cap_closes_the_pair_for_good() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        let (a, b) = (addr(1), addr(2));
        paired(&mut relay, now, TOKEN, a, b);
        for _ in 0..9 {
            assert_eq!(relay.handle_input(now, a, &quic(1000)), Verdict::Forward(b));
        }
        assert_eq!(relay.handle_input(now, b, &quic(1000)), Verdict::Forward(a));
        // 10,000 bytes both ways together: the next one is over.
        assert_eq!(relay.handle_input(now, b, &quic(1)), Verdict::Done);
        assert_eq!(relay.handle_input(now, a, &quic(1)), Verdict::Done);
        assert_eq!(relay.stats().pairs_capped, 1);
        // A re-bind does not reopen it, nor does a third address get in.
        relay.handle_input(now, a, &bind(TOKEN));
        relay.handle_input(now, addr(3), &bind(TOKEN));
        assert!(answers(&mut relay).is_empty());
        // Once idle long enough it is forgotten; the token may then start over.
        relay.handle_timeout(now + Duration::from_secs(61));
        assert_eq!(relay.pairs(), 0);
        assert_eq!(relay.handle_input(now, a, &quic(1)), Verdict::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_rate_datagrams_are_dropped_until_the_bucket_refills() {
        let rate = 1 << 20; // burst: 256 KiB
        let mut relay = Relay::new(
            RelayConfig {
                rate,
                max_bytes: u64::MAX,
                ..config()
            },
            auth(),
        );
        let now = Instant::now();
        let (a, b) = (addr(1), addr(2));
        paired(&mut relay, now, TOKEN, a, b);
        let packet = quic(1024);
        let passed = (0..1000)
            .filter(|_| relay.handle_input(now, a, &packet) == Verdict::Forward(b))
            .count();
        assert_eq!(passed, 256, "the burst");
        assert_eq!(relay.stats().over_rate, 1000 - 256);
        // A tenth of a second later, a tenth of the rate has refilled.
        let later = now + Duration::from_millis(100);
        let passed = (0..1000)
            .filter(|_| relay.handle_input(later, a, &packet) == Verdict::Forward(b))
            .count();
        assert!((100..=103).contains(&passed), "{passed}");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_pairs_and_lonely_legs_expire() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        let (a, b) = (addr(1), addr(2));
        paired(&mut relay, now, TOKEN, a, b);
        relay.handle_input(now, addr(3), &bind([8; 32]));
        answers(&mut relay);
        // Traffic keeps the pair; the lonely leg goes after 30 s.
        let t = now + Duration::from_secs(40);
        assert_eq!(relay.handle_input(t, a, &quic(10)), Verdict::Forward(b));
        relay.handle_timeout(t);
        assert_eq!((relay.pairs(), relay.waiting()), (1, 0));
        assert_eq!(relay.stats().legs_expired, 1);
        // 60 s of silence ends the pair: its legs are strangers again.
        let t = t + Duration::from_secs(61);
        relay.handle_timeout(t);
        assert_eq!(relay.pairs(), 0);
        assert_eq!(relay.handle_input(t, a, &quic(10)), Verdict::Done);
        assert_eq!(relay.stats().pairs_expired, 1);
        // A leg whose peer expired is replaced by the next address, which waits.
        relay.handle_input(t, addr(4), &bind([9; 32]));
        let t2 = t + Duration::from_secs(31);
        relay.handle_input(t2, addr(5), &bind([9; 32]));
        assert_eq!(
            answers(&mut relay),
            [
                (RelayState::Waiting, addr(4)),
                (RelayState::Waiting, addr(5))
            ]
        );
        assert_eq!(relay.pairs(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tables_are_bounded() {
        let mut relay = Relay::new(config(), auth());
        let now = Instant::now();
        paired(&mut relay, now, [1; 32], addr(1), addr(2));
        paired(&mut relay, now, [2; 32], addr(3), addr(4));
        // A third pair does not fit: its second leg hears `full`.
        relay.handle_input(now, addr(5), &bind([3; 32]));
        relay.handle_input(now, addr(6), &bind([3; 32]));
        assert_eq!(
            answers(&mut relay),
            [(RelayState::Waiting, addr(5)), (RelayState::Full, addr(6))]
        );
        assert_eq!(relay.pairs(), 2);
        // Three waiting legs at most.
        for n in 0..3 {
            relay.handle_input(now, addr(10 + n), &bind([10 + n; 32]));
        }
        let got = answers(&mut relay);
        assert_eq!(got.last(), Some(&(RelayState::Full, addr(12))), "{got:?}");
        assert_eq!(relay.waiting(), 3);
        // Room again once the old ones expire.
        let later = now + Duration::from_secs(31);
        relay.handle_input(later, addr(12), &bind([12; 32]));
        assert_eq!(answers(&mut relay), [(RelayState::Waiting, addr(12))]);
        assert_eq!(relay.waiting(), 1);
    }

    #[test]
    fn tokens_come_from_the_relay_key_and_debug_hides_secrets() {
        let a = RelayToken::from_bytes([1; 32]);
        assert!(format!("{a:?}").starts_with("RelayToken(01010101"));
        assert_eq!(format!("{:?}", auth()), "RelayAuth(***)");
    }
}
