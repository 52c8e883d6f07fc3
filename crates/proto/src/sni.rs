//! Stub until the SNI parser lands.

/// Most bytes buffered for a ClientHello.
pub const MAX_CLIENT_HELLO: usize = 16 * 1024 + 5;
/// A fatal `unrecognized_name` alert record.
pub const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// What the first bytes say.
pub enum Peek<'a> {
    /// More bytes needed.
    NeedMore,
    /// The name.
    Sni(&'a str),
    /// No SNI.
    NoSni,
    /// Not TLS.
    NotTls,
}

/// Peeks (stub: never finds a name).
///
/// # Errors
/// Never (stub).
pub fn peek_sni(bytes: &[u8]) -> Result<Peek<'_>, String> {
    Ok(if bytes.first() == Some(&22) {
        Peek::NoSni
    } else {
        Peek::NotTls
    })
}
