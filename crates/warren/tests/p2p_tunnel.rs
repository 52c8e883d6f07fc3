//! Peer-to-peer tunnels (issue 18, `p2p::tunnel`), in process against a real server with
//! `[server.p2p]`: TCP streams and UDP flows through the direct path and through the
//! relay, bytes checked by hash; an entrance that keeps its port and joins again when the
//! connection drops; a named service (`[server.p2p.services]`) reached by name and token;
//! a code used with the wrong pair of commands.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio_util::sync::CancellationToken;
use warren::Server;
use warren::config::{HostPort, UdpSettings};
use warren::crypto::secret::Secret;
use warren::p2p::code::Code;
use warren::p2p::mailbox::MailboxError;
use warren::p2p::mailbox::MailboxServer;
use warren::p2p::session::{self, Meeting, Offering, Options, Purpose, Route, SessionError};
use warren::p2p::tunnel::{Entrance, Event, Exit, Kind, Reporter, TunnelStats};

/// The named service of [`server`]'s config, and its token.
const SERVICE: &str = "ssh";
const SERVICE_TOKEN: &str = "p2p-service-token-0123456789";

async fn server() -> (MailboxServer, StopOnDrop) {
    let config = p2p_server_config(&format!(
        "[server.p2p.services.{SERVICE}]\ntoken = \"{SERVICE_TOKEN}\"\n"
    ));
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
    meeting: Meeting,
    stop: CancellationToken,
    drop_peers: Arc<tokio::sync::Notify>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Listens with a fresh code (`service` `None`) or as the named service.
async fn listen(
    options: Options,
    kind: Kind,
    target: SocketAddr,
    service: Option<&str>,
) -> Listener {
    let (mut offering, meeting) = match service {
        Some(name) => {
            let token = Secret::new(SERVICE_TOKEN);
            let meeting = Meeting::Service {
                name: name.to_owned(),
                token: token.clone(),
            };
            let offering = Offering::open_service(options, name, token)
                .await
                .expect("offered");
            (offering, meeting)
        }
        None => {
            let offering = Offering::open(options).await.expect("a code");
            let code = Code::parse(&offering.code().unwrap().reveal()).unwrap();
            (offering, Meeting::Code(code))
        }
    };
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
        meeting,
        stop,
        drop_peers,
    }
}

/// A reporter that hears nothing.
fn quiet() -> &'static Reporter {
    static QUIET: std::sync::LazyLock<Reporter> = std::sync::LazyLock::new(|| Arc::new(|_| {}));
    &QUIET
}

/// Joins `meeting`, reads the kind, binds an entrance on a free loopback port.
async fn connect(meeting: &Meeting, options: &Options) -> (Entrance, session::Connected) {
    let connected = session::join_meeting(meeting, options)
        .await
        .expect("joined");
    let kind = Entrance::hello(&connected.connection).await.expect("hello");
    let entrance = Entrance::bind(
        kind,
        "127.0.0.1:0".parse().unwrap(),
        UdpSettings::DEFAULT,
        Arc::default(),
    )
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
        let listener = listen(options.clone(), Kind::Tcp, echo, None).await;
        let (entrance, connected) = connect(&listener.meeting, &options).await;
        assert_eq!(entrance.kind(), Kind::Tcp);
        match (relay_only, connected.route) {
            (false, Route::Direct(_)) | (true, Route::Relayed(_)) => {}
            (_, route) => panic!("relay_only = {relay_only}: {route:?}"),
        }
        let local = entrance.local_addr();
        let stop = CancellationToken::new();
        let keeping = {
            let (meeting, options, stop) =
                (listener.meeting.clone(), options.clone(), stop.clone());
            async move {
                entrance
                    .keep_joined(
                        Some(connected),
                        &meeting,
                        std::slice::from_ref(&options),
                        &stop,
                        quiet(),
                    )
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
        assert_eq!(stats.streams.get(), 16);
        assert_eq!(stats.failed.get(), 0);
        entrance.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_go_through_the_direct_path_and_the_relay() {
    let (server, _stop) = server().await;
    let echo = udp_echo_target().await;
    for relay_only in [false, true] {
        let options = tunnel_options(&server, relay_only);
        let listener = listen(options.clone(), Kind::Udp, echo, None).await;
        let (entrance, connected) = connect(&listener.meeting, &options).await;
        assert_eq!(entrance.kind(), Kind::Udp);
        let local = entrance.local_addr();
        let stop = CancellationToken::new();
        let checking = async {
            check_udp_echoes(local, 20).await;
            stop.cancel();
        };
        let keeping = entrance.keep_joined(
            Some(connected),
            &listener.meeting,
            std::slice::from_ref(&options),
            &stop,
            quiet(),
        );
        let (kept, ()) = tokio::join!(keeping, checking);
        kept.expect("kept");
        entrance.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrance_keeps_its_port_and_joins_again_when_the_connection_drops() {
    for service in [None, Some(SERVICE)] {
        keeps_its_port(service).await;
    }
}

/// The reconnect check, with a code or by the named service.
async fn keeps_its_port(service: Option<&str>) {
    let (server, _stop) = server().await;
    let echo = echo_target().await;
    let options = tunnel_options(&server, false);
    let listener = listen(options.clone(), Kind::Tcp, echo, service).await;
    let (entrance, connected) = connect(&listener.meeting, &options).await;
    let local = entrance.local_addr();
    let stop = CancellationToken::new();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let report: Reporter = Arc::new(move |event| {
        let _ = events_tx.send(match event {
            Event::Connected(_) => "connected",
            Event::Disconnected { .. } => "disconnected",
            Event::Retrying { .. } => "retrying",
            Event::Offered(_) | Event::Notice(_) | Event::Moved { .. } => "other",
        });
    });
    let keeping = entrance.keep_joined(
        Some(connected),
        &listener.meeting,
        std::slice::from_ref(&options),
        &stop,
        &report,
    );
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
    let code = Code::parse(&offering.code().unwrap().reveal()).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_service_is_reached_by_its_name_with_its_token_only() {
    let (server, _stop) = server().await;
    let echo = echo_target().await;
    let options = tunnel_options(&server, false);
    let listener = listen(options.clone(), Kind::Tcp, echo, Some(SERVICE)).await;
    // A second listener for the same name is refused while the first is there.
    let second = Offering::open_service(options.clone(), SERVICE, Secret::new(SERVICE_TOKEN)).await;
    assert!(
        matches!(&second, Err(SessionError::Mailbox(MailboxError::Refused(reason))) if reason.contains("offered by another client")),
        "{second:?}"
    );
    // The wrong token, or a name the server does not have, gets nowhere.
    for (name, token, says) in [
        (SERVICE, "not-the-token-0123456789", "wrong token"),
        ("web", SERVICE_TOKEN, "no P2P service `web`"),
    ] {
        let meeting = Meeting::Service {
            name: name.to_owned(),
            token: Secret::new(token),
        };
        let error = session::join_meeting(&meeting, &options)
            .await
            .expect_err("refused");
        assert!(error.to_string().contains(says), "{error}");
    }
    // Two visitors at once, both through.
    let (a, a_connected) = connect(&listener.meeting, &options).await;
    let (b, b_connected) = connect(&listener.meeting, &options).await;
    let stop = CancellationToken::new();
    let checking = async {
        tokio::join!(
            check_tcp_echoes(a.local_addr(), 4, 128 * 1024),
            check_tcp_echoes(b.local_addr(), 4, 128 * 1024)
        );
        stop.cancel();
    };
    let (kept_a, kept_b, ()) = tokio::join!(
        a.keep_joined(
            Some(a_connected),
            &listener.meeting,
            std::slice::from_ref(&options),
            &stop,
            quiet()
        ),
        b.keep_joined(
            Some(b_connected),
            &listener.meeting,
            std::slice::from_ref(&options),
            &stop,
            quiet()
        ),
        checking
    );
    kept_a.expect("kept");
    kept_b.expect("kept");
    a.close().await;
    b.close().await;
}
