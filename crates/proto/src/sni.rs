//! The server name (SNI) of a TLS connection, read from the client's first bytes without
//! consuming them: TLS passthrough routes a connection by the name its ClientHello asks
//! for, then hands every byte, untouched, to the service's backend.
//!
//! Written by hand because no small crate peeks a ClientHello from raw bytes: rustls and
//! tls-parser either drive a whole handshake or pull in a parser framework, while this
//! needs one pass over a few hundred bytes that never panics and never allocates more than
//! [`MAX_CLIENT_HELLO`].
//!
//! # Flow
//!
//! ```text
//! caller: read into a buffer; peek_sni(&buffer)
//!   NeedMore  -> read more (give up once the buffer holds MAX_CLIENT_HELLO bytes)
//!   Sni(name) -> route on `name`, then forward the buffer and the rest of the stream
//!   NoSni     -> the client named no server (or an IP address): default route or refuse
//!   NotTls    -> not TLS at all (plain HTTP on the TLS port?): say so and close
//!   Err(_)    -> malformed; write ALERT_UNRECOGNIZED_NAME or just close
//! ```
//!
//! # What is parsed (RFC 8446 §5.1, §4.1.2; RFC 6066 §3)
//!
//! ```text
//! record:     type(1)=22  version(2)=0x0300..=0x0304  length(2)<=2^14  fragment
//! handshake:  type(1)=1 (ClientHello)  length(3)  body
//! body:       legacy_version(2) random(32) session_id<0..32> cipher_suites<2..2^16-2>
//!             compression_methods<1..2^8-1> [extensions<0..2^16-1>]
//! extension:  type(2) data<0..2^16-1>;  type 0 = server_name:
//!             server_name_list<1..2^16-1> of name_type(1) name<1..2^16-1>; type 0 = host_name
//! ```
//!
//! The ClientHello may span several handshake records; they are joined (bounded by
//! [`MAX_CLIENT_HELLO`]) before the body is read. Every length is checked against what
//! remains, so truncated or lying lengths give [`Peek::NeedMore`] (while the message is
//! incomplete) or an error (when the complete message contradicts itself), never a panic.
//!
//! Host names are validated by [`normalize_host_name`], which the HTTP router uses too,
//! so a name means the same thing whether it arrived as SNI or in a `Host` header.

use std::borrow::Cow;
use std::net::IpAddr;

/// The most bytes a caller buffers while waiting for a complete ClientHello: one full
/// record (header and 2^14 bytes). A ClientHello that needs more, whether it is split
/// into many small records or declares a huge length, is refused with
/// [`SniError::TooLarge`], so [`Peek::NeedMore`] only ever comes with fewer bytes than this.
pub const MAX_CLIENT_HELLO: usize = 16 * 1024 + RECORD_HEADER_LEN;

/// A TLS record holding a fatal `unrecognized_name` alert (RFC 6066 §3: level 2, description
/// 112), for a passthrough port to send when no service serves the requested name.
pub const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// The longest host name (RFC 1035 §2.3.4, without the trailing dot).
pub const MAX_HOST_NAME_LEN: usize = 253;

/// The longest label of a host name (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;

/// Record content type of handshake records.
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Extension type of `server_name` (RFC 6066 §3).
const EXTENSION_SERVER_NAME: u16 = 0;
/// `NameType` of a DNS host name (RFC 6066 §3).
const NAME_TYPE_HOST_NAME: u8 = 0;
/// Content type, version, length.
const RECORD_HEADER_LEN: usize = 5;
/// The largest plaintext record fragment (RFC 8446 §5.1).
const MAX_RECORD_LEN: usize = 1 << 14;
/// Handshake type and 24-bit length.
const HANDSHAKE_HEADER_LEN: usize = 4;
/// Bytes of the ClientHello random.
const RANDOM_LEN: usize = 32;
/// The longest legacy session id.
const MAX_SESSION_ID_LEN: usize = 32;

/// What the first bytes of a connection say about its server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// The ClientHello is not complete yet: read more and peek again.
    NeedMore,
    /// The client asked for this host name (lowercase, validated by [`normalize_host_name`]).
    /// Owned because a name may straddle two records and is lowercased.
    Sni(String),
    /// A complete ClientHello without a host name (no `server_name` extension, or one
    /// naming an IP address, which RFC 6066 forbids but some clients send).
    NoSni,
    /// The first byte is not a TLS handshake record: the client is not speaking TLS.
    NotTls,
}

/// Why the first bytes of a connection are not a ClientHello this parser accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SniError {
    /// A record's version is not TLS (major 3, minor 0 to 4).
    #[error(
        "the TLS record version {major}.{minor} is not TLS 1.x; the client must speak TLS 1.0 to 1.3"
    )]
    RecordVersion {
        /// The major version byte.
        major: u8,
        /// The minor version byte.
        minor: u8,
    },
    /// A handshake record with no bytes, which RFC 8446 §5.1 forbids.
    #[error("the client sent an empty TLS handshake record; its TLS stack is broken")]
    EmptyRecord,
    /// A record longer than TLS allows.
    #[error("the client sent a TLS record of {len} bytes, above the {max}-byte limit of TLS")]
    RecordTooLong {
        /// The declared length.
        len: usize,
        /// 2^14.
        max: usize,
    },
    /// A record other than a handshake record arrived before the ClientHello was complete.
    #[error(
        "the client sent a TLS record of type {content_type} in the middle of its ClientHello; its TLS stack is broken"
    )]
    UnexpectedRecord {
        /// The record's content type.
        content_type: u8,
    },
    /// The first handshake message is not a ClientHello.
    #[error(
        "the client's first TLS handshake message has type {handshake_type}, not a ClientHello (1); only clients may connect here"
    )]
    NotClientHello {
        /// The handshake type byte.
        handshake_type: u8,
    },
    /// The ClientHello's own version is not TLS (major 3).
    #[error(
        "the client's ClientHello has version {major}.{minor}, not TLS 1.x; the client must speak TLS 1.0 to 1.3"
    )]
    HelloVersion {
        /// The major version byte.
        major: u8,
        /// The minor version byte.
        minor: u8,
    },
    /// The ClientHello would need more than [`MAX_CLIENT_HELLO`] bytes of records.
    #[error(
        "the client's ClientHello needs at least {needed} bytes of records, above the {max}-byte limit"
    )]
    TooLarge {
        /// The fewest bytes the ClientHello could still take.
        needed: usize,
        /// [`MAX_CLIENT_HELLO`].
        max: usize,
    },
    /// A length inside the complete ClientHello runs past its end.
    #[error(
        "the client's ClientHello is malformed: its {field} runs past the end of what holds it"
    )]
    Truncated {
        /// The field whose length lies.
        field: &'static str,
    },
    /// A length inside the ClientHello leaves bytes over, or is out of its allowed range.
    #[error("the client's ClientHello is malformed: its {field} has an invalid length")]
    BadLength {
        /// The field with the bad length.
        field: &'static str,
    },
    /// Two `server_name` extensions, or two host names in one (RFC 6066 §3 forbids both).
    #[error("the client's ClientHello names more than one server; it may name only one")]
    DuplicateServerName,
    /// The host name is not a valid DNS name.
    #[error("the client's ClientHello asks for an invalid server name: {0}")]
    InvalidHostName(#[from] HostNameError),
}

/// Why bytes are not a valid host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostNameError {
    /// No characters (or only a dot).
    #[error("the host name is empty; name a host such as `app.example.com`")]
    Empty,
    /// Longer than [`MAX_HOST_NAME_LEN`].
    #[error("the host name has {len} characters, above the limit of {max}; use a shorter name")]
    TooLong {
        /// The name's length.
        len: usize,
        /// [`MAX_HOST_NAME_LEN`].
        max: usize,
    },
    /// Two dots in a row, or a leading dot.
    #[error(
        "the host name has an empty label (a leading dot or two dots in a row); remove the extra dot"
    )]
    EmptyLabel,
    /// One label is longer than [`MAX_LABEL_LEN`].
    #[error(
        "a label of the host name has {len} characters, above the limit of {max}; use shorter labels"
    )]
    LabelTooLong {
        /// The label's length.
        len: usize,
        /// [`MAX_LABEL_LEN`].
        max: usize,
    },
    /// A byte other than an ASCII letter, digit, hyphen or dot.
    #[error(
        "the host name contains the byte {byte:#04x}; only ASCII letters, digits, `-` and `.` are allowed"
    )]
    InvalidByte {
        /// The offending byte.
        byte: u8,
    },
}

/// Validates a DNS host name and returns it lowercased, without a trailing dot.
///
/// Accepts ASCII letters, digits, `-` and `.`; labels of 1 to 63 characters; 1 to 253
/// characters in all. One trailing dot (the fully qualified form) is dropped, so
/// `App.Example.COM.` and `app.example.com` are the same name. Internationalized names
/// must arrive in their `xn--` form, as they do on the wire.
///
/// # Errors
///
/// [`HostNameError`] naming the first problem found.
pub fn normalize_host_name(name: &[u8]) -> Result<String, HostNameError> {
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() {
        return Err(HostNameError::Empty);
    }
    if name.len() > MAX_HOST_NAME_LEN {
        return Err(HostNameError::TooLong {
            len: name.len(),
            max: MAX_HOST_NAME_LEN,
        });
    }
    for label in name.split(|&byte| byte == b'.') {
        if label.is_empty() {
            return Err(HostNameError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostNameError::LabelTooLong {
                len: label.len(),
                max: MAX_LABEL_LEN,
            });
        }
        if let Some(&byte) = label
            .iter()
            .find(|byte| !(byte.is_ascii_alphanumeric() || **byte == b'-'))
        {
            return Err(HostNameError::InvalidByte { byte });
        }
    }
    // Every byte is ASCII (checked above), so each maps to one char.
    Ok(name
        .iter()
        .map(|byte| char::from(byte.to_ascii_lowercase()))
        .collect())
}

/// Reads the server name from the first bytes a client sent on a TLS port, without
/// consuming them (the caller keeps `bytes` and forwards them unchanged).
///
/// Call it again with the longer buffer after each [`Peek::NeedMore`]. Bytes after the
/// ClientHello (a client may pipeline more records) are ignored.
///
/// # Errors
///
/// [`SniError`] when the bytes start like TLS but are not a well-formed ClientHello, or
/// when it would need more than [`MAX_CLIENT_HELLO`] bytes; reading more will not help.
pub fn peek_sni(bytes: &[u8]) -> Result<Peek, SniError> {
    let Some(&first) = bytes.first() else {
        return Ok(Peek::NeedMore);
    };
    if first != CONTENT_TYPE_HANDSHAKE {
        return Ok(Peek::NotTls);
    }
    match client_hello(bytes)? {
        None => Ok(Peek::NeedMore),
        Some(body) => server_name(&body),
    }
}

/// Joins the handshake records at the start of `bytes` until they hold the whole
/// ClientHello, and returns its body (after the handshake header); `None` while
/// incomplete. Borrows when the message fits in the first record, the usual case.
fn client_hello(bytes: &[u8]) -> Result<Option<Cow<'_, [u8]>>, SniError> {
    let mut message: Cow<'_, [u8]> = Cow::Borrowed(&[]);
    // Handshake header plus body, once the header has arrived.
    let mut message_len: Option<usize> = None;
    let mut offset = 0;
    loop {
        let Some(header) = bytes
            .get(offset..)
            .and_then(<[u8]>::first_chunk::<RECORD_HEADER_LEN>)
        else {
            // This record's header, then at least what the message still lacks.
            bound(offset + RECORD_HEADER_LEN + lacking(&message, message_len))?;
            return Ok(None);
        };
        let [content_type, major, minor, len_high, len_low] = *header;
        if content_type != CONTENT_TYPE_HANDSHAKE {
            return Err(SniError::UnexpectedRecord { content_type });
        }
        // RFC 5246 Appendix E.1: a client may write any 3.x, typically 3.0 or 3.1, in the
        // record of its first ClientHello.
        if major != 3 || minor > 4 {
            return Err(SniError::RecordVersion { major, minor });
        }
        let record_len = usize::from(u16::from_be_bytes([len_high, len_low]));
        if record_len == 0 {
            return Err(SniError::EmptyRecord);
        }
        if record_len > MAX_RECORD_LEN {
            return Err(SniError::RecordTooLong {
                len: record_len,
                max: MAX_RECORD_LEN,
            });
        }
        let start = offset + RECORD_HEADER_LEN;
        let end = start + record_len;
        let available = bytes.get(start..end.min(bytes.len())).unwrap_or_default();
        // Message bytes from earlier records.
        let before = message.len();
        if message.is_empty() {
            message = Cow::Borrowed(available);
        } else {
            message.to_mut().extend_from_slice(available);
        }

        if message_len.is_none()
            && let Some(&[handshake_type, len_0, len_1, len_2]) =
                message.first_chunk::<HANDSHAKE_HEADER_LEN>()
        {
            if handshake_type != HANDSHAKE_CLIENT_HELLO {
                return Err(SniError::NotClientHello { handshake_type });
            }
            let body_len = usize::from(len_0) << 16 | usize::from(len_1) << 8 | usize::from(len_2);
            message_len = Some(HANDSHAKE_HEADER_LEN + body_len);
        }
        if let Some(len) = message_len
            && message.len() >= len
        {
            // Bounded where the message ends even when all of it has arrived, so the
            // answer does not depend on how much the caller happened to buffer.
            bound(start + (len - before))?;
            return Ok(Some(match message {
                // `all` holds at least `len` >= HANDSHAKE_HEADER_LEN bytes (checked above).
                Cow::Borrowed(all) => Cow::Borrowed(&all[HANDSHAKE_HEADER_LEN..len]),
                Cow::Owned(mut all) => {
                    all.truncate(len);
                    all.drain(..HANDSHAKE_HEADER_LEN);
                    Cow::Owned(all)
                }
            }));
        }

        // The message continues past what has arrived. Bound where it can end at the
        // earliest: inside this record if the record is long enough, else after another
        // record header. (The rest of a record past the message is never needed.)
        let lacking = lacking(&message, message_len);
        let record_missing = record_len - available.len();
        let earliest_end = if lacking <= record_missing {
            start + available.len() + lacking
        } else {
            end + RECORD_HEADER_LEN + (lacking - record_missing)
        };
        bound(earliest_end)?;
        if available.len() < record_len {
            return Ok(None);
        }
        offset = end;
    }
}

/// How many message bytes are still to come: up to the end of the handshake header
/// while its length is unknown, else up to the end of the message.
fn lacking(message: &[u8], message_len: Option<usize>) -> usize {
    message_len
        .unwrap_or(HANDSHAKE_HEADER_LEN)
        .saturating_sub(message.len())
}

/// Refuses a ClientHello that needs more than [`MAX_CLIENT_HELLO`] bytes.
fn bound(needed: usize) -> Result<(), SniError> {
    if needed > MAX_CLIENT_HELLO {
        return Err(SniError::TooLarge {
            needed,
            max: MAX_CLIENT_HELLO,
        });
    }
    Ok(())
}

/// Walks a complete ClientHello body to its `server_name` extension.
fn server_name(body: &[u8]) -> Result<Peek, SniError> {
    let mut hello = Reader::new(body);
    let [major, minor] = hello.array("legacy version")?;
    if major != 3 {
        return Err(SniError::HelloVersion { major, minor });
    }
    hello.take(RANDOM_LEN, "random")?;
    let session_id = hello.vec8("session id")?;
    if session_id.len() > MAX_SESSION_ID_LEN {
        return Err(SniError::BadLength {
            field: "session id",
        });
    }
    let suites = hello.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(SniError::BadLength {
            field: "cipher suites",
        });
    }
    if hello.vec8("compression methods")?.is_empty() {
        return Err(SniError::BadLength {
            field: "compression methods",
        });
    }
    if hello.is_empty() {
        // TLS 1.0 to 1.2 allow a ClientHello without extensions.
        return Ok(Peek::NoSni);
    }
    let mut extensions = Reader::new(hello.vec16("extensions")?);
    hello.finish("extensions")?;

    let mut host: Option<&[u8]> = None;
    let mut seen = false;
    while !extensions.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vec16("extension")?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        if seen {
            return Err(SniError::DuplicateServerName);
        }
        seen = true;
        let mut outer = Reader::new(data);
        let mut list = Reader::new(outer.vec16("server name list")?);
        outer.finish("server_name extension")?;
        if list.is_empty() {
            return Err(SniError::BadLength {
                field: "server name list",
            });
        }
        while !list.is_empty() {
            let name_type = list.u8("server name type")?;
            // Every name type RFC 6066 defines (only host_name so far) is a 16-bit
            // length-prefixed string; rustls and OpenSSL read unknown ones the same way.
            let name = list.vec16("server name")?;
            if name_type != NAME_TYPE_HOST_NAME {
                continue;
            }
            if host.is_some() {
                return Err(SniError::DuplicateServerName);
            }
            host = Some(name);
        }
    }
    let Some(host) = host else {
        return Ok(Peek::NoSni);
    };
    // RFC 6066 forbids IP literals, but some clients send them: treat them as no name
    // (as rustls does) rather than routing on an address.
    if std::str::from_utf8(host).is_ok_and(|text| text.parse::<IpAddr>().is_ok()) {
        return Ok(Peek::NoSni);
    }
    Ok(Peek::Sni(normalize_host_name(host)?))
}

/// A cursor over a complete structure; every read checks what remains.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], SniError> {
        let (taken, rest) = self
            .bytes
            .split_at_checked(len)
            .ok_or(SniError::Truncated { field })?;
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], SniError> {
        let (taken, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(SniError::Truncated { field })?;
        self.bytes = rest;
        Ok(*taken)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, SniError> {
        let [byte] = self.array(field)?;
        Ok(byte)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, SniError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self, field: &'static str) -> Result<&'a [u8], SniError> {
        let len = self.u8(field)?;
        self.take(usize::from(len), field)
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self, field: &'static str) -> Result<&'a [u8], SniError> {
        let len = self.u16(field)?;
        self.take(usize::from(len), field)
    }

    /// Refuses bytes left over after the last field of `field`.
    fn finish(&self, field: &'static str) -> Result<(), SniError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(SniError::BadLength { field })
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `openssl s_client -servername app.example.com` (OpenSSL 3.0), captured by a local
    /// listener: one 321-byte record.
    const OPENSSL_HELLO: &str = "160301013c010001380303dc1ba144b5d236746b4eee3838cc3d394d92191e2fa978b0c8346e1b0afa1d2620127c5857a9683d2bb7b49b69ed20e4926e96a3168037401541e2b10d7c1930a3003e130213031301c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d003c0035002f00ff010000b100000014001200000f6170702e6578616d706c652e636f6d000b000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d0020b391a61913d749c2236a21f70038a0df8369da5015095bab2739a88e611b321f";

    /// The same client with `-noservername`.
    const OPENSSL_HELLO_NO_SNI: &str = "16030101240100012003031faa1ba6f860ed3e6843a46ef884b6b62bafd5b9d197d01840eda2b9e617bd662001ff87f9d33f8ceab39463b12100e0cdc1849d95d8ea249e2b97d7118c70f1d1003e130213031301c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d003c0035002f00ff01000099000b000403000102000a00160014001d0017001e0019001801000101010201030104002300000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d00207a4d571bcd8dea0d183ab15399b0614902c43178a59fa65e7abe34d766a4db6d";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn be16(len: usize) -> [u8; 2] {
        u16::try_from(len).expect("fits u16").to_be_bytes()
    }

    /// A `server_name` extension with these (name type, name) entries.
    fn sni_extension(names: &[(u8, &[u8])]) -> (u16, Vec<u8>) {
        let mut list = Vec::new();
        for (kind, name) in names {
            list.push(*kind);
            list.extend_from_slice(&be16(name.len()));
            list.extend_from_slice(name);
        }
        let mut data = be16(list.len()).to_vec();
        data.extend_from_slice(&list);
        (EXTENSION_SERVER_NAME, data)
    }

    /// A ClientHello body with these extensions (`None`: no extensions block at all).
    fn hello_body(extensions: Option<&[(u16, Vec<u8>)]>) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; RANDOM_LEN]);
        body.push(32);
        body.extend_from_slice(&[9; 32]);
        body.extend_from_slice(&[0x00, 0x04, 0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[0x01, 0x00]);
        if let Some(extensions) = extensions {
            // A harmless extension first (supported_versions), so the walk skips one.
            let mut block = vec![0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04];
            for (kind, data) in extensions {
                block.extend_from_slice(&kind.to_be_bytes());
                block.extend_from_slice(&be16(data.len()));
                block.extend_from_slice(data);
            }
            body.extend_from_slice(&be16(block.len()));
            body.extend_from_slice(&block);
        }
        body
    }

    /// The handshake message (header and body).
    fn handshake(body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(body.len()).expect("fits").to_be_bytes();
        let mut message = vec![HANDSHAKE_CLIENT_HELLO, len[1], len[2], len[3]];
        message.extend_from_slice(body);
        message
    }

    /// `message` in records of at most `size` bytes.
    fn records(message: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in message.chunks(size) {
            out.extend_from_slice(&[CONTENT_TYPE_HANDSHAKE, 0x03, 0x01]);
            out.extend_from_slice(&be16(chunk.len()));
            out.extend_from_slice(chunk);
        }
        out
    }

    fn hello_naming(name: &[u8]) -> Vec<u8> {
        let body = hello_body(Some(&[sni_extension(&[(NAME_TYPE_HOST_NAME, name)])]));
        records(&handshake(&body), MAX_RECORD_LEN)
    }

    #[test]
    fn openssl_client_hello_names_its_server() {
        let hello = hex(OPENSSL_HELLO);
        assert_eq!(hello.len(), 321);
        assert_eq!(peek_sni(&hello), Ok(Peek::Sni("app.example.com".into())));
        assert_eq!(peek_sni(&hex(OPENSSL_HELLO_NO_SNI)), Ok(Peek::NoSni));
    }

    #[test]
    fn every_truncation_needs_more() {
        for hello in [
            hex(OPENSSL_HELLO),
            hex(OPENSSL_HELLO_NO_SNI),
            records(&handshake(&hello_body(Some(&[]))), 50),
        ] {
            for len in 0..hello.len() {
                assert_eq!(peek_sni(&hello[..len]), Ok(Peek::NeedMore), "at {len}");
            }
        }
    }

    #[test]
    fn bytes_after_the_hello_are_ignored() {
        let mut bytes = hex(OPENSSL_HELLO);
        bytes.extend_from_slice(b"\x17\x03\x03\x00\x05early garbage");
        assert_eq!(peek_sni(&bytes), Ok(Peek::Sni("app.example.com".into())));
    }

    #[test]
    fn a_hello_split_across_records_is_joined() {
        let message = handshake(&hello_body(Some(&[sni_extension(&[(
            NAME_TYPE_HOST_NAME,
            b"split.example.com",
        )])])));
        // Every record size, including ones that split the handshake header and the name.
        for size in 1..=message.len() {
            let bytes = records(&message, size);
            if bytes.len() > MAX_CLIENT_HELLO {
                continue;
            }
            assert_eq!(
                peek_sni(&bytes),
                Ok(Peek::Sni("split.example.com".into())),
                "records of {size}"
            );
            for len in 0..bytes.len() {
                assert_eq!(peek_sni(&bytes[..len]), Ok(Peek::NeedMore), "{size}/{len}");
            }
        }
    }

    #[test]
    fn not_tls() {
        assert_eq!(peek_sni(b""), Ok(Peek::NeedMore));
        assert_eq!(peek_sni(b"GET / HTTP/1.1\r\n"), Ok(Peek::NotTls));
        assert_eq!(peek_sni(b"G"), Ok(Peek::NotTls));
        // An SSLv2-compatible hello (no SNI possible) and a TLS alert record.
        assert_eq!(peek_sni(&[0x80, 0x2e, 0x01]), Ok(Peek::NotTls));
        assert_eq!(peek_sni(&ALERT_UNRECOGNIZED_NAME), Ok(Peek::NotTls));
    }

    #[test]
    fn names_are_lowercased_and_lose_a_trailing_dot() {
        assert_eq!(
            peek_sni(&hello_naming(b"App.EXAMPLE.com")),
            Ok(Peek::Sni("app.example.com".into()))
        );
        assert_eq!(
            peek_sni(&hello_naming(b"app.example.com.")),
            Ok(Peek::Sni("app.example.com".into()))
        );
        assert_eq!(
            peek_sni(&hello_naming(b"localhost")),
            Ok(Peek::Sni("localhost".into()))
        );
    }

    #[test]
    fn ip_literals_count_as_no_name() {
        for ip in [&b"127.0.0.1"[..], b"::1", b"2001:db8::7"] {
            assert_eq!(peek_sni(&hello_naming(ip)), Ok(Peek::NoSni));
        }
    }

    #[test]
    fn garbage_names_are_refused() {
        let long_label = vec![b'a'; 64];
        let long_name = [
            &[b'a'; 60][..],
            b".",
            &[b'b'; 60],
            b".",
            &[b'c'; 60],
            b".",
            &[b'd'; 60],
            b".x",
        ]
        .concat();
        assert_eq!(long_name.len(), 245);
        assert!(matches!(
            peek_sni(&hello_naming(&long_name)),
            Ok(Peek::Sni(_))
        ));
        let too_long = [&long_name[..], b".abcdefgh"].concat();
        let cases: [(&[u8], HostNameError); 9] = [
            (b"", HostNameError::Empty),
            (b".", HostNameError::Empty),
            (b"a..b", HostNameError::EmptyLabel),
            (b".a", HostNameError::EmptyLabel),
            (
                b"a_b.example.com",
                HostNameError::InvalidByte { byte: b'_' },
            ),
            (b"a b", HostNameError::InvalidByte { byte: b' ' }),
            (b"a\0b", HostNameError::InvalidByte { byte: 0 }),
            (
                &long_label,
                HostNameError::LabelTooLong { len: 64, max: 63 },
            ),
            (&too_long, HostNameError::TooLong { len: 254, max: 253 }),
        ];
        for (name, problem) in cases {
            assert_eq!(
                peek_sni(&hello_naming(name)),
                Err(SniError::InvalidHostName(problem)),
                "{name:?}"
            );
        }
        assert_eq!(
            peek_sni(&hello_naming("bücher.example".as_bytes())),
            Err(SniError::InvalidHostName(HostNameError::InvalidByte {
                byte: 0xc3
            }))
        );
    }

    #[test]
    fn hellos_without_a_host_name() {
        let no_extensions = records(&handshake(&hello_body(None)), MAX_RECORD_LEN);
        assert_eq!(peek_sni(&no_extensions), Ok(Peek::NoSni));
        let empty_extensions = records(&handshake(&hello_body(Some(&[]))), MAX_RECORD_LEN);
        assert_eq!(peek_sni(&empty_extensions), Ok(Peek::NoSni));
        // A name of another (future) type is skipped.
        let other_type = hello_body(Some(&[sni_extension(&[(7, b"whatever")])]));
        assert_eq!(
            peek_sni(&records(&handshake(&other_type), MAX_RECORD_LEN)),
            Ok(Peek::NoSni)
        );
    }

    #[test]
    fn two_names_are_refused() {
        let two_entries = hello_body(Some(&[sni_extension(&[
            (NAME_TYPE_HOST_NAME, b"a.example.com"),
            (NAME_TYPE_HOST_NAME, b"b.example.com"),
        ])]));
        let two_extensions = hello_body(Some(&[
            sni_extension(&[(NAME_TYPE_HOST_NAME, b"a.example.com")]),
            sni_extension(&[(NAME_TYPE_HOST_NAME, b"a.example.com")]),
        ]));
        for body in [two_entries, two_extensions] {
            assert_eq!(
                peek_sni(&records(&handshake(&body), MAX_RECORD_LEN)),
                Err(SniError::DuplicateServerName)
            );
        }
    }

    #[test]
    fn malformed_records_are_refused() {
        let mut hello = hex(OPENSSL_HELLO);
        hello[1] = 0x02;
        assert_eq!(
            peek_sni(&hello),
            Err(SniError::RecordVersion { major: 2, minor: 1 })
        );
        assert_eq!(
            peek_sni(&[0x16, 0x03, 0x05, 0x00]),
            Ok(Peek::NeedMore),
            "the header is checked once complete"
        );
        assert_eq!(
            peek_sni(&[0x16, 0x03, 0x05, 0x00, 0x01]),
            Err(SniError::RecordVersion { major: 3, minor: 5 })
        );
        assert_eq!(
            peek_sni(&[0x16, 0x03, 0x01, 0x00, 0x00]),
            Err(SniError::EmptyRecord)
        );
        assert_eq!(
            peek_sni(&[0x16, 0x03, 0x01, 0x40, 0x01]),
            Err(SniError::RecordTooLong {
                len: MAX_RECORD_LEN + 1,
                max: MAX_RECORD_LEN
            })
        );
        // A ServerHello (type 2) is not what a client sends first.
        assert_eq!(
            peek_sni(&[0x16, 0x03, 0x03, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00]),
            Err(SniError::NotClientHello { handshake_type: 2 })
        );
        // An alert record in the middle of a split ClientHello.
        let mut split = records(&handshake(&hello_body(Some(&[]))), 40);
        split[45] = 0x15;
        assert_eq!(
            peek_sni(&split),
            Err(SniError::UnexpectedRecord { content_type: 0x15 })
        );
    }

    #[test]
    fn a_hello_needing_more_than_the_limit_is_refused_early() {
        // Declares a body of 20,000 bytes: refused on its first record's header.
        assert!(matches!(
            peek_sni(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x4e, 0x20]),
            Err(SniError::TooLarge { .. })
        ));
        // One byte per record: five bytes of header for each byte of message, so a
        // 4,000-byte hello needs 24,000 bytes of records.
        let body = hello_body(Some(&[(0x15, vec![0; 3_900])]));
        let bytes = records(&handshake(&body), 1);
        let refused = (0..bytes.len())
            .find(|&len| peek_sni(&bytes[..len]).is_err())
            .expect("refused at some point");
        assert!(refused <= MAX_CLIENT_HELLO, "refused after {refused} bytes");
        // A full-size record is fine: pad a hello to exactly MAX_CLIENT_HELLO bytes.
        let padded = |padding: usize| {
            let body = hello_body(Some(&[
                sni_extension(&[(NAME_TYPE_HOST_NAME, b"big.example.com")]),
                (0x15, vec![0; padding]),
            ]));
            records(&handshake(&body), MAX_RECORD_LEN)
        };
        let bytes = padded(MAX_CLIENT_HELLO - padded(0).len());
        assert_eq!(bytes.len(), MAX_CLIENT_HELLO);
        assert_eq!(peek_sni(&bytes), Ok(Peek::Sni("big.example.com".into())));
    }

    #[test]
    fn lying_lengths_are_refused() {
        let good = hello_body(Some(&[sni_extension(&[(
            NAME_TYPE_HOST_NAME,
            b"app.example.com",
        )])]));
        let session_id_at = 2 + RANDOM_LEN;
        let suites_at = session_id_at + 1 + 32;
        let compression_at = suites_at + 2 + 4;
        let extensions_at = compression_at + 2;
        let cases: Vec<(usize, u8, SniError)> = vec![
            (0, 0x04, SniError::HelloVersion { major: 4, minor: 3 }),
            (
                session_id_at,
                33,
                SniError::BadLength {
                    field: "session id",
                },
            ),
            (
                session_id_at,
                200,
                SniError::Truncated {
                    field: "session id",
                },
            ),
            (
                suites_at + 1,
                3,
                SniError::BadLength {
                    field: "cipher suites",
                },
            ),
            (
                suites_at + 1,
                0,
                SniError::BadLength {
                    field: "cipher suites",
                },
            ),
            (
                compression_at,
                0,
                SniError::BadLength {
                    field: "compression methods",
                },
            ),
            (
                extensions_at + 1,
                0xff,
                SniError::Truncated {
                    field: "extensions",
                },
            ),
            (
                extensions_at + 1,
                7,
                SniError::BadLength {
                    field: "extensions",
                },
            ),
            // The server_name extension's data length (after supported_versions).
            (
                extensions_at + 2 + 7 + 3,
                0xff,
                SniError::Truncated { field: "extension" },
            ),
            // Its list length, one too short and one too long.
            (
                extensions_at + 2 + 7 + 5,
                17,
                SniError::BadLength {
                    field: "server_name extension",
                },
            ),
            (
                extensions_at + 2 + 7 + 5,
                19,
                SniError::Truncated {
                    field: "server name list",
                },
            ),
            // The name's length, one too short: the list has a byte over.
            (
                extensions_at + 2 + 7 + 8,
                14,
                SniError::Truncated {
                    field: "server name",
                },
            ),
            (
                extensions_at + 2 + 7 + 8,
                0xff,
                SniError::Truncated {
                    field: "server name",
                },
            ),
        ];
        for (at, value, expected) in cases {
            let mut body = good.clone();
            body[at] = value;
            let bytes = records(&handshake(&body), MAX_RECORD_LEN);
            assert_eq!(peek_sni(&bytes), Err(expected), "byte {at} = {value}");
        }
        // A byte after the extensions, inside the handshake message.
        let mut body = good.clone();
        body.push(0);
        assert_eq!(
            peek_sni(&records(&handshake(&body), MAX_RECORD_LEN)),
            Err(SniError::BadLength {
                field: "extensions"
            })
        );
        // A handshake length shorter than the body: the extensions run past it.
        let mut message = handshake(&good);
        message[3] -= 1;
        assert_eq!(
            peek_sni(&records(&message, MAX_RECORD_LEN)),
            Err(SniError::Truncated {
                field: "extensions"
            })
        );
    }

    #[test]
    fn a_record_longer_than_the_hello_is_not_waited_for() {
        // Found by the fuzzer: the second record declares 2^14 bytes, more than the limit
        // allows after the first, but the message ends early in it. Every prefix must
        // agree with the whole: the limit applies where the message ends.
        let message = handshake(&hello_body(Some(&[sni_extension(&[(
            NAME_TYPE_HOST_NAME,
            b"app.example.com",
        )])])));
        let (first, rest) = message.split_at(100);
        let mut bytes = records(first, MAX_RECORD_LEN);
        bytes.extend_from_slice(&[CONTENT_TYPE_HANDSHAKE, 0x03, 0x01, 0x40, 0x00]);
        bytes.extend_from_slice(rest);
        assert_eq!(peek_sni(&bytes), Ok(Peek::Sni("app.example.com".into())));
        for len in 0..bytes.len() {
            assert_eq!(peek_sni(&bytes[..len]), Ok(Peek::NeedMore), "at {len}");
        }
        // A message ending past the limit is refused even when all of it has arrived.
        let body = hello_body(Some(&[(0x15, vec![0; MAX_RECORD_LEN])]));
        let message = handshake(&body);
        let (first, rest) = message.split_at(MAX_RECORD_LEN);
        let mut bytes = records(first, MAX_RECORD_LEN);
        bytes.extend_from_slice(&records(rest, MAX_RECORD_LEN));
        assert!(matches!(peek_sni(&bytes), Err(SniError::TooLarge { .. })));
    }

    #[test]
    fn the_alert_is_a_fatal_unrecognized_name() {
        let [
            content_type,
            major,
            minor,
            len_high,
            len_low,
            level,
            description,
        ] = ALERT_UNRECOGNIZED_NAME;
        assert_eq!((content_type, major, minor), (21, 3, 3));
        assert_eq!(u16::from_be_bytes([len_high, len_low]), 2);
        assert_eq!((level, description), (2, 112));
    }

    #[test]
    fn errors_are_sentences() {
        let error = SniError::InvalidHostName(HostNameError::InvalidByte { byte: b'_' });
        assert_eq!(
            error.to_string(),
            "the client's ClientHello asks for an invalid server name: the host name contains \
             the byte 0x5f; only ASCII letters, digits, `-` and `.` are allowed"
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            check(&bytes);
            let mut tls = vec![0x16, 0x03, 0x01];
            tls.extend_from_slice(&bytes);
            check(&tls);
        }

        #[test]
        fn mutated_hellos_never_panic(
            flips in proptest::collection::vec((0..321usize, any::<u8>()), 1..6),
            cut in 0..=321usize,
        ) {
            let mut hello = hex(OPENSSL_HELLO);
            for (at, value) in flips {
                hello[at] = value;
            }
            check(&hello[..cut]);
        }
    }

    /// The invariants the fuzz target checks too.
    fn check(bytes: &[u8]) {
        let whole = peek_sni(bytes);
        if let Some(cut) = bytes.len().checked_sub(1) {
            let prefix = peek_sni(&bytes[..cut]);
            assert!(
                prefix == Ok(Peek::NeedMore)
                    || prefix == whole
                    || (prefix.is_err() && whole.is_err()),
                "prefix {prefix:?} vs whole {whole:?}"
            );
        }
        match whole {
            Ok(Peek::NeedMore) => assert!(bytes.len() < MAX_CLIENT_HELLO),
            Ok(Peek::Sni(name)) => {
                assert_eq!(normalize_host_name(name.as_bytes()).as_deref(), Ok(&*name));
            }
            Ok(Peek::NotTls) => assert_ne!(bytes.first(), Some(&CONTENT_TYPE_HANDSHAKE)),
            Ok(Peek::NoSni) | Err(_) => {}
        }
    }
}
