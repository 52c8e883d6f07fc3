//! UDP-service datagrams over QUIC datagrams: the frame format, splitting a visitor's
//! datagram into frames that fit, and putting fragmented ones back together.
//!
//! A QUIC datagram can carry at most `max_datagram_size()` bytes (about 1,400 on an
//! internet path), while a UDP service may send up to 65,507. Most datagrams (DNS, games,
//! WireGuard, `iperf3 -l 1400`) fit, so they travel whole behind a header of 3–5 bytes;
//! larger ones are split into fragments that are reassembled at the far end, and lost if
//! any fragment is lost (as IP fragmentation behaves).
//!
//! # Wire format
//!
//! Integers are QUIC variable-length integers (RFC 9000 §16) in their shortest form, limited
//! to `u32`; a longer-than-necessary encoding is malformed, so every frame has exactly one
//! encoding.
//!
//! ```text
//! whole:    0x00  channel(varint)  flow(varint)  payload...
//! fragment: 0x01  channel(varint)  flow(varint)  packet_id(varint)  index(u8)  count(u8)  payload...
//! ```
//!
//! * `channel`: which UDP service channel of the session (the session assigns them).
//! * `flow`: which visitor of that channel (the relay's flow table assigns them).
//! * `packet_id`: numbers the fragmented packets of a sender ([`Fragmenter`] counts them).
//! * `index` < `count`, 2 ≤ `count` ≤ [`MAX_FRAGMENTS`]; every fragment but the last
//!   carries at least one byte, and fragments of one packet agree on `count`.
//!
//! # Reassembly
//!
//! [`Reassembler`] keeps partial packets keyed by (channel, flow, packet id), so flows never
//! mix, within caps on the packets held, the bytes held and their age; `now` comes from the
//! caller (no clock here). When a cap is reached the oldest partial packet is dropped.
//! Every drop is counted ([`ReassemblyStats`]).
//!
//! ```text
//! sender:   Fragmenter::split(key, payload, connection.max_datagram_size()) -> frames
//! receiver: Reassembler::handle_datagram(now, frame) -> Some(Delivery) when complete
//!           Reassembler::handle_timeout(now) at poll_timeout()
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The largest UDP payload Warren carries (Linux's limit for one IPv4 UDP datagram).
pub const MAX_PAYLOAD: usize = 65_507;

/// The most fragments one packet may be split into (`count` is one byte).
pub const MAX_FRAGMENTS: usize = 255;

/// Frame type of a whole datagram.
const KIND_WHOLE: u8 = 0x00;
/// Frame type of a fragment.
const KIND_FRAGMENT: u8 = 0x01;

/// The longest header of either kind: kind, three 8-byte varints, index, count.
pub const MAX_HEADER_LEN: usize = 1 + 8 + 8 + 8 + 2;

/// Which UDP service channel and which visitor a datagram belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowKey {
    /// The UDP service channel of the session.
    pub channel: u32,
    /// The visitor within the channel.
    pub flow: u32,
}

/// One decoded frame, borrowing its payload from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole visitor datagram.
    Whole {
        /// Channel and flow.
        key: FlowKey,
        /// The visitor's datagram.
        payload: &'a [u8],
    },
    /// One fragment of a larger visitor datagram.
    Fragment {
        /// Channel and flow.
        key: FlowKey,
        /// Which packet of the sender this belongs to.
        packet_id: u32,
        /// Position of this fragment, `0..count`.
        index: u8,
        /// How many fragments the packet has, 2 or more.
        count: u8,
        /// This fragment's bytes.
        payload: &'a [u8],
    },
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The datagram ends inside the header.
    #[error("datagram frame truncated: {len} bytes end inside the header")]
    Truncated {
        /// The datagram's length.
        len: usize,
    },
    /// The first byte is not a known frame type.
    #[error("unknown datagram frame type {kind:#04x}")]
    UnknownKind {
        /// The byte.
        kind: u8,
    },
    /// A varint is longer than needed or above `u32::MAX`.
    #[error("datagram frame integer is not in its shortest form or exceeds 32 bits")]
    BadInteger,
    /// `index`/`count` are inconsistent (`count` < 2 or `index` ≥ `count`).
    #[error("datagram fragment {index} of {count} is impossible")]
    BadFragmentIndex {
        /// The index.
        index: u8,
        /// The count.
        count: u8,
    },
    /// A fragment other than the last carries no byte.
    #[error("datagram fragment {index} of {count} is empty")]
    EmptyFragment {
        /// The index.
        index: u8,
        /// The count.
        count: u8,
    },
    /// The payload is larger than [`MAX_PAYLOAD`].
    #[error("datagram payload of {len} bytes exceeds {max}")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
}

/// Why a payload cannot be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SplitError {
    /// The payload is larger than [`MAX_PAYLOAD`]: no UDP datagram is that large.
    #[error("UDP datagram of {len} bytes exceeds the {max}-byte maximum")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// The path's datagrams are too small to carry this payload in [`MAX_FRAGMENTS`]
    /// fragments (or to carry a header at all); `None` means the peer does not accept QUIC
    /// datagrams.
    #[error(
        "QUIC datagrams of at most {max_datagram_size:?} bytes cannot carry a {len}-byte UDP datagram"
    )]
    DatagramTooSmall {
        /// The payload's length.
        len: usize,
        /// The size limit given.
        max_datagram_size: Option<usize>,
    },
}

/// Encodes a whole datagram frame into `out` (cleared first).
///
/// # Errors
///
/// [`SplitError::TooLarge`] for a payload over [`MAX_PAYLOAD`].
pub fn encode_whole(key: FlowKey, payload: &[u8], out: &mut Vec<u8>) -> Result<(), SplitError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(SplitError::TooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD,
        });
    }
    out.clear();
    out.reserve(whole_header_len(key) + payload.len());
    out.push(KIND_WHOLE);
    put_varint(out, key.channel);
    put_varint(out, key.flow);
    out.extend_from_slice(payload);
    Ok(())
}

/// Encodes any frame into `out` (cleared first), exactly as it decodes.
pub fn encode(frame: &Frame<'_>, out: &mut Vec<u8>) {
    out.clear();
    match *frame {
        Frame::Whole { key, payload } => {
            out.push(KIND_WHOLE);
            put_varint(out, key.channel);
            put_varint(out, key.flow);
            out.extend_from_slice(payload);
        }
        Frame::Fragment {
            key,
            packet_id,
            index,
            count,
            payload,
        } => {
            out.push(KIND_FRAGMENT);
            put_varint(out, key.channel);
            put_varint(out, key.flow);
            put_varint(out, packet_id);
            out.push(index);
            out.push(count);
            out.extend_from_slice(payload);
        }
    }
}

/// Decodes one frame. Never panics and never allocates.
///
/// # Errors
///
/// A [`DecodeError`] saying what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let truncated = DecodeError::Truncated { len: bytes.len() };
    let (&kind, mut rest) = bytes.split_first().ok_or(truncated)?;
    if kind != KIND_WHOLE && kind != KIND_FRAGMENT {
        return Err(DecodeError::UnknownKind { kind });
    }
    let channel = take_varint(&mut rest, truncated)?;
    let flow = take_varint(&mut rest, truncated)?;
    let key = FlowKey { channel, flow };
    if kind == KIND_WHOLE {
        if rest.len() > MAX_PAYLOAD {
            return Err(DecodeError::TooLarge {
                len: rest.len(),
                max: MAX_PAYLOAD,
            });
        }
        return Ok(Frame::Whole { key, payload: rest });
    }
    let packet_id = take_varint(&mut rest, truncated)?;
    let [index, count, payload @ ..] = rest else {
        return Err(truncated);
    };
    let (index, count) = (*index, *count);
    if count < 2 || index >= count {
        return Err(DecodeError::BadFragmentIndex { index, count });
    }
    if payload.is_empty() && index + 1 < count {
        return Err(DecodeError::EmptyFragment { index, count });
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(DecodeError::TooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD,
        });
    }
    Ok(Frame::Fragment {
        key,
        packet_id,
        index,
        count,
        payload,
    })
}

/// Splits visitor datagrams into frames; numbers the fragmented ones. One per sending
/// session: packet ids are unique per sender, so they are unique per (channel, flow) too.
#[derive(Debug, Clone, Default)]
pub struct Fragmenter {
    next_packet_id: u32,
}

impl Fragmenter {
    /// A fragmenter whose first packet id is `first_packet_id` (any value; ids wrap).
    pub fn new(first_packet_id: u32) -> Self {
        Fragmenter {
            next_packet_id: first_packet_id,
        }
    }

    /// The frames carrying `payload` in datagrams of at most `max_datagram_size` bytes
    /// (QUIC's current `max_datagram_size()`): one whole frame when it fits (the common
    /// case), else 2 to [`MAX_FRAGMENTS`] fragments of nearly equal size.
    ///
    /// # Errors
    ///
    /// [`SplitError::TooLarge`] above [`MAX_PAYLOAD`];
    /// [`SplitError::DatagramTooSmall`] if even [`MAX_FRAGMENTS`] fragments cannot carry it,
    /// or `max_datagram_size` is `None` (the peer takes no datagrams).
    pub fn split<'a>(
        &mut self,
        key: FlowKey,
        payload: &'a [u8],
        max_datagram_size: Option<usize>,
    ) -> Result<Fragments<'a>, SplitError> {
        let len = payload.len();
        if len > MAX_PAYLOAD {
            return Err(SplitError::TooLarge {
                len,
                max: MAX_PAYLOAD,
            });
        }
        let too_small = SplitError::DatagramTooSmall {
            len,
            max_datagram_size,
        };
        let max = max_datagram_size.ok_or(too_small)?;
        if whole_header_len(key) + len <= max {
            return Ok(Fragments {
                key,
                payload,
                packet_id: 0,
                count: 1,
                next: 0,
            });
        }
        let packet_id = self.next_packet_id;
        let room = max
            .checked_sub(fragment_header_len(key, packet_id))
            .filter(|&room| room > 0)
            .ok_or(too_small)?;
        let count = len.div_ceil(room);
        if count > MAX_FRAGMENTS {
            return Err(too_small);
        }
        self.next_packet_id = packet_id.wrapping_add(1);
        Ok(Fragments {
            key,
            payload,
            packet_id,
            // Invariant: 2 <= count <= MAX_FRAGMENTS (255), checked above; `len > room`
            // because the whole frame did not fit and its header is the shorter one.
            count: count as u8,
            next: 0,
        })
    }
}

/// The frames of one visitor datagram, in order; each is a fresh, exactly sized buffer
/// ready to hand to QUIC (`Bytes::from(vec)` takes it without copying).
#[derive(Debug, Clone)]
pub struct Fragments<'a> {
    key: FlowKey,
    payload: &'a [u8],
    packet_id: u32,
    count: u8,
    next: u8,
}

impl Fragments<'_> {
    /// How many frames: 1 for a whole datagram.
    pub fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// The byte range of fragment `index`: sizes differ by at most one byte, larger first.
    fn range(&self, index: u8) -> (usize, usize) {
        let count = usize::from(self.count);
        let index = usize::from(index);
        let base = self.payload.len() / count;
        let extra = self.payload.len() % count;
        let start = index * base + index.min(extra);
        let len = base + usize::from(index < extra);
        (start, start + len)
    }
}

impl Iterator for Fragments<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.next >= self.count {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let mut out = Vec::new();
        if self.count == 1 {
            encode(
                &Frame::Whole {
                    key: self.key,
                    payload: self.payload,
                },
                &mut out,
            );
        } else {
            let (start, end) = self.range(index);
            out.reserve_exact(fragment_header_len(self.key, self.packet_id) + end - start);
            encode(
                &Frame::Fragment {
                    key: self.key,
                    packet_id: self.packet_id,
                    index,
                    count: self.count,
                    payload: &self.payload[start..end],
                },
                &mut out,
            );
        }
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::from(self.count - self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Fragments<'_> {}

/// Bounds on what a [`Reassembler`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReassemblyLimits {
    /// Partial packets held at once, over all flows. Default 256.
    pub max_packets: usize,
    /// Fragment bytes held at once, over all flows. Default 4 MiB.
    pub max_bytes: usize,
    /// How long a partial packet waits for its missing fragments. Default 2 s: QUIC
    /// datagrams are never retransmitted, so a fragment that is late by more than a few
    /// round trips is lost.
    pub max_age: Duration,
}

impl Default for ReassemblyLimits {
    fn default() -> Self {
        ReassemblyLimits {
            max_packets: 256,
            max_bytes: 4 * 1024 * 1024,
            max_age: Duration::from_secs(2),
        }
    }
}

/// What a [`Reassembler`] has delivered and dropped since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReassemblyStats {
    /// Datagrams that arrived whole.
    pub whole: u64,
    /// Datagrams put back together from fragments.
    pub reassembled: u64,
    /// Partial packets dropped because a fragment did not arrive within `max_age`.
    pub expired: u64,
    /// Partial packets dropped, or fragments refused, to stay within `max_packets` /
    /// `max_bytes`.
    pub over_cap: u64,
    /// Datagrams that did not decode, or contradicted earlier fragments of their packet
    /// (which is then dropped too).
    pub malformed: u64,
    /// Fragments received a second time (ignored).
    pub duplicate: u64,
}

impl ReassemblyStats {
    /// Visitor datagrams lost in reassembly: expired plus dropped over a cap.
    pub fn incomplete(&self) -> u64 {
        self.expired + self.over_cap
    }
}

/// A visitor datagram ready for its flow: borrowed when it arrived whole, owned when it was
/// reassembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// Channel and flow.
    pub key: FlowKey,
    /// The visitor's datagram.
    pub payload: Cow<'a, [u8]>,
}

/// A packet waiting for fragments.
#[derive(Debug)]
struct Partial {
    /// Insertion number: the key of this packet in `Reassembler::order`.
    seq: u64,
    first_seen: Instant,
    count: u8,
    received: u8,
    bytes: usize,
    /// One slot per fragment; `None` until it arrives.
    fragments: Vec<Option<Vec<u8>>>,
}

/// Puts fragmented datagrams back together, within [`ReassemblyLimits`].
///
/// Call order: [`Reassembler::handle_datagram`] (or [`Reassembler::handle_frame`]) for each
/// QUIC datagram received, and [`Reassembler::handle_timeout`] once
/// [`Reassembler::poll_timeout`] has passed; `now` must not go backwards. Tables are
/// ordered maps, so a peer cannot pick keys that collide.
#[derive(Debug)]
pub struct Reassembler {
    limits: ReassemblyLimits,
    partials: BTreeMap<(FlowKey, u32), Partial>,
    /// Partial packets by age (insertion order), for expiry and eviction of the oldest.
    order: BTreeMap<u64, (FlowKey, u32)>,
    next_seq: u64,
    bytes_held: usize,
    stats: ReassemblyStats,
}

impl Reassembler {
    /// An empty reassembler with these limits.
    pub fn new(limits: ReassemblyLimits) -> Self {
        Reassembler {
            limits,
            partials: BTreeMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes_held: 0,
            stats: ReassemblyStats::default(),
        }
    }

    /// Decodes a QUIC datagram and feeds it in. A malformed one is counted and dropped.
    pub fn handle_datagram<'a>(&mut self, now: Instant, bytes: &'a [u8]) -> Option<Delivery<'a>> {
        match decode(bytes) {
            Ok(frame) => self.handle_frame(now, frame),
            Err(_) => {
                self.stats.malformed += 1;
                None
            }
        }
    }

    /// Feeds a decoded frame in; returns the visitor datagram it completes, if any.
    pub fn handle_frame<'a>(&mut self, now: Instant, frame: Frame<'a>) -> Option<Delivery<'a>> {
        self.handle_timeout(now);
        match frame {
            Frame::Whole { key, payload } => {
                self.stats.whole += 1;
                Some(Delivery {
                    key,
                    payload: Cow::Borrowed(payload),
                })
            }
            Frame::Fragment {
                key,
                packet_id,
                index,
                count,
                payload,
            } => self.handle_fragment(now, key, packet_id, index, count, payload),
        }
    }

    fn handle_fragment<'a>(
        &mut self,
        now: Instant,
        key: FlowKey,
        packet_id: u32,
        index: u8,
        count: u8,
        payload: &[u8],
    ) -> Option<Delivery<'a>> {
        let id = (key, packet_id);
        if payload.len() > self.limits.max_bytes {
            self.stats.over_cap += 1;
            return None;
        }
        if let Some(partial) = self.partials.get(&id) {
            if partial.count != count || partial.bytes + payload.len() > MAX_PAYLOAD {
                // Contradicts what arrived before: neither can be trusted.
                self.stats.malformed += 1;
                self.remove(&id);
                return None;
            }
            if partial.fragments[usize::from(index)].is_some() {
                self.stats.duplicate += 1;
                return None;
            }
        } else {
            // A new packet: make room for it by dropping the oldest.
            while self.partials.len() >= self.limits.max_packets.max(1) {
                self.drop_oldest();
            }
        }
        // Make room for the bytes, oldest packets first, but never the one being filled.
        while self.bytes_held + payload.len() > self.limits.max_bytes {
            let oldest = self.order.first_key_value().map(|(_, id)| *id);
            match oldest {
                Some(oldest) if oldest != id => self.drop_oldest(),
                _ => {
                    // Only this packet is left and it cannot grow: drop it.
                    self.stats.over_cap += 1;
                    self.remove(&id);
                    return None;
                }
            }
        }
        let partial = match self.partials.entry(id) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.order.insert(seq, id);
                entry.insert(Partial {
                    seq,
                    first_seen: now,
                    count,
                    received: 0,
                    bytes: 0,
                    fragments: vec![None; usize::from(count)],
                })
            }
        };
        partial.fragments[usize::from(index)] = Some(payload.to_vec());
        partial.received += 1;
        partial.bytes += payload.len();
        self.bytes_held += payload.len();
        if partial.received < partial.count {
            return None;
        }
        let partial = self.remove(&id)?;
        let mut whole = Vec::with_capacity(partial.bytes);
        for fragment in partial.fragments.into_iter().flatten() {
            whole.extend_from_slice(&fragment);
        }
        self.stats.reassembled += 1;
        Some(Delivery {
            key,
            payload: Cow::Owned(whole),
        })
    }

    /// Drops partial packets older than `max_age`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((_, id)) = self.order.first_key_value() {
            let id = *id;
            let expired = self
                .partials
                .get(&id)
                .is_none_or(|p| now.saturating_duration_since(p.first_seen) >= self.limits.max_age);
            if !expired {
                break;
            }
            self.stats.expired += 1;
            self.remove(&id);
        }
    }

    /// When the oldest partial packet expires, if any is held.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (_, id) = self.order.first_key_value()?;
        let partial = self.partials.get(id)?;
        Some(partial.first_seen + self.limits.max_age)
    }

    /// The counters.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Partial packets held now.
    pub fn packets_held(&self) -> usize {
        self.partials.len()
    }

    /// Fragment bytes held now.
    pub fn bytes_held(&self) -> usize {
        self.bytes_held
    }

    fn drop_oldest(&mut self) {
        if let Some((_, id)) = self.order.first_key_value() {
            let id = *id;
            self.stats.over_cap += 1;
            self.remove(&id);
        }
    }

    fn remove(&mut self, id: &(FlowKey, u32)) -> Option<Partial> {
        let partial = self.partials.remove(id)?;
        self.order.remove(&partial.seq);
        self.bytes_held -= partial.bytes;
        Some(partial)
    }
}

fn varint_len(value: u32) -> usize {
    match value {
        0..64 => 1,
        64..16_384 => 2,
        16_384..1_073_741_824 => 4,
        _ => 8,
    }
}

fn whole_header_len(key: FlowKey) -> usize {
    1 + varint_len(key.channel) + varint_len(key.flow)
}

fn fragment_header_len(key: FlowKey, packet_id: u32) -> usize {
    whole_header_len(key) + varint_len(packet_id) + 2
}

fn put_varint(out: &mut Vec<u8>, value: u32) {
    match varint_len(value) {
        1 => out.push(value as u8),
        2 => out.extend_from_slice(&(0x4000 | value as u16).to_be_bytes()),
        4 => out.extend_from_slice(&(0x8000_0000 | value).to_be_bytes()),
        _ => out.extend_from_slice(&(0xc000_0000_0000_0000 | u64::from(value)).to_be_bytes()),
    }
}

fn take_varint(rest: &mut &[u8], truncated: DecodeError) -> Result<u32, DecodeError> {
    let first = *rest.first().ok_or(truncated)?;
    let len = 1usize << (first >> 6);
    if rest.len() < len {
        return Err(truncated);
    }
    let (bytes, tail) = rest.split_at(len);
    let mut value = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        value = (value << 8) | u64::from(b);
    }
    let value = u32::try_from(value).map_err(|_| DecodeError::BadInteger)?;
    if varint_len(value) != len {
        return Err(DecodeError::BadInteger);
    }
    *rest = tail;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: FlowKey = FlowKey {
        channel: 3,
        flow: 70_000,
    };

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn split(payload: &[u8], max: usize) -> Vec<Vec<u8>> {
        Fragmenter::new(7)
            .split(KEY, payload, Some(max))
            .expect("splits")
            .collect()
    }

    fn feed(r: &mut Reassembler, now: Instant, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
        frames
            .iter()
            .filter_map(|f| r.handle_datagram(now, f).map(|d| d.payload.into_owned()))
            .collect()
    }

    #[test]
    fn varints_round_trip_and_reject_long_forms() {
        for value in [0, 63, 64, 16_383, 16_384, 1 << 30, u32::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value));
            let mut rest = &out[..];
            assert_eq!(
                take_varint(&mut rest, DecodeError::Truncated { len: 0 }),
                Ok(value)
            );
            assert!(rest.is_empty());
        }
        // 5 written in two bytes: not the shortest form.
        let mut rest: &[u8] = &[0x40, 0x05];
        assert_eq!(
            take_varint(&mut rest, DecodeError::Truncated { len: 0 }),
            Err(DecodeError::BadInteger)
        );
        // Above u32.
        let mut rest: &[u8] = &[0xc0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            take_varint(&mut rest, DecodeError::Truncated { len: 0 }),
            Err(DecodeError::BadInteger)
        );
    }

    #[test]
    fn small_datagrams_travel_whole_with_a_short_header() {
        let payload = bytes(1400, 1);
        let frames = split(&payload, 1420);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            frames[0].len(),
            payload.len() + 6,
            "kind, 1-byte and 4-byte varints"
        );
        let mut r = Reassembler::new(ReassemblyLimits::default());
        let got = r
            .handle_datagram(Instant::now(), &frames[0])
            .expect("delivered");
        assert_eq!(got.key, KEY);
        assert!(matches!(got.payload, Cow::Borrowed(_)), "no copy");
        assert_eq!(&*got.payload, &payload[..]);
        assert_eq!(r.stats().whole, 1);
        // An empty UDP datagram is a datagram too.
        let frames = split(&[], 100);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            r.handle_datagram(Instant::now(), &frames[0])
                .expect("delivered")
                .payload
                .len(),
            0
        );
    }

    #[test]
    fn large_datagrams_round_trip_in_any_order() {
        let now = Instant::now();
        for (len, max) in [
            (1500, 1200),
            (MAX_PAYLOAD, 1200),
            (MAX_PAYLOAD, 1400),
            (3000, 1001),
            (65_000, 6500),
        ] {
            let payload = bytes(len, len as u8);
            let mut frames = split(&payload, max);
            assert!(frames.len() >= 2);
            assert!(frames.iter().all(|f| f.len() <= max), "fits {max}");
            let sizes: Vec<usize> = frames.iter().map(Vec::len).collect();
            let spread = sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0);
            assert!(spread <= 1, "fragments are even: {sizes:?}");
            frames.reverse();
            let middle = frames.len() / 2;
            frames.swap(0, middle);
            let mut r = Reassembler::new(ReassemblyLimits::default());
            let got = feed(&mut r, now, &frames);
            assert_eq!(got, vec![payload], "len {len} max {max}");
            assert_eq!(r.packets_held(), 0);
            assert_eq!(r.bytes_held(), 0);
            assert_eq!(r.stats().reassembled, 1);
        }
    }

    #[test]
    fn split_refuses_what_cannot_be_carried() {
        let mut f = Fragmenter::default();
        assert_eq!(
            f.split(KEY, &bytes(MAX_PAYLOAD + 1, 0), Some(1400))
                .map(|_| ()),
            Err(SplitError::TooLarge {
                len: MAX_PAYLOAD + 1,
                max: MAX_PAYLOAD
            })
        );
        assert!(f.split(KEY, &bytes(10, 0), None).is_err());
        assert!(f.split(KEY, &bytes(10, 0), Some(5)).is_err(), "header only");
        assert!(
            f.split(KEY, &bytes(MAX_PAYLOAD, 0), Some(200)).is_err(),
            "would need more than 255 fragments"
        );
        // Packet ids advance only for fragmented packets.
        let mut f = Fragmenter::new(u32::MAX);
        let _ = f.split(KEY, &bytes(10, 0), Some(100)).expect("whole");
        assert_eq!(f.next_packet_id, u32::MAX);
        let _ = f.split(KEY, &bytes(300, 0), Some(100)).expect("fragments");
        assert_eq!(f.next_packet_id, 0, "wraps");
    }

    #[test]
    fn interleaved_flows_never_mix() {
        let now = Instant::now();
        let mut f = Fragmenter::default();
        let keys = [
            FlowKey {
                channel: 1,
                flow: 1,
            },
            FlowKey {
                channel: 1,
                flow: 2,
            },
            FlowKey {
                channel: 2,
                flow: 1,
            },
        ];
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| bytes(5000, i as u8 * 50)).collect();
        let framed: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .zip(&payloads)
            .map(|(k, p)| f.split(*k, p, Some(1200)).expect("split").collect())
            .collect();
        let mut r = Reassembler::new(ReassemblyLimits::default());
        let mut delivered = Vec::new();
        for i in 0..framed[0].len() {
            for frames in &framed {
                if let Some(d) = r.handle_datagram(now, &frames[i]) {
                    delivered.push((d.key, d.payload.into_owned()));
                }
            }
        }
        assert_eq!(delivered.len(), 3);
        for (key, payload) in delivered {
            let i = keys.iter().position(|k| *k == key).expect("known key");
            assert_eq!(payload, payloads[i]);
        }
        // The same packet id on two flows is two packets.
        let mut a = Fragmenter::new(9);
        let mut b = Fragmenter::new(9);
        let one: Vec<_> = a
            .split(keys[0], &payloads[0], Some(1200))
            .expect("split")
            .collect();
        let two: Vec<_> = b
            .split(keys[1], &payloads[1], Some(1200))
            .expect("split")
            .collect();
        let mut r = Reassembler::new(ReassemblyLimits::default());
        assert!(feed(&mut r, now, &one[..2]).is_empty());
        assert!(feed(&mut r, now, &two[..2]).is_empty());
        assert_eq!(r.packets_held(), 2);
    }

    #[test]
    fn a_lost_fragment_expires_and_is_counted() {
        let start = Instant::now();
        let limits = ReassemblyLimits::default();
        let mut r = Reassembler::new(limits);
        let payload = bytes(4000, 3);
        let frames = split(&payload, 1200);
        assert!(feed(&mut r, start, &frames[1..]).is_empty());
        assert_eq!(r.packets_held(), 1);
        assert_eq!(r.poll_timeout(), Some(start + limits.max_age));
        r.handle_timeout(start + limits.max_age - Duration::from_millis(1));
        assert_eq!(r.packets_held(), 1, "not yet");
        r.handle_timeout(start + limits.max_age);
        assert_eq!(r.packets_held(), 0);
        assert_eq!(r.bytes_held(), 0);
        assert_eq!(r.stats().expired, 1);
        assert_eq!(r.stats().incomplete(), 1);
        assert_eq!(r.poll_timeout(), None);
        // The late fragment starts a new partial packet, which expires in turn.
        let late = start + limits.max_age;
        assert!(feed(&mut r, late, &frames[..1]).is_empty());
        r.handle_timeout(late + limits.max_age);
        assert_eq!(r.stats().expired, 2);
    }

    #[test]
    fn duplicates_are_ignored() {
        let now = Instant::now();
        let payload = bytes(3000, 4);
        let frames = split(&payload, 1200);
        let mut r = Reassembler::new(ReassemblyLimits::default());
        assert!(feed(&mut r, now, &[frames[0].clone(), frames[0].clone()]).is_empty());
        assert_eq!(r.stats().duplicate, 1);
        let got = feed(&mut r, now, &frames[1..]);
        assert_eq!(got, vec![payload]);
        // A duplicate after completion starts a new partial, which never completes.
        assert!(feed(&mut r, now, &frames[..1]).is_empty());
        assert_eq!(r.packets_held(), 1);
    }

    #[test]
    fn malformed_frames_are_refused() {
        let cases: &[(&[u8], DecodeError)] = &[
            (&[], DecodeError::Truncated { len: 0 }),
            (&[0x02, 0, 0], DecodeError::UnknownKind { kind: 2 }),
            (&[0x00, 0], DecodeError::Truncated { len: 2 }),
            (&[0x00, 0x40, 0x01, 0], DecodeError::BadInteger),
            (&[0x01, 0, 0, 0, 0], DecodeError::Truncated { len: 5 }),
            (
                &[0x01, 0, 0, 0, 0, 1, 9],
                DecodeError::BadFragmentIndex { index: 0, count: 1 },
            ),
            (
                &[0x01, 0, 0, 0, 2, 2, 9],
                DecodeError::BadFragmentIndex { index: 2, count: 2 },
            ),
            (
                &[0x01, 0, 0, 0, 0, 2],
                DecodeError::EmptyFragment { index: 0, count: 2 },
            ),
        ];
        for (bytes, error) in cases {
            assert_eq!(decode(bytes), Err(*error), "{bytes:?}");
        }
        // The last fragment may be empty (a payload that splits unevenly never makes one,
        // but it is not ambiguous).
        assert!(decode(&[0x01, 0, 0, 0, 1, 2]).is_ok());
        let mut r = Reassembler::new(ReassemblyLimits::default());
        assert!(r.handle_datagram(Instant::now(), &[0x07]).is_none());
        assert_eq!(r.stats().malformed, 1);

        // Fragments of one packet that disagree on the count drop the packet.
        let now = Instant::now();
        let one = [0x01, 0, 0, 5, 0, 2, 0xaa];
        let other = [0x01, 0, 0, 5, 1, 3, 0xbb];
        assert!(r.handle_datagram(now, &one).is_none());
        assert!(r.handle_datagram(now, &other).is_none());
        assert_eq!(r.stats().malformed, 2);
        assert_eq!(r.packets_held(), 0);
        assert_eq!(r.bytes_held(), 0);
    }

    #[test]
    fn caps_hold_under_a_flood_of_partial_packets() {
        let now = Instant::now();
        let limits = ReassemblyLimits {
            max_packets: 16,
            max_bytes: 64 * 1024,
            max_age: Duration::from_secs(2),
        };
        let mut r = Reassembler::new(limits);
        // 10,000 first fragments of packets that never complete, 1000 bytes each, on many
        // flows.
        for i in 0..10_000u32 {
            let mut frame = Vec::new();
            encode(
                &Frame::Fragment {
                    key: FlowKey {
                        channel: i % 7,
                        flow: i,
                    },
                    packet_id: i,
                    index: 0,
                    count: 255,
                    payload: &[0u8; 1000],
                },
                &mut frame,
            );
            assert!(r.handle_datagram(now, &frame).is_none());
            assert!(r.packets_held() <= limits.max_packets);
            assert!(r.bytes_held() <= limits.max_bytes);
        }
        assert_eq!(r.stats().over_cap, 10_000 - 16);
        // Bytes cap: fragments of one packet beyond 32 KiB.
        let limits = ReassemblyLimits {
            max_bytes: 32 * 1024,
            ..limits
        };
        let mut r = Reassembler::new(limits);
        for index in 0..100u8 {
            let mut frame = Vec::new();
            encode(
                &Frame::Fragment {
                    key: KEY,
                    packet_id: 1,
                    index,
                    count: 200,
                    payload: &[1u8; 1000],
                },
                &mut frame,
            );
            r.handle_datagram(now, &frame);
            assert!(r.bytes_held() <= limits.max_bytes);
        }
        assert!(r.stats().over_cap >= 1);
        // A real packet still gets through after the flood.
        let payload = bytes(5000, 9);
        let frames = split(&payload, 1200);
        assert_eq!(feed(&mut r, now, &frames), vec![payload]);
    }

    #[test]
    fn encode_is_the_inverse_of_decode() {
        let frames = [
            Frame::Whole {
                key: KEY,
                payload: b"abc",
            },
            Frame::Fragment {
                key: FlowKey {
                    channel: u32::MAX,
                    flow: 0,
                },
                packet_id: 16_384,
                index: 254,
                count: 255,
                payload: b"",
            },
        ];
        for frame in frames {
            let mut out = Vec::new();
            encode(&frame, &mut out);
            assert_eq!(decode(&out), Ok(frame));
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Any payload, any workable datagram size, any arrival order with duplicates:
            /// the payload comes back once and nothing is left held.
            #[test]
            fn split_then_reassemble(
                len in 0usize..=MAX_PAYLOAD,
                max in 300usize..9000,
                channel: u32,
                flow: u32,
                first_id: u32,
                seed: u64,
            ) {
                let key = FlowKey { channel, flow };
                let payload = bytes(len, seed as u8);
                let Ok(fragments) = Fragmenter::new(first_id).split(key, &payload, Some(max)) else {
                    // Only when more than 255 fragments would be needed.
                    prop_assert!(len / (max - MAX_HEADER_LEN) >= MAX_FRAGMENTS - 1);
                    return Ok(());
                };
                let mut frames: Vec<Vec<u8>> = fragments.collect();
                prop_assert!(frames.iter().all(|f| f.len() <= max));
                // A deterministic shuffle and one duplicate.
                let mut state = seed | 1;
                for i in (1..frames.len()).rev() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    frames.swap(i, (state % (i as u64 + 1)) as usize);
                }
                let duplicate = frames[0].clone();
                frames.insert(frames.len() / 2, duplicate);
                let mut r = Reassembler::new(ReassemblyLimits::default());
                let now = Instant::now();
                let mut delivered = Vec::new();
                for frame in &frames {
                    prop_assert_eq!(decode(frame).map(|f| { let mut o = Vec::new(); encode(&f, &mut o); o }), Ok(frame.clone()));
                    if let Some(d) = r.handle_datagram(now, frame) {
                        prop_assert_eq!(d.key, key);
                        delivered.push(d.payload.into_owned());
                    }
                }
                prop_assert!(delivered.iter().all(|d| *d == payload));
                if frames.len() == 2 {
                    // A whole datagram sent twice arrives twice, as UDP allows.
                    prop_assert_eq!(delivered.len(), 2);
                } else {
                    // The duplicate lands before the last fragment, so it is ignored.
                    prop_assert_eq!(delivered.len(), 1);
                    prop_assert_eq!(r.stats().duplicate, 1);
                    prop_assert_eq!(r.packets_held(), 0);
                    prop_assert_eq!(r.bytes_held(), 0);
                }
            }
        }
    }
}
