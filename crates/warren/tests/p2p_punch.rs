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
use warren::p2p::net::punch::{Checker, Consent, PunchConfig, PunchError, Punched, Watched};
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
async fn a_watched_path_stays_alive_follows_a_peer_that_moved_and_is_lost_when_silent() {
    let a = Peer::bind("127.0.0.1:0", None);
    let b = Peer::bind("127.0.0.1:0", None);
    let (ra, rb, mut a, mut b) = punch_pair(a, b).await;
    let (ra, rb) = (ra.expect("a punched"), rb.expect("b punched"));
    let consent = Consent {
        every: Duration::from_millis(50),
        lost_after: Duration::from_millis(400),
        stretch: Duration::from_millis(300),
    };
    // Both watch: each answers the other's checks.
    let (mut heard_a, mut heard_b) = (Instant::now(), Instant::now());
    let (wa, wb) = tokio::join!(
        a.checker.watch(ra.remote, &consent, &mut heard_a),
        b.checker.watch(rb.remote, &consent, &mut heard_b),
    );
    assert_eq!((wa.unwrap(), wb.unwrap()), (Watched::Alive, Watched::Alive));
    // b's NAT gives it a new port: a new socket with the same key, still watching a.
    drop(b);
    let mut moved = Peer::bind("127.0.0.1:0", None);
    let stop = Instant::now() + Duration::from_secs(2);
    let watching = async {
        let mut heard = Instant::now();
        while Instant::now() < stop {
            let _ = moved.checker.watch(rb.remote, &consent, &mut heard).await;
        }
    };
    let following = async {
        loop {
            match a
                .checker
                .watch(ra.remote, &consent, &mut heard_a)
                .await
                .unwrap()
            {
                Watched::Alive => continue,
                other => return other,
            }
        }
    };
    let (found, ()) = tokio::join!(following, watching);
    assert_eq!(
        found,
        Watched::Moved(moved.local),
        "a follows b to its new port"
    );
    // b goes away for good: the path is lost.
    drop(moved);
    let mut lost = Watched::Alive;
    while lost == Watched::Alive {
        lost = a
            .checker
            .watch(ra.remote, &consent, &mut heard_a)
            .await
            .unwrap();
    }
    assert_eq!(lost, Watched::Lost);
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

/// The NAT lab (P2P.md's recipe, measured on these machines; shared with
/// `e2e_files_nat.rs`): a "public" namespace with the reflector on two addresses
/// (203.0.113.1 and .2), two NAT routers and a peer behind each. Each cell builds the lab
/// afresh, sets each router's NAT type, runs the two peers as children of this test binary
/// inside their namespaces (`nat_lab_child`, driven by env vars, exchanging candidates
/// through files as they would through the mailbox) and checks the outcome P2P.md expects.
/// Every namespace is deleted on drop, pass or fail.
///
/// Needs root, `ip`, `nft` and `iptables`; without them the test prints `SKIPPED …` and
/// passes, unless `WARREN_NETNS_TESTS=1`. `WARREN_LAB_RUNS` sets the runs per cell
/// (default 3; P2P.md's full protocol is 5).
#[path = "support/nat_lab.rs"]
mod nat_lab;
#[path = "support/netns_tools.rs"]
mod netns_tools;

/// One lab peer (runs only as a child of `nat_lab`, inside a peer namespace). Side `a` is
/// the QUIC client, `b` the server. Prints `MAPPING eim|edm`, then `RESULT direct MS REMOTE`
/// (and `QUIC ok` after a hash-checked stream) or `RESULT relay MS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nat_lab_child() {
    // Not in the lab, or the shared reflector / classifier: nothing more to do.
    let Some(side) = nat_lab::child().await else {
        return;
    };
    let dir = std::path::PathBuf::from(std::env::var("WARREN_LAB_DIR").unwrap());
    let (server_config, client_config) = quic_configs_shared(&dir, &side).await;
    let (socket, mut channel) = DemuxSocket::bind("0.0.0.0:0".parse().unwrap()).unwrap();
    let local = socket.local_addr().unwrap();
    let endpoint = demux::endpoint(socket, server_config).unwrap();
    let config = DiscoverConfig::default();
    let seen1 = reflector::discover(&mut channel, nat_lab::REFLECTOR.parse().unwrap(), &config)
        .await
        .expect("reflexive address");
    let seen2 = reflector::discover(&mut channel, nat_lab::REFLECTOR2.parse().unwrap(), &config)
        .await
        .expect("reflexive address from the second reflector address");
    // RFC 5780 mapping test: the same mapping towards two destinations is
    // endpoint-independent; a different one is a symmetric NAT.
    println!("{}", nat_lab::mapping_line(seen1, seen2));
    let ours = Candidates::gather(local, Some(seen1));
    let other = if side == "a" { "b" } else { "a" };
    nat_lab::put(
        &dir,
        &format!("{side}.cand"),
        &serde_json::to_vec(&ours).unwrap(),
    );
    let theirs: Candidates = serde_json::from_slice(
        &nat_lab::get(&dir, &format!("{other}.cand"), Duration::from_secs(10)).await,
    )
    .unwrap();
    let mut checker = Checker::new(channel, CheckKey::new(KEY), PunchConfig::default());
    let start = Instant::now();
    match checker.punch(&ours, &theirs).await {
        Ok(punched) => {
            println!(
                "RESULT direct {} {}",
                punched.elapsed.as_millis(),
                punched.remote
            );
            if let Some(client_config) = client_config {
                quic_client_checked(&endpoint, client_config, punched.remote).await;
            } else {
                let (answered, ()) = tokio::join!(
                    checker.answer_for(Duration::from_secs(2)),
                    quic_server_checked(&endpoint)
                );
                answered.unwrap();
            }
            println!("QUIC ok");
        }
        Err(PunchError::NoDirectPath { .. }) => {
            println!("RESULT relay {}", start.elapsed().as_millis());
        }
        Err(e) => panic!("punch failed: {e}"),
    }
}

/// Side b makes a certificate and publishes it; side a trusts it.
async fn quic_configs_shared(
    dir: &std::path::Path,
    side: &str,
) -> (Option<quinn::ServerConfig>, Option<quinn::ClientConfig>) {
    if side == "b" {
        let cert = rcgen::generate_simple_self_signed(vec!["warren-p2p".into()]).unwrap();
        let cert_der = cert.cert.der().clone();
        nat_lab::put(dir, "cert.der", &cert_der);
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let server = quinn::ServerConfig::with_single_cert(vec![cert_der], key).unwrap();
        (Some(server), None)
    } else {
        let der = nat_lab::get(dir, "cert.der", Duration::from_secs(10)).await;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.into()).unwrap();
        let client = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
        (None, Some(client))
    }
}

const LAB_BYTES: usize = 1 << 20;

async fn quic_client_checked(
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    to: SocketAddr,
) {
    let data: Vec<u8> = (0..LAB_BYTES).map(|i| (i * 13 + i / 977) as u8).collect();
    let run = async {
        let conn = endpoint
            .connect_with(config, to, "warren-p2p")
            .unwrap()
            .await
            .expect("client handshake");
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&data).await.unwrap();
        send.finish().unwrap();
        let hash = recv.read_to_end(64).await.unwrap();
        conn.close(0u32.into(), b"done");
        // The process exits next: let the close reach the server first.
        let _ = timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        hash
    };
    let hash = timeout(Duration::from_secs(10), run)
        .await
        .expect("QUIC within 10 s");
    assert_eq!(hash, blake3::hash(&data).as_bytes());
}

async fn quic_server_checked(endpoint: &quinn::Endpoint) {
    let run = async {
        let conn = endpoint
            .accept()
            .await
            .unwrap()
            .await
            .expect("server handshake");
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let got = recv.read_to_end(LAB_BYTES).await.unwrap();
        send.write_all(blake3::hash(&got).as_bytes()).await.unwrap();
        send.finish().unwrap();
        // The client checks the hash and closes; a close lost with its process is fine.
        let _ = timeout(Duration::from_secs(3), conn.closed()).await;
    };
    timeout(Duration::from_secs(10), run)
        .await
        .expect("QUIC within 10 s");
}

#[test]
fn nat_lab() {
    use nat_lab::Layout::{self, Separate, Shared};
    use nat_lab::Nat::{self, *};
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("nat_lab") {
        return;
    }
    let runs = nat_lab::runs(3);
    // P2P.md's expected outcomes: none/full/restr × anything and port × port are direct;
    // port × symm and symm × symm need the relay (no port prediction). restr × symm is
    // direct only through peer-reflexive answers (the symmetric side's port towards the
    // other peer is not the one the reflector saw).
    let cells: [(Nat, Nat, Layout, &str); 7] = [
        (None, None, Separate, "direct"),
        (Full, Port, Separate, "direct"),
        (Port, Port, Separate, "direct"),
        (Restr, Symm, Separate, "direct"),
        (Symm, Port, Separate, "relay"),
        (Symm, Symm, Separate, "relay"),
        // Both behind one symmetric NAT without hairpinning: only host candidates work.
        (Symm, Symm, Shared, "direct"),
    ];
    let mut table =
        String::from("| cell | expected | outcomes | punch ms (each run) |\n|---|---|---|---|\n");
    let mut failures = Vec::new();
    let started = Instant::now();
    for (left, right, layout, expected) in cells {
        let mut lab = nat_lab::Lab::new(left, right, layout);
        let reflector = lab.start_reflectors();
        let mut outcomes = Vec::new();
        let mut times = Vec::new();
        for run in 0..runs {
            lab.clear_dir();
            let a = lab.spawn(&lab.ns("peer1"), &[("WARREN_LAB_SIDE", "a".into())]);
            let b = lab.spawn(&lab.ns("peer2"), &[("WARREN_LAB_SIDE", "b".into())]);
            let (out_a, err_a) = lab.wait(a, Duration::from_secs(25));
            let (out_b, err_b) = lab.wait(b, Duration::from_secs(25));
            let cell = nat_lab::cell_name(left, right, layout);
            // The NAT must be what the cell says, or a typo would pass as "punching failed".
            for (nat, out) in [(left, &out_a), (right, &out_b)] {
                let want = format!("MAPPING {}", nat.mapping());
                if !out.contains(&want) {
                    failures.push(format!(
                        "{cell} run {run}: {} is not {want}:\n{out}\n{err_a}\n{err_b}",
                        nat.name()
                    ));
                }
            }
            let outcome = |out: &str| {
                out.lines()
                    .find_map(|l| l.strip_prefix("RESULT "))
                    .map(|r| r.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|| "nothing".into())
            };
            let (oa, ob) = (outcome(&out_a), outcome(&out_b));
            let kind_a = oa.split_whitespace().next().unwrap_or("").to_string();
            let kind_b = ob.split_whitespace().next().unwrap_or("").to_string();
            let quic =
                expected != "direct" || (out_a.contains("QUIC ok") && out_b.contains("QUIC ok"));
            if kind_a != expected || kind_b != expected || !quic {
                failures.push(format!(
                    "{cell} run {run}: expected {expected}, got a: {oa}, b: {ob}, quic ok: {quic}\n--- a\n{out_a}{err_a}\n--- b\n{out_b}{err_b}"
                ));
            }
            // Behind one NAT the winner must be a host address, not the NAT's.
            let result_line = out_a.lines().find(|l| l.starts_with("RESULT direct"));
            if layout == Shared && !result_line.is_some_and(|l| l.contains(" 198.51.100.")) {
                failures.push(format!(
                    "{cell} run {run}: not a host candidate: {result_line:?}"
                ));
            }
            outcomes.push(kind_a);
            times.push(oa.split_whitespace().nth(1).unwrap_or("?").to_string());
        }
        let _ = reflector;
        table.push_str(&format!(
            "| {} | {expected} | {} | {} |\n",
            nat_lab::cell_name(left, right, layout),
            outcomes.join(", "),
            times.join(", ")
        ));
        drop(lab);
    }
    println!(
        "NAT lab, {runs} runs per cell, {:.1} s:\n{table}",
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n\n"));
}

/// b offers only an address where nobody answers (as a symmetric NAT's reflexive address
/// is, for a peer): a learns b's real address from b's checks (peer-reflexive), checks it
/// at once, and both finish direct.
#[tokio::test]
async fn a_peer_reflexive_address_is_learnt_from_the_peers_checks() {
    let mut a = Peer::bind("127.0.0.1:0", None);
    let mut b = Peer::bind("127.0.0.1:0", None);
    let dead = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let b_offers = Candidates::gather(dead.local_addr().unwrap(), None);
    let (ca, cb) = (a.candidates(), b.candidates());
    let (ra, rb) = tokio::join!(a.checker.punch(&ca, &b_offers), b.checker.punch(&cb, &ca));
    assert_eq!(ra.expect("a punched").remote, b.local);
    assert_eq!(rb.expect("b punched").remote, a.local);
}
