//! Authenticating a QUIC connection: the handshake, then (in `psk` mode) PSK proofs bound
//! to the TLS exporter, and the control stream.
//!
//! rustls has no external-PSK support, so the PSK is proved inside the connection, over a
//! value only the two TLS endpoints of *this* connection know:
//!
//! ```text
//! exporter     = TLS-Exporter(label "EXPORTER-warren-psk-proof", context "warren/1", 32 bytes)
//! proof key    = HKDF-SHA256(ikm = PSK, salt = "", info = "warren quic psk proof v1")
//! client proof = HMAC-SHA256(proof key, "warren quic client proof" || exporter)
//! server proof = HMAC-SHA256(proof key, "warren quic server proof" || exporter)
//!
//! client                                              server
//!   QUIC + TLS 1.3 handshake (psk mode: any cert, or the pinned one) ->
//!   opens bidi stream 0, writes client proof (32) ->
//!                                                     verifies in constant time;
//!                                                     wrong: CONNECTION_CLOSE(code 1, "")
//!                            <- server proof (32)
//!   verifies in constant time; wrong: closes, refuses
//!   stream 0 is the session's control stream from here on, both ways
//! ```
//!
//! A relay in the middle terminates TLS with its own keys, so it sees a different exporter
//! on each side and cannot turn one side's proof into the other's; without the PSK it cannot
//! compute them either. The server answers a wrong proof with a generic close (application
//! code [`CLOSE_REFUSED`], empty reason) and says nothing else. The client checks the
//! server's proof, so it authenticates the server by PSK even without a certificate pin.
//! The proof key's label differs from every other Warren derivation (the Noise PSK uses
//! `"warren noise psk v1"`).
//!
//! In `mtls` mode TLS has authenticated both sides already: the client opens stream 0 and
//! it is the control stream as is. quinn announces a stream to the peer only with its first
//! bytes, so the client speaks first on it (its hello), and the server's [`accept`] returns
//! when those bytes arrive.
//!
//! One deadline covers the handshake and the proofs (and, in `mtls` mode, the wait for the
//! client's first bytes), so a silent or slow peer costs a bounded time and one gate permit.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::{ConnectionError, ReadExactError, VarInt};

use super::endpoint::{Admitted, QuicEndpoint};
use super::error::QuicError;
use super::tls::{ALPN, ClientAuth, ClientTls, ServerAuth, ServerTls};
use crate::crypto::kdf;
use crate::crypto::secret::Secret;

/// The TLS exporter label of the PSK proof (RFC 8446 §7.5; labels start with "EXPORTER").
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-warren-psk-proof";
/// The proof key's HKDF info: distinct from every other Warren derivation.
const PROOF_KEY_INFO: &[u8] = b"warren quic psk proof v1";
/// Direction label of the client's proof.
const CLIENT_PROOF: &[u8] = b"warren quic client proof";
/// Direction label of the server's proof.
const SERVER_PROOF: &[u8] = b"warren quic server proof";
/// Length of a proof on the wire.
pub const PROOF_LEN: usize = 32;

/// The application close code of a refused connection: the same for every reason, with an
/// empty reason phrase, so a peer learns nothing about why.
pub const CLOSE_REFUSED: VarInt = VarInt::from_u32(1);

/// A connection whose peer is authenticated, with its control stream.
#[derive(Debug)]
pub struct Authenticated {
    /// The QUIC connection: open and accept streams, datagrams, stats, close.
    pub connection: quinn::Connection,
    /// Bidirectional stream 0, opened by the client: the session's control stream. In `psk`
    /// mode the proofs have been read from it already; nothing else has.
    pub control: (quinn::SendStream, quinn::RecvStream),
}

/// Connects to `server` and authenticates both ways within `deadline`.
///
/// `server_name` is sent as SNI and, in `mtls` mode, must be a name the server's
/// certificate holds; in `psk` mode any valid host name works (use the configured host).
/// Reuse one `tls` for every connect: resumption tickets live in it.
///
/// # Errors
///
/// [`QuicError::WrongPsk`] if the server closed the connection after our proof;
/// [`QuicError::ServerProofInvalid`] if the server's proof is wrong;
/// [`QuicError::ServerCertificate`] if we refused its certificate (pin or CA);
/// [`QuicError::ClientCertificateRefused`] if it refused ours;
/// [`QuicError::Timeout`] when the deadline passes;
/// [`QuicError::Connection`] / [`QuicError::ControlStream`] when the network fails;
/// [`QuicError::ServerName`] for a name TLS cannot use.
pub async fn connect(
    endpoint: &QuicEndpoint,
    server: SocketAddr,
    server_name: &str,
    tls: &ClientTls,
    deadline: Duration,
) -> Result<Authenticated, QuicError> {
    let config = tls.quinn_client_config_with(endpoint.transport_config());
    let connecting = endpoint
        .endpoint
        .connect_with(config, server, server_name)
        .map_err(|e| match e {
            quinn::ConnectError::EndpointStopping => QuicError::EndpointClosed,
            other => QuicError::ServerName {
                server,
                name: server_name.to_owned(),
                reason: other.to_string(),
            },
        })?;
    let work = async {
        let connection = connecting.await.map_err(|e| client_error(server, e))?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|e| client_error(server, e))?;
        if let ClientAuth::Psk(psk) = tls.auth() {
            let proofs = Proofs::new(psk, &connection)?;
            send.write_all(&proofs.client)
                .await
                .map_err(|e| client_write_error(server, &connection, e))?;
            let mut answer = [0u8; PROOF_LEN];
            recv.read_exact(&mut answer)
                .await
                .map_err(|e| client_read_error(server, &connection, e))?;
            if !proofs.verify_server(&answer) {
                connection.close(CLOSE_REFUSED, b"");
                return Err(QuicError::ServerProofInvalid { server });
            }
        }
        Ok(Authenticated {
            connection,
            control: (send, recv),
        })
    };
    match tokio::time::timeout(deadline, work).await {
        Ok(result) => result,
        // Dropping `work` drops the connection, which closes it.
        Err(_) => Err(QuicError::Timeout {
            peer: server,
            deadline,
        }),
    }
}

/// Completes an admitted connection attempt and authenticates the client within
/// `deadline`; the gate permit is returned when this returns.
///
/// A client that fails authentication gets a generic close ([`CLOSE_REFUSED`], empty
/// reason) and nothing else; so does one that runs out of time.
///
/// # Errors
///
/// [`QuicError::ClientProofInvalid`] for a wrong PSK proof;
/// [`QuicError::ClientCertificate`] for a client certificate the CA did not sign, or none;
/// [`QuicError::Timeout`] when the deadline passes;
/// [`QuicError::Connection`] / [`QuicError::ControlStream`] when the network fails.
pub async fn accept(
    admitted: Admitted,
    tls: &ServerTls,
    deadline: Duration,
) -> Result<Authenticated, QuicError> {
    let peer = admitted.remote_address();
    // One deadline for both phases; they are split only to keep a handle on the
    // connection, so that a client that runs out of time is closed with our generic code.
    let until = tokio::time::Instant::now() + deadline;
    let Admitted { incoming, _permit } = admitted;
    let handshake = async {
        let connecting = incoming
            .accept()
            .map_err(|e| server_handshake_error(peer, e))?;
        connecting
            .await
            .map_err(|e| server_handshake_error(peer, e))
    };
    let connection = match tokio::time::timeout_at(until, handshake).await {
        Ok(result) => result?,
        // Dropping the unfinished handshake makes quinn abandon it.
        Err(_) => return Err(QuicError::Timeout { peer, deadline }),
    };
    let authenticate = async {
        let (mut send, mut recv) =
            connection
                .accept_bi()
                .await
                .map_err(|e| QuicError::Connection {
                    peer,
                    stage: "authentication",
                    source: e,
                })?;
        if let ServerAuth::Psk(psk) = tls.auth() {
            let proofs = Proofs::new(psk, &connection)?;
            let mut proof = [0u8; PROOF_LEN];
            recv.read_exact(&mut proof)
                .await
                .map_err(|e| read_error(peer, e))?;
            if !proofs.verify_client(&proof) {
                return Err(QuicError::ClientProofInvalid { peer });
            }
            send.write_all(&proofs.server)
                .await
                .map_err(|e| QuicError::ControlStream {
                    peer,
                    reason: e.to_string(),
                })?;
        }
        Ok((send, recv))
    };
    match tokio::time::timeout_at(until, authenticate).await {
        Ok(Ok(control)) => Ok(Authenticated {
            connection,
            control,
        }),
        Ok(Err(error)) => {
            connection.close(CLOSE_REFUSED, b"");
            Err(error)
        }
        Err(_) => {
            connection.close(CLOSE_REFUSED, b"");
            Err(QuicError::Timeout { peer, deadline })
        }
    }
}

/// Both proofs of one connection.
struct Proofs {
    key: [u8; 32],
    exporter: [u8; 32],
    client: [u8; PROOF_LEN],
    server: [u8; PROOF_LEN],
}

impl Proofs {
    fn new(psk: &Secret, connection: &quinn::Connection) -> Result<Self, QuicError> {
        let mut key = [0u8; 32];
        kdf::hkdf_expand(psk.as_bytes(), b"", &[PROOF_KEY_INFO], &mut key)
            .map_err(|e| QuicError::Tls(format!("PSK proof key: {e}")))?;
        let mut exporter = [0u8; 32];
        connection
            .export_keying_material(&mut exporter, EXPORTER_LABEL, ALPN)
            .map_err(|_| {
                QuicError::Tls("the TLS exporter is unavailable (internal error)".into())
            })?;
        Ok(Proofs {
            client: kdf::hmac_sha256(&key, &[CLIENT_PROOF, &exporter]),
            server: kdf::hmac_sha256(&key, &[SERVER_PROOF, &exporter]),
            key,
            exporter,
        })
    }

    fn verify_client(&self, proof: &[u8]) -> bool {
        kdf::verify_hmac_sha256(&self.key, &[CLIENT_PROOF, &self.exporter], proof)
    }

    fn verify_server(&self, proof: &[u8]) -> bool {
        kdf::verify_hmac_sha256(&self.key, &[SERVER_PROOF, &self.exporter], proof)
    }
}

/// Whether quinn's error is a TLS failure (a CRYPTO_ERROR, codes 0x100–0x1ff: a TLS alert).
fn is_tls_alert(code: quinn::TransportErrorCode) -> bool {
    (0x100..=0x1ff).contains(&u64::from(code))
}

/// What a connection failure on the client side means, for the user: a TLS alert we raised
/// is a refused server certificate, one the server raised is a refused client certificate,
/// and the server's generic close during authentication is a wrong PSK.
///
/// [`connect`] uses it; use it too for failures on the control stream right after
/// [`connect`] in `mtls` mode. TLS 1.3 lets a client finish its handshake before the server
/// has checked the client's certificate, so a refused client certificate can surface on the
/// first read of the control stream rather than in [`connect`].
pub fn client_error(server: SocketAddr, error: ConnectionError) -> QuicError {
    match &error {
        // Our rustls refused the server's certificate.
        ConnectionError::TransportError(e) if is_tls_alert(e.code) => {
            QuicError::ServerCertificate {
                server,
                reason: e.reason.clone(),
            }
        }
        // The server's rustls refused us: in mtls mode, our certificate.
        ConnectionError::ConnectionClosed(close) if is_tls_alert(close.error_code) => {
            QuicError::ClientCertificateRefused {
                server,
                reason: close.error_code.to_string(),
            }
        }
        ConnectionError::ApplicationClosed(close) if close.error_code == CLOSE_REFUSED => {
            QuicError::WrongPsk { server }
        }
        _ => QuicError::Connection {
            peer: server,
            stage: "authentication",
            source: error,
        },
    }
}

fn server_handshake_error(peer: SocketAddr, error: ConnectionError) -> QuicError {
    match &error {
        ConnectionError::TransportError(e) if is_tls_alert(e.code) => {
            QuicError::ClientCertificate {
                peer,
                reason: e.reason.clone(),
            }
        }
        _ => QuicError::Connection {
            peer,
            stage: "handshake",
            source: error,
        },
    }
}

fn client_write_error(
    server: SocketAddr,
    connection: &quinn::Connection,
    error: quinn::WriteError,
) -> QuicError {
    let lost = match error {
        quinn::WriteError::ConnectionLost(e) => Some(e),
        _ => connection.close_reason(),
    };
    match lost {
        Some(e) => client_error(server, e),
        None => QuicError::ControlStream {
            peer: server,
            reason: "the server stopped the control stream".into(),
        },
    }
}

fn client_read_error(
    server: SocketAddr,
    connection: &quinn::Connection,
    error: ReadExactError,
) -> QuicError {
    let lost = match error {
        ReadExactError::ReadError(quinn::ReadError::ConnectionLost(e)) => Some(e),
        _ => connection.close_reason(),
    };
    match lost {
        Some(e) => client_error(server, e),
        None => QuicError::ControlStream {
            peer: server,
            reason: "the server ended the control stream before its proof".into(),
        },
    }
}

fn read_error(peer: SocketAddr, error: ReadExactError) -> QuicError {
    match error {
        ReadExactError::ReadError(quinn::ReadError::ConnectionLost(e)) => QuicError::Connection {
            peer,
            stage: "authentication",
            source: e,
        },
        other => QuicError::ControlStream {
            peer,
            reason: other.to_string(),
        },
    }
}
