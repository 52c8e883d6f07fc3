//! Peer-to-peer tunnels (issue 18, `p2p::tunnel`), in process against a real server with
//! `[server.p2p]`: TCP streams and UDP flows through the direct path and through the
//! relay, bytes checked by hash; an entrance that keeps its port and joins again when the
//! connection drops; a code used with the wrong pair of commands.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use warren::Server;
use warren::config::{HostPort, UdpSettings};
use warren::p2p::code::Code;
use warren::p2p::mailbox::MailboxServer;
use warren::p2p::session::{self, Offering, Options, Purpose, Route, SessionError};
use warren::p2p::tunnel::{Entrance, Exit, Kind, TunnelStats, Visit};

async fn server() -> (MailboxServer, StopOnDrop) {
    let config = p2p_server_config("");
    let bound = Server::from_config(config).unwrap().bind().await.unwrap();
    let stop = StopOnDrop(bound.shutdown_token());
    let target = mailbox_target(bound.local_addr());
    tokio::spawn(bound.run());
    (target, stop)
}

fn tunnel_options(server: &MailboxServer, relay_only: bool) -> Options {
    let mut options = Options::new(server.clone());
    options.purpose = Purpose::Tunnel;
    options.relay_only = relay_only;
    options
}

/// A listening side serving `kind` at `target` to every peer that joins its code, each
/// connection's serving cancelled by `drop_peers` (the listener itself goes on).
struct Listener {
    code: Code,
    stop: CancellationToken,
    drop_peers: Arc<tokio::sync::Notify>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn listen(options: Options, kind: Kind, target: SocketAddr) -> Listener {
    let mut offering = Offering::open(options).await.expect("a code");
    let code = Code::parse(&offering.code().reveal()).unwrap();
    let exit = Arc::new(Exit {
        kind,
        target: HostPort::from(target),
        udp: UdpSettings::DEFAULT,
    });
    let stop = CancellationToken::new();
    let drop_peers = Arc::new(tokio::sync::Notify::new());
    let (stop_task, drop_task) = (stop.clone(), Arc::clone(&drop_peers));
    tokio::spawn(async move {
        let stats = Arc::new(TunnelStats::default());
        loop {
            let connected = tokio::select! {
                () = stop_task.cancelled() => return,
                connected = offering.next_receiver() => connected,
            };
            let Ok(connected) = connected else { continue };
            let (exit, stats, stop, drop_peers) = (
                Arc::clone(&exit),
                Arc::clone(&stats),
                stop_task.child_token(),
                Arc::clone(&drop_task),
            );
            tokio::spawn(async move {
                let serving = exit.serve(&connected.connection, &stats, &stop);
                tokio::select! {
                    _ = serving => {}
                    () = drop_peers.notified() => {
                        connected.connection.close(7u32.into(), b"dropped by the test");
                    }
                }
                // Keep the endpoint until the close is out.
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), connected.endpoint.wait_idle())
                        .await;
            });
        }
    });
    Listener {
        code,
        stop,
        drop_peers,
    }
}

/// Joins `code`, reads the kind, binds an entrance on a free loopback port.
async fn connect(code: &Code, options: &Options) -> (Entrance, session::Connected) {
    let connected = session::join(code, options).await.expect("joined");
    let kind = Entrance::hello(&connected.connection).await.expect("hello");
    let entrance = Entrance::bind(kind, "127.0.0.1:0".parse().unwrap(), UdpSettings::DEFAULT)
        .await
        .expect("bound");
    (entrance, connected)
}

/// `count` TCP connections at once through `entrance`, each a random payload echoed back
/// and checked by hash.
async fn check_tcp_echoes(entrance: SocketAddr, count: usize, len: usize) {
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..count {
        runs.spawn(async move {
            let payload = random_bytes(len + i);
            let reply =
                tokio::time::timeout(Duration::from_secs(30), round_trip(entrance, &payload))
                    .await
                    .expect("in time")
                    .expect("round trip");
            assert_eq!(hash(&reply), hash(&payload), "connection {i}");
        });
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_go_through_the_direct_path_and_the_relay() {
    let (server, _stop) = server().await;
    let echo = echo_target().await;
    for relay_only in [false, true] {
        let options = tunnel_options(&server, relay_only);
        let listener = listen(options.clone(), Kind::Tcp, echo).await;
        let (entrance, connected) = connect(&listener.code, &options).await;
        assert_eq!(entrance.kind(), Kind::Tcp);
        match (relay_only, connected.route) {
            (false, Route::Direct(_)) | (true, Route::Relayed(_)) => {}
            (_, route) => panic!("relay_only = {relay_only}: {route:?}"),
        }
        let local = entrance.local_addr();
        let stop = CancellationToken::new();
        let keeping = {
            let (code, options, stop) = (listener.code.clone(), options.clone(), stop.clone());
            async move {
                entrance
                    .keep_joined(connected, &code, &options, &stop, |_| {})
                    .await
                    .expect("kept");
                entrance
            }
        };
        let checking = async {
            check_tcp_echoes(local, 16, 256 * 1024).await;
            stop.cancel();
        };
        let (entrance, ()) = tokio::join!(keeping, checking);
        let stats = entrance.stats();
        assert_eq!(stats.streams.load(std::sync::atomic::Ordering::Relaxed), 16);
        assert_eq!(stats.failed.load(std::sync::atomic::Ordering::Relaxed), 0);
        entrance.close().await;
    }
}

/// Sends `count` datagrams from each of two sockets to `entrance` and checks every echo
/// comes back to its own socket.
async fn check_udp_echoes(entrance: SocketAddr, count: usize) {
    let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
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

async fn udp_echo() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], peer).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_go_through_the_direct_path_and_the_relay() {
    let (server, _stop) = server().await;
    let echo = udp_echo().await;
    for relay_only in [false, true] {
        let options = tunnel_options(&server, relay_only);
        let listener = listen(options.clone(), Kind::Udp, echo).await;
        let (entrance, connected) = connect(&listener.code, &options).await;
        assert_eq!(entrance.kind(), Kind::Udp);
        let local = entrance.local_addr();
        let stop = CancellationToken::new();
        let checking = async {
            check_udp_echoes(local, 20).await;
            stop.cancel();
        };
        let keeping = entrance.keep_joined(connected, &listener.code, &options, &stop, |_| {});
        let (kept, ()) = tokio::join!(keeping, checking);
        kept.expect("kept");
        entrance.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrance_keeps_its_port_and_joins_again_when_the_connection_drops() {
    let (server, _stop) = server().await;
    let echo = echo_target().await;
    let options = tunnel_options(&server, false);
    let listener = listen(options.clone(), Kind::Tcp, echo).await;
    let (entrance, connected) = connect(&listener.code, &options).await;
    let local = entrance.local_addr();
    let stop = CancellationToken::new();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let keeping = entrance.keep_joined(connected, &listener.code, &options, &stop, |visit| {
        let _ = events_tx.send(match visit {
            Visit::Connected(_) => "connected",
            Visit::Disconnected { .. } => "disconnected",
            Visit::Retrying { .. } => "retrying",
        });
    });
    let checking = async {
        check_tcp_echoes(local, 2, 64 * 1024).await;
        listener.drop_peers.notify_waiters();
        let mut seen = Vec::new();
        while seen.last() != Some(&"connected") {
            let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
                .await
                .expect("the entrance joins again in time")
                .unwrap();
            seen.push(event);
        }
        assert_eq!(seen.first(), Some(&"disconnected"), "{seen:?}");
        // The same local port works over the new connection.
        check_tcp_echoes(local, 2, 64 * 1024).await;
        stop.cancel();
    };
    let (kept, ()) = tokio::join!(keeping, checking);
    kept.expect("kept");
    entrance.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_code_used_for_files_fails_on_both_sides_with_the_commands() {
    let (server, _stop) = server().await;
    let mut offering = Offering::open(tunnel_options(&server, false))
        .await
        .expect("a code");
    let code = Code::parse(&offering.code().reveal()).unwrap();
    let listening = tokio::spawn(async move { offering.next_receiver().await.map(|_| ()) });
    let joined = session::join(&code, &Options::new(server.clone())).await;
    let error = joined.expect_err("a file receiver must not connect to a tunnel");
    assert!(
        matches!(error, SessionError::WrongPurpose { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("warren p2p connect"), "{error}");
    let listened = tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(listened, Err(SessionError::WrongPurpose { .. })),
        "{listened:?}"
    );
}
