//! Compression of stream records (`compression = "lz4"` or `"zstd"` on a service).
//!
//! A sender that compresses turns each `Data` record's payload into a `Compressed` record,
//! `codec (1 byte) || compressed bytes`, when that is smaller; the receiver inflates any
//! `Compressed` record into at most one record's worth ([`MAX_PAYLOAD`]), so a crafted
//! "bomb" is refused after 64 KiB of output instead of filling memory. Nothing is
//! negotiated: each side compresses what *it* sends by its own config, and every receiver
//! of this version inflates.
//!
//! Incompressible data (already compressed, encrypted, random) must cost nothing: a large
//! record is first judged by compressing a [`SAMPLE`] of it with lz4 (a sixteenth of the
//! work), and after a record that does not shrink the next ones go out as they are, 1, 2,
//! 4… up to [`MAX_SKIP`] records before the sender tries again ([`Compressor`]).
//!
//! The codecs are `lz4_flex` (pure Rust, fastest) and `zstd` at level 1 (smaller output);
//! zstd's contexts are kept per thread, so a stream holds no compression state.

use std::cell::RefCell;

use crate::crypto::record::MAX_PAYLOAD;

/// How a service's streams are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// LZ4 block format: fast, moderate ratio.
    Lz4,
    /// Zstandard level 1: better ratio, more CPU.
    Zstd,
}

impl Codec {
    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Every codec.
    pub const ALL: [Codec; 2] = [Codec::Lz4, Codec::Zstd];

    fn byte(self) -> u8 {
        match self {
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Codec> {
        match byte {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// Most records sent as they are after one that did not shrink, before trying again.
pub const MAX_SKIP: u32 = 256;

/// How much of a large record is compressed first to judge whether the rest is worth it.
pub const SAMPLE: usize = 4096;

/// A record must shrink at least this much (1/16) to be sent compressed: less is not worth
/// the receiver's work.
const MIN_GAIN_SHIFT: u32 = 4;

/// One stream direction's compression: the codec and how long to leave it alone after data
/// that did not shrink.
#[derive(Debug)]
pub struct Compressor {
    codec: Codec,
    /// Records still to send uncompressed.
    skip: u32,
    /// The next skip after another miss.
    backoff: u32,
}

impl Compressor {
    /// A compressor for `codec`, trying the first record.
    pub fn new(codec: Codec) -> Compressor {
        Compressor {
            codec,
            skip: 0,
            backoff: 1,
        }
    }

    /// Whether the next record goes as it is without a try (counted: call once per
    /// record, and [`Compressor::deflate`] only when this says `false`), so a sender that
    /// skips takes no buffer for it.
    pub fn skips(&mut self) -> bool {
        let skipping = self.skip > 0;
        self.skip = self.skip.saturating_sub(1);
        skipping
    }

    /// Appends `input` compressed (`codec || bytes`) to `out` and returns `true` when
    /// that is worth sending; `false` leaves `out` as it was and the record to go as it is.
    pub fn deflate(&mut self, input: &[u8], out: &mut Vec<u8>) -> bool {
        let start = out.len();
        if input.len() >= 4 * SAMPLE && !shrinks(&input[..SAMPLE], out) {
            self.missed();
            return false;
        }
        out.push(self.codec.byte());
        let packed = match self.codec {
            Codec::Lz4 => lz4(input, out),
            Codec::Zstd => zstd_compress(input, out),
        };
        let worth = packed && out.len() - start + (input.len() >> MIN_GAIN_SHIFT) < input.len();
        if worth {
            self.backoff = 1;
        } else {
            out.truncate(start);
            self.missed();
        }
        worth
    }

    /// A record did not shrink: leave the next ones alone for a while, longer each time.
    fn missed(&mut self) {
        self.skip = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_SKIP);
    }
}

/// Whether `sample` shrinks by at least 1/16 under lz4 (the cheapest judge for any codec);
/// `scratch` is used past its length and left as it was.
fn shrinks(sample: &[u8], scratch: &mut Vec<u8>) -> bool {
    let start = scratch.len();
    let packed = lz4(sample, scratch);
    let len = scratch.len() - start;
    scratch.truncate(start);
    packed && len + (sample.len() >> MIN_GAIN_SHIFT) < sample.len()
}

fn lz4(input: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    out.resize(
        start + lz4_flex::block::get_maximum_output_size(input.len()),
        0,
    );
    match lz4_flex::block::compress_into(input, &mut out[start..]) {
        Ok(n) => {
            out.truncate(start + n);
            true
        }
        Err(_) => false,
    }
}

thread_local! {
    /// zstd contexts of this thread: made once, reused by every stream it serves.
    static ZSTD: RefCell<Option<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)>> =
        const { RefCell::new(None) };
}

/// Runs `f` with this thread's zstd contexts; `None` if they cannot be made.
fn with_zstd<T>(
    f: impl FnOnce(&mut zstd::bulk::Compressor<'static>, &mut zstd::bulk::Decompressor<'static>) -> T,
) -> Option<T> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let compressor = zstd::bulk::Compressor::new(1).ok()?;
            let decompressor = zstd::bulk::Decompressor::new().ok()?;
            *slot = Some((compressor, decompressor));
        }
        let (compressor, decompressor) = slot.as_mut()?;
        Some(f(compressor, decompressor))
    })
}

fn zstd_compress(input: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    out.resize(start + zstd::zstd_safe::compress_bound(input.len()), 0);
    let packed = with_zstd(|compressor, _| compressor.compress_to_buffer(input, &mut out[start..]));
    match packed {
        Some(Ok(n)) => {
            out.truncate(start + n);
            true
        }
        _ => false,
    }
}

/// Why a compressed record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InflateError {
    /// The record names no codec this version knows.
    #[error("a compressed record names codec {0}, which this version does not know")]
    UnknownCodec(u8),
    /// The record is empty.
    #[error("an empty compressed record")]
    Empty,
    /// The bytes do not decompress, or decompress to more than one record's worth.
    #[error(
        "a compressed record does not inflate to at most {MAX_PAYLOAD} bytes (corrupt, or a decompression bomb): refused"
    )]
    Refused,
}

/// Inflates a `Compressed` record's payload into `out` (replacing what it held), never
/// beyond [`MAX_PAYLOAD`] bytes.
///
/// # Errors
/// [`InflateError`] for an unknown codec, corrupt data, or output over the bound.
pub fn inflate(payload: &[u8], out: &mut Vec<u8>) -> Result<(), InflateError> {
    let (&codec, packed) = payload.split_first().ok_or(InflateError::Empty)?;
    let codec = Codec::from_byte(codec).ok_or(InflateError::UnknownCodec(codec))?;
    out.clear();
    out.resize(MAX_PAYLOAD, 0);
    let inflated = match codec {
        Codec::Lz4 => lz4_flex::block::decompress_into(packed, out).ok(),
        Codec::Zstd => with_zstd(|_, decompressor| decompressor.decompress_to_buffer(packed, out))
            .and_then(Result::ok),
    };
    match inflated {
        Some(n) => {
            out.truncate(n);
            Ok(())
        }
        None => {
            out.clear();
            Err(InflateError::Refused)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Vec<u8> {
        let line =
            b"{\"level\":\"info\",\"event\":\"stream_closed\",\"service\":\"web\",\"up\":1234}\n";
        line.iter().copied().cycle().take(len).collect()
    }

    fn random(len: usize) -> Vec<u8> {
        (0..len).map(|_| rand::random::<u8>()).collect()
    }

    #[test]
    fn text_shrinks_and_comes_back_exactly_with_every_codec() {
        for codec in Codec::ALL {
            let input = text(MAX_PAYLOAD);
            let mut packed = Vec::new();
            let mut compressor = Compressor::new(codec);
            assert!(!compressor.skips());
            assert!(compressor.deflate(&input, &mut packed), "{codec:?}");
            assert!(
                packed.len() < input.len() / 4,
                "{codec:?}: {}",
                packed.len()
            );
            let mut out = Vec::new();
            inflate(&packed, &mut out).unwrap();
            assert_eq!(out, input, "{codec:?}");
        }
    }

    #[test]
    fn random_data_is_sent_as_is_and_tried_again_ever_more_rarely() {
        let mut compressor = Compressor::new(Codec::Lz4);
        let input = random(16 * 1024);
        let mut packed = Vec::new();
        let tried: Vec<bool> = (0..200)
            .map(|_| {
                let tried = !compressor.skips();
                if tried {
                    assert!(!compressor.deflate(&input, &mut packed));
                }
                tried
            })
            .collect();
        let attempts = tried.iter().filter(|t| **t).count();
        // Tries at 0, 2, 5, 10, 19, 36, 69, 134: then ever more rarely.
        assert!(attempts <= 8, "{attempts} attempts in 200 records");
        // Compressible data after a miss is compressed again once the skip runs out.
        let text = text(16 * 1024);
        let compressed = (0..=MAX_SKIP)
            .filter(|_| !compressor.skips() && compressor.deflate(&text, &mut packed));
        assert!(compressed.count() > 0);
    }

    #[test]
    fn a_bomb_is_refused_after_one_record_of_output() {
        for codec in Codec::ALL {
            let huge = vec![0u8; 4 * MAX_PAYLOAD];
            let mut packed = vec![codec.byte()];
            match codec {
                Codec::Lz4 => assert!(lz4(&huge, &mut packed)),
                Codec::Zstd => assert!(zstd_compress(&huge, &mut packed)),
            }
            assert!(packed.len() < 2048, "{codec:?}: {}", packed.len());
            let mut out = Vec::new();
            assert_eq!(
                inflate(&packed, &mut out),
                Err(InflateError::Refused),
                "{codec:?}"
            );
            assert!(out.capacity() <= MAX_PAYLOAD, "{codec:?}");
        }
    }

    #[test]
    fn garbage_and_unknown_codecs_are_refused() {
        let mut out = Vec::new();
        assert_eq!(inflate(&[], &mut out), Err(InflateError::Empty));
        assert_eq!(
            inflate(&[9, 1, 2], &mut out),
            Err(InflateError::UnknownCodec(9))
        );
        for codec in Codec::ALL {
            let mut garbage = vec![codec.byte()];
            garbage.extend([0xFF; 300]);
            assert_eq!(
                inflate(&garbage, &mut out),
                Err(InflateError::Refused),
                "{codec:?}"
            );
        }
    }
}
