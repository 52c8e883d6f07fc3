//! The first frames of every connection, both sides, over a [`Wire`].
//!
//! The byte layouts and the Noise state machine live in [`warren_proto::handshake`]; this
//! module only moves frames and turns the results into [`Channel`]s. Callers put one deadline
//! around the whole exchange.

use std::io;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_proto::CipherPolicy;
use warren_proto::handshake::{
    self, ClientHandshake, DataAccept, DataHello, Established, HandshakeError, NONCE_LEN, Preamble,
};

use crate::Side;
use crate::crypto::keys::SessionKeys;
use crate::transport::Channel;
use crate::transport::wire::Wire;

/// Failures while exchanging preambles.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreambleError {
    /// The socket failed or closed.
    #[error("connection error during handshake: {0}")]
    Io(#[from] io::Error),
    /// The peer's frames were wrong: authentication, format, or refusal.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The server did not accept the data channel (it closes in silence when it does not know
    /// the session, e.g. after a restart).
    #[error("the server closed the data channel without accepting it (session gone?)")]
    ChannelRefused,
}

/// Reads one length-prefixed frame body, checking the length before allocating.
pub async fn read_frame(stream: &mut Wire) -> Result<Vec<u8>, PreambleError> {
    let mut prefix = [0u8; 2];
    stream.read_exact(&mut prefix).await?;
    let len = handshake::frame_len(prefix)?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(body)
}

/// Client: runs the control-channel handshake on a fresh connection, with a `wss`
/// client's `tls_proof` ([`crate::crypto::keys::tls_proof`]) when it has one.
///
/// # Errors
/// [`PreambleError::Io`] with `UnexpectedEof` when the server closed in silence (the usual
/// sign of a wrong PSK), [`HandshakeError::Refused`] when the server declined.
pub async fn client_handshake(
    stream: &mut Wire,
    noise_psk: &[u8; 32],
    ciphers: &CipherPolicy,
    tls_proof: Option<[u8; 32]>,
) -> Result<Established, PreambleError> {
    let (state, first) = ClientHandshake::start_proving(noise_psk, ciphers, tls_proof)?;
    stream.write_all(&first).await?;
    stream.flush().await?;
    let reply = read_frame(stream).await?;
    Ok(state.handle_reply(&reply)?)
}

/// Client: opens a data channel of `keys`'s session on a fresh connection.
///
/// # Errors
/// [`PreambleError::ChannelRefused`] when the server closed without answering,
/// [`HandshakeError::Unauthenticated`] when its answer did not verify.
pub async fn client_data_channel(
    stream: Wire,
    keys: &SessionKeys,
) -> Result<Channel, PreambleError> {
    client_data_channel_of_kind(stream, keys, handshake::KIND_DATA).await
}

/// Client: opens a data channel with preamble kind `kind` (`KIND_DATA` for the pool,
/// `KIND_DATA_OPEN` for a stream the client opens).
///
/// # Errors
/// As [`client_data_channel`].
pub async fn client_data_channel_of_kind(
    mut stream: Wire,
    keys: &SessionKeys,
    kind: u8,
) -> Result<Channel, PreambleError> {
    let mut client_nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut client_nonce);
    let hello = DataHello {
        session_id: *keys.session_id(),
        client_nonce,
        mac: keys.data_hello_mac(&client_nonce),
    };
    stream.write_all(&hello.to_frame_of_kind(kind)).await?;
    stream.flush().await?;
    let reply = match read_frame(&mut stream).await {
        Err(PreambleError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(PreambleError::ChannelRefused);
        }
        other => other?,
    };
    let accept = DataAccept::from_bytes(&reply)?;
    if !keys.verify_data_accept(&client_nonce, &accept.server_nonce, &accept.mac) {
        return Err(HandshakeError::Unauthenticated.into());
    }
    let (sealer, opener) = keys.data_channel(Side::Client, &client_nonce, &accept.server_nonce);
    Ok(Channel::new(stream, sealer, opener))
}

/// What a new connection to the server turned out to be.
pub enum Incoming {
    /// A control channel: Noise message 1 (not yet authenticated).
    Control(Vec<u8>),
    /// A data channel hello (not yet authenticated).
    Data(DataHello),
    /// A data channel that opens a stream (forward service) at once (not yet authenticated).
    DataOpen(DataHello),
}

/// Server: reads the preamble of a new connection.
///
/// # Errors
/// Socket errors and malformed frames; the caller closes without answering.
pub async fn server_read_preamble(stream: &mut Wire) -> Result<Incoming, PreambleError> {
    let body = read_frame(stream).await?;
    Ok(match handshake::parse_preamble(&body)? {
        Preamble::Control(message1) => Incoming::Control(message1.to_vec()),
        Preamble::Data(hello) => Incoming::Data(hello),
        Preamble::DataOpen(hello) => Incoming::DataOpen(hello),
    })
}

/// Server: answers a verified data hello and turns the connection into a channel.
///
/// The caller has already checked `hello.mac` with [`SessionKeys::verify_data_hello`].
///
/// # Errors
/// Socket errors.
pub async fn server_accept_data_channel(
    mut stream: Wire,
    keys: &SessionKeys,
    hello: &DataHello,
) -> Result<Channel, PreambleError> {
    let mut server_nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut server_nonce);
    let accept = DataAccept {
        server_nonce,
        mac: keys.data_accept_mac(&hello.client_nonce, &server_nonce),
    };
    stream.write_all(&accept.to_frame()).await?;
    stream.flush().await?;
    let (sealer, opener) = keys.data_channel(Side::Server, &hello.client_nonce, &server_nonce);
    Ok(Channel::new(stream, sealer, opener))
}
