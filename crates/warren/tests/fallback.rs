//! `transports = [...]` (issue 19), in process on loopback: the client races its transports
//! happy-eyeballs style, falls back past one that is silent after the stagger and past one
//! that is refused at once, keeps the first when it works, and moves back to an earlier
//! transport when it works again while a transfer keeps flowing (bytes checked). The
//! network-namespace versions with the real binary are in `tests/netns.rs`.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren::config::{HostPort, Transport, TransportEntry};
use warren::{Client, ClientStatus, Server};

fn entry(transport: Transport, port: Option<u16>) -> TransportEntry {
    TransportEntry { transport, port }
}

/// A server on 127.0.0.1 listening on `transports` (TCP and UDP on one port number), with
/// one reverse service `web`.
async fn server_on(transports: Vec<TransportEntry>) -> (TestServer, Option<SocketAddr>) {
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .transports(transports)
        .quic(quic_config())
        .heartbeat_interval(Duration::from_secs(1))
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds");
    let quic = bound.transport_addr(Transport::Quic);
    let server = TestServer {
        addr: bound
            .transport_addr(Transport::Noise)
            .expect("noise listens"),
        service: bound.service_addr("web").unwrap(),
        stop: bound.shutdown_token(),
        task: tokio::spawn(async move {}),
    };
    let stop = server.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = bound.run() => {}
            () = stop.cancelled() => {}
        }
    });
    (server, quic)
}

/// A client of the server at `server` trying `transports` in order, serving `web` to
/// `target`.
fn client_of(
    server: SocketAddr,
    transports: Vec<TransportEntry>,
    target: SocketAddr,
    retry: Duration,
) -> (
    tokio::sync::watch::Receiver<ClientStatus>,
    CancellationToken,
) {
    let client = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .transports(transports)
        .quic(quic_config())
        .handshake_timeout(Duration::from_secs(3))
        .transport_retry(retry)
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400))
        .tcp_service("web", HostPort::from(target))
        .build()
        .expect("valid client");
    let status = client.status();
    let stop = CancellationToken::new();
    tokio::spawn(client.run(stop.clone()));
    (status, stop)
}

/// Waits (at most `within`) until the client is connected over `transport`; returns when.
async fn connected_over(
    status: &mut tokio::sync::watch::Receiver<ClientStatus>,
    transport: &str,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    let waited = tokio::time::timeout(
        within,
        status.wait_for(|s| {
            s.connected && s.transports.first().map(String::as_str) == Some(transport)
        }),
    )
    .await
    .map(|seen| seen.map(|_| ()));
    match waited {
        Ok(Ok(())) => started.elapsed(),
        Ok(Err(_)) => panic!("the client stopped"),
        Err(_) => panic!(
            "not connected over {transport} within {within:?}: {:?}",
            *status.borrow()
        ),
    }
}

/// A UDP port that takes datagrams and never answers: UDP blackholed.
async fn silent_udp() -> (UdpSocket, u16) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

/// A TCP port nobody listens on: connections to it are reset at once.
async fn closed_tcp_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_transport_costs_about_one_stagger() {
    let target = echo_target().await;
    let (server, _) = server_on(vec![entry(Transport::Noise, None)]).await;
    let (_silent, udp_port) = silent_udp().await;
    let started = Instant::now();
    let (mut status, stop) = client_of(
        server.addr,
        vec![
            entry(Transport::Quic, Some(udp_port)),
            entry(Transport::Noise, None),
        ],
        target,
        Duration::from_secs(30),
    );
    connected_over(&mut status, "noise", Duration::from_secs(5)).await;
    let took = started.elapsed();
    eprintln!("silent quic, then noise: connected in {took:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "expected one ~1 s stagger, took {took:?}"
    );
    let payload = random_bytes(1 << 20);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    stop.cancel();
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transport_falls_back_at_once() {
    let target = echo_target().await;
    let (server, _) = server_on(vec![entry(Transport::Noise, None)]).await;
    let closed = closed_tcp_port().await;
    let started = Instant::now();
    let (mut status, stop) = client_of(
        server.addr,
        vec![
            entry(Transport::Wss, Some(closed)),
            entry(Transport::Noise, None),
        ],
        target,
        Duration::from_secs(30),
    );
    connected_over(&mut status, "noise", Duration::from_secs(5)).await;
    let took = started.elapsed();
    eprintln!("refused wss, then noise: connected in {took:?}");
    assert!(
        took < Duration::from_millis(800),
        "a reset must not wait for the stagger: {took:?}"
    );
    stop.cancel();
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_transport_wins_when_it_works() {
    let target = echo_target().await;
    let (server, quic) = server_on(vec![
        entry(Transport::Quic, None),
        entry(Transport::Noise, None),
    ])
    .await;
    assert_eq!(
        quic.map(|a| a.port()),
        Some(server.addr.port()),
        "one port number for both"
    );
    let (mut status, stop) = client_of(
        server.addr,
        vec![entry(Transport::Quic, None), entry(Transport::Noise, None)],
        target,
        Duration::from_secs(30),
    );
    connected_over(&mut status, "quic", Duration::from_secs(5)).await;
    let payload = random_bytes(1 << 20);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    stop.cancel();
    server.stop.cancel();
}

/// A UDP relay in front of the server's QUIC port that drops everything until switched on.
struct UdpGate {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
}

impl UdpGate {
    async fn start(upstream: SocketAddr) -> UdpGate {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        back.connect(upstream).await.unwrap();
        let open = Arc::new(AtomicBool::new(false));
        let client: Arc<std::sync::Mutex<Option<SocketAddr>>> = Arc::default();
        let gate = UdpGate {
            addr: front.local_addr().unwrap(),
            open: Arc::clone(&open),
        };
        {
            let (front, back, open, client) = (
                Arc::clone(&front),
                Arc::clone(&back),
                Arc::clone(&open),
                Arc::clone(&client),
            );
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok((n, from)) = front.recv_from(&mut buf).await {
                    if open.load(Ordering::Relaxed) {
                        *client.lock().unwrap() = Some(from);
                        let _ = back.send(&buf[..n]).await;
                    }
                }
            });
        }
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = back.recv(&mut buf).await {
                let to = *client.lock().unwrap();
                if let (true, Some(to)) = (open.load(Ordering::Relaxed), to) {
                    let _ = front.send_to(&buf[..n], to).await;
                }
            }
        });
        gate
    }
}

/// A visitor that sends `total` random bytes in 64 KiB pieces, `pace` apart, through an
/// echo service while reading the echo; returns whether every byte came back exactly.
async fn paced_echo(service: SocketAddr, total: usize, pace: Duration) -> bool {
    let payload = random_bytes(total);
    let expected = hash(&payload);
    let stream = TcpStream::connect(service).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let send = async move {
        for piece in payload.chunks(64 << 10) {
            w.write_all(piece).await?;
            tokio::time::sleep(pace).await;
        }
        w.shutdown().await
    };
    let receive = async move {
        let mut echoed = Vec::with_capacity(total);
        r.read_to_end(&mut echoed).await?;
        Ok::<_, std::io::Error>(echoed)
    };
    match tokio::try_join!(send, receive) {
        Ok(((), echoed)) => hash(&echoed) == expected,
        Err(error) => panic!("the transfer broke: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_moves_back_to_quic_while_a_transfer_keeps_flowing() {
    let target = echo_target().await;
    let (server, quic) = server_on(vec![
        entry(Transport::Quic, None),
        entry(Transport::Noise, None),
    ])
    .await;
    let gate = UdpGate::start(quic.expect("quic listens")).await;
    let (mut status, stop) = client_of(
        server.addr,
        vec![
            entry(Transport::Quic, Some(gate.addr.port())),
            entry(Transport::Noise, None),
        ],
        target,
        Duration::from_millis(300),
    );
    connected_over(&mut status, "noise", Duration::from_secs(5)).await;

    // 8 MiB in 128 pieces 25 ms apart: about 3 s of transfer on the noise session.
    let transfer = tokio::spawn(paced_echo(
        server.service,
        8 << 20,
        Duration::from_millis(25),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.open.store(true, Ordering::Relaxed);
    let moved = connected_over(
        &mut status,
        &format!("quic:{}", gate.addr.port()),
        Duration::from_secs(10),
    )
    .await;
    eprintln!("UDP back: moved to QUIC {moved:?} later");
    assert!(
        !transfer.is_finished(),
        "the move must happen while the transfer flows"
    );
    assert!(
        transfer.await.unwrap(),
        "the transfer's bytes differ after the move"
    );
    // New visitors ride the QUIC session.
    let payload = random_bytes(1 << 20);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    assert_eq!(
        status.borrow().transports,
        [format!("quic:{}", gate.addr.port())]
    );
    stop.cancel();
    server.stop.cancel();
}
