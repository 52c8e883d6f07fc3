//! The QUIC foundation end to end, in-process on 127.0.0.1 with port 0: authentication in
//! both modes (psk with and without a pin, mtls), refusals and their errors on both sides,
//! resumption without 0-RTT, the handshake gate under garbage and Initial floods, a 32 MiB
//! transfer per settings preset, and how often the peer acknowledges.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::RngCore;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use warren::crypto::secret::Secret;
use warren::transport::quic::{
    self, Authenticated, ClientTls, QuicEndpoint, QuicError, QuicSettings, ServerTls, certs,
};

const PSK: &str = "quic-test-psk-0123456789-abcdef";
const DEADLINE: Duration = Duration::from_secs(10);
/// Every wait in these tests ends: a hang fails the test instead of stalling the suite.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

fn localhost() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "warren-quic-{name}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server endpoint whose accept loop runs each admitted attempt through `quic::accept` and
/// reports every result on a bounded channel. The loop (and every accept it spawned) stops
/// when this is dropped.
struct TestServer {
    endpoint: QuicEndpoint,
    addr: SocketAddr,
    results: mpsc::Receiver<Result<Authenticated, QuicError>>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
        self.endpoint.endpoint.close(0u32.into(), b"");
    }
}

impl TestServer {
    fn start(tls: ServerTls, settings: &QuicSettings, deadline: Duration) -> Self {
        let endpoint = quic::server_endpoint(localhost(), &tls, settings).expect("server endpoint");
        let addr = endpoint.socket.local_addr;
        let (tx, results) = mpsc::channel(1024);
        let accepting = endpoint.clone();
        let task = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            while let Some(incoming) = accepting.endpoint.accept().await {
                // Reap finished accepts so the set stays as small as the gate allows.
                while tasks.try_join_next().is_some() {}
                let Some(admitted) = accepting.admit(incoming) else {
                    continue;
                };
                let tls = tls.clone();
                let tx = tx.clone();
                tasks.spawn(async move {
                    let result = quic::accept(admitted, &tls, deadline).await;
                    // Waits for the test to read it: a dropped `Authenticated` would close
                    // its connection. The gate permit is back already.
                    let _ = tx.send(result).await;
                });
            }
        });
        TestServer {
            endpoint,
            addr,
            results,
            task,
        }
    }

    fn psk(settings: &QuicSettings, dir: &TempDir) -> (Self, certs::SelfSigned) {
        let cert = certs::load_or_create_self_signed(&dir.path().join("quic.pem")).expect("cert");
        let tls = ServerTls::psk(cert.cert.clone(), cert.key.clone_key(), Secret::new(PSK))
            .expect("server tls");
        (Self::start(tls, settings, DEADLINE), cert)
    }

    async fn next(&mut self) -> Result<Authenticated, QuicError> {
        tokio::time::timeout(TEST_TIMEOUT, self.results.recv())
            .await
            .expect("the server reported within the test timeout")
            .expect("the accept loop is running")
    }
}

fn client_endpoint(settings: &QuicSettings) -> QuicEndpoint {
    quic::client_endpoint(localhost(), settings).expect("client endpoint")
}

async fn connect(
    endpoint: &QuicEndpoint,
    server: SocketAddr,
    name: &str,
    tls: &ClientTls,
) -> Result<Authenticated, QuicError> {
    tokio::time::timeout(
        TEST_TIMEOUT,
        quic::connect(endpoint, server, name, tls, DEADLINE),
    )
    .await
    .expect("connect returned within the test timeout")
}

/// Writes `len` random bytes on `send`, finishes it, and returns their hash.
async fn send_random(send: &mut quinn::SendStream, len: usize) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    let mut left = len;
    let mut chunk = vec![0u8; 256 * 1024];
    while left > 0 {
        let n = left.min(chunk.len());
        rand::rng().fill_bytes(&mut chunk[..n]);
        hasher.update(&chunk[..n]);
        send.write_all(&chunk[..n]).await.expect("write");
        left -= n;
    }
    send.finish().expect("finish");
    hasher.finalize()
}

/// Reads `recv` to its end, returning the byte count and hash.
async fn receive_all(recv: &mut quinn::RecvStream) -> (usize, blake3::Hash) {
    let mut hasher = blake3::Hasher::new();
    let mut total = 0;
    let mut buf = vec![0u8; 256 * 1024];
    while let Some(n) = recv.read(&mut buf).await.expect("read") {
        hasher.update(&buf[..n]);
        total += n;
    }
    (total, hasher.finalize())
}

/// Both directions of a control stream carry random bytes intact.
async fn exchange(client: &mut Authenticated, server: &mut Authenticated, len: usize) {
    let (client_send, client_recv) = (&mut client.control.0, &mut client.control.1);
    let (server_send, server_recv) = (&mut server.control.0, &mut server.control.1);
    let work = async {
        let (sent_up, (got_up_len, got_up)) =
            tokio::join!(send_random(client_send, len), receive_all(server_recv));
        let (sent_down, (got_down_len, got_down)) =
            tokio::join!(send_random(server_send, len), receive_all(client_recv));
        assert_eq!(got_up_len, len);
        assert_eq!(got_up, sent_up, "client to server intact");
        assert_eq!(got_down_len, len);
        assert_eq!(got_down, sent_down, "server to client intact");
    };
    tokio::time::timeout(TEST_TIMEOUT, work)
        .await
        .expect("exchange finished in time");
}

#[tokio::test]
async fn psk_mode_authenticates_and_the_control_stream_carries_bytes_both_ways() {
    let dir = TempDir::new("psk");
    let settings = QuicSettings::internet();
    let (mut server, _) = TestServer::psk(&settings, &dir);
    let tls = ClientTls::psk(Secret::new(PSK), None).expect("client tls");
    let endpoint = client_endpoint(&settings);
    let mut client = connect(&endpoint, server.addr, "warren", &tls)
        .await
        .expect("connects with the right PSK");
    let mut accepted = server
        .next()
        .await
        .expect("server authenticates the client");
    assert_eq!(
        accepted.connection.remote_address(),
        endpoint.socket.local_addr
    );
    let alpn = client
        .connection
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.protocol);
    assert_eq!(alpn.as_deref(), Some(quic::ALPN));
    exchange(&mut client, &mut accepted, 1024 * 1024).await;
}

#[tokio::test]
async fn psk_mode_works_over_ipv6_loopback() {
    let dir = TempDir::new("psk6");
    let settings = QuicSettings::internet();
    let cert = certs::load_or_create_self_signed(&dir.path().join("quic.pem")).expect("cert");
    let tls = ServerTls::psk(cert.cert, cert.key, Secret::new(PSK)).expect("tls");
    let Ok(endpoint) = quic::server_endpoint("[::1]:0".parse().expect("addr"), &tls, &settings)
    else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let addr = endpoint.socket.local_addr;
    let server = tokio::spawn(async move {
        let incoming = endpoint.endpoint.accept().await.expect("incoming");
        let admitted = endpoint.admit(incoming).expect("admitted");
        quic::accept(admitted, &tls, DEADLINE).await
    });
    let client = quic::client_endpoint("[::1]:0".parse().expect("addr"), &settings)
        .expect("client endpoint");
    let client_tls = ClientTls::psk(Secret::new(PSK), None).expect("client tls");
    let mut connected = connect(&client, addr, "warren", &client_tls)
        .await
        .expect("connects over IPv6");
    let mut accepted = tokio::time::timeout(TEST_TIMEOUT, server)
        .await
        .expect("in time")
        .expect("task")
        .expect("accepted");
    exchange(&mut connected, &mut accepted, 4096).await;
}

#[tokio::test]
async fn wrong_psk_is_refused_on_both_sides_and_the_client_learns_nothing() {
    let dir = TempDir::new("wrongpsk");
    let settings = QuicSettings::internet();
    let (mut server, _) = TestServer::psk(&settings, &dir);
    let endpoint = client_endpoint(&settings);
    let wrong =
        ClientTls::psk(Secret::new("another-psk-of-the-same-length-xx"), None).expect("client tls");
    let error = connect(&endpoint, server.addr, "warren", &wrong)
        .await
        .expect_err("a wrong PSK is refused");
    assert!(
        matches!(error, QuicError::WrongPsk { .. }),
        "client error: {error:?}"
    );
    assert!(
        error.to_string().contains("wrong PSK?"),
        "client message: {error}"
    );
    assert!(!error.is_retryable());
    let server_error = server.next().await.expect_err("the server refuses");
    assert!(
        matches!(server_error, QuicError::ClientProofInvalid { .. }),
        "server error: {server_error:?}"
    );

    // What the refusal looks like on the wire: the generic code and an empty reason, for a
    // proof of the right length and for a short one alike.
    for proof_len in [32, 5] {
        let config = wrong.quinn_client_config(&settings).expect("config");
        let connection = endpoint
            .endpoint
            .connect_with(config, server.addr, "warren")
            .expect("connect")
            .await
            .expect("TLS handshake works without the PSK");
        let (mut send, mut recv) = connection.open_bi().await.expect("stream");
        send.write_all(&random_bytes(proof_len))
            .await
            .expect("write");
        if proof_len < 32 {
            send.finish().expect("finish");
        }
        let mut answer = [0u8; 32];
        let read = tokio::time::timeout(TEST_TIMEOUT, recv.read_exact(&mut answer))
            .await
            .expect("answered in time");
        match read {
            Err(quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(
                quinn::ConnectionError::ApplicationClosed(close),
            ))) => {
                assert_eq!(close.error_code, quic::CLOSE_REFUSED);
                assert!(close.reason.is_empty(), "no reason given");
            }
            other => panic!("expected a generic close, got {other:?}"),
        }
        let server_error = server.next().await.expect_err("refused");
        assert!(
            matches!(
                server_error,
                QuicError::ClientProofInvalid { .. } | QuicError::ControlStream { .. }
            ),
            "server error: {server_error:?}"
        );
    }
}

#[tokio::test]
async fn a_server_that_cannot_prove_the_psk_is_refused_by_the_client() {
    // An impostor: a QUIC server with ALPN warren/1 that takes any client proof and answers
    // with bytes it made up (it does not know the PSK, as a relay in the middle would not).
    let dir = TempDir::new("impostor");
    let settings = QuicSettings::internet();
    let cert = certs::load_or_create_self_signed(&dir.path().join("quic.pem")).expect("cert");
    let tls =
        ServerTls::psk(cert.cert, cert.key, Secret::new("the impostor's own psk")).expect("tls");
    let endpoint = quic::server_endpoint(localhost(), &tls, &settings).expect("endpoint");
    let addr = endpoint.socket.local_addr;
    let impostor = tokio::spawn(async move {
        let incoming = endpoint.endpoint.accept().await.expect("incoming");
        let connection = incoming.accept().expect("accept").await.expect("handshake");
        let (mut send, mut recv) = connection.accept_bi().await.expect("stream");
        let mut proof = [0u8; 32];
        recv.read_exact(&mut proof).await.expect("client proof");
        send.write_all(&random_bytes(32)).await.expect("fake proof");
        // Whatever the client does next, it must not be a control message.
        let mut next = [0u8; 1];
        let after = tokio::time::timeout(TEST_TIMEOUT, recv.read(&mut next)).await;
        (connection, after.map(|r| r.map(|n| n.unwrap_or(0))))
    });
    let client_tls = ClientTls::psk(Secret::new(PSK), None).expect("tls");
    let client = client_endpoint(&settings);
    let error = connect(&client, addr, "warren", &client_tls)
        .await
        .expect_err("the impostor is refused");
    assert!(
        matches!(error, QuicError::ServerProofInvalid { .. }),
        "client error: {error:?}"
    );
    let (connection, after) = tokio::time::timeout(TEST_TIMEOUT, impostor)
        .await
        .expect("in time")
        .expect("impostor task");
    assert!(
        !matches!(after, Ok(Ok(n)) if n > 0),
        "the client sent nothing after its proof"
    );
    assert!(matches!(
        connection.close_reason(),
        Some(quinn::ConnectionError::ApplicationClosed(close)) if close.error_code == quic::CLOSE_REFUSED
    ));
}

#[tokio::test]
async fn a_matching_pin_connects_and_a_wrong_pin_is_refused() {
    let dir = TempDir::new("pin");
    let settings = QuicSettings::internet();
    let (mut server, cert) = TestServer::psk(&settings, &dir);
    let endpoint = client_endpoint(&settings);

    let pin = certs::parse_sha256_pin(&cert.sha256_hex()).expect("pin parses");
    let pinned = ClientTls::psk(Secret::new(PSK), Some(pin)).expect("tls");
    let mut client = connect(&endpoint, server.addr, "warren", &pinned)
        .await
        .expect("the right pin connects");
    let mut accepted = server.next().await.expect("accepted");
    exchange(&mut client, &mut accepted, 1000).await;

    let mut other = pin;
    other[0] ^= 1;
    let mispinned = ClientTls::psk(Secret::new(PSK), Some(other)).expect("tls");
    let error = connect(&endpoint, server.addr, "warren", &mispinned)
        .await
        .expect_err("a wrong pin is refused");
    assert!(
        matches!(error, QuicError::ServerCertificate { .. }),
        "client error: {error:?}"
    );
    assert!(
        error.to_string().contains("server_cert_sha256"),
        "says what to check: {error}"
    );
    assert!(
        server.next().await.is_err(),
        "the server sees a failed handshake"
    );
}

/// Writes a CA, a server certificate and a client certificate as `warren cert` does, and
/// loads them back as a config would.
struct MtlsFiles {
    _dir: TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn mtls_files(name: &str) -> MtlsFiles {
    let dir = TempDir::new(name);
    let ca_dir = dir.path().join("ca");
    let ca = certs::CertAuthority::generate().expect("ca");
    ca.write(&ca_dir, certs::Overwrite::Never)
        .expect("ca written");
    let ca = certs::CertAuthority::load(&ca_dir).expect("ca loads");
    let server = ca
        .issue_server(&["localhost".into(), "127.0.0.1".into()])
        .expect("server cert");
    let server_dir = dir.path().join("server");
    certs::write_issued(
        &server_dir,
        certs::SERVER_CERT_FILE,
        certs::SERVER_KEY_FILE,
        &server,
        certs::Overwrite::Never,
    )
    .expect("server written");
    let client = ca.issue_client("test-client").expect("client cert");
    let client_dir = dir.path().join("client");
    certs::write_issued(
        &client_dir,
        certs::CLIENT_CERT_FILE,
        certs::CLIENT_KEY_FILE,
        &client,
        certs::Overwrite::Never,
    )
    .expect("client written");
    MtlsFiles {
        ca: ca_dir.join(certs::CA_CERT_FILE),
        server_cert: server_dir.join(certs::SERVER_CERT_FILE),
        server_key: server_dir.join(certs::SERVER_KEY_FILE),
        client_cert: client_dir.join(certs::CLIENT_CERT_FILE),
        client_key: client_dir.join(certs::CLIENT_KEY_FILE),
        _dir: dir,
    }
}

fn mtls_server_tls(files: &MtlsFiles) -> ServerTls {
    ServerTls::mtls(
        certs::load_certs(&files.server_cert).expect("chain"),
        certs::load_key(&files.server_key).expect("key"),
        certs::load_certs(&files.ca).expect("ca"),
    )
    .expect("server tls")
}

fn mtls_client_tls(ca: &Path, cert: &Path, key: &Path) -> ClientTls {
    ClientTls::mtls(
        certs::load_certs(ca).expect("ca"),
        certs::load_certs(cert).expect("chain"),
        certs::load_key(key).expect("key"),
    )
    .expect("client tls")
}

/// In mtls mode the client speaks first on the control stream (quinn announces a stream
/// with its first bytes), and a refusal of its certificate may show only then: TLS 1.3 lets
/// the client finish before the server has checked it.
async fn mtls_attempt(
    endpoint: &QuicEndpoint,
    server: SocketAddr,
    name: &str,
    tls: &ClientTls,
) -> Result<Authenticated, QuicError> {
    let mut connected = connect(endpoint, server, name, tls).await?;
    connected
        .control
        .0
        .write_all(b"hello")
        .await
        .map_err(|e| match e {
            quinn::WriteError::ConnectionLost(e) => quic::client_error(server, e),
            other => panic!("unexpected write error {other:?}"),
        })?;
    let mut ok = [0u8; 2];
    let read = tokio::time::timeout(TEST_TIMEOUT, connected.control.1.read_exact(&mut ok))
        .await
        .expect("answered in time");
    match read {
        Ok(()) => {
            assert_eq!(&ok, b"ok");
            Ok(connected)
        }
        Err(quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(e))) => {
            Err(quic::client_error(server, e))
        }
        Err(other) => panic!("unexpected read error {other:?}"),
    }
}

/// The server side of [`mtls_attempt`]: read the hello, answer "ok".
async fn mtls_answer(server: &mut TestServer) -> Result<Authenticated, QuicError> {
    let mut accepted = server.next().await?;
    let mut hello = [0u8; 5];
    accepted
        .control
        .1
        .read_exact(&mut hello)
        .await
        .expect("hello");
    assert_eq!(&hello, b"hello");
    accepted.control.0.write_all(b"ok").await.expect("answer");
    Ok(accepted)
}

#[tokio::test]
async fn mtls_connects_with_certs_from_warren_cert_and_refuses_others() {
    let files = mtls_files("mtls");
    let settings = QuicSettings::internet();
    let mut server = TestServer::start(mtls_server_tls(&files), &settings, DEADLINE);
    let endpoint = client_endpoint(&settings);

    // The right CA, certificate and name.
    let tls = mtls_client_tls(&files.ca, &files.client_cert, &files.client_key);
    let (client, accepted) = tokio::join!(
        mtls_attempt(&endpoint, server.addr, "localhost", &tls),
        mtls_answer(&mut server)
    );
    let mut client = client.expect("mtls connects");
    let mut accepted = accepted.expect("server accepts");
    let identity = accepted
        .connection
        .peer_identity()
        .and_then(|id| {
            id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .expect("the client's certificate is known to the server");
    assert_eq!(
        identity[0],
        certs::load_certs(&files.client_cert).expect("cert")[0]
    );
    exchange(&mut client, &mut accepted, 64 * 1024).await;

    // The server's certificate does not name what we dial: refused by the client.
    let error = connect(&endpoint, server.addr, "elsewhere.example", &tls)
        .await
        .expect_err("wrong name refused");
    assert!(
        matches!(error, QuicError::ServerCertificate { .. }),
        "client error: {error:?}"
    );
    assert!(server.next().await.is_err());

    // A client certificate from another CA.
    let stranger = mtls_files("stranger");
    let foreign = mtls_client_tls(&files.ca, &stranger.client_cert, &stranger.client_key);
    let error = mtls_attempt(&endpoint, server.addr, "localhost", &foreign)
        .await
        .expect_err("a foreign client certificate is refused");
    assert!(
        matches!(error, QuicError::ClientCertificateRefused { .. }),
        "client error: {error:?}"
    );
    let server_error = server.next().await.expect_err("server refuses");
    assert!(
        matches!(server_error, QuicError::ClientCertificate { .. }),
        "server error: {server_error:?}"
    );

    // No client certificate at all (a psk-mode client pinning the server's certificate).
    let pin = certs::sha256(&certs::load_certs(&files.server_cert).expect("cert")[0]);
    let bare = ClientTls::psk(Secret::new(PSK), Some(pin)).expect("tls");
    let error = connect(&endpoint, server.addr, "localhost", &bare)
        .await
        .expect_err("no client certificate is refused");
    assert!(
        matches!(error, QuicError::ClientCertificateRefused { .. }),
        "client error: {error:?}"
    );
    let server_error = server.next().await.expect_err("server refuses");
    assert!(
        matches!(server_error, QuicError::ClientCertificate { .. }),
        "server error: {server_error:?}"
    );
}

#[tokio::test]
async fn a_second_connect_resumes_the_tls_session_without_0rtt() {
    let dir = TempDir::new("resume");
    let settings = QuicSettings::internet();
    let (mut server, _) = TestServer::psk(&settings, &dir);
    let endpoint = client_endpoint(&settings);
    let tls = ClientTls::psk(Secret::new(PSK), None).expect("tls");

    let mut first = connect(&endpoint, server.addr, "warren", &tls)
        .await
        .expect("first connect");
    let mut accepted = server.next().await.expect("accepted");
    // A round trip after the handshake: the server's tickets have arrived by then.
    exchange(&mut first, &mut accepted, 100).await;
    assert_eq!(
        tls.full_handshakes(),
        1,
        "the first handshake saw a certificate"
    );

    let start = Instant::now();
    let mut second = connect(&endpoint, server.addr, "warren", &tls)
        .await
        .expect("second connect");
    let resumed_in = start.elapsed();
    let mut accepted = server.next().await.expect("accepted");
    assert_eq!(
        tls.full_handshakes(),
        1,
        "the second handshake resumed: no certificate was sent"
    );
    exchange(&mut second, &mut accepted, 100).await;
    eprintln!("resumed connect + PSK proof: {resumed_in:?}");

    // 0-RTT is off even with a ticket in hand: quinn refuses to start early data.
    let config = tls.quinn_client_config(&settings).expect("config");
    let connecting = endpoint
        .endpoint
        .connect_with(config, server.addr, "warren")
        .expect("connect");
    assert!(
        connecting.into_0rtt().is_err(),
        "0-RTT must not be available"
    );
}

/// Real Initial packets from clients that never answer: each would cost the server a TLS
/// handshake if the gate let it through.
fn crafted_initials(server: SocketAddr, count: usize) -> Vec<Vec<u8>> {
    let tls = ClientTls::psk(Secret::new("flood"), None).expect("tls");
    let config = tls
        .quinn_client_config(&QuicSettings::internet())
        .expect("config");
    let mut endpoint = quinn_proto::Endpoint::new(
        std::sync::Arc::new(quinn::EndpointConfig::default()),
        None,
        false,
        None,
    );
    // quinn-proto is sans-IO and takes std's clock.
    let now = Instant::now().into_std();
    let mut packets = Vec::with_capacity(count);
    for _ in 0..count {
        let (_, mut connection) = endpoint
            .connect(now, config.clone(), server, "warren")
            .expect("connect");
        let mut buf = Vec::with_capacity(1500);
        if let Some(transmit) = connection.poll_transmit(now, 1, &mut buf) {
            packets.push(buf[..transmit.size].to_vec());
        }
    }
    packets
}

/// Random bytes shaped like a long-header Initial (version 1, random connection IDs, padded
/// to 1200 bytes). They never decrypt, but quinn 0.11 only removes header protection before
/// it hands an attempt to the application (the payload is decrypted in `accept`), so about
/// one in four of them (reserved bits happen to be zero) reaches the gate: they must cost a
/// Retry or a failed `accept`, nothing more.
fn bogus_initial() -> Vec<u8> {
    let mut rng = rand::rng();
    let mut packet = Vec::with_capacity(1200);
    packet.push(0xc0 | (rng.next_u32() as u8 & 0x0f));
    packet.extend_from_slice(&1u32.to_be_bytes());
    for _ in 0..2 {
        let len = 8 + (rng.next_u32() % 13) as usize;
        packet.push(len as u8);
        packet.extend_from_slice(&random_bytes(len));
    }
    packet.push(0); // no token
    let rest = 1200 - packet.len() - 2;
    packet.extend_from_slice(&(0x4000u16 | rest as u16).to_be_bytes());
    packet.extend_from_slice(&random_bytes(rest));
    packet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_initial_floods_do_not_stop_a_real_client() {
    let dir = TempDir::new("flood");
    let mut settings = QuicSettings::internet();
    // A small gate so that the crafted handshakes reach it and the Retry path is taken.
    settings.handshake.retry_above = 16;
    settings.handshake.max_pending = 256;
    let cert = certs::load_or_create_self_signed(&dir.path().join("quic.pem")).expect("cert");
    let tls = ServerTls::psk(cert.cert, cert.key, Secret::new(PSK)).expect("tls");
    // A short deadline, so the flood's handshakes give their permits back soon.
    let mut server = TestServer::start(tls, &settings, Duration::from_secs(3));

    let initials = crafted_initials(server.addr, 400);
    assert_eq!(initials.len(), 400);
    // 10,000 random datagrams of random sizes and 10,000 bogus Initials, interleaved, with
    // the 400 real Initials from clients that never answer spread among them. Built first,
    // then sent from a plain thread as fast as the socket takes them, while the server runs.
    let mut datagrams = Vec::with_capacity(20_400);
    for i in 0..20_000 {
        if i % 2 == 0 {
            let len = 1 + (rand::random::<u32>() % 1500) as usize;
            datagrams.push(random_bytes(len));
        } else {
            datagrams.push(bogus_initial());
        }
        if i % 50 == 0
            && let Some(initial) = initials.get(i / 50)
        {
            datagrams.push(initial.clone());
        }
    }
    let target = server.addr;
    let (sent, took) = tokio::task::spawn_blocking(move || {
        let flood = UdpSocket::bind(localhost()).expect("flood socket");
        let started = Instant::now();
        // Loopback drops what the receive buffer cannot hold; that is part of a flood.
        let sent = datagrams
            .iter()
            .filter(|d| flood.send_to(d, target).is_ok())
            .count();
        (sent, started.elapsed())
    })
    .await
    .expect("flood thread");
    eprintln!("flood: {sent} datagrams sent in {took:?}");

    // A real client right after the flood.
    let endpoint = client_endpoint(&settings);
    let client_tls = ClientTls::psk(Secret::new(PSK), None).expect("tls");
    let start = Instant::now();
    let mut client = connect(&endpoint, server.addr, "warren", &client_tls)
        .await
        .expect("a real client connects right after the flood");
    eprintln!("real client connected in {:?}", start.elapsed());
    let gate = server.endpoint.gate_stats();
    eprintln!("gate after the flood: {gate:?}");
    assert!(gate.retried > 0, "the gate answered with Retry under load");
    assert!(gate.admitted >= 1);
    assert!(gate.pending <= settings.handshake.max_pending);

    // Find the real client among the results (the flood's attempts time out).
    let local = endpoint.socket.local_addr;
    let mut accepted = loop {
        match server.next().await {
            Ok(accepted) if accepted.connection.remote_address() == local => break accepted,
            _ => continue,
        }
    };
    exchange(&mut client, &mut accepted, 4096).await;

    // Every permit comes back once the flood's handshakes hit their deadline.
    let drained = async {
        while server.endpoint.gate_stats().pending > 0 {
            // Keep reading reports so that no accept task waits on the channel.
            let _ = tokio::time::timeout(Duration::from_millis(100), server.results.recv()).await;
        }
    };
    tokio::time::timeout(TEST_TIMEOUT, drained)
        .await
        .expect("all handshake permits returned");
}

/// A client connected and authenticated with the PSK, both ends using `settings`, and
/// everything that must live as long as the connection.
struct PskPair {
    client: Authenticated,
    accepted: Authenticated,
    _endpoint: QuicEndpoint,
    _server: TestServer,
    _dir: TempDir,
}

impl PskPair {
    async fn connect(name: &str, settings: &QuicSettings) -> PskPair {
        let dir = TempDir::new(name);
        let (mut server, _) = TestServer::psk(settings, &dir);
        let endpoint = client_endpoint(settings);
        let tls = ClientTls::psk(Secret::new(PSK), None).expect("tls");
        let client = connect(&endpoint, server.addr, "warren", &tls)
            .await
            .expect("connect");
        let accepted = server.next().await.expect("accepted");
        PskPair {
            client,
            accepted,
            _endpoint: endpoint,
            _server: server,
            _dir: dir,
        }
    }
}

/// One 32 MiB stream with the given settings on both ends, checked by hash; returns the
/// throughput (debug builds: a correctness check, not a benchmark).
async fn transfer_32_mib(settings: QuicSettings) -> f64 {
    const LEN: usize = 32 * 1024 * 1024;
    let pair = PskPair::connect("transfer", &settings).await;
    let (client, accepted) = (&pair.client, &pair.accepted);
    let start = Instant::now();
    let work = async {
        let (mut send, _) = client.connection.open_bi().await.expect("stream");
        let sender = async { send_random(&mut send, LEN).await };
        let receiver = async {
            let (_, mut recv) = accepted.connection.accept_bi().await.expect("accept");
            receive_all(&mut recv).await
        };
        let (sent, (len, got)) = tokio::join!(sender, receiver);
        assert_eq!(len, LEN);
        assert_eq!(got, sent, "32 MiB arrived intact");
    };
    tokio::time::timeout(TEST_TIMEOUT, work)
        .await
        .expect("the transfer finished in time");
    let secs = start.elapsed().as_secs_f64();
    let gbps = LEN as f64 * 8.0 / secs / 1e9;
    let stats = client.connection.stats();
    eprintln!(
        "32 MiB with max_udp_payload {}: {secs:.2} s ({gbps:.2} Gbit/s, debug build), path MTU {}, lost {} packets",
        settings.max_udp_payload, stats.path.current_mtu, stats.path.lost_packets
    );
    assert!(stats.path.current_mtu <= settings.max_udp_payload);
    gbps
}

/// ACK frames the server sent while the client wrote `PACKETS` one-byte packets, each read
/// before the next was written, with the given ACK threshold on both ends.
async fn acks_for_lone_packets(ack_eliciting_threshold: u32) -> u64 {
    const PACKETS: usize = 100;
    let settings = QuicSettings {
        ack_eliciting_threshold,
        ..QuicSettings::internet()
    };
    let mut pair = PskPair::connect("acks", &settings).await;
    let (client, accepted) = (&mut pair.client, &mut pair.accepted);
    let before = accepted.connection.stats().frame_tx.acks;
    let work = async {
        for i in 0..PACKETS {
            let byte = [i as u8];
            client.control.0.write_all(&byte).await.expect("write");
            let mut got = [0u8; 1];
            accepted.control.1.read_exact(&mut got).await.expect("read");
            assert_eq!(got, byte);
        }
    };
    tokio::time::timeout(TEST_TIMEOUT, work)
        .await
        .expect("the packets arrived in time");
    accepted.connection.stats().frame_tx.acks - before
}

/// Both ends ask for an ACK every ten packets (QUIC's ACK frequency extension), not every
/// second one: fewer packets to wake up for on a request's path.
#[tokio::test]
async fn the_peer_acknowledges_every_tenth_packet_not_every_second() {
    let rfc_default = acks_for_lone_packets(1).await;
    let warren = acks_for_lone_packets(QuicSettings::internet().ack_eliciting_threshold).await;
    assert!(
        rfc_default >= 40,
        "an ACK every second packet: {rfc_default} ACKs for 100 packets"
    );
    assert!(
        warren * 3 < rfc_default,
        "{warren} ACKs with Warren's settings against {rfc_default} with an ACK every second packet"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_32_mib_internet_preset() {
    transfer_32_mib(QuicSettings::internet()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_32_mib_loopback_preset() {
    transfer_32_mib(QuicSettings::loopback()).await;
}

#[tokio::test]
async fn warren_cert_writes_files_that_mtls_accepts_and_refuses_to_overwrite() {
    let dir = TempDir::new("cli");
    let warren = env!("CARGO_BIN_EXE_warren");
    let run = |args: &[&str]| {
        std::process::Command::new(warren)
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("warren runs")
    };
    let ok = |args: &[&str]| {
        let out = run(args);
        assert!(
            out.status.success(),
            "warren {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&["cert", "ca", "--out", "ca"]);
    ok(&[
        "cert",
        "server",
        "--ca",
        "ca",
        "--name",
        "localhost",
        "--name",
        "127.0.0.1",
        "--out",
        "server",
    ]);
    ok(&[
        "cert", "client", "--ca", "ca", "--name", "laptop", "--out", "client",
    ]);

    let again = run(&["cert", "ca", "--out", "ca"]);
    assert_eq!(again.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("--force"),
        "says how to overwrite: {stderr}"
    );
    let ca_before = std::fs::read(dir.path().join("ca/ca.pem")).expect("ca.pem");
    ok(&["cert", "ca", "--out", "ca", "--force"]);
    assert_ne!(
        std::fs::read(dir.path().join("ca/ca.pem")).expect("ca.pem"),
        ca_before,
        "--force replaced the CA"
    );
    // The server and client certificates were signed by the replaced CA: re-issue them.
    ok(&[
        "cert",
        "server",
        "--ca",
        "ca",
        "--name",
        "localhost",
        "--out",
        "server",
        "--force",
    ]);
    ok(&[
        "cert", "client", "--ca", "ca", "--name", "laptop", "--out", "client", "--force",
    ]);

    let files = MtlsFiles {
        ca: dir.path().join("ca/ca.pem"),
        server_cert: dir.path().join("server/server.pem"),
        server_key: dir.path().join("server/server.key"),
        client_cert: dir.path().join("client/client.pem"),
        client_key: dir.path().join("client/client.key"),
        _dir: TempDir::new("cli-unused"),
    };
    let settings = QuicSettings::internet();
    let mut server = TestServer::start(mtls_server_tls(&files), &settings, DEADLINE);
    let endpoint = client_endpoint(&settings);
    let tls = mtls_client_tls(&files.ca, &files.client_cert, &files.client_key);
    let (client, accepted) = tokio::join!(
        mtls_attempt(&endpoint, server.addr, "localhost", &tls),
        mtls_answer(&mut server)
    );
    client.expect("the CLI's certificates connect");
    accepted.expect("and are accepted");
}
