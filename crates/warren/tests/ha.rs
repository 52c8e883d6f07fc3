//! High availability, in process on 127.0.0.1: a service served by several clients
//! (balancing, retry before reset, health checks), one client with several servers, and
//! diagnostics (`warren doctor`, `warren ping`) that never take a live client's services.
//! Every visitor checks the bytes it gets back.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use warren::config::ha::{HealthCheck, HealthProbe};
use warren::{BoundServer, Client, ClientStatus, HostPort, Server};
use warren_proto::balance::Strategy;

/// A target that answers every connection with its one-byte `id`, then echoes.
async fn tagged_echo(id: u8) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve_tagged(listener, id, CancellationToken::new()));
    addr
}

async fn serve_tagged(listener: TcpListener, id: u8, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            return;
        };
        tokio::spawn(async move {
            if stream.write_all(&[id]).await.is_err() {
                return;
            }
            let (mut r, mut w) = stream.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }
}

/// One visitor: sends a random payload, half-closes, and checks the echo. Returns the id
/// of the target that answered.
async fn visit(service: SocketAddr) -> Result<u8, String> {
    let payload = random_bytes(1024 + rand::random::<u16>() as usize % 4096);
    let reply = tokio::time::timeout(Duration::from_secs(20), round_trip(service, &payload))
        .await
        .map_err(|_| "no answer within 20 s".to_owned())?
        .map_err(|e| e.to_string())?;
    match reply.split_first() {
        Some((id, echoed)) if hash(echoed) == hash(&payload) => Ok(*id),
        Some((_, echoed)) => Err(format!(
            "wrong bytes: {} back for {} sent",
            echoed.len(),
            payload.len()
        )),
        None => Err("closed without a byte".to_owned()),
    }
}

/// `n` sequential visitors; the count per target id, or the first failure.
async fn visit_many(service: SocketAddr, n: usize) -> HashMap<u8, usize> {
    let mut counts = HashMap::new();
    for i in 0..n {
        let id = visit(service)
            .await
            .unwrap_or_else(|e| panic!("visitor {i} failed: {e}"));
        *counts.entry(id).or_default() += 1;
    }
    counts
}

async fn server(strategy: Strategy, admin: bool) -> BoundServer {
    let mut builder = Server::builder()
        .bind("127.0.0.1:0".parse().expect("addr"))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_interval(Duration::from_secs(1))
        .tcp_service("web", "127.0.0.1:0".parse().expect("addr"))
        .load_balance("web", strategy);
    if admin {
        builder = builder.admin("127.0.0.1:0".parse().expect("addr"), None);
    }
    builder
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("server binds")
}

struct Running {
    status: tokio::sync::watch::Receiver<ClientStatus>,
    stop: CancellationToken,
}

impl Running {
    async fn wait_for(&mut self, what: &str, ok: impl FnMut(&ClientStatus) -> bool) {
        tokio::time::timeout(Duration::from_secs(15), self.status.wait_for(ok))
            .await
            .unwrap_or_else(|_| panic!("client: {what} within 15 s"))
            .expect("client alive");
    }
}

fn run(client: Client) -> Running {
    let status = client.status();
    let stop = CancellationToken::new();
    tokio::spawn(client.run(stop.clone()));
    Running { status, stop }
}

fn client(server: SocketAddr, target: SocketAddr) -> warren::ClientBuilder {
    Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .heartbeat_timeout(Duration::from_secs(3))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(400))
        .tcp_service("web", HostPort::from(target))
}

/// The sessions serving `web`, as the server's admin API lists them: (ready, picked).
async fn serving(admin: SocketAddr) -> Vec<(bool, u64)> {
    let (status, body) = http(admin, "GET", "/api/v1/services", None).await;
    assert_eq!(status, 200, "{body}");
    let services: serde_json::Value = serde_json::from_str(&body).expect("json");
    let web = services
        .as_array()
        .and_then(|list| list.iter().find(|s| s["name"] == "web"))
        .expect("web listed")
        .clone();
    web["sessions"]
        .as_array()
        .expect("sessions listed")
        .iter()
        .map(|s| {
            (
                s["ready"].as_bool().expect("ready"),
                s["picked"].as_u64().expect("picked"),
            )
        })
        .collect()
}

async fn wait_serving(admin: SocketAddr, what: &str, ok: impl Fn(&[(bool, u64)]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = serving(admin).await;
        if ok(&now) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server: {what} within 15 s; sessions now {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Visitors that keep connecting until stopped; counts successes and failures.
struct SteadyVisitors {
    ok: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

fn steady_visitors(service: SocketAddr) -> SteadyVisitors {
    let ok = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok2, stop2) = (Arc::clone(&ok), Arc::clone(&stop));
    let task = tokio::spawn(async move {
        let mut errors = Vec::new();
        // Bounded: at most 20,000 visitors even if nobody stops it.
        for _ in 0..20_000 {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            match visit(service).await {
                Ok(_) => {
                    ok2.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => errors.push(error),
            }
        }
        errors
    });
    SteadyVisitors { ok, stop, task }
}

impl SteadyVisitors {
    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self.task.await.expect("visitors");
        (self.ok.load(Ordering::Relaxed), errors)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_ping_and_a_second_client_never_take_a_live_clients_service() {
    let bound = server(Strategy::default(), false).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    let target = tagged_echo(1).await;
    let mut first = run(client(addr, target).build().expect("client"));
    first.wait_for("connected", |s| s.connected).await;

    let visitors = steady_visitors(service);
    // warren doctor, as a user runs it on the running client's own config file.
    let path = std::env::temp_dir().join(format!("warren-ha-doctor-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        format!(
            "[client]\nserver = \"{addr}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n[client.services.web]\ntarget = \"{target}\"\n"
        ),
    )
    .expect("write config");
    for _ in 0..3 {
        let report = warren::doctor::diagnose(&path).await;
        let text = format!("{report:?}");
        assert!(!report.failed(), "doctor failed on a healthy setup: {text}");
        assert!(text.contains("accepted by the server"), "{text}");
    }
    let ping = warren::ping::PingTarget {
        server: HostPort::from(addr),
        psk: warren::crypto::secret::Secret::new(PSK),
        ciphers: warren::config::ClientConfig::new(HostPort::from(addr), Default::default())
            .ciphers,
        cipher_choice: Default::default(),
        deadline: Duration::from_secs(5),
        quic: None,
    };
    for seq in 1..=3 {
        warren::ping::probe(&ping, seq).await.expect("ping");
    }
    let (ok, errors) = visitors.finish().await;
    assert!(ok > 20, "only {ok} visitors got through");
    assert!(
        errors.is_empty(),
        "{} of {} visitors failed while doctor and ping ran: {:?}",
        errors.len(),
        ok as usize + errors.len(),
        &errors[..errors.len().min(5)]
    );

    // A second client with the same service joins it, then leaves: the first keeps serving.
    // The one visitor that may be in flight on the second client when it stops is reset
    // (a stopping client cuts its streams); no visitor sees short data, and none after.
    let visitors = steady_visitors(service);
    let second_target = tagged_echo(2).await;
    let mut second = run(client(addr, second_target).build().expect("client"));
    second.wait_for("connected", |s| s.connected).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.stop.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, errors) = visitors.finish().await;
    assert!(ok > 20, "only {ok} visitors got through");
    assert!(
        errors.len() <= 1 && errors.iter().all(|e| e.contains("reset")),
        "visitors failed while a second client joined and left: {errors:?}"
    );
    let _ = std::fs::remove_file(&path);
    // And the first client still serves it alone.
    let counts = visit_many(service, 20).await;
    assert_eq!(counts.get(&1), Some(&20), "{counts:?}");
    first.stop.cancel();
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_and_round_robin_spread_visitors_evenly() {
    for strategy in [Strategy::LeastConnections, Strategy::RoundRobin] {
        let bound = server(strategy, false).await;
        let addr = bound.local_addr();
        let service = bound.service_addr("web").expect("web");
        let stop_server = bound.shutdown_token();
        tokio::spawn(bound.run());
        let mut a = run(client(addr, tagged_echo(1).await).build().expect("a"));
        let mut b = run(client(addr, tagged_echo(2).await).build().expect("b"));
        a.wait_for("connected", |s| s.connected).await;
        b.wait_for("connected", |s| s.connected).await;
        let counts = visit_many(service, 1000).await;
        let (one, two) = (counts.get(&1).copied(), counts.get(&2).copied());
        for share in [one, two] {
            let share = share.unwrap_or(0);
            assert!(
                (450..=550).contains(&share),
                "{strategy:?}: 1000 visitors spread {counts:?}, not within 10 % of even"
            );
        }
        a.stop.cancel();
        b.stop.cancel();
        stop_server.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_set_each_clients_share() {
    let bound = server(Strategy::RoundRobin, false).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    let mut heavy = run(client(addr, tagged_echo(1).await)
        .weight("web", 3)
        .build()
        .expect("heavy"));
    let mut light = run(client(addr, tagged_echo(2).await).build().expect("light"));
    heavy.wait_for("connected", |s| s.connected).await;
    light.wait_for("connected", |s| s.connected).await;
    let counts = visit_many(service, 400).await;
    assert_eq!(
        (counts.get(&1), counts.get(&2)),
        (Some(&300), Some(&100)),
        "weights 3:1"
    );
    heavy.stop.cancel();
    light.stop.cancel();
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_target_is_down_hands_every_visitor_on() {
    let bound = server(Strategy::RoundRobin, false).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let telemetry = bound.telemetry();
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    // A port nobody listens on: the client's dial fails and it refuses the stream.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    let mut broken = run(client(addr, closed).build().expect("broken"));
    let mut healthy = run(client(addr, tagged_echo(2).await).build().expect("healthy"));
    broken.wait_for("connected", |s| s.connected).await;
    healthy.wait_for("connected", |s| s.connected).await;
    // Every visitor succeeds: half of them are first picked on the broken client, which
    // refuses before any byte went back, and replayed on the healthy one.
    let counts = visit_many(service, 100).await;
    assert_eq!(counts.get(&2), Some(&100), "{counts:?}");
    let metrics = telemetry.metrics.encode();
    let retries = metrics
        .lines()
        .find(|l| l.starts_with("warren_service_retries_total{service=\"web\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        (40..=60).contains(&retries),
        "round-robin over two clients: about half the visitors retried, got {retries}"
    );
    // With the healthy client gone, a visitor has nowhere left: reset, not a silent close.
    healthy.stop.cancel();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let error = visit(service).await.expect_err("no session can serve it");
    assert!(!error.contains("wrong bytes"), "{error}");
    broken.stop.cancel();
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_check_withdraws_the_client_and_recovery_offers_it_again() {
    let bound = server(Strategy::RoundRobin, true).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let admin = bound.admin_addr().expect("admin");
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    // Client 1's target: a listener we stop and start again on the same port.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let target = listener.local_addr().expect("addr");
    let target_stop = CancellationToken::new();
    tokio::spawn(serve_tagged(listener, 1, target_stop.clone()));
    let check = HealthCheck {
        probe: HealthProbe::Tcp,
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        failures: 2,
    };
    let mut checked = run(client(addr, target)
        .health_check("web", check)
        .admin("127.0.0.1:0".parse().expect("addr"), None)
        .build()
        .expect("checked"));
    let mut other = run(client(addr, tagged_echo(2).await).build().expect("other"));
    checked.wait_for("connected", |s| s.connected).await;
    other.wait_for("connected", |s| s.connected).await;
    wait_serving(admin, "two ready sessions", |s| {
        s.len() == 2 && s.iter().all(|(ready, _)| *ready)
    })
    .await;

    // The target goes down: after two failed checks the client withdraws the service.
    target_stop.cancel();
    wait_serving(admin, "one session withdrawn", |s| {
        s.iter().filter(|(ready, _)| !ready).count() == 1
    })
    .await;
    let counts = visit_many(service, 100).await;
    assert_eq!(
        counts.get(&2),
        Some(&100),
        "a withdrawn client got visitors: {counts:?}"
    );

    // It comes back on the same port: the client offers the service again.
    let listener = TcpListener::bind(target).await.expect("rebind the target");
    tokio::spawn(serve_tagged(listener, 1, CancellationToken::new()));
    wait_serving(admin, "both sessions ready again", |s| {
        s.len() == 2 && s.iter().all(|(ready, _)| *ready)
    })
    .await;
    let counts = visit_many(service, 100).await;
    assert_eq!(
        (counts.get(&1), counts.get(&2)),
        (Some(&50), Some(&50)),
        "after recovery round-robin alternates"
    );
    checked.stop.cancel();
    other.stop.cancel();
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_serves_through_every_server_and_survives_losing_one() {
    let first = server(Strategy::default(), false).await;
    let second = server(Strategy::default(), false).await;
    let (addr1, addr2) = (first.local_addr(), second.local_addr());
    let (service1, service2) = (
        first.service_addr("web").expect("web"),
        second.service_addr("web").expect("web"),
    );
    let (stop1, stop2) = (first.shutdown_token(), second.shutdown_token());
    let task1 = tokio::spawn(first.run());
    tokio::spawn(second.run());
    let mut client = run(client(addr1, tagged_echo(7).await)
        .also_server(HostPort::from(addr2))
        .build()
        .expect("client"));
    client
        .wait_for("sessions with both servers", |s| s.servers.len() == 2)
        .await;
    assert_eq!(visit_many(service1, 20).await.get(&7), Some(&20));
    assert_eq!(visit_many(service2, 20).await.get(&7), Some(&20));

    // Server 1 goes away: the session with server 2 carries on untouched.
    let visitors = steady_visitors(service2);
    stop1.cancel();
    let _ = task1.await;
    client
        .wait_for("only server 2 left", |s| {
            s.servers == [addr2.to_string()] && s.connected
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, errors) = visitors.finish().await;
    assert!(ok > 5, "only {ok} visitors got through");
    assert!(
        errors.is_empty(),
        "losing server 1 failed visitors of server 2: {errors:?}"
    );
    client.stop.cancel();
    stop2.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_visitor_on_a_killed_client_is_reset_not_truncated() {
    let bound = server(Strategy::default(), false).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    let mut only = run(client(addr, tagged_echo(1).await).build().expect("client"));
    only.wait_for("connected", |s| s.connected).await;
    let mut visitor = TcpStream::connect(service).await.expect("connect");
    let mut id = [0u8; 1];
    visitor.read_exact(&mut id).await.expect("tag");
    // The client goes away mid-stream (its process would be killed): the visitor sees a
    // reset or an error, never a clean end of stream.
    only.stop.cancel();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), visitor.read_to_end(&mut rest)).await;
    match read {
        Ok(Ok(_)) => panic!("a cut stream looked complete ({} bytes)", rest.len()),
        Ok(Err(_)) => {}
        Err(_) => panic!("the cut stream was neither reset nor closed within 10 s"),
    }
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_only_changes_load_balance_keeps_every_session() {
    let free = || SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (control, web) = (free(), free());
    let toml = |strategy: &str| {
        format!(
            "[server]\nbind = \"{control}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n[server.services.web]\nbind = \"{web}\"\nload_balance = \"{strategy}\"\n"
        )
    };
    let config = |strategy: &str| match warren::Config::from_toml_str(&toml(strategy), "test")
        .expect("valid server config")
    {
        warren::Config::Server(config) => config,
        warren::Config::Client(_) => unreachable!("a server config"),
    };
    let bound = Server::from_config(config("least-connections"))
        .expect("server")
        .bind()
        .await
        .expect("binds");
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let reloader = bound.reloader();
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    let mut a = run(client(addr, tagged_echo(1).await).build().expect("a"));
    let mut b = run(client(addr, tagged_echo(2).await).build().expect("b"));
    a.wait_for("connected", |s| s.connected).await;
    b.wait_for("connected", |s| s.connected).await;
    let summary = reloader
        .apply(config("random"))
        .await
        .expect("reload applies")
        .to_string();
    assert!(
        summary.contains("now spreads its visitors by random"),
        "{summary}"
    );
    assert!(!summary.contains("reconnect"), "{summary}");
    let counts = visit_many(service, 200).await;
    assert!(
        counts.contains_key(&1) && counts.contains_key(&2),
        "random over two clients: {counts:?}"
    );
    for client in [&a, &b] {
        assert_eq!(client.status.borrow().sessions, 1, "a session was replaced");
    }
    a.stop.cancel();
    b.stop.cancel();
    stop_server.cancel();
}

/// A UDP target that answers every datagram with its one-byte `id` and the datagram.
async fn tagged_udp_echo(id: u8) -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf[1..]).await else {
                return;
            };
            buf[0] = id;
            let _ = socket.send_to(&buf[..n + 1], from).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_spread_over_clients_and_each_stays_on_its_own() {
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().expect("addr"))
        .psk(PSK)
        .default_token(TOKEN)
        .udp_service("dns", "127.0.0.1:0".parse().expect("addr"))
        .load_balance("dns", Strategy::RoundRobin)
        .build()
        .expect("server")
        .bind()
        .await
        .expect("binds");
    let addr = bound.local_addr();
    let service = bound.service_addr("dns").expect("dns");
    let stop_server = bound.shutdown_token();
    tokio::spawn(bound.run());
    let udp_client = |target: SocketAddr| {
        Client::builder(HostPort::from(addr))
            .psk(PSK)
            .default_token(TOKEN)
            .udp_service("dns", HostPort::from(target))
            .build()
            .expect("client")
    };
    let mut a = run(udp_client(tagged_udp_echo(1).await));
    let mut b = run(udp_client(tagged_udp_echo(2).await));
    a.wait_for("connected", |s| s.connected).await;
    b.wait_for("connected", |s| s.connected).await;
    // 20 flows (visitor sockets), 10 datagrams each: every reply of a flow comes from the
    // same client, and the flows are spread over both.
    let mut per_client = HashMap::new();
    for flow in 0..20u8 {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        socket.connect(service).await.expect("connect");
        let mut ids = Vec::new();
        for n in 0..10u8 {
            let payload = [flow, n, 0xAB];
            let mut reply = [0u8; 16];
            // UDP may drop: a few tries per datagram.
            let mut got = None;
            for _ in 0..5 {
                socket.send(&payload).await.expect("send");
                if let Ok(Ok(len)) =
                    tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut reply)).await
                {
                    got = Some(len);
                    break;
                }
            }
            let len = got.unwrap_or_else(|| panic!("flow {flow}: no reply to datagram {n}"));
            assert_eq!(&reply[1..len], &payload, "flow {flow}: wrong bytes");
            ids.push(reply[0]);
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "flow {flow} moved between clients: {ids:?}");
        *per_client.entry(ids[0]).or_insert(0) += 1;
    }
    assert_eq!(
        (per_client.get(&1), per_client.get(&2)),
        (Some(&10), Some(&10)),
        "round-robin over two clients"
    );
    a.stop.cancel();
    b.stop.cancel();
    stop_server.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_closes_its_port_finishes_the_stream_in_flight_and_stops() {
    let bound = server(Strategy::default(), true).await;
    let addr = bound.local_addr();
    let service = bound.service_addr("web").expect("web");
    let admin = bound.admin_addr().expect("admin");
    let running = tokio::spawn(bound.run());
    // Ready only once a client serves the service.
    let (status, body) = http(admin, "GET", "/readyz", None).await;
    assert_eq!(
        (status, body.as_str()),
        (
            503,
            "not ready: 1 of 1 services have no client ready to serve them\n"
        )
    );
    let mut client = run(client(addr, tagged_echo(4).await).build().expect("client"));
    client.wait_for("connected", |s| s.connected).await;
    let (status, body) = http(admin, "GET", "/readyz", None).await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    // A visitor in flight when the drain begins.
    let mut visitor = TcpStream::connect(service).await.expect("connect");
    let mut id = [0u8; 1];
    visitor.read_exact(&mut id).await.expect("tag");
    assert_eq!(id, [4]);
    let first = random_bytes(4096);
    visitor.write_all(&first).await.expect("send");
    let mut echoed = vec![0u8; first.len()];
    visitor.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(echoed, first);

    let (status, body) = http(admin, "POST", "/api/v1/drain", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(admin, "GET", "/readyz", None).await;
    assert_eq!((status, body.as_str()), (503, "not ready: draining\n"));
    let (_, body) = http(admin, "GET", "/api/v1/status", None).await;
    let status: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(status["draining"], true, "{body}");
    // The service port closes: a load balancer's next connection is refused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(service).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the service port still takes connections 10 s into the drain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stream in flight goes on, byte for byte, and the server waits for it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !running.is_finished(),
        "the server stopped with a stream open"
    );
    let second = random_bytes(64 * 1024);
    visitor
        .write_all(&second)
        .await
        .expect("send during the drain");
    visitor.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), visitor.read_to_end(&mut rest))
        .await
        .expect("the echo within 10 s")
        .expect("a clean end");
    assert_eq!(hash(&rest), hash(&second), "{} bytes back", rest.len());
    // With the last stream done, the server stops by itself.
    tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the drained server stopped within 15 s")
        .expect("server task");
    client.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_streams_go_around_a_draining_server() {
    // Two servers whose forward service `db` reaches a target tagged with their number.
    let mut servers = Vec::new();
    for tag in [1u8, 2] {
        let bound = Server::builder()
            .bind("127.0.0.1:0".parse().expect("addr"))
            .psk(PSK)
            .default_token(TOKEN)
            .heartbeat_interval(Duration::from_secs(1))
            .forward_service("db", HostPort::from(tagged_echo(tag).await))
            .build()
            .expect("valid server")
            .bind()
            .await
            .expect("server binds");
        servers.push((
            bound.local_addr(),
            bound.drain_token(),
            bound.shutdown_token(),
        ));
        tokio::spawn(bound.run());
    }
    let mut client = run(Client::builder(HostPort::from(servers[0].0))
        .psk(PSK)
        .default_token(TOKEN)
        .also_server(HostPort::from(servers[1].0))
        .forward_service("db", "127.0.0.1:0".parse().expect("addr"))
        .build()
        .expect("client"));
    client
        .wait_for("sessions with both servers", |s| s.servers.len() == 2)
        .await;
    let local = client.status.borrow().forwards["db"];
    // The server the client prefers (the nearer one) carries a stream that stays open, so
    // that its drain lasts; then it drains.
    let mut held = TcpStream::connect(local).await.expect("connect");
    let mut tag = [0u8; 1];
    held.read_exact(&mut tag).await.expect("tag");
    let (preferred, other) = (tag[0], 3 - tag[0]);
    servers[usize::from(preferred - 1)].1.cancel();
    // Told within a round trip (however slow the machine: wait for the first stream that
    // goes around it); from then on every new forward stream goes to the other.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while visit(local).await != Ok(other) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "forward streams still go through the draining server {preferred} after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..20 {
        let id = visit(local)
            .await
            .unwrap_or_else(|e| panic!("forward visitor {i} failed: {e}"));
        assert_eq!(
            id, other,
            "forward visitor {i} went through the draining server {preferred}"
        );
    }
    // The held stream still works, through the draining server.
    held.write_all(b"ping").await.expect("send");
    let mut echo = [0u8; 4];
    held.read_exact(&mut echo)
        .await
        .expect("echo while draining");
    assert_eq!(&echo, b"ping");
    drop(held);
    client.stop.cancel();
    for (_, _, stop) in servers {
        stop.cancel();
    }
}
