//! High availability end to end: the release binary behind HAProxy, as the README's
//! "High availability" section describes it. HAProxy (`mode tcp`, `option redispatch`,
//! `retries`, health checks) spreads visitors over **two servers**; **two clients** each
//! keep a session with both servers and serve one echo service. Visitors arrive at a steady
//! ~200 connections/s for 20 s, each checking its bytes, while one client and then one
//! server are SIGKILLed and both are started again.
//!
//! What must hold: every connection that starts after a kill succeeds (the servers hand
//! visitors on to the surviving client, HAProxy redispatches away from the dead server); a
//! connection in flight on a killed process ends in an error, never in a clean close with
//! short data (checked straight at the servers' ports, where only Warren decides; see the
//! assertion for what HAProxy itself does with a stream whose server side was reset); and after
//! the restarts the service is whole again with no operator action. The counts are
//! printed for the README.

mod e2e_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How one visitor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Every byte came back.
    Ok,
    /// An error (reset, refused) or a close before the first byte: the visitor knows it
    /// failed.
    Error,
    /// A clean end of stream after some bytes but before all: the one outcome never
    /// allowed, since it can pass for a complete answer.
    Truncated,
}

/// A free port outside the ephemeral range, so that no outgoing connection takes it
/// while its server is down between a kill and a restart.
fn stable_port() -> u16 {
    for _ in 0..1000 {
        let port = 20_000 + rand::random::<u16>() % 10_000;
        if std::net::TcpListener::bind(loopback(port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-29999");
}

/// One visitor: 8 KiB in four pieces 20 ms apart (so some are in flight at every moment),
/// half-close, read the echo.
async fn visit(addr: SocketAddr) -> Outcome {
    let payload = random_bytes(8 * 1024);
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        let (mut r, mut w) = stream.split();
        let send = async {
            for piece in payload.chunks(2048) {
                w.write_all(piece).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            w.shutdown().await
        };
        let mut reply = Vec::new();
        let recv = r.read_to_end(&mut reply);
        let (sent, received) = tokio::join!(send, recv);
        received?;
        sent?;
        std::io::Result::Ok(reply)
    };
    match tokio::time::timeout(Duration::from_secs(15), attempt).await {
        Ok(Ok(reply)) if reply == payload => Outcome::Ok,
        Ok(Ok(reply)) if reply.is_empty() => Outcome::Error,
        Ok(Ok(_)) => Outcome::Truncated,
        Ok(Err(_)) | Err(_) => Outcome::Error,
    }
}

/// Every visitor: when it started, when it ended and how.
type Log = Arc<Mutex<Vec<(Instant, Instant, Outcome)>>>;

/// `workers` visitors in a loop until `until`.
fn steady_load(
    addr: SocketAddr,
    workers: usize,
    until: Instant,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|_| {
            let log = Arc::clone(log);
            tokio::spawn(async move {
                while Instant::now() < until {
                    let started = Instant::now();
                    let outcome = visit(addr).await;
                    log.lock()
                        .expect("log")
                        .push((started, Instant::now(), outcome));
                    if outcome != Outcome::Ok {
                        // A dead server refuses at once: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect()
}

fn server_config(port: u16, web: u16) -> String {
    format!(
        r#"[server]
bind = "127.0.0.1:{port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
heartbeat_interval = "1s"

[server.services.echo]
bind = "127.0.0.1:{web}"
"#
    )
}

fn client_config(servers: [u16; 2], target: SocketAddr) -> String {
    format!(
        r#"[client]
servers = ["127.0.0.1:{}", "127.0.0.1:{}"]
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
heartbeat_timeout = "3s"
reconnect_initial_delay = "100ms"
reconnect_max_delay = "1s"

[client.services.echo]
target = "{target}"
"#,
        servers[0], servers[1]
    )
}

fn haproxy_config(front: u16, webs: [u16; 2]) -> String {
    format!(
        r#"global
    maxconn 4096
    log stdout format raw local0

defaults
    mode tcp
    log global
    option tcplog
    # A refused connect is retried after min(1 s, timeout connect): keep it short.
    timeout connect 200ms
    timeout client 20s
    timeout server 20s
    retries 3
    option redispatch 1

frontend visitors
    bind 127.0.0.1:{front}
    default_backend warren

backend warren
    balance roundrobin
    server s1 127.0.0.1:{} check inter 500ms fall 2 rise 2
    server s2 127.0.0.1:{} check inter 500ms fall 2 rise 2
"#,
        webs[0], webs[1]
    )
}

/// Counts of one slice of the run: (started, succeeded, errors, truncated).
fn tally(entries: &[(Instant, Instant, Outcome)]) -> (usize, usize, usize, usize) {
    let count = |o: Outcome| {
        entries
            .iter()
            .filter(|(_, _, outcome)| *outcome == o)
            .count()
    };
    (
        entries.len(),
        count(Outcome::Ok),
        count(Outcome::Error),
        count(Outcome::Truncated),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_two_clients_behind_haproxy_survive_sigkill_of_each() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") {
        return;
    }
    let dir = TestDir::new("e2e-ha");
    let target = echo_target().await;
    let (port1, port2) = (stable_port(), stable_port());
    let (web1, web2) = (stable_port(), stable_port());
    let front = stable_port();
    let server1_toml = dir.write("server1.toml", &server_config(port1, web1));
    let server2_toml = dir.write("server2.toml", &server_config(port2, web2));
    let client_toml = dir.write("client.toml", &client_config([port1, port2], target));
    let haproxy_cfg = dir.write("haproxy.cfg", &haproxy_config(front, [web1, web2]));

    let mut server1 = start_server(&dir, &server1_toml);
    let mut server2 = start_server(&dir, &server2_toml);
    wait_listening(port1, "server 1").await;
    wait_listening(port2, "server 2").await;
    let mut client_a = start_client(&dir, &client_toml, PSK);
    let mut client_b = start_client(&dir, &client_toml, PSK);
    let mut haproxy = Proc::spawn(
        &dir,
        "haproxy",
        "haproxy",
        &["-db", "-f", haproxy_cfg.to_str().expect("path")],
        &[],
    );
    wait_listening(front, "haproxy").await;
    // Both clients with both servers: each server logs two sessions.
    for server in [&mut server1, &mut server2] {
        let deadline = Instant::now() + READY_TIMEOUT;
        while server.logs().matches("client connected").count() < 2 {
            assert!(
                Instant::now() < deadline,
                "clients did not connect:\n{}",
                server.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for addr in [loopback(web1), loopback(web2), loopback(front)] {
        assert_eq!(visit(addr).await, Outcome::Ok, "{addr} before the run");
    }

    // 20 s of ~200 visitors/s (20 workers x ~100 ms each).
    let log: Log = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs(20);
    let mut workers = steady_load(loopback(front), 16, until, &log);
    // Visitors straight at the servers' ports too: what Warren itself does to a stream in
    // flight on a killed process, without HAProxy's own handling in between.
    let direct: Log = Arc::default();
    workers.extend(steady_load(loopback(web1), 2, until, &direct));
    workers.extend(steady_load(loopback(web2), 2, until, &direct));
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The moment a process is gone: `kill` returns once it is reaped.
    client_a.kill();
    let client_killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    server1.kill();
    let server_killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restarted = Instant::now();
    let mut client_a = start_client(&dir, &client_toml, PSK);
    let mut server1 = start_server(&dir, &server1_toml);
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let entries = log.lock().expect("log").clone();
    let direct = direct.lock().expect("log").clone();

    // Visitors that started in [from, to) and were not in flight at `to` (those are
    // counted with the kill that cut them).
    let slice = |from: Instant, to: Instant| -> Vec<(Instant, Instant, Outcome)> {
        entries
            .iter()
            .filter(|(at, end, _)| *at >= from && *at < to && *end <= to)
            .copied()
            .collect()
    };
    let in_flight = |moment: Instant| -> Vec<(Instant, Instant, Outcome)> {
        entries
            .iter()
            .filter(|(at, end, _)| *at < moment && *end > moment)
            .copied()
            .collect()
    };
    let whole = tally(&entries);
    let before = tally(&slice(started, client_killed));
    let cut_by_client = tally(&in_flight(client_killed));
    let after_client = tally(&slice(client_killed, server_killed));
    let cut_by_server = tally(&in_flight(server_killed));
    let after_server = tally(&slice(server_killed, restarted));
    let after_restart = tally(&slice(restarted, until));
    println!("HA run through HAProxy (started, succeeded, errors, truncated):");
    println!("  whole run                   {whole:?}");
    println!("  before any kill             {before:?}");
    println!("  in flight at SIGKILL client {cut_by_client:?}");
    println!("  started after it            {after_client:?}");
    println!("  in flight at SIGKILL server {cut_by_server:?}");
    println!("  started after it            {after_server:?}");
    println!("  after both restarted        {after_restart:?}");
    let rate = whole.0 as f64 / 20.0;
    println!("  rate: {rate:.0} visitors/s through HAProxy");
    let direct_tally = tally(&direct);
    println!("  straight at the servers' ports {direct_tally:?}");
    println!(
        "  cut by a kill and closed by HAProxy with a FIN: {}",
        cut_by_client.3 + cut_by_server.3
    );

    // Warren's own promise: a stream cut by a killed process ends in an error, never in a
    // clean close with short data. Straight at the servers' ports (where only Warren
    // decides) that holds for every visitor. Through HAProxy, a stream cut at a kill ends as
    // HAProxy decides: Warren resets HAProxy's connection (the killed client's server does,
    // or the dead server's kernel does), and HAProxy 2.6 in `mode tcp` then closes the
    // visitor's side with a FIN (its log says `SD`), which only the visitor's own protocol
    // can tell from a complete answer. Those are counted, and must be among the cut ones.
    assert_eq!(
        direct_tally.3, 0,
        "a visitor of a server's port saw a clean close with short data (silent truncation)"
    );
    assert_eq!(
        whole.3,
        cut_by_client.3 + cut_by_server.3,
        "a visitor not cut by a kill saw a clean close with short data"
    );
    assert_eq!(before.1, before.0, "visitors failed before any kill");
    assert_eq!(
        after_client.1, after_client.0,
        "visitors that started after the client's SIGKILL failed"
    );
    assert_eq!(
        after_server.1, after_server.0,
        "visitors that started after server 1's SIGKILL failed"
    );
    assert_eq!(
        after_restart.1, after_restart.0,
        "visitors failed after the restarts"
    );
    assert!(
        rate > 100.0,
        "the load was too light to mean much: {rate:.0}/s"
    );

    // Without any operator action the service is whole again: server 1 serves it with both
    // clients (the restarted client reconnected, and so did client B to the new server 1).
    wait_listening(web1, "restarted server 1").await;
    let deadline = Instant::now() + READY_TIMEOUT;
    while server1.logs().matches("client connected").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "clients did not come back to server 1:\n{}",
            server1.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for addr in [loopback(web1), loopback(web2), loopback(front)] {
        for _ in 0..10 {
            assert_eq!(visit(addr).await, Outcome::Ok, "{addr} after the restarts");
        }
    }
    for proc in [
        &mut haproxy,
        &mut client_a,
        &mut client_b,
        &mut server1,
        &mut server2,
    ] {
        proc.kill();
    }
}
