//! Control message decoding: never panics, never accepts past the caps, and whatever it
//! accepts re-encodes to a message that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::message::{self, ControlMessage};

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = message::decode_control(data) else {
        return;
    };
    assert!(data.len() <= message::MAX_CONTROL_LEN);
    if let ControlMessage::Hello { services } = &decoded {
        assert!(services.len() <= message::MAX_SERVICES_PER_SESSION);
    }
    let again = message::decode_control(&message::encode(&decoded)).expect("re-encoded decodes");
    assert_eq!(again, decoded);
});
