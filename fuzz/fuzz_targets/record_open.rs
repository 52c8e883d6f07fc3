//! The record opener (`Opener::parse_header` / `Opener::open`), for every cipher.
//!
//! Input: a cipher choice, then a stream of arbitrary records (header, then as many body
//! bytes as the header asks for). Garbage must be rejected without panicking and without
//! reading a body the header did not bound. Then a round trip: a sealed record with one
//! fuzzer-chosen bit flipped never opens.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use warren::crypto::record::{
    DirectionKeys, HEADER_LEN, MAX_PAYLOAD, MAX_TAG_LEN, Opener, RecordKind, Sealer,
};
use warren_proto::CipherSuite;

const SUITES: [CipherSuite; 7] = CipherSuite::ALL;

fn run(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let suite = SUITES[usize::from(u8::arbitrary(u)?) % SUITES.len()];
    let keys = DirectionKeys::derive(suite, b"fuzz secret", b"fuzz label");

    // Arbitrary records into a fresh opener.
    let mut opener = Opener::new(suite, keys.clone());
    for _ in 0..4 {
        let header: [u8; HEADER_LEN] = u.arbitrary()?;
        let Ok((_, len)) = opener.parse_header(header) else {
            continue;
        };
        assert!(len <= MAX_PAYLOAD + MAX_TAG_LEN);
        let mut body = u.bytes(len.min(u.len()))?.to_vec();
        if let Ok(n) = opener.open(header, &mut body) {
            // Only the plaintext suite may accept bytes nobody sealed.
            assert_eq!(suite, CipherSuite::None, "forged record opened");
            assert!(n <= body.len());
        }
    }

    // Seal a payload, flip one bit somewhere (or none), open.
    let mut sealer = Sealer::new(suite, keys.clone());
    let mut opener = Opener::new(suite, keys);
    let payload = u.bytes(u.len().min(2048).saturating_sub(8))?.to_vec();
    let mut record = vec![0u8; HEADER_LEN];
    record.extend_from_slice(&payload);
    let kind = if payload.is_empty() && bool::arbitrary(u)? {
        RecordKind::End
    } else {
        RecordKind::Data
    };
    sealer.seal(kind, &mut record).expect("seal");
    let flip: Option<(u16, u8)> = u.arbitrary()?;
    let flipped = flip.map(|(at, bit)| {
        let at = usize::from(at) % record.len();
        record[at] ^= 1 << (bit % 8);
        at
    });
    let header: [u8; HEADER_LEN] = record[..HEADER_LEN].try_into().expect("header");
    let body = &mut record[HEADER_LEN..];
    let opened = opener.open(header, body);
    match (flipped, suite) {
        (None, _) => {
            let n = opened.expect("an untouched record opens");
            assert_eq!(&body[..n], &payload[..]);
        }
        (Some(_), CipherSuite::None) => {}
        (Some(at), _) => assert!(opened.is_err(), "a flipped bit at {at} was not detected"),
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
