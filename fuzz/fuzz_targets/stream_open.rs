//! The first record of a data channel: never panics; accepted values round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::message;

fuzz_target!(|data: &[u8]| {
    let Ok(open) = message::decode_stream_open(data) else {
        return;
    };
    assert!(open.service.len() <= message::MAX_SERVICE_NAME_LEN);
    let again = message::decode_stream_open(&message::encode(&open)).expect("round trip");
    assert_eq!(again, open);
});
