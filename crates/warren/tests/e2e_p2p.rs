//! End to end: `warren p2p listen` and `warren p2p connect` as real processes through a
//! real `warren server` with `[server.p2p]`, on loopback (issue 18). TCP payloads are
//! checked by BLAKE3, UDP datagrams byte for byte; routes come from the `--json` events.
//! A named service (`--service`) keeps working through a restart of the server: the
//! direct connection never touches it, and the listener offers the name again once the
//! server is back. The NAT matrix is `e2e_p2p_nat.rs`.

mod e2e_support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use e2e_support::{
    PSK, Proc, TestDir, echo_target, free_port, json_events, random_bytes, round_trip,
    udp_echo_target,
};
use serde_json::Value;
use tokio::net::{TcpStream, UdpSocket};

const TOKEN: &str = "e2e-p2p-service-token-0123456789";
/// A connect's wait for its tunnel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A `warren server` with `[server.p2p]` and the named service `echo`, restartable on its
/// port.
struct P2pServer {
    proc: Proc,
    config: PathBuf,
    addr: String,
}

impl P2pServer {
    async fn start(dir: &TestDir) -> P2pServer {
        let port = free_port();
        let config = dir.write(
            "server.toml",
            &format!(
                "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"${{WARREN_PSK}}\"\n\n\
                 [server.p2p]\nrate_per_minute = 1000\n\n[server.p2p.services.echo]\ntoken = \"{TOKEN}\"\n"
            ),
        );
        let addr = format!("127.0.0.1:{port}");
        let proc = Self::run(dir, &config, &addr).await;
        P2pServer { proc, config, addr }
    }

    async fn run(dir: &TestDir, config: &std::path::Path, addr: &str) -> Proc {
        let mut proc = Proc::warren(
            dir,
            "server",
            &["server", config.to_str().unwrap()],
            &[("WARREN_PSK", PSK)],
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_err() {
            assert!(
                proc.is_running() && tokio::time::Instant::now() < deadline,
                "the server did not start:\n{}",
                proc.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proc
    }

    /// Stops the server (SIGTERM) and starts it again on the same port.
    async fn restart(&mut self, dir: &TestDir) {
        self.proc.terminate();
        assert!(
            self.proc.wait_exit(Duration::from_secs(10)).await.is_some(),
            "the server did not stop"
        );
        self.proc = Self::run(dir, &self.config, &self.addr).await;
    }

    /// `warren p2p ARGS --json` with the server, the PSK and `extra` in the environment.
    fn p2p(&self, dir: &TestDir, name: &str, args: &[&str], extra: &[(&str, &str)]) -> Proc {
        let mut all = vec!["p2p"];
        all.extend_from_slice(args);
        all.push("--json");
        let mut env = vec![("WARREN_PSK", PSK), ("WARREN_SERVER", self.addr.as_str())];
        env.extend_from_slice(extra);
        Proc::warren(dir, name, &all, &env)
    }
}

/// The last event named `name`.
fn last_event(proc: &Proc, name: &str) -> Value {
    json_events(&proc.stdout())
        .into_iter()
        .rfind(|e| e["event"] == name)
        .unwrap_or_else(|| panic!("no {name} event:\n{}", proc.logs()))
}

/// `count` connections at once through `port`, each a random payload echoed back and
/// checked by hash.
async fn tcp_echoes(port: u16, count: usize, len: usize) {
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..count {
        runs.spawn(async move {
            let payload = random_bytes(len + i);
            let reply = tokio::time::timeout(
                Duration::from_secs(30),
                round_trip(SocketAddr::from(([127, 0, 0, 1], port)), &payload),
            )
            .await
            .expect("in time")
            .expect("round trip");
            assert_eq!(
                blake3::hash(&reply),
                blake3::hash(&payload),
                "connection {i}"
            );
        });
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap();
    }
}

/// Datagrams to `port`, each echoed back (retried: the first may race the channel).
async fn udp_echoes(port: u16, count: usize) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for i in 0..count {
        let payload = random_bytes(200 + 50 * i);
        let mut buf = vec![0u8; 65_536];
        let mut echoed = false;
        for _ in 0..10 {
            socket.send_to(&payload, ("127.0.0.1", port)).await.unwrap();
            if let Ok(Ok(len)) =
                tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf)).await
            {
                assert_eq!(&buf[..len], &payload[..], "datagram {i}");
                echoed = true;
                break;
            }
        }
        assert!(echoed, "datagram {i} never came back");
    }
}

/// Starts a connect and waits until it listens; its local port.
async fn connect(
    server: &P2pServer,
    dir: &TestDir,
    name: &str,
    args: &[&str],
    extra: &[(&str, &str)],
) -> (Proc, u16) {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut all = vec!["connect", "--bind", bind.as_str()];
    all.extend_from_slice(args);
    let mut proc = server.p2p(dir, name, &all, extra);
    proc.wait_stdout("\"event\":\"listening\"", CONNECT_TIMEOUT)
        .await;
    (proc, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_carries_tcp_and_udp_through_the_real_binary() {
    let dir = TestDir::new("e2e-p2p-code");
    let server = P2pServer::start(&dir).await;
    let (tcp, udp) = (
        echo_target().await.to_string(),
        udp_echo_target().await.to_string(),
    );
    for (kind, target) in [("tcp", &tcp), ("udp", &udp)] {
        let flag = format!("--{kind}");
        let mut listen = server.p2p(
            &dir,
            &format!("listen-{kind}"),
            &["listen", &flag, target],
            &[],
        );
        let out = listen
            .wait_stdout("\"event\":\"code\"", Duration::from_secs(10))
            .await;
        let code = json_events(&out)
            .into_iter()
            .find(|e| e["event"] == "code")
            .and_then(|e| e["code"].as_str().map(str::to_owned))
            .expect("a code");
        let (visitor, port) = connect(
            &server,
            &dir,
            &format!("connect-{kind}"),
            &[],
            &[("WARREN_CODE", &code)],
        )
        .await;
        let connected = last_event(&visitor, "connected");
        assert_eq!(connected["route"], "direct", "{}", visitor.logs());
        assert!(connected["rtt_ms"].as_f64().is_some(), "{connected}");
        assert_eq!(last_event(&visitor, "listening")["kind"], kind);
        match kind {
            "tcp" => tcp_echoes(port, 8, 512 * 1024).await,
            _ => udp_echoes(port, 20).await,
        }
        assert_eq!(last_event(&listen, "connected")["route"], "direct");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_service_works_through_a_server_restart() {
    let dir = TestDir::new("e2e-p2p-service");
    let mut server = P2pServer::start(&dir).await;
    let target = echo_target().await.to_string();
    let token = [("WARREN_TOKEN", TOKEN)];
    let mut listen = server.p2p(
        &dir,
        "listen",
        &["listen", "--tcp", &target, "--service", "echo"],
        &token,
    );
    listen
        .wait_stdout("\"event\":\"offered\"", Duration::from_secs(10))
        .await;
    // A wrong token is refused with the reason, and the command fails.
    let mut wrong = server.p2p(
        &dir,
        "wrong",
        &["connect", "--service", "echo", "--bind", "127.0.0.1:0"],
        &[("WARREN_TOKEN", "not-the-token-0123456789")],
    );
    assert_eq!(wrong.expect_exit(Duration::from_secs(20)).await, 1);
    assert!(wrong.stderr().contains("wrong token"), "{}", wrong.logs());

    let (first, first_port) =
        connect(&server, &dir, "connect-1", &["--service", "echo"], &token).await;
    tcp_echoes(first_port, 4, 256 * 1024).await;
    server.restart(&dir).await;
    // The direct connection never went through the server.
    tcp_echoes(first_port, 4, 256 * 1024).await;
    // The listener offers the name again (it says so twice by then): a new visitor gets in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while json_events(&listen.stdout())
        .iter()
        .filter(|e| e["event"] == "offered")
        .count()
        < 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener did not offer the service again:\n{}",
            listen.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (second, second_port) =
        connect(&server, &dir, "connect-2", &["--service", "echo"], &token).await;
    tcp_echoes(second_port, 4, 256 * 1024).await;
    assert!(
        listen.stdout().contains("offering again"),
        "{}",
        listen.logs()
    );
    drop((first, second));
}
