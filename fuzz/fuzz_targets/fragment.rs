//! UDP-service datagram frames and their reassembly: arbitrary datagrams, clock advances and
//! split/reassemble round trips, interleaved. Invariants: decoding never panics and an
//! accepted frame re-encodes to the same bytes; the reassembler never holds more packets or
//! bytes than its limits, whatever arrives; a payload split for any workable datagram size
//! comes back intact in any arrival order, and every frame fits the size.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use warren_proto::fragment::{
    self, FlowKey, Fragmenter, MAX_PAYLOAD, Reassembler, ReassemblyLimits,
};

#[derive(Debug, Arbitrary)]
enum Op {
    /// Bytes as a received QUIC datagram.
    Datagram(Vec<u8>),
    /// A well-formed fragment with arbitrary fields (reaches the tables more often than
    /// random bytes do).
    Fragment {
        channel: u8,
        flow: u8,
        packet_id: u8,
        index: u8,
        count: u8,
        len: u16,
    },
    /// Time passes, then the timeout is handled.
    Advance(u16),
    /// Split a payload and reassemble it in a rotated order on a fresh reassembler.
    RoundTrip {
        channel: u32,
        flow: u32,
        len: u16,
        max: u16,
        rotate: u8,
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    max_packets: u8,
    max_kib: u8,
    max_age_ms: u16,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let limits = ReassemblyLimits {
        max_packets: usize::from(input.max_packets),
        max_bytes: usize::from(input.max_kib) * 1024,
        max_age: Duration::from_millis(u64::from(input.max_age_ms)),
    };
    let mut reassembler = Reassembler::new(limits);
    let mut now = Instant::now();
    let mut frame = Vec::new();
    for op in input.ops.into_iter().take(512) {
        match op {
            Op::Datagram(bytes) => {
                if let Ok(decoded) = fragment::decode(&bytes) {
                    fragment::encode(&decoded, &mut frame);
                    assert_eq!(frame, bytes, "frames have one encoding");
                }
                let _ = reassembler.handle_datagram(now, &bytes);
            }
            Op::Fragment {
                channel,
                flow,
                packet_id,
                index,
                count,
                len,
            } => {
                let payload = vec![0xa5; usize::from(len)];
                let decoded = fragment::Frame::Fragment {
                    key: FlowKey {
                        channel: u32::from(channel % 4),
                        flow: u32::from(flow % 4),
                    },
                    packet_id: u32::from(packet_id % 8),
                    index,
                    count,
                    payload: &payload,
                };
                fragment::encode(&decoded, &mut frame);
                if let Some(delivery) = reassembler.handle_datagram(now, &frame) {
                    assert!(delivery.payload.len() <= MAX_PAYLOAD);
                }
            }
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                reassembler.handle_timeout(now);
                if let Some(at) = reassembler.poll_timeout() {
                    assert!(at > now, "nothing held is already expired");
                }
            }
            Op::RoundTrip {
                channel,
                flow,
                len,
                max,
                rotate,
            } => {
                let key = FlowKey { channel, flow };
                let payload: Vec<u8> = (0..usize::from(len)).map(|i| i as u8).collect();
                let max = usize::from(max);
                let Ok(frames) = Fragmenter::new(u32::from(rotate)).split(key, &payload, Some(max))
                else {
                    continue;
                };
                let mut frames: Vec<Vec<u8>> = frames.collect();
                assert!(frames.iter().all(|f| f.len() <= max), "frames fit");
                let turn = usize::from(rotate) % frames.len();
                frames.rotate_left(turn);
                let mut fresh = Reassembler::new(ReassemblyLimits::default());
                let delivered: Vec<Vec<u8>> = frames
                    .iter()
                    .filter_map(|f| fresh.handle_datagram(now, f))
                    .map(|d| {
                        assert_eq!(d.key, key);
                        d.payload.into_owned()
                    })
                    .collect();
                assert_eq!(delivered, vec![payload], "round trip");
                assert_eq!(fresh.packets_held(), 0);
            }
        }
        assert!(reassembler.packets_held() <= limits.max_packets.max(1));
        assert!(reassembler.bytes_held() <= limits.max_bytes);
    }
});
