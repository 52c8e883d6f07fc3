//! STUN Binding messages from anyone on the network (`proto::stun`: checks, reflector
//! requests, relay binds and answers): the decoder never panics and stays within its
//! bounds; what it accepts re-encodes to a message that decodes to the same thing (relay
//! token and state included); the signed input of a tag is never longer than the packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::stun::{self, Class, MAX_MESSAGE_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = stun::classify(data);
    let Ok(decoded) = stun::decode(data) else {
        return;
    };
    assert!(data.len() <= MAX_MESSAGE_LEN);
    if let Some(tag) = &decoded.integrity {
        assert!(tag.signed_input(data).len() < data.len());
    }
    let message = decoded.message;
    let mut out = Vec::new();
    message.encode(&mut out);
    let again = stun::decode(&out).expect("a re-encoded message decodes");
    assert_eq!(again.message, message);
    assert!(again.integrity.is_none());
    if message.class != Class::Request {
        return;
    }
    message.encode_signed(&mut out, |bytes| {
        let mut tag = [0u8; 32];
        tag[0] = bytes.len() as u8;
        tag
    });
    let signed = stun::decode(&out).expect("a signed message decodes");
    assert_eq!(signed.message, message);
    let tag = signed.integrity.expect("the tag is found");
    assert_eq!(tag.tag[0], tag.signed_input(&out).len() as u8);
});
