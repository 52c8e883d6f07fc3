//! The dashboard's backend (issue 16): the login cookie, the browser-facing rules (Host,
//! Origin, no CORS, CSP), the live event stream, the masked config view with per-line
//! reload errors, and disconnecting a session. The pages themselves are tested in a real
//! browser by `tests/browser/dashboard.py`.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use warren::config::Transport;
use warren::{Client, ConfigSource, HostPort, Server, ServerConfig};

const ADMIN_TOKEN: &str = "admin-token-0123456789-abcdef";

/// [`http_exchange`] with the header block lower-cased (names compare as HTTP's do).
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let (status, head, body) = http_exchange(addr, method, path, headers, body).await;
    (status, head.to_ascii_lowercase(), body)
}

/// A header's value in a lower-cased header block.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
}

struct Running {
    admin: SocketAddr,
    service: SocketAddr,
    stop: CancellationToken,
    client_stop: CancellationToken,
    client: tokio::sync::watch::Receiver<warren::ClientStatus>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        self.client_stop.cancel();
    }
}

async fn running(token: Option<&str>, target: SocketAddr) -> Running {
    running_over(Transport::Noise, token, target).await
}

async fn running_over(transport: Transport, token: Option<&str>, target: SocketAddr) -> Running {
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .transport(transport)
        .quic(quic_config())
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .admin("127.0.0.1:0".parse().unwrap(), token)
        .heartbeat_interval(Duration::from_millis(200))
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("binds");
    let admin = bound.admin_addr().expect("admin bound");
    let service = bound.service_addr("web").unwrap();
    let server = bound.local_addr();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let client = Client::builder(HostPort::from(server))
        .transport(transport)
        .quic(quic_config())
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", HostPort::from(target))
        .reconnect_delays(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap();
    let mut status = client.status();
    let client_stop = CancellationToken::new();
    tokio::spawn(client.run(client_stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .expect("client connects")
        .unwrap();
    Running {
        admin,
        service,
        stop,
        client_stop,
        client: status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_needs_a_login_and_keeps_browsers_to_its_own_origin() {
    let target = echo_target().await;
    let w = running(Some(ADMIN_TOKEN), target).await;
    let admin = w.admin;
    let host = admin.to_string();
    let origin = format!("http://{admin}");

    // Not logged in: the page sends to the login, the API says 401, assets are public.
    let (status, head, _) = exchange(admin, "GET", "/", &[], "").await;
    assert_eq!((status, header(&head, "location")), (303, Some("/login")));
    let (status, _, _) = exchange(admin, "GET", "/api/v1/status", &[], "").await;
    assert_eq!(status, 401);
    let (status, head, body) = exchange(admin, "GET", "/login", &[], "").await;
    assert_eq!(status, 200);
    assert!(body.contains("<form"), "a login form: {body}");
    assert!(
        header(&head, "content-type")
            .unwrap()
            .starts_with("text/html")
    );
    let (status, head, _) = exchange(admin, "GET", "/assets/app.js", &[], "").await;
    assert_eq!(status, 200);
    assert!(
        header(&head, "content-type")
            .unwrap()
            .starts_with("text/javascript")
    );

    // Every answer is hardened, and none allows another origin.
    for head in [&head, &exchange(admin, "GET", "/", &[], "").await.1] {
        let csp = header(head, "content-security-policy").expect("CSP on every answer");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(header(head, "x-content-type-options"), Some("nosniff"));
        assert!(!head.contains("access-control-"), "no CORS: {head}");
    }
    let preflight = [
        ("Origin", "https://evil.example"),
        ("Access-Control-Request-Method", "POST"),
    ];
    let (_, head, _) = exchange(admin, "OPTIONS", "/api/v1/reload", &preflight, "").await;
    assert!(
        !head.contains("access-control-allow"),
        "no CORS preflight: {head}"
    );

    // A wrong token is refused; the right one gives an HttpOnly, SameSite=Strict cookie.
    let form = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Origin", &origin[..]),
    ];
    let (status, head, _) = exchange(admin, "POST", "/login", &form, "token=nope").await;
    assert_eq!(
        (status, header(&head, "location")),
        (303, Some("/login?failed=1"))
    );
    assert!(header(&head, "set-cookie").is_none());
    let body = format!("token={ADMIN_TOKEN}");
    let (status, head, _) = exchange(admin, "POST", "/login", &form, &body).await;
    assert_eq!((status, header(&head, "location")), (303, Some("/")));
    let set_cookie = header(&head, "set-cookie").expect("a login cookie");
    assert!(
        set_cookie.contains("httponly") && set_cookie.contains("samesite=strict"),
        "{set_cookie}"
    );
    // The header block is lower-cased; the cookie value is lower-case hex.
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    assert!(!cookie.contains(ADMIN_TOKEN), "the cookie is not the token");
    let with_cookie = [("Cookie", &cookie[..])];
    let (status, _, body) = exchange(admin, "GET", "/", &with_cookie, "").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("<html") || body.contains("<!doctype"),
        "{body}"
    );
    let (status, _, body) = exchange(admin, "GET", "/api/v1/status", &with_cookie, "").await;
    assert_eq!(status, 200, "{body}");

    // A cookie-authenticated change needs this dashboard's Origin.
    let (status, _, body) = exchange(admin, "POST", "/api/v1/reload", &with_cookie, "").await;
    assert_eq!(status, 403, "no Origin: {body}");
    let cross = [("Cookie", &cookie[..]), ("Origin", "http://evil.example")];
    let (status, _, body) = exchange(admin, "POST", "/api/v1/reload", &cross, "").await;
    assert_eq!(status, 403, "{body}");
    let same = [("Cookie", &cookie[..]), ("Origin", &origin[..])];
    let (status, _, body) = exchange(admin, "POST", "/api/v1/reload", &same, "").await;
    assert_eq!(
        status, 501,
        "passes the gate (built in code: nothing to reload): {body}"
    );

    // DNS rebinding: a page on another name reaching this port gets nothing, token or not.
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let rebound = [
        ("Host", "evil.example:7001"),
        ("Authorization", &bearer[..]),
    ];
    let (status, _, body) = exchange(admin, "GET", "/api/v1/status", &rebound, "").await;
    assert_eq!(status, 421, "{body}");
    let localhost = format!("localhost:{}", admin.port());
    let named = [("Host", &localhost[..]), ("Cookie", &cookie[..])];
    assert_eq!(
        exchange(admin, "GET", "/api/v1/status", &named, "").await.0,
        200
    );
    assert_eq!(
        exchange(admin, "GET", "/api/v1/status", &[("Host", &host[..])], "")
            .await
            .0,
        401
    );

    // Logging out ends the cookie.
    let (status, head, _) = exchange(admin, "POST", "/logout", &same, "").await;
    assert_eq!((status, header(&head, "location")), (303, Some("/login")));
    assert_eq!(
        exchange(admin, "GET", "/api/v1/status", &with_cookie, "")
            .await
            .0,
        401
    );
}

/// Reads Server-Sent Events until `wanted` accepts one (`event`, parsed data).
async fn wait_for_event(
    lines: &mut (impl AsyncBufReadExt + Unpin),
    mut wanted: impl FnMut(&str, &serde_json::Value) -> bool,
) -> (String, serde_json::Value) {
    let read = async {
        let mut event = String::new();
        loop {
            let mut line = String::new();
            assert!(
                lines.read_line(&mut line).await.unwrap() > 0,
                "stream ended"
            );
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix("event: ") {
                event = name.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let data: serde_json::Value = serde_json::from_str(data).unwrap();
                if wanted(&event, &data) {
                    return (event, data);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the event came")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_says_hello_then_ticks_with_moving_counters() {
    let target = echo_target().await;
    let w = running(None, target).await;
    let mut stream = TcpStream::connect(w.admin).await.unwrap();
    let request = format!(
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        w.admin
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut lines = BufReader::new(stream);
    let (_, hello) = wait_for_event(&mut lines, |event, _| event == "hello").await;
    assert_eq!(hello["side"], "server");
    assert!(hello["started"].as_u64().unwrap() > 0);
    let (_, first) = wait_for_event(&mut lines, |event, _| event == "tick").await;
    assert_eq!(first["sessions"], 1);
    assert_eq!(first["services"], 1);

    // 1 MiB through the tunnel: the next ticks count it, per service and in all.
    let payload = random_bytes(1 << 20);
    let echoed = round_trip(w.service, &payload).await.unwrap();
    assert_eq!(hash(&echoed), hash(&payload));
    let (_, tick) = wait_for_event(&mut lines, |event, data| {
        event == "tick" && data["bytes_in"].as_u64().unwrap() >= 1 << 20
    })
    .await;
    assert!(tick["bytes_out"].as_u64().unwrap() >= 1 << 20, "{tick}");
    let web = &tick["service_rates"][0];
    assert_eq!(web["name"], "web");
    assert_eq!(web["total_connections"], 1);
    assert!(web["bytes_in"].as_u64().unwrap() >= 1 << 20, "{web}");
    assert!(
        tick["http"].is_object(),
        "the server has an HTTP side: {tick}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_disconnected_from_the_dashboard_comes_back() {
    let target = echo_target().await;
    let mut w = running(None, target).await;
    // The heartbeat (every 200 ms) measures the session's round trip.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let session = loop {
        let (_, text) = http(w.admin, "GET", "/api/v1/sessions", None).await;
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        if list[0]["rtt_ms"].is_number() {
            break list[0].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no RTT: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(session["version"].as_u64().unwrap() >= 1);
    let id = session["id"].as_str().unwrap();
    let (status, body) = http(
        w.admin,
        "POST",
        &format!("/api/v1/sessions/{id}/disconnect"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::timeout(
        Duration::from_secs(10),
        w.client.wait_for(|s| s.sessions >= 2 && s.connected),
    )
    .await
    .expect("the client connects again")
    .unwrap();
    let (status, body) = http(
        w.admin,
        "POST",
        "/api/v1/sessions/ffffffff/disconnect",
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
}

struct TempConfig {
    dir: PathBuf,
    path: PathBuf,
}

impl TempConfig {
    fn new(text: &str) -> TempConfig {
        let dir = std::env::temp_dir().join(format!(
            "warren-dashboard-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        std::fs::write(&path, text).unwrap();
        TempConfig { dir, path }
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_view_masks_secrets_and_a_refused_reload_lists_each_error_with_its_line() {
    let [server_port, web_port, admin_port]: [u16; 3] = [(); 3].map(|_| free_port());
    let good = format!(
        "# the dashboard test\n[server]\nbind = \"127.0.0.1:{server_port}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n\n[server.services.web]\nbind = \"127.0.0.1:{web_port}\"\n\n[admin]\nbind = \"127.0.0.1:{admin_port}\"\ntoken = \"{ADMIN_TOKEN}\"\n"
    );
    let file = TempConfig::new(&good);
    let bound = Server::from_config(ServerConfig::load(&file.path).unwrap())
        .unwrap()
        .bind()
        .await
        .unwrap()
        .reload_from(ConfigSource::new(&file.path, ServerConfig::load).watch_file(false));
    let stop = bound.shutdown_token();
    let _stop = scopeguard(stop.clone());
    tokio::spawn(bound.run());
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));

    let (status, text) = http(admin, "GET", "/api/v1/config", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let shown = config["text"].as_str().unwrap();
    for secret in [PSK, TOKEN, ADMIN_TOKEN] {
        assert!(!shown.contains(secret), "a secret is shown: {shown}");
    }
    assert!(
        shown.contains("# the dashboard test") && shown.contains("\"********\""),
        "{shown}"
    );
    assert_eq!(config["path"], file.path.display().to_string());

    // Two errors on lines 5 and 8 of the new file: each listed with its line.
    let broken = good
        .replace(
            &format!("default_token = \"{TOKEN}\""),
            "default_token = 12",
        )
        .replace(
            &format!("bind = \"127.0.0.1:{web_port}\""),
            "bind = \"nowhere\"",
        );
    std::fs::write(&file.path, &broken).unwrap();
    let (status, text) = http(admin, "POST", "/api/v1/reload", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 422, "{text}");
    let refused: serde_json::Value = serde_json::from_str(&text).unwrap();
    let errors = refused["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{text}");
    for error in errors {
        assert!(error["line"].is_u64(), "every error has its line: {text}");
        assert!(error["message"].is_string(), "{text}");
    }
    let lines: Vec<u64> = errors.iter().filter_map(|e| e["line"].as_u64()).collect();
    assert!(lines.contains(&5), "the default_token line: {text}");
    // The view still shows the file in force, not the broken one.
    let (_, text) = http(admin, "GET", "/api/v1/config", Some(ADMIN_TOKEN)).await;
    assert!(!text.contains("nowhere"), "{text}");
    // The logs page's source answers (the ring is filled by the binary's logger).
    let (status, text) = http(admin, "GET", "/api/v1/logs?limit=5", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with('['), "{text}");
}

/// Cancels a token when dropped.
fn scopeguard(token: CancellationToken) -> impl Drop {
    struct Guard(CancellationToken);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.cancel();
        }
    }
    Guard(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_each_sessions_round_trip_and_quic_path() {
    let target = echo_target().await;
    let w = running_over(Transport::Quic, None, target).await;
    let payload = random_bytes(256 * 1024);
    let echoed = round_trip(w.service, &payload).await.unwrap();
    assert_eq!(hash(&echoed), hash(&payload));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, text) = http(w.admin, "GET", "/metrics", None).await;
        assert_eq!(status, 200);
        let has = |name: &str| {
            text.lines()
                .any(|l| l.starts_with(name) && l.contains("session=\""))
        };
        if has("warren_session_rtt_seconds") {
            for name in [
                "warren_session_streams",
                "warren_session_quic_cwnd_bytes",
                "warren_session_quic_lost_packets",
                "warren_session_quic_mtu_bytes",
                "warren_session_quic_datagrams_dropped",
            ] {
                assert!(has(name), "{name} missing:\n{text}");
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no RTT gauge:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
