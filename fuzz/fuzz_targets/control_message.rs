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
    match &decoded {
        ControlMessage::Hello { services } => {
            assert!(services.len() <= message::MAX_SERVICES_PER_SESSION)
        }
        ControlMessage::HelloPart { claims, mode, more } => {
            assert!(claims.len() <= message::MAX_SERVICES_PER_SESSION);
            // A part always fits an assembler that has seen nothing yet.
            let mut assembler = message::HelloAssembler::default();
            let whole = assembler
                .push(*mode, claims.clone(), *more)
                .expect("one part is within the hello's bounds");
            assert_eq!(whole.is_some(), !more);
        }
        ControlMessage::Health { services, .. } => {
            assert!(services.len() <= message::MAX_SERVICES_PER_SESSION)
        }
        _ => {}
    }
    let again = message::decode_control(&message::encode(&decoded)).expect("re-encoded decodes");
    assert_eq!(again, decoded);
});
