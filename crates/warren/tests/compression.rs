//! Compression (issue 19), in process: the client reaches the server through a counting
//! TCP relay, so what crosses the wire between them is measured, not taken from Warren's
//! own counters. Compressible bytes cross in a fraction of their size, in both directions
//! (each side compresses what it sends); random bytes cross as they are; every byte
//! arrives (hash checked).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use warren::Codec;
use warren::{Client, HostPort, Server};

/// Bytes that crossed the relay, each way.
#[derive(Default)]
struct Wire {
    to_server: AtomicU64,
    to_client: AtomicU64,
}

impl Wire {
    fn now(&self) -> (u64, u64) {
        (
            self.to_server.load(Ordering::Relaxed),
            self.to_client.load(Ordering::Relaxed),
        )
    }
}

/// A TCP relay to `server` that counts every byte through it.
async fn counting_relay(server: SocketAddr) -> (SocketAddr, Arc<Wire>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let wire = Arc::new(Wire::default());
    let counts = Arc::clone(&wire);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = upstream.into_split();
                let up = async {
                    let n = tokio::io::copy(&mut client_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                    n
                };
                let down = async {
                    let n = tokio::io::copy(&mut server_read, &mut client_write).await;
                    let _ = client_write.shutdown().await;
                    n
                };
                // Counted when each direction ends: the test reads after its visitors
                // are done and the channels are closed.
                let (up, down) = tokio::join!(up, down);
                counts
                    .to_server
                    .fetch_add(up.unwrap_or(0), Ordering::Relaxed);
                counts
                    .to_client
                    .fetch_add(down.unwrap_or(0), Ordering::Relaxed);
            });
        }
    });
    (addr, wire)
}

/// JSON log lines: what a compressing tunnel is for.
fn json_logs(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 200);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{{\"ts\":\"2026-11-24T22:{:02}:{:02}Z\",\"level\":\"info\",\"event\":\"request\",\"path\":\"/api/v1/items/{}\",\"status\":200,\"ms\":{}}}\n",
                i / 60 % 60,
                i % 60,
                i % 1000,
                i % 97
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// Echoes `payload` through a server that compresses with zstd and a client that
/// compresses with lz4, the client going through a counting relay; returns the bytes
/// that crossed the wire (to the server, to the client) while it did.
async fn echo_through_compressing_tunnel(payload: &[u8]) -> (u64, u64) {
    let echo = echo_target().await;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let bound = Server::builder()
        .bind(any)
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", any)
        .compression("web", Codec::Zstd)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let service = bound.service_addr("web").unwrap();
    let (relay, wire) = counting_relay(bound.local_addr()).await;
    let server_stop = bound.shutdown_token().drop_guard();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(relay))
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", HostPort::from(echo))
        .compression("web", Codec::Lz4)
        .build()
        .expect("valid client");
    let stop = run_connected(client).await;
    let reply = round_trip(service, payload).await.expect("round trip");
    assert_eq!(hash(&reply), hash(payload), "the echo differs");
    // Closing both ends closes every channel through the relay, which then counts them.
    stop.cancel();
    drop(server_stop);
    let mut last = (0, 0);
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = wire.now();
        if now == last && now.0 > 0 {
            break;
        }
        last = now;
    }
    wire.now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressible_bytes_cross_the_wire_in_a_fraction_of_their_size_both_ways() {
    let payload = json_logs(4 * 1024 * 1024);
    let (to_server, to_client) = echo_through_compressing_tunnel(&payload).await;
    let size = payload.len() as f64;
    eprintln!(
        "4 MiB of JSON logs: {:.1} % of it on the wire from the server (zstd), {:.1} % from the client (lz4)",
        100.0 * to_client as f64 / size,
        100.0 * to_server as f64 / size
    );
    // The visitor's bytes go server -> client compressed by the server (zstd); the echo
    // goes client -> server compressed by the client (lz4).
    assert!(
        (to_client as f64) < size / 5.0,
        "zstd: {to_client} bytes on the wire"
    );
    assert!(
        (to_server as f64) < size / 3.0,
        "lz4: {to_server} bytes on the wire"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_cross_as_they_are() {
    let payload = random_bytes(4 * 1024 * 1024);
    let (to_server, to_client) = echo_through_compressing_tunnel(&payload).await;
    let size = payload.len() as u64;
    eprintln!("4 MiB of random bytes: {to_server} bytes to the server, {to_client} to the client");
    for (way, bytes) in [("to the server", to_server), ("to the client", to_client)] {
        assert!(bytes >= size, "{way}: {bytes} bytes for {size} random ones");
        // Record headers and tags, the handshake and heartbeats: well under 2 %.
        assert!(bytes < size + size / 50, "{way}: {bytes} bytes for {size}");
    }
}
