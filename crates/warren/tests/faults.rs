//! Faults between client and server (hardening issue 7, suite 4), through the userspace
//! chaos relay of `harden::chaos`: delays and re-split segments keep every byte exact and
//! half-close working both ways; a flipped byte kills the stream with a reset and is never
//! delivered (what arrived is an exact prefix); a cut mid-transfer reaches the visitor as a
//! reset, never a clean EOF, and the tunnel comes back by itself; a client killed
//! mid-upload and restarted takes its services back.
//!
//! Network cuts and packet loss at the IP layer (namespaces + iptables) are in `netns.rs`.

mod e2e_support;
mod harden;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use e2e_support::*;
use harden::chaos::{ChaosRelay, Dir, Plan};
use harden::{drain, time_until_echo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

const MIB: usize = 1024 * 1024;

/// A deterministic pattern (BLAKE3 XOF), so a receiver can check that what it got is a
/// prefix of what was sent.
fn pattern(len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(b"warren chaos pattern")
        .finalize_xof()
        .fill(&mut out);
    out
}

/// A server and a client whose connections to the server go through a chaos relay.
struct Chaotic {
    server: Proc,
    client: Proc,
    relay: ChaosRelay,
    ports: Ports,
    client_config: PathBuf,
}

impl Chaotic {
    async fn start(dir: &TestDir, target: SocketAddr, plan: Plan) -> Chaotic {
        let setup = Setup::default();
        let ports = Ports::pick();
        let server_config = dir.write("server.toml", &server_toml(&setup, ports));
        let server = start_server(dir, &server_config);
        let relay = ChaosRelay::start(loopback(ports.server), plan).await;
        let probe = echo_target().await;
        let client_config = dir.write(
            "client.toml",
            &client_toml(&setup, ports, target, probe).replace(
                &format!("server = \"127.0.0.1:{}\"", ports.server),
                &format!("server = \"{}\"", relay.addr()),
            ),
        );
        let client = start_client(dir, &client_config, PSK);
        let chaotic = Chaotic {
            server,
            client,
            relay,
            ports,
            client_config,
        };
        chaotic.ready(Duration::from_secs(10)).await;
        chaotic
    }

    async fn ready(&self, within: Duration) -> Duration {
        time_until_echo(loopback(self.ports.probe), within)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "the tunnel did not work within {within:?}\n{}\n{}",
                    self.server.logs(),
                    self.client.logs()
                )
            })
    }

    fn service(&self) -> SocketAddr {
        loopback(self.ports.web)
    }
}

/// A target that sends `pattern(len)` in 16 KiB pieces, `pause` apart, then half-closes and
/// reads to EOF.
async fn pattern_target(len: usize, pause: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                for piece in pattern(len).chunks(16 * 1024) {
                    if stream.write_all(piece).await.is_err() {
                        return;
                    }
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
                let _ = stream.shutdown().await;
                let mut sink = Vec::new();
                let _ = stream.read_to_end(&mut sink).await;
            });
        }
    });
    addr
}

/// What a target read on one connection: the bytes, and whether they ended in a clean EOF.
struct Received {
    bytes: Vec<u8>,
    clean_eof: bool,
}

/// A target that reads to EOF or error and reports what it got.
async fn recording_target() -> (SocketAddr, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut bytes = Vec::new();
                let clean_eof = stream.read_to_end(&mut bytes).await.is_ok();
                let _ = tx.send(Received { bytes, clean_eof }).await;
            });
        }
    });
    (addr, rx)
}

/// Reads until EOF or error; returns the bytes and whether it ended in a clean EOF.
async fn read_all(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let clean = tokio::time::timeout(within, stream.read_to_end(&mut got))
        .await
        .expect("the stream ended in time")
        .is_ok();
    (got, clean)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_and_resplit_segments_keep_bytes_exact_and_half_close_both_ways() {
    let dir = TestDir::new("faults-delay");
    let (target, mut served) = hashing_target(MIB).await;
    let plan = Plan {
        max_delay: Duration::from_millis(2),
        max_piece: 4000,
        flip: None,
    };
    let chaotic = Chaotic::start(&dir, target, plan).await;
    // Visitor half-closes first (the target reads to EOF, then replies).
    hashed_transfers(chaotic.service(), &mut served, 4, MIB, MIB).await;

    // The target half-closes first: the visitor reads the whole pattern to a clean EOF,
    // then still uploads, and the target receives it to a clean EOF.
    let fin_first = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, mut rx) = mpsc::channel(1);
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            stream.write_all(&pattern(300_000)).await.expect("write");
            stream.shutdown().await.expect("fin");
            let mut got = Vec::new();
            let clean = stream.read_to_end(&mut got).await.is_ok();
            let _ = tx.send((got, clean)).await;
        });
        let dir2 = TestDir::new("faults-fin-first");
        let other = Chaotic::start(
            &dir2,
            addr,
            Plan {
                max_delay: Duration::from_millis(2),
                max_piece: 4000,
                flip: None,
            },
        )
        .await;
        let mut visitor = TcpStream::connect(other.service()).await.expect("visit");
        let (got, clean) = read_all(&mut visitor, Duration::from_secs(20)).await;
        assert!(clean, "the target's FIN did not arrive as a clean EOF");
        assert!(got == pattern(300_000), "download not exact");
        let upload = pattern(200_000);
        visitor
            .write_all(&upload)
            .await
            .expect("upload after the peer's FIN");
        visitor.shutdown().await.expect("fin");
        let (received, clean) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("target done")
            .expect("report");
        assert!(
            clean && received == upload,
            "upload after half-close not exact"
        );
        drop(other);
        dir2
    };
    drop(fin_first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_towards_the_server_resets_the_visitor_and_is_never_delivered() {
    let dir = TestDir::new("faults-flip-up");
    let len = 4 * MIB;
    let target = pattern_target(len, Duration::from_millis(1)).await;
    // Client -> server carries the target's bytes to the visitor.
    let plan = Plan {
        flip: Some((Dir::Up, 1_000_003)),
        ..Plan::default()
    };
    let chaotic = Chaotic::start(&dir, target, plan).await;
    let mut visitor = TcpStream::connect(chaotic.service()).await.expect("visit");
    let (got, clean) = read_all(&mut visitor, Duration::from_secs(30)).await;
    assert!(chaotic.relay.flipped(), "the relay never flipped a byte");
    assert!(
        !clean,
        "a corrupted stream ended in a clean EOF ({} bytes)",
        got.len()
    );
    assert!(got.len() < len, "all bytes arrived despite the flip");
    assert!(
        got == pattern(len)[..got.len()],
        "bytes delivered are not an exact prefix"
    );
    assert!(
        got.len() <= 1_000_003,
        "bytes past the flipped record were delivered"
    );
    eprintln!(
        "faults: flip up: visitor reset after an exact prefix of {} bytes",
        got.len()
    );
    // The session itself survives a data channel's death, or comes back.
    chaotic.ready(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_towards_the_client_resets_the_target_and_is_never_delivered() {
    let dir = TestDir::new("faults-flip-down");
    let (target, mut received) = recording_target().await;
    let plan = Plan {
        flip: Some((Dir::Down, 700_001)),
        ..Plan::default()
    };
    let chaotic = Chaotic::start(&dir, target, plan).await;
    let upload = pattern(3 * MIB);
    let mut visitor = TcpStream::connect(chaotic.service()).await.expect("visit");
    let sent = async {
        for piece in upload.chunks(32 * 1024) {
            visitor.write_all(piece).await?;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        visitor.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), sent).await;
    let report = tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await
        .expect("target report")
        .expect("report");
    assert!(chaotic.relay.flipped(), "the relay never flipped a byte");
    assert!(
        !report.clean_eof,
        "a corrupted upload ended in a clean EOF at the target"
    );
    assert!(
        report.bytes.len() < upload.len(),
        "everything arrived despite the flip"
    );
    assert!(
        report.bytes == upload[..report.bytes.len()],
        "not an exact prefix"
    );
    eprintln!(
        "faults: flip down: target reset after an exact prefix of {} bytes",
        report.bytes.len()
    );
    let (_, closed) = drain(&mut visitor, Duration::from_secs(10)).await;
    assert!(closed, "the visitor was not closed after the stream died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_mid_transfer_is_a_reset_and_the_tunnel_comes_back() {
    let dir = TestDir::new("faults-cut");
    let len = 8 * MIB;
    let target = pattern_target(len, Duration::from_millis(2)).await;
    let chaotic = Chaotic::start(&dir, target, Plan::default()).await;
    let mut visitor = TcpStream::connect(chaotic.service()).await.expect("visit");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while got.len() < MIB {
        let n = visitor.read(&mut buf).await.expect("read before the cut");
        assert!(n > 0, "EOF before the cut");
        got.extend_from_slice(&buf[..n]);
    }
    chaotic.relay.cut();
    let cut_at = Instant::now();
    let (rest, clean) = read_all(&mut visitor, Duration::from_secs(15)).await;
    got.extend_from_slice(&rest);
    assert!(
        !clean,
        "a cut transfer ended in a clean EOF after {} bytes",
        got.len()
    );
    assert!(
        got.len() < len && got == pattern(len)[..got.len()],
        "not an exact prefix"
    );
    chaotic.ready(Duration::from_secs(10)).await;
    eprintln!(
        "faults: cut after {} bytes: visitor reset; tunnel back {:?} after the cut",
        got.len(),
        cut_at.elapsed()
    );
    assert!(
        chaotic.relay.connections() > 2,
        "the client never reconnected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_upload_is_a_reset_and_a_restarted_client_takes_over() {
    let dir = TestDir::new("faults-client-restart");
    let (target, mut received) = recording_target().await;
    let mut chaotic = Chaotic::start(&dir, target, Plan::default()).await;
    let mut visitor = TcpStream::connect(chaotic.service()).await.expect("visit");
    let upload = pattern(2 * MIB);
    visitor.write_all(&upload[..MIB]).await.expect("first half");
    tokio::time::sleep(Duration::from_millis(300)).await;
    chaotic.client.kill();
    let (_, closed) = drain(&mut visitor, Duration::from_secs(10)).await;
    assert!(closed, "the visitor was not closed when the client died");
    let report = tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .expect("target report")
        .expect("report");
    assert!(
        !report.clean_eof,
        "the target saw a clean EOF from a killed client"
    );
    assert!(
        report.bytes == upload[..report.bytes.len()],
        "not an exact prefix"
    );
    let restarted = Instant::now();
    chaotic.client = start_client(&dir, &chaotic.client_config, PSK);
    chaotic.ready(Duration::from_secs(10)).await;
    eprintln!(
        "faults: restarted client serving again after {:?}",
        restarted.elapsed()
    );
}
