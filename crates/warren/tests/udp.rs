//! UDP services (issue 4): an in-process server and client on 127.0.0.1 (port 0) carry
//! real datagrams; every one is checked by hash and by the socket it comes back to.

mod support;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use support::{PSK, TOKEN};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren::{Client, ClientStatus, HostPort, Server, UdpSettings, UdpStatsHandle};

const SERVICE: &str = "dns";

/// A target socket with big kernel buffers: 32 visitors with up to 60 KB in flight each
/// would overflow the default 208 KiB and the test would measure the target, not Warren.
fn target_socket() -> UdpSocket {
    warren::relay::udp::bind_service_socket("127.0.0.1:0".parse().unwrap()).unwrap()
}

/// A UDP target that sends every datagram back to where it came from.
async fn echo_target() -> SocketAddr {
    let socket = target_socket();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let _ = socket.send_to(&buf[..n], peer).await;
        }
    });
    addr
}

/// A UDP target that answers with the port it saw the datagram come from (2 bytes, BE)
/// followed by the datagram: tells the test which client-side socket carried a flow.
async fn port_echo_target() -> SocketAddr {
    let socket = target_socket();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let mut reply = peer.port().to_be_bytes().to_vec();
            reply.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&reply, peer).await;
        }
    });
    addr
}

struct UdpTunnel {
    server_addr: SocketAddr,
    service: SocketAddr,
    stats: UdpStatsHandle,
    server_stop: CancellationToken,
    server_task: JoinHandle<()>,
    client_status: tokio::sync::watch::Receiver<ClientStatus>,
    _client_stop: tokio_util::sync::DropGuard,
}

async fn start_server(
    bind: SocketAddr,
    service_bind: SocketAddr,
    settings: UdpSettings,
) -> (
    SocketAddr,
    SocketAddr,
    UdpStatsHandle,
    CancellationToken,
    JoinHandle<()>,
) {
    let bound = Server::builder()
        .bind(bind)
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_interval(Duration::from_secs(1))
        .udp_service_with(SERVICE, service_bind, settings)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let addr = bound.local_addr();
    let service = bound.service_addr(SERVICE).expect("udp service bound");
    let stats = bound.udp_stats(SERVICE).expect("udp stats");
    let stop = bound.shutdown_token();
    (addr, service, stats, stop, tokio::spawn(bound.run()))
}

async fn udp_tunnel(target: SocketAddr, settings: UdpSettings) -> UdpTunnel {
    let (server_addr, service, stats, server_stop, server_task) = start_server(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        settings,
    )
    .await;
    let client = Client::builder(HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400))
        .udp_service_with(SERVICE, HostPort::from(target), settings)
        .build()
        .expect("valid client");
    let mut client_status = client.status();
    let stop = CancellationToken::new();
    tokio::spawn(client.run(stop.clone()));
    wait_sessions(&mut client_status, 1).await;
    UdpTunnel {
        server_addr,
        service,
        stats,
        server_stop,
        server_task,
        client_status,
        _client_stop: stop.drop_guard(),
    }
}

async fn wait_sessions(status: &mut tokio::sync::watch::Receiver<ClientStatus>, n: u64) {
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.connected && s.sessions >= n),
    )
    .await
    .expect("client connects within 10s")
    .expect("client alive");
}

async fn visitor(service: SocketAddr) -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.connect(service).await.unwrap();
    socket
}

/// Sends `payload` and waits up to `wait` for one reply.
async fn ask(socket: &UdpSocket, payload: &[u8], wait: Duration) -> Option<Vec<u8>> {
    socket.send(payload).await.unwrap();
    let mut buf = vec![0u8; 65_536];
    let n = tokio::time::timeout(wait, socket.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    Some(buf[..n].to_vec())
}

/// Asks through a port-echo target; returns the client-side port that carried the flow.
async fn flow_port(socket: &UdpSocket, payload: &[u8]) -> u16 {
    let reply = ask(socket, payload, Duration::from_secs(2))
        .await
        .expect("a reply within 2s");
    assert_eq!(&reply[2..], payload, "reply intact");
    u16::from_be_bytes([reply[0], reply[1]])
}

fn settings(idle_ms: u64, max_sessions: usize) -> UdpSettings {
    UdpSettings {
        idle_timeout: Duration::from_millis(idle_ms),
        max_sessions,
    }
}

/// A datagram of `len` bytes; from 32 bytes on it starts with the BLAKE3 hash of the rest,
/// so it can be checked on its own.
fn datagram(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill(&mut bytes[..]);
    if len >= 32 {
        let hash = blake3::hash(&bytes[32..]);
        bytes[..32].copy_from_slice(hash.as_bytes());
    }
    bytes
}

fn self_consistent(bytes: &[u8]) -> bool {
    bytes.len() < 32 || blake3::hash(&bytes[32..]).as_bytes() == &bytes[..32]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue4_datagrams_arrive_whole_and_reach_the_right_visitor() {
    const VISITORS: usize = 32;
    const PER_VISITOR: usize = 100;
    let echo = echo_target().await;
    let tunnel = udp_tunnel(echo, UdpSettings::DEFAULT).await;
    // Every datagram any visitor sent, by hash -> the visitor that sent it.
    let sent: Arc<Mutex<HashMap<blake3::Hash, usize>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for v in 0..VISITORS {
        let service = tunnel.service;
        let sent = Arc::clone(&sent);
        tasks.spawn(async move {
            let socket = visitor(service).await;
            let mut mine = HashSet::new();
            let (mut delivered, mut lost, mut late, mut bytes) = (0usize, 0usize, 0usize, 0u64);
            let mut foreign = Vec::new();
            let mut buf = vec![0u8; 65_536];
            for i in 0..PER_VISITOR {
                let len = match i {
                    0 => 1,
                    1 => 60_000,
                    _ => rand::rng().random_range(1..=60_000),
                };
                let payload = datagram(len);
                let hash = blake3::hash(&payload);
                mine.insert(hash);
                sent.lock().unwrap().insert(hash, v);
                socket.send(&payload).await.unwrap();
                let deadline = Instant::now() + Duration::from_secs(1);
                loop {
                    let Ok(received) =
                        tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await
                    else {
                        lost += 1;
                        break;
                    };
                    let reply = &buf[..received.unwrap()];
                    let reply_hash = blake3::hash(reply);
                    if reply_hash == hash {
                        delivered += 1;
                        bytes += reply.len() as u64;
                        break;
                    }
                    // Not the one we wait for: an earlier one of ours arriving late is fine;
                    // anything else is corrupted or misrouted.
                    if mine.contains(&reply_hash) && self_consistent(reply) {
                        late += 1;
                    } else {
                        foreign.push(reply.to_vec());
                    }
                }
            }
            (v, delivered, lost, late, bytes, foreign)
        });
    }
    let (mut delivered, mut lost, mut bytes) = (0usize, 0usize, 0u64);
    while let Some(done) = tasks.join_next().await {
        let (v, ok, missing, _late, moved, foreign) = done.unwrap();
        delivered += ok;
        lost += missing;
        bytes += moved;
        if let Some(reply) = foreign.first() {
            let owner = sent.lock().unwrap().get(&blake3::hash(reply)).copied();
            match owner {
                Some(owner) => panic!("visitor {v} got a datagram of visitor {owner}: misrouted"),
                None => panic!(
                    "visitor {v} got a corrupted or merged datagram of {} bytes",
                    reply.len()
                ),
            }
        }
    }
    let elapsed = started.elapsed();
    let total = VISITORS * PER_VISITOR;
    let loss = lost as f64 / total as f64;
    println!(
        "udp integrity: {delivered}/{total} round trips, loss {:.3}%, {:.0} datagrams/s each way, {:.1} MB/s each way, {elapsed:?}",
        loss * 100.0,
        delivered as f64 / elapsed.as_secs_f64(),
        bytes as f64 / elapsed.as_secs_f64() / 1e6,
    );
    let stats = tunnel.stats.snapshot();
    println!("server stats: {stats:?}");
    assert!(loss <= 0.01, "loss {loss} above 1% on loopback");
    assert_eq!(
        stats.flows_opened, VISITORS as u64,
        "one session per visitor"
    );
    assert_eq!(stats.flows_evicted, 0);
    assert_eq!(stats.dropped_oversized, 0);
}

#[tokio::test]
async fn issue4_empty_and_largest_datagrams_pass_whole() {
    let echo = echo_target().await;
    let tunnel = udp_tunnel(echo, UdpSettings::DEFAULT).await;
    let socket = visitor(tunnel.service).await;
    for len in [0, 1, 65_507] {
        let payload = datagram(len);
        let reply = ask(&socket, &payload, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("no reply for {len} bytes"));
        assert_eq!(reply.len(), len);
        assert_eq!(blake3::hash(&reply), blake3::hash(&payload), "{len} bytes");
    }
}

/// A target that keeps every datagram it reads, one `recv` each, in arrival order.
async fn recording_target() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let socket = target_socket();
    let addr = socket.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok(n) = socket.recv(&mut buf).await {
            record.lock().unwrap().push(buf[..n].to_vec());
        }
    });
    (addr, seen)
}

/// Waits (5 s at most) until a [`recording_target`] has read `n` datagrams.
async fn wait_seen(seen: &Mutex<Vec<Vec<u8>>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.lock().unwrap().len() < n {
        let got = seen.lock().unwrap().len();
        assert!(
            Instant::now() < deadline,
            "{got} of {n} datagrams reached the target"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The client sends the datagrams of one flow that arrive together in one call (GSO): the
/// target must still read each datagram on its own, whole and in order, whatever their
/// sizes (runs of one size, a shorter one, an empty one, one size again).
#[tokio::test]
async fn a_burst_of_one_flow_reaches_the_target_datagram_by_datagram_in_order() {
    let (target, seen) = recording_target().await;
    let tunnel = udp_tunnel(target, UdpSettings::DEFAULT).await;
    let socket = visitor(tunnel.service).await;
    let mut sizes = vec![1200; 120];
    sizes.extend([300, 0, 1200, 1200, 65_507, 1]);
    sizes.extend(vec![1400; 120]);
    let sent: Vec<Vec<u8>> = sizes.iter().map(|&len| datagram(len)).collect();
    // The first one opens the flow (and the channel); the rest go in one burst.
    socket.send(&sent[0]).await.unwrap();
    wait_seen(&seen, 1).await;
    for payload in &sent[1..] {
        socket.send(payload).await.unwrap();
    }
    wait_seen(&seen, sent.len()).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), sent.len(), "no datagram split or merged");
    for (i, (got, want)) in seen.iter().zip(&sent).enumerate() {
        assert_eq!(got.len(), want.len(), "datagram {i}'s length");
        assert!(got == want, "datagram {i}'s bytes (in order)");
    }
}

/// A visitor that sends a batch in one call (GSO): the service socket reads it in one go
/// (GRO), and the target must still get each datagram on its own.
#[tokio::test]
async fn a_batch_a_visitor_sends_in_one_call_reaches_the_target_datagram_by_datagram() {
    let (target, seen) = recording_target().await;
    let tunnel = udp_tunnel(target, UdpSettings::DEFAULT).await;
    let socket = visitor(tunnel.service).await;
    // The flow (and its channel) first, so the batch is not raced by their opening.
    socket.send(b"open").await.unwrap();
    wait_seen(&seen, 1).await;
    let mut batch = Vec::new();
    for i in 0..10u8 {
        batch.extend(std::iter::repeat_n(i, 1000));
    }
    batch.extend(std::iter::repeat_n(10u8, 123));
    warren::relay::udp::batch::BatchSocket::new(&socket)
        .unwrap()
        .send(&batch, 1000, tunnel.service, None)
        .await
        .unwrap();
    wait_seen(&seen, 12).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 12, "no datagram split or merged");
    for (i, got) in seen[1..].iter().enumerate() {
        let want = if i < 10 { 1000 } else { 123 };
        assert_eq!(got.len(), want, "datagram {i}'s length");
        assert!(
            got.iter().all(|&b| usize::from(b) == i),
            "datagram {i}'s bytes"
        );
    }
}

/// A target that answers with a batch sent in one call (GSO, as a QUIC server does): the
/// client's flow socket reads it in one go (GRO), and the visitor must still get each
/// datagram on its own.
#[tokio::test]
async fn a_batch_the_target_sends_in_one_call_reaches_the_visitor_datagram_by_datagram() {
    let socket = target_socket();
    let target = socket.local_addr().unwrap();
    // 10 datagrams of 1000 bytes and one of 123, each filled with its index.
    let mut batch = Vec::new();
    for i in 0..10u8 {
        batch.extend(std::iter::repeat_n(i, 1000));
    }
    batch.extend(std::iter::repeat_n(10u8, 123));
    let answer = batch.clone();
    tokio::spawn(async move {
        let batches = warren::relay::udp::batch::BatchSocket::new(&socket).unwrap();
        let mut buf = vec![0u8; 65_536];
        while let Ok((_, peer)) = socket.recv_from(&mut buf).await {
            batches.send(&answer, 1000, peer, None).await.unwrap();
        }
    });
    let tunnel = udp_tunnel(target, UdpSettings::DEFAULT).await;
    let visitor = visitor(tunnel.service).await;
    visitor.send(b"go").await.unwrap();
    let mut buf = vec![0u8; 65_536];
    for i in 0..11u8 {
        let n = tokio::time::timeout(Duration::from_secs(5), visitor.recv(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("datagram {i} never came"))
            .unwrap();
        let want = if i < 10 { 1000 } else { 123 };
        assert_eq!(n, want, "datagram {i}'s length");
        assert!(buf[..n].iter().all(|&b| b == i), "datagram {i}'s bytes");
    }
}

/// Replies come out of the tunnel in bursts and leave the service socket in runs (one call
/// per visitor and size): two visitors answered at once, interleaved, must each get their
/// own datagrams, every one whole and in order, whatever the sizes.
#[tokio::test]
async fn bursts_of_replies_to_two_visitors_reach_each_datagram_by_datagram_in_order() {
    let mut sizes = vec![1200; 30];
    sizes.extend([300, 0, 1200, 1200, 65_507, 1]);
    sizes.extend(vec![1400; 30]);
    // Replies for the visitor that says "a" and for the one that says "b".
    let answers: Arc<[Vec<Vec<u8>>; 2]> =
        Arc::new([0, 1].map(|_| sizes.iter().map(|&len| datagram(len)).collect()));
    let socket = target_socket();
    let target = socket.local_addr().unwrap();
    let replies = Arc::clone(&answers);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut peers = [None, None];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            match &buf[..n] {
                b"a" => peers[0] = Some(peer),
                b"b" => peers[1] = Some(peer),
                _ => continue,
            }
            let [Some(a), Some(b)] = peers else {
                continue;
            };
            // Both visitors' replies interleaved, as fast as the socket takes them.
            for (reply_a, reply_b) in replies[0].iter().zip(&replies[1]) {
                socket.send_to(reply_a, a).await.unwrap();
                socket.send_to(reply_b, b).await.unwrap();
            }
        }
    });
    let tunnel = udp_tunnel(target, UdpSettings::DEFAULT).await;
    let visitors = [visitor(tunnel.service).await, visitor(tunnel.service).await];
    let receive = |which: usize| {
        let (socket, want) = (&visitors[which], &answers[which]);
        async move {
            socket
                .send(if which == 0 { b"a" } else { b"b" })
                .await
                .unwrap();
            let mut buf = vec![0u8; 65_536];
            for (i, want) in want.iter().enumerate() {
                let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
                    .await
                    .unwrap_or_else(|_| panic!("visitor {which}: reply {i} never came"))
                    .unwrap();
                assert_eq!(n, want.len(), "visitor {which}: reply {i}'s length");
                assert!(
                    &buf[..n] == want,
                    "visitor {which}: reply {i}'s bytes (in order)"
                );
            }
        }
    };
    tokio::join!(receive(0), receive(1));
}

#[tokio::test]
async fn issue4_full_table_evicts_the_least_recently_active_visitor() {
    let target = port_echo_target().await;
    let tunnel = udp_tunnel(target, settings(60_000, 4)).await;
    let mut visitors = Vec::new();
    let mut ports = Vec::new();
    for i in 0..8u8 {
        let socket = visitor(tunnel.service).await;
        ports.push(flow_port(&socket, &[i]).await);
        visitors.push(socket);
    }
    let distinct: HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        8,
        "one client socket per visitor: {ports:?}"
    );
    assert_eq!(tunnel.stats.snapshot().flows_evicted, 4);
    // The four newest kept their flows (same client socket)...
    for i in 4..8 {
        assert_eq!(
            flow_port(&visitors[i], b"again").await,
            ports[i],
            "visitor {i}"
        );
    }
    assert_eq!(tunnel.stats.snapshot().flows_evicted, 4);
    // ...the four oldest were evicted: coming back makes a new flow (and evicts again).
    let port = flow_port(&visitors[0], b"back").await;
    assert!(!ports.contains(&port), "visitor 0 gets a new flow");
    assert_eq!(tunnel.stats.snapshot().flows_evicted, 5);
}

#[tokio::test]
async fn issue4_idle_sessions_expire() {
    let target = port_echo_target().await;
    let tunnel = udp_tunnel(target, settings(500, 16)).await;
    let socket = visitor(tunnel.service).await;
    let first = flow_port(&socket, b"one").await;
    assert_eq!(
        flow_port(&socket, b"two").await,
        first,
        "same flow while active"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(tunnel.stats.snapshot().flows_expired, 1);
    let again = flow_port(&socket, b"three").await;
    assert_ne!(again, first, "an expired flow comes back as a new one");
}

#[tokio::test]
async fn issue4_one_way_flow_outlives_the_idle_timeout_while_it_sends() {
    // A target that only listens, until the test tells it to answer.
    let target = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let tunnel = udp_tunnel(target_addr, settings(500, 16)).await;
    let socket = visitor(tunnel.service).await;
    let listen = tokio::spawn(async move {
        let mut sources = HashSet::new();
        let mut buf = vec![0u8; 65_536];
        let mut last = None;
        for _ in 0..20 {
            let (_, from) =
                tokio::time::timeout(Duration::from_secs(2), target.recv_from(&mut buf))
                    .await
                    .expect("the one-way flow keeps arriving")
                    .unwrap();
            sources.insert(from);
            last = Some(from);
        }
        (target, sources, last.unwrap())
    });
    // 2 s of one-way traffic, every 100 ms, with a 500 ms idle timeout.
    for i in 0..20u8 {
        socket.send(&[i]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (target, sources, last) = listen.await.unwrap();
    assert_eq!(
        sources.len(),
        1,
        "the client kept one socket for the flow: {sources:?}"
    );
    // Only now does the target answer: the reply must still find the visitor.
    target.send_to(b"late answer", last).await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), socket.recv(&mut buf))
        .await
        .expect("the late answer reaches the visitor")
        .unwrap();
    assert_eq!(&buf[..n], b"late answer");
    assert_eq!(tunnel.stats.snapshot().flows_expired, 0);
}

#[tokio::test]
async fn issue4_udp_comes_back_after_a_server_restart() {
    let echo = echo_target().await;
    let mut tunnel = udp_tunnel(echo, UdpSettings::DEFAULT).await;
    let socket = visitor(tunnel.service).await;
    assert_eq!(
        ask(&socket, b"before", Duration::from_secs(2))
            .await
            .as_deref(),
        Some(&b"before"[..])
    );

    tunnel.server_stop.cancel();
    (&mut tunnel.server_task).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        tunnel.client_status.wait_for(|s| !s.connected),
    )
    .await
    .unwrap()
    .unwrap();

    let (_addr, service, _stats, _stop, _task) =
        start_server(tunnel.server_addr, tunnel.service, UdpSettings::DEFAULT).await;
    assert_eq!(service, tunnel.service);
    wait_sessions(&mut tunnel.client_status, 2).await;
    // The same visitor socket works again (datagrams sent before the client is back may be
    // dropped, as UDP allows; retry for a bounded time).
    let mut answered = None;
    for _ in 0..20 {
        answered = ask(&socket, b"after", Duration::from_millis(250)).await;
        if answered.is_some() {
            break;
        }
    }
    assert_eq!(answered.as_deref(), Some(&b"after"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue4_datagrams_are_not_held_up_by_a_bulk_tcp_transfer() {
    let echo = echo_target().await;
    let (tcp_target, mut tcp_results) = support::sink_then_reply_target(16).await;
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .udp_service(SERVICE, "127.0.0.1:0".parse().unwrap())
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let (server_addr, web, dns) = (
        bound.local_addr(),
        bound.service_addr("web").unwrap(),
        bound.service_addr(SERVICE).unwrap(),
    );
    let _server_stop = bound.shutdown_token().drop_guard();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", HostPort::from(tcp_target))
        .udp_service(SERVICE, HostPort::from(echo))
        .build()
        .expect("valid client");
    let mut status = client.status();
    let stop = CancellationToken::new();
    let _client_stop = stop.clone().drop_guard();
    tokio::spawn(client.run(stop));
    wait_sessions(&mut status, 1).await;

    let payload = support::random_bytes(64 * 1024 * 1024);
    let expected = support::hash(&payload);
    let bulk = tokio::spawn(async move { support::round_trip(web, &payload).await });
    let socket = visitor(dns).await;
    let mut slowest = Duration::ZERO;
    for i in 0..50u32 {
        let started = Instant::now();
        let reply = ask(&socket, &i.to_be_bytes(), Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("datagram {i} unanswered during the TCP transfer"));
        assert_eq!(reply, i.to_be_bytes());
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let moved = bulk.await.unwrap().expect("the bulk transfer completes");
    assert_eq!(moved.len(), 16);
    assert_eq!(tcp_results.recv().await.unwrap().0, expected);
    println!("slowest UDP round trip during a 64 MiB TCP transfer: {slowest:?}");
}

// ---- Issue 5: UDP forward services and client-declared UDP services ----

/// A server and a client built by the closures, the client connected.
async fn pair(
    server: impl FnOnce(warren::ServerBuilder) -> warren::ServerBuilder,
    client: impl FnOnce(warren::ClientBuilder) -> warren::ClientBuilder,
) -> (ClientStatus, CancellationToken, CancellationToken) {
    let bound = server(
        Server::builder()
            .bind("127.0.0.1:0".parse().unwrap())
            .psk(PSK)
            .default_token(TOKEN),
    )
    .build()
    .expect("valid server")
    .bind()
    .await
    .expect("server binds");
    let server_addr = bound.local_addr();
    let server_stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let built = client(
        Client::builder(HostPort::from(server_addr))
            .psk(PSK)
            .default_token(TOKEN)
            .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400)),
    )
    .build()
    .expect("valid client");
    let mut status = built.status();
    let client_stop = CancellationToken::new();
    tokio::spawn(built.run(client_stop.clone()));
    wait_sessions(&mut status, 1).await;
    let status = status.borrow().clone();
    (status, client_stop, server_stop)
}

/// `visitors` sockets each send `per_visitor` hash-tagged datagrams through `service` to a
/// port-echo target; every reply must come back whole, to the visitor that sent it, and
/// each visitor's flow must keep one source port at the target, distinct from the others'.
async fn check_visitors(service: SocketAddr, visitors: usize, per_visitor: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for v in 0..visitors {
        tasks.spawn(async move {
            let socket = visitor(service).await;
            let mut ports = HashSet::new();
            for i in 0..per_visitor {
                let payload = datagram(32 + (v * 997 + i * 131) % 3000);
                let reply = ask(&socket, &payload, Duration::from_secs(2))
                    .await
                    .expect("a reply within 2s");
                assert_eq!(
                    blake3::hash(&reply[2..]),
                    blake3::hash(&payload),
                    "visitor {v} got its own datagram back, whole"
                );
                assert!(self_consistent(&reply[2..]));
                ports.insert(u16::from_be_bytes([reply[0], reply[1]]));
            }
            assert_eq!(ports.len(), 1, "one flow socket per visitor: {ports:?}");
            ports.into_iter().next().unwrap()
        });
    }
    let mut flow_ports = HashSet::new();
    while let Some(port) = tasks.join_next().await {
        flow_ports.insert(port.expect("visitor task"));
    }
    assert_eq!(flow_ports.len(), visitors, "each visitor is its own flow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue5_udp_forward_carries_several_visitors_to_the_right_one() {
    let target = port_echo_target().await;
    let (status, client_stop, server_stop) = pair(
        |s| s.udp_forward_service("dns", HostPort::from(target), UdpSettings::DEFAULT),
        |c| c.udp_forward_service("dns", "127.0.0.1:0".parse().unwrap(), UdpSettings::DEFAULT),
    )
    .await;
    assert_eq!(status.services, ["dns"]);
    let local = status.forwards["dns"];
    check_visitors(local, 8, 25).await;
    // The largest and the empty datagram pass whole, both ways.
    let socket = visitor(local).await;
    for len in [0usize, 65_507 - 2] {
        let payload = datagram(len);
        let reply = ask(&socket, &payload, Duration::from_secs(2))
            .await
            .expect("reply");
        assert_eq!(blake3::hash(&reply[2..]), blake3::hash(&payload), "{len}");
    }
    client_stop.cancel();
    server_stop.cancel();
}

#[tokio::test]
async fn issue5_udp_forward_flows_expire_when_idle() {
    let target = port_echo_target().await;
    let (status, client_stop, server_stop) = pair(
        |s| s.udp_forward_service("dns", HostPort::from(target), settings(400, 16)),
        |c| c.udp_forward_service("dns", "127.0.0.1:0".parse().unwrap(), settings(400, 16)),
    )
    .await;
    let socket = visitor(status.forwards["dns"]).await;
    let first = flow_port(&socket, b"one").await;
    assert_eq!(
        flow_port(&socket, b"two").await,
        first,
        "same flow while active"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = flow_port(&socket, b"three").await;
    assert_ne!(again, first, "an expired flow comes back as a new one");
    client_stop.cancel();
    server_stop.cancel();
}

#[tokio::test]
async fn issue5_forward_protocol_mismatch_is_denied_with_the_fix() {
    let target = port_echo_target().await;
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .udp_forward_service("dns", HostPort::from(target), UdpSettings::DEFAULT)
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let server_addr = bound.local_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .forward_service("dns", "127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        client.run(CancellationToken::new()),
    )
    .await
    .expect("ends");
    let Err(warren::ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(
        reason.contains("is a udp forward service on the server; set type = \"udp\""),
        "{reason}"
    );
    stop.cancel();
}

fn allow_ports(s: warren::ServerBuilder) -> warren::ServerBuilder {
    s.allow_ports("20000-29999".parse::<warren::PortRange>().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue5_declared_udp_service_gets_a_port_in_range_and_works() {
    let target = port_echo_target().await;
    let (status, client_stop, server_stop) = pair(allow_ports, |c| {
        c.declared_udp_service(
            "dnsd",
            HostPort::from(target),
            "0.0.0.0:0".parse().unwrap(),
            UdpSettings::DEFAULT,
        )
    })
    .await;
    let bound = status.bound["dnsd"];
    assert!((20000..=29999).contains(&bound.port()), "{bound}");
    assert_eq!(
        bound.ip().to_string(),
        "127.0.0.1",
        "default: the server's IP"
    );
    check_visitors(bound, 4, 20).await;
    // The port is released when the session ends.
    client_stop.cancel();
    let mut freed = false;
    for _ in 0..50 {
        if UdpSocket::bind(bound).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        freed,
        "declared UDP port {bound} still bound after the session"
    );
    server_stop.cancel();
}

/// Runs a client declaring one UDP service on `remote_bind` until the server refuses it.
async fn declared_udp_refusal(server_addr: SocketAddr, remote_bind: &str) -> String {
    let client = Client::builder(HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .declared_udp_service(
            "dnsd",
            HostPort::from(SocketAddr::from(([127, 0, 0, 1], 9))),
            remote_bind.parse().unwrap(),
            UdpSettings::DEFAULT,
        )
        .build()
        .unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        client.run(CancellationToken::new()),
    )
    .await
    .expect("ends");
    match result {
        Err(warren::ClientError::AllServicesRefused(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn issue5_declared_udp_port_taken_or_outside_the_range_is_refused_clearly() {
    let bound = allow_ports(
        Server::builder()
            .bind("127.0.0.1:0".parse().unwrap())
            .psk(PSK)
            .default_token(TOKEN),
    )
    .build()
    .unwrap()
    .bind()
    .await
    .unwrap();
    let server_addr = bound.local_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    // A UDP port in the range that something else holds.
    let mut holder = None;
    for _ in 0..200 {
        let port = 20000 + rand::random::<u16>() % 10000;
        if let Ok(socket) = UdpSocket::bind(("127.0.0.1", port)).await {
            holder = Some((port, socket));
            break;
        }
    }
    let (port, _socket) = holder.expect("a free UDP port in the range");
    let reason = declared_udp_refusal(server_addr, &format!("127.0.0.1:{port}")).await;
    assert!(
        reason.contains(&format!("UDP port {port} is in use on the server")),
        "{reason}"
    );
    let reason = declared_udp_refusal(server_addr, "127.0.0.1:80").await;
    assert!(
        reason.contains("port 80 is outside the server's allow_ports 20000-29999"),
        "{reason}"
    );
    stop.cancel();
}

/// A server with one UDP forward service `dns` to `target`, on `bind`.
async fn udp_forward_server(
    bind: SocketAddr,
    target: SocketAddr,
) -> (SocketAddr, CancellationToken, JoinHandle<()>) {
    let bound = Server::builder()
        .bind(bind)
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_interval(Duration::from_secs(1))
        .udp_forward_service("dns", HostPort::from(target), UdpSettings::DEFAULT)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let addr = bound.local_addr();
    let stop = bound.shutdown_token();
    (addr, stop, tokio::spawn(bound.run()))
}

#[tokio::test]
async fn issue5_udp_forward_comes_back_after_a_server_restart() {
    let echo = echo_target().await;
    let (server_addr, server_stop, server_task) =
        udp_forward_server("127.0.0.1:0".parse().unwrap(), echo).await;
    let client = Client::builder(HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400))
        .udp_forward_service("dns", "127.0.0.1:0".parse().unwrap(), UdpSettings::DEFAULT)
        .build()
        .expect("valid client");
    let mut status = client.status();
    let client_stop = CancellationToken::new();
    tokio::spawn(client.run(client_stop.clone()));
    wait_sessions(&mut status, 1).await;
    let local = status.borrow().forwards["dns"];
    let socket = visitor(local).await;
    assert_eq!(
        ask(&socket, b"before", Duration::from_secs(2))
            .await
            .as_deref(),
        Some(&b"before"[..])
    );

    server_stop.cancel();
    server_task.await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| !s.connected))
        .await
        .unwrap()
        .unwrap();
    // While no session is up, datagrams are dropped (UDP allows it), never queued forever.
    assert_eq!(
        ask(&socket, b"lost", Duration::from_millis(300)).await,
        None
    );

    let (_addr, stop_again, _task) = udp_forward_server(server_addr, echo).await;
    wait_sessions(&mut status, 2).await;
    assert_eq!(
        status.borrow().forwards["dns"],
        local,
        "the client's port stays"
    );
    // The same visitor socket works again through a new channel of the new session.
    let mut answered = None;
    for _ in 0..20 {
        answered = ask(&socket, b"after", Duration::from_millis(250)).await;
        if answered.is_some() {
            break;
        }
    }
    assert_eq!(answered.as_deref(), Some(&b"after"[..]));
    client_stop.cancel();
    stop_again.cancel();
}
