//! The server's QUIC listener (`transport = "quic"`): one UDP socket at `bind` for every
//! client's connection, its control stream, its visitors' streams and its UDP services'
//! datagrams.
//!
//! A connection attempt passes the endpoint's handshake gate (bounded handshakes in flight,
//! address validation under load), then TLS 1.3 and the PSK proof (or the client
//! certificate), then the same hello as on the TCP transports, all within one
//! `handshake_timeout`, off the accept loop. What follows is an ordinary session whose
//! streams are the connection's ([`crate::session::quic`]).

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use tracing::{debug, info, warn};
use warren_proto::handshake::PROTOCOL_VERSION;

use super::{Rejected, ServerError, Shared, hello, run_session, serve_hello};
use crate::config::ServerConfig;
use crate::config::quic::{QuicAuth, QuicConfig};
use crate::crypto::keys::SessionKeys;
use crate::metrics::HandshakeFailure;
use crate::session::link::Carrier;
use crate::session::quic as quic_streams;
use crate::transport::quic::{self, Admitted, QuicEndpoint, QuicError, ServerTls, certs};

/// The bound QUIC endpoint and the TLS settings connections are accepted with.
pub(super) struct QuicListener {
    pub(super) endpoint: QuicEndpoint,
    /// Replaced by a reload that changes the PSK.
    tls: RwLock<Arc<ServerTls>>,
}

impl QuicListener {
    /// Binds `config.bind` (UDP) with the config's certificates and PSK.
    pub(super) fn bind(config: &ServerConfig, addr: SocketAddr) -> Result<Self, ServerError> {
        let tls = server_tls(config).map_err(|error| bind_error(addr, &error))?;
        let endpoint = quic::server_endpoint(addr, &tls, &config.quic.settings())
            .map_err(|error| bind_error(addr, &error))?;
        Ok(QuicListener {
            endpoint,
            tls: RwLock::new(Arc::new(tls)),
        })
    }

    /// The UDP address the endpoint listens on.
    pub(super) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.endpoint.local_addr()
    }

    /// New connections authenticate with `config`'s PSK from now on (a reload); those up
    /// keep theirs.
    pub(super) fn reload(&self, config: &ServerConfig) -> Result<(), QuicError> {
        let tls = Arc::new(server_tls(config)?);
        self.endpoint.set_server_tls(&tls)?;
        *self.tls.write().unwrap_or_else(PoisonError::into_inner) = tls;
        Ok(())
    }

    fn tls(&self) -> Arc<ServerTls> {
        Arc::clone(&self.tls.read().unwrap_or_else(PoisonError::into_inner))
    }
}

fn bind_error(addr: SocketAddr, error: &QuicError) -> ServerError {
    ServerError::Bind {
        what: "the QUIC port (UDP)".to_owned(),
        addr,
        source: std::io::Error::other(error.to_string()),
    }
}

/// The TLS side of the config: the self-signed certificate (made on first start) and the
/// PSK, or the mTLS files.
fn server_tls(config: &ServerConfig) -> Result<ServerTls, QuicError> {
    match &config.quic.auth {
        QuicAuth::Psk { cert, .. } => {
            let path = QuicConfig::server_cert_path(cert.as_ref()).map_err(QuicError::Tls)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let _ = std::fs::create_dir_all(dir);
            }
            let own = certs::load_or_create_self_signed(&path)?;
            info!(
                event = "quic_certificate",
                path = %path.display(),
                sha256 = %own.sha256_hex(),
                created = own.created,
                "QUIC certificate (clients may pin it with server_cert_sha256)"
            );
            ServerTls::psk(own.cert, own.key, config.psk.clone())
        }
        QuicAuth::Mtls { cert, key, ca, .. } => ServerTls::mtls(
            certs::load_certs(cert)?,
            certs::load_key(key)?,
            certs::load_certs(ca)?,
        ),
    }
}

/// Accepts connections until the server stops.
pub(super) async fn accept_loop(shared: &Arc<Shared>, listener: Arc<QuicListener>) {
    loop {
        let incoming = tokio::select! {
            () = shared.cancel.cancelled() => break,
            incoming = listener.endpoint.endpoint.accept() => incoming,
        };
        let Some(incoming) = incoming else { break };
        // The gate answers floods with a Retry or ignores them; what passes is bounded.
        let Some(admitted) = listener.endpoint.admit(incoming) else {
            continue;
        };
        let tls = listener.tls();
        shared
            .tasks
            .spawn(handle(Arc::clone(shared), admitted, tls));
    }
}

/// Closes every connection left once the sessions have said goodbye (the server stops),
/// and waits a moment for the closes to leave.
pub(super) async fn close(listener: &QuicListener) {
    listener
        .endpoint
        .endpoint
        .close(0u32.into(), b"server stopped");
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        listener.endpoint.endpoint.wait_idle(),
    )
    .await;
}

/// One connection: authenticate, hello, then the session.
async fn handle(shared: Arc<Shared>, admitted: Admitted, tls: Arc<ServerTls>) {
    let peer = admitted.remote_address();
    let live = shared.live();
    let deadline = live.config.handshake_timeout;
    let started = tokio::time::Instant::now();
    let accepted = tokio::select! {
        () = shared.cancel.cancelled() => return,
        accepted = quic::accept(admitted, &tls, deadline) => accepted,
    };
    let authenticated = match accepted {
        Ok(authenticated) => authenticated,
        Err(error) => {
            let failure = match &error {
                QuicError::ClientProofInvalid { .. } | QuicError::ClientCertificate { .. } => {
                    HandshakeFailure::BadPsk
                }
                QuicError::Timeout { .. } => HandshakeFailure::Timeout,
                _ => HandshakeFailure::Io,
            };
            shared.telemetry.metrics.handshake_failed(failure);
            debug!(event = "handshake_failed", %peer, %error, "QUIC connection not authenticated");
            return;
        }
    };
    let connection = authenticated.connection;
    let Some(binding) = quic_streams::session_binding(&connection) else {
        connection.close(quic::CLOSE_REFUSED, b"");
        return;
    };
    let keys = SessionKeys::for_quic(binding);
    let (send, recv) = authenticated.control;
    let mut control = quic_streams::control_stream(send, recv);
    let remaining = deadline.saturating_sub(started.elapsed());
    let carrier = Carrier::Quic(connection.clone());
    let hello = serve_hello(
        &shared,
        &live,
        &mut control,
        (keys, carrier),
        peer,
        PROTOCOL_VERSION,
    );
    let outcome = tokio::select! {
        () = shared.cancel.cancelled() => return,
        outcome = tokio::time::timeout(remaining, hello) => outcome,
    };
    match outcome {
        Ok(Ok(session)) => run_session(&shared, session, control).await,
        Ok(Err(rejected)) => {
            if let Some(failure) = rejected.failure() {
                shared.telemetry.metrics.handshake_failed(failure);
            }
            rejected.log(peer);
            refuse(&mut control, &rejected).await;
            connection.close(quic::CLOSE_REFUSED, b"");
        }
        Err(_) => {
            shared
                .telemetry
                .metrics
                .handshake_failed(HandshakeFailure::Timeout);
            warn!(event = "handshake_timeout", %peer, "no complete hello within {deadline:?}; closing");
            connection.close(quic::CLOSE_REFUSED, b"");
        }
    }
}

/// Tells an authenticated client why it is refused, before the connection closes.
async fn refuse(control: &mut crate::session::stream::Stream, rejected: &Rejected) {
    if let Some((reason, retry)) = rejected.tell() {
        hello::refuse(control, PROTOCOL_VERSION, &reason, retry).await;
    }
}
