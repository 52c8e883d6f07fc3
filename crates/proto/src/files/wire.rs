//! Byte-level helpers shared by the file-transfer codecs: QUIC variable-length integers
//! (RFC 9000 §16) in their shortest form only, so every message has exactly one encoding,
//! and a cursor that never reads past its slice.

/// The largest value a QUIC varint holds (2^62 − 1).
pub const MAX_VARINT: u64 = (1 << 62) - 1;

/// A malformed or truncated integer, or too few bytes; each codec maps it to its own
/// error type with context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The input ends inside a value.
    Truncated,
    /// A varint in a longer form than needed.
    NonCanonical,
}

/// Bytes a varint of `value` takes (`value` ≤ [`MAX_VARINT`]).
pub(crate) fn varint_len(value: u64) -> usize {
    match value {
        0..64 => 1,
        64..16_384 => 2,
        16_384..1_073_741_824 => 4,
        _ => 8,
    }
}

/// Appends `value` as a varint.
///
/// # Panics
///
/// If `value` > [`MAX_VARINT`]: callers bound their values first (an internal error).
pub(crate) fn put_varint(out: &mut Vec<u8>, value: u64) {
    assert!(value <= MAX_VARINT, "varint out of range: {value}");
    match varint_len(value) {
        1 => out.push(value as u8),
        2 => out.extend_from_slice(&(0x4000 | value as u16).to_be_bytes()),
        4 => out.extend_from_slice(&(0x8000_0000 | value as u32).to_be_bytes()),
        _ => out.extend_from_slice(&(0xc000_0000_0000_0000 | value).to_be_bytes()),
    }
}

/// A read cursor over a byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        let (&first, rest) = self.rest.split_first().ok_or(WireError::Truncated)?;
        self.rest = rest;
        Ok(first)
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if self.rest.len() < len {
            return Err(WireError::Truncated);
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(taken)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        let first = *self.rest.first().ok_or(WireError::Truncated)?;
        let len = 1usize << (first >> 6);
        let bytes = self.bytes(len)?;
        let mut value = u64::from(first & 0x3f);
        for &b in &bytes[1..] {
            value = (value << 8) | u64::from(b);
        }
        if varint_len(value) != len {
            return Err(WireError::NonCanonical);
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_long_forms() {
        for value in [
            0,
            1,
            63,
            64,
            16_383,
            16_384,
            1_073_741_823,
            1_073_741_824,
            MAX_VARINT,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value));
            let mut reader = Reader::new(&out);
            assert_eq!(reader.varint(), Ok(value));
            assert_eq!(reader.remaining(), 0);
        }
        // 5 in two bytes.
        assert_eq!(
            Reader::new(&[0x40, 0x05]).varint(),
            Err(WireError::NonCanonical)
        );
        assert_eq!(
            Reader::new(&[0x80, 0, 0]).varint(),
            Err(WireError::Truncated)
        );
        assert_eq!(Reader::new(&[]).varint(), Err(WireError::Truncated));
        assert_eq!(Reader::new(&[1, 2]).bytes(3), Err(WireError::Truncated));
        assert_eq!(Reader::new(&[1, 2]).array::<2>(), Ok([1, 2]));
    }
}
