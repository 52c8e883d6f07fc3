//! The server side of the Noise handshake with an arbitrary message 1.
//!
//! Mode 0 feeds the bytes as message 1 (a stranger's garbage): the server must refuse in
//! silence (`Unauthenticated` or `Malformed`, no reply). Mode 1 encrypts the bytes as the
//! payload of a genuine message 1 under the right PSK, reaching the `ClientInit` decoder,
//! its cipher-speed extension and the cipher choice behind the PSK check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::handshake::{self, HandshakeError};
use warren_proto::{CipherChoice, CipherPolicy, CipherSuite, SuiteSpeed};

const PSK: [u8; 32] = [0x42; 32];
const ALLOWED: [CipherSuite; 3] = [
    CipherSuite::Aes256Gcm,
    CipherSuite::ChaCha20Poly1305,
    CipherSuite::Aegis128X2,
];

/// A `fastest` server with figures, so the extension's figures are used, not just decoded.
fn policy() -> CipherPolicy {
    CipherPolicy {
        suites: ALLOWED.to_vec(),
        choice: CipherChoice::Fastest,
        speeds: ALLOWED
            .iter()
            .zip([20_000, 2_500, 30_000])
            .map(|(&suite, mbps)| SuiteSpeed {
                suite,
                seal_mbps: mbps,
                open_mbps: mbps,
            })
            .collect(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        match handshake::server_handshake(&PSK, rest, &policy(), [1; 16]) {
            Err(HandshakeError::Unauthenticated | HandshakeError::Malformed) => {}
            other => panic!("garbage message 1 was not refused in silence: {other:?}"),
        }
        return;
    }
    if rest.len() > 900 {
        return;
    }
    let params = handshake::NOISE_PARAMS.parse().expect("params");
    let mut initiator = snow::Builder::new(params)
        .psk(0, &PSK)
        .expect("psk")
        .build_initiator()
        .expect("initiator");
    let mut message1 = vec![0u8; 1024];
    let n = initiator.write_message(rest, &mut message1).expect("write");
    match handshake::server_handshake(&PSK, &message1[..n], &policy(), [1; 16]) {
        Ok(outcome) => {
            assert!(outcome.reply.len() <= 2 + handshake::MAX_PREAMBLE_LEN);
            if let Ok(established) = outcome.result {
                assert!(ALLOWED.contains(&established.cipher));
            }
        }
        Err(HandshakeError::Malformed) => {}
        Err(other) => panic!("authenticated message 1 failed oddly: {other:?}"),
    }
});
