//! The server's first read: a 2-byte length prefix, then a preamble body (control or data).
//! Never panics; a data hello that parses re-encodes to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::handshake::{self, Preamble};

fuzz_target!(|data: &[u8]| {
    let Some((prefix, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let Ok(len) = handshake::frame_len(*prefix) else {
        return;
    };
    assert!((1..=handshake::MAX_PREAMBLE_LEN).contains(&len));
    let body = &body[..len.min(body.len())];
    match handshake::parse_preamble(body) {
        Ok(Preamble::Data(hello)) => {
            let frame = hello.to_frame();
            assert_eq!(&frame[2..], body, "data hello round trip");
        }
        Ok(Preamble::DataOpen(hello)) => {
            assert_eq!(body[0], handshake::KIND_DATA_OPEN);
            let frame = hello.to_frame();
            assert_eq!(&frame[3..], &body[1..], "forward data hello round trip");
        }
        Ok(Preamble::Control(message1)) => assert_eq!(message1, &body[1..]),
        Err(_) => {}
    }
});
