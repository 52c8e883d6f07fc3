//! rustls configurations for Warren's QUIC: TLS 1.3 only, ALPN `warren/1`, aws-lc-rs as the
//! crypto provider (QUIC packets sealed by the faster AEAD: [`super::packet_key`]), session
//! tickets on, 0-RTT off.
//!
//! Two authentication modes, each a pair of [`ServerTls`] / [`ClientTls`]:
//!
//! * **psk** (default): the server presents a self-signed certificate
//!   ([`super::certs::load_or_create_self_signed`]). The client accepts any certificate,
//!   unless it pins one with `server_cert_sha256`, in which case the SHA-256 of the
//!   end-entity certificate must match (compared in constant time). Either way it checks the
//!   TLS 1.3 handshake signature, so the server holds the certificate's key. Who is who is
//!   settled after the handshake by the PSK proofs of [`super::auth`], bound to this TLS
//!   session's exporter, so a relay in the middle cannot pass them on.
//! * **mtls**: the server verifies client certificates against a CA (rustls's
//!   `WebPkiClientVerifier`); the client verifies the server against the same CA and the
//!   name it dials. No PSK proof.
//!
//! Resumption: the server issues stateless tickets (aws-lc-rs `Ticketer`, keys rotated every
//! 6 hours) and the client keeps them in rustls's in-memory store, so a reconnect skips the
//! certificate exchange and signature. Keep one [`ClientTls`] for the life of the client:
//! the store lives in it. 0-RTT stays off on both sides, because Warren's first message
//! (the PSK proof, then the hello) must not be replayable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use subtle::ConstantTimeEq;

use super::certs;
use super::error::QuicError;
use super::settings::QuicSettings;
use crate::crypto::hex;
use crate::crypto::secret::Secret;

/// The ALPN protocol of Warren over QUIC, version 1. A peer speaking anything else fails the
/// handshake with `no_application_protocol`.
pub const ALPN: &[u8] = b"warren/1";

/// How many TLS 1.3 tickets the server sends per handshake. Tickets are single-use; two let
/// a client reconnect twice before it needs a fresh one (each resumption brings new ones).
const TICKETS_PER_HANDSHAKE: usize = 2;

/// How a server authenticates its clients, with what it needs for that.
#[derive(Clone, Debug)]
pub enum ServerAuth {
    /// Clients prove this PSK over the TLS exporter ([`super::auth`]).
    Psk(Secret),
    /// Clients present a certificate from the CA; no PSK proof.
    Mtls,
}

/// The server half: a rustls server config wrapped for quinn, plus the mode.
#[derive(Clone)]
pub struct ServerTls {
    crypto: Arc<quinn::crypto::rustls::QuicServerConfig>,
    auth: ServerAuth,
    cert_sha256: [u8; 32],
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("auth", &self.auth)
            .field("cert_sha256", &hex(&self.cert_sha256))
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// `psk` mode: present `cert` (usually self-signed), require the PSK proof.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if rustls refuses the key (not expected for keys Warren made).
    pub fn psk(
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
        psk: Secret,
    ) -> Result<Self, QuicError> {
        let cert_sha256 = certs::sha256(&cert);
        let config = server_builder()?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| QuicError::Tls(format!("the QUIC server key is unusable: {e}")))?;
        Self::finish(config, ServerAuth::Psk(psk), cert_sha256)
    }

    /// `mtls` mode: present `chain` (leaf first), require a client certificate that
    /// verifies against `client_ca`.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if the CA list is empty or unusable, or rustls refuses the key.
    pub fn mtls(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        client_ca: Vec<CertificateDer<'static>>,
    ) -> Result<Self, QuicError> {
        let cert_sha256 = chain.first().map(certs::sha256).unwrap_or_default();
        let roots = root_store(client_ca)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| QuicError::Tls(format!("the client CA is unusable: {e}")))?;
        let config = server_builder()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| QuicError::Tls(format!("the QUIC server key is unusable: {e}")))?;
        Self::finish(config, ServerAuth::Mtls, cert_sha256)
    }

    fn finish(
        mut config: rustls::ServerConfig,
        auth: ServerAuth,
        cert_sha256: [u8; 32],
    ) -> Result<Self, QuicError> {
        config.alpn_protocols = vec![ALPN.to_vec()];
        // 0-RTT off: quinn requires 0 or u32::MAX, and 0 means no early data is accepted.
        config.max_early_data_size = 0;
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()
            .map_err(|e| QuicError::Tls(format!("cannot create the ticket key: {e}")))?;
        config.send_tls13_tickets = TICKETS_PER_HANDSHAKE;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(config)
            .map_err(|e| QuicError::Tls(format!("rustls config unusable for QUIC: {e}")))?;
        Ok(ServerTls {
            crypto: Arc::new(crypto),
            auth,
            cert_sha256,
        })
    }

    /// How clients are authenticated.
    pub fn auth(&self) -> &ServerAuth {
        &self.auth
    }

    /// SHA-256 of the certificate the server presents (what clients pin), lowercase hex.
    pub fn cert_sha256_hex(&self) -> String {
        hex(&self.cert_sha256)
    }

    /// quinn's server config: this TLS config, the transport settings and the handshake
    /// limits. [`super::endpoint::QuicEndpoint::set_server_tls`] installs a new one on a
    /// running endpoint (hot reload of the PSK or certificates).
    ///
    /// # Errors
    ///
    /// [`QuicError::Settings`] if the settings are invalid.
    pub fn quinn_server_config(
        &self,
        settings: &QuicSettings,
    ) -> Result<quinn::ServerConfig, QuicError> {
        let mut config = quinn::ServerConfig::with_crypto(self.crypto.clone());
        let limits = &settings.handshake;
        config
            .transport_config(Arc::new(settings.transport_config()?))
            .max_incoming(limits.max_incoming)
            .incoming_buffer_size(limits.incoming_buffer_size)
            .incoming_buffer_size_total(limits.incoming_buffer_size_total)
            // Clients keep their session when their address changes (NAT rebinding, Wi-Fi to
            // mobile): the QUIC issue's migration requirement.
            .migration(true);
        Ok(config)
    }
}

/// How a client authenticates itself and the server, with what it needs for that.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// Prove this PSK and check the server's proof ([`super::auth`]).
    Psk(Secret),
    /// Present a client certificate; the server's certificate is checked against the CA.
    Mtls,
}

/// The client half: a rustls client config (with its ticket store) wrapped for quinn, plus
/// the mode. Clones share the ticket store and the counters.
#[derive(Clone)]
pub struct ClientTls {
    crypto: Arc<quinn::crypto::rustls::QuicClientConfig>,
    auth: ClientAuth,
    verifier: Arc<CountingVerifier>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("auth", &self.auth)
            .field("full_handshakes", &self.full_handshakes())
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// `psk` mode: accept the server's certificate if `pin` is `None`, else only the one
    /// whose DER has that SHA-256 ([`certs::parse_sha256_pin`] reads the config's form).
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if rustls refuses the config (not expected).
    pub fn psk(psk: Secret, pin: Option<[u8; 32]>) -> Result<Self, QuicError> {
        let pin = pin.map_or(Pin::Any, Pin::CertSha256);
        let verifier: Arc<dyn ServerCertVerifier> = Arc::new(PinVerifier::new(pin));
        Self::build(verifier, None, ClientAuth::Psk(psk))
    }

    /// `mtls` mode: verify the server against `ca` and the name dialled; present `chain`
    /// (leaf first) with `key`.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if the CA list is empty or unusable, or rustls refuses the key.
    pub fn mtls(
        ca: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, QuicError> {
        let roots = root_store(ca)?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .map_err(|e| QuicError::Tls(format!("the server CA is unusable: {e}")))?;
        Self::build(verifier, Some((chain, key)), ClientAuth::Mtls)
    }

    fn build(
        inner: Arc<dyn ServerCertVerifier>,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
        auth: ClientAuth,
    ) -> Result<Self, QuicError> {
        let verifier = Arc::new(CountingVerifier {
            inner,
            verified: AtomicU64::new(0),
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| QuicError::Tls(format!("TLS 1.3 unavailable: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone());
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| {
                QuicError::Tls(format!(
                    "the QUIC client certificate or key is unusable: {e}"
                ))
            })?,
        };
        config.alpn_protocols = vec![ALPN.to_vec()];
        // Tickets are kept (rustls's default in-memory store, 256 servers); no early data.
        config.enable_early_data = false;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(config)
            .map_err(|e| QuicError::Tls(format!("rustls config unusable for QUIC: {e}")))?;
        Ok(ClientTls {
            crypto: Arc::new(crypto),
            auth,
            verifier,
        })
    }

    /// How this client authenticates.
    pub fn auth(&self) -> &ClientAuth {
        &self.auth
    }

    /// How many handshakes made with this config verified a server certificate. A resumed
    /// handshake (TLS 1.3 ticket) sees no certificate, so this does not grow: quinn does not
    /// expose rustls's own "resumed" flag, and this is how tests and diagnostics tell.
    pub fn full_handshakes(&self) -> u64 {
        self.verifier.verified.load(Ordering::Relaxed)
    }

    /// quinn's client config: this TLS config with the transport settings.
    ///
    /// # Errors
    ///
    /// [`QuicError::Settings`] if the settings are invalid.
    pub fn quinn_client_config(
        &self,
        settings: &QuicSettings,
    ) -> Result<quinn::ClientConfig, QuicError> {
        let transport = Arc::new(settings.transport_config()?);
        Ok(self.quinn_client_config_with(transport))
    }

    /// As [`ClientTls::quinn_client_config`], with a transport config built already.
    pub(crate) fn quinn_client_config_with(
        &self,
        transport: Arc<quinn::TransportConfig>,
    ) -> quinn::ClientConfig {
        let mut config = quinn::ClientConfig::new(self.crypto.clone());
        config.transport_config(transport);
        config
    }
}

/// aws-lc-rs, the one provider Warren links, with the TLS 1.3 suites in the order that is
/// fastest here: rustls puts AES-256-GCM first, but AES-128-GCM gives the same protection
/// for a session key and seals ~10 % faster (`warren doctor` shows both); without AES
/// instructions ChaCha20-Poly1305 goes first. The client's order decides (rustls servers
/// follow it), and both sides offer all three. QUIC packets are sealed by the faster AEAD
/// implementation of this machine ([`super::packet_key`]).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    let suites = if crate::config::has_aes_hardware() {
        vec![
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
        ]
    } else {
        vec![
            TLS13_CHACHA20_POLY1305_SHA256,
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
        ]
    };
    provider.cipher_suites = suites
        .into_iter()
        .map(super::packet_key::with_fast_packets)
        .collect();
    Arc::new(provider)
}

fn server_builder()
-> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>, QuicError> {
    rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| QuicError::Tls(format!("TLS 1.3 unavailable: {e}")))
}

fn root_store(cas: Vec<CertificateDer<'static>>) -> Result<rustls::RootCertStore, QuicError> {
    if cas.is_empty() {
        return Err(QuicError::Tls("the CA file holds no certificate".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(ca)
            .map_err(|e| QuicError::Tls(format!("a CA certificate is unusable: {e}")))?;
    }
    Ok(roots)
}

/// What a [`PinVerifier`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// Any certificate (`psk` mode without `server_cert_sha256`).
    Any,
    /// The certificate whose DER has this SHA-256 (`server_cert_sha256`).
    CertSha256([u8; 32]),
    /// Any certificate for the key whose SubjectPublicKeyInfo has this SHA-256: what the
    /// peer-to-peer key exchange agreed (`p2p::pake::Outcome`).
    SpkiSha256([u8; 32]),
}

/// Checks a peer's certificate against a [`Pin`], as a server verifier (`psk` mode, the
/// peer-to-peer client) or a client verifier (the peer-to-peer server). The handshake
/// signature is always verified, so the peer holds the key of what it presented.
#[derive(Debug)]
pub(crate) struct PinVerifier {
    pin: Pin,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinVerifier {
    /// A verifier for `pin`, with the signature algorithms of Warren's one provider.
    pub(crate) fn new(pin: Pin) -> PinVerifier {
        PinVerifier {
            pin,
            algorithms: provider().signature_verification_algorithms,
        }
    }

    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let matches = match &self.pin {
            Pin::Any => true,
            Pin::CertSha256(pin) => bool::from(certs::sha256(end_entity).ct_eq(pin)),
            Pin::SpkiSha256(pin) => {
                let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
                let spki = parsed.subject_public_key_info();
                bool::from(spki_sha256(spki.as_ref()).ct_eq(pin))
            }
        };
        if matches {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(PinMismatch(
                    self.pin,
                )))),
            ))
        }
    }
}

/// SHA-256 of a DER SubjectPublicKeyInfo.
pub(crate) fn spki_sha256(spki_der: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, spki_der);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The error a pin mismatch reports, carried through rustls as the certificate error.
/// rustls shows it with `Debug`, so `Debug` says the same as `Display`.
struct PinMismatch(Pin);

impl std::fmt::Debug for PinMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Pin::SpkiSha256(_) => f.write_str(
                "its key is not the one agreed through the join code: someone else answered",
            ),
            _ => f.write_str("its SHA-256 does not match server_cert_sha256"),
        }
    }
}

impl std::error::Error for PinMismatch {}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Unreachable (TLS 1.3 only), but verified properly rather than assumed.
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for PinVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Wraps a verifier to count the certificates it accepted (see
/// [`ClientTls::full_handshakes`]).
#[derive(Debug)]
struct CountingVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    verified: AtomicU64,
}

impl ServerCertVerifier for CountingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        self.verified.fetch_add(1, Ordering::Relaxed);
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(verifier: &PinVerifier, cert: &CertificateDer<'_>) -> bool {
        let name = ServerName::try_from("warren").expect("valid name");
        verifier
            .verify_server_cert(cert, &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn psk_mode_verifier_accepts_any_cert_or_only_the_pinned_one() {
        let one = certs::self_signed(&["warren".into()]).expect("cert");
        let two = certs::self_signed(&["warren".into()]).expect("cert");
        let open = PinVerifier::new(Pin::Any);
        assert!(verify(&open, &one.cert_der));
        assert!(verify(&open, &two.cert_der));
        let pinned = PinVerifier::new(Pin::CertSha256(certs::sha256(&one.cert_der)));
        assert!(verify(&pinned, &one.cert_der));
        assert!(!verify(&pinned, &two.cert_der));
    }

    #[test]
    fn spki_pin_accepts_only_that_key_both_ways() {
        let one = certs::self_signed(&["warren".into()]).expect("cert");
        let two = certs::self_signed(&["warren".into()]).expect("cert");
        let spki = rustls::server::ParsedCertificate::try_from(&one.cert_der)
            .expect("parses")
            .subject_public_key_info();
        let pinned = PinVerifier::new(Pin::SpkiSha256(spki_sha256(spki.as_ref())));
        assert!(verify(&pinned, &one.cert_der));
        assert!(!verify(&pinned, &two.cert_der));
        let as_client = |cert| {
            ClientCertVerifier::verify_client_cert(&pinned, cert, &[], UnixTime::now()).is_ok()
        };
        assert!(as_client(&one.cert_der));
        assert!(!as_client(&two.cert_der));
        assert!(!as_client(&CertificateDer::from(vec![0x30, 0x00])));
    }

    #[test]
    fn configs_build_in_both_modes() {
        let cert = certs::self_signed(&["warren".into()]).expect("cert");
        let server = ServerTls::psk(
            cert.cert_der.clone(),
            cert.private_key().expect("key"),
            Secret::new("a-psk-long-enough-to-be-real"),
        )
        .expect("psk server");
        assert_eq!(server.cert_sha256_hex(), cert.sha256_hex());
        assert!(
            server
                .quinn_server_config(&QuicSettings::internet())
                .is_ok()
        );
        let client = ClientTls::psk(Secret::new("hunter2-hunter2"), None).expect("psk client");
        assert_eq!(client.full_handshakes(), 0);
        assert!(!format!("{client:?}").contains("hunter2"));

        let ca = certs::CertAuthority::generate().expect("ca");
        let leaf = ca.issue_server(&["localhost".into()]).expect("leaf");
        let id = ca.issue_client("bob").expect("client");
        ServerTls::mtls(
            vec![leaf.cert_der.clone()],
            leaf.private_key().expect("key"),
            vec![ca.cert_der().expect("ca der")],
        )
        .expect("mtls server");
        ClientTls::mtls(
            vec![ca.cert_der().expect("ca der")],
            vec![id.cert_der.clone()],
            id.private_key().expect("key"),
        )
        .expect("mtls client");
        assert!(
            ClientTls::mtls(
                Vec::new(),
                vec![id.cert_der.clone()],
                id.private_key().expect("key")
            )
            .is_err()
        );
    }
}
