//! Who is at the other end: each side's ephemeral certificate, and the QUIC configs that
//! accept exactly the peer whose key the join code's key exchange agreed.
//!
//! Each transfer makes a fresh self-signed certificate ([`Identity::generate`]), or uses
//! the machine's long-term one ([`Identity::load_or_create`], `p2p_identity`), whose
//! fingerprint (SHA-256 of its SubjectPublicKeyInfo) goes into the PAKE
//! ([`crate::p2p::pake::Pake::new`]). The PAKE gives back the peer's fingerprint
//! ([`Outcome::peer_fingerprint`]), and the configs here pin it in both directions: the
//! server demands a client certificate and both sides accept only that key
//! ([`crate::transport::quic::tls`]'s pin verifier, shared with `server_cert_sha256`).
//! TLS 1.3 only, ALPN [`ALPN`], no session resumption (a resumed handshake shows no
//! certificate, and these identities live for one transfer anyway), no 0-RTT.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::p2p::pake::{CertFingerprint, LABEL, Outcome};
use crate::transport::quic::certs;
use crate::transport::quic::error::QuicError;
use crate::transport::quic::settings::QuicSettings;
use crate::transport::quic::tls::{Pin, PinVerifier, provider};

/// ALPN of the file protocol (the PAKE's label).
pub const ALPN: &[u8] = LABEL;

/// The name in the ephemeral certificates and the one a client dials: names mean nothing
/// here, the pinned key is what is checked.
pub const SERVER_NAME: &str = "warren-files";

/// This side's ephemeral certificate and key. `Debug` shows only the fingerprint.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    fingerprint: CertFingerprint,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh ECDSA P-256 self-signed certificate.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if key generation fails (not expected).
    pub fn generate() -> Result<Identity, QuicError> {
        let issued = certs::self_signed(&[SERVER_NAME.to_owned()])?;
        let key = issued.private_key()?;
        let fingerprint = {
            let parsed = rustls::server::ParsedCertificate::try_from(&issued.cert_der)
                .map_err(|e| QuicError::Tls(format!("the new certificate does not parse: {e}")))?;
            CertFingerprint::of_spki(parsed.subject_public_key_info().as_ref())
        };
        Ok(Identity {
            cert: issued.cert_der,
            key,
            fingerprint,
        })
    }

    /// This machine's long-term identity (`p2p_identity`): an Ed25519 key kept in `path`,
    /// created there (mode 0600) on first use. Its fingerprint is what the other end pins
    /// (`peer = "..."`).
    ///
    /// # Errors
    ///
    /// [`QuicError::CertificateFile`] naming the path and the fix when it cannot be read,
    /// parsed or written.
    pub fn load_or_create(path: &std::path::Path) -> Result<Identity, QuicError> {
        let loaded = certs::load_or_create_ed25519(path, SERVER_NAME)?;
        let parsed = rustls::server::ParsedCertificate::try_from(&loaded.cert).map_err(|e| {
            QuicError::CertificateFile {
                path: path.to_owned(),
                problem: format!("its certificate does not parse ({e})"),
                fix: "delete it to make a new identity (peers pinning the old one must update `peer`)",
            }
        })?;
        let fingerprint = CertFingerprint::of_spki(parsed.subject_public_key_info().as_ref());
        Ok(Identity {
            cert: loaded.cert,
            key: loaded.key,
            fingerprint,
        })
    }

    /// The fingerprint to give the PAKE.
    pub fn fingerprint(&self) -> CertFingerprint {
        self.fingerprint
    }
}

fn pin(outcome: &Outcome) -> Arc<PinVerifier> {
    Arc::new(PinVerifier::new(Pin::SpkiSha256(
        *outcome.peer_fingerprint.as_bytes(),
    )))
}

/// The quinn server config of a peer that listens: presents `identity`, demands a client
/// certificate and accepts only the peer's key from `outcome`.
///
/// # Errors
///
/// [`QuicError::Tls`] / [`QuicError::Settings`] if rustls or the settings refuse (not
/// expected).
pub fn server_config(
    identity: &Identity,
    outcome: &Outcome,
    settings: &QuicSettings,
) -> Result<quinn::ServerConfig, QuicError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicError::Tls(format!("TLS 1.3 unavailable: {e}")))?
        .with_client_cert_verifier(pin(outcome))
        .with_single_cert(vec![identity.cert.clone()], identity.key.clone_key())
        .map_err(|e| QuicError::Tls(format!("the ephemeral certificate is unusable: {e}")))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(config)
        .map_err(|e| QuicError::Tls(format!("rustls config unusable for QUIC: {e}")))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(settings.transport_config()?));
    Ok(server)
}

/// The quinn client config of a peer that dials (with [`SERVER_NAME`] as the name):
/// presents `identity` and accepts only the peer's key from `outcome`.
///
/// # Errors
///
/// As [`server_config`].
pub fn client_config(
    identity: &Identity,
    outcome: &Outcome,
    settings: &QuicSettings,
) -> Result<quinn::ClientConfig, QuicError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicError::Tls(format!("TLS 1.3 unavailable: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(pin(outcome))
        .with_client_auth_cert(vec![identity.cert.clone()], identity.key.clone_key())
        .map_err(|e| QuicError::Tls(format!("the ephemeral certificate is unusable: {e}")))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    config.enable_early_data = false;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(config)
        .map_err(|e| QuicError::Tls(format!("rustls config unusable for QUIC: {e}")))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(settings.transport_config()?));
    Ok(client)
}
