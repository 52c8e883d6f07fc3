//! Arbitrary operation sequences against the session state machines (quinn-style): the
//! heartbeat and the reconnect backoff on a virtual clock, interleaved with control
//! message round trips. Invariants: backoff delays stay in `[cap/2, cap]` and never exceed
//! the max; the heartbeat never asks for anything before its `poll_timeout`, declares the
//! peer dead exactly when a ping has waited unanswered for its dead deadline (which stays
//! within its floor and the configured timeout, and never below the suspect deadline), and
//! a dead peer stays dead; every message round trips.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use warren_proto::liveness::{Backoff, Heartbeat, HeartbeatAction, HeartbeatConfig, PeerState};
use warren_proto::message::{self, ClaimKind, ControlMessage, ServiceClaim, Verdict};

#[derive(Debug, Arbitrary)]
enum Op {
    Advance(u16),
    Receive,
    Pong(u64),
    Busy(bool),
    Timeout,
    NextDelay(u64),
    ResetBackoff,
    Ping(u64),
    NeedChannels(u16),
    Hello(Vec<(String, [u8; 32])>),
    Reply(Vec<bool>),
    Goodbye(String),
}

#[derive(Debug, Arbitrary)]
struct Input {
    interval_ms: u16,
    timeout_ms: u16,
    initial_ms: u16,
    max_ms: u16,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let start = Instant::now();
    let mut now = start;
    let interval = Duration::from_millis(u64::from(input.interval_ms.max(1)));
    let timeout = Duration::from_millis(u64::from(input.timeout_ms.max(1)));
    let config = HeartbeatConfig::new(interval, timeout);
    let mut heartbeat = Heartbeat::new(now, config);
    // When the first ping nothing has answered yet left.
    let mut unanswered_since: Option<Instant> = None;
    let mut dead = false;
    let initial = Duration::from_millis(u64::from(input.initial_ms));
    let max = Duration::from_millis(u64::from(input.max_ms)).max(initial);
    let mut backoff = Backoff::new(initial, max);
    let mut attempt: u32 = 0;
    for op in input.ops.into_iter().take(256) {
        match op {
            Op::Advance(ms) => now += Duration::from_millis(u64::from(ms)),
            Op::Receive => {
                heartbeat.on_received(now);
                unanswered_since = None;
            }
            Op::Pong(seq) => {
                heartbeat.on_received(now);
                heartbeat.on_pong(now, seq);
                unanswered_since = None;
            }
            Op::Busy(busy) => heartbeat.set_busy(now, busy),
            Op::Timeout => {
                let due = heartbeat.poll_timeout();
                let dead_after = heartbeat.dead_after();
                assert!(dead_after <= timeout, "{dead_after:?} past the timeout");
                assert!(dead_after >= config.min_dead.min(timeout));
                assert!(heartbeat.suspect_after() <= dead_after);
                let action = heartbeat.handle_timeout(now);
                if now < due {
                    assert_eq!(action, None, "acted before poll_timeout");
                }
                let due_dead = unanswered_since.is_some_and(|since| now >= since + dead_after);
                dead = dead || due_dead;
                assert_eq!(action == Some(HeartbeatAction::PeerDead), dead);
                if let Some(HeartbeatAction::SendPing { .. }) = action {
                    unanswered_since.get_or_insert(now);
                }
                if dead {
                    assert_eq!(heartbeat.state(now), PeerState::Dead);
                }
            }
            Op::NextDelay(random) => {
                let delay = backoff.next_delay(random);
                let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
                let cap = initial.saturating_mul(factor).min(max);
                assert!(
                    delay <= cap && delay >= cap / 2,
                    "{delay:?} outside [{cap:?}/2, {cap:?}]"
                );
                assert!(delay <= max);
                attempt = attempt.saturating_add(1);
            }
            Op::ResetBackoff => {
                backoff.reset();
                attempt = 0;
            }
            Op::Ping(seq) => round_trip(ControlMessage::Ping { seq }),
            Op::NeedChannels(count) => round_trip(ControlMessage::NeedChannels { count }),
            Op::Hello(claims) => round_trip(ControlMessage::Hello {
                services: claims
                    .into_iter()
                    .map(|(name, proof)| ServiceClaim {
                        name,
                        proof,
                        kind: ClaimKind::Reverse,
                    })
                    .collect(),
            }),
            Op::Reply(verdicts) => round_trip(ControlMessage::HelloReply {
                verdicts: verdicts
                    .into_iter()
                    .map(|ok| {
                        if ok {
                            Verdict::Accepted { bound: None }
                        } else {
                            Verdict::Refused
                        }
                    })
                    .collect(),
            }),
            Op::Goodbye(reason) => round_trip(ControlMessage::Goodbye { reason }),
        }
    }
});

/// Encodes; decoding gives the message back unless it breaks a documented cap.
fn round_trip(original: ControlMessage) {
    let bytes = message::encode(&original);
    match message::decode_control(&bytes) {
        Ok(decoded) => assert_eq!(decoded, original),
        Err(message::DecodeError::TooLarge { .. } | message::DecodeError::FieldTooLong { .. }) => {}
        Err(other) => panic!("our own encoding did not decode: {other}"),
    }
}
