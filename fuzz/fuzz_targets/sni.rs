//! TLS ClientHello SNI peeking (`proto::sni`): arbitrary first bytes of a connection never
//! panic; `NeedMore` only while under the buffer limit; `NotTls` only when the first byte
//! is not a handshake record; a name it returns is a valid, normalized host name; and a
//! prefix of bytes never contradicts the whole (an answer is stable as more bytes arrive).
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::sni::{self, Peek};

fuzz_target!(|data: &[u8]| {
    let whole = sni::peek_sni(data);
    match &whole {
        Ok(Peek::NeedMore) => assert!(data.len() < sni::MAX_CLIENT_HELLO),
        Ok(Peek::NotTls) => assert_ne!(data.first(), Some(&22)),
        Ok(Peek::Sni(name)) => {
            assert_eq!(
                sni::normalize_host_name(name.as_bytes()).as_deref(),
                Ok(name.as_str())
            );
            assert!(!name.is_empty() && name.len() <= sni::MAX_HOST_NAME_LEN);
        }
        Ok(Peek::NoSni) | Err(_) => {}
    }
    // Once a peek has an answer, more bytes do not change it: the answer depends only on
    // the bytes it needed.
    if !matches!(whole, Ok(Peek::NeedMore)) {
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\x16\x03\x01\x00\x01\x01more");
        assert_eq!(sni::peek_sni(&longer), whole);
    }
    // A proper prefix needs more, or already has the same answer. (Both may be different
    // errors: a prefix can already need more than the limit where the whole shows a
    // malformed record first.)
    if let Some(cut) = data.len().checked_sub(1) {
        let prefix = sni::peek_sni(&data[..cut]);
        assert!(
            matches!(prefix, Ok(Peek::NeedMore))
                || prefix == whole
                || (prefix.is_err() && whole.is_err()),
            "prefix {prefix:?} vs whole {whole:?}"
        );
    }
});
