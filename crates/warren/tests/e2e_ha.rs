//! High availability end to end: the release binary behind HAProxy, as the README's
//! "High availability" section describes it. HAProxy (`option redispatch`, `retries`,
//! health checks of each server's `/readyz`) spreads visitors over **two servers**; **two
//! clients** each keep a session with both servers and serve one service. Visitors arrive
//! steadily, each checking its bytes, while
//!
//! - one client and then one server are SIGKILLed and started again;
//! - one client stops answering for 10 s with its sockets open: frozen with SIGSTOP, or its
//!   packets dropped both ways (iptables), and then answers again;
//! - one server is frozen (HAProxy in HTTP mode with L7 retries, nginx as the target: a
//!   frozen server's kernel still takes connections, so only the balancer can move them);
//! - both clients, then both servers, are restarted one at a time with SIGTERM (a drain).
//!
//! What must hold: every connection that starts after a kill succeeds; a connection in
//! flight on a killed process ends in an error, never in a clean close with short data
//! (checked straight at the servers' ports, where only Warren decides); a client or server
//! that stops answering strands no visitor that arrives afterwards, and none waits more than
//! 3 s; a rolling restart fails no visitor; and afterwards the service is whole again with no
//! operator action. The counts are printed for the README. The tests run one at a time
//! (each loads both cores).

mod e2e_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// `N` distinct free ports outside the ephemeral range, so that no outgoing connection
/// takes one while its server is down between a kill and a restart. Each is held bound
/// until all are chosen: two draws can never return the same port.
fn stable_ports<const N: usize>() -> [u16; N] {
    let mut held = Vec::with_capacity(N);
    for _ in 0..10_000 {
        if held.len() == N {
            break;
        }
        let port = 20_000 + rand::random::<u16>() % 10_000;
        if let Ok(listener) = std::net::TcpListener::bind(loopback(port)) {
            held.push((port, listener));
        }
    }
    assert_eq!(held.len(), N, "no {N} free ports in 20000-29999");
    std::array::from_fn(|i| held[i].0)
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

/// One HTTP visitor: `GET` one of `files` (served by nginx behind the tunnel) on a fresh
/// connection, and check the body byte for byte.
async fn get(addr: SocketAddr, files: &[Vec<u8>]) -> Outcome {
    let n = rand::random::<u64>() as usize % files.len();
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET /f{n} HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        std::io::Result::Ok(reply)
    };
    let reply = match tokio::time::timeout(Duration::from_secs(15), attempt).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(_)) | Err(_) => return Outcome::Error,
    };
    let Some(split) = reply.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Outcome::Error;
    };
    let (head, body) = (&reply[..split], &reply[split + 4..]);
    if !head.starts_with(b"HTTP/1.1 200 ") {
        return Outcome::Error;
    }
    match body {
        body if body == files[n].as_slice() => Outcome::Ok,
        body if body.len() < files[n].len() => Outcome::Truncated,
        _ => Outcome::Error,
    }
}

/// What every visitor of a run does.
#[derive(Clone)]
enum Visitor {
    /// 8 KiB echoed over raw TCP ([`visit`]).
    Echo,
    /// An 8 KiB file fetched over HTTP ([`get`]).
    Get(Arc<Vec<Vec<u8>>>),
}

impl Visitor {
    /// A worker's rest between two visits: an HTTP fetch takes a fraction of an 8 KiB echo's
    /// 80 ms, and the load should be steady, not a flood.
    fn pause(&self) -> Duration {
        match self {
            Visitor::Echo => Duration::ZERO,
            Visitor::Get(_) => Duration::from_millis(40),
        }
    }

    async fn visit(&self, addr: SocketAddr) -> Outcome {
        match self {
            Visitor::Echo => visit(addr).await,
            Visitor::Get(files) => get(addr, files).await,
        }
    }
}

/// One visitor: when it started, when it ended and how.
type Visit = (Instant, Instant, Outcome);

/// Every visitor.
type Log = Arc<Mutex<Vec<Visit>>>;

/// When a process was SIGKILLed: from the signal to its reaping.
struct Kill {
    sent: Instant,
    reaped: Instant,
}

impl Kill {
    fn of(proc: &mut Proc) -> Kill {
        let sent = Instant::now();
        proc.kill();
        Kill {
            sent,
            reaped: Instant::now(),
        }
    }

    /// Whether `visit` was in flight at some moment of the kill.
    fn cut(&self, (at, end, _): &Visit) -> bool {
        *at < self.reaped && *end > self.sent
    }
}

/// `workers` visitors in a loop until `until` or `stop`.
fn steady_load(
    visitor: &Visitor,
    addr: SocketAddr,
    workers: usize,
    until: Instant,
    stop: &CancellationToken,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|_| {
            let log = Arc::clone(log);
            let stop = stop.clone();
            let visitor = visitor.clone();
            tokio::spawn(async move {
                while Instant::now() < until && !stop.is_cancelled() {
                    let started = Instant::now();
                    let outcome = visitor.visit(addr).await;
                    log.lock()
                        .expect("log")
                        .push((started, Instant::now(), outcome));
                    if outcome != Outcome::Ok {
                        // A dead server refuses at once: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    } else {
                        tokio::time::sleep(visitor.pause()).await;
                    }
                }
            })
        })
        .collect()
}

/// Heartbeat settings of a run: the kill test's short ones (so that the killed processes'
/// peers reconnect fast), or the defaults, which a freeze must be met with.
#[derive(Clone, Copy)]
enum Heartbeats {
    Short,
    Default,
}

/// A server's ports: clients', the echo service's, and the admin API's (HAProxy checks
/// its `/readyz`).
#[derive(Clone, Copy)]
struct ServerPorts {
    control: u16,
    web: u16,
    admin: u16,
}

fn server_config(ports: ServerPorts, heartbeats: Heartbeats) -> String {
    let ServerPorts {
        control,
        web,
        admin,
    } = ports;
    let heartbeat = match heartbeats {
        Heartbeats::Short => "heartbeat_interval = \"1s\"\n",
        Heartbeats::Default => "",
    };
    // The grace outlasts HAProxy's `fall 2` of `/readyz` checks 300 ms apart: by the time
    // the service port closes, HAProxy sends it nobody.
    format!(
        r#"[server]
bind = "127.0.0.1:{control}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
drain_grace = "2s"
{heartbeat}

[server.services.echo]
bind = "127.0.0.1:{web}"

[admin]
bind = "127.0.0.1:{admin}"
"#
    )
}

fn client_config(servers: [u16; 2], target: SocketAddr, heartbeats: Heartbeats) -> String {
    let heartbeat = match heartbeats {
        Heartbeats::Short => "heartbeat_timeout = \"3s\"\n",
        Heartbeats::Default => "",
    };
    format!(
        r#"[client]
servers = ["127.0.0.1:{}", "127.0.0.1:{}"]
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
{heartbeat}reconnect_initial_delay = "100ms"
reconnect_max_delay = "1s"

[client.services.echo]
target = "{target}"
"#,
        servers[0], servers[1]
    )
}

/// What HAProxy speaks to visitors and servers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `mode tcp`: a connection it handed a server is that server's.
    Tcp,
    /// `mode http` with L7 retries: a request that got no answer within `timeout server`
    /// (a frozen server) is sent again to the other server.
    Http,
}

/// HAProxy as the README's "High availability" section sets it up: each server checked at
/// its `/readyz` (which fails while it drains, while no client serves the service, and when
/// it is frozen or gone), refused connects retried elsewhere.
fn haproxy_config(front: u16, servers: [ServerPorts; 2], mode: Mode) -> String {
    let mode = match mode {
        Mode::Tcp => "mode tcp\n    option tcplog\n    timeout server 20s",
        Mode::Http => {
            "mode http\n    option httplog\n    timeout server 1s\n    retry-on conn-failure empty-response response-timeout"
        }
    };
    format!(
        r#"global
    maxconn 4096
    log stdout format raw local0

defaults
    {mode}
    log global
    # A refused connect is retried after min(1 s, timeout connect): keep it short.
    timeout connect 200ms
    timeout client 20s
    retries 3
    option redispatch 1

frontend visitors
    bind 127.0.0.1:{front}
    default_backend warren

backend warren
    balance roundrobin
    option httpchk GET /readyz
    timeout check 300ms
    server s1 127.0.0.1:{} check port {} inter 300ms fall 2 rise 2
    server s2 127.0.0.1:{} check port {} inter 300ms fall 2 rise 2
"#,
        servers[0].web, servers[0].admin, servers[1].web, servers[1].admin
    )
}

/// Counts of one slice of the run: (started, succeeded, errors, truncated).
fn tally(entries: &[Visit]) -> (usize, usize, usize, usize) {
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

/// The tests of this file one at a time: each loads both cores for 20 s.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Two servers, two clients with a session each to both, HAProxy in front.
struct Cluster {
    dir: TestDir,
    visitor: Visitor,
    /// nginx, the target of an HTTP run.
    nginx: Option<Proc>,
    controls: [u16; 2],
    webs: [u16; 2],
    admins: [u16; 2],
    front: u16,
    server1_toml: std::path::PathBuf,
    server2_toml: std::path::PathBuf,
    client_toml: std::path::PathBuf,
    server1: Proc,
    server2: Proc,
    client_a: Proc,
    client_b: Proc,
    haproxy: Proc,
}

impl Cluster {
    async fn start(name: &str, heartbeats: Heartbeats) -> Cluster {
        Cluster::start_with(name, heartbeats, None, Mode::Tcp).await
    }

    /// [`Cluster::start`] with client A in group `group_a` (its packets can be told apart),
    /// and in HTTP `mode` nginx as the target.
    async fn start_with(
        name: &str,
        heartbeats: Heartbeats,
        group_a: Option<u32>,
        mode: Mode,
    ) -> Cluster {
        let dir = TestDir::new(name);
        let (target, visitor, nginx) = match mode {
            Mode::Tcp => (echo_target().await, Visitor::Echo, None),
            Mode::Http => {
                let files: Vec<Vec<u8>> = (0..8).map(|_| random_bytes(8 * 1024)).collect();
                std::fs::create_dir_all(dir.path().join("www")).expect("www");
                for (n, file) in files.iter().enumerate() {
                    std::fs::write(dir.path().join(format!("www/f{n}")), file).expect("file");
                }
                let [port] = stable_ports();
                let mut nginx = spawn_nginx(
                    &dir,
                    &format!(
                        "  server {{ listen 127.0.0.1:{port}; root {}/www; }}\n",
                        dir.path().display()
                    ),
                );
                nginx.wait_listening(port).await;
                (loopback(port), Visitor::Get(Arc::new(files)), Some(nginx))
            }
        };
        let [port1, port2, web1, web2, admin1, admin2, front] = stable_ports();
        let (ports, webs, admins) = ([port1, port2], [web1, web2], [admin1, admin2]);
        let servers = [0, 1].map(|n| ServerPorts {
            control: ports[n],
            web: webs[n],
            admin: admins[n],
        });
        let server1_toml = dir.write("server1.toml", &server_config(servers[0], heartbeats));
        let server2_toml = dir.write("server2.toml", &server_config(servers[1], heartbeats));
        let client_toml = dir.write("client.toml", &client_config(ports, target, heartbeats));
        let haproxy_cfg = dir.write("haproxy.cfg", &haproxy_config(front, servers, mode));

        let mut server1 = start_server(&dir, &server1_toml);
        let mut server2 = start_server(&dir, &server2_toml);
        server1.wait_listening(ports[0]).await;
        server2.wait_listening(ports[1]).await;
        let client_a = match group_a {
            Some(gid) => Proc::spawn_with(
                &dir,
                "client",
                WARREN,
                &["client", client_toml.to_str().expect("path")],
                &[("WARREN_PSK", PSK)],
                |command| {
                    use std::os::unix::process::CommandExt;
                    command.gid(gid);
                },
            ),
            None => start_client(&dir, &client_toml, PSK),
        };
        let client_b = start_client(&dir, &client_toml, PSK);
        let mut haproxy = Proc::spawn(
            &dir,
            "haproxy",
            "haproxy",
            &["-db", "-f", haproxy_cfg.to_str().expect("path")],
            &[],
        );
        haproxy.wait_listening(front).await;
        // Both clients with both servers: each server logs two sessions.
        for server in [&mut server1, &mut server2] {
            wait_sessions(server, 2, "clients did not connect").await;
        }
        for admin in admins {
            wait_ready(admin, "a server with both clients").await;
        }
        for addr in [loopback(webs[0]), loopback(webs[1]), loopback(front)] {
            assert_eq!(
                visitor.visit(addr).await,
                Outcome::Ok,
                "{addr} before the run"
            );
        }
        Cluster {
            dir,
            visitor,
            nginx,
            controls: ports,
            webs,
            admins,
            front,
            server1_toml,
            server2_toml,
            client_toml,
            server1,
            server2,
            client_a,
            client_b,
            haproxy,
        }
    }

    /// Steady load until `until`: 16 visitors at a time through HAProxy (`log`), and 2 at
    /// each server's port (`direct`), where only Warren decides what a visitor sees.
    fn load(&self, until: Instant, log: &Log, direct: &Log) -> Vec<tokio::task::JoinHandle<()>> {
        self.load_until(until, &CancellationToken::new(), log, direct)
    }

    /// [`Cluster::load`] that also ends when `stop` fires (no visitor starts after it).
    fn load_until(
        &self,
        until: Instant,
        stop: &CancellationToken,
        log: &Log,
        direct: &Log,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let v = &self.visitor;
        let mut workers = steady_load(v, loopback(self.front), 16, until, stop, log);
        workers.extend(steady_load(
            v,
            loopback(self.webs[0]),
            2,
            until,
            stop,
            direct,
        ));
        workers.extend(steady_load(
            v,
            loopback(self.webs[1]),
            2,
            until,
            stop,
            direct,
        ));
        workers
    }

    /// Ten visitors at each entrance succeed.
    async fn whole(&self, when: &str) {
        for addr in [
            loopback(self.webs[0]),
            loopback(self.webs[1]),
            loopback(self.front),
        ] {
            for _ in 0..10 {
                assert_eq!(self.visitor.visit(addr).await, Outcome::Ok, "{addr} {when}");
            }
        }
    }

    fn stop(mut self) {
        if let Some(nginx) = &mut self.nginx {
            nginx.kill();
        }
        for proc in [
            &mut self.haproxy,
            &mut self.client_a,
            &mut self.client_b,
            &mut self.server1,
            &mut self.server2,
        ] {
            proc.kill();
        }
    }
}

/// Waits until the server with admin port `admin` says it is ready (`/readyz`), then as long
/// again as HAProxy takes to believe it (`rise 2` checks 300 ms apart).
async fn wait_ready(admin: u16, what: &str) {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let answer = readyz(admin).await;
        if answer.as_deref() == Some("ready") {
            break;
        }
        assert!(Instant::now() < deadline, "{what} not ready: {answer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
}

/// The first line of `GET /readyz` at `admin`, or `None` when it does not answer.
async fn readyz(admin: u16) -> Option<String> {
    let attempt = async {
        let mut stream = TcpStream::connect(loopback(admin)).await?;
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        std::io::Result::Ok(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()?
        .ok()?;
    answer
        .split("\r\n\r\n")
        .nth(1)
        .map(|body| body.trim().to_owned())
}

/// Waits until `server` has logged `count` client sessions in all.
async fn wait_sessions(server: &mut Proc, count: usize, what: &str) {
    let deadline = Instant::now() + READY_TIMEOUT;
    while server.logs().matches("client connected").count() < count {
        assert!(Instant::now() < deadline, "{what}:\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_two_clients_behind_haproxy_survive_sigkill_of_each() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start("e2e-ha", Heartbeats::Short).await;

    // 20 s of ~200 visitors/s (20 workers x ~100 ms each).
    let log: Log = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs(20);
    // Visitors straight at the servers' ports too: what Warren itself does to a stream in
    // flight on a killed process, without HAProxy's own handling in between.
    let direct: Log = Arc::default();
    let workers = cluster.load(until, &log, &direct);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // A kill is a window, not a moment: the signal goes at `sent`, the kernel closes the
    // process's sockets while it dies, and `kill` returns once it is reaped. A busy machine
    // may run visitor tasks (which see the sockets close) before this task records the
    // reaping, so a visitor cut by a kill can end before `reaped`: every visitor in flight
    // at any point of the window counts as cut by it.
    let client_kill = Kill::of(&mut cluster.client_a);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let server_kill = Kill::of(&mut cluster.server1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restarted = Instant::now();
    cluster.client_a = start_client(&cluster.dir, &cluster.client_toml, PSK);
    cluster.server1 = start_server(&cluster.dir, &cluster.server1_toml);
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let entries = log.lock().expect("log").clone();
    let direct = direct.lock().expect("log").clone();

    // Visitors that started in [from, to) and ended by `to`.
    let slice = |from: Instant, to: Instant| -> Vec<Visit> {
        entries
            .iter()
            .filter(|(at, end, _)| *at >= from && *at < to && *end <= to)
            .copied()
            .collect()
    };
    let cut_by = |kill: &Kill| -> Vec<Visit> {
        entries
            .iter()
            .filter(|visit| kill.cut(visit))
            .copied()
            .collect()
    };
    let whole = tally(&entries);
    let before = tally(&slice(started, client_kill.sent));
    let cut_by_client = tally(&cut_by(&client_kill));
    let after_client = tally(&slice(client_kill.reaped, server_kill.sent));
    let cut_by_server = tally(&cut_by(&server_kill));
    let after_server = tally(&slice(server_kill.reaped, restarted));
    let after_restart = tally(&slice(restarted, until));
    // A clean close with short data that no kill can explain.
    let unexplained: Vec<String> = entries
        .iter()
        .filter(|visit| visit.2 == Outcome::Truncated)
        .filter(|visit| !client_kill.cut(visit) && !server_kill.cut(visit))
        .map(|(at, end, _)| {
            format!(
                "{:?}..{:?} after the start",
                at.duration_since(started),
                end.duration_since(started)
            )
        })
        .collect();
    println!("HA run through HAProxy (started, succeeded, errors, truncated):");
    println!("  whole run                   {whole:?}");
    println!("  before any kill             {before:?}");
    println!("  in flight at SIGKILL client {cut_by_client:?}");
    println!("  started after it            {after_client:?}");
    println!("  in flight at SIGKILL server {cut_by_server:?}");
    println!("  started after it            {after_server:?}");
    println!("  after both restarted        {after_restart:?}");
    for (what, kill) in [("client", &client_kill), ("server", &server_kill)] {
        println!(
            "  SIGKILL {what} at {:?}, reaped {:?} later",
            kill.sent.duration_since(started),
            kill.reaped.duration_since(kill.sent)
        );
    }
    for (at, end, _) in entries.iter().filter(|visit| visit.2 == Outcome::Truncated) {
        let kill = [&client_kill, &server_kill]
            .into_iter()
            .min_by_key(|kill| {
                kill.sent
                    .duration_since(*at)
                    .max(at.duration_since(kill.sent))
            })
            .expect("two kills");
        let from_signal = |t: &Instant| {
            t.duration_since(kill.sent).as_secs_f64() - kill.sent.duration_since(*t).as_secs_f64()
        };
        println!(
            "  truncated: started {:+.3} s, ended {:+.3} s from the nearest SIGKILL",
            from_signal(at),
            from_signal(end)
        );
    }
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
    assert!(
        unexplained.is_empty(),
        "a visitor not cut by a kill saw a clean close with short data: {unexplained:?}"
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
    cluster.server1.wait_listening(cluster.webs[0]).await;
    wait_sessions(
        &mut cluster.server1,
        2,
        "clients did not come back to server 1",
    )
    .await;
    cluster.whole("after the restarts").await;
    cluster.stop();
}

/// A client frozen with SIGSTOP keeps its sockets open and answers nothing: the failure a
/// swapping process or a paused VM looks like. With the default heartbeat settings the
/// servers must judge it suspect within a couple of seconds, give it no new visitor, move
/// the visitors still waiting for their first answer to the other client, and drop its
/// sessions; once thawed it reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_client_strands_no_visitor_that_arrives_after_the_freeze() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start("e2e-ha-freeze", Heartbeats::Default).await;
    a_silent_client_strands_no_visitor(cluster, Fault::Freeze).await;
}

/// A path that drops every packet of one client's connections, both ways (iptables DROP):
/// what a NAT box that forgot its mappings, or a cut link, looks like. The client process
/// runs on; the servers must treat it as they treat a frozen one, and once the path is back
/// it reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_client_strands_no_visitor_that_arrives_after_the_cut() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") || !have_tool("iptables", "iptables", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let hole = BlackHole::prepare();
    let cluster = Cluster::start_with(
        "e2e-ha-black-hole",
        Heartbeats::Default,
        Some(hole.gid),
        Mode::Tcp,
    )
    .await;
    a_silent_client_strands_no_visitor(cluster, Fault::BlackHole(hole)).await;
}

/// How client A stops answering.
enum Fault {
    /// SIGSTOP, later SIGCONT.
    Freeze,
    /// Its packets dropped, later let through again.
    BlackHole(BlackHole),
}

impl Fault {
    fn name(&self) -> &'static str {
        match self {
            Fault::Freeze => "a frozen client",
            Fault::BlackHole(_) => "a black-holed client",
        }
    }

    fn begin(&mut self, cluster: &mut Cluster) {
        match self {
            Fault::Freeze => cluster.client_a.signal("STOP"),
            Fault::BlackHole(hole) => hole.drop_packets(true),
        }
    }

    fn end(&mut self, cluster: &mut Cluster) {
        match self {
            Fault::Freeze => cluster.client_a.signal("CONT"),
            Fault::BlackHole(hole) => hole.drop_packets(false),
        }
    }
}

/// iptables rules that mark every connection of the processes in group `gid` and, while
/// dropping, drop all their packets both ways (on loopback both pass OUTPUT); removed when
/// dropped. Only that group's connections ever match.
struct BlackHole {
    gid: u32,
    mark: String,
    dropping: bool,
}

impl BlackHole {
    fn prepare() -> BlackHole {
        let gid = 47_000 + std::process::id() % 1_000;
        let hole = BlackHole {
            gid,
            mark: format!("0x{gid:x}"),
            dropping: false,
        };
        hole.iptables(&[
            "-t",
            "mangle",
            "-I",
            "OUTPUT",
            "-m",
            "owner",
            "--gid-owner",
            &gid.to_string(),
            "-j",
            "CONNMARK",
            "--set-mark",
            &hole.mark,
        ]);
        hole
    }

    fn drop_packets(&mut self, on: bool) {
        if on != self.dropping {
            let action = if on { "-I" } else { "-D" };
            self.iptables(&[
                action, "OUTPUT", "-m", "connmark", "--mark", &self.mark, "-j", "DROP",
            ]);
            self.dropping = on;
        }
    }

    fn iptables(&self, args: &[&str]) {
        let status = std::process::Command::new("iptables")
            .arg("-w")
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("run iptables {args:?}: {e}"));
        assert!(status.success(), "iptables {args:?} failed");
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        let gid = self.gid.to_string();
        let rules: [&[&str]; 2] = [
            &[
                "-D", "OUTPUT", "-m", "connmark", "--mark", &self.mark, "-j", "DROP",
            ],
            &[
                "-t",
                "mangle",
                "-D",
                "OUTPUT",
                "-m",
                "owner",
                "--gid-owner",
                &gid,
                "-j",
                "CONNMARK",
                "--set-mark",
                &self.mark,
            ],
        ];
        for (n, rule) in rules.into_iter().enumerate() {
            if n == 0 && !self.dropping {
                continue;
            }
            let _ = std::process::Command::new("iptables")
                .arg("-w")
                .args(rule)
                .status();
        }
    }
}

/// Client A stops answering (`fault`) under steady load for 10 s, then answers again; see
/// the two tests above for what must hold.
async fn a_silent_client_strands_no_visitor(mut cluster: Cluster, mut fault: Fault) {
    let log: Log = Arc::default();
    let direct: Log = Arc::default();
    let started = Instant::now();
    let until = started + Duration::from_secs(20);
    let workers = cluster.load(until, &log, &direct);
    tokio::time::sleep(Duration::from_secs(4)).await;
    fault.begin(&mut cluster);
    let frozen = Instant::now();
    // When each server judged it (polled from their logs, so up to 20 ms late), within the
    // 10 s it stays frozen: long enough for the servers to give up on it (its dead
    // deadline is 6 s on loopback).
    let mut suspect_at = [None; 2];
    let mut dead_at = [None; 2];
    while frozen.elapsed() < Duration::from_secs(10) {
        for (n, server) in [&cluster.server1, &cluster.server2].into_iter().enumerate() {
            let logs = server.logs();
            if suspect_at[n].is_none() && logs.contains("session_suspect") {
                suspect_at[n] = Some(frozen.elapsed());
            }
            if dead_at[n].is_none() && logs.contains("session_dead") {
                dead_at[n] = Some(frozen.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fault.end(&mut cluster);
    let thawed = Instant::now();
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let entries = log.lock().expect("log").clone();
    let direct = direct.lock().expect("log").clone();

    let everyone: Vec<Visit> = entries.iter().chain(&direct).copied().collect();
    let in_flight = |visits: &[Visit]| -> Vec<Visit> {
        visits
            .iter()
            .filter(|(at, end, _)| *at < frozen && *end > frozen)
            .copied()
            .collect()
    };
    let after_freeze: Vec<Visit> = everyone
        .iter()
        .filter(|(at, _, _)| *at >= frozen && *at < thawed)
        .copied()
        .collect();
    let after_thaw: Vec<Visit> = everyone
        .iter()
        .filter(|(at, _, _)| *at >= thawed)
        .copied()
        .collect();
    let slowest = after_freeze
        .iter()
        .map(|(at, end, _)| end.duration_since(*at))
        .max()
        .unwrap_or_default();
    let whole = tally(&everyone);
    println!(
        "HA run with {} (started, succeeded, errors, truncated):",
        fault.name()
    );
    println!("  whole run                    {whole:?}");
    println!(
        "  in flight at the fault       {:?}",
        tally(&in_flight(&everyone))
    );
    println!("  started during the fault     {:?}", tally(&after_freeze));
    println!("  slowest of those             {slowest:?}");
    println!("  started after it ended       {:?}", tally(&after_thaw));
    println!(
        "  from the fault to suspect (no new visitor goes there) {suspect_at:?}, to dead {dead_at:?}"
    );
    for (n, server) in [&cluster.server1, &cluster.server2].into_iter().enumerate() {
        let logs = server.logs();
        let dead: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("session_dead"))
            .collect();
        println!(
            "  server {}: {} suspect; {dead:?}",
            n + 1,
            logs.matches("session_suspect").count(),
        );
    }

    // Visitors in flight on the frozen client when it froze may fail: their bytes went
    // into a process that will not answer, and those that had an answer back cannot be
    // replayed. Straight at a server's port such a visitor sees a reset, never a clean close.
    assert_eq!(
        tally(&in_flight(&direct)).3,
        0,
        "a visitor of a server's port saw a clean close with short data"
    );
    let failed: Vec<String> = after_freeze
        .iter()
        .filter(|visit| visit.2 != Outcome::Ok)
        .map(|(at, end, outcome)| {
            format!(
                "{outcome:?} {:?}..{:?} after the freeze",
                at.duration_since(frozen),
                end.duration_since(frozen)
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "visitors that arrived while a client was frozen failed: {failed:?}"
    );
    assert!(
        slowest <= Duration::from_secs(3),
        "a visitor that arrived while a client was frozen took {slowest:?}"
    );
    assert_eq!(
        tally(&after_thaw).1,
        after_thaw.len(),
        "visitors failed after the thaw"
    );
    assert!(
        after_freeze.len() > 500,
        "the load was too light to mean much: {} visitors in 10 s",
        after_freeze.len()
    );
    for server in [&cluster.server1, &cluster.server2] {
        let logs = server.logs();
        assert!(
            logs.contains("session_suspect") && logs.contains("session_dead"),
            "a server did not judge {}:\n{logs}",
            fault.name()
        );
    }

    // Thawed, the client finds its sessions gone and comes back to both servers by itself.
    for server in [&mut cluster.server1, &mut cluster.server2] {
        wait_sessions(server, 3, "the thawed client did not reconnect").await;
    }
    cluster.whole("after the thaw").await;
    cluster.stop();
}

/// A rolling restart of both clients under load, as an operator does it: SIGTERM one (it
/// drains: the servers send it no new visitors, its streams in flight finish, then it
/// exits), start it again, wait until both servers have it back, then the other. No
/// visitor may fail or be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_both_clients_fails_no_visitor() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start("e2e-ha-drain", Heartbeats::Default).await;

    let log: Log = Arc::default();
    let direct: Log = Arc::default();
    let until = Instant::now() + Duration::from_secs(60);
    let stop_load = CancellationToken::new();
    let workers = cluster.load_until(until, &stop_load, &log, &direct);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut drains = Vec::new();
    for (which, sessions) in [("a", 3), ("b", 4)] {
        let client = if which == "a" {
            &mut cluster.client_a
        } else {
            &mut cluster.client_b
        };
        let asked = Instant::now();
        client.terminate();
        let status = client.wait_exit(Duration::from_secs(40)).await;
        let took = asked.elapsed();
        assert!(
            status.is_some_and(|s| s.success()),
            "client {which} did not drain and exit cleanly ({status:?}):\n{}",
            client.logs()
        );
        assert!(
            client.logs().contains("drain_finished"),
            "client {which} did not say it drained:\n{}",
            client.logs()
        );
        drains.push((which, took));
        *client = start_client(&cluster.dir, &cluster.client_toml, PSK);
        for server in [&mut cluster.server1, &mut cluster.server2] {
            wait_sessions(server, sessions, "the restarted client did not come back").await;
        }
        // Let the restarted client take visitors before the next one goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop_load.cancel();
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let everyone: Vec<Visit> = log
        .lock()
        .expect("log")
        .iter()
        .chain(direct.lock().expect("log").iter())
        .copied()
        .collect();
    let whole = tally(&everyone);
    println!("rolling restart of both clients (started, succeeded, errors, truncated): {whole:?}");
    println!("  SIGTERM to exit: {drains:?}");
    assert_eq!(whole.1, whole.0, "visitors failed during a rolling restart");
    assert!(
        whole.0 > 1_000,
        "the load was too light to mean much: {whole:?}"
    );
    cluster.whole("after the rolling restart").await;
    cluster.stop();
}

/// A rolling restart of both servers under load, as an operator does it behind a load
/// balancer: SIGTERM one (it drains: `/readyz` fails so HAProxy stops sending it visitors,
/// its service port closes after `drain_grace`, its streams in flight finish, then it
/// exits), start it again, wait until it is ready (a client serves the service there) and
/// HAProxy believes it, then the other. No visitor through HAProxy may fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_both_servers_fails_no_visitor() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start("e2e-ha-server-drain", Heartbeats::Default).await;

    // Through HAProxy only: a server's own port refuses visitors while it drains, by design.
    let log: Log = Arc::default();
    let until = Instant::now() + Duration::from_secs(90);
    let stop_load = CancellationToken::new();
    let workers = steady_load(
        &cluster.visitor,
        loopback(cluster.front),
        16,
        until,
        &stop_load,
        &log,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut drains = Vec::new();
    for which in [1, 2] {
        let (server, toml, admin) = if which == 1 {
            (
                &mut cluster.server1,
                &cluster.server1_toml,
                cluster.admins[0],
            )
        } else {
            (
                &mut cluster.server2,
                &cluster.server2_toml,
                cluster.admins[1],
            )
        };
        let asked = Instant::now();
        server.terminate();
        let status = server.wait_exit(Duration::from_secs(60)).await;
        let took = asked.elapsed();
        let logs = server.logs();
        assert!(
            status.is_some_and(|s| s.success()),
            "server {which} did not drain and exit cleanly ({status:?}):\n{logs}"
        );
        assert!(
            logs.contains("service_ports_closed") && logs.contains("drain_finished"),
            "server {which} did not say it drained:\n{logs}"
        );
        drains.push((which, took));
        *server = start_server(&cluster.dir, toml);
        wait_sessions(
            server,
            2,
            "the clients did not come back to the restarted server",
        )
        .await;
        wait_ready(admin, "the restarted server").await;
        // Let the restarted server take visitors before the next one goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop_load.cancel();
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let everyone = log.lock().expect("log").clone();
    let whole = tally(&everyone);
    println!("rolling restart of both servers (started, succeeded, errors, truncated): {whole:?}");
    println!("  SIGTERM to exit: {drains:?}");
    for (n, server) in [&cluster.client_a, &cluster.client_b]
        .into_iter()
        .enumerate()
    {
        println!(
            "  client {}: told of a drain {} times",
            n + 1,
            server.logs().matches("server_draining").count()
        );
    }
    assert_eq!(
        whole.1, whole.0,
        "visitors failed during a rolling restart of the servers"
    );
    assert!(
        whole.0 > 1_000,
        "the load was too light to mean much: {whole:?}"
    );
    cluster
        .whole("after the rolling restart of the servers")
        .await;
    cluster.stop();
}

/// A server frozen with SIGSTOP: its kernel still completes TCP handshakes on its ports, so
/// a TCP health check passes, and nothing Warren does can answer for it. The load balancer
/// must see it fail at `/readyz` (which then times out) and send elsewhere what it gave it:
/// with HAProxy in HTTP mode and L7 retries, no visitor that arrives after the freeze fails
/// or waits more than 3 s. The clients judge the server suspect, then dead, and once it is
/// thawed they come back to it by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_strands_no_visitor_behind_a_balancer_that_checks_readyz() {
    if !have_tool("haproxy", "haproxy", "e2e_ha") || !have_tool("nginx", "nginx", "e2e_ha") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start_with(
        "e2e-ha-frozen-server",
        Heartbeats::Default,
        None,
        Mode::Http,
    )
    .await;
    let server1 = format!("server=127.0.0.1:{}", cluster.controls[0]);

    let log: Log = Arc::default();
    let until = Instant::now() + Duration::from_secs(20);
    let stop_load = CancellationToken::new();
    let workers = steady_load(
        &cluster.visitor,
        loopback(cluster.front),
        16,
        until,
        &stop_load,
        &log,
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.server1.signal("STOP");
    let frozen = Instant::now();
    // When each client judged server 1 (polled from their logs), within the 10 s it stays
    // frozen.
    let mut suspect_at = [None; 2];
    let mut dead_at = [None; 2];
    let judged = |logs: &str, event: &str| {
        logs.lines()
            .any(|line| line.contains(event) && line.contains(&server1))
    };
    while frozen.elapsed() < Duration::from_secs(10) {
        for (n, client) in [&cluster.client_a, &cluster.client_b]
            .into_iter()
            .enumerate()
        {
            let logs = client.logs();
            if suspect_at[n].is_none() && judged(&logs, "session_suspect") {
                suspect_at[n] = Some(frozen.elapsed());
            }
            if dead_at[n].is_none() && judged(&logs, "session_dead") {
                dead_at[n] = Some(frozen.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.server1.signal("CONT");
    let thawed = Instant::now();
    for worker in workers {
        worker.await.expect("visitor worker");
    }
    let everyone = log.lock().expect("log").clone();
    let in_flight: Vec<Visit> = everyone
        .iter()
        .filter(|(at, end, _)| *at < frozen && *end > frozen)
        .copied()
        .collect();
    let after_freeze: Vec<Visit> = everyone
        .iter()
        .filter(|(at, _, _)| *at >= frozen && *at < thawed)
        .copied()
        .collect();
    let after_thaw: Vec<Visit> = everyone
        .iter()
        .filter(|(at, _, _)| *at >= thawed)
        .copied()
        .collect();
    let slowest = after_freeze
        .iter()
        .map(|(at, end, _)| end.duration_since(*at))
        .max()
        .unwrap_or_default();
    println!(
        "HA run with a frozen server, HAProxy in HTTP mode (started, succeeded, errors, truncated):"
    );
    println!("  whole run                    {:?}", tally(&everyone));
    println!("  in flight at SIGSTOP         {:?}", tally(&in_flight));
    println!("  started while it was frozen  {:?}", tally(&after_freeze));
    println!("  slowest of those             {slowest:?}");
    println!("  started after SIGCONT        {:?}", tally(&after_thaw));
    println!("  from SIGSTOP to the clients' suspect {suspect_at:?}, to dead {dead_at:?}");

    let failed: Vec<String> = after_freeze
        .iter()
        .chain(&after_thaw)
        .filter(|visit| visit.2 != Outcome::Ok)
        .map(|(at, end, outcome)| {
            format!(
                "{outcome:?} {:?}..{:?} after the freeze",
                at.duration_since(frozen),
                end.duration_since(frozen)
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "visitors that arrived after a server froze failed: {failed:?}"
    );
    assert!(
        slowest <= Duration::from_secs(3),
        "a visitor that arrived while a server was frozen took {slowest:?}"
    );
    assert!(
        after_freeze.len() > 300,
        "the load was too light to mean much: {} visitors in 10 s",
        after_freeze.len()
    );
    for client in [&cluster.client_a, &cluster.client_b] {
        let logs = client.logs();
        assert!(
            judged(&logs, "session_suspect") && judged(&logs, "session_dead"),
            "a client did not judge the frozen server:\n{logs}"
        );
    }
    // Thawed, the server finds its sessions gone; both clients come back to it.
    wait_sessions(
        &mut cluster.server1,
        4,
        "the clients did not come back to the thawed server",
    )
    .await;
    wait_ready(cluster.admins[0], "the thawed server").await;
    cluster.whole("after the thaw").await;
    cluster.stop();
}
