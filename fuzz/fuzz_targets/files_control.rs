//! The file protocol's control-message decoder (`proto::files::control`): never panics,
//! never takes more than the buffer, and what it accepts re-encodes to the same bytes
//! (except a Manifest, whose decoder has its own target).
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::files::control::{ControlMessage, Decoded, max_body_len};

fuzz_target!(|data: &[u8]| {
    let Ok(Decoded::Message(message, used)) = ControlMessage::decode(data) else {
        return;
    };
    assert!(used <= data.len());
    assert!(used <= 1 + 8 + max_body_len(data[0]).expect("known type"));
    let mut out = Vec::new();
    message.encode(&mut out);
    assert_eq!(out, &data[..used], "canonical");
});
