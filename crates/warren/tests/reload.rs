//! Hot reload (issue 6), in process: a reload touches only what changed, a transfer through
//! an unchanged service keeps flowing through it (bytes checked), a bad config is refused
//! while the old one keeps running, a PSK change reconnects the session, the client takes
//! new targets and forward ports, and `POST /api/v1/reload` and file changes reload a
//! config file.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use warren::{
    BoundServer, Client, ClientConfig, ClientStatus, ConfigSource, ReloadError, Server,
    ServerConfig,
};

const OTHER_PSK: &str = "another-psk-0123456789-abcdef";
const ADMIN_TOKEN: &str = "admin-token-0123456789-abcdef";

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The server port of the configs one test writes: a port free when the test first asks.
/// Per thread, because each test body runs on its own thread and reloads keep the port.
fn server_port() -> u16 {
    thread_local! {
        static PORT: u16 = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .unwrap();
    }
    PORT.with(|port| *port)
}

/// A server config with `services` as (name, port) and optional extra TOML.
fn server_toml(psk: &str, services: &[(&str, u16)], extra: &str) -> String {
    let port = server_port();
    let mut text = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{psk}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n{extra}\n"
    );
    for (name, port) in services {
        text.push_str(&format!(
            "[server.services.{name}]\nbind = \"127.0.0.1:{port}\"\n"
        ));
    }
    text
}

fn server_config(text: &str) -> ServerConfig {
    ServerConfig::from_toml_str(text, "server.toml").expect("valid server config")
}

/// A client config serving `services` as (name, target), plus extra TOML.
fn client_config(
    server: SocketAddr,
    psk: &str,
    services: &[(&str, SocketAddr)],
    extra: &str,
) -> ClientConfig {
    let mut text = format!(
        "[client]\nserver = \"{server}\"\npsk = \"{psk}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_timeout = \"3s\"\nreconnect_initial_delay = \"50ms\"\nreconnect_max_delay = \"200ms\"\n{extra}\n"
    );
    for (name, target) in services {
        text.push_str(&format!(
            "[client.services.{name}]\ntarget = \"{target}\"\n"
        ));
    }
    ClientConfig::from_toml_str(&text, "client.toml").expect("valid client config")
}

async fn start_server(config: ServerConfig) -> (BoundServer, SocketAddr) {
    let bound = Server::from_config(config)
        .expect("valid")
        .bind()
        .await
        .expect("binds");
    let addr = bound.local_addr();
    (bound, addr)
}

struct RunningClient {
    status: tokio::sync::watch::Receiver<ClientStatus>,
    reloader: warren::Reloader<ClientConfig>,
    _stop: DropCancel,
}

/// Cancels its token when dropped, so a failed test stops what it started.
struct DropCancel(CancellationToken);

impl Drop for DropCancel {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

fn start_client(config: ClientConfig) -> RunningClient {
    let client = Client::from_config(config).expect("valid client");
    let status = client.status();
    let reloader = client.reloader();
    let stop = CancellationToken::new();
    tokio::spawn(client.run(stop.clone()));
    RunningClient {
        status,
        reloader,
        _stop: DropCancel(stop),
    }
}

impl RunningClient {
    async fn wait_for(&mut self, what: &str, check: impl Fn(&ClientStatus) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), self.status.wait_for(check))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
            .expect("client alive");
    }

    async fn wait_serving(&mut self, session: u64, services: &[&str]) {
        let want: Vec<String> = services.iter().map(ToString::to_string).collect();
        self.wait_for(&format!("session {session} serving {want:?}"), |s| {
            s.connected && s.sessions >= session && want.iter().all(|w| s.services.contains(w))
        })
        .await;
    }
}

/// An echo connection through a tunnel that checks every byte coming back.
struct Echo {
    stream: TcpStream,
    sent: blake3::Hasher,
    received: blake3::Hasher,
}

impl Echo {
    async fn open(service: SocketAddr) -> Echo {
        Echo {
            stream: TcpStream::connect(service)
                .await
                .expect("service reachable"),
            sent: blake3::Hasher::new(),
            received: blake3::Hasher::new(),
        }
    }

    /// Sends one random chunk and reads its echo back.
    async fn exchange(&mut self, len: usize) {
        let chunk = random_bytes(len);
        self.sent.update(&chunk);
        self.stream
            .write_all(&chunk)
            .await
            .expect("tunnel takes bytes");
        let mut back = vec![0u8; len];
        tokio::time::timeout(Duration::from_secs(10), self.stream.read_exact(&mut back))
            .await
            .expect("echo within 10s")
            .expect("echo arrives");
        self.received.update(&back);
    }

    fn assert_intact(&self) {
        assert_eq!(self.sent.finalize(), self.received.finalize());
    }
}

/// Whether a fresh connection through `service` echoes a payload intact.
async fn echoes(service: SocketAddr) -> bool {
    let payload = random_bytes(4096);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), round_trip(service, &payload)).await,
        Ok(Ok(reply)) if reply == payload
    )
}

async fn refused(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).await.is_err()
}

/// Whether the port at `addr` stops accepting within 2 s (its listener's task notices the
/// stop at its next turn).
async fn closes(addr: SocketAddr) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !refused(addr).await {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reload_touches_only_what_changed() {
    let echo = echo_target().await;
    let (steady, gone, moved, moved_to, fresh) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let before = server_toml(
        PSK,
        &[("steady", steady), ("gone", gone), ("moved", moved)],
        "",
    );
    let (bound, server) = start_server(server_config(&before)).await;
    let reloader = bound.reloader();
    let stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let services = [
        ("steady", echo),
        ("gone", echo),
        ("moved", echo),
        ("fresh", echo),
    ];
    let mut client = start_client(client_config(server, PSK, &services, ""));
    client.wait_serving(1, &["steady", "gone", "moved"]).await;

    // A transfer through the unchanged service is under way during the reload.
    let mut transfer = Echo::open(loopback(steady)).await;
    transfer.exchange(256 * 1024).await;

    let after = server_toml(
        PSK,
        &[("steady", steady), ("moved", moved_to), ("fresh", fresh)],
        "",
    );
    let summary = reloader
        .apply(server_config(&after))
        .await
        .expect("reload applies");
    let text = summary.to_string();
    assert!(text.contains("removed service gone"), "{text}");
    assert!(
        text.contains(&format!("restarted service moved on 127.0.0.1:{moved_to}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("added service fresh on 127.0.0.1:{fresh}")),
        "{text}"
    );
    assert!(
        !text.contains("steady"),
        "the unchanged service is not touched: {text}"
    );
    assert!(
        text.contains("reconnect"),
        "the session served a changed service: {text}"
    );

    // The transfer keeps flowing, every byte intact, through the session change.
    for _ in 0..8 {
        transfer.exchange(128 * 1024).await;
    }
    transfer.assert_intact();

    // The client comes back (at once: the server said goodbye) and takes the new service.
    client.wait_serving(2, &["steady", "moved", "fresh"]).await;
    assert!(echoes(loopback(steady)).await, "unchanged service serves");
    assert!(
        echoes(loopback(moved_to)).await,
        "moved service serves on its new port"
    );
    assert!(echoes(loopback(fresh)).await, "added service serves");
    assert!(
        closes(loopback(gone)).await,
        "removed service's port is closed"
    );
    assert!(
        closes(loopback(moved)).await,
        "moved service's old port is closed"
    );
    transfer.exchange(4096).await;
    transfer.assert_intact();

    // The same config again changes nothing and closes no session.
    let again = reloader.apply(server_config(&after)).await.unwrap();
    assert!(again.is_empty(), "{again}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        client.status.borrow().sessions,
        2,
        "no reconnect without a change"
    );
    drop(stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_keeps_the_running_config() {
    let echo = echo_target().await;
    let (web, extra) = (free_port(), free_port());
    let before = server_toml(PSK, &[("web", web)], "");
    let (bound, server) = start_server(server_config(&before)).await;
    let reloader = bound.reloader();
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;

    // Invalid: a weak PSK. Every error is reported; nothing changes.
    let weak = server_config(&before);
    let mut weak = weak;
    weak.psk = warren::crypto::secret::Secret::new("short");
    let error = reloader.apply(weak).await.unwrap_err();
    assert!(matches!(error, ReloadError::Invalid(_)), "{error}");
    assert!(error.to_string().contains("psk"), "{error}");

    // Valid, but a new port is taken: refused as a whole, the other new service included.
    let squatter = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let blocked = server_toml(PSK, &[("web", web), ("extra", extra), ("busy", taken)], "");
    let error = reloader.apply(server_config(&blocked)).await.unwrap_err();
    assert!(matches!(error, ReloadError::Unappliable(_)), "{error}");
    assert!(
        error.to_string().contains(&taken.to_string()),
        "names the port: {error}"
    );
    assert!(
        refused(loopback(extra)).await,
        "nothing of the refused reload was applied"
    );
    assert!(
        echoes(loopback(web)).await,
        "the running config still serves"
    );
    assert_eq!(
        client.status.borrow().sessions,
        1,
        "the session was not touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_psk_change_reconnects_and_the_client_follows_its_own_reload() {
    let echo = echo_target().await;
    let web = free_port();
    let (bound, server) = start_server(server_config(&server_toml(PSK, &[("web", web)], ""))).await;
    let reloader = bound.reloader();
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;

    let summary = reloader
        .apply(server_config(&server_toml(OTHER_PSK, &[("web", web)], "")))
        .await
        .unwrap();
    let text = summary.to_string();
    assert!(text.contains("psk (secret) -> (secret)"), "{text}");
    assert!(
        !text.contains(OTHER_PSK),
        "no secret in the summary: {text}"
    );
    client
        .wait_for("the session to end", |s| !s.connected)
        .await;

    // The client with the old PSK cannot get back in; with the new one it can.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!client.status.borrow().connected);
    client
        .reloader
        .apply(client_config(server, OTHER_PSK, &[("web", echo)], ""))
        .await
        .unwrap();
    client.wait_serving(2, &["web"]).await;
    assert!(echoes(loopback(web)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reload_retargets_without_a_new_session_and_adds_forward_ports() {
    let (first, _first_rx) = sink_then_reply_target(16).await;
    let second = echo_target().await;
    let forwarded = echo_target().await;
    let web = free_port();
    let extra = format!("[server.services.db]\ntarget = \"{forwarded}\"\n");
    let (bound, server) =
        start_server(server_config(&server_toml(PSK, &[("web", web)], &extra))).await;
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", first)], ""));
    client.wait_serving(1, &["web"]).await;
    let reply = round_trip(loopback(web), b"hello").await.unwrap();
    assert_eq!(reply.len(), 16, "the first target answers 16 bytes");

    // A new target: applies to the next stream, same session.
    let summary = client
        .reloader
        .apply(client_config(server, PSK, &[("web", second)], ""))
        .await
        .unwrap();
    assert!(
        summary.to_string().contains("changed service web"),
        "{summary}"
    );
    assert!(!summary.to_string().contains("reconnecting"), "{summary}");
    assert!(
        echoes(loopback(web)).await,
        "the new target (an echo) answers"
    );
    assert_eq!(client.status.borrow().sessions, 1);

    // A forward service: its port is bound and the session restarts to claim it.
    let local = free_port();
    let forward = format!("[client.services.db]\nbind = \"127.0.0.1:{local}\"\n");
    let summary = client
        .reloader
        .apply(client_config(server, PSK, &[("web", second)], &forward))
        .await
        .unwrap();
    let text = summary.to_string();
    assert!(
        text.contains(&format!("forward service db listens on 127.0.0.1:{local}")),
        "{text}"
    );
    assert!(text.contains("reconnecting"), "{text}");
    client.wait_serving(2, &["web", "db"]).await;
    assert!(
        echoes(loopback(local)).await,
        "the forward service reaches its target"
    );

    // Removing it closes its port.
    let summary = client
        .reloader
        .apply(client_config(server, PSK, &[("web", second)], ""))
        .await
        .unwrap();
    assert!(
        summary.to_string().contains("removed forward service db"),
        "{summary}"
    );
    assert!(closes(loopback(local)).await);
    client.wait_serving(3, &["web"]).await;
    assert!(echoes(loopback(web)).await);
}

/// A config file in a fresh directory.
struct ConfigFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ConfigFile {
    fn new(name: &str, text: &str) -> ConfigFile {
        let dir = std::env::temp_dir().join(format!(
            "warren-reload-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }

    fn write(&self, text: &str) {
        // Written aside and renamed over, as editors and config management do.
        let aside = self.dir.join(".server.toml.tmp");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &self.path).unwrap();
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reloads_the_config_file() {
    let echo = echo_target().await;
    let (web, added, admin_port) = (free_port(), free_port(), free_port());
    let admin = format!("[admin]\nbind = \"127.0.0.1:{admin_port}\"\ntoken = \"{ADMIN_TOKEN}\"\n");
    let file = ConfigFile::new("admin", &server_toml(PSK, &[("web", web)], &admin));
    let (bound, server) = start_server(ServerConfig::load(&file.path).unwrap()).await;
    let bound =
        bound.reload_from(ConfigSource::new(&file.path, ServerConfig::load).watch_file(false));
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(
        server,
        PSK,
        &[("web", echo), ("added", echo)],
        "",
    ));
    client.wait_serving(1, &["web"]).await;
    let admin = loopback(admin_port);

    file.write(&server_toml(
        PSK,
        &[("web", web), ("added", added)],
        &admin_section(admin_port),
    ));
    let (status, body) = http(admin, "POST", "/api/v1/reload", None).await;
    assert_eq!(status, 401, "the token is required: {body}");
    assert!(
        refused(loopback(added)).await,
        "an unauthorised request reloads nothing"
    );
    let (status, body) = http(admin, "POST", "/api/v1/reload", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["reloaded"], true);
    let applied = answer["applied"].to_string();
    assert!(applied.contains("added service added"), "{body}");
    // The client claimed `added` before the server had it: it is asked to claim it again.
    assert!(body.contains("reconnect"), "{body}");
    client.wait_serving(2, &["web", "added"]).await;
    assert!(echoes(loopback(added)).await, "the added service serves");

    // A broken file: 422 with the error and its line; the running config stays.
    file.write("[server]\nbind = \"127.0.0.1:7000\"\npsk = 12\n");
    let (status, body) = http(admin, "POST", "/api/v1/reload", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("psk"), "names the key: {body}");
    assert!(body.contains("3:"), "names the line: {body}");
    assert!(echoes(loopback(web)).await, "still serving the old config");

    let (status, metrics) = http(admin, "GET", "/metrics", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("warren_config_reloads_total{result=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("warren_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
}

fn admin_section(port: u16) -> String {
    format!("[admin]\nbind = \"127.0.0.1:{port}\"\ntoken = \"{ADMIN_TOKEN}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_reloaded_without_asking() {
    let echo = echo_target().await;
    let (web, added) = (free_port(), free_port());
    let file = ConfigFile::new("watch", &server_toml(PSK, &[("web", web)], ""));
    let (bound, server) = start_server(ServerConfig::load(&file.path).unwrap()).await;
    let bound = bound.reload_from(ConfigSource::new(&file.path, ServerConfig::load));
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;
    // Let the watcher start before the file changes.
    tokio::time::sleep(Duration::from_millis(200)).await;

    file.write(&server_toml(PSK, &[("web", web), ("added", added)], ""));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while refused(loopback(added)).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the file change was not applied within 10s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(echoes(loopback(web)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reload_keeps_its_declared_port() {
    let echo = echo_target().await;
    let (web, declared) = (free_port(), free_port());
    let allow =
        format!("allow_ports = \"{declared}-{declared}\"\nallow_bind_addrs = [\"127.0.0.1\"]\n");
    // allow_* belong in [server]: put them before the service tables.
    let text = server_toml(PSK, &[("web", web)], "").replacen(
        "heartbeat_interval",
        &format!("{allow}heartbeat_interval"),
        1,
    );
    let (bound, server) = start_server(server_config(&text)).await;
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mine = format!(
        "[client.services.mine]\ntarget = \"{echo}\"\nremote_bind = \"127.0.0.1:{declared}\"\n"
    );
    let mut client = start_client(client_config(server, PSK, &[], &mine));
    client.wait_serving(1, &["mine"]).await;
    assert!(echoes(loopback(declared)).await);

    // A reload that adds a service restarts the session; the declared port comes along.
    for session in 2..=4 {
        let services: Vec<(&str, SocketAddr)> = if session % 2 == 0 {
            vec![("web", echo)]
        } else {
            vec![]
        };
        client
            .reloader
            .apply(client_config(server, PSK, &services, &mine))
            .await
            .unwrap();
        client.wait_serving(session, &["mine"]).await;
        assert!(echoes(loopback(declared)).await, "session {session}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visitors_are_never_turned_away_while_the_client_changes_sessions() {
    let echo = echo_target().await;
    let (web, other) = (free_port(), free_port());
    let text = server_toml(PSK, &[("web", web), ("other", other)], "");
    let (bound, server) = start_server(server_config(&text)).await;
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;

    let visitors = Visitors::start(loopback(web));
    // Each reload changes the claims, so each takes a new session.
    for session in 2..=6 {
        let services: Vec<(&str, SocketAddr)> = if session % 2 == 0 {
            vec![("web", echo), ("other", echo)]
        } else {
            vec![("web", echo)]
        };
        client
            .reloader
            .apply(client_config(server, PSK, &services, ""))
            .await
            .unwrap();
        client.wait_serving(session, &["web"]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    visitors.assert_none_turned_away().await;
}

/// Visitors arriving at a service one after another until told to stop.
struct Visitors {
    visiting: CancellationToken,
    task: tokio::task::JoinHandle<(u32, u32)>,
}

impl Visitors {
    fn start(service: SocketAddr) -> Visitors {
        let visiting = CancellationToken::new();
        let task = tokio::spawn({
            let visiting = visiting.clone();
            async move {
                let (mut served, mut failed) = (0u32, 0u32);
                while !visiting.is_cancelled() {
                    if echoes(service).await {
                        served += 1;
                    } else {
                        failed += 1;
                    }
                }
                (served, failed)
            }
        });
        Visitors { visiting, task }
    }

    async fn assert_none_turned_away(self) {
        self.visiting.cancel();
        let (served, failed) = self.task.await.unwrap();
        assert!(served > 20, "visitors kept coming: {served}");
        assert_eq!(
            failed,
            0,
            "{failed} of {} visitors were turned away",
            served + failed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_adds_a_claimed_service_turns_no_visitor_away() {
    let echo = echo_target().await;
    let (web, later) = (free_port(), free_port());
    let (bound, server) = start_server(server_config(&server_toml(PSK, &[("web", web)], ""))).await;
    let reloader = bound.reloader();
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    // The client already claims `later`, which the server does not have yet.
    let services = [("web", echo), ("later", echo)];
    let mut client = start_client(client_config(server, PSK, &services, ""));
    client.wait_serving(1, &["web"]).await;
    let visitors = Visitors::start(loopback(web));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let text = server_toml(PSK, &[("web", web), ("later", later)], "");
    let summary = reloader.apply(server_config(&text)).await.unwrap();
    assert!(
        summary.to_string().contains("claim their services again"),
        "{summary}"
    );
    client.wait_serving(2, &["web", "later"]).await;
    assert!(
        echoes(loopback(later)).await,
        "the client serves the new service"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    visitors.assert_none_turned_away().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_an_unreachable_server_ends_the_session_and_a_good_one_comes_back() {
    let echo = echo_target().await;
    let web = free_port();
    let (bound, server) = start_server(server_config(&server_toml(PSK, &[("web", web)], ""))).await;
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;

    // Nothing listens there: the new session cannot be had, the old one ends anyway.
    let nowhere = loopback(free_port());
    client
        .reloader
        .apply(client_config(nowhere, PSK, &[("web", echo)], ""))
        .await
        .unwrap();
    client
        .wait_for("the old session to end", |s| !s.connected)
        .await;
    assert!(
        !echoes(loopback(web)).await,
        "no session serves web any more"
    );

    client
        .reloader
        .apply(client_config(server, PSK, &[("web", echo)], ""))
        .await
        .unwrap();
    client.wait_serving(2, &["web"]).await;
    assert!(echoes(loopback(web)).await);
}

/// Issue 19: a new `bandwidth_limit` applies in place: the connection under way follows it
/// at once (neither cut nor restarted, bytes checked) and no session starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_bandwidth_limit_applies_to_the_connection_under_way() {
    let echo = echo_target().await;
    let port = free_port();
    let limited = |limit: &str| {
        let mut text = server_toml(PSK, &[("web", port)], "");
        text.push_str(limit);
        server_config(&text)
    };
    let (bound, server) = start_server(limited("bandwidth_limit = \"200KB/s\"\n")).await;
    let reloader = bound.reloader();
    let _stop = DropCancel(bound.shutdown_token());
    tokio::spawn(bound.run());
    let mut client = start_client(client_config(server, PSK, &[("web", echo)], ""));
    client.wait_serving(1, &["web"]).await;

    let mut transfer = Echo::open(loopback(port)).await;
    // 400 kB each way at 200 kB/s: about 2 s.
    let started = tokio::time::Instant::now();
    for _ in 0..4 {
        transfer.exchange(100_000).await;
    }
    let limited_time = started.elapsed();
    assert!(
        limited_time >= Duration::from_millis(1500),
        "400 kB took {limited_time:?} under a 200 kB/s limit"
    );

    let summary = reloader.apply(limited("")).await.expect("reload applies");
    let text = summary.to_string();
    assert!(
        text.contains("service web: bandwidth limit now none, compression none"),
        "{text}"
    );
    assert!(!text.contains("restarted"), "{text}");
    let started = tokio::time::Instant::now();
    for _ in 0..4 {
        transfer.exchange(100_000).await;
    }
    let free_time = started.elapsed();
    assert!(
        free_time < limited_time / 3,
        "still limited after the reload: {free_time:?} (was {limited_time:?})"
    );
    transfer.assert_intact();
    assert_eq!(
        client.status.borrow().sessions,
        1,
        "the session started again"
    );
}
