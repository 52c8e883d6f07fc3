//! Test support: an in-process server and client on 127.0.0.1 with port 0, local target
//! services, and payload checks by hash.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warren::config::Transport;
use warren::{CipherChoice, CipherSuite, Client, ClientStatus, HostPort, Server};

mod ports;
pub use ports::free_port;
mod temp;
pub use temp::reused_temp_dir;

pub const PSK: &str = "test-psk-0123456789-abcdef";
pub const TOKEN: &str = "test-token-0123456789-abcdef";

/// Random bytes.
pub fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// BLAKE3 hash.
pub fn hash(bytes: &[u8]) -> blake3::Hash {
    blake3::hash(bytes)
}

/// A target service that, per connection, reads everything until EOF, then writes back
/// `reply_len` random bytes and closes. Each connection's (received hash, sent bytes) goes to
/// the returned channel.
pub async fn sink_then_reply_target(
    reply_len: usize,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(blake3::Hash, Vec<u8>)>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut received = Vec::new();
                stream.read_to_end(&mut received).await.unwrap();
                let reply = random_bytes(reply_len);
                stream.write_all(&reply).await.unwrap();
                stream.shutdown().await.unwrap();
                let _ = tx.send((hash(&received), reply));
            });
        }
    });
    (addr, rx)
}

/// An echo target.
pub async fn echo_target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// A running in-process server.
pub struct TestServer {
    pub addr: SocketAddr,
    pub service: SocketAddr,
    pub stop: CancellationToken,
    pub task: JoinHandle<()>,
}

/// Options shared by server and client in a test.
#[derive(Clone)]
pub struct Setup {
    pub transport: Transport,
    pub insecure: bool,
    pub server_ciphers: Option<Vec<CipherSuite>>,
    pub client_ciphers: Option<Vec<CipherSuite>>,
    /// `cipher_choice` of both sides (`None`: the default, `fastest`).
    pub cipher_choice: Option<CipherChoice>,
    pub server_token: String,
    pub client_token: String,
    pub client_psk: String,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            transport: Transport::Noise,
            insecure: false,
            server_ciphers: None,
            client_ciphers: None,
            cipher_choice: None,
            server_token: TOKEN.into(),
            client_token: TOKEN.into(),
            client_psk: PSK.into(),
        }
    }
}

pub async fn start_server(setup: &Setup, bind: SocketAddr, service_bind: SocketAddr) -> TestServer {
    let mut builder = Server::builder()
        .bind(bind)
        .psk(PSK)
        .default_token(&setup.server_token)
        .transport(setup.transport)
        .quic(quic_config())
        .insecure(setup.insecure)
        .heartbeat_interval(Duration::from_secs(1))
        .tcp_service("web", service_bind);
    if let Some(ciphers) = &setup.server_ciphers {
        builder = builder.ciphers(ciphers.clone());
    }
    if let Some(choice) = setup.cipher_choice {
        builder = builder.cipher_choice(choice);
    }
    if setup.transport.uses_tls() {
        builder = builder.tls(tls_config());
    }
    let bound = builder
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let addr = bound.local_addr();
    let service = bound.service_addr("web").unwrap();
    let stop = bound.shutdown_token();
    let task = tokio::spawn(bound.run());
    TestServer {
        addr,
        service,
        stop,
        task,
    }
}

/// [`start_server`] on 127.0.0.1, its port and its service's port picked by the system.
pub async fn start_loopback_server(setup: &Setup) -> TestServer {
    start_server(
        setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
}

pub struct TestClient {
    pub status: tokio::sync::watch::Receiver<ClientStatus>,
    pub stop: CancellationToken,
    pub task: JoinHandle<Result<(), warren::ClientError>>,
}

pub fn start_client(setup: &Setup, server: SocketAddr, target: SocketAddr) -> TestClient {
    let mut builder = Client::builder(HostPort::from(server))
        .psk(&setup.client_psk)
        .default_token(&setup.client_token)
        .transport(setup.transport)
        .quic(quic_config())
        .insecure(setup.insecure)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400))
        .tcp_service("web", HostPort::from(target));
    if let Some(ciphers) = &setup.client_ciphers {
        builder = builder.ciphers(ciphers.clone());
    }
    if let Some(choice) = setup.cipher_choice {
        builder = builder.cipher_choice(choice);
    }
    let client = builder.build().expect("valid client");
    let status = client.status();
    let stop = CancellationToken::new();
    let task = tokio::spawn(client.run(stop.clone()));
    TestClient { status, stop, task }
}

/// Runs `client` until the returned token is cancelled, once it is connected (10 s at most).
pub async fn run_connected(client: Client) -> CancellationToken {
    let mut status = client.status();
    let stop = CancellationToken::new();
    tokio::spawn(client.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .expect("client connects within 10s")
        .expect("client alive");
    stop
}

impl TestClient {
    /// Waits until the client has established its `n`-th session.
    pub async fn wait_sessions(&mut self, n: u64) {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.status.wait_for(|s| s.connected && s.sessions >= n),
        )
        .await
        .expect("client connects within 10s")
        .expect("client alive");
    }
}

/// QUIC settings for tests: the self-signed certificate in [`reused_temp_dir`] (the server
/// makes it on its first start, atomically), loopback-size packets.
pub fn quic_config() -> warren::config::quic::QuicConfig {
    let dir = reused_temp_dir("quic");
    warren::config::quic::QuicConfig {
        auth: warren::config::quic::QuicAuth::Psk {
            cert: Some(dir.join("quic.pem")),
            pin: None,
        },
        max_packet: 6500,
        ..Default::default()
    }
}

/// A server certificate for `tls` / `wss` in [`reused_temp_dir`]: self-signed for
/// `localhost`, made on the binary's first run.
pub fn tls_config() -> warren::config::web::ServerTlsConfig {
    static FILES: std::sync::OnceLock<(std::path::PathBuf, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    let files = FILES.get_or_init(|| {
        let dir = reused_temp_dir("tls");
        if !dir.exists() {
            // Certificate and key are made in a scratch directory and renamed into place
            // together, so a racing run sees both or neither; the loser's rename fails and
            // it uses the winner's pair.
            let scratch = tempfile::Builder::new()
                .prefix("warren-test-tls-")
                .tempdir()
                .unwrap();
            let issued =
                warren::transport::quic::certs::self_signed(&["localhost".to_owned()]).unwrap();
            std::fs::write(scratch.path().join("tls.pem"), &issued.cert_pem).unwrap();
            std::fs::write(scratch.path().join("tls.key"), &issued.key_pem).unwrap();
            if std::fs::rename(scratch.path(), &dir).is_ok() {
                let _ = scratch.keep();
            }
        }
        (dir.join("tls.pem"), dir.join("tls.key"))
    });
    warren::config::web::ServerTlsConfig {
        files: Some(files.clone()),
        self_signed: None,
        configured: true,
    }
}

/// A server and client on loopback around `target`, connected.
pub async fn tunnel(setup: &Setup, target: SocketAddr) -> (TestServer, TestClient) {
    let server = start_loopback_server(setup).await;
    let mut client = start_client(setup, server.addr, target);
    client.wait_sessions(1).await;
    (server, client)
}

/// Sends `payload` through `service`, half-closes, reads the reply to EOF.
pub async fn round_trip(service: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(service).await?;
    let (mut r, mut w) = stream.split();
    let send = async {
        w.write_all(payload).await?;
        w.shutdown().await
    };
    let mut reply = Vec::new();
    let recv = r.read_to_end(&mut reply);
    tokio::try_join!(send, recv)?;
    Ok(reply)
}

/// A minimal HTTP/1.1 request (the admin API); returns (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let (status, _, body) = http_with_headers(addr, method, path, token).await;
    (status, body)
}

/// [`http`], with the response's header lines too: (status, headers, body).
pub async fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|auth| ("Authorization", auth))
        .into_iter()
        .collect();
    http_exchange(addr, method, path, &headers, "").await
}

/// One HTTP/1.1 exchange with the given header lines (a `Host` naming `addr` unless one is
/// given) and body: (status, header block, body).
pub async fn http_exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .expect("answered within 5s")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text[9..12].parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_owned(), body.to_owned())
}

/// A server config with `[server.p2p]` (rate limit 100 a minute, then `extra` keys of
/// the section) on a free loopback port, its P2P UDP port on 127.0.0.1 port 0.
pub fn p2p_server_config(extra: &str) -> warren::ServerConfig {
    let port = free_port();
    let text = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{PSK}\"\n[server.p2p]\nrate_per_minute = 100\n{extra}"
    );
    let mut config =
        warren::ServerConfig::from_toml_str(&text, "server.toml").expect("valid config");
    config.p2p.as_mut().unwrap().udp_bind = "127.0.0.1:0".parse().unwrap();
    config
}

/// The mailbox of the server at `control`, with [`PSK`] and a 5 s deadline.
pub fn mailbox_target(control: SocketAddr) -> warren::p2p::mailbox::MailboxServer {
    warren::p2p::mailbox::MailboxServer {
        server: HostPort::from(control),
        psk: warren::crypto::secret::Secret::new(PSK),
        quic: None,
        deadline: Duration::from_secs(5),
    }
}

/// Stops a server (cancels its token) when dropped, so a failing test leaves nothing.
pub struct StopOnDrop(pub CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A UDP echo service on loopback.
pub async fn udp_echo_target() -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], peer).await;
        }
    });
    addr
}

/// Sends `count` datagrams from each of two sockets to `entrance` and checks every echo
/// comes back to its own socket.
pub async fn check_udp_echoes(entrance: SocketAddr, count: usize) {
    let a = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let b = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for (n, socket) in [&a, &b].into_iter().enumerate() {
        let mut got = 0;
        for i in 0..count {
            let payload = random_bytes(100 + 37 * i + n);
            // Datagrams may be lost (the first ones race the channel's opening): retry.
            for attempt in 0.. {
                socket.send_to(&payload, entrance).await.unwrap();
                let mut buf = vec![0u8; 65_536];
                match tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf)).await
                {
                    Ok(Ok(len)) => {
                        assert_eq!(&buf[..len], &payload[..], "socket {n} datagram {i}");
                        got += 1;
                        break;
                    }
                    _ if attempt < 10 => {}
                    _ => panic!("socket {n}: datagram {i} never came back"),
                }
            }
        }
        assert_eq!(got, count);
    }
}
