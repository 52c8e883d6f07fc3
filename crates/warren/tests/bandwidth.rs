//! Bandwidth limits (issue 19): an in-process server and client on 127.0.0.1 hold a
//! limited service to its rate, each direction on its own, shared by all of its
//! connections; the bytes still arrive exactly (checked by hash), and UDP over the limit
//! is dropped and counted. The ±10 % figure over 10 s is checked end to end with iperf3
//! (`e2e.rs`); here only "never faster than the limit", which a slow machine cannot break.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use warren::{Client, HostPort, Server, UdpSettings};

const RATE: u64 = 2_000_000;
const MB: usize = 1_000_000;

/// One server with the tcp services `up` and `down`, and a client serving them from their
/// targets with both held to [`RATE`]; returns the services' public addresses.
async fn limited_tunnel(
    up: SocketAddr,
    down: SocketAddr,
) -> ((SocketAddr, SocketAddr), [tokio_util::sync::DropGuard; 2]) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let bound = Server::builder()
        .bind(any)
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("up", any)
        .tcp_service("down", any)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let server = bound.local_addr();
    let services = (
        bound.service_addr("up").unwrap(),
        bound.service_addr("down").unwrap(),
    );
    let server_stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("up", HostPort::from(up))
        .tcp_service("down", HostPort::from(down))
        .bandwidth_limit("up", RATE)
        .bandwidth_limit("down", RATE)
        .build()
        .expect("valid client");
    let stop = run_connected(client).await;
    (services, [stop.drop_guard(), server_stop.drop_guard()])
}

/// Four visitors through `service` at once, each sending `send` bytes and reading what
/// comes back; returns how long they took and each one's (sent, received) hashes.
async fn four_visitors(
    service: SocketAddr,
    send: usize,
) -> (f64, Vec<(blake3::Hash, blake3::Hash)>) {
    let started = Instant::now();
    let visitors: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let payload = random_bytes(send);
                let reply = round_trip(service, &payload).await.expect("round trip");
                (hash(&payload), hash(&reply))
            })
        })
        .collect();
    let mut hashes = Vec::new();
    for visitor in visitors {
        hashes.push(visitor.await.unwrap());
    }
    (started.elapsed().as_secs_f64(), hashes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_service_shares_its_rate_over_all_connections_in_each_direction() {
    let (up_target, mut up_results) = sink_then_reply_target(0).await;
    let (down_target, mut down_results) = sink_then_reply_target(MB).await;
    let ((up, down), _tunnel) = limited_tunnel(up_target, down_target).await;
    // 4 MB through one direction's bucket at 2 MB/s is 2 s, less the burst (at most 100 kB)
    // and the last chunk of each connection (paid after it went, at most 64 KiB each).
    let fastest = (4.0 * MB as f64 - 100_000.0 - 4.0 * 65_536.0) / RATE as f64;
    for (label, service, send, results) in [
        ("visitor -> target", up, MB, &mut up_results),
        ("target -> visitor", down, 0, &mut down_results),
    ] {
        let (elapsed, sent) = four_visitors(service, send).await;
        for _ in 0..4 {
            let (received, reply) = results.recv().await.unwrap();
            assert!(
                sent.iter()
                    .any(|(up, down)| *up == received && *down == hash(&reply)),
                "{label}: a visitor's bytes differ"
            );
        }
        eprintln!(
            "{label}: 4 MB through a 2 MB/s limit in {elapsed:.2} s (no faster than {fastest:.2} s)"
        );
        assert!(
            elapsed >= fastest,
            "{label}: took {elapsed:.2} s, faster than the limit allows"
        );
        assert!(
            elapsed < 20.0,
            "{label}: took {elapsed:.2} s, the limit stalls"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_over_the_limit_is_dropped_and_counted() {
    let target = udp_echo_target().await;
    let settings = UdpSettings::DEFAULT;
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .udp_service_with("dns", "127.0.0.1:0".parse().unwrap(), settings)
        .bandwidth_limit("dns", 200_000)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let server = bound.local_addr();
    let service = bound.service_addr("dns").unwrap();
    let stats = bound.udp_stats("dns").unwrap();
    let server_stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let _server_stop = server_stop.drop_guard();
    let client = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .udp_service_with("dns", HostPort::from(target), settings)
        .build()
        .expect("valid client");
    let _stop = run_connected(client).await.drop_guard();

    let visitor = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    visitor.connect(service).await.unwrap();
    // The first datagram opens the flow; wait for its echo so the rest meet a ready path.
    let mut buf = vec![0u8; 2048];
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            visitor.send(b"hello").await.unwrap();
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(200), visitor.recv(&mut buf)).await
            {
                return;
            }
        }
    })
    .await
    .expect("the UDP service answers");

    // 1 MB in 1000-byte datagrams, sent in well under a second: at 200 kB/s little more
    // than the burst (64 KiB) plus what the send time earns fits.
    let started = Instant::now();
    let datagram = random_bytes(1000);
    for _ in 0..1000 {
        visitor.send(&datagram).await.unwrap();
    }
    let sending = started.elapsed().as_secs_f64();
    let mut echoed = 0usize;
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(500), visitor.recv(&mut buf)).await
    {
        assert_eq!(hash(&buf[..n]), hash(&datagram), "an echo differs");
        echoed += n;
    }
    let allowed = 65_536.0 + (sending + 0.5) * 200_000.0 + 1000.0;
    let dropped = stats.snapshot().dropped_over_limit;
    eprintln!(
        "sent 1 MB in {sending:.3} s; {echoed} bytes echoed (at most {allowed:.0}); {dropped} dropped"
    );
    assert!(echoed > 0, "nothing came back");
    assert!(
        (echoed as f64) <= allowed,
        "{echoed} bytes echoed: more than the limit allows"
    );
    assert!(dropped > 0, "drops over the limit are counted");
}
