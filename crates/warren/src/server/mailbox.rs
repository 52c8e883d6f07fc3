//! The peer-to-peer mailbox: where the two clients of one join code meet
//! (`[server.p2p]`, issue 17).
//!
//! A sender's session allocates a *nameplate* (the number at the front of the code); a
//! receiver's session claims it; from then on each side's `Send` reaches the other as a
//! `Message`. The server never sees the code's words: the bodies are SPAKE2 messages and
//! what they seal, opaque here. What the server does see, it bounds:
//! - nameplates open at once (`max_nameplates`), each waiting at most `nameplate_ttl` for
//!   its next receiver (counted from its allocation, then from the last receiver's
//!   leaving: a `warren send --max-receivers` or a `warren p2p listen` that keeps being
//!   used keeps its code);
//! - allocations and claims per client IP per minute (`rate_per_minute`), so guessing
//!   nameplates or filling the table is slow;
//! - messages queued for a receiver not there yet ([`QUEUE_MESSAGES`], [`QUEUE_BYTES`]);
//! - failed exchanges: a client that reports a failed PAKE (`Release { failed: true }`)
//!   counts against the nameplate, which is burned after [`MAX_FAILURES`] (each guess
//!   costs a guesser a claim; the real sender learns of each).
//!
//! A *named P2P service* (`[server.p2p.services]`) works the same way, with two
//! differences: its side proves the service's token to offer it (`OfferService`) or visit
//! it (`VisitService`, the only way to claim its nameplate: its number is never accepted
//! by `Claim`), and its nameplate lives as long as the offering session, never expiring
//! nor burning (a failed exchange there means a visitor with the wrong token, which could
//! only come from a token holder). One session offers a service at a time.
//!
//! A session holds at most one nameplate. When it ends, its side leaves: a sender's leaving
//! frees the nameplate, a receiver's lets another receiver claim it.
//!
//! `Allocated` and `Claimed` tell the client the bound port of the server's P2P UDP socket
//! (address reflector and relay, [`crate::p2p::net::relay`]), which the client reaches at
//! the host it reached the server at.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio::time::Instant;
use warren_proto::handshake::SessionId;
use warren_proto::message::{ControlMessage, MailboxEvent, MailboxOp};

use crate::config::p2p::P2pConfig;
use crate::crypto::keys;

/// Messages kept for a receiver that has not joined yet.
pub const QUEUE_MESSAGES: usize = 16;
/// Bytes kept for a receiver that has not joined yet.
pub const QUEUE_BYTES: usize = 32 * 1024;
/// The answer when the table holds `max_nameplates` already.
const TABLE_FULL: &str =
    "the server holds as many codes as it may (max_nameplates); try again in a few minutes";
/// Failed exchanges after which a nameplate is burned.
pub const MAX_FAILURES: u8 = 3;
/// Client IPs whose recent requests are counted; when full, the oldest windows go.
const RATE_TABLE: usize = 16_384;

/// One side at a nameplate: its session and the queue to its control loop.
struct Member {
    session: SessionId,
    to: mpsc::Sender<ControlMessage>,
}

impl Member {
    /// Tells this side `event`; `false` when its control queue is full or gone (the
    /// session is wedged or ending, and its side is dropped).
    fn tell(&self, event: MailboxEvent) -> bool {
        self.to
            .try_send(ControlMessage::MailboxEvent { event })
            .is_ok()
    }
}

struct Plate {
    /// Since when the nameplate waits for a receiver: its allocation, or the last
    /// receiver's leaving.
    waiting_since: Instant,
    sender: Member,
    receiver: Option<Member>,
    /// Sent by the sender before a receiver joined.
    queued: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    failures: u8,
    /// The named P2P service it stands for.
    service: Option<String>,
}

#[derive(Default)]
struct Table {
    plates: HashMap<u32, Plate>,
    /// The nameplate of each named P2P service on offer.
    services: HashMap<String, u32>,
    /// Which nameplate each session is at, and whether as the sender.
    sessions: HashMap<SessionId, (u32, bool)>,
    /// Per client IP: the start of its current one-minute window and its requests in it.
    rates: HashMap<IpAddr, (Instant, u32)>,
}

/// The server's mailbox (one per server).
#[derive(Default)]
pub struct Mailbox {
    table: Mutex<Table>,
    /// The bound port of the server's P2P UDP socket (reflector and relay), told to every
    /// client that allocates or claims; `None` when the server has none.
    udp_port: Option<u16>,
    /// The reflector's second port (NAT-type probes), told on [`MailboxOp::Info`].
    udp_alt_port: Option<u16>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

/// Who asks: the session, its client's IP, and the queue to its control loop.
pub struct Caller<'a> {
    /// The session.
    pub session: SessionId,
    /// The client's IP (rate limits).
    pub ip: IpAddr,
    /// Where answers go.
    pub to: &'a mpsc::Sender<ControlMessage>,
    /// The session's handshake hash, which service token proofs are bound to.
    pub handshake_hash: &'a [u8; 32],
}

impl Mailbox {
    /// A mailbox telling its clients that the reflector and relay listen on `udp_port`
    /// (on the host they reached the server at), and a second reflector on `udp_alt_port`.
    pub fn new(udp_port: Option<u16>, udp_alt_port: Option<u16>) -> Self {
        Mailbox {
            table: Mutex::default(),
            udp_port,
            udp_alt_port,
        }
    }

    /// Handles one operation of `caller`'s; `config` is `None` when the server has no
    /// `[server.p2p]`.
    pub fn handle(&self, config: Option<&P2pConfig>, caller: &Caller<'_>, op: MailboxOp) {
        let answer = |event| {
            let _ = caller.to.try_send(ControlMessage::MailboxEvent { event });
        };
        let Some(config) = config else {
            answer(refused(
                "this server has no peer-to-peer mailbox: its operator adds a [server.p2p] section to enable `warren send`",
            ));
            return;
        };
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.expire(config, Instant::now());
        match op {
            MailboxOp::Allocate
            | MailboxOp::Claim { .. }
            | MailboxOp::OfferService { .. }
            | MailboxOp::VisitService { .. }
                if table.sessions.contains_key(&caller.session) =>
            {
                answer(refused(
                    "this session already holds a code; release it first",
                ));
            }
            MailboxOp::Allocate => {
                if !table.within_rate(config, caller.ip) {
                    return answer(slow_down(config));
                }
                answer(self.allocated(table.allocate(config, caller, None)));
            }
            MailboxOp::OfferService { service, proof } => {
                if let Err(reason) = check_service(config, caller, &service, &proof) {
                    return answer(refused(&reason));
                }
                if table.services.contains_key(&service) {
                    return answer(refused(&format!(
                        "P2P service `{service}` is offered by another client already; this one takes over when that one leaves"
                    )));
                }
                answer(self.allocated(table.allocate(config, caller, Some(service))));
            }
            MailboxOp::VisitService { service, proof } => {
                if let Err(reason) = check_service(config, caller, &service, &proof) {
                    return answer(refused(&reason));
                }
                let Some(&nameplate) = table.services.get(&service) else {
                    return answer(refused(&format!(
                        "nobody offers P2P service `{service}` right now: start `warren p2p listen --service {service}` on its side"
                    )));
                };
                if let Some(event) = table.claim_in_turn(config, caller, nameplate, self.udp_port) {
                    answer(event);
                }
            }
            MailboxOp::Claim { nameplate }
                if table
                    .plates
                    .get(&nameplate)
                    .is_some_and(|plate| plate.service.is_some()) =>
            {
                // A service's nameplate is reached by its name and token only; to a
                // guesser it looks like no code at all.
                if !table.within_rate(config, caller.ip) {
                    return answer(slow_down(config));
                }
                answer(refused(&no_such_code(nameplate)));
            }
            MailboxOp::Claim { nameplate } => {
                if let Some(event) = table.claim_in_turn(config, caller, nameplate, self.udp_port) {
                    answer(event);
                }
            }
            MailboxOp::Send { body } => {
                if let Err(reason) = table.send(caller.session, body) {
                    answer(refused(&reason));
                }
            }
            MailboxOp::Release { failed } => table.leave(caller.session, failed),
            // Takes nothing and names no one: not rate limited beyond the session's own.
            MailboxOp::Info => answer(MailboxEvent::Info {
                udp_port: self.udp_port,
                udp_alt_port: self.udp_alt_port,
            }),
        }
    }

    /// The answer to an allocation: the nameplate, or the table is full.
    fn allocated(&self, nameplate: Option<u32>) -> MailboxEvent {
        match nameplate {
            Some(nameplate) => MailboxEvent::Allocated {
                nameplate,
                udp_port: self.udp_port,
            },
            None => refused(TABLE_FULL),
        }
    }

    /// The session ended: its side leaves its nameplate.
    pub fn session_ended(&self, session: &SessionId) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leave(*session, false);
    }

    /// Nameplates open now.
    pub fn open(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .plates
            .len()
    }
}

/// Why `caller` may not offer or visit `service`, if it may not.
fn check_service(
    config: &P2pConfig,
    caller: &Caller<'_>,
    service: &str,
    proof: &[u8; 32],
) -> Result<(), String> {
    let Some(token) = config.services.get(service) else {
        return Err(format!(
            "this server has no P2P service `{service}`: its operator adds [server.p2p.services.{service}]"
        ));
    };
    if keys::verify_token_proof(token, caller.handshake_hash, service, proof) {
        Ok(())
    } else {
        Err(format!(
            "wrong token for P2P service `{service}`: use the token of [server.p2p.services.{service}]"
        ))
    }
}

fn no_such_code(nameplate: u32) -> String {
    format!(
        "no code starts with {nameplate} on this server: check the code, or ask the sender to run `warren send` again"
    )
}

fn refused(reason: &str) -> MailboxEvent {
    MailboxEvent::Refused {
        reason: reason.to_owned(),
    }
}

fn slow_down(config: &P2pConfig) -> MailboxEvent {
    refused(&format!(
        "too many codes asked for from this address (at most {} a minute); wait a minute",
        config.rate_per_minute
    ))
}

impl Table {
    /// Counts one allocation or claim of `ip`; `false` when over the limit.
    fn within_rate(&mut self, config: &P2pConfig, ip: IpAddr) -> bool {
        let now = Instant::now();
        let minute = std::time::Duration::from_secs(60);
        if self.rates.len() >= RATE_TABLE && !self.rates.contains_key(&ip) {
            self.rates
                .retain(|_, (start, _)| now.duration_since(*start) < minute);
            if self.rates.len() >= RATE_TABLE {
                return false;
            }
        }
        let (start, count) = self.rates.entry(ip).or_insert((now, 0));
        if now.duration_since(*start) >= minute {
            *start = now;
            *count = 0;
        }
        *count += 1;
        *count <= config.rate_per_minute
    }

    /// Frees nameplates whose receiver never came within the TTL, telling their senders.
    fn expire(&mut self, config: &P2pConfig, now: Instant) {
        let stale: Vec<u32> = self
            .plates
            .iter()
            .filter(|(_, p)| {
                p.receiver.is_none()
                    && p.service.is_none()
                    && now.duration_since(p.waiting_since) > config.nameplate_ttl
            })
            .map(|(n, _)| *n)
            .collect();
        for nameplate in stale {
            if let Some(plate) = self.plates.remove(&nameplate) {
                self.sessions.remove(&plate.sender.session);
                plate.sender.tell(refused(&format!(
                    "the code expired: nobody used it for {} s; run the command again for a new code",
                    config.nameplate_ttl.as_secs()
                )));
            }
        }
    }

    /// A fresh nameplate held by `caller`, standing for the named P2P `service` if any;
    /// `None` when the table is full.
    fn allocate(
        &mut self,
        config: &P2pConfig,
        caller: &Caller<'_>,
        service: Option<String>,
    ) -> Option<u32> {
        let max = usize::try_from(config.max_nameplates).unwrap_or(usize::MAX);
        if self.plates.len() >= max {
            return None;
        }
        // Short numbers, from a range at least four times the table's size so a free one
        // is found in a few draws; random, so the numbers say nothing about other users.
        let mut bound: u32 = 1000;
        while u64::from(bound) < 4 * u64::from(config.max_nameplates) && bound < 1_000_000_000 {
            bound *= 10;
        }
        let nameplate = (0..64)
            .map(|_| rand::random_range(1..bound))
            .find(|n| !self.plates.contains_key(n))?;
        self.plates.insert(
            nameplate,
            Plate {
                waiting_since: Instant::now(),
                sender: Member {
                    session: caller.session,
                    to: caller.to.clone(),
                },
                receiver: None,
                queued: VecDeque::new(),
                queued_bytes: 0,
                failures: 0,
                service: service.clone(),
            },
        );
        if let Some(service) = service {
            self.services.insert(service, nameplate);
        }
        self.sessions.insert(caller.session, (nameplate, true));
        Some(nameplate)
    }

    /// Claims `nameplate` for `caller` in turn; the answer when it did not go through.
    /// `Busy` is checked before the rate limit, so receivers waiting their turn at a
    /// sender with several do not spend their address's budget. All it tells a guesser is
    /// that a receiver is at a nameplate right now.
    fn claim_in_turn(
        &mut self,
        config: &P2pConfig,
        caller: &Caller<'_>,
        nameplate: u32,
        udp_port: Option<u16>,
    ) -> Option<MailboxEvent> {
        if self
            .plates
            .get(&nameplate)
            .is_some_and(|plate| plate.receiver.is_some())
        {
            return Some(MailboxEvent::Busy);
        }
        if !self.within_rate(config, caller.ip) {
            return Some(slow_down(config));
        }
        self.claim(nameplate, caller, udp_port)
            .err()
            .map(|reason| refused(&reason))
    }

    fn claim(
        &mut self,
        nameplate: u32,
        caller: &Caller<'_>,
        udp_port: Option<u16>,
    ) -> Result<(), String> {
        let Some(plate) = self.plates.get_mut(&nameplate) else {
            return Err(no_such_code(nameplate));
        };
        if plate.receiver.is_some() {
            return Err(format!(
                "code {nameplate}-… is in use by another receiver; wait for it to finish, or ask the sender for a new code"
            ));
        }
        let receiver = Member {
            session: caller.session,
            to: caller.to.clone(),
        };
        receiver.tell(MailboxEvent::Claimed { udp_port });
        for body in plate.queued.drain(..) {
            receiver.tell(MailboxEvent::Message { body });
        }
        plate.queued_bytes = 0;
        plate.sender.tell(MailboxEvent::PeerJoined);
        plate.receiver = Some(receiver);
        self.sessions.insert(caller.session, (nameplate, false));
        Ok(())
    }

    fn send(&mut self, session: SessionId, body: Vec<u8>) -> Result<(), String> {
        let Some(&(nameplate, is_sender)) = self.sessions.get(&session) else {
            return Err("allocate or claim a code before sending".to_owned());
        };
        let Some(plate) = self.plates.get_mut(&nameplate) else {
            return Err("the code is gone".to_owned());
        };
        let delivered = if is_sender {
            match &plate.receiver {
                Some(receiver) => receiver.tell(MailboxEvent::Message { body }),
                None => {
                    if plate.queued.len() >= QUEUE_MESSAGES
                        || plate.queued_bytes + body.len() > QUEUE_BYTES
                    {
                        return Err(format!(
                            "too much waiting for the receiver (at most {QUEUE_MESSAGES} messages)"
                        ));
                    }
                    plate.queued_bytes += body.len();
                    plate.queued.push_back(body);
                    true
                }
            }
        } else {
            plate.sender.tell(MailboxEvent::Message { body })
        };
        if !delivered {
            // The other side's control queue is full or gone: it is not reading.
            let other = if is_sender {
                plate.receiver.as_ref().map(|r| r.session)
            } else {
                Some(plate.sender.session)
            };
            if let Some(other) = other {
                self.leave(other, false);
            }
        }
        Ok(())
    }

    /// `session` leaves its nameplate (`failed`: its exchange failed).
    fn leave(&mut self, session: SessionId, failed: bool) {
        let Some((nameplate, is_sender)) = self.sessions.remove(&session) else {
            return;
        };
        let Some(plate) = self.plates.get_mut(&nameplate) else {
            return;
        };
        if failed {
            plate.failures = plate.failures.saturating_add(1);
        }
        let burns = plate.failures >= MAX_FAILURES && plate.service.is_none();
        if is_sender || burns {
            let Some(plate) = self.plates.remove(&nameplate) else {
                return;
            };
            if let Some(service) = &plate.service {
                self.services.remove(service);
            }
            let burned = burns;
            let event = || {
                if burned {
                    MailboxEvent::Burned
                } else {
                    MailboxEvent::PeerLeft
                }
            };
            for member in std::iter::once(&plate.sender).chain(plate.receiver.as_ref()) {
                if member.session != session {
                    self.sessions.remove(&member.session);
                    member.tell(event());
                } else if burned {
                    member.tell(event());
                }
            }
        } else {
            plate.receiver = None;
            plate.waiting_since = Instant::now();
            plate.sender.tell(MailboxEvent::PeerLeft);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> P2pConfig {
        P2pConfig {
            rate_per_minute: 1000,
            ..P2pConfig::default()
        }
    }

    struct Side {
        id: SessionId,
        tx: mpsc::Sender<ControlMessage>,
        rx: mpsc::Receiver<ControlMessage>,
    }

    fn side(n: u8) -> Side {
        let (tx, rx) = mpsc::channel(64);
        Side {
            id: [n; 16],
            tx,
            rx,
        }
    }

    impl Side {
        fn caller(&self) -> Caller<'_> {
            Caller {
                session: self.id,
                ip: IpAddr::from([192, 0, 2, 1]),
                to: &self.tx,
                handshake_hash: &HASH,
            }
        }

        fn events(&mut self) -> Vec<MailboxEvent> {
            let mut events = Vec::new();
            while let Ok(message) = self.rx.try_recv() {
                match message {
                    ControlMessage::MailboxEvent { event } => events.push(event),
                    other => panic!("not a mailbox event: {other:?}"),
                }
            }
            events
        }
    }

    /// Every test session's handshake hash.
    const HASH: [u8; 32] = [9; 32];

    fn allocate(mailbox: &Mailbox, sender: &mut Side) -> u32 {
        mailbox.handle(Some(&config()), &sender.caller(), MailboxOp::Allocate);
        match sender.events().as_slice() {
            [MailboxEvent::Allocated { nameplate, .. }] => *nameplate,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn two_sides_meet_and_messages_pass_both_ways_even_before_the_receiver_came() {
        let mailbox = Mailbox::default();
        let (mut sender, mut receiver) = (side(1), side(2));
        let nameplate = allocate(&mailbox, &mut sender);
        assert!((1..10_000).contains(&nameplate));
        let send = |side: &Side, body: &[u8]| {
            mailbox.handle(
                Some(&config()),
                &side.caller(),
                MailboxOp::Send {
                    body: body.to_vec(),
                },
            );
        };
        send(&sender, b"early");
        mailbox.handle(
            Some(&config()),
            &receiver.caller(),
            MailboxOp::Claim { nameplate },
        );
        assert_eq!(
            receiver.events(),
            [
                MailboxEvent::Claimed { udp_port: None },
                MailboxEvent::Message {
                    body: b"early".to_vec()
                }
            ]
        );
        assert_eq!(sender.events(), [MailboxEvent::PeerJoined]);
        send(&receiver, b"back");
        send(&sender, b"forth");
        assert_eq!(
            sender.events(),
            [MailboxEvent::Message {
                body: b"back".to_vec()
            }]
        );
        assert_eq!(
            receiver.events(),
            [MailboxEvent::Message {
                body: b"forth".to_vec()
            }]
        );
        // The sender's session ends: the receiver hears, the nameplate is free.
        mailbox.session_ended(&sender.id);
        assert_eq!(receiver.events(), [MailboxEvent::PeerLeft]);
        assert_eq!(mailbox.open(), 0);
    }

    #[tokio::test]
    async fn unknown_nameplates_are_refused_busy_ones_say_so_and_failures_burn_one() {
        let mailbox = Mailbox::default();
        let mut sender = side(1);
        let nameplate = allocate(&mailbox, &mut sender);
        let mut stranger = side(9);
        mailbox.handle(
            Some(&config()),
            &stranger.caller(),
            MailboxOp::Claim {
                nameplate: nameplate.wrapping_add(1),
            },
        );
        assert!(
            matches!(&stranger.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("no code"))
        );
        let mut first = side(2);
        mailbox.handle(
            Some(&config()),
            &first.caller(),
            MailboxOp::Claim { nameplate },
        );
        assert_eq!(first.events(), [MailboxEvent::Claimed { udp_port: None }]);
        mailbox.handle(
            Some(&config()),
            &stranger.caller(),
            MailboxOp::Claim { nameplate },
        );
        // A busy nameplate says so (the receiver claims again shortly), without spending
        // the rate limit.
        assert_eq!(stranger.events(), [MailboxEvent::Busy]);
        sender.events();
        // Three receivers fail the exchange in turn: the third burns the nameplate.
        mailbox.handle(
            Some(&config()),
            &first.caller(),
            MailboxOp::Release { failed: true },
        );
        for n in 1..MAX_FAILURES {
            let mut guesser = side(20 + n);
            mailbox.handle(
                Some(&config()),
                &guesser.caller(),
                MailboxOp::Claim { nameplate },
            );
            assert_eq!(guesser.events(), [MailboxEvent::Claimed { udp_port: None }]);
            mailbox.handle(
                Some(&config()),
                &guesser.caller(),
                MailboxOp::Release { failed: true },
            );
        }
        let heard = sender.events();
        assert_eq!(heard.last(), Some(&MailboxEvent::Burned), "{heard:?}");
        assert_eq!(mailbox.open(), 0);
    }

    #[tokio::test]
    async fn without_the_section_everything_is_refused_and_rates_and_sizes_are_bounded() {
        let mailbox = Mailbox::default();
        let mut sender = side(1);
        mailbox.handle(None, &sender.caller(), MailboxOp::Allocate);
        assert!(
            matches!(&sender.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("[server.p2p]"))
        );

        let strict = P2pConfig {
            rate_per_minute: 2,
            max_nameplates: 2,
            ..P2pConfig::default()
        };
        let mut sides: Vec<Side> = (1..=3).map(side).collect();
        for side in &mut sides {
            mailbox.handle(Some(&strict), &side.caller(), MailboxOp::Allocate);
        }
        let third = sides[2].events();
        assert!(
            matches!(&third[..], [MailboxEvent::Refused { reason }] if reason.contains("a minute")),
            "{third:?}"
        );

        let roomy = P2pConfig {
            max_nameplates: 2,
            ..config()
        };
        let mut fourth = side(4);
        mailbox.handle(Some(&roomy), &fourth.caller(), MailboxOp::Allocate);
        assert!(
            matches!(&fourth.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("max_nameplates"))
        );

        // A sender cannot pile up messages for a receiver that never comes.
        let sender = &sides[0];
        for _ in 0..QUEUE_MESSAGES {
            mailbox.handle(
                Some(&roomy),
                &sender.caller(),
                MailboxOp::Send { body: vec![0; 8] },
            );
        }
        mailbox.handle(
            Some(&roomy),
            &sender.caller(),
            MailboxOp::Send { body: vec![0; 8] },
        );
        let mut sender = sides.remove(0);
        let events = sender.events();
        assert!(
            matches!(events.last(), Some(MailboxEvent::Refused { reason }) if reason.contains("waiting")),
            "{events:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_nameplate_nobody_claims_expires() {
        let mailbox = Mailbox::default();
        let mut sender = side(1);
        let _ = allocate(&mailbox, &mut sender);
        tokio::time::advance(config().nameplate_ttl + std::time::Duration::from_secs(1)).await;
        let mut other = side(2);
        mailbox.handle(Some(&config()), &other.caller(), MailboxOp::Allocate);
        assert!(
            matches!(&sender.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("expired"))
        );
        assert!(matches!(
            &other.events()[..],
            [MailboxEvent::Allocated { .. }]
        ));
        assert_eq!(mailbox.open(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_nameplate_in_use_waits_its_ttl_again_from_the_last_receivers_leaving() {
        let mailbox = Mailbox::default();
        let (mut sender, receiver) = (side(1), side(2));
        let nameplate = allocate(&mailbox, &mut sender);
        let ttl = config().nameplate_ttl;
        tokio::time::advance(ttl / 2).await;
        mailbox.handle(
            Some(&config()),
            &receiver.caller(),
            MailboxOp::Claim { nameplate },
        );
        mailbox.handle(
            Some(&config()),
            &receiver.caller(),
            MailboxOp::Release { failed: false },
        );
        // Older than the TTL since its allocation, but not since the receiver left.
        tokio::time::advance(ttl / 2 + std::time::Duration::from_secs(10)).await;
        let other = side(3);
        mailbox.handle(Some(&config()), &other.caller(), MailboxOp::Allocate);
        assert_eq!(mailbox.open(), 2, "{:?}", sender.events());
        tokio::time::advance(ttl).await;
        mailbox.handle(Some(&config()), &other.caller(), MailboxOp::Allocate);
        assert!(
            sender.events().iter().any(
                |e| matches!(e, MailboxEvent::Refused { reason } if reason.contains("expired"))
            )
        );
    }

    fn with_service() -> P2pConfig {
        let mut config = config();
        config.services.insert(
            "ssh".into(),
            crate::crypto::secret::Secret::new("ssh-token-0123456789"),
        );
        config
    }

    fn proof(token: &str, service: &str) -> [u8; 32] {
        keys::token_proof(&crate::crypto::secret::Secret::new(token), &HASH, service)
    }

    #[tokio::test(start_paused = true)]
    async fn a_named_service_is_reached_by_name_and_token_only_and_never_expires_or_burns() {
        let mailbox = Mailbox::default();
        let config = with_service();
        let (mut offer, mut visitor, mut guesser) = (side(1), side(2), side(3));
        let op = |service: &str, token: &str, visit: bool| {
            let (service, proof) = (service.to_owned(), proof(token, service));
            if visit {
                MailboxOp::VisitService { service, proof }
            } else {
                MailboxOp::OfferService { service, proof }
            }
        };
        // A wrong token, an unknown service: refused, naming what to fix.
        mailbox.handle(
            Some(&config),
            &offer.caller(),
            op("ssh", "not-the-token", false),
        );
        mailbox.handle(
            Some(&config),
            &offer.caller(),
            op("web", "ssh-token-0123456789", false),
        );
        let events = offer.events();
        assert!(
            matches!(&events[0], MailboxEvent::Refused { reason } if reason.contains("wrong token")),
            "{events:?}"
        );
        assert!(
            matches!(&events[1], MailboxEvent::Refused { reason } if reason.contains("no P2P service `web`")),
            "{events:?}"
        );
        mailbox.handle(
            Some(&config),
            &offer.caller(),
            op("ssh", "ssh-token-0123456789", false),
        );
        let nameplate = match offer.events().as_slice() {
            [MailboxEvent::Allocated { nameplate, .. }] => *nameplate,
            other => panic!("{other:?}"),
        };
        // Its number is no way in.
        mailbox.handle(
            Some(&config),
            &guesser.caller(),
            MailboxOp::Claim { nameplate },
        );
        assert!(
            matches!(&guesser.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("no code starts with"))
        );
        // Nor is the name without the token.
        mailbox.handle(
            Some(&config),
            &guesser.caller(),
            op("ssh", "guess-0123456789", true),
        );
        assert!(
            matches!(&guesser.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("wrong token"))
        );
        // Long past the TTL, and after more failed exchanges than burn a code, a visitor
        // with the token still gets in.
        tokio::time::advance(config.nameplate_ttl * 3).await;
        for _ in 0..MAX_FAILURES + 1 {
            mailbox.handle(
                Some(&config),
                &visitor.caller(),
                op("ssh", "ssh-token-0123456789", true),
            );
            assert!(matches!(
                visitor.events().first(),
                Some(MailboxEvent::Claimed { .. })
            ));
            mailbox.handle(
                Some(&config),
                &visitor.caller(),
                MailboxOp::Release { failed: true },
            );
        }
        mailbox.handle(
            Some(&config),
            &visitor.caller(),
            op("ssh", "ssh-token-0123456789", true),
        );
        assert!(matches!(
            visitor.events().first(),
            Some(MailboxEvent::Claimed { .. })
        ));
        // A second offer waits for the first to leave; then the name is free again.
        let mut second = side(4);
        mailbox.handle(
            Some(&config),
            &second.caller(),
            op("ssh", "ssh-token-0123456789", false),
        );
        assert!(
            matches!(&second.events()[..], [MailboxEvent::Refused { reason }] if reason.contains("offered by another client"))
        );
        mailbox.session_ended(&offer.id);
        mailbox.handle(
            Some(&config),
            &second.caller(),
            op("ssh", "ssh-token-0123456789", false),
        );
        assert!(matches!(
            &second.events()[..],
            [MailboxEvent::Allocated { .. }]
        ));
    }
}
