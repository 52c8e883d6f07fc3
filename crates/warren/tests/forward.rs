//! Issue 5 in process: forward services, client-declared services, IPv6 and PROXY headers.
//! Server and client on loopback (port 0), bytes checked by hash both ways.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use warren::{Client, ClientError, ClientStatus, HostPort, PortRange, ProxyProtocol, Server};

struct Running {
    addr: SocketAddr,
    stop: CancellationToken,
}

async fn server(
    bind: &str,
    configure: impl FnOnce(warren::ServerBuilder) -> warren::ServerBuilder,
) -> Running {
    let builder = Server::builder()
        .bind(bind.parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_interval(Duration::from_secs(1));
    let bound = configure(builder)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("binds");
    let addr = bound.local_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    Running { addr, stop }
}

struct RunningClient {
    status: tokio::sync::watch::Receiver<ClientStatus>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ClientError>>,
}

fn client(
    server: SocketAddr,
    configure: impl FnOnce(warren::ClientBuilder) -> warren::ClientBuilder,
) -> RunningClient {
    let builder = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400));
    let client = configure(builder).build().expect("valid client");
    let status = client.status();
    let stop = CancellationToken::new();
    let task = tokio::spawn(client.run(stop.clone()));
    RunningClient { status, stop, task }
}

impl RunningClient {
    async fn connected(&mut self) -> ClientStatus {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.status.wait_for(|s| s.connected),
        )
        .await
        .expect("connects within 10s")
        .expect("client alive")
        .clone()
    }
}

/// Hash-checked bytes both ways through `addr` to a sink-then-reply target.
async fn check_bytes(
    addr: SocketAddr,
    results: &mut tokio::sync::mpsc::UnboundedReceiver<(blake3::Hash, Vec<u8>)>,
) {
    let payload = random_bytes(2 * 1024 * 1024 + 3);
    let reply = round_trip(addr, &payload).await.expect("round trip");
    let (received, sent) = results.recv().await.expect("target saw a connection");
    assert_eq!(received, hash(&payload), "visitor -> target bytes differ");
    assert_eq!(hash(&reply), hash(&sent), "target -> visitor bytes differ");
}

#[tokio::test]
async fn forward_service_by_name_carries_bytes_both_ways() {
    let (target, mut results) = sink_then_reply_target(1024 * 1024 + 5).await;
    let server = server("127.0.0.1:0", |b| {
        b.forward_service("db", HostPort::from(target))
    })
    .await;
    let mut client = client(server.addr, |b| {
        b.forward_service("db", "127.0.0.1:0".parse().unwrap())
    });
    let status = client.connected().await;
    assert_eq!(status.services, ["db"]);
    let local = status.forwards["db"];
    for _ in 0..3 {
        check_bytes(local, &mut results).await;
    }
    client.stop.cancel();
    server.stop.cancel();
}

#[tokio::test]
async fn forward_service_by_target_over_ipv6() {
    let Ok(probe) = TcpListener::bind("[::1]:0").await else {
        eprintln!("skipping: no IPv6 loopback");
        return;
    };
    drop(probe);
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let target = listener.local_addr().unwrap();
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
    let server = server("[::1]:0", |b| {
        b.forward_service("internal-name", HostPort::from(target))
    })
    .await;
    let mut client = client(server.addr, |b| {
        b.forward_to(
            "mine",
            "[::1]:0".parse().unwrap(),
            format!("[::1]:{}", target.port()).parse().unwrap(),
        )
        .prefer_ipv6(true)
    });
    let status = client.connected().await;
    let local = status.forwards["mine"];
    assert!(local.is_ipv6());
    let payload = random_bytes(512 * 1024 + 1);
    let reply = round_trip(local, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    client.stop.cancel();
    server.stop.cancel();
}

#[tokio::test]
async fn forward_claim_for_an_unlisted_target_is_refused() {
    let echo = echo_target().await;
    let server = server("127.0.0.1:0", |b| {
        b.forward_service("db", HostPort::from(echo))
            .tcp_service("web", "127.0.0.1:0".parse().unwrap())
    })
    .await;
    // A target the server does not name: refused, the client gives up.
    let c = client(server.addr, |b| {
        b.forward_to(
            "x",
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
        )
    });
    let result = tokio::time::timeout(Duration::from_secs(10), c.task)
        .await
        .expect("client ends")
        .expect("no panic");
    assert!(matches!(result, Err(ClientError::AllServicesRefused(_))));
    // A forward claim for a reverse service: denied with a reason naming the direction.
    let c = client(server.addr, |b| {
        b.forward_service("web", "127.0.0.1:0".parse().unwrap())
    });
    let result = tokio::time::timeout(Duration::from_secs(10), c.task)
        .await
        .expect("client ends")
        .expect("no panic");
    let Err(ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(reason.contains("reverse service"), "{reason}");
    server.stop.cancel();
}

#[tokio::test]
async fn declared_service_gets_a_port_in_range_and_carries_bytes() {
    let (target, mut results) = sink_then_reply_target(300_000).await;
    let server = server("127.0.0.1:0", |b| {
        b.allow_ports("20000-29999".parse::<PortRange>().unwrap())
    })
    .await;
    let mut client = client(server.addr, |b| {
        b.declared_service("app", HostPort::from(target), "0.0.0.0:0".parse().unwrap())
    });
    let status = client.connected().await;
    let bound = status.bound["app"];
    assert!((20000..=29999).contains(&bound.port()), "{bound}");
    assert_eq!(bound.ip(), server.addr.ip(), "default: the server's own IP");
    check_bytes(bound, &mut results).await;
    // The port is released when the session ends.
    client.stop.cancel();
    let _ = client.task.await;
    let mut freed = false;
    for _ in 0..50 {
        if TcpListener::bind(bound).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        freed,
        "declared port {bound} still bound after the session ended"
    );
    server.stop.cancel();
}

/// A free port inside 20000-29999, found by binding.
async fn free_port_in_range() -> (u16, TcpListener) {
    for port in 20000u16..20500 {
        let port = port + (rand::random::<u16>() % 9000);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return (port, listener);
        }
    }
    panic!("no free port in range");
}

#[tokio::test]
async fn declared_service_explicit_port_out_of_range_and_in_use() {
    let echo = echo_target().await;
    let server = server("127.0.0.1:0", |b| {
        b.allow_ports("20000-29999".parse::<PortRange>().unwrap())
    })
    .await;
    // Explicit port, free.
    let (port, holder) = free_port_in_range().await;
    drop(holder);
    let mut ok = client(server.addr, |b| {
        b.declared_service(
            "app",
            HostPort::from(echo),
            format!("127.0.0.1:{port}").parse().unwrap(),
        )
    });
    let status = ok.connected().await;
    assert_eq!(status.bound["app"].port(), port);
    let payload = random_bytes(100_000);
    let reply = round_trip(status.bound["app"], &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));

    // The same port again: in use.
    let taken = client(server.addr, |b| {
        b.declared_service(
            "app2",
            HostPort::from(echo),
            format!("127.0.0.1:{port}").parse().unwrap(),
        )
    });
    let result = tokio::time::timeout(Duration::from_secs(10), taken.task)
        .await
        .expect("ends")
        .expect("no panic");
    let Err(ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(
        reason.contains(&format!("port {port} is in use")),
        "{reason}"
    );

    // Outside the range.
    let outside = client(server.addr, |b| {
        b.declared_service(
            "app3",
            HostPort::from(echo),
            "127.0.0.1:80".parse().unwrap(),
        )
    });
    let result = tokio::time::timeout(Duration::from_secs(10), outside.task)
        .await
        .expect("ends")
        .expect("no panic");
    let Err(ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(
        reason.contains("port 80 is outside the server's allow_ports 20000-29999"),
        "{reason}"
    );
    ok.stop.cancel();
    server.stop.cancel();
}

#[tokio::test]
async fn declared_services_refused_without_allow_ports_or_with_wrong_token() {
    let echo = echo_target().await;
    let server = server("127.0.0.1:0", |b| b).await;
    let c = client(server.addr, |b| {
        b.declared_service("app", HostPort::from(echo), "0.0.0.0:0".parse().unwrap())
    });
    let result = c.task.await.expect("no panic");
    let Err(ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(reason.contains("allow_ports"), "{reason}");

    let server2 = server_with_range().await;
    let c = client(server2.addr, |b| {
        b.default_token("a-different-token-0123456789")
            .declared_service("app", HostPort::from(echo), "0.0.0.0:0".parse().unwrap())
    });
    let result = c.task.await.expect("no panic");
    let Err(ClientError::AllServicesRefused(reason)) = result else {
        panic!("expected a refusal, got {result:?}");
    };
    assert!(
        !reason.contains("allow_ports"),
        "a wrong token learns nothing: {reason}"
    );
    server.stop.cancel();
    server2.stop.cancel();
}

async fn server_with_range() -> Running {
    server("127.0.0.1:0", |b| {
        b.allow_ports("20000-29999".parse::<PortRange>().unwrap())
    })
    .await
}

/// A target that parses a PROXY header line (v1) or block (v2), then echoes; it reports
/// the header it saw.
async fn proxy_header_target() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut first = [0u8; 12];
                reader.read_exact(&mut first).await.unwrap();
                let header = if first.starts_with(b"PROXY ") {
                    let mut rest = Vec::new();
                    reader.read_until(b'\n', &mut rest).await.unwrap();
                    [first.to_vec(), rest].concat()
                } else {
                    let mut fixed = [0u8; 4];
                    reader.read_exact(&mut fixed).await.unwrap();
                    let len = usize::from(u16::from_be_bytes([fixed[2], fixed[3]]));
                    let mut body = vec![0u8; len];
                    reader.read_exact(&mut body).await.unwrap();
                    [first.to_vec(), fixed.to_vec(), body].concat()
                };
                let _ = tx.send(header);
                // Bytes read past the header belong to the payload.
                let buffered = reader.buffer().to_vec();
                let mut stream = reader.into_inner();
                stream.write_all(&buffered).await.unwrap();
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn proxy_protocol_headers_carry_the_visitor_address() {
    for version in [ProxyProtocol::V1, ProxyProtocol::V2] {
        let (target, mut headers) = proxy_header_target().await;
        let server = server_with_range().await;
        let mut c = client(server.addr, |b| {
            b.declared_service("pp", HostPort::from(target), "0.0.0.0:0".parse().unwrap())
                .proxy_protocol("pp", version)
        });
        let bound = c.connected().await.bound["pp"];
        // The visitor comes from 127.0.0.2, so its address differs from everything else.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut visitor = socket.connect(bound).await.unwrap();
        let visitor_addr = visitor.local_addr().unwrap();
        let payload = random_bytes(70_000);
        visitor.write_all(&payload).await.unwrap();
        visitor.shutdown().await.unwrap();
        let mut reply = Vec::new();
        visitor.read_to_end(&mut reply).await.unwrap();
        assert_eq!(
            hash(&reply),
            hash(&payload),
            "bytes after the header are intact"
        );
        let header = headers.recv().await.unwrap();
        let expected = warren_proto_header(version, visitor_addr, bound);
        assert_eq!(header, expected, "{version:?}");
        c.stop.cancel();
        server.stop.cancel();
    }
}

#[tokio::test]
async fn issue5_forward_proxy_protocol_carries_the_visitor_at_the_client_bind() {
    for version in [ProxyProtocol::V1, ProxyProtocol::V2] {
        let (target, mut headers) = proxy_header_target().await;
        let server = server("127.0.0.1:0", |b| {
            b.forward_service("pp", HostPort::from(target))
                .forward_proxy_protocol("pp", version)
        })
        .await;
        let mut c = client(server.addr, |b| {
            b.forward_service("pp", "127.0.0.1:0".parse().unwrap())
        });
        let local = c.connected().await.forwards["pp"];
        for _ in 0..2 {
            // The visitor comes from 127.0.0.2: the header must name it, not the tunnel.
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let mut visitor = socket.connect(local).await.unwrap();
            let visitor_addr = visitor.local_addr().unwrap();
            let payload = random_bytes(200_001);
            visitor.write_all(&payload).await.unwrap();
            visitor.shutdown().await.unwrap();
            let mut reply = Vec::new();
            visitor.read_to_end(&mut reply).await.unwrap();
            assert_eq!(hash(&reply), hash(&payload), "bytes after the header");
            let header = headers.recv().await.unwrap();
            assert_eq!(
                header,
                warren_proto_header(version, visitor_addr, local),
                "{version:?}"
            );
        }
        c.stop.cancel();
        server.stop.cancel();
    }
}

fn warren_proto_header(version: ProxyProtocol, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    match version {
        ProxyProtocol::V1 => format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            src.ip(),
            dst.ip(),
            src.port(),
            dst.port()
        )
        .into_bytes(),
        ProxyProtocol::V2 => {
            let mut out = vec![
                0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A, 0x21, 0x11,
                0, 12,
            ];
            let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
                panic!("IPv4 expected");
            };
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
            out.extend_from_slice(&src.port().to_be_bytes());
            out.extend_from_slice(&dst.port().to_be_bytes());
            out
        }
    }
}

#[tokio::test]
async fn forward_bind_in_use_is_a_clear_error() {
    let holder = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken = holder.local_addr().unwrap();
    let server = server("127.0.0.1:0", |b| {
        b.forward_service("db", "127.0.0.1:9".parse().unwrap())
    })
    .await;
    let c = client(server.addr, |b| b.forward_service("db", taken));
    let result = c.task.await.expect("no panic");
    let Err(error) = result else {
        panic!("expected a bind error")
    };
    assert!(matches!(error, ClientError::Bind { .. }), "{error}");
    assert!(error.to_string().contains(&taken.to_string()), "{error}");
    server.stop.cancel();
}

/// Issue 14: forward and client-declared services over QUIC (the client opens the forward
/// streams on the connection; the declared port is bound for the QUIC session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_and_declared_services_over_quic() {
    use warren::config::Transport;
    let (target, mut results) = sink_then_reply_target(300_000).await;
    let quic = |b: warren::ServerBuilder| b.transport(Transport::Quic).quic(quic_config());
    let server = server("127.0.0.1:0", |b| {
        quic(b)
            .forward_service("db", HostPort::from(target))
            .allow_ports("20000-29999".parse::<PortRange>().unwrap())
    })
    .await;
    let mut client = client(server.addr, |b| {
        b.transport(Transport::Quic)
            .quic(quic_config())
            .forward_service("db", "127.0.0.1:0".parse().unwrap())
            .declared_service("app", HostPort::from(target), "0.0.0.0:0".parse().unwrap())
    });
    let status = client.connected().await;
    let local = status.forwards["db"];
    let bound = status.bound["app"];
    for _ in 0..2 {
        check_bytes(local, &mut results).await;
        check_bytes(bound, &mut results).await;
    }
    client.stop.cancel();
    server.stop.cancel();
}
