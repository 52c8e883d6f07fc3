//! Certificates for QUIC: the persisted self-signed server certificate of `psk` mode, and
//! the development CA with its server and client certificates for `mtls` mode (what
//! `warren cert ca | server | client` writes).
//!
//! Keys are ECDSA P-256 (rcgen on aws-lc-rs). Files are PEM; private keys are written with
//! mode 0600 (certificates 0644) and never logged. Writes go to a temporary file in the same directory that is
//! then linked into place, so a reader never sees a half-written certificate, and two
//! servers starting at once agree on one certificate.
//!
//! The CA's name carries the first 8 hex digits of its public key's SHA-256, so the name can
//! be rebuilt from `ca.key` alone when issuing (rcgen cannot parse certificates without a
//! second ASN.1 stack) and two development CAs never share a name.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::error::QuicError;
use crate::crypto::hex;

/// File names `warren cert ca` writes into its directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key file.
pub const CA_KEY_FILE: &str = "ca.key";
/// File names `warren cert server` writes.
pub const SERVER_CERT_FILE: &str = "server.pem";
/// The server's private key file.
pub const SERVER_KEY_FILE: &str = "server.key";
/// File names `warren cert client` writes.
pub const CLIENT_CERT_FILE: &str = "client.pem";
/// The client's private key file.
pub const CLIENT_KEY_FILE: &str = "client.key";

/// How long a development CA is valid.
const CA_VALIDITY_DAYS: i64 = 3650;
/// How long server and client certificates are valid.
const LEAF_VALIDITY_DAYS: i64 = 825;
/// How long the self-signed `psk` mode certificate is valid. Nobody checks its dates (the
/// client accepts it by PSK proof or by pin), so it is long enough never to expire in use.
const SELF_SIGNED_VALIDITY_DAYS: i64 = 20 * 365;
/// Clock skew allowed between the machine that issues and the one that verifies.
const BACKDATE_HOURS: i64 = 1;

/// The longest client name `warren cert client --name` accepts.
pub const MAX_CLIENT_NAME_LEN: usize = 64;

/// A certificate and its private key, as PEM. The key is secret: `Debug` masks it.
pub struct IssuedCert {
    /// The certificate, DER.
    pub cert_der: CertificateDer<'static>,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("sha256", &sha256_hex(&self.cert_der))
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// The private key as rustls wants it.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if the PEM does not parse (not expected: we wrote it).
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, QuicError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| QuicError::Tls(format!("generated key does not parse: {e}")))
    }

    /// The SHA-256 of the certificate's DER, lowercase hex: what `server_cert_sha256` pins.
    pub fn sha256_hex(&self) -> String {
        sha256_hex(&self.cert_der)
    }
}

/// The self-signed certificate of a `psk` mode server, as loaded or created.
pub struct SelfSigned {
    /// The certificate.
    pub cert: CertificateDer<'static>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
    /// SHA-256 of the certificate's DER: clients may pin it (`server_cert_sha256`).
    pub sha256: [u8; 32],
    /// Whether this start generated it (else it was read from the file).
    pub created: bool,
}

impl std::fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfSigned")
            .field("sha256", &hex(&self.sha256))
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

impl SelfSigned {
    /// The SHA-256 as lowercase hex, the form `server_cert_sha256` takes.
    pub fn sha256_hex(&self) -> String {
        hex(&self.sha256)
    }
}

/// Loads the `psk` mode server certificate from `path` (PEM certificate and key in one
/// file), or generates one and writes it there (mode 0600) if the file does not exist.
///
/// The certificate names `warren`; clients do not check names in `psk` mode. Its SHA-256 is
/// what clients pin: log [`SelfSigned::sha256_hex`] at start.
///
/// # Errors
///
/// [`QuicError::CertificateFile`] naming the path when the file exists but cannot be read
/// or parsed, or cannot be written; the fix is to repair its permissions or delete it (a new
/// certificate then changes the pin clients may hold).
pub fn load_or_create_self_signed(path: &Path) -> Result<SelfSigned, QuicError> {
    load_or_create(path, || self_signed(&["warren".to_owned()]))
}

/// A long-term P2P identity (`p2p_identity`): an Ed25519 key and a self-signed
/// certificate for `name`, kept in `path` like [`load_or_create_self_signed`]'s (created
/// with mode 0600 when missing). Peers pin the key's fingerprint, which stays the same as
/// long as the file does.
///
/// # Errors
///
/// As [`load_or_create_self_signed`].
pub fn load_or_create_ed25519(path: &Path, name: &str) -> Result<SelfSigned, QuicError> {
    load_or_create(path, || {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(tls_error)?;
        let params = leaf_params(&[name.to_owned()], SELF_SIGNED_VALIDITY_DAYS)?;
        let cert = params.self_signed(&key).map_err(tls_error)?;
        Ok(issued(cert.der().clone(), cert.pem(), &key))
    })
}

fn load_or_create(
    path: &Path,
    make: impl FnOnce() -> Result<IssuedCert, QuicError>,
) -> Result<SelfSigned, QuicError> {
    match std::fs::read(path) {
        Ok(bytes) => return parse_self_signed(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(QuicError::CertificateFile {
                path: path.to_owned(),
                problem: format!("cannot read it: {e}"),
                fix: "make it readable by this user, or delete it to generate a new certificate (clients pinning the old one must update server_cert_sha256)",
            });
        }
    }
    let issued = make()?;
    let mut contents = issued.cert_pem.clone();
    contents.push_str(&issued.key_pem);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| QuicError::CertificateFile {
            path: path.to_owned(),
            problem: format!("cannot create its directory: {e}"),
            fix: "create the directory or point the certificate path somewhere writable",
        })?;
    }
    match write_file(path, contents.as_bytes(), KEY_MODE, Overwrite::Never) {
        Ok(()) => {}
        // Another process created it first: use theirs, so both agree.
        Err(WriteError::Exists) => {
            let bytes = std::fs::read(path).map_err(|e| QuicError::CertificateFile {
                path: path.to_owned(),
                problem: format!("cannot read it: {e}"),
                fix: "make it readable by this user",
            })?;
            return parse_self_signed(path, &bytes);
        }
        Err(WriteError::Io(e)) => {
            return Err(QuicError::CertificateFile {
                path: path.to_owned(),
                problem: format!("cannot write it: {e}"),
                fix: "make its directory writable by this user, or point the certificate path somewhere writable",
            });
        }
    }
    let key = issued.private_key()?;
    Ok(SelfSigned {
        sha256: sha256(&issued.cert_der),
        cert: issued.cert_der,
        key,
        created: true,
    })
}

fn parse_self_signed(path: &Path, bytes: &[u8]) -> Result<SelfSigned, QuicError> {
    let corrupt = |problem: String| QuicError::CertificateFile {
        path: path.to_owned(),
        problem,
        fix: "delete it to generate a new certificate at the next start (clients pinning the old one must update server_cert_sha256)",
    };
    let cert = CertificateDer::pem_slice_iter(bytes)
        .next()
        .ok_or_else(|| corrupt("it holds no PEM CERTIFICATE block".into()))?
        .map_err(|e| corrupt(format!("its certificate does not parse ({e})")))?;
    let key = PrivateKeyDer::from_pem_slice(bytes).map_err(|e| {
        corrupt(format!(
            "its private key is missing or does not parse ({e})"
        ))
    })?;
    warn_if_key_readable_by_others(path);
    Ok(SelfSigned {
        sha256: sha256(&cert),
        cert,
        key,
        created: false,
    })
}

/// A self-signed certificate for `names` (host names or IP addresses).
///
/// # Errors
///
/// [`QuicError::Tls`] for a name that is neither, or if key generation fails.
pub fn self_signed(names: &[String]) -> Result<IssuedCert, QuicError> {
    let key = KeyPair::generate().map_err(tls_error)?;
    let mut params = leaf_params(names, SELF_SIGNED_VALIDITY_DAYS)?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key).map_err(tls_error)?;
    Ok(issued(cert.der().clone(), cert.pem(), &key))
}

/// A development certificate authority: signs the server and client certificates of
/// `mtls` mode. Its key is secret: `Debug` masks it.
pub struct CertAuthority {
    key: KeyPair,
    cert_pem: String,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("name", &ca_name(&self.key))
            .finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// A new CA with a fresh key, valid for ten years.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if key generation or signing fails (not expected).
    pub fn generate() -> Result<Self, QuicError> {
        let key = KeyPair::generate().map_err(tls_error)?;
        let params = ca_params(&key, Some(CA_VALIDITY_DAYS));
        let cert = params.self_signed(&key).map_err(tls_error)?;
        Ok(CertAuthority {
            key,
            cert_pem: cert.pem(),
        })
    }

    /// Loads a CA written by [`CertAuthority::write`] (`ca.pem` and `ca.key` in `dir`).
    ///
    /// # Errors
    ///
    /// [`QuicError::CertificateFile`] naming the file that is missing, unreadable, corrupt
    /// or does not belong to the other.
    pub fn load(dir: &Path) -> Result<Self, QuicError> {
        let key_path = dir.join(CA_KEY_FILE);
        let cert_path = dir.join(CA_CERT_FILE);
        let key_pem = read_text(&key_path, "run `warren cert ca --out DIR` first")?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| QuicError::CertificateFile {
            path: key_path.clone(),
            problem: format!("not a PEM private key rcgen can use ({e})"),
            fix: "give the directory `warren cert ca` wrote",
        })?;
        let cert_pem = read_text(&cert_path, "run `warren cert ca --out DIR` first")?;
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
            QuicError::CertificateFile {
                path: cert_path.clone(),
                problem: format!("not a PEM certificate ({e})"),
                fix: "give the directory `warren cert ca` wrote",
            }
        })?;
        // The certificate's DER holds the raw public key; a key from another CA would sign
        // certificates that verify against nothing.
        let public = key.public_key_raw();
        if !cert.windows(public.len()).any(|w| w == public) {
            return Err(QuicError::CertificateFile {
                path: key_path,
                problem: format!("this key does not belong to {}", cert_path.display()),
                fix: "keep ca.pem and ca.key from the same `warren cert ca` run together",
            });
        }
        warn_if_key_readable_by_others(&key_path);
        Ok(CertAuthority { key, cert_pem })
    }

    /// The CA certificate, PEM: what servers and clients trust in `mtls` mode.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] if the PEM does not parse (not expected).
    pub fn cert_der(&self) -> Result<CertificateDer<'static>, QuicError> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| QuicError::Tls(format!("CA certificate does not parse: {e}")))
    }

    /// Writes `ca.pem` (mode 0644) and `ca.key` (mode 0600) into `dir`, creating it.
    ///
    /// # Errors
    ///
    /// [`QuicError::CertificateFile`] if a file exists and `overwrite` is
    /// [`Overwrite::Never`], or on an IO error.
    pub fn write(&self, dir: &Path, overwrite: Overwrite) -> Result<Vec<PathBuf>, QuicError> {
        write_pair(
            dir,
            (CA_CERT_FILE, self.cert_pem.as_bytes()),
            (CA_KEY_FILE, self.key.serialize_pem().as_bytes()),
            overwrite,
        )
    }

    /// A server certificate for `names` (host names and IP addresses clients connect to),
    /// valid for 825 days.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] naming a name that is neither a valid host name nor an IP address,
    /// or when no name is given.
    pub fn issue_server(&self, names: &[String]) -> Result<IssuedCert, QuicError> {
        if names.is_empty() {
            return Err(QuicError::CertificateName {
                name: String::new(),
                reason: "a server certificate needs at least one name: the host name or IP address clients connect to",
            });
        }
        for name in names {
            ServerName::try_from(name.as_str()).map_err(|_| QuicError::CertificateName {
                name: name.clone(),
                reason: "it is neither a valid host name nor an IP address",
            })?;
        }
        let mut params = leaf_params(names, LEAF_VALIDITY_DAYS)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate whose common name is `name` (shown in the server's logs),
    /// valid for 825 days.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tls`] for an empty name, one longer than [`MAX_CLIENT_NAME_LEN`], or one
    /// with characters other than printable ASCII.
    pub fn issue_client(&self, name: &str) -> Result<IssuedCert, QuicError> {
        if name.is_empty()
            || name.len() > MAX_CLIENT_NAME_LEN
            || !name.bytes().all(|b| (0x20..0x7f).contains(&b))
        {
            return Err(QuicError::CertificateName {
                name: name.to_owned(),
                reason: "a client name is 1 to 64 printable ASCII characters",
            });
        }
        let mut params = leaf_params(&[], LEAF_VALIDITY_DAYS)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<IssuedCert, QuicError> {
        let key = KeyPair::generate().map_err(tls_error)?;
        let issuer = Issuer::new(ca_params(&self.key, None), &self.key);
        let cert = params.signed_by(&key, &issuer).map_err(tls_error)?;
        Ok(issued(cert.der().clone(), cert.pem(), &key))
    }
}

/// Whether writing certificate files may replace existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Refuse when a file exists (the default of `warren cert`).
    Never,
    /// Replace existing files (`--force`).
    Replace,
}

/// Writes an issued certificate (mode 0644) and its key (mode 0600) into `dir` under the
/// given file names, creating it.
///
/// # Errors
///
/// [`QuicError::CertificateFile`] if a file exists and `overwrite` is [`Overwrite::Never`],
/// or on an IO error.
pub fn write_issued(
    dir: &Path,
    cert_file: &str,
    key_file: &str,
    issued: &IssuedCert,
    overwrite: Overwrite,
) -> Result<Vec<PathBuf>, QuicError> {
    write_pair(
        dir,
        (cert_file, issued.cert_pem.as_bytes()),
        (key_file, issued.key_pem.as_bytes()),
        overwrite,
    )
}

/// Reads every certificate of a PEM file (a chain, or a CA bundle).
///
/// # Errors
///
/// [`QuicError::CertificateFile`] naming the path if it cannot be read, holds no
/// certificate, or one does not parse.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, QuicError> {
    let text = read_text(path, "check the path in the config")?;
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| QuicError::CertificateFile {
            path: path.to_owned(),
            problem: format!("a certificate does not parse ({e})"),
            fix: "give a PEM file such as the one `warren cert` writes",
        })?;
    if certs.is_empty() {
        return Err(QuicError::CertificateFile {
            path: path.to_owned(),
            problem: "it holds no PEM CERTIFICATE block".into(),
            fix: "give a PEM certificate file such as the one `warren cert` writes",
        });
    }
    Ok(certs)
}

/// Reads the private key of a PEM file (PKCS#8, SEC1 or PKCS#1).
///
/// # Errors
///
/// [`QuicError::CertificateFile`] naming the path if it cannot be read or holds no key.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, QuicError> {
    let text = read_text(path, "check the path in the config")?;
    let key =
        PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|e| QuicError::CertificateFile {
            path: path.to_owned(),
            problem: format!("no usable PEM private key in it ({e})"),
            fix: "give the .key file `warren cert` wrote beside the certificate",
        })?;
    warn_if_key_readable_by_others(path);
    Ok(key)
}

/// SHA-256 of a certificate's DER.
pub fn sha256(cert: &CertificateDer<'_>) -> [u8; 32] {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert.as_ref());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// SHA-256 of a certificate's DER as lowercase hex.
pub fn sha256_hex(cert: &CertificateDer<'_>) -> String {
    hex(&sha256(cert))
}

/// Parses a `server_cert_sha256` pin: 64 hex digits, optionally separated by `:` (as
/// `openssl x509 -fingerprint` prints them).
///
/// # Errors
///
/// A message saying what form is expected.
pub fn parse_sha256_pin(text: &str) -> Result<[u8; 32], String> {
    let digits: Vec<u8> = text
        .trim()
        .bytes()
        .filter(|&b| b != b':')
        .collect::<Vec<_>>();
    let wrong = || {
        format!(
            "server_cert_sha256 {text:?} is not a SHA-256: give 64 hex digits (colons allowed), as the server logs at start"
        )
    };
    if digits.len() != 64 {
        return Err(wrong());
    }
    let mut out = [0u8; 32];
    for (i, pair) in digits.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| wrong())?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| wrong())?;
    }
    Ok(out)
}

/// The CA's parameters, rebuilt the same way from its key every time (see the module doc).
fn ca_params(key: &KeyPair, validity_days: Option<i64>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, ca_name(key));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Warren");
    // Path length 0: this CA signs leaves only.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    if let Some(days) = validity_days {
        set_validity(&mut params, days);
        params.serial_number = Some(random_serial());
    }
    params
}

fn ca_name(key: &KeyPair) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.public_key_raw());
    format!("Warren development CA {}", hex(&digest.as_ref()[..4]))
}

fn leaf_params(names: &[String], validity_days: i64) -> Result<CertificateParams, QuicError> {
    let mut params = CertificateParams::new(names.to_vec()).map_err(tls_error)?;
    params.distinguished_name = DistinguishedName::new();
    if let Some(first) = names.first() {
        params.distinguished_name.push(DnType::CommonName, first);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, validity_days);
    Ok(params)
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(BACKDATE_HOURS);
    params.not_after = now + time::Duration::days(days);
}

fn random_serial() -> SerialNumber {
    let mut serial: [u8; 16] = rand::random();
    // Positive and without a leading zero byte, as RFC 5280 wants (at most 20 octets).
    serial[0] = (serial[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&serial)
}

fn issued(cert_der: CertificateDer<'static>, cert_pem: String, key: &KeyPair) -> IssuedCert {
    IssuedCert {
        cert_der,
        cert_pem,
        key_pem: key.serialize_pem(),
    }
}

fn tls_error(e: rcgen::Error) -> QuicError {
    QuicError::Tls(format!("certificate generation failed: {e}"))
}

fn read_text(path: &Path, fix: &'static str) -> Result<String, QuicError> {
    std::fs::read_to_string(path).map_err(|e| QuicError::CertificateFile {
        path: path.to_owned(),
        problem: format!("cannot read it: {e}"),
        fix,
    })
}

fn write_pair(
    dir: &Path,
    cert: (&str, &[u8]),
    key: (&str, &[u8]),
    overwrite: Overwrite,
) -> Result<Vec<PathBuf>, QuicError> {
    std::fs::create_dir_all(dir).map_err(|e| QuicError::CertificateFile {
        path: dir.to_owned(),
        problem: format!("cannot create the directory: {e}"),
        fix: "choose an --out directory this user can write",
    })?;
    let paths = [dir.join(cert.0), dir.join(key.0)];
    // Check both before writing either, so a refusal leaves nothing half done.
    if overwrite == Overwrite::Never
        && let Some(existing) = paths.iter().find(|p| p.exists())
    {
        return Err(QuicError::CertificateFile {
            path: existing.clone(),
            problem: "it already exists".into(),
            fix: "pass --force to replace it, or choose another --out directory",
        });
    }
    for ((path, contents), mode) in paths.iter().zip([cert.1, key.1]).zip([CERT_MODE, KEY_MODE]) {
        write_file(path, contents, mode, overwrite).map_err(|e| QuicError::CertificateFile {
            path: path.clone(),
            problem: match e {
                WriteError::Exists => "it already exists".into(),
                WriteError::Io(e) => format!("cannot write it: {e}"),
            },
            fix: "pass --force to replace it, or choose another --out directory",
        })?;
    }
    Ok(paths.to_vec())
}

enum WriteError {
    Exists,
    Io(std::io::Error),
}

/// Mode of private key files (and of the self-signed file, which holds its key).
const KEY_MODE: u32 = 0o600;
/// Mode of certificate files: public, readable by the user a server runs as.
const CERT_MODE: u32 = 0o644;

/// Writes `contents` to `path` with `mode` (Unix): into a temporary file beside it first,
/// then linked (never replaces) or renamed (replaces) into place, so the file appears whole.
fn write_file(
    path: &Path,
    contents: &[u8],
    mode: u32,
    overwrite: Overwrite,
) -> Result<(), WriteError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{file_name}.tmp-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&tmp).map_err(WriteError::Io)?;
        file.write_all(contents).map_err(WriteError::Io)?;
        file.sync_all().map_err(WriteError::Io)?;
        match overwrite {
            Overwrite::Never => std::fs::hard_link(&tmp, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    WriteError::Exists
                } else {
                    WriteError::Io(e)
                }
            }),
            Overwrite::Replace => std::fs::rename(&tmp, path).map_err(WriteError::Io),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Logs a warning when a private key file can be read by other users.
fn warn_if_key_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                event = "key_file_permissions",
                path = %path.display(),
                "the private key file {} can be read by other users; run `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "warren-certs-{name}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn self_signed_is_created_once_then_reloaded() {
        let dir = scratch("selfsigned");
        let path = dir.join("sub").join("quic.pem");
        let first = load_or_create_self_signed(&path).expect("created");
        assert!(first.created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path)
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let second = load_or_create_self_signed(&path).expect("loaded");
        assert!(!second.created);
        assert_eq!(first.sha256, second.sha256);
        assert_eq!(first.cert, second.cert);
        let leftovers = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .count();
        assert_eq!(leftovers, 1, "no temporary files left behind");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn corrupt_self_signed_names_the_path_and_the_fix() {
        let dir = scratch("corrupt");
        let path = dir.join("quic.pem");
        std::fs::write(&path, b"not a certificate").expect("write");
        let error = load_or_create_self_signed(&path).expect_err("corrupt");
        let text = error.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("delete it"), "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ca_round_trips_through_files_and_refuses_overwrite() {
        let dir = scratch("ca");
        let ca = CertAuthority::generate().expect("ca");
        ca.write(&dir, Overwrite::Never).expect("written");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |name: &str| {
                std::fs::metadata(dir.join(name))
                    .expect("exists")
                    .permissions()
                    .mode()
                    & 0o077
            };
            assert_eq!(mode(CA_KEY_FILE), 0, "the key is private");
            assert_eq!(mode(CA_CERT_FILE) & 0o022, 0, "nobody else writes it");
        }
        let error = ca.write(&dir, Overwrite::Never).expect_err("exists");
        assert!(error.to_string().contains("--force"), "{error}");
        ca.write(&dir, Overwrite::Replace).expect("forced");
        let loaded = CertAuthority::load(&dir).expect("loads");
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        assert!(
            loaded
                .issue_server(&["localhost".into(), "127.0.0.1".into()])
                .is_ok()
        );
        assert!(loaded.issue_client("alice laptop").is_ok());
        assert!(loaded.issue_server(&[]).is_err());
        assert!(loaded.issue_server(&["bad name!".into()]).is_err());
        assert!(loaded.issue_client("").is_err());
        assert!(loaded.issue_client("tab\there").is_err());

        // A key from another CA is refused with the file named.
        let other = CertAuthority::generate().expect("other");
        std::fs::write(dir.join(CA_KEY_FILE), other.key.serialize_pem()).expect("write");
        let error = CertAuthority::load(&dir).expect_err("mismatch");
        assert!(error.to_string().contains("does not belong"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn pins_parse_with_or_without_colons() {
        let plain = "ab".repeat(32);
        assert_eq!(parse_sha256_pin(&plain), Ok([0xab; 32]));
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_sha256_pin(&colons), Ok([0xab; 32]));
        assert!(parse_sha256_pin("abcd").is_err());
        assert!(parse_sha256_pin(&"zz".repeat(32)).is_err());
        assert!(parse_sha256_pin(&"é".repeat(32)).is_err());
    }
}
