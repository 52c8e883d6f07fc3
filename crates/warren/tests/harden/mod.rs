//! Support for the hardening suites (`hostile.rs`, `faults.rs`, `netns.rs`, `security.rs`):
//! a hand-driven protocol client that can stop or misbehave at any step, floods of silent
//! peers from many loopback source addresses, `/proc` readings of the server process, and
//! [`chaos`], a userspace relay that delays, coalesces, flips and cuts bytes.
//!
//! Everything listens on or connects to 127.0.0.0/8 only.
#![allow(dead_code)]

pub mod chaos;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use warren::Side;
use warren::crypto::keys::{self, SessionKeys};
use warren::crypto::record::{HEADER_LEN, Opener, RecordKind, Sealer};
use warren::crypto::secret::Secret;
use warren_proto::CipherSuite;
use warren_proto::handshake::{self, ClientHandshake};
use warren_proto::message::{self, ClaimKind, ControlMessage, ServiceClaim};

/// Raises this process's soft open-file limit as far as `want` (bounded by the hard limit)
/// and returns the limit now in force.
pub fn raise_fd_limit(want: u64) -> u64 {
    rlimit::increase_nofile_limit(want).unwrap_or(0)
}

/// VmRSS of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Open descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls until `fd_count(pid) <= limit` or `timeout`; returns the last count.
pub async fn wait_fds_at_most(pid: u32, limit: usize, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let n = fd_count(pid);
        if n <= limit || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The n-th loopback source address used for floods: 127.0.0.2, 127.0.0.3, … (never
/// 127.0.0.1, where the real client comes from).
pub fn flood_source(n: usize) -> IpAddr {
    let n = n % 250;
    IpAddr::V4(Ipv4Addr::new(127, 0, (n / 250) as u8, 2 + n as u8))
}

/// Connects `count` silent peers to `to`, spread over `sources` loopback addresses.
/// Connections the server already dropped are kept too (they read EOF).
pub async fn silent_peers(to: SocketAddr, count: usize, sources: usize) -> Vec<TcpStream> {
    let mut peers = Vec::with_capacity(count);
    for i in 0..count {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(flood_source(i % sources.max(1)), 0))
            .expect("bind a loopback source");
        match tokio::time::timeout(Duration::from_secs(5), socket.connect(to)).await {
            Ok(Ok(stream)) => peers.push(stream),
            Ok(Err(e)) => panic!("silent peer {i}: connect failed: {e}"),
            Err(_) => panic!("silent peer {i}: connect timed out (listen backlog stuck?)"),
        }
    }
    peers
}

/// Reads everything `stream` yields until EOF, a reset or `within`; returns the bytes and
/// whether the peer closed (EOF or reset) within the time.
pub async fn drain(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One echo round trip through `addr` within 1 s.
pub async fn echo_once(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"probe").await?;
        stream.shutdown().await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        std::io::Result::Ok(reply == b"probe")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Ok(true))
    )
}

/// Polls `echo_once(addr)` until it works; returns how long that took, or `None` after
/// `timeout`.
pub async fn time_until_echo(addr: SocketAddr, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if echo_once(addr).await {
            return Some(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first frame of a genuine control channel (preamble with Noise message 1) under
/// `psk`, and the handshake to finish with the reply. It speaks protocol v1 (one `Hello`,
/// one `HelloReply`), so these tests also keep v1 clients working against this server.
pub fn message1(psk: &str) -> (ClientHandshake, Vec<u8>) {
    let noise_psk = keys::noise_psk(&Secret::new(psk));
    ClientHandshake::start_version(
        &noise_psk,
        &[CipherSuite::ChaCha20Poly1305, CipherSuite::None],
        1,
    )
    .expect("client handshake")
}

/// A protocol client driven by hand, step by step.
pub struct RawClient {
    /// The connection.
    pub stream: TcpStream,
    /// Seals records to the server.
    pub sealer: Sealer,
    /// Opens records from the server.
    pub opener: Opener,
    /// The session's keys.
    pub keys: SessionKeys,
    /// Every byte this client sent, in order (for replays).
    pub sent: Vec<u8>,
}

impl RawClient {
    /// Connects and completes the Noise handshake with `psk`.
    ///
    /// # Panics
    /// If the server does not answer within 5 s or refuses.
    pub async fn handshake(server: SocketAddr, psk: &str) -> RawClient {
        let mut stream = TcpStream::connect(server).await.expect("connect");
        let (client, frame) = message1(psk);
        stream.write_all(&frame).await.expect("send message 1");
        let mut prefix = [0u8; 2];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut prefix))
            .await
            .expect("server answers message 1 within 5s")
            .expect("read reply prefix");
        let len = handshake::frame_len(prefix).expect("reply length");
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await.expect("reply body");
        let established = client.handle_reply(&body).expect("handshake completes");
        let keys = SessionKeys::new(&established);
        let (sealer, opener) = keys.control_channel(Side::Client);
        RawClient {
            stream,
            sealer,
            opener,
            keys,
            sent: frame,
        }
    }

    /// A sealed record of `kind` with `payload`, as bytes (not sent).
    pub fn seal(&mut self, kind: RecordKind, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; HEADER_LEN];
        buf.extend_from_slice(payload);
        self.sealer.seal(kind, &mut buf).expect("seal");
        buf
    }

    /// Sends raw bytes (recorded in [`RawClient::sent`]).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.sent.extend_from_slice(bytes);
        self.stream.write_all(bytes).await
    }

    /// A hello claiming `claims` (service name, token used for its proof).
    pub fn hello(&mut self, claims: &[(&str, &str)]) -> Vec<u8> {
        let services = claims
            .iter()
            .map(|(name, token)| ServiceClaim {
                name: (*name).to_owned(),
                proof: keys::token_proof(&Secret::new(*token), self.keys.handshake_hash(), name),
                kind: ClaimKind::Reverse,
            })
            .collect();
        let payload = message::encode(&ControlMessage::Hello { services });
        self.seal(RecordKind::Control, &payload)
    }

    /// Reads and opens one record within `within`; `None` on EOF, error or timeout.
    pub async fn recv(&mut self, within: Duration) -> Option<(RecordKind, Vec<u8>)> {
        let read = async {
            let mut header = [0u8; HEADER_LEN];
            self.stream.read_exact(&mut header).await.ok()?;
            let (kind, len) = self.opener.parse_header(header).ok()?;
            let mut body = vec![0u8; len];
            self.stream.read_exact(&mut body).await.ok()?;
            let n = self.opener.open(header, &mut body).ok()?;
            body.truncate(n);
            Some((kind, body))
        };
        tokio::time::timeout(within, read).await.ok().flatten()
    }

    /// Sends a hello and returns the decoded reply, if any.
    pub async fn hello_exchange(&mut self, claims: &[(&str, &str)]) -> Option<ControlMessage> {
        let hello = self.hello(claims);
        self.send_raw(&hello).await.ok()?;
        let (kind, body) = self.recv(Duration::from_secs(5)).await?;
        assert_eq!(kind, RecordKind::Control);
        message::decode_control(&body).ok()
    }
}
