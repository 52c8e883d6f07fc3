//! [`QuicError`]: everything that can go wrong setting up a QUIC endpoint or an authenticated
//! connection, each message saying what was wrong, which side failed, and what to do.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::settings::SettingsError;

/// Why a QUIC endpoint, certificate or authenticated connection could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuicError {
    /// The settings are unusable (local config).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The UDP socket could not be created or bound (local; retrying rarely helps).
    #[error(
        "cannot bind the QUIC UDP socket on {addr}: {source}; is another process using that UDP port, or is the address not on this machine?"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// A certificate or key file is missing, unreadable or corrupt (local config).
    #[error("cannot use {path}: {problem}; {fix}")]
    CertificateFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// What to do about it.
        fix: &'static str,
    },
    /// Certificate generation or the TLS configuration failed (internal, or a key type
    /// rustls does not support).
    #[error("cannot set up TLS for QUIC: {0}")]
    Tls(String),
    /// A name given for a certificate cannot go into one (local input).
    #[error("cannot issue a certificate for {name:?}: {reason}")]
    CertificateName {
        /// The name given.
        name: String,
        /// What is wrong and what is accepted.
        reason: &'static str,
    },
    /// The server name is not a valid DNS name or IP address for TLS (local config).
    #[error(
        "cannot connect with QUIC to {server} as {name:?}: {reason}; give the server as a host name or IP address"
    )]
    ServerName {
        /// The address.
        server: SocketAddr,
        /// The name given.
        name: String,
        /// quinn's reason.
        reason: String,
    },
    /// The deadline for handshake and authentication passed (peer or network; retry).
    #[error(
        "QUIC handshake and authentication with {peer} did not finish within {deadline:?}; check that UDP reaches the server's port (firewalls often drop UDP) and that the server runs transport = \"quic\""
    )]
    Timeout {
        /// The peer.
        peer: SocketAddr,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// The QUIC connection failed or was lost during the handshake or authentication (peer
    /// or network; retry).
    #[error("the QUIC connection with {peer} failed during {stage}: {source}")]
    Connection {
        /// The peer.
        peer: SocketAddr,
        /// "handshake" or "authentication".
        stage: &'static str,
        /// quinn's error.
        source: quinn::ConnectionError,
    },
    /// Client side: the server closed the connection after our PSK proof (peer refused us;
    /// retrying with the same PSK will not help).
    #[error(
        "the server {server} closed the connection during authentication: wrong PSK? Check that both sides use the same psk"
    )]
    WrongPsk {
        /// The server.
        server: SocketAddr,
    },
    /// Client side: the server's PSK proof is wrong, so whoever answered does not know our
    /// PSK: a different server, or someone in the middle. Nothing was sent after our proof.
    #[error(
        "the server {server} failed to prove it knows the PSK: it is not the Warren server you configured (or someone is in the middle); not connecting. Check the address, or pin the server's certificate with server_cert_sha256"
    )]
    ServerProofInvalid {
        /// The server.
        server: SocketAddr,
    },
    /// Server side: a client's PSK proof was wrong; its connection was closed with no
    /// information (peer; expected from scanners and misconfigured clients).
    #[error(
        "a QUIC client at {peer} failed PSK authentication (wrong PSK or not a Warren client); closed without an answer"
    )]
    ClientProofInvalid {
        /// The client.
        peer: SocketAddr,
    },
    /// Client side: we refused the server's certificate: a `server_cert_sha256` pin that
    /// does not match, or (mtls) a certificate not from our CA or not for the name.
    #[error(
        "refused the QUIC server certificate of {server}: {reason}. With server_cert_sha256 the pin must equal the SHA-256 the server logs at start; with mtls the server's certificate must come from the configured CA and name the host you connect to"
    )]
    ServerCertificate {
        /// The server.
        server: SocketAddr,
        /// rustls's reason.
        reason: String,
    },
    /// Client side (mtls): the server refused our client certificate, or we sent none.
    #[error(
        "the QUIC server {server} refused our client certificate (TLS alert: {reason}); mtls needs a client certificate signed by the server's CA (`warren cert client`)"
    )]
    ClientCertificateRefused {
        /// The server.
        server: SocketAddr,
        /// The alert, as the server sent it.
        reason: String,
    },
    /// Server side (mtls): a client presented no certificate or one the CA did not sign
    /// (peer; expected from strangers).
    #[error(
        "a QUIC client at {peer} was refused: its certificate did not verify against the client CA ({reason})"
    )]
    ClientCertificate {
        /// The client.
        peer: SocketAddr,
        /// rustls's reason.
        reason: String,
    },
    /// The client's first stream did not open (peer or network).
    #[error("the QUIC control stream with {peer} could not be opened: {reason}")]
    ControlStream {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The endpoint is closed (local; it was shut down).
    #[error("the QUIC endpoint is closed")]
    EndpointClosed,
}

impl QuicError {
    /// Whether trying again (after a backoff) may succeed: true for network and peer
    /// trouble, false for configuration and authentication failures.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            QuicError::Timeout { .. }
                | QuicError::Connection { .. }
                | QuicError::ControlStream { .. }
        )
    }
}
