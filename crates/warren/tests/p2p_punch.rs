//! Peer-to-peer connectivity (issue 17, `p2p::net`): address discovery, hole punching and
//! QUIC over the shared socket, first on loopback in-process, then in a NAT lab of network
//! namespaces (see `nat_lab` below and `../shared/P2P.md`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use warren::p2p::net::candidates::Candidates;
use warren::p2p::net::demux::{self, DemuxSocket, StunChannel};
use warren::p2p::net::key::CheckKey;
use warren::p2p::net::punch::{Checker, PunchConfig, PunchError, Punched};
use warren::p2p::net::reflector::{self, DiscoverConfig, ReflectorConfig};
use warren_proto::stun::Message;

const KEY: [u8; 32] = [0x5a; 32];

/// One peer: the shared socket, its quinn endpoint (which reads the socket) and a checker.
struct Peer {
    endpoint: quinn::Endpoint,
    checker: Checker<StunChannel>,
    local: SocketAddr,
}

impl Peer {
    fn bind(addr: &str, server: Option<quinn::ServerConfig>) -> Peer {
        Self::bind_with(addr.parse().unwrap(), server, PunchConfig::default())
    }

    fn bind_with(
        addr: SocketAddr,
        server: Option<quinn::ServerConfig>,
        config: PunchConfig,
    ) -> Peer {
        let (socket, channel) = DemuxSocket::bind(addr).expect("bind");
        let local = socket.local_addr().unwrap();
        let endpoint = demux::endpoint(socket, server).expect("endpoint");
        let checker = Checker::new(channel, CheckKey::new(KEY), config);
        Peer {
            endpoint,
            checker,
            local,
        }
    }

    fn candidates(&self) -> Candidates {
        Candidates::gather(self.local, None)
    }
}

/// A self-signed QUIC server config and the client config trusting it.
fn quic_configs() -> (quinn::ServerConfig, quinn::ClientConfig) {
    let cert = rcgen::generate_simple_self_signed(vec!["warren-p2p".into()]).unwrap();
    let cert_der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let server = quinn::ServerConfig::with_single_cert(vec![cert_der.clone()], key).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let client = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    (server, client)
}

/// Sends `len` pseudo-random bytes over a QUIC stream; the server answers their BLAKE3
/// hash, which must match.
async fn quic_bytes_checked(
    client: &quinn::Endpoint,
    server: &quinn::Endpoint,
    client_config: quinn::ClientConfig,
    to: SocketAddr,
    len: usize,
) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    let expected = blake3::hash(&data);
    let serve = async {
        let incoming = server.accept().await.expect("incoming");
        let conn = incoming.await.expect("server handshake");
        let (mut send, mut recv) = conn.accept_bi().await.expect("accept_bi");
        let got = recv.read_to_end(64 << 20).await.expect("read");
        send.write_all(blake3::hash(&got).as_bytes()).await.unwrap();
        send.finish().unwrap();
        // Keep the connection until the client has read the hash.
        conn.closed().await;
    };
    let call = async {
        let conn = client
            .connect_with(client_config, to, "warren-p2p")
            .unwrap()
            .await
            .expect("client handshake");
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&data).await.unwrap();
        send.finish().unwrap();
        let hash = recv.read_to_end(64).await.unwrap();
        conn.close(0u32.into(), b"done");
        hash
    };
    let (_, hash) = timeout(Duration::from_secs(10), async { tokio::join!(serve, call) })
        .await
        .expect("QUIC transfer within 10 s");
    assert_eq!(hash, expected.as_bytes());
}

#[tokio::test]
async fn reflector_answers_with_the_source_address() {
    let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let reflector_addr = server.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { reflector::serve(&server, ReflectorConfig::default(), cancel).await }
    });
    // Through the shared socket, as a peer does (the endpoint must live: it reads).
    let Peer {
        endpoint: _endpoint,
        checker,
        local,
    } = Peer::bind("127.0.0.1:0", None);
    let mut channel = checker.into_inner();
    let seen = reflector::discover(&mut channel, reflector_addr, &DiscoverConfig::default())
        .await
        .expect("reflexive address");
    assert_eq!(seen, local);
    // And through a plain socket.
    let mut plain = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = plain.local_addr().unwrap();
    let seen = reflector::discover(&mut plain, reflector_addr, &DiscoverConfig::default())
        .await
        .unwrap();
    assert_eq!(seen, local);
    cancel.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn discovery_times_out_when_nobody_answers() {
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut plain = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let config = DiscoverConfig {
        first_wait: Duration::from_millis(20),
        timeout: Duration::from_millis(200),
    };
    let start = Instant::now();
    let err = reflector::discover(&mut plain, silent.local_addr().unwrap(), &config)
        .await
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(err.to_string().contains("did not answer"), "{err}");
}

/// Both punch at once; returns (a's result, b's result) and the peers.
async fn punch_pair(
    mut a: Peer,
    mut b: Peer,
) -> (
    Result<Punched, PunchError>,
    Result<Punched, PunchError>,
    Peer,
    Peer,
) {
    let (ca, cb) = (a.candidates(), b.candidates());
    let (ra, rb) = tokio::join!(a.checker.punch(&ca, &cb), b.checker.punch(&cb, &ca));
    (ra, rb, a, b)
}

#[tokio::test]
async fn two_sockets_find_each_other_directly() {
    let a = Peer::bind("127.0.0.1:0", None);
    let b = Peer::bind("127.0.0.1:0", None);
    let (a_addr, b_addr) = (a.local, b.local);
    let (ra, rb, _a, _b) = punch_pair(a, b).await;
    let (ra, rb) = (ra.expect("a punched"), rb.expect("b punched"));
    assert_eq!(ra.remote, b_addr);
    assert_eq!(rb.remote, a_addr);
    assert_eq!(ra.seen_as, Some(a_addr));
    assert!(ra.elapsed < Duration::from_secs(1), "{:?}", ra.elapsed);
}

#[tokio::test]
async fn a_strangers_unauthenticated_checks_are_ignored() {
    let a = Peer::bind("127.0.0.1:0", None);
    let b = Peer::bind("127.0.0.1:0", None);
    let a_addr = a.local;
    let b_addr = b.local;
    // The stranger knows a's address and floods it with checks: unsigned, and signed under
    // a wrong key, claiming to be a peer.
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let stranger_addr = stranger.local_addr().unwrap();
    let wrong = CheckKey::new([1; 32]);
    let flood = async {
        let mut buf = [0u8; 600];
        let mut answers = 0;
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let mut packet = Vec::new();
            Message::request(rand_tx())
                .with_agent([9; 8])
                .encode(&mut packet);
            stranger.send_to(&packet, a_addr).await.unwrap();
            Message::request(rand_tx())
                .with_agent([9; 8])
                .encode_signed(&mut packet, |m| wrong.sign(m));
            stranger.send_to(&packet, a_addr).await.unwrap();
            if let Ok(Ok((len, _))) =
                timeout(Duration::from_millis(10), stranger.recv_from(&mut buf)).await
            {
                // a's own checks reach the stranger (it is a poisoned candidate); only an
                // answer to the stranger's checks would be a failure.
                let answer = warren_proto::stun::decode(&buf[..len])
                    .is_ok_and(|d| d.message.class == warren_proto::stun::Class::Success);
                answers += usize::from(answer);
            }
        }
        answers
    };
    // a also lists the stranger as a candidate of b's (a poisoned mailbox entry): its
    // answers to a's checks are unsigned, so a must still pick b.
    let mut a = a;
    let mut b = b;
    let ca = a.candidates();
    let mut cb = b.candidates();
    cb.list.insert(
        0,
        warren::p2p::net::candidates::Candidate {
            kind: warren::p2p::net::candidates::CandidateKind::Host,
            addr: stranger_addr,
        },
    );
    // b starts late so the stranger's flood arrives first.
    let b_late = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        b.checker.punch(&b.candidates(), &ca).await
    };
    let (answers, ra, rb) = tokio::join!(flood, a.checker.punch(&ca, &cb), b_late);
    assert_eq!(answers, 0, "a answered a stranger");
    assert_eq!(ra.expect("a punched").remote, b_addr);
    assert_eq!(rb.expect("b punched").remote, a_addr);
    assert!(a.checker.stats().ignored >= 2, "{:?}", a.checker.stats());
}

fn rand_tx() -> [u8; 12] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut tx = [0u8; 12];
    tx.copy_from_slice(&nanos.to_be_bytes()[4..]);
    tx
}

#[tokio::test]
async fn the_deadline_expires_cleanly_when_the_peer_never_answers() {
    let config = PunchConfig {
        deadline: Duration::from_millis(300),
        ..PunchConfig::default()
    };
    let mut a = Peer::bind_with("127.0.0.1:0".parse().unwrap(), None, config);
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let theirs = Candidates::gather(silent.local_addr().unwrap(), None);
    let start = Instant::now();
    let err = a.checker.punch(&a.candidates(), &theirs).await.unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, PunchError::NoDirectPath { .. }), "{err}");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    assert!(err.to_string().contains("use the relay"), "{err}");
    // ~12 rounds of 25 ms to one candidate.
    assert!(
        (8..=20).contains(&a.checker.stats().sent),
        "{:?}",
        a.checker.stats()
    );
    // No candidate at all is its own clear error.
    let err = a
        .checker
        .punch(&a.candidates(), &Candidates::default())
        .await
        .unwrap_err();
    assert!(matches!(err, PunchError::NoCandidates), "{err}");
}

#[tokio::test]
async fn quic_connects_over_the_demux_sockets_after_the_punch() {
    let (server_config, client_config) = quic_configs();
    let a = Peer::bind("127.0.0.1:0", None);
    let b = Peer::bind("127.0.0.1:0", Some(server_config));
    let (ra, rb, a, mut b) = punch_pair(a, b).await;
    let remote = ra.expect("a punched").remote;
    rb.expect("b punched");
    // b keeps answering late checks while QUIC runs on the same socket.
    let answering = b.checker.answer_for(Duration::from_millis(500));
    let transfer = quic_bytes_checked(&a.endpoint, &b.endpoint, client_config, remote, 4 << 20);
    let (answered, ()) = tokio::join!(answering, transfer);
    answered.unwrap();
    let stats = b.checker.into_inner();
    let socket_stats = stats.socket().stats();
    assert!(socket_stats.stun.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn the_demux_drops_datagrams_that_are_neither_stun_nor_quic() {
    let (server_config, client_config) = quic_configs();
    let a = Peer::bind("127.0.0.1:0", None);
    let b = Peer::bind("127.0.0.1:0", Some(server_config));
    let junk = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for first in [4u8, 20, 63] {
        junk.send_to(&[first, 1, 2, 3], b.local).await.unwrap();
    }
    quic_bytes_checked(&a.endpoint, &b.endpoint, client_config, b.local, 1000).await;
    let channel = b.checker.into_inner();
    let dropped = channel
        .socket()
        .stats()
        .other_dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(dropped, 3);
}
