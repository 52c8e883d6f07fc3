//! The client's read of a data channel accept (and a data hello body): round trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::handshake::{DataAccept, DataHello};

fuzz_target!(|data: &[u8]| {
    if let Ok(accept) = DataAccept::from_bytes(data) {
        assert_eq!(&accept.to_frame()[2..], data);
    }
    if let Ok(hello) = DataHello::from_bytes(data) {
        assert_eq!(&hello.to_frame()[3..], data);
    }
});
